"""Per-format x loaders and block dots of the f32-x gemv kernels (llama.cpp dmmv.cu's route): every weight is
converted to float32 and FMA'd against f32 x (`kernels.gemv`'s docstring has the work split).

x loader: (x as uint32, weight index of the block's first weight in the row, lane-in-block j) -> tuple of x values.
block dot: (raw view, block index in the tensor, j, that tuple) -> float32 contribution of this lane's piece.
A ``_math_*`` function is the decode half of a dot split into loads (`kernels.gemv.device`) and decode (the
cp.async ring decodes a block its fetch read from shared memory).
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from kernels.gemv.device import (
    M0,
    M4,
    M8,
    M16,
    M32,
    M128,
    MB,
    N1,
    N2,
    N4,
    U,
    _dot8,
    _h2,
    _i8,
    _k4_header,
    _q6_bytes,
    _q6_k_lane,
    _q8_0_words,
    _spread4,
    _sum8,
    _x8,
)
from kernels.quant.bits import f32_from_bits, f32_from_f16_bits, ld_global_v4_u32


@cuda.jit(device=True, inline="always")
def _x_legacy(xv, wb, j):
    """LPB = 2 on 32-weight blocks with nibble planes: lane j has weights 8j..8j+7 and 16+8j..16+8j+7."""
    t0 = _x8(xv, wb + 8 * j)
    t1 = _x8(xv, wb + 16 + 8 * j)
    return (t0, t1, _sum8(t0) + _sum8(t1))


@cuda.jit(device=True, inline="always")
def _dot_q4_0(raw, bi, j, xs):
    """Q4_0, uint16 view (9 per block): d | qs[16]; lane j reads qs bytes 8j..8j+7."""
    base = bi * 9
    d = f32_from_f16_bits(int(raw[U(base)]))
    qi = base + 1 + 4 * j
    w0 = _h2(raw, qi)
    w1 = _h2(raw, qi + 2)
    s = _dot8(w0 & N4, w1 & N4, M8, xs[0]) + _dot8((w0 >> 4) & N4, (w1 >> 4) & N4, M8, xs[1])
    return d * s


@cuda.jit(device=True, inline="always")
def _dot_q4_1(raw, bi, j, xs):
    """Q4_1, uint32 view (5 per block): d|m | qs[16]; w = d*q + m."""
    base = bi * 5
    dm = int(raw[U(base)])
    w0 = int(raw[U(base + 1 + 2 * j)])
    w1 = int(raw[U(base + 2 + 2 * j)])
    s = _dot8(w0 & N4, w1 & N4, M0, xs[0]) + _dot8((w0 >> 4) & N4, (w1 >> 4) & N4, M0, xs[1])
    return f32_from_f16_bits(dm & 0xFFFF) * s + f32_from_f16_bits(dm >> 16) * xs[2]


@cuda.jit(device=True, inline="always")
def _dot_q5_0(raw, bi, j, xs):
    """Q5_0, uint16 view (11 per block): d | qh[4] | qs[16]; q = nibble | qh bit << 4; w = d*(q - 16)."""
    base = bi * 11
    d = f32_from_f16_bits(int(raw[U(base)]))
    qh = _h2(raw, base + 1)  # bytes 2..5: two halfword loads, never one (misaligned) uint32 load
    qi = base + 3 + 4 * j
    w0 = _h2(raw, qi)
    w1 = _h2(raw, qi + 2)
    hl = qh >> (8 * j)
    hh = qh >> (16 + 8 * j)
    lo0 = (w0 & N4) | (_spread4(hl) << 4)
    lo1 = (w1 & N4) | (_spread4(hl >> 4) << 4)
    hi0 = ((w0 >> 4) & N4) | (_spread4(hh) << 4)
    hi1 = ((w1 >> 4) & N4) | (_spread4(hh >> 4) << 4)
    return d * (_dot8(lo0, lo1, M16, xs[0]) + _dot8(hi0, hi1, M16, xs[1]))


@cuda.jit(device=True, inline="always")
def _dot_q5_1(raw, bi, j, xs):
    """Q5_1, uint64 view (3 per block): d|m|qh[4] | qs[16]; w = d*q + m."""
    base = bi * 3
    h = raw[U(base)]
    qw = raw[U(base + 1 + j)]
    dm = int(h & U(0xFFFFFFFF))
    qh = int(h >> U(32))
    w0 = int(qw & U(0xFFFFFFFF))
    w1 = int(qw >> U(32))
    hl = qh >> (8 * j)
    hh = qh >> (16 + 8 * j)
    lo0 = (w0 & N4) | (_spread4(hl) << 4)
    lo1 = (w1 & N4) | (_spread4(hl >> 4) << 4)
    hi0 = ((w0 >> 4) & N4) | (_spread4(hh) << 4)
    hi1 = ((w1 >> 4) & N4) | (_spread4(hh >> 4) << 4)
    s = _dot8(lo0, lo1, M0, xs[0]) + _dot8(hi0, hi1, M0, xs[1])
    return f32_from_f16_bits(dm & 0xFFFF) * s + f32_from_f16_bits(dm >> 16) * xs[2]


@cuda.jit(device=True, inline="always")
def _x_q8_0(xv, wb, j):
    """Q8_0, LPB = 2: lane j has weights 16j .. 16j+15."""
    return (_x8(xv, wb + 16 * j), _x8(xv, wb + 16 * j + 8))


@cuda.jit(device=True, inline="always")
def _dot_q8_0(raw, bi, j, xs):
    """Q8_0 x f32 (layout: `_q8_0_words`); int8 b = (b ^ 0x80) - 128."""
    return _math_q8_0(_q8_0_words(raw, bi, j), j, xs)


@cuda.jit(device=True, inline="always")
def _math_q8_0(t, j, xs):
    """The decode half of `_dot_q8_0`, from lane j's `_q8_0_words` tuple ``t``."""
    d = t[0]
    w0 = t[1] ^ 0x80808080
    w1 = t[2] ^ 0x80808080
    w2 = t[3] ^ 0x80808080
    w3 = t[4] ^ 0x80808080
    return d * (_dot8(w0, w1, M128, xs[0]) + _dot8(w2, w3, M128, xs[1]))


