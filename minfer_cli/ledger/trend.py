"""One figure over the ledger's history: the points `minfer ledger trend` charts and plots.

A METRIC is either a bench test (``pp2048``, ``tg128``: the label of a bench record's arm, the figure its mean ± std
in tok/s) or an experiment's own figure (``median``, or the metric's name, ``time`` / ``throughput``) of one
configuration on one workload: the arms of ab, run, sweep (and measured verify) records whose knobs match it.
This module returns data and raises `UsageError`; it never prints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from minfer_cli.errors import MinferError, UsageError
from minfer_cli.ledger.figures import knobs_text, stats_of

EXPERIMENT_METRICS = ("median", "time", "throughput")
"""METRIC names that pick an experiment's own figure (the arm's median) rather than a bench test."""
EXPERIMENT_KINDS = ("ab", "run", "sweep", "verify")
"""Kinds whose arms are configurations of an experiment on one workload (a verify only when it measured, and not
of a bench record, whose arms are bench tests)."""
COMMIT_CHARS = 8


@dataclass(frozen=True)
class TrendPoint:
    """One point of a trend: the record (``id``, ``timestamp`` ISO-8601 UTC, ``commit`` its first `COMMIT_CHARS`
    hex digits or ""), the figure ``value`` in ``unit``, the error bars as distances below and above the value
    (``err_low``, ``err_high``, both >= 0, None when the record has no spread), ``label`` what was measured (the
    bench test, or the record's kind and arm: ``ab B``), ``spread`` what the bars are (``± std``, ``p10–p90``,
    or "" when there are none), ``higher_is_better`` (the metric's direction) and ``knobs`` (the arm's)."""

    id: int
    timestamp: str
    commit: str
    value: float
    err_low: float | None
    err_high: float | None
    unit: str
    label: str
    spread: str = ""
    higher_is_better: bool = False
    knobs: dict = field(default_factory=dict, compare=False)


def _commit(record: Mapping[str, Any]) -> str:
    return str((record.get("git") or {}).get("commit") or "")[:COMMIT_CHARS]


def _same(a: Any, b: Any) -> bool:
    """Knob values are equal: as stored (4 == 4) or as typed on a command line ("4" == 4)."""
    return a == b or str(a) == str(b)


def _matches(knobs: Mapping[str, Any], wanted: Mapping[str, Any], only_shared: bool) -> bool:
    """``knobs`` hold every setting of ``wanted``; with ``only_shared``, a knob the arm lacks is not compared."""
    for key, value in wanted.items():
        if key not in knobs:
            if only_shared:
                continue
            return False
        if not _same(knobs[key], value):
            return False
    return True


def _is_bench(record: Mapping[str, Any]) -> bool:
    """A record whose arms are bench tests (labelled ``pp2048``, ``tg128``): a bench, or a verify of one."""
    return record.get("kind") == "bench" or (
        record.get("kind") == "verify" and (record.get("verify") or {}).get("of_kind") == "bench")


def _is_configurations(record: Mapping[str, Any]) -> bool:
    """A record whose arms are configurations of its experiment on its workload (ab, run, sweep, a measured
    verify of one of those)."""
    return record.get("kind") in EXPERIMENT_KINDS and not _is_bench(record)


def _ok_arms(record: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [a for a in record.get("arms") or [] if isinstance(a, Mapping) and a.get("status", "ok") == "ok"]


def bench_tests(records: Iterable[Mapping[str, Any]]) -> list[str]:
    """The bench tests (arm labels of bench records) in ``records``, sorted: ``pp512, pp2048, tg128``."""
    found = {str(a.get("label")) for r in records if r.get("kind") == "bench" for a in _ok_arms(r)}
    return sorted(found, key=lambda t: (t.rstrip("0123456789"), len(t), t))


def experiment_workloads(records: Iterable[Mapping[str, Any]]) -> dict[str, list[str]]:
    """Experiment -> the workload names its ab/run/sweep records measured (both sorted)."""
    found: dict[str, set[str]] = {}
    for r in records:
        if _is_configurations(r) and r.get("experiment") and r.get("arms"):
            found.setdefault(str(r["experiment"]), set()).add(str((r.get("workload") or {}).get("name")))
    return {e: sorted(ws) for e, ws in sorted(found.items())}


def _what_exists(records: list[Mapping[str, Any]]) -> str:
    tests = bench_tests(records)
    experiments = experiment_workloads(records)
    parts = []
    if tests:
        parts.append(f"bench tests {', '.join(tests)} (e.g. `minfer ledger trend {tests[-1]}`)")
    if experiments:
        parts.append(f"an experiment's median: `minfer ledger trend median -e EXP -w WORKLOAD [--arm K=V]` "
                     f"(experiments: {', '.join(experiments)})")
    return "; ".join(parts) if parts else "no measurement yet"


def _bench_points(records: list[Mapping[str, Any]], test: str, experiment: str | None, workload: str | None,
                  arm: Mapping[str, Any] | None) -> list[TrendPoint]:
    points = []
    for record in records:
        if not _is_bench(record):
            continue
        if experiment is not None and record.get("experiment") != experiment:
            continue
        if workload is not None and (record.get("workload") or {}).get("name") != workload:
            continue
        metric = record.get("metric") or {}
        for entry in _ok_arms(record):
            if str(entry.get("label")) != test or not _matches(entry.get("knobs") or {}, arm or {}, False):
                continue
            s = stats_of(entry)
            value = s["mean"] if s["mean"] is not None else s["median"]
            if value is None:
                continue
            low = high = None
            spread = ""
            if s["std"] is not None:
                low = high = s["std"]
                spread = "± std"
            elif s["p10"] is not None and s["p90"] is not None:
                low, high = max(0.0, value - s["p10"]), max(0.0, s["p90"] - value)
                spread = "p10–p90"
            points.append(TrendPoint(int(record["id"]), str(record.get("timestamp")), _commit(record), value, low,
                                     high, str(metric.get("unit") or ""), test, spread,
                                     bool(metric.get("higher_is_better")), dict(entry.get("knobs") or {})))
    return _label_configurations(points)


def _label_configurations(points: list[TrendPoint]) -> list[TrendPoint]:
    """Each point whose knobs differ from the newest point's (on the knobs both have) says so in its label
    (``pp2048 (GRAPHS=0)``): a bench run with other knobs is another configuration, not a step in this one's
    history."""
    if not points:
        return points
    newest = max(points, key=lambda p: (p.timestamp, p.id)).knobs
    try:  # a tg test reads only the decode knobs, a pp test only the others: the rest cannot move its figure
        from minfer_cli.engine.bench import DECODE_KNOBS
    except ImportError:
        DECODE_KNOBS = None
    out = []
    for p in points:
        tg = p.label.startswith("tg")
        differ = {k: v for k, v in p.knobs.items() if k in newest and not _same(v, newest[k])
                  and (DECODE_KNOBS is None or (k in DECODE_KNOBS) == tg)}
        out.append(p if not differ else TrendPoint(p.id, p.timestamp, p.commit, p.value, p.err_low, p.err_high, p.unit,
                                                   f"{p.label} ({knobs_text(differ)})", p.spread, p.higher_is_better,
                                                   p.knobs))
    return out


def _configuration(experiment: str, arm: Mapping[str, Any] | None) -> tuple[dict[str, Any], bool, str]:
    """(the knobs to match, whether only the knobs an arm has are compared, how to name them in an error)."""
    if arm:
        return dict(arm), False, f"--arm {knobs_text(arm)}"
    from minfer_cli.experiment import get

    try:
        defaults = get(experiment).default_config()
    except MinferError as exc:
        raise UsageError(f"the current defaults of experiment {experiment!r} are unknown ({exc}); name the "
                         "configuration with --arm K=V[,K=V]") from None
    return dict(defaults), True, f"its current defaults ({knobs_text(defaults)})"


def _experiment_points(records: list[Mapping[str, Any]], metric: str, experiment: str | None, workload: str | None,
                       arm: Mapping[str, Any] | None) -> list[TrendPoint]:
    known = experiment_workloads(records)
    if experiment is None:
        raise UsageError(f"metric {metric!r} is an experiment's figure: pick one with --experiment EXP --workload "
                         f"WORKLOAD (experiments: {', '.join(known) or 'none recorded yet'})")
    if experiment not in known:
        raise UsageError(f"no ab, run or sweep record of experiment {experiment!r} in this ledger; recorded "
                         f"experiments: {', '.join(known) or 'none yet'}")
    if workload is None:
        if len(known[experiment]) > 1:
            raise UsageError(f"experiment {experiment} was measured on several workloads; pick one with --workload "
                             f"({', '.join(known[experiment])})")
        workload = known[experiment][0]
    if workload not in known[experiment]:
        raise UsageError(f"no record of experiment {experiment} on workload {workload!r}; its recorded workloads: "
                         f"{', '.join(known[experiment])}")
    wanted, only_shared, named = _configuration(experiment, arm)
    points, seen_metrics = [], set()
    for record in records:
        if (not _is_configurations(record) or record.get("experiment") != experiment
                or (record.get("workload") or {}).get("name") != workload):
            continue
        record_metric = record.get("metric") or {}
        seen_metrics.add(str(record_metric.get("name")))
        if metric not in ("median", record_metric.get("name")):
            continue
        for entry in _ok_arms(record):
            knobs = entry.get("knobs") or {}
            if only_shared and not set(knobs) & set(wanted):
                continue  # no knob in common: nothing says this arm is the default configuration
            if not _matches(knobs, wanted, only_shared):
                continue
            s = stats_of(entry)
            if s["median"] is None:
                continue
            low = high = None
            spread = ""
            if s["p10"] is not None and s["p90"] is not None:
                low, high = max(0.0, s["median"] - s["p10"]), max(0.0, s["p90"] - s["median"])
                spread = "p10–p90"
            points.append(TrendPoint(int(record["id"]), str(record.get("timestamp")), _commit(record), s["median"],
                                     low, high, str(record_metric.get("unit") or ""),
                                     f"{record.get('kind')} {entry.get('label')}", spread,
                                     bool(record_metric.get("higher_is_better")), dict(knobs)))
    if not points and metric != "median" and metric not in seen_metrics:
        raise UsageError(f"experiment {experiment} records {', '.join(sorted(seen_metrics))}, not {metric!r}; use "
                         "`median` (the experiment's own metric)")
    if not points:
        raise UsageError(f"no arm of experiment {experiment} on workload {workload} matches {named}; name the "
                         "configuration with --arm K=V[,K=V] (see `minfer ledger show -e "
                         f"{experiment}` for the recorded arms)")
    if not only_shared:
        _refuse_mixed(points, wanted, named)
    return points


def _refuse_mixed(points: list[TrendPoint], wanted: Mapping[str, Any], name: str) -> None:
    """UsageError when the arms matching ``--arm`` differ in a knob ``--arm`` leaves out (among the arms that have
    it: a knob added since is absent from older records): a line through them would join different configurations
    (a Q4_K kernel and a Q6_K one) as if it were one figure's history."""
    named = set(wanted)
    keys = sorted({k for p in points for k in p.knobs} - named)
    # a knob the older records lack (added since) is compared among the records that have it
    varying = {k: sorted({str(p.knobs[k]) for p in points if k in p.knobs}) for k in keys}
    varying = {k: v for k, v in varying.items() if len(v) > 1}
    if varying:
        example = ",".join(f"{k}={v[0]}" for k, v in list(varying.items())[:2])
        raise UsageError(f"the arms matching {name} are {len(points)} of different configurations: they differ in "
                         + "; ".join(f"{k} ({', '.join(v[:4])}{', …' if len(v) > 4 else ''})" for k, v in varying.items())
                         + f"; name those knobs too, e.g. --arm {knobs_text(wanted)},{example}")


