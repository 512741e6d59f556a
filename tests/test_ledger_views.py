"""The ledger's reading side at scale and its verdict re-checks: `ledger show` at 80 columns for every kind,
filters, `show ID`, `diff`, `verify` (with a fake runner for each outcome) and `retire`, and the derived index."""

from __future__ import annotations

import json
import random
import re

import pytest
import yaml
from typer.testing import CliRunner

from minfer_cli import ledger
from minfer_cli.commands import ledger_common
from minfer_cli.ledger import figures, index, store
from minfer_cli.ledger import verify as core_verify
from minfer_cli.main import app
from tests.ledger_factory import KINDS, record, write_ledger


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


# ------------------------------------------------------------------------------------------------ show


@pytest.mark.parametrize("n", [0, 1, 1000])
def test_show_fits_80_columns_one_line_per_record(tmp_path, console_width, n):
    write_ledger(tmp_path, n, seed=n)
    console_width(80)
    r = invoke("ledger", "show", "--ledger", str(tmp_path))
    assert r.exit_code == 0, r.output
    if n == 0:  # a message naming the directory, whose path is never broken
        assert "no records yet" in r.stdout
        return
    lines = r.stdout.rstrip("\n").split("\n")
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    assert len(lines) == n + 2  # header, rule, then exactly one line per record: no cell wrapped
    ids = [int(line.split("│")[0]) for line in lines[2:]]
    assert ids == list(range(1, n + 1))


def test_every_kind_shows_its_figure_in_its_unit(tmp_path, console_width):
    write_ledger(tmp_path, len(KINDS))
    console_width(200)
    r = invoke("ledger", "show", "--ledger", str(tmp_path))
    rows = {line.split("│")[0].strip(): line for line in r.stdout.splitlines()[2:]}
    assert re.search(r"\d+\.\d → \d+\.\d µs [+-]\d+\.\d% (faster|slower)", rows["1"])  # ab: both medians, the change
    assert re.search(r"pp2048 [\d,]+ ± [\d.]+, tg128 [\d.]+ ± [\d.]+ tok/s", rows["2"])  # bench: mean ± std
    assert "best TM=64" in rows["3"] and "vs default" in rows["3"]  # sweep: best point and change vs default
    assert "FP rate 0% at 1%, suggested bar 0.4" in rows["5"]  # calibration
    assert "HOLDS" in rows["6"] and "RETIRED" in rows["7"] and "PASS" in rows["8"]


def test_speedup_is_one_definition_for_time_and_rate():
    # 400 µs -> 350 µs is old/new - 1 = +14.3%; 100 -> 114.3 tok/s is new/old - 1 = +14.3%.
    assert figures.speedup(350 / 400 - 1, higher_is_better=False) == pytest.approx(400 / 350 - 1)
    assert figures.speedup(0.143, higher_is_better=True) == pytest.approx(0.143)
    low, high = figures.speedup_interval(-0.13, -0.11, higher_is_better=False)
    assert low == pytest.approx(1 / 0.89 - 1) and high == pytest.approx(1 / 0.87 - 1) and low < high
    assert figures.fmt_change(0.141) == "+14.1% faster" and figures.fmt_change(-0.032) == "-3.2% slower"
    assert figures.fmt_p(0.0) == "< 1e-6" and figures.fmt_p(0.034) == "0.034"


def test_filters_kind_since_grep(tmp_path):
    records = write_ledger(tmp_path, 40)
    frame = json.loads(invoke("ledger", "show", "--ledger", str(tmp_path), "--kind", "bench", "-f", "json").stdout)
    assert {row["kind"] for row in frame} == {"bench"} and len({row["id"] for row in frame}) == 5
    frame = json.loads(invoke("ledger", "show", "--ledger", str(tmp_path), "--since", "30", "-f", "json").stdout)
    assert min(row["id"] for row in frame) == 30
    day = records[9]["timestamp"][:10]
    chosen = ledger.query(records, since=ledger.parse_since(day))
    assert chosen and all(r["timestamp"] >= day for r in chosen)
    frame = json.loads(invoke("ledger", "show", "--ledger", str(tmp_path), "--grep", "RECORD 17 ", "-f", "json").stdout)
    assert [row["id"] for row in frame] == [17]
    r = invoke("ledger", "show", "--ledger", str(tmp_path), "--since", "yesterday")
    assert r.exit_code == 2 and "neither a record id nor a date" in r.output


