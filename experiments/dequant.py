"""Experiment `dequant`: GGUF tensor bytes -> row-major f16 ``[od, id]``, one kernel per block format.

Knobs: TYPE (the GGUF format; every one `kernels.quant` supports), TPB (threads per CUDA block; each thread
writes 8 consecutive f16 with one 16-byte store). Workloads: the weight matrices of a 7B model (Qwen2-7B
shapes: hidden 3584, FFN 18944) and a tiny one for the CUDA simulator.
Cost model: no FLOPs; bytes = quantized bytes read + 2 * od * id f16 bytes written (the fewest that must move).
Reference: ``float16(gguf.quants.dequantize(bytes, type))`` computed on the host from the same input bytes;
the kernels are bit-exact, so the check is the fraction of mismatching elements and the tolerance is 0.
"""

from __future__ import annotations

import weakref

import numpy as np

from kernels.quant import SUPPORTED, TPB_VALUES, block_format
from minfer_cli.experiment import Cost, Experiment, KernelInstance, Workload, register
from minfer_cli.knobs import Knob
from minfer_cli.quant_blocks import random_blocks, reference_f16


class _InputSet:
    """One input set: a seed and, per TYPE, the device bytes of a random valid tensor generated from it."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.raw: dict[str, object] = {}

    def materialise(self, qtype: str, od: int, id: int):
        raw = self.raw.get(qtype)
        if raw is None:
            from numba import cuda

            rng = np.random.default_rng([self.seed, SUPPORTED.index(qtype)])
            raw = self.raw[qtype] = cuda.to_device(random_blocks(qtype, od, id, rng))
        return raw


class DequantExperiment(Experiment):
    name = "dequant"
    purpose = "GGUF blocks -> f16 [od, id], one dequantization kernel per block format"
    knobs = (
        Knob("TYPE", SUPPORTED, "Q4_K", "GGUF tensor format of the input bytes (selects the kernel)"),
        Knob("TPB", TPB_VALUES, 256, "threads per CUDA block (8 f16 outputs per thread)"),
    )
    workloads = (
        Workload("ffn_up", {"od": 18944, "id": 3584}, "7B FFN up/gate projection weight"),
        Workload("ffn_down", {"od": 3584, "id": 18944}, "7B FFN down projection weight"),
        Workload("attn_q", {"od": 3584, "id": 3584}, "7B attention query/output projection weight"),
        Workload("tiny", {"od": 4, "id": 512}, "4 x 512, for the CUDA simulator in CI"),
    )
    ceiling = "copy"
    work_knobs = ("TYPE",)

    def __init__(self) -> None:
        self._sets: dict[str, weakref.WeakSet] = {}

    @staticmethod
    def _shape(workload: Workload) -> tuple[int, int]:
        return workload.shape["od"], workload.shape["id"]

    def _quant_bytes(self, qtype: str, workload: Workload) -> int:
        od, id = self._shape(workload)
        return od * block_format(qtype).row_bytes(id)

    def input_set_bytes(self, workload: Workload) -> int:
        """Bytes of one input set, taken as the smallest quantized size any TYPE gives for this shape (Q2_K), so
        that the ring is at least the L2-defeating size whatever TYPE an arm uses (the harness sizes the ring
        before it knows the arm; a larger TYPE makes the ring larger, never too small)."""
        return min(self._quant_bytes(t, workload) for t in SUPPORTED)

    def make_input_set(self, workload: Workload, rng):
        """A fresh input set whose bytes are generated per TYPE: ``prepare`` materialises the arm's TYPE on every
        live set of the workload (host `random_blocks` + one copy to the device), so launches only look it up."""
        inputs = _InputSet(int(rng.integers(0, 2**63)))
        self._sets.setdefault(workload.name, weakref.WeakSet()).add(inputs)
        return inputs

    def make_output(self, workload: Workload):
        from numba import cuda

        return cuda.device_array(self._shape(workload), dtype=np.float16)

    def prepare(self, config, workload):
        qtype, tpb = str(config["TYPE"]), int(config["TPB"])
        od, id = self._shape(workload)

        for inputs in list(self._sets.get(workload.name, ())):
            inputs.materialise(qtype, od, id)

        from kernels.quant import dequantize  # numba: imported when GPU work starts, not by `experiments list`

        def launch(inputs, output, stream):
            raw = inputs.materialise(qtype, od, id)  # a dict lookup once prepare has run
            dequantize(raw, qtype, od, id, out=output, stream=stream, tpb=tpb)

        return launch

    def poison(self, output) -> None:
        """Every output element becomes NaN, which no valid input dequantizes to."""
        from numba import cuda

        output.copy_to_device(np.full(output.shape, np.nan, dtype=np.float16))
        cuda.synchronize()

    def check(self, config, workload, inputs, output) -> float:
        """Fraction of output elements whose f16 bits differ from ``float16(gguf reference)`` (NaN counts as a
        mismatch): 0.0 when the kernel is bit-exact, which it must be (tolerance 0)."""
        qtype = str(config["TYPE"])
        od, id = self._shape(workload)
        ref = reference_f16(inputs.materialise(qtype, od, id).copy_to_host(), qtype, od, id)
        got = output.copy_to_host()
        return float(np.count_nonzero(got.view(np.uint16) != ref.view(np.uint16))) / ref.size

    def tolerance(self, config, workload) -> float:
        return 0.0

    def kernels(self, config, workload):
        from kernels.quant import kernel_for, kernel_signature

        qtype, tpb = str(config["TYPE"]), int(config["TPB"])
        dispatcher, signature = kernel_for(qtype), kernel_signature(qtype)
        dispatcher.compile(signature)
        return [KernelInstance(f"dequant[{qtype}]", dispatcher, signature, tpb)]

    def cost(self, workload: Workload, config=None) -> Cost:
        """Quantized bytes read + 2*od*id f16 bytes written, for ``config``'s TYPE (default TYPE when None)."""
        qtype = str((config or {}).get("TYPE", "Q4_K"))
        od, id = self._shape(workload)
        return Cost(flops=0.0, bytes=float(self._quant_bytes(qtype, workload) + 2 * od * id))


register(DequantExperiment())
