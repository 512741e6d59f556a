"""`minfer ab [EXP] --arm A --arm B`: interleaved A/B of two knob settings, verdict appended to the ledger."""

from __future__ import annotations

import json
from typing import List, Optional

import typer

from minfer_cli.commands import options, render
from minfer_cli.console import guard, out, progress
from minfer_cli.errors import UsageError
from minfer_cli.experiment import get, pick_for_arms
from minfer_cli.knobs import format_config



def resolve_arms(experiment: Optional[str], arms: List[str]):
    """The experiment and the two full configurations; UsageError for anything malformed or ambiguous."""
    if len(arms) != 2:
        raise UsageError(f"give exactly two --arm options (control A first, then B), got {len(arms)}; "
                         "e.g. minfer ab copy --arm VEC=1 --arm VEC=4")
    exp = get(experiment) if experiment else pick_for_arms(arms)
    configs = [exp.config(text) for text in arms]
    if configs[0] == configs[1]:
        raise UsageError(f"the two arms are identical ({format_config(configs[0])}); change at least one knob "
                         "(an A/A run is `minfer calibrate`)")
    return exp, configs


@guard
def ab(
    experiment: Optional[str] = typer.Argument(None, help="Experiment name; omitted: the one experiment owning the arms' knobs."),
    arm: List[str] = typer.Option([], "--arm", "-a", help="K=V[,K=V...]; give it twice: control A first, then B."),
    workload: Optional[str] = options.WORKLOAD,
    bar: float = options.BAR,
    max_time: float = typer.Option(60.0, "--max-time", min=1.0, max=3600.0, help="Stop after this many seconds of rounds even if the CI is still wide."),
    min_rounds: int = typer.Option(10, "--min-rounds", min=3, max=10000, help="Rounds before adaptive stopping may stop."),
    flush: bool = options.FLUSH,
    warmup: float = options.WARMUP,
    seed: Optional[int] = options.SEED,
    no_record: bool = typer.Option(False, "--no-record", help="Do not append the verdict to the ledger."),
    fail_on_regression: bool = typer.Option(False, "--fail-on-regression", help="Exit with status 1 when the verdict is REVERTED (gate a CI job)."),
    note: str = options.NOTE,
    title: Optional[str] = options.TITLE,
    ledger: Optional[str] = options.LEDGER,
    as_json: bool = options.JSON,
    plot: Optional[str] = options.PLOT,
    force: bool = options.FORCE,
) -> None:
    """Interleaved A/B comparison (ABBA rounds, adaptive stopping) of two arms of one experiment.

    Both arms are checked against the reference first (an arm that fails is INVALID, not timed). The result is
    B's speed-up over the control A (old time / new time - 1, or new rate / old rate - 1: "+14.1% faster"), from
    the median of per-round paired ratios, with a bootstrap 95% CI and a Wilcoxon p-value. LANDED: the CI wholly
    on the faster side and the change at least the bar; REVERTED: wholly on the slower side and at least the bar;
    NEUTRAL otherwise.

    Example: minfer ab copy --arm VEC=1 --arm VEC=4 --plot vec.png
    """
    from minfer_cli.measure.harness import measure_ab, open_session
    from minfer_cli.measure.record import ab_record

    options.check_plot(plot, force, ledger)
    exp, configs = resolve_arms(experiment, arm)
    wl = exp.workload(workload, configs)
    options.check_arms_can_run(exp, wl, configs, ["A", "B"])
    options.check_same_work(exp, configs, wl)
    if not no_record:
        options.check_ledger_writable(ledger)
    options.print_notes(exp, wl, configs, ["A", "B"])
    with progress(f"{exp.name} {wl.name}") as report:
        session = open_session(exp, wl, flush=flush, warmup_s=warmup, seed=seed, progress=report)
        result = measure_ab(session, configs, bar=bar / 100.0, max_time_s=max_time, min_rounds=min_rounds,
                            progress=report)
    out.print(render.arms_table(session, result.arms))
    for line in render.timing_lines(session, result.arms):
        out.print(line)
    if result.comparison is not None:
        out.print(f"stopped: {result.stop_reason} after {result.rounds} rounds, {result.elapsed_s:.1f} s"
                  + (f"; [yellow]{result.throttled_rounds} round(s) ran while the GPU reported throttling[/]"
                     if result.throttled_rounds else ""))
    out.print(render.environment_line(session, result.env_end))
    out.print(render.verdict_line(result.comparison, result.verdict, result.bar, exp.metric.higher_is_better))
    rec = ab_record(result, title, note)
    if as_json:
        print(json.dumps(rec, default=str))
    code = 0 if no_record else options.write_record(rec, ledger)
    options.draw_plot(plot, force, ledger, _plot_ab, rec)
    if fail_on_regression and result.verdict == "REVERTED":
        raise typer.Exit(code=1)
    if code:
        raise typer.Exit(code=code)


def _plot_ab(record: dict, path) -> None:
    from minfer_cli.ledger.plots import plot_ab  # matplotlib and the plot code only when a plot is asked for

    plot_ab(record, path)
