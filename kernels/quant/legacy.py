"""Legacy-quant dequantization kernels (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): 32-weight blocks -> f16.

Thread ``g`` writes output elements ``8g .. 8g+7`` of the flattened ``[od, id]`` f16 matrix with one 16-byte
store: part ``p = g % 4`` of block ``b = g // 4`` (``id`` is a multiple of 32, so block ``b`` lands at output
``32*b``). Part p covers weights 8p .. 8p+7, i.e. nibble plane ``p / 2`` (low nibbles are weights 0..15, high
nibbles 16..31) of qs bytes ``8*(p%2) .. +8``.

Arithmetic reproduces gguf-py ``quants.py`` (``Q*_*.dequantize_blocks``) in float32: ``d*q`` or
``d*q + m`` with ``fmul_rn``/``fadd_rn`` (no fma contraction), then round-to-nearest-even to f16, so the output
is bit-identical to ``float16(gguf.quants.dequantize(raw, qtype))``.

Loads: ``raw`` arrives as a view whose element width is the format's ``align`` (`kernels.quant.formats`): Q4_0
(18 B), Q5_0 (22 B) and Q8_0 (34 B) blocks start only 2-byte aligned and are read as uint16 words (Q5_0's qh,
at byte 2 of the block, is assembled from two uint16: a uint32 load there faults on every other block); Q4_1
(20 B) as uint32 words, Q5_1 (24 B) as uint64 words. Layouts: ggml-common.h ``block_q4_0`` .. ``block_q8_0``.
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
    fadd_rn,
    fmul_rn,
    st_global_v4_u32,
)
from kernels.jit import kernel

U = np.uint64
LO32 = np.uint64(0xFFFFFFFF)
HI32 = np.uint64(32)
F32_MAGIC_P8 = np.float32(8388608.0 + 8.0)  # Q4_0: q - 8
F32_MAGIC_P16 = np.float32(8388608.0 + 16.0)  # Q5_0: q - 16
F32_MAGIC_P128 = np.float32(8388608.0 + 128.0)  # Q8_0: (byte ^ 0x80) - 128 = int8


@kernel
def dequant_q4_0(raw, out, n_groups):
    """Q4_0, 18-byte blocks ``d f16 | qs[16]`` read as uint16 words (9 per block); w = d*(nibble - 8)."""
    g = cuda.grid(1)
    if g >= n_groups:
        return
    b = g >> 2
    p = g & 3
    base = b * 9
    d = f32_from_f16_bits(int(raw[U(base)]))
    qi = base + 1 + 4 * (p & 1)
    shift = 4 * (p >> 1)
    lo = ((int(raw[U(qi)]) | (int(raw[U(qi + 1)]) << 16)) >> shift) & 0x0F0F0F0F
    hi = ((int(raw[U(qi + 2)]) | (int(raw[U(qi + 3)]) << 16)) >> shift) & 0x0F0F0F0F
    vals = cuda.local.array(8, np.float32)
    for k in range(8):
        word = lo if k < 4 else hi
        q = f32_from_bits(F32_MAGIC_BITS | ((word >> (8 * (k & 3))) & 0xF)) - F32_MAGIC_P8
        vals[k] = fmul_rn(d, q)
    st_global_v4_u32(
        out,
        g * 4,
        f16x2_bits(vals[0], vals[1]),
        f16x2_bits(vals[2], vals[3]),
        f16x2_bits(vals[4], vals[5]),
        f16x2_bits(vals[6], vals[7]),
    )


@kernel
def dequant_q4_1(raw, out, n_groups):
    """Q4_1, 20-byte blocks ``d f16 | m f16 | qs[16]`` read as uint32 words (5 per block); w = d*nibble + m."""
    g = cuda.grid(1)
    if g >= n_groups:
        return
    b = g >> 2
    p = g & 3
    base = b * 5
    dm = int(raw[U(base)])
    d = f32_from_f16_bits(dm & 0xFFFF)
    m = f32_from_f16_bits(dm >> 16)
    qi = base + 1 + 2 * (p & 1)
    shift = 4 * (p >> 1)
    lo = (int(raw[U(qi)]) >> shift) & 0x0F0F0F0F
    hi = (int(raw[U(qi + 1)]) >> shift) & 0x0F0F0F0F
    vals = cuda.local.array(8, np.float32)
    for k in range(8):
        word = lo if k < 4 else hi
        q = f32_from_bits(F32_MAGIC_BITS | ((word >> (8 * (k & 3))) & 0xF)) - F32_MAGIC
        vals[k] = fadd_rn(fmul_rn(d, q), m)
    st_global_v4_u32(
        out,
        g * 4,
        f16x2_bits(vals[0], vals[1]),
        f16x2_bits(vals[2], vals[3]),
        f16x2_bits(vals[4], vals[5]),
        f16x2_bits(vals[6], vals[7]),
    )


@kernel
def dequant_q5_0(raw, out, n_groups):
    """Q5_0, 22-byte blocks ``d f16 | qh[4] | qs[16]`` read as uint16 words (11 per block).

    Weight j: q = nibble | (bit j of qh) << 4; w = d*(q - 16).
    """
    g = cuda.grid(1)
    if g >= n_groups:
        return
    b = g >> 2
    p = g & 3
    base = b * 11
    d = f32_from_f16_bits(int(raw[U(base)]))
    qh = int(raw[U(base + 1)]) | (int(raw[U(base + 2)]) << 16)  # bytes 2..5: never one uint32 load
    hb = (qh >> (8 * p)) & 0xFF  # fifth bits of weights 8p .. 8p+7
    qi = base + 3 + 4 * (p & 1)
    shift = 4 * (p >> 1)
    lo = ((int(raw[U(qi)]) | (int(raw[U(qi + 1)]) << 16)) >> shift) & 0x0F0F0F0F
    hi = ((int(raw[U(qi + 2)]) | (int(raw[U(qi + 3)]) << 16)) >> shift) & 0x0F0F0F0F
    vals = cuda.local.array(8, np.float32)
    for k in range(8):
        word = lo if k < 4 else hi
        q5 = ((word >> (8 * (k & 3))) & 0xF) | (((hb >> k) & 1) << 4)
        vals[k] = fmul_rn(d, f32_from_bits(F32_MAGIC_BITS | q5) - F32_MAGIC_P16)
    st_global_v4_u32(
        out,
        g * 4,
        f16x2_bits(vals[0], vals[1]),
        f16x2_bits(vals[2], vals[3]),
        f16x2_bits(vals[4], vals[5]),
        f16x2_bits(vals[6], vals[7]),
    )


@kernel
def dequant_q5_1(raw, out, n_groups):
    """Q5_1, 24-byte blocks ``d f16 | m f16 | qh[4] | qs[16]`` read as uint64 words (3 per block).

    Weight j: q = nibble | (bit j of qh) << 4; w = d*q + m.
    """
    g = cuda.grid(1)
    if g >= n_groups:
        return
    b = g >> 2
    p = g & 3
    base = b * 3
    h = raw[U(base)]
    dm = int(h & LO32)
    d = f32_from_f16_bits(dm & 0xFFFF)
    m = f32_from_f16_bits(dm >> 16)
    hb = (int(h >> HI32) >> (8 * p)) & 0xFF
    qw = raw[U(base + 1 + (p & 1))]
    shift = 4 * (p >> 1)
    lo = (int(qw & LO32) >> shift) & 0x0F0F0F0F
    hi = (int(qw >> HI32) >> shift) & 0x0F0F0F0F
    vals = cuda.local.array(8, np.float32)
    for k in range(8):
        word = lo if k < 4 else hi
        q5 = ((word >> (8 * (k & 3))) & 0xF) | (((hb >> k) & 1) << 4)
        vals[k] = fadd_rn(fmul_rn(d, f32_from_bits(F32_MAGIC_BITS | q5) - F32_MAGIC), m)
    st_global_v4_u32(
        out,
        g * 4,
        f16x2_bits(vals[0], vals[1]),
        f16x2_bits(vals[2], vals[3]),
        f16x2_bits(vals[4], vals[5]),
        f16x2_bits(vals[6], vals[7]),
    )


@kernel
def dequant_q8_0(raw, out, n_groups):
    """Q8_0, 34-byte blocks ``d f16 | qs[32] int8`` read as uint16 words (17 per block); w = qs[j]*d."""
    g = cuda.grid(1)
    if g >= n_groups:
        return
    b = g >> 2
    p = g & 3
    base = b * 17
    d = f32_from_f16_bits(int(raw[U(base)]))
    qi = base + 1 + 4 * p
    lo = int(raw[U(qi)]) | (int(raw[U(qi + 1)]) << 16)
    hi = int(raw[U(qi + 2)]) | (int(raw[U(qi + 3)]) << 16)
    vals = cuda.local.array(8, np.float32)
    for k in range(8):
        word = lo if k < 4 else hi
        q = f32_from_bits(F32_MAGIC_BITS | (((word >> (8 * (k & 3))) & 0xFF) ^ 0x80)) - F32_MAGIC_P128
        vals[k] = fmul_rn(q, d)
    st_global_v4_u32(
        out,
        g * 4,
        f16x2_bits(vals[0], vals[1]),
        f16x2_bits(vals[2], vals[3]),
        f16x2_bits(vals[4], vals[5]),
        f16x2_bits(vals[6], vals[7]),
    )


KERNELS = {
    "Q4_0": dequant_q4_0,
    "Q4_1": dequant_q4_1,
    "Q5_0": dequant_q5_0,
    "Q5_1": dequant_q5_1,
    "Q8_0": dequant_q8_0,
}
"""Format name -> kernel ``(raw view, out uint32 view, n_groups)``; one thread per 8 outputs."""
