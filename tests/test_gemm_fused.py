"""kernels/gemm_fused.py: the fused GEMM's format side (the kernel's tests: tests/test_gemm_fused_regs.py).

* simulator session: `q4_k_scales_mins` against gguf's ``Q4_K.get_scale_min`` on fresh random headers; `q4_k_low` /
  `q4_k_high` against numpy on every pair of codes;
* everywhere: `fused_f16_weights`, the f16 weights of the kernels' f16x2 arithmetic modelled in numpy, against
  gguf-py's dequantization; the argument checks' one-line refusals.
"""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

from kernels import gemm_fused as F
from kernels.errors import KernelConstraintError
from kernels.ptx import SIMULATOR
from minfer_cli.experiment import rel_l2
from minfer_cli.quant_blocks import random_blocks, reference_f16

sim = pytest.mark.skipif(not SIMULATOR, reason="simulator session only (NUMBA_ENABLE_CUDASIM=1)")


def _operands(nt, rows, id_, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((nt, id_)).astype(np.float16)
    raws = [random_blocks("Q4_K", r, id_, rng) for r in rows]
    w16 = np.concatenate([reference_f16(raw, "Q4_K", r, id_) for raw, r in zip(raws, rows)])
    return a, raws, w16


def fused_f16_weights(raw, rows: int, id_: int) -> np.ndarray:
    """The f16 [rows, id] weights the fused kernel's arithmetic makes of Q4_K bytes ``raw``, modelled in numpy: each
    sub-block's d·sc and -dmin·m as float32 products rounded to f16 (gguf's ``get_scale_min``), then every weight
    ``q · s16 + m16`` rounded once to f16 (`kernels.gemm_fused.q4_k_low` / `q4_k_high`: ``fma.rn.f16x2``; the
    product and sum are exact in float64). Layout: ggml-common.h ``block_q4_K``."""
    from gguf import quants

    blocks = raw.reshape(rows * id_ // 256, 144)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
    dmin = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
    sc, mn = quants.Q4_K.get_scale_min(blocks[:, 4:16].copy())
    s16 = (d * sc.astype(np.float32)).astype(np.float16).astype(np.float64)  # [blocks, 8 sub-blocks]
    m16 = (-(dmin * mn.astype(np.float32))).astype(np.float16).astype(np.float64)
    qs = blocks[:, 16:].reshape(-1, 4, 32)  # 4 groups of 32 bytes: low nibbles sub-block 2g, high 2g + 1
    q = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(-1, 8, 32).astype(np.float64)
    return (q * s16[:, :, None] + m16[:, :, None]).astype(np.float16).reshape(rows, id_)


@sim
def test_q4_k_scales_mins_matches_gguf():
    """`q4_k_scales_mins` for every 64-weight group g of fresh random Q4_K headers (all 6-bit codes and top bits
    exercised) equals gguf's ``Q4_K.get_scale_min``: d * sc and -dmin * m in float32, rounded to f16, in both halves."""
    from gguf import quants

    n = 64
    rng = np.random.default_rng()
    scales = rng.integers(0, 256, (n, 12), dtype=np.uint8)
    dd = (rng.standard_normal((n, 2)) * 0.05).astype(np.float16)
    words = scales.view("<u4")  # (n, 3)

    @cuda.jit
    def kernel(dd, words, out):
        i = cuda.grid(1)
        if i < out.shape[0]:
            for g in range(4):
                r = F.q4_k_scales_mins(np.float32(dd[i, 0]), np.float32(dd[i, 1]), g, words[i, 0], words[i, 1],
                                       words[i, 2])
                for k in range(4):
                    out[i, g, k] = r[k]

    out = cuda.to_device(np.zeros((n, 4, 4), np.uint32))
    kernel[1, n](cuda.to_device(dd), cuda.to_device(words), out)
    got = out.copy_to_host()
    sc, mn = quants.Q4_K.get_scale_min(scales.copy())
    d, dmin = dd[:, :1].astype(np.float32), dd[:, 1:].astype(np.float32)
    s16 = (d * sc.astype(np.float32)).astype(np.float16).view(np.uint16).astype(np.uint32)
    m16 = (-(dmin * mn.astype(np.float32))).astype(np.float16).view(np.uint16).astype(np.uint32)
    both = lambda h: h | (h << 16)  # noqa: E731
    want = np.stack([both(s16[:, 0::2]), both(m16[:, 0::2]), both(s16[:, 1::2]), both(m16[:, 1::2])], axis=-1)
    np.testing.assert_array_equal(got, want)


@sim
def test_q4_k_low_and_high_are_code_times_scale_plus_min():
    """`q4_k_low` / `q4_k_high` on words whose bytes 0 and 2 hold every pair of qs bytes (all 16 codes in both
    nibbles) and whose bytes 1 and 3 are random (ignored), with fresh random f16 scales and minima: each half is
    ``code * s + m`` rounded once to f16 (float64 is exact), the low half from byte 0."""
    rng = np.random.default_rng()
    b0, b2 = np.meshgrid(np.arange(256), np.arange(256))
    n = b0.size
    noise = rng.integers(0, 256, (2, n))
    words = (b0.ravel() | noise[0] << 8 | b2.ravel() << 16 | noise[1] << 24).astype(np.uint32)
    sm = (rng.standard_normal((n, 4)) * 0.05).astype(np.float16)  # s_lo, s_hi, m_lo, m_hi per word
    pairs = np.stack([sm, sm], axis=-1).view(np.uint32)[..., 0]  # (n, 4): each value in both halves

    @cuda.jit
    def kernel(words, pairs, out):
        i = cuda.grid(1)
        if i < out.shape[0]:
            out[i, 0] = F.q4_k_low(words[i], pairs[i, 0], pairs[i, 2])
            out[i, 1] = F.q4_k_high(words[i], pairs[i, 1], pairs[i, 3])

    out = cuda.to_device(np.zeros((n, 2), np.uint32))
    kernel[n // 256, 256](cuda.to_device(words), cuda.to_device(pairs), out)
    got = out.copy_to_host().view(np.float16).reshape(n, 2, 2)  # [word, low | high, half]
    s, m = sm.astype(np.float64)[:, :2], sm.astype(np.float64)[:, 2:]
    b0, b2 = b0.ravel(), b2.ravel()
    codes = np.stack([np.stack([b0 & 15, b2 & 15], -1), np.stack([b0 >> 4, b2 >> 4], -1)], 1)
    want = (codes * s[:, :, None] + m[:, :, None]).astype(np.float16)
    np.testing.assert_array_equal(got, want)


def _bad_calls():
    """(call, the words its one-line refusal must hold)."""
    a = np.zeros((4, 256), np.float16)
    raw = np.zeros(2 * 144, np.uint8)
    return [
        (lambda: F.check_segments(a, [(raw, 2)], "Q6_K"), "Q6_K have no dequantizer in the fused GEMM; types: Q4_K"),
        (lambda: F.check_segments(np.zeros((4, 128), np.float16), [(raw, 2)], "Q4_K"), "multiple of 256"),
        (lambda: F.check_segments(a, [(raw, 3)], "Q4_K"), "segment 0 must be the 3 x 144 bytes"),
        (lambda: F.check_segments(a, [(raw.view(np.uint16), 2)], "Q4_K"), "1-D uint8"),
        (lambda: F.check_segments(a, [(raw, 2)] * 4, "Q4_K"), "1 to 3 weight segments"),
        (lambda: F.check_segments(a, [(raw, 2), (raw, 2)], "Q4_K"), "segment 1 starts at row 2; .* multiple of 64"),
        (lambda: F.check_segments(a, [(raw, 2)], "Q4_K", out=np.zeros((4, 2), np.float16)), "C-contiguous float32"),
        (lambda: F.check_segments(np.zeros((4, 0), np.float16), [(raw[:0], 2)], "Q4_K"), "positive multiple of 256"),
        (lambda: F.check_segments(a, [(np.zeros(4 * 144, np.uint8)[::2], 2)], "Q4_K"), "contiguous 1-D uint8"),
        (lambda: F.check_segments(a, [(raw, 2.0)], "Q4_K"), "whole number of rows"),
        (lambda: F.check_on_device([(raw, 2)]), "segment 0 is a host array"),
        (lambda: F.check_segments(a.astype(np.float32), [(raw, 2)], "Q4_K"), "float16"),
        (lambda: F.check_segments(a, [(raw, 2)], "Q4_K", out=np.zeros((4, 3), np.float32)), r"float32 \[4, 2\]"),
    ]


@pytest.mark.parametrize("index", range(len(_bad_calls())))
def test_fused_refuses_bad_input_in_one_line(index):
    call, match = _bad_calls()[index]
    with pytest.raises(KernelConstraintError, match=match) as err:
        call()
    assert "\n" not in str(err.value)


def test_the_fused_weights_model_is_gguf_dequantization_to_an_f16_ulp():
    """`fused_f16_weights` on fresh random Q4_K rows is gguf-py's dequantization within the f16 rounding of the two
    terms (and not equal to it everywhere: the model does round differently), so the kernels' second reference is
    the right weights."""
    rows, id_ = 64, 512
    raw = random_blocks("Q4_K", rows, id_, np.random.default_rng())
    got = fused_f16_weights(raw, rows, id_).astype(np.float64)
    ref = reference_f16(raw, "Q4_K", rows, id_).astype(np.float64)
    assert rel_l2(got, ref) < 1e-3 and not np.array_equal(got, ref)
