"""`minfer run EXP`: one arm alone — median µs, spread, TFLOP/s, GB/s, % of the measured roofline."""

from __future__ import annotations

import json
from typing import List, Optional

import typer

from minfer_cli.commands import options, render
from minfer_cli.console import guard, out, progress
from minfer_cli.experiment import get


@guard
def run(
    experiment: str = typer.Argument(..., help="Experiment name (see `minfer experiments list`)."),
    arm: Optional[List[str]] = options.ARM_ONCE,
    workload: Optional[str] = options.WORKLOAD,
    samples: int = typer.Option(50, "--samples", "-n", min=5, max=100000, help="Samples to take."),
    max_time: float = typer.Option(30.0, "--max-time", min=1.0, max=3600.0, help="Stop sampling after this many seconds."),
    flush: bool = options.FLUSH,
    warmup: float = options.WARMUP,
    seed: Optional[int] = options.SEED,
    record: bool = typer.Option(False, "--record", help="Append the result to the ledger (verdict MEASURED)."),
    note: str = options.NOTE,
    title: Optional[str] = options.TITLE,
    ledger: Optional[str] = options.LEDGER,
    as_json: bool = options.JSON,
) -> None:
    """Measure one arm of an experiment after checking it against the reference.

    Example: minfer run copy --arm VEC=4
    """
    from minfer_cli.measure.harness import measure_run, open_session
    from minfer_cli.measure.record import run_record

    exp = get(experiment)
    config = exp.config(options.single_arm(arm))
    wl = exp.workload(workload, [config])
    options.check_arms_can_run(exp, wl, [config], ["A"])
    if record:
        options.check_ledger_writable(ledger)
    options.print_notes(exp, wl, [config], ["A"])
    with progress(f"{exp.name} {wl.name}") as report:
        session = open_session(exp, wl, flush=flush, warmup_s=warmup, seed=seed, progress=report)
        result = measure_run(session, config, samples=samples, max_time_s=max_time, progress=report)
    out.print(render.arms_table(session, [result.arm]))
    for line in render.timing_lines(session, [result.arm]):
        out.print(line)
    out.print(render.environment_line(session, result.env_end))
    rec = run_record(result, title, note)
    if as_json:
        print(json.dumps(rec, default=str))
    code = options.write_record(rec, ledger) if record else 0
    if result.arm.status != "ok":
        raise typer.Exit(code=1)
    if code:
        raise typer.Exit(code=code)
