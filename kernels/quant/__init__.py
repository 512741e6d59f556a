"""GGUF block formats and their dequantization kernels: ``dequantize(raw, qtype, od, id) -> f16 [od, id]``.

`formats` (block sizes, layouts, alignment, from gguf-py's tables), `bits` (bit-exact scalar helpers),
`legacy` (Q4_0 .. Q8_0), `kquants` (Q2_K .. Q6_K), `floats` (F16, BF16, F32, MXFP4), `dequant` (the launcher).
"""

from kernels.quant.dequant import TPB_VALUES, dequantize, kernel_for, kernel_signature
from kernels.quant.formats import FORMATS, SUPPORTED, BlockFormat, block_format

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