@cuda.jit(device=True, inline="always")
def _x_k_planes(xv, wb, j):
    """Q2_K / Q3_K / Q6_K, LPB = 8: lane j (n = j/4, t0 = 8*(j%4)) has weights 128n + 32s + t0 + (0..7), s < 4."""
    b = wb + 128 * (j >> 2) + 8 * (j & 3)
    t0 = _x8(xv, b)
    t1 = _x8(xv, b + 32)
    t2 = _x8(xv, b + 64)
    t3 = _x8(xv, b + 96)
    return (t0, t1, t2, t3, _sum8(t0), _sum8(t1), _sum8(t2), _sum8(t3))


@cuda.jit(device=True, inline="always")
def _dot_q2_k(raw, bi, j, xs):
    """Q2_K, uint32 view (21 per block): scales[16] | qs[64] | d|dmin. Weight 128n + 32s + t: 2 bits at shift 2s
    of qs[32n + t]; sub-block scale byte 8n + 2s + t/16 (low nibble scale, high nibble min)."""
    base = bi * 21
    n = j >> 2
    e = (j & 3) >> 1
    dd = int(raw[U(base + 20)])
    sw0 = int(raw[U(base + 2 * n)]) >> (8 * e)  # scales 8n + e + {0, 2}
    sw1 = int(raw[U(base + 2 * n + 1)]) >> (8 * e)  # scales 8n + e + {4, 6}
    qi = base + 4 + 8 * n + 2 * (j & 3)
    w0 = int(raw[U(qi)])
    w1 = int(raw[U(qi + 1)])
    c0 = sw0 & 0xFF
    c1 = (sw0 >> 16) & 0xFF
    c2 = sw1 & 0xFF
    c3 = (sw1 >> 16) & 0xFF
    sq = np.float32(c0 & 0xF) * _dot8(w0 & N2, w1 & N2, M0, xs[0])
    sq += np.float32(c1 & 0xF) * _dot8((w0 >> 2) & N2, (w1 >> 2) & N2, M0, xs[1])
    sq += np.float32(c2 & 0xF) * _dot8((w0 >> 4) & N2, (w1 >> 4) & N2, M0, xs[2])
    sq += np.float32(c3 & 0xF) * _dot8((w0 >> 6) & N2, (w1 >> 6) & N2, M0, xs[3])
    sm = np.float32(c0 >> 4) * xs[4] + np.float32(c1 >> 4) * xs[5]
    sm += np.float32(c2 >> 4) * xs[6] + np.float32(c3 >> 4) * xs[7]
    return f32_from_f16_bits(dd & 0xFFFF) * sq - f32_from_f16_bits(dd >> 16) * sm


