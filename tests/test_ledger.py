"""The YAML ledger (`minfer_cli.ledger`) and `minfer ledger show`: plain logic, no GPU."""

from __future__ import annotations

import copy
import io
import json
import multiprocessing

import pandas as pd
import pytest
from pathlib import Path
import typer
import yaml
from typer.testing import CliRunner

from minfer_cli import ledger
from minfer_cli.commands import ledger as ledger_command
from minfer_cli.errors import LedgerError


def make_record(title: str = "VEC=4 vs VEC=2", experiment: str = "copy", verdict: str = "LANDED", **extra) -> dict:
    record = {
        "schema": 1,
        "title": title,
        "timestamp": "2026-11-29T23:10:00Z",
        "kind": "ab",
        "experiment": experiment,
        "workload": {"name": "1GiB", "shape": {"nbytes": 1 << 30}},
        "metric": {"name": "time", "unit": "µs", "higher_is_better": False},
        "arms": [
            {"label": "A", "knobs": {"VEC": 2}, "status": "ok", "stats": {"median": 812.5, "p10": 800.0, "p90": 830.0, "n": 40}},
            {"label": "B", "knobs": {"VEC": 4}, "status": "ok", "error": None, "parity_error": 0.0,
             "stats": {"median": 790.25, "p10": 780.0, "p90": 801.0, "n": 40}, "gbps": 2718.3},
        ],
        "comparison": {"delta": -0.0274, "ci_low": -0.031, "ci_high": -0.022, "p_value": 0.0001, "rounds": 20},
        "bar": 0.02,
        "verdict": verdict,
        "environment": {"device": "NVIDIA H200"},
        "software": {"numba-cuda": "0.30.0"},
        "git": {"commit": "6b580ad0123456789abcdef0123456789abcdef0", "dirty": False},
        "command": "minfer ab copy --arm VEC=2 --arm VEC=4",
        "notes": "",
    }
    record.update(extra)
    return record


def single_arm_record() -> dict:
    record = make_record(title="copy run", verdict="MEASURED", kind="run", comparison=None)
    record["arms"] = [{"label": "cupy", "knobs": {}, "status": "ok", "stats": None}]
    record["git"] = {"commit": None, "dirty": None}
    return record


def bench_record() -> dict:
    """A `minfer bench -p 512 -n 128 --record` record: one arm per test, the same engine knobs in each, no bar."""
    record = make_record(title="bench qwen2 7B Q4_K - Medium: pp512, tg128", experiment="bench", verdict="MEASURED",
                         kind="bench", comparison=None, bar=0.0,
                         workload={"name": "qwen2 7B Q4_K - Medium", "shape": {"params": 7615616512}},
                         metric={"name": "throughput", "unit": "tok/s", "higher_is_better": True})
    knobs = {"W16": 1, "GRAPHS": 1}
    record["arms"] = [{"label": "pp512", "knobs": knobs, "status": "ok", "error": None, "stats": {"median": 14192.5}},
                      {"label": "tg128", "knobs": knobs, "status": "ok", "error": None, "stats": {"median": 331.8}}]
    return record


def _append_many(directory: str, worker: int, count: int, start) -> None:
    start.wait()
    for i in range(count):
        ledger.append(directory, make_record(title=f"worker {worker} record {i}"))


# ------------------------------------------------------------------------------------------------ append


def test_concurrent_appends_get_distinct_ids(tmp_path):
    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    start = context.Event()
    workers = [context.Process(target=_append_many, args=(str(tmp_path), w, 10, start)) for w in range(8)]
    for process in workers:
        process.start()
    start.set()
    for process in workers:
        process.join(timeout=60)
        assert process.exitcode == 0
    contents = ledger.load(tmp_path)
    assert contents.problems == []
    assert [r["id"] for r in contents.records] == list(range(1, 81))
    titles = {r["title"] for r in contents.records}
    assert titles == {f"worker {w} record {i}" for w in range(8) for i in range(10)}
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no reservations, no temporaries


def test_append_names_file_and_does_not_change_the_callers_record(tmp_path):
    record = make_record(title="Ünïcode: VEC=4 vs VEC=2 (copy, 1 GiB) " + "x" * 80)
    before = copy.deepcopy(record)
    result = ledger.append(tmp_path, record)
    assert record == before
    assert result.id == 1
    assert result.path.name.startswith("0001-unicode-vec-4-vs-vec-2-copy-1-gib-")
    assert len(result.path.name) <= len("0001-") + 48 + len(".yaml")
    stored = yaml.safe_load(result.path.read_text(encoding="utf-8"))
    assert list(stored)[:2] == ["schema", "id"] and stored["id"] == 1
    assert stored["metric"]["unit"] == "µs"
    assert ledger.get(tmp_path, 1) == stored


