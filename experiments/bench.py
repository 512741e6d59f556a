"""Experiment `bench`: the whole-model prefill (llama-bench's pp test) as an A/B-able experiment.

`minfer ab bench --arm W16=0 --arm W16=1` compares two engine settings at the model level through the same
interleaved harness, metric tok/s (higher is better). Knobs: the engine's (W16, the gemm_f16 tile knobs, FA_*
flash-attention knobs). Each sample is one prefill of nt random prompt tokens into an empty cache, timed on the
wall clock around the synchronised forward (self-timed: the harness's CUDA graphs do not apply to a forward
that launches hundreds of kernels from Python).

Check: the last token's logits. For `tiny` they are compared with the independent float64 numpy forward
(`minfer_cli.engine.reference`); for the 7B preset a float64 forward is far too slow, so they are compared with
the engine at its default knobs on the same tokens (the default engine itself is held to independent references
by the test suite). Tolerance 2e-2 (f16 weights and activations through every layer).
"""

from __future__ import annotations

import time

import numpy as np

from minfer_cli.engine.bench import engine_knobs, engine_options
from minfer_cli.engine.presets import DEFAULT_PRESET
from minfer_cli.experiment import Cost, Experiment, Metric, Workload, register

SEED = 0
_PRESET = {"pp512": DEFAULT_PRESET, "pp2048": DEFAULT_PRESET, "tiny_pp16": "tiny"}


class BenchExperiment(Experiment):
    name = "bench"
    purpose = "whole-model prefill of a preset (llama-bench pp), tok/s; engine knobs W16, gemm tiles, FA_*"
    knobs = tuple(k for k in engine_knobs() if k.name != "GRAPHS")  # GRAPHS acts on decode only; pp would ignore it
    workloads = (
        Workload("pp2048", {"nt": 2048}, f"{DEFAULT_PRESET}, 2048-token prompt"),
        Workload("pp512", {"nt": 512}, f"{DEFAULT_PRESET}, 512-token prompt"),
        Workload("tiny_pp16", {"nt": 16}, "tiny preset, 16-token prompt (CUDA simulator)"),
    )
    metric = Metric("throughput", "tok/s", higher_is_better=True)
    self_timed = True
    ceiling = "matrix"

    def __init__(self) -> None:
        self._weights: dict[str, object] = {}
        self._engines: dict[tuple, object] = {}

    def _model(self, workload: Workload):
        from minfer_cli.engine.presets import preset
        from minfer_cli.engine.weights import synth_weights

        name = _PRESET[workload.name]
        if name not in self._weights:
            self._weights[name] = synth_weights(preset(name), SEED)
        return self._weights[name]

    def _engine(self, config, workload: Workload):
        from minfer_cli.engine.forward import PrefillEngine

        key = (workload.name, tuple(sorted(config.items())))
        if key not in self._engines:
            self._engines[key] = PrefillEngine(self._model(workload), workload.shape["nt"], engine_options(config))
        return self._engines[key]

    def input_set_bytes(self, workload: Workload) -> int:
        return 4 * workload.shape["nt"]

    def make_input_set(self, workload: Workload, rng):
        from numba import cuda

        vocab = self._model(workload).config.vocab
        return cuda.to_device(rng.integers(0, vocab, size=workload.shape["nt"], dtype=np.int32))

    def make_output(self, workload: Workload):
        from numba import cuda

        return cuda.device_array(self._model(workload).config.vocab, dtype=np.float32)

    def prepare(self, config, workload):
        engine = self._engine(config, workload)
        nt = workload.shape["nt"]

        def launch(ids, output, stream):
            t0 = time.perf_counter()
            logits = engine.prefill(ids)
            output.copy_to_device(logits.reshape(logits.size), stream=engine.stream)
            engine.stream.synchronize()
            return nt / (time.perf_counter() - t0)

        return launch

    def poison(self, output) -> None:
        output.copy_to_device(np.full(output.size, np.nan, dtype=np.float32))

    def check(self, config, workload, inputs, output) -> float:
        got = output.copy_to_host().astype(np.float64)
        if not np.isfinite(got).all():
            return float("inf")
        if workload.name.startswith("tiny"):
            from minfer_cli.engine.reference import Reference

            ref = np.asarray(Reference(self._model(workload)).forward(inputs.copy_to_host(), last_only=True)).reshape(-1)
        else:
            base = self._engine(self.default_config(), workload)
            ref = base.prefill(inputs).copy_to_host().reshape(-1).astype(np.float64)
        return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))

    def tolerance(self, config) -> float:
        return 2e-2

    def cost(self, workload: Workload, config=None) -> Cost:
        """FLOPs of the matrix products and causal attention of one prefill; bytes: the quantized weights read
        once (the fewest a forward must move)."""
        from minfer_cli.engine.forward import gemm_weight_shapes

        m = self._model(workload)
        c, nt = m.config, workload.shape["nt"]
        gemm = sum(2.0 * od * id for od, id in gemm_weight_shapes(c)[:-1]) * nt + 2.0 * c.vocab * c.hidden
        attn = 2.0 * 2.0 * c.n_layers * c.n_heads * c.head_dim * nt * (nt + 1) / 2.0
        return Cost(flops=gemm + attn, bytes=float(m.size_bytes()))


register(BenchExperiment())