@cuda.jit(device=True, inline="always")
def _q3_scale(lo_hw, hi_hw, e, lshift, hshift):
    """Signed 6-bit Q3_K scale: low 4 bits from byte e of lo_hw >> lshift, high 2 from byte e of hi_hw >> hshift."""
    low = (lo_hw >> (8 * e + lshift)) & 0xF
    high = (hi_hw >> (8 * e + hshift)) & 3
    return np.float32((low | (high << 4)) - 32)


@cuda.jit(device=True, inline="always")
def _dot_q3_k(raw, bi, j, xs):
    """Q3_K, uint16 view (55 per block): hmask[32] | qs[64] | scales[12] | d. Weight 128n + 32s + t: 2 bits at
    shift 2s of qs[32n + t], minus 4 unless bit 4n + s of hmask[t] is set; 6-bit scale i = 8n + 2s + t/16."""
    base = bi * 55
    n = j >> 2
    e = (j & 3) >> 1
    d = f32_from_f16_bits(int(raw[U(base + 54)]))
    qi = base + 16 + 16 * n + 4 * (j & 3)
    mi = base + 4 * (j & 3)
    hb = 4 * n
    q0 = _h2(raw, qi)
    q1 = _h2(raw, qi + 2)
    m0 = _h2(raw, mi) >> hb
    m1 = _h2(raw, mi + 2) >> hb
    hi0 = int(raw[U(base + 52)])  # scales[8..9]
    hi1 = int(raw[U(base + 53)])  # scales[10..11]
    sc0 = _q3_scale(int(raw[U(base + 48)]), hi0, e, 4 * n, 4 * n)  # i = 8n + e
    sc1 = _q3_scale(int(raw[U(base + 49)]), hi1, e, 4 * n, 4 * n)  # i = 8n + 2 + e
    sc2 = _q3_scale(int(raw[U(base + 50)]), hi0, e, 4 * n, 4 * n + 2)  # i = 8n + 4 + e
    sc3 = _q3_scale(int(raw[U(base + 51)]), hi1, e, 4 * n, 4 * n + 2)  # i = 8n + 6 + e
    s = sc0 * _dot8((q0 & N2) | ((m0 & N1) << 2), (q1 & N2) | ((m1 & N1) << 2), M4, xs[0])
    s += sc1 * _dot8(((q0 >> 2) & N2) | (((m0 >> 1) & N1) << 2), ((q1 >> 2) & N2) | (((m1 >> 1) & N1) << 2), M4, xs[1])
    s += sc2 * _dot8(((q0 >> 4) & N2) | (((m0 >> 2) & N1) << 2), ((q1 >> 4) & N2) | (((m1 >> 2) & N1) << 2), M4, xs[2])
    s += sc3 * _dot8(((q0 >> 6) & N2) | (((m0 >> 3) & N1) << 2), ((q1 >> 6) & N2) | (((m1 >> 3) & N1) << 2), M4, xs[3])
    return d * s


@cuda.jit(device=True, inline="always")
def _dot_q6_k(raw, bi, j, xs):
    """Q6_K x f32 (layout: `_q6_k_lane`): d * Σ_s sc_s * Σ((q - 32)·x)."""
    return _math_q6_k(_q6_k_lane(raw, bi, j), j, xs)


@cuda.jit(device=True, inline="always")
def _math_q6_k(t, j, xs):
    """The decode half of `_dot_q6_k`, from lane j's `_q6_k_lane` tuple ``t``."""
    d, a0, a1, b0, b1, m0, m1, c0, c1, c2, c3 = t
    s = _i8(c0) * _dot8(_q6_bytes(a0, m0, 0), _q6_bytes(a1, m1, 0), M32, xs[0])
    s += _i8(c1) * _dot8(_q6_bytes(b0, m0, 1), _q6_bytes(b1, m1, 1), M32, xs[1])
    s += _i8(c2) * _dot8(_q6_bytes(a0, m0, 2), _q6_bytes(a1, m1, 2), M32, xs[2])
    s += _i8(c3) * _dot8(_q6_bytes(b0, m0, 3), _q6_bytes(b1, m1, 3), M32, xs[3])
    return d * s


@cuda.jit(device=True, inline="always")
def _x_k_nibbles(xv, wb, j):
    """Q4_K / Q5_K, LPB = 8: lane j (i = j/2, h = j%2) has weights 64i + 16h + (0..15) (low nibbles, sub-block
    2i) and 64i + 32 + 16h + (0..15) (high nibbles, sub-block 2i+1)."""
    b = wb + 64 * (j >> 1) + 16 * (j & 1)
    l0 = _x8(xv, b)
    l1 = _x8(xv, b + 8)
    h0 = _x8(xv, b + 32)
    h1 = _x8(xv, b + 40)
    return (l0, l1, h0, h1, _sum8(l0) + _sum8(l1), _sum8(h0) + _sum8(h1))


