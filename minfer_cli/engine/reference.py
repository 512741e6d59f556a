"""The reference forward pass: plain numpy float64 on the host, from gguf-py's dequantized weights.

This is the oracle the GPU engine is compared with, so it is written to be obviously correct, not fast (tiny
models only). One decoder layer of llama / qwen2 (llama.cpp ``llm_build_llama`` / ``llm_build_qwen2``):

    h  = RMSNorm(x) * attn_norm
    q  = h Wq^T (+ bq),  k = h Wk^T (+ bk),  v = h Wv^T (+ bv)        per head, head h = rows h*hd .. h*hd+hd-1
    q, k = RoPE(q, pos), RoPE(k, pos)        neox (qwen2): pairs (i, i + hd/2); norm (llama): pairs (2i, 2i+1);
                                             pair i turns by pos * base^(-2i/hd) / factor_i
                                             (factor: rope_freqs.weight, Llama 3.1+; else 1)
    a  = softmax(q k^T / sqrt(hd) + causal mask) v     query head h reads KV head h // (n_heads / n_kv_heads)
    x  = x + a Wo^T
    h  = RMSNorm(x) * ffn_norm
    x  = x + (silu(h Wg^T) * (h Wu^T)) Wd^T
    logits = (RMSNorm(x) * output_norm) Wout^T     Wout = token_embd when the output is tied

RMSNorm(x) = x / sqrt(mean(x^2) + eps). Weights ``W[od, id]`` are the GGUF tensors dequantized by
``gguf.quants.dequantize`` (float32, exactly what the dequant kernels reproduce) and widened to float64, when a
layer needs them (`Reference` keeps them for tiny models, or streams them layer by layer for large ones).
"""

from __future__ import annotations

import numpy as np

from minfer_cli.engine.config import ModelConfig, TensorSpec
from minfer_cli.engine.weights import ModelWeights


