"""`minfer bench`: llama-bench's pp and tg tests on minfer's engine — the whole-model numbers a kernel change is
judged by.

pp<n>: one prefill of n prompt tokens into an empty KV cache, wall-clock timed from the first launch to the
stream's completion (llama-bench's definition: tokens / seconds, mean ± sample stddev over repetitions). Weight
generation or loading, f16 weight copies (W16=1), JIT compilation and (PGRAPH=1) the capture of the length's
CUDA graph happen before timing: a warm-up prefill of the same length runs first; the capture's wall time is
reported beside the figures.

tg<n>: n tokens generated one at a time into an empty KV cache (llama-bench's test_gen: no prompt; the first
token random, at position 0), tok/s = n / wall seconds from the first step's launch to the n-th token being back
on the host. Each step is `DecodeEngine`'s (GEMVs on the GGUF blocks, flash-decoding, greedy argmax on the
device; GRAPHS=1 replays one captured CUDA graph per step). llama-bench feeds random tokens and samples nothing;
here each step feeds the previous step's greedy token (the same work plus one argmax over the logits). Engine
construction, JIT compilation and graph capture happen before timing: a warm-up generation of the same length
runs first.
"""

from __future__ import annotations

import dataclasses
import re
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional

import numpy as np

from kernels.attention_config import REMOVED as _FA_REMOVED  # numba-free knob table
from minfer_cli.engine.config import ModelConfig, TensorSpec
from minfer_cli.engine.forward import PrefillEngine, device_bytes, kv_cache_bytes, uses_fused_glu, uses_glu
from minfer_cli.engine.options import DecodeOptions, EngineOptions, PrefillOptions
from minfer_cli.engine.weights import ModelWeights
from minfer_cli.engine.errors import ModelError
from minfer_cli.knobs import Config, Knob

Progress = Optional[Callable[[str, float], None]]

FA_PREFIX = "FA_"


DECODE_KNOBS = ("GRAPHS", "MMVQ", "XRES", "FUSE_ADD", "FUSE_GLU", "FUSE_QKV", "FUSE_ROPE_KV", "ROPE_ANGLES",
                "AHEAD", "FUSE_ATTN_Q8", "FUSE_NORM_SPLIT", "FUSE_QKV_MIXED", "DEEP", "FEW_ROWS", "WIDE_RING", "PDL",
                "ATTN_SPLITS")
"""Engine knobs that act on tg (decode) only; every other engine knob acts on pp (prefill) only."""


REMOVED_KNOBS = {"PREFETCH": 0, "STAGE": 0, "HOIST": 0, "VLOAD": 0, "ATTN_MINK": 1, "ATTN_KEYS": 4, "ATTN_MINB": 0,
                 "FUSE_NORM_Q8": 0, "FUSE_GLU_Q8": 0, "FUSE_NORM_GEMV": 0, "GRID": 0, "FUSE_ATTN_ROPE": 0,
                 "DOWN_F32": 0, "SCHED": "grid", "PFUSED_REGS": 0,
                 **{FA_PREFIX + k: v for k, v in _FA_REMOVED.items()}}
"""Engine knobs deleted with the variants they switched on (each lost its A/B, or for ATTN_MINB its sweep: ledger #170;
FUSE_NORM_Q8, #280; FUSE_GLU_Q8, #287 and #297; FUSE_NORM_GEMV, #365-#368; GRID, #369; FUSE_ATTN_ROPE, #386 and #387;
DOWN_F32, #393 and #394; PFUSED_REGS, #415 and #416); each value here is what the engine still runs (ATTN_MINK=1: every
warp of decode attention's grid takes a partition while L allows; ATTN_KEYS=4: the half-warp-per-row decode attention,
the one kept; ATTN_MINB=0: no register cap on it; FUSE_NORM_Q8=0: no one-block RMSNorm that quantizes; FUSE_GLU_Q8=0:
the SwiGLU output quantized by its own kernel; FUSE_NORM_GEMV=0: each RMSNorm a launch, not recomputed by every CUDA
block of the mat-vecs it feeds; GRID=0: a CUDA block per row group, not blocks looping over groups; FUSE_ATTN_ROPE=0:
RoPE and the KV append are kernels of their own, not done by decode attention's partial kernel; DOWN_F32=0: ffn_down
reads the SwiGLU output as Q8_1 blocks from a quantization kernel, not as f32; PFUSED_REGS=0: the default records'
value, where PFUSED=0 left it nothing to do (PFUSED's matrices now always go to the register-A kernel,
kernels.gemm_fused_regs; the records of the B-producer kernel that dequantized into shared memory are retired)); the
prefill flash attention's FA_BQ and FA_STAGES (`kernels.attention_config.REMOVED`); and the prefill GEMM's SCHED (persistent
blocks lost or tied, ledger #198-#201; grid, a block per tile, is what runs). The bench experiment's ``removed_knobs``;
`minfer bench --arm` names them as removed."""


