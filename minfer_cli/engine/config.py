"""Model hyper-parameters, the tensors a model holds, and llama.cpp's Q4_K_M type mix.

Shape order. GGUF lists a tensor's dims fastest-first: ``ne0`` is the number of columns, i.e. the input dim
``id`` of a weight matrix. A weight that computes ``y[od] = W[od, id] · x[id]`` is stored row-major as ``od``
rows of ``id`` values and has GGUF shape ``(id, od)``; numpy shape (what gguf-py's reader and
``quants.dequantize`` give) is the reverse, ``(od, id)``. `TensorSpec.shape` is always the GGUF order;
`TensorSpec.id` / `TensorSpec.od` name the two dims without ambiguity. ``token_embd`` and ``output`` are both
GGUF ``(hidden, vocab)``: ``vocab`` rows of ``hidden`` values (one embedding per row; logits = rows · h).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from kernels.attention_config import head_dim_refusal
from minfer_cli.engine.errors import ModelError

ARCHITECTURES = ("llama", "qwen2")
"""Architectures minfer loads and generates (llama.cpp's ``general.architecture`` names)."""

ROPE_STYLE = {"qwen2": "neox", "llama": "norm"}
"""llama.cpp's RoPE type per architecture: ``neox`` rotates pairs (i, i + head_dim/2); ``norm`` rotates
interleaved pairs (2i, 2i + 1) (llama's converter permutes Q/K rows so that this form applies)."""

MIXES = ("Q4_K_M",)
FILE_TYPES = {"Q4_K_M": 15}
"""``general.file_type`` per mix (llama.cpp ``LLAMA_FTYPE_MOSTLY_Q4_K_M`` = 15)."""

FILE_TYPE_NAMES = {
    0: "all F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    7: "Q8_0",
    8: "Q5_0",
    9: "Q5_1",
    10: "Q2_K - Medium",
    11: "Q3_K - Small",
    12: "Q3_K - Medium",
    13: "Q3_K - Large",
    14: "Q4_K - Small",
    15: "Q4_K - Medium",
    16: "Q5_K - Small",
    17: "Q5_K - Medium",
    18: "Q6_K",
    32: "BF16",
    38: "MXFP4 MoE",
}
"""llama.cpp's ``llama_model_ftype_name`` for the file types minfer can meet (what llama-bench prints)."""


@dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of a llama/qwen2-shaped decoder.

    arch: "llama" | "qwen2"; name: a label (preset name or ``general.name``); n_layers; hidden (d_model);
    ffn (SwiGLU inner dim); n_heads, n_kv_heads (GQA: query head h reads KV head h // (n_heads/n_kv_heads));
    head_dim; vocab; rope_base (theta); rms_eps; context_length; qkv_bias (attn_q/k/v biases, qwen2);
    rope_style "neox" | "norm" (see ROPE_STYLE); tied_output (no ``output`` tensor: logits use token_embd);
    rope_freqs (a ``rope_freqs.weight`` F32 ``[head_dim/2]`` tensor of RoPE frequency divisors, Llama 3.1+).
    """

    arch: str
    name: str
    n_layers: int
    hidden: int
    ffn: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab: int
    rope_base: float
    rms_eps: float
    context_length: int
    qkv_bias: bool
    rope_style: str
    tied_output: bool
    rope_freqs: bool = False

    @property
    def q_dim(self) -> int:
        """Rows of attn_q (and columns of attn_output): n_heads * head_dim."""
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Rows of attn_k and attn_v: n_kv_heads * head_dim."""
        return self.n_kv_heads * self.head_dim

    def as_dict(self) -> dict:
        return asdict(self)

    def validate(self) -> "ModelConfig":
        """Return self; raise ModelError (one sentence) for an unsupported architecture, inconsistent dims or a head_dim
        the attention kernels do not run (`kernels.attention_config.HEAD_DIMS`)."""
        if self.arch not in ARCHITECTURES:
            raise ModelError(f"architecture {self.arch!r} is not supported; supported: {', '.join(ARCHITECTURES)}")
        if self.rope_style not in ("neox", "norm"):
            raise ModelError(f"rope_style {self.rope_style!r} must be 'neox' or 'norm'")
        for key in ("n_layers", "hidden", "ffn", "n_heads", "n_kv_heads", "head_dim", "vocab"):
            if int(getattr(self, key)) <= 0:
                raise ModelError(f"{key}={getattr(self, key)} must be positive")
        if self.n_heads % self.n_kv_heads:
            raise ModelError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")
        why = head_dim_refusal(self.head_dim)
        if why:
            raise ModelError(why)
        return self


@dataclass(frozen=True)
class TensorSpec:
    """One tensor: GGUF name (e.g. "blk.3.ffn_down.weight"), GGUF shape (fastest dim first: ``(id, od)`` for a
    weight ``[od, id]``, ``(n,)`` for a vector) and type name ("Q4_K", "Q6_K", "F32", or any gguf type)."""

    name: str
    shape: tuple[int, ...]
    qtype: str

    @property
    def id(self) -> int:
        """Input dim: elements per row (GGUF ``ne0``)."""
        return int(self.shape[0])

    @property
    def od(self) -> int:
        """Output dim: number of rows (product of the remaining GGUF dims; 1 for a vector)."""
        n = 1
        for d in self.shape[1:]:
            n *= int(d)
        return n

    @property
    def numpy_shape(self) -> tuple[int, ...]:
        """The shape in numpy (row-major) order: GGUF's reversed."""
        return tuple(int(d) for d in reversed(self.shape))

    @property
    def n_elements(self) -> int:
        return self.id * self.od

    @property
    def ggml_type(self) -> GGMLQuantizationType:
        return GGMLQuantizationType[self.qtype]

    @property
    def n_bytes(self) -> int:
        """Bytes as stored: rows of whole blocks (gguf's GGML_QUANT_SIZES)."""
        block_size, type_size = GGML_QUANT_SIZES[self.ggml_type]
        return self.n_elements // block_size * type_size

    @property
    def layer(self) -> int | None:
        """The block index of a ``blk.N.*`` tensor, else None."""
        parts = self.name.split(".")
        return int(parts[1]) if parts[0] == "blk" else None

    @property
    def role(self) -> str:
        """The name without the block prefix: "attn_q.weight", "token_embd.weight", ..."""
        parts = self.name.split(".")
        return ".".join(parts[2:]) if parts[0] == "blk" else self.name


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp ``use_more_bits`` (src/llama-quant.cpp): the layers whose attn_v and ffn_down Q4_K_M promotes
    to Q6_K: the first eighth, the last eighth, and every third layer in between (C integer division)."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def tensor_names(config: ModelConfig) -> list[tuple[str, tuple[int, ...]]]:
    """``(GGUF name, GGUF shape)`` of every tensor of ``config``, in file order: token_embd, rope_freqs (when the
    config has it), the blocks
    (attn_norm, attn_q/k/v (+ biases), attn_output, ffn_norm, ffn_gate, ffn_up, ffn_down), output_norm,
    output (absent when tied)."""
    c = config
    out: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (c.hidden, c.vocab))]
    if c.rope_freqs:
        out.append(("rope_freqs.weight", (c.head_dim // 2,)))
    for i in range(c.n_layers):
        b = f"blk.{i}."
        out.append((b + "attn_norm.weight", (c.hidden,)))
        for proj, rows in (("attn_q", c.q_dim), ("attn_k", c.kv_dim), ("attn_v", c.kv_dim)):
            out.append((b + proj + ".weight", (c.hidden, rows)))
            if c.qkv_bias:
                out.append((b + proj + ".bias", (rows,)))
        out.append((b + "attn_output.weight", (c.q_dim, c.hidden)))
        out.append((b + "ffn_norm.weight", (c.hidden,)))
        out.append((b + "ffn_gate.weight", (c.hidden, c.ffn)))
        out.append((b + "ffn_up.weight", (c.hidden, c.ffn)))
        out.append((b + "ffn_down.weight", (c.ffn, c.hidden)))
    out.append(("output_norm.weight", (c.hidden,)))
    if not c.tied_output:
        out.append(("output.weight", (c.hidden, c.vocab)))
    return out


def llm_type_70b(config: "ModelConfig") -> bool:
    """llama.cpp's ``LLM_TYPE_70B`` (src/llama-model.cpp ``load_hparams``): 80 layers, for llama only with grouped
    KV heads (80 layers and n_head == n_head_kv is its 65B); the quantizer gives this type's attn_v more bits."""
    return config.n_layers == 80 and (config.arch != "llama" or config.n_heads != config.n_kv_heads)


def mix_type(name: str, shape: tuple[int, ...], n_layers: int, mix: str = "Q4_K_M", tied: bool = False,
             type_70b: bool = False) -> str:
    """The type llama.cpp's ``llama_tensor_get_type`` (src/llama-quant.cpp) gives tensor ``name`` under ``mix``
    (only Q4_K_M): vectors F32; ``output.weight`` Q6_K, and ``token_embd.weight`` too when the output is ``tied``
    to it (the quantizer gives a model without an output tensor's embedding the output's type); ``attn_v`` and
    ``ffn_down`` Q6_K in `use_more_bits` layers; with ``type_70b`` (`llm_type_70b`: 8 query heads share each
    attn_v) the other layers' attn_v Q5_K; every other matrix (an untied token_embd included) Q4_K. (llama.cpp's
    MoE special cases do not apply here.)"""
    if mix not in MIXES:
        raise ModelError(f"type mix {mix!r} is not supported; supported: {', '.join(MIXES)}")
    if len(shape) == 1:
        return "F32"
    if name == "output.weight" or (tied and name == "token_embd.weight"):
        return "Q6_K"
    parts = name.split(".")
    if parts[0] == "blk" and parts[2] in ("attn_v", "ffn_down") and use_more_bits(int(parts[1]), n_layers):
        return "Q6_K"
    if type_70b and parts[0] == "blk" and parts[2] == "attn_v":
        return "Q5_K"
    return "Q4_K"


def tensor_specs(config: ModelConfig, mix: str = "Q4_K_M") -> list[TensorSpec]:
    """Every tensor of ``config`` with its type under ``mix``, in file order (see `tensor_names`).

    Raises ModelError when a K-quant matrix's input dim is not a multiple of 256 (llama.cpp would fall back to
    another type there; minfer's generators write only Q4_K, Q5_K, Q6_K and F32).
    """
    config.validate()
    specs = []
    for name, shape in tensor_names(config):
        qtype = mix_type(name, shape, config.n_layers, mix, tied=config.tied_output,
                         type_70b=llm_type_70b(config))
        if qtype != "F32" and shape[0] % 256:
            raise ModelError(
                f"tensor {name} has input dim {shape[0]}, not a multiple of 256, which {qtype} super-blocks need"
            )
        specs.append(TensorSpec(name, tuple(int(d) for d in shape), qtype))
    return specs


# llama.cpp names a model's size by its architecture's layer count and width (llm_type), not by rounding the
# parameter count: Qwen2-7B has 7.62 B parameters and is "7B"; Llama-2-7B has 6.74 B and is "7B" too.
KNOWN_SIZES = {("qwen2", 28, 3584): "7B", ("qwen2", 28, 1536): "1.5B", ("llama", 16, 2048, 8192): "1B", ("llama", 28, 3072, 8192): "3B", ("llama", 32, 4096, 11008): "7B", ("llama", 32, 4096, 14336): "8B",
               ("llama", 80, 8192, 28672): "70B"}


def size_label(n_params: int, config: "ModelConfig | None" = None) -> str:
    """llama.cpp-style size label: the known label of ``config``'s shape (see KNOWN_SIZES), else from the
    parameter count: "7B", "8B", "1.5B", "37M"."""
    if config is not None:
        for key in ((config.arch, config.n_layers, config.hidden), (config.arch, config.n_layers, config.hidden, config.ffn)):
            if key in KNOWN_SIZES:
                return KNOWN_SIZES[key]
    if n_params >= 1e9:
        b = n_params / 1e9
        return f"{b:.0f}B" if b >= 6 else f"{b:.1f}B".replace(".0B", "B")
    return f"{n_params / 1e6:.0f}M"
