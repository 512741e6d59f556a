"""Per-format x loaders and block dots of the MMVQ gemv kernels: int8 (Q8_1) activations and dp4a.

x loader: (q as uint32 words, d, s, weight index of the block's first weight, j) -> tuple of words and scales.
Each dot decodes the lane's weights into packed bytes and multiplies them with x's int8 values four at a time
(`kernels.ptx.dp4a_s32`); a 32-weight x block contributes d_x * (integer sum), so per 4 weights the work is one
mask/shift and one dp4a instead of four converts and four FMAs (llama.cpp ggml-cuda/vecdotq.cuh
``vec_dot_q4_K_q8_1`` etc.). The lane fetches are `kernels.gemv.device`'s, shared with the f32-x dots.

Compensated x (XRES=1, `kernels.quantize_q8`: x ≈ d·(q + r/254)): the loader (``_xqr_*``) also returns the lane's
residual words and each block's d already divided by 254; the dot runs a second dp4a chain over the residual words
with the same decoded weight bytes, started from 254 times the first chain's sum, so the integer sum is
``254·Σw·q + Σw·r`` and everything after it (scales, min terms) is the plain dot's. Every sum stays far inside
int32 (at most 16 · 127 · 127 · 255 for Q8_0).
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from kernels.gemv.device import N4, U, _i8, _k4_header, _q6_bytes, _q6_k_lane, _q8_0_words
from kernels.ptx import dp4a_s32
from kernels.quant.bits import ld_global_v4_u32
from kernels.quantize_q8 import RES_SCALE

R = RES_SCALE
INV_R = np.float32(1.0 / RES_SCALE)


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
def _q4_k_ints(w0, w1, w2, w3, a0, a1, a2, a3, b0, b1, b2, b3, clo, chi):
    """Integer sums of a Q4_K lane's qs words ``w`` (low nibbles: sub-block 2i, high: 2i+1) against int8 x words
    ``a`` and ``b``, started from ``clo`` and ``chi``."""
    lo = dp4a_s32(w0 & N4, a0, dp4a_s32(w1 & N4, a1, dp4a_s32(w2 & N4, a2, dp4a_s32(w3 & N4, a3, clo))))
    hi = dp4a_s32((w0 >> 4) & N4, b0, dp4a_s32((w1 >> 4) & N4, b1,
                  dp4a_s32((w2 >> 4) & N4, b2, dp4a_s32((w3 >> 4) & N4, b3, chi))))
    return lo, hi


@cuda.jit(device=True, inline="always")
def _q4_k_scaled(d, dmin, sc0, mn0, sc1, mn1, lo, hi, j, xs):
    """A Q4_K MMVQ lane's result from its two integer sums: d*(sc*dx*lo + sc*dx*hi), minus dmin*m*Σx on even
    lanes (x's d at ``xs[8:10]``, its sums at ``xs[10:12]``)."""
    r = d * (sc0 * xs[8] * np.float32(lo) + sc1 * xs[9] * np.float32(hi))
    if (j & 1) == 0:
        r -= dmin * (mn0 * xs[10] + mn1 * xs[11])
    return r


@cuda.jit(device=True, inline="always")
def _q4_k_sumq(d, dmin, sc0, mn0, sc1, mn1, q0, q1, q2, q3, j, xs):
    """Q4_K x Q8_1 of one lane: its decoded scales and qs words against its int8 x words, d and sums."""
    w0, w1, w2, w3 = int(q0), int(q1), int(q2), int(q3)
    lo, hi = _q4_k_ints(w0, w1, w2, w3, xs[0], xs[1], xs[2], xs[3], xs[4], xs[5], xs[6], xs[7], 0, 0)
    return _q4_k_scaled(d, dmin, sc0, mn0, sc1, mn1, lo, hi, j, xs)


@cuda.jit(device=True, inline="always")
def _xqr_k_nibbles(xq, xd, xsum, xr, wb, j):
    """`_xq_k_nibbles` for compensated x: d / 254 for both blocks, and the residual words at ``xs[12:20]``."""
    o = (wb >> 2) + 16 * (j >> 1) + 4 * (j & 1)
    b = (wb >> 5) + 2 * (j >> 1)
    u0, u1, u2, u3 = ld_global_v4_u32(xq, o)
    v0, v1, v2, v3 = ld_global_v4_u32(xq, o + 8)
    p0, p1, p2, p3 = ld_global_v4_u32(xr, o)
    t0, t1, t2, t3 = ld_global_v4_u32(xr, o + 8)
    return (u0, u1, u2, u3, v0, v1, v2, v3, xd[b] * INV_R, xd[b + 1] * INV_R, xsum[b], xsum[b + 1],
            p0, p1, p2, p3, t0, t1, t2, t3)


@cuda.jit(device=True, inline="always")
def _dotqr_q4_k(raw4, bi, j, xs):
    """`_dotq_q4_k` with compensated x (`_xqr_k_nibbles`): integer sums 254·Σw·q + Σw·r."""
    base = bi * 36
    d, dmin, sc0, mn0, sc1, mn1 = _k4_header(raw4, base, j)
    q0, q1, q2, q3 = ld_global_v4_u32(raw4, base + 4 + 4 * j)
    w0, w1, w2, w3 = int(q0), int(q1), int(q2), int(q3)
    lo, hi = _q4_k_ints(w0, w1, w2, w3, xs[0], xs[1], xs[2], xs[3], xs[4], xs[5], xs[6], xs[7], 0, 0)
    lo, hi = _q4_k_ints(w0, w1, w2, w3, xs[12], xs[13], xs[14], xs[15], xs[16], xs[17], xs[18], xs[19],
                        lo * R, hi * R)
    return _q4_k_scaled(d, dmin, sc0, mn0, sc1, mn1, lo, hi, j, xs)


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
def _q6_k_ints(e0, e1, e2, e3, e4, e5, e6, e7, x0, x1, x2, x3, x4, x5, x6, x7, k0, k1, k2, k3):
    """Per-plane integer sums of a Q6_K lane: weight bytes ``e`` (planes 0..3, two words each) against int8 x words
    ``x`` (same order), plane s started from ``k_s``."""
    return (dp4a_s32(e0, x0, dp4a_s32(e1, x1, k0)), dp4a_s32(e2, x2, dp4a_s32(e3, x3, k1)),
            dp4a_s32(e4, x4, dp4a_s32(e5, x5, k2)), dp4a_s32(e6, x6, dp4a_s32(e7, x7, k3)))


@cuda.jit(device=True, inline="always")
def _q6_k_signed_words(a0, a1, b0, b1, m0, m1):
    """A Q6_K lane's weights as int8 bytes q - 32, planes 0..3 two words each (`_q6_bytes`, `_q6_signed`)."""
    return (_q6_signed(_q6_bytes(a0, m0, 0)), _q6_signed(_q6_bytes(a1, m1, 0)),
            _q6_signed(_q6_bytes(b0, m0, 1)), _q6_signed(_q6_bytes(b1, m1, 1)),
            _q6_signed(_q6_bytes(a0, m0, 2)), _q6_signed(_q6_bytes(a1, m1, 2)),
            _q6_signed(_q6_bytes(b0, m0, 3)), _q6_signed(_q6_bytes(b1, m1, 3)))


@cuda.jit(device=True, inline="always")
def _q6_k_stored_words(a0, a1, b0, b1, m0, m1):
    """A Q6_K lane's stored 6-bit q (0..63) as bytes, planes 0..3 two words each (`_q6_bytes`; FOLD=1)."""
    return (_q6_bytes(a0, m0, 0), _q6_bytes(a1, m1, 0), _q6_bytes(b0, m0, 1), _q6_bytes(b1, m1, 1),
            _q6_bytes(a0, m0, 2), _q6_bytes(a1, m1, 2), _q6_bytes(b0, m0, 3), _q6_bytes(b1, m1, 3))


@cuda.jit(device=True, inline="always")
def _mathq_q6_k(t, j, xs):
    """The decode half of `_dotq_q6_k`, from lane j's `_q6_k_lane` tuple ``t``."""
    d, a0, a1, b0, b1, m0, m1, c0, c1, c2, c3 = t
    e0, e1, e2, e3, e4, e5, e6, e7 = _q6_k_signed_words(a0, a1, b0, b1, m0, m1)
    s0, s1, s2, s3 = _q6_k_ints(e0, e1, e2, e3, e4, e5, e6, e7,
                                xs[0], xs[1], xs[2], xs[3], xs[4], xs[5], xs[6], xs[7], 0, 0, 0, 0)
    return _q6_k_scaled(d, c0, c1, c2, c3, s0, s1, s2, s3, xs)


@cuda.jit(device=True, inline="always")
def _xqr_k_planes(xq, xd, xsum, xr, wb, j):
    """`_xq_k_planes` for compensated x: the four blocks' d / 254, and the residual words at ``xs[12:20]``."""
    o = (wb >> 2) + 32 * (j >> 2) + 2 * (j & 3)
    b = (wb >> 5) + 4 * (j >> 2)
    return (xq[o], xq[o + 1], xq[o + 8], xq[o + 9], xq[o + 16], xq[o + 17], xq[o + 24], xq[o + 25],
            xd[b] * INV_R, xd[b + 1] * INV_R, xd[b + 2] * INV_R, xd[b + 3] * INV_R,
            xr[o], xr[o + 1], xr[o + 8], xr[o + 9], xr[o + 16], xr[o + 17], xr[o + 24], xr[o + 25])


@cuda.jit(device=True, inline="always")
def _mathqr_q6_k(t, j, xs):
    """`_mathq_q6_k` with compensated x (`_xqr_k_planes`): per plane 254·Σ(q-32)·q_x + Σ(q-32)·r."""
    d, a0, a1, b0, b1, m0, m1, c0, c1, c2, c3 = t
    e0, e1, e2, e3, e4, e5, e6, e7 = _q6_k_signed_words(a0, a1, b0, b1, m0, m1)
    s0, s1, s2, s3 = _q6_k_ints(e0, e1, e2, e3, e4, e5, e6, e7,
                                xs[0], xs[1], xs[2], xs[3], xs[4], xs[5], xs[6], xs[7], 0, 0, 0, 0)
    s0, s1, s2, s3 = _q6_k_ints(e0, e1, e2, e3, e4, e5, e6, e7, xs[12], xs[13], xs[14], xs[15], xs[16], xs[17],
                                xs[18], xs[19], s0 * R, s1 * R, s2 * R, s3 * R)
    return _q6_k_scaled(d, c0, c1, c2, c3, s0, s1, s2, s3, xs)


@cuda.jit(device=True, inline="always")
def _dotqr_q6_k(raw, bi, j, xs):
    """`_dotq_q6_k` with compensated x (`_mathqr_q6_k`)."""
    return _mathqr_q6_k(_q6_k_lane(raw, bi, j), j, xs)


@cuda.jit(device=True, inline="always")
def _mathq_q6_k_fold(t, j, xs):
    """`_mathq_q6_k` with FOLD=1 (x from `_xq_k_planes_fold`): each plane's integer sum starts from the loader's
    ``-32 * Σx`` and adds ``dp4a(q, x)`` of the stored q, so ``Σ(q - 32)·x`` needs no per-word offset."""
    d, a0, a1, b0, b1, m0, m1, c0, c1, c2, c3 = t
    e0, e1, e2, e3, e4, e5, e6, e7 = _q6_k_stored_words(a0, a1, b0, b1, m0, m1)
    s0, s1, s2, s3 = _q6_k_ints(e0, e1, e2, e3, e4, e5, e6, e7, xs[0], xs[1], xs[2], xs[3], xs[4], xs[5], xs[6],
                                xs[7], xs[12], xs[13], xs[14], xs[15])
    return _q6_k_scaled(d, c0, c1, c2, c3, s0, s1, s2, s3, xs)


@cuda.jit(device=True, inline="always")
def _xqr_k_planes_fold(xq, xd, xsum, xr, wb, j):
    """`_xq_k_planes_fold` for compensated x: d / 254, per plane the offset ``-32 * (254·Σq_x + Σr)`` of both
    values at ``xs[12:16]``, and the residual words at ``xs[16:24]``."""
    o = U((wb >> 2) + 32 * (j >> 2) + 2 * (j & 3))
    b = U((wb >> 5) + 4 * (j >> 2))
    w0, w1, w2, w3 = xq[o], xq[o + U(1)], xq[o + U(8)], xq[o + U(9)]
    w4, w5, w6, w7 = xq[o + U(16)], xq[o + U(17)], xq[o + U(24)], xq[o + U(25)]
    r0, r1, r2, r3 = xr[o], xr[o + U(1)], xr[o + U(8)], xr[o + U(9)]
    r4, r5, r6, r7 = xr[o + U(16)], xr[o + U(17)], xr[o + U(24)], xr[o + U(25)]
    return (w0, w1, w2, w3, w4, w5, w6, w7,
            xd[b] * INV_R, xd[b + U(1)] * INV_R, xd[b + U(2)] * INV_R, xd[b + U(3)] * INV_R,
            dp4a_s32(Q6_OFFSET, r0, dp4a_s32(Q6_OFFSET, r1, R * dp4a_s32(Q6_OFFSET, w0, dp4a_s32(Q6_OFFSET, w1, 0)))),
            dp4a_s32(Q6_OFFSET, r2, dp4a_s32(Q6_OFFSET, r3, R * dp4a_s32(Q6_OFFSET, w2, dp4a_s32(Q6_OFFSET, w3, 0)))),
            dp4a_s32(Q6_OFFSET, r4, dp4a_s32(Q6_OFFSET, r5, R * dp4a_s32(Q6_OFFSET, w4, dp4a_s32(Q6_OFFSET, w5, 0)))),
            dp4a_s32(Q6_OFFSET, r6, dp4a_s32(Q6_OFFSET, r7, R * dp4a_s32(Q6_OFFSET, w6, dp4a_s32(Q6_OFFSET, w7, 0)))),
            r0, r1, r2, r3, r4, r5, r6, r7)


@cuda.jit(device=True, inline="always")
def _mathqr_q6_k_fold(t, j, xs):
    """`_mathq_q6_k_fold` with compensated x (`_xqr_k_planes_fold`): per plane, the x chain starts from 0, the
    residual chain from 254 times its sum plus the loader's combined offset."""
    d, a0, a1, b0, b1, m0, m1, c0, c1, c2, c3 = t
    e0, e1, e2, e3, e4, e5, e6, e7 = _q6_k_stored_words(a0, a1, b0, b1, m0, m1)
    s0, s1, s2, s3 = _q6_k_ints(e0, e1, e2, e3, e4, e5, e6, e7,
                                xs[0], xs[1], xs[2], xs[3], xs[4], xs[5], xs[6], xs[7], 0, 0, 0, 0)
    s0, s1, s2, s3 = _q6_k_ints(e0, e1, e2, e3, e4, e5, e6, e7, xs[16], xs[17], xs[18], xs[19], xs[20], xs[21],
                                xs[22], xs[23], s0 * R + xs[12], s1 * R + xs[13], s2 * R + xs[14], s3 * R + xs[15])
    return _q6_k_scaled(d, c0, c1, c2, c3, s0, s1, s2, s3, xs)


@cuda.jit(device=True, inline="always")
def _dotqr_q6_k_fold(raw, bi, j, xs):
    """`_dotq_q6_k_fold` with compensated x (`_mathqr_q6_k_fold`)."""
    return _mathqr_q6_k_fold(_q6_k_lane(raw, bi, j), j, xs)


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


@cuda.jit(device=True, inline="always")
def _xqr_q8_0(xq, xd, xsum, xr, wb, j):
    """`_xq_q8_0` for compensated x: the block's d / 254, and the lane's residual words at ``xs[5:9]``."""
    u0, u1, u2, u3 = ld_global_v4_u32(xq, (wb >> 2) + 4 * j)
    p0, p1, p2, p3 = ld_global_v4_u32(xr, (wb >> 2) + 4 * j)
    return (u0, u1, u2, u3, xd[wb >> 5] * INV_R, p0, p1, p2, p3)


@cuda.jit(device=True, inline="always")
def _dotqr_q8_0(raw, bi, j, xs):
    """`_dotq_q8_0` with compensated x (`_xqr_q8_0`): d * (dx/254) * (254·Σq·q_x + Σq·r)."""
    w = _q8_0_words(raw, bi, j)
    t = dp4a_s32(w[1], xs[0], dp4a_s32(w[2], xs[1], 0))
    t = dp4a_s32(w[3], xs[2], dp4a_s32(w[4], xs[3], t))
    t = dp4a_s32(w[1], xs[5], dp4a_s32(w[2], xs[6], t * R))
    t = dp4a_s32(w[3], xs[7], dp4a_s32(w[4], xs[8], t))
    return w[0] * xs[4] * np.float32(t)
