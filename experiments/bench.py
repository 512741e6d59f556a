"""Experiment `bench`: the whole-model prefill (llama-bench's pp test) and token generation (tg) as A/B-able
experiments.

`minfer ab bench --arm W16=0 --arm W16=1` (pp2048) or `minfer ab bench -w tg128 --arm GRAPHS=0 --arm GRAPHS=1`
compares two engine settings at the model level through the same interleaved harness, metric tok/s (higher is
better). Knobs: the engine's (W16, PGRAPH, FUSE_ADD_NORM, PFUSE_ROPE_KV, PHEAD, the gemm_f16 tile knobs, SPLITK and
FA_* flash-attention knobs act on pp workloads; the decode knobs, `minfer_cli.engine.bench.DECODE_KNOBS` (GRAPHS,
MMVQ, XRES, the FUSE_* fusions, ROPE_ANGLES, DEEP, PDL, ATTN_SPLITS, ...), on tg workloads; an arm that sets a knob
the workload does not use is refused, so no A/B of a no-op is ever recorded). Self-timed on the wall clock (the
harness's CUDA graphs do not apply to a forward that launches hundreds of kernels from Python):

* pp<nt>: one prefill of nt random prompt tokens into an empty cache, around the synchronised forward.
* tg<n>: llama-bench's tg: n tokens generated one at a time into an empty cache from a random first token at
  position 0 (`DecodeEngine.generate`: graph replays with GRAPHS=1), JIT and graph capture done before timing.
* ``_d<depth>`` workloads (llama-bench's ``-d``): the same after ``depth`` tokens already sit in the KV cache (the
  same seeded random tokens for every arm, written by an eager prefill before timing, `PrefillEngine.fill`); pp
  prefills positions depth..depth+nt-1, tg generates from position depth on that cache
  (`minfer_cli.engine.bench`).

Check, pp: the last token's logits. For `tiny` they are compared with the independent float64 numpy forward
(`minfer_cli.engine.reference`); for the real-sized presets a float64 forward is far too slow, so they are compared with
the engine at its default knobs on the same tokens (the default engine itself is held to independent references
by the test suite). Tolerance 2e-2 (f16 weights and activations through every layer).
Check, tg: the logits of the last step, against a forward over the same token sequence (the first token and the
n-1 tokens the arm generated): `tiny` the float64 reference, the 7B preset eager decode steps with f32 mat-vec
inputs (MMVQ=0), forced along that sequence. Tolerance 1e-2 (the numerical-truth bar, which f32 and compensated
Q8_1 mat-vec inputs meet), 5e-2 for an arm with plain Q8_1 inputs (MMVQ=1, XRES=0: every mat-vec input rounded to
int8, ~0.5% per product, through every layer); greedy tokens themselves are not compared (near-ties may flip).
"""

from __future__ import annotations

import time

import numpy as np

from minfer_cli.engine.bench import (
    DECODE_KNOBS,
    REMOVED_KNOBS,
    engine_conflict,
    engine_knobs,
    engine_options,
    idle_fusions,
    idle_knobs,
)
from minfer_cli.engine.presets import DEFAULT_PRESET
from minfer_cli.experiment import Cost, Experiment, Metric, Workload, register, rel_l2

SEED = 0
_PRESET = {"pp128": DEFAULT_PRESET, "pp512": DEFAULT_PRESET, "pp2048": DEFAULT_PRESET, "tiny_pp16": "tiny",
           "tg128": DEFAULT_PRESET, "tiny_tg8": "tiny",
           "qwen2-1.5b_pp512": "qwen2-1.5b-q4_k_m", "qwen2-1.5b_pp2048": "qwen2-1.5b-q4_k_m",
           "qwen2-1.5b_tg128": "qwen2-1.5b-q4_k_m", "llama3.2-3b_pp512": "llama3.2-3b-q4_k_m",
           "tg128_d4096": DEFAULT_PRESET, "tg128_d16384": DEFAULT_PRESET, "pp512_d4096": DEFAULT_PRESET,
           "tiny_tg2_d8": "tiny"}
PP_TOLERANCE = 2e-2
TG_TOLERANCE = 1e-2
TG_TOLERANCE_PLAIN_Q8 = 5e-2


