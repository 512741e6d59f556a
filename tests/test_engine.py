"""The prefill engine end to end against the independent float64 numpy forward (`minfer_cli.engine.reference`).

Simulator session: the `tiny` preset (2 layers, head_dim 128, Q4_K_M mix) on a short prompt. GPU: a qwen2-shaped
model (Qwen2-7B's layer dimensions, 2 layers, a small vocabulary so the float64 reference stays affordable) on a
512-token prompt, and W16=0 vs W16=1 giving the same logits.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from numba import cuda

from minfer_cli.engine.forward import PrefillEngine
from minfer_cli.engine.options import PrefillOptions
from minfer_cli.engine.presets import DEFAULT_PRESET, preset
from minfer_cli.engine.reference import Reference
from minfer_cli.engine.weights import synth_weights
from tests.engine_standins import use_standins
from minfer_cli.experiment import rel_l2

SMALL_TILES = PrefillOptions(
    w16=True,
    gemm={"MMA": "mma_sync", "TM": 64, "TN": 64, "KS": 32, "STAGES": 2, "STAGING": "cp_async", "GROUP": 1, "LOOP": "v1"},
    attention={"BK": 32},
    pgraph=False,  # the simulator captures no CUDA graphs
    fuse_glu=False,  # the unfused prefill; the fusions are the cases that turn them on
    rope_angles=False,
    fuse_rope_kv=False,
)
GLU_TILES = {"fuse_glu": True, "gemm": None}
RESID = {"fuse_resid": True, "gemm": None}
"""PFUSE_RESID=1 with the GEMM knobs' defaults (STAGING=tma, whose kernels have the residual epilogue)."""
"""PFUSE_GLU=1 with the GEMM knobs' defaults, whose staged TMA epilogue takes the SwiGLU (`uses_glu`): SMALL_TILES'
64-wide tiles do not, and the engine would run the product and swiglu apart."""


@pytest.mark.parametrize("fusion", [{}, {"fuse_add_norm": True}, {"fuse_rope_kv": True}, {"head": "gemv"},
                                    {"norm_wide": True, "fuse_add_norm": True}, GLU_TILES,
                                    {"rope_angles": True}, {"rope_angles": True, "fuse_rope_kv": True}, RESID],
                         ids=["unfused", "FUSE_ADD_NORM=1", "PFUSE_ROPE_KV=1", "PHEAD=gemv", "PNORM_WIDE=1",
                              "PFUSE_GLU=1", "PROPE_ANGLES=1", "PROPE_ANGLES=1,PFUSE_ROPE_KV=1", "PFUSE_RESID=1"])
def test_tiny_prefill_wiring_matches_the_float64_reference(monkeypatch, fusion):
    """The engine's plumbing (embedding, norms, fused q|k|v + bias, RoPE on views, KV-cache append, SwiGLU on the
    fused gate|up, residuals, last-token logits) through the simulator. The tensor-core GEMM, flash attention and
    the weight dequantization are replaced by stand-ins (`tests/engine_standins.py`) here only because the simulator
    needs minutes for them at these shapes; each is tested alone in the simulator, and the whole engine with every
    real kernel runs in the `gpu` tests. FUSE_ADD_NORM=1: the residual adds run in `add_rms_norm` (the GEMM stand-in
    hands it two k slices); PFUSE_ROPE_KV=1: RoPE writes q16 and the cache rows; PHEAD=gemv: the logits from the
    quantized output weight's mat-vec (no f16 copy of it); PNORM_WIDE=1: the norms (plain and fused) of this short
    prompt with `kernels.norm.row_tpb` threads a row; PFUSE_GLU=1: the activation straight from the gate/up product
    (no f32 product buffer); PROPE_ANGLES=1: the (cos, sin) of the prompt's positions computed once, read by every
    layer's RoPE (alone, or writing q16 and the cache rows); PFUSE_RESID=1: the GEMMs add attn_output's and
    ffn_down's products to the residual stream themselves."""
    use_standins(monkeypatch)
    _tiny_prefill_matches_the_reference(dataclasses.replace(SMALL_TILES, **fusion))


@pytest.mark.gpu
def test_tiny_prefill_with_every_real_kernel_matches_the_float64_reference():
    _tiny_prefill_matches_the_reference()


