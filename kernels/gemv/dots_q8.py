"""Per-format x loaders and block dots of the MMVQ gemv kernels: int8 (Q8_1) activations and dp4a.

x loader: (q as uint32 words, d, s, weight index of the block's first weight, j) -> tuple of words and scales.
Each dot decodes the lane's weights into packed bytes and multiplies them with x's int8 values four at a time
(`kernels.ptx.dp4a_s32`); a 32-weight x block contributes d_x * (integer sum), so per 4 weights the work is one
mask/shift and one dp4a instead of four converts and four FMAs (llama.cpp ggml-cuda/vecdotq.cuh
``vec_dot_q4_K_q8_1`` etc.). The lane fetches are `kernels.gemv.device`'s, shared with the f32-x dots.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from kernels.gemv.device import N4, U, _i8, _k4_header, _q6_bytes, _q6_k_lane, _q8_0_words
from kernels.ptx import dp4a_s32
from kernels.quant.bits import ld_global_v4_u32


@cuda.jit(device=True, inline="always")
def _xq_k_nibbles(xq, xd, xsum, wb, j):
    """Q4_K, LPB = 8: lane j (i = j/2) has weights 64i + 16(j%2) + (0..15) of sub-block 2i and the same 16
    positions of sub-block 2i+1: two 16-byte loads of int8 x, and both blocks' d and sum."""
    o = (wb >> 2) + 16 * (j >> 1) + 4 * (j & 1)
    b = (wb >> 5) + 2 * (j >> 1)
    u0, u1, u2, u3 = ld_global_v4_u32(xq, o)
    v0, v1, v2, v3 = ld_global_v4_u32(xq, o + 8)
    return (u0, u1, u2, u3, v0, v1, v2, v3, xd[b], xd[b + 1], xsum[b], xsum[b + 1])


@cuda.jit(device=True, inline="always")
def _dotq_q4_k(raw4, bi, j, xs):
    """Q4_K x Q8_1 (layout: `kernels.gemv.dots._dot_q4_k`): d*sc*dx*Σ(q·xq) per sub-block, minus dmin*m*Σx
    (added once per sub-block: by even lanes). Header decoded before the qs load, as `_dot_q4_k`."""
    base = bi * 36
    d, dmin, sc0, mn0, sc1, mn1 = _k4_header(raw4, base, j)
    q0, q1, q2, q3 = ld_global_v4_u32(raw4, base + 4 + 4 * j)
    return _q4_k_sumq(d, dmin, sc0, mn0, sc1, mn1, q0, q1, q2, q3, j, xs)


@cuda.jit(device=True, inline="always")
def _q4_k_sumq(d, dmin, sc0, mn0, sc1, mn1, q0, q1, q2, q3, j, xs):
    """Q4_K x Q8_1 of one lane: its decoded scales and qs words against its int8 x words, d and sums."""
    w0, w1, w2, w3 = int(q0), int(q1), int(q2), int(q3)
    lo = dp4a_s32(w0 & N4, xs[0], dp4a_s32(w1 & N4, xs[1], dp4a_s32(w2 & N4, xs[2], dp4a_s32(w3 & N4, xs[3], 0))))
    hi = dp4a_s32((w0 >> 4) & N4, xs[4], dp4a_s32((w1 >> 4) & N4, xs[5],
                  dp4a_s32((w2 >> 4) & N4, xs[6], dp4a_s32((w3 >> 4) & N4, xs[7], 0))))
    r = d * (sc0 * xs[8] * np.float32(lo) + sc1 * xs[9] * np.float32(hi))
    if (j & 1) == 0:
        r -= dmin * (mn0 * xs[10] + mn1 * xs[11])
    return r


@cuda.jit(device=True, inline="always")
def _xq_k_planes(xq, xd, xsum, wb, j):
    """Q6_K, LPB = 8: lane j (h = j/4, t0 = 8*(j%4)) has weights 128h + 32s + t0 + (0..7), s < 4: 8 int8 x (two
    words) from each of x blocks 4h + s, and their d."""
    o = (wb >> 2) + 32 * (j >> 2) + 2 * (j & 3)
    b = (wb >> 5) + 4 * (j >> 2)
    return (xq[o], xq[o + 1], xq[o + 8], xq[o + 9], xq[o + 16], xq[o + 17], xq[o + 24], xq[o + 25],
            xd[b], xd[b + 1], xd[b + 2], xd[b + 3])


Q6_OFFSET = 0xE0E0E0E0
"""Four int8 -32s: ``dp4a(Q6_OFFSET, x, c) = c - 32 * Σx``, Q6_K's offset (weight = d * scale * (q - 32))."""


@cuda.jit(device=True, inline="always")
def _xq_k_planes_fold(xq, xd, xsum, wb, j):
    """`_xq_k_planes` (same lanes, words and d) with unsigned indexes, plus per plane s ``-32 * Σx`` of the lane's
    8 x values of that plane (FOLD=1: computed once per chunk, shared by every row)."""
    o = U((wb >> 2) + 32 * (j >> 2) + 2 * (j & 3))
    b = U((wb >> 5) + 4 * (j >> 2))
    w0, w1, w2, w3 = xq[o], xq[o + U(1)], xq[o + U(8)], xq[o + U(9)]
    w4, w5, w6, w7 = xq[o + U(16)], xq[o + U(17)], xq[o + U(24)], xq[o + U(25)]
    return (w0, w1, w2, w3, w4, w5, w6, w7, xd[b], xd[b + U(1)], xd[b + U(2)], xd[b + U(3)],
            dp4a_s32(Q6_OFFSET, w0, dp4a_s32(Q6_OFFSET, w1, 0)), dp4a_s32(Q6_OFFSET, w2, dp4a_s32(Q6_OFFSET, w3, 0)),
            dp4a_s32(Q6_OFFSET, w4, dp4a_s32(Q6_OFFSET, w5, 0)), dp4a_s32(Q6_OFFSET, w6, dp4a_s32(Q6_OFFSET, w7, 0)))


