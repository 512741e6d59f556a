"""The gemv kernels' per-format facts that need no numba (`kernels.gemv`): which formats gemv takes, which each
knob takes (MMVQ, STAGE, FOLD) and how many lanes share a block. `kernels.gemv.formats` pairs them with the x
loaders and block dots (numba device functions) and checks that the two agree; `kernels.gemv.config` and the gemv
experiment's knob table read only this module, so listing the knobs imports no numba.
"""

from __future__ import annotations

from kernels.errors import KernelConstraintError
from kernels.quant.formats import FORMATS, SUPPORTED, block_format

FLOAT_GROUP = 8
"""Float types: ``id`` must be a multiple of 8 (each lane reads a row's elements in whole 16-byte groups)."""
LANES_PER_BLOCK = {
    "F32": 1, "F16": 1, "BF16": 1,
    "Q4_0": 2, "Q4_1": 2, "Q5_0": 2, "Q5_1": 2, "Q8_0": 2,
    "Q2_K": 8, "Q3_K": 8, "Q4_K": 8, "Q5_K": 8, "Q6_K": 8,
    "MXFP4": 2,
}
"""Lanes of a warp that share one GGUF block with f32 x, by format (a chunk of a row is ``32 / lanes`` blocks)."""
assert set(LANES_PER_BLOCK) == set(SUPPORTED), "every supported format needs a gemv implementation"
GEMV_TYPES = tuple(SUPPORTED)
"""Names of every format ``gemv_q`` takes (all of `kernels.quant.SUPPORTED`)."""
MMVQ_TYPES = ("Q4_K", "Q6_K", "Q8_0")
"""Formats with an MMVQ kernel (x given as `kernels.quantize_q8.Q8Blocks`): the default preset's Q4_K and Q6_K,
and Q8_0."""
STAGE_TYPES = tuple(name for name in SUPPORTED if FORMATS[name].align == 2)
"""Formats STAGE > 0 takes: the ones whose blocks are only 2-byte aligned (their kernels read ``uint16`` views):
Q4_0, Q5_0, Q8_0, Q3_K, Q6_K."""
FOLD_TYPES = ("Q6_K",)
"""Formats FOLD=1 takes: Q6_K, whose MMVQ dot subtracts 32 from every stored q."""


def _format_name(qtype, mmvq: bool) -> str:
    try:
        name = block_format(qtype).name
    except KeyError as e:
        raise KernelConstraintError(e.args[0]) from None
    if mmvq and name not in MMVQ_TYPES:
        raise KernelConstraintError(
            f"{name} has no MMVQ (int8-activation) kernel; MMVQ covers {', '.join(MMVQ_TYPES)} (use f32 x for {name})"
        )
    return name


def _known_format(qtype) -> tuple:
    """(the format's name, None), or (None, the sentence naming the supported formats) for an unknown ``qtype``."""
    try:
        return block_format(qtype).name, None
    except KeyError as e:
        return None, e.args[0]