def _tiny_prefill_matches_the_reference(options: PrefillOptions = SMALL_TILES):
    """Logits within 1e-2 of the float64 forward, and the same greedy token. The prompt is redrawn while the
    reference's two best logits are within 0.05 std(logits) of each other: the f16 weights and activations move
    the logits by up to 0.008 std (max |got - ref|, 3000 emulated draws; typically 0.0035), so a closer pair may
    be decided either way (the argmax differed in ~1e-3 of draws); ~12% of prompts are redrawn."""
    rng = np.random.default_rng()
    weights = synth_weights(preset("tiny"), int(rng.integers(0, 2**31)))
    reference = Reference(weights)
    for _ in range(100):
        tokens = rng.integers(0, weights.config.vocab, size=5, dtype=np.int32)
        ref = reference.forward(tokens, last_only=True)
        second, best = np.sort(ref)[-2:]
        if best - second > 0.05 * ref.std():
            break
    engine = PrefillEngine(weights, 8, options)
    assert engine.glu == [options.fuse_glu] * len(engine.layers)  # GLU_TILES's case runs the fused product
    engine.logits.copy_to_device(np.full(engine.logits.shape, np.nan, dtype=np.float32))
    got = engine.prefill(cuda.to_device(tokens)).copy_to_host()[0].astype(np.float64)
    assert np.isfinite(got).all()
    assert rel_l2(got, ref) < 1e-2
    assert int(np.argmax(got)) == int(np.argmax(ref))


def test_prompt_longer_than_the_engine_is_refused():
    from minfer_cli.engine.errors import ModelError

    weights = synth_weights(preset("tiny"), 1)
    engine = PrefillEngine(weights, 4, PrefillOptions(w16=False, pgraph=False))  # W16=0: nothing dequantized here
    with pytest.raises(ModelError, match="does not fit"):
        engine.prefill(cuda.to_device(np.zeros(5, dtype=np.int32)))


def test_a_prefill_after_a_filled_cache_matches_the_reference(monkeypatch):
    """`bench -d`'s set-up: `PrefillEngine.fill` writes cache rows 0..4 (in chunks of max_tokens 3: 3 + 2) over
    NaN-poisoned caches, then a 2-token prefill at positions 5..6 reads them: its logits follow the float64 forward
    of all 7 tokens (a row fill left unwritten would leave NaN; one written at the wrong position would move the
    logits). A depth with no room left after it is refused."""
    from minfer_cli.engine.errors import ModelError

    use_standins(monkeypatch)
    rng = np.random.default_rng()
    config = dataclasses.replace(preset("tiny"), name="micro-depth", n_layers=1, ffn=256, vocab=256)
    weights = synth_weights(config, int(rng.integers(0, 2**31)))
    tokens = rng.integers(0, config.vocab, size=7, dtype=np.int32)
    engine = PrefillEngine(weights, 3, PrefillOptions(w16=False, pgraph=False), context=8)
    for layer in engine.layers:
        for cache in (layer.k_cache, layer.v_cache):
            cache.copy_to_device(np.full(cache.shape, np.nan, dtype=np.float16))
    engine.fill(tokens[:5])
    got = engine.prefill(cuda.to_device(tokens[5:]), 5).copy_to_host()[0].astype(np.float64)
    assert np.isfinite(got).all() and rel_l2(got, Reference(weights).forward(tokens, last_only=True)) < 1e-2
    with pytest.raises(ModelError, match="depth of 8 tokens does not fit"):
        engine.fill(np.zeros(8, dtype=np.int32))


def test_prefill_breakdown_marks_every_stage_and_leaves_no_timeline(monkeypatch):
    """`bench --breakdown`'s prefill pass: each stage is one interval a layer (embedding and output once), in order;
    the engine keeps no timeline afterwards (the timed runs carry no events). Stand-ins for the GEMM, attention and
    dequantization (simulator time); the simulator's events carry no µs (the GPU test checks them)."""
    use_standins(monkeypatch)
    config = dataclasses.replace(preset("tiny"), name="micro-breakdown", n_layers=2, ffn=256, vocab=256)
    engine = PrefillEngine(synth_weights(config, 5), 4, PrefillOptions(w16=False, pgraph=False))
    got = engine.breakdown(cuda.to_device(np.arange(2, dtype=np.int32)), 0, 1)
    assert [(s, n) for s, _, n in got] == [
        ("embedding", 1), ("attn_norm", 2), ("qkv", 2), ("rope_kv", 2), ("attention", 2), ("attn_output", 2),
        ("ffn_norm", 2), ("ffn_gate_up", 2), ("ffn_down", 2), ("output", 1)]
    assert engine.timeline is None


