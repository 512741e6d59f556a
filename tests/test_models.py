"""Model configs, the Q4_K_M type mix, weights generated on the device, GGUF writing and loading, and the
float64 reference forward.

Simulator session: the ``tiny`` presets (synth through numba's CUDA simulator). ``gpu``: the 7B preset on a
real GPU (size, parameter count, time, finite samples).
"""

from __future__ import annotations

import math
import os
import time

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from minfer_cli.engine.config import ModelConfig, TensorSpec, tensor_specs, use_more_bits
from minfer_cli.engine.errors import ModelError
from minfer_cli.engine.presets import DEFAULT_PRESET, PRESETS, preset

SEED = int.from_bytes(os.urandom(4), "little")  # fresh each session; printed in failure messages


def _one_line(exc: BaseException) -> bool:
    return "\n" not in str(exc) and len(str(exc)) > 0


# ------------------------------------------------------------------------------------------ configs and specs


def test_presets_match_their_models():
    q = preset(DEFAULT_PRESET)
    assert DEFAULT_PRESET == "qwen2-7b-q4_k_m"
    assert (q.arch, q.n_layers, q.hidden, q.ffn, q.n_heads, q.n_kv_heads, q.head_dim, q.vocab) == (
        "qwen2", 28, 3584, 18944, 28, 4, 128, 152064)
    assert (q.rope_base, q.rms_eps, q.context_length, q.qkv_bias, q.rope_style, q.tied_output) == (
        1e6, 1e-6, 32768, True, "neox", False)
    l2, l3 = preset("llama2-7b-q4_k_m"), preset("llama3-8b-q4_k_m")
    assert (l2.n_layers, l2.hidden, l2.ffn, l2.n_kv_heads, l2.vocab, l2.rope_base, l2.qkv_bias) == (
        32, 4096, 11008, 32, 32000, 1e4, False)
    assert (l3.ffn, l3.n_kv_heads, l3.vocab, l3.rope_base, l3.context_length, l3.rope_style) == (
        14336, 8, 128256, 5e5, 8192, "norm")
    for cfg in PRESETS.values():  # every matrix's input dim a multiple of 256 (the K-quants need it)
        assert all(s.id % 256 == 0 for s in tensor_specs(cfg) if s.qtype != "F32")


def test_unknown_preset_is_a_model_error_listing_names():
    with pytest.raises(ModelError) as e:
        preset("gpt5")
    assert _one_line(e.value) and "tiny" in str(e.value) and DEFAULT_PRESET in str(e.value)


def test_use_more_bits_matches_llama_cpp_for_28_layers():
    # n/8 = 3, 7n/8 = 24 (C integer division); in between every third layer from 5
    assert [i for i in range(28) if use_more_bits(i, 28)] == [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27]
    assert [i for i in range(32) if use_more_bits(i, 32)] == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29,
                                                              30, 31]


@pytest.mark.parametrize("name, size", [("qwen2-1.5b-q4_k_m", "1.5B"), ("llama3.2-3b-q4_k_m", "3B"),
                                        ("llama3.2-1b-q4_k_m", "1B")])
def test_a_tied_embedding_takes_the_outputs_type(name, size):
    """llama.cpp's quantizer gives a model without output.weight an embedding of the output's type (Q6_K)."""
    from minfer_cli.engine.config import size_label

    cfg = preset(name)
    specs = {s.name: s for s in tensor_specs(cfg)}
    assert cfg.tied_output and "output.weight" not in specs
    assert specs["token_embd.weight"].qtype == "Q6_K" and specs["blk.0.attn_q.weight"].qtype == "Q4_K"
    assert size_label(sum(s.n_elements for s in specs.values()), cfg) == size


