"""The engine's typed options: `PrefillOptions` (read by `minfer_cli.engine.forward.PrefillEngine`),
`DecodeOptions` (read by `minfer_cli.engine.decode.DecodeEngine`) and `EngineOptions`, the pair a whole run takes.

Each field is one engine knob of `minfer_cli.engine.bench.engine_knobs` (its name in capitals there), with the
knob's default; `minfer_cli.engine.bench.engine_options` maps a knob configuration onto them. The engine reads
only these values: it never sees knob names or CLI strings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass(frozen=True)
class PrefillOptions:
    """w16 (W16): persistent f16 weights made once at construction (True) or each matrix dequantized into one
    scratch buffer before its product (False). gemm / attention: `kernels.gemm_f16` and `kernels.attention` knob
    settings, by their names without prefix (None: the kernels' defaults). pgraph (PGRAPH): the prefill of each
    (prompt length, start) is captured into a CUDA graph on its first run and replayed after (True; not in the CUDA
    simulator) or every kernel is launched from Python (False). fuse_add_norm (FUSE_ADD_NORM): the attention
    output's and the FFN's products are added to the residual stream by the next RMSNorm's kernel, which also sums
    their split-K slices (`kernels.norm.add_rms_norm`, True), or by a slice sum, a residual add and an RMSNorm
    (False). fuse_rope_kv (PFUSE_ROPE_KV): RoPE also writes the rotated q as f16 and the K/V cache rows
    and adds the q|k|v bias (`kernels.rope.rope` with kv_cache, q_out and bias, True) instead of a bias kernel and a
    separate `kernels.kv_cache.kv_append` (False).
    head (PHEAD): the last token's logits by `kernels.gemm_f16` on an f16 copy of the output weight ("gemm") or by
    `kernels.gemv.gemv_q` on the quantized weight with f32 input ("gemv"; no f16 copy of it is made). norm_wide
    (PNORM_WIDE): RMSNorms of fewer than `kernels.norm.WIDE_ROWS` rows (and the last token's, and FUSE_ADD_NORM's
    at every length) run with `kernels.norm.row_tpb` threads a row (True) or `kernels.norm.DEFAULT_TPB` at every
    length (False). fuse_glu
    (PFUSE_GLU): the gate/up product and SwiGLU as one GEMM that writes the f16 activation
    (`kernels.gemm_f16.gemm_f16_glu`, or `kernels.gemm_fused_regs.gemm_fused_regs_glu` for a gate|up PFUSED
    multiplies; True, where the GEMM knobs and ffn allow it: `minfer_cli.engine.forward.uses_glu`,
    `uses_fused_glu`) or the GEMM's f32 [nt, 2 ffn] product then `kernels.activation.swiglu`
    (False; within one f16 ulp of act, `kernels.gemm_f16.gemm_f16_glu`). rope_angles (PROPE_ANGLES): every token's
    RoPE (cos, sin) computed once a prefill (`kernels.rope.rope_angles`) and read by every layer's RoPE (True), or
    computed in each layer's kernel (False). fuse_resid (PFUSE_RESID): the attention output's and the FFN's products
    are added to the residual stream by their GEMM's epilogue (`kernels.gemm_f16.gemm_f16`'s ``accumulate``, True,
    where `minfer_cli.engine.forward.uses_resid` says it applies) or written to a buffer that
    `kernels.residual.residual_add` adds (False; the same numbers either way).
    fused (PFUSED): a matrix whose stacked tensors are all of a `kernels.gemm_fused.FUSED_TYPES` format (Q4_K) is
    multiplied straight from its quantized bytes by `kernels.gemm_fused_regs` (the weight dequantized into wgmma's
    register operand), with no f16 copy or scratch for it (True); the other matrices as ``w16`` says. False: every
    matrix as ``w16`` says. fused_tn (PFUSED_TN): the tokens a tile of that kernel (its TN: 256 with the
    register-donating producer warpgroup, or 128), whatever ``gemm``'s TN says (`fused_gemm`)."""

    w16: bool = True
    gemm: Optional[dict] = None
    attention: Optional[dict] = None
    pgraph: bool = True
    fuse_add_norm: bool = False
    fuse_rope_kv: bool = True
    head: str = "gemm"
    norm_wide: bool = True
    fuse_glu: bool = True
    rope_angles: bool = True
    fused: bool = False
    fuse_resid: bool = True
    fused_tn: int = 256

    @property
    def fused_gemm(self) -> Optional[dict]:
        """The GEMM knobs PFUSED's kernel reads (``gemm`` with TN = ``fused_tn``), or None without ``fused``: also
        what the split-K partials and the memory plan size its tiles by."""
        return dict(self.gemm or {}, TN=self.fused_tn) if self.fused else None