@pytest.mark.gpu
def test_run_pp_at_a_depth_names_and_times_each_test():
    from minfer_cli.engine.bench import run_pp

    weights = synth_weights(preset("tiny"), 3)
    rows = run_pp(weights, [16, 32], 2, PrefillOptions(), seed=0, depths=(0, 64), breakdown=True)
    assert [(r.test, r.depth) for r in rows] == [("pp16", 0), ("pp32", 0), ("pp16 @ d64", 64), ("pp32 @ d64", 64)]
    assert all(len(r.samples) == 2 and min(r.samples) > 0 for r in rows)
    for r in rows:  # --breakdown: every stage timed on the GPU (events inside the PGRAPH=1 graph)
        stages = {s: (us, n) for s, us, n in r.breakdown}
        assert min(us for us, _ in stages.values()) > 0 and stages["qkv"][1] == weights.config.n_layers


def _qwen2_shaped(layers: int = 2, vocab: int = 4096):
    return dataclasses.replace(preset(DEFAULT_PRESET), name="qwen2-7b-shaped", n_layers=layers, vocab=vocab)


@pytest.mark.gpu
@pytest.mark.parametrize("nt,options", [(512, {}), (100, {"gemm": {"SPLITK": 0}}), (100, {"head": "gemv"})],
                         ids=["pp512", "pp100-SPLITK=0", "pp100-PHEAD=gemv"])
def test_qwen2_shaped_prefill_matches_the_float64_reference(nt, options):
    rng = np.random.default_rng()
    weights = synth_weights(_qwen2_shaped(), int(rng.integers(0, 2**31)))
    tokens = rng.integers(0, weights.config.vocab, size=nt, dtype=np.int32)
    engine = PrefillEngine(weights, 512, PrefillOptions(**options))
    got = engine.prefill(cuda.to_device(tokens)).copy_to_host()[0].astype(np.float64)
    ref = Reference(weights).forward(tokens, last_only=True)
    assert rel_l2(got, ref) < 2e-2
    assert int(np.argmax(got)) == int(np.argmax(ref))


@pytest.mark.gpu
@pytest.mark.parametrize("gemm", [None, {"SPLITK": 0}], ids=["default", "SPLITK=0"])
def test_a_replayed_prefill_graph_equals_the_eager_prefill_bit_for_bit(gemm):
    """PGRAPH=1: the first prefill of a (length, start) captures, later ones replay; every replay of fresh token ids
    equals the eager forward's logits exactly, at several lengths and start positions, and the KV cache rows. With
    SPLITK=0 (auto) the short prompts' products are split-K (7 and 65 tokens of 7B-wide layers), so this is also
    split-K's determinism: partials summed in slice order whichever block finished last."""
    rng = np.random.default_rng()
    weights = synth_weights(_qwen2_shaped(), int(rng.integers(0, 2**31)))
    graph = PrefillEngine(weights, 300, PrefillOptions(pgraph=True, gemm=gemm), context=400)
    eager = PrefillEngine(weights, 300, PrefillOptions(pgraph=False, gemm=gemm), context=400)
    if gemm:
        assert graph.partials is not None
    for nt, start in ((300, 0), (7, 0), (300, 0), (65, 100), (7, 0), (65, 100)):
        ids = cuda.to_device(rng.integers(0, weights.config.vocab, size=nt, dtype=np.int32))
        poisoned = np.full((1, weights.config.vocab), np.nan, np.float32)
        graph.logits.copy_to_device(poisoned)
        got = graph.prefill(ids, start=start).copy_to_host()
        want = eager.prefill(ids, start=start).copy_to_host()
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(graph.layers[-1].k_cache.copy_to_host()[start:start + nt],
                                      eager.layers[-1].k_cache.copy_to_host()[start:start + nt])
    assert set(graph.capture_seconds) == {(300, 0), (7, 0), (65, 100)}
    assert all(0 < s < 60 for s in graph.capture_seconds.values())
    graph.close()


@pytest.mark.gpu
@pytest.mark.parametrize("fusion", [{"fuse_add_norm": True}, {"fuse_rope_kv": True}, {"fuse_glu": True},
                                    {"rope_angles": True}, {"fuse_resid": True}],
                         ids=["FUSE_ADD_NORM=1", "PFUSE_ROPE_KV=1", "PFUSE_GLU=1", "PROPE_ANGLES=1", "PFUSE_RESID=1"])
