"""The prefill forward of a llama/qwen2 model on minfer's own kernels.

One pass over nt prompt tokens (llama-bench's pp test: an empty cache, positions 0..nt-1), all on one stream:

    x = embedding(ids)                                               f32 [nt, hidden]   (residual stream)
    per layer:  h = rms_norm(x, attn_norm)                           f16 [nt, hidden]
                qkv = h · Wqkv^T (+ bias)                            f32 [nt, q_dim + 2 kv_dim]   (fused q|k|v)
                rope(q, k at positions pos)                           in place
                q16, K/V cache rows = kv_append(qkv, pos)            f16
                a = flash_attention(q16, K[:L], V[:L], causal)       f16 [nt, q_dim]
                x += a · Wo^T
                h = rms_norm(x, ffn_norm);  gu = h · Wgate_up^T       f32 [nt, 2 ffn]   (fused gate|up)
                x += swiglu(gu) · Wdown^T
    logits = rms_norm(x[nt-1], output_norm) · Woutput^T               f32 [vocab] (last token only, as llama-bench)

Knob PNORM_WIDE: the RMSNorms of short prompts (and the last token's) with up to 1024 threads a row.
Knob PHEAD: the last token's logits from the f16 GEMM on an f16 copy of the output weight (gemm) or from the
decode's f32-input mat-vec on the quantized weight (gemv: no f16 copy made, ~2.4-3.6x fewer bytes read for one row).
Knob PFUSE_ROPE_KV: RoPE and the KV append as one kernel (`kernels.rope.rope` with kv_cache and q_out), which also
writes the rotated q as f16 for attention (decode's FUSE_ROPE_KV, plus q) and adds the q|k|v bias (no bias kernel).
Knob FUSE_ADD_NORM: ``x += a · Wo^T; h = rms_norm(x, ffn_norm)`` (and ``x += act · Wdown^T`` with the next layer's
attn_norm) as the GEMM and one `kernels.norm.add_rms_norm` kernel, which also sums the GEMM's split-K slices.
Knob PROPE_ANGLES: every token's RoPE (cos, sin) computed once before the layers (`kernels.rope.rope_angles`) and
read by each layer's RoPE kernel, instead of each layer's kernel computing them (float64 angles) again.
Knob PFUSE_GLU: ``act = silu(h · Wgate^T) * (h · Wup^T)`` as one `kernels.gemm_f16.gemm_f16_glu` (the SwiGLU in the
GEMM's epilogue; no f32 [nt, 2 ffn] product in memory) instead of `kernels.gemm_f16` and `kernels.activation.swiglu`
(within one f16 ulp of act: NOCALL=1's epilogue divides with div.approx; the same bits with NOCALL=0); a gate|up
that PFUSED multiplies from its bytes, as `kernels.gemm_fused_regs.gemm_fused_regs_glu`. Those two run where the
GEMM knobs or ffn leave no SwiGLU epilogue (`uses_glu`, `uses_fused_glu`).
Knob PFUSE_RESID: ``x += a · Wo^T`` and ``x += act · Wdown^T`` by the GEMM itself (`kernels.gemm_f16.gemm_f16` /
`kernels.gemm_fused_regs.gemm_fused_regs` with ``accumulate``: the residual epilogue) instead of the product into a
buffer and `kernels.residual.residual_add` (the same numbers); not with FUSE_ADD_NORM, whose norm kernel adds
(`uses_resid`).
Matrix products are `kernels.quant.dequantize` (GGUF blocks -> f16) followed by `kernels.gemm_f16`. Knob W16: keep a
persistent f16 copy of every weight, made once at start-up (memory permitting), instead of dequantizing before every
product into one scratch buffer. Knob PGRAPH: the first prefill of each (prompt length, start position) runs eagerly
and is then captured into a CUDA graph, which every later prefill of that length replays: one host call instead of
~11 kernel launches a layer, each costing tens of µs of Python and driver time. Nothing a prefill reads comes from
the host (the token ids are copied device to device into the engine's own buffer; the positions are a view of one
``0..context-1`` array made at construction), so a replay is the same work. Source of the architecture: llama.cpp's
llm_build_llama / llm_build_qwen2 (pre-norm, SwiGLU, RoPE NEOX for qwen2 and NORMAL for llama, GQA).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Optional

import numpy as np

from minfer_cli.engine.config import ModelConfig, TensorSpec
from minfer_cli.engine.options import PrefillOptions
from minfer_cli.engine.weights import ModelWeights

Progress = Optional[Callable[[str, float], None]]


@dataclass
class _Matrix:
    """A weight as the GEMM sees it: GGUF tensors stacked along od (q|k|v, gate|up), f16 [od, id] when built;
    ``fused``: the format `kernels.gemm_fused_regs` multiplies it in straight from its quantized bytes (PFUSED), or
    None."""

    parts: list
    od: int
    id: int
    f16: object = None
    fused: Optional[str] = None


@dataclass
class _Layer:
    attn_norm: object
    ffn_norm: object
    qkv: _Matrix
    qkv_bias: object
    attn_output: _Matrix
    gate_up: _Matrix
    down: _Matrix
    k_cache: object = None
    v_cache: object = None


def _f32(weights: ModelWeights, name: str):
    spec = weights.spec(name)
    if spec.qtype != "F32":
        from minfer_cli.engine.errors import ModelError

        raise ModelError(f"tensor {name} is {spec.qtype}; minfer expects F32 norms and biases")
    return weights.device(name).view(np.float32)


class PrefillEngine:
    """Buffers and weights for prompts of up to ``max_tokens`` tokens (and a KV cache of ``context`` rows).

    Construction does every allocation and, with W16, every dequantization: nothing is allocated in `prefill`.
    Raises ModelError for a model the kernels cannot run (a tensor type the dequant kernels do not cover, stacked
    tensors of different input dims; a head_dim the attention kernels do not run is refused by the config). Callers check
    the memory plan first (`device_bytes`, `minfer_cli.engine.bench.check_fits`).
    """

    def __init__(self, weights: ModelWeights, max_tokens: int, options: PrefillOptions = PrefillOptions(),
                 context: Optional[int] = None, stream=None, progress: Progress = None):
        from numba import cuda

        from kernels.ptx import SIMULATOR
        from kernels.quant import SUPPORTED
        from minfer_cli.engine.errors import ModelError

        if options.pgraph and SIMULATOR:
            raise ModelError("PGRAPH=1 captures the prefill into CUDA graphs, which the CUDA simulator cannot; "
                             "use PGRAPH=0 (PrefillOptions(pgraph=False)) there")
        c: ModelConfig = weights.config
        self.config, self.weights, self.options = c, weights, options
        self.max_tokens = int(max_tokens)
        self.context = int(context or max_tokens)
        self.stream = stream if stream is not None else cuda.stream()
        self.timeline = None  # a Timeline while `breakdown` runs
        self.rope_factors = weights.rope_factors()
        self.embedding = weights.embedding_table()  # (raw, qtype): token_embd, or its f32 copy for other types
        for name, (spec, _) in weights.tensors.items():
            if spec.qtype not in SUPPORTED:
                raise ModelError(f"tensor {name} has type {spec.qtype}; supported types: {', '.join(SUPPORTED)}")
        self.layers: list[_Layer] = []
        parts = gemm_weight_parts(c)
        for i in range(c.n_layers):
            b = f"blk.{i}."
            bias = None
            if c.qkv_bias:
                bias = cuda.to_device(np.concatenate([
                    weights.device(b + p + ".bias").copy_to_host().view(np.float32) for p in ("attn_q", "attn_k", "attn_v")
                ]))
            qkv, attn_output, gate_up, down = parts[4 * i: 4 * i + 4]
            self.layers.append(_Layer(
                attn_norm=_f32(weights, b + "attn_norm.weight"),
                ffn_norm=_f32(weights, b + "ffn_norm.weight"),
                qkv=self._matrix(qkv),
                qkv_bias=bias,
                attn_output=self._matrix(attn_output),
                gate_up=self._matrix(gate_up),
                down=self._matrix(down),
            ))
        self.output_norm = _f32(weights, "output_norm.weight")
        self.output = self._matrix(parts[-1])
        if options.head not in ("gemm", "gemv"):
            raise ModelError(f"prefill head {options.head!r}: must be 'gemm' or 'gemv' (PHEAD)")
        if options.head == "gemv":
            from kernels.gemv import GEMV_TYPES

            head_type = weights.spec(self.output.parts[0]).qtype
            if head_type not in GEMV_TYPES:
                raise ModelError(f"PHEAD=gemv: the output weight {self.output.parts[0]} is {head_type}, which the "
                                 f"mat-vec does not read ({', '.join(GEMV_TYPES)}); use PHEAD=gemm")
        matrices = [m for layer in self.layers for m in (layer.qkv, layer.attn_output, layer.gate_up, layer.down)]
        if options.head == "gemm":  # PHEAD=gemv multiplies the quantized output weight: no f16 copy of it
            matrices.append(self.output)
        s = self.stream
        if options.fused:
            for m in matrices:
                m.fused = fused_format([(weights.spec(n).qtype, weights.spec(n).od) for n in m.parts])
        copied = [m for m in matrices if m.fused is None]  # the matrices the f16 GEMM multiplies
        self.scratch = None
        if options.w16:
            for n, m in enumerate(copied):
                if progress:
                    progress("f16 weights (W16=1)", n / len(copied))
                m.f16 = cuda.device_array((m.od, m.id), dtype=np.float16, stream=s)
                self._dequantize(m, m.f16)
        elif copied:
            largest = max(copied, key=lambda m: m.od * m.id)
            self.scratch = cuda.device_array(largest.od * largest.id, dtype=np.float16, stream=s)
        width = c.q_dim + 2 * c.kv_dim
        nt = self.max_tokens
        for layer in self.layers:
            layer.k_cache = cuda.device_array((self.context, c.kv_dim), dtype=np.float16, stream=s)
            layer.v_cache = cuda.device_array((self.context, c.kv_dim), dtype=np.float16, stream=s)
        self.x = cuda.device_array((nt, c.hidden), dtype=np.float32, stream=s)
        self.h = cuda.device_array((nt, c.hidden), dtype=np.float16, stream=s)
        self.qkv = cuda.device_array((nt, width), dtype=np.float32, stream=s)
        self.q16 = cuda.device_array((nt, c.q_dim), dtype=np.float16, stream=s)
        self.attn = cuda.device_array((nt, c.q_dim), dtype=np.float16, stream=s)
        self.proj = cuda.device_array((nt, c.hidden), dtype=np.float32, stream=s)
        glu, fused_glu = uses_glu(c, options), uses_fused_glu(c, options)
        self.glu = [fused_glu if layer.gate_up.fused is not None else glu for layer in self.layers]
        self.resid = uses_resid(options)
        self.gu = None if all(self.glu) else cuda.device_array((nt, 2 * c.ffn), dtype=np.float32, stream=s)
        self.act = cuda.device_array((nt, c.ffn), dtype=np.float16, stream=s)
        self.last = cuda.device_array((1, c.hidden), dtype=np.float16 if options.head == "gemm" else np.float32,
                                      stream=s)
        self.logits = cuda.device_array((1, c.vocab), dtype=np.float32, stream=s)
        self.ids = cuda.device_array(nt, dtype=np.int32, stream=s)
        self.angles = (cuda.device_array((nt, c.head_dim // 2, 2), dtype=np.float32, stream=s)
                       if options.rope_angles else None)
        self.partials = None  # split-K partial tiles (gemm SPLITK), sized for every product of every prompt
        capacity = prefill_partials_capacity(self.options.gemm, nt, max(m.od for m in matrices),
                                             options.fused_gemm)
        if capacity:
            self.partials = cuda.device_array(capacity, dtype=np.float32, stream=s)
        self.positions = cuda.to_device(np.arange(self.context, dtype=np.int32), stream=s)
        self._graphs: dict = {}  # (nt, start) -> StreamGraph
        self.capture_seconds: dict = {}  # (nt, start) -> wall seconds of its capture + instantiation
        s.synchronize()
        if progress:
            progress("f16 weights (W16=1)" if options.w16 else "buffers", 1.0)

    # -- weights ---------------------------------------------------------------------------------------------------
    def _matrix(self, names: list) -> _Matrix:
        specs = [self.weights.spec(n) for n in names]
        if len({s.id for s in specs}) != 1:
            from minfer_cli.engine.errors import ModelError

            raise ModelError(f"tensors {', '.join(names)} differ in input dim ({[s.id for s in specs]}); they must match")
        return _Matrix(parts=names, od=sum(s.od for s in specs), id=specs[0].id)

    def _segments(self, m: _Matrix) -> list:
        return [(self.weights.device(n), self.weights.spec(n).od) for n in m.parts]

    def _dequantize(self, m: _Matrix, out) -> None:
        from kernels.quant import dequantize

        row = 0
        for name in m.parts:
            spec = self.weights.spec(name)
            dequantize(self.weights.device(name), spec.qtype, spec.od, spec.id, out=out[row:row + spec.od],
                       stream=self.stream)
            row += spec.od

    def _weight_f16(self, m: _Matrix):
        if m.f16 is not None:
            return m.f16
        out = self.scratch[: m.od * m.id].reshape(m.od, m.id)
        self._dequantize(m, out)
        return out

    def _gemm(self, a, m: _Matrix, out, accumulate: bool = False) -> None:
        """out = a · W^T, or out += a · W^T with ``accumulate`` (PFUSE_RESID)."""
        if m.fused is not None:
            from kernels.gemm_fused_regs import gemm_fused_regs

            gemm_fused_regs(a, self._segments(m), m.fused, out, config=self.options.fused_gemm, stream=self.stream,
                            partials=self.partials, accumulate=accumulate)
            return
        from kernels.gemm_f16 import gemm_f16

        gemm_f16(a, self._weight_f16(m), out, config=self.options.gemm, stream=self.stream, partials=self.partials,
                 accumulate=accumulate)

    def _gemm_glu(self, a, m: _Matrix, out) -> None:
        if m.fused is not None:
            from kernels.gemm_fused_regs import gemm_fused_regs_glu

            gemm_fused_regs_glu(a, self._segments(m), m.fused, out, config=self.options.fused_gemm, stream=self.stream,
                                partials=self.partials)
            return
        from kernels.gemm_f16 import gemm_f16_glu

        gemm_f16_glu(a, self._weight_f16(m), out, config=self.options.gemm, stream=self.stream,
                     partials=self.partials)

    def _gemm_parts(self, a, m: _Matrix):
        """a · W^T as (parts, count): C, or its split-K slices left unsummed (`kernels.gemm_f16.gemm_f16_split`,
        into ``proj`` or the partials buffer), for `kernels.norm.add_rms_norm` (FUSE_ADD_NORM)."""
        if m.fused is not None:
            from kernels.gemm_fused_regs import gemm_fused_regs_split

            return gemm_fused_regs_split(a, self._segments(m), m.fused, self.proj[: a.shape[0]],
                                         config=self.options.fused_gemm, stream=self.stream, partials=self.partials)
        from kernels.gemm_f16 import gemm_f16_split

        return gemm_f16_split(a, self._weight_f16(m), self.proj[: a.shape[0]], config=self.options.gemm,
                              stream=self.stream, partials=self.partials)

    # -- the forward ---------------------------------------------------------------------------------------------
    def prefill(self, ids, start: int = 0, taps: Optional[list] = None):
        """Enqueue the prefill of ``ids`` (int32 device array [nt], nt <= max_tokens) at positions start..start+nt-1
        and return the last token's logits (f32 device array [1, vocab]); the caller synchronises the stream.
        ``taps`` (a list; `minfer model check`): the residual stream after the embedding and after each layer is
        appended to it as a host f32 array [nt, hidden] (each copy waits for the stream: never in a timed run;
        always eager). With ``options.pgraph`` the first call of a (nt, start) runs eagerly and captures a graph
        (its wall time in ``capture_seconds``); later calls replay it.

        Raises ModelError when nt is 0 or exceeds max_tokens, or the positions exceed the cache's context.
        """
        from minfer_cli.engine.errors import ModelError

        nt = int(ids.shape[0])
        if not 0 < nt <= self.max_tokens or start + nt > self.context:
            raise ModelError(f"prefill of {nt} tokens at position {start} does not fit this engine "
                             f"(max {self.max_tokens} tokens per call, context {self.context})")
        if not self.options.pgraph or taps is not None:
            return self._forward(ids, start, taps)
        own = self.ids[:nt]
        if ids.device_ctypes_pointer.value != own.device_ctypes_pointer.value:
            own.copy_to_device(ids, stream=self.stream)
        key = (nt, int(start))
        graph = self._graphs.get(key)
        if graph is None:
            self._forward(own, start)  # compiles every kernel and sets launch attributes outside the capture
            self._capture(key, own, start)
            return self.logits
        graph.launch()
        return self.logits

    def fill(self, tokens) -> None:
        """Write K/V cache rows 0..d-1 from an eager prefill of ``tokens`` (int32 host array [d], 0 < d <
        context), in chunks of at most ``max_tokens``; waits for the stream. The set-up of a test at depth d
        (llama-bench's ``-d``): never timed, no graph captured.

        Raises ModelError when d leaves no cache row after it."""
        from minfer_cli.engine.errors import ModelError

        tokens = np.ascontiguousarray(tokens, dtype=np.int32).reshape(-1)
        d = int(tokens.size)
        if not 0 < d < self.context:
            raise ModelError(f"a depth of {d} tokens does not fit this engine's KV cache (context {self.context}) "
                             f"with a token after it")
        for start in range(0, d, self.max_tokens):
            chunk = tokens[start: start + self.max_tokens]
            own = self.ids[: chunk.size]
            own.copy_to_device(chunk, stream=self.stream)
            self._forward(own, start)
        self.stream.synchronize()

    def breakdown(self, ids, start: int, reps: int) -> list[tuple[str, float, float]]:
        """(stage, mean GPU µs a prefill, intervals a prefill) of ``reps`` prefills of ``ids`` at ``start``, from
        CUDA events between the forward's stages (embedding; per layer attn_norm, qkv, rope_kv, attention,
        attn_output, ffn_norm, ffn_gate_up, ffn_down; output; with FUSE_ADD_NORM the residual adds run in ffn_norm
        and ffn_down, and ffn_down holds the next layer's attn_norm), captured into the graph with PGRAPH=1. The engine's
        graphs are dropped before and after (the timed ones must not carry events). Waits for the stream."""
        from minfer_cli.measure.timeline import Timeline, mean_stage_times

        self.close()
        self.timeline = Timeline(self.stream)
        try:
            self.prefill(ids, start)  # PGRAPH=1: the eager run and the capture, with the events
            self.stream.synchronize()
            runs = []
            for _ in range(reps):
                self.prefill(ids, start)
                self.stream.synchronize()
                runs.append(self.timeline.stage_times())
            return mean_stage_times(runs)
        finally:
            self.timeline = None
            self.close()

    def _mark(self, stage: str) -> None:
        if self.timeline is not None:
            self.timeline.mark(stage)

    def _capture(self, key, ids, start: int) -> None:
        import time

        from minfer_cli.measure.graph import StreamGraph

        t0 = time.perf_counter()
        self._graphs[key] = StreamGraph(self.stream, lambda: self._forward(ids, start))
        self.capture_seconds[key] = time.perf_counter() - t0

    def close(self) -> None:
        """Destroy the captured prefill graphs (the buffers go with the engine)."""
        for graph in self._graphs.values():
            graph.close()
        self._graphs.clear()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def _forward(self, ids, start: int = 0, taps: Optional[list] = None):
        from kernels.activation import swiglu
        from kernels.attention import flash_attention
        from kernels.embedding import embedding
        from kernels.kv_cache import kv_append
        from kernels.norm import DEFAULT_TPB, add_rms_norm, rms_norm, row_tpb, rows_tpb
        from kernels.residual import bias_add, residual_add
        from kernels.rope import rope, rope_angles
        from kernels.views import head_slice

        c, s = self.config, self.stream
        nt = int(ids.shape[0])
        pos = self.positions[start: start + nt]
        x, h, qkv, q16, attn = self.x[:nt], self.h[:nt], self.qkv[:nt], self.q16[:nt], self.attn[:nt]
        proj, act = self.proj[:nt], self.act[:nt]
        gu = None if self.gu is None else self.gu[:nt]
        mark = self._mark
        if self.timeline is not None:
            self.timeline.begin()
        embedding(*self.embedding, c.vocab, c.hidden, ids, out=x, stream=s)
        mark("embedding")
        if taps is not None:
            taps.append(x.copy_to_host(stream=s))
        heads = c.n_heads + 2 * c.n_kv_heads
        length = start + nt
        angles = None
        if self.angles is not None:  # PROPE_ANGLES: every layer rotates the same positions
            angles = rope_angles(pos, c.rope_base, c.head_dim, factors=self.rope_factors, out=self.angles[:nt],
                                 stream=s)
        fuse = self.options.fuse_add_norm
        tpb = rows_tpb(nt, c.hidden) if self.options.norm_wide else DEFAULT_TPB
        # FUSE_ADD_NORM's kernel loads the split-K slices, x and w for each element: with PNORM_WIDE its rows take
        # row_tpb threads at every length (at DEFAULT_TPB a 3584-wide row is 14 rounds of dependent loads a thread)
        add_tpb = row_tpb(c.hidden) if self.options.norm_wide else DEFAULT_TPB
        for i, layer in enumerate(self.layers):
            following = self.layers[i + 1] if i + 1 < len(self.layers) else None
            if i == 0 or not fuse:  # FUSE_ADD_NORM: the previous layer's ffn_down stage made h
                rms_norm(x, layer.attn_norm, c.rms_eps, out=h, stream=s, tpb=tpb)
            mark("attn_norm")
            self._gemm(h, layer.qkv, qkv)
            if layer.qkv_bias is not None and not self.options.fuse_rope_kv:  # PFUSE_ROPE_KV's RoPE adds it
                bias_add(qkv, layer.qkv_bias, out=qkv, stream=s)
            mark("qkv")
            view = qkv.reshape(nt, heads, c.head_dim)
            q_heads, k_heads = head_slice(view, 0, c.n_heads), head_slice(view, c.n_heads, c.n_heads + c.n_kv_heads)
            if self.options.fuse_rope_kv:  # one kernel writes the rotated q16 and the cache rows
                rope(q_heads, k_heads, pos, c.rope_base, c.rope_style, stream=s, factors=self.rope_factors,
                     kv_cache=(head_slice(view, c.n_heads + c.n_kv_heads, heads), layer.k_cache, layer.v_cache),
                     q_out=q16, angles=angles, bias=layer.qkv_bias)
            else:
                rope(q_heads, k_heads, pos, c.rope_base, c.rope_style, stream=s, factors=self.rope_factors,
                     angles=angles)
                kv_append(qkv, pos, layer.k_cache, layer.v_cache, c.q_dim, q_out=q16, stream=s)
            mark("rope_kv")
            flash_attention(
                q16.reshape(nt, c.n_heads, c.head_dim),
                layer.k_cache[:length].reshape(length, c.n_kv_heads, c.head_dim),
                layer.v_cache[:length].reshape(length, c.n_kv_heads, c.head_dim),
                out=attn.reshape(nt, c.n_heads, c.head_dim), causal=True, config=self.options.attention, stream=s,
            )
            mark("attention")
            if fuse:  # the residual add (and slice sum) runs in the ffn_norm stage's kernel
                parts, count = self._gemm_parts(attn, layer.attn_output)
                mark("attn_output")
                add_rms_norm(x, parts, count, layer.ffn_norm, c.rms_eps, out=h, stream=s, tpb=add_tpb)
            else:
                if self.resid:  # PFUSE_RESID: x += attn · Wo^T in the GEMM's epilogue
                    self._gemm(attn, layer.attn_output, x, accumulate=True)
                else:
                    self._gemm(attn, layer.attn_output, proj)
                    residual_add(x, proj, stream=s)
                mark("attn_output")
                rms_norm(x, layer.ffn_norm, c.rms_eps, out=h, stream=s, tpb=tpb)
            mark("ffn_norm")
            if self.glu[i]:
                self._gemm_glu(h, layer.gate_up, act)
            else:
                self._gemm(h, layer.gate_up, gu)
                swiglu(gu, out=act, stream=s)
            mark("ffn_gate_up")
            if fuse and following is not None:  # the add and the next layer's attn_norm, in this stage
                parts, count = self._gemm_parts(act, layer.down)
                add_rms_norm(x, parts, count, following.attn_norm, c.rms_eps, out=h, stream=s, tpb=add_tpb)
            elif self.resid:
                self._gemm(act, layer.down, x, accumulate=True)
            else:
                self._gemm(act, layer.down, proj)
                residual_add(x, proj, stream=s)
            mark("ffn_down")
            if taps is not None:
                taps.append(x.copy_to_host(stream=s))
        rms_norm(x[nt - 1: nt], self.output_norm, c.rms_eps, out=self.last, stream=s,
                 tpb=rows_tpb(1, c.hidden) if self.options.norm_wide else DEFAULT_TPB)
        if self.options.head == "gemm":
            self._gemm(self.last, self.output, self.logits)
        else:  # PHEAD=gemv: the decode's f32-input mat-vec on the quantized weight
            from kernels.gemv import gemv_q

            name = self.output.parts[0]
            gemv_q(self.weights.device(name), self.weights.spec(name).qtype, c.vocab, c.hidden,
                   self.last.reshape(c.hidden), self.logits.reshape(c.vocab), stream=s)
        mark("output")
        return self.logits


def uses_glu(c: ModelConfig, options: PrefillOptions) -> bool:
    """Whether PFUSE_GLU's `kernels.gemm_f16.gemm_f16_glu` runs ``c``'s gate|up products with ``options``: PFUSE_GLU
    on and the GEMM knobs and ffn what that kernel takes (`kernels.gemm_f16.glu_refusal`); else (and for a gate|up
    that PFUSED multiplies from its quantized bytes: `uses_fused_glu`) the product and `kernels.activation.swiglu`
    run apart."""
    from kernels.gemm_f16 import glu_refusal

    return options.fuse_glu and glu_refusal(options.gemm, 2 * c.ffn) is None


def uses_fused_glu(c: ModelConfig, options: PrefillOptions) -> bool:
    """Whether a gate|up that PFUSED multiplies from its quantized bytes takes the SwiGLU into its GEMM
    (`kernels.gemm_fused_regs.gemm_fused_regs_glu`): PFUSED and PFUSE_GLU on and a ffn it takes
    (`kernels.gemm_fused_regs.glu_refusal`)."""
    from kernels.gemm_fused_regs import glu_refusal

    return options.fused and options.fuse_glu and glu_refusal(2 * c.ffn) is None


def uses_resid(options: PrefillOptions) -> bool:
    """Whether PFUSE_RESID's residual epilogue adds the attention output's and the FFN's products to the residual
    stream with ``options``: PFUSE_RESID on, FUSE_ADD_NORM off (its norm kernel adds them) and GEMM knobs whose
    kernels have the epilogue (`kernels.gemm_f16_config.accumulate_refusal`: STAGING=tma); else a buffer and
    `kernels.residual.residual_add`."""
    from kernels.gemm_f16_config import accumulate_refusal

    return options.fuse_resid and not options.fuse_add_norm and accumulate_refusal(options.gemm or {}) is None


def gemm_weight_shapes(c: ModelConfig) -> list[tuple[int, int]]:
    """(od, id) of every matrix the prefill multiplies by: per layer q|k|v, attn_output, gate|up, down; output."""
    per_layer = [(c.q_dim + 2 * c.kv_dim, c.hidden), (c.hidden, c.q_dim), (2 * c.ffn, c.hidden), (c.hidden, c.ffn)]
    return per_layer * c.n_layers + [(c.vocab, c.hidden)]


def gemm_weight_parts(c: ModelConfig) -> list[list[str]]:
    """The GGUF tensors stacked along od into each matrix of `gemm_weight_shapes` (same order): per layer
    [attn_q, attn_k, attn_v], [attn_output], [ffn_gate, ffn_up], [ffn_down]; then the output (token_embd if tied)."""
    parts = []
    for i in range(c.n_layers):
        b = f"blk.{i}."
        parts += [[b + "attn_q.weight", b + "attn_k.weight", b + "attn_v.weight"], [b + "attn_output.weight"],
                  [b + "ffn_gate.weight", b + "ffn_up.weight"], [b + "ffn_down.weight"]]
    return parts + [["token_embd.weight" if c.tied_output else "output.weight"]]


def fused_format(parts: list[tuple[str, int]]) -> Optional[str]:
    """The format `kernels.gemm_fused_regs` multiplies a matrix in under PFUSED, from the (GGUF type name, od) of its
    stacked tensors, or None (the f16 GEMM then multiplies it): every part of one format the fused kernel reads
    (`FUSED_TYPES`), at most its segment count, each later part starting on a box of rows."""
    from kernels.gemm_fused import BOX_ROWS, FUSED_TYPES, MAX_SEGMENTS

    formats = {qtype for qtype, _ in parts}
    if len(formats) != 1 or parts[0][0] not in FUSED_TYPES or len(parts) > MAX_SEGMENTS:
        return None
    if any(sum(od for _, od in parts[:i]) % BOX_ROWS for i in range(1, len(parts))):
        return None
    return parts[0][0]


def prefill_partials_capacity(gemm: Optional[dict], max_tokens: int, max_od: int,
                              fused_gemm: Optional[dict] = None) -> int:
    """f32 elements of the prefill's split-K partials buffer for gemm knobs ``gemm`` (`kernels.gemm_f16`'s
    `partials_capacity` on this device's SMs; with ``fused_gemm``, the knobs of PFUSED's kernel
    (`minfer_cli.engine.options.PrefillOptions.fused_gemm`), also `kernels.gemm_fused_regs`'s, whose tiles are 128
    weight rows whatever TM says): 0 without a split."""
    from kernels.gemm_f16_config import LAUNCH_DEFAULT

    if dict(LAUNCH_DEFAULT, **(gemm or {}))["SPLITK"] == 1:
        return 0
    from kernels.gemm_f16 import partials_capacity
    from minfer_cli.engine.gemv_policy import sm_count

    capacity = partials_capacity(gemm, max_tokens, max_od, sm_count())
    if fused_gemm is not None:
        from kernels.gemm_fused_regs import partials_capacity as regs_capacity

        capacity = max(capacity, regs_capacity(fused_gemm, max_tokens, max_od, sm_count()))
    return capacity


def kv_cache_bytes(c: ModelConfig, context: int) -> int:
    """Bytes of the f16 K and V caches of every layer over ``context`` rows."""
    return 2 * 2 * c.n_layers * context * c.kv_dim


def device_bytes(c: ModelConfig, max_tokens: int, w16: bool, context: Optional[int] = None,
                 gemm: Optional[dict] = None, glu: bool = False, fused: Optional[Mapping[str, TensorSpec]] = None,
                 fused_gemm: Optional[dict] = None) -> int:
    """Device bytes `PrefillEngine` allocates beyond the quantized weights (f16 weights or the dequant scratch, KV
    cache, activations (``glu``: every gate|up product with the SwiGLU epilogue, no f32 gate|up product),
    split-K partials for gemm knobs ``gemm``), so
    that a prompt that cannot fit is refused before anything is allocated. ``fused`` (with PFUSED): the weight
    tensors' specs by name; the matrices `fused_format` gives a format get no f16 copy or scratch (without PFUSED
    every matrix is copied or dequantized into the scratch); ``fused_gemm``: the knobs their kernel,
    `kernels.gemm_fused_regs`, runs with (its split-K partials)."""
    shapes = gemm_weight_shapes(c)
    max_od = max(od for od, _ in shapes)  # every product's split-K partials, fused or not
    if fused is not None:
        shapes = [shape for shape, names in zip(shapes, gemm_weight_parts(c))
                  if fused_format([(fused[n].qtype, fused[n].od) for n in names]) is None]
    copies = [od * id for od, id in shapes] or [0]
    weights = 2 * (sum(copies) if w16 else max(copies))
    kv = kv_cache_bytes(c, context or max_tokens)
    width = c.q_dim + 2 * c.kv_dim
    per_token = (4 * c.hidden + 2 * c.hidden + 4 * width + 2 * 2 * c.q_dim + 4 * c.hidden + (0 if glu else 4 * 2 * c.ffn)
                 + 2 * c.ffn + 4 * c.head_dim)  # the last: PROPE_ANGLES's (cos, sin), counted always
    partials = 4 * prefill_partials_capacity(gemm, max_tokens, max_od, fused_gemm if fused is not None else None)
    return weights + kv + max_tokens * per_token + 4 * c.vocab + partials
