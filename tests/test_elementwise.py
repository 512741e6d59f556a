"""The elementwise kernels of the forward pass: RMSNorm, RoPE, SwiGLU, embedding gather, residual / bias adds.

Simulator session: tiny shapes with tails (d=200, nt=3, head_dim=10), fresh random inputs every run, outputs
poisoned with NaN before the launch, each kernel against a numpy float64 reference. Relative error
``||out - ref|| / ||ref||`` bounds: F32_TOL = 1e-5 for f32 outputs, F16_TOL = 1e-3 for f16 outputs (one f16
rounding is ~2^-11 = 4.9e-4 per element); the embedding gather is compared bit for bit with gguf-py. Every
rejected input raises KernelConstraintError.
`compile` (no simulator): every kernel builds for sm_90 with no local memory (`.local` absent from the PTX).
`gpu`: qwen2-7B shapes (nt=2048, hidden 3584, ffn 18944, 28 q heads / 4 kv heads of 128) on the device.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import quants
from gguf.constants import GGMLQuantizationType
from numba import cuda

from kernels.activation import swiglu
from kernels.embedding import SUPPORTED as EMBED_TYPES
from kernels.embedding import embedding
from kernels.errors import KernelConstraintError
from kernels.norm import add_rms_norm, rms_norm, rms_norm_q8
from kernels.residual import bias_add, residual_add
from kernels.rope import rope
from minfer_cli.quant_blocks import random_blocks
from minfer_cli.experiment import rel_l2

F32_TOL = 1e-5
F16_TOL = 1e-3
TOL = {np.float32: F32_TOL, np.float16: F16_TOL}


def _rng():
    return np.random.default_rng()


def _poisoned(shape, dtype):
    return cuda.to_device(np.full(shape, np.nan, dtype=dtype))


# ---- numpy float64 references ----------------------------------------------------------------------------


def _rms_norm_ref(x, w, eps):
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(axis=1, keepdims=True) + eps) * w.astype(np.float64)


def _rope_ref(x, pos, base, mode, factors=None):
    x = x.astype(np.float64)
    hd = x.shape[-1]
    half = hd // 2
    freq = base ** (-2.0 * np.arange(half) / hd) / (1.0 if factors is None else factors.astype(np.float64))
    theta = pos.astype(np.float64)[:, None] * freq[None, :]
    c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    out = x.copy()
    i0, i1 = (slice(0, half), slice(half, hd)) if mode == "neox" else (slice(0, hd, 2), slice(1, hd, 2))
    out[..., i0] = x[..., i0] * c - x[..., i1] * s
    out[..., i1] = x[..., i0] * s + x[..., i1] * c
    return out


def _swiglu_ref(gate, up):
    g = gate.astype(np.float64)
    return g / (1.0 + np.exp(-g)) * up.astype(np.float64)


def _embedding_ref(raw, name, vocab, hidden, ids):
    """gguf-py's float32 dequantization of the rows ``ids`` (BF16: bits << 16, as gguf-py's BF16)."""
    rows = raw.reshape(vocab, -1)[ids]
    return quants.dequantize(rows, GGMLQuantizationType[name]).reshape(len(ids), hidden).astype(np.float32)


# ---- simulator: numbers ----------------------------------------------------------------------------------


@pytest.mark.parametrize("out_dtype", [np.float16, np.float32])
@pytest.mark.parametrize("nt, d, tpb", [(3, 200, 64), (1, 5, 32), (2, 300, 96), (2, 1000, 32)])
def test_rms_norm(nt, d, tpb, out_dtype):
    """Tails of the four-column loop (200 / 64: 8 threads take one unrolled pass), d < tpb, 3 warps, and several
    unrolled passes plus a tail (1000 / 32)."""
    rng = _rng()
    x = (rng.standard_normal((nt, d)) * rng.uniform(0.1, 10.0, size=(nt, 1))).astype(np.float32)
    w = rng.standard_normal(d).astype(np.float32)
    out = _poisoned((nt, d), out_dtype)
    got = rms_norm(cuda.to_device(x), cuda.to_device(w), 1e-6, out=out, tpb=tpb)
    assert got is out
    assert rel_l2(out.copy_to_host(), _rms_norm_ref(x, w, 1e-6)) < TOL[out_dtype]


@pytest.mark.parametrize("count, nt, d, tpb", [(1, 3, 200, 64), (3, 2, 300, 96), (2, 1, 5, 32), (9, 2, 130, 32)])
def test_add_rms_norm_equals_slice_sum_residual_add_and_norm(count, nt, d, tpb):
    """x += the slices' sum, then the norm: within f16 rounding of float64, and the same bits as the three kernels it
    replaces (the slice sum in slice order, `residual_add`, `rms_norm`); the parts buffer's unused tail stays unread."""
    rng = _rng()
    x = (rng.standard_normal((nt, d)) * rng.uniform(0.1, 10.0, size=(nt, 1))).astype(np.float32)
    w = rng.standard_normal(d).astype(np.float32)
    slices = rng.standard_normal((count, nt, d)).astype(np.float32)
    parts = np.concatenate([slices.reshape(-1), np.full(7, np.nan, np.float32)])  # NaN past the slices: never read
    dx = cuda.to_device(x)
    out = _poisoned((nt, d), np.float16)
    add_rms_norm(dx, cuda.to_device(parts), count, cuda.to_device(w), 1e-6, out=out, tpb=tpb)
    y = slices[0].copy()
    for s in slices[1:]:
        y = (y + s).astype(np.float32)
    want_x = (x + y).astype(np.float32)
    np.testing.assert_array_equal(dx.copy_to_host(), want_x)
    separate = rms_norm(cuda.to_device(want_x), cuda.to_device(w), 1e-6, out=_poisoned((nt, d), np.float16), tpb=tpb)
    np.testing.assert_array_equal(out.copy_to_host(), separate.copy_to_host())
    ref = _rms_norm_ref(x.astype(np.float64) + slices.astype(np.float64).sum(axis=0), w, 1e-6)
    assert rel_l2(out.copy_to_host(), ref) < TOL[np.float16]