def test_prefill_fusions_give_the_unfused_logits_bit_for_bit(fusion):
    """FUSE_ADD_NORM=1 sums the split-K slices and adds them to the residual in the RMSNorm kernel: the same
    additions in the same order as the slice sum, residual add and RMSNorm kernels (both at `kernels.norm.DEFAULT_TPB`
    threads a row, PNORM_WIDE=0: with PNORM_WIDE=1 the fused kernel runs `row_tpb` threads at every length, the
    plain norm only below `kernels.norm.WIDE_ROWS` rows, and the sums of squares are added in another order);
    PFUSE_ROPE_KV=1 stores the same
    f16 roundings of the same rotations as RoPE + KV append; PFUSE_GLU=1 the same f16 roundings of the same SwiGLU
    of the same products (`kernels.gemm_f16.gemm_f16_glu`) with NOCALL=0 (NOCALL=1, the default, divides with
    div.approx: one f16 ulp apart, and the float64-reference tests cover it); PFUSE_RESID=1 the same f32 additions
    in the GEMM's epilogue and slice sums. So the same logits, at a split (7, 65 tokens) and an unsplit (300) prompt
    length."""
    rng = np.random.default_rng()
    weights = synth_weights(_qwen2_shaped(), int(rng.integers(0, 2**31)))
    unfused = PrefillOptions(fuse_glu=False, rope_angles=False, fuse_rope_kv=False, fuse_resid=False,
                             gemm={"NOCALL": 0} if "fuse_glu" in fusion else None,
                             norm_wide="fuse_add_norm" not in fusion)
    fused = PrefillEngine(weights, 300, dataclasses.replace(unfused, **fusion), context=400)
    plain = PrefillEngine(weights, 300, unfused, context=400)
    assert fused.glu == [bool(fusion.get("fuse_glu"))] * len(fused.layers) and not any(plain.glu)
    assert fused.resid == bool(fusion.get("fuse_resid")) and not plain.resid
    for nt in (7, 65, 300):
        ids = cuda.to_device(rng.integers(0, weights.config.vocab, size=nt, dtype=np.int32))
        np.testing.assert_array_equal(fused.prefill(ids).copy_to_host(), plain.prefill(ids).copy_to_host())
    fused.close()
    plain.close()


@pytest.mark.parametrize("w16", [True, False], ids=["W16=1", "W16=0"])
def test_pfused_multiplies_all_q4_k_matrices_from_their_bytes(monkeypatch, w16):
    """PFUSED=1: exactly the matrices whose stacked tensors are all Q4_K go to `kernels.gemm_fused_regs` (no f16 copy,
    no scratch for them), the rest as W16 says, and the logits equal PFUSED=0's (the stand-ins dequantize both ways
    with gguf: the routing is what is tested here; the fused kernel's numbers are tests/test_gemm_fused_regs.py's and
    the GPU test's). FUSE_ADD_NORM=1 covers the split form."""
    use_standins(monkeypatch)
    rng = np.random.default_rng()
    weights = synth_weights(preset("tiny"), int(rng.integers(0, 2**31)))
    base = dataclasses.replace(SMALL_TILES, w16=w16, fuse_add_norm=True)
    fused = PrefillEngine(weights, 6, dataclasses.replace(base, fused=True))
    plain = PrefillEngine(weights, 6, base)
    matrices = [m for layer in fused.layers for m in (layer.qkv, layer.attn_output, layer.gate_up, layer.down)]
    all_q4k = [all(weights.spec(n).qtype == "Q4_K" for n in m.parts) for m in matrices]
    assert any(all_q4k) and not all(all_q4k)  # the tiny preset has both kinds (a Q6_K attn_v or ffn_down)
    for m, q4k in zip(matrices, all_q4k):
        assert (m.fused == "Q4_K") == q4k and (m.f16 is not None) == (w16 and not q4k), m.parts
    assert fused.output.fused is None  # the tied/own output weight is Q6_K
    ids = cuda.to_device(rng.integers(0, weights.config.vocab, size=5, dtype=np.int32))
    np.testing.assert_array_equal(fused.prefill(ids).copy_to_host(), plain.prefill(ids).copy_to_host())