def engine_knobs() -> tuple[Knob, ...]:
    """The knobs of the whole engine: W16, the decode ones (``DECODE_KNOBS``), the GEMM's tile knobs, and the
    flash-attention knobs (prefixed FA_). W16 and the GEMM/FA_ knobs act on pp, the decode ones on tg."""
    from kernels import attention_config as attention, gemm_f16_config as gemm_f16  # numba-free knob tables

    knobs = [Knob("W16", (0, 1), 1, "1: persistent f16 copy of every weight made at load; 0: dequantize before every product")]
    knobs += [Knob("PGRAPH", (0, 1), 1, "prefill (pp): 1 captures the prefill of each prompt length into a CUDA graph "
                                        "on its first run and replays it; 0 launches every kernel from Python",
                   legacy=0)]
    knobs += [Knob("FUSE_ADD_NORM", (0, 1), 0, "prefill (pp): 1 adds the attention output and the FFN output (their "
                                               "split-K slices summed) to the residual stream in the next RMSNorm's "
                                               "kernel, its rows row_tpb threads wide with PNORM_WIDE; 0 a slice sum, a "
                                               "residual add and an RMSNorm (0 the default: it won at pp128 but lost "
                                               "at pp512)")]
    knobs += [Knob("PHEAD", ("gemm", "gemv"), "gemm", "prefill (pp): the last token's logits by the f16 GEMM on an f16 "
                                                       "copy of the output weight (gemm) or by the decode's f32-input "
                                                       "mat-vec on the quantized weight (gemv: no f16 copy, fewer bytes)")]
    knobs += [Knob("PNORM_WIDE", (0, 1), 1, "prefill (pp): 1 runs the RMSNorms of prompts under 256 tokens (and the "
                                            "last token's), and FUSE_ADD_NORM's at every length, with up to 1024 "
                                            "threads a row, so a row takes one round of loads (the default: faster "
                                            "at pp128); 0 256 threads a row at every length", legacy=0)]
    knobs += [Knob("PFUSE_ROPE_KV", (0, 1), 1, "prefill (pp): 1 writes the rotated q (f16) and the K/V cache rows from "
                                               "the RoPE kernel, which also adds the q|k|v bias (the default: faster "
                                               "at pp128 and pp512); 0 a bias kernel (qwen2), then "
                                               "RoPE, then a KV-append kernel (decode's FUSE_ROPE_KV, plus q)", legacy=0)]
    knobs += [Knob("PFUSE_GLU", (0, 1), 1, "prefill (pp): 1 computes silu(gate) * up in the gate/up GEMM's epilogue "
                                           "and writes the f16 activation (kernels.gemm_f16.gemm_f16_glu: no f32 "
                                           "[nt, 2 ffn] product written and read back; the default: faster at "
                                           "pp512); 0 the GEMM's f32 product, then swiglu (the same bits with "
                                           "NOCALL=0; NOCALL=1's epilogue divides with div.approx, one f16 ulp). "
                                           "Needs STAGING=tma, EPI=staged, TM 128 or 256; does nothing for a ffn "
                                           "not a multiple of TM / 2", legacy=0)]
    knobs += [Knob("PFUSE_RESID", (0, 1), 1, "prefill (pp): 1 adds the attention output's and the FFN's products to "
                                             "the residual stream in their GEMM's epilogue (C += A·B^T; split-K "
                                             "slices in the slice sum): no f32 [nt, hidden] product written, read "
                                             "back and added by a kernel of its own (the default: faster at pp128 "
                                             "and pp512); 0 that buffer and residual_add. "
                                             "The same numbers either way. Does nothing with FUSE_ADD_NORM=1 (its "
                                             "norm kernel adds) or STAGING other than tma", legacy=0)]
    knobs += [Knob("PFUSED", (0, 1), 0, "prefill (pp): 1 multiplies every matrix whose tensors are all Q4_K straight "
                                        "from its quantized bytes with kernels.gemm_fused_regs (the weight as "
                                        "wgmma's register operand, each consumer thread dequantizing its own "
                                        "fragment; tile 128 weight rows x PFUSED_TN tokens; the gate|up with its "
                                        "SwiGLU epilogue under PFUSE_GLU; no f16 copy or scratch for it), the "
                                        "others as W16 says; 0 every matrix as W16 says")]
    knobs += [Knob("PFUSED_TN", (128, 256), 256, "prefill (pp), with PFUSED=1: tokens a tile of "
                                                  "kernels.gemm_fused_regs (its TN, whatever TN says for the f16 "
                                                  "GEMM). 256 (the default: faster at nt 512 and 2048): each "
                                                  "dequantized weight fragment serves twice the tokens; its producer "
                                                  "warpgroup gives registers to the consumers (setmaxnreg; the "
                                                  "kernel is loaded whole-program through the driver's JIT) and "
                                                  "turns the block headers into scales for them. Does nothing "
                                                  "without PFUSED=1", legacy=128)]
    knobs += [Knob("PROPE_ANGLES", (0, 1), 1, "prefill (pp): 1 computes every token's RoPE (cos, sin) once a prefill "
                                              "(kernels.rope.rope_angles) for all layers (the default: faster at "
                                              "pp512); 0 in every layer's RoPE kernel (float64 angles per token "
                                              "and pair; the same values either way)", legacy=0)]
    knobs += [Knob("GRAPHS", (0, 1), 1, "decode (tg): 1 replays one captured CUDA graph per step; 0 launches eagerly", legacy=0)]
    knobs += [Knob("MMVQ", (0, 1), 1, "decode (tg): 1 quantizes mat-vec inputs to Q8_1 (int8, dp4a) for "
                                      "Q4_K/Q6_K/Q8_0 weights; 0 keeps f32 inputs", legacy=0)]
    knobs += [Knob("XRES", (0, 1), 1, "decode (tg, MMVQ=1): 1 quantizes mat-vec inputs to compensated Q8_1 (a second "
                                      "int8 per element holds the rounding residual at d/254; one more dp4a a word), "
                                      "as accurate as f32 inputs (the default: plain Q8_1 misses the 1e-2 logits bar); "
                                      "0 plain Q8_1. No effect with MMVQ=0", legacy=0)]
    knobs += [Knob("FUSE_ADD", (0, 1), 1, "decode (tg): 1 adds q/k/v biases and the residual in the mat-vec "
                                          "epilogue; 0 runs them as separate kernels", legacy=0)]
    knobs += [Knob("FUSE_GLU", (0, 1), 1, "decode (tg): 1 runs gate, up and SwiGLU as one mat-vec kernel; 0 as three "
                                          "(the default: fewer launches and one read of x)", legacy=0)]
    knobs += [Knob("FUSE_QKV", (0, 1), 1, "decode (tg): 1 runs consecutive q/k/v weights of one format as one mat-vec "
                                          "over their stacked rows (read in place; the default: fewer launches); 0 "
                                          "one mat-vec each", legacy=0)]
    knobs += [Knob("FUSE_ROPE_KV", (0, 1), 0, "decode (tg): 1 writes the rotated k and v rows into the KV cache from "
                                              "the RoPE kernel; 0 copies them in a separate KV-append kernel (0 the "
                                              "default: its gain stayed under the A/B bar)")]
    knobs += [Knob("ROPE_ANGLES", (0, 1), 1, "decode (tg): 1 computes the step's RoPE (cos, sin) once after the "
                                             "embedding (kernels.rope.rope_angles) and every layer's RoPE reads "
                                             "them (the default; the same bits); 0 each layer's RoPE kernel computes "
                                             "them in float64 (prefill's PROPE_ANGLES for decode)", legacy=0)]
    knobs += [Knob("FUSE_ATTN_Q8", (0, 1), 1, "decode (tg, MMVQ=1): 1 writes the attention output's Q8_1 blocks "
                                              "in decode attention's combine kernel (the default: one launch fewer "
                                              "a layer); 0 in a separate kernel. No effect with MMVQ=0", legacy=0)]
    knobs += [Knob("FUSE_NORM_SPLIT", (0, 1), 1, "decode (tg, MMVQ=1): 1 writes each RMSNorm's Q8_1 blocks from the "
                                                 "norm kernel, spread over several CUDA blocks that each recompute "
                                                 "the row's scale (the same bits; the default: faster tg on both "
                                                 "presets); 0 quantizes in a separate kernel. No effect "
                                                 "with MMVQ=0", legacy=0)]
    knobs += [Knob("FUSE_QKV_MIXED", (0, 1), 1, "decode (tg, FUSE_ADD=1, FUSE_QKV=1): 1 runs the two q/k/v "
                                                "mat-vecs FUSE_QKV leaves where the layer has two formats (Q4_K_M: "
                                                "q|k Q4_K and v Q6_K) as one launch, each its own CUDA blocks (the "
                                                "same bits; the default: faster tg on both presets); 0 one "
                                                "launch each. No effect where q, k and v share a format", legacy=0)]
    knobs += [Knob("DEEP", (0, 1), 1, "decode (tg): 1 runs the Q4_K and Q6_K MMVQ mat-vecs of long rows (ffn_down) "
                                      "with RPB=4, WPR=4 and launch bounds for one wave (gemv MINB), Q6_K also with "
                                      "gemv STAGE=2 and FOLD=1 (the default: faster at ffn_down); 0 the general shape. No "
                                      "effect with MMVQ=0 (f32 inputs keep the f32 shape)", legacy=0)]
    knobs += [Knob("FEW_ROWS", (0, 1), 1, "decode (tg, MMVQ=1): 1 runs the MMVQ mat-vecs of at most 2048 rows "
                                          "(the 1.5B's q|k|v and attention output; the 7B's v where it has its own "
                                          "format) two rows a CUDA block (RPB=2, WPR=2: twice the blocks of the "
                                          "general shape for the SMs; the default: faster tg on both presets); 0 the "
                                          "general shape (RPB=4, WPR=2)", legacy=0)]
    knobs += [Knob("WIDE_RING", (0, 1), 1, "decode (tg, MMVQ=1): 1 runs the Q6_K mat-vecs of at least 8192 rows (the "
                                           "vocabulary head) with gemv STAGE=2 and FOLD=1 (the per-warp cp.async ring "
                                           "and the offset fold, RPB=4, WPR=2; the default: faster tg on both "
                                           "presets); 0 the general shape. No effect with MMVQ=0", legacy=0)]
    knobs += [Knob("PDL", (0, 1), 1, "decode (tg): 1 makes the per-layer kernels (mat-vecs, RMSNorm, Q8_1 "
                                     "quantization, RoPE, KV append, decode attention) programmatic dependent launches: "
                                     "each may start before the previous kernel ends and waits for it before reading "
                                     "its output (the default: it shortens the step); 0 ordinary launches", legacy=0)]
    knobs += [Knob("AHEAD", (1, 2, 4, 8), 1, "decode (tg, PDL=1): chunks of weight each mat-vec warp prefetches into "
                                            "L2 before it waits for the previous kernel (kernels.gemv lookahead), "
                                            "so the next mat-vec's weights stream while the current kernel ends; 1 "
                                            "the first chunk. The Q6_K ring (DEEP) keeps its own")]
    knobs += [Knob("ATTN_SPLITS", (32, 64, 128), 64, "decode (tg): decode-attention blocks per KV head along the "
                                                    "cache (4 warp partitions each; 64 the default: it tied 128 at "
                                                    "tg128 and beat it at 16384 cached tokens; 128 was chosen over 32)",
                   legacy=32)]
    knobs += [Knob(k, tuple(v), gemm_f16.DEFAULT[k], f"gemm_f16 {k} (see `minfer experiments list`)",
                   legacy={"EPI": "direct", "NOCALL": 0}.get(k))  # what records from before the knob ran
              for k, v in gemm_f16.KNOBS.items()]
    knobs += [Knob("SPLITK", tuple(gemm_f16.LAUNCH_KNOBS["SPLITK"]), gemm_f16.LAUNCH_DEFAULT["SPLITK"],
                   "prefill (pp): gemm_f16 k slices per C tile (MMA=wgmma), partials summed in slice order by a second "
                   "kernel; 0 auto: enough slices to fill the GPU when a product's tiles do not (the default: short "
                   "prompts' products leave most SMs idle otherwise); 1 none",
                   legacy=1)]
    knobs += [Knob("AUTOTILE", tuple(gemm_f16.LAUNCH_KNOBS["AUTOTILE"]), gemm_f16.LAUNCH_DEFAULT["AUTOTILE"],
                   "prefill (pp): 4 runs a gemm_f16 product whose 256-wide tile grid quantizes badly on the SMs "
                   "(e.g. 2.2 waves) with the 192-, 144- or 128-wide tiles whose whole waves finish first (the "
                   "default; the SwiGLU epilogue's only 128); 1 chooses only between 256 and 128; 0 the configured "
                   "tile everywhere",
                   legacy=0)]
    knobs += [Knob("NARROWTAIL", tuple(gemm_f16.LAUNCH_KNOBS["NARROWTAIL"]), gemm_f16.LAUNCH_DEFAULT["NARROWTAIL"],
                   "prefill (pp): 1 runs a gemm_f16 product's whole waves of 256-wide tiles, then its last, partial "
                   "wave's columns as 128-wide tiles in a second launch, where that finishes sooner "
                   "(kernels.gemm_f16.tail_plan: a 7B ffn_gate_up at pp512 is 4 waves, then one of 128-wide tiles, "
                   "instead of 5); 0 one launch")]
    knobs += [Knob(FA_PREFIX + k, tuple(v), attention.DEFAULT[k], f"flash attention {k}",
                   legacy=attention.LEGACY.get(k))
              for k, v in attention.KNOBS.items()]
    return tuple(knobs)


