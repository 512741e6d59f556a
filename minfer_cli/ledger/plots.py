"""Pictures of ledger records and trends, drawn with matplotlib (imported only here, only when a plot is asked for).

Each function draws one figure to ``path`` (``.png`` or ``.svg``, picked by the suffix); commands pass a temporary
path through `minfer_cli.outputs.write_output`, which owns the checks and the rename. Figures are drawn on a
`matplotlib.figure.Figure` (no pyplot, no window, no global backend state). Every figure has a title and axis
labels with the metric's unit. Errors are `UsageError`s of one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from minfer_cli.errors import UsageError
from minfer_cli.ledger.figures import (
    comparison_change,
    differing_knobs,
    fmt_change,
    fmt_num,
    headline,
    stats_of,
    sweep_point,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from minfer_cli.ledger.trend import TrendPoint

COLORS = {"A": "#4C72B0", "B": "#DD8452", "best": "#2CA02C", "default": "#FF7F0E", "other": "#7F7F7F"}
MAX_TICKS = 24  # a trend labels at most this many records on its x axis


def _figure(width: float, height: float) -> "Figure":
    try:
        import matplotlib
        from matplotlib.figure import Figure
    except ImportError:
        raise UsageError("plots need matplotlib, which is not installed: pip install matplotlib") from None
    matplotlib.rcParams["text.parse_math"] = False  # titles and knobs are text: `$5` is five dollars, not math
    return Figure(figsize=(width, height), dpi=110, layout="constrained")


def _save(fig: "Figure", path: str | Path) -> None:
    suffix = Path(path).suffix.lower().lstrip(".")
    if suffix not in ("png", "svg"):
        raise UsageError(f"cannot draw {path}: the file name must end in .png or .svg")
    import warnings

    from matplotlib.text import Text

    from minfer_cli.console import clean

    for text in fig.findobj(Text):  # record text may hold control characters: drawn as their escapes
        shown = text.get_text()
        if not shown.replace("\n", "").isprintable():  # a title's own line breaks stay line breaks
            text.set_text("\n".join(clean(line) for line in shown.split("\n")))
    with warnings.catch_warnings():  # a character the font lacks (an emoji in a title) is drawn as a box, quietly
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from font")
        fig.savefig(path, format=suffix)


def _metric(record: Mapping[str, Any]) -> tuple[str, str, bool]:
    metric = record.get("metric") or {}
    return str(metric.get("name") or "value"), str(metric.get("unit") or ""), bool(metric.get("higher_is_better"))


def _axis_label(name: str, unit: str) -> str:
    return f"{name} ({unit})" if unit else name


def _subtitle(record: Mapping[str, Any]) -> str:
    commit = str((record.get("git") or {}).get("commit") or "")[:8]
    parts = [f"#{record['id']}" if record.get("id") is not None else "", str(record.get("timestamp") or "")[:10],
             commit,
             str(record.get("experiment") or ""), str((record.get("workload") or {}).get("name") or "")]
    return " · ".join(p for p in parts if p)


# ---------------------------------------------------------------------------------------------------- trend


def plot_trend(points: Sequence["TrendPoint"], path: str | Path, title: str) -> None:
    """Draw ``points`` (`minfer_cli.ledger.trend.series`, oldest first) to ``path``: each point's value over the
    records in date order (evenly spaced, so a burst of records on one day stays readable), error bars from
    ``err_low``/``err_high``, x ticks ``#id commit`` with the date below, the y axis in the points' unit.
    Raises UsageError when ``points`` is empty or ``path`` is not .png/.svg."""
    if not points:
        raise UsageError("nothing to plot: the trend has no points")
    fig = _figure(max(6.4, min(16.0, 2.0 + 0.45 * len(points))), 4.8)
    ax = fig.add_subplot()
    xs = list(range(len(points)))
    values = [p.value for p in points]
    has_bars = any(p.err_low is not None for p in points)
    if has_bars:
        yerr = [[p.err_low or 0.0 for p in points], [p.err_high or 0.0 for p in points]]
        ax.errorbar(xs, values, yerr=yerr, fmt="-o", color=COLORS["A"], ecolor="#555555", capsize=3,
                    markersize=5, linewidth=1.2)
    else:
        ax.plot(xs, values, "-o", color=COLORS["A"], markersize=5, linewidth=1.2)
    step = max(1, -(-len(points) // MAX_TICKS))
    shown = xs[::step]
    ax.set_xticks(shown, [f"#{points[i].id} {points[i].commit}\n{points[i].timestamp[:10]}" for i in shown],
                  rotation=45, ha="right", fontsize=8)
    unit = points[0].unit
    spread = next((p.spread for p in points if p.spread), "")
    direction = "higher is better" if points[0].higher_is_better else "lower is better"
    ax.set_ylabel(_axis_label(points[0].label if len({p.label for p in points}) == 1 else "value", unit))
    ax.set_xlabel(f"record (#id commit, date), oldest first · {direction}" + (f" · bars: {spread}" if spread else ""))
    ax.set_title(title)
    ax.grid(True, axis="y", alpha=0.3)
    _save(fig, path)


# ---------------------------------------------------------------------------------------------------- ab


def _samples(record: Mapping[str, Any], arm: Mapping[str, Any]) -> list[float]:
    samples = arm.get("samples")
    if not isinstance(samples, list) or not samples:
        if arm.get("status", "ok") != "ok":
            raise UsageError(f"record #{record.get('id')}: arm {arm.get('label')} was not measured "
                             f"({arm.get('error') or 'invalid'}), so there is nothing to plot")
        raise UsageError(f"record #{record.get('id')} predates per-round samples (schema {record.get('schema')}, "
                         "no arms[].samples), so its rounds cannot be plotted; `minfer ledger show "
                         f"{record.get('id')}` prints its figures")
    return [float(v) for v in samples]


def plot_ab(record: Mapping[str, Any], path: str | Path) -> None:
    """Draw an A/B record (two arms with per-round ``samples``) to ``path``: left, each arm's per-round medians as
    a violin with the points over it, both medians marked; right (when both arms have one value per round), each
    round's speed-up of B over A in percent with its median, the CI and the bar. The title gives the speed-up,
    its 95% CI and the verdict. Raises UsageError for a record without two arms or without samples (one that
    predates per-round samples)."""
    import numpy as np

    arms = [a for a in record.get("arms") or [] if isinstance(a, Mapping)]
    if len(arms) != 2:
        raise UsageError(f"record #{record.get('id')} has {len(arms)} arm(s); an A/B plot needs two")
    series = [_samples(record, arm) for arm in arms]
    name, unit, higher = _metric(record)
    paired = len(series[0]) == len(series[1]) and len(series[0]) > 1
    fig = _figure(11.0 if paired else 6.4, 4.8)
    ax = fig.add_subplot(1, 2, 1) if paired else fig.add_subplot()
    varied = differing_knobs(arms)
    names = []
    for i, (arm, values) in enumerate(zip(arms, series)):
        color = COLORS["A" if i == 0 else "B"]
        if len(values) > 1:
            parts = ax.violinplot([values], positions=[i], widths=0.7, showextrema=False)
            for body in parts["bodies"]:
                body.set_facecolor(color)
                body.set_alpha(0.25)
        jitter = np.random.default_rng(i).uniform(-0.12, 0.12, len(values))
        ax.scatter(i + jitter, values, s=14, color=color, alpha=0.8, zorder=3, label=f"{arm.get('label')} rounds")
        recorded = stats_of(arm)["median"]  # the arm's figure as tables print it, else the rounds' median
        median = recorded if recorded is not None else float(np.median(values))
        ax.hlines(median, i - 0.3, i + 0.3, color="black", linewidth=2, zorder=4)
        ax.annotate(f"median {fmt_num(median)}", (i + 0.32, median), va="center", fontsize=8)
        knobs = arm.get("knobs") or {}
        names.append(f"{arm.get('label')}\n" + ",".join(f"{k}={knobs.get(k)}" for k in varied[:3]))
    ax.set_xticks([0, 1], names)
    ax.set_xlim(-0.6, 1.9)
    ax.set_ylabel(_axis_label(f"per-round median {name}", unit))
    ax.set_xlabel("arm (knobs that differ)")
    ax.grid(True, axis="y", alpha=0.3)
    change = comparison_change(record)
    if change is not None:
        verdict = f"{fmt_change(change[0])} [{change[1] * 100:+.1f}, {change[2] * 100:+.1f}] 95% CI"
    else:
        verdict = "no comparison"
    if paired:
        a, b = np.asarray(series[0]), np.asarray(series[1])
        per_round = (b / a - 1.0 if higher else a / b - 1.0) * 100.0
        right = fig.add_subplot(1, 2, 2)
        rounds = np.arange(1, len(per_round) + 1)
        right.plot(rounds, per_round, "o-", color=COLORS["B"], markersize=4, linewidth=1, label="per round")
        right.axhline(0.0, color="black", linewidth=0.8)
        if change is not None:
            right.axhspan(change[1] * 100, change[2] * 100, color=COLORS["B"], alpha=0.15, label="95% CI")
            right.axhline(change[0] * 100, color=COLORS["B"], linewidth=1.5, label="speed-up")
        bar = record.get("bar")
        verify = record.get("verify") if record.get("kind") == "verify" else None
        recorded = ((verify or {}).get("recorded") or {}).get("speedup") if isinstance(verify, Mapping) else None
        bar = (verify.get("bar") if isinstance(verify, Mapping) and verify.get("bar") is not None else bar)
        if isinstance(recorded, (int, float)) and isinstance(bar, (int, float)):
            # a verify is judged against the recorded effect ± the bar: that band, not ± the bar around 0
            right.axhspan((recorded - bar) * 100, (recorded + bar) * 100, color="#999999", alpha=0.2,
                          label=f"recorded {recorded * 100:+.1f}% ± bar (HOLDS if the CI reaches it)")
        elif isinstance(bar, (int, float)) and bar > 0:
            for sign in (-1, 1):
                right.axhline(sign * bar * 100, color="#999999", linestyle="--", linewidth=0.8,
                              label="bar" if sign > 0 else None)
        right.set_xlabel("round")
        right.set_ylabel("speed-up of B over A (%)")
        right.legend(fontsize=8, loc="best")
        right.grid(True, alpha=0.3)
    fig.suptitle(f"{record.get('title')}\n{verdict} · {record.get('verdict')} · {_subtitle(record)}", fontsize=10)
    _save(fig, path)


# ---------------------------------------------------------------------------------------------------- sweep


def _point_text(arm: Mapping[str, Any], varied: list[str]) -> str:
    knobs = arm.get("knobs") or {}
    return ",".join(f"{k}={knobs.get(k)}" for k in varied) or str(arm.get("label"))


def plot_sweep(record: Mapping[str, Any], path: str | Path) -> None:
    """Draw a sweep (or run) record to ``path``: every point's median with p10–p90 bars, best first, each labelled
    by the knobs that vary across the grid; the best point and the default (``record["default"]``) coloured and
    named in the legend; invalid points listed last, marked. Raises UsageError for a record without arms."""
    arms = [a for a in record.get("arms") or [] if isinstance(a, Mapping)]
    if not arms:
        raise UsageError(f"record #{record.get('id')} has no points to plot")
    name, unit, higher = _metric(record)
    varied = differing_knobs(arms)
    best, default = sweep_point(record, "best"), sweep_point(record, "default")
    measured = [a for a in arms if stats_of(a)["median"] is not None]
    measured.sort(key=lambda a: stats_of(a)["median"], reverse=higher)
    invalid = [a for a in arms if stats_of(a)["median"] is None]
    order = measured + invalid
    fig = _figure(8.0, max(3.2, min(40.0, 1.6 + 0.28 * len(order))))
    ax = fig.add_subplot()
    ys = list(range(len(order)))
    for y, arm in zip(ys, order):
        s = stats_of(arm)
        if s["median"] is None:
            ax.annotate("INVALID", (0, y), xycoords=("axes fraction", "data"), xytext=(4, 0),
                        textcoords="offset points", va="center", fontsize=8, color="#B00020")
            continue
        role = "best" if arm is best else "default" if arm is default else "other"
        low = s["median"] - s["p10"] if s["p10"] is not None else 0.0
        high = s["p90"] - s["median"] if s["p90"] is not None else 0.0
        ax.errorbar([s["median"]], [y], xerr=[[max(0.0, low)], [max(0.0, high)]], fmt="o", color=COLORS[role],
                    ecolor=COLORS[role], capsize=3, markersize=6 if role != "other" else 4,
                    label={"best": "best", "default": "default"}.get(role))
    labels = []
    for arm in order:
        tags = [t for t, point in (("best", best), ("default", default)) if arm is point]
        labels.append(_point_text(arm, varied) + (f" ({', '.join(tags)})" if tags else ""))
    ax.set_yticks(ys, labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(_axis_label(f"median {name}", unit) + " · bars p10–p90 · " +
                  ("higher is better" if higher else "lower is better"))
    ax.set_ylabel("point (" + ",".join(varied) + ")" if varied else "point")
    ax.grid(True, axis="x", alpha=0.3)
    if best is not None or default is not None:
        ax.legend(fontsize=8, loc="best")
    head = headline(record)
    fig.suptitle(f"{record.get('title')}\n{' '.join(t for t in (head.result, head.change) if t)} · "
                 f"{_subtitle(record)}", fontsize=10)
    _save(fig, path)


# ---------------------------------------------------------------------------------------------------- bench


def _plot_bench(record: Mapping[str, Any], path: str | Path) -> None:
    arms = [a for a in record.get("arms") or [] if isinstance(a, Mapping) and stats_of(a)["median"] is not None]
    if not arms:
        raise UsageError(f"record #{record.get('id')} has no measured test to plot")
    name, unit, higher = _metric(record)
    peer = record.get("peer") if isinstance(record.get("peer"), Mapping) else {}
    peer_figures = peer.get("figures") if isinstance(peer.get("figures"), Mapping) else {}
    fig = _figure(max(4.0, 3.0 * len(arms)), 4.4)
    axes = fig.subplots(1, len(arms), squeeze=False)[0]
    for ax, arm in zip(axes, arms):  # one panel per test: pp and tg rates differ by orders of magnitude
        s = stats_of(arm)
        value = s["mean"] if s["mean"] is not None else s["median"]
        test = str(arm.get("label"))
        ax.bar([0], [value], yerr=[[s["std"] or 0.0], [s["std"] or 0.0]], color=COLORS["A"], capsize=6, width=0.6)
        ax.annotate(fmt_num(value) + (f" ± {fmt_num(s['std'])}" if s["std"] is not None else ""), (0, value),
                    xytext=(0, 4), textcoords="offset points", ha="center", va="bottom", fontsize=8)
        ticks = ["minfer"]
        other = peer_figures.get(test)
        if isinstance(other, (int, float)):
            ax.bar([1], [other], color=COLORS["other"], width=0.6)
            ax.annotate(fmt_num(float(other)), (1, other), xytext=(0, 4), textcoords="offset points",
                        ha="center", va="bottom", fontsize=8)
            ticks.append(str(peer.get("engine") or "peer"))
        ax.set_xticks(range(len(ticks)), ticks)
        ax.set_xlim(-0.8, len(ticks) - 0.2)
        ax.margins(y=0.12)
        ax.set_title(test)
        ax.set_ylabel(_axis_label(name, unit))
        ax.set_xlabel("engine (bars: ± std)")
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(f"{record.get('title')}\n{_subtitle(record)}", fontsize=10)
    _save(fig, path)


def plot_refusal(record: Mapping[str, Any]) -> str | None:
    """Why `plot_record` cannot draw ``record``, in one sentence, or None: asked before anything is printed."""
    kind = record.get("kind")
    if kind == "verify" and record.get("arms"):
        kind = (record.get("verify") or {}).get("of_kind")
    if kind not in ("bench", "ab", "sweep", "run"):
        return (f"record #{record.get('id')} is a {record.get('kind')} record; pictures exist for ab, sweep, run and "
                "bench records (and a verify that re-measured one)")
    if kind == "ab":
        try:
            for arm in (record.get("arms") or [])[:2]:
                _samples(record, arm)
        except UsageError as exc:
            return str(exc)
    return None


def plot_record(record: Mapping[str, Any], path: str | Path) -> None:
    """Draw one record to ``path`` by its kind: ab (and a measured verify of one) `plot_ab`; sweep and run
    `plot_sweep`; bench (and a measured verify of one) a bar per test, mean ± std, with a peer engine's figure
    beside it when recorded. Raises UsageError for a kind without a picture (calibrate, check, retire) and as the
    plot functions do."""
    kind = record.get("kind")
    if kind == "verify" and record.get("arms"):  # a measured verify: drawn as what it re-measured
        kind = (record.get("verify") or {}).get("of_kind")
    if kind == "bench":
        _plot_bench(record, path)
    elif kind == "ab":
        plot_ab(record, path)
    elif kind in ("sweep", "run"):
        plot_sweep(record, path)
    else:
        raise UsageError(f"record #{record.get('id')} is a {record.get('kind')} record; pictures exist for ab, "
                         "sweep, run and bench records (and a verify that re-measured one)")
