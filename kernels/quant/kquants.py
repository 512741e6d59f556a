"""K-quant dequantization kernels (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K): 256-weight super-blocks -> f16.

Every kernel has the same shape. Thread ``g`` writes output elements ``8g .. 8g+7`` of the flattened ``[od, id]``
f16 matrix with one 16-byte store (consecutive threads, consecutive 16-byte chunks: a warp writes 512
contiguous bytes), i.e. group ``p = g % 32`` of super-block ``b = g // 32``; a warp dequantizes one super-block.
Because ``id`` is a multiple of 256, super-block ``b`` (in storage order, row after row) lands at output
``256*b`` exactly, so no row arithmetic is needed.

Arithmetic reproduces gguf-py ``quants.py`` (``Q*_K.dequantize_blocks``) in float32 operation for operation:
products that are then added or subtracted use ``fmul_rn``/``fsub_rn`` so ptxas cannot fuse them into an fma
(numpy rounds twice), and the final float32 -> f16 is round-to-nearest-even as numpy's ``astype(float16)``.
The result is bit-identical to ``float16(gguf.quants.dequantize(raw, qtype))``.

Loads (see `kernels.quant.formats`): ``raw`` is passed as a view whose element width is the format's ``align``:
Q4_K and Q5_K (144 B, 176 B: 16-byte multiples) read 8-byte words; Q2_K (84 B) 4-byte words; Q3_K (110 B) and
Q6_K (210 B), whose blocks start only 2-byte aligned, 2-byte words. Layouts: ggml-common.h ``block_q*_K``
(QK_K = 256).

Indices are computed in int64 and cast to uint64 at each access, which drops numba's negative-index wraparound
code (the kernels never index negatively).
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from kernels.quant.bits import (
    F32_MAGIC,
    F32_MAGIC_BITS,
    f16x2_bits,
    f32_from_bits,
    f32_from_f16_bits,
    fmul_rn,
    fsub_rn,
    st_global_v4_u32,
)
from kernels.jit import kernel

U = np.uint64
LO32 = np.uint64(0xFFFFFFFF)
HI32 = np.uint64(32)
F32_MAGIC_P4 = np.float32(8388608.0 + 4.0)  # F32_MAGIC + 4: Q3_K's "minus 4 when the hmask bit is 0"
F32_MAGIC_P32 = np.float32(8388608.0 + 32.0)  # F32_MAGIC + 32: Q6_K's 6-bit offset


@kernel
def dequant_q2_k(raw, out, n_groups):
    """Q2_K, 84-byte blocks ``scales[16] | qs[64] | d f16 | dmin f16`` read as uint32 words (21 per block).

    Weight j (0..255): sc = scales[j/16]; q = qs[32*(j/128) + j%32] >> 2*((j/32)%4) & 3;
    w = (d*(sc & 0xF))*q - dmin*(sc >> 4).
    """
    g = cuda.grid(1)
    if g >= n_groups:
        return
    b = g >> 5
    p = g & 31
    base = b * 21
    dd = int(raw[U(base + 20)])
    d = f32_from_f16_bits(dd & 0xFFFF)
    dmin = f32_from_f16_bits(dd >> 16)
    sc = (int(raw[U(base + (p >> 3))]) >> (8 * ((p >> 1) & 3))) & 0xFF
    dl = fmul_rn(d, np.float32(sc & 0xF))
    ml = fmul_rn(dmin, np.float32(sc >> 4))
    qi = base + 4 + 8 * (p >> 4) + 2 * (p & 3)
    shift = 2 * ((p >> 2) & 3)
    lo = (int(raw[U(qi)]) >> shift) & 0x03030303
    hi = (int(raw[U(qi + 1)]) >> shift) & 0x03030303
    vals = cuda.local.array(8, np.float32)
    for i in range(8):
        word = lo if i < 4 else hi
        q = f32_from_bits(F32_MAGIC_BITS | ((word >> (8 * (i & 3))) & 3)) - F32_MAGIC
        vals[i] = fsub_rn(fmul_rn(dl, q), ml)
    st_global_v4_u32(
        out,
        g * 4,
        f16x2_bits(vals[0], vals[1]),
        f16x2_bits(vals[2], vals[3]),
        f16x2_bits(vals[4], vals[5]),
        f16x2_bits(vals[6], vals[7]),
    )


@kernel
def dequant_q3_k(raw, out, n_groups):
    """Q3_K, 110-byte blocks ``hmask[32] | qs[64] | scales[12] | d f16`` read as uint16 words (55 per block).

    Weight j: 6-bit scale i = j/16: low 4 bits ``scales[i%8] >> 4*(i/8)``, high 2 bits
    ``scales[8 + i%4] >> 2*(i/4)``, minus 32; q = (qs[32*(j/128) + j%32] >> 2*((j/32)%4) & 3) - 4 unless bit
    j/32 of hmask[j%32] is set; w = (d*scale)*q.
    """
    g = cuda.grid(1)
    if g >= n_groups:
        return
    b = g >> 5
    p = g & 31
    base = b * 55
    d = f32_from_f16_bits(int(raw[U(base + 54)]))
    i = p >> 1
    lb = 96 + (i & 7)  # byte offsets of the scale's low and high bits
    hb = 104 + (i & 3)
    low = (int(raw[U(base + (lb >> 1))]) >> (8 * (lb & 1) + 4 * (i >> 3))) & 0xF
    high = (int(raw[U(base + (hb >> 1))]) >> (8 * (hb & 1) + 2 * (i >> 2))) & 3
    dl = fmul_rn(d, np.float32((low | (high << 4)) - 32))
    qi = base + 16 + 16 * (p >> 4) + 4 * (p & 3)  # qs bytes 32 + 32*(j/128) + 8*(p%4), as uint16 index
    mi = base + 4 * (p & 3)  # hmask bytes 8*(p%4)
    shift = 2 * ((p >> 2) & 3)
    hbit = p >> 2
    qlo = int(raw[U(qi)]) | (int(raw[U(qi + 1)]) << 16)
    qhi = int(raw[U(qi + 2)]) | (int(raw[U(qi + 3)]) << 16)
    mlo = int(raw[U(mi)]) | (int(raw[U(mi + 1)]) << 16)
    mhi = int(raw[U(mi + 2)]) | (int(raw[U(mi + 3)]) << 16)
    qlo = ((qlo >> shift) & 0x03030303) | (((mlo >> hbit) & 0x01010101) << 2)
    qhi = ((qhi >> shift) & 0x03030303) | (((mhi >> hbit) & 0x01010101) << 2)
    vals = cuda.local.array(8, np.float32)
    for k in range(8):
        word = qlo if k < 4 else qhi
        # (2 low bits | hmask bit << 2) - 4 = q - (hmask bit ? 0 : 4)
        q = f32_from_bits(F32_MAGIC_BITS | ((word >> (8 * (k & 3))) & 7)) - F32_MAGIC_P4
        vals[k] = fmul_rn(dl, q)
    st_global_v4_u32(
        out,
        g * 4,
        f16x2_bits(vals[0], vals[1]),
        f16x2_bits(vals[2], vals[3]),
        f16x2_bits(vals[4], vals[5]),
        f16x2_bits(vals[6], vals[7]),
    )


@kernel
def dequant_q4_k(raw, out, n_groups):
    """Q4_K, 144-byte blocks ``d f16 | dmin f16 | scales[12] | qs[128]`` read as uint64 words (18 per block).

    Weight j: sub-block s = j/32 with 6-bit scale sc and min m unpacked from scales[12] as ggml's
    ``get_scale_min_k4``; q = qs[32*(s/2) + j%32] >> 4*(s%2) & 0xF; w = (d*sc)*q - dmin*m.
    """
    g = cuda.grid(1)
    if g >= n_groups:
        return
    b = g >> 5
    p = g & 31
    base = b * 18
    h0 = raw[U(base)]  # d | dmin | scales[0..3]
    h1 = raw[U(base + 1)]  # scales[4..11]
    qw = raw[U(base + 2 + 4 * (p >> 3) + (p & 3))]
    w0 = int(h0 & LO32)
    d = f32_from_f16_bits(w0 & 0xFFFF)
    dmin = f32_from_f16_bits(w0 >> 16)
    s = p >> 2
    t = 8 * (s & 3)
    a = (int(h0 >> HI32) >> t) & 0xFF  # scales[s % 4]
    c = (int(h1 & LO32) >> t) & 0xFF  # scales[s % 4 + 4]
    e = (int(h1 >> HI32) >> t) & 0xFF  # scales[s % 4 + 8]
    sc = (a & 63) if s < 4 else ((e & 0xF) | ((a >> 6) << 4))
    m = (c & 63) if s < 4 else ((e >> 4) | ((c >> 6) << 4))
    dsc = fmul_rn(d, np.float32(sc))
    dm = fmul_rn(dmin, np.float32(m))
    shift = 4 * (s & 1)
    lo = (int(qw & LO32) >> shift) & 0x0F0F0F0F
    hi = (int(qw >> HI32) >> shift) & 0x0F0F0F0F
    vals = cuda.local.array(8, np.float32)
    for k in range(8):
        word = lo if k < 4 else hi
        q = f32_from_bits(F32_MAGIC_BITS | ((word >> (8 * (k & 3))) & 0xF)) - F32_MAGIC
        vals[k] = fsub_rn(fmul_rn(dsc, q), dm)
    st_global_v4_u32(
        out,
        g * 4,
        f16x2_bits(vals[0], vals[1]),
        f16x2_bits(vals[2], vals[3]),
        f16x2_bits(vals[4], vals[5]),
        f16x2_bits(vals[6], vals[7]),
    )


@kernel
def dequant_q5_k(raw, out, n_groups):
    """Q5_K, 176-byte blocks ``d f16 | dmin f16 | scales[12] | qh[32] | qs[128]`` read as uint64 words (22 per
    block). As Q4_K with a fifth bit: q = (qs nibble) | (bit s of qh[j%32]) << 4, s = j/32."""
    g = cuda.grid(1)
    if g >= n_groups:
        return
    b = g >> 5
    p = g & 31
    base = b * 22
    h0 = raw[U(base)]
    h1 = raw[U(base + 1)]
    hw = raw[U(base + 2 + (p & 3))]  # qh bytes 8*(p%4) .. +8
    qw = raw[U(base + 6 + 4 * (p >> 3) + (p & 3))]  # qs bytes 32*(s/2) + 8*(p%4) .. +8
    w0 = int(h0 & LO32)
    d = f32_from_f16_bits(w0 & 0xFFFF)
    dmin = f32_from_f16_bits(w0 >> 16)
    s = p >> 2
    t = 8 * (s & 3)
    a = (int(h0 >> HI32) >> t) & 0xFF
    c = (int(h1 & LO32) >> t) & 0xFF
    e = (int(h1 >> HI32) >> t) & 0xFF
    sc = (a & 63) if s < 4 else ((e & 0xF) | ((a >> 6) << 4))
    m = (c & 63) if s < 4 else ((e >> 4) | ((c >> 6) << 4))
    dsc = fmul_rn(d, np.float32(sc))
    dm = fmul_rn(dmin, np.float32(m))
    shift = 4 * (s & 1)
    lo = ((int(qw & LO32) >> shift) & 0x0F0F0F0F) | (((int(hw & LO32) >> s) & 0x01010101) << 4)
    hi = ((int(qw >> HI32) >> shift) & 0x0F0F0F0F) | (((int(hw >> HI32) >> s) & 0x01010101) << 4)
    vals = cuda.local.array(8, np.float32)
    for k in range(8):
        word = lo if k < 4 else hi
        q = f32_from_bits(F32_MAGIC_BITS | ((word >> (8 * (k & 3))) & 0x1F)) - F32_MAGIC
        vals[k] = fsub_rn(fmul_rn(dsc, q), dm)
    st_global_v4_u32(
        out,
        g * 4,
        f16x2_bits(vals[0], vals[1]),
        f16x2_bits(vals[2], vals[3]),
        f16x2_bits(vals[4], vals[5]),
        f16x2_bits(vals[6], vals[7]),
    )


@kernel
def dequant_q6_k(raw, out, n_groups):
    """Q6_K, 210-byte blocks ``ql[128] | qh[64] | scales[16] int8 | d f16`` read as uint16 words (105 per block).

    Weight j: h = j/128, r = j%128: low 4 bits ``ql[64h + r%64] >> 4*(r/64)``, high 2 bits
    ``qh[32h + r%32] >> 2*(r/32)``; q = q6 - 32; w = (d*scales[j/16])*q.
    """
    g = cuda.grid(1)
    if g >= n_groups:
        return
    b = g >> 5
    p = g & 31
    base = b * 105
    d = f32_from_f16_bits(int(raw[U(base + 104)]))
    sb = int(raw[U(base + 96 + (p >> 2))]) >> (8 * ((p >> 1) & 1)) & 0xFF  # scales[p/2]
    dsc = fmul_rn(d, np.float32(sb - ((sb & 0x80) << 1)))  # int8
    li = base + 32 * (p >> 4) + 4 * (p & 7)  # ql bytes 64h + 8*(p%8)
    hi_ = base + 64 + 16 * (p >> 4) + 4 * (p & 3)  # qh bytes 128 + 32h + 8*(p%4)
    lshift = 4 * ((p >> 3) & 1)
    hshift = 2 * ((p >> 2) & 3)
    l0 = int(raw[U(li)]) | (int(raw[U(li + 1)]) << 16)
    l1 = int(raw[U(li + 2)]) | (int(raw[U(li + 3)]) << 16)
    m0 = int(raw[U(hi_)]) | (int(raw[U(hi_ + 1)]) << 16)
    m1 = int(raw[U(hi_ + 2)]) | (int(raw[U(hi_ + 3)]) << 16)
    q0 = ((l0 >> lshift) & 0x0F0F0F0F) | (((m0 >> hshift) & 0x03030303) << 4)
    q1 = ((l1 >> lshift) & 0x0F0F0F0F) | (((m1 >> hshift) & 0x03030303) << 4)
    vals = cuda.local.array(8, np.float32)
    for k in range(8):
        word = q0 if k < 4 else q1
        q = f32_from_bits(F32_MAGIC_BITS | ((word >> (8 * (k & 3))) & 0x3F)) - F32_MAGIC_P32
        vals[k] = fmul_rn(dsc, q)
    st_global_v4_u32(
        out,
        g * 4,
        f16x2_bits(vals[0], vals[1]),
        f16x2_bits(vals[2], vals[3]),
        f16x2_bits(vals[4], vals[5]),
        f16x2_bits(vals[6], vals[7]),
    )


KERNELS = {
    "Q2_K": dequant_q2_k,
    "Q3_K": dequant_q3_k,
    "Q4_K": dequant_q4_k,
    "Q5_K": dequant_q5_k,
    "Q6_K": dequant_q6_k,
}
"""Format name -> kernel ``(raw view, out uint32 view, n_groups)``; one thread per 8 outputs."""
