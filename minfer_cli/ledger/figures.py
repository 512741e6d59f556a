"""What a record says, in its unit: the speed-up definition, each record's headline figures, and the flat rows
of the exports.

One definition of change (docs/ledger.md): speed-up = old time / new time - 1 for a time metric and new rate /
old rate - 1 for a throughput metric, so ``+14.1% faster`` means the same thing for µs and tok/s. Records store
``comparison.delta`` (B/A - 1 in the metric's own unit); `speedup` converts.
"""

from __future__ import annotations

import re

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from minfer_cli.errors import LedgerError
from minfer_cli.ledger.schema import KINDS_WITH_BAR, KINDS_WITH_WORKLOAD_ARMS, is_number

if TYPE_CHECKING:
    import pandas as pd

FORMATS = ("md", "csv", "json")


# ---------------------------------------------------------------------------------------------------- numbers


def _m(value: Any) -> Mapping[str, Any]:
    """``value`` when it is a mapping, else an empty one (a record's optional parts may be anything)."""
    return value if isinstance(value, Mapping) else {}


def _finite(value: Any) -> float | None:
    return float(value) if is_number(value) and math.isfinite(value) else None


def speedup(delta: float, higher_is_better: bool) -> float:
    """The speed-up of B over A from ``delta`` = B/A - 1 of the metric: ``delta`` itself for a rate (higher is
    better), A/B - 1 = 1/(1 + delta) - 1 for a time. Positive means B is faster."""
    return delta if higher_is_better else 1.0 / (1.0 + delta) - 1.0


def speedup_interval(low: float, high: float, higher_is_better: bool) -> tuple[float, float]:
    """The CI [low, high] of ``delta`` as a CI of the speed-up (its ends swap for a time metric)."""
    if higher_is_better:
        return low, high
    return speedup(high, False), speedup(low, False)


def fmt_num(value: float | None) -> str:
    """A measured value with about four significant digits: ``28,802``, ``374.0``, ``23.89``, ``0.0123``."""
    if value is None:
        return "—"
    size = abs(value)
    if size >= 1000:
        return f"{value:,.0f}"
    if size >= 100:
        return f"{value:.1f}"
    if size >= 10:
        return f"{value:.2f}"
    if size >= 1:
        return f"{value:.3f}"
    return f"{value:.3g}"


def fmt_pct(value: float, digits: int = 1) -> str:
    """A fraction as a signed percentage: 0.1412 -> ``+14.1%``."""
    return f"{value * 100:+.{digits}f}%"


def fmt_change(value: float) -> str:
    """A speed-up in words: ``+14.1% faster``, ``-3.2% slower``, ``+0.0% same``."""
    if round(value * 100, 1) == 0:
        return f"{value * 100:+.1f}% same"
    return f"{fmt_pct(value)} {'faster' if value > 0 else 'slower'}"


def fmt_p(p_value: float | None) -> str:
    """A p-value for a table: ``0.034``, ``< 1e-6`` (never ``0.0``), ``—`` when missing."""
    if p_value is None:
        return "—"
    if p_value < 1e-6:
        return "< 1e-6"
    if p_value < 1e-3:
        return f"{p_value:.0e}"
    return f"{p_value:.2g}"


# ---------------------------------------------------------------------------------------------------- per record


def stats_of(arm: Mapping[str, Any] | None) -> dict[str, float | None]:
    """An arm's median, mean, std, p10, p90 and n (None where the record lacks one)."""
    stats = _m(_m(arm).get("stats"))
    return {k: _finite(stats.get(k)) for k in ("median", "mean", "std", "p10", "p90", "n")}


def knobs_text(knobs: Mapping[str, Any]) -> str:
    """Knobs as the ``--arm`` syntax: ``K=V,K=V``."""
    return ",".join(f"{k}={v}" for k, v in knobs.items())


def arm_text(arm: Mapping[str, Any]) -> str:
    """How an arm is written in tables: its knobs as ``K=V,K=V`` (the ``--arm`` syntax), or its label if none."""
    knobs = arm.get("knobs") or {}
    return knobs_text(knobs) if knobs else str(arm.get("label", ""))


