"""kernels/attention.py (prefill flash attention) and kernels/attention_decode.py (flash-decoding): numbers in the
CUDA simulator at tiny shapes against numpy float64, input errors, the compiled code of every knob combination
(`compile`), and real shapes against torch on a GPU (`gpu`)."""

from __future__ import annotations

import numpy as np
import pytest

from kernels.specialize import H200_SMEM_OPTIN
from numba import cuda

from experiments.attention import reference_numpy
from kernels import attention as A
from kernels import attention_decode as DEC
from kernels.errors import KernelConstraintError
from kernels.ptx import SIMULATOR
from minfer_cli.experiment import rel_l2

sim = pytest.mark.skipif(not SIMULATOR, reason="simulator session only (NUMBA_ENABLE_CUDASIM=1)")


def _qkv(nt, nt_kv, h, hk, seed=0, hd=128):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((nt, h, hd)).astype(np.float16)
    k = rng.standard_normal((nt_kv, hk, hd)).astype(np.float16)
    v = rng.standard_normal((nt_kv, hk, hd)).astype(np.float16)
    return q, k, v


def _prefill(config, nt, nt_kv, h, hk, hd=128, causal=True, seed=None):
    q, k, v = _qkv(nt, nt_kv, h, hk, seed, hd)
    out = cuda.to_device(np.full((nt, h, hd), np.nan, np.float16))  # poisoned: every row must be written
    A.flash_attention(cuda.to_device(q), cuda.to_device(k), cuda.to_device(v), out, causal=causal, config=config)
    got = out.copy_to_host().astype(np.float64)
    assert np.isfinite(got).all(), "some outputs were never written (or NaN)"
    return rel_l2(got, reference_numpy(q, k, v, causal=causal))


# ---- simulator: prefill numbers ----------------------------------------------------------------------------
# The simulator runs ~1 µs per thread-op and every mma is a 32-thread rendezvous: shapes are tiny, heads few.

D = A.DEFAULT
MS = dict(D, MMA="mma_sync")  # the FlashAttention-2 kernel (mma.sync), the default's predecessor
SIM_CASES = [
    ("nt=1, GQA 2/1", MS, (1, 1, 2, 1)),  # GQA 4/2's head mapping: the nt=17 case
    ("nt=17, GQA 4/2, BK=32", dict(MS, BK=32), (17, 17, 4, 2)),
    ("nt=70: 2 q tiles, 2 k tiles, tails", MS, (70, 70, 2, 1)),
    ("prefix: nt=9 after 31 cached, BK=32", dict(MS, BK=32), (9, 40, 2, 1)),
    ("head_dim 64: nt=37, GQA 4/2, BK=32", dict(MS, BK=32), (37, 37, 4, 2, 64)),
    ("head_dim 64: prefix, nt=9 after 60 cached", MS, (9, 69, 2, 1, 64)),
    ("head_dim 256: nt=19, GQA 2/1, BK=32", dict(MS, BK=32), (19, 19, 2, 1, 256)),
    ("wgmma: nt=70, GQA 2/1: 2 q tiles, 2 k tiles, tails", dict(D, MMA="wgmma"), (70, 70, 2, 1)),
    ("wgmma head_dim 64: prefix, nt=9 after 60 cached", dict(D, MMA="wgmma"), (9, 69, 2, 1, 64)),
    ("wgmma head_dim 256: nt=17", dict(D, MMA="wgmma"), (17, 17, 1, 1, 256)),
    ("wgmma BK=32: prefix, nt=9 after 40 cached", dict(D, MMA="wgmma", BK=32), (9, 49, 2, 1)),
    ("wgmma: nt=150, 3 q tiles, 3 k tiles", dict(D, MMA="wgmma"), (150, 150, 1, 1)),
    ("wgmma BK=32: prefix, nt=40 after 60, head_dim 64", dict(D, MMA="wgmma", BK=32), (40, 100, 2, 1, 64)),
    ("wgmma: one key tile (nt=5)", dict(D, MMA="wgmma"), (5, 5, 1, 1)),
    # head_dim 80 and 96: 128-element shared rows, D/16 k16 steps of Q·K^T; wgmma's P·V is m64n128k16 (padding columns
    # of O never stored)
    ("head_dim 80: nt=37, GQA 4/2, BK=32", dict(MS, BK=32), (37, 37, 4, 2, 80)),
    ("head_dim 96: prefix, nt=9 after 60 cached", MS, (9, 69, 2, 1, 96)),
    ("wgmma head_dim 80: prefix, nt=9 after 60 cached", dict(D, MMA="wgmma"), (9, 69, 2, 1, 80)),
    ("wgmma head_dim 96: nt=70, GQA 2/1", dict(D, MMA="wgmma"), (70, 70, 2, 1, 96)),  # P·V at n = 128
]