@pytest.mark.parametrize("tn", [256, 128], ids=["PFUSED_TN=256", "PFUSED_TN=128"])
@pytest.mark.parametrize("add_norm", [True, False], ids=["FUSE_ADD_NORM=1", "FUSE_ADD_NORM=0"])
def test_pfused_runs_the_register_kernel_at_its_tile(monkeypatch, tn, add_norm):
    """PFUSED multiplies the all-Q4_K matrices with `kernels.gemm_fused_regs` (the whole product, and the split form
    FUSE_ADD_NORM takes for the products its norm adds) at PFUSED_TN tokens a tile, whatever the f16 GEMM's TN;
    the logits equal PFUSED=0's. (The SwiGLU form: test_pfuse_glu_runs_where_its_epilogue_can.)"""
    import kernels.gemm_fused_regs

    use_standins(monkeypatch)
    names = ("gemm_fused_regs", "gemm_fused_regs_split", "gemm_fused_regs_glu")
    calls, tiles = [], []
    for name in names:
        standin = getattr(kernels.gemm_fused_regs, name)
        monkeypatch.setattr(kernels.gemm_fused_regs, name, lambda *args, standin=standin, name=name, **kwargs:
                            calls.append(name) or tiles.append(kwargs["config"].get("TN")) or standin(*args, **kwargs))
    rng = np.random.default_rng()
    weights = synth_weights(preset("tiny"), int(rng.integers(0, 2**31)))
    base = dataclasses.replace(SMALL_TILES, fuse_add_norm=add_norm)
    fused = PrefillEngine(weights, 6, dataclasses.replace(base, fused=True, fused_tn=tn))
    plain = PrefillEngine(weights, 6, base)
    ids = cuda.to_device(rng.integers(0, weights.config.vocab, size=5, dtype=np.int32))
    np.testing.assert_array_equal(fused.prefill(ids).copy_to_host(), plain.prefill(ids).copy_to_host())
    assert set(calls) == {names[0]} | ({names[1]} if add_norm else set())  # SMALL_TILES: PFUSE_GLU=0
    assert set(tiles) == {tn} and SMALL_TILES.gemm.get("TN") != 256


def test_pfuse_resid_runs_where_its_epilogue_can():
    """PFUSE_RESID=1 (the default) adds in the GEMM where the GEMM knobs have the residual epilogue (STAGING=tma, either EPI) and
    FUSE_ADD_NORM does not do the adds; else the engine runs residual_add (and `bench` says so: test_cli)."""
    from minfer_cli.engine.forward import uses_resid

    on = PrefillOptions(fuse_resid=True)
    assert uses_resid(on) and uses_resid(dataclasses.replace(on, gemm={"EPI": "direct"}))
    assert not uses_resid(PrefillOptions(fuse_resid=False))
    assert not uses_resid(dataclasses.replace(on, fuse_add_norm=True))
    assert not uses_resid(dataclasses.replace(on, gemm=SMALL_TILES.gemm))


def test_pfuse_glu_runs_where_its_epilogue_can(monkeypatch):
    """PFUSE_GLU=1 (the default) takes the SwiGLU into the gate/up GEMM where `kernels.gemm_f16.glu_refusal` finds
    nothing against it; elsewhere the product and swiglu run apart (the same bits): a ffn that is not a multiple of
    TM / 2, GEMM tiles without the staged TMA epilogue. Under PFUSED a gate|up multiplied from its quantized bytes
    takes the register kernel's SwiGLU epilogue (`uses_fused_glu`: a ffn that is a multiple of 64) whatever the f16
    GEMM's tiles, and only with PFUSE_GLU."""
    import kernels.gemm_fused_regs
    from minfer_cli.engine.config import ModelConfig
    from minfer_cli.engine.forward import uses_fused_glu, uses_glu

    tiny = preset("tiny")
    odd = ModelConfig(**{**tiny.as_dict(), "ffn": 544})
    on = PrefillOptions(pgraph=False)
    assert on.fuse_glu and uses_glu(tiny, on) and not uses_glu(odd, on)
    assert not uses_glu(tiny, SMALL_TILES) and not uses_glu(tiny, dataclasses.replace(SMALL_TILES, fuse_glu=True))
    assert not uses_glu(tiny, dataclasses.replace(on, fuse_glu=False))
    use_standins(monkeypatch)
    assert PrefillEngine(synth_weights(tiny, 1), 4, on).gu is None
    regs = dataclasses.replace(on, fused=True, w16=False)  # gemm_fused_regs_glu: ffn % 64 == 0
    assert uses_fused_glu(tiny, regs) and not uses_fused_glu(odd, regs)
    assert not uses_fused_glu(tiny, dataclasses.replace(regs, fuse_glu=False))
    assert not uses_fused_glu(tiny, dataclasses.replace(regs, fused=False))
    engine = PrefillEngine(synth_weights(tiny, 1), 4, regs)
    assert all(engine.glu) and engine.gu is None
    calls = []
    standin = kernels.gemm_fused_regs.gemm_fused_regs_glu
    monkeypatch.setattr(kernels.gemm_fused_regs, "gemm_fused_regs_glu",
                        lambda *args, **kwargs: calls.append(1) or standin(*args, **kwargs))
    ids = cuda.to_device(np.arange(4, dtype=np.int32))
    plain = PrefillEngine(synth_weights(tiny, 1), 4, dataclasses.replace(on, w16=False))
    np.testing.assert_array_equal(engine.prefill(ids).copy_to_host(), plain.prefill(ids).copy_to_host())
    assert len(calls) == tiny.n_layers