def idle_knobs(config: Config, tg: bool) -> list[str]:
    """The knobs ``config`` moves from their defaults that a tg (``tg``) or pp test never reads."""
    default = {k.name: k.default for k in engine_knobs()}
    return [k for k, v in config.items() if v != default[k] and (k in DECODE_KNOBS) != tg]


def idle_fusions(config: Config) -> dict[str, str]:
    """The prefill knobs (the fusions, NARROWTAIL) a full engine knob configuration sets to 1 that its other knobs
    make a no-op, each
    with why in one line: PFUSE_GLU with GEMM knobs whose kernel has no SwiGLU epilogue
    (`kernels.gemm_f16_config.glu_tile_refusal`; the gate/up product and swiglu then run apart); PFUSE_RESID with
    FUSE_ADD_NORM=1 (its norm kernel does the residual adds) or GEMM knobs without the residual epilogue
    (`kernels.gemm_f16_config.accumulate_refusal`); PFUSED_TN other than its default without PFUSED=1;
    NARROWTAIL with GEMM knobs it does not split
    (`kernels.gemm_f16_config.narrow_tail_refusal`; with PFUSED=1 the all-Q4_K matrices' fused kernel runs one
    launch, the others still split). Empty when each applies."""
    from kernels.gemm_f16_config import (  # numba-free: no compiler before the GPU check
        accumulate_refusal, glu_tile_refusal, narrow_tail_refusal)

    idle = {}
    if config.get("PFUSE_GLU") and (why := glu_tile_refusal(config)) is not None:
        idle["PFUSE_GLU"] = f"PFUSE_GLU=1 does nothing with these GEMM knobs ({why})"
    if config.get("PFUSE_RESID"):
        if config.get("FUSE_ADD_NORM"):
            idle["PFUSE_RESID"] = "PFUSE_RESID=1 does nothing with FUSE_ADD_NORM=1 (its norm kernel adds the products)"
        elif (why := accumulate_refusal(config)) is not None:
            idle["PFUSE_RESID"] = f"PFUSE_RESID=1 does nothing with these GEMM knobs ({why})"
    if config.get("PFUSED_TN", 256) != 256 and not config.get("PFUSED"):
        idle["PFUSED_TN"] = (f"PFUSED_TN={config['PFUSED_TN']} does nothing without PFUSED=1 (it is the fused "
                             f"kernel's tile)")
    if config.get("NARROWTAIL") and (why := narrow_tail_refusal(config)) is not None:
        idle["NARROWTAIL"] = f"NARROWTAIL=1 does nothing with these GEMM knobs ({why})"
    return idle


