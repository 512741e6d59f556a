"""Experiment `attention`: causal prefill attention (FlashAttention-2 on tensor cores, head_dim 64/128/256, GQA).

Knobs: the kernel's compile-time shape (KNOBS of kernels/attention_config.py: BK, MMA; BQ and STAGES were
deleted with their losing values: `removed_knobs`) and IMPL (minfer's
kernel or torch's scaled_dot_product_attention as the vendor arm). Workloads: Qwen2-7B prefill of 2048 and 8192 tokens into
an empty cache (28 query heads, 4 KV heads, head_dim 128), Llama-3.2-1B's 2048 (32 / 8 heads, head_dim 64), and tiny
shapes with tails for the CUDA simulator (head_dim 128 and 64).
Cost: causal FLOPs counted as half the dense ones, 4·nt²·n_heads·D / 2 (two GEMMs of 2·nt·nt·D each, half
the key/query pairs masked; the diagonal tiles' extra work is not counted). Fewest bytes: q, k, v read once and
o written once, all f16. Ceiling: the f16 matrix rate.
Reference: torch SDPA in f32 on the GPU (math on f32 copies of the same f16 inputs, K/V repeated per group) when
torch is importable, else numpy float64 on the host; relative error ‖O − ref‖ / ‖ref‖ < 1e-2 (P is rounded to
f16 for P·V, and O to f16).
"""

from __future__ import annotations

import numpy as np

from kernels import attention_config as knob_table
from minfer_cli.experiment import Cost, Experiment, KernelInstance, Workload, register, rel_l2
from minfer_cli.knobs import Knob

_DOCS = {
    "BK": "keys per K/V tile (S is 16 x BK per warp in registers)",
    "MMA": "the products: mma_sync (per-warp mma.sync m16n8k16, FlashAttention-2) or wgmma (per-warpgroup "
           "wgmma: S = Q·K^T from shared memory, O += P·V with P from registers and V read MN-major, as "
           "FlashAttention-3 issues them)",
}


def _shape(nt: int, n_heads: int, n_kv_heads: int, head_dim: int = 128) -> dict[str, int]:
    return {"nt": nt, "nt_kv": nt, "n_heads": n_heads, "n_kv_heads": n_kv_heads, "head_dim": head_dim}