def test_q4_k_m_type_mix_at_28_layers():
    cfg = preset("qwen2-7b-q4_k_m")
    specs = {s.name: s for s in tensor_specs(cfg)}
    assert len(specs) == 1 + 28 * 12 + 2
    assert specs["token_embd.weight"].qtype == "Q4_K"
    assert specs["output.weight"].qtype == "Q6_K"
    assert specs["output_norm.weight"].qtype == "F32"
    promoted = {i for i in range(28) if use_more_bits(i, 28)}
    for i in range(28):
        b = f"blk.{i}."
        for role in ("attn_v.weight", "ffn_down.weight"):
            assert specs[b + role].qtype == ("Q6_K" if i in promoted else "Q4_K"), b + role
        for role in ("attn_q.weight", "attn_k.weight", "attn_output.weight", "ffn_gate.weight", "ffn_up.weight"):
            assert specs[b + role].qtype == "Q4_K", b + role
        for role in ("attn_norm.weight", "ffn_norm.weight", "attn_q.bias", "attn_k.bias", "attn_v.bias"):
            assert specs[b + role].qtype == "F32", b + role


def test_gguf_shape_order():
    cfg = preset(DEFAULT_PRESET)
    specs = {s.name: s for s in tensor_specs(cfg)}
    down = specs["blk.0.ffn_down.weight"]  # y[hidden] = W[hidden, ffn] . a[ffn]
    assert down.shape == (18944, 3584) and (down.od, down.id) == (3584, 18944) and down.numpy_shape == (3584, 18944)
    assert specs["blk.0.attn_k.weight"].shape == (3584, 512)
    assert specs["token_embd.weight"].shape == (3584, 152064)
    assert specs["blk.0.attn_k.bias"].shape == (512,)
    assert TensorSpec("x", (256, 4), "Q4_K").n_bytes == 4 * 144


def test_7b_size_and_params_as_llama_bench_reports():
    """llama-bench prints Qwen2-7B Q4_K_M as "qwen2 7B Q4_K - Medium | 4.36 GiB | 7.62 B"."""
    specs = tensor_specs(preset(DEFAULT_PRESET))
    size = sum(s.n_bytes for s in specs)
    params = sum(s.n_elements for s in specs)
    assert round(size / 2**30, 2) == 4.36
    assert round(params / 1e9, 2) == 7.62
    assert params == 7_615_616_512


def test_70b_type_mix_size_and_params_as_llama_cpp_writes_them():
    """llama.cpp's quantizer gives a 70B (80 layers, grouped KV heads: LLM_TYPE_70B) attn_v Q5_K where Q4_K_M
    would leave it Q4_K; llama-bench prints Meta-Llama-3-70B Q4_K_M as "llama 70B Q4_K - Medium | 39.59 GiB |
    70.55 B". An 80-layer llama without grouped heads is llama.cpp's 65B: no Q5_K."""
    from minfer_cli.engine.config import llm_type_70b, size_label

    cfg = preset("llama3-70b-q4_k_m")
    specs = {s.name: s for s in tensor_specs(cfg)}
    assert llm_type_70b(cfg)
    for i in range(80):
        more = use_more_bits(i, 80)
        assert specs[f"blk.{i}.attn_v.weight"].qtype == ("Q6_K" if more else "Q5_K"), i
        assert specs[f"blk.{i}.ffn_down.weight"].qtype == ("Q6_K" if more else "Q4_K"), i
        assert specs[f"blk.{i}.attn_k.weight"].qtype == "Q4_K"
    size, params = sum(s.n_bytes for s in specs.values()), sum(s.n_elements for s in specs.values())
    assert (round(size / 2**30, 2), round(params / 1e9, 2), size_label(params, cfg)) == (39.59, 70.55, "70B")
    mha = ModelConfig(**{**cfg.as_dict(), "n_kv_heads": 64, "ffn": 22016})  # LLaMA-1 65B's shape: llama.cpp's 65B
    assert not llm_type_70b(mha) and all(s.qtype != "Q5_K" for s in tensor_specs(mha))
    assert size_label(sum(s.n_elements for s in tensor_specs(mha)), mha) != "70B"
    assert not any(llm_type_70b(c) for c in PRESETS.values() if c is not cfg)


def test_bad_configs_are_model_errors():
    base = preset("tiny")
    with pytest.raises(ModelError) as e:
        ModelConfig(**{**base.as_dict(), "arch": "gpt2"}).validate()
    assert _one_line(e.value) and "gpt2" in str(e.value) and "qwen2" in str(e.value)
    with pytest.raises(ModelError, match="multiple of 256"):
        tensor_specs(ModelConfig(**{**base.as_dict(), "ffn": 320}))
    with pytest.raises(ModelError, match="Q4_K_M"):
        tensor_specs(base, mix="Q8_0")


