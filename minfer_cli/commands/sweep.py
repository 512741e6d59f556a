"""`minfer sweep EXP K=v1,v2 ...`: a grid over knob values, each point gated and timed, ranked fastest first."""

from __future__ import annotations

import json
from typing import List, Optional

import typer

from minfer_cli.commands import options, render
from minfer_cli.console import guard, out, progress
from minfer_cli.errors import UsageError
from minfer_cli.experiment import get
from minfer_cli.knobs import parse_grid


@guard
def sweep(
    experiment: str = typer.Argument(..., help="Experiment name (see `minfer experiments list`)."),
    axes: List[str] = typer.Argument(None, help="Grid axes K=v1,v2,...; knobs not named keep their defaults."),
    workload: Optional[str] = options.WORKLOAD,
    samples: int = typer.Option(20, "--samples", "-n", min=3, max=100000, help="Samples per point."),
    max_time: float = typer.Option(10.0, "--max-time", min=1.0, max=3600.0, help="Seconds of sampling per point at most."),
    flush: bool = options.FLUSH,
    warmup: float = typer.Option(0.5, "--warmup", min=0.0, max=60.0, help="Warm-up seconds per point."),
    record: bool = typer.Option(False, "--record", help="Append the whole ranked grid to the ledger (best point marked)."),
    note: str = options.NOTE,
    title: Optional[str] = options.TITLE,
    ledger: Optional[str] = options.LEDGER,
    as_json: bool = options.JSON,
    plot: Optional[str] = options.PLOT,
    force: bool = options.FORCE,
) -> None:
    """Measure every point of a knob grid with the same harness and rank them (a failing point is INVALID,
    listed last, never a crash). The experiment's default configuration is measured too (added to the grid when
    the grid lacks it), so the record holds the best point's change against the default of its time. This is how
    defaults are found; confirm a winner with `minfer ab`.

    Example: minfer sweep gemm_f16 TM=64,128,256 STAGES=3,4 --plot tiles.svg
    """
    from minfer_cli.measure.harness import measure_sweep, open_session
    from minfer_cli.measure.record import sweep_ranking, sweep_record

    options.check_plot(plot, force, ledger)
    exp = get(experiment)
    configs = parse_grid(exp.knobs, axes or [], f"experiment {exp.name}", exp.removed_knobs)
    wl = exp.workload(workload, configs)
    problems = [exp.refuse(config, wl) for config in configs]
    if all(problems):
        raise UsageError(f"no point of the grid can run on workload {wl.name}: {problems[0]}")
    default = exp.default_config()
    for axis in axes or []:  # an axis none of whose non-default values can run is no comparison at all
        key = axis.partition("=")[0].strip()
        moved = [p for c, p in zip(configs, problems) if c[key] != default[key]]
        if moved and all(moved):
            raise UsageError(f"axis {key} cannot vary on workload {wl.name}: {moved[0]}")
    if default not in configs and exp.refuse(default, wl) is None:
        configs.append(default)  # measured too, so the best point's change against today's default is on record
    default_label = f"p{configs.index(default) + 1}" if default in configs else None
    if record:
        options.check_ledger_writable(ledger)
    with progress(f"sweep {exp.name} {wl.name} ({len(configs)} points)") as report:
        session = open_session(exp, wl, flush=flush, warmup_s=warmup, progress=report)
        outcomes = measure_sweep(session, configs, samples=samples, max_time_s=max_time, progress=report)
    ranked = sweep_ranking(exp, outcomes)
    out.print(render.arms_table(session, ranked))
    for line in render.timing_lines(session, ranked[:1]):
        out.print(line)
    out.print(render.environment_line(session, session.nvml.state()))
    rec = sweep_record(session, outcomes, session.nvml.state(), title, note, default_label=default_label)
    if as_json:
        print(json.dumps(rec, default=str))
    code = options.write_record(rec, ledger) if record else 0
    options.draw_plot(plot, force, ledger, _plot_sweep, rec)
    if code:
        raise typer.Exit(code=code)


def _plot_sweep(record: dict, path) -> None:
    from minfer_cli.ledger.plots import plot_sweep  # matplotlib and the plot code only when a plot is asked for

    plot_sweep(record, path)