class AttentionExperiment(Experiment):
    name = "attention"
    removed_knobs = knob_table.REMOVED
    purpose = ("causal prefill flash attention (mma.sync or wgmma, hd 64/80/96/128/256, GQA) vs torch SDPA and the "
               "f16 matrix-rate ceiling")
    knobs = tuple(Knob(k, tuple(v), knob_table.DEFAULT[k], _DOCS[k], knob_table.LEGACY.get(k))
                  for k, v in knob_table.KNOBS.items()) + (
        Knob("IMPL", ("minfer", "torch_sdpa"), "minfer",
             "minfer's kernel, or torch.nn.functional.scaled_dot_product_attention (is_causal, GQA) as the vendor "
             "arm; tile knobs do not apply to torch_sdpa"),
    )
    workloads = (
        Workload("qwen2_7b_pp2048", _shape(2048, 28, 4), "Qwen2-7B prefill, 2048 tokens, 28 query / 4 KV heads"),
        Workload("qwen2_7b_pp8192", _shape(8192, 28, 4), "Qwen2-7B prefill, 8192 tokens, 28 query / 4 KV heads"),
        Workload("llama3_2_1b_pp2048", _shape(2048, 32, 8, 64),
                 "Llama-3.2-1B prefill, 2048 tokens, 32 query / 8 KV heads, head_dim 64"),
        Workload("phi3_mini_pp2048", _shape(2048, 32, 32, 96),
                 "Phi-3-mini-shaped prefill, 2048 tokens, 32 query / 32 KV heads, head_dim 96 (128-wide rows)"),
        Workload("tiny", _shape(33, 4, 2), "33 tokens (tails of every tile), 4 query / 2 KV heads, for the simulator"),
        Workload("tiny_hd64", _shape(33, 4, 2, 64), "as tiny with head_dim 64, for the simulator"),
        Workload("tiny_hd80", _shape(33, 4, 2, 80), "as tiny with head_dim 80 (padded rows), for the simulator"),
    )
    ceiling = "matrix"

    def __init__(self) -> None:
        self._torch_results: dict[int, object] = {}

    def input_set_bytes(self, workload: Workload) -> int:
        s = workload.shape
        return 2 * s["head_dim"] * (s["nt"] * s["n_heads"] + 2 * s["nt_kv"] * s["n_kv_heads"])

    def make_input_set(self, workload: Workload, rng):
        from numba import cuda

        s = workload.shape
        hd = s["head_dim"]
        q = rng.standard_normal((s["nt"], s["n_heads"], hd), dtype=np.float32).astype(np.float16)
        k = rng.standard_normal((s["nt_kv"], s["n_kv_heads"], hd), dtype=np.float32).astype(np.float16)
        v = rng.standard_normal((s["nt_kv"], s["n_kv_heads"], hd), dtype=np.float32).astype(np.float16)
        return cuda.to_device(q), cuda.to_device(k), cuda.to_device(v)

    def make_output(self, workload: Workload):
        from numba import cuda

        s = workload.shape
        return cuda.device_array((s["nt"], s["n_heads"], s["head_dim"]), dtype=np.float16)

    def _knobs(self, config) -> dict:
        return {k: config[k] for k in knob_table.KNOBS}

    def prepare(self, config, workload):
        if config.get("IMPL") == "torch_sdpa":
            return self._torch_launch(workload)
        from kernels import attention as kernel  # numba: imported when GPU work starts, not by `experiments list`

        cfg = self._knobs(config)
        kernel.build(cfg, head_dim=workload.shape["head_dim"])  # compile (and opt in to >48 KB shared memory) now, outside any timing or capture

        def launch(inputs, output, stream):
            q, k, v = inputs
            kernel.flash_attention(q, k, v, output, config=cfg, stream=stream)

        return launch

    def poison(self, output) -> None:
        from numba import cuda

        output.copy_to_device(np.full(output.shape, np.nan, dtype=np.float16))
        self._torch_results.pop(id(output), None)
        cuda.synchronize()

    def check(self, config, workload, inputs, output) -> float:
        if config.get("IMPL") == "torch_sdpa":
            res = self._torch_results.get(id(output))
            if res is None:
                return float("inf")
            out = res.transpose(1, 2)[0].double().cpu().numpy()  # [1, H, nt, D] -> [nt, H, D]
        else:
            out = output.copy_to_host()
        return rel_l2(out, _reference(*inputs))

    def tolerance(self, config, workload) -> float:
        return 1e-2

    def cost(self, workload: Workload, config=None) -> Cost:
        """Causal: 4·nt²·n_heads·D / 2 FLOPs (half of QK^T and PV); bytes: q, k, v read + o written (f16)."""
        s = workload.shape
        nt, h, hk, ntk, hd = s["nt"], s["n_heads"], s["n_kv_heads"], s["nt_kv"], s["head_dim"]
        return Cost(flops=4.0 * nt * ntk * h * hd / 2, bytes=2.0 * hd * (2 * nt * h + 2 * ntk * hk))

    def kernels(self, config, workload):
        if config.get("IMPL") == "torch_sdpa":
            return []
        from kernels import attention as kernel

        built = kernel.build(self._knobs(config), head_dim=workload.shape["head_dim"])
        g = built.geometry
        return [KernelInstance(f"flash_attention[BK={g.bk},MMA={g.mma},D={g.head_dim}]",
                               built.kernel,
                               kernel.SIGNATURE, g.threads, g.smem_bytes)]

    def _torch_launch(self, workload: Workload):
        """The vendor arm: `scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)` on the harness's
        stream over [1, H, nt, D] views of the same f16 inputs (no copies; torch < 2.5 without enable_gqa gets K/V
        repeated per group once per input set, outside the timed launches). SDPA allocates its own output, so the
        result is kept for `check` rather than copied into our buffer (a copy would add ~2·nt·H·256 bytes of
        traffic to torch's time). Torch views are made on the first launch of each input set (the correctness gate
        and the warm-up touch every set before any graph capture). RuntimeError when torch with CUDA is missing."""
        try:
            import torch
            import torch.nn.functional as F
        except ImportError:
            raise RuntimeError("IMPL=torch_sdpa needs torch with CUDA (not importable here); the vendor arm is skipped") from None
        if not torch.cuda.is_available():
            raise RuntimeError("IMPL=torch_sdpa needs torch with CUDA; torch sees no GPU")
        s = workload.shape
        if s["nt"] != s["nt_kv"]:
            raise RuntimeError("IMPL=torch_sdpa: is_causal aligns the mask top-left; only nt == nt_kv is comparable")
        group = s["n_heads"] // s["n_kv_heads"]
        views: dict[int, tuple] = {}
        results = self._torch_results

        def launch(inputs, output, stream):
            key = id(inputs)
            if key not in views:
                q, k, v = (torch.as_tensor(x, device="cuda").unsqueeze(0).transpose(1, 2) for x in inputs)
                try:
                    F.scaled_dot_product_attention(q[:, :, :1], k[:, :, :1], v[:, :, :1], is_causal=True, enable_gqa=True)
                    gqa = True
                except (TypeError, RuntimeError):
                    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
                    gqa = False
                torch.cuda.synchronize()
                views[key] = (q, k, v, gqa)
            q, k, v, gqa = views[key]
            with torch.cuda.stream(torch.cuda.ExternalStream(int(stream.handle))):
                if gqa:
                    res = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                else:
                    res = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            results[id(output)] = res

        return launch