# ---------------------------------------------------------------------------------- generated weights (device)


@pytest.fixture(scope="module")
def tiny():
    from minfer_cli.engine.weights import synth_weights

    return synth_weights(preset("tiny"), SEED)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q5_K", "Q6_K", "F32"])
def test_synth_kernel_bytes_follow_the_host_hash(qtype):
    """Non-scale words are exactly the documented hash of (key, word index); independent of the grid."""
    from numba import cuda

    from kernels.synth import synth, tensor_key, word_hash_host

    n_bytes = {"Q4_K": 144 * 3, "Q5_K": 176 * 3, "Q6_K": 210 * 3, "F32": 4 * 64}[qtype]
    key = tensor_key(SEED, 7)
    a = synth(cuda.device_array(n_bytes, np.uint8), qtype, key, blocks=1).copy_to_host()
    b = synth(cuda.device_array(n_bytes, np.uint8), qtype, key, blocks=3).copy_to_host()
    assert (a == b).all()
    if qtype == "Q4_K":
        words = a.view(np.uint64)
        assert int(words[5]) == word_hash_host(key, 5) and int(words[18 + 2]) == word_hash_host(key, 20)
    elif qtype == "Q5_K":
        words = a.view(np.uint64)
        assert int(words[21]) == word_hash_host(key, 21) and int(words[22 + 2]) == word_hash_host(key, 24)
        assert int(words[22]) != word_hash_host(key, 22)  # the second block's header word
    elif qtype == "Q6_K":
        words = a.view(np.uint16)
        assert int(words[3]) == word_hash_host(key, 3) & 0xFFFF


def test_synth_scale_fields(tiny):
    """Q4_K: d positive finite f16 in range, dmin = f16(7.5 d), mins equal scales; Q6_K: d in range."""
    from gguf import quants

    from minfer_cli.engine.weights import synth_params

    for name, (spec, _) in tiny.tensors.items():
        raw = tiny.to_host(name)
        if spec.qtype == "F32":
            continue
        params = synth_params(spec)
        lo, hi = (np.float16(x) for x in params["d_range"])
        if spec.qtype == "Q4_K":
            blocks = raw.reshape(-1, 144)
            d = blocks[:, 0:2].copy().view(np.float16).ravel()
            dmin = blocks[:, 2:4].copy().view(np.float16).ravel()
            assert np.all(dmin == (d.astype(np.float32) * np.float32(7.5)).astype(np.float16)), name
            sc, mn = quants.Q4_K.get_scale_min(blocks[:, 4:16].copy())
            assert np.array_equal(sc, mn), name
        else:
            d = raw.reshape(-1, 210)[:, 208:210].copy().view(np.float16).ravel()
        assert np.all(np.isfinite(d)) and np.all(d >= lo) and np.all(d <= hi), name


def test_synth_weights_are_valid_and_in_range(tiny):
    from minfer_cli.engine.reference import dequantize_tensor
    from minfer_cli.engine.weights import target_std

    specs = {s.name: s for s in tensor_specs(preset("tiny"))}
    assert list(tiny.tensors) == list(specs)
    for name, (spec, raw) in tiny.tensors.items():
        assert spec == specs[name] and raw.size == spec.n_bytes and raw.dtype == np.uint8
        w = dequantize_tensor(spec, tiny.to_host(name))
        assert np.all(np.isfinite(w)), f"{name} (seed {SEED})"
        std = target_std(spec)
        assert 0.8 * std < w.std() < 1.25 * std, f"{name}: std {w.std():.4g} vs target {std:.4g} (seed {SEED})"
        if spec.qtype == "F32":
            center = 0.0 if name.endswith(".bias") else 1.0
            assert np.all(np.abs(w - center) <= 0.1 + 1e-6), name
        else:
            assert abs(w.mean()) < 0.1 * std, f"{name}: mean {w.mean():.3g} (seed {SEED})"
            # no per-sub-block offsets: the 32-weight sub-block means carry ~1/32 of the variance, as if iid
            share = w.reshape(spec.od, -1, 32).mean(axis=2).var() / w.var()
            assert share < 0.06, f"{name}: sub-block means carry {share:.2f} of the variance"