def differing_knobs(arms: list) -> list[str]:
    """The knob names whose values differ between ``arms`` (first-seen order)."""
    knob_sets = [dict(a.get("knobs") or {}) for a in arms if isinstance(a, Mapping)]
    keys = list(dict.fromkeys(k for ks in knob_sets for k in ks))
    return [k for k in keys if len({repr(ks.get(k)) for ks in knob_sets}) > 1]


def arms_text(arms: list) -> str:
    """The arms of a record as a table shows them: only the knobs that differ between the arms (``TM=64 → TM=128``),
    every knob when there is one arm or when the arms are the same (A/A), more than two arms as a count."""
    if len(arms) > 2:
        return f"{len(arms)} points"
    differing = differing_knobs(arms)
    if len(arms) < 2 or not differing:
        return " → ".join(arm_text(a) for a in arms)
    return " → ".join(",".join(f"{k}={(a.get('knobs') or {}).get(k)}" for k in differing) for a in arms)


def record_arms_text(record: Mapping[str, Any]) -> str:
    """A record's arms as the ledger table shows them: a bench record's tests (``pp2048, tg128``), a sweep's grid
    (the knobs it varied), a verify's original, any other record's `arms_text`."""
    arms = record.get("arms") or []
    kind = record.get("kind")
    if kind in KINDS_WITH_WORKLOAD_ARMS:
        return ", ".join(str(a.get("label")) for a in arms)
    if kind == "sweep":
        varied = differing_knobs(arms)
        return f"{len(arms)} points over {','.join(varied)}" if varied else f"{len(arms)} point(s)"
    if kind == "verify":
        verify = _m(record.get("verify"))
        if verify.get("of_kind") in KINDS_WITH_WORKLOAD_ARMS:
            return f"#{verify.get('of')}: " + ", ".join(str(a.get("label")) for a in arms)
        return f"#{verify.get('of')}" + (f": {arms_text(arms)}" if arms else "")
    if kind == "retire":
        return "retires " + ", ".join(f"#{i}" for i in _m(record.get("retire")).get("ids", []))
    if kind == "check":
        arm = _m(record.get("check")).get("arm")
        if arm is None:  # records written before `check.arm`: the knobs its command line set
            found = re.search(r"--arm[ =](\S+)", str(record.get("command") or ""))
            arm = found.group(1) if found else ""
        return (f"{arm} · " if arm else "") + str(_m(record.get("workload")).get("name") or record.get("title"))
    return arms_text(arms)


def _higher(record: Mapping[str, Any]) -> bool:
    return bool(_m(record.get("metric")).get("higher_is_better"))


def _unit(record: Mapping[str, Any]) -> str:
    return str(_m(record.get("metric")).get("unit") or "")


def sweep_point(record: Mapping[str, Any], which: str) -> Mapping[str, Any] | None:
    """A sweep's ``best`` or ``default`` arm (None when the record names none)."""
    label = _m(record.get(which)).get("label")
    return next((a for a in record.get("arms") or [] if a.get("label") == label), None)


@dataclass(frozen=True)
class Headline:
    """What a table row of a record shows: ``result`` the figures in their unit (``23.89 → 20.90 µs``), ``change``
    the speed-up in words (``+14.3% faster``), ``ci`` its 95% CI in percent, ``p`` the p-value text."""

    result: str
    change: str = ""
    ci: str = ""
    p: str = ""


def _ci_text(low: float, high: float) -> str:
    return f"[{low * 100:+.1f}, {high * 100:+.1f}]"


def comparison_change(record: Mapping[str, Any]) -> tuple[float, float, float] | None:
    """(speed-up, CI low, CI high) of B over A for a record with a comparison, else None."""
    comparison = record.get("comparison") or {}
    values = [_finite(comparison.get(k)) for k in ("delta", "ci_low", "ci_high")]
    if any(v is None for v in values):
        return None
    delta, low, high = values
    higher = _higher(record)
    return (speedup(delta, higher), *speedup_interval(low, high, higher))