@sim
@pytest.mark.parametrize("config,shape", [c[1:] for c in SIM_CASES], ids=[c[0] for c in SIM_CASES])
def test_prefill_simulator_matches_float64(config, shape):
    assert _prefill(config, *shape) < 1e-2


@sim
def test_prefill_non_causal():
    assert _prefill(dict(D, BK=32), 5, 37, 2, 1, causal=False) < 1e-2
    assert _prefill(dict(D, BK=32), 5, 37, 2, 1, hd=64, causal=False) < 1e-2


# ---- simulator: decode numbers ------------------------------------------------------------------------------


def _decode(L, l_max, h, hk, splits, q_dtype=np.float32, hd=128, seed=None):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((h, hd)).astype(q_dtype)
    k = rng.standard_normal((l_max, hk, hd)).astype(np.float16)
    v = rng.standard_normal((l_max, hk, hd)).astype(np.float16)
    out = cuda.to_device(np.full((h, hd), np.nan, np.float32))
    ws_ml, ws_acc = DEC.decode_workspace(h, splits, head_dim=hd)
    for ws in (ws_ml, ws_acc):
        ws.copy_to_device(np.full(ws.shape, np.nan, np.float32))
    DEC.decode_attention(cuda.to_device(q), cuda.to_device(k), cuda.to_device(v),
                         cuda.to_device(np.array([L], np.int32)), out, splits=splits, workspace=(ws_ml, ws_acc))
    got = out.copy_to_host().astype(np.float64)
    assert np.isfinite(got).all()
    ref = reference_numpy(q[None].astype(np.float64), k[:L], v[:L], causal=False)[0]
    return rel_l2(got, ref)


@sim
@pytest.mark.parametrize("L,l_max,h,hk,splits,q_dtype,hd", [
    (1, 16, 4, 2, 2, np.float32, 128),
    (7, 16, 4, 2, 2, np.float16, 128),
    (37, 48, 6, 2, 1, np.float16, 128),
    (29, 32, 7, 1, 1, np.float32, 128),
    (300, 320, 2, 1, 16, np.float32, 128),
    (37, 48, 8, 2, 1, np.float32, 64),
    (3, 8, 4, 1, 2, np.float16, 64),
    (29, 32, 4, 2, 1, np.float32, 256),
    (37, 48, 6, 2, 1, np.float16, 80),
    (29, 32, 8, 1, 2, np.float32, 96),
], ids=["L=1: 1 of 8 partitions", "L=7 f16 q: 7 of 8", "L=37 G=3 f16 q: 10 rows a warp",
        "L=29 G=7: a half-warp and a row slot idle", "L=300: 64 partitions, 5 rows a warp",
        "head_dim 64, L=37 G=4: quarter-warp rows, 10 rows a warp", "head_dim 64, L=3 f16 q: 3 of 8 partitions",
        "head_dim 256, L=29 G=2: whole-warp rows, 8 rows a warp",
        "head_dim 80, L=37 G=3: 16-lane rows, 6 lanes padding; a half-empty combine block",
        "head_dim 96, L=29 G=8: 16-lane rows, 4 lanes padding"])
def test_decode_simulator_matches_float64(L, l_max, h, hk, splits, q_dtype, hd):
    """Against float64, the workspace NaN-poisoned. Partitions past L (`used_partitions`) leave warps and whole blocks
    idle; partition lengths that are not a multiple of a warp's row slots (8, 4 or 2 rows an iteration at head_dim
    64, 128, 256) leave slots masked; a block row or a masked slot read stale would show."""
    assert DEC.used_partitions(L, 4 * splits) == min(4 * splits, L)
    assert _decode(L, l_max, h, hk, splits, q_dtype, hd) < 1e-4


