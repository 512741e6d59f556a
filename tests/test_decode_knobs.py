"""Decode knobs: every engine knob reaches `DecodeOptions` (defaults, legacy values, deleted knobs named, conflicts
refused before loading, tg-only knobs refused on pp workloads) in the simulator session. GPU: PDL launches the layer
chain with programmatic serialization, ATTN_SPLITS moves the logits by rounding only, and every fusion knob gives
bit-identical logits and tokens over 8 graph-replayed steps."""

from __future__ import annotations

import numpy as np
import pytest

from minfer_cli.engine.options import DecodeOptions
from minfer_cli.engine.presets import preset


def test_decode_knobs_reach_the_engine_options_and_only_tg_workloads():
    from minfer_cli.engine.bench import DECODE_KNOBS, engine_conflict, engine_knobs, engine_options
    from minfer_cli.knobs import resolve_config

    knobs = {k.name: k for k in engine_knobs()}
    assert knobs["GRAPHS"].values == (0, 1) and knobs["GRAPHS"].default == 1
    assert knobs["MMVQ"].values == (0, 1) and knobs["MMVQ"].default == 1
    assert engine_options(resolve_config(engine_knobs(), {"FUSE_ADD": "0"}, "e")).decode.fuse_add is False
    assert engine_options(resolve_config(engine_knobs(), {"FUSE_GLU": "0"}, "e")).decode.fuse_glu is False
    assert "FUSE_NORM_Q8" not in knobs  # deleted after its A/B (ledger #280)
    assert engine_options(resolve_config(engine_knobs(), {"FUSE_QKV": "0"}, "e")).decode.fuse_qkv is False
    assert knobs["FUSE_QKV"].default == 1 and engine_options(resolve_config(engine_knobs(), {}, "e")).decode.fuse_qkv
    assert engine_options(resolve_config(engine_knobs(), {"DEEP": "0"}, "e")).decode.deep is False
    assert engine_options(resolve_config(engine_knobs(), {"PDL": "0"}, "e")).decode.pdl is False
    assert engine_options(resolve_config(engine_knobs(), {"FUSE_ROPE_KV": "1"}, "e")).decode.fuse_rope_kv is True
    assert knobs["FUSE_ROPE_KV"].default == 0 and "FUSE_ROPE_KV" in DECODE_KNOBS
    assert engine_options(resolve_config(engine_knobs(), {"FUSE_ATTN_Q8": "0"}, "e")).decode.fuse_attn_q8 is False
    assert knobs["FUSE_ATTN_Q8"].default == 1 and "FUSE_ATTN_Q8" in DECODE_KNOBS
    assert not engine_options(resolve_config(engine_knobs(), {"FUSE_NORM_SPLIT": "0"}, "e")).decode.fuse_norm_split
    assert knobs["FUSE_NORM_SPLIT"].default == 1 and "FUSE_NORM_SPLIT" in DECODE_KNOBS
    assert not engine_options(resolve_config(engine_knobs(), {"FUSE_QKV_MIXED": "0"}, "e")).decode.fuse_qkv_mixed
    assert not engine_options(resolve_config(engine_knobs(), {"FEW_ROWS": "0"}, "e")).decode.few_rows
    assert engine_options(resolve_config(engine_knobs(), {"ROPE_ANGLES": "1"}, "e")).decode.rope_angles is True
    assert knobs["ROPE_ANGLES"].default == 1 and knobs["ROPE_ANGLES"].legacy == 0 and "ROPE_ANGLES" in DECODE_KNOBS
    assert engine_options(resolve_config(engine_knobs(), {"ROPE_ANGLES": "0"}, "e")).decode.rope_angles is False
    assert "DOWN_F32" not in knobs  # ffn_down on the f32 SwiGLU output, no quantization kernel: deleted (#393, #394)
    assert "FUSE_ATTN_ROPE" not in knobs  # decode attention doing RoPE and the KV append: deleted (#386, #387)
    assert knobs["FEW_ROWS"].default == 1 and "FEW_ROWS" in DECODE_KNOBS
    assert "FOLD" not in knobs  # every Q6_K mat-vec folded: neutral (ledger #353, #354), deleted
    assert knobs["FUSE_QKV_MIXED"].default == 1 and "FUSE_QKV_MIXED" in DECODE_KNOBS
    assert "FUSE_GLU_Q8" not in knobs  # deleted after its A/Bs (ledger #287, #297)
    assert "ATTN_MINB" not in knobs  # deleted after its sweep (ledger #170)
    assert "DEEP_STAGE" not in knobs  # deleted after its A/B (ledger #349)
    assert "ATTN_ONE" not in knobs  # one decode-attention kernel, its last block combining: deleted (#357, #358)
    assert "FUSE_NORM_GEMV" not in knobs  # each RMSNorm inside the mat-vecs it feeds: deleted (#365-#368)
    assert "GRID" not in knobs  # grid-stride mat-vecs, the next row group prefetched: deleted (#369, #370)
    assert engine_options(resolve_config(engine_knobs(), {"AHEAD": "4"}, "e")).decode.ahead == 4
    assert knobs["AHEAD"].default == 1 and "AHEAD" in DECODE_KNOBS
    assert engine_conflict({**{k: v.default for k, v in knobs.items()}, "AHEAD": 2, "PDL": 0}).startswith(
        "AHEAD=2 is the prefetch before PDL's wait")
    default = engine_options(resolve_config(engine_knobs(), {}, "e")).decode
    assert default.graphs is True and default.mmvq is True and default.fuse_add is True and default.fuse_glu is True
    assert default.xres is True and knobs["XRES"].default == 1 and knobs["XRES"].legacy == 0
    assert engine_options(resolve_config(engine_knobs(), {"XRES": "0"}, "e")).decode.xres is False
    assert default.deep is True and default.pdl is True and engine_conflict(resolve_config(engine_knobs(), {"MMVQ": "0"}, "e")) is None
    assert "SPLITK=2 needs MMA=wgmma" in engine_conflict(
        resolve_config(engine_knobs(), {"SPLITK": "2", "MMA": "mma_sync"}, "e"))  # the GEMM's rules, before loading
    ms = resolve_config(engine_knobs(), {"FA_MMA": "mma_sync"}, "e")
    assert engine_conflict(ms) is None and engine_options(ms).prefill.attention["MMA"] == "mma_sync"
    assert knobs["FA_MMA"].default == "wgmma" and knobs["FA_MMA"].legacy == "mma_sync"
    assert knobs["NOCALL"].default == 1 and knobs["NOCALL"].legacy == 0
    assert engine_options(resolve_config(engine_knobs(), {"GRAPHS": "0"}, "e")).decode.graphs is False
    assert engine_options(resolve_config(engine_knobs(), {"MMVQ": "0"}, "e")).decode.mmvq is False
    from kernels.attention_decode import DEFAULT_SPLITS, SPLITS_VALUES

    assert set(knobs["ATTN_SPLITS"].values) <= set(SPLITS_VALUES) and knobs["ATTN_SPLITS"].default == DEFAULT_SPLITS
    assert default.attn_splits == DEFAULT_SPLITS == DecodeOptions().attn_splits and knobs["ATTN_SPLITS"].legacy == 32
    assert engine_options(resolve_config(engine_knobs(), {"ATTN_SPLITS": "32"}, "e")).decode.attn_splits == 32

    from minfer_cli import experiment as registry

    registry.load_all()
    bench = registry.get("bench")
    with pytest.raises(ValueError, match="GRAPHS acts on tg workloads only and tiny_pp16 is a pp workload"):
        bench.prepare(bench.config("GRAPHS=0"), bench.workload("tiny_pp16"))
    with pytest.raises(ValueError, match="W16 acts on pp workloads only and tiny_tg8 is a tg workload"):
        bench.prepare(bench.config("W16=0"), bench.workload("tiny_tg8"))
    assert bench.tolerance(bench.default_config(), bench.workload("tg128")) == 1e-2
    assert bench.tolerance(bench.config("XRES=0"), bench.workload("tg128")) == 5e-2
    assert bench.tolerance(bench.config("XRES=0,MMVQ=0"), bench.workload("tg128")) == 1e-2
    assert bench.tolerance(bench.default_config(), bench.workload("pp2048")) == 2e-2