def test_pfused_knob_conflicts_are_named_before_loading():
    from minfer_cli.engine.bench import REMOVED_KNOBS, engine_conflict, engine_knobs, engine_options, idle_fusions
    from minfer_cli.errors import UsageError
    from minfer_cli.knobs import resolve_config

    knobs = engine_knobs()
    assert engine_options(resolve_config(knobs, {"PFUSED": "1"}, "e")).prefill.fused is True
    assert engine_conflict(resolve_config(knobs, {"PFUSED": "1"}, "e")) is None
    assert engine_conflict(resolve_config(knobs, {"PFUSED": "1", "PFUSE_GLU": "1"}, "e")) is None
    # the register kernel's own tile: the f16 GEMM's STAGING does not apply to it, its knob values do
    assert engine_conflict(resolve_config(knobs, {"PFUSED": "1", "STAGING": "cp_async", "AUTOTILE": "0"}, "e")) is None
    regs = resolve_config(knobs, {"PFUSED": "1"}, "e")
    # the register-A kernel has its own tile (128 weight rows): TM and STAGING do not apply to it
    assert engine_conflict(dict(regs, TM=64)) is None
    # PFUSED_TN: the register kernel's tile (256 by default), not the f16 GEMM's (which refuses TN=256)
    options = engine_options(regs).prefill
    assert options.fused_tn == 256 and options.fused_gemm["TN"] == 256 and options.gemm.get("TN", 128) == 128
    narrow = resolve_config(knobs, {"PFUSED": "1", "PFUSED_TN": "128"}, "e")
    assert engine_conflict(narrow) is None and engine_options(narrow).prefill.fused_gemm["TN"] == 128
    assert engine_options(resolve_config(knobs, {}, "e")).prefill.fused_gemm is None
    assert "TN=256 is the register-A fused kernel's tile only" in engine_conflict(dict(regs, TN=256))
    assert idle_fusions(resolve_config(knobs, {"PFUSED_TN": "128"}, "e")) == {
        "PFUSED_TN": "PFUSED_TN=128 does nothing without PFUSED=1 (it is the fused kernel's tile)"}
    assert idle_fusions(regs) == {} and idle_fusions(narrow) == {}
    with pytest.raises(UsageError, match="knob PFUSED_REGS was removed"):  # with the B-producer kernel (#415, #416)
        resolve_config(knobs, {"PFUSED_REGS": "0"}, "e", REMOVED_KNOBS)


@pytest.mark.gpu
@pytest.mark.parametrize("tn", [256, 128], ids=["PFUSED_TN=256", "PFUSED_TN=128"])
def test_pfused_logits_follow_the_f16_path(tn):
    """PFUSED=1 on the GPU (the real `kernels.gemm_fused_regs` for every all-Q4_K matrix): logits within 1e-2 of
    W16=1's, at a split (65) and an unsplit (300) prompt length."""
    rng = np.random.default_rng()
    weights = synth_weights(_qwen2_shaped(), int(rng.integers(0, 2**31)))
    fused = PrefillEngine(weights, 300, PrefillOptions(fused=True, fused_tn=tn, w16=False), context=400)
    plain = PrefillEngine(weights, 300, PrefillOptions(), context=400)
    for nt in (65, 300):
        ids = cuda.to_device(rng.integers(0, weights.config.vocab, size=nt, dtype=np.int32))
        got, want = fused.prefill(ids).copy_to_host()[0], plain.prefill(ids).copy_to_host()[0]
        assert rel_l2(got.astype(np.float64), want.astype(np.float64)) < 1e-2
    fused.close()
    plain.close()


def test_an_unknown_prefill_head_is_refused_by_name():
    from minfer_cli.engine.errors import ModelError

    with pytest.raises(ModelError, match="prefill head 'gemx': must be 'gemm' or 'gemv'"):
        PrefillEngine(synth_weights(preset("tiny"), 1), 4, PrefillOptions(w16=False, pgraph=False, head="gemx"))


def test_pgraph_is_refused_by_name_under_the_simulator():
    from kernels.ptx import SIMULATOR

    if not SIMULATOR:
        pytest.skip("the refusal is the simulator's")
    from minfer_cli.engine.errors import ModelError

    with pytest.raises(ModelError, match="PGRAPH=1 .* CUDA simulator cannot; use PGRAPH=0"):
        PrefillEngine(None, 4, PrefillOptions(pgraph=True))  # refused before the weights are looked at


