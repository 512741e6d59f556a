"""Model shapes and helpers shared by the decode tests (tests/test_decode.py, tests/test_gemv_policy.py,
tests/test_decode_knobs.py); the ``micro_weights`` fixture built from `micro` is in tests/conftest.py."""

from __future__ import annotations

import dataclasses

import numpy as np

from minfer_cli.engine.presets import DEFAULT_PRESET, preset


def micro():
    """`tiny` cut to 1 layer, ffn 256 and vocab 256 (GQA 2/1, head_dim 128, qkv bias, Q4_K/Q6_K): ~25 s a step in
    the simulator instead of ~130 s."""
    return dataclasses.replace(preset("tiny"), name="micro", n_layers=1, ffn=256, vocab=256)


def qwen2_shaped(layers: int = 2, vocab: int = 4096):
    """The default preset's (Qwen2-7B) shapes cut to ``layers`` layers and a ``vocab``-token head."""
    return dataclasses.replace(preset(DEFAULT_PRESET), name="qwen2-7b-shaped", n_layers=layers, vocab=vocab)


def generate_with_logits(engine, n: int):
    """n greedy tokens from a started engine, one graph replay each, and the float64 logits each was picked from."""
    tokens, logits = [], []
    for _ in range(n):
        tokens += engine.generate(1)
        logits.append(engine.logits.copy_to_host().astype(np.float64))
    return tokens, logits