def test_append_converts_numpy_scalars(tmp_path):
    np = pytest.importorskip("numpy")
    record = make_record(bar=np.float64(0.02))
    record["arms"][0]["stats"]["n"] = np.int64(40)
    record["git"]["dirty"] = np.bool_(True)
    result = ledger.append(tmp_path, record)
    stored = ledger.get(tmp_path, result.id)
    assert stored["bar"] == 0.02 and type(stored["arms"][0]["stats"]["n"]) is int and stored["git"]["dirty"] is True


def test_append_never_overwrites(tmp_path):
    existing = tmp_path / "0003-x.yaml"
    existing.write_text("hand: written\n")
    # Ids follow the valid records (a junk file cannot push them up), and an id a file name holds is skipped.
    assert [ledger.append(tmp_path, make_record()).id for _ in range(3)] == [1, 2, 4]
    assert existing.read_text() == "hand: written\n"


def test_append_refuses_invalid_record(tmp_path):
    record = make_record(verdict="GREAT")
    del record["metric"]
    with pytest.raises(LedgerError, match="missing metric.*verdict 'GREAT'"):
        ledger.append(tmp_path, record)
    assert list(tmp_path.iterdir()) == []


def test_append_to_unwritable_path_names_it(tmp_path):
    blocker = tmp_path / "file.txt"
    blocker.write_text("not a directory")
    target = blocker / "records"
    with pytest.raises(LedgerError) as info:
        ledger.append(target, make_record())
    message = str(info.value)
    assert str(target) in message and "directory" in message.lower()


# ------------------------------------------------------------------------------------------------ load


def test_unsafe_tag_is_refused_not_executed(tmp_path):
    ledger.append(tmp_path, make_record())
    marker = tmp_path / "executed"
    (tmp_path / "0002-evil.yaml").write_text(f"!!python/object/apply:os.system ['touch {marker}']\n")
    contents = ledger.load(tmp_path)
    assert not marker.exists()
    assert [r["id"] for r in contents.records] == [1]
    assert len(contents.problems) == 1
    assert contents.problems[0].file == "0002-evil.yaml" and "refused" in contents.problems[0].reason