@cuda.jit(device=True, inline="always")
def _q6_signed(v):
    """Bytes 0..63 of v (no carries) -> the int8 bytes v - 32: + 0x60 per byte (96..159), then flip bit 7."""
    return (v + 0x60606060) ^ 0x80808080


@cuda.jit(device=True, inline="always")
def _dotq_q6_k(raw, bi, j, xs):
    """Q6_K x Q8_1 (layout: `_q6_k_lane`): d * Σ_s sc_s * dx_s * Σ((q - 32)·xq)."""
    return _mathq_q6_k(_q6_k_lane(raw, bi, j), j, xs)


@cuda.jit(device=True, inline="always")
def _q6_k_scaled(d, c0, c1, c2, c3, s0, s1, s2, s3, xs):
    """A Q6_K MMVQ lane's result from its four planes' integer sums ``s0..s3``: d * Σ_s int8(c_s) * dx_s * s_s,
    with x's d of plane s at ``xs[8 + s]``."""
    r = _i8(c0) * xs[8] * np.float32(s0)
    r += _i8(c1) * xs[9] * np.float32(s1)
    r += _i8(c2) * xs[10] * np.float32(s2)
    r += _i8(c3) * xs[11] * np.float32(s3)
    return d * r


@cuda.jit(device=True, inline="always")
def _mathq_q6_k(t, j, xs):
    """The decode half of `_dotq_q6_k`, from lane j's `_q6_k_lane` tuple ``t``."""
    d, a0, a1, b0, b1, m0, m1, c0, c1, c2, c3 = t
    s0 = dp4a_s32(_q6_signed(_q6_bytes(a0, m0, 0)), xs[0], dp4a_s32(_q6_signed(_q6_bytes(a1, m1, 0)), xs[1], 0))
    s1 = dp4a_s32(_q6_signed(_q6_bytes(b0, m0, 1)), xs[2], dp4a_s32(_q6_signed(_q6_bytes(b1, m1, 1)), xs[3], 0))
    s2 = dp4a_s32(_q6_signed(_q6_bytes(a0, m0, 2)), xs[4], dp4a_s32(_q6_signed(_q6_bytes(a1, m1, 2)), xs[5], 0))
    s3 = dp4a_s32(_q6_signed(_q6_bytes(b0, m0, 3)), xs[6], dp4a_s32(_q6_signed(_q6_bytes(b1, m1, 3)), xs[7], 0))
    return _q6_k_scaled(d, c0, c1, c2, c3, s0, s1, s2, s3, xs)


@cuda.jit(device=True, inline="always")
def _mathq_q6_k_fold(t, j, xs):
    """`_mathq_q6_k` with FOLD=1 (x from `_xq_k_planes_fold`): each plane's integer sum starts from the loader's
    ``-32 * Σx`` and adds ``dp4a(q, x)`` of the stored q, so ``Σ(q - 32)·x`` needs no per-word offset."""
    d, a0, a1, b0, b1, m0, m1, c0, c1, c2, c3 = t
    s0 = dp4a_s32(_q6_bytes(a0, m0, 0), xs[0], dp4a_s32(_q6_bytes(a1, m1, 0), xs[1], xs[12]))
    s1 = dp4a_s32(_q6_bytes(b0, m0, 1), xs[2], dp4a_s32(_q6_bytes(b1, m1, 1), xs[3], xs[13]))
    s2 = dp4a_s32(_q6_bytes(a0, m0, 2), xs[4], dp4a_s32(_q6_bytes(a1, m1, 2), xs[5], xs[14]))
    s3 = dp4a_s32(_q6_bytes(b0, m0, 3), xs[6], dp4a_s32(_q6_bytes(b1, m1, 3), xs[7], xs[15]))
    return _q6_k_scaled(d, c0, c1, c2, c3, s0, s1, s2, s3, xs)


@cuda.jit(device=True, inline="always")
def _dotq_q6_k_fold(raw, bi, j, xs):
    """`_dotq_q6_k` with FOLD=1 (`_mathq_q6_k_fold`)."""
    return _mathq_q6_k_fold(_q6_k_lane(raw, bi, j), j, xs)


@cuda.jit(device=True, inline="always")
def _xq_q8_0(xq, xd, xsum, wb, j):
    """Q8_0, LPB = 2: lane j has weights 16j .. 16j+15 (one 16-byte load of int8 x) and the block's d."""
    u0, u1, u2, u3 = ld_global_v4_u32(xq, (wb >> 2) + 4 * j)
    return (u0, u1, u2, u3, xd[wb >> 5])


@cuda.jit(device=True, inline="always")
def _dotq_q8_0(raw, bi, j, xs):
    """Q8_0 x Q8_1 (layout: `_q8_0_words`): d * dx * Σ(q·xq) over the lane's 16 int8 pairs."""
    return _mathq_q8_0(_q8_0_words(raw, bi, j), j, xs)


@cuda.jit(device=True, inline="always")
def _mathq_q8_0(w, j, xs):
    """The decode half of `_dotq_q8_0`, from lane j's `_q8_0_words` tuple ``w``."""
    t = dp4a_s32(w[1], xs[0], dp4a_s32(w[2], xs[1], 0))
    t = dp4a_s32(w[3], xs[2], dp4a_s32(w[4], xs[3], t))
    return w[0] * xs[4] * np.float32(t)
