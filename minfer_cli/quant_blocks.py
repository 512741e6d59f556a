"""Random but valid GGUF tensor bytes (host numpy) and the gguf-py reference dequantization, for tests and the
`dequant` experiment.

Valid means: every scale field is a finite f16 (or an E8M0 exponent) of small magnitude, |d| in [1e-3, 1e-1]
with a random sign, so that no dequantized weight overflows f16 (the largest, Q6_K's d*127*32, stays near 400);
every quant bit is random (uniform bytes), so the data are never all zeros. Plain float tensors hold
N(0, 0.05^2) values (F32 / F16; BF16 is the upper half of such float32s). Field offsets are ggml-common.h's.
"""

from __future__ import annotations

import numpy as np
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

D_MIN, D_MAX = 1e-3, 1e-1
E8M0_RANGE = (117, 130)  # MXFP4 block scales 2^(e-127) in [2^-10, 2^2]: weights within [2^-11, 24]

# Byte offsets of the f16 scale fields (d, dmin, m) inside one block of each format.
_F16_SCALE_OFFSETS = {
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q8_0": (0,),
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
}


def _qtype(qtype) -> GGMLQuantizationType:
    if isinstance(qtype, str):
        return GGMLQuantizationType[qtype.upper()]
    return GGMLQuantizationType(int(qtype))


def random_blocks(qtype, od: int, id: int, rng: np.random.Generator) -> np.ndarray:
    """1-D uint8 array: the bytes of a random valid ``[od, id]`` tensor of ``qtype`` (name, enum or int).

    Raises ValueError when ``id`` is not a multiple of the block size, and for formats it does not know.
    """
    qt = _qtype(qtype)
    block_size, type_size = GGML_QUANT_SIZES[qt]
    if id % block_size:
        raise ValueError(f"id={id} is not a multiple of the {qt.name} block size {block_size}")
    n = od * id
    if qt.name in ("F32", "F16", "BF16"):
        x = (rng.standard_normal(n) * 0.05).astype(np.float32)
        if qt.name == "F32":
            return x.view(np.uint8).copy()
        if qt.name == "F16":
            return x.astype(np.float16).view(np.uint8).copy()
        return (x.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).copy()
    n_blocks = n // block_size
    blocks = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    if qt.name == "MXFP4":
        blocks[:, 0] = rng.integers(*E8M0_RANGE, size=n_blocks, dtype=np.uint8)
    elif qt.name in _F16_SCALE_OFFSETS:
        for off in _F16_SCALE_OFFSETS[qt.name]:
            mag = np.exp(rng.uniform(np.log(D_MIN), np.log(D_MAX), size=n_blocks))
            d = (mag * rng.choice((-1.0, 1.0), size=n_blocks)).astype(np.float16)
            blocks[:, off : off + 2] = d.view(np.uint8).reshape(n_blocks, 2)
    else:
        raise ValueError(f"random_blocks does not know the {qt.name} layout")
    return blocks.reshape(-1)


def reference_f16(raw: np.ndarray, qtype, od: int, id: int) -> np.ndarray:
    """``float16(gguf.quants.dequantize(raw, qtype))`` as an ``[od, id]`` array: the reference every kernel
    output must equal element for element (gguf-py dequantizes to float32; numpy rounds to nearest even)."""
    qt = _qtype(qtype)
    block_size, type_size = GGML_QUANT_SIZES[qt]
    rows = np.ascontiguousarray(raw, dtype=np.uint8).reshape(od, id // block_size * type_size)
    return quants.dequantize(rows, qt).reshape(od, id).astype(np.float16)
