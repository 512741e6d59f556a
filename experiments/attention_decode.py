"""Experiment `attention_decode`: decode attention of one token over a filled f16 KV cache (flash-decoding,
`kernels.attention_decode`), the kernel behind `bench`'s tg at a depth.

Knobs: SPLITS (blocks per KV head along the cache, the engine's ATTN_SPLITS); MINB (a register cap by launch bound)
was deleted after its sweep (ledger #170: every cap spilled and was slower). Workloads: the 7B preset's heads (28 query / 4 KV) over 4,096 and 16,384 cached
rows, the 1.5B preset's (12 / 2) over 16,384, Llama-3.2-1B's (32 / 8, head_dim 64) over 16,384, and tiny shapes with
tails for the CUDA simulator (head_dim 128 and 64). Cost: the fewest bytes are the L K and V rows read once
(2 · L · n_kv_heads · D · 2 bytes, D = head_dim), q read and the output written; FLOPs 4 · L · n_heads · D (q·k and
p·v). Ceiling: the copy bandwidth (the kernel is memory-bound).
Reference: numpy float64 softmax attention over the same f16 rows (scale 1/sqrt(D)); relative error
‖out − ref‖ / ‖ref‖ < 1e-4 (f32 accumulation of exact f16 inputs).
"""

from __future__ import annotations

import math

import numpy as np

from minfer_cli.experiment import Cost, Experiment, KernelInstance, Workload, register, rel_l2
from minfer_cli.knobs import Knob

def _shape(L: int, n_heads: int, n_kv_heads: int, l_max: int | None = None, head_dim: int = 128) -> dict[str, int]:
    return {"L": L, "l_max": l_max or L, "n_heads": n_heads, "n_kv_heads": n_kv_heads, "head_dim": head_dim}


