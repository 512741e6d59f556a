"""The decode engine's mat-vec launch policy (`minfer_cli.engine.gemv_policy`) and weight stacking: which launch
shape (general, FEW_ROWS, DEEP, WIDE_RING, AHEAD's lookahead) each mat-vec gets, FUSE_QKV's stacked q|k weights as
views of the loaded bytes; one eager step at the default shapes within the accuracy bar (simulator). GPU: the deep
launch at a Qwen2-7B ffn_down against float64 and the general launch, and DEEP=1 against DEEP=0 logits on a
qwen2-shaped model. The kernels themselves are tested in tests/test_gemv.py."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from numba import cuda

from minfer_cli.engine.options import DecodeOptions
from minfer_cli.experiment import rel_l2
from tests.decode_models import generate_with_logits, micro, qwen2_shaped


def test_fuse_qkv_stacks_runs_of_one_format_and_glu_pairs_gate_and_up(micro_weights):
    """FUSE_QKV=1 wiring: q and k (both Q4_K) become one mat-vec over their stacked rows, v (Q6_K) stays alone, each
    writing its own slice of the q|k|v vector; FUSE_GLU's kernel reads gate and up of one format. That the fused
    paths compute bit-identical logits to the unfused ones: `test_fusion_knobs_give_bit_identical_logits` (GPU,
    8 graph-replayed steps per knob; each fused kernel alone against float64 in tests/test_gemv.py)."""
    from minfer_cli.engine.decode import DecodeEngine

    c = micro_weights.config
    fused = DecodeEngine(micro_weights, 2, DecodeOptions(graphs=False, fuse_qkv=True), splits=1, rows_per_block=8,
                         warps_per_row=1)
    assert [(m.qtype, m.od) for m, _, _ in fused.layers[0].qkv] == [("Q4_K", c.q_dim + c.kv_dim), ("Q6_K", c.kv_dim)]
    assert [out.shape[0] for _, out, _ in fused.layers[0].qkv] == [c.q_dim + c.kv_dim, c.kv_dim]
    names = ["blk.0.attn_q", "blk.0.attn_k"]
    (m, _, bias) = fused.layers[0].qkv[0]
    np.testing.assert_array_equal(m.raw.copy_to_host(), np.concatenate([micro_weights.to_host(n + ".weight")
                                                                        for n in names]))
    np.testing.assert_array_equal(bias.copy_to_host(), np.concatenate([micro_weights.to_host(n + ".bias")
                                                                       for n in names]).view(np.float32))
    plain = DecodeEngine(micro_weights, 2, DecodeOptions(graphs=False, fuse_qkv=False), splits=1, rows_per_block=8,
                         warps_per_row=1)
    assert [m.od for m, _, _ in plain.layers[0].qkv] == [c.q_dim, c.kv_dim, c.kv_dim]
    assert plain.layers[0].gate.qtype == plain.layers[0].up.qtype


def test_stacked_weights_are_views_only_while_back_to_back():
    """`ModelWeights.stacked`: each layer's q, k, v weights are one allocation (a view of their bytes, in order);
    a tensor replaced since loading, names out of order, padding between two tensors (a size that is not a multiple
    of STACK_ALIGN) or tensors outside a group give None, and FUSE_QKV then runs those mat-vecs separately."""
    from numba import cuda

    from minfer_cli.engine.config import TensorSpec
    from minfer_cli.engine.decode import DecodeEngine
    from minfer_cli.engine.weights import STACK_ALIGN, synth_weights

    weights = synth_weights(dataclasses.replace(micro(), n_layers=2), int(np.random.default_rng().integers(0, 2**31)))
    q, k, v = (f"blk.1.attn_{p}.weight" for p in "qkv")
    got = weights.stacked([q, k, v])
    np.testing.assert_array_equal(got.copy_to_host(), np.concatenate([weights.to_host(n) for n in (q, k, v)]))
    assert weights.stacked([k, q]) is None and weights.stacked([q, "blk.1.attn_output.weight"]) is None
    assert weights.stacked(["blk.0.attn_q.weight", "blk.1.attn_k.weight"]) is None
    spec = weights.spec(k)
    weights.tensors[k] = (spec, cuda.to_device(weights.to_host(k)))  # same bytes, another allocation
    assert weights.stacked([q, k]) is None
    engine = DecodeEngine(weights, 2, DecodeOptions(graphs=False), splits=1, rows_per_block=8, warps_per_row=1)
    assert [m.od for m, _, _ in engine.layers[1].qkv] == [weights.spec(q).od, spec.od, weights.spec(v).od]
    assert engine.layers[0].qkv[0][0].od > weights.spec(q).od  # layer 0 untouched: q and k (and v) still stacked
    odd = TensorSpec("blk.0.attn_q.weight", (3, 1), "F32")  # 12 bytes
    assert odd.n_bytes % STACK_ALIGN
    again = synth_weights(micro(), 1)
    again.allocate([odd] + [again.spec(n) for n in ("blk.0.attn_k.weight",)])
    assert again.stacked(["blk.0.attn_q.weight", "blk.0.attn_k.weight"]) is None


def test_deep_launch_only_for_long_q4_k_and_q6_k_rows(monkeypatch):
    """DEEP=1 (on 132 SMs): a Q4_K or Q6_K mat-vec of at least DEEP_COLS columns gets its format's
    `GEMV_MMVQ_DEEP` (Q6_K: the cp.async ring and the offset fold) and MINB for its grid's one wave
    (`kernels.gemv.one_wave_min_blocks`); shorter rows, other formats, a Q6_K weight the ring cannot read (not a
    whole number of 16-byte vectors) and a grid no bound of >= 72 registers fits in one wave (od 4096: MINB=8) keep
    the general MMVQ shape; without Q8_1 input blocks every format takes the f32-input kernel."""
    from kernels.gemv import GemvConfig, one_wave_min_blocks
    from minfer_cli.engine import gemv_policy
    from minfer_cli.engine.gemv_policy import DEEP_COLS, GEMV_F32, GEMV_MMVQ, GEMV_MMVQ_DEEP, GemvOperand, GemvPolicy

    monkeypatch.setattr(gemv_policy, "sm_count", lambda: 132)
    policy = GemvPolicy(DecodeOptions(graphs=False, deep=True))
    minb = one_wave_min_blocks(896, 132, 4)
    assert minb == 7
    for qtype in ("Q4_K", "Q6_K"):
        config = policy.config(GemvOperand(None, qtype, 3584, DEEP_COLS), True, wide=True)
        assert config == GemvConfig(qtype, mmvq=True, **GEMV_MMVQ_DEEP[qtype], pdl=1, min_blocks=minb, xres=True)
        f32 = policy.config(GemvOperand(None, qtype, 3584, DEEP_COLS), False, wide=True)
        assert f32 == GemvConfig(qtype, mmvq=False, **GEMV_F32, pdl=1)
    odd = cuda.to_device(np.zeros(3 * 8 + 1, dtype=np.uint16))  # 50 bytes: not a whole number of 16-byte vectors
    for m in (GemvOperand(None, "Q4_K", 3584, DEEP_COLS - 256), GemvOperand(None, "Q8_0", 3584, DEEP_COLS),
              GemvOperand(odd, "Q6_K", 3584, DEEP_COLS), GemvOperand(None, "Q4_K", 4096, DEEP_COLS),
              GemvOperand(None, "Q6_K", 4096, DEEP_COLS)):
        assert policy.config(m, True, wide=True) == GemvConfig(m.qtype, mmvq=True, **GEMV_MMVQ, pdl=1, xres=True), m


def test_few_rows_launch_only_for_mmvq_mat_vecs_of_at_most_2048_rows(monkeypatch):
    """FEW_ROWS=1 (the default, on 132 SMs): an MMVQ mat-vec of at most FEW_ROWS rows (the 1.5B's q|k|v, 2048, and
    attention output, 1536; with or without the residual epilogue) takes `GEMV_MMVQ_FEW`; one more row, the SwiGLU
    kernel, an f32-input mat-vec and a long-row (DEEP) one keep theirs; FEW_ROWS=0 the general shape."""
    from kernels.gemv import GemvConfig, one_wave_min_blocks
    from minfer_cli.engine import gemv_policy
    from minfer_cli.engine.gemv_policy import (DEEP_COLS, FEW_ROWS, GEMV_F32, GEMV_MMVQ, GEMV_MMVQ_DEEP, GEMV_MMVQ_FEW,
                                               GemvOperand, GemvPolicy)

    monkeypatch.setattr(gemv_policy, "sm_count", lambda: 132)
    on, off = GemvPolicy(DecodeOptions(graphs=False)), GemvPolicy(DecodeOptions(graphs=False, few_rows=False))
    for od, residual in ((FEW_ROWS, False), (1536, True), (256, False)):
        m = GemvOperand(None, "Q4_K", od, 1536)
        assert on.config(m, True, wide=True, residual=residual) == GemvConfig(
            "Q4_K", mmvq=True, **GEMV_MMVQ_FEW, pdl=1, xres=True, residual=residual), od
        assert off.config(m, True, wide=True, residual=residual) == GemvConfig(
            "Q4_K", mmvq=True, **GEMV_MMVQ, pdl=1, xres=True, residual=residual), od
    general = GemvConfig("Q6_K", mmvq=True, **GEMV_MMVQ, pdl=1, xres=True)
    assert on.config(GemvOperand(None, "Q6_K", FEW_ROWS + 1, 1536), True, wide=True) == general
    assert on.config(GemvOperand(None, "Q4_K", 1536, 1536), True, wide=False, glu=True) == GemvConfig(
        "Q4_K", mmvq=True, **GEMV_MMVQ, pdl=1, xres=True, glu=True)
    assert on.config(GemvOperand(None, "Q4_K", 1536, 1536), False, wide=True) == GemvConfig(
        "Q4_K", mmvq=False, **GEMV_F32, pdl=1)
    assert on.config(GemvOperand(None, "Q4_K", 1536, DEEP_COLS), True, wide=True) == GemvConfig(
        "Q4_K", mmvq=True, **GEMV_MMVQ_DEEP["Q4_K"], pdl=1, xres=True, min_blocks=one_wave_min_blocks(384, 132, 4))


def test_wide_ring_launch_only_for_q6_k_mat_vecs_of_many_rows():
    """WIDE_RING=1: an MMVQ Q6_K mat-vec of at least WIDE_ROWS rows (the vocabulary head) takes the ring and the fold
    (`GEMV_MMVQ_WIDE_RING`, no AHEAD lookahead: the ring has its own prologue); one row fewer, a Q4_K head (the wide
    shape), the SwiGLU kernel, f32 input and a weight whose bytes the ring cannot take keep theirs; WIDE_RING=0 the
    general shape."""
    from numba import cuda

    from kernels.gemv import GemvConfig
    from minfer_cli.engine.gemv_policy import (GEMV_F32, GEMV_MMVQ, GEMV_MMVQ_FEW, GEMV_MMVQ_WIDE,
                                               GEMV_MMVQ_WIDE_RING, WIDE_ROWS, GemvOperand, GemvPolicy)

    on = GemvPolicy(DecodeOptions(graphs=False, ahead=2))
    off = GemvPolicy(DecodeOptions(graphs=False, ahead=2, wide_ring=False))
    head = GemvOperand(None, "Q6_K", WIDE_ROWS, 1536)
    ring = GemvConfig("Q6_K", mmvq=True, **GEMV_MMVQ_WIDE_RING["Q6_K"], pdl=1, xres=True)
    general = GemvConfig("Q6_K", mmvq=True, **GEMV_MMVQ, pdl=1, xres=True, lookahead=2)
    assert on.config(head, True, wide=True) == ring and ring.stage == 2 and ring.fold == 1
    assert off.config(head, True, wide=True) == general
    assert on.config(GemvOperand(None, "Q6_K", WIDE_ROWS - 1, 1536), True, wide=True) == general
    assert on.config(GemvOperand(None, "Q6_K", 512, 1536), True, wide=True) == GemvConfig(
        "Q6_K", mmvq=True, **GEMV_MMVQ_FEW, pdl=1, xres=True, lookahead=2)
    assert on.config(GemvOperand(None, "Q4_K", WIDE_ROWS, 1536), True, wide=True) == GemvConfig(
        "Q4_K", mmvq=True, **GEMV_MMVQ_WIDE, pdl=1, xres=True, lookahead=2)
    assert on.config(head, True, wide=False, glu=True) == GemvConfig(
        "Q6_K", mmvq=True, **GEMV_MMVQ, pdl=1, xres=True, lookahead=2, glu=True)
    assert on.config(head, False, wide=True) == GemvConfig("Q6_K", mmvq=False, **GEMV_F32, pdl=1, lookahead=2)
    odd = GemvOperand(cuda.to_device(np.zeros(210 * 6 + 8, np.uint8)), "Q6_K", WIDE_ROWS + 1, 1536)
    assert on.config(odd, True, wide=True) == general  # not a whole number of 16-byte vectors: no ring


def test_few_rows_decode_step_within_the_accuracy_bar(micro_weights, monkeypatch):
    """The engine's default launch shapes (no override): every mat-vec of the micro model (at most 256 rows) but the
    SwiGLU one takes FEW_ROWS=1's two rows a block; one eager step within 1e-2 of the float64 forward."""
    import kernels.gemv
    from minfer_cli.engine.decode import DecodeEngine
    from minfer_cli.engine.gemv_policy import GEMV_MMVQ_FEW
    from minfer_cli.engine.reference import Reference

    shapes, gemv_q = [], kernels.gemv.gemv_q
    monkeypatch.setattr(kernels.gemv, "gemv_q", lambda *a, **k: (
        shapes.append((k["config"].rows_per_block, k["config"].warps_per_row)), gemv_q(*a, **k))[1])
    first = int(np.random.default_rng().integers(0, micro_weights.config.vocab))
    engine = DecodeEngine(micro_weights, 2, DecodeOptions(graphs=False), splits=1)
    engine.start(first, 0)
    got = engine.step().copy_to_host()
    assert shapes and set(shapes) == {(GEMV_MMVQ_FEW["rows_per_block"], GEMV_MMVQ_FEW["warps_per_row"])}, shapes
    assert rel_l2(got, Reference(micro_weights).forward([first], last_only=True)) < 1e-2


