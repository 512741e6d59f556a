"""Generated ledgers for the tests and for `tests/perf_ledger.py`: valid records of every kind, written straight to
disk (no fsync per file, so 10,000 records take seconds)."""

from __future__ import annotations

import random
from pathlib import Path

from minfer_cli.ledger import store

KINDS = ("ab", "bench", "sweep", "run", "calibrate", "verify", "retire", "check")


def _arm(label: str, knobs: dict, median: float, rng: random.Random, samples: int = 20) -> dict:
    values = [round(median * (1 + rng.gauss(0, 0.01)), 4) for _ in range(samples)]
    return {"label": label, "knobs": knobs, "status": "ok", "error": None,
            "stats": {"median": median, "p10": median * 0.99, "p90": median * 1.01, "mean": median,
                      "std": median * 0.01, "n": samples}, "samples": values}


def record(record_id: int, kind: str, rng: random.Random) -> dict:
    """A valid schema 2 record of ``kind`` with id ``record_id`` (figures drawn from ``rng``)."""
    base = {"schema": 2, "id": record_id, "title": f"{kind} record {record_id} with a long title " + "x" * (record_id % 40),
            "timestamp": f"2026-{1 + record_id % 12:02d}-{1 + record_id % 28:02d}T{record_id % 24:02d}:00:00Z",
            "kind": kind, "git": {"commit": f"{record_id:040x}", "dirty": False},
            "command": f"minfer {kind} --arm TM=64,TN=128,KS=32,STAGES=3,STAGING=cp_async,GROUP=8", "notes": ""}
    measurement = {"experiment": "gemm_f16", "workload": {"name": "ffn_up", "shape": {"nt": 2048, "od": 18944}},
                   "metric": {"name": "time", "unit": "µs", "higher_is_better": False},
                   "environment": {"device": {"name": "NVIDIA H200"}}, "software": {"minfer": "0.1.0"},
                   "comparison": None, "bar": 0.0}
    a = 500 + rng.random() * 100
    if kind == "ab":
        b = a * (0.9 + rng.random() * 0.2)
        delta = b / a - 1
        return {**base, **measurement, "verdict": "LANDED" if delta < -0.01 else "NEUTRAL", "bar": 0.01,
                "arms": [_arm("A", {"TM": 64, "TN": 128, "KS": 32, "STAGES": 3}, a, rng),
                         _arm("B", {"TM": 128, "TN": 128, "KS": 32, "STAGES": 3}, b, rng)],
                "comparison": {"delta": delta, "ci_low": delta - 0.002, "ci_high": delta + 0.002,
                               "p_value": 1e-7, "rounds": 20}}
    if kind == "bench":
        return {**base, **measurement, "experiment": "bench", "verdict": "MEASURED",
                "workload": {"name": "qwen2 7B Q4_K - Medium", "shape": {"source": "synth:0"}},
                "metric": {"name": "throughput", "unit": "tok/s", "higher_is_better": True},
                "arms": [_arm("pp2048", {"W16": 1}, 28000 + a, rng, 3), _arm("tg128", {"W16": 1}, a * 0.7, rng, 3)]}
    if kind in ("sweep", "run"):
        arms = [_arm(f"p{i + 1}", {"TM": tm, "KS": 32}, a * (1 + i / 10), rng) for i, tm in enumerate((64, 128, 256))]
        extra = {"best": {"label": "p1", "knobs": arms[0]["knobs"]}, "default": {"label": "p3", "knobs": arms[2]["knobs"]}}
        return {**base, **measurement, "verdict": "MEASURED", "arms": arms[:1] if kind == "run" else arms,
                **(extra if kind == "sweep" else {})}
    if kind == "calibrate":
        return {**base, **measurement, "verdict": "MEASURED", "bar": 0.01, "arms": [_arm("A", {"VEC": 4}, a, rng)],
                "calibration": {"false_positive_rate": 0.0, "suggested_bar": 0.004, "bar": 0.01}}
    if kind == "verify":
        return {**base, "verdict": "HOLDS", "verify": {"of": max(1, record_id - 1), "reason": "+2.0% then, +2.1% now",
                                                       "measured_text": "+2.0% faster then, +2.1% faster now"}}
    if kind == "retire":
        return {**base, "verdict": "RETIRED", "retire": {"ids": [max(1, record_id - 2)], "why": "variant deleted"}}
    return {**base, "verdict": "PASS", "check": {"tolerance": 0.01, "worst_rel_l2": 0.003}}


def write_ledger(directory: Path, n: int, seed: int = 0) -> list[dict]:
    """Write ``n`` records (ids 1..n, kinds in rotation) to ``directory``; returns them."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    records = []
    for i in range(1, n + 1):
        rec = record(i, KINDS[(i - 1) % len(KINDS)], rng)
        (directory / f"{i:04d}-{store.slugify(rec['title'])}.yaml").write_text(store.dump(rec), encoding="utf-8")
        records.append(rec)
    return records