@sim
@pytest.mark.parametrize("compensated,hd", [(False, 128), (True, 128), (True, 64), (True, 96)])
def test_decode_q8_blocks_equal_a_separate_quantization(compensated, hd):
    """FUSE_ATTN_Q8's combine: the Q8_1 blocks (q, d, s and, compensated, r) it writes beside out equal
    `quantize_q8_1(out)`'s bit for bit (the blocks are NaN/garbage-poisoned before)."""
    from kernels.quantize_q8 import q8_blocks, quantize_q8_1

    rng = np.random.default_rng()
    h, hk, L = 4, 2, 7
    q = cuda.to_device(rng.standard_normal((h, hd)).astype(np.float32))
    k, v = (cuda.to_device(rng.standard_normal((8, hk, hd)).astype(np.float16)) for _ in range(2))
    out = cuda.to_device(np.full((h, hd), np.nan, np.float32))
    fused, separate = q8_blocks(h * hd, compensated=compensated), q8_blocks(h * hd, compensated=compensated)
    for blocks in (fused, separate):
        for a in (blocks.q, blocks.d, blocks.s) + ((blocks.r,) if compensated else ()):
            a.copy_to_device(np.full(a.shape, 0x55 if a.dtype == np.int8 else np.nan, a.dtype))
    DEC.decode_attention(q, k, v, cuda.to_device(np.array([L], np.int32)), out, splits=1, q8=fused)
    quantize_q8_1(out.reshape(h * hd), separate)
    for field in ("q", "d", "s") + (("r",) if compensated else ()):
        got, want = getattr(fused, field).copy_to_host(), getattr(separate, field).copy_to_host()
        assert np.isfinite(want.astype(np.float64)).all()
        np.testing.assert_array_equal(got.view(np.uint8 if got.dtype == np.int8 else np.uint32),
                                      want.view(np.uint8 if want.dtype == np.int8 else np.uint32), err_msg=field)


# ---- constraints (host-side) --------------------------------------------------------------------------------


@sim
@pytest.mark.parametrize("q_shape,kv_shape,dtype,match", [
    ((4, 2, 72), (4, 2, 72), np.float16, "head_dim 72: the attention kernels run head_dim 64, 80, 96, 128, 256 only"),
    ((4, 2, 64), (4, 2, 128), np.float16, "q has head_dim 64 but k has 128"),
    ((4, 3, 128), (4, 2, 128), np.float16, "multiple of n_kv_heads"),
    ((4, 2, 128), (4, 2, 128), np.float32, "must be float16"),
    ((8, 2, 128), (4, 2, 128), np.float16, "nt_kv >= nt"),
])
def test_prefill_bad_inputs_are_refused(q_shape, kv_shape, dtype, match):
    q = cuda.to_device(np.ones(q_shape, dtype))
    kv = cuda.to_device(np.ones(kv_shape, np.float16))
    with pytest.raises(KernelConstraintError, match=match):
        A.flash_attention(q, kv, kv)


