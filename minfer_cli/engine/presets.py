"""Named model configs: the shapes of real models (weights are generated, see `weights.synth_weights`).

Sources: each model's Hugging Face ``config.json`` as llama.cpp's converter maps it to GGUF metadata
(Qwen2-7B: 28 layers, 3584 hidden, 18944 FFN, 28/4 heads, vocab 152064, theta 1e6, eps 1e-6, QKV bias;
Llama-2-7B: 32 layers, 4096, 11008, 32/32 heads, vocab 32000, theta 1e4, eps 1e-5; Meta-Llama-3-8B: 32
layers, 4096, 14336, 32/8 heads, vocab 128256, theta 5e5, eps 1e-5; Llama-3.1-8B: the same shapes, context 131072 and a ``rope_freqs``
tensor; Qwen2-1.5B: 28 layers, 1536, 8960, 12/2
heads, vocab 151936, theta 1e6, eps 1e-6, QKV bias, tied embedding; Llama-3.2-3B: 28 layers, 3072, 8192, 24/8
heads, vocab 128256, theta 5e5, eps 1e-5, tied embedding, a ``rope_freqs`` tensor; Llama-3.2-1B: 16 layers, 2048,
8192, 32/8 heads of head_dim 64, vocab 128256, theta 5e5, eps 1e-5, tied embedding, a ``rope_freqs`` tensor;
Meta-Llama-3-70B: 80 layers,
8192, 28672, 64/8 heads, vocab 128256, theta 5e5, eps 1e-5). A tied embedding is Q6_K, as llama.cpp's quantizer
writes it, and a 70B's attn_v Q5_K where Q4_K_M gives it no Q6_K (`config.mix_type`). ``tiny`` and ``tiny-llama`` are
simulator-sized (every matrix input dim a multiple of 256, as the K-quants need); ``tiny-llama`` covers the
other RoPE style and a tied output.
"""

from __future__ import annotations

from minfer_cli.engine.config import ModelConfig
from minfer_cli.engine.errors import ModelError

DEFAULT_PRESET = "qwen2-7b-q4_k_m"


def _qwen2(name, **kw) -> ModelConfig:
    base = dict(arch="qwen2", name=name, qkv_bias=True, rope_style="neox", tied_output=False)
    return ModelConfig(**{**base, **kw}).validate()


def _llama(name, **kw) -> ModelConfig:
    base = dict(arch="llama", name=name, qkv_bias=False, rope_style="norm", tied_output=False)
    return ModelConfig(**{**base, **kw}).validate()


PRESETS: dict[str, ModelConfig] = {
    "qwen2-7b-q4_k_m": _qwen2(
        "qwen2-7b-q4_k_m", n_layers=28, hidden=3584, ffn=18944, n_heads=28, n_kv_heads=4, head_dim=128,
        vocab=152064, rope_base=1e6, rms_eps=1e-6, context_length=32768,
    ),
    "llama2-7b-q4_k_m": _llama(
        "llama2-7b-q4_k_m", n_layers=32, hidden=4096, ffn=11008, n_heads=32, n_kv_heads=32, head_dim=128,
        vocab=32000, rope_base=1e4, rms_eps=1e-5, context_length=4096,
    ),
    "llama3-8b-q4_k_m": _llama(
        "llama3-8b-q4_k_m", n_layers=32, hidden=4096, ffn=14336, n_heads=32, n_kv_heads=8, head_dim=128,
        vocab=128256, rope_base=5e5, rms_eps=1e-5, context_length=8192,
    ),
    "llama3.1-8b-q4_k_m": _llama(
        "llama3.1-8b-q4_k_m", n_layers=32, hidden=4096, ffn=14336, n_heads=32, n_kv_heads=8, head_dim=128,
        vocab=128256, rope_base=5e5, rms_eps=1e-5, context_length=131072, rope_freqs=True,
    ),
    "llama3-70b-q4_k_m": _llama(
        "llama3-70b-q4_k_m", n_layers=80, hidden=8192, ffn=28672, n_heads=64, n_kv_heads=8, head_dim=128,
        vocab=128256, rope_base=5e5, rms_eps=1e-5, context_length=8192,
    ),
    "qwen2-1.5b-q4_k_m": _qwen2(
        "qwen2-1.5b-q4_k_m", n_layers=28, hidden=1536, ffn=8960, n_heads=12, n_kv_heads=2, head_dim=128,
        vocab=151936, rope_base=1e6, rms_eps=1e-6, context_length=32768, tied_output=True,
    ),
    "llama3.2-3b-q4_k_m": _llama(
        "llama3.2-3b-q4_k_m", n_layers=28, hidden=3072, ffn=8192, n_heads=24, n_kv_heads=8, head_dim=128,
        vocab=128256, rope_base=5e5, rms_eps=1e-5, context_length=131072, tied_output=True, rope_freqs=True,
    ),
    "llama3.2-1b-q4_k_m": _llama(
        "llama3.2-1b-q4_k_m", n_layers=16, hidden=2048, ffn=8192, n_heads=32, n_kv_heads=8, head_dim=64,
        vocab=128256, rope_base=5e5, rms_eps=1e-5, context_length=131072, tied_output=True, rope_freqs=True,
    ),
    "tiny": _qwen2(
        "tiny", n_layers=2, hidden=256, ffn=512, n_heads=2, n_kv_heads=1, head_dim=128, vocab=512,
        rope_base=1e4, rms_eps=1e-6, context_length=256,
    ),
    "tiny-llama": _llama(
        "tiny-llama", n_layers=2, hidden=256, ffn=512, n_heads=2, n_kv_heads=1, head_dim=128, vocab=512,
        rope_base=1e4, rms_eps=1e-5, context_length=256, tied_output=True,
    ),
}


def preset(name: str) -> ModelConfig:
    """The config called ``name``. Raises ModelError listing the valid names."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ModelError(f"unknown model preset {name!r}; presets: {', '.join(PRESETS)}") from None