def test_exports_carry_every_statistic_and_every_sweep_point(tmp_path):
    write_ledger(tmp_path, 3)
    rows = json.loads(invoke("ledger", "show", "--ledger", str(tmp_path), "-f", "json").stdout)
    ab = rows[0]
    for key in ("a_median", "a_mean", "a_std", "a_p10", "a_p90", "a_n", "b_median", "speedup_pct", "p_value"):
        assert ab[key] is not None, key
    assert ab["speedup_pct"] == pytest.approx((1 / (1 + ab["delta_pct"] / 100) - 1) * 100, rel=1e-6)
    assert [row["point"] for row in rows if row["kind"] == "sweep"] == ["p1 (best)", "p2", "p3 (default)"]


@pytest.mark.parametrize("kind", KINDS)
def test_show_one_record_whole_and_readable(tmp_path, console_width, kind):
    write_ledger(tmp_path, len(KINDS))
    console_width(80)
    record_id = KINDS.index(kind) + 1
    r = invoke("ledger", "show", str(record_id), "--ledger", str(tmp_path))
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith(f"#{record_id} {kind} record") and "command: minfer" in r.stdout
    assert not r.stdout.lstrip().startswith("schema:")  # not raw YAML
    r = invoke("ledger", "show", str(record_id), "--ledger", str(tmp_path), "--format", "yaml")
    assert yaml.safe_load(r.stdout)["id"] == record_id


def test_diff_names_knobs_environment_and_figures(tmp_path):
    rng = random.Random(3)
    a, b = record(1, "ab", rng), record(2, "ab", rng)
    b["arms"][1]["knobs"]["STAGES"] = 4
    b["environment"] = {"device": {"name": "NVIDIA H100"}}
    from minfer_cli.ledger.diff import diff

    result = diff(a, b)
    assert [(d.what, d.a, d.b) for d in result.knobs] == [("arm B STAGES", "3", "4")]
    assert ("GPU", "NVIDIA H200", "NVIDIA H100") in [(d.what, d.a, d.b) for d in result.environment]
    medians = {f.what: f for f in result.figures}
    assert medians["A median"].change == pytest.approx(a["arms"][0]["stats"]["median"] / b["arms"][0]["stats"]["median"] - 1)
    for rec in (a, b):
        (tmp_path / f"{rec['id']:04d}-x.yaml").write_text(store.dump(rec))
    r = invoke("ledger", "diff", "1", "2", "--ledger", str(tmp_path))
    assert r.exit_code == 0 and "arm B STAGES" in r.stdout and "NVIDIA H100" in r.stdout


# ------------------------------------------------------------------------------------------------ verify


class FakeRunner:
    """Measures what a plan asks by returning a chosen speed-up (A/B) or value ratio (figures)."""

    def __init__(self, speedup: float = 0.0, ratio: float = 1.0, device: str = "NVIDIA H200") -> None:
        self.speedup, self.ratio, self.device, self.plans = speedup, ratio, device, []

    def device_name(self):
        return self.device

    def run(self, plan):
        self.plans.append(plan)
        if plan.mode == "ab":
            delta = 1 / (1 + self.speedup) - 1 if not plan.higher_is_better else self.speedup
            comparison = {"delta": delta, "ci_low": delta - 0.001, "ci_high": delta + 0.001, "p_value": 1e-6,
                          "rounds": 12}
            arms = [{"label": label, "knobs": c, "status": "ok", "stats": {"median": 100.0}}
                    for label, c in zip(plan.labels, plan.configs)]
            return core_verify.Measured(arms, comparison, {"arms": arms})
        arms = [{"label": label, "knobs": c, "status": "ok", "stats": {"median": v * self.ratio, "mean": v * self.ratio}}
                for label, c, v in zip(plan.labels, plan.configs, plan.recorded_values)]
        return core_verify.Measured(arms, None, {"arms": arms})


