"""The ledger record of a `minfer bench` run (kind "bench", verdict MEASURED): one arm per pp/tg test."""

from __future__ import annotations

import datetime as dt

import numpy as np

from minfer_cli.engine.bench import BenchRow
from minfer_cli.engine.weights import ModelWeights
from minfer_cli.ledger.schema import SAMPLES_MAX, SCHEMA
from minfer_cli.measure import environment as envmod


def bench_record(rows: list[BenchRow], weights: ModelWeights, config: dict, notes: str = "",
                 preset: str | None = None) -> dict:
    """The record of one `minfer bench` run (schema 2): one arm per test with its repetitions as ``samples``;
    ``preset`` (the preset the weights were synthesised from, if any) lets `ledger verify` rebuild them."""
    from minfer_cli.measure.device import probe

    device = probe()
    arms = []
    for r in rows:
        p10, median, p90 = (float(v) for v in np.percentile(np.asarray(r.samples, dtype=np.float64), [10, 50, 90]))
        arms.append({
            "label": r.test, "knobs": dict(config), "status": "ok", "error": None,
            "stats": {"median": round(median, 3), "p10": round(p10, 3), "p90": round(p90, 3),  # as measure.stats
                      "mean": round(r.mean, 3), "std": round(r.std, 3), "n": len(r.samples)},
            "peak_mem_gib": round(r.peak_mem_bytes / 2**30, 3), "mem_growth_mib": round(r.mem_growth_bytes / 2**20, 2),
            "samples": [round(float(x), 3) for x in r.samples[:SAMPLES_MAX]],
        })
    return {
        "schema": SCHEMA,
        "title": f"bench {weights.describe()}: {', '.join(r.test for r in rows)}",
        "timestamp": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "kind": "bench",
        "experiment": "bench",
        "workload": {"name": weights.describe(), "shape": {"size_bytes": weights.size_bytes(), "params": weights.n_params(),
                                                           "source": weights.source,
                                                           **({"preset": preset} if preset else {})}},
        "metric": {"name": "throughput", "unit": "tok/s", "higher_is_better": True},
        "arms": arms,
        "comparison": None,
        "bar": 0.0,
        "verdict": "MEASURED",
        "environment": {"device": device.as_dict()},
        "software": envmod.software_versions() | {"cuda_driver": device.driver_version, "cuda_runtime": device.runtime_version},
        "git": envmod.git_state(),
        "command": envmod.command_line(),
        "notes": notes or "",
    }