@dataclass(frozen=True)
class DecodeOptions:
    """graphs (GRAPHS): a step replays one captured CUDA graph (True) or launches eagerly (False). mmvq (MMVQ): the
    mat-vecs of Q4_K/Q6_K/Q8_0 weights take their input quantized to Q8_1 (int8, dp4a; llama.cpp's MMVQ) instead of
    f32. xres (XRES, with mmvq): that input is compensated Q8_1 (a second int8 value per element holds the first
    rounding's residual at d/254: `kernels.quantize_q8`), as accurate as f32 input (True) or plain Q8_1 (False).
    fuse_add (FUSE_ADD): bias and residual adds in the mat-vec epilogue (True) or separate kernels (False).
    fuse_glu (FUSE_GLU): gate, up and SwiGLU as one kernel (`kernels.gemv.gemv_glu`, True) or three (False).
    deep (DEEP, with mmvq): the Q4_K and Q6_K mat-vecs of long rows (ffn_down) take
    `minfer_cli.engine.gemv_policy.GEMV_MMVQ_DEEP` and launch bounds for one wave (True) or the general shape
    (False). few_rows (FEW_ROWS, with mmvq): the MMVQ mat-vecs of at most
    `minfer_cli.engine.gemv_policy.FEW_ROWS` rows take `minfer_cli.engine.gemv_policy.GEMV_MMVQ_FEW` (True) or the
    general shape (False). wide_ring (WIDE_RING, with mmvq): the Q6_K mat-vecs of at least
    `minfer_cli.engine.gemv_policy.WIDE_ROWS` rows (the vocabulary head) take
    `minfer_cli.engine.gemv_policy.GEMV_MMVQ_WIDE_RING` (True) or the general shape (False). pdl (PDL): the per-layer kernels are programmatic dependent launches (`kernels.launch`: each
    may start before the previous one ends and waits for it before reading its output; True) or ordinary ones (False).
    fuse_qkv (FUSE_QKV): q/k/v weights of one format run as one mat-vec over their stacked rows (True) or one each
    (False). fuse_rope_kv (FUSE_ROPE_KV): the RoPE kernel also writes the
    rotated k and v rows into the KV cache (`kernels.rope.rope`'s kv_cache, True) or `kernels.kv_cache.kv_append`
    copies them after it (False). rope_angles (ROPE_ANGLES): the step's RoPE (cos, sin) computed once after the
    embedding (`kernels.rope.rope_angles`) and read by every layer's RoPE (True), or each layer's RoPE computes its
    own in float64 (False); the same bits. fuse_attn_q8 (FUSE_ATTN_Q8, with mmvq): decode attention's combine also writes its
    output's Q8_1 blocks (`kernels.attention_decode.decode_attention`'s q8, True; at a head_dim that is not a
    multiple of 32, 80, the separate quantization runs) instead of a separate quantization (False). fuse_norm_split (FUSE_NORM_SPLIT, with mmvq): each RMSNorm also writes its output's Q8_1 blocks, in
    one launch of several CUDA blocks that each recompute the row's scale (`kernels.norm.rms_norm_q8`, True),
    instead of a separate quantization (False). fuse_qkv_mixed (FUSE_QKV_MIXED, with fuse_add): q/k/v mat-vecs left
    as two launches by fuse_qkv (two formats) run as one (`kernels.gemv.gemv_pair`, True) or two (False). ahead
    (AHEAD, with pdl): chunks of weight each mat-vec warp
    prefetches into L2 before it waits for the previous kernel (`kernels.gemv.GemvConfig.lookahead`; 1: the
    first). attn_splits (ATTN_SPLITS): decode-attention blocks per KV head (`kernels.attention_decode.SPLITS_VALUES`)."""

    graphs: bool = True
    mmvq: bool = True
    xres: bool = True
    fuse_add: bool = True
    fuse_glu: bool = True
    deep: bool = True
    few_rows: bool = True
    wide_ring: bool = True
    pdl: bool = True
    fuse_qkv: bool = True
    fuse_rope_kv: bool = False
    rope_angles: bool = True
    fuse_attn_q8: bool = True
    fuse_norm_split: bool = True
    fuse_qkv_mixed: bool = True
    ahead: int = 1
    attn_splits: int = 64


@dataclass(frozen=True)
class EngineOptions:
    """The options of a run that prefills and decodes (`minfer_cli.engine.check.check`, a bench of pp and tg)."""

    prefill: PrefillOptions = field(default_factory=PrefillOptions)
    decode: DecodeOptions = field(default_factory=DecodeOptions)
