"""Activation quantization for the MMVQ mat-vec: f32 ``x[id]`` -> Q8_1 blocks of 32 (int8 values, f32 scale, f32 sum).

Per 32-element block b (llama.cpp ggml-cuda/quantize.cu ``quantize_q8_1``; the Q8_1 block of ggml-common.h):

    d[b]  = max_k |x[32b + k]| / 127                     (float32)
    q[k]  = roundf(x[32b + k] * (1 / d[b]))  as int8     (0 when d[b] = 0; roundf = half away from zero)
    s[b]  = Σ_k x[32b + k]                               (float32, the block's sum of the *unquantized* x)

so ``x[32b + k] ≈ d[b] * q[k]`` and a block format with a min term (Q4_K's ``- dmin*m``) uses the exact sum.

Compensated form (``Q8Blocks.r``, the MMVQ kernels' XRES=1): a second int8 value per element holds what the first
rounding left, at a scale 254 times finer (error-compensated quantization, x ≈ d₁q₁ + d₂q₂ with d₂ = d₁/254):

    r[k]  = roundf((x[32b + k] * (1 / d[b]) - q[k]) * 254)    (|x/d - q| <= 1/2, so |r| <= 127)

so ``x[32b + k] ≈ d[b] * (q[k] + r[k] / 254)`` with an error at most ``d[b] / 508`` instead of ``d[b] / 2``; a dot
product takes ``(d / 254) * (254 * Σ w·q + Σ w·r)``, two dp4a chains sharing one weight decode and one scale.
The value rounding is gguf-py's ``quants.Q8_0`` quantizer step for step (``d = amax / 127``, ``id = 1 / d``,
``np_roundf(x * id)``), so the int8 values equal ``gguf.quants.quantize(x, Q8_0)``'s bit for bit; unlike that
format (and llama.cpp's half2 ``ds``) d and s stay float32. Layout: three separate device arrays (`Q8Blocks`):
int8 ``q[id]`` (read by the mat-vec as uint32 words, 16-byte aligned), float32 ``d[id/32]`` and ``s[id/32]``,
and in the compensated form int8 ``r[id]`` laid out as ``q``.

One thread per element, one warp per block: the block's |x| maximum and sum are xor-butterfly reductions
(`kernels.ptx.shfl_xor_f32`, 5 steps each).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numba import cuda
from numba.cuda.cudadrv import devicearray

from kernels.errors import KernelConstraintError
from kernels.launch import launch_kernel
from kernels.ptx import pdl_enter, shfl_xor_f32
from kernels.jit import kernel

QK = 32
"""Elements per Q8_1 block (ggml-common.h ``QK8_1``)."""
THREADS = 256
F127 = np.float32(127.0)
RES_SCALE = 254
"""The compensated form's second scale is ``d / RES_SCALE``: the first rounding leaves at most d/2, which 254 steps
of d/254 cover with int8 values within ±127."""
F254 = np.float32(RES_SCALE)
ONE = np.float32(1.0)
ZERO = np.float32(0.0)


@dataclass(frozen=True)
class Q8Blocks:
    """x quantized to Q8_1 blocks on the device: ``q`` int8 [n], ``d`` float32 [n/32], ``s`` float32 [n/32], and
    in the compensated form ``r`` int8 [n] (the residual of the first rounding in steps of d/254; None without)."""

    q: object
    d: object
    s: object
    r: object = None

    @property
    def compensated(self) -> bool:
        """True when the blocks carry the residual values ``r`` (the MMVQ kernels' XRES=1)."""
        return self.r is not None

    @property
    def size(self) -> int:
        return int(self.q.size)


def q8_blocks(n: int, stream=0, compensated: bool = False) -> Q8Blocks:
    """Allocate (uninitialised) device buffers for ``n`` quantized activations (``n`` a multiple of 32), with the
    residual values ``r`` when ``compensated``.

    Raises KernelConstraintError when ``n`` is not a positive integer multiple of 32."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n <= 0 or n % QK:
        raise KernelConstraintError(f"Q8_1 activations need a positive integer multiple of {QK} elements, got {n!r}")
    nb = n // QK
    return Q8Blocks(
        q=cuda.device_array(n, dtype=np.int8, stream=stream),
        d=cuda.device_array(nb, dtype=np.float32, stream=stream),
        s=cuda.device_array(nb, dtype=np.float32, stream=stream),
        r=cuda.device_array(n, dtype=np.int8, stream=stream) if compensated else None,
    )


@cuda.jit(device=True, inline="always")
def _roundf(v):
    """gguf-py ``np_roundf``: round half away from zero, as ``sign(v) * (floor|v| + floor(2(|v| - floor|v|)))``."""
    a = abs(v)
    f = np.float32(math.floor(a))
    r = f + np.float32(math.floor(np.float32(2.0) * (a - f)))
    return -r if v < ZERO else r


@cuda.jit(device=True, inline="always")
def quantize_warp_block(v, i, q, d, s):
    """The calling warp quantizes one 32-element block: lane l holds element ``i`` = 32b + l (value ``v``, f32)
    and writes ``q[i]``; lane 0 writes ``d[b]`` and ``s[b]``. All 32 lanes must call it together (shuffles).
    Returns (v / d, q[i]) as f32 (both 0 when the block is all zeros), what `store_residual` needs."""
    m = abs(v)
    t = v
    for lane_mask in (16, 8, 4, 2, 1):
        m = max(m, shfl_xor_f32(m, lane_mask))
        t += shfl_xor_f32(t, lane_mask)
    dd = m / F127
    inv = ONE / dd if dd != ZERO else ZERO
    scaled = v * inv
    qv = _roundf(scaled)
    q[i] = np.int8(qv)
    if (i & 31) == 0:
        b = i // QK
        d[b] = dd
        s[b] = t
    return scaled, qv


@cuda.jit(device=True, inline="always")
def store_residual(scaled, qv, i, r):
    """The compensated form's second value: ``r[i] = roundf((scaled - qv) * 254)`` from `quantize_warp_block`'s
    return (``|scaled - qv| <= 1/2``, so ``|r| <= 127``)."""
    r[i] = np.int8(_roundf((scaled - qv) * F254))


@kernel
def _quantize_q8_1(x, q, d, s, n):
    """x f32 [n] -> q int8 [n], d f32 [n/32], s f32 [n/32]; n a multiple of 32, so warps are whole blocks."""
    pdl_enter()
    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if i - (cuda.threadIdx.x & 31) >= n:  # the whole warp is past the end: it exits together
        return
    quantize_warp_block(x[i], i, q, d, s)


@kernel
def _quantize_q8_1_res(x, q, d, s, r, n):
    """`_quantize_q8_1` that also writes the compensated form's residual values r int8 [n]."""
    pdl_enter()
    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if i - (cuda.threadIdx.x & 31) >= n:
        return
    scaled, qv = quantize_warp_block(x[i], i, q, d, s)
    store_residual(scaled, qv, i, r)


def check_q8(q8, n: int, what: str = "q8") -> Q8Blocks:
    """``q8`` itself when it is a `Q8Blocks` of ``n`` activations whose arrays are 1-D C-contiguous device arrays
    of the right dtype and length (int8 [n], float32 [n/32] twice, and int8 [n] for ``r`` when present); else
    KernelConstraintError naming ``what`` and the expected form."""
    expected = f"{what} must be Q8Blocks of {n} activations (allocate it with q8_blocks({n}))"
    if not isinstance(q8, Q8Blocks):
        raise KernelConstraintError(f"{expected}, got {type(q8).__name__}")
    arrays = (("q", np.int8, n), ("d", np.float32, n // QK), ("s", np.float32, n // QK))
    for field, dtype, size in arrays + ((("r", np.int8, n),) if q8.compensated else ()):
        a = getattr(q8, field)
        if not devicearray.is_cuda_ndarray(a):
            raise KernelConstraintError(f"{expected}; its {field} is a {type(a).__name__}, not a device array")
        if a.dtype != np.dtype(dtype) or a.ndim != 1 or a.size != size or not a.is_c_contiguous():
            raise KernelConstraintError(
                f"{expected}; its {field} is {a.dtype} of shape {tuple(a.shape)}, expected a contiguous "
                f"{np.dtype(dtype)} array of {size}"
            )
    return q8


def quantize_q8_1(x, out: Q8Blocks, stream=0, pdl: bool = False) -> Q8Blocks:
    """Enqueue the Q8_1 quantization of ``x`` into ``out`` on ``stream``; return ``out``.

    x: 1-D C-contiguous float32 device array of n elements, n a positive multiple of 32.
    out: `Q8Blocks` of the same n (from `q8_blocks`); when it is compensated (``out.r``), the residual values are
    written too. pdl: a programmatic dependent launch (`kernels.launch`; the kernel waits for the previous one
    first: `kernels.ptx.pdl_enter`).
    Raises KernelConstraintError for x of the wrong dtype, rank or layout, n not a multiple of 32, or ``out`` not
    `Q8Blocks` of n activations (`check_q8`)."""
    if not devicearray.is_cuda_ndarray(x):
        raise KernelConstraintError(f"x must be a CUDA device array (float32, 1-D), got {type(x).__name__}")
    if x.dtype != np.float32 or x.ndim != 1 or not x.is_c_contiguous():
        raise KernelConstraintError(f"x must be a 1-D C-contiguous float32 device array, got {x.dtype} {tuple(x.shape)}")
    n = int(x.size)
    if n <= 0 or n % QK:
        raise KernelConstraintError(f"x has {n} elements; Q8_1 quantization needs a positive multiple of {QK}")
    check_q8(out, n, "out")
    grid = (n + THREADS - 1) // THREADS
    if out.compensated:
        launch_kernel(_quantize_q8_1_res, grid, THREADS, stream, (x, out.q, out.d, out.s, out.r, n), pdl=pdl)
    else:
        launch_kernel(_quantize_q8_1, grid, THREADS, stream, (x, out.q, out.d, out.s, n), pdl=pdl)
    return out
