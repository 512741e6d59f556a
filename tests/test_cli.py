"""CLI behaviour without a GPU: help, listings, and every bad-input case as one line with a non-zero exit."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from minfer_cli import experiment as registry_mod
from minfer_cli.experiment import Experiment, Workload
from minfer_cli.knobs import Knob
from minfer_cli.main import app

runner = CliRunner()


def invoke(*args: str):
    result = runner.invoke(app, list(args))
    assert "Traceback" not in result.output, result.output
    return result


def test_version_and_help():
    assert invoke("--version").output.startswith("minfer ")
    for cmd in (["--help"], ["run", "--help"], ["ab", "--help"], ["calibrate", "--help"], ["doctor", "--help"],
                ["experiments", "list", "--help"], ["ledger", "show", "--help"]):
        r = invoke(*cmd)
        assert r.exit_code == 0, (cmd, r.output)
    assert "Example" in invoke("ab", "--help").output


def test_every_experiment_file_loads():
    assert registry_mod.broken() == {}


_NUMBA_FREE = """
import sys
from minfer_cli.main import app  # what `minfer --help` imports
assert 'numba' not in sys.modules, 'the CLI imports numba at start-up'
from minfer_cli.engine.bench import engine_knobs
from minfer_cli.experiment import broken, load_all
registry = load_all()  # what `minfer experiments list` and `show` load
assert not broken(), broken()
knobs = [k for e in registry.values() for k in e.knobs] + list(engine_knobs())
leaked = sorted(m for m in sys.modules if m == 'numba' or m.startswith('numba.'))
assert not leaked, 'listing the experiments imports numba: ' + ', '.join(leaked[:5])
"""


def test_listing_experiments_imports_no_numba():
    """`minfer --help`, `minfer experiments list` and `show` stay fast: no experiment module, knob table or the
    engine's knob list imports numba at module level (a kernel is imported inside the methods that do GPU work)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-c", _NUMBA_FREE], cwd=root, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr


def test_experiments_list_shows_copy_knobs_and_workloads():
    r = invoke("experiments", "list", "--json")
    assert r.exit_code == 0
    import json

    data = {e["name"]: e for e in json.loads(r.output)}
    copy = data["copy"]
    assert copy["knobs"][0]["name"] == "VEC" and copy["knobs"][0]["values"] == [1, 2, 4]
    assert any(w["name"] == "1GiB" for w in copy["workloads"])
    assert invoke("experiments", "list").exit_code == 0


def test_experiments_list_is_a_line_each_and_show_gives_one_whole(console_width):
    console_width(80)
    r = invoke("experiments", "list")
    assert r.exit_code == 0 and all(len(line) <= 80 for line in r.stdout.splitlines())
    assert sum(line.startswith("gemv ") for line in r.stdout.splitlines()) == 1
    one = invoke("experiments", "show", "copy")
    assert one.exit_code == 0 and "VEC ∈ {1, 2, 4*}" in one.stdout and "1GiB: nbytes=1073741824" in one.stdout
    bad = invoke("experiments", "show", "nope")
    assert bad.exit_code == 2 and "registered experiments: attention" in bad.output


def test_without_w_the_arms_knobs_pick_the_workload():
    """No -w: the first workload every arm can run on (a tg-only engine knob picks tg128, not pp2048); where none
    fits, the first declared one, whose refusal `ab` / `run` then report."""
    from minfer_cli.experiment import get

    bench = get("bench")
    arms = [bench.config(a) for a in ("FUSE_GLU=0", "FUSE_GLU=1")]
    assert bench.workload(None, arms).name == "tg128"
    assert bench.workload(None, [bench.config("W16=0")]).name == "pp2048"
    assert bench.workload(None, [bench.config("W16=0,FUSE_GLU=0")]).name == "pp2048"  # nothing fits: refused later
    assert bench.workload(None).name == "pp2048" and bench.workload("tiny_tg8", arms).name == "tiny_tg8"
    gemv = get("gemv")
    assert gemv.workload(None, [gemv.config("TYPE=Q6_K,STAGE=2")]).name == "ffn_up"