def _reference(q, k, v) -> np.ndarray:
    """float64 host array [nt, H, D]: causal attention (bottom-right aligned: query i at position
    i + nt_kv - nt) of the same f16 device inputs, torch f32 on the GPU when available, else numpy float64."""
    nt, h, d = q.shape
    ntk, hk, _ = k.shape
    group = h // hk
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and torch.cuda.is_available():
        tq, tk, tv = (torch.as_tensor(x, device="cuda").float().transpose(0, 1) for x in (q, k, v))  # [H, n, D]
        tk, tv = tk.repeat_interleave(group, 0), tv.repeat_interleave(group, 0)
        mask = torch.arange(ntk, device="cuda")[None, :] <= torch.arange(nt, device="cuda")[:, None] + (ntk - nt)
        prev = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            s = (tq @ tk.transpose(1, 2)) / np.sqrt(d)
            s = s.masked_fill(~mask, float("-inf"))
            return (torch.softmax(s, dim=-1) @ tv).transpose(0, 1).double().cpu().numpy()
        finally:
            torch.backends.cuda.matmul.allow_tf32 = prev
    return reference_numpy(q.copy_to_host(), k.copy_to_host(), v.copy_to_host())


def reference_numpy(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool = True) -> np.ndarray:
    """float64 causal (bottom-right aligned) GQA attention of host arrays q [nt, H, D], k/v [nt_kv, Hk, D]."""
    nt, h, d = q.shape
    ntk, hk, _ = k.shape
    group = h // hk
    out = np.zeros((nt, h, d))
    mask = np.arange(ntk)[None, :] > np.arange(nt)[:, None] + (ntk - nt)
    for head in range(h):
        s = q[:, head].astype(np.float64) @ k[:, head // group].astype(np.float64).T / np.sqrt(d)
        if causal:
            s[mask] = -np.inf
        s -= s.max(axis=1, keepdims=True)
        p = np.exp(s)
        p /= p.sum(axis=1, keepdims=True)
        out[:, head] = p @ v[:, head // group].astype(np.float64)
    return out


register(AttentionExperiment())