def test_ahead_reaches_every_ringless_mat_vec(monkeypatch):
    """AHEAD=4 (with PDL): every mat-vec kernel without the ring prefetches its warps' first 4 chunks before its
    wait (`kernels.gemv.GemvConfig.lookahead`); DEEP's Q6_K ring keeps its own prologue (and its deep launch);
    PDL=0 has no prologue, so AHEAD is not passed on."""
    from kernels.gemv import GemvConfig, one_wave_min_blocks
    from minfer_cli.engine import gemv_policy
    from minfer_cli.engine.gemv_policy import (DEEP_COLS, GEMV_MMVQ, GEMV_MMVQ_DEEP, GEMV_MMVQ_FEW, GemvOperand,
                                               GemvPolicy)

    monkeypatch.setattr(gemv_policy, "sm_count", lambda: 132)
    policy = GemvPolicy(DecodeOptions(graphs=False, ahead=4))
    minb = one_wave_min_blocks(896, 132, 4)
    q4 = policy.config(GemvOperand(None, "Q4_K", 3584, DEEP_COLS), True, wide=True)
    assert q4 == GemvConfig("Q4_K", mmvq=True, **GEMV_MMVQ_DEEP["Q4_K"], pdl=1, min_blocks=minb, xres=True, lookahead=4)
    q6 = policy.config(GemvOperand(None, "Q6_K", 3584, DEEP_COLS), True, wide=True)
    assert q6 == GemvConfig("Q6_K", mmvq=True, **GEMV_MMVQ_DEEP["Q6_K"], pdl=1, min_blocks=minb, xres=True)
    general = policy.config(GemvOperand(None, "Q6_K", 4608, 3584), True, wide=False)
    assert general == GemvConfig("Q6_K", mmvq=True, **GEMV_MMVQ, pdl=1, xres=True, lookahead=4)
    small = policy.config(GemvOperand(None, "Q6_K", 512, 3584), True, wide=False)  # FEW_ROWS's shape
    assert small == GemvConfig("Q6_K", mmvq=True, **GEMV_MMVQ_FEW, pdl=1, xres=True, lookahead=4)
    plain = GemvPolicy(DecodeOptions(graphs=False, ahead=4, pdl=False))
    assert plain.config(GemvOperand(None, "Q6_K", 512, 3584), True, wide=False).lookahead == 1