def series(records: Iterable[Mapping[str, Any]], metric: str, experiment: str | None = None,
           workload: str | None = None, arm: Mapping[str, Any] | None = None) -> list[TrendPoint]:
    """The points of ``metric`` over the ledger, oldest first (by timestamp, then id).

    ``metric`` a bench test (an arm label of bench records, ``pp2048``): one point per record holding that test,
    its mean (else median) with ± std error bars (else p10–p90); ``experiment``, ``workload`` (the model) and
    ``arm`` (knobs the arm must have) then only filter. ``metric`` ``median`` or the experiment's metric name
    (``time``, ``throughput``): one point per arm of the ab/run/sweep/verify records of ``experiment`` on
    ``workload`` (optional when the experiment was measured on one) whose knobs match the configuration: ``arm``
    ({knob: value}, values as stored or as text, every named knob must match) or else the experiment's current
    defaults (compared on the knobs both the arm and the defaults have); its median with p10–p90 bars. A bench
    point run with other knobs than the newest one says which in its label.

    Raises UsageError (one line) for an unknown metric, experiment or workload (naming what this ledger holds),
    when no point matches, and when the arms matching ``arm`` differ in another knob they all have.
    """
    records = [r for r in records if isinstance(r, Mapping)]
    bench_labels = {str(a.get("label")) for r in records if _is_bench(r) for a in _ok_arms(r)}
    if metric not in EXPERIMENT_METRICS and metric in bench_labels:
        points = _bench_points(records, metric, experiment, workload, arm)
        if not points:
            filters = ", ".join(f"{k} {v}" for k, v in (("experiment", experiment), ("workload", workload),
                                                       ("--arm", knobs_text(arm) if arm else None)) if v)
            raise UsageError(f"no bench record of {metric} matches {filters}; drop a filter, or see `minfer ledger "
                             f"show --kind bench`")
    elif metric in EXPERIMENT_METRICS:
        points = _experiment_points(records, metric, experiment, workload, arm)
    else:
        raise UsageError(f"no metric {metric!r} in this ledger; it holds {_what_exists(records)}")
    return sorted(points, key=lambda p: (p.timestamp, p.id))
