"""`minfer ledger trend`, the ledger's plots and the output-file rules: plain logic, no GPU."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from minfer_cli import console, ledger
from minfer_cli.commands.ledger_trend import bar_text
from minfer_cli.errors import MinferError, UsageError
from minfer_cli.ledger import plots
from minfer_cli.ledger.trend import series
from minfer_cli.main import app
from minfer_cli.outputs import PLOT_SUFFIXES, check_output_path, write_output

COMMITS = ["a1b2c3d4e5f60718293a4b5c6d7e8f9012345678", "b2c3d4e5f60718293a4b5c6d7e8f901234567890",
           "c3d4e5f60718293a4b5c6d7e8f90123456789012", "d4e5f60718293a4b5c6d7e8f9012345678901234"]


def record(kind: str, arms: list[dict], timestamp: str, commit: str, experiment: str = "copy",
           workload: str = "1GiB", metric: dict | None = None, **extra) -> dict:
    """A valid schema 2 measurement record."""
    rec = {
        "schema": 2, "title": f"{experiment} {kind} {timestamp}", "timestamp": timestamp, "kind": kind,
        "experiment": experiment, "workload": {"name": workload, "shape": {"nbytes": 1 << 30}},
        "metric": metric or {"name": "time", "unit": "µs", "higher_is_better": False},
        "arms": arms, "comparison": None, "bar": 0.0,
        "verdict": "MEASURED", "environment": {"device": {"name": "NVIDIA H200"}}, "software": {},
        "git": {"commit": commit, "dirty": False}, "command": f"minfer {kind}", "notes": "",
    }
    rec.update(extra)
    return rec


def arm(label: str, knobs: dict, median: float, p10: float | None = None, p90: float | None = None,
        **stats) -> dict:
    return {"label": label, "knobs": knobs, "status": "ok", "error": None,
            "stats": {"median": median, "p10": p10, "p90": p90, "n": 20, **stats}}


TOK_S = {"name": "throughput", "unit": "tok/s", "higher_is_better": True}


def bench(timestamp: str, commit: str, pp: float | None, tg: float, **pp_stats) -> dict:
    knobs = {"W16": 1, "GRAPHS": 1}
    arms = []
    if pp is not None:
        arms.append(arm("pp2048", knobs, pp, **pp_stats))
    arms.append(arm("tg128", knobs, tg, mean=tg, std=0.2))
    return record("bench", arms, timestamp, commit, experiment="bench", workload="qwen2 7B Q4_K - Medium",
                  metric=TOK_S)


def ab_record(a: float, b: float, timestamp: str, commit: str, samples: bool = True, **extra) -> dict:
    rng = np.random.default_rng(7)
    arms = [arm("A", {"VEC": 2}, a, a - 3, a + 4), arm("B", {"VEC": 4}, b, b - 2, b + 5)]
    if samples:
        arms[0]["samples"] = [float(x) for x in a + rng.normal(0, 2, 24)]
        arms[1]["samples"] = [float(x) for x in b + rng.normal(0, 2, 24)]
    delta = b / a - 1
    comparison = {"delta": delta, "ci_low": delta - 0.004, "ci_high": delta + 0.004, "p_value": 1e-5, "rounds": 24}
    return record("ab", arms, timestamp, commit, comparison=comparison, bar=0.01, verdict="LANDED", **extra)


@pytest.fixture
def filled(tmp_path) -> Path:
    """A ledger: three bench records (one without pp2048, one with p10/p90 but no std) appended out of date
    order, and copy A/B, run and sweep records (one sweep on another workload)."""
    directory = tmp_path / "ledger"
    ledger.append(directory, bench("2026-12-01T10:00:00Z", COMMITS[1], 20000.0, 300.0, mean=20100.0, std=150.0))
    ledger.append(directory, bench("2026-11-30T10:00:00Z", COMMITS[0], 14000.0, 250.0, mean=14050.0, std=90.0))
    ledger.append(directory, bench("2026-12-01T12:00:00Z", COMMITS[2], None, 320.0))
    ledger.append(directory, bench("2026-12-02T09:00:00Z", COMMITS[3], 28800.0, 374.0, p10=28600.0, p90=28900.0))
    ledger.append(directory, ab_record(812.5, 790.25, "2026-11-29T23:10:00Z", COMMITS[0]))  # id 5
    ledger.append(directory, record("run", [arm("run", {"VEC": 1}, 900.0, 890.0, 910.0)], "2026-11-30T01:00:00Z",
                                    COMMITS[1]))  # id 6: not the default, no point
    sweep_arms = [arm(f"p{v}", {"VEC": v}, m, m - 5, m + 6) for v, m in ((1, 905.0), (2, 811.0), (4, 780.5))]
    ledger.append(directory, record("sweep", sweep_arms, "2026-11-30T02:00:00Z", COMMITS[2],
                                    best={"label": "p4", "knobs": {"VEC": 4}},
                                    default={"label": "p4", "knobs": {"VEC": 4}}))  # id 7
    ledger.append(directory, record("sweep", [arm("p4", {"VEC": 4}, 200.0, 199.0, 201.0)], "2026-11-30T03:00:00Z",
                                    COMMITS[3], workload="256MiB"))  # id 8: another workload
    return directory


@pytest.fixture(autouse=True)
def terminal_width(monkeypatch):
    """Restores the console's width after `cli` pins it (rich fixes the width of a console made while COLUMNS was
    exported, so the environment alone cannot set it)."""
    monkeypatch.setattr(console.out, "_width", None)


def cli(*args: str, columns: int = 80):
    """`minfer ledger trend ARGS` on a terminal ``columns`` wide."""
    console.out._width = columns
    return CliRunner().invoke(app, ["ledger", "trend", *args], env={"COLUMNS": str(columns)})


def one_error_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    return lines[0]


def assert_real_png(path: Path) -> None:
    import matplotlib.image

    assert path.stat().st_size > 10_000
    pixels = matplotlib.image.imread(path)
    rgb = pixels[..., :3].reshape(-1, 3)
    assert pixels.std() > 0.05
    assert len(np.unique(rgb, axis=0)) > 10
    assert (rgb.mean(axis=1) < 0.9).mean() > 0.01  # more than 1% of the pixels are drawn on


# ------------------------------------------------------------------------------------------------ series


def test_bench_series_in_date_order_with_std_bars(filled):
    records = ledger.load(filled).records
    points = series(records, "pp2048")
    assert [p.id for p in points] == [2, 1, 4]  # by timestamp, not id; record 3 has no pp2048
    assert [p.value for p in points] == [14050.0, 20100.0, 28800.0]  # mean, else median
    assert [(p.err_low, p.err_high) for p in points] == [(90.0, 90.0), (150.0, 150.0), (200.0, 100.0)]
    assert [p.spread for p in points] == ["± std", "± std", "p10–p90"]
    assert [p.commit for p in points] == [COMMITS[0][:8], COMMITS[1][:8], COMMITS[3][:8]]
    assert {p.unit for p in points} == {"tok/s"} and all(p.higher_is_better for p in points)
    tg = series(records, "tg128")
    assert [p.id for p in tg] == [2, 1, 3, 4] and [p.value for p in tg] == [250.0, 300.0, 320.0, 374.0]
    assert series(records, "tg128", arm={"W16": "1"})[0].value == 250.0  # knob values as typed
    with pytest.raises(UsageError, match="no bench record of tg128 matches --arm W16=0"):
        series(records, "tg128", arm={"W16": 0})


def test_a_measured_verify_of_a_bench_record_is_a_point(filled):
    verify = bench("2026-12-03T09:00:00Z", COMMITS[0], 29000.0, 380.0, mean=29010.0, std=100.0)
    verify.update(kind="verify", verdict="HOLDS", verify={"of": 4, "of_kind": "bench", "reason": "re-measured"})
    ledger.append(filled, verify)  # id 9
    points = series(ledger.load(filled).records, "pp2048")
    assert [(p.id, p.value, p.err_low) for p in points][-2:] == [(4, 28800.0, 200.0), (9, 29010.0, 100.0)]


def test_experiment_median_at_the_current_defaults(filled):
    records = ledger.load(filled).records
    points = series(records, "median", experiment="copy", workload="1GiB")  # copy's default is VEC=4
    assert [(p.id, p.label, p.value) for p in points] == [(5, "ab B", 790.25), (7, "sweep p4", 780.5)]
    assert [(p.err_low, p.err_high) for p in points] == [(2.0, 5.0), (5.0, 6.0)]
    assert points[0].unit == "µs" and not points[0].higher_is_better and points[0].spread == "p10–p90"
    assert series(records, "time", experiment="copy", workload="1GiB") == points  # the metric's own name
    chosen = series(records, "median", experiment="copy", workload="1GiB", arm={"VEC": "2"})
    assert [(p.id, p.label, p.value) for p in chosen] == [(5, "ab A", 812.5), (7, "sweep p2", 811.0)]
    other = series(records, "median", experiment="copy", workload="256MiB")
    assert [(p.id, p.value) for p in other] == [(8, 200.0)]


def test_unknown_metric_lists_what_the_ledger_holds(filled):
    records = ledger.load(filled).records
    with pytest.raises(UsageError) as info:
        series(records, "pp9999")
    message = str(info.value)
    assert "\n" not in message
    assert "bench tests tg128" not in message and "pp2048, tg128" in message
    assert "minfer ledger trend median -e EXP -w WORKLOAD" in message and "(experiments: copy)" in message


@pytest.mark.parametrize("kwargs, expected", [
    ({}, r"pick one with --experiment EXP --workload WORKLOAD \(experiments: copy\)"),
    ({"experiment": "copy"}, r"measured on several workloads; pick one with --workload \(1GiB, 256MiB\)"),
    ({"experiment": "gemv", "workload": "x"}, r"no ab, run or sweep record of experiment 'gemv'.*experiments: copy$"),
    ({"experiment": "copy", "workload": "1GiB", "arm": {"VEC": 8}}, r"no arm .* matches --arm VEC=8"),
])
def test_experiment_metric_errors_say_what_to_give(filled, kwargs, expected):
    with pytest.raises(UsageError, match=expected):
        series(ledger.load(filled).records, "median", **kwargs)
    with pytest.raises(UsageError, match="copy records time, not 'throughput'"):
        series(ledger.load(filled).records, "throughput", experiment="copy", workload="1GiB")


# ------------------------------------------------------------------------------------------------ CLI


def test_cli_trend_plot_writes_a_real_png(filled, tmp_path):
    target = tmp_path / "out" / "pp2048.png"
    target.parent.mkdir()
    result = cli("pp2048", "--ledger", str(filled), "--plot", str(target))
    assert result.exit_code == 0, result.output
    assert f"plot written to {target}" in result.stdout
    assert_real_png(target)
    assert [p.name for p in target.parent.iterdir()] == ["pp2048.png"]  # no temporary left behind
    svg = tmp_path / "out" / "tg128.svg"
    assert cli("tg128", "--ledger", str(filled), "--plot", str(svg)).exit_code == 0
    text = svg.read_text()
    assert "<svg" in text and "tok/s" in text and "#3 c3d4e5f6" in text


def test_cli_refuses_an_existing_plot_without_force(filled, tmp_path):
    target = tmp_path / "taken.png"
    target.write_bytes(b"mine")
    result = cli("pp2048", "--ledger", str(filled), "--plot", str(target))
    assert result.exit_code == 2
    assert "exists; add --force" in one_error_line(result) and result.stdout == ""
    assert target.read_bytes() == b"mine"
    result = cli("pp2048", "--ledger", str(filled), "--plot", str(target), "--force")
    assert result.exit_code == 0, result.output
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert_real_png(target)


@pytest.mark.parametrize("where, message", [
    ("ledger/inside.png", "inside the ledger directory"),
    ("ledger/../ledger/inside.svg", "inside the ledger directory"),
    ("out.jpg", "must end in .png or .svg"),
    ("missing/out.png", "does not exist"),
    ("adir.png", "is a directory"),
])
def test_cli_refuses_bad_plot_paths(filled, tmp_path, where, message):
    (tmp_path / "adir.png").mkdir()
    before = sorted(p.name for p in filled.iterdir())
    result = cli("pp2048", "--ledger", str(filled), "--plot", str(tmp_path / where), "--force")
    assert result.exit_code == 2
    assert message in one_error_line(result)
    assert sorted(p.name for p in filled.iterdir()) == before


def test_cli_refuses_a_symlink_into_the_ledger(filled, tmp_path):
    (tmp_path / "alias").symlink_to(filled)
    result = cli("pp2048", "--ledger", str(filled), "--plot", str(tmp_path / "alias" / "x.png"))
    assert result.exit_code == 2 and "inside the ledger directory" in one_error_line(result)


@pytest.mark.parametrize("columns", [80, 60])
def test_cli_chart_fits_the_terminal_one_line_per_point(filled, columns):
    result = cli("median", "-e", "copy", "-w", "1GiB", "--arm", "VEC=2", "--ledger", str(filled), columns=columns)
    assert result.exit_code == 0, result.output
    lines = result.stdout.rstrip("\n").splitlines()
    assert max(len(line) for line in lines) <= columns
    assert len(lines) == 2 + 2 + 2  # title, heading, column header and rule, one row per point
    rows = lines[4:]
    assert [row.split()[0] for row in rows] == ["5", "7"]
    assert "812.5 −3.000 +4.000" in rows[0] and "811.0 −5.000 +6.000" in rows[1]
    assert rows[0].rstrip().endswith("█") and "█" in rows[1] and rows[0].count("█") > rows[1].count("█")


def test_cli_chart_bars_scale_between_min_and_max(filled):
    result = cli("tg128", "--ledger", str(filled))
    assert result.exit_code == 0, result.output
    lines = result.stdout.rstrip("\n").splitlines()
    assert max(len(line) for line in lines) == 80
    rows = {row.split()[0]: row for row in lines[4:]}
    assert list(rows) == ["2", "1", "3", "4"]
    width = len(rows["4"].rstrip().split("│")[-1].strip())
    assert rows["2"].rstrip().endswith("│ █") and width > 20  # the min is one cell, the max the whole column
    assert "250.0 ± 0.2 " in rows["2"] and "2026-11-30" in rows["2"] and COMMITS[0][:8] in rows["2"]


def test_cli_json_and_unknown_metric(filled):
    result = cli("pp2048", "--ledger", str(filled), "--format", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [(d["id"], d["value"], d["err_low"]) for d in data] == [(2, 14050.0, 90.0), (1, 20100.0, 150.0),
                                                                    (4, 28800.0, 200.0)]
    result = cli("nope", "--ledger", str(filled))
    assert result.exit_code == 2 and "pp2048, tg128" in one_error_line(result)


def test_bar_text_scale():
    assert bar_text(1.0, 1.0, 3.0, 20) == "█"
    assert bar_text(3.0, 1.0, 3.0, 20) == "█" * 20
    assert bar_text(2.0, 1.0, 3.0, 20) == "█" * 10 + "▌"  # 1 cell + half of the 19 left
    assert bar_text(5.0, 5.0, 5.0, 12) == "█" * 12


def test_ab_and_sweep_check_the_plot_path_before_measuring(filled, tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, ["ab", "copy", "--arm", "VEC=1", "--arm", "VEC=4", "--ledger", str(filled),
                                 "--plot", str(filled / "ab.png")])
    assert result.exit_code == 2 and "inside the ledger directory" in one_error_line(result)
    result = runner.invoke(app, ["sweep", "copy", "VEC=1,4", "--plot", str(tmp_path / "sweep.pdf")])
    assert result.exit_code == 2 and "must end in .png or .svg" in one_error_line(result)


# ------------------------------------------------------------------------------------------------ plots


def test_plot_ab_from_samples(tmp_path):
    rec = ab_record(812.5, 790.25, "2026-11-29T23:10:00Z", COMMITS[0])
    target = write_output(tmp_path / "ab.png", lambda p: plots.plot_ab(rec, p), force=False,
                          ledger_dir=tmp_path / "ledger", suffixes=PLOT_SUFFIXES)
    assert_real_png(target)
    svg = tmp_path / "ab.svg"
    plots.plot_ab(rec, svg)
    text = svg.read_text()
    assert "+2.8% faster" in text and "LANDED" in text and "median 790.2" in text


def test_plot_ab_without_samples_names_the_cause(tmp_path):
    rec = ab_record(812.5, 790.25, "2026-11-29T23:10:00Z", COMMITS[0], samples=False, id=5)
    with pytest.raises(UsageError, match="record #5 predates per-round samples"):
        plots.plot_ab(rec, tmp_path / "ab.png")
    with pytest.raises(UsageError, match="predates per-round samples"):
        write_output(tmp_path / "ab.png", lambda p: plots.plot_record(rec, p), force=False, ledger_dir=None)
    assert list(tmp_path.iterdir()) == []  # the temporary file is gone too


def test_plot_sweep_and_bench(filled, tmp_path):
    records = {r["id"]: r for r in ledger.load(filled).records}
    plots.plot_record(records[7], tmp_path / "sweep.svg")
    text = (tmp_path / "sweep.svg").read_text()
    assert "VEC=4 (best, default)" in text and "VEC=1" in text and "µs" in text
    plots.plot_record(records[1], tmp_path / "bench.png")
    assert_real_png(tmp_path / "bench.png")
    with pytest.raises(UsageError, match="pictures exist for ab, sweep, run and bench"):
        plots.plot_record({**records[7], "kind": "calibrate"}, tmp_path / "x.png")


# ------------------------------------------------------------------------------------------------ outputs


def test_write_output_is_atomic_and_never_clobbers(tmp_path):
    target = tmp_path / "data.png"
    write_output(target, lambda p: p.write_bytes(b"one"), force=False, ledger_dir=None)
    assert target.read_bytes() == b"one"
    with pytest.raises(UsageError, match="exists; add --force"):
        write_output(target, lambda p: p.write_bytes(b"two"), force=False, ledger_dir=None)
    write_output(target, lambda p: p.write_bytes(b"two"), force=True, ledger_dir=None)
    assert target.read_bytes() == b"two" and [p.name for p in tmp_path.iterdir()] == ["data.png"]

    def fails(path: Path) -> None:
        path.write_bytes(b"half")
        raise RuntimeError("drawing failed")

    with pytest.raises(MinferError, match="cannot draw .*data.png: RuntimeError: drawing failed"):
        write_output(target, fails, force=True, ledger_dir=None)
    assert target.read_bytes() == b"two" and [p.name for p in tmp_path.iterdir()] == ["data.png"]
    assert check_output_path(tmp_path / "new.SVG", force=False, ledger_dir=tmp_path / "l",
                             suffixes=PLOT_SUFFIXES) == tmp_path / "new.SVG"


def test_a_trend_never_joins_different_configurations_silently():
    """--arm naming part of a configuration: arms that differ in another knob they all have are refused (naming
    it); a bench run with other knobs than the newest is labelled with them."""
    mixed = [record("run", [arm("A", {"TYPE": t, "RPB": 4}, m)], f"2026-12-0{i + 1}T00:00:00Z", COMMITS[i],
                    experiment="gemv", workload="ffn_down", id=i + 1)
             for i, (t, m) in enumerate([("Q4_K", 15.3), ("Q6_K", 20.9)])]
    with pytest.raises(UsageError, match=r"differ in TYPE \(Q4_K, Q6_K\).*--arm RPB=4,TYPE=Q4_K"):
        series(mixed, "median", "gemv", "ffn_down", {"RPB": 4})
    assert [p.value for p in series(mixed, "median", "gemv", "ffn_down", {"RPB": 4, "TYPE": "Q6_K"})] == [20.9]
    eager, graphs = (dict(bench(f"2026-12-0{i}T00:00:00Z", COMMITS[i], None, tg), id=i) for i, tg in ((1, 31.4), (2, 374.0)))
    eager["arms"][0]["knobs"] = {"W16": 1, "GRAPHS": 0}
    points = series([eager, graphs], "tg128")
    assert [p.label for p in points] == ["tg128 (GRAPHS=0)", "tg128"]
