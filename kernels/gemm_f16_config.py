"""The knob table of `kernels.gemm_f16` (allowed values, defaults, the baseline and the best mma_sync arm), in a
module without numba so that `minfer experiments list` and the engine's knob table read it without importing the
kernel. `kernels.gemm_f16` re-exports every name here.
"""

from __future__ import annotations

# Allowed knob values. The baseline arm is MMA=mma_sync TM=64 TN=64 KS=32 STAGES=2 STAGING=cp_async GROUP=1.
# What each value measured is in the ledger and baselines/gemm-notes.yaml.
KNOBS: dict[str, tuple] = {
    # wgmma (sm_90a): Hopper warpgroup MMA m64nNk16 with both operands in shared memory (descriptors over the same
    # swizzled cp.async tiles), one warpgroup per 64 nt rows x N od columns; needs STAGING=cp_async and
    # LOOP=addr32|pipe (see _make_kernel_wgmma).
    "MMA": ("mma_sync", "wmma", "wgmma"),
    "TM": (64, 128, 256),  # od tile (B rows per block)
    "TN": (64, 128),  # nt tile (A rows per block)
    "KS": (32, 64),  # k step per shared tile
    "STAGES": (2, 3, 4),  # shared-memory ring depth (STAGES-1 tiles in flight)
    "STAGING": ("cp_async", "sync"),  # how global tiles reach shared memory
    "GROUP": (1, 4, 8),  # od tiles per program-order group
    # Main-loop schedule (mma_sync + cp_async only; see _make_kernel_v2). v1: the original loop (per-access 64-bit
    # index math, `it % STAGES` division every k tile). addr32: same schedule, addresses precomputed once as
    # 32-bit shared / 64-bit global byte offsets. pipe: addr32 + fragments double-buffered in registers across
    # the k16 sub-steps (CUTLASS sm80 multistage order). With MMA=wgmma: addr32 waits for each k tile's wgmma batch
    # before the next barrier; pipe keeps one batch in flight (wgmma.wait_group 1; copies then run STAGES-2 tiles
    # ahead; needs STAGES >= 3).
    "LOOP": ("v1", "addr32", "pipe"),
}
# Launch knob (not compiled in: one kernel serves every value). SPLITK: k slices per C tile, each a CUDA block
# (grid y) that multiplies one contiguous range of k tiles and writes f32 partials to a workspace; a second kernel
# adds the slices in slice order (deterministic) into C. For grids smaller than the GPU (short prompts: a 7B
# ffn_down at nt=128 is 14 tiles of 256x128 on 132 SMs). 0: auto, the count `auto_slices` gives the shape; 1: no
# split. MMA=wgmma only.
LAUNCH_KNOBS: dict[str, tuple] = {"SPLITK": (0, 1, 2, 3, 4, 6, 8, 12, 16)}
LAUNCH_DEFAULT: dict = {"SPLITK": 0}
MAX_SLICES = 16
MIN_KTILES_PER_SLICE = 12


def auto_slices(tiles: int, ktiles: int, sms: int) -> int:
    """SPLITK=0 (auto): k slices for a grid of ``tiles`` C tiles with ``ktiles`` k tiles each on ``sms`` SMs (one
    256x128 wgmma block a SM). 1 when the tiles fill the GPU; else the most slices with every block in one wave
    (``tiles * slices <= sms``), at most MAX_SLICES, each slice at least MIN_KTILES_PER_SLICE k tiles (the ring's
    prologue and the partials' write and read must stay small beside the slice's k loop). A heuristic: `minfer
    sweep gemm_f16 SPLITK=...` on a small-nt workload measures the alternatives."""
    if tiles >= sms:
        return 1
    return max(1, min(MAX_SLICES, sms // tiles, ktiles // MIN_KTILES_PER_SLICE))


BASELINE: dict = {"MMA": "mma_sync", "TM": 64, "TN": 64, "KS": 32, "STAGES": 2, "STAGING": "cp_async", "GROUP": 1,
                  "LOOP": "v1"}
# The fastest measured on the H200 (DEFAULT: wgmma, 2 warpgroups of m64n256k16 on a 128 x 256 tile, k step 64 with
# the 128-byte swizzle, a 4-stage cp.async ring, grouped order 8, one wgmma batch in flight) and the fastest mma_sync
# arm (MMA_SYNC_BEST), the A/B baseline the wgmma work is judged against; figures in baselines/gemm-notes.yaml.
DEFAULT: dict = {"MMA": "wgmma", "TM": 256, "TN": 128, "KS": 64, "STAGES": 4, "STAGING": "cp_async", "GROUP": 8,
                 "LOOP": "pipe"}
MMA_SYNC_BEST: dict = {"MMA": "mma_sync", "TM": 256, "TN": 128, "KS": 32, "STAGES": 3, "STAGING": "cp_async",
                       "GROUP": 8, "LOOP": "pipe"}