@pytest.mark.parametrize(
    "args, needle",
    [
        (["ab", "copy", "--arm", "BOGUS=1", "--arm", "VEC=4"], "unknown knob BOGUS for experiment copy; its knobs are: VEC"),
        (["ab", "copy", "--arm", "VEC=3", "--arm", "VEC=4"], "VEC=3 is not allowed; allowed values: 1, 2, 4"),
        (["ab", "copy", "--arm", "VEC=x", "--arm", "VEC=4"], "is not an integer; allowed values: 1, 2, 4"),
        (["ab", "copy", "--arm", "VEC", "--arm", "VEC=4"], "is not K=V"),
        (["ab", "copy", "--arm", "VEC=1,VEC=2", "--arm", "VEC=4"], "set twice"),
        (["ab", "copy", "--arm", "VEC=4", "--arm", "VEC=4"], "the two arms are identical"),
        (["ab", "copy", "--arm", "VEC=4"], "give exactly two --arm options"),
        (["ab", "--arm", "ZZ=64", "--arm", "ZZ=128"], "no experiment owns knob(s) ZZ"),
        (["ab", "nosuch", "--arm", "VEC=1", "--arm", "VEC=4"], "no experiment named 'nosuch'"),
        (["run", "copy", "--workload", "huge"], "has no workload 'huge'"),
        (["sweep", "copy", "VEC=1,5"], "VEC=5 is not allowed; allowed values: 1, 2, 4"),
        (["sweep", "copy", "FOO=1"], "unknown knob FOO for experiment copy"),
        (["sweep", "copy", "VEC"], "malformed grid axis"),
        (["sweep", "copy", "VEC=1", "VEC=2"], "given twice"),
        (["ab", "bench", "-w", "tiny_pp16", "--arm", "GRAPHS=0", "--arm", "GRAPHS=1"],
         "arm A cannot run: GRAPHS acts on tg workloads only and tiny_pp16 is a pp workload; pick a tg one with -w "
         "(tg128, tiny_tg8, qwen2-1.5b_tg128, tg128_d4096, tg128_d16384, tiny_tg2_d8)"),
        (["ab", "bench", "-w", "tg128", "--arm", "W16=0", "--arm", "W16=1"], "W16 acts on pp workloads only"),
        (["bench", "--arm", "GLU=1"], "unknown knob GLU for the engine (did you mean PFUSE_GLU or FUSE_GLU?)"),
        (["bench", "--arm", "fuse_glu=1"], "(did you mean FUSE_GLU?)"),
        (["bench", "-n", "0", "--arm", "DEEP=0"], "no requested test reads: DEEP (tg: needs -n > 0)"),
        (["bench", "-p", "0", "--arm", "W16=0"], "no requested test reads: W16 (pp: needs -p > 0)"),
        (["ab", "gemv", "--arm", "GLU=0", "--arm", "GLU=1"], "arms A and B do different work (GLU=0 vs 1)"),
        (["ab", "dequant", "--arm", "TYPE=Q4_K", "--arm", "TYPE=Q6_K"], "`minfer sweep dequant TYPE=Q4_K,Q6_K`"),
        (["sweep", "bench", "-w", "tiny_pp16", "FUSE_GLU=0", "DEEP=0"], "no point of the grid can run on workload"),
        (["bench", "--arm", "FUSE_NORM_Q8=1"], "knob FUSE_NORM_Q8 was removed from"),
        (["ab", "attention", "--arm", "BQ=64", "--arm", "BQ=128"], "knob BQ was removed from"),
        (["ab", "bench", "-w", "pp512", "--arm", "PFUSE_GLU=0,TM=64", "--arm", "PFUSE_GLU=1,TM=64"],
         "arms A and B run the same code: what they differ in (PFUSE_GLU=0 vs 1) is not read"),
        (["ab", "gemv", "--arm", "TYPE=Q5_0,MMVQ=1", "--arm", "TYPE=Q5_0,MMVQ=0"], "MMVQ=1 needs TYPE one of Q4_K"),
        (["run", "gemm_f16", "--arm", "MMA=wgmma,STAGING=sync"], "MMA=wgmma needs STAGING=cp_async"),
        (["calibrate", "gemm_f16", "--arm", "STAGING=cp_async,LOOP=pipe,STAGES=2"], "LOOP=pipe needs STAGES >= 3"),
        (["run", "gemm_f16", "--arm", "STAGING=tma,LOOP=addr32"], "STAGING=tma (the default) needs MMA=wgmma, KS=64"),
        (["bench", "--arm", "ATTN_MINB=3"], "knob ATTN_MINB was removed from the engine (a deleted variant"),
        (["ab", "attention_decode", "--arm", "MINB=3", "--arm", "MINB=0"],
         "knob MINB was removed from experiment attention_decode"),
        (["ab", "gemm_f16", "--arm", "IMPL=cublas,KS=32", "--arm", "IMPL=cublas"],
         "arms A and B run the same code: what they differ in (KS=32 vs 64) is not read"),
        (["ab", "gemm_f16", "--arm", "MMA=mma_sync,STAGING=cp_async,SPLITK=0", "--arm",
          "MMA=mma_sync,STAGING=cp_async,SPLITK=1"], "arms A and B run the same code"),
        (["ab", "--arm", "ATTN_MINB=0", "--arm", "ATTN_MINB=1"], "knob(s) removed (ATTN_MINB from bench"),
        (["ab", "bench", "--arm", "ATTN_SPLITS=32,PHEAD=gemv", "--arm", "ATTN_SPLITS=64"],
         "PHEAD act(s) on pp workloads only and ATTN_SPLITS on tg workloads only: no workload reads both"),
        (["bench", "--arm", "SCHED=persistent"], "knob SCHED was removed from the engine"),
        (["kernels", "gemm_f16", "KS=32"], "no point of the grid compiles for gemm_f16: gemm_f16 STAGING=tma"),
        (["sweep", "gemm_f16", "SCHED=grid,persistent"], "knob SCHED was removed from experiment gemm_f16"),
        (["sweep", "bench", "-w", "tg128", "FUSE_ADD_NORM=0,1"],
         "axis FUSE_ADD_NORM cannot vary on workload tg128: FUSE_ADD_NORM acts on pp workloads only"),
        (["ledger", "show", "-e", "nope"], "no record of experiment 'nope'"),
        (["bench", "-m", "/nonexistent/model.gguf"], "-m /nonexistent/model.gguf: no such file"),
        (["bench", "--preset", "tiny", "-d", "4k"], "-d takes comma-separated token counts, e.g. -d 0,4096; got '4k'"),
        (["bench", "--preset", "tiny", "-d", "0,-5"], "-d token counts must be >= 0, got -5"),
        (["bench", "--preset", "tiny", "-p", "16", "-n", "0", "-d", "0,1000000"],
         "-p 16 after a depth of -d 1000000 is beyond the model's context length"),
    ],
)
def test_bad_input_is_one_line(args, needle):
    r = invoke(*args)
    assert r.exit_code != 0
    assert needle in r.output, r.output
    lines = [ln for ln in r.output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, r.output


def test_a_default_knob_that_other_knobs_make_a_no_op_is_said():
    """PFUSE_GLU=1 (the default) with GEMM tiles whose kernel has no SwiGLU epilogue runs the gate/up product and
    swiglu apart, and NARROWTAIL=1 (the default) splits no launch of another TM or STAGING: `bench` says so on stderr
    before it does anything else (here it then stops: no GPU)."""
    from minfer_cli.engine.bench import engine_conflict, engine_knobs, idle_fusions
    from minfer_cli.knobs import resolve_config

    def idle(**knobs):
        return idle_fusions(resolve_config(engine_knobs(), {k: str(v) for k, v in knobs.items()}, "e"))

    narrow = resolve_config(engine_knobs(), {"TM": "64"}, "e")
    assert engine_conflict(narrow) is None
    assert list(idle(TM=64)) == ["PFUSE_GLU", "NARROWTAIL"]
    assert idle(TM=64)["PFUSE_GLU"].startswith("PFUSE_GLU=1 does nothing with these GEMM")
    assert idle(TM=64)["NARROWTAIL"].startswith("NARROWTAIL=1 does nothing with these GEMM knobs")
    assert idle() == {} and idle(TM=64, PFUSE_GLU=0, NARROWTAIL=0) == {} and idle(PFUSE_RESID=1) == {}
    assert idle(PFUSE_RESID=1, FUSE_ADD_NORM=1)["PFUSE_RESID"].startswith("PFUSE_RESID=1 does nothing with FUSE_ADD")
    cp_async = idle(PFUSE_RESID=1, STAGING="cp_async", KS=64, LOOP="pipe")
    assert set(cp_async) == {"PFUSE_GLU", "PFUSE_RESID", "NARROWTAIL"} and "STAGING=cp_async" in cp_async["PFUSE_RESID"]
    r = invoke("bench", "--preset", "tiny", "-p", "16", "-n", "0", "--arm", "TM=64")
    assert "PFUSE_GLU=1 does nothing with these GEMM knobs (gemm_f16_glu's SwiGLU epilogue" in r.output, r.output


def test_bench_test_names_round_trip_and_strangers_are_refused():
    from minfer_cli.engine.bench import bench_test_name, parse_bench_test

    for kind, n, depth in [("pp", 512, 0), ("tg", 128, 4096), ("pp", 1, 16384)]:
        assert parse_bench_test(bench_test_name(kind, n, depth)) == (kind, n, depth)
    assert bench_test_name("tg", 128, 4096) == "tg128 @ d4096" and bench_test_name("pp", 512) == "pp512"
    for bad in ["pp", "tg0", "pg128", "tg128 @ 4096", "tg128@d4096", "pp512 @ d"]:
        with pytest.raises(ValueError, match="is not a bench test name"):
            parse_bench_test(bad)


class _Twin(Experiment):
    """A second owner of VEC, to make the knob ambiguous."""

    name = "twin"
    purpose = "test double"
    knobs = (Knob("VEC", (1, 4), 4, "test"),)
    workloads = (Workload("w", {"n": 1}),)

    def input_set_bytes(self, workload): return 4
    def make_input_set(self, workload, rng): return None
    def make_output(self, workload): return None
    def prepare(self, config, workload): return lambda i, o, s: None
    def poison(self, output): return None
    def check(self, config, workload, inputs, output): return 0.0
    def cost(self, workload): return registry_mod.Cost(0, 4)


def test_ambiguous_knob_asks_for_a_name(monkeypatch):
    registry_mod.load_all()
    twin = _Twin()
    monkeypatch.setitem(registry_mod._REGISTRY.experiments, "twin", twin)
    r = invoke("ab", "--arm", "VEC=1", "--arm", "VEC=4")
    assert r.exit_code != 0
    assert "belong to several experiments (copy, twin)" in r.output and "name one" in r.output


def test_experiment_is_picked_from_the_knobs_when_unambiguous():
    assert registry_mod.pick_for_arms(["VEC=1", "VEC=4"]).name == "copy"
    assert registry_mod.pick_for_arms(["TYPE=Q4_K,TPB=64", "TPB=256"]).name == "dequant"


def test_timing_commands_refuse_the_simulator_with_one_sentence():
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") in ("", "0"):
        pytest.skip("simulator-session test")
    for args in (["run", "copy"], ["ab", "copy", "--arm", "VEC=1", "--arm", "VEC=4"], ["calibrate", "copy"]):
        r = invoke(*args)
        assert r.exit_code == 2
        assert "minfer doctor" in r.output and "simulator" in r.output


def test_without_a_gpu_commands_name_doctor():
    """In a fresh process without the simulator, on a machine with no GPU: one sentence naming `minfer doctor`."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    probe = subprocess.run([sys.executable, "-c", "from numba import cuda; print(cuda.is_available())"],
                           env=env, capture_output=True, text=True, timeout=120)
    if probe.stdout.strip() == "True":
        pytest.skip("a GPU is present here")
    r = subprocess.run([sys.executable, "-m", "minfer_cli", "run", "copy"], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert "minfer doctor" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    d = subprocess.run([sys.executable, "-m", "minfer_cli", "doctor"], env=env, capture_output=True, text=True,
                       timeout=120)
    assert d.returncode == 1 and "GPU" in d.stdout and "FAIL" in d.stdout


def test_numpy_pin_is_checked_at_start(monkeypatch):
    import importlib.metadata

    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "2.5.0" if name == "numpy" else real(name))
    r = invoke("experiments", "list")
    assert r.exit_code != 0 and "numpy < 2.5" in r.output


def test_grid_is_the_product_of_its_axes_with_defaults_elsewhere():
    from minfer_cli.knobs import Knob, parse_grid

    knobs = (Knob("TM", (64, 128, 256), 128, "t"), Knob("KS", (32, 64), 32, "k"), Knob("MMA", ("wmma", "mma_sync"), "mma_sync", "m"))
    grid = parse_grid(knobs, ["TM=64,256", "KS=32,64"], "x")
    assert len(grid) == 4
    assert {(c["TM"], c["KS"]) for c in grid} == {(64, 32), (64, 64), (256, 32), (256, 64)}
    assert all(c["MMA"] == "mma_sync" for c in grid)
    assert parse_grid(knobs, [], "x") == [{"TM": 128, "KS": 32, "MMA": "mma_sync"}]


@pytest.mark.parametrize(
    "args, needle",
    [
        (["ab", "copy", "--arm", "VEC=1", "--arm", "VEC=4", "--bar", "-1"], "Invalid value for '--bar'"),
        (["run", "--samples", "0", "copy"], "Invalid value for '--samples'"),
        (["ledger", "show", "abc"], "record id 'abc' is not a whole number of 1 or more; give one like 46"),
        (["ledger", "show", "4x"], "record id '4x' is not a whole number of 1 or more; give one like 46"),
        (["bogus"], "No such command 'bogus'"),
        (["run"], "Missing argument"),
        (["run", "copy", "--arm", "VEC=1", "--arm", "VEC=4"], "this command takes one arm"),
        (["ab", "copy", "--arm", "", "--arm", "VEC=1"], "empty --arm"),
        (["ledger", "show", "--ledger", "/nonexistent/minfer-ledger"], "does not exist"),
    ],
)
def test_console_script_errors_are_one_line(args, needle):
    """Through the real entry point: typer's own usage errors are one `error:` line too, exit status 2."""
    r = subprocess.run([sys.executable, "-m", "minfer_cli", *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, (args, r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], r.stderr
    assert "Traceback" not in r.stderr + r.stdout


def test_ledger_show_one_record_parses_back_as_yaml():
    """`ledger show N --format yaml` prints the record as stored, unwrapped: long values stay on one line."""
    import yaml

    r = invoke("ledger", "show", "1", "--format", "yaml")
    assert r.exit_code == 0, r.output
    record = yaml.safe_load(r.output)
    assert record["id"] == 1 and record["experiment"] == "copy"


def test_group_without_a_command_says_so():
    """`minfer ledger` alone: the group's help, then one error line that names what is missing."""
    r = subprocess.run([sys.executable, "-m", "minfer_cli", "ledger"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "ledger` needs a command (see `" in r.stderr, r.stderr


def _command_paths(command=None, path=()):
    """Every command and group of the app, as argument lists (``[]`` is `minfer` itself)."""
    import typer.main

    command = command if command is not None else typer.main.get_command(app)
    yield list(path)
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        yield from _command_paths(sub, (*path, name))


def test_help_shows_no_value_type_after_a_flag():
    """A flag takes no value, so `--help` shows none after it (typer 0.29 printed `--record <bool>`, `--help <bool>`)."""
    paths = list(_command_paths())
    assert ["ledger", "show"] in paths and ["bench"] in paths and ["ab"] in paths
    for path in paths:
        r = invoke(*path, "--help")
        assert r.exit_code == 0, (path, r.output)
        assert "<bool>" not in r.output, (path, r.output)
    assert "--no-record" in invoke("ab", "--help").output  # the flags keep the names users type
    assert "--record" in invoke("bench", "--help").output
    assert "<int range>" in invoke("ab", "--help").output  # options that take a value still show its type


@pytest.mark.parametrize(
    "args, status",
    [
        (["ledger", "show"], 0),
        (["ledger", "show", "1"], 0),
        (["ledger", "show", "1", "--format", "json"], 0),
        (["ledger", "show", "--format", "csv"], 0),
        (["--help"], 0),
        (["ledger", "show", "--broken"], 1),
    ],
)
def test_closed_stdout_is_met_quietly(tmp_path, args, status):
    """`minfer ... | head -0`: no traceback, no status 1 from the broken pipe; the command runs to its end (here: it
    still names a skipped file on stderr, and exits 1 for it) and exits with its own status."""
    import shutil
    from pathlib import Path

    records = Path(__file__).resolve().parents[1] / "ledger" / "records"
    for name in sorted(os.listdir(records))[:3]:
        shutil.copy(records / name, tmp_path / name)
    if "--broken" in args:
        args = [a for a in args if a != "--broken"]
        (tmp_path / "0009-broken.yaml").write_text("title: [unclosed\n")
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before minfer writes its first byte
    try:
        r = subprocess.run([sys.executable, "-m", "minfer_cli", *args], stdout=write_end, stderr=subprocess.PIPE,
                           text=True, timeout=120, env={**os.environ, "MINFER_LEDGER": str(tmp_path)})
    finally:
        os.close(write_end)
    assert r.returncode == status, r.stderr
    assert "Traceback" not in r.stderr and "BrokenPipe" not in r.stderr and "Exception ignored" not in r.stderr
    if status == 0:
        assert r.stderr == ""
    else:
        assert "skipped 0009-broken.yaml" in r.stderr


def test_arm_table_knob_columns_with_uneven_arms():
    """Arms with different key sets or equal values of different types: compared as they print."""
    from minfer_cli.commands.render import knob_columns

    assert knob_columns([{"A": 1}, {"A": 1, "B": 2}]) == (["(same knobs)", "B=2"], "every arm: A=1")
    assert knob_columns([{"A": 1, "B": 2}, {"A": 1}]) == (["B=2", "(same knobs)"], "every arm: A=1")
    assert knob_columns([{"A": 1}, {"A": "1"}]) == (["(same knobs)", "(same knobs)"], "every arm: A=1")


def test_arm_table_shows_the_knobs_that_differ_and_captions_the_shared_ones():
    """An A/B of one knob shows that knob per arm and every other knob once, in the caption; one arm shows all."""
    from minfer_cli.commands.render import knob_columns

    a = {"TYPE": "Q4_K", "RPB": 2, "WPR": 2, "HOIST": 0}
    b = {"TYPE": "Q4_K", "RPB": 4, "WPR": 4, "HOIST": 0}
    assert knob_columns([a, b]) == (["RPB=2,WPR=2", "RPB=4,WPR=4"], "every arm: TYPE=Q4_K,HOIST=0")
    assert knob_columns([a]) == (["TYPE=Q4_K,RPB=2,WPR=2,HOIST=0"], "")
    assert knob_columns([a, dict(a)]) == (["(same knobs)", "(same knobs)"], "every arm: TYPE=Q4_K,RPB=2,WPR=2,HOIST=0")
    assert knob_columns([a, {**a, "HOIST": 1}, {**a, "RPB": 4}]) == (
        ["RPB=2,HOIST=0", "RPB=2,HOIST=1", "RPB=4,HOIST=0"], "every arm: TYPE=Q4_K,WPR=2")


def test_model_list_shows_every_preset_with_llama_bench_size_and_params(console_width):
    """`minfer model list` needs no GPU: shapes, params and size from the tensor specs (Qwen2-7B Q4_K_M: 7.62 B
    params, 4.36 GiB, as llama-bench reports for the real file)."""
    from minfer_cli.engine.presets import PRESETS

    console_width(200)
    result = runner.invoke(app, ["model", "list"])
    assert result.exit_code == 0, result.output
    assert all(name in result.output for name in PRESETS)
    row = next(line for line in result.output.splitlines() if "qwen2-7b-q4_k_m *" in line)
    assert "7.62 B" in row and "4.36 GiB" in row and "28/4 x 128" in row and "18944" in row and "169/0/29/141" in row
    assert "* the default preset\n" in result.output


def test_model_list_fits_80_columns_by_leaving_columns_out(console_width):
    """At 80 columns no cell wraps or is cut: whole columns are left out, and the table says which."""
    from minfer_cli.engine.presets import PRESETS

    console_width(80)
    narrow = runner.invoke(app, ["model", "list"])
    assert narrow.exit_code == 0 and "…" not in narrow.output, narrow.output
    assert all(len(line) <= 80 for line in narrow.output.splitlines())
    assert all(name in narrow.output for name in PRESETS)
    assert "a wider terminal also shows Q4_K/Q5_K/Q6_K/F32" in narrow.output


def test_the_arms_table_fits_80_columns_for_many_knobs(console_width):
    """`ab`/`run`/`sweep` tables: long knob cells end in …, figure columns a narrow terminal cannot hold are left
    out and named, a column without any figure (TFLOP/s of a copy) is not shown."""
    from types import SimpleNamespace

    from minfer_cli.baselines import Throughput
    from minfer_cli.commands.render import arms_table
    from minfer_cli.experiment import get
    from minfer_cli.measure.harness import ArmOutcome
    from minfer_cli.measure.stats import ArmStats

    gemv = get("gemv")
    session = SimpleNamespace(experiment=gemv, workload=gemv.workload("ffn_down"))
    arms = [ArmOutcome(f"p{i}", {**gemv.default_config(), "RPB": rpb, "WPR": wpr, "MINB": 7, "STAGE": 2},
                       parity_error=1.2e-6, stats=ArmStats(15.27 + i, 15.0, 16.0, 15.3, 40, 0),
                       figures=Throughput(0.0, 2501.3, 61.3, None, None))
            for i, (rpb, wpr) in enumerate([(4, 4), (2, 8), (8, 1)])]
    console_width(80)
    from minfer_cli.console import out

    with out.capture() as captured:
        out.print(arms_table(session, arms))
    text = captured.get()
    assert all(len(line) <= 80 for line in text.splitlines()), text
    assert "TFLOP/s" not in text and "15.27" in text and "p2 " in text