def test_synth_q5_k_is_valid_centred_and_of_the_target_std():
    """Q5_K (a 70B's attn_v): gguf-py dequantizes the generated blocks to finite weights with the std
    `synth_params` aims at, mean ~ 0 in every 32-weight sub-block (dmin = 15.5 d, mins equal to scales)."""
    from gguf import GGMLQuantizationType, quants
    from numba import cuda

    from kernels.synth import synth, tensor_key
    from minfer_cli.engine.weights import synth_params, target_std

    spec = TensorSpec("blk.0.attn_v.weight", (8192, 64), "Q5_K")
    raw = synth(cuda.device_array(spec.n_bytes, np.uint8), "Q5_K", tensor_key(SEED, 3), **synth_params(spec))
    blocks = raw.copy_to_host().reshape(-1, 176)
    d = blocks[:, 0:2].copy().view(np.float16).ravel()
    dmin = blocks[:, 2:4].copy().view(np.float16).ravel()
    assert np.all(dmin == (d.astype(np.float32) * np.float32(15.5)).astype(np.float16))
    w = quants.dequantize(blocks.reshape(-1), GGMLQuantizationType.Q5_K).astype(np.float64)
    std = target_std(spec)
    assert np.all(np.isfinite(w)) and 0.8 * std < w.std() < 1.25 * std, f"std {w.std():.4g} vs {std:.4g} (seed {SEED})"
    assert abs(w.mean()) < 0.05 * std and w.reshape(-1, 32).mean(axis=1).var() / w.var() < 0.06, f"seed {SEED}"


def test_same_seed_same_bytes_other_seed_other_bytes(tiny):
    from minfer_cli.engine.weights import synth_weights

    again = synth_weights(preset("tiny"), SEED)
    other = synth_weights(preset("tiny"), SEED + 1)
    for name in tiny.tensors:
        a = tiny.to_host(name)
        assert np.array_equal(a, again.to_host(name)), name
        assert not np.array_equal(a, other.to_host(name)), name


def test_describe_size_params(tiny):
    assert tiny.describe() == "qwen2 1M Q4_K - Medium"
    assert tiny.size_bytes() == sum(s.n_bytes for s in tensor_specs(preset("tiny")))
    assert tiny.n_params() == sum(s.n_elements for s in tensor_specs(preset("tiny")))
    assert tiny.type_counts() == {"Q4_K": 13, "F32": 11, "Q6_K": 3}  # layer 1 of 2 promotes attn_v, ffn_down


# ------------------------------------------------------------------------------------------------ GGUF files


def test_write_then_load_round_trip(tiny, tmp_path):
    from gguf import GGUFReader

    from minfer_cli.engine.gguf_io import write_gguf
    from minfer_cli.engine.weights import load_gguf

    path = write_gguf(tiny, tmp_path / "tiny.gguf")
    back = load_gguf(path)
    assert back.config == tiny.config
    assert back.file_type == 15 and back.describe() == tiny.describe()
    assert list(back.tensors) == list(tiny.tensors)
    for name, (spec, _) in tiny.tensors.items():
        assert back.spec(name) == spec
        assert np.array_equal(back.to_host(name), tiny.to_host(name)), name
    r = GGUFReader(path)  # what llama.cpp reads
    assert r.fields["general.architecture"].contents() == "qwen2"
    assert r.fields["general.file_type"].contents() == 15
    assert r.fields["qwen2.attention.head_count_kv"].contents() == 1
    assert len(r.fields["tokenizer.ggml.tokens"].contents()) == 512
    t = {t.name: t for t in r.tensors}["blk.1.ffn_down.weight"]
    assert t.tensor_type.name == "Q6_K" and [int(d) for d in t.shape] == [512, 256]


def test_tied_output_and_rope_freqs_round_trip(tmp_path):
    import dataclasses

    from minfer_cli.engine.gguf_io import write_gguf
    from minfer_cli.engine.weights import load_gguf, synth_weights

    w = synth_weights(dataclasses.replace(preset("tiny-llama"), rope_freqs=True), SEED)
    assert "output.weight" not in w.tensors and w.spec("rope_freqs.weight").shape == (64,)
    back = load_gguf(write_gguf(w, tmp_path / "t.gguf"))
    assert back.config == w.config and back.config.tied_output and back.config.rope_style == "norm"
    assert back.config.rope_freqs and np.array_equal(back.to_host("rope_freqs.weight"), w.to_host("rope_freqs.weight"))
    factors = back.rope_factors().copy_to_host()
    assert factors.dtype == np.float32 and factors.shape == (64,) and (factors > 0).all()