def headline(record: Mapping[str, Any]) -> Headline:
    """The figures that matter for ``record``, by kind (docs/ledger.md, Views); a record whose optional parts
    hold something unexpected gets ``(figures unreadable: ...)`` instead of an exception."""
    try:
        return _headline(record)
    except Exception as exc:  # a valid record may still hold odd optional values: one cell says so
        return Headline(f"(figures unreadable: {type(exc).__name__})")


def _headline(record: Mapping[str, Any]) -> Headline:
    kind, unit, arms = record.get("kind"), _unit(record), record.get("arms") or []
    if kind == "bench":
        parts = []
        for arm in arms:
            s = stats_of(arm)
            if s["mean"] is not None and s["std"] is not None:
                parts.append(f"{arm.get('label')} {fmt_num(s['mean'])} ± {fmt_num(s['std'])}")
            else:
                parts.append(f"{arm.get('label')} {fmt_num(s['median'])}")
        return Headline(", ".join(parts) + f" {unit}")
    if kind == "sweep":
        best = sweep_point(record, "best")
        if best is None or best.get("status") != "ok":
            return Headline("no valid point")
        median = stats_of(best)["median"]
        varied = differing_knobs(arms)
        knobs = best.get("knobs") or {}
        point = ",".join(f"{k}={knobs.get(k)}" for k in varied) or str(best.get("label"))
        text = f"best {point}: {fmt_num(median)} {unit}"
        default = sweep_point(record, "default")
        default_median = stats_of(default)["median"] if default else None
        if default_median and median:
            ratio = median / default_median - 1.0
            return Headline(text, fmt_change(speedup(ratio, _higher(record))) + " vs default")
        return Headline(text)
    if kind == "calibrate":
        cal = _m(record.get("calibration"))
        fpr, suggested, bar = (_finite(cal.get(k)) for k in ("false_positive_rate", "suggested_bar", "bar"))
        if fpr is None:
            return Headline("no calibration")
        bar_text = f" at {bar * 100:.2g}%" if bar is not None else ""
        return Headline(f"FP rate {fpr * 100:.0f}%{bar_text}, suggested bar {fmt_num((suggested or 0) * 100)}%")
    if kind == "verify":
        verify = _m(record.get("verify"))
        then, now = _m(verify.get("recorded")), _m(verify.get("measured"))
        if _finite(then.get("speedup")) is not None and _finite(now.get("speedup")) is not None:
            low, high = _finite(now.get("ci_low")), _finite(now.get("ci_high"))
            return Headline(f"then {fmt_pct(then['speedup'])}, now {fmt_change(now['speedup'])}", "",
                            _ci_text(low, high) if low is not None and high is not None else "")
        if then and set(then) == set(now) and all(_finite(v) is not None for v in [*then.values(), *now.values()]):
            return Headline(", ".join(f"{k} {fmt_num(then[k])} → {fmt_num(now[k])} ({fmt_pct(speedup(now[k] / then[k] - 1, _higher(record)))})"
                                      for k in then) + f" {_unit(record)}".rstrip())
        return Headline(str(verify.get("measured_text") or verify.get("reason") or ""))
    if kind == "retire":
        return Headline(str(_m(record.get("retire")).get("why", "")))
    if kind == "check":
        check = _m(record.get("check"))
        worst = _finite(check.get("worst_rel_l2"))
        tol = _finite(check.get("tolerance"))
        if worst is None:
            return Headline("")
        if tol is None:
            return Headline(f"worst rel L2 {worst:.2g}")
        return Headline(f"worst rel L2 {worst:.2g} {'≤' if worst <= tol else '>'} tolerance {tol:.2g}")
    if kind == "run" or len(arms) < 2:
        s = stats_of(arms[0] if arms else None)
        extra = arms[0].get("pct_roofline") if arms else None
        roof = f", {extra:.1f}% roofline" if is_number(extra) else ""
        return Headline(f"{fmt_num(s['median'])} {unit}{roof}")
    a, b = stats_of(arms[0])["median"], stats_of(arms[1])["median"]
    result = f"{fmt_num(a)} → {fmt_num(b)} {unit}"
    change = comparison_change(record)
    if change is None:
        return Headline(result)
    p_value = _finite(_m(record.get("comparison")).get("p_value"))
    return Headline(result, fmt_change(change[0]), _ci_text(change[1], change[2]), fmt_p(p_value))


