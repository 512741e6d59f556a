"""Experiment `gemv`: decode mat-vec ``y[od] = W[od, id] · x[id]`` straight from GGUF blocks (`kernels.gemv_q`).

Knobs: TYPE (W's GGUF format; every one `kernels.gemv_q` supports), RPB (rows per CUDA block, decoded together
by each warp so x is loaded once per RPB rows), WPR (warps per row; threads per block = 32 * WPR).
Workloads: the nt = 1 projections of one Qwen2-7B layer (hidden 3584, FFN 18944, 28 q heads + 2x4 kv heads of
128 -> fused qkv 4608) and its vocabulary head (152064 x 3584), plus a tiny shape for the CUDA simulator.
Cost model: 2*od*id FLOPs; fewest bytes = W's quantized bytes + x read once (4*id) + y written once (4*od);
ceiling "copy" (a mat-vec is bandwidth-bound: % of the measured device-to-device copy bandwidth).
Reference: numpy float64 ``gguf.quants.dequantize(W) @ x`` on the host from the same input bytes; the check is
the relative error ‖y − ref‖ / ‖ref‖, tolerance 1e-5 (float32 accumulation gives ~1e-7 here; float weights
F16/BF16/F32 are exact inputs, so the same bound holds for them).
"""

from __future__ import annotations

import weakref

import numpy as np

from kernels.gemv_q import (
    DEFAULT_RPB,
    DEFAULT_WPR,
    GEMV_TYPES,
    RPB_VALUES,
    WPR_VALUES,
    gemv_q,
    kernel_for,
    kernel_signature,
    threads_per_block,
)
from kernels.quant import block_format
from minfer_cli.experiment import Cost, Experiment, KernelInstance, Workload, register
from minfer_cli.knobs import Knob
from minfer_cli.quant_blocks import random_blocks

TOLERANCE = 1e-5


class _InputSet:
    """One input set: a seed, the f32 activation x (device) and, per TYPE, the device bytes of a random valid W."""

    def __init__(self, seed: int, od: int, id: int) -> None:
        from numba import cuda

        self.seed = seed
        self.od, self.id = od, id
        rng = np.random.default_rng([seed, 0])
        self.x_host = rng.standard_normal(id).astype(np.float32)
        self.x = cuda.to_device(self.x_host)
        self.raw: dict[str, object] = {}

    def materialise(self, qtype: str):
        raw = self.raw.get(qtype)
        if raw is None:
            from numba import cuda

            rng = np.random.default_rng([self.seed, 1 + GEMV_TYPES.index(qtype)])
            raw = self.raw[qtype] = cuda.to_device(random_blocks(qtype, self.od, self.id, rng))
        return raw


def reference(raw_host: np.ndarray, qtype: str, od: int, id: int, x: np.ndarray) -> np.ndarray:
    """float64 ``dequantize(W) @ x`` (gguf-py ``quants.dequantize``, then numpy in float64)."""
    from gguf import quants

    fmt = block_format(qtype)
    rows = np.ascontiguousarray(raw_host, dtype=np.uint8).reshape(od, fmt.row_bytes(id))
    w = quants.dequantize(rows, fmt.qtype).reshape(od, id).astype(np.float64)
    return w @ x.astype(np.float64)


def relative_error(y: np.ndarray, ref: np.ndarray) -> float:
    """‖y − ref‖ / ‖ref‖ in float64; inf when y holds a NaN (an element never written)."""
    y = np.asarray(y, dtype=np.float64)
    if not np.isfinite(y).all():
        return float("inf")
    return float(np.linalg.norm(y - ref) / np.linalg.norm(ref))