@cuda.jit(device=True, inline="always")
def _dot_q4_k(raw4, bi, j, xs):
    """Q4_K x f32. Q4_K, uint32 view (36 per block): d|dmin | scales[12] | qs[128]; lane j reads the 16-byte header
    and qs bytes 16j..16j+15 (one 16-byte load each; they hold the low nibbles of sub-block 2i and the high nibbles
    of sub-block 2i+1). The header is decoded before the qs load is issued: ptxas schedules this order better than
    both loads first."""
    base = bi * 36
    d, dmin, sc0, mn0, sc1, mn1 = _k4_header(raw4, base, j)
    q0, q1, q2, q3 = ld_global_v4_u32(raw4, base + 4 + 4 * j)
    return _q4_k_sum(d, dmin, sc0, mn0, sc1, mn1, q0, q1, q2, q3, xs)


@cuda.jit(device=True, inline="always")
def _q4_k_sum(d, dmin, sc0, mn0, sc1, mn1, q0, q1, q2, q3, xs):
    """Q4_K x f32 of one lane: its decoded scales and qs words against its x values."""
    w0, w1, w2, w3 = int(q0), int(q1), int(q2), int(q3)
    slo = _dot8(w0 & N4, w1 & N4, M0, xs[0]) + _dot8(w2 & N4, w3 & N4, M0, xs[1])
    shi = _dot8((w0 >> 4) & N4, (w1 >> 4) & N4, M0, xs[2]) + _dot8((w2 >> 4) & N4, (w3 >> 4) & N4, M0, xs[3])
    return d * (sc0 * slo + sc1 * shi) - dmin * (mn0 * xs[4] + mn1 * xs[5])


@cuda.jit(device=True, inline="always")
def _dot_q5_k(raw4, bi, j, xs):
    """Q5_K, uint32 view (44 per block): d|dmin | scales[12] | qh[32] | qs[128]; as Q4_K plus the fifth bit
    (bit s of qh[t], t = position in the 32-weight sub-block); lane j reads qh bytes 16h..16h+15 (16-byte load)."""
    base = bi * 44
    d, dmin, sc0, mn0, sc1, mn1 = _k4_header(raw4, base, j)
    h0, h1, h2, h3 = ld_global_v4_u32(raw4, base + 4 + 4 * (j & 1))
    q0, q1, q2, q3 = ld_global_v4_u32(raw4, base + 12 + 4 * j)
    b0 = 2 * (j >> 1)
    b1 = b0 + 1
    m0, m1, m2, m3 = int(h0), int(h1), int(h2), int(h3)
    w0, w1, w2, w3 = int(q0), int(q1), int(q2), int(q3)
    slo = _dot8(
        (w0 & N4) | (((m0 >> b0) & N1) << 4), (w1 & N4) | (((m1 >> b0) & N1) << 4), M0, xs[0]
    ) + _dot8((w2 & N4) | (((m2 >> b0) & N1) << 4), (w3 & N4) | (((m3 >> b0) & N1) << 4), M0, xs[1])
    shi = _dot8(
        ((w0 >> 4) & N4) | (((m0 >> b1) & N1) << 4), ((w1 >> 4) & N4) | (((m1 >> b1) & N1) << 4), M0, xs[2]
    ) + _dot8(((w2 >> 4) & N4) | (((m2 >> b1) & N1) << 4), ((w3 >> 4) & N4) | (((m3 >> b1) & N1) << 4), M0, xs[3])
    return d * (sc0 * slo + sc1 * shi) - dmin * (mn0 * xs[4] + mn1 * xs[5])


@cuda.jit(device=True, inline="always")
def _e2m1x2(v):
    """2 * the E2M1 value of nibble v (OCP MX v1.0 §5.3.3), as float32: |.| in {0,1,2,3,4,6,8,12} (a packed
    4-bit table), sign bit 3."""
    mag = f32_from_bits(MB | ((0xC8643210 >> (4 * (v & 7))) & 0xF)) - M0
    return -mag if v & 8 else mag


