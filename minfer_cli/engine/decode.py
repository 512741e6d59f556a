"""Token generation (decode, nt = 1) on minfer's kernels: one step per token, replayed as one CUDA graph.

Every value a step depends on lives in device memory: ``state = [id, pos, length]`` (int32; `kernels.decode_state`)
holds the token to process, its position and the attention length pos + 1. One step, all on one stream:

    x = embedding(state.id)                                          f32 [hidden]   (residual stream)
    per layer:  h = rms_norm(x, attn_norm)                           f32 [hidden]   (MMVQ: and h quantized to Q8_1)
                qkv[q | k | v] = gemv_q(Wq|Wk|Wv, h) (+ bias)        f32 [q_dim + 2 kv_dim]  (3 GEMVs, bias fused)
                rope(q, k at state.pos)                              in place
                K/V cache row state.pos = kv_append(qkv)             f16
                a = decode_attention(q, K, V, state.length)          f32 [n_heads, head_dim]  (flash-decoding)
                x = gemv_q(Wo, a) + x                                (residual fused in the GEMV epilogue)
                h = rms_norm(x, ffn_norm);  gu[gate | up] = gemv_q(Wgate, h) | gemv_q(Wup, h)   f32 [2 ffn]
                x = gemv_q(Wdown, swiglu(gu)) + x
    logits = gemv_q(Woutput, rms_norm(x, output_norm))               f32 [vocab]
    state.id = argmax(logits)  (on the device; ties -> lowest index)
    history[state.pos] = state.id;  state.pos += 1;  state.length += 1

The weights are the GGUF tensors as loaded (raw blocks on the device, read by `kernels.gemv`; no f16 copies).
Because nothing a step reads or writes depends on the host, ``GRAPHS=1`` captures one step once (after one eager
warm-up step that compiles every kernel) and `generate` replays that graph n times, then copies the n tokens back
in one transfer. ``GRAPHS=0`` launches the same kernels eagerly (A/B and debugging; ~400 launches a step at 7B,
so host launch time dominates). Both run the same kernels on the same data: bit-identical tokens and logits.
``MMVQ=1`` (``options.mmvq``): every mat-vec input (h, the attention output, the SwiGLU output) is quantized once to
Q8_1 blocks (`kernels.quantize_q8`) and the Q4_K / Q6_K / Q8_0 weights run the int8 dp4a kernels on it (one
quantization serves q, k and v, and gate and up); other weight types keep the f32 input. ``FUSE_NORM_SPLIT=1``
(``options.fuse_norm_split``, the default) quantizes h in the RMSNorm's own launch, spread over several CUDA blocks
(`kernels.norm.rms_norm_q8`; 0: a separate kernel). ``FUSE_QKV_MIXED=1`` (``options.fuse_qkv_mixed``, the default)
runs the q|k and v mat-vecs of different formats (Q4_K_M: Q4_K and Q6_K) as one launch (`kernels.gemv.gemv_pair`).
``XRES=1`` (``options.xres``, with MMVQ) quantizes to compensated Q8_1 instead (each element also carries its
rounding residual at d/254: `kernels.quantize_q8`), and the mat-vecs run a second dp4a chain over it. ``FUSE_ADD=0``
(``options.fuse_add``) runs the q/k/v bias adds and the two residual adds as separate kernels after their mat-vecs
instead of in the mat-vec epilogue (5 more launches and a write + read of each vector per layer). ``FUSE_GLU=1``
(``options.fuse_glu``, the default: one launch and no gate/up vectors in memory) computes ``act = silu(Wgate·h) *
(Wup·h)`` in one mat-vec kernel (`kernels.gemv.gemv_glu`) when gate and up share a format, instead of two mat-vecs
and `swiglu`. ``FUSE_QKV=1`` (``options.fuse_qkv``) runs each run of consecutive q / k / v weights of one format as
one mat-vec over their stacked rows (Q4_K_M: q|k, or q|k|v where attn_v is Q4_K too), read in place: the loaders lay
each layer's q, k, v weights and biases back to back (`ModelWeights.stacked`; no extra device memory), and since
every row is computed alone with the same launch shape, the logits are bit-identical. ``PDL=1``
(``options.pdl``) makes the per-layer chain programmatic dependent launches (`kernels.launch`): the mat-vecs,
RMSNorm, the Q8_1 quantization, RoPE, the KV append and both decode-attention kernels start while the kernel
before them finishes and wait for it (`kernels.ptx.griddepcontrol_wait`) before they read its output; the
embedding, argmax and state kernels (once a step) launch as before. ``ROPE_ANGLES=1`` (the default;
``options.rope_angles``) computes the step's RoPE (cos, sin) once after the embedding (`kernels.rope.rope_angles`;
every layer rotates the same position) and each layer's RoPE reads them instead of computing its table in float64
(bit-identical).

The KV caches are the prefill engine's when one is given (`DecodeEngine(weights, prefill=engine)`: decode
continues a prompt), or the decode engine's own (``context`` rows; llama-bench's tg test from an empty cache).
Source of the architecture: llama.cpp's llm_build_qwen2 / llm_build_llama (see `minfer_cli.engine.forward`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from minfer_cli.engine.config import ModelConfig
from minfer_cli.engine.errors import ModelError
from minfer_cli.engine.forward import PrefillEngine, kv_cache_bytes
from minfer_cli.engine.gemv_policy import GemvOperand, GemvPolicy
from minfer_cli.engine.options import DecodeOptions
from minfer_cli.engine.weights import ModelWeights

@dataclass
class _DecodeLayer:
    attn_norm: object
    ffn_norm: object
    qkv: tuple  # ((GemvOperand, out view, bias or None), ...) for q, k, v
    attn_output: GemvOperand
    gate: GemvOperand
    up: GemvOperand
    down: GemvOperand
    k_cache: object  # [context, kv_dim] f16 (written by kv_append, or by rope with FUSE_ROPE_KV)
    v_cache: object
    k_heads: object  # the same memory as [context, n_kv_heads, head_dim] (read by decode_attention)
    v_heads: object


def decode_device_bytes(c: ModelConfig, context: int) -> int:
    """Device bytes a standalone `DecodeEngine` allocates beyond the quantized weights (its KV cache and buffers)."""
    from kernels.argmax import default_blocks
    from kernels.attention_decode import SPLITS_VALUES

    kv = kv_cache_bytes(c, context)
    vectors = 4 * (2 * c.hidden + c.q_dim + 2 * c.kv_dim + c.q_dim + 3 * c.ffn + c.vocab) + 2 * c.q_dim
    workspace = 4 * max(SPLITS_VALUES) * c.n_heads * (2 + c.head_dim) + 8 * default_blocks(c.vocab)
    return kv + vectors + workspace + 4 * context


class DecodeEngine:
    """One-token decode steps over a KV cache of ``context`` rows, with every buffer allocated at construction.

    weights: the model (its GGUF tensors on the device). context: KV-cache rows (positions 0..context-1) when the
    engine owns its caches; ignored with ``prefill``. options: `DecodeOptions` (``options.graphs`` picks graph
    replay or eager launches; the mat-vec choices are `minfer_cli.engine.gemv_policy.GemvPolicy`'s). prefill: a `PrefillEngine` over the same weights whose KV caches, context and stream decode
    shares (a prompt prefilled there is continued here). stream: default the prefill engine's or a new one.
    splits: decode-attention blocks per KV head (`kernels.attention_decode.SPLITS_VALUES`; None: the options'
    ``attn_splits``). rows_per_block,
    warps_per_row: GEMV knobs (`kernels.gemv`) for every mat-vec (None: the policy's shapes, the fastest measured
    for each input form). ``timeline``: None, or a `minfer_cli.measure.timeline.Timeline` on the engine's stream
    while `breakdown` runs: every step then records an event after each stage (embedding, attn_norm, qkv, rope_kv,
    attention, attn_output, ffn_norm, ffn_gate_up, ffn_down per layer; output, sample), inside the graph too.

    Use: ``start(token, position)`` then ``generate(n)`` (graph replay when ``graphs``) or ``step()`` (always
    eager). Raises ModelError for a model the kernels cannot run (a GQA group above `attention_decode.max_group`, a
    tensor type the GEMV does not cover) and for steps past the cache.
    """

    def __init__(self, weights: ModelWeights, context: Optional[int] = None, options: DecodeOptions = DecodeOptions(),
                 *, prefill: Optional[PrefillEngine] = None, stream=None, splits: Optional[int] = None,
                 rows_per_block: Optional[int] = None, warps_per_row: Optional[int] = None):
        from numba import cuda

        from kernels.argmax import argmax_workspace, default_blocks
        from kernels.attention_decode import SPLITS_VALUES, decode_workspace, max_group
        from kernels.decode_state import STATE_SIZE
        from kernels.gemv import GEMV_TYPES
        from kernels.views import head_slice

        c: ModelConfig = weights.config
        if prefill is not None and prefill.weights is not weights:
            raise ModelError("DecodeEngine(prefill=...) must be given the prefill engine's own weights")
        if c.n_heads // c.n_kv_heads > max_group(c.head_dim):
            raise ModelError(f"GQA group {c.n_heads // c.n_kv_heads} (n_heads {c.n_heads} / n_kv_heads "
                             f"{c.n_kv_heads}): decode attention supports groups up to {max_group(c.head_dim)} "
                             f"at head_dim {c.head_dim}")
        for name, (spec, _) in weights.tensors.items():
            if spec.qtype not in GEMV_TYPES:
                raise ModelError(f"tensor {name} has type {spec.qtype}; gemv_q supports: {', '.join(GEMV_TYPES)}")
        self.config, self.weights, self.options = c, weights, options
        self.graphs = bool(options.graphs)
        self.mmvq = bool(options.mmvq)
        self.xres = bool(options.xres)
        self.fuse_add = bool(options.fuse_add)
        self.fuse_glu = bool(options.fuse_glu)
        self.fuse_qkv = bool(options.fuse_qkv)
        self.fuse_rope_kv = bool(options.fuse_rope_kv)
        self.rope_angles = bool(options.rope_angles)
        # FUSE_ATTN_Q8's combine writes whole Q8_1 blocks of one head: head_dim 80 runs the same quantization apart
        self.fuse_attn_q8 = bool(options.fuse_attn_q8) and c.head_dim % 32 == 0
        self.fuse_norm_split = bool(options.fuse_norm_split)
        self.fuse_qkv_mixed = bool(options.fuse_qkv_mixed)
        self.pdl = bool(options.pdl)
        self.splits = int(splits or options.attn_splits)
        if self.splits not in SPLITS_VALUES:
            raise ModelError(f"decode attention splits {self.splits}: must be one of "
                             f"{', '.join(map(str, SPLITS_VALUES))}")
        self.gemv = GemvPolicy(options, rows_per_block, warps_per_row)
        if prefill is not None:
            self.context = prefill.context
            self.stream = stream if stream is not None else prefill.stream
        else:
            if not context or context < 1:
                raise ModelError("a DecodeEngine without a prefill engine needs context >= 1 KV-cache rows")
            self.context = int(context)
            self.stream = stream if stream is not None else cuda.stream()
        s = self.stream
        self.timeline = None  # a Timeline while `breakdown` runs
        width = c.q_dim + 2 * c.kv_dim
        heads = c.n_heads + 2 * c.n_kv_heads

        # -- state and buffers (every one allocated here; nothing is allocated by a step) -------------------------
        self.state = cuda.to_device(np.array([0, 0, 1], dtype=np.int32), stream=s)
        self._saved = cuda.device_array(STATE_SIZE, dtype=np.int32, stream=s)
        self.ids, self.pos, self.length = self.state[0:1], self.state[1:2], self.state[2:3]
        self.history = cuda.device_array(self.context, dtype=np.int32, stream=s)
        self.x = cuda.device_array((1, c.hidden), dtype=np.float32, stream=s)
        self.h = cuda.device_array((1, c.hidden), dtype=np.float32, stream=s)
        self.qkv = cuda.device_array(width, dtype=np.float32, stream=s)
        self.q16 = cuda.device_array((1, c.q_dim), dtype=np.float16, stream=s)
        self.attn = cuda.device_array((c.n_heads, c.head_dim), dtype=np.float32, stream=s)
        self.gu = cuda.device_array(2 * c.ffn, dtype=np.float32, stream=s)
        self.act = cuda.device_array((1, c.ffn), dtype=np.float32, stream=s)
        self.logits = cuda.device_array(c.vocab, dtype=np.float32, stream=s)
        self._sum = cuda.device_array((1, c.hidden), dtype=np.float32, stream=s)  # FUSE_ADD=0: a mat-vec's output
        self.attn_workspace = decode_workspace(c.n_heads, self.splits, stream=s, head_dim=c.head_dim)
        self.argmax_blocks = default_blocks(c.vocab)
        self.argmax_workspace = argmax_workspace(self.argmax_blocks, stream=s)
        self._q8_hidden, self._q8_attn, self._q8_ffn = (self._q8(n) for n in (c.hidden, c.q_dim, c.ffn))
        # views, made once (numba's slicing costs host time; these are all contiguous or O(1) helper views)
        self._x1, self._h1 = self.x.reshape(c.hidden), self.h.reshape(c.hidden)
        self._attn1, self._act1 = self.attn.reshape(c.q_dim), self.act.reshape(c.ffn)
        self._qkv2 = self.qkv.reshape(1, width)
        qkv3 = self.qkv.reshape(1, heads, c.head_dim)
        self.rope_factors = weights.rope_factors()
        self._angles = (cuda.device_array((1, c.head_dim // 2, 2), dtype=np.float32, stream=s)
                        if self.rope_angles else None)  # ROPE_ANGLES: the step's (cos, sin), every layer's
        self._q_rope = head_slice(qkv3, 0, c.n_heads)
        self._k_rope = head_slice(qkv3, c.n_heads, c.n_heads + c.n_kv_heads)
        self._v_rope = head_slice(qkv3, c.n_heads + c.n_kv_heads, c.n_heads + 2 * c.n_kv_heads)
        self._q_heads = self.qkv[0: c.q_dim].reshape(c.n_heads, c.head_dim)
        self._gu2 = self.gu.reshape(1, 2 * c.ffn)
        gate_out, up_out = self.gu[0: c.ffn], self.gu[c.ffn: 2 * c.ffn]
        self._gate_out, self._up_out = gate_out, up_out

        self.layers: list[_DecodeLayer] = []
        for i in range(c.n_layers):
            b = f"blk.{i}."
            if prefill is not None:
                k_cache, v_cache = prefill.layers[i].k_cache, prefill.layers[i].v_cache
            else:
                k_cache = cuda.device_array((self.context, c.kv_dim), dtype=np.float16, stream=s)
                v_cache = cuda.device_array((self.context, c.kv_dim), dtype=np.float16, stream=s)
            self.layers.append(_DecodeLayer(
                attn_norm=self._f32(b + "attn_norm.weight"),
                ffn_norm=self._f32(b + "ffn_norm.weight"),
                qkv=self._qkv(b),
                attn_output=self._gemv(b + "attn_output.weight"),
                gate=self._gemv(b + "ffn_gate.weight"),
                up=self._gemv(b + "ffn_up.weight"),
                down=self._gemv(b + "ffn_down.weight"),
                k_cache=k_cache, v_cache=v_cache,
                k_heads=k_cache.reshape(self.context, c.n_kv_heads, c.head_dim),
                v_heads=v_cache.reshape(self.context, c.n_kv_heads, c.head_dim),
            ))
        self.output_norm = self._f32("output_norm.weight")
        self.output = self._gemv("token_embd.weight" if c.tied_output else "output.weight")
        self.embedding = weights.embedding_table()  # (raw, qtype): token_embd, or its f32 copy for other types
        s.synchronize()
        self.position: Optional[int] = None  # host copy of state.pos (None until `start`)
        self._prepared = False
        self._graph = None  # GRAPHS=1: one step as a StreamGraph, captured by `prepare`

    # -- construction helpers -------------------------------------------------------------------------------------
    def _f32(self, name: str):
        spec = self.weights.spec(name)
        if spec.qtype != "F32":
            raise ModelError(f"tensor {name} is {spec.qtype}; minfer expects F32 norms and biases")
        return self.weights.device(name).view(np.float32)

    def _gemv(self, name: str) -> GemvOperand:
        spec = self.weights.spec(name)
        return GemvOperand(self.weights.device(name), spec.qtype, spec.od, spec.id)

    def _qkv(self, prefix: str) -> tuple:
        """Layer ``prefix``'s q, k, v mat-vecs as ((GemvOperand, out view of ``qkv``, bias or None), ...); with FUSE_QKV
        each run of consecutive ones of one format is one entry over their stacked rows, read in place where the
        weights (and biases) lie back to back (`ModelWeights.stacked`; a run that does not stays separate mat-vecs,
        the same values either way)."""
        c = self.config
        names = [prefix + p for p in ("attn_q", "attn_k", "attn_v")]
        parts = [(n, self._gemv(n + ".weight")) for n in names]
        runs = [[parts[0]]]
        for name, m in parts[1:]:
            if self.fuse_qkv and m.qtype == runs[-1][-1][1].qtype and self._stack(runs[-1] + [(name, m)]) is not None:
                runs[-1].append((name, m))
            else:
                runs.append([(name, m)])
        entries, row = [], 0
        for run in runs:
            if len(run) == 1:
                name, m = run[0]
                bias = self._f32(name + ".bias") if c.qkv_bias else None
            else:
                m, bias = self._stack(run)
            entries.append((m, self.qkv[row: row + m.od], bias))
            row += m.od
        return tuple(entries)

    def _stack(self, run: list):
        """(GemvOperand over the stacked rows of ``run``'s weights, their stacked f32 biases or None), both views of
        the loaded tensors; None when they do not lie back to back."""
        c = self.config
        raw = self.weights.stacked([n + ".weight" for n, _ in run])
        bias = self.weights.stacked([n + ".bias" for n, _ in run]) if c.qkv_bias else None
        if raw is None or (c.qkv_bias and bias is None):
            return None
        m = GemvOperand(raw, run[0][1].qtype, sum(m.od for _, m in run), run[0][1].id)
        return m, None if bias is None else bias.view(np.float32)

    def _q8(self, n: int):
        """Q8_1 buffers for an n-wide mat-vec input when MMVQ is on (None when off or n is not a multiple of 32,
        where no MMVQ format's rows fit either)."""
        from kernels.quantize_q8 import QK, q8_blocks

        return q8_blocks(n, stream=self.stream, compensated=self.xres) if self.mmvq and n % QK == 0 else None

    # -- one step, enqueued ---------------------------------------------------------------------------------------
    def _quantize(self, x, q8):
        """Enqueue x -> Q8_1 into ``q8`` and return it (None, and nothing enqueued, without MMVQ)."""
        from kernels.quantize_q8 import quantize_q8_1

        return None if q8 is None else quantize_q8_1(x, q8, stream=self.stream, pdl=self.pdl)

    def _norm(self, weight):
        """Enqueue h = rms_norm(x) * weight and, with MMVQ, `quantize_q8_1` of h into its Q8_1 blocks (returned;
        None without MMVQ); with FUSE_NORM_SPLIT both in one launch (`kernels.norm.rms_norm_q8`, the same bits)."""
        from kernels.norm import rms_norm, rms_norm_q8, row_tpb

        eps, tpb, q8 = self.config.rms_eps, row_tpb(self.config.hidden), self._q8_hidden
        if self.fuse_norm_split and q8 is not None:
            rms_norm_q8(self.x, weight, eps, self.h, q8, stream=self.stream, tpb=tpb, pdl=self.pdl)
            return q8
        rms_norm(self.x, weight, eps, out=self.h, stream=self.stream, tpb=tpb, pdl=self.pdl)
        return self._quantize(self._h1, q8)

    def _input(self, m: GemvOperand, x, xq, wide: bool, glu: bool = False, residual: bool = False):
        """The mat-vec input for weight ``m`` (x, or its Q8_1 blocks ``xq``) and its kernel, as `GemvPolicy.config`
        chooses."""
        config = self.gemv.config(m, xq is not None, wide, glu, residual)
        return (xq if config.mmvq else x), config

    def _matvec(self, m: GemvOperand, x, out, residual=None, xq=None) -> None:
        """out = W·x (+ residual); with ``xq`` (x's Q8_1 blocks) the MMVQ kernel for the formats that have one.
        Without FUSE_ADD the add is a separate kernel: a bias (``residual`` is not ``out``) is added to ``out`` in
        place; the residual stream (``residual`` is ``out``) gets W·x through a scratch vector."""
        from kernels.gemv import gemv_q
        from kernels.residual import bias_add, residual_add

        if residual is not None and not self.fuse_add:
            if residual is out:
                self._matvec(m, x, self._sum.reshape(m.od), xq=xq)
                residual_add(out.reshape(1, m.od), self._sum, stream=self.stream)
            else:
                self._matvec(m, x, out, xq=xq)
                bias_add(out.reshape(1, m.od), residual, stream=self.stream)
            return
        x_in, config = self._input(m, x, xq, wide=True, residual=residual is not None)
        gemv_q(m.raw, m.qtype, m.od, m.id, x_in, out, config=config, residual=residual, stream=self.stream)

    def _qkv_matvecs(self, qkv: tuple, hq) -> None:
        """Enqueue a layer's q/k/v mat-vecs (`_qkv`'s entries, biases fused); with FUSE_QKV_MIXED the two entries
        FUSE_QKV leaves where q/k/v have two formats (q|k and v) run as one launch (`kernels.gemv.gemv_pair`: the
        same kernels' code, each its own CUDA blocks) when they take the same input and their kernels can share a
        launch (`kernels.gemv.pair_refusal`), else one each."""
        from kernels.gemv import gemv_pair, pair_refusal

        if self.fuse_qkv_mixed and self.fuse_add and len(qkv) == 2:
            calls = []
            for m, out, bias in qkv:
                x_in, config = self._input(m, self._h1, hq, wide=True, residual=bias is not None)
                calls.append(((m.raw, m.qtype, m.od, m.id, out, bias, config), x_in))
            (a, xa), (b, xb) = calls
            if xa is xb and pair_refusal(a[-1], b[-1]) is None:
                gemv_pair(a, b, xa, stream=self.stream)
                return
        for m, out, bias in qkv:
            self._matvec(m, self._h1, out, residual=bias, xq=hq)

    def _matvec_glu(self, gate: GemvOperand, up: GemvOperand, x, out, xq=None) -> None:
        """out = silu(Wgate·x) * (Wup·x) in one kernel (gate and up of one format; MMVQ with ``xq``). Launch shape:
        the general MMVQ / f32 one (RPB=4 or 2, WPR=2), not the one-warp-per-8-rows shape (16 accumulators per lane
        with two weights, too many registers for that shape)."""
        from kernels.gemv import gemv_glu

        x_in, config = self._input(gate, x, xq, wide=False, glu=True)
        gemv_glu(gate.raw, up.raw, gate.qtype, gate.od, gate.id, x_in, out, config=config, stream=self.stream)

    def _enqueue(self) -> None:
        """Enqueue one decode step (reads and advances `state`; see the module docstring). No allocation, no sync."""
        from kernels.activation import swiglu
        from kernels.argmax import argmax
        from kernels.attention_decode import decode_attention
        from kernels.decode_state import advance
        from kernels.embedding import embedding
        from kernels.kv_cache import kv_append
        from kernels.rope import rope, rope_angles

        c, s, p = self.config, self.stream, self.pdl
        mark = self._mark
        if self.timeline is not None:
            self.timeline.begin()
        embedding(*self.embedding, c.vocab, c.hidden, self.ids, out=self.x, stream=s)
        if self._angles is not None:
            rope_angles(self.pos, c.rope_base, c.head_dim, factors=self.rope_factors, out=self._angles, stream=s)
        mark("embedding")
        for layer in self.layers:
            hq = self._norm(layer.attn_norm)
            mark("attn_norm")
            self._qkv_matvecs(layer.qkv, hq)
            mark("qkv")
            if self.fuse_rope_kv:  # with angles the fused kernel also writes q16 (rope's angles need q_out there)
                rope(self._q_rope, self._k_rope, self.pos, c.rope_base, c.rope_style, stream=s, pdl=p,
                     factors=self.rope_factors, kv_cache=(self._v_rope, layer.k_cache, layer.v_cache),
                     angles=self._angles, q_out=None if self._angles is None else self.q16)
            else:
                rope(self._q_rope, self._k_rope, self.pos, c.rope_base, c.rope_style, stream=s, pdl=p,
                     factors=self.rope_factors, angles=self._angles)
                kv_append(self._qkv2, self.pos, layer.k_cache, layer.v_cache, c.q_dim, q_out=self.q16, stream=s,
                          pdl=p)
            mark("rope_kv")
            fused_q8 = self._q8_attn if self.fuse_attn_q8 else None
            decode_attention(self._q_heads, layer.k_heads, layer.v_heads, self.length, out=self.attn,
                             splits=self.splits, workspace=self.attn_workspace, stream=s, pdl=p, q8=fused_q8)
            mark("attention")
            aq = fused_q8 if fused_q8 is not None else self._quantize(self._attn1, self._q8_attn)
            self._matvec(layer.attn_output, self._attn1, self._x1, residual=self._x1, xq=aq)
            mark("attn_output")
            hq = self._norm(layer.ffn_norm)
            mark("ffn_norm")
            if self.fuse_glu and layer.gate.qtype == layer.up.qtype:
                self._matvec_glu(layer.gate, layer.up, self._h1, self._act1, xq=hq)
            else:
                self._matvec(layer.gate, self._h1, self._gate_out, xq=hq)
                self._matvec(layer.up, self._h1, self._up_out, xq=hq)
                swiglu(self._gu2, out=self.act, stream=s)
            mark("ffn_gate_up")
            self._matvec(layer.down, self._act1, self._x1, residual=self._x1, xq=self._quantize(self._act1, self._q8_ffn))
            mark("ffn_down")
        self._matvec(self.output, self._h1, self.logits, xq=self._norm(self.output_norm))
        mark("output")
        argmax(self.logits, out=self.ids, blocks=self.argmax_blocks, workspace=self.argmax_workspace, stream=s)
        advance(self.state, self.history, stream=s)
        mark("sample")

    def _mark(self, stage: str) -> None:
        if self.timeline is not None:
            self.timeline.mark(stage)

    # -- public API -----------------------------------------------------------------------------------------------
    def start(self, token: int, position: int = 0) -> None:
        """Set the next step's input: ``token`` at ``position`` (attending to cache rows 0..position). Enqueued on
        the engine's stream. Position 0 is llama-bench's tg (an empty cache); after a prefill of n tokens on the
        shared prefill engine, continue with the token chosen from its logits at position n."""
        from kernels.decode_state import ID, LENGTH, POS, STATE_SIZE

        c = self.config
        if not 0 <= int(token) < c.vocab:
            raise ModelError(f"token {token} is outside the vocabulary [0, {c.vocab})")
        if not 0 <= int(position) < self.context:
            raise ModelError(f"position {position} is outside the KV cache (context {self.context})")
        host = np.zeros(STATE_SIZE, dtype=np.int32)
        host[ID], host[POS], host[LENGTH] = int(token), int(position), int(position) + 1
        self.state.copy_to_device(host, stream=self.stream)
        self.position = int(position)

    def _check_room(self, n: int) -> int:
        if self.position is None:
            raise ModelError("call start(token, position) before decoding")
        if n < 0 or self.position + n > self.context:
            raise ModelError(f"{n} decode steps from position {self.position} do not fit the KV cache "
                             f"(context {self.context})")
        return self.position

    def step(self):
        """Enqueue one eager decode step (whatever ``graphs`` says) and return the logits buffer (f32 device
        array [vocab]) it writes; the caller synchronises the stream. The chosen token is in ``history``."""
        self._check_room(1)
        self._enqueue()
        self.position += 1
        return self.logits

    def prepare(self) -> None:
        """With graphs: run one eager step (compiles every kernel and sets any launch attribute), restore the
        state it advanced, then capture one step into a CUDA graph. Idempotent; `generate` calls it. Needs a
        state set by `start` (the warm-up writes the KV row at that position, which the first replayed step
        rewrites with the same values)."""
        if self._prepared:
            return
        self._check_room(1)
        if self.graphs:
            s = self.stream
            self._saved.copy_to_device(self.state, stream=s)
            self._enqueue()
            self.state.copy_to_device(self._saved, stream=s)
            s.synchronize()
            self._capture()
        self._prepared = True

    def _capture(self) -> None:
        from minfer_cli.measure.graph import StreamGraph

        self._graph = StreamGraph(self.stream, self._enqueue)

    def generate(self, n: int) -> list[int]:
        """Run n decode steps from the state `start` set (graph replays, or eager steps without graphs),
        synchronise, and return the n tokens chosen (greedy), copied back in one transfer."""
        p0 = self._check_room(int(n))
        if n == 0:
            return []
        self.prepare()
        if self.graphs:
            self._graph.launch(times=n)
            self.position += n
        else:
            for _ in range(n):
                self.step()
        tokens = self.history[p0: p0 + n].copy_to_host(stream=self.stream)
        self.stream.synchronize()
        return [int(t) for t in tokens]

    def breakdown(self, token: int, position: int, n: int) -> list[tuple[str, float, float]]:
        """(stage, mean GPU µs a token, intervals a token) of n steps from ``token`` at ``position``, from CUDA
        events between the step's stages (captured into the graph with GRAPHS=1), one step a synchronised
        generation. The graph is dropped before and after (the timed one must not carry events). The events keep
        programmatic dependent launches from overlapping across stages, so the stages sum to more than a timed
        step."""
        from minfer_cli.measure.timeline import Timeline, mean_stage_times

        self.close()
        self.timeline = Timeline(self.stream)
        try:
            self.start(token, position)
            self.prepare()
            runs = []
            for _ in range(n):
                self.generate(1)  # synchronises
                runs.append(self.timeline.stage_times())
            return mean_stage_times(runs)
        finally:
            self.timeline = None
            self.close()

    def close(self) -> None:
        """Destroy the captured graph (the buffers go with the engine)."""
        if self._graph is not None:
            self._graph.close()
            self._graph = None
            self._prepared = False

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
