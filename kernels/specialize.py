"""Compile-time specialised tensor-core kernels: one compiled kernel per knob combination, built once and cached,
with the dynamic-shared-memory opt-in done at build time. Shared by `gemm_f16` and `attention`.

Above 48 KB of shared memory a kernel needs CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES raised; it is set when
the kernel is built, so never inside a CUDA-graph capture (where setting it fails silently and poisons the first
captured launch). The H200 allows 227 KB per block after the opt-in.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Hashable

from numba import cuda

from kernels.errors import KernelConstraintError
from kernels.jit import kernel as jit_kernel
from kernels.ptx import SIMULATOR

STATIC_SMEM_LIMIT = 48 * 1024
H200_SMEM_OPTIN = 227 * 1024  # cudaDevAttrMaxSharedMemoryPerBlockOptin on sm_90


def device_smem_limit() -> int:
    """The largest dynamic shared memory a block may opt into on the current device (H200's 227 KB when the
    device cannot be asked, e.g. under the simulator)."""
    if SIMULATOR:
        return H200_SMEM_OPTIN
    try:
        return int(cuda.get_current_device().MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
    except Exception:
        return H200_SMEM_OPTIN


def opt_in_dynamic_smem(kernel, nbytes: int, family: str) -> None:
    """Raise the compiled kernel's dynamic shared memory limit to ``nbytes`` (numba-cuda 0.30 internals: the
    overload's CUkernel handle and cuKernelSetAttribute, as numba sets its own carveout). Raises
    KernelConstraintError naming ``family`` when the driver refuses."""
    try:
        from numba.cuda.cudadrv.driver import binding, driver

        (compiled,) = kernel.overloads.values()
        cufunc = compiled._codelibrary.get_cufunc()
        attr = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        driver.cuKernelSetAttribute(attr, int(nbytes), cufunc.handle, cufunc.device.id)
    except Exception as exc:  # the numba-cuda internals used here are not public API
        raise KernelConstraintError(
            f"{family}: could not opt in to {nbytes} bytes of dynamic shared memory "
            f"(cuKernelSetAttribute MAX_DYNAMIC_SHARED_SIZE_BYTES failed: {exc!r})"
        ) from exc


def is_contiguous(x) -> bool:
    """C-contiguity of a numpy or numba device array."""
    flags = getattr(x, "flags", None)
    if flags is not None:
        try:
            return bool(flags["C_CONTIGUOUS"])
        except (KeyError, TypeError):
            pass
    return bool(getattr(x, "is_c_contiguous", lambda: True)())


@dataclass
class BuiltKernel:
    geometry: Any
    kernel: object


class KernelCache:
    """Build-once cache of specialised kernels keyed by their (hashable) geometry."""

    def __init__(self, family: str, signature, limit: Callable[[], int] = device_smem_limit):
        self.family, self.signature, self.limit = family, signature, limit
        self._built: dict[Hashable, BuiltKernel] = {}
        self._lock = threading.Lock()

    def get(self, geometry, make: Callable[[Any], Callable], smem_bytes: int, threads: int, hint: str = "",
            whole_program: bool = False) -> BuiltKernel:
        """The kernel for ``geometry`` (compiled by ``make(geometry)`` on first use; ``whole_program``: loaded as
        one program, `kernels.jit.load_whole_program`). Raises KernelConstraintError when ``smem_bytes`` exceeds the
        device's opt-in limit (``hint`` says what to lower)."""
        with self._lock:
            built = self._built.get(geometry)
            if built is not None:
                return built
            limit = self.limit()
            if smem_bytes > limit:
                raise KernelConstraintError(
                    f"{self.family} config needs {smem_bytes} bytes of shared memory per block; the device allows "
                    f"{limit}" + (f" ({hint})" if hint else "")
                )
            kernel = jit_kernel(make(geometry), self.signature, threads=threads, whole_program=whole_program)
            if not SIMULATOR and smem_bytes > STATIC_SMEM_LIMIT:
                opt_in_dynamic_smem(kernel, smem_bytes, self.family)
            built = self._built[geometry] = BuiltKernel(geometry, kernel)
            return built
