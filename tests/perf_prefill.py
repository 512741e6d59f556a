"""Benchmark: where a prefill's time goes, eager against a replayed CUDA graph (the prefill issue's profile).
Not a test: run it on the GPU machine, read the figures.

    python tests/perf_prefill.py [PRESET] [LENGTHS]     # default: qwen2-7b-q4_k_m 128,256,512,1024,2048,4096,8192

For each prompt length, after a warm-up (JIT compilation): the eager prefill (`PrefillEngine._forward`, every
kernel launched from Python) timed three ways - host enqueue (until the Python call returns), wall (until the
stream is done), and the GPU span between two events around it - then the PGRAPH=1 prefill (one graph replay:
the GPU's own work, with ~1 µs between kernels). The eager wall minus the graph wall is the fixed cost that
launching from Python adds; the graph's node count is the kernels (and copies) one prefill launches. Medians of
``REPS`` runs; times in ms.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

REPS = 7


def main(name: str, lengths: list[int]) -> None:
    import numpy as np
    from numba import cuda

    from minfer_cli.engine.forward import PrefillEngine
    from minfer_cli.engine.options import PrefillOptions
    from minfer_cli.engine.presets import preset
    from minfer_cli.engine.weights import synth_weights

    weights = synth_weights(preset(name), 0)
    engine = PrefillEngine(weights, max(lengths), PrefillOptions(pgraph=True))
    s, rng = engine.stream, np.random.default_rng(0)
    print(f"{name}: {weights.describe()}; medians of {REPS} runs, ms", flush=True)
    print(f"{'tokens':>7} {'eager host':>11} {'eager wall':>11} {'eager GPU span':>15} {'graph wall':>11} "
          f"{'fixed cost':>11} {'graph tok/s':>12} {'nodes':>6} {'capture':>8}", flush=True)
    for n in lengths:
        ids = cuda.to_device(rng.integers(0, weights.config.vocab, size=n, dtype=np.int32))
        engine._forward(ids)
        s.synchronize()
        host, wall, span = [], [], []
        for _ in range(REPS):
            e0, e1 = cuda.event(), cuda.event()
            t0 = time.perf_counter()
            e0.record(s)
            engine._forward(ids)
            e1.record(s)
            t1 = time.perf_counter()
            s.synchronize()
            t2 = time.perf_counter()
            host.append(t1 - t0)
            wall.append(t2 - t0)
            span.append(cuda.event_elapsed_time(e0, e1) / 1e3)
        engine.prefill(ids)  # captures this length's graph
        s.synchronize()
        nodes = engine._graphs[(n, 0)].nodes()
        replay = []
        for _ in range(REPS):
            t0 = time.perf_counter()
            engine.prefill(ids)
            s.synchronize()
            replay.append(time.perf_counter() - t0)
        ms = [statistics.median(v) * 1e3 for v in (host, wall, span, replay)]
        print(f"{n:>7} {ms[0]:>11.2f} {ms[1]:>11.2f} {ms[2]:>15.2f} {ms[3]:>11.2f} {ms[1] - ms[3]:>11.2f} "
              f"{n / ms[3] * 1e3:>12,.0f} {nodes:>6} {engine.capture_seconds[(n, 0)] * 1e3:>7.1f}", flush=True)
    engine.close()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "qwen2-7b-q4_k_m",
         [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "128,256,512,1024,2048,4096,8192").split(",")])
