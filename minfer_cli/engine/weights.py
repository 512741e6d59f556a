"""Model weights on the device: generated from a seed (`synth_weights`) or read from a GGUF file (`load_gguf`).

Each tensor is a 1-D uint8 device array holding exactly its bytes as a GGUF file stores them (rows of whole
blocks; see `config` for the shape order), so the dequantization and GEMV kernels read either source alike.

Generated weights (`synth_weights`): every byte from `kernels.synth` (a counter hash of (seed, tensor index in
`tensor_specs` order, word index)), with scale fields chosen so that activations stay finite and of order one
through every layer of the forward pass:

* every matrix, ``token_embd`` and ``output`` included: dequantized std ~ 1/sqrt(id), mean ~ 0 (so a
  normalised input of rms 1 gives outputs of rms ~1, attention scores of std ~1, logits of std ~1). Q4_K:
  ``w = sc*(d*q - dmin)`` (`kernels.synth` sets each min equal to its scale, dmin = 7.5 d: zero mean in every
  sub-block) with random 6-bit sc and 4-bit q has std ~168.5 d; Q6_K: ``w = d*sc*(q-32)`` with random int8 sc
  and 6-bit q has std ~1330 d; Q5_K (llama.cpp gives it to a 70B's attn_v): Q4_K's form with 5-bit q and
  dmin = 15.5 d, std ~337.2 d.
  d is drawn from [0.8, 1.2] x its target (f16, subnormal for the widest 7B matrices: valid and finite).
* norm weights (F32): uniform in [0.9, 1.1]; biases (F32): uniform in [-0.1, 0.1].
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from minfer_cli.engine.config import (
    ARCHITECTURES,
    FILE_TYPE_NAMES,
    FILE_TYPES,
    ROPE_STYLE,
    ModelConfig,
    TensorSpec,
    size_label,
    tensor_names,
    tensor_specs,
)
from minfer_cli.engine.errors import ModelError

Progress = Optional[Callable[[str, float], None]]

Q4_K_STD_PER_D = 168.5  # sqrt(E[sc^2] = 63*127/6) * sqrt(var q = 255/12)
Q6_K_STD_PER_D = 1330.0  # sqrt(E[sc^2] ~ 2^16/12) * sqrt(E[(q-32)^2] = 341.5)
Q4_K_DMIN_PER_D = 7.5
Q5_K_STD_PER_D = 337.2  # sqrt(63*127/6) * sqrt(var q = 1023/12)
Q5_K_DMIN_PER_D = 15.5
D_JITTER = (0.8, 1.2)
NORM_CENTER, NORM_SPREAD = 1.0, 0.1
BIAS_CENTER, BIAS_SPREAD = 0.0, 0.1

# Each layer's q, k and v weights, and their biases, lie back to back in one device allocation (in this order,
# each start aligned to STACK_ALIGN bytes), so that one mat-vec over their stacked rows reads them in place
# (`ModelWeights.stacked`; decode's FUSE_QKV) with no second copy of the weights.
STACKED = (("attn_q.weight", "attn_k.weight", "attn_v.weight"), ("attn_q.bias", "attn_k.bias", "attn_v.bias"))
STACK_ALIGN = 256  # what cuMemAlloc guarantees for a separate allocation, and more than any kernel's loads need


@dataclass
class ModelWeights:
    """A model's config and its tensors: ``tensors[name] = (TensorSpec, 1-D uint8 device array of the bytes)``,
    in file order. ``file_type``: ``general.file_type`` (15 = Q4_K_M) or None; ``source``: "synth:SEED" or the
    file path; ``seed``: the generating seed or None."""

    config: ModelConfig
    tensors: dict = field(default_factory=dict)
    file_type: Optional[int] = None
    source: str = ""
    seed: Optional[int] = None
    _embedding_f32: object = field(default=None, repr=False, compare=False)
    _stacks: dict = field(default_factory=dict, repr=False, compare=False)  # name -> (buffer, byte offset, view)

    def allocate(self, specs: list[TensorSpec], stream=0) -> None:
        """Allocate an uninitialised device array for every spec in ``tensors`` (the loaders then fill them): one
        allocation per tensor, except each layer's `STACKED` groups, which share one (`stacked`)."""
        from numba import cuda

        by_name = {s.name: s for s in specs}
        grouped = set()
        for i in range(self.config.n_layers):
            for group in STACKED:
                names = [f"blk.{i}.{n}" for n in group if f"blk.{i}.{n}" in by_name]
                if not names:  # a model without q/k/v biases
                    continue
                starts, end = [], 0
                for name in names:
                    starts.append(end)
                    end = -(-(end + by_name[name].n_bytes) // STACK_ALIGN) * STACK_ALIGN
                buffer = cuda.device_array(end, dtype=np.uint8, stream=stream)
                for name, start in zip(names, starts):
                    view = buffer[start: start + by_name[name].n_bytes]
                    self.tensors[name] = (by_name[name], view)
                    self._stacks[name] = (buffer, start, view)
                grouped.update(names)
        for spec in specs:
            if spec.name not in grouped:
                self.tensors[spec.name] = (spec, cuda.device_array(spec.n_bytes, dtype=np.uint8, stream=stream))
        self.tensors = {s.name: self.tensors[s.name] for s in specs}  # file order

    def stacked(self, names: list[str]):
        """The bytes of the tensors ``names`` as one 1-D uint8 device array (a view, no copy) when they lie back to
        back in one allocation (`allocate`'s `STACKED` groups, none of them replaced since, each size a multiple
        of `STACK_ALIGN` so no padding sits between them); else None."""
        places = [self._stacks.get(n) for n in names]
        if any(p is None for p in places) or len({id(p[0]) for p in places}) != 1:
            return None
        buffer, first, _ = places[0]
        at = first
        for name, (_, start, view) in zip(names, places):
            if start != at or self.device(name) is not view:
                return None
            at += view.size
        return buffer[first:at]

    def spec(self, name: str) -> TensorSpec:
        return self.tensors[name][0]

    def device(self, name: str):
        """The tensor's bytes as a 1-D uint8 device array."""
        return self.tensors[name][1]

    def rope_factors(self):
        """The RoPE frequency divisors as a float32 device array ``[head_dim/2]``: the ``rope_freqs.weight``
        tensor (viewed, not copied) when the model has one, else ones (`kernels.rope.rope`'s ``factors``)."""
        from numba import cuda

        if self.config.rope_freqs:
            return self.device("rope_freqs.weight").view(np.float32)
        return cuda.to_device(np.ones(self.config.head_dim // 2, dtype=np.float32))

    def embedding_table(self) -> tuple[object, str]:
        """``(raw, qtype)`` for `kernels.embedding.embedding`: ``token_embd`` itself when the embedding kernel reads
        its type (``kernels.embedding.SUPPORTED``), else an f32 copy ``[vocab, hidden]`` made once on the host by
        gguf's own ``quants.dequantize`` (so every row is exactly gguf's float32 value, as the gather kernels'
        are), as uint8 bytes on the device, with "F32". The copy costs ``4 * vocab * hidden`` bytes of device memory
        (2.1 GB for Llama-3-8B) and is shared by every engine of these weights."""
        from kernels.embedding import SUPPORTED

        spec = self.spec("token_embd.weight")
        if spec.qtype in SUPPORTED:
            return self.device("token_embd.weight"), spec.qtype
        if self._embedding_f32 is None:
            from numba import cuda

            from minfer_cli.engine.reference import dequantize_tensor

            table = dequantize_tensor(spec, self.to_host("token_embd.weight"), dtype=np.float32)
            self._embedding_f32 = cuda.to_device(np.ascontiguousarray(table).view(np.uint8).reshape(-1))
        return self._embedding_f32, "F32"

    def to_host(self, name: str) -> np.ndarray:
        """The tensor's bytes copied to a 1-D uint8 numpy array."""
        return self.tensors[name][1].copy_to_host()

    def size_bytes(self) -> int:
        """Sum of the tensors' byte sizes (llama-bench's "size", which it prints in GiB)."""
        return sum(spec.n_bytes for spec, _ in self.tensors.values())

    def n_params(self) -> int:
        """Sum of the tensors' element counts (llama-bench's "params")."""
        return sum(spec.n_elements for spec, _ in self.tensors.values())

    def type_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for spec, _ in self.tensors.values():
            counts[spec.qtype] = counts.get(spec.qtype, 0) + 1
        return counts

    def describe(self) -> str:
        """llama-bench's model column: "{arch} {size} {file type}", e.g. "qwen2 7B Q4_K - Medium"."""
        ftype = FILE_TYPE_NAMES.get(self.file_type, "?") if self.file_type is not None else "?"
        return f"{self.config.arch} {size_label(self.n_params(), self.config)} {ftype}"


def synth_params(spec: TensorSpec) -> dict:
    """Keyword arguments of `kernels.synth.synth` for ``spec`` (see the module docstring for the targets)."""
    if spec.qtype == "F32":
        if spec.name.endswith(".bias"):
            return {"center": BIAS_CENTER, "spread": BIAS_SPREAD}
        return {"center": NORM_CENTER, "spread": NORM_SPREAD}
    std = 1.0 / math.sqrt(spec.id)
    lo, hi = D_JITTER
    if spec.qtype == "Q4_K":
        d = std / Q4_K_STD_PER_D
        return {"d_range": (lo * d, hi * d), "dmin_ratio": Q4_K_DMIN_PER_D}
    if spec.qtype == "Q5_K":
        d = std / Q5_K_STD_PER_D
        return {"d_range": (lo * d, hi * d), "dmin_ratio": Q5_K_DMIN_PER_D}
    if spec.qtype == "Q6_K":
        d = std / Q6_K_STD_PER_D
        return {"d_range": (lo * d, hi * d)}
    raise ModelError(f"tensor {spec.name}: no generator for type {spec.qtype}; generated types: Q4_K, Q5_K, Q6_K, "
                     "F32")


def target_std(spec: TensorSpec) -> float:
    """The dequantized std `synth_params` aims at: 1/sqrt(id) for matrices; that of the uniform F32 range."""
    if spec.qtype == "F32":
        spread = BIAS_SPREAD if spec.name.endswith(".bias") else NORM_SPREAD
        return spread / math.sqrt(3.0)
    return 1.0 / math.sqrt(spec.id)


def _require_device() -> None:
    from minfer_cli.measure.device import probe

    probe()  # NoGpuError (one sentence naming `minfer doctor`) when neither a GPU nor the simulator is usable


def synth_weights(config: ModelConfig, seed: int, progress: Progress = None, mix: str = "Q4_K_M") -> ModelWeights:
    """Generate every tensor of ``config`` on the device from ``seed`` (same seed, same bytes, on any device or
    the simulator). Types follow ``mix`` (`config.tensor_specs`). ``progress(text, fraction)`` is called per
    tensor. Returns after the device has finished (synchronised). Raises NoGpuError without a device."""
    from numba import cuda

    from kernels.synth import synth, tensor_key

    specs = tensor_specs(config, mix)
    _require_device()
    weights = ModelWeights(config, file_type=FILE_TYPES[mix], source=f"synth:{seed}", seed=int(seed))
    total = sum(s.n_bytes for s in specs)
    done = 0
    stream = cuda.stream()
    weights.allocate(specs, stream)
    for index, spec in enumerate(specs):
        raw = weights.device(spec.name)
        synth(raw, spec.qtype, tensor_key(int(seed), index), stream=stream, **synth_params(spec))
        done += spec.n_bytes
        if progress:
            progress(spec.name, done / total)
    stream.synchronize()
    return weights


# ----------------------------------------------------------------------------------------------- GGUF reading

_META = {
    "n_layers": "block_count",
    "hidden": "embedding_length",
    "ffn": "feed_forward_length",
    "n_heads": "attention.head_count",
    "n_kv_heads": "attention.head_count_kv",
    "rope_base": "rope.freq_base",
    "rms_eps": "attention.layer_norm_rms_epsilon",
    "context_length": "context_length",
}
_META_DEFAULTS = {"rope_base": 10000.0}  # llama.cpp's default when a llama file omits rope.freq_base


def _f32_value(v) -> float:
    """A float32 metadata value as the shortest decimal that rounds to it (1e-06, not 9.99999997e-07), so that
    a config written and read back compares equal."""
    return float(np.format_float_positional(np.float32(v), unique=True, trim="-"))


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _open_reader(path: Path):
    from gguf import GGUFReader
    from gguf.constants import GGUF_MAGIC

    if not path.is_file():
        raise ModelError(f"{path}: no such file")
    with open(path, "rb") as f:
        head = f.read(4)
    if len(head) < 4 or int.from_bytes(head, "little") != GGUF_MAGIC:
        raise ModelError(f"{path} is not a GGUF file (it does not start with the 'GGUF' magic)")
    try:
        return GGUFReader(path)
    except (ValueError, IndexError, KeyError, OverflowError, UnicodeDecodeError, TypeError, RecursionError,
            MemoryError) as exc:
        raise ModelError(f"{path} is a truncated or corrupt GGUF file ({type(exc).__name__}: {_one_line(exc)})") from None


def _field(reader, key: str, path: Path, default=None):
    f = reader.fields.get(key)
    if f is None:
        if default is not None:
            return default
        raise ModelError(f"{path} lacks the metadata key {key}")
    try:
        return f.contents()
    except Exception as exc:  # a malformed value: one sentence
        raise ModelError(f"{path}: metadata key {key} cannot be read ({_one_line(exc)})") from None


METADATA_LIMITS: dict[str, tuple[float, float]] = {
    "n_layers": (1, 1024), "hidden": (1, 1 << 20), "ffn": (1, 1 << 22), "n_heads": (1, 4096), "n_kv_heads": (1, 4096),
    "context_length": (1, 1 << 24), "vocab": (1, 1 << 24), "head_dim": (2, 1024),
}
"""Inclusive bounds of the integer hyper-parameters read from a GGUF file (docs/inputs.md). Beyond them a value is
refused by name before anything is allocated; the block count must also equal the number of ``blk.N`` layers
present."""
FLOAT_LIMITS: dict[str, tuple[float, float, bool]] = {"rope_base": (0.0, 1e12, False), "rms_eps": (0.0, 1e-2, True)}
"""(low, high, high inclusive) of the float hyper-parameters; low is exclusive: the rope base must be finite and
positive, the RMS epsilon in (0, 1e-2]."""


IMPLEMENTED_KEYS = ("block_count", "embedding_length", "feed_forward_length", "attention.head_count",
                    "attention.head_count_kv", "rope.freq_base", "attention.layer_norm_rms_epsilon", "context_length",
                    "vocab_size", "attention.key_length", "attention.value_length", "rope.dimension_count")
"""The ``{arch}.*`` metadata keys minfer reads (the last two only when they equal the head dim). Any other key
under the architecture's prefix may change the math (RoPE scaling, sliding windows, logit soft-capping, experts),
so a file carrying one is refused by name rather than run as something else."""
NEUTRAL_VALUES = {"rope.scaling.type": ("none",), "rope.scaling.factor": (1.0, 0.0), "expert_count": (0,),
                  "expert_used_count": (0,), "attention.sliding_window": (0,)}
"""Keys that are accepted when they hold the value that changes nothing (llama.cpp writes some of them always)."""


def check_supported(reader, arch: str, config: ModelConfig, path: Path) -> None:
    """Refuse, by name and in one line, a metadata key or tensor that changes the math and that minfer does not
    implement (`IMPLEMENTED_KEYS`, `NEUTRAL_VALUES`), and any tensor that is not one of the
    model's (`config.tensor_names`): silence would mean computing another model than the file describes."""
    prefix = f"{arch}."
    for key in reader.fields:
        if not key.startswith(prefix):
            continue
        short = key[len(prefix):]
        if short in IMPLEMENTED_KEYS:
            if short in ("attention.value_length", "rope.dimension_count"):
                value = _int_meta(_field(reader, key, path), key, path, "head_dim")
                if value != config.head_dim:
                    raise ModelError(f"{path}: metadata key {key} = {value} differs from the head dim {config.head_dim}; "
                                     "partial rotation and value dims other than the key dim are not supported")
            continue
        if short in NEUTRAL_VALUES:
            value = _field(reader, key, path)
            if value in NEUTRAL_VALUES[short] or (isinstance(value, bytes) and value.decode(errors="replace") in NEUTRAL_VALUES[short]):
                continue
            raise ModelError(f"{path}: metadata key {key} = {value!r:.40} changes the math and is not supported "
                             f"(supported: {', '.join(map(str, NEUTRAL_VALUES[short]))})")
        raise ModelError(f"{path}: metadata key {key} is not supported (it may change the math); minfer reads "
                         f"{', '.join(prefix + k for k in IMPLEMENTED_KEYS[:8])}, ...")
    wanted = {name for name, _ in tensor_names(config)}
    for t in reader.tensors:
        if t.name not in wanted:
            raise ModelError(f"{path}: tensor {t.name} is not part of a {arch} model minfer runs (expert, extra "
                             "projection or norm?); it would be ignored, so the file is refused")


def _int_meta(value, key: str, path: Path, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ModelError(f"{path}: metadata key {key} must be an integer, got {type(value).__name__} {value!r:.40}")
    low, high = METADATA_LIMITS[name]
    if not low <= int(value) <= high:
        raise ModelError(f"{path}: metadata key {key} = {int(value)} is outside {int(low)}..{int(high)}")
    return int(value)


def _float_meta(value, key: str, path: Path, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ModelError(f"{path}: metadata key {key} must be a number, got {type(value).__name__} {value!r:.40}")
    low, high, inclusive = FLOAT_LIMITS[name]
    number = _f32_value(value)
    if not (np.isfinite(number) and low < number and (number <= high if inclusive else number < high)):
        bound = f"({low:g}, {high:g}{']' if inclusive else ')'}"
        raise ModelError(f"{path}: metadata key {key} = {number!r} must be finite and in {bound}")
    return number


def read_config(reader, path: Path) -> ModelConfig:
    """The ModelConfig described by an open GGUFReader's metadata and tensor list (see `load_gguf`).

    Every hyper-parameter is checked by value, not only by type (`METADATA_LIMITS`, `FLOAT_LIMITS`), and the
    block count against the ``blk.N`` tensors present; a bad one is a ModelError naming the key."""
    arch = _field(reader, "general.architecture", path)
    if arch not in ARCHITECTURES:
        raise ModelError(f"{path}: architecture {arch!r} is not supported; supported: {', '.join(ARCHITECTURES)}")
    values = {}
    for attr, key in _META.items():
        values[attr] = _field(reader, f"{arch}.{key}", path, _META_DEFAULTS.get(attr))
    names = {t.name: t for t in reader.tensors}
    if "token_embd.weight" not in names:
        raise ModelError(f"{path} lacks the tensor token_embd.weight")
    embd_shape = [int(d) for d in names["token_embd.weight"].shape]
    vocab = _field(reader, f"{arch}.vocab_size", path, embd_shape[-1])
    ints = {name: _int_meta(values[name], f"{arch}.{_META[name]}", path, name)
            for name in ("n_layers", "hidden", "ffn", "n_heads", "n_kv_heads", "context_length")}
    layers = {int(n.split(".")[1]) for n in names  # ASCII digits only: "²".isdigit() is True, int("²") fails
              if n.startswith("blk.") and n.split(".")[1].isascii() and n.split(".")[1].isdigit()}
    if layers and layers != set(range(ints["n_layers"])):  # none at all: the missing tensor is named below
        raise ModelError(f"{path}: metadata key {arch}.block_count = {ints['n_layers']}, but the file holds blk.N "
                         f"tensors for {len(layers)} layer(s){' (not 0..N-1)' if layers and max(layers) >= len(layers) else ''}")
    vocab = _int_meta(vocab, f"{arch}.vocab_size", path, "vocab")
    n_heads = ints["n_heads"]
    head_dim = _int_meta(_field(reader, f"{arch}.attention.key_length", path, ints["hidden"] // n_heads),
                         f"{arch}.attention.key_length", path, "head_dim")
    config = ModelConfig(
        arch=str(arch),
        name=str(_field(reader, "general.name", path, path.stem)),
        n_layers=ints["n_layers"],
        hidden=ints["hidden"],
        ffn=ints["ffn"],
        n_heads=n_heads,
        n_kv_heads=ints["n_kv_heads"],
        head_dim=head_dim,
        vocab=vocab,
        rope_base=_float_meta(values["rope_base"], f"{arch}.{_META['rope_base']}", path, "rope_base"),
        rms_eps=_float_meta(values["rms_eps"], f"{arch}.{_META['rms_eps']}", path, "rms_eps"),
        context_length=ints["context_length"],
        qkv_bias=any(f"blk.0.attn_{p}.bias" in names for p in "qkv"),  # one missing bias is then named as missing
        rope_style=ROPE_STYLE[arch],
        tied_output="output.weight" not in names,
        rope_freqs="rope_freqs.weight" in names,
    )
    try:
        return config.validate()
    except ModelError as exc:
        raise ModelError(f"{path}: {exc}") from None


def load_gguf(path, progress: Progress = None) -> ModelWeights:
    """Read a llama or qwen2 GGUF file (memory-mapped by gguf's GGUFReader) and copy its tensors to the device.

    Hyper-parameters come from ``{arch}.*`` metadata (block_count, embedding_length, feed_forward_length,
    attention.head_count, attention.head_count_kv, rope.freq_base (default 1e4), attention.
    layer_norm_rms_epsilon, context_length; vocab_size and attention.key_length when present, else from
    token_embd's shape and hidden / heads). QKV bias = attn_q.bias present; tied output = no output.weight.
    Every tensor `config.tensor_names` lists must be present with that shape, in a type `kernels.quant`
    dequantizes (any of ``kernels.quant.SUPPORTED``); a metadata key or tensor that would change the math and is not
    implemented is refused by name (`check_supported`), never ignored.

    Raises ModelError (one sentence) for: a missing file, not a GGUF file, a truncated or corrupt one, an
    unsupported architecture, a missing metadata key or tensor, a wrong shape, an unsupported tensor type.
    """
    weights, specs = inspect_gguf(path)
    _require_device()
    total = sum(s.n_bytes for s, _ in specs)
    done = 0
    weights.allocate([spec for spec, _ in specs])
    for spec, t in specs:
        weights.device(spec.name).copy_to_device(np.ascontiguousarray(t.data).view(np.uint8).reshape(-1))
        done += spec.n_bytes
        if progress:
            progress(spec.name, done / total)
    return weights


def _check_data_section(reader, path: Path) -> None:
    """The tensors must fill the file's data section: its last tensor ends within one alignment of the file's end.
    A header whose tensor count or offsets are wrong (a count one too low shifts every tensor's bytes by the size of
    a tensor-info entry) is refused here, not loaded misaligned."""
    size = path.stat().st_size
    end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=int(reader.data_offset))
    if not 0 <= size - end < int(reader.alignment):
        raise ModelError(f"{path}: its tensors end at byte {end:,} of {size:,}; the header's tensor count or "
                         "offsets do not describe this file (truncated, or a corrupt header)")


def _check_rope_factors(tensor, path: Path) -> None:
    """A ``rope_freqs.weight`` tensor must be F32 (as llama.cpp writes it) and hold finite positive divisors."""
    if tensor.tensor_type.name != "F32":
        raise ModelError(f"{path}: tensor rope_freqs.weight has type {tensor.tensor_type.name}; RoPE frequency "
                         "factors must be F32")
    values = np.asarray(tensor.data, dtype=np.float64).reshape(-1)
    if not (np.isfinite(values).all() and (values > 0).all()):
        raise ModelError(f"{path}: tensor rope_freqs.weight must hold finite positive factors (each pair's RoPE "
                         f"frequency is divided by its factor); it has {int((~(np.isfinite(values) & (values > 0))).sum())} "
                         "that are not")


def inspect_gguf(path) -> tuple[ModelWeights, list]:
    """Everything `load_gguf` checks, on the host only (no GPU needed, nothing copied): the file, its metadata
    (by value) and every tensor's presence, type, shape and bytes. Returns the ModelWeights without tensors and
    the (TensorSpec, gguf tensor) pairs to copy. Raises ModelError as `load_gguf` does."""
    from kernels.quant import SUPPORTED

    path = Path(path)
    reader = _open_reader(path)
    config = read_config(reader, path)
    check_supported(reader, config.arch, config, path)
    by_name = {t.name: t for t in reader.tensors}
    file_type = _field(reader, "general.file_type", path) if "general.file_type" in reader.fields else None
    if file_type is not None and (isinstance(file_type, bool) or not isinstance(file_type, (int, np.integer))
                                  or not 0 <= int(file_type) < 1 << 16):
        raise ModelError(f"{path}: metadata key general.file_type must be a small non-negative integer (llama.cpp's "
                         f"LLAMA_FTYPE, 15 = Q4_K_M), got {type(file_type).__name__} {file_type!r:.40}")
    weights = ModelWeights(config, file_type=int(file_type) if file_type is not None else None, source=str(path))
    wanted = tensor_names(config)
    specs = []
    for name, shape in wanted:
        t = by_name.get(name)
        if t is None:
            raise ModelError(f"{path} lacks the tensor {name}")
        qname = t.tensor_type.name
        if qname not in SUPPORTED:
            raise ModelError(
                f"{path}: tensor {name} has type {qname}, which minfer cannot dequantize; supported: "
                f"{', '.join(SUPPORTED)}"
            )
        got = tuple(int(d) for d in t.shape)
        if got != shape:
            raise ModelError(f"{path}: tensor {name} has GGUF shape {got}, but the metadata implies {shape}")
        spec = TensorSpec(name, shape, qname)
        if t.data.nbytes != spec.n_bytes:
            raise ModelError(f"{path} is truncated: tensor {name} has {t.data.nbytes} of its {spec.n_bytes} bytes")
        if name == "rope_freqs.weight":
            _check_rope_factors(t, path)
        specs.append((spec, t))
    _check_data_section(reader, path)
    return weights, specs
