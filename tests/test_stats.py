"""A/B statistics and the interleaved harness against fake timers with known distributions (pure logic, no GPU).

The verdict-rate tests run 300 seeded trials each at a fixed length (min_rounds == max_rounds, so `compare`
runs once per trial and the suite stays fast); the adaptive stopping itself is tested separately below.
"""

from __future__ import annotations

import numpy as np
import pytest

from minfer_cli.measure.interleave import STOP_REASONS, run_interleaved
from minfer_cli.measure.stats import (
    VERDICTS,
    Comparison,
    calibration_summary,
    ci_narrow_enough,
    compare,
    summarize,
    verdict,
)

BAR = 0.01
TRIALS = 300
SPR = 5
ROUNDS = 30
DRIFT = 0.0005  # +0.05 % per sample call: 30 rounds x 2 arms x 5 samples = 300 calls -> +15 % over a run
NOISE = {
    "lognormal": {"sigma": 0.01},
    "outliers": {"sigma": 0.01, "outlier_p": 0.02},  # heavier tail: 2 % of samples are 20 % slow
}


class FakeGpu:
    """A fake timer: ``sample(arm)`` = base * (1 + effect if arm is B) * lognormal(0, sigma) noise
    * (1 + outlier with probability outlier_p) * (1 + drift * calls so far). ``clock()`` advances ``dt`` s per
    sample, so time budgets are deterministic. ``arms`` records the order of the calls."""

    BLOCK = 1024

    def __init__(self, seed, *, effect=0.0, base=100.0, sigma=0.01, outlier_p=0.0, outlier=0.20, drift=0.0, dt=1e-3):
        self._rng = np.random.default_rng(seed)
        self.effect, self.base, self.sigma = effect, base, sigma
        self.outlier_p, self.outlier, self.drift, self.dt = outlier_p, outlier, drift, dt
        self.calls = 0
        self.now = 0.0
        self.arms: list[int] = []
        self._noise = np.empty(0)

    def sample(self, arm: int) -> float:
        i = self.calls % self.BLOCK
        if i == 0:
            spikes = np.where(self._rng.random(self.BLOCK) < self.outlier_p, 1.0 + self.outlier, 1.0)
            self._noise = self._rng.lognormal(0.0, self.sigma, self.BLOCK) * spikes
        value = self.base * self._noise[i] * (1.0 + self.drift * self.calls)
        if arm == 1:
            value *= 1.0 + self.effect
        self.calls += 1
        self.now += self.dt
        self.arms.append(arm)
        return float(value)

    def clock(self) -> float:
        return self.now


def fixed_run(seed, *, higher_is_better=False, **fake):
    gpu = FakeGpu(seed, **fake)
    return run_interleaved(
        gpu.sample,
        bar=BAR,
        higher_is_better=higher_is_better,
        samples_per_round=SPR,
        min_rounds=ROUNDS,
        max_rounds=ROUNDS,
        clock=gpu.clock,
        rng=seed,
    )


def trial_comparisons(scenario: int, trials: int = TRIALS, **kwargs) -> list[Comparison]:
    return [fixed_run(1_000 * scenario + i, **kwargs).comparison for i in range(trials)]


def verdict_rates(comparisons: list[Comparison]) -> dict[str, float]:
    verdicts = [c.verdict for c in comparisons]
    return {v: verdicts.count(v) / len(verdicts) for v in VERDICTS}


def sequential_compare(gpu: FakeGpu, rounds: int, seed: int) -> Comparison:
    """The naive ordering the harness avoids: every round of A first, then every round of B."""
    values = [[np.median([gpu.sample(arm) for _ in range(SPR)]) for _ in range(rounds)] for arm in (0, 1)]
    return compare(values[0], values[1], bar=BAR, higher_is_better=False, rng=np.random.default_rng(seed))


# ---- verdict rates (300 trials each, bar 1 %) ----


@pytest.mark.parametrize("noise", NOISE)
def test_aa_is_neutral(noise):
    comparisons = trial_comparisons(1, **NOISE[noise])
    assert verdict_rates(comparisons)["NEUTRAL"] >= 0.99
    # the 95 % CI is honest on its own: it covers the true zero in about 95 % of A/A trials
    assert np.mean([c.ci_low <= 0.0 <= c.ci_high for c in comparisons]) >= 0.90


@pytest.mark.parametrize("noise", NOISE)
def test_true_5pct_improvement_lands(noise):
    assert verdict_rates(trial_comparisons(2, effect=-0.05, **NOISE[noise]))["LANDED"] >= 0.95


@pytest.mark.parametrize("noise", NOISE)
def test_true_5pct_loss_is_reverted(noise):
    assert verdict_rates(trial_comparisons(3, effect=0.05, **NOISE[noise]))["REVERTED"] >= 0.95


