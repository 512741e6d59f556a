"""The knob table of `kernels.attention` (allowed values and defaults) and its head dimension, in a module without
numba so that `minfer experiments list` and the engine's knob table read it without importing the kernel.
`kernels.attention` re-exports every name here.
"""

from __future__ import annotations

HEAD_DIM = 128

KNOBS: dict[str, tuple] = {
    "BQ": (64, 128),  # query rows per block (BQ/16 warps of 16 rows each)
    "BK": (32, 64),  # keys per K/V tile
    "STAGES": (1, 2),  # K/V shared ring depth: 1 = load then compute; 2 = tile j+1 loads while j computes
}
DEFAULT: dict = {"BQ": 64, "BK": 64, "STAGES": 2}
