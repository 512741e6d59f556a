"""Hostile and clumsy input: nothing a bad file, name, value or output stream does may hide, change or lose a
record, hang minfer, or end in a traceback. One test per class of the hostile-input issue; every case is bounded in
time (`bounded`), and each asserts the exact outcome: the one line, the exit status, the records still shown."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from minfer_cli import ledger
from minfer_cli.engine.errors import ModelError
from minfer_cli.errors import LedgerError
from minfer_cli.ledger import store
from minfer_cli.main import app
from tests.ledger_factory import write_ledger

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def bounded():
    """No hostile case may hang: each test fails after 60 s instead."""

    def expire(signum, frame):
        raise TimeoutError("a hostile input made minfer hang")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def _every_view_still_shows(directory: Path, ids: list[int], bad: str) -> None:
    """Every ledger view lists the good records and names the bad file on stderr; `show ID` of a good one works."""
    for fmt in ("table", "csv", "md", "json"):
        r = invoke("ledger", "show", "--ledger", str(directory), "--format", fmt)
        assert r.exit_code == 1, (fmt, r.output)  # a skipped file is a finding
        assert f"skipped {bad}" in r.stderr, (fmt, r.stderr)
        if fmt == "json":
            assert sorted({row["id"] for row in json.loads(r.stdout)}) == ids
    r = invoke("ledger", "show", str(ids[0]), "--ledger", str(directory))
    assert r.exit_code == 1 and r.stdout.startswith(f"#{ids[0]} ") and f"skipped {bad}" in r.stderr


# 1. Any failure while reading one file is isolated.
BAD_FILES = {
    "0004-bigint.yaml": "schema: 2\nid: " + "9" * 5000 + "\n",
    "0004-deep.yaml": "a: " + "[" * 100_000 + "]" * 100_000 + "\n",
    "0004-bomb.yaml": "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
        f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
        for i in range(9)),
    "0004-binary.yaml": "\x00\xff\xfe garbage",
    "0004-python.yaml": "!!python/object/apply:os.system ['touch /tmp/minfer-pwned']\n",
    "0004-nan.yaml": None,  # filled below: a valid record whose delta is .nan
}


@pytest.mark.parametrize("name", list(BAD_FILES))
def test_one_bad_file_hides_nothing(tmp_path, name):
    write_ledger(tmp_path, 3)
    if name == "0004-nan.yaml":
        rec = yaml.safe_load((sorted(tmp_path.glob("0001-*.yaml"))[0]).read_text())
        rec["id"], rec["comparison"]["delta"] = 4, float("nan")
        text = store.dump(rec)
        assert ".nan" in text
    else:
        text = BAD_FILES[name]
    (tmp_path / name).write_bytes(text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text)
    _every_view_still_shows(tmp_path, [1, 2, 3], name)
    assert not Path("/tmp/minfer-pwned").exists()
    reason = dict(ledger.load(tmp_path).problems)[name]
    assert "\n" not in reason and len(reason) < 400


# 2. Nothing in the directory can hang a read.
def test_a_fifo_or_a_directory_is_never_opened(tmp_path):
    write_ledger(tmp_path, 2)
    os.mkfifo(tmp_path / "0003-pipe.yaml")
    (tmp_path / "0004-dir.yaml").mkdir()
    problems = dict(ledger.load(tmp_path).problems)
    assert "not a regular file" in problems["0003-pipe.yaml"] and "not a regular file" in problems["0004-dir.yaml"]
    _every_view_still_shows(tmp_path, [1, 2], "0003-pipe.yaml")


def test_an_oversized_record_is_skipped_unread(tmp_path):
    write_ledger(tmp_path, 1)
    (tmp_path / "0002-huge.yaml").write_bytes(b"a: " + b"x" * (store.RECORD_MAX_BYTES + 1))
    assert "over the record size limit" in dict(ledger.load(tmp_path).problems)["0002-huge.yaml"]


# 3. Ids stay sane.
def test_a_junk_id_cannot_move_the_next_id(tmp_path):
    write_ledger(tmp_path, 2)
    (tmp_path / "99999999999999999999-junk.yaml").write_text("a: 1\n")
    (tmp_path / "1000000000-too-big.yaml").write_text("a: 1\n")
    assert ledger.append(tmp_path, yaml.safe_load(next(tmp_path.glob("0001-*")).read_text())).id == 3
    for fmt in ("csv", "md", "json"):
        assert invoke("ledger", "show", "--ledger", str(tmp_path), "-f", fmt).exit_code == 1
    assert invoke("ledger", "show", "10000000000", "--ledger", str(tmp_path)).exit_code == 2


# 4. minfer never overwrites what it did not create.
def test_outputs_refuse_existing_files_and_the_ledger(tmp_path):
    write_ledger(tmp_path / "records", 2)
    record = next((tmp_path / "records").glob("0001-*"))
    before = record.read_bytes()
    for args in (["model", "synth", "tiny", "-o", str(record)],
                 ["model", "synth", "tiny", "-o", str(tmp_path / "records" / "new.gguf")],
                 ["ledger", "show", "1", "--ledger", str(tmp_path / "records"), "--plot", str(record)]):
        r = invoke(*args, *(["--ledger", str(tmp_path / "records")] if args[0] == "model" else []))
        assert r.exit_code == 2, (args, r.output)
    env_ledger = dict(os.environ, MINFER_LEDGER=str(tmp_path / "records"))
    existing = tmp_path / "m.gguf"
    existing.write_bytes(b"keep me")
    r = subprocess.run([sys.executable, "-m", "minfer_cli", "model", "synth", "tiny", "-o", str(existing)],
                       env=env_ledger, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "exists; add --force" in r.stderr and existing.read_bytes() == b"keep me"
    r = subprocess.run([sys.executable, "-m", "minfer_cli", "model", "synth", "tiny", "-o", str(record)],
                       env=env_ledger, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "inside the ledger directory" in r.stderr
    assert record.read_bytes() == before


# 5. GGUF metadata is validated by value, before any GPU work, naming the key.
def _gguf(path: Path, **overrides) -> Path:
    from gguf import GGUFWriter
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    w = GGUFWriter(path, "qwen2")
    fields = {"block_count": 1, "embedding_length": 256, "feed_forward_length": 512, "attention.head_count": 4,
              "attention.head_count_kv": 2, "context_length": 256, "attention.layer_norm_rms_epsilon": 1e-6,
              "rope.freq_base": 1e6}
    fields.update(overrides)
    for key, value in fields.items():
        full = f"qwen2.{key}"
        if isinstance(value, str):
            w.add_string(full, value)
        elif isinstance(value, float):
            w.add_float32(full, value)
        else:
            w.add_uint64(full, value)
    bs, ts = GGML_QUANT_SIZES[GGMLQuantizationType.Q4_K]
    w.add_tensor("token_embd.weight", np.zeros((512, 256 // bs * ts), np.uint8), raw_dtype=GGMLQuantizationType.Q4_K)
    w.add_tensor("blk.0.attn_norm.weight", np.ones(256, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("override, message", [
    ({"block_count": "two"}, "qwen2.block_count must be an integer, got str"),
    ({"block_count": 10**9}, "qwen2.block_count = 1000000000 is outside 1..1024"),
    ({"block_count": 3}, "qwen2.block_count = 3, but the file holds blk.N tensors for 1 layer(s)"),
    ({"rope.freq_base": float("nan")}, "qwen2.rope.freq_base = nan must be finite"),
    ({"attention.layer_norm_rms_epsilon": -1e-6}, "qwen2.attention.layer_norm_rms_epsilon = -1e-06 must be finite and in (0, 0.01]"),
    ({"context_length": 2**40}, "qwen2.context_length = 1099511627776 is outside 1..16777216"),
    ({"attention.key_length": 112}, "head_dim 112: the attention kernels run head_dim 64, 80, 96, 128, 256 only"),
])
def test_gguf_metadata_is_checked_by_value(tmp_path, override, message):
    from minfer_cli.engine.weights import inspect_gguf

    path = _gguf(tmp_path / "m.gguf", **override)
    with pytest.raises(ModelError) as e:
        inspect_gguf(path)
    assert message in str(e.value) and "\n" not in str(e.value)
    # The bench refuses it in one line, exit status 2, before it looks for a GPU.
    r = invoke("bench", "-m", str(path), "-p", "16", "-n", "0")
    assert r.exit_code == 2 and message in r.output and "GPU" not in r.output


def test_a_truncated_model_is_named_before_the_gpu(tmp_path):
    path = _gguf(tmp_path / "m.gguf", block_count=1)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])
    r = invoke("bench", "-m", str(path), "-p", "16", "-n", "0")
    assert r.exit_code == 2 and ("truncated" in r.output or "lacks the tensor" in r.output) and "doctor" not in r.output


def test_a_prompt_beyond_the_context_is_refused_before_loading(tmp_path):
    r = invoke("bench", "-p", "10000000", "-n", "0")
    assert r.exit_code == 2 and "-p 10000000 is beyond the model's context length" in r.output


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(block_count=st.one_of(st.integers(-5, 2**40), st.text(max_size=5)),
       eps=st.floats(allow_nan=True, allow_infinity=True, width=32))
def test_gguf_metadata_property(tmp_path, block_count, eps):
    """Whatever the values, reading is a config or one ModelError line, never another exception."""
    from minfer_cli.engine.weights import inspect_gguf

    kwargs = {"attention.layer_norm_rms_epsilon": eps}
    if not (isinstance(block_count, int) and block_count < 0):  # gguf cannot write a negative uint64
        kwargs["block_count"] = block_count
    try:
        path = _gguf(tmp_path / "p.gguf", **kwargs)
    except (ValueError, OverflowError, TypeError):
        return  # gguf itself refused to write the value
    try:
        inspect_gguf(path)
    except ModelError as exc:
        assert "\n" not in str(exc)


# 6. A dropped-in file cannot change what the ledger says.
def test_duplicates_are_shown_and_flagged_symlinks_out_refused(tmp_path):
    write_ledger(tmp_path / "records", 3)
    records = tmp_path / "records"
    original = next(records.glob("0002-*"))
    (records / "0002-copy.yaml").write_bytes(original.read_bytes())
    outside = tmp_path / "outside.yaml"
    outside.write_text(store.dump(dict(yaml.safe_load(original.read_text()), id=4, title="planted")))
    (records / "0004-link.yaml").symlink_to(outside)
    inside = records / "0005-inside.yaml"
    inside.symlink_to(records / next(p.name for p in records.glob("0003-*")))
    contents = ledger.load(records)
    assert [r["id"] for r in contents.records] == [1, 2, 2, 3]
    assert contents.duplicates == {2: sorted([original.name, "0002-copy.yaml"])}
    problems = dict(contents.problems)
    assert "outside the ledger directory" in problems["0004-link.yaml"]
    assert "file name says id 5" in problems["0005-inside.yaml"]  # followed (inside), then held to its name
    r = invoke("ledger", "show", "--ledger", str(records), "-f", "json")
    assert r.exit_code == 1 and [row["id"] for row in json.loads(r.stdout)].count(2) == 4  # a bench: 2 rows each
    assert "duplicate id 2" in r.stderr
    r = invoke("ledger", "show", "2", "--ledger", str(records))
    assert r.stdout.count("#2 ") == 2 and r.exit_code == 1


def test_non_finite_statistics_are_refused_on_append(tmp_path):
    rec = yaml.safe_load(store.dump(write_ledger(tmp_path / "a", 1)[0]))
    rec["bar"] = math.inf
    with pytest.raises(LedgerError, match="bar must be finite"):
        ledger.append(tmp_path / "b", rec)


@settings(max_examples=60, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children,
                                                                                        max_size=4), max_leaves=20))
def test_validate_never_raises(value):
    problems = ledger.validate(value)
    assert isinstance(problems, list) and all(isinstance(p, str) for p in problems)


# 7. Output that cannot take Unicode, a full disk, a deleted working directory.
@pytest.mark.parametrize("args", [["ledger", "show", "--last", "3"], ["ledger", "show", "86"], ["experiments", "list"],
                                  ["--help"], ["ledger", "show", "--help"]])
def test_ascii_only_output_works(args):
    env = dict(os.environ, PYTHONIOENCODING="ascii", COLUMNS="80")
    r = subprocess.run([sys.executable, "-m", "minfer_cli", *args], env=env, capture_output=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr.decode("ascii", "replace")
    assert r.stdout.decode("ascii") and b"Traceback" not in r.stderr
    if "--last" in args:  # a fitted table: its widths as written, in ASCII
        assert all(len(line) <= 80 for line in r.stdout.decode("ascii").splitlines())


def test_a_full_disk_is_one_line():
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-m", "minfer_cli", "ledger", "show"], stdout=full, stderr=subprocess.PIPE,
                           text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 1 and r.stderr.strip().count("\n") == 0 and "No space left on device" in r.stderr


def test_a_deleted_working_directory_is_one_line(tmp_path):
    gone = tmp_path / "gone"
    gone.mkdir()
    script = f"import os, sys; os.chdir({str(gone)!r}); os.rmdir({str(gone)!r}); sys.path.insert(0, {str(ROOT)!r}); " \
             "sys.argv = ['minfer', 'ledger', 'show']; from minfer_cli.main import cli; cli()"
    env = {k: v for k, v in os.environ.items() if k != "MINFER_LEDGER"}
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 2 and "working directory no longer exists" in r.stderr and "Traceback" not in r.stderr


# 8. The writability check covers paths that do not exist yet.
@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere: a read-only parent cannot be made here")
def test_a_new_ledger_under_a_read_only_parent_is_refused_before_measuring(tmp_path):
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o500)
    try:
        with pytest.raises(LedgerError, match="not writable"):
            ledger.check_writable(parent / "new")
    finally:
        parent.chmod(0o700)


# Refusals that teach: a key or tensor that changes the math and is not implemented is refused by name.
def _gguf_with(path: Path, extra_fields: dict, extra_tensors: tuple = ()) -> Path:
    from gguf import GGUFReader, GGUFWriter

    base = GGUFReader(_gguf(path.with_suffix(".base.gguf")))
    w = GGUFWriter(path, "qwen2")
    for field in base.fields.values():
        if field.name.startswith("qwen2."):
            value = field.contents()
            (w.add_float32 if isinstance(value, float) else w.add_uint64)(field.name, value)
    for key, value in extra_fields.items():
        if isinstance(value, str):
            w.add_string(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        else:
            w.add_uint32(key, value)
    for t in base.tensors:
        w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    for extra in extra_tensors:  # a name (64 f32 ones) or (name, array)
        name, data = (extra, np.ones(64, np.float32)) if isinstance(extra, str) else extra
        w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("fields, tensors, message", [
    ({}, ("rope_freqs.weight",), "tensor rope_freqs.weight has GGUF shape (64,), but the metadata implies (32,)"),
    ({}, (("rope_freqs.weight", np.r_[np.ones(31), 0.0].astype(np.float32)),), "must hold finite positive factors"),
    ({}, (("rope_freqs.weight", np.ones(32, np.float16)),), "rope_freqs.weight has type F16; RoPE frequency factors must be F32"),
    ({"qwen2.rope.scaling.type": "yarn"}, (), "metadata key qwen2.rope.scaling.type = 'yarn' changes the math"),
    ({"qwen2.attention.sliding_window": 4096}, (), "metadata key qwen2.attention.sliding_window = 4096 changes the math"),
    ({"qwen2.final_logit_softcapping": 30.0}, (), "metadata key qwen2.final_logit_softcapping is not supported"),
    ({"qwen2.expert_count": 8}, (), "metadata key qwen2.expert_count = 8 changes the math"),
    ({"qwen2.rope.dimension_count": 32}, (), "qwen2.rope.dimension_count = 32 differs from the head dim 64"),
    ({}, ("blk.0.ffn_gate_inp.weight",), "tensor blk.0.ffn_gate_inp.weight is not part of a qwen2 model"),
])
def test_math_changing_keys_and_tensors_are_refused_by_name(tmp_path, fields, tensors, message):
    from minfer_cli.engine.weights import inspect_gguf

    path = _gguf_with(tmp_path / "m.gguf", fields, tensors)
    with pytest.raises(ModelError) as e:
        inspect_gguf(path)
    assert message in str(e.value) and "\n" not in str(e.value)
    r = invoke("bench", "-m", str(path), "-p", "16", "-n", "0")
    assert r.exit_code == 2 and message in r.output


def test_neutral_values_of_such_keys_pass_the_check(tmp_path):
    from minfer_cli.engine.weights import inspect_gguf

    path = _gguf_with(tmp_path / "m.gguf", {"qwen2.rope.scaling.type": "none", "qwen2.expert_count": 0,
                                            "qwen2.rope.dimension_count": 64})
    with pytest.raises(ModelError) as e:  # the only complaint left is the layer's missing tensors
        inspect_gguf(path)
    assert "lacks the tensor blk.0.attn_q.weight" in str(e.value)


# Found by a fresh probe: markup, control characters, extreme-but-finite figures, odd optional parts, the cache.
def test_text_from_users_and_records_is_never_markup_or_terminal_control(tmp_path):
    write_ledger(tmp_path, 2)
    r = invoke("ledger", "retire", "1", "--why", "variant [/deleted] in \x1b[2Ja1b2\u202e", "--ledger", str(tmp_path))
    assert r.exit_code == 0, r.output
    for args in (["ledger", "show", "3"], ["ledger", "show"], ["ledger", "diff", "1", "3"]):
        r = invoke(*args, "--ledger", str(tmp_path))
        assert r.exit_code == 0 and "\x1b" not in r.stdout and "\u202e" not in r.stdout, (args, r.output)
    assert "[/deleted]" in invoke("ledger", "show", "3", "--ledger", str(tmp_path)).stdout
    r = invoke("ledger", "show", "[/x]", "--ledger", str(tmp_path))
    assert r.exit_code == 2 and "'[/x]'" in r.output


@pytest.mark.parametrize("change, where", [
    ({"comparison": {"delta": -1.0, "ci_low": -1.0, "ci_high": -0.9, "p_value": 0.1, "rounds": 3}}, "above -1"),
    ({"bar": 1e300}, "at most"),
    ({"timestamp": "2026-13-45T99:99:99Z"}, "ISO-8601"),
    ({"peer": {"engine": "llama.cpp", "figures": {"pp512": float("nan")}}}, "peer.figures.pp512 is not a finite"),
    ({"check": {"logits_rel_l2": float("inf")}}, "check.logits_rel_l2 is not a finite"),
    ({"notes_extra": [1.0, float("-inf")]}, "notes_extra[1] is not a finite"),
])
def test_extreme_but_finite_figures_are_refused_by_the_schema(tmp_path, change, where):
    rec = write_ledger(tmp_path, 1)[0]
    assert not ledger.validate(rec)
    assert any(where in p for p in ledger.validate({**rec, **change})), ledger.validate({**rec, **change})


def test_odd_optional_parts_cost_one_cell_not_the_ledger(tmp_path):
    write_ledger(tmp_path, 2)
    odd = {"schema": 2, "id": 3, "title": "t", "timestamp": "2026-12-03T00:00:00Z", "kind": "retire",
           "verdict": "RETIRED", "retire": {"ids": [1], "why": "w"}, "git": {"commit": None, "dirty": None},
           "command": "c", "notes": "", "workload": "str"}
    assert any("workload" in p for p in ledger.validate(odd))  # a view's key, wrongly typed, is refused
    odd.pop("workload")
    odd["best"] = "not a mapping"
    (tmp_path / "0003-odd.yaml").write_text(store.dump(odd))
    for args in (["ledger", "show"], ["ledger", "show", "3"], ["ledger", "show", "-f", "csv"]):
        assert invoke(*args, "--ledger", str(tmp_path)).exit_code == 0, args


def test_a_fifo_in_the_cache_never_hangs(tmp_path, monkeypatch):
    write_ledger(tmp_path / "records", 2)
    cache = tmp_path / "cache"
    cache.mkdir()
    os.mkfifo(cache / "ledger-index.key")
    monkeypatch.setenv("MINFER_CACHE_DIR", str(cache))
    assert [r["id"] for r in ledger.load(tmp_path / "records").records] == [1, 2]
    (cache / "ledger-index.key").unlink()
    from minfer_cli.ledger import index

    os.mkfifo(index.index_path(tmp_path / "records"))
    assert [r["id"] for r in ledger.load(tmp_path / "records").records] == [1, 2]


def test_the_cache_never_writes_into_the_ledger(tmp_path, monkeypatch):
    write_ledger(tmp_path, 2)
    monkeypatch.setenv("MINFER_CACHE_DIR", str(tmp_path))
    before = sorted(p.name for p in tmp_path.iterdir())
    ledger.load(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_closed_stdout_is_quiet_and_keeps_the_exit_status(tmp_path):
    write_ledger(tmp_path, 2)
    r = subprocess.run([sys.executable, "-m", "minfer_cli", "ledger", "retire", "1", "--why", "x", "--ledger",
                        str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=60,
                       close_fds=True, preexec_fn=lambda: os.close(1))
    assert r.returncode == 0 and "Traceback" not in r.stderr
    assert len(list(tmp_path.glob("0003-*.yaml"))) == 1


def test_text_that_is_not_utf8_is_kept_visibly(tmp_path):
    write_ledger(tmp_path, 1)
    r = invoke("ledger", "retire", "1", "--why", "bad\udcffbyte", "--ledger", str(tmp_path))
    assert r.exit_code == 0, r.output
    assert ledger.load(tmp_path).records[-1]["retire"]["why"] == "bad\\udcffbyte"


def test_junk_and_stale_reservations_cannot_use_up_ids(tmp_path):
    write_ledger(tmp_path, 2)
    (tmp_path / "999999999-junk.yaml").write_text("not: a record\n")
    stale = tmp_path / ".999999998.reserve"
    stale.write_text("")
    os.utime(stale, (0, 0))
    rec = yaml.safe_load(next(tmp_path.glob("0001-*")).read_text())
    assert ledger.append(tmp_path, rec).id == 3


def test_plot_text_is_never_mathtext_and_a_drawing_failure_is_one_line(tmp_path):
    rec = write_ledger(tmp_path / "records", 1)[0]
    rec = {**rec, "id": 2, "title": r"$\frac{$ broken and $5 vs $10"}
    rec["arms"][0]["knobs"] = {"TM": r"$\x$"}
    (tmp_path / "records" / "0002-math.yaml").write_text(store.dump(rec))
    r = invoke("ledger", "show", "2", "--ledger", str(tmp_path / "records"), "--plot", str(tmp_path / "m.png"))
    assert r.exit_code == 0, r.output
    assert (tmp_path / "m.png").stat().st_size > 1000


# Found by a third probe: markup in a unit or arm label in diff and trend, GGUF values that crashed, error lines
# of megabytes, control characters in exports, non-ASCII digits.
def test_markup_in_a_unit_or_an_arm_label_never_crashes_diff_or_trend(tmp_path):
    rec = write_ledger(tmp_path, 1)[0]
    bench = next(r for r in write_ledger(tmp_path / "b", 40) if r["kind"] == "bench")
    for directory, record in ((tmp_path / "u", bench), (tmp_path / "l", rec)):
        directory.mkdir()
        odd = json.loads(json.dumps(record))
        odd["id"] = 1
        odd["metric"]["unit"] = "tok/s[/]"
        odd["arms"][0]["label"] = odd["arms"][0]["label"] + "[/]"
        (directory / "0001-odd.yaml").write_text(store.dump(odd))
        r = invoke("ledger", "diff", "1", "1", "--ledger", str(directory))
        assert r.exit_code == 0 and "[/]" in r.stdout, r.output
    test = bench["arms"][1]["label"]
    r = invoke("ledger", "trend", test, "--ledger", str(tmp_path / "u"))
    assert r.exit_code == 0 and "tok/s[/]" in r.stdout, r.output


@pytest.mark.parametrize("value", ["q4", [1, 2], float("nan")])
def test_a_file_type_that_is_not_an_integer_is_refused_by_name(tmp_path, value):
    from gguf import GGUFReader, GGUFWriter

    from minfer_cli.engine.weights import inspect_gguf

    base = GGUFReader(_gguf(tmp_path / "base.gguf"))
    path = tmp_path / "m.gguf"
    w = GGUFWriter(path, "qwen2")
    for field in base.fields.values():
        if field.name.startswith("qwen2."):
            v = field.contents()
            (w.add_float32 if isinstance(v, float) else w.add_uint64)(field.name, v)
    if isinstance(value, str):
        w.add_string("general.file_type", value)
    elif isinstance(value, list):
        w.add_array("general.file_type", value)
    else:
        w.add_float32("general.file_type", value)
    for t in base.tensors:
        w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.add_tensor("blk.².attn_norm.weight", np.ones(256, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelError) as e:
        inspect_gguf(path)
    assert "\n" not in str(e.value)


def test_an_error_line_quoting_megabytes_is_cut():
    from minfer_cli.console import ERROR_LINE_MAX

    r = subprocess.run([sys.executable, "-m", "minfer_cli", "ledger", "show", "x" * 100_000], capture_output=True,
                       timeout=60, cwd=ROOT)
    line = r.stderr.decode().strip()
    assert r.returncode == 2 and "\n" not in line and len(line) < ERROR_LINE_MAX + 100 and "more characters" in line


def test_exports_never_carry_terminal_control(tmp_path):
    write_ledger(tmp_path, 2)
    assert invoke("ledger", "retire", "1", "--why", "\x1b[2J\x07 and \x9b31m", "--ledger", str(tmp_path)).exit_code == 0
    for args in (["-f", "csv"], ["-f", "md"], ["-f", "json"], ["3", "-f", "json"], ["3", "-f", "md"]):
        out = invoke("ledger", "show", *args, "--ledger", str(tmp_path)).stdout
        assert not any(ch in out for ch in "\x1b\x07\x9b"), args
    json.loads(invoke("ledger", "show", "3", "-f", "json", "--ledger", str(tmp_path)).stdout)  # still JSON


@pytest.mark.parametrize("args, message", [
    (["bench", "-p", "٣"], "-p takes comma-separated token counts"),
    (["run", "copy", "--arm", "VEC=１"], "is not an integer"),
    (["ledger", "show", "--since", "2026-11-30T25:00"], "neither a record id nor a date"),
    (["bench", "-m", ""], "-m needs a GGUF file"),
    (["bench", "--preset", ""], "--preset needs a name"),
])
def test_non_ascii_digits_impossible_times_and_empty_names_are_refused(args, message):
    r = invoke(*args)
    assert r.exit_code == 2 and message in r.output, r.output


def test_a_file_named_with_non_ascii_digits_is_not_a_record(tmp_path):
    rec = write_ledger(tmp_path, 1)[0]
    (tmp_path / "٠٠٢١-x.yaml").write_text(store.dump(dict(rec, id=21)))
    contents = ledger.load(tmp_path)
    assert [r["id"] for r in contents.records] == [1] and contents.problems[0].file == "٠٠٢١-x.yaml"


def test_a_header_counting_one_tensor_too_few_is_refused_not_loaded_misaligned(tmp_path):
    """A tensor count one too low moves the data section (every tensor's bytes read 32 bytes early) and drops the
    last tensor (output.weight: the model would read as tied): the tensors no longer fill the file."""
    import struct

    from minfer_cli.engine.gguf_io import write_gguf
    from minfer_cli.engine.presets import preset
    from minfer_cli.engine.weights import inspect_gguf, synth_weights

    path = write_gguf(synth_weights(preset("tiny"), 1), tmp_path / "m.gguf")
    assert inspect_gguf(path)[0].config.tied_output is False
    data = bytearray(path.read_bytes())
    count = struct.unpack("<Q", data[8:16])[0]
    data[8:16] = struct.pack("<Q", count - 1)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(ModelError, match="header's tensor count or offsets do not describe this file"):
        inspect_gguf(bad)


@pytest.mark.parametrize("change, where", [
    ({"bar": -5.0}, "bar must be a fraction"), ({"bar": 3.0}, "bar must be a fraction"),
    ({"kind": []}, "kind must be a str"),
])
def test_the_schema_refuses_nonsense_a_view_would_show(tmp_path, change, where):
    rec = write_ledger(tmp_path, 1)[0]
    assert any(where in p for p in ledger.validate({**rec, **change})), ledger.validate({**rec, **change})


def test_a_picture_that_cannot_be_drawn_is_refused_before_the_record_prints(tmp_path):
    write_ledger(tmp_path, 2)
    retire = invoke("ledger", "retire", "1", "--why", "x", "--ledger", str(tmp_path))
    assert retire.exit_code == 0
    r = invoke("ledger", "show", "3", "--plot", str(tmp_path.parent / "p.png"), "--ledger", str(tmp_path))
    assert r.exit_code == 2 and r.stdout == "" and "pictures exist for" in r.output
