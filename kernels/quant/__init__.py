"""GGUF block formats and their dequantization kernels: ``dequantize(raw, qtype, od, id) -> f16 [od, id]``.

`formats` (block sizes, layouts, alignment, from gguf-py's tables), `bits` (bit-exact scalar helpers),
`legacy` (Q4_0 .. Q8_0), `kquants` (Q2_K .. Q6_K), `floats` (F16, BF16, F32, MXFP4), `dequant` (the launcher), `config` (its
threads-per-block choices, no numba).
"""

import importlib

from kernels.quant.config import TPB_VALUES
from kernels.quant.formats import FORMATS, SUPPORTED, BlockFormat, block_format

# The launcher's names load on first use (PEP 562): `kernels.quant.formats` (the block layouts, the knob tables'
# TYPE values) imports no numba, and neither does importing this package.
_LAUNCHER = ("dequantize", "kernel_for", "kernel_signature")


def __getattr__(name: str):
    if name not in _LAUNCHER:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module("kernels.quant.dequant"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAUNCHER))


__all__ = [
    "FORMATS",
    "SUPPORTED",
    "TPB_VALUES",
    "BlockFormat",
    "block_format",
    "dequantize",
    "kernel_for",
    "kernel_signature",
]