def _copy_ab(record_id: int, speedup: float, **extra) -> dict:
    """An A/B of the copy experiment (VEC=1 vs VEC=4) whose B was ``speedup`` faster."""
    a = 700.0
    b = a / (1 + speedup)
    return {"schema": 2, "id": record_id, "title": f"copy {record_id}", "timestamp": "2026-11-30T10:00:00Z",
            "kind": "ab", "experiment": "copy", "workload": {"name": "1GiB", "shape": {}},
            "metric": {"name": "time", "unit": "µs", "higher_is_better": False},
            "arms": [{"label": "A", "knobs": {"VEC": 1}, "status": "ok", "stats": {"median": a}},
                     {"label": "B", "knobs": {"VEC": 4}, "status": "ok", "stats": {"median": b}}],
            "comparison": {"delta": b / a - 1, "ci_low": b / a - 1.001, "ci_high": b / a - 0.999, "p_value": 1e-7,
                           "rounds": 20},
            "bar": 0.01, "verdict": "LANDED", "environment": {"device": {"name": "NVIDIA H200"}}, "software": {},
            "git": {"commit": None, "dirty": None}, "command": "minfer ab", "notes": "", **extra}


@pytest.mark.parametrize("now, outcome", [(0.305, "HOLDS"), (0.20, "REGRESSED"), (0.40, "IMPROVED")])
def test_verify_judges_an_ab_by_its_effect(now, outcome):
    original = _copy_ab(1, 0.30)
    result = core_verify.verify(original, [original], FakeRunner(speedup=now))
    assert result.outcome == outcome, result.reason
    assert result.recorded["speedup"] == pytest.approx(0.30)
    assert result.measured["speedup"] == pytest.approx(now, abs=2e-3)


@pytest.mark.parametrize("ratio, outcome", [(0.99, "HOLDS"), (0.90, "REGRESSED"), (1.10, "IMPROVED")])
def test_verify_judges_a_bench_figure(ratio, outcome):
    rng = random.Random(0)
    bench = record(1, "bench", rng)
    result = core_verify.verify(bench, [bench], FakeRunner(ratio=ratio))
    assert result.outcome == outcome, result.reason
    assert "pp2048" in result.reason and "tg128" in result.reason


def test_verify_cannot_run_names_why():
    original = _copy_ab(1, 0.3)
    gone = dict(original, arms=[dict(original["arms"][0], knobs={"VEC": 8}), original["arms"][1]])
    assert "VEC=8 no longer exists" in core_verify.verify(gone, [gone], FakeRunner()).reason
    other_gpu = core_verify.verify(original, [original], FakeRunner(device="NVIDIA B200"))
    assert other_gpu.outcome == "CANNOT-RUN" and "recorded on NVIDIA H200, this GPU is NVIDIA B200" in other_gpu.reason
    removed = dict(original, arms=[dict(a, knobs={**a["knobs"], "OLD": i}) for i, a in enumerate(original["arms"])])
    assert "knob OLD (the one under test" in core_verify.verify(removed, [removed], FakeRunner()).reason
    calibration = dict(original, kind="calibrate", verdict="MEASURED")
    assert core_verify.verify(calibration, [calibration], FakeRunner()).outcome == "CANNOT-RUN"


@pytest.mark.parametrize("recorded, asked, expected", [(3, None, 3), (2, None, 3), (27, None, 10), (None, None, 10),
                                                      (3, 12, 12)])
