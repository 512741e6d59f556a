"""`minfer ledger trend METRIC`: one figure over the ledger's history, as a terminal chart, JSON/CSV, or a plot.

Core: `minfer_cli.ledger.trend` (the points), `minfer_cli.ledger.plots` (the picture), `minfer_cli.outputs` (the file).
"""

from __future__ import annotations

import csv
import dataclasses
import io
from pathlib import Path
from typing import Optional, Sequence

import typer
from rich.table import Table
from rich.text import Text

from minfer_cli.commands.ledger_common import LEDGER, load_contents, report_problems, resolve_dir
from minfer_cli.console import clean, err, guard, json_text, out
from minfer_cli.errors import UsageError
from minfer_cli.knobs import parse_arm_text
from minfer_cli.ledger import figures
from minfer_cli.ledger import trend as core_trend
from minfer_cli.outputs import PLOT_SUFFIXES, check_output_path, write_output

FORMATS = ("table", "json", "csv")
BAR_MIN = 8  # the chart's bar column never gets narrower than this many characters
_EIGHTHS = " ▏▎▍▌▋▊▉"


def bar_text(value: float, low: float, high: float, width: int) -> str:
    """A horizontal bar of block characters, ``width`` cells at most: one cell for ``low``, all of them for
    ``high`` (the series' min and max), in eighths of a cell between; every bar is full when low == high."""
    fraction = (value - low) / (high - low) if high > low else 1.0
    eighths = 8 + round(max(0.0, min(1.0, fraction)) * (width - 1) * 8)
    return "█" * (eighths // 8) + (_EIGHTHS[eighths % 8] if eighths % 8 else "")


def value_text(point: core_trend.TrendPoint) -> str:
    """A point's value and its error bars: ``28,802 ± 127`` (symmetric), ``15.69 −0.144 +0.206`` (p10–p90)."""
    text = figures.fmt_num(point.value)
    if point.err_low is None or point.err_high is None:
        return text
    if figures.fmt_num(point.err_low) == figures.fmt_num(point.err_high):
        return f"{text} ± {figures.fmt_num(point.err_low)}"
    return f"{text} −{figures.fmt_num(point.err_low)} +{figures.fmt_num(point.err_high)}"


def _width(name: str, cells: list[str]) -> int:
    return max(len(name), *(len(c) for c in cells))


def chart(points: Sequence[core_trend.TrendPoint], width: int) -> Table:
    """The terminal chart: one row per point (id, date, commit, the arm when points differ in it, value ± error
    bars, a bar scaled between the series' min and max); the bar column takes what ``width`` leaves, so the table
    is ``width`` wide and no cell wraps. On a narrow terminal the date loses its year, then the arm and the commit
    columns go; below that, cells end in …."""
    unit = points[0].unit
    columns: list[tuple[str, str, list[str]]] = [
        ("id", "right", [str(p.id) for p in points]),
        ("date", "left", [p.timestamp[:10] for p in points]),
        ("commit", "left", [p.commit or "—" for p in points]),
    ]
    if len({p.label for p in points}) > 1:
        columns.append(("arm", "left", [p.label for p in points]))
    columns.append((f"value ({unit})" if unit else "value", "right", [value_text(p) for p in points]))

    def spare() -> int:  # show_edge/pad_edge off: a separator and a space each side between columns
        return width - sum(_width(name, cells) for name, _, cells in columns) - 3 * len(columns)

    # a label naming other knobs than the newest point's ("tg128 (GRAPHS=0)") is kept, cut to fit, never dropped
    labelled = any("(" in p.label for p in points)
    for shrink in ("date", "commit") + (() if labelled else ("arm",)):
        if spare() >= BAR_MIN:
            break
        if shrink == "date":
            columns[1] = ("date", "left", [p.timestamp[5:10] for p in points])
        else:
            columns = [c for c in columns if c[0] != shrink]
    if labelled and spare() < BAR_MIN:
        i = next(i for i, c in enumerate(columns) if c[0] == "arm")
        room = max(8, _width(*columns[i][::2]) - (BAR_MIN - spare()))
        columns[i] = ("arm", "left", [label if len(label) <= room else label[:room - 1] + "…" for label in columns[i][2]])
    bar_width = max(BAR_MIN, spare())
    low, high = min(p.value for p in points), max(p.value for p in points)
    table = Table(show_edge=False, header_style="bold", pad_edge=False)
    for name, justify, _ in columns:  # a header may hold record text (the unit): a Text, never markup
        table.add_column(Text(clean(name)), justify=justify, no_wrap=True, overflow="ellipsis")
    span = f"{figures.fmt_num(low)} … {figures.fmt_num(high)}"
    table.add_column(span if len(span) <= bar_width else "", no_wrap=True, overflow="crop", width=bar_width)
    for i, point in enumerate(points):
        table.add_row(*(Text(clean(cells[i])) for _, _, cells in columns),
                      Text(bar_text(point.value, low, high, bar_width), style="cyan"))
    return table


def _title(metric: str, points: Sequence[core_trend.TrendPoint], experiment: Optional[str],
           workload: Optional[str], arm: Optional[str]) -> str:
    if metric in core_trend.EXPERIMENT_METRICS:
        where = f"{experiment} · {workload}" if workload else str(experiment)
        return f"{where}: median at {arm or 'the current defaults'}"
    filters = " · ".join(x for x in (experiment, workload, arm) if x)
    others = " (a point run with other knobs than the newest names them)" if any("(" in p.label for p in points) else ""
    return f"{metric}" + (f" ({filters})" if filters else "") + " over the ledger" + others


def _heading(points: Sequence[core_trend.TrendPoint]) -> str:
    spread = next((p.spread for p in points if p.spread), "")
    direction = "higher is better" if points[0].higher_is_better else "lower is better"
    return f"{len(points)} point(s), oldest first, {direction}" + (f"; error: {spread}" if spread else "")


@guard
def trend(
    metric: str = typer.Argument(
        ..., show_default=False,
        help="A bench test (pp2048, tg128: its mean ± std in tok/s), or `median` (also `time` / `throughput`) for "
        "an experiment's own figure with --experiment and --workload.",
    ),
    experiment: Optional[str] = typer.Option(None, "--experiment", "-e", help="The experiment (needed for median; "
                                             "with a bench test, only its records)."),
    workload: Optional[str] = typer.Option(None, "--workload", "-w", help="The workload (for median: needed when the "
                                           "experiment was measured on several; with a bench test, the model)."),
    arm: Optional[str] = typer.Option(None, "--arm", "-a", metavar="K=V[,K=V]", help="The configuration: only arms "
                                      "with these knob values (for median, default: the experiment's current "
                                      "defaults, matched on the knobs a record has)."),
    plot: Optional[Path] = typer.Option(None, "--plot", metavar="FILE", help="Also draw the trend to FILE (.png or "
                                        ".svg; outside the ledger directory)."),
    force: bool = typer.Option(False, "--force", help="Replace an existing --plot FILE."),
    fmt: str = typer.Option("table", "--format", "-f", help=f"Output: {', '.join(FORMATS)} (json/csv: one object "
                            "or row per point: id, timestamp, commit, value, err_low, err_high, unit, label, spread)."),
    ledger: Optional[Path] = LEDGER,
) -> None:
    """Chart one figure over the ledger's history: one row per record, oldest first, with a bar per point.

    A bench test (pp2048, tg128) charts every bench record's mean ± std of that test. `median` charts an
    experiment's median on one workload at one configuration (the current defaults, or --arm) over its ab, run and
    sweep records, with p10–p90 as the error. An unknown METRIC lists those this ledger holds.

    Examples:

      minfer ledger trend tg128 --plot tg128.png

      minfer ledger trend median -e gemv -w ffn_down --arm RPB=4,WPR=4,PDL=1

      minfer ledger trend pp2048 --format csv > pp2048.csv
    """
    fmt = fmt.lower()
    if fmt not in FORMATS:
        raise UsageError(f"unknown --format {fmt!r}; valid formats: {', '.join(FORMATS)}")
    settings = parse_arm_text(arm) if arm is not None else None
    directory = resolve_dir(ledger)
    if plot is not None:
        check_output_path(plot, force=force, ledger_dir=directory, suffixes=PLOT_SUFFIXES)
    contents = load_contents(directory)
    flagged = report_problems(contents)
    points = core_trend.series(contents.records, metric, experiment=experiment, workload=workload, arm=settings)
    title = _title(metric, points, experiment, workload, arm)
    if fmt == "json":
        print(json_text([dataclasses.asdict(p) for p in points]))
    elif fmt == "csv":
        buffer = io.StringIO()
        fields = [f.name for f in dataclasses.fields(core_trend.TrendPoint) if f.name != "knobs"]  # JSON has them
        writer = csv.DictWriter(buffer, fieldnames=fields, lineterminator="\n", extrasaction="ignore")
        writer.writeheader()
        writer.writerows({k: clean(v) if isinstance(v, str) else v for k, v in dataclasses.asdict(p).items()}
                         for p in points)
        print(buffer.getvalue(), end="")
    else:
        out.print(Text(clean(title), style="bold"), no_wrap=True, overflow="ellipsis", crop=True)
        out.print(_heading(points), no_wrap=True, overflow="ellipsis", crop=True, markup=False)
        out.print(chart(points, out.width))
    if plot is not None:
        from minfer_cli.ledger import plots

        written = write_output(plot, lambda tmp: plots.plot_trend(points, tmp, title), force=force,
                               ledger_dir=directory, suffixes=PLOT_SUFFIXES)
        (out if fmt == "table" else err).print(f"plot written to {written}", markup=False, soft_wrap=True)
    if flagged:
        raise typer.Exit(code=1)
