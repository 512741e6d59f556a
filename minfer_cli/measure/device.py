"""The GPU minfer measures on: presence checks with one-sentence errors, and the properties timing needs."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from minfer_cli.errors import NoGpuError

DOCTOR_HINT = "run `minfer doctor` to see what is missing and how to fix it"


@dataclass(frozen=True)
class DeviceInfo:
    """Properties of CUDA device 0 as read from the driver.

    l2_bytes: L2 cache size in bytes (60 MiB on the H200); smem_optin_bytes: the largest dynamic shared memory a
    block may opt into; driver_version / runtime_version: e.g. "13.0"; simulator: True under numba's CUDA
    simulator (nothing can be timed there).
    """

    name: str
    compute_capability: str
    sm_count: int
    l2_bytes: int
    smem_optin_bytes: int
    memory_bytes: int
    uuid: str
    driver_version: str
    runtime_version: str
    simulator: bool = False

    def as_dict(self) -> dict:
        return asdict(self)


def simulator_enabled() -> bool:
    """True when numba runs kernels in its CUDA simulator (NUMBA_ENABLE_CUDASIM=1, read at numba's import)."""
    from numba.cuda import config

    return bool(config.ENABLE_CUDASIM)


def _version(pair) -> str:
    return ".".join(str(x) for x in pair)


def probe() -> DeviceInfo:
    """Read device 0's properties. Raises NoGpuError (naming `minfer doctor`) when no GPU is usable."""
    from numba import cuda

    if simulator_enabled():
        return DeviceInfo("CUDA simulator", "sim", 1, 0, 48 * 1024, 0, "", "sim", "sim", simulator=True)
    try:
        if not cuda.is_available():
            raise NoGpuError(f"no usable NVIDIA GPU or CUDA driver was found; {DOCTOR_HINT}")
        dev = cuda.get_current_device()
        free, total = cuda.current_context().get_memory_info()
        from numba.cuda.cudadrv import driver, runtime

        return DeviceInfo(
            name=dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name),
            compute_capability=_version(dev.compute_capability),
            sm_count=int(dev.MULTIPROCESSOR_COUNT),
            l2_bytes=int(dev.L2_CACHE_SIZE),
            smem_optin_bytes=int(dev.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
            memory_bytes=int(total),
            uuid=str(dev.uuid),
            driver_version=_version(driver.get_version()),
            runtime_version=_version(runtime.get_version()),
        )
    except NoGpuError:
        raise
    except Exception as exc:  # driver missing, no device, init failure: one sentence, no traceback
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise NoGpuError(f"the GPU could not be used ({first}); {DOCTOR_HINT}") from None


def require_timing_device() -> DeviceInfo:
    """The device to time on (or to compile on, for `minfer kernels`). Raises NoGpuError when there is none, or
    when only the CUDA simulator is active (the simulator runs kernels as Python: no timing, no resources)."""
    info = probe()
    if info.simulator:
        raise NoGpuError(
            "NUMBA_ENABLE_CUDASIM=1 is set: the CUDA simulator runs kernels as Python, so it can neither time them "
            "nor report their registers and occupancy; unset it on a machine with a GPU "
            f"({DOCTOR_HINT})"
        )
    return info