def test_verify_reruns_as_many_rounds_as_the_record_ran(recorded, asked, expected):
    original = _copy_ab(1, 0.3)
    original["comparison"]["rounds"] = recorded
    plan = core_verify.plan(original, [original])
    assert plan.rounds == recorded
    assert core_verify.min_rounds_for(plan, asked) == expected


def test_verify_drops_shared_removed_knobs_and_gives_predated_knobs_their_legacy_value():
    from minfer_cli.knobs import Knob

    class Exp:
        name, workloads = "fake", ()
        knobs = (Knob("VEC", (1, 4), 4, "v"), Knob("LOOP", ("v1", "pipe"), "pipe", "l", legacy="v1"),
                 Knob("NEW", (0, 1), 1, "n"))
        removed_knobs = {"GONE": 2, "LOST": 0}

        def default_config(self):
            return {k.name: k.default for k in self.knobs}

        def workload(self, name):
            return name

        def unread_knobs(self, workload):
            return ()

    original = _copy_ab(1, 0.3)
    original["experiment"] = "fake"
    original["workload"] = {"name": "w", "shape": {}}
    for arm in original["arms"]:
        arm["knobs"]["GONE"] = 2
    Exp.workloads = (type("W", (), {"name": "w"})(),)
    plan = core_verify.plan(original, [original], registry=lambda name: Exp())
    assert plan.dropped == {"GONE": 2} and plan.predated == {"LOOP": "v1", "NEW": 1}
    assert [c["LOOP"] for c in plan.configs] == ["v1", "v1"] and [c["VEC"] for c in plan.configs] == [1, 4]
    for arm in original["arms"]:  # a removed knob at another value than the one the code still runs: a deleted variant
        arm["knobs"]["LOST"] = 1
    gone = core_verify.plan(original, [original], registry=lambda name: Exp())
    assert gone.outcome == "CANNOT-RUN" and gone.reason == "knob value LOST=1 was deleted (the code runs only what was LOST=0)"
    for arm in original["arms"]:  # a removed knob the experiment does not declare: nothing says what it did
        arm["knobs"].pop("LOST")
        arm["knobs"]["UNKNOWN"] = 0
    unknown = core_verify.plan(original, [original], registry=lambda name: Exp())
    assert unknown.outcome == "CANNOT-RUN" and "UNKNOWN=0 no longer exists and fake does not say" in unknown.reason


def test_verify_cli_records_each_outcome_and_exits_1_on_regression(tmp_path, monkeypatch):
    from minfer_cli.measure import verify_runner

    for rec in (_copy_ab(1, 0.30), _copy_ab(2, 0.30), _copy_ab(3, 0.30)):
        (tmp_path / f"{rec['id']:04d}-copy.yaml").write_text(store.dump(rec))
    monkeypatch.setattr(verify_runner, "HarnessRunner", lambda **kw: FakeRunner(speedup=0.31))
    r = invoke("ledger", "verify", "--landed", "--ledger", str(tmp_path))
    # Three records of the same A/B: the latest governs, the earlier ones are superseded and not re-run.
    assert r.exit_code == 0, r.output
    assert "#3 HOLDS" in r.stdout and "#1: superseded by #3" in r.stdout and "#2: superseded by #3" in r.stdout
    written = ledger.load(tmp_path).records[-1]
    assert written["kind"] == "verify" and written["verdict"] == "HOLDS" and written["verify"]["of"] == 3
    monkeypatch.setattr(verify_runner, "HarnessRunner", lambda **kw: FakeRunner(speedup=0.10))
    r = invoke("ledger", "verify", "1", "--ledger", str(tmp_path))
    assert r.exit_code == 1 and "#1 REGRESSED" in r.stdout
    assert ledger.load(tmp_path).records[-1]["verdict"] == "REGRESSED"


