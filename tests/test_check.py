"""`minfer model check`: the engine against the float64 reference, under the CUDA simulator (numpy stand-ins for
the GEMM and flash attention, `tests/engine_standins.py`): a faithful engine passes, a broken one fails and the
layer where the error enters is named; the CLI prints, exports and records it."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from minfer_cli import ledger
from minfer_cli.engine.check import check, compare
from minfer_cli.engine.options import DecodeOptions, EngineOptions
from minfer_cli.engine.presets import preset
from minfer_cli.main import app
from tests.engine_standins import use_simulator_decode_shapes, use_standins

EXACT = EngineOptions(decode=DecodeOptions(graphs=False, mmvq=False))


@pytest.fixture(scope="module")
def micro():
    from minfer_cli.engine.weights import synth_weights

    config = dataclasses.replace(preset("tiny"), name="micro", n_layers=1, ffn=256, vocab=256)
    return synth_weights(config, int(np.random.default_rng().integers(0, 2**31)))


def test_a_broken_layer_fails_and_is_named(micro, monkeypatch):
    """RoPE skipped in the engine: the prefill's logits leave the tolerance and the error enters at layer 1."""
    import kernels.rope

    use_standins(monkeypatch)
    monkeypatch.setattr(kernels.rope, "rope", lambda *args, **kwargs: None)
    result = check(micro, EXACT, prompt=6, steps=0, seed=3)
    assert not result.passed and result.worst > 1e-2
    assert result.layers[0] < 1e-6 and result.layers[1] > 1e-2 and result.worst_layer == 1


def test_compare_tells_a_near_tie_from_a_flip():
    rng = np.random.default_rng()
    want = rng.standard_normal(1000)
    top, second = np.argsort(want)[-2:][::-1]
    want[top] = want[second] + 1e-4  # a near tie
    got = want + rng.standard_normal(1000) * 1e-3
    got[second], got[top] = want[top] + 1e-3, want[top] - 1e-3  # swapped by errors of the typical size
    tie = compare("decode", 7, got, want)
    assert not tie.top1_agrees and tie.near_tie and tie.top5 >= 4
    want[top] = want[second] + 1.0  # a clear winner, outvoted by an error on one logit only
    flip = compare("decode", 7, np.where(np.arange(1000) == second, want[top] + 0.01, want), want)
    assert not flip.top1_agrees and not flip.near_tie
    assert compare("prefill", 0, np.full(1000, np.nan), want).rel_l2 == float("inf")


def test_cli_prints_exports_and_records_a_check(tmp_path, monkeypatch):
    use_standins(monkeypatch)
    runner = CliRunner()
    r = runner.invoke(app, ["model", "check", "--preset", "tiny", "--prompt", "4", "--steps", "0", "-f", "json",
                            "--arm", "MMVQ=0", "--record", "--ledger", str(tmp_path)])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["passed"] and data["prefill_rel_l2"] < 1e-2 and len(data["layers_rel_l2"]) == 3
    (rec,) = ledger.load(tmp_path).records
    assert rec["kind"] == "check" and rec["verdict"] == "PASS" and not ledger.validate(rec)
    shown = runner.invoke(app, ["ledger", "show", "--ledger", str(tmp_path)])
    assert shown.exit_code == 0 and "PASS" in shown.stdout


@pytest.mark.parametrize("args, message", [
    (["--preset", "tiny", "--prompt", "300"], "exceed the model's context of 256 tokens"),
    (["nope.gguf"], "nope.gguf: no such file"),
    (["--preset", "tiny", "-f", "xml"], "unknown --format"),
    (["--preset", "tiny", "--arm", "VEC=4"], "VEC"),
])
def test_cli_refuses_bad_input_before_gpu_work(args, message):
    r = CliRunner().invoke(app, ["model", "check", *args])
    assert r.exit_code == 2 and message in r.output, r.output


