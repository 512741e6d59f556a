"""Device helpers every gemv kernel shares (`kernels.gemv`): the float tricks, x loads, the warp sum, and the
lane fetches (the load halves) that the f32-x dots (`kernels.gemv.dots`) and the MMVQ dots
(`kernels.gemv.dots_q8`) both use.

Float trick: ``bits(2^23 | q) - (2^23 + offset)`` is exactly ``q - offset`` (integer pipe + one FADD instead of
the quarter-rate ``cvt``), hence the ``M*`` constants. Block layouts: ggml-common.h (see `kernels.quant.formats`).
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from kernels.quant.bits import SIMULATOR, f32_from_bits, f32_from_f16_bits, ld_global_v4_u32


U = np.uint64
MB = 0x4B000000  # float32 bits of 2^23: bits(MB | q) = 2^23 + q for 0 <= q < 2^23
M0 = np.float32(8388608.0)
M4 = np.float32(8388608.0 + 4.0)
M8 = np.float32(8388608.0 + 8.0)
M16 = np.float32(8388608.0 + 16.0)
M32 = np.float32(8388608.0 + 32.0)
M128 = np.float32(8388608.0 + 128.0)
N4 = 0x0F0F0F0F
N2 = 0x03030303
N1 = 0x01010101
ZERO = np.float32(0.0)


# ---- float tricks, x loads, warp sum -------------------------------------------------------------------------------


@cuda.jit(device=True, inline="always")
def _x8(xv, i):
    """x[i .. i+7] as an 8-tuple of float32 (two 16-byte loads; ``i`` a multiple of 4)."""
    a0, a1, a2, a3 = ld_global_v4_u32(xv, i)
    b0, b1, b2, b3 = ld_global_v4_u32(xv, i + 4)
    return (
        f32_from_bits(a0),
        f32_from_bits(a1),
        f32_from_bits(a2),
        f32_from_bits(a3),
        f32_from_bits(b0),
        f32_from_bits(b1),
        f32_from_bits(b2),
        f32_from_bits(b3),
    )


@cuda.jit(device=True, inline="always")
def _sum8(t):
    return ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]))


@cuda.jit(device=True, inline="always")
def _dot8(w0, w1, off, t):
    """Σ_k (byte k of the 8 bytes w0 | w1 << 32, as an integer) - (off - 2^23)) * t[k]; every byte < 2^8."""
    a = (f32_from_bits(MB | (w0 & 0xFF)) - off) * t[0]
    a += (f32_from_bits(MB | ((w0 >> 8) & 0xFF)) - off) * t[1]
    a += (f32_from_bits(MB | ((w0 >> 16) & 0xFF)) - off) * t[2]
    a += (f32_from_bits(MB | ((w0 >> 24) & 0xFF)) - off) * t[3]
    a += (f32_from_bits(MB | (w1 & 0xFF)) - off) * t[4]
    a += (f32_from_bits(MB | ((w1 >> 8) & 0xFF)) - off) * t[5]
    a += (f32_from_bits(MB | ((w1 >> 16) & 0xFF)) - off) * t[6]
    a += (f32_from_bits(MB | ((w1 >> 24) & 0xFF)) - off) * t[7]
    return a


@cuda.jit(device=True, inline="always")
def _h2(raw, i):
    """Two consecutive uint16 words i, i+1 as one 32-bit value (2-byte-aligned formats)."""
    return int(raw[U(i)]) | (int(raw[U(i + 1)]) << 16)


@cuda.jit(device=True, inline="always")
def _spread4(n):
    """Bits 0..3 of n -> bit 0 of bytes 0..3 (no carries: the four shifted copies do not overlap)."""
    return ((n & 0xF) * 0x00204081) & N1


if SIMULATOR:
    from kernels.ptx import _warp_exchange  # numba's simulator has no shuffles; this emulates one warp's lanes

    def _butterfly(slots):
        v = [np.float32(s) for s in slots]
        for off in (16, 8, 4, 2, 1):
            v = [np.float32(v[lane] + v[lane ^ off]) for lane in range(32)]
        return v

    def _warp_sum(v):
        """Simulator form of the ``shfl_xor_sync`` butterfly below (same order of float32 additions)."""
        return _warp_exchange(_butterfly, v)

else:

    @cuda.jit(device=True, inline="always")
    def _warp_sum(v):
        """Sum of ``v`` over the 32 lanes of the (fully active) warp, in every lane: a 5-step xor butterfly."""
        v += cuda.shfl_xor_sync(0xFFFFFFFF, v, 16)
        v += cuda.shfl_xor_sync(0xFFFFFFFF, v, 8)
        v += cuda.shfl_xor_sync(0xFFFFFFFF, v, 4)
        v += cuda.shfl_xor_sync(0xFFFFFFFF, v, 2)
        v += cuda.shfl_xor_sync(0xFFFFFFFF, v, 1)
        return v


# ---- lane fetches shared by the f32-x and MMVQ dots ----------------------------------------------------------


@cuda.jit(device=True, inline="always")
def _q8_0_words(raw, bi, j):
    """Q8_0, uint16 view (17 per block): d | qs[32] int8. Lane j's loads: d (as float32) and qs bytes
    16j..16j+15 as four words (eight halfword loads)."""
    base = bi * 17
    qi = base + 1 + 8 * j
    return (f32_from_f16_bits(int(raw[U(base)])), _h2(raw, qi), _h2(raw, qi + 2), _h2(raw, qi + 4),
            _h2(raw, qi + 6))


@cuda.jit(device=True, inline="always")
def _q6_k_lane(raw, bi, j):
    """Q6_K, uint16 view (105 per block): ql[128] | qh[64] | scales[16] int8 | d. Weight 128h + 32s + t (t < 32):
    low 4 bits of ql[64h + 32*(s%2) + t] >> 4*(s/2), high 2 of qh[32h + t] >> 2s; scale 8h + 2s + t/16.
    Lane j (h = j/4, t0 = 8*(j%4)) gets d, the words a0, a1 (ql bytes 64h + t0 ..+7), b0, b1 (ql 64h + 32 + t0
    ..+7), m0, m1 (qh 32h + t0 ..+7) and its four int8 scales as bytes (`_i8`); `_q6_bytes` makes the stored
    6-bit q (0..63, weight = d * scale * (q - 32)) of plane s from the words."""
    return _q6_k_lane_at(raw, bi * 105, j)


@cuda.jit(device=True, inline="always")
def _q6_k_lane_at(raw, base, j):
    """`_q6_k_lane` of the block starting at element ``base`` of the uint16 array ``raw`` (105 elements a block:
    STAGE=2..4 read a block wherever the ring window put it)."""
    h = j >> 2
    e = (j & 3) >> 1
    d = f32_from_f16_bits(int(raw[U(base + 104)]))
    li = base + 32 * h + 4 * (j & 3)
    mi = base + 64 + 16 * h + 4 * (j & 3)
    a0 = _h2(raw, li)
    a1 = _h2(raw, li + 2)
    b0 = _h2(raw, li + 16)
    b1 = _h2(raw, li + 18)
    m0 = _h2(raw, mi)
    m1 = _h2(raw, mi + 2)
    si = base + 96 + 4 * h
    c0 = (int(raw[U(si)]) >> (8 * e)) & 0xFF
    c1 = (int(raw[U(si + 1)]) >> (8 * e)) & 0xFF
    c2 = (int(raw[U(si + 2)]) >> (8 * e)) & 0xFF
    c3 = (int(raw[U(si + 3)]) >> (8 * e)) & 0xFF
    return d, a0, a1, b0, b1, m0, m1, c0, c1, c2, c3


@cuda.jit(device=True, inline="always")
def _i8(c):
    """The int8 value of byte c (0..255), as float32 (converted from 32 bits: ``I2FP.F32.S32``, not the slower
    64-bit ``I2F.S64``)."""
    return np.float32(np.int32(c - ((c & 0x80) << 1)))


@cuda.jit(device=True, inline="always")
def _q6_bytes(lo, m, s):
    """Plane s (0..3) of a Q6_K lane word: low nibble (s < 2) or high nibble of ``lo`` | 2 bits of ``m`` << 4."""
    return ((lo >> (4 * (s >> 1))) & N4) | (((m >> (2 * s)) & N2) << 4)


@cuda.jit(device=True, inline="always")
def _scale_min_k4(s, a, c, e):
    """ggml's get_scale_min_k4 for sub-block s, given scales[s%4], scales[s%4 + 4], scales[s%4 + 8]. Converted
    from int64 (``I2F.S64``): the 32-bit conversion needs more registers, which spill under MINB=7's bound."""
    if s < 4:
        return np.float32(a & 63), np.float32(c & 63)
    return np.float32((e & 0xF) | ((a >> 6) << 4)), np.float32((e >> 4) | ((c >> 6) << 4))


