"""Experiment `sync`: what one dependent step of a decode costs, as a kernel boundary or as a grid barrier.

A chain of P phases over an n-float vector, each what decode's RMSNorm does (every CUDA block reduces the whole
input, then scales its share), run as P launches (MODE=launch), P programmatic dependent launches (MODE=pdl, as the
decode engine chains its kernels) or one persistent kernel with a grid barrier between phases (MODE=grid,
`kernels.grid_sync`: the synchronisation a persistent decode kernel would use). The sample is the whole chain; its
time / P is a step's cost each way. Reference: the same chain in float64 (numpy).
"""

from __future__ import annotations

import numpy as np

from minfer_cli.experiment import Cost, Experiment, KernelInstance, Workload, register, rel_l2
from minfer_cli.knobs import Knob

MODES = ("launch", "pdl", "grid")  # kernels.grid_sync.MODES (numba-free here, for `experiments list`)


def reference(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """float64 result of the chain: x <- x * w[p] / sqrt(mean(x^2) + eps) for every row p of w."""
    y = x.astype(np.float64)
    for row in w.astype(np.float64):
        y = y * row / np.sqrt(np.mean(y * y) + eps)
    return y


class SyncExperiment(Experiment):
    name = "sync"
    purpose = "a chain of dependent RMSNorm-like phases: kernel launches, PDL launches or grid barriers in one kernel"
    knobs = (
        Knob("MODE", MODES, "pdl", "launch: a kernel per phase; pdl: a programmatic dependent launch per phase (the "
                                   "decode's chaining); grid: one persistent kernel, a grid barrier between phases"),
        Knob("BLOCKS", (1, 12, 132, 264), 132, "CUDA blocks of 128 threads in every phase (grid: all resident at "
                                               "once, refused above what the device holds)"),
    )
    workloads = (
        Workload("phases_1536", {"n": 1536, "phases": 64}, "64 phases over 1536 floats (Qwen2-1.5B's hidden); "
                                                           "time / 64 is one step"),
        Workload("phases_3584", {"n": 3584, "phases": 64}, "64 phases over 3584 floats (Qwen2-7B's hidden)"),
        Workload("tiny", {"n": 300, "phases": 3}, "3 phases over 300 floats, for the CUDA simulator in CI"),
    )
    ceiling = "copy"

    def __init__(self) -> None:
        self._states: dict[tuple, object] = {}  # (MODE, BLOCKS) of a prepared grid arm -> its barrier state

    def note(self, config, workload) -> str | None:
        """How to read the figure: a sample is the whole chain."""
        p = workload.shape["phases"]
        return f"a sample is {p} dependent steps: the time of one step is the sample's time / {p}"

    def input_set_bytes(self, workload: Workload) -> int:
        s = workload.shape
        return 4 * s["n"] * (1 + s["phases"])

    def make_input_set(self, workload: Workload, rng):
        from numba import cuda

        s = workload.shape
        x = rng.standard_normal(s["n"]).astype(np.float32)
        w = rng.uniform(0.5, 1.5, (s["phases"], s["n"])).astype(np.float32)
        return cuda.to_device(x), cuda.to_device(w)

    def make_output(self, workload: Workload):
        from numba import cuda

        return cuda.device_array((2, workload.shape["n"]), dtype=np.float32)

    def prepare(self, config, workload):
        from kernels.grid_sync import new_state, phase_chain

        mode, blocks = str(config["MODE"]), int(config["BLOCKS"])
        state = self._states[mode, blocks] = new_state() if mode == "grid" else None

        def launch(inputs, output, stream):
            x, w = inputs
            phase_chain(x, w, output, mode, blocks, stream, state=state)

        return launch

    def poison(self, output) -> None:
        from numba import cuda

        output.copy_to_device(np.full(output.shape, np.nan, dtype=np.float32))
        cuda.synchronize()

    def check(self, config, workload, inputs, output) -> float:
        """Relative L2 error of the chain's result against `reference`. Raises `kernels.grid_sync.WatchdogError` when
        a grid barrier gave up (the arm is then INVALID with that reason)."""
        from kernels.grid_sync import EPS

        self.after_timing(config, workload)
        x, w = (a.copy_to_host() for a in inputs)
        got = output.copy_to_host()[(workload.shape["phases"] - 1) % 2]
        return rel_l2(got, reference(x, w, float(EPS)))

    def tolerance(self, config, workload) -> float:
        return 1e-5

    def after_timing(self, config, workload) -> None:
        """A grid arm whose barrier gave up while it was timed timed no barriers: WatchdogError."""
        from kernels.grid_sync import check_watchdog

        state = self._states.get((str(config["MODE"]), int(config["BLOCKS"])))
        if state is not None:
            check_watchdog(state)

    def cost(self, workload: Workload, config=None) -> Cost:
        """The fewest bytes: x and every w row read once, the result written once (f32; the intermediate vectors
        can stay in L2); FLOPs: 2n for the sum of squares and 2n for the scaling, per phase."""
        s = workload.shape
        return Cost(flops=4.0 * s["n"] * s["phases"], bytes=4.0 * s["n"] * (s["phases"] + 2))

    def kernels(self, config, workload):
        from numba import types

        from kernels import grid_sync

        if config["MODE"] == "grid":
            sig = grid_sync.GRID_SIGNATURE
            grid_sync._phases_grid.compile(sig)
            return [KernelInstance("phases_grid", grid_sync._phases_grid, sig, grid_sync.THREADS)]
        f1 = types.Array(types.float32, 1, "C")
        sig = (f1, f1, f1)
        grid_sync._phase_kernel.compile(sig)
        return [KernelInstance("phase", grid_sync._phase_kernel, sig, grid_sync.THREADS)]


register(SyncExperiment())