# ---- GPU -------------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K"])
def test_deep_launch_at_ffn_down_against_float64_and_the_general_launch(micro_weights, qtype):
    """DEEP=1's launch for a Qwen2-7B ffn_down (3584 x 18944; Q6_K: the cp.async ring and the offset fold; MINB for
    one wave) on fresh random blocks, residual added in place as the decode step does: within 1e-5 of float64 and
    of the general MMVQ launch (the same products, each row's sums split over 4 warps instead of 2)."""
    from experiments.gemv import reference_mmvq
    from kernels.gemv import GemvConfig, gemv_q
    from kernels.quantize_q8 import q8_blocks, quantize_q8_1
    from minfer_cli.engine.decode import DecodeEngine
    from minfer_cli.engine.gemv_policy import DEEP_COLS, GEMV_MMVQ
    from minfer_cli.engine.gemv_policy import GemvOperand
    from minfer_cli.quant_blocks import random_blocks

    od, id = 3584, 18944
    rng = np.random.default_rng()
    raw_host = random_blocks(qtype, od, id, rng)
    raw = cuda.to_device(raw_host)
    x = rng.standard_normal(id).astype(np.float32)
    res = rng.standard_normal(od).astype(np.float32)
    xq = quantize_q8_1(cuda.to_device(x), q8_blocks(id))
    engine = DecodeEngine(micro_weights, 2, DecodeOptions(graphs=False, deep=True), splits=1)
    deep = engine.gemv.deep_launch(GemvOperand(raw, qtype, od, id))
    if deep is None:
        pytest.skip("this GPU fits no 896-block grid of RPB=4, WPR=4 in one wave at >= 72 registers (H200: MINB=7)")
    assert id >= DEEP_COLS and deep["warps_per_row"] == 4 and deep.get("stage", 0) == (2 if qtype == "Q6_K" else 0)
    ref = reference_mmvq(raw_host, qtype, od, id, x) + res
    got = {}
    for name, launch in (("deep", deep), ("general", GEMV_MMVQ)):
        out = cuda.to_device(res)
        # pdl=0: a lone launch on the default stream (the engine's PDL chain is tested with its own stream)
        config = GemvConfig(qtype, mmvq=True, residual=True, **{**launch, "pdl": 0})
        gemv_q(raw, qtype, od, id, xq, out, config=config, residual=out)
        got[name] = out.copy_to_host().astype(np.float64)
        assert np.abs(got[name] - ref).max() <= 1e-5 * np.abs(ref).max(), name
    assert np.abs(got["deep"] - got["general"]).max() <= 1e-5 * np.abs(ref).max()