@pytest.mark.parametrize("noise", NOISE)
def test_half_percent_change_is_below_bar(noise):
    assert verdict_rates(trial_comparisons(4, effect=-0.005, **NOISE[noise]))["NEUTRAL"] >= 0.95


def test_drift_does_not_flip_aa():
    assert verdict_rates(trial_comparisons(5, drift=DRIFT))["NEUTRAL"] >= 0.99


def test_interleaving_cancels_drift_that_fools_sequential_order():
    seeds = range(20)
    naive = [sequential_compare(FakeGpu(s, drift=DRIFT), ROUNDS, s).verdict for s in seeds]
    interleaved = [fixed_run(s, drift=DRIFT).comparison.verdict for s in seeds]
    assert (naive, interleaved) == (["REVERTED"] * 20, ["NEUTRAL"] * 20)


@pytest.mark.parametrize("effect, expected", [(0.05, "LANDED"), (-0.05, "REVERTED")])
def test_higher_is_better_throughput(effect, expected):
    rates = verdict_rates(trial_comparisons(6, 100, higher_is_better=True, effect=effect, base=1500.0))
    assert rates[expected] >= 0.95


# ---- adaptive stopping ----


def test_stops_on_narrow_ci_but_not_before_min_rounds():
    gpu = FakeGpu(7, sigma=0.0005)
    seen: list[tuple[int, Comparison | None]] = []
    res = run_interleaved(
        gpu.sample, bar=BAR, higher_is_better=False, min_rounds=10, clock=gpu.clock, rng=7,
        on_round=lambda r, c: seen.append((r, c)),
    )
    assert (res.stop_reason, res.rounds) == ("ci", 10)
    assert [r for r, _ in seen] == list(range(10))
    assert all(c is None for _, c in seen[:9]) and seen[9][1] is res.comparison
    early = compare(res.round_values[0][:5], res.round_values[1][:5], bar=BAR, higher_is_better=False,
                    rng=np.random.default_rng(0))
    assert ci_narrow_enough(early, BAR)  # narrow already after 5 rounds: only min_rounds kept it going


def test_ci_stop_after_min_rounds():
    gpu = FakeGpu(8)
    res = run_interleaved(gpu.sample, bar=0.03, higher_is_better=False, min_rounds=10, max_rounds=500,
                          clock=gpu.clock, rng=8)
    assert res.stop_reason == "ci" and 10 < res.rounds < 500
    assert res.comparison.ci_high - res.comparison.ci_low < 0.03 / 4


def test_stops_on_max_time():
    gpu = FakeGpu(9, dt=0.125)  # one round = 10 samples = 1.25 s of fake clock
    res = run_interleaved(gpu.sample, bar=BAR, higher_is_better=False, min_rounds=10, max_time_s=25.0,
                          clock=gpu.clock, rng=9)
    assert (res.stop_reason, res.rounds, res.elapsed_s) == ("max_time", 20, 25.0)


def test_time_budget_never_cuts_below_min_rounds():
    gpu = FakeGpu(10, dt=0.125)
    res = run_interleaved(gpu.sample, bar=BAR, higher_is_better=False, min_rounds=12, max_time_s=1.0,
                          clock=gpu.clock, rng=10)
    assert (res.stop_reason, res.rounds) == ("max_time", 12)


def test_stops_on_max_rounds():
    gpu = FakeGpu(11)
    res = run_interleaved(gpu.sample, bar=BAR, higher_is_better=False, min_rounds=10, max_rounds=15,
                          clock=gpu.clock, rng=11)
    assert res.stop_reason in STOP_REASONS
    assert (res.stop_reason, res.rounds) == ("max_rounds", 15)


def test_abba_order_and_result_shapes():
    gpu = FakeGpu(12)
    res = run_interleaved(gpu.sample, bar=BAR, higher_is_better=False, samples_per_round=3, min_rounds=4,
                          max_rounds=4, clock=gpu.clock, rng=12)
    assert gpu.arms == [a for a in (0, 1, 1, 0, 0, 1, 1, 0) for _ in range(3)]
    assert [s.shape for s in res.samples] == [(12,), (12,)]
    assert [v.shape for v in res.round_values] == [(4,), (4,)]
    assert res.round_values[0][1] == np.median(res.samples[0][3:6])
    assert res.arm_stats[0].n == res.arm_stats[1].n == 12


def test_throttled_rounds_are_kept_and_counted():
    flags = iter([False, False, True, False, False, True, False, True, False, False])
    gpu = FakeGpu(13)
    res = run_interleaved(gpu.sample, bar=BAR, higher_is_better=False, min_rounds=10, max_rounds=10,
                          probe=lambda: next(flags), clock=gpu.clock, rng=13)
    assert res.rounds == 10 and res.throttled_rounds.tolist().count(True) == 3
    assert np.flatnonzero(res.throttled_rounds).tolist() == [2, 5, 7]
    assert [s.throttled for s in res.arm_stats] == [3 * SPR, 3 * SPR]
    assert [s.n for s in res.arm_stats] == [10 * SPR, 10 * SPR]