@sim
@pytest.mark.parametrize("q_shape,q_dtype,kv_shape,match", [
    ((4, 112), np.float32, (8, 2, 112), "head_dim 112: the attention kernels run head_dim 64, 80, 96, 128, 256 only"),
    ((4, 64), np.float32, (8, 2, 128), "q has head_dim 64 but k_cache has 128"),
    ((18, 256), np.float32, (8, 2, 256), "group n_heads / n_kv_heads = 9 is above the supported 8 \\(at head_dim 256\\)"),
    ((3, 128), np.float32, (8, 2, 128), "multiple of n_kv_heads"),
    ((4, 128), np.float64, (8, 2, 128), "float32/float16"),
    ((34, 128), np.float32, (8, 2, 128), "group n_heads / n_kv_heads = 17 is above the supported 16"),
])
def test_decode_bad_inputs_are_refused(q_shape, q_dtype, kv_shape, match):
    q = cuda.to_device(np.ones(q_shape, q_dtype))
    kv = cuda.to_device(np.ones(kv_shape, np.float16))
    with pytest.raises(KernelConstraintError, match=match):
        DEC.decode_attention(q, kv, kv, cuda.to_device(np.array([1], np.int32)))
    good = cuda.to_device(np.ones((8, 2, 128), np.float16))
    one = cuda.to_device(np.array([1], np.int32))
    q4 = cuda.to_device(np.ones((4, 128), np.float32))
    for workspace, needle in (((cuda.to_device(np.zeros(8, np.int32)), cuda.to_device(np.zeros(512, np.float32))),
                               "workspace ml must be a contiguous 1-D float32 device array of at least 8 elements"),
                              ((cuda.to_device(np.zeros(8, np.float32)),), "workspace must be the \\(ml, acc\\) pair"),
                              ((cuda.to_device(np.zeros(8, np.float32)), cuda.to_device(np.zeros(511, np.float32))),
                               "workspace acc .* at least 512 elements")):
        with pytest.raises(KernelConstraintError, match=needle):
            DEC.decode_attention(q4, good, good, one, splits=1, workspace=workspace)
    with pytest.raises(KernelConstraintError, match="q must be a CUDA device array, got ndarray"):
        DEC.decode_attention(np.ones((4, 128), np.float32), good, good, one)
    with pytest.raises(KernelConstraintError, match="splits must be one of"):
        DEC.decode_attention(q4, good, good, one, splits=4.0)
    with pytest.raises(KernelConstraintError, match="splits must be one of 1, 2, 4, 8, 16, 32, 64, 128, got 3"):
        good = cuda.to_device(np.ones((8, 2, 128), np.float16))
        DEC.decode_attention(cuda.to_device(np.ones((4, 128), np.float32)), good, good,
                             cuda.to_device(np.array([1], np.int32)), splits=3)
    with pytest.raises(KernelConstraintError, match="int32"):
        DEC.decode_attention(cuda.to_device(np.ones((4, 128), np.float32)), cuda.to_device(np.ones((8, 2, 128), np.float16)),
                             cuda.to_device(np.ones((8, 2, 128), np.float16)), cuda.to_device(np.array([1], np.int64)))


@sim
def test_decode_q8_blocks_need_head_dims_of_whole_blocks():
    """At head_dim 80 a Q8_1 block of 32 outputs would straddle two heads' combine blocks: refused in one line."""
    from kernels.quantize_q8 import q8_blocks

    q = cuda.to_device(np.ones((4, 80), np.float32))
    kv = cuda.to_device(np.ones((8, 2, 80), np.float16))
    with pytest.raises(KernelConstraintError, match="q8 output needs head_dim a multiple of 32 .* got 80"):
        DEC.decode_attention(q, kv, kv, cuda.to_device(np.array([1], np.int32)), q8=q8_blocks(4 * 80))


def test_unknown_knob_and_value_are_refused():
    with pytest.raises(KernelConstraintError, match="no knob"):
        A.resolve_config({"BM": 64})
    with pytest.raises(KernelConstraintError, match="not allowed"):
        A.resolve_config({"BK": 96})
    with pytest.raises(KernelConstraintError, match="no knob 'BQ'"):
        A.resolve_config({"BQ": 64})  # deleted (REMOVED), not a knob any more
    assert A.resolve_config({"BK": "32"})["BK"] == 32


def test_geometry_follows_the_knobs():
    g = A.geometry(D)
    assert g.grid(2048, 28) == (28, 32) and g.threads == 128
    assert (g.bq, g.stages) == (64, 2) and g.smem_bytes == 2 * 128 * (64 + 2 * 2 * 64)
    assert A.geometry(dict(D, BK=32)).smem_bytes < g.smem_bytes
    assert max(A.geometry(c, head_dim=hd).smem_bytes for c in A.all_configs() for hd in A.HEAD_DIMS) <= H200_SMEM_OPTIN
    assert A.geometry(D, head_dim=64).smem_bytes * 2 == g.smem_bytes
    with pytest.raises(KernelConstraintError, match="head_dim 100: the attention kernels run head_dim 64, 80, 96, 128"):
        A.geometry(D, head_dim=100)
    assert A.geometry(D, head_dim=80).smem_bytes == A.geometry(D, head_dim=96).smem_bytes == g.smem_bytes
    assert [A.padded_head_dim(d) for d in A.HEAD_DIMS] == [64, 128, 128, 128, 256]