@cuda.jit(device=True, inline="always")
def _k4_header(raw4, base, j):
    """d, dmin and the (scale, min) of sub-blocks 2i, 2i+1 from a Q4_K/Q5_K block's first 16 bytes."""
    hd, ha, hc, he = ld_global_v4_u32(raw4, base)
    return _k4_scales(hd, ha, hc, he, j)


@cuda.jit(device=True, inline="always")
def _k4_scales(hd, ha, hc, he, j):
    """`_k4_header` from the header's four words already loaded (d|dmin, scales 0..3, 4..7, 8..11)."""
    w = int(hd)
    s0 = 2 * (j >> 1)
    s1 = s0 + 1
    t0 = 8 * (s0 & 3)
    t1 = 8 * (s1 & 3)
    sc0, mn0 = _scale_min_k4(s0, (int(ha) >> t0) & 0xFF, (int(hc) >> t0) & 0xFF, (int(he) >> t0) & 0xFF)
    sc1, mn1 = _scale_min_k4(s1, (int(ha) >> t1) & 0xFF, (int(hc) >> t1) & 0xFF, (int(he) >> t1) & 0xFF)
    return f32_from_f16_bits(w & 0xFFFF), f32_from_f16_bits(w >> 16), sc0, mn0, sc1, mn1
