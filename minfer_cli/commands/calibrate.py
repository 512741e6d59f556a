"""`minfer calibrate EXP`: repeated A/A runs — the noise floor and the false-positive rate at a bar."""

from __future__ import annotations

from typing import List, Optional

import typer

from minfer_cli.commands import options, render
from minfer_cli.console import guard, out, progress
from minfer_cli.experiment import get


@guard
def calibrate(
    experiment: str = typer.Argument(..., help="Experiment name (see `minfer experiments list`)."),
    arm: Optional[List[str]] = typer.Option(None, "--arm", "-a", help="The arm run against itself, given once (default: every knob at its default)."),
    trials: int = typer.Option(10, "--trials", "-t", min=2, max=1000, help="Number of A/A comparisons."),
    workload: Optional[str] = options.WORKLOAD,
    bar: float = options.BAR,
    max_time: float = typer.Option(10.0, "--max-time", min=1.0, max=3600.0, help="Seconds per A/A trial."),
    min_rounds: int = typer.Option(10, "--min-rounds", min=3, max=10000, help="Rounds per trial before adaptive stopping."),
    flush: bool = options.FLUSH,
    warmup: float = options.WARMUP,
    no_record: bool = typer.Option(False, "--no-record", help="Do not append the calibration to the ledger."),
    note: str = options.NOTE,
    ledger: Optional[str] = options.LEDGER,
) -> None:
    """Run the same arm against itself N times: the spread of Δ is the noise floor, and the share of
    non-NEUTRAL verdicts is the false-positive rate at the bar. Pick a bar above the noise floor.

    Example: minfer calibrate copy --trials 10
    """
    from minfer_cli.measure.harness import measure_calibration, open_session
    from minfer_cli.measure.record import calibration_record

    exp = get(experiment)
    config = exp.config(options.single_arm(arm))
    wl = exp.workload(workload, [config])
    options.check_arms_can_run(exp, wl, [config], ["A"])
    if not no_record:
        options.check_ledger_writable(ledger)
    options.print_notes(exp, wl, [config], ["A"])
    with progress(f"calibrate {exp.name}") as report:
        session = open_session(exp, wl, flush=flush, warmup_s=warmup, progress=report)
        result = measure_calibration(session, config, trials=trials, bar=bar / 100.0, max_time_s=max_time,
                                     min_rounds=min_rounds, progress=report)
    out.print(render.arms_table(session, result.trials[-1].arms))
    s = result.summary
    if s is None:
        out.print("calibration: the arm failed its correctness check; nothing was timed")
    else:
        out.print(
            f"A/A over {s.trials} trials: Δ median {s.delta_median * 100:+.3f}%, std {s.delta_std * 100:.3f}%, "
            f"p95 |Δ| {s.delta_p95_abs * 100:.3f}%; false positives at bar {bar:.2g}%: {s.false_positive_rate * 100:.1f}%; "
            f"suggested bar ≥ {s.suggested_bar * 100:.2g}%"
        )
    out.print(render.environment_line(session, result.trials[-1].env_end))
    code = 0 if no_record else options.write_record(calibration_record(result, bar / 100.0, notes=note), ledger)
    if s is None:
        raise typer.Exit(code=1)
    if code:
        raise typer.Exit(code=code)