class AttentionDecodeExperiment(Experiment):
    name = "attention_decode"
    purpose = "decode attention of one token over an L-row f16 KV cache (flash-decoding) vs the copy-bandwidth ceiling"
    knobs = (
        Knob("SPLITS", (16, 32, 64, 128), 64, "blocks per KV head along the cache, 4 warp partitions each "
                                               "(the engine's ATTN_SPLITS)"),
    )
    removed_knobs = {"MINB": 0}
    """MINB (the partial kernel's launch bound) lost its sweep (ledger #170); 0, no bound, is what runs."""
    workloads = (
        Workload("qwen2_7b_d16384", _shape(16384, 28, 4), "7B preset heads (28 query / 4 KV), 16,384 cached rows"),
        Workload("qwen2_7b_d4096", _shape(4096, 28, 4), "7B preset heads, 4,096 cached rows"),
        Workload("qwen2_1_5b_d16384", _shape(16384, 12, 2), "1.5B preset heads (12 query / 2 KV), 16,384 cached rows"),
        Workload("llama3_2_1b_d16384", _shape(16384, 32, 8, head_dim=64),
                 "Llama-3.2-1B heads (32 query / 8 KV, head_dim 64), 16,384 cached rows"),
        Workload("phi3_mini_d16384", _shape(16384, 32, 32, head_dim=96),
                 "Phi-3-mini-shaped heads (32 query / 32 KV, head_dim 96: 16-lane rows, 4 lanes padding), 16,384 "
                 "cached rows"),
        Workload("tiny", _shape(37, 3, 1, l_max=48), "37 of 48 rows (partitions of 1-2 rows, masked slots), "
                                                    "3 query heads on 1 KV head, for the simulator"),
        Workload("tiny_hd64", _shape(37, 4, 1, l_max=48, head_dim=64), "as tiny with head_dim 64 (quarter-warp "
                                                                       "rows), 4 query heads, for the simulator"),
        Workload("tiny_hd80", _shape(37, 4, 1, l_max=48, head_dim=80), "as tiny with head_dim 80 (16-lane rows, 6 "
                                                                       "lanes padding), for the simulator"),
    )
    ceiling = "copy"

    def __init__(self) -> None:
        self._workspaces: dict[tuple, object] = {}

    def input_set_bytes(self, workload: Workload) -> int:
        s = workload.shape
        return 2 * 2 * s["l_max"] * s["n_kv_heads"] * s["head_dim"] + 4 * s["n_heads"] * s["head_dim"] + 4

    def make_input_set(self, workload: Workload, rng):
        """(q f32 [n_heads, D], k and v caches f16 [l_max, n_kv_heads, D], L as an int32 device scalar)."""
        from numba import cuda

        s = workload.shape
        q = rng.standard_normal((s["n_heads"], s["head_dim"]), dtype=np.float32)
        k, v = (rng.standard_normal((s["l_max"], s["n_kv_heads"], s["head_dim"]), dtype=np.float32).astype(np.float16)
                for _ in range(2))
        return (cuda.to_device(q), cuda.to_device(k), cuda.to_device(v), cuda.to_device(np.array([s["L"]], np.int32)))

    def make_output(self, workload: Workload):
        from numba import cuda

        return cuda.device_array((workload.shape["n_heads"], workload.shape["head_dim"]), dtype=np.float32)

    def _workspace(self, n_heads: int, splits: int, head_dim: int):
        from kernels import attention_decode as kernel

        key = (n_heads, splits, head_dim)
        if key not in self._workspaces:
            self._workspaces[key] = kernel.decode_workspace(n_heads, splits, head_dim=head_dim)
        return self._workspaces[key]

    def prepare(self, config, workload):
        from kernels import attention_decode as kernel  # numba: imported when GPU work starts

        s = workload.shape
        splits = int(config["SPLITS"])
        kernel.build(s["n_heads"] // s["n_kv_heads"], np.float32, head_dim=s["head_dim"])  # compile now, untimed
        workspace = self._workspace(s["n_heads"], splits, s["head_dim"])  # once, outside any graph capture

        def launch(inputs, output, stream):
            q, k, v, length = inputs
            kernel.decode_attention(q, k, v, length, output, splits=splits, workspace=workspace, stream=stream)

        return launch

    def poison(self, output) -> None:
        from numba import cuda

        output.copy_to_device(np.full(output.shape, np.nan, dtype=np.float32))
        cuda.synchronize()

    def check(self, config, workload, inputs, output) -> float:
        q, k, v, _ = inputs
        return rel_l2(output.copy_to_host(), reference(q.copy_to_host(), k.copy_to_host()[: workload.shape["L"]],
                                                       v.copy_to_host()[: workload.shape["L"]]))

    def tolerance(self, config, workload) -> float:
        return 1e-4

    def cost(self, workload: Workload, config=None) -> Cost:
        """Bytes: K and V rows 0..L-1 read once (f16), q read (f32), out written (f32); FLOPs 4·L·n_heads·D."""
        s = workload.shape
        L, h, hk, hd = s["L"], s["n_heads"], s["n_kv_heads"], s["head_dim"]
        return Cost(flops=4.0 * L * h * hd, bytes=2.0 * 2 * L * hk * hd + 2 * 4.0 * h * hd)

    def kernels(self, config, workload):
        from kernels import attention_decode as kernel

        s = workload.shape
        partial, combine = kernel.build(s["n_heads"] // s["n_kv_heads"], np.float32, head_dim=s["head_dim"])
        return [
            KernelInstance(f"decode_attention_partial[SPLITS={config['SPLITS']},D={s['head_dim']}]", partial,
                           kernel.partial_signature(np.float32), kernel.WARPS * 32),
            KernelInstance(f"decode_attention_combine[D={s['head_dim']}]", combine, kernel.COMBINE_SIGNATURE,
                           kernel.COMBINE_WARPS * 32),
        ]


def reference(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """float64 [n_heads, D]: softmax(q·Kᵀ / sqrt(D)) · V per head over all rows of k/v [L, n_kv_heads, D]
    (GQA: head h reads KV head h // (n_heads / n_kv_heads))."""
    h, hd = q.shape
    hk = k.shape[1]
    group = h // hk
    out = np.empty((h, hd))
    for head in range(h):
        kk = k[:, head // group].astype(np.float64)
        s = kk @ q[head].astype(np.float64) / math.sqrt(hd)
        p = np.exp(s - s.max())
        out[head] = p @ v[:, head // group].astype(np.float64) / p.sum()
    return out


register(AttentionDecodeExperiment())
