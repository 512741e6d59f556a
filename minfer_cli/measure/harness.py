"""The measurement harness: one session per (experiment, workload), arms prepared and gated, then timed.

Order of work, for every command that times (`run`, `ab`, `calibrate`):
  1. the device is probed (NoGpuError naming `minfer doctor` when there is none);
  2. the L2-defeating ring of input sets, the output and the optional flush buffer are allocated once;
  3. each arm is prepared (compiled), its output poisoned with NaN, launched once and checked against the
     experiment's reference: an arm that fails, or raises while compiling or launching, is INVALID and is not
     timed;
  4. valid arms warm up (time-budgeted), pick their timing method (graph/eager, batch) and are sampled.
Results are dataclasses; `minfer_cli/commands/` renders them and `minfer_cli/ledger.py` stores them.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from minfer_cli.baselines import Ceilings, Throughput, ceilings_for, throughput
from minfer_cli.experiment import Experiment, Workload
from minfer_cli.knobs import Config, format_config
from minfer_cli.measure import environment as envmod
from minfer_cli.measure.device import DeviceInfo, require_timing_device
from minfer_cli.measure.interleave import run_interleaved
from minfer_cli.measure.stats import ArmStats, Comparison, calibration_summary, summarize
from minfer_cli.measure.timing import ArmTimer, RingPlan, SelfTimer, TimingMethod, plan_ring

Progress = Callable[[str, float], None]
"""progress(description, fraction in [0, 1]) — called by long steps; the CLI maps it onto a rich bar."""


def _quiet(_: str, __: float) -> None:
    return None


@dataclass
class ArmOutcome:
    """One arm: its knobs, whether it passed the correctness gate, and (if timed) its statistics."""

    label: str
    config: Config
    status: str = "ok"  # ok | invalid
    error: str | None = None
    parity_error: float | None = None
    tolerance: float | None = None
    stats: ArmStats | None = None
    figures: Throughput | None = None
    timing: TimingMethod | None = None
    samples: list[float] = field(default_factory=list)
    """The values the stats summarise, in order: each sample (run, sweep) or each round's median (an A/B arm)."""


@dataclass
class Session:
    """Device, stream, ring and buffers shared by the arms of one measurement."""

    experiment: Experiment
    workload: Workload
    device: DeviceInfo
    ceilings: Ceilings | None
    stream: object
    plan: RingPlan
    ring: list
    output: object
    flush_buffer: object | None
    nvml: envmod.Nvml
    env_start: envmod.GpuState
    warmup_s: float