# ---- GPU -------------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_pdl_step_launches_the_layer_chain_with_programmatic_serialization(monkeypatch):
    """PDL=1: after a first eager step (numba compiles there, with ordinary launches), a second step launches every
    kernel of the per-layer chain through cuda.core with ``programmatic_stream_serialization`` (at least the 14
    kernels a layer has besides q/k/v) and never falls back to an ordinary launch for want of a compiled kernel;
    the step's logits equal those of PDL=0 bit for bit."""
    import cuda.core

    from kernels import launch as launch_module
    from minfer_cli.engine.decode import DecodeEngine
    from minfer_cli.engine.weights import synth_weights

    rng = np.random.default_rng()
    weights = synth_weights(preset("tiny"), int(rng.integers(0, 2**31)))
    first = int(rng.integers(0, weights.config.vocab))
    logits = []
    for pdl in (False, True):
        engine = DecodeEngine(weights, 16, DecodeOptions(graphs=False, pdl=pdl), rows_per_block=4, warps_per_row=2)
        engine.start(first, 0)
        engine.step()
        engine.start(first, 0)
        if pdl:
            configs, missing = [], []
            real_launch, real_compiled = cuda.core.launch, launch_module._compiled

            def counting(stream, config, kernel, *args):
                configs.append(config)
                return real_launch(stream, config, kernel, *args)

            def compiled(dispatcher, args):
                kernel = real_compiled(dispatcher, args)
                missing.extend([dispatcher] if kernel is None else [])
                return kernel

            monkeypatch.setattr(cuda.core, "launch", counting)
            monkeypatch.setattr(launch_module, "_compiled", compiled)
        engine.step()
        logits.append(engine.logits.copy_to_host(stream=engine.stream))
        engine.stream.synchronize()
        engine.close()
    assert not missing, f"{len(missing)} PDL launches fell back to an ordinary launch"
    assert len(configs) >= 14 * weights.config.n_layers
    assert all(c.programmatic_stream_serialization for c in configs)
    np.testing.assert_array_equal(logits[0], logits[1])


