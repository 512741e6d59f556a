"""The knob table of `kernels.gemm_f16` (allowed values, defaults, the baseline and the best mma_sync arm), in a
module without numba so that `minfer experiments list` and the engine's knob table read it without importing the
kernel. `kernels.gemm_f16` re-exports every name here.
"""

from __future__ import annotations

# Allowed knob values. The baseline arm is MMA=mma_sync TM=64 TN=64 KS=32 STAGES=2 STAGING=cp_async GROUP=1.
KNOBS: dict[str, tuple] = {
    # wmma: +23% time vs mma_sync at the 64x64x32 baseline on H200 (ledger #9). wgmma (sm_90a): Hopper warpgroup
    # MMA m64nNk16 with both operands in shared memory (descriptors over the same swizzled cp.async tiles), one
    # warpgroup per 64 nt rows x N od columns; needs STAGING=cp_async and LOOP=addr32|pipe (see _make_kernel_wgmma).
    "MMA": ("mma_sync", "wmma", "wgmma"),
    "TM": (64, 128, 256),  # od tile (B rows per block); TM=128 -16.5% vs 64 at the baseline (ledger #6)
    "TN": (64, 128),  # nt tile (A rows per block)
    "KS": (32, 64),  # k step per shared tile; KS=64 -11.5% at the baseline (#7) but slower at 3 stages (#5)
    "STAGES": (2, 3, 4),  # shared-memory ring depth (STAGES-1 tiles in flight); 4 stages +2% vs 3 at 256x128 (#12)
    "STAGING": ("cp_async", "sync"),  # sync: +29% time vs cp_async at the baseline (ledger #8)
    "GROUP": (1, 4, 8),  # od tiles per program-order group
    # Main-loop schedule (mma_sync + cp_async only; see _make_kernel_v2). v1: the original loop (per-access 64-bit
    # index math, `it % STAGES` division every k tile). addr32: same schedule, addresses precomputed once as
    # 32-bit shared / 64-bit global byte offsets. pipe: addr32 + fragments double-buffered in registers across
    # the k16 sub-steps (CUTLASS sm80 multistage order). At 256x128x32/3 stages on ffn_up: v1 1102 µs, addr32 957,
    # pipe 826 (ledger #12). With MMA=wgmma: addr32 waits for each k tile's wgmma batch before the next barrier;
    # pipe keeps one batch in flight (wgmma.wait_group 1; copies then run STAGES-2 tiles ahead; needs STAGES >= 3).
    "LOOP": ("v1", "addr32", "pipe"),
}
BASELINE: dict = {"MMA": "mma_sync", "TM": 64, "TN": 64, "KS": 32, "STAGES": 2, "STAGING": "cp_async", "GROUP": 1,
                  "LOOP": "v1"}
# The best measured on the H200: wgmma (2 warpgroups of m64n256k16 on a 128 x 256 tile), k step 64 (128-byte
# swizzle), 4-stage cp.async ring, grouped order 8, one wgmma batch in flight: ffn_up 499.5 µs (cuBLAS 367.2 in the
# same session: 74%), ffn_down 467.7 µs (cuBLAS 383.5: 82%); 216 registers, no spills. The previous best, the same
# tile with mma_sync, KS=32, 3 stages (ledger #12: 826 µs; 829 / 831 µs in that session) is MMA_SYNC_BEST.
# wgmma dead ends in that session (ffn_up): KS=32 3 stages 998 µs (copies only one k tile ahead of the tensor
# cores), KS=32 4 stages 636, KS=64 3 stages 632, LOOP=addr32 (KS=64, 4 stages) 628, TM=128 (KS=64, 3 or 4 stages)
# 607-609, TN=64 (64 x 256, KS=64, 4 stages) 683, GROUP=4 497 (same as 8).
DEFAULT: dict = {"MMA": "wgmma", "TM": 256, "TN": 128, "KS": 64, "STAGES": 4, "STAGING": "cp_async", "GROUP": 8,
                 "LOOP": "pipe"}
MMA_SYNC_BEST: dict = {"MMA": "mma_sync", "TM": 256, "TN": 128, "KS": 32, "STAGES": 3, "STAGING": "cp_async",
                       "GROUP": 8, "LOOP": "pipe"}