def test_add_rms_norm_rejects_bad_parts():
    x, w = cuda.to_device(np.ones((2, 40), np.float32)), cuda.to_device(np.ones(40, np.float32))
    out = cuda.device_array((2, 40), np.float16)
    with pytest.raises(KernelConstraintError, match="at least 2 x 2 x 40 elements"):
        add_rms_norm(x, cuda.to_device(np.ones(159, np.float32)), 2, w, 1e-6, out=out)
    with pytest.raises(KernelConstraintError, match="count must be at least 1"):
        add_rms_norm(x, cuda.to_device(np.ones(80, np.float32)), 0, w, 1e-6, out=out)


def test_row_tpb_gives_each_thread_at_most_four_columns():
    from kernels.norm import row_tpb

    assert row_tpb(3584) == 896 and row_tpb(4096) == 1024 and row_tpb(5) == 32 and row_tpb(8192) == 1024
    for d in (5, 100, 3584, 4000):
        assert row_tpb(d) % 32 == 0 and 4 * row_tpb(d) >= d


def test_rms_norm_allocates_f16_by_default_and_f32_on_request():
    rng = _rng()
    x, w = rng.standard_normal((2, 40)).astype(np.float32), rng.standard_normal(40).astype(np.float32)
    dx, dw = cuda.to_device(x), cuda.to_device(w)
    assert rms_norm(dx, dw, 1e-5, tpb=32).dtype == np.float16
    got = rms_norm(dx, dw, 1e-5, out_dtype=np.float32, tpb=32)
    assert got.dtype == np.float32 and rel_l2(got.copy_to_host(), _rms_norm_ref(x, w, 1e-5)) < F32_TOL