def engine_conflict(config: Config) -> str | None:
    """Why a full engine knob configuration cannot run, in one sentence, or None."""
    if config.get("AHEAD", 1) > 1 and not config.get("PDL", 1):
        return f"AHEAD={config['AHEAD']} is the prefetch before PDL's wait for the previous kernel: it needs PDL=1"
    from kernels import gemm_f16_config as table

    names = (*table.KNOBS, *table.LAUNCH_KNOBS)
    defaults = {**table.DEFAULT, **table.LAUNCH_DEFAULT}
    gemm = {k: config[k] for k in names if k in config}
    if config.get("PFUSED"):  # the fused kernel reads the GEMM knobs by its own rules
        from kernels.errors import KernelConstraintError
        from kernels.gemm_fused_regs import regs_geometry

        try:
            regs_geometry(dict(gemm, TN=config.get("PFUSED_TN", 256)), "Q4_K")
        except KernelConstraintError as e:
            return f"PFUSED=1: {e}"
    if any(v != defaults[k] for k, v in gemm.items()):  # the GEMM's own rules (e.g. SPLITK > 1 needs MMA=wgmma)
        from kernels.errors import KernelConstraintError
        from kernels.gemm_f16 import resolve_config

        try:
            resolve_config(gemm)
        except KernelConstraintError as e:
            return str(e)
    return None