@pytest.mark.gpu
def test_w16_off_and_on_give_the_same_logits():
    rng = np.random.default_rng()
    weights = synth_weights(_qwen2_shaped(), int(rng.integers(0, 2**31)))
    ids = cuda.to_device(rng.integers(0, weights.config.vocab, size=300, dtype=np.int32))
    on = PrefillEngine(weights, 300, PrefillOptions(w16=True)).prefill(ids).copy_to_host()
    off = PrefillEngine(weights, 300, PrefillOptions(w16=False)).prefill(ids).copy_to_host()
    np.testing.assert_array_equal(on, off)


@pytest.mark.gpu
def test_tiny_greedy_tokens_match_the_reference_for_8_steps():
    """Greedy decoding by repeated prefill (the decode path does not exist yet): 8 tokens equal the reference's."""
    rng = np.random.default_rng()
    weights = synth_weights(preset("tiny"), int(rng.integers(0, 2**31)))
    prompt = [int(t) for t in rng.integers(0, weights.config.vocab, size=6)]
    engine = PrefillEngine(weights, 16, PrefillOptions())
    seq = list(prompt)
    for _ in range(8):
        logits = engine.prefill(cuda.to_device(np.array(seq, dtype=np.int32))).copy_to_host()[0]
        seq.append(int(np.argmax(logits)))
    assert seq[len(prompt):] == Reference(weights).greedy(prompt, 8)


def _llama3_factors(rng, pairs: int) -> np.ndarray:
    """RoPE frequency divisors in [1, 8] for every pair (Llama 3.1's `rope_freqs` reach 8 on its slow pairs; here
    every pair is scaled, so that a 5-token prompt shows whether they are applied)."""
    return rng.uniform(1.0, 8.0, size=pairs).astype(np.float32)


