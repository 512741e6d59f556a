"""KV-cache append: split a fused QKV projection into f16 queries and the f16 K/V cache rows of its positions.

``qkv`` f32 ``[nt, q_dim + 2*kv_dim]`` (q | k | v along a row, as the fused QKV GEMM writes it, after bias and
RoPE) -> ``q`` f16 ``[nt, q_dim]`` (the flash-attention input) and ``k_cache[pos[t]]``, ``v_cache[pos[t]]`` f16
``[kv_dim]`` rows of caches ``[context, kv_dim]`` (= ``[context, n_kv_heads, head_dim]``). Positions come from a
device int32 array so that decode can read them from device memory (one graph serves every step).
"""

from __future__ import annotations

import numpy as np
from numba import cuda
from numba.cuda.cudadrv import devicearray

from kernels.errors import KernelConstraintError
from kernels.launch import launch_kernel
from kernels.ptx import pdl_enter
from kernels.jit import kernel

THREADS = 256


@kernel
def _append(qkv, pos, q_out, k_cache, v_cache, q_dim, kv_dim, col_blocks):
    pdl_enter()
    b = cuda.blockIdx.x
    t = b // col_blocks
    col = (b - t * col_blocks) * cuda.blockDim.x + cuda.threadIdx.x
    if col < q_dim:
        q_out[t, col] = qkv[t, col]
    elif col < q_dim + kv_dim:
        k_cache[pos[t], col - q_dim] = qkv[t, col]
    elif col < q_dim + 2 * kv_dim:
        v_cache[pos[t], col - q_dim - kv_dim] = qkv[t, col]


def kv_append(qkv, pos, k_cache, v_cache, q_dim: int, q_out=None, stream=0, pdl: bool = False):
    """Enqueue the split of ``qkv`` into ``q_out`` (returned) and the cache rows at ``pos`` on ``stream``.

    qkv: C-contiguous f32 device array ``[nt, q_dim + 2*kv_dim]``; pos: int32 ``[nt]`` with 0 <= pos < context
    (not checked on the device: positions are written by the engine); k_cache, v_cache: C-contiguous f16
    ``[context, kv_dim]``; q_out: optional f16 ``[nt, q_dim]``; pdl: a programmatic dependent launch
    (`kernels.launch`; the kernel waits for the previous one first: `kernels.ptx.pdl_enter`). Raises KernelConstraintError for wrong dtypes,
    shapes that do not add up, or non-contiguous arrays.
    """
    for name, a, dtype, ndim in (("qkv", qkv, np.float32, 2), ("pos", pos, np.int32, 1),
                                 ("k_cache", k_cache, np.float16, 2), ("v_cache", v_cache, np.float16, 2)):
        if not devicearray.is_cuda_ndarray(a) or a.dtype != dtype or a.ndim != ndim or not a.is_c_contiguous():
            raise KernelConstraintError(f"{name} must be a C-contiguous {np.dtype(dtype)} device array with {ndim} "
                                        f"dimension(s), got {getattr(a, 'dtype', type(a).__name__)}")
    nt, width = qkv.shape
    kv_dim = k_cache.shape[1]
    if v_cache.shape != k_cache.shape or width != q_dim + 2 * kv_dim:
        raise KernelConstraintError(f"qkv width {width} must equal q_dim {q_dim} + 2 x kv_dim {kv_dim}, and the "
                                    f"caches must match ({tuple(k_cache.shape)} vs {tuple(v_cache.shape)})")
    if pos.shape[0] != nt:
        raise KernelConstraintError(f"pos has {pos.shape[0]} positions for {nt} tokens")
    if q_out is None:
        q_out = cuda.device_array((nt, q_dim), dtype=np.float16, stream=stream)
    elif q_out.dtype != np.float16 or tuple(q_out.shape) != (nt, q_dim) or not q_out.is_c_contiguous():
        raise KernelConstraintError(f"q_out must be a C-contiguous float16 array of shape ({nt}, {q_dim})")
    if nt:
        col_blocks = -(-width // THREADS)
        launch_kernel(_append, nt * col_blocks, THREADS, stream,
                      (qkv, pos, q_out, k_cache, v_cache, q_dim, kv_dim, col_blocks), pdl=pdl)
    return q_out
