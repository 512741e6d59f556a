"""Greedy sampling on the device: ``out[0] = argmax_i x[i]`` over an f32 vector (ties -> the lowest index).

Two passes (a block reduction, then a one-block reduction of the block results), so decode's next token never
leaves the GPU and one captured CUDA graph can replay every step:

1. ``partial``: grid ``blocks``, ``tpb`` threads. Thread t of block b scans ``i = b*tpb + t + k*blocks*tpb``
   (grid-stride, coalesced 4-byte loads), keeping (value, index); the block then reduces its ``tpb`` pairs in
   shared memory (a halving tree) and writes one pair to the workspace.
2. ``final``: one block of ``tpb`` threads reduces the ``blocks`` pairs the same way and writes the index to
   ``out[0]`` (an int32 device array: decode passes its token-id array, so the next step embeds that token).

Order: ``(v, i)`` beats ``(w, j)`` when ``v > w`` or ``v == w and i < j``, so the result is numpy's
``np.argmax`` (first maximal index) whatever the reduction order. NaN never wins (every comparison with NaN is
false); -inf does (an all -inf vector gives 0, as numpy); a vector with no non-NaN value gives -1 (numpy would
give the first NaN; -1 makes the next decode step's embedding a NaN row, so the failure shows).

Source: the classic shared-memory tree reduction (Harris, "Optimizing Parallel Reduction in CUDA", 2007);
llama.cpp ``ggml-cuda/argmax.cu`` (which uses warp shuffles; a shared-memory tree is enough for a 150k vector
once per token and runs unchanged in numba's simulator).
"""

from __future__ import annotations

import threading

import numpy as np
from numba import cuda, float32, int32
from numba.cuda.cudadrv import devicearray

from kernels.errors import KernelConstraintError
from kernels.jit import kernel

DEFAULT_TPB = 256
TPB_VALUES = (32, 64, 128, 256, 512, 1024)
ITEMS = 4
"""Elements per thread the automatic block count aims at (152064 logits: 149 blocks of 256 threads)."""
MAX_BLOCKS = 1024
NONE = 0x7FFFFFFF  # index sentinel: "no candidate yet" (loses every tie; becomes -1 in the output)
NEG_INF = float32(-np.inf)


def _make(tpb: int):
    @cuda.jit(device=True, inline="always")
    def better(v, i, w, j):
        return v > w or (v == w and i < j)

    @cuda.jit(device=True, inline="always")
    def tree(sv, si, t):
        """Reduce the block's tpb (value, index) pairs in shared memory to pair 0; every thread calls it."""
        cuda.syncthreads()
        half = tpb // 2
        while half > 0:
            if t < half and better(sv[t + half], si[t + half], sv[t], si[t]):
                sv[t] = sv[t + half]
                si[t] = si[t + half]
            cuda.syncthreads()
            half //= 2

    def partial(x, n, part_val, part_idx):
        t = cuda.threadIdx.x
        b = cuda.blockIdx.x
        sv = cuda.shared.array(tpb, float32)
        si = cuda.shared.array(tpb, int32)
        bv = NEG_INF
        bi = int32(NONE)
        i = b * tpb + t
        step = cuda.gridDim.x * tpb
        while i < n:
            v = x[i]
            if better(v, i, bv, bi):
                bv = v
                bi = i
            i += step
        sv[t] = bv
        si[t] = bi
        tree(sv, si, t)
        if t == 0:
            part_val[b] = sv[0]
            part_idx[b] = si[0]

    def final(part_val, part_idx, parts, out):
        t = cuda.threadIdx.x
        sv = cuda.shared.array(tpb, float32)
        si = cuda.shared.array(tpb, int32)
        bv = NEG_INF
        bi = int32(NONE)
        p = t
        while p < parts:
            if better(part_val[p], part_idx[p], bv, bi):
                bv = part_val[p]
                bi = part_idx[p]
            p += tpb
        sv[t] = bv
        si[t] = bi
        tree(sv, si, t)
        if t == 0:
            out[0] = -1 if si[0] == NONE else si[0]

    return kernel(partial), kernel(final)


