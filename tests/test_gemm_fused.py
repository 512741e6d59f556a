"""kernels/gemm_fused.py: the prefill GEMM whose consumers dequantize GGUF blocks into the swizzled B tile.

* simulator session: random valid Q4_K weights (`minfer_cli.quant_blocks.random_blocks`) in 1-3 segments, nt/od
  tails, rings that wrap, split-K slices; C against float64 of gguf-py's dequantization and against `gemm_f16` on
  the f16 copy (`kernels.quant.dequantize`); poisoned outputs and partials;
* `compile`: the new instructions in the sm_90a PTX, the block's registers fit;
* `gpu`: real Qwen2-7B shapes on the H200 against torch float64 and the f16-copy path.
Refusals of bad input run everywhere.
"""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

from kernels import gemm_f16 as G
from kernels import gemm_fused as F
from kernels.errors import KernelConstraintError
from kernels.ptx import SIMULATOR
from kernels.quant import dequantize
from minfer_cli.quant_blocks import random_blocks, reference_f16

sim = pytest.mark.skipif(not SIMULATOR, reason="simulator session only (NUMBA_ENABLE_CUDASIM=1)")


def _operands(nt, rows, id_, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((nt, id_)).astype(np.float16)
    raws = [random_blocks("Q4_K", r, id_, rng) for r in rows]
    w16 = np.concatenate([reference_f16(raw, "Q4_K", r, id_) for raw, r in zip(raws, rows)])
    return a, raws, w16


def _fused(a, raws, rows, config, partials=None):
    nt, od = a.shape[0], sum(rows)
    out = cuda.to_device(np.full((nt, od), np.nan, np.float32))
    segments = [(cuda.to_device(raw), r) for raw, r in zip(raws, rows)]
    F.gemm_fused(cuda.to_device(a), segments, "Q4_K", out, config=config, partials=partials)
    return out.copy_to_host()


def _f16_path(a, raws, rows, config):
    """gemm_f16 on the f16 copy the engine's W16=1 makes (kernels.quant.dequantize of each segment)."""
    id_ = a.shape[1]
    w = cuda.device_array((sum(rows), id_), np.float16)
    at = 0
    for raw, r in zip(raws, rows):
        dequantize(cuda.to_device(raw), "Q4_K", r, id_, out=w[at: at + r])
        at += r
    out = cuda.to_device(np.full((a.shape[0], sum(rows)), np.nan, np.float32))
    G.gemm_f16(cuda.to_device(a), w, out, config=config)
    return out.copy_to_host()


SIM_CASES = [
    ("128x64, 3 stages (the ring wraps), 8 raw slots, 2 segments, od tail", dict(G.DEFAULT, TM=128, TN=64, STAGES=3),
     17, [64, 70], 256),
    ("256x128 default: 3 segments, 2 raw slots", G.DEFAULT, 17, [128, 64, 108], 256),
]


@sim
@pytest.mark.parametrize("config,nt,rows,id_", [c[1:] for c in SIM_CASES], ids=[c[0] for c in SIM_CASES])
def test_fused_simulator_matches_float64_and_the_f16_copy_path(config, nt, rows, id_):
    a, raws, w16 = _operands(nt, rows, id_, seed=len(rows))
    got = _fused(a, raws, rows, config)
    assert np.isfinite(got).all(), "some outputs were never written"
    _assert_close(got, a, w16, _f16_path(a, raws, rows, config))


def _assert_close(got, a, w16, f16_path):
    """Within 1e-3 of float64 (f16 weights in f16 arithmetic: ~4e-4 measured), and as close to the f16-copy path."""
    ref = a.astype(np.float64) @ w16.astype(np.float64).T
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-3
    assert np.linalg.norm(got - f16_path) / np.linalg.norm(f16_path) < 1e-3
    assert not np.array_equal(got, f16_path)  # the f16x2 arithmetic does differ: the comparison can fail


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
def test_fused_simulator_split_k():
    """Every tile in k slices: 3 of 8 k tiles (slices start at tiles 0, 2, 5: mid super-block), and 4 of 4 (one k
    tile a slice); poisoned C and partials, float64 and the f16 path."""
    nt, rows = 20, [64, 30]
    for id_, splitk in ((512, 3), (256, 4)):
        config = dict(G.DEFAULT, TM=128, TN=64, STAGES=3, SPLITK=splitk)
        a, raws, w16 = _operands(nt, rows, id_, seed=9)
        partials = cuda.to_device(np.full(G.partials_elements(config, nt, sum(rows), id_), np.nan, np.float32))
        got = _fused(a, raws, rows, config, partials=partials)
        assert np.isfinite(got).all()
        _assert_close(got, a, w16, _f16_path(a, raws, rows, config))


@sim
def test_fused_accumulate_is_the_product_then_the_residual_add_bit_for_bit():
    """gemm_fused(accumulate=True): x0 + the fused product, the same f32 bits, whole tiles and every tile in 3
    slices; fresh random x0 and operands."""
    nt, rows, id_ = 17, [64, 70], 256
    for splitk in (1, 3):
        config = dict(G.DEFAULT, TM=128, TN=64, STAGES=3, SPLITK=splitk)
        a, raws, w16 = _operands(nt, rows, id_, seed=None)
        x0 = (4 * np.random.default_rng().standard_normal((nt, sum(rows)))).astype(np.float32)
        need = max(1, G.partials_elements(config, nt, sum(rows), id_))
        prod = _fused(a, raws, rows, config, partials=cuda.to_device(np.full(need, np.nan, np.float32)))
        x = cuda.to_device(x0)
        segments = [(cuda.to_device(raw), r) for raw, r in zip(raws, rows)]
        F.gemm_fused(cuda.to_device(a), segments, "Q4_K", x, config=config, accumulate=True,
                     partials=cuda.to_device(np.full(need, np.nan, np.float32)))
        assert np.isfinite(prod).all() and np.array_equal(x.copy_to_host(), x0 + prod)


def _bad_calls():
    """(call, the words its one-line refusal must hold)."""
    a = np.zeros((4, 256), np.float16)
    raw = np.zeros(2 * 144, np.uint8)
    return [
        (lambda: F.fused_geometry(None, "Q6_K"), "Q6_K have no dequantizer in the fused GEMM; types: Q4_K"),
        (lambda: F.fused_geometry(dict(G.DEFAULT, STAGING="cp_async"), "Q4_K"), "needs STAGING=tma"),
        (lambda: F.fused_geometry(dict(G.DEFAULT, STAGES=2), "Q4_K"), "STAGES >= 3"),
        (lambda: F.fused_geometry(dict(G.DEFAULT, TM=192), "Q4_K"), "TM=192 has no fused B producer"),
        (lambda: F.check_segments(np.zeros((4, 128), np.float16), [(raw, 2)], "Q4_K"), "multiple of 256"),
        (lambda: F.check_segments(a, [(raw, 3)], "Q4_K"), "segment 0 must be the 3 x 144 bytes"),
        (lambda: F.check_segments(a, [(raw.view(np.uint16), 2)], "Q4_K"), "1-D uint8"),
        (lambda: F.check_segments(a, [(raw, 2)] * 4, "Q4_K"), "1 to 3 weight segments"),
        (lambda: F.check_segments(a, [(raw, 2), (raw, 2)], "Q4_K"), "segment 1 starts at row 2; .* multiple of 64"),
        (lambda: F.check_segments(a, [(raw, 2)], "Q4_K", out=np.zeros((4, 2), np.float16)), "C-contiguous float32"),
        (lambda: F.check_segments(np.zeros((4, 0), np.float16), [(raw[:0], 2)], "Q4_K"), "positive multiple of 256"),
        (lambda: F.check_segments(a, [(np.zeros(4 * 144, np.uint8)[::2], 2)], "Q4_K"), "contiguous 1-D uint8"),
        (lambda: F.check_segments(a, [(raw, 2.0)], "Q4_K"), "whole number of rows"),
        (lambda: F.gemm_fused(a, [(raw, 2)], "Q4_K"), "segment 0 is a host array"),
        (lambda: F.gemm_fused(a, [(raw, 2)], "Q4_K", accumulate=True), "accumulate adds the product to out"),
        (lambda: F.check_segments(a.astype(np.float32), [(raw, 2)], "Q4_K"), "float16"),
        (lambda: F.check_segments(a, [(raw, 2)], "Q4_K", out=np.zeros((4, 3), np.float32)), r"float32 \[4, 2\]"),
    ]


@pytest.mark.parametrize("index", range(len(_bad_calls())))
def test_fused_refuses_bad_input_in_one_line(index):
    call, match = _bad_calls()[index]
    with pytest.raises(KernelConstraintError, match=match) as err:
        call()
    assert "\n" not in str(err.value)


@pytest.mark.compile
@pytest.mark.parametrize("config", [G.DEFAULT, dict(G.DEFAULT, TM=128, TN=64, STAGES=3)], ids=["default", "128x64"])
def test_fused_ptx(config):
    """The raw and A boxes, the raw reads, the f16x2 dequantization, swizzled 16-byte stores, the proxy fence, the
    named barrier, the barrier arrivals and wgmma; at most 168 registers a thread (the default's 9 warps put 3 on
    one scheduler: 168 is its register-file share)."""
    from ptx_assembly import ptxas_resources

    ptx = F.kernel_ptx(config, "Q4_K")
    for needle in ("ld.shared.v4.b32", "st.shared.v4.b32", "fence.proxy.async.shared::cta", "barrier.sync.aligned",
                   "prmt.b32", "sub.rn.f16x2", "fma.rn.f16x2",
                   "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes",
                   "mbarrier.arrive.expect_tx.shared::cta.b64", "mbarrier.arrive.shared::cta.b64",
                   "mbarrier.try_wait.parity.shared::cta.b64", "cvt.rn.f16x2.f32", "mul.rn.f32",
                   "wgmma.wait_group.sync.aligned 1;", ".extern .shared .align 1024"):
        assert needle in ptx, needle
    assert "ld.local" not in ptx and "st.local" not in ptx, "accumulators in local memory (NVVM)"
    res = ptxas_resources(ptx)
    assert res["registers"] <= 168


@pytest.mark.gpu
@pytest.mark.parametrize("config", [G.DEFAULT, dict(G.DEFAULT, SPLITK=3), dict(G.DEFAULT, TM=128, TN=64, STAGES=3)],
                         ids=["default", "split3", "128x64"])
@pytest.mark.parametrize("nt,rows,id_", [(2048, [18944, 18944], 3584), (128, [18944, 18944], 3584),
                                        (2047, [3584, 512, 513], 3584), (33, [70], 256)], ids=str)
def test_fused_gpu_matches_torch_and_the_f16_copy(config, nt, rows, id_):
    torch = pytest.importorskip("torch")
    a, raws, w16 = _operands(nt, rows, id_, seed=nt)
    got = _fused(a, raws, rows, config)
    assert np.isfinite(got).all()
    ref = (torch.from_numpy(a).cuda().double() @ torch.from_numpy(w16).cuda().double().T).cpu().numpy()
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-3
    f16_path = _f16_path(a, raws, rows, config)
    assert np.linalg.norm(got - f16_path) / np.linalg.norm(f16_path) < 1e-3


@sim
def test_experiment_fused_arm_runs_and_is_checked():
    """`minfer run gemm_f16 --arm IMPL=fused` on the tiny workload: the arm multiplies the input set's Q4_K bytes and
    passes the experiment's check; a poisoned element of its output fails it; refusals and cost name the fused
    kernel's rules and its weight bytes."""
    from minfer_cli.experiment import get

    exp = get("gemm_f16")
    wl = exp.workload("tiny")
    config = exp.config("IMPL=fused,TM=128,TN=64,STAGES=3")
    inputs, output = exp.make_input_set(wl, np.random.default_rng()), exp.make_output(wl)
    exp.poison(output)
    exp.prepare(config, wl)(inputs, output, 0)
    err = exp.check(config, wl, inputs, output)
    assert 0 < err < exp.tolerance(config, wl)
    host = output.copy_to_host()
    host[3, 5] = np.nan
    output.copy_to_device(host)
    assert exp.check(config, wl, inputs, output) == float("inf")
    assert "STAGES >= 3" in exp.refuse(exp.config("IMPL=fused,STAGES=2"), wl)
    assert exp.refuse(exp.config("IMPL=minfer,STAGES=2,STAGING=tma"), wl) is None
    s = wl.shape
    fused_bytes = exp.cost(wl, config).bytes
    assert exp.cost(wl, exp.config("IMPL=minfer")).bytes - fused_bytes == 2 * s["od"] * s["id"] - s["od"] * s["id"] // 256 * 144