# ---------------------------------------------------------------------------------------------------- flat rows


PCT_DIGITS = 6
"""Decimals a percentage is exported with: a fraction's ``* 100`` leaves binary noise (0.239153 -> 23.915300000000002)
that no measurement has; 1e-6 % is far below any A/B's resolution."""

_STAT_COLUMNS = ("median", "mean", "std", "p10", "p90", "n")
# Columns of `to_frame` and their pandas dtypes (nullable, so a missing value is <NA> in every column). The
# exports read back to the same frame with ``pd.read_csv(buf, dtype=COLUMNS)`` and
# ``pd.read_json(buf, orient="records", dtype=False).astype(COLUMNS)``.
COLUMNS: dict[str, str] = {
    "id": "Int64",
    "date": "string",
    "kind": "string",
    "experiment": "string",
    "workload": "string",
    "point": "string",
    "arm_a": "string",
    "arm_b": "string",
    **{f"a_{k}": ("Int64" if k == "n" else "Float64") for k in _STAT_COLUMNS},
    **{f"b_{k}": ("Int64" if k == "n" else "Float64") for k in _STAT_COLUMNS},
    "unit": "string",
    "delta_pct": "Float64",
    "ci_low_pct": "Float64",
    "ci_high_pct": "Float64",
    "speedup_pct": "Float64",
    "speedup_ci_low_pct": "Float64",
    "speedup_ci_high_pct": "Float64",
    "p_value": "Float64",
    "bar_pct": "Float64",
    "verdict": "string",
    "title": "string",
    "commit": "string",
    "dirty": "boolean",
}


def _pct(value: Any) -> float | None:
    """A stored fraction as percent, rounded to `PCT_DIGITS` decimals (None for a missing or non-finite value)."""
    return round(value * 100.0, PCT_DIGITS) if _finite(value) is not None else None


def _row(record: Mapping[str, Any], workload: Any, arm_a: Mapping[str, Any] | None,
         arm_b: Mapping[str, Any] | None, point: str | None = None) -> dict[str, Any]:
    comparison = record.get("comparison") or {}
    git = record.get("git") or {}
    change = comparison_change(record) if arm_b is not None else None
    row = {
        "id": record["id"],
        "date": record.get("timestamp"),
        "kind": record.get("kind"),
        "experiment": record.get("experiment"),
        "workload": workload,
        "point": point,
        "arm_a": arm_text(arm_a) if arm_a else None,
        "arm_b": arm_text(arm_b) if arm_b else None,
    }
    for prefix, arm in (("a", arm_a), ("b", arm_b)):
        stats = stats_of(arm)
        for k in _STAT_COLUMNS:
            value = stats[k]
            row[f"{prefix}_{k}"] = (int(value) if k == "n" and value is not None else value)
    row.update({
        "unit": _m(record.get("metric")).get("unit"),
        "delta_pct": _pct(comparison.get("delta")),
        "ci_low_pct": _pct(comparison.get("ci_low")),
        "ci_high_pct": _pct(comparison.get("ci_high")),
        "speedup_pct": _pct(change[0]) if change else None,
        "speedup_ci_low_pct": _pct(change[1]) if change else None,
        "speedup_ci_high_pct": _pct(change[2]) if change else None,
        "p_value": _finite(comparison.get("p_value")),
        "bar_pct": _pct(record.get("bar")) if record.get("kind") in KINDS_WITH_BAR else None,
        "verdict": record.get("verdict"),
        "title": record.get("title"),
        "commit": git.get("commit"),
        "dirty": git.get("dirty"),
    })
    return row


