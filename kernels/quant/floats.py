"""Float-format dequantization kernels: F16, BF16, F32 (one value per element) and MXFP4 (E2M1 + E8M0) -> f16.

F16 / BF16 / F32 (``raw`` 16-byte aligned): thread ``g`` converts elements ``8g .. 8g+7`` with 16-byte loads
(``ld.global.v4.u32``: one for F16/BF16, two for F32) and one 16-byte store; the last thread handles the
``n % 8`` tail element by element (2- or 4-byte accesses). Arguments: ``(raw_v4, raw_el, out_v4, out_el, n)``:
``raw_v4`` is the uint32 view of the ``n - n % 8`` leading elements, ``raw_el`` the view with one element per
value (uint16 for F16/BF16, uint32 for F32), ``out_v4`` / ``out_el`` the uint32 / uint16 views of the flat
output, ``n = od*id``. Conversions: F16 is a copy; BF16 -> float32 is ``bits << 16`` (gguf-py ``BF16``),
float32 -> f16 rounds to nearest even (numpy ``astype(float16)``), so out == float16(gguf reference) exactly.

MXFP4 (17-byte blocks ``e | qs[16]``, 1-byte aligned: read byte by byte): thread g writes weights 8p .. 8p+7 of
block g // 4, p = g % 4; weight j is the E2M1 nibble ``qs[j % 16] >> 4*(j / 16)`` times the E8M0 scale
2^(e-127). The nibble (sign | 2 exponent bits | 1 mantissa bit, OCP MX spec v1.0 §5.3.3) is decoded to its
float32 bit pattern, not looked up as an integer, and gguf-py's order of operations is kept: ``d_half *
(2*e2m1)`` with ``d_half = 2^(e-128)`` as ggml's ``ggml_e8m0_to_fp32_half`` builds it (exact products, so
e = 255 also matches the reference instead of being NaN). ggml-common.h ``block_mxfp4``.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from kernels.quant.bits import (
    f16x2_bits,
    f32_from_bits,
    fmul_rn,
    ld_global_v4_u32,
    st_global_v4_u32,
)
from kernels.jit import kernel

U = np.uint64


@kernel
def dequant_f16(raw_v4, raw_el, out_v4, out_el, n):
    """F16 -> f16: a 16-byte copy per thread, element copy for the n % 8 tail."""
    g = cuda.grid(1)
    n8 = n >> 3
    if g < n8:
        x0, x1, x2, x3 = ld_global_v4_u32(raw_v4, g * 4)
        st_global_v4_u32(out_v4, g * 4, x0, x1, x2, x3)
    elif g == n8:
        for e in range(n8 * 8, n):
            out_el[U(e)] = raw_el[U(e)]


@kernel
def dequant_bf16(raw_v4, raw_el, out_v4, out_el, n):
    """BF16 -> f16: float32 = bf16 bits << 16, rounded to f16 (nearest even)."""
    g = cuda.grid(1)
    n8 = n >> 3
    if g < n8:
        x0, x1, x2, x3 = ld_global_v4_u32(raw_v4, g * 4)
        st_global_v4_u32(
            out_v4,
            g * 4,
            f16x2_bits(f32_from_bits(int(x0) << 16), f32_from_bits(int(x0) & 0xFFFF0000)),
            f16x2_bits(f32_from_bits(int(x1) << 16), f32_from_bits(int(x1) & 0xFFFF0000)),
            f16x2_bits(f32_from_bits(int(x2) << 16), f32_from_bits(int(x2) & 0xFFFF0000)),
            f16x2_bits(f32_from_bits(int(x3) << 16), f32_from_bits(int(x3) & 0xFFFF0000)),
        )
    elif g == n8:
        for e in range(n8 * 8, n):
            out_el[U(e)] = f16x2_bits(f32_from_bits(int(raw_el[U(e)]) << 16), np.float32(0)) & 0xFFFF


@kernel
def dequant_f32(raw_v4, raw_el, out_v4, out_el, n):
    """F32 -> f16, rounded to nearest even."""
    g = cuda.grid(1)
    n8 = n >> 3
    if g < n8:
        a0, a1, a2, a3 = ld_global_v4_u32(raw_v4, g * 8)
        b0, b1, b2, b3 = ld_global_v4_u32(raw_v4, g * 8 + 4)
        st_global_v4_u32(
            out_v4,
            g * 4,
            f16x2_bits(f32_from_bits(a0), f32_from_bits(a1)),
            f16x2_bits(f32_from_bits(a2), f32_from_bits(a3)),
            f16x2_bits(f32_from_bits(b0), f32_from_bits(b1)),
            f16x2_bits(f32_from_bits(b2), f32_from_bits(b3)),
        )
    elif g == n8:
        for e in range(n8 * 8, n):
            out_el[U(e)] = f16x2_bits(f32_from_bits(raw_el[U(e)]), np.float32(0)) & 0xFFFF


@kernel
def dequant_mxfp4(raw, out, n_groups):
    """MXFP4, 17-byte blocks ``e (E8M0) | qs[16] (E2M1 nibbles)`` read byte by byte (uint8 view)."""
    g = cuda.grid(1)
    if g >= n_groups:
        return
    b = g >> 2
    p = g & 3
    base = b * 17
    e = int(raw[U(base)])
    d_half = f32_from_bits((0x00200000 << e) if e < 2 else ((e - 1) << 23))  # 2^(e-128), ggml's formula
    qi = base + 1 + 8 * (p & 1)
    shift = 4 * (p >> 1)
    vals = cuda.local.array(8, np.float32)
    for k in range(8):
        v = (int(raw[U(qi + k)]) >> shift) & 0xF
        em = v & 7  # exponent (2 bits) | mantissa (1 bit)
        ex = em >> 1
        # float32 bits of 2*|e2m1|: 0 -> 0, subnormal 0.5 -> 1.0, else 2^ex * (1 + m/2)
        mag = 0 if em == 0 else ((127 << 23) if em == 1 else (((127 + ex) << 23) | ((em & 1) << 22)))
        sign = ((v >> 3) << 31) if em != 0 else 0  # -0 decodes as +0, as in the reference's table
        vals[k] = fmul_rn(d_half, f32_from_bits(sign | mag))
    st_global_v4_u32(
        out,
        g * 4,
        f16x2_bits(vals[0], vals[1]),
        f16x2_bits(vals[2], vals[3]),
        f16x2_bits(vals[4], vals[5]),
        f16x2_bits(vals[6], vals[7]),
    )


ELEMENT_KERNELS = {"F16": dequant_f16, "BF16": dequant_bf16, "F32": dequant_f32}
"""Format name -> kernel ``(raw_v4, raw_el, out_v4, out_el, n)``; one thread per 8 elements plus the tail."""

KERNELS = {"MXFP4": dequant_mxfp4}
"""Format name -> kernel ``(raw view, out uint32 view, n_groups)``; one thread per 8 outputs."""
