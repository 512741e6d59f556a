"""Per-format tables of the gemv kernels (`kernels.gemv`): which x loader and block dot each GGUF format uses with
f32 x, with Q8_1 x (MMVQ) and with compensated Q8_1 x (MMVQ with XRES). How many lanes share a block and which formats each knob takes are in
`kernels.gemv.tables` (no numba; checked against the dots below). Block sizes, byte sizes and
alignments come from `kernels.quant.formats` (the one table of GGUF layouts), not from here.
"""

from __future__ import annotations

import numpy as np

from kernels.gemv.device import _q6_k_lane_at
from kernels.gemv.dots import (
    _dot_bf16,
    _dot_f16,
    _dot_f32,
    _dot_mxfp4,
    _dot_q2_k,
    _dot_q3_k,
    _dot_q4_0,
    _dot_q4_1,
    _dot_q4_k,
    _dot_q5_0,
    _dot_q5_1,
    _dot_q5_k,
    _dot_q6_k,
    _dot_q8_0,
    _math_q6_k,
    _x_float,
    _x_k_nibbles,
    _x_k_planes,
    _x_legacy,
    _x_q8_0,
)
from kernels.gemv.dots_q8 import (
    _dotq_q4_k,
    _dotq_q6_k,
    _dotq_q6_k_fold,
    _dotq_q8_0,
    _dotqr_q4_k,
    _dotqr_q6_k,
    _dotqr_q6_k_fold,
    _dotqr_q8_0,
    _mathq_q6_k,
    _mathq_q6_k_fold,
    _mathqr_q6_k,
    _mathqr_q6_k_fold,
    _xq_k_nibbles,
    _xq_k_planes,
    _xq_k_planes_fold,
    _xq_q8_0,
    _xqr_k_nibbles,
    _xqr_k_planes,
    _xqr_k_planes_fold,
    _xqr_q8_0,
)
from kernels.gemv.tables import FLOAT_GROUP, FOLD_TYPES, LANES_PER_BLOCK, MMVQ_TYPES
from kernels.quant.formats import FORMATS, SUPPORTED

_VIEW = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64, 16: np.uint32}
"""The dtype a kernel views W's bytes as, by the format's ``align``: the widest word every block starts on, except
that 16-byte-aligned blocks are uint32 words read four at a time (`kernels.quant.bits.ld_global_v4_u32`)."""


def _geometry(name: str) -> tuple:
    """(weights per (pseudo-)block, raw view dtype) of format ``name`` from `kernels.quant.formats`: a float type's
    pseudo-block is the ``FLOAT_GROUP`` elements one lane reads."""
    fmt = FORMATS[name]
    return (FLOAT_GROUP if fmt.block_size == 1 else fmt.block_size), _VIEW[fmt.align]


# name -> (x loader, block dot, lanes per block); `_IMPLS` adds `_geometry`'s two
_F32_DOTS = {
    "F32": (_x_float, _dot_f32, 1),
    "F16": (_x_float, _dot_f16, 1),
    "BF16": (_x_float, _dot_bf16, 1),
    "Q4_0": (_x_legacy, _dot_q4_0, 2),
    "Q4_1": (_x_legacy, _dot_q4_1, 2),
    "Q5_0": (_x_legacy, _dot_q5_0, 2),
    "Q5_1": (_x_legacy, _dot_q5_1, 2),
    "Q8_0": (_x_q8_0, _dot_q8_0, 2),
    "Q2_K": (_x_k_planes, _dot_q2_k, 8),
    "Q3_K": (_x_k_planes, _dot_q3_k, 8),
    "Q4_K": (_x_k_nibbles, _dot_q4_k, 8),
    "Q5_K": (_x_k_nibbles, _dot_q5_k, 8),
    "Q6_K": (_x_k_planes, _dot_q6_k, 8),
    "MXFP4": (_x_legacy, _dot_mxfp4, 2),
}
_MMVQ_DOTS = {
    "Q4_K": (_xq_k_nibbles, _dotq_q4_k, 8),
    "Q6_K": (_xq_k_planes, _dotq_q6_k, 8),
    "Q8_0": (_xq_q8_0, _dotq_q8_0, 2),
}
_MMVQ_RES_DOTS = {
    "Q4_K": (_xqr_k_nibbles, _dotqr_q4_k, 8),
    "Q6_K": (_xqr_k_planes, _dotqr_q6_k, 8),
    "Q8_0": (_xqr_q8_0, _dotqr_q8_0, 2),
}
assert set(_F32_DOTS) == set(SUPPORTED), "every supported format needs a gemv implementation"
# name -> (x loader, block dot, lanes per block, weights per (pseudo-)block, raw view dtype)
_IMPLS = {name: (*dots, *_geometry(name)) for name, dots in _F32_DOTS.items()}
_MMVQ_IMPLS = {name: (*dots, *_geometry(name)) for name, dots in _MMVQ_DOTS.items()}
_MMVQ_RES_IMPLS = {name: (*dots, *_geometry(name)) for name, dots in _MMVQ_RES_DOTS.items()}
assert all(dots[2] == LANES_PER_BLOCK[name] for name, dots in _F32_DOTS.items()), "kernels.gemv.tables' lanes differ"
assert MMVQ_TYPES == tuple(_MMVQ_IMPLS) == tuple(_MMVQ_RES_IMPLS), "kernels.gemv.tables.MMVQ_TYPES differs from " \
    "the MMVQ dots"
# STAGE=2..4: name -> (a lane's fetch from the block at element ``base`` of a uint16 ring window, the decode of what
# it returned with f32 x, with Q8_1 x, with compensated Q8_1 x); the block dot computes decode(fetch(...)), so the
# ring computes what STAGE=0 does (`kernels.gemv.codegen._ring_loop`). The other STAGE_TYPES decode a slice of the
# window with their block dot.
_RING_FETCH = {"Q6_K": (_q6_k_lane_at, _math_q6_k, _mathq_q6_k, _mathqr_q6_k)}
# FOLD=1: name -> (x loader, Q8_1-x dot, the dot's decode half for the ring), plain and compensated x
_FOLD = {"Q6_K": (_xq_k_planes_fold, _dotq_q6_k_fold, _mathq_q6_k_fold)}
_FOLD_RES = {"Q6_K": (_xqr_k_planes_fold, _dotqr_q6_k_fold, _mathqr_q6_k_fold)}
assert FOLD_TYPES == tuple(_FOLD) == tuple(_FOLD_RES), "kernels.gemv.tables.FOLD_TYPES differs from the FOLD dots"