def rows(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The flat rows of one record (see `to_frame`); a record whose optional parts defeat them gives one row with
    only its id, kind, verdict and title, never an exception."""
    try:
        return _rows(record)
    except Exception:  # a valid record may still hold odd optional values: the row says what it can
        return [{**{name: None for name in COLUMNS}, "id": record.get("id"), "kind": record.get("kind"),
                 "verdict": record.get("verdict"), "title": record.get("title")}]


def _rows(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    arms = record.get("arms") or []
    kind = record.get("kind")
    of_kind = _m(record.get("verify")).get("of_kind") if kind == "verify" else None
    if kind in KINDS_WITH_WORKLOAD_ARMS or of_kind in KINDS_WITH_WORKLOAD_ARMS:  # one configuration, several tests
        return [_row(record, arm.get("label"), arm, None) for arm in arms]
    workload = _m(record.get("workload")).get("name")
    if kind == "sweep":  # a grid: every point; `point` says which is best / default
        best = _m(record.get("best")).get("label")
        default = _m(record.get("default")).get("label")
        out = []
        for arm in arms:
            tags = [t for t, label in (("best", best), ("default", default)) if arm.get("label") == label]
            out.append(_row(record, workload, arm, None, f"{arm.get('label')}" + (f" ({', '.join(tags)})" if tags else "")))
        return out
    if not arms:
        return [_row(record, workload, None, None)]
    return [_row(record, workload, arms[0], arms[1] if len(arms) > 1 else None)]


def to_frame(records: Iterable[Mapping[str, Any]]) -> "pd.DataFrame":
    """One row per record (a bench record: one per pp/tg test; a sweep: one per grid point) with the flat columns
    of `COLUMNS` (nullable dtypes; a missing value is <NA>).

    ``date`` is the timestamp; ``workload`` the workload's name; ``point`` a sweep point's label, tagged ``(best)``
    / ``(default)``; ``arm_a``/``arm_b`` are `arm_text` of arms[0]/arms[1]; ``a_*``/``b_*`` the arms' median,
    mean, std, p10, p90 (in ``unit``) and n. A bench record gives one row per test: ``workload`` is the test
    (``pp2048``), ``arm_a`` the engine knobs, ``a_mean`` ± ``a_std`` its tok/s. ``delta_pct``, ``ci_low_pct``,
    ``ci_high_pct`` are the stored comparison (B/A - 1) in percent; ``speedup_pct`` and its CI the same change as a
    speed-up (positive = B faster, for time and throughput alike); ``p_value`` the Wilcoxon p; ``bar_pct`` the bar
    for the kinds judged against one (ab, calibrate); ``commit``/``dirty`` come from ``git``. An empty string is
    stored as missing, so that every export reads back to the same frame; a character a terminal would take as
    control is stored as its escape (`minfer_cli.console.clean`).
    """
    import pandas as pd

    from minfer_cli.console import clean  # record text is never terminal control, in any export

    flat = [{k: (None if v == "" else clean(v) if isinstance(v, str) else v) for k, v in row.items()}
            for r in records for row in rows(r)]
    columns = {name: pd.array([row[name] for row in flat], dtype=dtype) for name, dtype in COLUMNS.items()}
    return pd.DataFrame(columns)


def export(records: Iterable[Mapping[str, Any]], fmt: str) -> str:
    """`to_frame` of ``records`` as text ending in a newline: ``md`` (a Markdown table), ``csv``, or ``json`` (a list
    of row objects). CSV and JSON read back to the same frame (see `COLUMNS`). Raises LedgerError for another
    format."""
    if fmt not in FORMATS:
        raise LedgerError(f"unknown export format {fmt!r}; valid formats: {', '.join(FORMATS)}")
    frame = to_frame(records)
    if fmt == "csv":
        return frame.to_csv(index=False)
    if fmt == "json":
        return frame.to_json(orient="records", force_ascii=False) + "\n"
    escaped = frame.astype(object).map(lambda v: v.replace("|", "\\|").replace("\n", " ") if isinstance(v, str) else v)
    shown = escaped.astype(object).where(frame.notna(), None)
    return shown.to_markdown(index=False, missingval="") + "\n"
