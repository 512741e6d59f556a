"""Measured ceilings per device, read from `baselines/*.yaml`, for the "% of roofline" figures.

Each file holds one device: `device` (the name the driver reports), `ceilings.copy_gbps` (device-to-device copy,
bytes read + written, GB/s) and `ceilings.f16_matmul_tflops` (cuBLAS f16 GEMM with f32 accumulation), each with
its source (command, date). The roofline floor of a sample is max(FLOPs / matrix rate, bytes / copy bandwidth).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

BASELINES_DIR = Path(__file__).resolve().parents[1] / "baselines"


@dataclass(frozen=True)
class Ceilings:
    device: str
    copy_gbps: float
    f16_matmul_tflops: float
    source: str


def ceilings_for(device_name: str, directory: Path = BASELINES_DIR) -> Ceilings | None:
    """The measured ceilings of `device_name`, or None when no baseline file names that device."""
    if not directory.is_dir():
        return None
    for path in sorted(directory.glob("*.yaml")):
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError):
            continue
        if not isinstance(data, dict) or data.get("device") != device_name:
            continue
        c = data.get("ceilings") or {}
        try:
            return Ceilings(
                device=device_name,
                copy_gbps=float(c["copy_gbps"]["value"]),
                f16_matmul_tflops=float(c["f16_matmul_tflops"]["value"]),
                source=str(path.name),
            )
        except (KeyError, TypeError, ValueError):
            return None
    return None


@dataclass(frozen=True)
class Throughput:
    """Derived figures of one median time: TFLOP/s, GB/s, and % of the roofline floor (None without ceilings)."""

    tflops: float
    gbps: float
    pct_roofline: float | None
    floor_us: float | None
    bound: str | None


def throughput(flops: float, nbytes: float, time_us: float, ceilings: Ceilings | None) -> Throughput:
    """Figures for one sample that does `flops` and moves `nbytes` in `time_us` microseconds."""
    seconds = time_us * 1e-6
    tflops = flops / seconds / 1e12 if seconds > 0 else float("nan")
    gbps = nbytes / seconds / 1e9 if seconds > 0 else float("nan")
    if ceilings is None:
        return Throughput(tflops, gbps, None, None, None)
    t_math = flops / (ceilings.f16_matmul_tflops * 1e12) * 1e6
    t_mem = nbytes / (ceilings.copy_gbps * 1e9) * 1e6
    floor = max(t_math, t_mem)
    bound = "matrix" if t_math >= t_mem else "memory"
    return Throughput(tflops, gbps, 100.0 * floor / time_us if time_us > 0 else None, floor, bound)