def test_retire_makes_verify_report_retired(tmp_path, monkeypatch):
    from minfer_cli.measure import verify_runner

    (tmp_path / "0001-copy.yaml").write_text(store.dump(_copy_ab(1, 0.3)))
    r = invoke("ledger", "retire", "1", "--why", "VEC=1 deleted in abc1234", "--ledger", str(tmp_path))
    assert r.exit_code == 0, r.output
    runner = FakeRunner()
    monkeypatch.setattr(verify_runner, "HarnessRunner", lambda **kw: runner)
    r = invoke("ledger", "verify", "1", "--ledger", str(tmp_path))
    assert r.exit_code == 0 and "#1 RETIRED: retired by #2: VEC=1 deleted in abc1234" in r.stdout
    assert runner.plans == []  # nothing was measured
    assert invoke("ledger", "retire", "1", "--why", " ", "--ledger", str(tmp_path)).exit_code == 2
    assert invoke("ledger", "retire", "9", "--why", "x", "--ledger", str(tmp_path)).exit_code == 2
    again = invoke("ledger", "retire", "1", "--why", "x", "--ledger", str(tmp_path))
    assert again.exit_code == 2 and "already retired by #2" in again.output
    tomb = invoke("ledger", "retire", "2", "--why", "x", "--ledger", str(tmp_path))
    assert tomb.exit_code == 2 and "itself a retire record" in tomb.output
    assert sorted(p.name[:4] for p in tmp_path.glob("*.yaml")) == ["0001", "0002", "0003"]  # the verify; no more
    row = next(line for line in invoke("ledger", "show", "--ledger", str(tmp_path)).stdout.splitlines()
               if line.lstrip().startswith("1 "))
    assert row.rstrip().endswith("RETIRED")
    assert "retired by #2: VEC=1 deleted in abc1234" in invoke("ledger", "show", "1", "--ledger", str(tmp_path)).stdout


def test_verify_needs_records_or_landed(tmp_path):
    r = invoke("ledger", "verify", "--ledger", str(tmp_path))
    assert r.exit_code == 2 and "--landed" in r.output


# ------------------------------------------------------------------------------------------------ index


def test_the_index_is_used_and_never_trusted(tmp_path, monkeypatch):
    write_ledger(tmp_path, 20)
    first = ledger.load(tmp_path).records
    calls = []
    real_parse = store._parse
    monkeypatch.setattr(store, "_parse", lambda data, name_id: calls.append(name_id) or real_parse(data, name_id))
    assert ledger.load(tmp_path).records == first and calls == []  # every record came from the index
    # A file changed on disk is parsed again, whatever the index says.
    path = sorted(tmp_path.glob("0007-*.yaml"))[0]
    changed = yaml.safe_load(path.read_text())
    changed["notes"] = "edited"
    path.write_text(store.dump(changed))
    assert ledger.load(tmp_path).records[6]["notes"] == "edited" and calls == [7]
    # A planted index (valid JSON, entries naming the real files' hashes, a false record, no valid MAC) is ignored.
    index_file = index.index_path(tmp_path)
    payload = json.loads(index_file.read_bytes().split(b"\n", 1)[1])
    for name, entry in payload["entries"].items():
        entry[1] = dict(entry[1], title="PLANTED")
    index_file.write_bytes(b"0" * 64 + b"\n" + json.dumps(payload).encode())
    assert all(r["title"] != "PLANTED" for r in ledger.load(tmp_path).records)
    # Truncated or garbage: rebuilt, silently.
    for junk in (index_file.read_bytes()[:100], b"\x00\xff" * 50, b""):
        index_file.write_bytes(junk)
        assert ledger.load(tmp_path).records == ledger.load(tmp_path).records and len(ledger.load(tmp_path).records) == 20


def test_an_unwritable_cache_costs_speed_only(tmp_path, monkeypatch):
    write_ledger(tmp_path / "l", 5)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("MINFER_CACHE_DIR", str(blocker / "cache"))
    assert [r["id"] for r in ledger.load(tmp_path / "l").records] == [1, 2, 3, 4, 5]


