"""What a measurement ran on: clocks, temperature, power and throttle reasons (NVML), versions, git state.

NVML is read through nvidia-ml-py (`pynvml`). Every reading is best-effort: a field that cannot be read is None,
and the record says so, but a missing NVML never stops a measurement.
"""

from __future__ import annotations

import platform
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

# NVML clock-event reasons that mean the clocks were held below what the load asked for. Idle, application
# clock settings, sync boost and display settings are benign and are not counted as throttling.
# Source: NVML API reference, "nvmlClocksEventReasons".
THROTTLE_REASONS = {
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
}


def decode_throttle(mask: int) -> list[str]:
    """Names of the throttling reasons set in an NVML clock-event-reason bit mask."""
    return [name for bit, name in THROTTLE_REASONS.items() if mask & bit]


@dataclass
class GpuState:
    """One NVML reading: SM and memory clocks (MHz), temperature (°C), power (W), throttle reasons."""

    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    temperature_c: int | None = None
    power_w: float | None = None
    throttle: list[str] = field(default_factory=list)
    error: str | None = None


class Nvml:
    """A handle on the NVML device that matches CUDA device 0 (by UUID, else index 0)."""

    def __init__(self, uuid: str | None = None) -> None:
        self.handle = None
        self.error: str | None = None
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = None
            if uuid:
                try:
                    handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
                except pynvml.NVMLError:
                    handle = None
            self.handle = handle or pynvml.nvmlDeviceGetHandleByIndex(0)
            self._nvml = pynvml
        except Exception as exc:  # no driver, no NVML: readings become None
            self.error = f"NVML unavailable: {exc}"

    def throttle_mask(self) -> int:
        if self.handle is None:
            return 0
        nv = self._nvml
        getter = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or nv.nvmlDeviceGetCurrentClocksThrottleReasons
        try:
            return int(getter(self.handle))
        except nv.NVMLError:
            return 0

    def throttled(self) -> bool:
        """True when NVML reports a throttling reason right now (probe called once per A/B round)."""
        return bool(decode_throttle(self.throttle_mask()))

    def state(self) -> GpuState:
        if self.handle is None:
            return GpuState(error=self.error)
        nv, h = self._nvml, self.handle
        s = GpuState()
        for attr, call in (
            ("sm_clock_mhz", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
            ("mem_clock_mhz", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)),
            ("temperature_c", lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
            ("power_w", lambda: round(nv.nvmlDeviceGetPowerUsage(h) / 1000.0, 1)),
        ):
            try:
                setattr(s, attr, call())
            except nv.NVMLError as exc:
                s.error = str(exc)
        s.throttle = decode_throttle(self.throttle_mask())
        return s


def software_versions() -> dict:
    """Versions of minfer, numba-cuda, numpy, scipy, python, and the CUDA driver/runtime where readable."""
    from importlib.metadata import PackageNotFoundError, version

    import numpy

    from minfer_cli import __version__

    def pkg(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    return {
        "minfer": __version__,
        "numba_cuda": pkg("numba-cuda"),
        "numpy": numpy.__version__,
        "scipy": pkg("scipy"),
        "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.machine()}",
    }


def git_state(cwd: Path | None = None) -> dict:
    """{commit, dirty} of the git checkout holding the project. MINFER_GIT_COMMIT / MINFER_GIT_DIRTY, when set,
    say what a copy of the working tree (a GPU host) was made from and take precedence: such a copy may sit inside
    an unrelated or stale checkout whose git would answer for it. Otherwise git; where git cannot tell, None."""
    from minfer_cli.knobs import ENV_GIT_COMMIT, ENV_GIT_DIRTY, env

    if env(ENV_GIT_COMMIT) is not None:
        dirty = env(ENV_GIT_DIRTY)
        return {"commit": env(ENV_GIT_COMMIT), "dirty": None if dirty is None else dirty == "1"}
    root = cwd or Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root, capture_output=True, text=True, timeout=10, check=True,
        ).stdout
        return {"commit": commit or None, "dirty": bool(status.strip())}
    except (OSError, subprocess.SubprocessError):
        dirty = env(ENV_GIT_DIRTY)
        return {"commit": env(ENV_GIT_COMMIT), "dirty": None if dirty is None else dirty == "1"}


def command_line() -> str:
    """The exact command line, as typed (program name shortened to `minfer`)."""
    args = [a if " " not in a else repr(a) for a in sys.argv[1:]]
    return " ".join(["minfer", *args])


def gpu_state_dict(state: GpuState) -> dict:
    return asdict(state)
