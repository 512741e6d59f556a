"""numpy stand-ins for the tensor-core GEMM and flash attention, for engine tests in the CUDA simulator (which
needs tens of minutes for the real kernels at model shapes; each kernel is tested alone in the simulator, and the
whole engine with every real kernel runs in the `gpu` tests)."""

from __future__ import annotations

import numpy as np


def numpy_gemm(a, b, out=None, *, config=None, stream=0):
    """Stand-in for gemm_f16 in the simulator session: f32 numpy product of the same f16 operands."""
    result = a.copy_to_host().astype(np.float32) @ b.copy_to_host().astype(np.float32).T
    out.copy_to_device(result.astype(np.float32))
    return out


def numpy_attention(q, k, v, out=None, *, causal=True, config=None, stream=0):
    """Stand-in for flash_attention in the simulator session: causal GQA softmax attention in float64."""
    qh, kh, vh = (x.copy_to_host().astype(np.float64) for x in (q, k, v))
    nt, heads, dim = qh.shape
    group = heads // kh.shape[1]
    offset = kh.shape[0] - nt
    res = np.empty_like(qh)
    for h in range(heads):
        s = qh[:, h] @ kh[:, h // group].T / np.sqrt(dim)
        s[np.triu_indices(nt, 1 + offset, kh.shape[0])] = -np.inf
        p = np.exp(s - s.max(axis=1, keepdims=True))
        res[:, h] = (p / p.sum(axis=1, keepdims=True)) @ vh[:, h // group]
    out.copy_to_device(res.astype(np.float16))
    return out


def use_standins(monkeypatch) -> None:
    """Route the engine's GEMM and flash attention to the stand-ins for one test."""
    import kernels.attention
    import kernels.gemm_f16

    monkeypatch.setattr(kernels.gemm_f16, "gemm_f16", numpy_gemm)
    monkeypatch.setattr(kernels.attention, "flash_attention", numpy_attention)
