"""Interleaved A/B sampling with adaptive stopping.

Two arms, index 0 = A (the control) and 1 = B, alternate in ABBA order: round 0 runs A then B, round 1 B then A,
and so on, so that a slow drift (clocks, temperature, a neighbour's load) hits both arms alike and cancels in the
per-round ratio B_r / A_r. The GPU work is behind the ``sample(arm)`` callable; this module is pure logic.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from minfer_cli.measure.stats import ArmStats, Comparison, ci_narrow_enough, compare, summarize

STOP_REASONS = ("ci", "max_time", "max_rounds")
"""Why `run_interleaved` stopped: the CI got narrower than bar/4, the time budget ran out, or the round cap."""


@dataclass(frozen=True)
class InterleavedResult:
    """Everything an interleaved A/B run measured; per-arm tuples are indexed (A, B).

    samples: every sample of each arm in the order taken (metric units), shape [rounds * samples_per_round].
    round_values: each arm's per-round median, shape [rounds]. throttled_rounds: bool per round, True when the
    probe reported throttling during it (such rounds are kept, only flagged). arm_stats: per-arm `ArmStats` over all
    samples. comparison: the final `Comparison` of B against A. stop_reason: one of STOP_REASONS.
    elapsed_s: seconds on ``clock`` from start to stop. rounds: number of completed rounds.
    """

    samples: tuple[np.ndarray, np.ndarray]
    round_values: tuple[np.ndarray, np.ndarray]
    throttled_rounds: np.ndarray
    arm_stats: tuple[ArmStats, ArmStats]
    comparison: Comparison
    stop_reason: str
    elapsed_s: float
    rounds: int
    samples_per_round: int


def _stop_reason(
    comparison: Comparison, bar: float, elapsed_s: float, max_time_s: float, rounds: int, max_rounds: int
) -> str | None:
    if ci_narrow_enough(comparison, bar):
        return "ci"
    if elapsed_s >= max_time_s:
        return "max_time"
    if rounds >= max_rounds:
        return "max_rounds"
    return None


def run_interleaved(
    sample: Callable[[int], float],
    *,
    bar: float,
    higher_is_better: bool,
    samples_per_round: int = 5,
    min_rounds: int = 10,
    max_rounds: int = 2000,
    max_time_s: float = 60.0,
    probe: Callable[[], bool] | None = None,
    on_round: Callable[[int, Comparison | None], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    rng: np.random.Generator | int | None = None,
) -> InterleavedResult:
    """Sample arms A (0) and B (1) in ABBA-ordered rounds until the comparison is precise enough.

    Each round, each arm in turn takes ``samples_per_round`` consecutive samples ``sample(arm)`` (metric units,
    finite and positive); its round value is their median. ``probe()``, if given, is called once per round after
    its samples and returns True when the GPU reported throttling during the round. After every round from
    ``min_rounds`` on, `compare` runs (bootstrap CI and Wilcoxon p-value, see `minfer_cli.measure.stats`) and the
    run stops at the first of: the CI is narrower than ``bar / 4`` ("ci"), ``clock()`` has advanced at least
    ``max_time_s`` seconds since the start ("max_time"), ``max_rounds`` rounds are done ("max_rounds"). The time
    budget never cuts a run below ``min_rounds``. ``on_round(r, comparison)`` is called after round r (0-based)
    with the comparison so far, None before ``min_rounds``. ``rng`` (Generator, seed or None) drives the bootstrap.

    Raises ValueError for samples_per_round < 1, min_rounds < 2, max_rounds < min_rounds or a negative bar or
    time budget, and (from `compare`) when a round value is not finite and positive.
    """
    if samples_per_round < 1:
        raise ValueError(f"samples_per_round must be >= 1, got {samples_per_round}")
    if min_rounds < 2:
        raise ValueError(f"min_rounds must be >= 2 (a comparison needs 2 paired rounds), got {min_rounds}")
    if max_rounds < min_rounds:
        raise ValueError(f"max_rounds ({max_rounds}) must be >= min_rounds ({min_rounds})")
    if bar < 0 or max_time_s < 0:
        raise ValueError(f"bar and max_time_s must be >= 0, got bar={bar}, max_time_s={max_time_s}")
    gen = np.random.default_rng(rng)
    samples: tuple[list[float], list[float]] = ([], [])
    round_values: tuple[list[float], list[float]] = ([], [])
    throttled: list[bool] = []
    start = clock()
    rounds = 0
    while True:
        for arm in (0, 1) if rounds % 2 == 0 else (1, 0):
            taken = [float(sample(arm)) for _ in range(samples_per_round)]
            samples[arm].extend(taken)
            round_values[arm].append(statistics.median(taken))
        throttled.append(bool(probe()) if probe is not None else False)
        rounds += 1
        comparison = None
        if rounds >= min_rounds:
            comparison = compare(
                round_values[0], round_values[1], bar=bar, higher_is_better=higher_is_better, rng=gen
            )
        if on_round is not None:
            on_round(rounds - 1, comparison)
        if comparison is not None:
            stop_reason = _stop_reason(comparison, bar, clock() - start, max_time_s, rounds, max_rounds)
            if stop_reason is not None:
                break
    elapsed_s = clock() - start
    flags = np.asarray(throttled, dtype=bool)
    sample_mask = np.repeat(flags, samples_per_round)
    arrays = (np.asarray(samples[0]), np.asarray(samples[1]))
    return InterleavedResult(
        samples=arrays,
        round_values=(np.asarray(round_values[0]), np.asarray(round_values[1])),
        throttled_rounds=flags,
        arm_stats=(summarize(arrays[0], sample_mask), summarize(arrays[1], sample_mask)),
        comparison=comparison,
        stop_reason=stop_reason,
        elapsed_s=elapsed_s,
        rounds=rounds,
        samples_per_round=samples_per_round,
    )