# Every tensor type in every role (llama.cpp's quantizer may put any type anywhere): two micro models whose nine
# matrix roles hold, between them, all 14 types the dequant kernels read.
ROLES = ("token_embd", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down", "output")
MIXES = {
    "untied": ("Q5_1", "Q4_0", "Q5_0", "Q8_0", "Q2_K", "Q3_K", "Q5_K", "Q4_1", "MXFP4"),
    "tied": ("BF16", "F16", "F32", "Q6_K", "Q4_K", "MXFP4", "Q2_K", "Q3_K", None),
}


def _scaled_blocks(qtype: str, od: int, id: int, rng) -> np.ndarray:
    """Random valid blocks of ``qtype`` whose dequantized weights have std ~1/sqrt(id), as a trained model's do (raw
    random K-quant blocks reach std 20-40, whose activations would overflow f16): the f16 scale fields are scaled,
    an MXFP4 block's power-of-two exponent shifted."""
    from gguf import quants
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    from minfer_cli.quant_blocks import _F16_SCALE_OFFSETS, random_blocks

    raw = random_blocks(qtype, od, id, rng)
    if qtype in ("F32", "F16", "BF16"):
        return raw
    factor = (1.0 / np.sqrt(id)) / quants.dequantize(raw.reshape(od, -1), GGMLQuantizationType[qtype]).std()
    blocks = raw.reshape(-1, GGML_QUANT_SIZES[GGMLQuantizationType[qtype]][1])
    if qtype == "MXFP4":
        blocks[:, 0] = np.clip(blocks[:, 0].astype(int) + int(np.round(np.log2(factor))), 1, 254).astype(np.uint8)
    for off in _F16_SCALE_OFFSETS.get(qtype, ()):
        scale = blocks[:, off:off + 2].copy().view(np.float16).astype(np.float32) * factor
        blocks[:, off:off + 2] = scale.astype(np.float16).view(np.uint8).reshape(-1, 2)
    return blocks.reshape(-1)


def _typed(weights, types, rng):
    from numba import cuda

    from minfer_cli.engine.config import TensorSpec

    for role, qtype in zip(ROLES, types):
        if qtype is None:
            continue
        for name in [n for n in weights.tensors if n.endswith(f"{role}.weight")]:
            spec = weights.spec(name)
            weights.tensors[name] = (TensorSpec(name, spec.shape, qtype),
                                     cuda.to_device(_scaled_blocks(qtype, spec.od, spec.id, rng)))
    return weights


@pytest.mark.parametrize("mix", list(MIXES))
def test_every_type_in_every_role_passes_the_check(mix, monkeypatch):
    """A faithful engine passes at the prefill and a decode step, whatever type each role holds; the report names
    both positions and the error after the embedding and after the one layer."""
    from kernels.quant.formats import SUPPORTED
    from minfer_cli.engine.weights import synth_weights

    assert (set(MIXES["untied"]) | set(MIXES["tied"])) - {None} >= set(SUPPORTED)
    use_standins(monkeypatch)
    use_simulator_decode_shapes(monkeypatch)
    rng = np.random.default_rng()
    tied = mix == "tied"
    config = dataclasses.replace(preset("tiny-llama" if tied else "tiny"), name=f"micro-{mix}", n_layers=1, ffn=256,
                                 vocab=256)
    assert config.tied_output == tied
    weights = _typed(synth_weights(config, int(rng.integers(0, 2**31))), MIXES[mix], rng)
    options = dataclasses.replace(EXACT, decode=dataclasses.replace(EXACT.decode, attn_splits=1))
    result = check(weights, options, prompt=4, steps=1, seed=int(rng.integers(0, 2**31)))
    assert result.passed, result.as_dict()
    assert [(p.phase, p.position) for p in result.positions] == [("prefill", 3), ("decode", 4)]
    assert len(result.layers) == 2 and all(e < 1e-2 for e in result.layers)
    assert 0 < result.worst < 1e-2  # f16 activations: close, never exact
