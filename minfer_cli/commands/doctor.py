"""`minfer doctor`: is this machine ready to measure? GPU, driver, CUDA runtime, numba-cuda, numpy, NVML."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

import typer
from rich.table import Table

from minfer_cli.console import guard, out


@dataclass
class Check:
    name: str
    status: str  # OK | WARN | FAIL
    detail: str
    fix: str = ""


def _pkg(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def run_checks() -> list[Check]:
    """Every readiness check, in the order a fix would go; never raises."""
    checks = [Check("python", "OK", platform.python_version())]
    import numpy

    np_ok = tuple(int(x) for x in numpy.__version__.split(".")[:2]) < (2, 5)
    checks.append(Check("numpy", "OK" if np_ok else "FAIL", numpy.__version__,
                        "" if np_ok else "pip install 'numpy<2.5' (numba-cuda 0.30 calls np.row_stack, gone in 2.5)"))
    nc = _pkg("numba-cuda")
    nc_ok = nc is not None and nc.startswith("0.30.")
    checks.append(Check("numba-cuda", "OK" if nc_ok else "FAIL", nc or "not installed",
                        "" if nc_ok else "pip install 'numba-cuda[cu13]>=0.30,<0.31'"))
    for name in ("gguf", "scipy", "nvidia-ml-py"):
        v = _pkg(name)
        checks.append(Check(name, "OK" if v else "FAIL", v or "not installed", "" if v else f"pip install {name}"))
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        checks.append(Check("GPU", "FAIL", "NUMBA_ENABLE_CUDASIM is set: kernels run in numba's simulator, nothing can be timed",
                            "unset NUMBA_ENABLE_CUDASIM"))
        return checks
    from minfer_cli.errors import NoGpuError
    from minfer_cli.measure.device import probe

    try:
        d = probe()
    except NoGpuError as exc:
        checks.append(Check("GPU", "FAIL", str(exc).split("; run `minfer doctor`")[0],
                            "install the NVIDIA driver and run on a machine with an NVIDIA GPU (sm_90 for the tensor-core kernels)"))
        return checks
    checks.append(Check("GPU", "OK", f"{d.name}, compute capability {d.compute_capability}, {d.sm_count} SMs, "
                                     f"L2 {d.l2_bytes / 2**20:.0f} MiB, {d.memory_bytes / 2**30:.0f} GiB"))
    cc_ok = tuple(int(x) for x in d.compute_capability.split(".")) >= (9, 0)
    checks.append(Check("sm_90 (Hopper)", "OK" if cc_ok else "WARN", f"compute capability {d.compute_capability}",
                        "" if cc_ok else "tensor-core kernels target sm_90; other experiments still run"))
    checks.append(Check("CUDA driver / runtime", "OK", f"driver {d.driver_version}, runtime {d.runtime_version}"))
    from minfer_cli.measure.environment import Nvml

    nvml = Nvml(d.uuid)
    state = nvml.state()
    if state.error and state.sm_clock_mhz is None:
        checks.append(Check("NVML", "WARN", state.error, "clocks and throttling will not be recorded"))
    else:
        throttle = ", ".join(state.throttle) or "none"
        checks.append(Check("NVML", "OK", f"SM {state.sm_clock_mhz} MHz, mem {state.mem_clock_mhz} MHz, "
                                          f"{state.temperature_c} °C, {state.power_w} W, throttling: {throttle}"))
    from minfer_cli.baselines import ceilings_for

    c = ceilings_for(d.name)
    checks.append(Check("measured ceilings", "OK" if c else "WARN",
                        f"{c.copy_gbps:.0f} GB/s copy, {c.f16_matmul_tflops:.0f} TFLOP/s f16 ({c.source})" if c
                        else f"none for {d.name} in baselines/", "" if c else "add baselines/<device>.yaml (see baselines/h200.yaml)"))
    return checks


@guard
def doctor() -> None:
    """Check that this machine can run and time minfer's kernels; say what is wrong and how to fix it.

    Exit status 1 when a required check fails.

    Example: minfer doctor
    """
    checks = run_checks()
    t = Table(title="minfer doctor", title_justify="left")
    for col in ("check", "status", "detail", "fix"):
        t.add_column(col)
    style = {"OK": "green", "WARN": "yellow", "FAIL": "bold red"}
    for c in checks:
        t.add_row(c.name, f"[{style[c.status]}]{c.status}[/]", c.detail, c.fix)
    out.print(t)
    if any(c.status == "FAIL" for c in checks):
        raise typer.Exit(code=1)