_BUILT: dict = {}
_LOCK = threading.Lock()


def build(tpb: int = DEFAULT_TPB):
    """(partial, final) dispatchers for ``tpb`` threads per block (compiled on first launch; cached)."""
    if tpb not in TPB_VALUES:
        raise KernelConstraintError(f"tpb={tpb!r} is not supported; allowed: {', '.join(map(str, TPB_VALUES))}")
    with _LOCK:
        if tpb not in _BUILT:
            _BUILT[tpb] = _make(tpb)
        return _BUILT[tpb]


def default_blocks(n: int, tpb: int = DEFAULT_TPB) -> int:
    """Blocks of the first pass for ``n`` elements: about ITEMS elements per thread, at most MAX_BLOCKS."""
    return max(1, min(MAX_BLOCKS, -(-int(n) // (tpb * ITEMS))))


def argmax_workspace(blocks: int, stream=0):
    """(values f32 [blocks], indices int32 [blocks]) for `argmax`'s ``workspace``: allocate once, outside any capture."""
    return (cuda.device_array(blocks, dtype=np.float32, stream=stream),
            cuda.device_array(blocks, dtype=np.int32, stream=stream))


def argmax(x, out=None, *, blocks=None, tpb: int = DEFAULT_TPB, workspace=None, stream=0):
    """Enqueue ``out[0] = argmax(x)`` on ``stream`` and return ``out``.

    x: 1-D C-contiguous float32 device array of n >= 1 elements (e.g. the logits). out: optional int32 device
    array of >= 1 elements, C-contiguous (allocated, [1], when None); only element 0 is written. Ties go to the
    lowest index; NaN is skipped; no non-NaN element gives -1 (module docstring). blocks: first-pass blocks,
    1..MAX_BLOCKS (default `default_blocks`). tpb: threads per block, one of TPB_VALUES. workspace: from
    `argmax_workspace(b)` with b >= blocks; allocated per call when None (then not graph-capture safe).

    Raises KernelConstraintError (a ValueError) with one sentence for: a non-device or empty x, a wrong dtype,
    rank or layout, an out that is not an int32 device array, a bad tpb or blocks, a too-small workspace.
    """
    if not devicearray.is_cuda_ndarray(x):
        raise KernelConstraintError(f"x must be a CUDA device array, got {type(x).__name__}")
    if x.dtype != np.float32 or x.ndim != 1 or not x.is_c_contiguous() or x.size < 1:
        raise KernelConstraintError(f"x must be a non-empty 1-D C-contiguous float32 array, got {x.dtype} {tuple(x.shape)}")
    partial, final = build(tpb)
    n = int(x.size)
    if blocks is None:
        blocks = default_blocks(n, tpb)
    if isinstance(blocks, bool) or not isinstance(blocks, (int, np.integer)) or not 1 <= blocks <= MAX_BLOCKS:
        raise KernelConstraintError(f"blocks={blocks!r} must be an integer from 1 to {MAX_BLOCKS}")
    if out is None:
        out = cuda.device_array(1, dtype=np.int32, stream=stream)
    elif (not devicearray.is_cuda_ndarray(out) or out.dtype != np.int32 or out.ndim != 1 or out.size < 1
          or not out.is_c_contiguous()):
        raise KernelConstraintError("out must be a C-contiguous 1-D int32 device array of at least one element")
    values, indices = workspace if workspace is not None else argmax_workspace(blocks, stream)
    if values.size < blocks or indices.size < blocks or values.dtype != np.float32 or indices.dtype != np.int32:
        raise KernelConstraintError(f"workspace must be (float32, int32) arrays of at least blocks={blocks} elements")
    partial[blocks, tpb, stream](x, n, values, indices)
    final[1, tpb, stream](values, indices, int(blocks), out)
    return out
