"""Timing one arm: L2-defeating input rings, CUDA-event samples, replayed CUDA graphs for short kernels.

Method (`../shared/CONVENTIONS.md` §4):
* inputs rotate through a ring of input sets whose total size is at least 4x the device's L2, so no sample reads
  inputs that the previous one left in L2; a working set already larger than that uses two copies; an optional
  flush mode writes a buffer of 2x L2 between samples, outside the timed events;
* each sample is timed with CUDA events on a dedicated stream. The preferred method captures
  [start event, B launches over B successive ring sets, end event] into a CUDA graph and replays it: the events
  sit inside the graph, so host launch latency (about 49 µs per numba launch) is never inside the timed region.
  B = ceil(`BATCH_TARGET_US` / one launch's time in a graph of one), at most half the ring ("batch"), so that every sample spans
  about the same GPU time whatever the kernel: the fixed cost of starting a graph and recording its events
  (about 2 µs on the H200) is then a small share of a sample instead of a jump at one kernel length (a 20 µs
  threshold had timed a 19 µs arm in batches and a 21 µs arm alone). The sample is the graph time divided by B.
  Where capture fails the harness falls back to eager launches behind a GPU sleep kernel ("eager") and says so;
* warm-up is time-budgeted (JIT compilation, first touch and clock ramp-up are never timed).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

BATCH_TARGET_US = 200.0
ESTIMATE_GRAPHS = 8
"""Graphs of one launch (over as many ring sets) whose replays estimate a launch's time for `batch_size`."""
MAX_RING_SETS = 1024
RING_FACTOR = 4


