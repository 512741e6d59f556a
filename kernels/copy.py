"""Device-to-device copy: the bandwidth ceiling every memory-bound kernel is measured against.

`dst[i] = src[i]` over a uint32 buffer, grid-stride, with ``VEC`` 4-byte elements per load/store per thread:
VEC=1 `ld.global.u32`, VEC=2 `ld.global.u64` (a uint64 view), VEC=4 `ld.global.v4.u32` (inline PTX).
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from kernels.errors import KernelConstraintError
from kernels.ptx import ld_global_v4_u32, st_global_v4_u32
from kernels.jit import kernel

VEC_VALUES = (1, 2, 4)
THREADS = 256


@kernel
def _copy_scalar(src, dst):
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    while i < src.size:
        dst[i] = src[i]
        i += stride


@kernel
def _copy_v4(src, dst):
    i = cuda.grid(1) * 4
    stride = cuda.gridsize(1) * 4
    while i < src.size:
        x0, x1, x2, x3 = ld_global_v4_u32(src, i)
        st_global_v4_u32(dst, i, x0, x1, x2, x3)
        i += stride


def copy(src, dst, vec: int = 4, stream=0, blocks: int | None = None) -> None:
    """Enqueue ``dst[:] = src[:]`` on ``stream``.

    src, dst: 1-D C-contiguous uint32 device arrays of the same length, a multiple of ``vec`` (the harness
    uses whole MiB). vec: 4-byte elements per load/store per thread, 1, 2 or 4. blocks: grid size (default
    8 blocks of 256 threads per SM, grid-stride loop).

    Raises KernelConstraintError (a ValueError) for another dtype, a length mismatch, a length not a multiple
    of ``vec``, or a ``vec`` outside (1, 2, 4).
    """
    if vec not in VEC_VALUES:
        raise KernelConstraintError(f"VEC={vec} is not supported; allowed: {', '.join(map(str, VEC_VALUES))}")
    for name, a in (("src", src), ("dst", dst)):
        if a.dtype != np.uint32 or a.ndim != 1:
            raise KernelConstraintError(f"{name} must be a 1-D uint32 device array, got {a.dtype} with ndim {a.ndim}")
    if src.size != dst.size:
        raise KernelConstraintError(f"src has {src.size} elements but dst has {dst.size}; they must match")
    if src.size % vec:
        raise KernelConstraintError(f"length {src.size} is not a multiple of VEC={vec}")
    if blocks is None:
        # 8 blocks per SM; the CUDA simulator's device reports no SM count (1 then)
        blocks = 8 * getattr(cuda.get_current_device(), "MULTIPROCESSOR_COUNT", 1)
    if vec == 1:
        _copy_scalar[blocks, THREADS, stream](src, dst)
    elif vec == 2:
        _copy_scalar[blocks, THREADS, stream](src.view(np.uint64), dst.view(np.uint64))
    else:
        _copy_v4[blocks, THREADS, stream](src, dst)
