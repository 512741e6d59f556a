"""Harness logic that needs no timing: ring planning, the correctness gate, and the `ab` command's outputs
(verdict rendering, ledger write, --fail-on-regression, a ledger that cannot be written) with a faked measurement."""

from __future__ import annotations

import numpy as np
import pytest
import yaml
from pathlib import Path
from typer.testing import CliRunner

from minfer_cli import ledger
from minfer_cli.experiment import get
from minfer_cli.main import app
from minfer_cli.measure import environment as envmod
from minfer_cli.measure import harness
from minfer_cli.measure.device import DeviceInfo
from minfer_cli.measure.stats import ArmStats, Comparison
from minfer_cli.measure.timing import BATCH_TARGET_US, RING_FACTOR, ArmTimer, batch_size, plan_ring

L2 = 60 << 20


@pytest.mark.parametrize("set_bytes", [1 << 20, 7 << 20, 59 << 20, 200 << 20])
def test_ring_covers_four_times_l2(set_bytes):
    plan = plan_ring(set_bytes, L2)
    assert plan.mode == "ring"
    assert plan.total_bytes >= RING_FACTOR * L2
    assert (plan.sets - 1) * set_bytes < RING_FACTOR * L2 or plan.sets == 2


def test_batch_size_has_no_jump_at_one_kernel_length():
    """Kernels just below and just above 20 µs (the old threshold: batched vs alone) get nearly the same batch;
    a sample spans about BATCH_TARGET_US where the ring allows; a long kernel runs alone."""
    rng = np.random.default_rng()
    for _ in range(50):
        single = float(rng.uniform(1.0, 400.0))
        b = batch_size(single, 1024)
        assert b * single >= BATCH_TARGET_US or b == 1  # a sample spans the target ...
        assert (b - 1) * single < BATCH_TARGET_US  # ... with no launch more than it needs
    assert abs(batch_size(19.0, 1024) - batch_size(21.0, 1024)) <= 1
    assert batch_size(19.0, 12) == batch_size(21.0, 12) == 6  # the ring caps both alike
    assert batch_size(1.0, 20) == 10
    assert batch_size(2 * BATCH_TARGET_US, 12) == 1
    assert batch_size(0.0, 1024) == batch_size(0.5, 1024) == 400  # a 0 µs reading counts as 0.5 µs
    assert batch_size(0.0, 3) == 1
    with pytest.raises(ValueError, match="at least 1 input set"):
        batch_size(5.0, 0)


