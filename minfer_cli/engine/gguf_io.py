"""Write ModelWeights as a GGUF file llama.cpp can load, with gguf-py's GGUFWriter.

Metadata: ``general.architecture``, ``general.name``, ``general.file_type`` (15 for Q4_K_M),
``general.quantization_version`` (2, what llama.cpp's quantizer writes), the ``{arch}.*`` hyper-parameters
(block_count, context_length, embedding_length, feed_forward_length, attention.head_count / head_count_kv /
key_length / value_length / layer_norm_rms_epsilon, rope.freq_base, rope.dimension_count, vocab_size), and a
placeholder SentencePiece-style vocabulary (``tokenizer.ggml.model = "llama"``: <unk>, <s>, </s>, the 256
byte tokens llama.cpp looks up, then "<tNNN>" fillers) so that llama.cpp's loader and llama-bench accept the
file; its text is meaningless. Tensors are written with their raw bytes and GGML type, streamed one at a time
from the device (the writer never holds the whole model in host memory).

`write_random_f16_gguf` writes the input llama.cpp's own quantizer takes (``llama-quantize IN.gguf OUT.gguf
TYPE``): every matrix F16 from a seeded normal distribution, vectors F32, and a Llama 3.1 ``rope_freqs`` tensor
holding the real llama3 frequency divisors (`llama3_rope_factors`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from minfer_cli.engine.errors import ModelError
from minfer_cli.engine.weights import ModelWeights, Progress

QUANTIZATION_VERSION = 2
_N_SPECIAL = 3  # <unk>, <s>, </s>


def placeholder_vocab(n: int) -> tuple[list[str], list[float], list[int]]:
    """(tokens, scores, token types) of a meaningless SentencePiece-style vocabulary of ``n`` >= 259 entries."""
    from gguf.constants import TokenType

    if n < _N_SPECIAL + 256:
        raise ModelError(f"vocab={n} is too small for the placeholder vocabulary (needs at least 259 tokens)")
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"<t{i}>" for i in range(len(tokens), n)]
    types = [int(TokenType.UNKNOWN), int(TokenType.CONTROL), int(TokenType.CONTROL)] + [int(TokenType.BYTE)] * 256
    types += [int(TokenType.NORMAL)] * (n - len(types))
    return tokens, [0.0] * n, types


def write_gguf(weights: ModelWeights, path, progress: Progress = None) -> Path:
    """Write ``weights`` to ``path`` (overwritten) and return the path. See the module docstring for content.
    Raises ModelError if the file cannot be written."""
    from gguf import GGUFWriter

    c = weights.config
    path = Path(path)
    try:
        w = GGUFWriter(path, c.arch)
        _add_metadata(w, c, weights.file_type)
        for name, (spec, _) in weights.tensors.items():
            # byte shape in numpy order: rows x bytes per row; gguf-py turns it back into (od, id) elements
            byte_shape = (*spec.numpy_shape[:-1], spec.n_bytes // spec.od)
            w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), spec.n_bytes, raw_dtype=spec.ggml_type)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        total = weights.size_bytes()
        done = 0
        for name, (spec, _) in weights.tensors.items():
            w.write_tensor_data(weights.to_host(name))
            done += spec.n_bytes
            if progress:
                progress(name, done / total)
        w.close()
    except OSError as exc:
        raise ModelError(f"cannot write {path}: {exc.strerror or exc}") from None
    return path


def _add_metadata(w, c, file_type) -> None:
    """Every key the module docstring lists, for config ``c`` and ``general.file_type`` ``file_type`` (or None)."""
    w.add_name(c.name)
    if file_type is not None:
        w.add_file_type(int(file_type))
    w.add_quantization_version(QUANTIZATION_VERSION)
    w.add_block_count(c.n_layers)
    w.add_context_length(c.context_length)
    w.add_embedding_length(c.hidden)
    w.add_feed_forward_length(c.ffn)
    w.add_head_count(c.n_heads)
    w.add_head_count_kv(c.n_kv_heads)
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
    w.add_rope_dimension_count(c.head_dim)
    w.add_rope_freq_base(float(c.rope_base))
    w.add_layer_norm_rms_eps(float(c.rms_eps))
    w.add_vocab_size(c.vocab)
    tokens, scores, types = placeholder_vocab(c.vocab)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)


F16_FILE_TYPE = 1
"""``general.file_type`` of an F16 file (llama.cpp ``LLAMA_FTYPE_MOSTLY_F16``)."""


def llama3_rope_factors(head_dim: int, rope_base: float, factor: float = 8.0, low_freq_factor: float = 1.0,
                        high_freq_factor: float = 4.0, original_context: int = 8192) -> np.ndarray:
    """The ``rope_freqs`` divisors ``[head_dim/2]`` f32 of Llama 3.1's "llama3" RoPE scaling (defaults: the
    Llama-3.1 config.json's rope_scaling), as llama.cpp's converter computes them (convert_hf_to_gguf.py,
    LlamaModel.generate_extra_tensors): pair i's frequency ``base^(-2i/head_dim)`` of wavelength ``2π/f``; shorter
    than ``original_context/high_freq_factor``: 1; longer than ``original_context/low_freq_factor``: ``factor``;
    between: ``1 / ((1 - s)/factor + s)`` with ``s = (original_context/wavelength - low) / (high - low)``."""
    freqs = 1.0 / (float(rope_base) ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    wavelength = 2 * np.pi / freqs
    smooth = (original_context / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
    out = np.where(wavelength < original_context / high_freq_factor, 1.0,
                   np.where(wavelength > original_context / low_freq_factor, factor,
                            1.0 / ((1 - smooth) / factor + smooth)))
    return out.astype(np.float32)


def write_random_f16_gguf(config, path, seed: int, progress: Progress = None) -> Path:
    """Write ``config``'s tensors (`config.tensor_names`) with random values to ``path`` as an F16 GGUF, the
    input of llama.cpp's ``llama-quantize``; host memory holds one tensor at a time. Matrices: F16 normal with std
    1/sqrt(input dim) (activations of order one through every layer); norm weights F32 uniform in [0.9, 1.1];
    biases F32 uniform in [-0.1, 0.1]; ``rope_freqs.weight`` the llama3 divisors (`llama3_rope_factors`). The
    same ``seed`` writes the same bytes. Raises ModelError if the file cannot be written."""
    from gguf import GGUFWriter

    from minfer_cli.engine.config import tensor_names

    c = config.validate()
    path = Path(path)
    entries = tensor_names(c)

    def values(index: int, name: str, shape: tuple[int, ...]) -> np.ndarray:
        rng = np.random.default_rng([int(seed), index])
        numpy_shape = tuple(reversed(shape))
        if name == "rope_freqs.weight":
            return llama3_rope_factors(c.head_dim, c.rope_base)
        if len(shape) == 1:
            lo, hi = (-0.1, 0.1) if name.endswith(".bias") else (0.9, 1.1)
            return rng.uniform(lo, hi, size=numpy_shape).astype(np.float32)
        return (rng.standard_normal(numpy_shape, dtype=np.float32) / np.float32(np.sqrt(shape[0]))).astype(np.float16)

    try:
        w = GGUFWriter(path, c.arch)
        _add_metadata(w, c, F16_FILE_TYPE)
        for name, shape in entries:
            dtype = np.float16 if len(shape) > 1 else np.float32
            numpy_shape = tuple(reversed(shape))
            w.add_tensor_info(name, numpy_shape, np.dtype(dtype), int(np.prod(shape)) * np.dtype(dtype).itemsize)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for index, (name, shape) in enumerate(entries):
            w.write_tensor_data(values(index, name, shape))
            if progress:
                progress(name, (index + 1) / len(entries))
        w.close()
    except OSError as exc:
        raise ModelError(f"cannot write {path}: {exc.strerror or exc}") from None
    return path