def test_rope_freqs_reach_the_prefill(monkeypatch):
    """A llama with a `rope_freqs` tensor (Llama 3.1+): the engine's logits follow the float64 reference that divides
    each pair's frequency by its factor, and are far from the reference that ignores them (the test fails if the
    engine ignores the tensor). the stand-ins of the wiring test above."""
    use_standins(monkeypatch)
    rng = np.random.default_rng()
    config = dataclasses.replace(preset("tiny-llama"), name="micro-llama3.1", n_layers=1, ffn=256, vocab=256,
                                 rope_freqs=True)
    weights = synth_weights(config, int(rng.integers(0, 2**31)))
    spec = weights.spec("rope_freqs.weight")
    weights.tensors["rope_freqs.weight"] = (spec, cuda.to_device(_llama3_factors(rng, config.head_dim // 2).view(np.uint8)))
    tokens = rng.integers(0, config.vocab, size=5, dtype=np.int32)
    want = Reference(weights).forward(tokens, last_only=True)
    unscaled = dataclasses.replace(weights, config=dataclasses.replace(config, rope_freqs=False),
                                   tensors={k: v for k, v in weights.tensors.items() if k != "rope_freqs.weight"})
    ignored = Reference(unscaled).forward(tokens, last_only=True)
    engine = PrefillEngine(weights, 8, SMALL_TILES)
    got = engine.prefill(cuda.to_device(tokens)).copy_to_host()[0].astype(np.float64)
    assert rel_l2(got, want) < 1e-2
    assert rel_l2(ignored, want) > 5e-2  # the factors matter at these positions: ignoring them would be seen


def test_a_tied_q4_0_token_embd_reaches_the_prefill(monkeypatch):
    """A llama whose tied token_embd is Q4_0 (as llama.cpp's quantizer leaves a plain Q4_0 file): the embedding
    lookup (through the f32 table) and the tied output both read it; logits within 1e-2 of the float64 reference.
    the stand-ins of the wiring test."""
    from minfer_cli.engine.config import TensorSpec
    from minfer_cli.quant_blocks import random_blocks

    use_standins(monkeypatch)
    rng = np.random.default_rng()
    config = dataclasses.replace(preset("tiny-llama"), name="micro-llama-q4_0", n_layers=1, ffn=256, vocab=256)
    weights = synth_weights(config, int(rng.integers(0, 2**31)))
    spec = TensorSpec("token_embd.weight", (config.hidden, config.vocab), "Q4_0")
    weights.tensors["token_embd.weight"] = (spec, cuda.to_device(random_blocks("Q4_0", config.vocab, config.hidden, rng)))
    tokens = rng.integers(0, config.vocab, size=5, dtype=np.int32)
    want = Reference(weights).forward(tokens, last_only=True)
    engine = PrefillEngine(weights, 8, SMALL_TILES)
    got = engine.prefill(cuda.to_device(tokens)).copy_to_host()[0].astype(np.float64)
    assert np.isfinite(got).all() and rel_l2(got, want) < 1e-2


def test_pfused_memory_plan_copies_only_the_matrices_the_f16_gemm_multiplies():
    """PFUSED's pre-load plan: the all-Q4_K matrices (gemm_fused_regs's) get no f16 copy with W16=1, counted from the
    preset's tensor types independently of `fused_format`; so the 70B fits an H200 with W16=1,PFUSED=1 where W16=1
    alone is refused. `gemm_weight_parts` stacks exactly the tensors of `gemm_weight_shapes`."""
    from minfer_cli.engine.bench import check_fits_model, engine_options, engine_knobs, prefill_need
    from minfer_cli.engine.config import tensor_specs
    from minfer_cli.engine.errors import ModelError
    from minfer_cli.engine.forward import gemm_weight_parts, gemm_weight_shapes

    c = preset("llama3-70b-q4_k_m")
    specs = {s.name: s for s in tensor_specs(c)}
    for names, (od, id_) in zip(gemm_weight_parts(c), gemm_weight_shapes(c), strict=True):
        assert sum(specs[n].od for n in names) == od and {specs[n].id for n in names} == {id_}, names
    fused_elems = sum(od * id_ for names, (od, id_) in zip(gemm_weight_parts(c), gemm_weight_shapes(c))
                      if all(specs[n].qtype == "Q4_K" for n in names))
    assert 0 < fused_elems < sum(od * id_ for od, id_ in gemm_weight_shapes(c))  # a Q4_K_M mix: some of each
    default = {k.name: k.default for k in engine_knobs()}
    pfused = engine_options(dict(default, PFUSED=1)).prefill
    assert prefill_need(c, 512, pfused) - prefill_need(c, 512, pfused, specs=specs) == 2 * fused_elems
    # PFUSED's gate|up keeps the SwiGLU epilogue (ffn a multiple of 64): no f32 gate|up product, as the default
    assert prefill_need(c, 512, pfused) == prefill_need(c, 512, engine_options(default).prefill)
    unfused_glu = engine_options(dict(default, PFUSE_GLU=0)).prefill
    assert prefill_need(c, 512, unfused_glu) - prefill_need(c, 512, engine_options(default).prefill) == 512 * 8 * c.ffn
    weights, free = sum(s.n_bytes for s in specs.values()), 139 * 2**30
    check_fits_model(c, weights, [512, 2048], [128], [0], engine_options(dict(default, PFUSED=1)), free=free,
                     specs=specs)
    with pytest.raises(ModelError, match="try --arm W16=0"):
        check_fits_model(c, weights, [512], [], [0], engine_options(default), free=free, specs=specs)


def test_a_model_that_cannot_fit_is_refused_before_its_weights_are_made():
    """`bench`'s pre-load check: the 70B preset's 39.6 GiB of weights and its f16 copies (W16=1, ~131 GiB) do
    not fit an H200's ~139 GiB: one line naming the test, the sizes and W16=0; W16=0 (one matrix's scratch) fits,
    and the check weighs the largest test, prefill or decode (host arithmetic: ``free`` given)."""
    from minfer_cli.engine.bench import check_fits_model, decode_need, engine_options, engine_knobs, prefill_need
    from minfer_cli.engine.config import tensor_specs
    from minfer_cli.engine.errors import ModelError

    c = preset("llama3-70b-q4_k_m")
    weights = sum(s.n_bytes for s in tensor_specs(c))
    default = {k.name: k.default for k in engine_knobs()}
    free = 139 * 2**30
    with pytest.raises(ModelError) as e:
        check_fits_model(c, weights, [512], [128], [0], engine_options(default), free=free)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("llama3-70b-q4_k_m: -p 512 needs") and "--arm W16=0" in msg
    assert "39.6 GiB of weights" in msg and "139.0 GiB are free" in msg
    light = engine_options(dict(default, W16=0))
    check_fits_model(c, weights, [512, 2048], [128], [0], light, free=free)
    assert prefill_need(c, 2048, light.prefill) < 8 * 2**30 and decode_need(c, 128) < 2**30
    with pytest.raises(ModelError, match=r"are free$"):  # weights alone over the free memory: W16=0 would not help
        check_fits_model(c, weights, [512], [], [0], engine_options(default), free=weights // 2)
    with pytest.raises(ValueError, match="needs a prompt"):
        check_fits_model(c, weights, [], [], [0], light, free=free)
    with pytest.raises(ModelError, match=r"-n 2048 after a depth of 4096 needs .* are free$"):  # no W16 hint
        check_fits_model(c, weights, [], [2048], [4096], light, free=weights + decode_need(c, 2048, 4096) - 1)