def test_experiment_cost_and_workloads():
    from experiments.attention import AttentionExperiment

    exp = AttentionExperiment()
    w = exp.workload("qwen2_7b_pp2048")
    c = exp.cost(w, exp.default_config())
    assert c.flops == 4 * 2048 * 2048 * 28 * 128 / 2
    assert c.bytes == 2 * 128 * (2 * 2048 * 28 + 2 * 2048 * 4)
    small = exp.cost(exp.workload("llama3_2_1b_pp2048"))
    assert small.flops == 4 * 2048 * 2048 * 32 * 64 / 2 and small.bytes == 2 * 64 * (2 * 2048 * 32 + 2 * 2048 * 8)
    assert {k.name for k in exp.knobs} == {"BK", "MMA", "IMPL"} and set(exp.removed_knobs) == {"BQ", "STAGES"}


# ---- compile: every knob combination, the right instructions, no local memory ------------------------------

COMBOS = [(cfg, causal) for cfg in A.all_configs() if cfg["MMA"] == "mma_sync" for causal in (True, False)]
WGMMA_COMBOS = [cfg for cfg in A.all_configs() if cfg["MMA"] == "wgmma"]
_WG_IDS = [f"BK={c['BK']}" for c in WGMMA_COMBOS]
_PTX: dict = {}


def _ptx(cfg, causal=True, hd=128) -> str:
    key = (tuple(sorted(A.resolve_config(cfg).items())), causal, hd)
    if key not in _PTX:
        _PTX[key] = A.kernel_ptx(cfg, causal, head_dim=hd)
    return _PTX[key]