def engine_options(config: Config) -> EngineOptions:
    """The engine's typed options (`minfer_cli.engine.options`) from a full engine knob configuration."""
    from kernels import gemm_f16_config

    gemm = {k: config[k] for k in (*gemm_f16_config.KNOBS, *gemm_f16_config.LAUNCH_KNOBS) if k in config}
    attention = {k[len(FA_PREFIX):]: v for k, v in config.items() if k.startswith(FA_PREFIX)}
    prefill = PrefillOptions(w16=bool(config["W16"]), gemm=gemm, attention=attention,
                             pgraph=bool(config.get("PGRAPH", 1)), fuse_add_norm=bool(config.get("FUSE_ADD_NORM", 0)),
                             fuse_rope_kv=bool(config.get("PFUSE_ROPE_KV", 1)), head=str(config.get("PHEAD", "gemm")),
                             norm_wide=bool(config.get("PNORM_WIDE", 1)), fuse_glu=bool(config.get("PFUSE_GLU", 1)),
                             rope_angles=bool(config.get("PROPE_ANGLES", 1)), fused=bool(config.get("PFUSED", 0)),
                             fused_tn=int(config.get("PFUSED_TN", 256)),
                             fuse_resid=bool(config.get("PFUSE_RESID", 1)))
    decode = DecodeOptions(graphs=bool(config.get("GRAPHS", 1)), mmvq=bool(config.get("MMVQ", 1)),
                           xres=bool(config.get("XRES", 1)), fuse_add=bool(config.get("FUSE_ADD", 1)),
                           fuse_glu=bool(config.get("FUSE_GLU", 1)),
                           deep=bool(config.get("DEEP", 1)),
                           few_rows=bool(config.get("FEW_ROWS", 1)), wide_ring=bool(config.get("WIDE_RING", 1)),
                           pdl=bool(config.get("PDL", 1)),
                           fuse_qkv=bool(config.get("FUSE_QKV", 1)),
                           fuse_rope_kv=bool(config.get("FUSE_ROPE_KV", 0)),
                           rope_angles=bool(config.get("ROPE_ANGLES", 1)),
                           fuse_attn_q8=bool(config.get("FUSE_ATTN_Q8", 1)),
                           fuse_norm_split=bool(config.get("FUSE_NORM_SPLIT", 1)),
                           fuse_qkv_mixed=bool(config.get("FUSE_QKV_MIXED", 1)), attn_splits=int(config.get("ATTN_SPLITS", 64)),
                           ahead=int(config.get("AHEAD", 1)))
    return EngineOptions(prefill, decode)