def test_ten_thousand_records_load_and_export(tmp_path):
    write_ledger(tmp_path, 10_000)
    contents = ledger.load(tmp_path)
    assert len(contents.records) == 10_000 and not contents.problems
    frame = ledger.to_frame(contents.records[-50:])
    assert frame["id"].max() == 10_000


def test_ledger_common_fit_widths_shrinks_in_order():
    widths = ledger_common.fit_widths({"a": 10, "b": 30, "c": 30}, 60, (("b", 10), ("c", 20)))
    assert widths == {"a": 10, "b": 14, "c": 30}  # 10 + 14 + 30 + 2 separators x 3 = 60


def test_a_verify_of_a_bench_exports_a_row_per_test_not_an_ab():
    rng = random.Random(1)
    bench = record(1, "bench", rng)
    result = core_verify.verify(bench, [bench], FakeRunner(ratio=1.0))
    rec = core_verify.verify_record(bench, result, git={"commit": None, "dirty": None}, command="c",
                                    timestamp="2026-12-02T00:00:00Z")
    rec["id"] = 2
    rows = figures.rows(rec)
    assert [r["workload"] for r in rows] == [a["label"] for a in bench["arms"]]
    assert all(r["arm_b"] is None and r["b_median"] is None for r in rows)


def test_verify_plan_says_what_each_record_is_judged_against(tmp_path):
    (tmp_path / "0001-copy.yaml").write_text(store.dump(_copy_ab(1, 0.3)))
    r = invoke("ledger", "verify", "1", "--plan", "--ledger", str(tmp_path))
    assert r.exit_code == 0, r.output
    assert "#1 ab copy · 1GiB: VEC=1 → VEC=4" in r.stdout
    assert "recorded +30.0% faster: HOLDS if the new 95% CI reaches +29.0% to +31.0%" in r.stdout
    assert "1 record(s): 1 to re-run (1 A/B" in r.stdout and "appends a verify record" in r.stdout
    assert list(tmp_path.glob("*.yaml")) == [tmp_path / "0001-copy.yaml"]  # a plan writes nothing


def test_a_sweep_over_work_knobs_ranks_by_throughput_and_otherwise_by_the_metric():
    """gemv TYPE=Q2_K is the fastest in µs and the slowest in GB/s: a grid over TYPE names the GB/s winner; a
    grid over launch shapes the fastest time; a rate metric (bench tok/s) the highest."""
    from minfer_cli.baselines import Throughput
    from minfer_cli.experiment import get
    from minfer_cli.measure.harness import ArmOutcome
    from minfer_cli.measure.record import sweep_ranking
    from minfer_cli.measure.stats import ArmStats

    def point(label, knobs, us, gbps):
        return ArmOutcome(label, knobs, stats=ArmStats(us, us, us, us, 5, 0),
                          figures=Throughput(0.0, gbps, None, None, None))

    gemv = get("gemv")
    by_type = [point("p1", {"TYPE": "Q2_K", "RPB": 4}, 47.5, 900.0), point("p2", {"TYPE": "F16", "RPB": 4}, 98.6, 4000.0),
               ArmOutcome("p3", {"TYPE": "Q4_K", "RPB": 4}, status="invalid")]
    assert [a.label for a in sweep_ranking(gemv, by_type)] == ["p2", "p1", "p3"]
    by_shape = [point("p1", {"TYPE": "Q4_K", "RPB": 2}, 20.0, 2000.0), point("p2", {"TYPE": "Q4_K", "RPB": 4}, 16.0, 2500.0)]
    assert [a.label for a in sweep_ranking(gemv, by_shape)] == ["p2", "p1"]
    tok_s = [point("p1", {"PDL": 0}, 337.0, 0.0), point("p2", {"PDL": 1}, 373.0, 0.0)]
    assert [a.label for a in sweep_ranking(get("bench"), tok_s)] == ["p2", "p1"]