def test_broken_files_are_reported_by_name_while_the_rest_load(tmp_path):
    for i in range(3):
        ledger.append(tmp_path, make_record(title=f"good {i}"))
    text = yaml.safe_dump(dict(make_record(), id=4), sort_keys=False, allow_unicode=True)
    (tmp_path / "0004-truncated.yaml").write_text(text[: len(text) // 2])
    incomplete = dict(make_record(), id=5)
    del incomplete["arms"], incomplete["verdict"]
    (tmp_path / "0005-incomplete.yaml").write_text(yaml.safe_dump(incomplete))
    (tmp_path / "0006-mismatch.yaml").write_text(yaml.safe_dump(dict(make_record(), id=7)))
    (tmp_path / "0008-a.yaml").write_text(yaml.safe_dump(dict(make_record(), id=8)))
    (tmp_path / "0008-b.yaml").write_text(yaml.safe_dump(dict(make_record(), id=8)))
    (tmp_path / "notes.yaml").write_text("a: 1\n")

    contents = ledger.load(tmp_path)
    # Two files with one id are both shown and flagged, never both hidden (docs/ledger.md).
    assert [r["id"] for r in contents.records] == [1, 2, 3, 8, 8]
    assert contents.duplicates == {8: ["0008-a.yaml", "0008-b.yaml"]}
    assert contents.files[-2:] == ["0008-a.yaml", "0008-b.yaml"]
    problems = dict(contents.problems)
    assert set(problems) == {"0004-truncated.yaml", "0005-incomplete.yaml", "0006-mismatch.yaml", "notes.yaml"}
    assert problems["0004-truncated.yaml"]  # YAML error or missing keys, depending on where the cut falls
    assert "missing verdict, arms" in problems["0005-incomplete.yaml"]
    assert "id 6" in problems["0006-mismatch.yaml"] and "id 7" in problems["0006-mismatch.yaml"]
    with pytest.raises(LedgerError, match="0005-incomplete.yaml"):
        ledger.get(tmp_path, 5)
    # A broken file's id is still taken.
    assert ledger.append(tmp_path, make_record()).id == 9


def test_validate_reports_types_and_allowed_values():
    assert ledger.validate(dict(make_record(), id=1)) == []
    assert ledger.validate(dict(single_arm_record(), id=1)) == []
    record = dict(make_record(), id=1, kind="fast", timestamp="yesterday", bar="2%")
    record["arms"][1]["status"] = "maybe"
    record["git"]["dirty"] = "no"
    problems = " | ".join(ledger.validate(record))
    for expected in ("kind 'fast'", "timestamp 'yesterday'", "bar must be a number", "arms[1].status 'maybe'",
                     "git.dirty must be a bool or null"):
        assert expected in problems
    assert ledger.validate(["not", "a", "mapping"]) == ["a record must be a mapping, got list"]


def test_missing_directory_is_an_empty_ledger(tmp_path):
    contents = ledger.load(tmp_path / "nowhere")
    assert contents.records == [] and contents.problems == []
    with pytest.raises(LedgerError, match="no records yet"):
        ledger.get(tmp_path / "nowhere", 1)


def test_get_names_the_id_range(tmp_path):
    for _ in range(3):
        ledger.append(tmp_path, make_record())
    with pytest.raises(LedgerError, match=r"1\.\.3"):
        ledger.get(tmp_path, 99)


def test_query_filters():
    records = [dict(make_record(experiment=e, verdict=v), id=i) for i, (e, v) in
               enumerate([("copy", "LANDED"), ("gemm", "NEUTRAL"), ("copy", "NEUTRAL"), ("copy", "LANDED")], 1)]
    assert [r["id"] for r in ledger.query(records, experiment="copy")] == [1, 3, 4]
    assert [r["id"] for r in ledger.query(records, experiment="copy", verdict="LANDED", last=1)] == [4]
    assert [r["id"] for r in ledger.query(records, last=2)] == [3, 4]
    with pytest.raises(LedgerError, match="valid verdicts"):
        ledger.query(records, verdict="GOOD")


def test_ledger_dir_resolution(tmp_path, monkeypatch):
    project = tmp_path / "proj"
    (project / "sub" / "deeper").mkdir(parents=True)
    (project / "pyproject.toml").write_text('[project]\nname = "minfer"\n')
    monkeypatch.delenv("MINFER_LEDGER", raising=False)
    monkeypatch.chdir(project / "sub" / "deeper")
    assert ledger.ledger_dir(None) == project / "ledger" / "records"
    monkeypatch.setenv("MINFER_LEDGER", str(tmp_path / "from-env"))
    assert ledger.ledger_dir(None) == tmp_path / "from-env"
    assert ledger.ledger_dir(tmp_path / "explicit") == tmp_path / "explicit"
    monkeypatch.delenv("MINFER_LEDGER")
    (project / "pyproject.toml").write_text('[project]\nname = "other"\n')
    # outside any minfer project: the project minfer was installed from (editable), else the working directory
    installed = Path(ledger.__file__).resolve().parents[2]
    expected = installed if (installed / "pyproject.toml").exists() else project / "sub" / "deeper"
    assert ledger.ledger_dir(None) == expected / "ledger" / "records"


# ------------------------------------------------------------------------------------------------ exports


def test_frame_columns_and_values():
    records = [dict(make_record(), id=1), dict(single_arm_record(), id=2)]
    frame = ledger.to_frame(records)
    assert list(frame.columns) == list(ledger.COLUMNS)
    first, second = frame.iloc[0], frame.iloc[1]
    assert (first["arm_a"], first["arm_b"], first["a_median"], first["unit"]) == ("VEC=2", "VEC=4", 812.5, "µs")
    assert first["delta_pct"] == pytest.approx(-2.74) and first["bar_pct"] == pytest.approx(2.0)
    assert not first["dirty"] and not pd.isna(first["dirty"])
    assert second["arm_a"] == "cupy"
    assert pd.isna(second["arm_b"]) and pd.isna(second["delta_pct"]) and pd.isna(second["commit"])


def test_csv_percentages_carry_no_binary_noise():
    """A stored fraction of 0.239153 exports as 23.9153 (``* 100`` alone gives 23.915300000000002)."""
    record = make_record()
    record["comparison"] = {**record["comparison"], "delta": 0.239153, "ci_low": -0.0274}
    assert 0.239153 * 100.0 != 23.9153
    text = ledger.export([dict(record, id=1)], "csv")
    assert ",23.9153," in text and ",-2.74," in text and "0000000" not in text


def test_a_sweep_exports_every_point_with_the_best_tagged():
    record = make_record(kind="sweep", verdict="MEASURED", comparison=None, best={"label": "B", "knobs": {"VEC": 4}},
                         default={"label": "A", "knobs": {"VEC": 2}})
    frame = ledger.to_frame([dict(record, id=1)])
    assert list(frame["point"]) == ["A (default)", "B (best)"]
    assert list(frame["arm_a"]) == ["VEC=2", "VEC=4"] and list(frame["a_median"]) == [812.5, 790.25]
    assert frame["arm_b"].isna().all() and frame["b_median"].isna().all()


def test_bar_pct_is_missing_where_no_bar_was_applied():
    """run, sweep and bench records store bar 0.0 for "no bar": <NA>, not 0.0; ab and calibrate keep theirs."""
    run = dict(single_arm_record(), bar=0.0, id=1)
    sweep = dict(make_record(kind="sweep", verdict="MEASURED", comparison=None, bar=0.0, best={"label": "B"}), id=2)
    bench = dict(bench_record(), id=3)
    calibrate = dict(make_record(kind="calibrate", verdict="MEASURED", comparison=None, bar=0.01), id=4)
    ab = dict(make_record(), id=5)
    frame = ledger.to_frame([run, sweep, bench, calibrate, ab]).set_index("kind")
    for kind in ("run", "sweep", "bench"):
        assert frame.loc[[kind], "bar_pct"].isna().all(), kind
    assert frame.loc["calibrate", "bar_pct"] == pytest.approx(1.0)
    assert frame.loc["ab", "bar_pct"] == pytest.approx(2.0)


def test_a_bench_record_gives_one_row_per_test_not_an_ab():
    records = [dict(make_record(), id=1), dict(bench_record(), id=2)]
    frame = ledger.to_frame(records)
    assert frame["id"].tolist() == [1, 2, 2]
    bench = frame[frame["id"] == 2]
    assert bench["workload"].tolist() == ["pp512", "tg128"]
    assert bench["a_median"].tolist() == [14192.5, 331.8] and (bench["unit"] == "tok/s").all()
    assert (bench["arm_a"] == "W16=1,GRAPHS=1").all()
    for column in ("arm_b", "b_median", "delta_pct", "bar_pct"):
        assert bench[column].isna().all(), column
    assert ledger.record_arms_text(records[1]) == "pp512, tg128"
    assert ledger.record_arms_text(records[0]) == "VEC=2 → VEC=4"


def test_exports_round_trip(tmp_path):
    records = [dict(make_record(title="a, \"quoted\" title"), id=1), dict(single_arm_record(), id=2),
               dict(bench_record(), id=3)]
    frame = ledger.to_frame(records)
    csv_back = pd.read_csv(io.StringIO(ledger.export(records, "csv")), dtype=ledger.COLUMNS)
    pd.testing.assert_frame_equal(csv_back, frame)
    json_text = ledger.export(records, "json")
    json_back = pd.read_json(io.StringIO(json_text), orient="records", dtype=False).astype(ledger.COLUMNS)
    pd.testing.assert_frame_equal(json_back, frame)
    assert json.loads(json_text)[1]["arm_b"] is None
    markdown = ledger.export(records, "md")
    header = markdown.splitlines()[0]
    assert header.startswith("|") and all(column in header for column in ledger.COLUMNS)
    assert "nan" not in markdown.lower().replace("nanos", "")
    with pytest.raises(LedgerError, match="valid formats"):
        ledger.export(records, "xlsx")


# ------------------------------------------------------------------------------------------------ CLI


@pytest.fixture
def cli():
    root = typer.Typer()
    root.add_typer(ledger_command.app)

    @root.callback()
    def main() -> None:
        """minfer (test app)."""

    runner = CliRunner()
    return lambda *args: runner.invoke(root, ["ledger", *args])


@pytest.fixture
def filled(tmp_path):
    directory = tmp_path / "records"
    ledger.append(directory, make_record(title="first"))
    ledger.append(directory, make_record(title="second", experiment="gemm", verdict="NEUTRAL"))
    ledger.append(directory, single_arm_record())
    (directory / "0009-broken.yaml").write_text("title: [unclosed\n")
    return directory


def test_cli_show_lists_records(cli, filled):
    result = cli("show", "--ledger", str(filled))
    assert result.exit_code == 1, result.output  # every good record shows; the broken file makes the status 1
    # The test console is 80 columns wide, so the arms column may wrap: look for its parts.
    # -2.74% of time is a speed-up of 1/(1-0.0274)-1 = +2.8%: both arms' medians, then the change in words.
    for expected in ("copy", "gemm", "VEC=2 → VEC=4", "812.5 → 790.2 µs +2.8% faster", "LANDED", "NEUTRAL",
                     "MEASURED"):
        assert expected in result.stdout
    assert "skipped 0009-broken.yaml" in result.stderr


def test_cli_show_filters(cli, filled):
    result = cli("show", "--ledger", str(filled), "--verdict", "neutral")
    assert result.exit_code == 1, result.output
    assert "gemm" in result.stdout and "LANDED" not in result.stdout


def test_cli_show_one(cli, filled):
    result = cli("show", "2", "--ledger", str(filled))
    assert result.exit_code == 1, result.output  # the broken file 0009 is reported: one rule for every reading command
    assert "second" in result.stdout and "minfer ab copy --arm VEC=2 --arm VEC=4" in result.stdout
    result = cli("show", "2", "--ledger", str(filled), "--format", "json")
    assert json.loads(result.stdout)["title"] == "second"


@pytest.mark.parametrize(
    "args, message",
    [
        (["show", "99"], "no record 99"),
        (["show", "9"], "0009-broken.yaml"),
        (["show", "--verdict", "BOGUS"], "valid verdicts: LANDED, REVERTED, NEUTRAL, INVALID, MEASURED"),
        (["show", "--format", "xml"], "valid formats: table, md, csv, json"),
        (["show", "1", "--last", "2"], "not both"),
        (["show", "4x"], "record id '4x' is not a whole number of 1 or more; give one like 46"),
    ],
)
def test_cli_errors_are_one_line(cli, filled, args, message):
    result = cli(*args, "--ledger", str(filled))
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0]


@pytest.mark.parametrize("text", ["4x", "0", "-3", "4.0", "4_6", "+4", "", "٤"])
def test_a_malformed_record_id_is_a_usage_error(cli, filled, text):
    with pytest.raises(LedgerError, match=r"is not a whole number of 1 or more; give one like 46 \(or 0046"):
        ledger.parse_id(text)
    result = cli("show", "--ledger", str(filled), "--", text)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: record id ") and len(result.stderr.strip().splitlines()) == 1


def test_record_ids_as_typed(cli, filled):
    assert [ledger.parse_id(t) for t in ("46", "0046", " 7 ")] == [46, 46, 7]
    result = cli("show", "0002", "--ledger", str(filled))  # as in the file name 0002-second.yaml
    assert result.exit_code == 1 and "second" in result.stdout  # 1: the broken file 0009 is reported


def test_cli_csv_parses(cli, filled):
    result = cli("show", "--ledger", str(filled), "--format", "csv")
    assert result.exit_code == 1, result.output
    frame = pd.read_csv(io.StringIO(result.stdout), dtype=ledger.COLUMNS)
    assert frame["id"].tolist() == [1, 2, 3]
    assert frame["experiment"].tolist() == ["copy", "gemm", "copy"]


def test_cli_empty_ledger(cli, tmp_path):
    (tmp_path / "empty").mkdir()
    result = cli("show", "--ledger", str(tmp_path / "empty"))
    assert result.exit_code == 0
    assert "no records yet" in result.stdout and "empty" in result.stdout
    result = cli("show", "--ledger", str(tmp_path / "missing"))
    assert result.exit_code == 2 and "does not exist" in result.stderr


def test_cli_clean_ledger_exits_zero(cli, filled):
    (filled / "0009-broken.yaml").unlink()
    assert cli("show", "--ledger", str(filled)).exit_code == 0


def test_cli_help_shows_an_example(cli):
    result = cli("show", "--help")
    assert result.exit_code == 0
    assert "minfer ledger show --experiment gemv" in result.stdout and "--verdict" in result.stdout


def test_git_state_prefers_the_commit_a_copy_was_made_from(monkeypatch, tmp_path):
    """A tree copied to a GPU host may sit inside another (stale) checkout: MINFER_GIT_COMMIT wins over its git."""
    from minfer_cli.measure.environment import git_state

    monkeypatch.setenv("MINFER_GIT_COMMIT", "4d5abc0d1252a335c203ebaad3b6aaf78e91e960")
    monkeypatch.setenv("MINFER_GIT_DIRTY", "0")
    assert git_state() == {"commit": "4d5abc0d1252a335c203ebaad3b6aaf78e91e960", "dirty": False}
    monkeypatch.delenv("MINFER_GIT_COMMIT")
    monkeypatch.delenv("MINFER_GIT_DIRTY")
    assert git_state(tmp_path) == {"commit": None, "dirty": None}  # no git there, no override
