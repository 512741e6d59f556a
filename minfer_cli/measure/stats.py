"""Statistics of an A/B comparison: per-arm summaries, the paired-ratio effect with its bootstrap CI and
Wilcoxon p-value, the verdict rule, and the summary of an A/A calibration.

All relative quantities are fractions, not percent: ``delta = 0.05`` means +5 %, ``bar = 0.01`` means 1 %.
``delta`` is the change of the metric of arm B against the control arm A; for a time metric (lower is better)
a negative delta means B is faster, for a throughput metric (higher is better) a positive delta means B is better.
Pure numpy/scipy: no GPU code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

VERDICTS = ("LANDED", "REVERTED", "NEUTRAL", "INVALID")
"""LANDED: B significantly better by at least the bar; REVERTED: significantly worse by at least the bar;
NEUTRAL: neither; INVALID: an arm failed its correctness check (decided by the harness, never by `verdict`)."""

DEFAULT_RESAMPLES = 2000
CONFIDENCE = 0.95


@dataclass(frozen=True)
class ArmStats:
    """Summary of one arm's samples, in the metric's unit (e.g. µs). ``throttled``: how many of the ``n`` samples
    were taken while the GPU reported throttling; ``std``: the sample standard deviation (0 for one sample)."""

    median: float
    p10: float
    p90: float
    mean: float
    n: int
    throttled: int
    std: float = 0.0


@dataclass(frozen=True)
class Comparison:
    """Arm B against control arm A over ``rounds`` paired rounds.

    delta: median over rounds of B_r / A_r, minus 1 (fraction). ci_low, ci_high: 95 % percentile-bootstrap CI
    of that median, minus 1. p_value: two-sided Wilcoxon signed-rank test of log(B_r / A_r). verdict: one of
    VERDICTS, from `verdict` with ``bar`` (fraction) and ``higher_is_better``.
    """

    delta: float
    ci_low: float
    ci_high: float
    p_value: float
    rounds: int
    verdict: str
    bar: float
    higher_is_better: bool


@dataclass(frozen=True)
class CalibrationSummary:
    """What A/A trials (both arms identical) say about the noise floor; see `calibration_summary`.

    trials: number of A/A trials; delta_median, delta_std: of their deltas (fractions); delta_p95_abs: 95th
    percentile of |delta|; false_positive_rate: fraction of trials whose verdict was not NEUTRAL at ``bar``;
    suggested_bar: the bar the noise supports (fraction); bar: the bar the trials' verdicts were reached at.
    """

    trials: int
    delta_median: float
    delta_std: float
    delta_p95_abs: float
    false_positive_rate: float
    suggested_bar: float
    bar: float


def summarize(samples, throttled_mask=None) -> ArmStats:
    """Median, 10th/90th percentile (numpy's linear interpolation), mean and sample standard deviation of one arm's
    samples.

    ``throttled_mask``: optional booleans, one per sample, True where the GPU reported throttling; their count
    becomes ``ArmStats.throttled``. Raises ValueError for no samples or a mask of another length.
    """
    x = np.asarray(samples, dtype=np.float64).ravel()
    if x.size == 0:
        raise ValueError("summarize needs at least one sample, got none")
    throttled = 0
    if throttled_mask is not None:
        mask = np.asarray(throttled_mask, dtype=bool).ravel()
        if mask.size != x.size:
            raise ValueError(f"throttled_mask has {mask.size} entries for {x.size} samples; give one per sample")
        throttled = int(mask.sum())
    p10, median, p90 = np.percentile(x, [10, 50, 90])
    std = float(x.std(ddof=1)) if x.size > 1 else 0.0
    return ArmStats(float(median), float(p10), float(p90), float(x.mean()), int(x.size), throttled, std)


def verdict(delta: float, ci_low: float, ci_high: float, bar: float, higher_is_better: bool) -> str:
    """LANDED, REVERTED or NEUTRAL for a relative change ``delta`` of B against A with CI [ci_low, ci_high].

    "Better" is lower for time (``higher_is_better=False``) and higher for throughput. LANDED needs both
    significance and size: the CI lies wholly on the better side of 0 and the point improvement is >= ``bar``.
    REVERTED is the mirror image (CI wholly on the worse side, point loss >= ``bar``). Anything else is NEUTRAL.
    All arguments are fractions. Raises ValueError for a negative bar or ci_low > ci_high.
    """
    if bar < 0:
        raise ValueError(f"bar must be >= 0 (a fraction, 0.01 = 1 %), got {bar}")
    if ci_low > ci_high:
        raise ValueError(f"confidence interval is inverted: ci_low {ci_low} > ci_high {ci_high}")
    sign = 1.0 if higher_is_better else -1.0
    gain, gain_low, gain_high = sign * delta, min(sign * ci_low, sign * ci_high), max(sign * ci_low, sign * ci_high)
    if gain_low > 0 and gain >= bar:
        return "LANDED"
    if gain_high < 0 and -gain >= bar:
        return "REVERTED"
    return "NEUTRAL"


def _paired_log_ratios(a_rounds, b_rounds) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(a_rounds, dtype=np.float64).ravel()
    b = np.asarray(b_rounds, dtype=np.float64).ravel()
    if a.size != b.size:
        raise ValueError(f"arms must have one value per round each: A has {a.size} rounds, B has {b.size}")
    if a.size < 2:
        raise ValueError(f"a comparison needs at least 2 paired rounds (got {a.size}): a CI needs resampling")
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        raise ValueError("round values must be finite; a NaN or inf means a sample failed and the run is invalid")
    if np.any(a <= 0) or np.any(b <= 0):
        raise ValueError("round values must be positive (times or rates): the paired ratio B/A is undefined otherwise")
    ratios = b / a
    return ratios, np.log(ratios)


def compare(
    a_rounds,
    b_rounds,
    *,
    bar: float,
    higher_is_better: bool,
    rng: np.random.Generator,
    n_resamples: int = DEFAULT_RESAMPLES,
) -> Comparison:
    """Compare arm B with control arm A from their per-round values (paired by index, metric units).

    delta = median_r(B_r / A_r) - 1. The CI is the 95 % percentile bootstrap of that median, resampling rounds
    (``scipy.stats.bootstrap``, ``method="percentile"``, ``n_resamples`` draws from ``rng``), minus 1. The
    p-value is the two-sided Wilcoxon signed-rank test (``scipy.stats.wilcoxon``) of log(B_r / A_r); it is 1
    when every ratio is exactly 1. The verdict follows `verdict` with ``bar`` (a fraction).

    Raises ValueError when the arms have different round counts, fewer than 2 rounds, or a value that is not
    finite and positive.
    """
    ratios, log_ratios = _paired_log_ratios(a_rounds, b_rounds)
    from scipy import stats as _sps  # imported here: scipy costs ~1 s, and most commands never compare

    boot = _sps.bootstrap(
        (ratios,),
        np.median,
        n_resamples=n_resamples,
        confidence_level=CONFIDENCE,
        method="percentile",
        vectorized=True,
        rng=rng,
    )
    delta = float(np.median(ratios)) - 1.0
    ci_low = float(boot.confidence_interval.low) - 1.0
    ci_high = float(boot.confidence_interval.high) - 1.0
    p_value = 1.0 if not np.any(log_ratios) else float(_sps.wilcoxon(log_ratios).pvalue)
    return Comparison(
        delta=delta,
        ci_low=ci_low,
        ci_high=ci_high,
        p_value=p_value,
        rounds=int(ratios.size),
        verdict=verdict(delta, ci_low, ci_high, bar, higher_is_better),
        bar=bar,
        higher_is_better=higher_is_better,
    )


def ci_narrow_enough(comparison: Comparison, bar: float) -> bool:
    """True when the CI is narrower than a quarter of the bar (``ci_high - ci_low < bar / 4``): more rounds
    could no longer move the verdict by much, so an adaptive run may stop."""
    return (comparison.ci_high - comparison.ci_low) < bar / 4


SUGGESTED_BAR_STEP = 0.001
"""Granularity of `calibration_summary`'s suggested bar: 0.1 %."""


def calibration_summary(deltas: list[float], verdicts: list[str], bar: float) -> CalibrationSummary:
    """Noise floor from A/A trials (both arms the same code): one delta and one verdict per trial, judged at ``bar``.

    false_positive_rate is the fraction of trials whose verdict is not NEUTRAL (an A/A trial can only be wrong
    by claiming a difference). Rule for suggested_bar: twice the 95th percentile of |delta|, rounded up to the
    next multiple of 0.1 %, and never below 0.1 %. Twice the p95 keeps a real change that just clears the bar
    well outside what noise alone produced in 95 % of A/A trials.

    Raises ValueError for no trials, a different number of deltas and verdicts, an unknown verdict, or a
    delta that is not finite.
    """
    d = np.asarray(deltas, dtype=np.float64).ravel()
    if d.size == 0:
        raise ValueError("calibration_summary needs at least one A/A trial, got none")
    if d.size != len(verdicts):
        raise ValueError(f"got {d.size} deltas but {len(verdicts)} verdicts; give one of each per trial")
    unknown = sorted(set(verdicts) - set(VERDICTS))
    if unknown:
        raise ValueError(f"unknown verdict(s) {unknown}; expected one of {VERDICTS}")
    if not np.all(np.isfinite(d)):
        raise ValueError("every A/A delta must be finite")
    p95_abs = float(np.percentile(np.abs(d), 95))
    steps = math.ceil(round(2.0 * p95_abs / SUGGESTED_BAR_STEP, 9))
    suggested = round(max(1, steps) * SUGGESTED_BAR_STEP, 6)
    return CalibrationSummary(
        trials=int(d.size),
        delta_median=float(np.median(d)),
        delta_std=float(d.std(ddof=1)) if d.size > 1 else 0.0,
        delta_p95_abs=p95_abs,
        false_positive_rate=sum(v != "NEUTRAL" for v in verdicts) / d.size,
        suggested_bar=suggested,
        bar=bar,
    )