@dataclass
class BenchRow:
    """One llama-bench row: model description, size (bytes), params, test name, t/s samples and their summary,
    and the device memory the process used (peak, and growth from the first repetition to the last)."""

    model: str
    size_bytes: int
    n_params: int
    test: str
    n_tokens: int
    samples: list = field(default_factory=list)
    peak_mem_bytes: int = 0
    mem_growth_bytes: int = 0
    capture_seconds: float = 0.0  # pp with PGRAPH=1: wall time of the graph capture (in the warm-up, untimed)
    depth: int = 0  # tokens already in the KV cache when the test ran (llama-bench's -d)
    breakdown: list = field(default_factory=list)  # --breakdown: (stage, µs, intervals) a token (tg) or a prefill (pp)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.samples)

    @property
    def std(self) -> float:
        return statistics.stdev(self.samples) if len(self.samples) > 1 else 0.0


def bench_test_name(kind: str, n: int, depth: int = 0) -> str:
    """llama-bench's test name: ``pp512``, ``tg128``, and at a depth ``pp512 @ d4096``."""
    return f"{kind}{n}" + (f" @ d{depth}" if depth else "")


def parse_bench_test(name: str) -> tuple[str, int, int]:
    """(kind "pp" or "tg", n, depth) of a `bench_test_name`; ValueError for anything else."""
    m = re.fullmatch(r"(pp|tg)([0-9]+)(?: @ d([0-9]+))?", str(name).strip())
    if not m or int(m.group(2)) < 1:
        raise ValueError(f"{name!r} is not a bench test name (pp<n>, tg<n>, optionally ' @ d<depth>')")
    return m.group(1), int(m.group(2)), int(m.group(3) or 0)


def _used_bytes() -> int:
    from numba import cuda

    free, total = cuda.current_context().get_memory_info()
    return int(total - free)


def prefill_need(c: ModelConfig, max_tokens: int, options: PrefillOptions, depth: int = 0,
                 specs: Optional[Mapping[str, TensorSpec]] = None) -> int:
    """Device bytes a prefill engine for prompts of up to ``max_tokens`` after ``depth`` cached tokens allocates
    beyond the quantized weights (`minfer_cli.engine.forward.device_bytes`). ``specs``: the weight tensors by name,
    which PFUSED's plan needs (the matrices it multiplies from quantized bytes get no f16 copy); without them every
    matrix is counted as copied."""
    return device_bytes(c, max_tokens, options.w16, context=depth + max_tokens, gemm=options.gemm,
                        glu=uses_glu(c, options) and (not options.fused or uses_fused_glu(c, options)),
                        fused=specs if options.fused else None,
                        fused_gemm=options.fused_gemm)