def test_not_a_gguf_file(tmp_path):
    from minfer_cli.engine.weights import load_gguf

    p = tmp_path / "x.gguf"
    p.write_bytes(b"PK\x03\x04 definitely a zip" * 10)
    with pytest.raises(ModelError) as e:
        load_gguf(p)
    assert _one_line(e.value) and "not a GGUF file" in str(e.value)
    with pytest.raises(ModelError, match="no such file"):
        load_gguf(tmp_path / "missing.gguf")
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(ModelError, match="not a GGUF file"):
        load_gguf(empty)


def _small_gguf(path, arch="qwen2", tensor_type=None):
    """A GGUF with tiny's metadata (under ``arch``) and one token_embd tensor."""
    from gguf import GGUFWriter
    from gguf.constants import GGMLQuantizationType

    w = GGUFWriter(path, arch)
    w.add_block_count(2)
    w.add_embedding_length(256)
    w.add_feed_forward_length(512)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_context_length(256)
    w.add_layer_norm_rms_eps(1e-6)
    qt = tensor_type or GGMLQuantizationType.Q4_K
    from gguf.constants import GGML_QUANT_SIZES

    bs, ts = GGML_QUANT_SIZES[qt]
    w.add_tensor("token_embd.weight", np.zeros((512, 256 // bs * ts), np.uint8), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_truncated_file(tiny, tmp_path):
    from minfer_cli.engine.gguf_io import write_gguf
    from minfer_cli.engine.weights import load_gguf

    full = write_gguf(tiny, tmp_path / "full.gguf").read_bytes()
    for cut in (len(full) - 1000, len(full) // 2, 2000, 12):
        p = tmp_path / f"cut{cut}.gguf"
        p.write_bytes(full[:cut])
        with pytest.raises(ModelError) as e:
            load_gguf(p)
        assert _one_line(e.value) and "truncated" in str(e.value), (cut, str(e.value))


def test_unsupported_architecture(tmp_path):
    from minfer_cli.engine.weights import load_gguf

    with pytest.raises(ModelError) as e:
        load_gguf(_small_gguf(tmp_path / "g.gguf", arch="gpt2"))
    assert _one_line(e.value) and "'gpt2'" in str(e.value) and "llama, qwen2" in str(e.value)


def test_unsupported_tensor_type_and_missing_tensor(tmp_path):
    from gguf.constants import GGMLQuantizationType

    from minfer_cli.engine.weights import load_gguf

    with pytest.raises(ModelError) as e:
        load_gguf(_small_gguf(tmp_path / "iq.gguf", tensor_type=GGMLQuantizationType.IQ4_NL))
    msg = str(e.value)
    assert _one_line(e.value) and "token_embd.weight" in msg and "IQ4_NL" in msg and "Q4_K" in msg
    with pytest.raises(ModelError, match="lacks the tensor blk.0.attn_norm.weight"):
        load_gguf(_small_gguf(tmp_path / "one.gguf"))


def test_cli_synth_writes_a_loadable_file(tmp_path):
    from minfer_cli.commands import model
    from minfer_cli.engine.weights import load_gguf

    app = typer.Typer()
    app.add_typer(model.app)
    out = tmp_path / "t.gguf"
    res = CliRunner().invoke(app, ["model", "synth", "tiny-llama", "-o", str(out), "--seed", "3"])
    assert res.exit_code == 0, res.output
    assert "llama 1M Q4_K - Medium, 0.78 MiB, 1.31 M params, 20 tensors, seed 3" in res.output
    assert load_gguf(out).config == preset("tiny-llama")
    bad = CliRunner().invoke(app, ["model", "synth", "nope", "-o", str(out)])
    assert bad.exit_code == 2 and "unknown model preset" in bad.output


def test_random_f16_gguf_is_what_llama_quantize_takes(tmp_path):
    """`write_random_f16_gguf` (`model synth --type F16`): matrices F16 with std 1/sqrt(id), vectors F32, Llama
    3.1's rope_freqs the llama3 divisors; the file loads back as the same config; `--layers` truncates, bad values
    are refused in one line."""
    import dataclasses

    from gguf import GGUFReader

    from minfer_cli.commands import model
    from minfer_cli.engine.gguf_io import llama3_rope_factors, write_random_f16_gguf
    from minfer_cli.engine.weights import load_gguf

    factors = llama3_rope_factors(128, 5e5)
    assert factors.shape == (64,) and factors.dtype == np.float32
    assert factors[0] == 1.0 and factors[-1] == 8.0 and np.all(np.diff(factors) >= 0)
    assert ((factors > 1) & (factors < 8)).any()  # the smooth band between the two wavelengths
    config = dataclasses.replace(preset("tiny-llama"), rope_freqs=True, rope_base=5e5)
    path = write_random_f16_gguf(config, tmp_path / "f16.gguf", SEED)
    tensors = {t.name: t for t in GGUFReader(path).tensors}
    assert np.array_equal(np.asarray(tensors["rope_freqs.weight"].data), llama3_rope_factors(128, 5e5))
    w = np.asarray(tensors["blk.1.ffn_down.weight"].data, dtype=np.float64)
    assert tensors["blk.1.ffn_down.weight"].tensor_type.name == "F16" and w.shape == (256, 512)
    assert abs(w.std() * math.sqrt(512) - 1) < 0.05, SEED
    assert tensors["blk.0.attn_norm.weight"].tensor_type.name == "F32"
    assert load_gguf(path).config == dataclasses.replace(config, name=load_gguf(path).config.name)

    app = typer.Typer()
    app.add_typer(model.app)
    out = tmp_path / "t.gguf"
    res = CliRunner().invoke(app, ["model", "synth", "tiny-llama", "--type", "F16", "--layers", "1", "-o", str(out)])
    assert res.exit_code == 0 and "llama F16 (first 1 of 2 layers)" in res.output, res.output
    assert load_gguf(out).config.n_layers == 1
    for bad, says in ((["--type", "Q5_K"], "unknown --type 'Q5_K'"), (["--layers", "3"], "exceeds tiny-llama's 2")):
        res = CliRunner().invoke(app, ["model", "synth", "tiny-llama", "-o", str(tmp_path / "x.gguf"), *bad])
        assert res.exit_code == 2 and says in res.output, res.output


# ----------------------------------------------------------------------------------------- reference forward


def test_rope_styles_rotate_the_documented_pairs():
    from minfer_cli.engine.reference import rope

    x = np.zeros((2, 1, 8))
    x[:, 0, 0] = 1.0
    pos = np.array([0, 1])
    neox, norm = rope(x, pos, 1e4, "neox"), rope(x, pos, 1e4, "norm")
    assert np.allclose(neox[0], x[0]) and np.allclose(norm[0], x[0])  # position 0: identity
    assert np.isclose(neox[1, 0, 0], math.cos(1.0)) and np.isclose(neox[1, 0, 4], math.sin(1.0))  # (0, hd/2)
    assert np.isclose(norm[1, 0, 0], math.cos(1.0)) and np.isclose(norm[1, 0, 1], math.sin(1.0))  # (0, 1)
    r = np.random.default_rng(0).standard_normal((5, 3, 8))
    for style in ("neox", "norm"):
        assert np.allclose(np.linalg.norm(rope(r, np.arange(5), 1e4, style), axis=-1), np.linalg.norm(r, axis=-1))


def test_attention_is_causal():
    from minfer_cli.engine.reference import attention

    rng = np.random.default_rng(1)
    q, k, v = rng.standard_normal((4, 4, 8)), rng.standard_normal((4, 2, 8)), rng.standard_normal((4, 2, 8))
    a = attention(q, k, v)
    k2, v2 = k.copy(), v.copy()
    k2[3], v2[3] = 9.0, 9.0  # changing the last position changes only the last output
    b = attention(q, k2, v2)
    assert np.allclose(a[:3], b[:3]) and not np.allclose(a[3], b[3])
    assert np.allclose(a[0].reshape(4, 8)[[0, 1]], v[0, 0]) and np.allclose(a[0].reshape(4, 8)[[2, 3]], v[0, 1])


def test_reference_forward_of_tiny(tiny):
    from minfer_cli.engine.reference import Reference

    ref = Reference(tiny)
    prompt = [1, 17, 300, 42, 511, 7]
    states = ref.hidden_states(prompt)
    for i, x in enumerate(states[1:]):
        rms = float(np.sqrt(np.mean(x * x)))
        assert np.all(np.isfinite(x)) and 0.1 < rms < 10, f"layer {i}: residual rms {rms:.3g} (seed {SEED})"
    logits = ref.forward(prompt)
    assert logits.shape == (len(prompt), 512) and np.all(np.isfinite(logits))
    assert 0.1 < logits.std() < 100, f"logit std {logits.std():.3g} (seed {SEED})"
    last = ref.forward(prompt, last_only=True)
    assert np.allclose(last, logits[-1])
    # causal: the logits of a prefix do not depend on what follows
    assert np.allclose(ref.forward(prompt[:3]), logits[:3])
    g1 = ref.greedy(prompt, 4)
    assert g1 == ref.greedy(prompt, 4) and len(g1) == 4 and all(0 <= t < 512 for t in g1)
    assert g1[0] == int(np.argmax(last))
    with pytest.raises(ValueError):
        ref.forward([512])


# ------------------------------------------------------------------------------------------------------ GPU


@pytest.mark.gpu
def test_synth_7b_on_gpu():
    """The default preset on a real GPU: under ~10 s after JIT (warmed up on tiny), llama-bench's size and
    params (4.36 GiB, 7.62 B), finite dequantized samples with the intended std."""
    from kernels.quant import dequantize
    from minfer_cli.engine.weights import synth_weights, target_std

    cfg = preset(DEFAULT_PRESET)
    synth_weights(preset("tiny"), 0)  # compile the kernels
    t0 = time.perf_counter()
    w = synth_weights(cfg, SEED)
    elapsed = time.perf_counter() - t0
    assert elapsed < 10.0, f"synth took {elapsed:.1f} s"
    assert w.describe() == "qwen2 7B Q4_K - Medium"
    assert round(w.size_bytes() / 2**30, 2) == 4.36 and round(w.n_params() / 1e9, 2) == 7.62
    for name in ("token_embd.weight", "blk.0.ffn_down.weight", "blk.3.ffn_down.weight", "blk.27.attn_v.weight",
                 "output.weight"):
        spec, raw = w.tensors[name]
        rows = min(spec.od, 256)
        part = raw[: rows * (spec.n_bytes // spec.od)]
        x = dequantize(part, spec.qtype, rows, spec.id).copy_to_host().astype(np.float64)
        assert np.all(np.isfinite(x)), name
        assert 0.8 < x.std() / target_std(spec) < 1.25, f"{name}: std {x.std():.3g}"



# ---------------------------------------------------------------------------- compile (real NVVM, no GPU)


@pytest.mark.compile
@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "F32"])  # Q4_K's kernel writes Q5_K too
def test_synth_kernels_compile_for_sm90(qtype):
    """Each generator builds for sm_90 with the argument types `kernels.synth.synth` launches it with, and its
    stores have the word width the format allows (Q6_K blocks are only 2-byte aligned)."""
    from numba import cuda, types

    from kernels import synth

    u64 = types.uint64
    kernel, sig, store = {
        "Q4_K": (synth.synth_k_min, (types.Array(u64, 1, "C"), types.int64, u64, u64, u64, types.float32,
                                     types.int64), "u64"),
        "Q6_K": (synth.synth_q6_k, (types.Array(types.uint16, 1, "C"), types.int64, u64, u64, u64), "u16"),
        "F32": (synth.synth_f32, (types.Array(types.float32, 1, "C"), types.int64, u64, types.float32,
                                  types.float32), "f32"),
    }[qtype]
    ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=(9, 0))
    assert f"st.global.{store}" in ptx or f"st.global.b{store[1:]}" in ptx
    assert "cvt.rn.f64" not in ptx and ".f64" not in ptx.split("// .globl")[-1], "a uint64/int64 mix went float64"