@cuda.jit(device=True, inline="always")
def _dot8_e2m1(w0, w1, t):
    """Σ_k 2*e2m1(nibble in byte k of w0 | w1 << 32) * t[k]; every byte < 16."""
    a = _e2m1x2(w0 & 0xF) * t[0]
    a += _e2m1x2((w0 >> 8) & 0xF) * t[1]
    a += _e2m1x2((w0 >> 16) & 0xF) * t[2]
    a += _e2m1x2((w0 >> 24) & 0xF) * t[3]
    a += _e2m1x2(w1 & 0xF) * t[4]
    a += _e2m1x2((w1 >> 8) & 0xF) * t[5]
    a += _e2m1x2((w1 >> 16) & 0xF) * t[6]
    a += _e2m1x2((w1 >> 24) & 0xF) * t[7]
    return a


@cuda.jit(device=True, inline="always")
def _b4(raw, i):
    """Four consecutive bytes i .. i+3 as one 32-bit value (byte loads: MXFP4 blocks are 1-byte aligned)."""
    return (
        int(raw[U(i)])
        | (int(raw[U(i + 1)]) << 8)
        | (int(raw[U(i + 2)]) << 16)
        | (int(raw[U(i + 3)]) << 24)
    )


@cuda.jit(device=True, inline="always")
def _dot_mxfp4(raw, bi, j, xs):
    """MXFP4, uint8 view (17 per block, byte loads): e (E8M0) | qs[16]; lane j reads qs bytes 8j..8j+7;
    w = 2^(e-128) * (2*e2m1) (ggml's ``ggml_e8m0_to_fp32_half`` times the doubled table)."""
    base = bi * 17
    e = int(raw[U(base)])
    d_half = f32_from_bits((0x00200000 << e) if e < 2 else ((e - 1) << 23))
    qi = base + 1 + 8 * j
    w0 = _b4(raw, qi)
    w1 = _b4(raw, qi + 4)
    s = _dot8_e2m1(w0 & N4, w1 & N4, xs[0]) + _dot8_e2m1((w0 >> 4) & N4, (w1 >> 4) & N4, xs[1])
    return d_half * s


@cuda.jit(device=True, inline="always")
def _x_float(xv, wb, j):
    """Float types: a 'block' is 8 consecutive elements, one lane each (LPB = 1)."""
    return (_x8(xv, wb),)


@cuda.jit(device=True, inline="always")
def _dot_f16(raw4, bi, j, xs):
    """F16, uint32 view: elements 8bi .. 8bi+7 with one 16-byte load."""
    a, b, c, d = ld_global_v4_u32(raw4, bi * 4)
    t = xs[0]
    s = f32_from_f16_bits(int(a) & 0xFFFF) * t[0] + f32_from_f16_bits(int(a) >> 16) * t[1]
    s += f32_from_f16_bits(int(b) & 0xFFFF) * t[2] + f32_from_f16_bits(int(b) >> 16) * t[3]
    s += f32_from_f16_bits(int(c) & 0xFFFF) * t[4] + f32_from_f16_bits(int(c) >> 16) * t[5]
    s += f32_from_f16_bits(int(d) & 0xFFFF) * t[6] + f32_from_f16_bits(int(d) >> 16) * t[7]
    return s


@cuda.jit(device=True, inline="always")
def _dot_bf16(raw4, bi, j, xs):
    """BF16, uint32 view: float32 = bf16 bits << 16 (gguf-py ``BF16``); one 16-byte load per 8 elements."""
    a, b, c, d = ld_global_v4_u32(raw4, bi * 4)
    t = xs[0]
    s = f32_from_bits(int(a) << 16) * t[0] + f32_from_bits(int(a) & 0xFFFF0000) * t[1]
    s += f32_from_bits(int(b) << 16) * t[2] + f32_from_bits(int(b) & 0xFFFF0000) * t[3]
    s += f32_from_bits(int(c) << 16) * t[4] + f32_from_bits(int(c) & 0xFFFF0000) * t[5]
    s += f32_from_bits(int(d) << 16) * t[6] + f32_from_bits(int(d) & 0xFFFF0000) * t[7]
    return s


@cuda.jit(device=True, inline="always")
def _dot_f32(raw4, bi, j, xs):
    """F32, uint32 view: elements 8bi .. 8bi+7 with two 16-byte loads."""
    w = _x8(raw4, bi * 8)
    t = xs[0]
    s = w[0] * t[0] + w[1] * t[1]
    s += w[2] * t[2] + w[3] * t[3]
    s += w[4] * t[4] + w[5] * t[5]
    s += w[6] * t[6] + w[7] * t[7]
    return s