def batch_size(single_us: float, ring_sets: int) -> int:
    """Launches per sample for a kernel whose one launch took ``single_us`` µs (a graph of one launch; eager
    launches where capture fails):
    ceil(`BATCH_TARGET_US` / ``single_us``), at least 1 and at most half of the ``ring_sets`` input sets (every
    launch of a sample reads a different set). Raises ValueError for a ring of fewer than 1 set."""
    if ring_sets < 1:
        raise ValueError(f"a ring needs at least 1 input set, got {ring_sets}")
    return int(min(max(1, math.ceil(BATCH_TARGET_US / max(single_us, 0.5))), max(1, ring_sets // 2)))


@dataclass(frozen=True)
class RingPlan:
    """How inputs rotate: `sets` input sets of `set_bytes` each; mode "ring" (>= 4x L2 in total), "two-copies"
    (one set is already >= 4x L2) or "ring+flush" (sets too small to fill 4x L2 within MAX_RING_SETS)."""

    sets: int
    set_bytes: int
    l2_bytes: int
    mode: str

    @property
    def total_bytes(self) -> int:
        return self.sets * self.set_bytes


def plan_ring(set_bytes: int, l2_bytes: int, flush: bool = False) -> RingPlan:
    """Number of input sets so that together they are at least RING_FACTOR x L2 (see RingPlan)."""
    if set_bytes <= 0:
        raise ValueError(f"an input set must have a positive size, got {set_bytes} bytes")
    target = RING_FACTOR * max(l2_bytes, 1)
    if set_bytes >= target:
        return RingPlan(2, set_bytes, l2_bytes, "two-copies+flush" if flush else "two-copies")
    sets = math.ceil(target / set_bytes)
    if sets > MAX_RING_SETS:
        return RingPlan(MAX_RING_SETS, set_bytes, l2_bytes, "ring+flush")
    return RingPlan(max(sets, 2), set_bytes, l2_bytes, "ring+flush" if flush else "ring")


@dataclass(frozen=True)
class TimingMethod:
    """What ran: method "graph" or "eager", launches per sample (batch), ring plan."""

    method: str
    batch: int
    ring: RingPlan
    note: str = ""

    def describe(self) -> str:
        ring = self.ring
        text = (
            f"{self.method}, {self.batch} launch(es) per sample, inputs: {ring.mode} "
            f"({ring.sets} x {ring.set_bytes / 2**20:.1f} MiB vs L2 {ring.l2_bytes / 2**20:.0f} MiB)"
        )
        return text + (f"; {self.note}" if self.note else "")


class ArmTimer:
    """Times one prepared arm: `sample()` returns the time of one launch in µs.

    launch(inputs, output, stream) enqueues one sample; ring: the input sets; flush_buffer: a device buffer of
    2x L2 written between samples when flush mode is on (None otherwise).
    """

    def __init__(self, launch: Callable, ring: list, output: Any, stream, plan: RingPlan, flush_buffer=None):
        self.launch, self.ring, self.output, self.stream = launch, ring, output, stream
        self.plan, self.flush_buffer = plan, flush_buffer
        self.position = 0
        self.batch = 1
        self.method = "graph"
        self.note = ""
        self._graphs: list = []
        self._graph_index = 0

    # -- one launch on the next ring set ------------------------------------------------------------------------
    def _launch_next(self) -> None:
        self.launch(self.ring[self.position], self.output, self.stream)
        self.position = (self.position + 1) % len(self.ring)

    def _flush(self) -> None:
        if self.flush_buffer is not None:
            from numba.cuda.cudadrv.driver import device_memset

            device_memset(self.flush_buffer, 0x5A, self.flush_buffer.nbytes, stream=self.stream)

    def warm(self, seconds: float) -> None:
        """Launch over the ring for at least `seconds` (and at least once per set); not timed."""
        end = time.monotonic() + seconds
        for _ in range(len(self.ring)):
            self._launch_next()
        self.stream.synchronize()
        while time.monotonic() < end:
            for _ in range(min(len(self.ring), 16)):
                self._launch_next()
            self.stream.synchronize()

    # -- eager: events around launches, a GPU sleep in front so host latency is hidden ---------------------------
    def _eager_sample(self, batch: int) -> float:
        from numba import cuda

        from kernels.spin import spin

        start, end = cuda.event(), cuda.event()
        self._flush()
        spin(100 + 60 * batch, stream=self.stream)
        start.record(self.stream)
        for _ in range(batch):
            self._launch_next()
        end.record(self.stream)
        end.synchronize()
        return start.elapsed_time(end) * 1000.0 / batch

    # -- graph: [start event, batch launches, end event] captured once per ring window, then replayed ------------
    def _capture(self, batch: int, windows: int | None = None) -> None:
        """Capture ``windows`` graphs (default: as many as the ring holds) of ``batch`` launches each."""
        from numba import cuda

        from minfer_cli.measure.graph import StreamGraph, cuda_check, driver

        drv = driver()
        handle = drv.CUstream(int(self.stream.handle))
        external = drv.CUevent_record_flags.CU_EVENT_RECORD_EXTERNAL

        def window(start, end) -> None:
            cuda_check(drv.cuEventRecordWithFlags(drv.CUevent(int(start.handle)), handle, external), "event record")
            for _ in range(batch):
                self._launch_next()
            cuda_check(drv.cuEventRecordWithFlags(drv.CUevent(int(end.handle)), handle, external), "event record")

        graphs = []
        for _ in range(windows or max(1, len(self.ring) // batch)):
            start, end = cuda.event(), cuda.event()
            graphs.append((StreamGraph(self.stream, lambda: window(start, end)), start, end))
        self._graphs = graphs
        self._graph_index = 0

    def _graph_sample(self) -> float:
        graph, start, end = self._graphs[self._graph_index]
        self._graph_index = (self._graph_index + 1) % len(self._graphs)
        self._flush()
        graph.launch()
        end.synchronize()
        return start.elapsed_time(end) * 1000.0 / self.batch

    def calibrate(self) -> None:
        """Pick the method and the batch size: `batch_size` of the median of graph replays of one launch (the
        method's own per-launch time, including a graph start's ~2 µs), then capture the graphs of that batch.
        Where capture fails: eager launches, batched by the median of single eager launches. Graphs are never sized
        from an eager estimate: host latency the sleep does not hide inflates it several times over, and batches
        would differ between the arms of one sweep (baselines/gemm-notes.yaml, timing)."""
        try:
            self.batch = 1
            self._capture(1, min(len(self.ring), ESTIMATE_GRAPHS))
            for _ in range(len(self._graphs)):  # a graph's first replay also uploads it: not timed
                self._graph_sample()
            single = float(np.median([self._graph_sample() for _ in range(max(5, len(self._graphs)))]))
            batch = batch_size(single, len(self.ring))
            if batch > 1 or len(self._graphs) < len(self.ring):
                self.release()
                self.batch = batch
                self._capture(batch)
                for _ in range(len(self._graphs)):
                    self._graph_sample()
            self.method = "graph"
        except Exception as exc:  # capture unsupported here: eager launches behind a GPU sleep
            self._graphs = []
            self.method = "eager"
            self.note = f"graph capture failed ({exc}); eager launches behind a GPU sleep kernel"
            self.batch = batch_size(float(np.median([self._eager_sample(1) for _ in range(5)])), len(self.ring))

    def sample(self) -> float:
        """Time of one launch in µs (a batch divided by its size when batched)."""
        if self.method == "graph":
            return self._graph_sample()
        return self._eager_sample(self.batch)

    def describe(self) -> TimingMethod:
        return TimingMethod(self.method, self.batch, self.plan, self.note)

    def release(self) -> None:
        for graph, _, _ in self._graphs:
            graph.close()
        self._graphs = []


class SelfTimer:
    """Timer of a self-timed experiment (e.g. a whole-model prefill): its launch returns the sample's metric value
    itself (tok/s measured on the wall clock around a synchronised forward); the ring still rotates the inputs."""

    def __init__(self, launch: Callable, ring: list, output: Any, stream, plan: RingPlan):
        self.launch, self.ring, self.output, self.stream, self.plan = launch, ring, output, stream, plan
        self.position = 0

    def sample(self) -> float:
        value = float(self.launch(self.ring[self.position], self.output, self.stream))
        self.position = (self.position + 1) % len(self.ring)
        return value

    def warm(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        self.sample()
        while time.monotonic() < end:
            self.sample()

    def calibrate(self) -> None:
        """Nothing to choose: one launch is one sample."""

    def describe(self) -> TimingMethod:
        return TimingMethod("self-timed (wall clock around a synchronised launch)", 1, self.plan)

    def release(self) -> None:
        """Nothing to free."""