class _TgOutput:
    """A tg sample's output: the last step's logits (device, f32 [vocab]) and the n tokens generated."""

    def __init__(self, vocab: int) -> None:
        from numba import cuda

        self.logits = cuda.device_array(vocab, dtype=np.float32)
        self.tokens: list[int] | None = None


class BenchExperiment(Experiment):
    name = "bench"
    purpose = "whole-model prefill (pp) or generation (tg) of a preset, tok/s (llama-bench); every engine knob"
    knobs = engine_knobs()
    workloads = (
        Workload("pp2048", {"nt": 2048}, f"{DEFAULT_PRESET}, 2048-token prompt"),
        Workload("pp512", {"nt": 512}, f"{DEFAULT_PRESET}, 512-token prompt"),
        Workload("tiny_pp16", {"nt": 16}, "tiny preset, 16-token prompt (CUDA simulator)"),
        Workload("tg128", {"n": 128}, f"{DEFAULT_PRESET}, 128 tokens generated from an empty cache"),
        Workload("tiny_tg8", {"n": 8}, "tiny preset, 8 tokens generated (GPU tests; ~130 s a step in the simulator)"),
        Workload("pp128", {"nt": 128}, f"{DEFAULT_PRESET}, 128-token prompt"),
        Workload("qwen2-1.5b_pp512", {"nt": 512}, "qwen2-1.5b-q4_k_m, 512-token prompt"),
        Workload("qwen2-1.5b_pp2048", {"nt": 2048}, "qwen2-1.5b-q4_k_m, 2048-token prompt"),
        Workload("llama3.2-3b_pp512", {"nt": 512}, "llama3.2-3b-q4_k_m, 512-token prompt"),
        Workload("qwen2-1.5b_tg128", {"n": 128}, "qwen2-1.5b-q4_k_m, 128 tokens generated from an empty cache"),
        Workload("tg128_d4096", {"n": 128, "depth": 4096}, f"{DEFAULT_PRESET}, 128 tokens generated after 4096 cached"),
        Workload("tg128_d16384", {"n": 128, "depth": 16384}, f"{DEFAULT_PRESET}, 128 tokens generated after 16384 "
                                                              "cached"),
        Workload("pp512_d4096", {"nt": 512, "depth": 4096}, f"{DEFAULT_PRESET}, 512-token prompt after 4096 cached"),
        Workload("tiny_tg2_d8", {"n": 2, "depth": 8}, "tiny preset, 2 tokens generated after 8 cached (CUDA "
                                                      "simulator)"),
    )
    metric = Metric("throughput", "tok/s", higher_is_better=True)
    self_timed = True
    ceiling = "matrix"
    removed_knobs = REMOVED_KNOBS

    def __init__(self) -> None:
        self._weights: dict[str, object] = {}
        self._engines: dict[tuple, object] = {}
        self._fillers: dict[str, object] = {}  # tg workload with a depth -> the prefill engine holding its cache

    def _model(self, workload: Workload):
        from minfer_cli.engine.presets import preset
        from minfer_cli.engine.weights import synth_weights

        name = _PRESET[workload.name]
        if name not in self._weights:
            self._weights[name] = synth_weights(preset(name), SEED)
        return self._weights[name]

    @staticmethod
    def _is_tg(workload: Workload) -> bool:
        return "n" in workload.shape

    @staticmethod
    def _depth(workload: Workload) -> int:
        return int(workload.shape.get("depth", 0))

    def _depth_tokens(self, workload: Workload) -> np.ndarray:
        """The ``depth`` tokens in the cache before every sample of ``workload``: the same for every arm."""
        depth = self._depth(workload)
        return np.random.default_rng(SEED + depth).integers(0, self._model(workload).config.vocab, size=depth,
                                                            dtype=np.int32)

    def _filler(self, workload: Workload):
        """A tg workload's cache at its depth: one eager prefill engine per workload, shared by every arm's decode
        engine (a generation writes rows depth.. only, so the arms never disturb the depth rows)."""
        from minfer_cli.engine.bench import depth_filler

        if workload.name not in self._fillers:
            self._fillers[workload.name] = depth_filler(self._model(workload), self._depth_tokens(workload),
                                                        workload.shape["n"])
        return self._fillers[workload.name]

    def _engine(self, config, workload: Workload):
        from minfer_cli.engine.decode import DecodeEngine
        from minfer_cli.engine.forward import PrefillEngine

        key = (workload.name, tuple(sorted(config.items())))
        if key not in self._engines:
            model, options, depth = self._model(workload), engine_options(config), self._depth(workload)
            if self._is_tg(workload):
                engine = (DecodeEngine(model, options=options.decode, prefill=self._filler(workload)) if depth
                          else DecodeEngine(model, workload.shape["n"], options.decode))
            else:
                engine = PrefillEngine(model, workload.shape["nt"], options.prefill, context=depth + workload.shape["nt"])
                if depth:
                    engine.fill(self._depth_tokens(workload))
            self._engines[key] = engine
        return self._engines[key]

    def unread_knobs(self, workload: Workload) -> tuple[str, ...]:
        """A tg workload reads only the decode knobs, a pp workload every other one."""
        tg = self._is_tg(workload)
        return tuple(k.name for k in self.knobs if (k.name in DECODE_KNOBS) != tg)

    def effective(self, config, workload: Workload | None = None):
        """A prefill fusion knob at 1 that the other knobs make a no-op (PFUSE_GLU with GEMM tiles that have no
        SwiGLU epilogue, PFUSE_RESID with FUSE_ADD_NORM=1: `idle_fusions`) runs as 0."""
        return {**config, **{k: 0 for k in idle_fusions(config)}}

    def note(self, config, workload: Workload) -> str | None:
        """The prefill fusion knobs these knobs make a no-op, on a pp workload (`idle_fusions`)."""
        return None if self._is_tg(workload) else "; ".join(idle_fusions(config).values()) or None

    def refuse(self, config, workload: Workload) -> str | None:
        """An arm that moves a knob this workload never reads (its A/B would time a no-op), or GEMM knobs
        `kernels.gemm_f16` refuses."""
        tg = self._is_tg(workload)
        idle = idle_knobs(config, tg)
        both = idle_knobs(config, not tg)
        if idle and both:
            pp, dec = (idle, both) if tg else (both, idle)
            return (f"{', '.join(pp)} act(s) on pp workloads only and {', '.join(dec)} on tg workloads only: no "
                    f"workload reads both; compare them in separate A/Bs")
        if idle:
            kind, other = ("tg", "pp") if tg else ("pp", "tg")
            verb = "acts" if len(idle) == 1 else "act"
            names = ", ".join(w.name for w in self.workloads if self._is_tg(w) != tg)
            return (f"{', '.join(idle)} {verb} on {other} workloads only and {workload.name} is a {kind} workload; "
                    f"pick a {other} one with -w ({names})")
        return engine_conflict(config)

    def input_set_bytes(self, workload: Workload) -> int:
        return 4 if self._is_tg(workload) else 4 * workload.shape["nt"]

    def make_input_set(self, workload: Workload, rng):
        """pp: nt random prompt tokens on the device; tg: one random first token (a host int)."""
        from numba import cuda

        vocab = self._model(workload).config.vocab
        if self._is_tg(workload):
            return int(rng.integers(0, vocab))
        return cuda.to_device(rng.integers(0, vocab, size=workload.shape["nt"], dtype=np.int32))

    def make_output(self, workload: Workload):
        from numba import cuda

        vocab = self._model(workload).config.vocab
        return _TgOutput(vocab) if self._is_tg(workload) else cuda.device_array(vocab, dtype=np.float32)

    def prepare(self, config, workload):
        problem = self.refuse(config, workload)
        if problem:
            raise ValueError(problem)
        engine = self._engine(config, workload)
        depth = self._depth(workload)
        if self._is_tg(workload):
            return self._prepare_tg(engine, workload.shape["n"], depth)
        nt = workload.shape["nt"]

        def launch(ids, output, stream):
            t0 = time.perf_counter()
            logits = engine.prefill(ids, depth)
            output.copy_to_device(logits.reshape(logits.size), stream=engine.stream)
            engine.stream.synchronize()
            return nt / (time.perf_counter() - t0)

        return launch

    @staticmethod
    def _prepare_tg(engine, n: int, depth: int):
        def launch(token, output, stream):
            engine.start(token, depth)
            engine.stream.synchronize()
            t0 = time.perf_counter()
            tokens = engine.generate(n)  # synchronises and copies the n tokens back
            rate = n / (time.perf_counter() - t0)
            output.logits.copy_to_device(engine.logits, stream=engine.stream)
            engine.stream.synchronize()
            output.tokens = [token] + tokens
            return rate

        return launch

    def poison(self, output) -> None:
        if isinstance(output, _TgOutput):
            output.tokens = None
            output = output.logits
        output.copy_to_device(np.full(output.size, np.nan, dtype=np.float32))

    def _check_tg(self, workload, output) -> float:
        """Relative error of the last step's logits against a forward over the same tokens (see the docstring)."""
        got = output.logits.copy_to_host().astype(np.float64)
        if output.tokens is None or not np.isfinite(got).all():
            return float("inf")
        seq = output.tokens[:-1]  # the step that produced the last token read the n tokens before it
        model, depth = self._model(workload), self._depth(workload)
        if workload.name.startswith("tiny"):
            from minfer_cli.engine.reference import Reference

            full = [int(t) for t in self._depth_tokens(workload)] + list(seq)
            ref = np.asarray(Reference(model).forward(full, last_only=True)).reshape(-1)
        else:  # at a depth the exact engine shares the arm's cache rows 0..depth-1 (`_filler`)
            exact = self._engine({**self.default_config(), "GRAPHS": 0, "MMVQ": 0}, workload)
            for p, token in enumerate(seq):
                exact.start(int(token), depth + p)
                exact.step()
            ref = exact.logits.copy_to_host(stream=exact.stream).astype(np.float64)
            exact.stream.synchronize()
        return rel_l2(got, ref)

    def check(self, config, workload, inputs, output) -> float:
        if self._is_tg(workload):
            return self._check_tg(workload, output)
        got = output.copy_to_host().astype(np.float64)
        if not np.isfinite(got).all():
            return float("inf")
        if workload.name.startswith("tiny"):
            from minfer_cli.engine.reference import Reference

            full = np.concatenate([self._depth_tokens(workload), inputs.copy_to_host()])
            ref = np.asarray(Reference(self._model(workload)).forward(full, last_only=True)).reshape(-1)
        else:  # the default engine's cache holds the same depth tokens (`_depth_tokens`)
            base = self._engine(self.default_config(), workload)
            ref = base.prefill(inputs, self._depth(workload)).copy_to_host().reshape(-1)
        return rel_l2(got, ref)

    def tolerance(self, config, workload) -> float:
        """2e-2 for pp; for tg 1e-2, or 5e-2 with plain Q8_1 mat-vec inputs (MMVQ=1, XRES=0; module docstring)."""
        if not self._is_tg(workload):
            return PP_TOLERANCE
        return TG_TOLERANCE_PLAIN_Q8 if config.get("MMVQ", 1) and not config.get("XRES", 1) else TG_TOLERANCE

    def cost(self, workload: Workload, config=None) -> Cost:
        """pp: FLOPs of the matrix products and causal attention of one prefill; bytes: the quantized weights read
        once (the fewest a forward must move) and, after a depth, the cached K/V rows once. tg<n>: n steps, each 2
        FLOPs per weight (matrix products) and every weight byte read once, plus attention over the cached rows
        (f16 K and V: 4 bytes per kv_dim element; 4 FLOPs per q_dim element and row)."""
        from minfer_cli.engine.forward import gemm_weight_shapes

        m = self._model(workload)
        c, depth = m.config, self._depth(workload)
        if self._is_tg(workload):
            n = workload.shape["n"]
            rows = n * depth + n * (n + 1) / 2.0  # step i attends to depth + i + 1 rows
            kv_bytes = 4.0 * c.n_layers * c.kv_dim * rows
            attn = 4.0 * c.n_layers * c.q_dim * rows
            return Cost(flops=2.0 * m.n_params() * n + attn, bytes=float(m.size_bytes()) * n + kv_bytes)
        nt = workload.shape["nt"]
        gemm = sum(2.0 * od * id for od, id in gemm_weight_shapes(c)[:-1]) * nt + 2.0 * c.vocab * c.hidden
        attn = 2.0 * 2.0 * c.n_layers * c.n_heads * c.head_dim * (nt * depth + nt * (nt + 1) / 2.0)
        return Cost(flops=gemm + attn, bytes=float(m.size_bytes()) + 4.0 * c.n_layers * c.kv_dim * depth)


register(BenchExperiment())
