"""SwiGLU, the gated activation of the Qwen2/Llama MLP: ``out = silu(gate) * up``, ``silu(g) = g / (1 + exp(-g))``.

gate and up are f32 ``[nt, ffn]`` (the gate and up GEMM outputs), given either as two arrays or as one fused
``[nt, 2*ffn]`` array whose FIRST half of each row is gate and second half up (the order of a stacked
``[gate_proj; up_proj]`` weight, as vLLM's ``gate_up_proj``). out is f16 ``[nt, ffn]`` (prefill: feeds the
f16-A down GEMM) or f32 (decode: the mat-vec takes f32 x).

A 1-D grid of ``nt * ceil(ffn / tpb)`` blocks; block b does row ``b // ceil(ffn/tpb)``, one column per thread:
coalesced 4-byte loads of gate and up, 2- or 4-byte stores. ``exp`` is numba's f32 ``math.exp``; f32's exp overflows
to inf past 88.72, so silu(g) is -0 for g below -88.72, the float32 result of the same expression. `silu_mul`'s cap
on exp's argument (`SILU_EXP_CAP`) changes no GPU result; it keeps the CUDA simulator, whose ``math.exp`` is
float64 and raises OverflowError past 709.78, on that same -0.

Source: Shazeer 2020, "GLU Variants Improve Transformer" (arXiv:2002.05202); llama.cpp ``ggml_swiglu`` /
``unary.cu`` (``silu``: ``x / (1 + expf(-x))``).
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32
from numba.cuda.cudadrv import devicearray

from kernels.errors import KernelConstraintError
from kernels.views import column_slice
from kernels.jit import kernel
from kernels.ptx import div_approx_f32

DEFAULT_TPB = 256
OUT_DTYPES = (np.float16, np.float32)
SILU_EXP_CAP = 100.0  # above f32's exp range (88.72): exp(min(-g, cap)) is inf for every g < -88.72, as uncapped


@cuda.jit(device=True, inline="always")
def silu_mul(g, u):
    """``silu(g) * u = g / (1 + exp(-g)) * u`` for f32 scalars g, u: the one SwiGLU expression of every kernel (this
    file's and the fused mat-vec's `kernels.gemv.gemv_glu`), so fused and unfused decode agree bit for bit.
    -0 for g < -88.72 (f32's exp is inf there); exp's argument is capped at `SILU_EXP_CAP` so that the simulator's
    float64 ``math.exp`` gives the same inf instead of raising OverflowError."""
    return g / (float32(1.0) + math.exp(min(-g, float32(SILU_EXP_CAP)))) * u


@cuda.jit(device=True, inline="always")
def silu_mul_approx(g, u):
    """`silu_mul` with its division as `div.approx.f32` (~2 ulp; 0 where 1 + exp(-g) passes 2^126, i.e. g < -87.3,
    where silu is below 1e-36): no IEEE division, whose subroutine call would make ptxas serialize the wgmma of a
    kernel it is inlined in (gemm_f16_glu with NOCALL=1)."""
    return div_approx_f32(g, float32(1.0) + math.exp(min(-g, float32(SILU_EXP_CAP)))) * u


@kernel
def _swiglu(gate, up, out, col_blocks):
    """out[r, c] = silu(gate[r, c]) * up[r, c]; gate/up f32 [nt, ffn] (any row stride), out f16/f32 [nt, ffn]."""
    b = cuda.blockIdx.x
    row = b // col_blocks
    col = (b - row * col_blocks) * cuda.blockDim.x + cuda.threadIdx.x
    if col < out.shape[1]:
        out[row, col] = silu_mul(gate[row, col], up[row, col])


def _device(a, name: str):
    if not devicearray.is_cuda_ndarray(a):
        raise KernelConstraintError(f"{name} must be a CUDA device array, got {type(a).__name__}")
    if a.dtype != np.float32 or a.ndim != 2:
        raise KernelConstraintError(f"{name} must be a 2-D float32 array, got {a.dtype} with ndim {a.ndim}")
    if not a.is_c_contiguous():
        raise KernelConstraintError(f"{name} must be C-contiguous (row-major)")
    return a


def swiglu(gate, up=None, out=None, out_dtype=None, stream=0, tpb: int = DEFAULT_TPB):
    """Enqueue ``out = silu(gate) * up`` on ``stream`` and return ``out``.

    gate, up: f32 C-contiguous device arrays ``[nt, ffn]``; or ``up=None`` and gate the fused f32 ``[nt, 2*ffn]``
    array, gate = columns ``[0, ffn)``, up = columns ``[ffn, 2*ffn)`` of each row. Any nt >= 0, any ffn >= 1.
    out: optional C-contiguous ``[nt, ffn]`` device array, f16 or f32; allocated when None with ``out_dtype``
    (default f16, for the down GEMM; f32 for the decode mat-vec). tpb: threads per block, a multiple of 32 from
    32 to 1024.

    f32 arithmetic; error against a float64 reference ~1e-7 relative before the output rounding (f16: ~2^-11).
    Source: Shazeer 2020 (SwiGLU); llama.cpp ``ggml_swiglu``.

    Raises KernelConstraintError (a ValueError) for: a non-device array, a dtype other than f32 / rank other
    than 2 for gate/up, a non-contiguous input, gate and up of different shapes, a fused gate with an odd number
    of columns, an out of the wrong shape, dtype or layout (or disagreeing with ``out_dtype``), or a bad tpb.
    """
    gate = _device(gate, "gate")
    if up is None:
        nt, two_ffn = gate.shape
        if two_ffn % 2 or two_ffn == 0:
            raise KernelConstraintError(
                f"a fused gate|up array needs an even, positive number of columns (2*ffn), got {two_ffn}"
            )
        ffn = two_ffn // 2
        gate, up = column_slice(gate, 0, ffn), column_slice(gate, ffn, 2 * ffn)
    else:
        up = _device(up, "up")
        if tuple(up.shape) != tuple(gate.shape):
            raise KernelConstraintError(f"gate {tuple(gate.shape)} and up {tuple(up.shape)} must have the same shape")
        nt, ffn = gate.shape
        if ffn == 0:
            raise KernelConstraintError("gate and up must have at least one column (ffn >= 1)")
    if tpb % 32 or not 32 <= tpb <= 1024:
        raise KernelConstraintError(f"tpb={tpb} must be a multiple of 32 between 32 and 1024")
    if out_dtype is not None and np.dtype(out_dtype) not in OUT_DTYPES:
        raise KernelConstraintError(f"out_dtype must be float16 or float32, got {np.dtype(out_dtype)}")
    if out is None:
        out = cuda.device_array((nt, ffn), dtype=np.dtype(out_dtype or np.float16), stream=stream)
    else:
        if not devicearray.is_cuda_ndarray(out):
            raise KernelConstraintError(f"out must be a CUDA device array, got {type(out).__name__}")
        if out.dtype not in OUT_DTYPES or tuple(out.shape) != (nt, ffn) or not out.is_c_contiguous():
            raise KernelConstraintError(
                f"out must be a C-contiguous float16 or float32 array of shape ({nt}, {ffn}), got {out.dtype} "
                f"{tuple(out.shape)} contiguous={out.is_c_contiguous()}"
            )
        if out_dtype is not None and out.dtype != np.dtype(out_dtype):
            raise KernelConstraintError(f"out is {out.dtype} but out_dtype={np.dtype(out_dtype)}; give one or agree")
    if nt:
        col_blocks = (ffn + tpb - 1) // tpb
        _swiglu[nt * col_blocks, tpb, stream](gate, up, out, col_blocks)
    return out
