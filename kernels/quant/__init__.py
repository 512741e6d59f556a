"""GGUF block formats and their dequantization kernels: ``dequantize(raw, qtype, od, id) -> f16 [od, id]``.

`formats` (block sizes, layouts, alignment, from gguf-py's tables), `bits` (bit-exact scalar helpers),
`legacy` (Q4_0 .. Q8_0), `kquants` (Q2_K .. Q6_K), `floats` (F16, BF16, F32, MXFP4), `dequant` (the launcher), `config` (its
threads-per-block choices, no numba).
"""

from kernels.lazy import lazy_exports
from kernels.quant.config import TPB_VALUES
from kernels.quant.formats import FORMATS, SUPPORTED, BlockFormat, block_format

# The launcher's names load on first use (PEP 562): `kernels.quant.formats` (the block layouts, the knob tables'
# TYPE values) imports no numba, and neither does importing this package.
_LAUNCHER = ("dequantize", "kernel_for", "kernel_signature")


__getattr__, __dir__ = lazy_exports(__name__, dict.fromkeys(_LAUNCHER, "dequant"), globals())


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