def dequantize_tensor(spec: TensorSpec, raw: np.ndarray, dtype=np.float64) -> np.ndarray:
    """Array of numpy shape ``spec.numpy_shape`` (``[od, id]`` for a matrix) from the tensor's bytes: gguf's float32
    values (``quants.dequantize``; F32/F16 as stored), widened to ``dtype`` (float64 by default)."""
    from gguf import quants

    raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
    if spec.qtype == "F32":
        flat = raw.view(np.float32)
    elif spec.qtype == "F16":
        flat = raw.view(np.float16)
    else:
        flat = quants.dequantize(raw.reshape(spec.od, -1), spec.ggml_type)
    return np.asarray(flat, dtype=dtype).reshape(spec.numpy_shape)


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x: np.ndarray, positions: np.ndarray, base: float, style: str, factors: np.ndarray | None = None) -> np.ndarray:
    """Rotate ``x[T, heads, hd]`` by position: pair i turns by ``pos * base^(-2i/hd) / factors[i]`` (see module
    docstring; ``factors`` None: all 1)."""
    hd = x.shape[-1]
    inv = base ** (-np.arange(0, hd // 2, dtype=np.float64) * 2.0 / hd)
    if factors is not None:
        inv = inv / factors
    ang = positions.astype(np.float64)[:, None] * inv[None, :]  # [T, hd/2]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    if style == "neox":
        a, b = x[..., : hd // 2], x[..., hd // 2 :]
    else:
        a, b = x[..., 0::2], x[..., 1::2]
    ra, rb = a * cos - b * sin, a * sin + b * cos
    out = np.empty_like(x)
    if style == "neox":
        out[..., : hd // 2], out[..., hd // 2 :] = ra, rb
    else:
        out[..., 0::2], out[..., 1::2] = ra, rb
    return out


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Causal GQA attention: ``q[T, H, hd]``, ``k, v[T, KV, hd]`` -> ``[T, H * hd]`` (heads concatenated)."""
    t, n_heads, hd = q.shape
    group = n_heads // k.shape[1]
    mask = np.triu(np.ones((t, t), dtype=bool), k=1)  # key j > query i is masked
    out = np.empty((t, n_heads, hd))
    for h in range(n_heads):
        kv = h // group
        s = q[:, h, :] @ k[:, kv, :].T / np.sqrt(hd)
        s[mask] = -np.inf
        s -= s.max(axis=1, keepdims=True)
        p = np.exp(s)
        p /= p.sum(axis=1, keepdims=True)
        out[:, h, :] = p @ v[:, kv, :]
    return out.reshape(t, n_heads * hd)


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


OUTPUT_ROWS = 8192
"""Rows of the output matrix dequantized at a time when logits are computed (float64: 8192 x 4096 x 8 = 256 MiB)."""


class Reference:
    """The float64 model. ``Reference(weights)`` dequantizes each tensor when a layer first needs it and keeps it
    (tiny models, many forwards); ``Reference(weights, keep=False)`` streams: a layer's tensors are dequantized for
    that layer and dropped after it, the embedding rows of the tokens only, the output matrix `OUTPUT_ROWS` rows at a
    time, so a 7-8B model needs a few GB of host memory, not the ~64 GB of all its weights in float64.
    ``progress(text, fraction)`` is called per layer."""

    def __init__(self, weights: ModelWeights, keep: bool = True, progress=None):
        self.config: ModelConfig = weights.config
        self.weights = weights
        self.keep = keep
        self.progress = progress
        self.w: dict[str, np.ndarray] = {}

    def _tensor(self, name: str) -> np.ndarray:
        if name in self.w:
            return self.w[name]
        spec = self.weights.spec(name)
        value = dequantize_tensor(spec, self.weights.to_host(name))
        if self.keep or spec.od == 1:  # vectors (norms, biases, rope factors) are small: always kept
            self.w[name] = value
        return value

    def _rows(self, name: str, rows: np.ndarray) -> np.ndarray:
        """Rows ``rows`` of matrix ``name`` in float64, dequantizing only those rows' bytes (unless kept)."""
        if self.keep:
            return self._tensor(name)[rows]
        spec = self.weights.spec(name)
        raw = self.weights.to_host(name).reshape(spec.od, -1)[rows]
        row_spec = type(spec)(spec.name, (spec.id, len(rows)), spec.qtype)
        return dequantize_tensor(row_spec, raw)

    def _layer(self, x: np.ndarray, i: int, positions: np.ndarray) -> np.ndarray:
        c, b = self.config, f"blk.{i}."
        w = self._tensor
        t = x.shape[0]
        h = rms_norm(x, w(b + "attn_norm.weight"), c.rms_eps)
        q, k, v = (h @ w(b + p + ".weight").T for p in ("attn_q", "attn_k", "attn_v"))
        if c.qkv_bias:
            q, k, v = q + w(b + "attn_q.bias"), k + w(b + "attn_k.bias"), v + w(b + "attn_v.bias")
        factors = w("rope_freqs.weight") if c.rope_freqs else None
        q = rope(q.reshape(t, c.n_heads, c.head_dim), positions, c.rope_base, c.rope_style, factors)
        k = rope(k.reshape(t, c.n_kv_heads, c.head_dim), positions, c.rope_base, c.rope_style, factors)
        v = v.reshape(t, c.n_kv_heads, c.head_dim)
        x = x + attention(q, k, v) @ w(b + "attn_output.weight").T
        h = rms_norm(x, w(b + "ffn_norm.weight"), c.rms_eps)
        a = silu(h @ w(b + "ffn_gate.weight").T) * (h @ w(b + "ffn_up.weight").T)
        return x + a @ w(b + "ffn_down.weight").T

    def hidden_states(self, tokens) -> list[np.ndarray]:
        """The residual stream ``[T, hidden]`` after the embedding and after each layer (n_layers + 1 arrays)."""
        tokens = np.asarray(tokens, dtype=np.int64)
        if tokens.ndim != 1 or tokens.size == 0 or tokens.min() < 0 or tokens.max() >= self.config.vocab:
            raise ValueError(f"tokens must be a non-empty 1-D sequence of ids in [0, {self.config.vocab})")
        positions = np.arange(tokens.size)
        x = self._rows("token_embd.weight", tokens)
        states = [x]
        for i in range(self.config.n_layers):
            x = self._layer(x, i, positions)
            states.append(x)
            if self.progress:
                self.progress(f"reference layer {i + 1}/{self.config.n_layers}", (i + 1) / self.config.n_layers)
        return states

    def logits(self, x: np.ndarray) -> np.ndarray:
        """Logits ``[T, vocab]`` of residual-stream rows ``x [T, hidden]`` (final RMSNorm, then the output matrix,
        token_embd when tied)."""
        h = rms_norm(x, self._tensor("output_norm.weight"), self.config.rms_eps)
        name = "token_embd.weight" if self.config.tied_output else "output.weight"
        if self.keep:
            return h @ self._tensor(name).T
        vocab = self.config.vocab
        return np.concatenate([h @ self._rows(name, np.arange(r, min(r + OUTPUT_ROWS, vocab))).T
                               for r in range(0, vocab, OUTPUT_ROWS)], axis=1)

    def forward(self, tokens, last_only: bool = False) -> np.ndarray:
        """Logits ``[T, vocab]`` for every position of ``tokens`` (ids, positions 0..T-1), or ``[vocab]`` for the
        last one when ``last_only``."""
        x = self.hidden_states(tokens)[-1]
        logits = self.logits(x[-1:] if last_only else x)
        return logits[0] if last_only else logits

    def greedy(self, tokens, steps: int) -> list[int]:
        """``steps`` greedy tokens after ``tokens``, each from a full re-forward of the whole sequence so far."""
        seq = [int(t) for t in tokens]
        new = []
        for _ in range(steps):
            nxt = int(np.argmax(self.forward(seq, last_only=True)))
            seq.append(nxt)
            new.append(nxt)
        return new
