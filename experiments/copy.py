"""Experiment `copy`: device-to-device copy of a uint32 buffer, the bandwidth ceiling of memory-bound kernels.

Knob VEC: 4-byte elements per load/store per thread (1 = ld.global.u32, 2 = u64, 4 = ld.global.v4.u32).
Cost model: bytes read + bytes written = 2 x buffer size; no FLOPs. Reference: exact equality with the source.
"""

from __future__ import annotations

import numpy as np

from minfer_cli.experiment import Cost, Experiment, KernelInstance, Workload, register
from minfer_cli.knobs import Knob

class CopyExperiment(Experiment):
    name = "copy"
    purpose = "device-to-device copy of a uint32 buffer: the measured bandwidth ceiling"
    knobs = (Knob("VEC", (1, 2, 4), 4, "4-byte elements per load/store per thread (16-byte accesses at 4)"),)
    workloads = (
        Workload("1GiB", {"nbytes": 1 << 30}, "1 GiB buffer, far larger than L2: the DRAM copy ceiling"),
        Workload("256MiB", {"nbytes": 256 << 20}, "256 MiB buffer, 4x the H200's L2"),
        Workload("tiny", {"nbytes": 64 << 10}, "64 KiB, for the CUDA simulator in CI"),
    )
    ceiling = "copy"

    def _elements(self, workload: Workload) -> int:
        return workload.shape["nbytes"] // 4

    def input_set_bytes(self, workload: Workload) -> int:
        return workload.shape["nbytes"]

    def make_input_set(self, workload: Workload, rng):
        from numba import cuda

        host = rng.integers(0, 0xFFFFFFFF, size=self._elements(workload), dtype=np.uint32)
        return cuda.to_device(host)

    def make_output(self, workload: Workload):
        from numba import cuda

        return cuda.device_array(self._elements(workload), dtype=np.uint32)

    def prepare(self, config, workload):
        from kernels.copy import copy  # numba: imported when GPU work starts, not by `experiments list`

        vec = int(config["VEC"])

        def launch(inputs, output, stream):
            copy(inputs, output, vec=vec, stream=stream)

        return launch

    def poison(self, output) -> None:
        """Every output word becomes 0xFFFFFFFF (a NaN as f32), a value the inputs never hold."""
        from numba import cuda

        output.copy_to_device(np.full(output.size, 0xFFFFFFFF, dtype=np.uint32))
        cuda.synchronize()

    def check(self, config, workload, inputs, output) -> float:
        """Fraction of output words that differ from the source (0.0 when the copy is exact)."""
        src, dst = inputs.copy_to_host(), output.copy_to_host()
        return float(np.count_nonzero(src != dst)) / src.size

    def tolerance(self, config, workload) -> float:
        return 0.0

    def kernels(self, config, workload):
        from numba import types

        from kernels import copy as copy_kernels

        vec = int(config["VEC"])
        element = types.uint64 if vec == 2 else types.uint32
        array = types.Array(element, 1, "C")
        dispatcher = copy_kernels._copy_v4 if vec == 4 else copy_kernels._copy_scalar
        signature = (array, array)
        dispatcher.compile(signature)
        return [KernelInstance(f"copy[VEC={vec}]", dispatcher, signature, copy_kernels.THREADS)]

    def cost(self, workload: Workload, config=None) -> Cost:
        return Cost(flops=0.0, bytes=2.0 * workload.shape["nbytes"])


register(CopyExperiment())
