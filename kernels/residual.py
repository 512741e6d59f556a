"""Residual and bias adds on f32 rows: ``out = x + y (+ bias)`` and ``out = y + bias``.

* `residual_add`: the residual stream update after attention and after the MLP, ``x += y`` (x the f32 residual
  stream ``[nt, d]``, y the f32 output of the o_proj / down GEMM), optionally plus a bias ``[d]`` (models with
  an o_proj or down bias; none of qwen2/llama has one).
* `bias_add`: ``y += bias`` over the rows of a GEMM output, for qwen2's q/k/v biases. Choice: one pass over the
  fused QKV output ``[nt, (nh + 2*nkv)*hd]`` with the concatenated bias ``[q_bias | k_bias | v_bias]``, before
  `kernels.rope.rope` runs on the q/k views of the same buffer. Folding the bias into the GEMM epilogue would save
  this pass (a read and a write of nt*4608*4 bytes at qwen2-7B); that belongs to the GEMM's file, not here.

Both default to in place (``out`` = x / y) and take an explicit ``out`` otherwise. A 1-D grid of
``nt * ceil(d / tpb)`` blocks, one column per thread, coalesced 4-byte accesses; the bias row is read through
L1/L2 (every row reuses it). f32 adds: exact to one rounding.
"""

from __future__ import annotations

import numpy as np
from numba import cuda
from numba.cuda.cudadrv import devicearray

from kernels.errors import KernelConstraintError
from kernels.jit import kernel

DEFAULT_TPB = 256


@kernel
def _add(x, y, out, col_blocks):
    """out[r, c] = x[r, c] + y[r, c]; all f32 [nt, d]."""
    b = cuda.blockIdx.x
    row = b // col_blocks
    col = (b - row * col_blocks) * cuda.blockDim.x + cuda.threadIdx.x
    if col < out.shape[1]:
        out[row, col] = x[row, col] + y[row, col]


@kernel
def _add_bias(x, y, bias, out, col_blocks):
    """out[r, c] = x[r, c] + (y[r, c] + bias[c]); f32 [nt, d], bias f32 [d]."""
    b = cuda.blockIdx.x
    row = b // col_blocks
    col = (b - row * col_blocks) * cuda.blockDim.x + cuda.threadIdx.x
    if col < out.shape[1]:
        out[row, col] = x[row, col] + (y[row, col] + bias[col])


@kernel
def _bias(y, bias, out, col_blocks):
    """out[r, c] = y[r, c] + bias[c]; f32 [nt, d], bias f32 [d]."""
    b = cuda.blockIdx.x
    row = b // col_blocks
    col = (b - row * col_blocks) * cuda.blockDim.x + cuda.threadIdx.x
    if col < out.shape[1]:
        out[row, col] = y[row, col] + bias[col]


def _rows(a, name: str):
    if not devicearray.is_cuda_ndarray(a):
        raise KernelConstraintError(f"{name} must be a CUDA device array, got {type(a).__name__}")
    if a.dtype != np.float32 or a.ndim != 2 or not a.is_c_contiguous():
        raise KernelConstraintError(
            f"{name} must be a C-contiguous 2-D float32 [nt, d] array, got {a.dtype} ndim {a.ndim} "
            f"contiguous={a.is_c_contiguous()}"
        )
    return a


def _bias_vector(bias, d: int):
    if not devicearray.is_cuda_ndarray(bias):
        raise KernelConstraintError(f"bias must be a CUDA device array, got {type(bias).__name__}")
    if bias.dtype != np.float32 or tuple(bias.shape) != (d,) or not bias.is_c_contiguous():
        raise KernelConstraintError(
            f"bias must be a contiguous float32 array of shape ({d},), got {bias.dtype} {tuple(bias.shape)}"
        )
    return bias


def _out(out, like, name: str):
    if out is None:
        return like
    out = _rows(out, "out")
    if tuple(out.shape) != tuple(like.shape):
        raise KernelConstraintError(f"out {tuple(out.shape)} must have the shape of {name} {tuple(like.shape)}")
    return out


def _check_tpb(tpb: int) -> None:
    if tpb % 32 or not 32 <= tpb <= 1024:
        raise KernelConstraintError(f"tpb={tpb} must be a multiple of 32 between 32 and 1024")


def residual_add(x, y, bias=None, out=None, stream=0, tpb: int = DEFAULT_TPB):
    """Enqueue ``out = x + y`` (``x + (y + bias)`` with a bias) on ``stream`` and return ``out``.

    x, y: C-contiguous f32 device arrays ``[nt, d]`` (x the residual stream, y a GEMM output); bias: optional
    contiguous f32 ``[d]``. out: default x (in place, the residual update); else a C-contiguous f32 ``[nt, d]``
    array (may alias x or y). tpb: threads per block, a multiple of 32 from 32 to 1024.

    Raises KernelConstraintError (a ValueError) for a non-device array, a dtype other than f32, a rank other than
    2 (1 for bias), a non-contiguous array, mismatched shapes, or a bad tpb.
    """
    x, y = _rows(x, "x"), _rows(y, "y")
    if tuple(y.shape) != tuple(x.shape):
        raise KernelConstraintError(f"x {tuple(x.shape)} and y {tuple(y.shape)} must have the same shape")
    nt, d = x.shape
    if bias is not None:
        bias = _bias_vector(bias, d)
    out = _out(out, x, "x")
    _check_tpb(tpb)
    if nt and d:
        col_blocks = (d + tpb - 1) // tpb
        if bias is None:
            _add[nt * col_blocks, tpb, stream](x, y, out, col_blocks)
        else:
            _add_bias[nt * col_blocks, tpb, stream](x, y, bias, out, col_blocks)
    return out


def bias_add(y, bias, out=None, stream=0, tpb: int = DEFAULT_TPB):
    """Enqueue ``out[t, :] = y[t, :] + bias`` on ``stream`` and return ``out``.

    y: C-contiguous f32 device array ``[nt, d]`` (e.g. the fused QKV GEMM output, d = (nh + 2*nkv)*head_dim);
    bias: contiguous f32 ``[d]`` (qwen2: ``concat(q_bias, k_bias, v_bias)``). out: default y (in place); else a
    C-contiguous f32 ``[nt, d]`` array. tpb: threads per block, a multiple of 32 from 32 to 1024.

    Raises KernelConstraintError (a ValueError) for a non-device array, a dtype other than f32, a wrong rank or
    shape, a non-contiguous array, or a bad tpb.
    """
    y = _rows(y, "y")
    nt, d = y.shape
    bias = _bias_vector(bias, d)
    out = _out(out, y, "y")
    _check_tpb(tpb)
    if nt and d:
        col_blocks = (d + tpb - 1) // tpb
        _bias[nt * col_blocks, tpb, stream](y, bias, out, col_blocks)
    return out