@pytest.mark.gpu
@pytest.mark.parametrize("splits", [32, 1, 64])
def test_attention_split_knobs_move_the_logits_by_rounding_only(splits):
    """ATTN_SPLITS only regroups decode attention's partial sums: 48 teacher-forced
    eager steps (cache lengths 1..48, so some partitions idle and some not; splits=1 walks up to 12 rows a warp) give
    logits within 1e-4 of the default's at every step. MMVQ=0 (f32 mat-vec inputs): a Q8_1 quantization of the attention output would turn a last-bit difference
    into a whole rounding step of the int8 grid."""
    from minfer_cli.engine.decode import DecodeEngine
    from minfer_cli.engine.weights import synth_weights

    rng = np.random.default_rng()
    weights = synth_weights(preset("tiny"), int(rng.integers(0, 2**31)))
    tokens = rng.integers(0, weights.config.vocab, size=48)
    runs = []
    for options in (DecodeOptions(graphs=False, mmvq=False),
                    DecodeOptions(graphs=False, mmvq=False, attn_splits=splits)):
        engine = DecodeEngine(weights, 48, options)
        steps = []
        for i, token in enumerate(tokens):
            engine.start(int(token), i)
            steps.append(engine.step().copy_to_host(stream=engine.stream))
        engine.stream.synchronize()
        engine.close()
        runs.append(np.array(steps, dtype=np.float64))
    err = np.linalg.norm(runs[1] - runs[0], axis=1) / np.linalg.norm(runs[0], axis=1)
    assert np.isfinite(runs[1]).all() and err.max() < 1e-4, err.max()


@pytest.mark.gpu
@pytest.mark.parametrize("knob", [{"fuse_add": False}, {"fuse_glu": False}, {"fuse_qkv": False},
                                  {"fuse_qkv": False, "fuse_add": False}, {"pdl": False},
                                  {"fuse_rope_kv": True}, {"fuse_attn_q8": False}, {"fuse_attn_q8": False, "xres": False},
                                  {"ahead": 4}, {"fuse_norm_split": False}, {"fuse_norm_split": False, "xres": False},
                                  {"fuse_qkv_mixed": False}, {"rope_angles": False},
                                  {"rope_angles": False, "fuse_rope_kv": True}],
                         ids=["FUSE_ADD=0", "FUSE_GLU=0", "FUSE_QKV=0", "FUSE_QKV=0,FUSE_ADD=0",
                              "PDL=0", "FUSE_ROPE_KV=1", "FUSE_ATTN_Q8=0", "FUSE_ATTN_Q8=0,XRES=0", "AHEAD=4",
                              "FUSE_NORM_SPLIT=0", "FUSE_NORM_SPLIT=0,XRES=0", "FUSE_QKV_MIXED=0", "ROPE_ANGLES=0",
                              "ROPE_ANGLES=0,FUSE_ROPE_KV=1"])
def test_fusion_knobs_give_bit_identical_logits(knob):
    """FUSE_ADD=0 (bias and residual adds as separate kernels), FUSE_GLU=0 (gate, up and SwiGLU as three kernels),
    FUSE_ROPE_KV=1 (RoPE writes the cache rows), FUSE_ATTN_Q8=0 (a separate kernel writes the attention output's
    Q8_1 blocks, compensated or plain, where the default's combine does) and FUSE_NORM_SPLIT=0 (a separate kernel
    quantizes each RMSNorm's output, compensated or plain, where the default's norm launch does), FUSE_QKV_MIXED=0
    (q|k and v in two launches, where the default's one gives each its own CUDA blocks running the same code)
    compute the same
    float32 operations in the same order as the default path, PDL=0 (the default is 1) only when a kernel
    may start (each waits for the kernel before it), and
    FUSE_QKV=0 only unstacks the default's one launch over q/k rows of one format (one launch shape for every mat-vec, so the
    sums split alike), AHEAD=4 only prefetches more weight lines into L2 before each mat-vec's wait, ROPE_ANGLES=0
    computes each layer's (cos, sin) in float64 where the default reads the step's table of the same values: logits and
    tokens bit-identical over 8 graph-replayed steps."""
    from minfer_cli.engine.decode import DecodeEngine
    from minfer_cli.engine.weights import synth_weights

    rng = np.random.default_rng()
    weights = synth_weights(preset("tiny"), int(rng.integers(0, 2**31)))
    first = int(rng.integers(0, weights.config.vocab))
    runs = []
    for options in (DecodeOptions(xres=knob.get("xres", True)), DecodeOptions(**knob)):  # XRES=0: both arms
        engine = DecodeEngine(weights, 16, options, rows_per_block=4, warps_per_row=2)
        engine.start(first, 0)
        runs.append((engine.generate(8), engine.logits.copy_to_host(stream=engine.stream)))
        engine.stream.synchronize()
        engine.close()
    assert runs[0][0] == runs[1][0]
    np.testing.assert_array_equal(runs[0][1], runs[1][1])