def decode_need(c: ModelConfig, max_tokens: int, depth: int = 0) -> int:
    """Device bytes a generation of ``max_tokens`` after ``depth`` cached tokens allocates beyond the quantized
    weights: the decode engine's (`minfer_cli.engine.decode.decode_device_bytes`) and, at a depth, the prefill
    engine that fills its cache (whose KV rows the decode shares: counted once)."""
    from minfer_cli.engine.decode import decode_device_bytes

    context = depth + max_tokens
    need = decode_device_bytes(c, context)
    if depth:
        need += device_bytes(c, min(depth, FILL_CHUNK), False, context=context) - kv_cache_bytes(c, context)
    return need


def _free_bytes() -> int:
    from numba import cuda

    return int(cuda.current_context().get_memory_info()[0])


def check_fits_model(c: ModelConfig, weight_bytes: int, pp: list[int], tg: list[int], depths: list[int],
                     options: EngineOptions, free: int | None = None,
                     specs: Optional[Mapping[str, TensorSpec]] = None) -> None:
    """ModelError, before the weights are loaded or generated, when the weights (``weight_bytes``) and the largest
    test's engine (`prefill_need` with the weight tensors ``specs`` by name, `decode_need`; the tests run one after
    another) exceed the device's free memory (``free``, bytes: the current device's by default)."""
    if not pp and not tg:
        raise ValueError("check_fits_model needs a prompt (pp) or a generation (tg) length")
    tests = [(f"-p {max(pp)}", prefill_need(c, max(pp), options.prefill, max(depths), specs))] if pp else []
    tests += [(f"-n {max(tg)}", decode_need(c, max(tg), max(depths)))] if tg else []
    flag, need = max(tests, key=lambda t: t[1])
    free = _free_bytes() if free is None else free
    if weight_bytes + need > free:
        at = f" after a depth of {max(depths)}" if max(depths) else ""
        hint = ""
        if flag.startswith("-p") and options.prefill.w16:  # name W16=0 only where it would fit
            light = prefill_need(c, max(pp), dataclasses.replace(options.prefill, w16=False), max(depths), specs)
            if weight_bytes + max([light] + [n for f, n in tests if f.startswith("-n")]) <= free:
                hint = " (try --arm W16=0, which keeps no f16 weight copies)"
        raise ModelError(f"{c.name}: {flag}{at} needs {(weight_bytes + need) / 2**30:.1f} GiB of device memory "
                         f"({weight_bytes / 2**30:.1f} GiB of weights and {need / 2**30:.1f} GiB for the engine); "
                         f"{free / 2**30:.1f} GiB are free{hint}")


def check_fits(weights: ModelWeights, max_tokens: int, options: PrefillOptions, depth: int = 0) -> None:
    """ModelError when a prompt (after ``depth`` cached tokens) is beyond the model's context or the engine would
    not fit in device memory."""
    c = weights.config
    if depth + max_tokens > c.context_length:
        at = f" after a depth of {depth}" if depth else ""
        raise ModelError(f"-p {max_tokens}{at} is beyond the model's context length {c.context_length}")
    need = prefill_need(c, max_tokens, options, depth, {name: spec for name, (spec, _) in weights.tensors.items()})
    free = _free_bytes()
    if need > free:
        hint = " (try --arm W16=0, which keeps no f16 weight copies)" if options.w16 else ""
        raise ModelError(f"-p {max_tokens} needs {need / 2**30:.1f} GiB of device memory beyond the weights; "
                         f"{free / 2**30:.1f} GiB are free{hint}")


def run_pp(weights: ModelWeights, counts: list[int], reps: int, options: PrefillOptions, seed: int,
           progress: Progress = None, depths: tuple[int, ...] = (0,), breakdown: bool = False) -> list[BenchRow]:
    """Time pp<n> @ d for every n in ``counts`` and d in ``depths``: ``reps`` prefills of n random tokens at
    positions d..d+n-1 each, after one warm-up prefill; the cache's first d rows are filled before (module
    docstring). With ``breakdown``, each row's ``breakdown`` holds every stage's mean GPU µs a prefill over
    ``reps`` more prefills with events between the stages (`PrefillEngine.breakdown`)."""
    from numba import cuda

    check_fits(weights, max(counts), options, max(depths))
    c = weights.config
    engine = PrefillEngine(weights, max(counts), options, context=max(depths) + max(counts), progress=progress)
    rng = np.random.default_rng(seed)
    rows = []
    for depth in depths:
        if depth:
            if progress:
                progress(f"filling the KV cache to depth {depth}", 0.0)
            engine.fill(rng.integers(0, c.vocab, size=depth, dtype=np.int32))
        for n in counts:
            row = BenchRow(weights.describe(), weights.size_bytes(), weights.n_params(),
                           bench_test_name("pp", n, depth), n, depth=depth)
            ids = cuda.to_device(rng.integers(0, c.vocab, size=n, dtype=np.int32))
            engine.prefill(ids, depth)
            engine.stream.synchronize()
            first_used = _used_bytes()
            peak = first_used
            for r in range(reps):
                if progress:
                    progress(f"{row.test} repetition {r + 1}/{reps}", r / reps)
                t0 = time.perf_counter()
                engine.prefill(ids, depth)
                engine.stream.synchronize()
                row.samples.append(n / (time.perf_counter() - t0))
                peak = max(peak, _used_bytes())
            row.peak_mem_bytes = peak
            row.mem_growth_bytes = _used_bytes() - first_used
            row.capture_seconds = engine.capture_seconds.get((n, depth), 0.0)
            if breakdown:
                if progress:
                    progress(f"{row.test} stage breakdown", 1.0)
                row.breakdown = engine.breakdown(ids, depth, reps)
            rows.append(row)
    engine.close()
    return rows


