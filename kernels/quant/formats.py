"""The GGUF tensor formats minfer dequantizes: block size, bytes per block and the alignment its kernel relies on.

Sizes come from gguf-py's ``GGML_QUANT_SIZES`` (the Python mirror of ggml's ``ggml_type_traits``), never typed
by hand. A *block* holds ``block_size`` consecutive weights of one row in ``type_size`` bytes; a row of ``id``
weights is ``id / block_size`` blocks, and a tensor ``[od, id]`` is ``od`` such rows back to back (ggml-common.h;
gguf-py ``quants.py``). Plain float types are blocks of one element.

``align`` is the one number the kernels' memory accesses rest on. Every block of a format starts at a multiple
of ``align`` bytes from the start of the buffer (``align`` is the largest power of two dividing ``type_size``,
capped at 16), so when the buffer itself starts ``align``-aligned (the launcher checks) a load of at most
``align`` bytes at an ``align``-multiple offset inside a block is aligned. No kernel issues a global load wider
than its format's ``align`` (the compile tests read that off the PTX). The odd block sizes are the trap this
guards: Q5_0 (22 B), Q8_0 (34 B), Q4_0 (18 B), Q3_K (110 B) and Q6_K (210 B) blocks start only 2-byte
aligned, MXFP4 (17 B) blocks 1-byte aligned, so a 4-byte load at ``blk + 2`` is a misaligned-address fault
(cudaErrorMisalignedAddress) on every other block. The float types read whole 16-byte groups, so their ``align``
is 16.
"""

from __future__ import annotations

from dataclasses import dataclass

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType


@dataclass(frozen=True)
class BlockFormat:
    """One GGUF tensor format. name: ggml's name ("Q4_K"); qtype: gguf's enum member; block_size: weights per
    block; type_size: bytes per block; align: the buffer alignment the kernel needs and the widest global load
    it issues, in bytes; layout: the block's fields, in byte order, as ggml-common.h declares them."""

    name: str
    qtype: GGMLQuantizationType
    block_size: int
    type_size: int
    align: int
    layout: str

    def row_bytes(self, id: int) -> int:
        """Bytes of one row of ``id`` weights (``id`` a multiple of ``block_size``)."""
        return id // self.block_size * self.type_size


def _lowest_power_of_two(n: int) -> int:
    return n & -n


_LAYOUTS = {
    "F32": "f32 value (4 B)",
    "F16": "f16 value (2 B)",
    "BF16": "bf16 value (2 B): the upper 16 bits of a float32",
    "Q4_0": "d f16 (2) | qs[16]: weight j = d*((qs[j%16] >> 4*(j/16) & 0xF) - 8)",
    "Q4_1": "d f16 (2) | m f16 (2) | qs[16]: weight j = d*(qs[j%16] >> 4*(j/16) & 0xF) + m",
    "Q5_0": "d f16 (2) | qh[4] (bit j = 5th bit of weight j) | qs[16]: weight j = d*(q5 - 16)",
    "Q5_1": "d f16 (2) | m f16 (2) | qh[4] | qs[16]: weight j = d*q5 + m",
    "Q8_0": "d f16 (2) | qs[32] int8: weight j = d*qs[j]",
    "Q2_K": "scales[16] (lo nibble scale, hi nibble min) | qs[64] (2 bits) | d f16 | dmin f16",
    "Q3_K": "hmask[32] | qs[64] (2 bits) | scales[12] (16 x 6 bits, signed - 32) | d f16",
    "Q4_K": "d f16 | dmin f16 | scales[12] (8 x (6-bit scale, 6-bit min)) | qs[128] (4 bits)",
    "Q5_K": "d f16 | dmin f16 | scales[12] | qh[32] (5th bits) | qs[128] (4 bits)",
    "Q6_K": "ql[128] (low 4 bits) | qh[64] (high 2 bits) | scales[16] int8 | d f16: weight = d*sc*(q6 - 32)",
    "MXFP4": "e E8M0 (1) | qs[16] (E2M1 nibbles: j < 16 low, j >= 16 high): weight = 2^(e-127) * e2m1",
}

_FLOAT_ALIGN = 16  # the float kernels read 8 elements per thread with 16-byte loads

FORMATS: dict[str, BlockFormat] = {}
for _name, _layout in _LAYOUTS.items():
    _qtype = GGMLQuantizationType[_name]
    _bs, _ts = GGML_QUANT_SIZES[_qtype]
    _align = _FLOAT_ALIGN if _bs == 1 else min(16, _lowest_power_of_two(_ts))
    FORMATS[_name] = BlockFormat(_name, _qtype, _bs, _ts, _align, _layout)
del _name, _layout, _qtype, _bs, _ts, _align

SUPPORTED = tuple(FORMATS)
"""Names of every format `kernels.quant.dequantize` takes, in declaration order."""


def block_format(qtype) -> BlockFormat:
    """The format for ``qtype`` (a name like "Q4_K", a ``GGMLQuantizationType`` or its integer value).

    Raises KeyError (never for a supported type) whose message lists the supported names; the launcher turns it
    into KernelConstraintError.
    """
    if isinstance(qtype, str):
        name = qtype.upper()
    else:
        try:
            name = GGMLQuantizationType(int(qtype)).name
        except (ValueError, TypeError):
            name = repr(qtype)
    if name not in FORMATS:
        raise KeyError(f"{name} is not a supported GGUF type; supported: {', '.join(SUPPORTED)}")
    return FORMATS[name]