def _check_rms_norm_q8(nt, d, tpb, compensated=False):
    """The fused norm + Q8_1 kernel equals `rms_norm` then `quantize_q8_1`, bit for bit (with ``compensated`` the
    residual values too, XRES=1's input), and the reference."""
    from kernels.quantize_q8 import q8_blocks, quantize_q8_1

    rng = _rng()
    x = (rng.standard_normal((nt, d)) * rng.uniform(0.1, 10.0, size=(nt, 1))).astype(np.float32)
    w = rng.standard_normal(d).astype(np.float32)
    dx, dw = cuda.to_device(x), cuda.to_device(w)
    out, q8 = _poisoned((nt, d), np.float32), q8_blocks(nt * d, compensated=compensated)
    q8.d.copy_to_device(np.full(nt * d // 32, np.nan, np.float32))
    q8.s.copy_to_device(np.full(nt * d // 32, np.nan, np.float32))
    q8.q.copy_to_device(np.full(nt * d, -128, np.int8))  # never written: |q| <= 127
    if compensated:
        q8.r.copy_to_device(np.full(nt * d, -128, np.int8))  # outside the residual's +-127
    assert rms_norm_q8(dx, dw, 1e-6, out, q8, tpb=tpb) is out
    ref_out = rms_norm(dx, dw, 1e-6, out_dtype=np.float32, tpb=tpb)
    ref_q8 = quantize_q8_1(ref_out.reshape(nt * d), q8_blocks(nt * d, compensated=compensated))
    np.testing.assert_array_equal(out.copy_to_host(), ref_out.copy_to_host())
    planes = ((q8.q, ref_q8.q), (q8.d, ref_q8.d), (q8.s, ref_q8.s)) + (((q8.r, ref_q8.r),) if compensated else ())
    for got, want in planes:
        np.testing.assert_array_equal(got.copy_to_host(), want.copy_to_host())
    assert rel_l2(out.copy_to_host(), _rms_norm_ref(x, w, 1e-6)) < F32_TOL


@pytest.mark.parametrize("nt, d, tpb, compensated", [(2, 320, 128, False), (1, 96, 256, False), (2, 192, 64, True)])
def test_rms_norm_q8_equals_norm_then_quantize(nt, d, tpb, compensated):
    """Several CUDA blocks a row, the last one partly past the row's end (320 = 2 x 128 + 64); d < tpb (one block,
    warps past the end); compensated (XRES=1) blocks over three CUDA blocks a row."""
    _check_rms_norm_q8(nt, d, tpb, compensated)


def test_rms_norm_q8_rejects_bad_input():
    from kernels.quantize_q8 import q8_blocks

    x, w = cuda.to_device(np.ones((1, 40), np.float32)), cuda.to_device(np.ones(40, np.float32))
    with pytest.raises(KernelConstraintError, match="multiple of 32"):
        rms_norm_q8(x, w, 1e-6, cuda.to_device(np.ones((1, 40), np.float32)), q8_blocks(64))
    x, w = cuda.to_device(np.ones((1, 64), np.float32)), cuda.to_device(np.ones(64, np.float32))
    with pytest.raises(KernelConstraintError, match="f32 out"):
        rms_norm_q8(x, w, 1e-6, cuda.to_device(np.ones((1, 64), np.float16)), q8_blocks(64))
    with pytest.raises(KernelConstraintError, match="q8_blocks\\(64\\)"):
        rms_norm_q8(x, w, 1e-6, cuda.to_device(np.ones((1, 64), np.float32)), q8_blocks(96))
    with pytest.raises(KernelConstraintError, match="cannot write out over x"):
        rms_norm_q8(x, w, 1e-6, x, q8_blocks(64))
    with pytest.raises(KernelConstraintError, match="at most 65535 rows"):
        many = cuda.device_array((65536, 32), np.float32)
        rms_norm_q8(many, cuda.to_device(np.ones(32, np.float32)), 1e-6, cuda.device_array((65536, 32), np.float32),
                    q8_blocks(65536 * 32))


POSITIONS = np.array([0, 1, 7, 4095, 32767, 131071, 1_000_000], dtype=np.int32)


@pytest.mark.parametrize("mode", ["neox", "norm"])
@pytest.mark.parametrize("base", [10000.0, 1e6])
def test_rope_both_pairings_at_small_and_large_positions(mode, base):
    rng = _rng()
    nt, nh, nkv, hd = len(POSITIONS), 3, 1, 10  # head_dim/2 = 5 pairs: no power of two anywhere
    q = rng.standard_normal((nt, nh, hd)).astype(np.float32)
    k = rng.standard_normal((nt, nkv, hd)).astype(np.float32)
    dq, dk = cuda.to_device(q), cuda.to_device(k)
    rope(dq, dk, cuda.to_device(POSITIONS), base, mode)
    assert rel_l2(dq.copy_to_host(), _rope_ref(q, POSITIONS, base, mode)) < F32_TOL
    assert rel_l2(dk.copy_to_host(), _rope_ref(k, POSITIONS, base, mode)) < F32_TOL


@pytest.mark.parametrize("mode", ["neox", "norm"])
def test_rope_divides_each_pairs_frequency_by_its_factor(mode):
    """Llama 3.1's `rope_freqs`: pair i turns by pos * base^(-2i/hd) / factors[i]; fresh factors in [0.5, 8]."""
    rng = _rng()
    nt, nh, nkv, hd = len(POSITIONS), 2, 1, 10
    q = rng.standard_normal((nt, nh, hd)).astype(np.float32)
    k = rng.standard_normal((nt, nkv, hd)).astype(np.float32)
    factors = rng.uniform(0.5, 8.0, size=hd // 2).astype(np.float32)
    dq, dk = cuda.to_device(q), cuda.to_device(k)
    rope(dq, dk, cuda.to_device(POSITIONS), 5e5, mode, factors=cuda.to_device(factors))
    assert rel_l2(dq.copy_to_host(), _rope_ref(q, POSITIONS, 5e5, mode, factors)) < F32_TOL
    assert rel_l2(dk.copy_to_host(), _rope_ref(k, POSITIONS, 5e5, mode, factors)) < F32_TOL
    assert rel_l2(dq.copy_to_host(), _rope_ref(q, POSITIONS, 5e5, mode)) > 0.1


@pytest.mark.parametrize("mode", ["neox", "norm"])
def test_rope_angles_computed_once_rotate_bit_for_bit_as_the_kernels_own(mode):
    """`rope_angles` (PROPE_ANGLES) writes the (cos, sin) `rope` computes per block: against float64 within f32
    rounding at large positions, and a `rope` given them rotates q and k bit for bit as without, alone (large
    positions) and writing the f16 cache rows and q16 (scattered small positions); frequency factors, hd = 10."""
    from kernels.rope import rope_angles

    rng = _rng()
    nh, nkv, hd = 3, 1, 10
    factors = cuda.to_device(rng.uniform(0.5, 8.0, hd // 2).astype(np.float32))
    for positions, kv in ((POSITIONS, False), (rng.permutation(16)[:5].astype(np.int32), True)):
        nt = len(positions)
        dpos = cuda.to_device(positions)
        angles = rope_angles(dpos, 5e5, hd, factors=factors,
                             out=cuda.to_device(np.full((nt, hd // 2, 2), np.nan, np.float32)))
        theta = (positions[:, None].astype(np.float64) * 5e5 ** (-2 * np.arange(hd // 2) / hd)
                 / factors.copy_to_host())
        got = angles.copy_to_host()
        assert np.abs(got[..., 0] - np.cos(theta)).max() < 1e-6 and np.abs(got[..., 1] - np.sin(theta)).max() < 1e-6
        qkv = rng.standard_normal((nt, (nh + 2 * nkv) * hd)).astype(np.float32)
        runs = []
        for given in (None, angles):
            d3 = cuda.to_device(qkv).reshape(nt, nh + 2 * nkv, hd)
            kc, vc = (cuda.to_device(np.full((16, nkv * hd), np.nan, np.float16)) for _ in range(2))
            q16 = cuda.to_device(np.full((nt, nh * hd), np.nan, np.float16))
            cache = dict(kv_cache=(d3[:, nh + nkv:], kc, vc), q_out=q16) if kv else {}
            rope(d3[:, :nh], d3[:, nh: nh + nkv], dpos, 5e5, mode, factors=factors, angles=given, **cache)
            runs.append([x.copy_to_host() for x in (d3, kc, vc, q16)])
        for x, y in zip(*runs):
            np.testing.assert_array_equal(x.view(np.uint8), y.view(np.uint8))
    views = (d3[:, :nh], d3[:, nh: nh + nkv])
    with pytest.raises(KernelConstraintError, match=r"angles must be a C-contiguous float32 \[5, 5, 2\]"):
        rope(*views, dpos, 5e5, mode, angles=cuda.to_device(np.zeros((5, 4, 2), np.float32)))
    with pytest.raises(KernelConstraintError, match="angles serve rope alone or with kv_cache and q_out"):
        rope(*views, dpos, 5e5, mode, kv_cache=(d3[:, nh + nkv:], kc, vc), angles=angles)
    with pytest.raises(KernelConstraintError, match=r"out must be a C-contiguous float32 \[5, 5, 2\]"):
        rope_angles(dpos, 5e5, hd, out=cuda.to_device(np.zeros((5, 5), np.float32)))


def test_rope_on_the_q_and_k_views_of_a_fused_qkv_buffer_leaves_v_alone():
    rng = _rng()
    nt, nh, nkv, hd = 3, 2, 1, 8
    qkv = rng.standard_normal((nt, (nh + 2 * nkv) * hd)).astype(np.float32)
    pos = rng.integers(0, 40000, size=nt).astype(np.int32)
    d3 = cuda.to_device(qkv).reshape(nt, nh + 2 * nkv, hd)
    rope(d3[:, :nh], d3[:, nh : nh + nkv], cuda.to_device(pos), 1e6, "neox")
    got = d3.copy_to_host()
    h3 = qkv.reshape(nt, nh + 2 * nkv, hd)
    assert rel_l2(got[:, :nh], _rope_ref(h3[:, :nh], pos, 1e6, "neox")) < F32_TOL
    assert rel_l2(got[:, nh : nh + nkv], _rope_ref(h3[:, nh : nh + nkv], pos, 1e6, "neox")) < F32_TOL
    np.testing.assert_array_equal(got[:, nh + nkv :], h3[:, nh + nkv :])


@pytest.mark.parametrize("with_q", [False, True, "bias"], ids=["kv", "kv+q16", "kv+q16+bias"])
@pytest.mark.parametrize("mode,nh,nkv,hd", [("neox", 4, 2, 16), ("norm", 3, 1, 10)])
def test_rope_with_kv_cache_writes_what_rope_then_kv_append_writes(mode, nh, nkv, hd, with_q):
    """FUSE_ROPE_KV's kernel (and PFUSE_ROPE_KV's, which also writes the f16 q, and adds the q|k|v bias) against
    the kernels it replaces (bias_add, rope, kv_append), on the q/k/v views of one fused QKV buffer: the rotated q
    and k in place, the f16 cache rows at scattered positions and the f16 q rows bit for bit; every other cache row
    keeps its NaN poison. hd = 10: a head_dim that is not a multiple of the block's pair threads."""
    from kernels.kv_cache import kv_append
    from kernels.residual import bias_add

    rng = _rng()
    nt, context = 3, 9
    qkv = rng.standard_normal((nt, (nh + 2 * nkv) * hd)).astype(np.float32)
    pos = rng.permutation(context)[:nt].astype(np.int32)
    factors = rng.uniform(0.5, 8.0, hd // 2).astype(np.float32)
    bias = rng.standard_normal((nh + 2 * nkv) * hd).astype(np.float32) if with_q == "bias" else None
    runs = []
    for fused in (False, True):
        d = cuda.to_device(qkv)
        if bias is not None and not fused:
            bias_add(d, cuda.to_device(bias), out=d)
        d3 = d.reshape(nt, nh + 2 * nkv, hd)
        kc, vc = (cuda.to_device(np.full((context, nkv * hd), np.nan, np.float16)) for _ in range(2))
        q16 = cuda.to_device(np.full((nt, nh * hd), np.nan, np.float16))
        dpos = cuda.to_device(pos)
        views = (d3[:, :nh], d3[:, nh: nh + nkv])
        if fused:
            rope(*views, dpos, 5e5, mode, factors=cuda.to_device(factors), kv_cache=(d3[:, nh + nkv:], kc, vc),
                 q_out=q16 if with_q else None, bias=None if bias is None else cuda.to_device(bias))
        else:
            rope(*views, dpos, 5e5, mode, factors=cuda.to_device(factors))
            kv_append(d, dpos, kc, vc, nh * hd, q_out=q16)
        runs.append((d.copy_to_host(), kc.copy_to_host(), vc.copy_to_host(), q16.copy_to_host()))
    (q0, k0, v0, h0), (q1, k1, v1, h1) = runs
    width = nh + nkv  # q and k: rotated in place by both; v: the unfused path's bias_add wrote it, the fused reads it
    np.testing.assert_array_equal(q1.reshape(nt, -1, hd)[:, :width], q0.reshape(nt, -1, hd)[:, :width])
    np.testing.assert_array_equal(q1.reshape(nt, -1, hd)[:, width:], qkv.reshape(nt, -1, hd)[:, width:])
    if with_q:
        np.testing.assert_array_equal(h1.view(np.uint16), h0.view(np.uint16))
    else:
        assert np.isnan(h1).all()
    np.testing.assert_array_equal(k1.view(np.uint16), k0.view(np.uint16))
    np.testing.assert_array_equal(v1.view(np.uint16), v0.view(np.uint16))
    others = np.setdiff1d(np.arange(context), pos)
    assert np.isnan(k1[others]).all() and np.isnan(v1[others]).all() and np.isfinite(k1[pos]).all()
    h3 = (qkv if bias is None else qkv + bias).reshape(nt, nh + 2 * nkv, hd)
    want_k = _rope_ref(h3[:, nh: nh + nkv], pos, 5e5, mode, factors).reshape(nt, nkv * hd)
    assert rel_l2(k1[pos].astype(np.float64), want_k) < 1e-3  # f16 rounding of the reference rotation
    np.testing.assert_array_equal(v1[pos], h3[:, nh + nkv:].reshape(nt, nkv * hd).astype(np.float16))


def test_f32_angles_would_miss_the_f32_bound_at_32k():
    """Why the kernel computes theta in f64: llama.cpp's/HF's f32 theta = f32(pos) * f32(inv_freq) at
    pos = 32767 already misses F32_TOL against the float64 rotation (numpy only, no kernel)."""
    rng = _rng()
    hd, base = 128, 1e6
    pos = np.full(4, 32767, dtype=np.int32)
    x = rng.standard_normal((4, 1, hd))
    inv32 = (base ** (-2.0 * np.arange(hd // 2) / hd)).astype(np.float32)
    theta32 = (pos.astype(np.float32)[:, None] * inv32[None, :]).astype(np.float64)
    c, s = np.cos(theta32)[:, None, :], np.sin(theta32)[:, None, :]
    half = hd // 2
    f32_angles = np.concatenate([x[..., :half] * c - x[..., half:] * s, x[..., :half] * s + x[..., half:] * c], -1)
    assert rel_l2(f32_angles, _rope_ref(x, pos, base, "neox")) > F32_TOL


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # simulator: exp(100) -> inf, as expf
@pytest.mark.parametrize("out_dtype", [np.float16, np.float32])
@pytest.mark.parametrize("fused", [False, True])
def test_swiglu(fused, out_dtype):
    rng = _rng()
    nt, ffn = 3, 200
    gate = (rng.standard_normal((nt, ffn)) * 4).astype(np.float32)
    gate[0, :4] = (-100.0, 100.0, -88.5, 0.0)  # exp overflow/underflow edges
    up = rng.standard_normal((nt, ffn)).astype(np.float32)
    out = _poisoned((nt, ffn), out_dtype)
    if fused:
        got = swiglu(cuda.to_device(np.concatenate([gate, up], axis=1)), out=out, tpb=64)
    else:
        got = swiglu(cuda.to_device(gate), cuda.to_device(up), out=out, tpb=64)
    assert got is out
    assert rel_l2(out.copy_to_host(), _swiglu_ref(gate, up)) < TOL[out_dtype]


def _embed_hidden(name: str) -> int:
    return {"Q4_K": 512, "Q6_K": 256, "Q8_0": 96}.get(name, 40)  # several blocks per row; floats: a tail at tpb 32


@pytest.mark.parametrize("name", EMBED_TYPES)
def test_embedding_gather_is_bit_exact_against_gguf(name):
    rng = _rng()
    vocab, hidden = 6, _embed_hidden(name)
    raw = random_blocks(name, vocab, hidden, rng)
    ids = np.array([3, 0, 5, 3], dtype=np.int32)  # repeated id, first and last rows
    out = _poisoned((len(ids), hidden), np.float32)
    got = embedding(cuda.to_device(raw), name, vocab, hidden, cuda.to_device(ids), out=out, tpb=32)
    assert got is out
    host = out.copy_to_host()
    assert not np.isnan(host).any(), "some output elements were never written (still the NaN poison)"
    np.testing.assert_array_equal(host.view(np.uint32), _embedding_ref(raw, name, vocab, hidden, ids).view(np.uint32))


OTHER_EMBED_TYPES = tuple(t for t in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q5_K", "MXFP4")
                          if t not in EMBED_TYPES)


@pytest.mark.parametrize("name", OTHER_EMBED_TYPES)
def test_a_token_embd_of_any_other_type_embeds_exactly_as_gguf(name):
    """The types the gather kernels do not read (llama.cpp leaves token_embd in the file's type: a plain Q4_0
    model): the engine's f32 table (`ModelWeights.embedding_table`) then the F32 gather, bit-identical to gguf."""
    from minfer_cli.engine.config import TensorSpec
    from minfer_cli.engine.presets import preset
    from minfer_cli.engine.weights import ModelWeights

    rng = _rng()
    vocab, hidden = 6, 256
    raw = random_blocks(name, vocab, hidden, rng)
    spec = TensorSpec("token_embd.weight", (hidden, vocab), name)
    weights = ModelWeights(preset("tiny"), {"token_embd.weight": (spec, cuda.to_device(raw))})
    table, qtype = weights.embedding_table()
    assert qtype == "F32" and weights.embedding_table()[0] is table  # made once
    ids = np.array([5, 0, 2, 5], dtype=np.int32)
    got = embedding(table, qtype, vocab, hidden, cuda.to_device(ids), out=_poisoned((4, hidden), np.float32))
    np.testing.assert_array_equal(got.copy_to_host().view(np.uint32),
                                  _embedding_ref(raw, name, vocab, hidden, ids).view(np.uint32))


@pytest.mark.parametrize("name", ["Q8_0", "F16"])
def test_embedding_out_of_range_ids_give_nan_rows(name):
    rng = _rng()
    vocab, hidden = 4, _embed_hidden(name)
    raw = random_blocks(name, vocab, hidden, rng)
    ids = np.array([1, 4, -1, 2], dtype=np.int32)
    got = embedding(cuda.to_device(raw), name, vocab, hidden, cuda.to_device(ids), tpb=32).copy_to_host()
    assert np.isnan(got[[1, 2]]).all()
    ref = _embedding_ref(raw, name, vocab, hidden, np.array([1, 2]))
    np.testing.assert_array_equal(got[[0, 3]], ref)


@pytest.mark.parametrize("with_bias", [False, True])
def test_residual_add_in_place(with_bias):
    rng = _rng()
    nt, d = 3, 200
    x, y = rng.standard_normal((nt, d)).astype(np.float32), rng.standard_normal((nt, d)).astype(np.float32)
    b = rng.standard_normal(d).astype(np.float32)
    dx = cuda.to_device(x)
    got = residual_add(dx, cuda.to_device(y), bias=cuda.to_device(b) if with_bias else None, tpb=64)
    assert got is dx
    ref = x.astype(np.float64) + y + (b if with_bias else 0.0)
    assert rel_l2(dx.copy_to_host(), ref) < F32_TOL


def test_residual_add_into_out_and_bias_add():
    rng = _rng()
    nt, d = 3, 200
    x, y = rng.standard_normal((nt, d)).astype(np.float32), rng.standard_normal((nt, d)).astype(np.float32)
    b = rng.standard_normal(d).astype(np.float32)
    dx, out = cuda.to_device(x), _poisoned((nt, d), np.float32)
    residual_add(dx, cuda.to_device(y), out=out, tpb=64)
    assert rel_l2(out.copy_to_host(), x.astype(np.float64) + y) < F32_TOL
    np.testing.assert_array_equal(dx.copy_to_host(), x)  # x untouched when out is given
    out2 = _poisoned((nt, d), np.float32)
    bias_add(dx, cuda.to_device(b), out=out2, tpb=64)
    assert rel_l2(out2.copy_to_host(), x.astype(np.float64) + b) < F32_TOL
    bias_add(dx, cuda.to_device(b), tpb=64)
    assert rel_l2(dx.copy_to_host(), x.astype(np.float64) + b) < F32_TOL


# ---- simulator: rejected inputs --------------------------------------------------------------------------


def _d(shape, dtype=np.float32):
    return cuda.to_device(np.zeros(shape, dtype=dtype))


def _q4k_raw(vocab=2, hidden=256):
    return cuda.to_device(random_blocks("Q4_K", vocab, hidden, np.random.default_rng(1)))


BAD_CALLS = [
    (lambda: rms_norm(np.zeros((2, 8), np.float32), _d(8), 1e-6), "must be a CUDA device array"),
    (lambda: rms_norm(_d((2, 8), np.float16), _d(8), 1e-6), "2-D float32"),
    (lambda: rms_norm(_d((2, 8)), _d(9), 1e-6), r"shape \(8,\)"),
    (lambda: rms_norm(_d((2, 8)), _d(8), 0.0), "eps must be a positive"),
    (lambda: rms_norm(_d((2, 8)), _d(8), 1e-6, tpb=48), "tpb=48"),
    (lambda: rms_norm(_d((2, 8)), _d(8), 1e-6, out=_d((2, 8), np.float64)), "out must be"),
    (lambda: rms_norm(_d((2, 8)), _d(8), 1e-6, out=_d((2, 8)), out_dtype=np.float16), "give one or agree"),
    (lambda: rms_norm(_d((2, 16))[:, :8], _d(8), 1e-6), "C-contiguous"),
    (lambda: rope(_d((2, 2, 8)), _d((2, 1, 8)), _d(2, np.int32), 1e4, "yarn"), "mode='yarn'"),
    (lambda: rope(_d((2, 2, 7)), _d((2, 1, 7)), _d(2, np.int32), 1e4, "neox"), "head_dim=7 must be even"),
    (lambda: rope(_d((2, 2, 8)), _d((3, 1, 8)), _d(2, np.int32), 1e4, "neox"), "same nt and head_dim"),
    (lambda: rope(_d((2, 2, 8)), _d((2, 1, 8)), _d(2, np.int64), 1e4, "neox"), "pos must be a contiguous int32"),
    (lambda: rope(_d((2, 2, 8), np.float16), _d((2, 1, 8)), _d(2, np.int32), 1e4, "neox"), "3-D float32"),
    (
        lambda: rope(_d((2, 2, 16))[:, :, :8], _d((2, 1, 8)), _d(2, np.int32), 1e4, "neox"),
        "contiguous within a token",
    ),
    (lambda: rope(_d((2, 2, 8)), _d((2, 1, 8)), _d(2, np.int32), -1.0, "neox"), "base must be a positive"),
    (lambda: rope(_d((2, 2, 8)), _d((2, 1, 8)), _d(2, np.int32), 1e4, "neox", factors=_d(8)), "factors must be a contiguous float32"),
    (lambda: rope(_d((2, 2, 8)), _d((2, 1, 8)), _d(2, np.int32), 1e4, "neox",
                  kv_cache=(_d((2, 2, 8)), _d((4, 8), np.float16), _d((4, 8), np.float16))), "must have k's shape"),
    (lambda: rope(_d((2, 2, 8)), _d((2, 1, 8)), _d(2, np.int32), 1e4, "neox",
                  kv_cache=(_d((2, 1, 8)), _d((4, 8)), _d((4, 8), np.float16))), "k_cache must be a C-contiguous float16"),
    (lambda: rope(_d((2, 2, 8)), _d((2, 1, 8)), _d(2, np.int32), 1e4, "neox",
                  kv_cache=(_d((2, 1, 8)), _d((4, 8), np.float16), _d((3, 8), np.float16))),
     r"k_cache \(4, 8\) and v_cache \(3, 8\) must have the same shape"),
    (lambda: rope(_d((2, 2, 8)), _d((2, 1, 8)), _d(2, np.int32), 1e4, "neox", q_out=_d((2, 16), np.float16)),
     "q_out is written only with kv_cache"),
    (lambda: rope(_d((2, 2, 8)), _d((2, 1, 8)), _d(2, np.int32), 1e4, "neox", q_out=_d((2, 8), np.float16),
                  kv_cache=(_d((2, 1, 8)), _d((4, 8), np.float16), _d((4, 8), np.float16))),
     r"q_out must be a C-contiguous float16 \[2, 16\]"),
    (lambda: rope(_d((2, 2, 8)), _d((2, 1, 8)), _d(2, np.int32), 1e4, "neox", bias=_d(32)),
     "bias is added only by the fused rope \\+ KV append that writes q_out"),
    (lambda: rope(_d((2, 2, 8)), _d((2, 1, 8)), _d(2, np.int32), 1e4, "neox", q_out=_d((2, 16), np.float16),
                  kv_cache=(_d((2, 1, 8)), _d((4, 8), np.float16), _d((4, 8), np.float16)), bias=_d(24)),
     r"bias must be a C-contiguous float32 \[32\] device array \(q\|k\|v\), got float32 \(24,\)"),
    (lambda: swiglu(_d((2, 7))), "even, positive number of columns"),
    (lambda: swiglu(_d((2, 8)), _d((2, 9))), "must have the same shape"),
    (lambda: swiglu(_d((2, 8), np.float16), _d((2, 8))), "2-D float32"),
    (lambda: swiglu(_d((2, 8)), _d((2, 8)), out=_d((2, 4), np.float16)), r"shape \(2, 8\)"),
    (lambda: swiglu(_d((2, 8)), _d((2, 8)), out_dtype=np.int8), "out_dtype must be"),
    (lambda: residual_add(_d((2, 8)), _d((2, 9))), "must have the same shape"),
    (lambda: residual_add(_d((2, 8)), _d((2, 8)), bias=_d(9)), r"bias must be a contiguous float32 .* \(8,\)"),
    (lambda: residual_add(_d((2, 8)), _d((2, 8), np.float16)), "C-contiguous 2-D float32"),
    (lambda: residual_add(_d((2, 8)), _d((2, 8)), out=_d((2, 4))), "must have the shape of x"),
    (lambda: bias_add(_d((2, 8)), _d((2, 8))), "bias must be"),
    (lambda: embedding(_q4k_raw(), "Q4_0", 2, 256, _d(1, np.int32)), "does not support Q4_0"),
    (lambda: embedding(_q4k_raw(), "Q9_9", 2, 256, _d(1, np.int32)), "not a supported GGUF type"),
    (lambda: embedding(_q4k_raw(), "Q4_K", 2, 128, _d(1, np.int32)), "not a multiple of the Q4_K block size"),
    (lambda: embedding(_q4k_raw(), "Q4_K", 3, 256, _d(1, np.int32)), "raw holds 288 bytes"),
    (lambda: embedding(_q4k_raw(), "Q4_K", 2, 256, _d(1, np.int64)), "ids must be a contiguous 1-D int32"),
    (lambda: embedding(_q4k_raw(), "Q4_K", 2, 256, _d(2, np.int32), out=_d((2, 256), np.float16)), "out must be"),
    (lambda: embedding(_d(2 * 144 + 4, np.uint8)[4:], "Q4_K", 2, 256, _d(1, np.int32)), "8-byte aligned"),
]


@pytest.mark.parametrize("call, needle", BAD_CALLS)
def test_rejects_bad_input(call, needle):
    with pytest.raises(KernelConstraintError, match=needle):
        call()


# ---- compile: PTX for sm_90, no local memory -------------------------------------------------------------


def _compile_cases():
    from kernels import activation, embedding, norm, residual
    from kernels import rope as rope_mod

    rows = "float32[:, ::1]"
    return {
        "rms_norm f16 out": (norm._rms_norm, f"{rows}, float32[::1], float16[:, ::1], float32"),
        "rms_norm f32 out": (norm._rms_norm, f"{rows}, float32[::1], {rows}, float32"),
        "rms_norm q8": (norm._rms_norm_q8, f"{rows}, float32[::1], {rows}, int8[::1], float32[::1], float32[::1], "
                                           "float32"),
        "rms_norm q8 res": (norm._rms_norm_q8_res, f"{rows}, float32[::1], {rows}, int8[::1], float32[::1], "
                                                   "float32[::1], int8[::1], float32"),
        "rope contiguous": (rope_mod._rope, "float32[:, :, ::1], float32[:, :, ::1], int32[::1], float64, float32[::1], boolean"),
        "rope qkv views": (rope_mod._rope, "float32[:, :, :], float32[:, :, :], int32[::1], float64, float32[::1], boolean"),
        "rope kv append": (rope_mod._rope_append, "float32[:, :, :], float32[:, :, :], float32[:, :, :], int32[::1], "
                                                  "float64, float32[::1], boolean, float16[:, ::1], float16[:, ::1]"),
        "rope kv append q16": (rope_mod._rope_append_q, "float32[:, :, :], float32[:, :, :], float32[:, :, :], "
                                                        "int32[::1], float64, float32[::1], boolean, float16[:, ::1], "
                                                        "float16[:, ::1], float16[:, ::1]"),
        "rope kv append q16 bias": (rope_mod._rope_append_q_bias, "float32[:, :, :], float32[:, :, :], float32[:, :, :], "
                                                             "int32[::1], float64, float32[::1], boolean, "
                                                             "float16[:, ::1], float16[:, ::1], float16[:, ::1], "
                                                             "float32[::1]"),
        "rope angles": (rope_mod._angles, "int32[::1], float64, float32[::1], int64, float32[:, :, ::1]"),
        "rope angles given": (rope_mod._rope_tab, "float32[:, :, :], float32[:, :, :], float32[:, :, ::1], boolean"),
        "rope kv append q16 angles given": (rope_mod._rope_append_q_tab, "float32[:, :, :], float32[:, :, :], "
                                            "float32[:, :, :], int32[::1], float32[:, :, ::1], boolean, "
                                            "float16[:, ::1], float16[:, ::1], float16[:, ::1]"),
        "rope kv append q16 angles bias": (rope_mod._rope_append_q_tab_bias, "float32[:, :, :], float32[:, :, :], "
                                           "float32[:, :, :], int32[::1], float32[:, :, ::1], boolean, "
                                           "float16[:, ::1], float16[:, ::1], float16[:, ::1], float32[::1]"),
        "add rms_norm": (norm._add_rms_norm, f"{rows}, float32[::1], int64, float32[::1], float16[:, ::1], float32"),
        "swiglu two arrays": (activation._swiglu, f"{rows}, {rows}, float16[:, ::1], int64"),
        "swiglu fused": (activation._swiglu, "float32[:, :], float32[:, :], float16[:, ::1], int64"),
        "swiglu f32 out": (activation._swiglu, f"{rows}, {rows}, {rows}, int64"),
        "residual add": (residual._add, f"{rows}, {rows}, {rows}, int64"),
        "residual add bias": (residual._add_bias, f"{rows}, {rows}, float32[::1], {rows}, int64"),
        "bias add": (residual._bias, f"{rows}, float32[::1], {rows}, int64"),
        "embed Q4_K": (embedding._gather_q4_k, f"uint64[::1], int32[::1], {rows}, int64, int64, int64"),
        "embed Q6_K": (embedding._gather_q6_k, f"uint16[::1], int32[::1], {rows}, int64, int64, int64"),
        "embed Q8_0": (embedding._gather_q8_0, f"uint16[::1], int32[::1], {rows}, int64, int64, int64"),
        "embed F32": (embedding._gather_float, f"{rows}, int32[::1], {rows}, int64, int64"),
        "embed F16": (embedding._gather_float, f"float16[:, ::1], int32[::1], {rows}, int64, int64"),
        "embed BF16": (embedding._gather_bf16, f"uint16[:, ::1], int32[::1], {rows}, int64, int64"),
    }


COMPILE_NAMES = [
    "rms_norm f16 out", "rms_norm f32 out", "rms_norm q8", "rms_norm q8 res", "rope contiguous", "rope qkv views",
    "rope kv append", "rope kv append q16", "rope kv append q16 bias", "rope angles", "rope angles given",
    "rope kv append q16 angles given", "rope kv append q16 angles bias", "add rms_norm",
    "swiglu two arrays",
    "swiglu fused", "swiglu f32 out", "residual add", "residual add bias", "bias add", "embed Q4_K", "embed Q6_K",
    "embed Q8_0", "embed F32", "embed F16", "embed BF16",
]  # fmt: skip


@pytest.mark.compile
@pytest.mark.parametrize("name", COMPILE_NAMES)
def test_compiles_for_sm90_without_local_memory(name):
    cases = _compile_cases()
    assert set(cases) == set(COMPILE_NAMES)
    kernel, sig = cases[name]
    ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=(9, 0))
    assert ".local" not in ptx, f"{name} uses local memory"
    if name.startswith("rms_norm"):
        assert "shfl.sync.bfly" in ptx  # the warp butterfly, not a shared-memory-only fallback
    if name.startswith("rope"):
        assert "sin.approx" not in ptx and "cos.approx" not in ptx
    if name.startswith("embed Q"):
        assert "fma.rn.f32" not in ptx  # bit-exactness with gguf-py needs the separate mul/sub roundings


# ---- gpu: qwen2-7B shapes ----------------------------------------------------------------------------------

NT, HIDDEN, FFN, NH, NKV, HD = 2048, 3584, 18944, 28, 4, 128


@pytest.mark.gpu
@pytest.mark.parametrize("compensated", [False, True])
def test_rms_norm_q8_on_gpu(compensated):
    """The decode's launch: `row_tpb` threads, four CUDA blocks at hidden 3584."""
    from kernels.norm import row_tpb

    _check_rms_norm_q8(1, HIDDEN, row_tpb(HIDDEN), compensated)


@pytest.mark.gpu
@pytest.mark.parametrize("out_dtype", [np.float16, np.float32])
def test_rms_norm_on_gpu(out_dtype):
    rng = _rng()
    x = rng.standard_normal((NT, HIDDEN)).astype(np.float32)
    w = rng.standard_normal(HIDDEN).astype(np.float32)
    out = _poisoned((NT, HIDDEN), out_dtype)
    rms_norm(cuda.to_device(x), cuda.to_device(w), 1e-6, out=out)
    cuda.synchronize()
    assert rel_l2(out.copy_to_host(), _rms_norm_ref(x, w, 1e-6)) < TOL[out_dtype]


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["neox", "norm"])
def test_rope_on_gpu(mode):
    rng = _rng()
    q = rng.standard_normal((NT, NH, HD)).astype(np.float32)
    k = rng.standard_normal((NT, NKV, HD)).astype(np.float32)
    pos = (np.arange(NT) + 30000).astype(np.int32)
    dq, dk = cuda.to_device(q), cuda.to_device(k)
    rope(dq, dk, cuda.to_device(pos), 1e6, mode)
    cuda.synchronize()
    assert rel_l2(dq.copy_to_host(), _rope_ref(q, pos, 1e6, mode)) < F32_TOL
    assert rel_l2(dk.copy_to_host(), _rope_ref(k, pos, 1e6, mode)) < F32_TOL


@pytest.mark.gpu
def test_swiglu_on_gpu():
    rng = _rng()
    gu = (rng.standard_normal((NT, 2 * FFN)) * 3).astype(np.float32)
    out = _poisoned((NT, FFN), np.float16)
    swiglu(cuda.to_device(gu), out=out)
    cuda.synchronize()
    assert rel_l2(out.copy_to_host(), _swiglu_ref(gu[:, :FFN], gu[:, FFN:])) < F16_TOL


@pytest.mark.gpu
@pytest.mark.parametrize("name", EMBED_TYPES)
def test_embedding_on_gpu(name):
    rng = _rng()
    vocab = 4096
    raw = random_blocks(name, vocab, HIDDEN, rng)
    ids = rng.integers(0, vocab, size=NT).astype(np.int32)
    out = _poisoned((NT, HIDDEN), np.float32)
    embedding(cuda.to_device(raw), name, vocab, HIDDEN, cuda.to_device(ids), out=out)
    cuda.synchronize()
    np.testing.assert_array_equal(
        out.copy_to_host().view(np.uint32), _embedding_ref(raw, name, vocab, HIDDEN, ids).view(np.uint32)
    )


@pytest.mark.gpu
def test_residual_and_bias_on_gpu():
    rng = _rng()
    x, y = rng.standard_normal((NT, HIDDEN)).astype(np.float32), rng.standard_normal((NT, HIDDEN)).astype(np.float32)
    b = rng.standard_normal(HIDDEN).astype(np.float32)
    dx = cuda.to_device(x)
    residual_add(dx, cuda.to_device(y), bias=cuda.to_device(b))
    cuda.synchronize()
    assert rel_l2(dx.copy_to_host(), x.astype(np.float64) + y + b) < F32_TOL
    qkv_d = (NH + 2 * NKV) * HD
    z, bz = rng.standard_normal((NT, qkv_d)).astype(np.float32), rng.standard_normal(qkv_d).astype(np.float32)
    dz = cuda.to_device(z)
    bias_add(dz, cuda.to_device(bz))
    cuda.synchronize()
    assert rel_l2(dz.copy_to_host(), z.astype(np.float64) + bz) < F32_TOL