FILL_CHUNK = 512
"""Tokens per eager prefill when a tg test's KV cache is filled to its depth."""


def depth_filler(weights: ModelWeights, tokens, n: int) -> PrefillEngine:
    """A tg test's KV cache at depth d = len(tokens), room for n more rows: a prefill engine (W16=0, no f16 weight
    copies; eager; default GEMM and flash-attention knobs, so tg reads decode knobs only) that has written rows
    0..d-1 from ``tokens`` in chunks of `FILL_CHUNK`. A `DecodeEngine` given it as ``prefill`` shares that cache;
    close it after the decode engine."""
    depth = len(tokens)
    filler = PrefillEngine(weights, min(depth, FILL_CHUNK), PrefillOptions(w16=False, pgraph=False),
                           context=depth + n)
    filler.fill(tokens)
    return filler


def check_fits_tg(weights: ModelWeights, max_tokens: int, depth: int = 0) -> None:
    """ModelError when a generation (after ``depth`` cached tokens) is beyond the model's context or its KV cache
    (and, at a depth, the prefill that fills it) would not fit in device memory."""
    c = weights.config
    if depth + max_tokens > c.context_length:
        at = f" after a depth of {depth}" if depth else ""
        raise ModelError(f"-n {max_tokens}{at} is beyond the model's context length {c.context_length}")
    need = decode_need(c, max_tokens, depth)
    free = _free_bytes()
    if need > free:
        raise ModelError(f"-n {max_tokens} needs {need / 2**30:.1f} GiB of device memory beyond the weights; "
                         f"{free / 2**30:.1f} GiB are free")


def run_tg(weights: ModelWeights, counts: list[int], reps: int, options: DecodeOptions, seed: int,
           progress: Progress = None, depths: tuple[int, ...] = (0,), breakdown: bool = False) -> list[BenchRow]:
    """Time tg<n> @ d for every n in ``counts`` and d in ``depths``: ``reps`` generations of n tokens from position
    d (a random first token; rows 0..d-1 of the cache filled before, module docstring), each after one untimed
    warm-up generation of the same length (JIT, graph capture). With ``breakdown``, after the timed repetitions the
    engine generates the same n tokens once more, one step at a time with events between the stages, and each row's
    ``breakdown`` holds every stage's mean GPU µs a token (`DecodeEngine.breakdown`)."""
    from minfer_cli.engine.decode import DecodeEngine

    check_fits_tg(weights, max(counts), max(depths))
    c = weights.config
    rng = np.random.default_rng(seed)
    rows = []
    for depth in depths:
        filler = None
        if depth:
            if progress:
                progress(f"filling the KV cache to depth {depth}", 0.0)
            filler = depth_filler(weights, rng.integers(0, c.vocab, size=depth, dtype=np.int32), max(counts))
            engine = DecodeEngine(weights, options=options, prefill=filler)
        else:
            engine = DecodeEngine(weights, max(counts), options)
        try:
            for n in counts:
                row = BenchRow(weights.describe(), weights.size_bytes(), weights.n_params(),
                               bench_test_name("tg", n, depth), n, depth=depth)
                token = int(rng.integers(0, c.vocab))
                engine.start(token, depth)
                engine.generate(n)
                first_used = _used_bytes()
                peak = first_used
                for r in range(reps):
                    if progress:
                        progress(f"{row.test} repetition {r + 1}/{reps}", r / reps)
                    engine.start(token, depth)
                    engine.stream.synchronize()
                    t0 = time.perf_counter()
                    engine.generate(n)
                    row.samples.append(n / (time.perf_counter() - t0))
                    peak = max(peak, _used_bytes())
                row.peak_mem_bytes = peak
                row.mem_growth_bytes = _used_bytes() - first_used
                if breakdown:
                    if progress:
                        progress(f"{row.test} stage breakdown", 1.0)
                    row.breakdown = engine.breakdown(token, depth, n)
                rows.append(row)
        finally:
            engine.close()
            if filler is not None:
                filler.close()
    return rows
