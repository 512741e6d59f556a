"""The knob table of `kernels.attention` (allowed values and defaults) and the head dims both attention kernels run, in a module without
numba so that `minfer experiments list` and the engine's knob table read it without importing the kernel.
`kernels.attention` re-exports every name here.
"""

from __future__ import annotations

HEAD_DIMS: tuple[int, ...] = (64, 80, 96, 128, 256)
"""The head dims both attention kernels (and so the engine) run: 64 (Llama-3.2-1B, TinyLlama-1.1B, Qwen2-0.5B),
80 (Phi-2, StableLM), 96 (Phi-3), 128 (most 7-70B models), 256 (Gemma). The kernels lay a row out as
`padded_head_dim` elements (a power of two of 16-byte chunks: the prefill kernel's XOR swizzle and the decode
kernel's lanes-per-row split need one) and compute over the D real ones."""


def padded_head_dim(head_dim: int) -> int:
    """The row width (elements) the attention kernels lay a head_dim-wide row out in: the smallest power of two >=
    head_dim (80 and 96 -> 128; 64, 128, 256 are their own). The padding is never loaded from memory, computed
    with or stored."""
    return 1 << (int(head_dim) - 1).bit_length()


def head_dim_refusal(head_dim) -> str | None:
    """None when both attention kernels run ``head_dim``, else the one-line reason (names the supported dims)."""
    if head_dim in HEAD_DIMS:
        return None
    return f"head_dim {head_dim}: the attention kernels run head_dim {', '.join(map(str, HEAD_DIMS))} only"


KNOBS: dict[str, tuple] = {
    "BK": (32, 64),  # keys per K/V tile
    "MMA": ("mma_sync", "wgmma"),  # the products: per-warp mma.sync (FA2), or per-warpgroup wgmma (Hopper, FA3's)
}
DEFAULT: dict = {"BK": 64, "MMA": "wgmma"}
REMOVED: dict = {"BQ": 64, "STAGES": 2}
"""Knobs deleted with the variants they switched on, and the value the kernels still run: BQ=128 (two warpgroups
a block) and STAGES=1 (one K/V slot: load, then compute) lost their A/Bs against BQ=64 and STAGES=2 (ledger #275,
#276)."""
BQ = REMOVED["BQ"]  # query rows per block: 4 warps of 16 rows (one warpgroup for wgmma)
STAGES = REMOVED["STAGES"]  # K/V shared ring depth: tile j+1 loads while tile j computes
LEGACY: dict = {"MMA": "mma_sync"}
"""Knobs added after the first records, and the value that reproduces the kernel before them (mma.sync products):
what the `attention` experiment and the engine's FA_ knobs read for a record that predates the knob."""

