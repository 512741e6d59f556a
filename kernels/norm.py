"""RMSNorm over the rows of the f32 residual stream: ``y[t, :] = x[t, :] / sqrt(mean(x[t, :]^2) + eps) * w``.

One CUDA block per row. Each thread accumulates the squares of columns ``tid, tid + tpb, ...`` in f32 (coalesced
4-byte loads, four columns' loads issued per loop iteration into four partial sums), the block sums the partial
sums with a warp butterfly (`shfl.sync.bfly`) then a second butterfly over the per-warp sums held in shared
memory (every warp reduces them, so no broadcast barrier is needed), and each thread writes its columns
``(x * inv_rms) * w`` as f16 (prefill: feeds the f16-A GEMM) or f32 (decode: the mat-vec takes f32 x). The second
pass re-reads the row, which is still in L1/L2 (a 3584-wide row is 14 KiB).
`add_rms_norm` first adds a GEMM's output (or its split-K slices) to the residual row (prefill FUSE_ADD_NORM: the
residual add, the slice sum and the next RMSNorm in one launch, not three). `rms_norm_q8` (decode
FUSE_NORM_SPLIT) also quantizes its output to Q8_1 blocks for the MMVQ mat-vecs, spread over several CUDA blocks a
row that each recompute the row's scale, so no block runs the whole quantization alone.

Arithmetic follows llama.cpp's ``rms_norm_f32`` (sum of squares in f32, ``mean + eps``, one scale per row) and
HF's ``Qwen2RMSNorm`` / ``LlamaRMSNorm`` (scale in f32, then times the weight); ``1/sqrt`` is the correctly
rounded division of a correctly rounded sqrt, not ``rsqrt.approx``.

Source: Zhang & Sennrich 2019, "Root Mean Square Layer Normalization" (arXiv:1910.07467); llama.cpp
``ggml/src/ggml-cuda/norm.cu`` (``rms_norm_f32``).
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32
from numba.cuda.cudadrv import devicearray

from kernels.errors import KernelConstraintError
from kernels.launch import launch_kernel
from kernels.ptx import SIMULATOR, pdl_enter
from kernels.jit import kernel
from kernels.quantize_q8 import QK, check_q8, quantize_warp_block, store_residual

DEFAULT_TPB = 256
"""Threads per block (one block per row) for many rows (prefill): 14 columns per thread at hidden 3584."""


def row_tpb(d: int) -> int:
    """Threads per block for a launch of a few rows (decode: one): enough that each thread has at most 4 columns
    (one iteration of the four-loads-in-flight loops), a multiple of 32, at most 1024. At d = 3584: 896. With
    `DEFAULT_TPB` a one-row norm took 10.2 µs on the H200 (14 dependent load rounds per pass; 57 per tg step)."""
    return min(1024, max(32, (d + 127) // 128 * 32))

WIDE_ROWS = 256
"""Below this many rows, a launch of one block a row leaves most of an H200's 132 SMs with one or no block: each row
then gets `row_tpb` threads (the prefill's PNORM_WIDE)."""


def rows_tpb(nt: int, d: int) -> int:
    """Threads per block for an RMSNorm of ``nt`` rows of ``d`` (one block a row): `row_tpb` below `WIDE_ROWS`
    rows, else `DEFAULT_TPB`."""
    return row_tpb(d) if nt < WIDE_ROWS else DEFAULT_TPB

OUT_DTYPES = (np.float16, np.float32)
MAX_GRID_Y = 65535
"""CUDA's limit on a grid's y dimension (`rms_norm_q8` puts the rows there)."""
FULL_MASK = 0xFFFFFFFF

if SIMULATOR:
    from kernels.ptx import _warp_exchange

    def _butterfly_sum(slots):
        v = [np.float32(s) for s in slots]
        for off in (16, 8, 4, 2, 1):
            v = [np.float32(v[lane] + v[lane ^ off]) for lane in range(32)]
        return v

    def warp_allreduce_sum(v):
        """Simulator form of the 5-step `shfl.sync.bfly` butterfly: the same f32 additions in the same order, so
        every lane gets the bit-identical warp sum. All 32 lanes must call it at the same point."""
        return _warp_exchange(_butterfly_sum, np.float32(v))

else:

    @cuda.jit(device=True, inline="always")
    def warp_allreduce_sum(v):
        """Sum of ``v`` (f32) over the 32 lanes of the warp, returned to every lane: `shfl.sync.bfly.b32` with
        offsets 16, 8, 4, 2, 1 (PTX ISA §9.7.9.6 "shfl.sync"). All 32 lanes must be active."""
        for off in (16, 8, 4, 2, 1):
            v += cuda.shfl_xor_sync(FULL_MASK, v, off)
        return v


@cuda.jit(device=True, inline="always")
def block_allreduce_sum(v, partial):
    """Sum of ``v`` (f32) over the whole block, returned to every thread. ``partial``: a 32-element f32 shared
    array. The block's thread count must be a multiple of 32 (at most 1024); every thread must call this once.
    ``partial`` may be reused only after another `syncthreads`."""
    lane = cuda.threadIdx.x & 31
    warp = cuda.threadIdx.x >> 5
    v = warp_allreduce_sum(v)
    if lane == 0:
        partial[warp] = v
    cuda.syncthreads()
    w = float32(0.0)
    if lane < (cuda.blockDim.x >> 5):
        w = partial[lane]
    return warp_allreduce_sum(w)


@cuda.jit(device=True, inline="always")
def _inv_rms(x, row, eps):
    """``1 / sqrt(mean(x[row, :]^2) + eps)`` (f32), computed by the calling block and returned to every thread."""
    tid = cuda.threadIdx.x
    step = cuda.blockDim.x
    d = x.shape[1]
    partial = cuda.shared.array(32, float32)
    a0 = float32(0.0)
    a1 = float32(0.0)
    a2 = float32(0.0)
    a3 = float32(0.0)
    c = tid
    while c + 3 * step < d:  # four columns' loads in flight per iteration
        v0 = x[row, c]
        v1 = x[row, c + step]
        v2 = x[row, c + 2 * step]
        v3 = x[row, c + 3 * step]
        a0 += v0 * v0
        a1 += v1 * v1
        a2 += v2 * v2
        a3 += v3 * v3
        c += 4 * step
    while c < d:
        v0 = x[row, c]
        a0 += v0 * v0
        c += step
    total = block_allreduce_sum((a0 + a1) + (a2 + a3), partial)
    return float32(1.0) / math.sqrt(total / float32(d) + eps)


@kernel
def _rms_norm(x, w, out, eps):
    """Row ``blockIdx.x`` of x (f32 [nt, d]) -> out (f16 or f32 [nt, d]); w f32 [d]; eps f32."""
    pdl_enter()
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    step = cuda.blockDim.x
    d = x.shape[1]
    inv = _inv_rms(x, row, eps)
    c = tid
    while c + 3 * step < d:
        v0 = x[row, c]
        v1 = x[row, c + step]
        v2 = x[row, c + 2 * step]
        v3 = x[row, c + 3 * step]
        out[row, c] = (v0 * inv) * w[c]
        out[row, c + step] = (v1 * inv) * w[c + step]
        out[row, c + 2 * step] = (v2 * inv) * w[c + 2 * step]
        out[row, c + 3 * step] = (v3 * inv) * w[c + 3 * step]
        c += 4 * step
    while c < d:
        out[row, c] = (x[row, c] * inv) * w[c]
        c += step


@kernel
def _add_rms_norm(x, parts, count, w, out, eps):
    """x[row, :] += the sum of ``count`` slices of parts (f32, flat [count * nt * d], slice s of row r at
    ``s * nt * d + r * d``; added in slice order, then to x), then `_rms_norm` of the updated row into out."""
    pdl_enter()
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    step = cuda.blockDim.x
    d = x.shape[1]
    n = x.shape[0] * d
    c = tid
    while c < d:
        i = row * d + c
        v = parts[i]
        s = 1
        while s + 3 < count:  # four slices' loads in flight, added in slice order
            p0 = parts[s * n + i]
            p1 = parts[(s + 1) * n + i]
            p2 = parts[(s + 2) * n + i]
            p3 = parts[(s + 3) * n + i]
            v = (((v + p0) + p1) + p2) + p3
            s += 4
        while s < count:
            v += parts[s * n + i]
            s += 1
        x[row, c] = x[row, c] + v
        c += step
    cuda.syncthreads()  # the row's new values, written by this block, before the sum of squares reads them
    inv = _inv_rms(x, row, eps)
    c = tid
    while c < d:
        out[row, c] = (x[row, c] * inv) * w[c]
        c += step


@kernel
def _rms_norm_q8(x, w, out, q, qd, qs, eps):
    """Columns ``blockIdx.x * blockDim.x ..`` of row ``blockIdx.y`` of x (f32 [nt, d], d a multiple of 32): every
    block computes the whole row's scale (`_inv_rms`: the same operations as `_rms_norm` at the same blockDim),
    then each thread writes one column of out (f32) and its warp quantizes those 32 columns (one Q8_1 block)."""
    pdl_enter()
    row = cuda.blockIdx.y
    d = x.shape[1]
    inv = _inv_rms(x, row, eps)
    c = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if c - (cuda.threadIdx.x & 31) >= d:  # the whole warp is past the row's end (d % 32 == 0): it exits together
        return
    v = (x[row, c] * inv) * w[c]
    out[row, c] = v
    quantize_warp_block(v, row * d + c, q, qd, qs)


@kernel
def _rms_norm_q8_res(x, w, out, q, qd, qs, r, eps):
    """`_rms_norm_q8` that also writes the compensated Q8_1 form's residual values r (`kernels.quantize_q8`)."""
    pdl_enter()
    row = cuda.blockIdx.y
    d = x.shape[1]
    inv = _inv_rms(x, row, eps)
    c = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if c - (cuda.threadIdx.x & 31) >= d:
        return
    v = (x[row, c] * inv) * w[c]
    out[row, c] = v
    scaled, qv = quantize_warp_block(v, row * d + c, q, qd, qs)
    store_residual(scaled, qv, row * d + c, r)


def _device(a, name: str):
    if not devicearray.is_cuda_ndarray(a):
        raise KernelConstraintError(f"{name} must be a CUDA device array, got {type(a).__name__}")
    return a


def add_rms_norm(x, parts, count: int, w, eps: float, out, stream=0, tpb: int = DEFAULT_TPB):
    """Enqueue ``x += y`` then ``out = rms_norm(x) * w`` on ``stream``, one CUDA block per row; return ``out``.

    y is the sum of ``count`` slices of ``parts`` (a flat f32 device array holding ``count`` row-major [nt, d]
    slices back to back: `kernels.gemm_f16.gemm_f16_split`'s output, a GEMM's C or its split-K partials), added in
    slice order and then to x: the same bits as `kernels.gemm_f16`'s slice sum, `kernels.residual.residual_add` and
    `rms_norm` run one after another. x: f32 [nt, d], C-contiguous, updated in place (the residual stream). w, eps,
    out (f16 or f32 [nt, d]), tpb: as `rms_norm`.

    Raises KernelConstraintError for what `rms_norm` refuses, a count below 1, or parts that are not a flat f32
    device array of at least count * nt * d elements.
    """
    rms_norm(x, w, eps, out=out, tpb=tpb, launch=False)  # the shared checks
    nt, d = x.shape
    parts = _device(parts, "parts")
    if int(count) < 1:
        raise KernelConstraintError(f"count must be at least 1 (the slices in parts), got {count}")
    if parts.dtype != np.float32 or parts.ndim != 1 or parts.shape[0] < count * nt * d:
        raise KernelConstraintError(
            f"parts must be a flat float32 array of at least {count} x {nt} x {d} elements, got {parts.dtype} "
            f"{tuple(parts.shape)}")
    if nt:
        _add_rms_norm[nt, tpb, stream](x, parts, np.int64(count), w, out, np.float32(eps))
    return out


def rms_norm(x, w, eps: float, out=None, out_dtype=None, stream=0, tpb: int = DEFAULT_TPB, launch: bool = True,
             pdl: bool = False):
    """Enqueue ``out[t, :] = x[t, :] / sqrt(mean(x[t, :]^2) + eps) * w`` on ``stream`` and return ``out``.

    x: f32 device array ``[nt, d]``, C-contiguous (nt >= 0, d >= 1, any d). w: f32 device array ``[d]``,
    contiguous. eps: the model's ``rms_norm_eps`` (1e-6 for Qwen2, 1e-5 for Llama), used as f32.
    out: optional C-contiguous device array ``[nt, d]`` of f16 or f32; allocated when None with ``out_dtype``
    (default f16: prefill feeds the f16-A GEMM; pass f32 for the decode mat-vec, which takes f32 x).
    tpb: threads per block, a multiple of 32 from 32 to 1024 (one block per row). launch: False only checks the
    arguments (and allocates out) without enqueuing anything (`add_rms_norm` shares the checks). pdl: a
    programmatic dependent launch (`kernels.launch`; the kernel waits for the previous one first: `pdl_enter`).

    Sum of squares and scale in f32; error against a float64 reference: f16 rounding (~2^-11) for f16 out,
    ~1e-7 for f32 out. Source: Zhang & Sennrich 2019; llama.cpp ``rms_norm_f32``.

    Raises KernelConstraintError (a ValueError) for: a non-device array, a wrong dtype or rank, w not ``[d]``,
    a non-contiguous x/w/out, an out of the wrong shape or a dtype other than f16/f32 (or one that disagrees
    with ``out_dtype``), a non-positive or non-finite eps, or a tpb outside 32..1024 / not a multiple of 32.
    """
    x, w = _device(x, "x"), _device(w, "w")
    if x.dtype != np.float32 or x.ndim != 2:
        raise KernelConstraintError(f"x must be a 2-D float32 [nt, d] array, got {x.dtype} with ndim {x.ndim}")
    nt, d = x.shape
    if d < 1:
        raise KernelConstraintError("x must have at least one column (d >= 1)")
    if w.dtype != np.float32 or tuple(w.shape) != (d,):
        raise KernelConstraintError(f"w must be a float32 array of shape ({d},), got {w.dtype} {tuple(w.shape)}")
    if not x.is_c_contiguous() or not w.is_c_contiguous():
        raise KernelConstraintError("x and w must be C-contiguous (row-major [nt, d] and [d])")
    if not (isinstance(eps, (int, float, np.floating)) and math.isfinite(eps) and eps > 0):
        raise KernelConstraintError(f"eps must be a positive finite number, got {eps!r}")
    if tpb % 32 or not 32 <= tpb <= 1024:
        raise KernelConstraintError(f"tpb={tpb} must be a multiple of 32 between 32 and 1024")
    if out_dtype is not None and np.dtype(out_dtype) not in OUT_DTYPES:
        raise KernelConstraintError(f"out_dtype must be float16 or float32, got {np.dtype(out_dtype)}")
    if out is None:
        out = cuda.device_array((nt, d), dtype=np.dtype(out_dtype or np.float16), stream=stream)
    else:
        out = _device(out, "out")
        if out.dtype not in OUT_DTYPES or tuple(out.shape) != (nt, d) or not out.is_c_contiguous():
            raise KernelConstraintError(
                f"out must be a C-contiguous float16 or float32 array of shape ({nt}, {d}), got {out.dtype} "
                f"{tuple(out.shape)} contiguous={out.is_c_contiguous()}"
            )
        if out_dtype is not None and out.dtype != np.dtype(out_dtype):
            raise KernelConstraintError(f"out is {out.dtype} but out_dtype={np.dtype(out_dtype)}; give one or agree")
    if nt and launch:
        launch_kernel(_rms_norm, nt, tpb, stream, (x, w, out, np.float32(eps)), pdl=pdl)
    return out


def rms_norm_q8(x, w, eps: float, out, q8, stream=0, tpb: int = DEFAULT_TPB, pdl: bool = False):
    """Enqueue `rms_norm` with f32 ``out`` and, in the same launch, the Q8_1 quantization of ``out`` into ``q8``
    (`kernels.quantize_q8`: int8 values, d and sum per 32 columns, row-major over the rows); return ``out``.

    The launch has ``ceil(d / tpb)`` CUDA blocks of ``tpb`` threads a row: each computes the row's scale over all
    d columns (the same operations in the same order as `rms_norm` with this tpb), then writes and quantizes its
    tpb columns, a warp a Q8_1 block. Both results are bit-identical to `rms_norm` (same tpb) followed by
    `kernels.quantize_q8.quantize_q8_1`, in one launch instead of two, and the quantization is spread over the
    blocks instead of left to the one block a row of `rms_norm` (decode: the norm's output feeds MMVQ mat-vecs).

    x, w, eps, tpb: as for `rms_norm`, with ``d`` a multiple of 32 and at most 65535 rows (the grid's y). out:
    C-contiguous f32 ``[nt, d]``, not x itself (a row's blocks read all of x while others write). q8: `Q8Blocks` of
    ``nt * d`` activations (compensated ones get their residual values too). pdl: as for `rms_norm`.
    Raises KernelConstraintError for everything `rms_norm` refuses, ``d`` not a multiple of 32, more than 65535
    rows, out not f32 or the same array as x, or q8 not `Q8Blocks` of ``nt * d`` activations
    (`kernels.quantize_q8.check_q8`; not checked when nt = 0, where nothing is written).
    """
    from kernels.quant.dequant import _address  # a device array's address (the simulator's too)

    if out is None or _device(out, "out").dtype != np.float32:
        raise KernelConstraintError("rms_norm_q8 needs an f32 out array (the quantized values come from it)")
    out = rms_norm(x, w, eps, out=out, stream=stream, tpb=tpb, launch=False)
    nt, d = x.shape
    if d % QK:
        raise KernelConstraintError(f"rms_norm_q8 needs d to be a multiple of {QK} (whole Q8_1 blocks), got {d}")
    if nt > MAX_GRID_Y:
        raise KernelConstraintError(f"rms_norm_q8 takes at most {MAX_GRID_Y} rows (one grid row each), got {nt}")
    if out is x or (nt and _address(out) == _address(x)):
        raise KernelConstraintError("rms_norm_q8 cannot write out over x: the other blocks of a row still read it")
    if nt == 0:
        return out
    check_q8(q8, nt * d)
    grid = ((d + tpb - 1) // tpb, nt)
    if q8.compensated:
        launch_kernel(_rms_norm_q8_res, grid, tpb, stream, (x, w, out, q8.q, q8.d, q8.s, q8.r, np.float32(eps)),
                      pdl=pdl)
    else:
        launch_kernel(_rms_norm_q8, grid, tpb, stream, (x, w, out, q8.q, q8.d, q8.s, np.float32(eps)), pdl=pdl)
    return out