def test_always_throttling_gpu_still_gives_a_result():
    gpu = FakeGpu(14, effect=-0.05)
    res = run_interleaved(gpu.sample, bar=BAR, higher_is_better=False, min_rounds=20, max_rounds=20,
                          probe=lambda: True, clock=gpu.clock, rng=14)
    assert res.throttled_rounds.all() and res.arm_stats[1].throttled == res.arm_stats[1].n == 20 * SPR
    assert res.comparison.verdict == "LANDED"


@pytest.mark.parametrize("kwargs", [{"min_rounds": 1}, {"min_rounds": 10, "max_rounds": 5}, {"samples_per_round": 0}])
def test_run_interleaved_rejects_bad_settings(kwargs):
    with pytest.raises(ValueError):
        run_interleaved(FakeGpu(0).sample, bar=BAR, higher_is_better=False, **kwargs)


# ---- compare, verdict, summaries ----


@pytest.mark.parametrize(
    "a, b, match",
    [([1.0], [1.0], "at least 2"), ([1.0, 2.0], [1.0], "one value per round"),
     ([1.0, 0.0], [1.0, 1.0], "positive"), ([1.0, np.nan], [1.0, 1.0], "finite")],
)
def test_compare_rejects_degenerate_input(a, b, match):
    with pytest.raises(ValueError, match=match):
        compare(a, b, bar=BAR, higher_is_better=False, rng=np.random.default_rng(0))


def test_compare_identical_arms_and_seeding():
    same = compare([5.0, 6.0, 7.0], [5.0, 6.0, 7.0], bar=BAR, higher_is_better=False, rng=np.random.default_rng(0))
    assert (same.delta, same.ci_low, same.ci_high, same.p_value, same.verdict) == (0.0, 0.0, 0.0, 1.0, "NEUTRAL")
    a = np.random.default_rng(1).lognormal(0, 0.01, 20)
    b = a * 0.9
    runs = [compare(a, b, bar=BAR, higher_is_better=False, rng=np.random.default_rng(2)) for _ in range(2)]
    assert runs[0] == runs[1]
    assert runs[0].delta == pytest.approx(-0.1) and runs[0].verdict == "LANDED" and runs[0].p_value < 1e-4


@pytest.mark.parametrize(
    "delta, lo, hi, hib, expected",
    [
        (-0.05, -0.07, -0.03, False, "LANDED"),
        (0.05, 0.03, 0.07, False, "REVERTED"),
        (0.05, 0.03, 0.07, True, "LANDED"),
        (-0.05, -0.07, -0.03, True, "REVERTED"),
        (-0.005, -0.007, -0.003, False, "NEUTRAL"),  # significant but below the bar
        (-0.05, -0.09, 0.001, False, "NEUTRAL"),  # above the bar but the CI reaches 0
        (-0.01, -0.012, -0.008, False, "LANDED"),  # exactly at the bar lands
    ],
)
def test_verdict_rule(delta, lo, hi, hib, expected):
    assert verdict(delta, lo, hi, BAR, hib) == expected


def test_summarize():
    s = summarize(np.arange(1.0, 11.0), np.arange(10) % 4 == 0)
    assert (s.median, s.mean, s.n, s.throttled) == (5.5, 5.5, 10, 3)
    assert (s.p10, s.p90) == pytest.approx((1.9, 9.1))
    with pytest.raises(ValueError):
        summarize([])
    with pytest.raises(ValueError):
        summarize([1.0, 2.0], [True])


def test_calibration_summary_rule():
    exact = calibration_summary([0.0015, -0.0015] * 10, ["NEUTRAL"] * 19 + ["LANDED"], BAR)
    assert (exact.trials, exact.delta_p95_abs, exact.false_positive_rate) == (20, pytest.approx(0.0015), 0.05)
    assert exact.suggested_bar == 0.003  # 2 x 0.15 % is already a multiple of 0.1 %
    assert calibration_summary([0.0016, -0.0016], ["NEUTRAL"] * 2, BAR).suggested_bar == 0.004
    assert calibration_summary([0.0, 0.0], ["NEUTRAL"] * 2, BAR).suggested_bar == 0.001
    with pytest.raises(ValueError):
        calibration_summary([0.0], ["NEUTRAL", "NEUTRAL"], BAR)
    with pytest.raises(ValueError):
        calibration_summary([0.0], ["MAYBE"], BAR)


def test_calibration_from_aa_runs():
    runs = [fixed_run(6_000 + i).comparison for i in range(50)]
    cal = calibration_summary([c.delta for c in runs], [c.verdict for c in runs], BAR)
    assert cal.false_positive_rate == 0.0 and cal.delta_p95_abs < BAR / 2
    assert 0.001 <= cal.suggested_bar <= BAR
