"""numpy stand-ins for the tensor-core GEMMs (f16 and fused-dequantization), flash attention and the weight
dequantization, for engine tests in the
CUDA simulator (which needs tens of minutes for the real kernels at model shapes; each kernel is tested alone in the
simulator — dequantization of every type against gguf's in tests/test_dequant.py — and the whole engine with every
real kernel runs in the `gpu` tests)."""

from __future__ import annotations

import numpy as np


def numpy_gemm(a, b, out=None, *, config=None, stream=0, partials=None, accumulate=False):
    """Stand-in for gemm_f16 in the simulator session: f32 numpy product of the same f16 operands (added to out
    with ``accumulate``)."""
    result = a.copy_to_host().astype(np.float32) @ b.copy_to_host().astype(np.float32).T
    if accumulate:
        result = out.copy_to_host() + result
    out.copy_to_device(result.astype(np.float32))
    return out


def numpy_gemm_split(a, b, out=None, *, config=None, stream=0, partials=None):
    """Stand-in for gemm_f16_split in the simulator session: the numpy product split over k into two f32 slices
    (so the consumer's slice sum is exercised), in a new flat array."""
    from numba import cuda

    a32, b32 = a.copy_to_host().astype(np.float32), b.copy_to_host().astype(np.float32)
    half = a32.shape[1] // 2
    parts = [a32[:, :half] @ b32[:, :half].T, a32[:, half:] @ b32[:, half:].T]
    return cuda.to_device(np.concatenate([p.reshape(-1) for p in parts]).astype(np.float32)), 2


def numpy_gemm_glu(a, b, out=None, *, config=None, stream=0, partials=None):
    """Stand-in for gemm_f16_glu in the simulator session: the numpy product of `numpy_gemm`, then silu(g) * u in
    f32 rounded to f16 (b's rows: gate, then up)."""
    c = a.copy_to_host().astype(np.float32) @ b.copy_to_host().astype(np.float32).T
    g, u = np.split(c, 2, axis=1)
    out.copy_to_device((g / (np.float32(1.0) + np.exp(-g)) * u).astype(np.float16))
    return out


def _fused_weight(segments, qtype, kdim):
    """gguf's dequantization of `gemm_fused_regs`'s stacked segments, rounded to f16 as a device array [od, id]."""
    from numba import cuda

    rows = []
    for raw, od in segments:
        out = cuda.device_array((od, kdim), dtype=np.float16)
        rows.append(gguf_dequantize(raw, qtype, od, kdim, out=out).copy_to_host())
    return cuda.to_device(np.concatenate(rows))


def numpy_gemm_fused(a, segments, qtype, out=None, *, config=None, stream=0, partials=None, accumulate=False):
    """Stand-in for gemm_fused_regs in the simulator session: `numpy_gemm` on gguf's dequantization of the segments."""
    return numpy_gemm(a, _fused_weight(segments, qtype, a.shape[1]), out, accumulate=accumulate)


def numpy_gemm_fused_glu(a, segments, qtype, out=None, *, config=None, stream=0, partials=None):
    """Stand-in for gemm_fused_regs_glu: `numpy_gemm_glu` on gguf's dequantization of the segments."""
    return numpy_gemm_glu(a, _fused_weight(segments, qtype, a.shape[1]), out)


def numpy_gemm_fused_split(a, segments, qtype, out=None, *, config=None, stream=0, partials=None):
    """Stand-in for gemm_fused_regs_split: `numpy_gemm_split` on gguf's dequantization of the segments."""
    return numpy_gemm_split(a, _fused_weight(segments, qtype, a.shape[1]), out)


def gguf_dequantize(raw, qtype, od, id, out=None, stream=0, tpb=None):
    """Stand-in for `kernels.quant.dequantize` in the simulator session: gguf's own dequantization, rounded to f16
    (what the kernel is tested to equal element for element), written into ``out``'s rows."""
    from gguf import quants

    from kernels.quant.formats import block_format

    values = quants.dequantize(raw.copy_to_host().reshape(od, -1), block_format(qtype).qtype)
    out.copy_to_device(np.asarray(values, dtype=np.float32).reshape(od, id).astype(np.float16))
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
    """Route the engine's GEMM (the fused ones too), flash attention and prefill dequantization to the stand-ins for
    one test."""
    import kernels.attention
    import kernels.gemm_f16
    import kernels.gemm_fused_regs
    import kernels.quant

    monkeypatch.setattr(kernels.quant, "dequantize", gguf_dequantize)
    monkeypatch.setattr(kernels.gemm_f16, "gemm_f16", numpy_gemm)
    monkeypatch.setattr(kernels.gemm_f16, "gemm_f16_split", numpy_gemm_split)
    monkeypatch.setattr(kernels.gemm_f16, "gemm_f16_glu", numpy_gemm_glu)
    monkeypatch.setattr(kernels.gemm_fused_regs, "gemm_fused_regs", numpy_gemm_fused)
    monkeypatch.setattr(kernels.gemm_fused_regs, "gemm_fused_regs_split", numpy_gemm_fused_split)
    monkeypatch.setattr(kernels.gemm_fused_regs, "gemm_fused_regs_glu", numpy_gemm_fused_glu)
    monkeypatch.setattr(kernels.attention, "flash_attention", numpy_attention)


def use_simulator_decode_shapes(monkeypatch) -> None:
    """Decode mat-vecs with f32 inputs launched as one warp a row, 8 rows a block (`kernels.gemv` supports it for
    every format; the default is two warps a row): fewer simulated threads, the same arithmetic per row. Give the
    engine ``DecodeOptions(attn_splits=1)`` too (one decode-attention split; the default 64 and their combine are
    tested alone in tests/test_attention.py). The default shapes run on the GPU in the `gpu` tests."""
    import minfer_cli.engine.gemv_policy as policy

    monkeypatch.setattr(policy, "GEMV_F32", {"rows_per_block": 8, "warps_per_row": 1})