class GemvExperiment(Experiment):
    name = "gemv"
    purpose = "decode mat-vec y = W·x reading GGUF blocks directly (f32 x, f32 accumulate) vs the copy ceiling"
    knobs = (
        Knob("TYPE", GEMV_TYPES, "Q4_K", "GGUF format of W (selects the block decoder)"),
        Knob("RPB", RPB_VALUES, DEFAULT_RPB, "rows per CUDA block, decoded together by every warp (x reuse)"),
        Knob("WPR", WPR_VALUES, DEFAULT_WPR, "warps per row (split of each row's blocks); threads = 32*WPR"),
    )
    workloads = (
        Workload("ffn_up", {"od": 18944, "id": 3584}, "Qwen2-7B FFN up/gate projection, nt=1"),
        Workload("ffn_down", {"od": 3584, "id": 18944}, "Qwen2-7B FFN down projection, nt=1"),
        Workload("attn_qkv", {"od": 4608, "id": 3584}, "Qwen2-7B fused q|k|v projection (3584+512+512), nt=1"),
        Workload("attn_output", {"od": 3584, "id": 3584}, "Qwen2-7B attention output projection, nt=1"),
        Workload("output", {"od": 152064, "id": 3584}, "Qwen2-7B vocabulary head (lm_head), nt=1"),
        Workload("tiny", {"od": 5, "id": 512}, "5 x 512, for the CUDA simulator in CI (a partial last CUDA block)"),
    )
    ceiling = "copy"

    def __init__(self) -> None:
        self._sets: dict[str, weakref.WeakSet] = {}

    @staticmethod
    def _shape(workload: Workload) -> tuple[int, int]:
        return workload.shape["od"], workload.shape["id"]

    def _quant_bytes(self, qtype: str, workload: Workload) -> int:
        od, id = self._shape(workload)
        return od * block_format(qtype).row_bytes(id)

    def input_set_bytes(self, workload: Workload) -> int:
        """The smallest W any TYPE gives for this shape (Q2_K) plus x: the ring is sized before the arm is known,
        so a larger TYPE only makes the ring larger, never smaller than the L2-defeating size."""
        od, id = self._shape(workload)
        return min(self._quant_bytes(t, workload) for t in GEMV_TYPES) + 4 * id

    def make_input_set(self, workload: Workload, rng):
        """Fresh x now; W's bytes per TYPE when ``prepare`` materialises the arm's TYPE on every live set."""
        od, id = self._shape(workload)
        inputs = _InputSet(int(rng.integers(0, 2**63)), od, id)
        self._sets.setdefault(workload.name, weakref.WeakSet()).add(inputs)
        return inputs

    def make_output(self, workload: Workload):
        from numba import cuda

        return cuda.device_array(self._shape(workload)[0], dtype=np.float32)

    def prepare(self, config, workload):
        qtype, rpb, wpr = str(config["TYPE"]), int(config["RPB"]), int(config["WPR"])
        od, id = self._shape(workload)
        for inputs in list(self._sets.get(workload.name, ())):
            inputs.materialise(qtype)
        kernel_for(qtype, rpb, wpr)  # build the specialised kernel now (its JIT happens at the first launch)

        def launch(inputs, output, stream):
            raw = inputs.materialise(qtype)  # a dict lookup once prepare has run
            gemv_q(raw, qtype, od, id, inputs.x, output, rows_per_block=rpb, warps_per_row=wpr, stream=stream)

        return launch

    def poison(self, output) -> None:
        from numba import cuda

        output.copy_to_device(np.full(output.shape, np.nan, dtype=np.float32))
        cuda.synchronize()

    def check(self, config, workload, inputs, output) -> float:
        """‖y − ref‖ / ‖ref‖ against float64 ``dequantize(W) @ x`` (inf if any element is still NaN)."""
        qtype = str(config["TYPE"])
        od, id = self._shape(workload)
        ref = reference(inputs.materialise(qtype).copy_to_host(), qtype, od, id, inputs.x_host)
        return relative_error(output.copy_to_host(), ref)

    def tolerance(self, config) -> float:
        return TOLERANCE

    def kernels(self, config, workload):
        qtype, rpb, wpr = str(config["TYPE"]), int(config["RPB"]), int(config["WPR"])
        dispatcher, signature = kernel_for(qtype, rpb, wpr), kernel_signature(qtype)
        dispatcher.compile(signature)
        return [KernelInstance(f"gemv[{qtype},RPB={rpb},WPR={wpr}]", dispatcher, signature, threads_per_block(wpr))]

    def cost(self, workload: Workload, config=None) -> Cost:
        """2*od*id FLOPs; W's quantized bytes (``config``'s TYPE, default Q4_K) + 4*id (x) + 4*od (y)."""
        qtype = str((config or {}).get("TYPE", "Q4_K"))
        od, id = self._shape(workload)
        return Cost(flops=2.0 * od * id, bytes=float(self._quant_bytes(qtype, workload) + 4 * id + 4 * od))


register(GemvExperiment())
