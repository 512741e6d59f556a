"""Write ModelWeights as a GGUF file llama.cpp can load, with gguf-py's GGUFWriter.

Metadata: ``general.architecture``, ``general.name``, ``general.file_type`` (15 for Q4_K_M),
``general.quantization_version`` (2, what llama.cpp's quantizer writes), the ``{arch}.*`` hyper-parameters
(block_count, context_length, embedding_length, feed_forward_length, attention.head_count / head_count_kv /
key_length / value_length / layer_norm_rms_epsilon, rope.freq_base, rope.dimension_count, vocab_size), and a
placeholder SentencePiece-style vocabulary (``tokenizer.ggml.model = "llama"``: <unk>, <s>, </s>, the 256
byte tokens llama.cpp looks up, then "<tNNN>" fillers) so that llama.cpp's loader and llama-bench accept the
file; its text is meaningless. Tensors are written with their raw bytes and GGML type, streamed one at a time
from the device (the writer never holds the whole model in host memory).
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
        w.add_name(c.name)
        if weights.file_type is not None:
            w.add_file_type(int(weights.file_type))
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