@pytest.mark.gpu
def test_deep_and_general_launches_give_close_logits_on_a_qwen2_shaped_model():
    """DEEP=1 (the default) against DEEP=0 on Qwen2-7B's shapes cut to 2 layers (ffn_down Q4_K in layer 0, Q6_K in
    layer 1: both deep launches are used), graph-replayed for 8 steps teacher-forced on DEEP=0's tokens: logits
    within 1e-2 of max |logit| (the torch check's bound: float32 rounding differences grow to ~1e-3 through this
    random model; the kernels themselves agree within 1e-5, measured ~1e-7 on the H200:
    `test_deep_launch_at_ffn_down_against_float64_and_the_general_launch`)."""
    from minfer_cli.engine.config import use_more_bits
    from minfer_cli.engine.decode import DecodeEngine
    from minfer_cli.engine.weights import synth_weights

    assert not use_more_bits(0, 2) and use_more_bits(1, 2)
    rng = np.random.default_rng()
    weights = synth_weights(qwen2_shaped(), int(rng.integers(0, 2**31)))
    first = int(rng.integers(0, weights.config.vocab))
    general = DecodeEngine(weights, 16, DecodeOptions(deep=False))
    general.start(first, 0)
    tokens, want = generate_with_logits(general, 8)
    general.close()
    deep = DecodeEngine(weights, 16, DecodeOptions(deep=True))
    for pos, token in enumerate([first] + tokens[:-1]):
        deep.start(token, pos)
        deep.generate(1)
        got = deep.logits.copy_to_host().astype(np.float64)
        assert np.isfinite(got).all() and np.abs(got - want[pos]).max() <= 1e-2 * np.abs(want[pos]).max(), pos
    launches = {key[0]: launch for key, launch in deep.gemv.deep_launches.items()}
    deep.close()
    if launches["Q4_K"] is None:
        pytest.skip("this GPU fits no deep launch in one wave (H200: MINB=7); the logits above were the general shape's")
    assert launches["Q4_K"]["warps_per_row"] == 4 and launches["Q6_K"]["stage"] == 2 and launches["Q6_K"]["fold"] == 1