class _FakeTimer(ArmTimer):
    """An ArmTimer whose graph replays take ``graph_us`` per launch plus 2 µs a replay and whose eager launches
    take ``eager_us`` (host latency not hidden); ``capture_fails``: graph capture raises."""

    def __init__(self, graph_us, eager_us, capture_fails=False):
        super().__init__(lambda *a: None, list(range(12)), None, None, plan_ring(21 << 20, L2))
        self.graph_us, self.eager_us, self.capture_fails = graph_us, eager_us, capture_fails
        self.captured = []

    def _capture(self, batch, windows=None):
        if self.capture_fails:
            raise RuntimeError("no capture here")
        self.captured.append(batch)
        self._graphs = [None] * (windows or max(1, len(self.ring) // batch))

    def _graph_sample(self):
        return self.graph_us + 2.0 / self.batch

    def _eager_sample(self, batch):
        return self.eager_us

    def release(self):
        self._graphs = []


def test_calibrate_batches_graphs_by_a_graph_of_one_launch_not_an_eager_launch():
    """A 17 µs kernel whose eager launches read 150 µs (seen on an H200: ledger #74-#76 got batches of 1 to 6 in
    one sweep) is batched as a 17 µs kernel (19 µs in a graph of one: 11 launches, capped at 6 by the ring of 12),
    and captured at that batch; without capture, the eager estimate is all there is."""
    timer = _FakeTimer(17.0, 150.0)
    timer.calibrate()
    assert timer.method == "graph" and timer.batch == 6 and timer.captured == [1, 6]
    slow = _FakeTimer(300.0, 150.0)
    slow.calibrate()
    assert slow.batch == 1 and slow.captured == [1, 1]  # 8 estimate graphs, then one per set of the ring of 12
    eager = _FakeTimer(17.0, 150.0, capture_fails=True)
    eager.calibrate()
    assert eager.method == "eager" and eager.batch == batch_size(150.0, 12) == 2 and "no capture here" in eager.note


def test_large_working_sets_use_two_copies_and_tiny_ones_add_a_flush():
    assert plan_ring(1 << 30, L2).mode == "two-copies"
    assert plan_ring(1 << 30, L2).sets == 2
    tiny = plan_ring(4 << 10, L2)
    assert tiny.mode == "ring+flush" and tiny.total_bytes < RING_FACTOR * L2
    assert plan_ring(1 << 20, L2, flush=True).mode == "ring+flush"
    with pytest.raises(ValueError):
        plan_ring(0, L2)


def _session(exp_name="copy", workload="tiny"):
    from numba import cuda

    exp = get(exp_name)
    wl = exp.workload(workload)
    rng = np.random.default_rng()
    device = DeviceInfo("Fake GPU", "9.0", 132, L2, 227 << 10, 80 << 30, "", "13.0", "13.0")
    return harness.Session(
        experiment=exp, workload=wl, device=device, ceilings=None, stream=cuda.stream(),
        plan=plan_ring(exp.input_set_bytes(wl), L2), ring=[exp.make_input_set(wl, rng) for _ in range(2)],
        output=exp.make_output(wl), flush_buffer=None, nvml=envmod.Nvml.__new__(envmod.Nvml),
        env_start=envmod.GpuState(), warmup_s=0.0,
    )


def test_gate_passes_a_correct_arm():
    session = _session()
    outcome, timer = harness.prepare_arm(session, "A", {"VEC": 4})
    assert outcome.status == "ok" and outcome.parity_error == 0.0 and timer is not None


def test_gate_marks_a_wrong_or_crashing_arm_invalid(monkeypatch):
    session = _session()
    exp = session.experiment

    def lazy_prepare(config, workload):  # writes nothing: the NaN poison must be caught
        return lambda inputs, output, stream: None

    monkeypatch.setattr(exp, "prepare", lazy_prepare)
    outcome, timer = harness.prepare_arm(session, "B", {"VEC": 4})
    assert outcome.status == "invalid" and timer is None
    assert "relative error" in outcome.error and outcome.parity_error > 0

    def crashing_prepare(config, workload):
        raise RuntimeError("ptxas: too many resources requested for launch")

    monkeypatch.setattr(exp, "prepare", crashing_prepare)
    outcome, timer = harness.prepare_arm(session, "B", {"VEC": 4})
    assert outcome.status == "invalid" and timer is None
    assert "too many resources" in outcome.error


def test_an_arm_whose_timing_went_wrong_is_invalid_after_timing(monkeypatch):
    """`Experiment.after_timing` raising (a persistent kernel's barrier gave up while it was timed) turns a timed
    arm INVALID with the reason; not raising leaves it ok."""
    session = _session()
    outcome, timer = harness.prepare_arm(session, "A", {"VEC": 4})
    stats = ArmStats(10.0, 9.9, 10.1, 10.0, 5, 0)

    class Timer:
        def describe(self):
            return "graph, 1 launch(es) per sample"

    harness._finish(session, outcome, Timer(), stats)
    assert outcome.status == "ok" and outcome.error is None

    def gave_up(config, workload):
        raise RuntimeError("grid barrier 3 gave up waiting")

    monkeypatch.setattr(session.experiment, "after_timing", gave_up)
    harness._finish(session, outcome, Timer(), stats)
    assert outcome.status == "invalid" and outcome.error == "after timing: RuntimeError: grid barrier 3 gave up waiting"


def _fake_ab(verdict: str, delta: float):
    def measure_ab(session, configs, *, bar, **kwargs):
        arms = []
        for label, cfg in zip(("A", "B"), configs):
            arm = harness.ArmOutcome(label=label, config=cfg, parity_error=0.0, tolerance=0.0)
            med = 100.0 * (1 + delta if label == "B" else 1.0)
            arm.stats = ArmStats(med, med * 0.99, med * 1.01, med, 50, 0)
            arms.append(arm)
        comp = Comparison(delta, delta - 0.002, delta + 0.002, 1e-4, 20, verdict, bar, False)
        return harness.ABResult(session, arms, comp, verdict, bar, rounds=20, stop_reason="ci",
                                env_end=envmod.GpuState())

    return measure_ab


@pytest.fixture
def fake_gpu(monkeypatch):
    monkeypatch.setattr(harness, "open_session", lambda exp, wl, **kw: _session())
    return monkeypatch


def test_ab_records_the_verdict_and_gates_on_regression(fake_gpu, tmp_path):
    runner = CliRunner()
    fake_gpu.setattr(harness, "measure_ab", _fake_ab("REVERTED", 0.05))
    led = tmp_path / "records"
    args = ["ab", "copy", "--arm", "VEC=4", "--arm", "VEC=1", "--ledger", str(led), "--note", "from a test"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "REVERTED" in r.output and "-4.8% slower" in r.output  # +5% of time: 1/1.05 - 1 as a speed-up
    r = runner.invoke(app, args + ["--fail-on-regression"])
    assert r.exit_code == 1
    contents = ledger.load(led)
    assert [rec["verdict"] for rec in contents.records] == ["REVERTED", "REVERTED"]
    assert contents.records[0]["notes"] == "from a test" and not contents.problems
    assert contents.records[0]["arms"][1]["knobs"] == {"VEC": 1}

    fake_gpu.setattr(harness, "measure_ab", _fake_ab("LANDED", -0.2))
    r = runner.invoke(app, ["ab", "copy", "--arm", "VEC=1", "--arm", "VEC=4", "--ledger", str(led), "--fail-on-regression"])
    assert r.exit_code == 0 and "LANDED" in r.output


def test_a_bad_ledger_is_refused_before_measuring(fake_gpu, tmp_path):
    blocker = tmp_path / "file.txt"
    blocker.write_text("not a directory")

    def must_not_run(*args, **kwargs):
        raise AssertionError("measured although the ledger could not take the record")

    fake_gpu.setattr(harness, "measure_ab", must_not_run)
    for bad in (blocker, tmp_path / "no" / "such" / "dir"):
        r = CliRunner().invoke(app, ["ab", "copy", "--arm", "VEC=1", "--arm", "VEC=4", "--ledger", str(bad)])
        assert r.exit_code == 2 and "ledger directory" in r.output, r.output


def test_a_ledger_that_fails_after_measuring_loses_nothing(fake_gpu, tmp_path):
    """The write can still fail after the measurement (disk full, permissions changed): print everything."""
    blocker = tmp_path / "file.txt"
    blocker.write_text("not a directory")
    fake_gpu.setattr(ledger, "check_writable", lambda directory: None)
    fake_gpu.setattr(harness, "measure_ab", _fake_ab("NEUTRAL", 0.001))
    r = CliRunner().invoke(app, ["ab", "copy", "--arm", "VEC=1", "--arm", "VEC=4", "--ledger", str(blocker / "records")])
    assert r.exit_code == 3
    assert "NEUTRAL" in r.output and "the result was not lost: saved to " in r.output
    saved = Path(" ".join(r.output.split("saved to ", 1)[1].split()).split(" (copy it")[0])
    assert yaml.safe_load(saved.read_text())["verdict"] == "NEUTRAL"
    # When even the fallback cannot be written, the whole record is printed instead.
    fake_gpu.setenv("MINFER_CACHE_DIR", str(blocker / "cache"))
    r = CliRunner().invoke(app, ["ab", "copy", "--arm", "VEC=1", "--arm", "VEC=4", "--ledger", str(blocker / "records")])
    assert r.exit_code == 3 and "the measurement was not lost" in r.output
    dumped = r.output[r.output.index("schema: "):]
    assert yaml.safe_load(dumped)["verdict"] == "NEUTRAL"