@pytest.mark.compile
@pytest.mark.parametrize("cfg,causal", COMBOS, ids=[f"{' '.join(f'{k}={v}' for k, v in c.items())} causal={z}" for c, z in COMBOS])
def test_prefill_compiles(cfg, causal):
    ptx = _ptx(cfg, causal)
    for needle in ("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
                   "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16", "cp.async.cg.shared.global",
                   "shfl.sync.bfly.b32", "ex2.approx", "st.global.v4.u32"):
        assert needle in ptx, needle
    assert ".local" not in ptx, "fragments or accumulators spilled to local memory"
    assert ".f64" not in ptx, "double-precision arithmetic crept into the kernel"
    # S = Q·K^T and O += P·V: (BK/16) * 8 * 2 mma each per tile, fully unrolled
    assert ptx.count("mma.sync.aligned") == 2 * (cfg["BK"] // 16) * 8 * 2


@pytest.mark.compile
@pytest.mark.parametrize("cfg", WGMMA_COMBOS, ids=_WG_IDS)
@pytest.mark.parametrize("hd", [64, 80, 96, 128])
def test_prefill_wgmma_compiles_and_assembles(cfg, hd):
    """MMA=wgmma: D/16 shared-A wgmma (S = Q·K^T, m64nBK) and BK/16 register-A wgmma with the MN-major V (O += P·V,
    m64nD, transposed B) a key tile, the proxy fence; ptxas (nvJitLink, sm_90a) assembles it with no spills at
    head_dim 64, 80, 96 and 128 and without serializing the wgmma (no C7509 warning)."""
    from ptx_assembly import ptxas_resources

    ptx = A.kernel_ptx(cfg, True, cc=(9, 0, "a"), head_dim=hd)
    bk, dp = cfg["BK"], A.padded_head_dim(hd)  # P·V is m64n(DP): 128 at head_dim 80 and 96
    shape = "wgmma.mma_async.sync.aligned.m64n{}k16.f32.f16.f16"
    if bk == dp:
        assert ptx.count(shape.format(bk)) == hd // 16 + bk // 16
    else:
        assert ptx.count(shape.format(bk)) == hd // 16 and ptx.count(shape.format(dp)) == bk // 16
    assert ptx.count(", p, 1, 1, 1;") == bk // 16  # the register-A products read V MN-major
    for needle in ("fence.proxy.async.shared::cta", "wgmma.wait_group.sync.aligned 0;", "cp.async.cg.shared.global"):
        assert needle in ptx, needle
    assert "mma.sync.aligned" not in ptx and "ldmatrix" not in ptx and ".f64" not in ptx
    got = ptxas_resources(ptx)
    assert got["spill_bytes"] == 0 and got["local_bytes"] == 0, got
    assert not got["wgmma_serialized"], "a call in the kernel (64-bit or IEEE division?) serializes its wgmma"


@pytest.mark.compile
@pytest.mark.parametrize("hd", [64, 80, 96, 256])
@pytest.mark.parametrize("cfg", [MS, dict(MS, BK=32)], ids=["mma_sync", "mma_sync BK=32"])
def test_prefill_compiles_at_other_head_dims(cfg, hd):
    """head_dim 64, 80, 96 and 256: D/16 k16 steps of Q·K^T and D/8 n8 tiles of O, fully unrolled; ptxas
    (nvJitLink) keeps the fragments of 64, 80 and 96 in registers. At 256 the O accumulators alone are 128 f32 a
    lane, so only that it assembles is checked (its spill bytes are reported by `minfer kernels`, not asserted)."""
    from ptx_assembly import ptxas_resources

    ptx = _ptx(cfg, True, hd)
    assert ptx.count("mma.sync.aligned") == 2 * (cfg["BK"] // 16) * (hd // 16) * 2
    assert ".f64" not in ptx
    got = ptxas_resources(ptx)
    if hd < 128:
        assert ".local" not in ptx and got["spill_bytes"] == 0, got
    assert _ptx(cfg, True, hd) != _ptx(cfg, True, 128)


@pytest.mark.compile
@pytest.mark.parametrize("knob", list(A.KNOBS))
def test_each_knob_changes_the_code(knob):
    for value in A.KNOBS[knob]:
        if value != D[knob]:
            assert _ptx(dict(D, **{knob: value})) != _ptx(D), f"{knob}={value} compiles to the default's PTX"
    assert _ptx(D, causal=False) != _ptx(D, causal=True)


@pytest.mark.compile
@pytest.mark.parametrize("q8_mode", DEC.Q8_MODES)
def test_decode_combine_with_q8_blocks_compiles_without_local_memory(q8_mode):
    from ptx_assembly import ptxas_resources

    combine = DEC.kernel_ptx(7, q8_mode=q8_mode)[1]
    assert ".local" not in combine and ("st.global.u8" in combine or "st.global.s8" in combine) == (q8_mode > 0)
    assert ptxas_resources(combine)["spill_bytes"] == 0


@pytest.mark.compile
@pytest.mark.parametrize("group,q_dtype", [(7, np.float32), (1, np.float16), (6, np.float32), (8, np.float32),
                                           (DEC.MAX_GROUP, np.float32)])
def test_decode_compiles(group, q_dtype):
    """G = 7 (Qwen2-7B), 6 (Qwen2-1.5B), 8 (70B), 1: the accumulators stay in registers (no local memory); the
    largest group compiles (its shared-memory join fits the static 48 KiB)."""
    partial, combine = DEC.kernel_ptx(group, q_dtype)
    assert "ld.global.v4.b32" in partial and "bar.sync" in partial
    if group == DEC.MAX_GROUP:
        return
    assert "shfl.sync.bfly.b32" in partial and "ex2.approx" in partial and "ex2.approx" in combine
    assert ".local" not in partial and ".local" not in combine
    assert ".f64" not in partial and ".f64" not in combine


@pytest.mark.compile
@pytest.mark.parametrize("group,hd", [(4, 64), (DEC.max_group(64), 64), (2, 256), (DEC.max_group(256), 256),
                                     (4, 80), (1, 96)],
                         ids=["G=4 hd=64 (Llama-3.2-1B)", "largest G at hd=64", "G=2 hd=256", "largest G at hd=256",
                              "G=4 hd=80", "G=1 hd=96 (Phi-3)"])
def test_decode_compiles_at_other_head_dims(group, hd):
    """Quarter-warp (64) and whole-warp (256) rows: the shuffle tree and the lane-group joins compile; the
    shared-memory join fits the static 48 KiB at the largest group; G = 4 at 64 stays in registers."""
    from ptx_assembly import ptxas_resources

    partial, combine = DEC.kernel_ptx(group, head_dim=hd)
    assert "ld.global.v4.b32" in partial and "bar.sync" in partial and "ex2.approx" in combine
    got = ptxas_resources(partial)
    if group <= 4:
        assert got["spill_bytes"] == 0 and got["local_bytes"] == 0, got
    assert ptxas_resources(combine)["spill_bytes"] == 0


@pytest.mark.compile
def test_decode_partial_kernel_does_not_spill():
    """ptxas (nvJitLink): the G = 7 partial kernel (the 7B preset's group) keeps its accumulators in registers, no
    spills and no stack."""
    from ptx_assembly import ptxas_resources

    got = ptxas_resources(DEC.kernel_ptx(7)[0])
    assert got["spill_bytes"] == 0 and got["local_bytes"] == 0, got


# ---- gpu: real shapes against torch --------------------------------------------------------------------------


def _torch_sdpa(q, k, v):
    import torch
    import torch.nn.functional as F

    tq, tk, tv = (torch.from_numpy(x).cuda().float().transpose(0, 1)[None] for x in (q, k, v))
    g = q.shape[1] // k.shape[1]
    tk, tv = tk.repeat_interleave(g, 1), tv.repeat_interleave(g, 1)
    torch.backends.cuda.matmul.allow_tf32 = False
    return F.scaled_dot_product_attention(tq, tk, tv, is_causal=True)[0].transpose(0, 1).double().cpu().numpy()


@pytest.mark.gpu
@pytest.mark.parametrize("config", [MS, dict(MS, BK=32), dict(D, MMA="wgmma"), dict(D, MMA="wgmma", BK=32)],
                         ids=["mma_sync", "mma_sync BK=32", "wgmma", "wgmma BK=32"])
@pytest.mark.parametrize("nt", [1, 33, 2048, 2055])
def test_prefill_gpu_matches_torch(config, nt):
    pytest.importorskip("torch")
    q, k, v = _qkv(nt, nt, 28, 4, seed=3)
    out = cuda.to_device(np.full((nt, 28, 128), np.nan, np.float16))
    A.flash_attention(cuda.to_device(q), cuda.to_device(k), cuda.to_device(v), out, config=config)
    got = out.copy_to_host().astype(np.float64)
    assert np.isfinite(got).all()
    assert rel_l2(got, _torch_sdpa(q, k, v)) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("mma", ["mma_sync", "wgmma"])
@pytest.mark.parametrize("hd,h,hk", [(64, 32, 8), (256, 8, 4), (80, 32, 8), (96, 32, 32)],
                         ids=["hd64 Llama-3.2-1B heads", "hd256", "hd80", "hd96 Phi-3 heads"])
@pytest.mark.parametrize("nt", [33, 2055])
def test_prefill_gpu_matches_torch_at_other_head_dims(hd, h, hk, nt, mma):
    pytest.importorskip("torch")
    q, k, v = _qkv(nt, nt, h, hk, seed=5, hd=hd)
    out = cuda.to_device(np.full((nt, h, hd), np.nan, np.float16))
    A.flash_attention(cuda.to_device(q), cuda.to_device(k), cuda.to_device(v), out, config=dict(D, MMA=mma))
    got = out.copy_to_host().astype(np.float64)
    assert np.isfinite(got).all() and rel_l2(got, _torch_sdpa(q, k, v)) < 1e-2


@pytest.mark.gpu
def test_prefill_gpu_prefix_matches_float64():
    q, k, v = _qkv(100, 612, 28, 4, seed=4)
    out = cuda.to_device(np.full((100, 28, 128), np.nan, np.float16))
    A.flash_attention(cuda.to_device(q), cuda.to_device(k), cuda.to_device(v), out)
    assert rel_l2(out.copy_to_host().astype(np.float64), reference_numpy(q, k, v)) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("L, splits, hd, h, hk", [
    (1, 128, 128, 28, 4), (3, 128, 128, 28, 4), (4097, 128, 128, 28, 4), (4352, 128, 128, 28, 4),
    (4097, 32, 128, 28, 4), (517, 1, 128, 28, 4), (4352, 64, 128, 28, 4),
    (4097, 64, 64, 32, 8), (3, 64, 64, 32, 8), (4097, 64, 256, 16, 2), (4097, 64, 80, 32, 8), (517, 64, 96, 32, 32)])
def test_decode_gpu_matches_torch(L, splits, hd, h, hk):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(9)
    l_max = 4352
    q = rng.standard_normal((h, hd)).astype(np.float32)
    k = rng.standard_normal((l_max, hk, hd)).astype(np.float16)
    v = rng.standard_normal((l_max, hk, hd)).astype(np.float16)
    out = cuda.to_device(np.full((h, hd), np.nan, np.float32))
    DEC.decode_attention(cuda.to_device(q), cuda.to_device(k), cuda.to_device(v),
                         cuda.to_device(np.array([L], np.int32)), out, splits=splits)
    tq = torch.from_numpy(q).cuda()[None, :, None]  # [1, h, 1, hd]
    tk = torch.from_numpy(k[:L]).cuda().float().transpose(0, 1)[None].repeat_interleave(h // hk, 1)
    tv = torch.from_numpy(v[:L]).cuda().float().transpose(0, 1)[None].repeat_interleave(h // hk, 1)
    ref = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv)[0, :, 0].double().cpu().numpy()
    assert rel_l2(out.copy_to_host().astype(np.float64), ref) < 1e-4


@sim
@pytest.mark.parametrize("workload", ["tiny", "tiny_hd64", "tiny_hd80"])
def test_decode_experiment_tiny_round_trip(workload):
    """The `attention_decode` experiment's own path (inputs, poison, prepare, launch, check) on its tiny workloads;
    its check sees a wrong output (one head's row shifted)."""
    from experiments.attention_decode import AttentionDecodeExperiment

    exp = AttentionDecodeExperiment()
    w = exp.workload(workload)
    config = exp.config("SPLITS=16")
    inputs = exp.make_input_set(w, np.random.default_rng())
    output = exp.make_output(w)
    exp.poison(output)
    assert np.isinf(exp.check(config, w, inputs, output))
    exp.prepare(config, w)(inputs, output, 0)
    assert exp.check(config, w, inputs, output) < exp.tolerance(config, w)
    good = output.copy_to_host()
    good[1] = np.roll(good[1], 1)
    output.copy_to_device(good)
    assert exp.check(config, w, inputs, output) > 1e-2
    assert [k.threads for k in exp.kernels(config, w)] == [128, 256]
    hd, h = w.shape["head_dim"], w.shape["n_heads"]
    assert exp.cost(w).bytes == 2 * 2 * 37 * 1 * hd + 2 * 4 * h * hd


@sim
@pytest.mark.parametrize("workload", ["tiny", "tiny_hd64", "tiny_hd80"])
def test_experiment_tiny_round_trip(workload):
    """The experiment's own path (inputs, poison, prepare, launch, check) on its tiny workloads."""
    from experiments.attention import AttentionExperiment

    exp = AttentionExperiment()
    w = exp.workload(workload)
    config = exp.config("BK=32")
    inputs = exp.make_input_set(w, np.random.default_rng(2))
    output = exp.make_output(w)
    exp.poison(output)
    assert np.isinf(exp.check(config, w, inputs, output))  # a poisoned output fails the gate
    exp.prepare(config, w)(inputs, output, 0)
    assert exp.check(config, w, inputs, output) < exp.tolerance(config, w)
    (inst,) = exp.kernels(config, w)
    assert inst.threads == 128 and inst.dynamic_smem == A.geometry(dict(D, BK=32), head_dim=w.shape["head_dim"]).smem_bytes