def open_session(experiment: Experiment, workload: Workload, *, flush: bool = False, warmup_s: float = 1.0,
                 seed: int | None = None, progress: Progress = _quiet) -> Session:
    """Probe the device and allocate the ring, output and flush buffer once (never inside the sampling loop)."""
    from numba import cuda

    device = require_timing_device()
    nvml = envmod.Nvml(device.uuid)
    plan = plan_ring(experiment.input_set_bytes(workload), device.l2_bytes, flush=flush)
    need = plan.total_bytes + (2 * device.l2_bytes if "flush" in plan.mode else 0)
    if device.memory_bytes and need > 0.8 * device.memory_bytes:
        from minfer_cli.errors import UsageError

        raise UsageError(
            f"workload {workload.name} needs {need / 2**30:.1f} GiB of inputs for an L2-defeating ring; the device "
            f"has {device.memory_bytes / 2**30:.1f} GiB"
        )
    rng = np.random.default_rng(seed)
    ring = []
    for i in range(plan.sets):
        progress(f"allocating inputs ({plan.sets} x {plan.set_bytes / 2**20:.1f} MiB)", i / plan.sets)
        ring.append(experiment.make_input_set(workload, rng))
    progress("allocating inputs", 1.0)
    flush_buffer = cuda.device_array(2 * device.l2_bytes, dtype=np.uint8) if "flush" in plan.mode else None
    return Session(
        experiment=experiment, workload=workload, device=device, ceilings=ceilings_for(device.name),
        stream=cuda.stream(), plan=plan, ring=ring, output=experiment.make_output(workload),
        flush_buffer=flush_buffer, nvml=nvml, env_start=nvml.state(), warmup_s=warmup_s,
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


def prepare_arm(session: Session, label: str, config: Config) -> tuple[ArmOutcome, ArmTimer | SelfTimer | None]:
    """Compile the arm, check it against the reference (output poisoned first), and build its timer.

    Never raises for a failing variant: compile/launch errors and parity failures come back as an INVALID
    outcome (with the error) and no timer.
    """
    exp, wl = session.experiment, session.workload
    outcome = ArmOutcome(label=label, config=dict(config), tolerance=exp.tolerance(config, wl))
    try:
        launch = exp.prepare(config, wl)
        exp.poison(session.output)
        launch(session.ring[0], session.output, session.stream)
        session.stream.synchronize()
        err = float(exp.check(config, wl, session.ring[0], session.output))
    except Exception as exc:  # a variant that fails to compile or launch is a result, not a crash
        outcome.status, outcome.error = "invalid", _first_line(exc)
        return outcome, None
    outcome.parity_error = err
    if not math.isfinite(err) or err > outcome.tolerance:
        outcome.status = "invalid"
        outcome.error = f"output differs from the reference: relative error {err:.3g} > tolerance {outcome.tolerance:.3g}"
        return outcome, None
    if exp.self_timed:
        return outcome, SelfTimer(launch, session.ring, session.output, session.stream, session.plan)
    timer = ArmTimer(launch, session.ring, session.output, session.stream, session.plan, session.flush_buffer)
    return outcome, timer


def start_timer(session: Session, timer: ArmTimer) -> None:
    """Warm up (time-budgeted) and pick the timing method and batch size."""
    timer.warm(session.warmup_s)
    timer.calibrate()


def _finish(session: Session, outcome: ArmOutcome, timer: ArmTimer, stats: ArmStats) -> None:
    outcome.stats = stats
    if session.experiment.metric.name == "time":  # TFLOP/s, GB/s and roofline need a time per sample
        cost = session.experiment.cost(session.workload, outcome.config)
        outcome.figures = throughput(cost.flops, cost.bytes, stats.median, session.ceilings)
    outcome.timing = timer.describe()
    try:
        session.experiment.after_timing(outcome.config, session.workload)
    except Exception as exc:  # the samples timed something else than the checked output came from
        outcome.status, outcome.error = "invalid", f"after timing: {_first_line(exc)}"


@dataclass
class RunResult:
    """`minfer run`: one arm measured alone."""

    session: Session
    arm: ArmOutcome
    env_end: envmod.GpuState
    elapsed_s: float


def _time_alone(session: Session, outcome: ArmOutcome, timer: ArmTimer, samples: int, max_time_s: float,
                progress: Progress, label: str = "sampling") -> None:
    """Warm up, then take `samples` samples of one arm (fewer only when `max_time_s` runs out)."""
    t0 = time.monotonic()
    start_timer(session, timer)
    values, flags = [], []
    while len(values) < samples and (len(values) < 3 or time.monotonic() - t0 < max_time_s):
        values.append(timer.sample())
        flags.append(session.nvml.throttled())
        progress(label, len(values) / samples)
    _finish(session, outcome, timer, summarize(np.array(values), np.array(flags, dtype=bool)))
    outcome.samples = [float(v) for v in values]
    timer.release()


def measure_run(session: Session, config: Config, *, samples: int = 50, max_time_s: float = 30.0,
                progress: Progress = _quiet) -> RunResult:
    """Time one arm: `samples` samples after the gate and warm-up (stopping early only at `max_time_s`)."""
    t0 = time.monotonic()
    outcome, timer = prepare_arm(session, "A", config)
    if timer is not None:
        _time_alone(session, outcome, timer, samples, max_time_s, progress)
    return RunResult(session, outcome, session.nvml.state(), time.monotonic() - t0)


def measure_sweep(session: Session, configs: list[Config], *, samples: int = 20, max_time_s: float = 10.0,
                  progress: Progress = _quiet) -> list[ArmOutcome]:
    """Gate and time every configuration of a grid, one after another; a failing point is an INVALID outcome."""
    outcomes = []
    for i, config in enumerate(configs):
        label = f"p{i + 1}"
        progress(f"{label}/{len(configs)} {format_config(config)}", i / len(configs))
        outcome, timer = prepare_arm(session, label, config)
        if timer is not None:
            _time_alone(session, outcome, timer, samples, max_time_s, _quiet)
        outcomes.append(outcome)
    progress("sweep", 1.0)
    return outcomes


@dataclass
class ABResult:
    """`minfer ab`: two arms interleaved, their comparison and the verdict."""

    session: Session
    arms: list[ArmOutcome]
    comparison: Comparison | None
    verdict: str
    bar: float
    rounds: int = 0
    stop_reason: str = ""
    throttled_rounds: int = 0
    env_end: envmod.GpuState | None = None
    elapsed_s: float = 0.0
    round_values: list[list[float]] = field(default_factory=list)


def measure_ab(session: Session, configs: list[Config], *, bar: float, max_time_s: float = 60.0,
               min_rounds: int = 10, samples_per_round: int = 5, progress: Progress = _quiet,
               labels: tuple[str, str] = ("A", "B")) -> ABResult:
    """Interleaved A/B of two configurations (A = control). INVALID when either arm fails its gate."""
    t0 = time.monotonic()
    prepared = [prepare_arm(session, label, cfg) for label, cfg in zip(labels, configs)]
    arms = [p[0] for p in prepared]
    timers = [p[1] for p in prepared]
    if any(t is None for t in timers):
        return ABResult(session, arms, None, "INVALID", bar, env_end=session.nvml.state(),
                        elapsed_s=time.monotonic() - t0)
    progress("warming up", 0.0)
    for timer in timers:
        start_timer(session, timer)
    budget_start = time.monotonic()

    def on_round(i: int, comparison: Comparison | None) -> None:
        frac = (time.monotonic() - budget_start) / max_time_s
        if comparison is not None:
            width = comparison.ci_high - comparison.ci_low
            frac = max(frac, min(1.0, (bar / 4) / width) if width > 0 else 1.0)
        progress(f"round {i + 1}", min(frac, 1.0))

    result = run_interleaved(
        lambda arm: timers[arm].sample(), bar=bar, higher_is_better=session.experiment.metric.higher_is_better,
        samples_per_round=samples_per_round, min_rounds=min_rounds, max_time_s=max_time_s,
        probe=session.nvml.throttled, on_round=on_round,
    )
    for outcome, timer, stats, rounds in zip(arms, timers, result.arm_stats, result.round_values):
        _finish(session, outcome, timer, stats)
        outcome.samples = [float(v) for v in rounds]
        timer.release()
    verdict = "INVALID" if any(a.status == "invalid" for a in arms) else result.comparison.verdict
    return ABResult(
        session, arms, result.comparison, verdict, bar, rounds=result.rounds,
        stop_reason=result.stop_reason, throttled_rounds=int(np.sum(result.throttled_rounds)),
        env_end=session.nvml.state(), elapsed_s=time.monotonic() - t0,
        round_values=[list(map(float, v)) for v in result.round_values],
    )


@dataclass
class CalibrationResult:
    """`minfer calibrate`: repeated A/A runs of one arm: the noise floor and the false-positive rate."""

    session: Session
    config: Config
    trials: list[ABResult]
    summary: object


def measure_calibration(session: Session, config: Config, *, trials: int, bar: float, max_time_s: float,
                        min_rounds: int = 10, progress: Progress = _quiet) -> CalibrationResult:
    """Run `trials` A/A comparisons (the same arm as both A and B) and summarise the spread of their deltas."""
    results = []
    for i in range(trials):
        progress(f"A/A trial {i + 1}/{trials}", i / trials)
        results.append(measure_ab(session, [config, config], bar=bar, max_time_s=max_time_s,
                                  min_rounds=min_rounds, labels=("A", "A'")))
        if results[-1].verdict == "INVALID":
            break
    progress("A/A trials", 1.0)
    deltas = [r.comparison.delta for r in results if r.comparison is not None]
    verdicts = [r.verdict for r in results if r.comparison is not None]
    summary = calibration_summary(deltas, verdicts, bar) if deltas else None
    return CalibrationResult(session, dict(config), results, summary)


def describe_arms(arms: list[ArmOutcome]) -> str:
    return " vs ".join(format_config(a.config) or "(defaults)" for a in arms)
