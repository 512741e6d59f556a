"""The knob table of `kernels.gemm_f16` (allowed values, defaults, the baseline and the best mma_sync arm), in a
module without numba so that `minfer experiments list` and the engine's knob table read it without importing the
kernel. `kernels.gemm_f16` re-exports every name here.
"""

from __future__ import annotations

from dataclasses import dataclass

# Allowed knob values. The baseline arm is MMA=mma_sync TM=64 TN=64 KS=32 STAGES=2 STAGING=cp_async GROUP=1.
# What each value measured is in the ledger and baselines/gemm-notes.yaml.
KNOBS: dict[str, tuple] = {
    # wgmma (sm_90a): Hopper warpgroup MMA m64nNk16 with both operands in shared memory (descriptors over the same
    # swizzled cp.async or TMA tiles), one warpgroup per 64 nt rows x N od columns; needs STAGING=cp_async with
    # LOOP=addr32|pipe (see kernels.gemm_cp_async._wgmma) or STAGING=tma (kernels.gemm_tma).
    "MMA": ("mma_sync", "wmma", "wgmma"),
    # od tile (B rows per block). 144, 192 (STAGING=tma only): other wgmma widths (m64nNk16, N any multiple of 8)
    # for products whose 256- and 128-wide grids both quantize badly on the SMs (a 7B qkv at nt=512: 72 tiles of
    # 256, 144 of 128, 96 of 192, 128 of 144). 112 (one wave of 128 tiles where 128-wide ones leave 20 of 132 SMs
    # idle, a 7B ffn_down at nt=512) took the same time as 128 (ledger #360) and was deleted.
    "TM": (64, 128, 144, 192, 256),
    # nt tile (A rows per block). 256: the register-A fused kernel's only (kernels.gemm_fused_regs, IMPL=fused_regs):
    # a producer warpgroup hands its registers to the consumers (setmaxnreg) for 128 accumulators a thread.
    "TN": (64, 128, 256),
    "KS": (32, 64),  # k step per shared tile
    "STAGES": (2, 3, 4),  # shared-memory ring depth (STAGES-1 tiles in flight)
    # How global tiles reach shared memory: cp.async by every thread, ld/st by every thread, or tma: a producer
    # warp issues one tensor-map box copy per operand and k tile (the copy engine swizzles and zero-fills),
    # completing on a per-stage mbarrier the consumer warpgroups wait on; they free a stage by arriving on its
    # second mbarrier (warp specialization, CUTLASS sm90 / FlashAttention-3). tma needs MMA=wgmma, KS=64, LOOP=pipe.
    "STAGING": ("cp_async", "sync", "tma"),
    "GROUP": (1, 4, 8),  # od tiles per program-order group
    # Main-loop schedule (mma_sync + cp_async only; kernels.gemm_cp_async._v2). v1: the original loop (per-access
    # 64-bit index math, `it % STAGES` division every k tile). addr32: same schedule, addresses precomputed once as
    # 32-bit shared / 64-bit global byte offsets. pipe: addr32 + fragments double-buffered in registers across
    # the k16 sub-steps (CUTLASS sm80 multistage order). With MMA=wgmma: addr32 waits for each k tile's wgmma batch
    # before the next barrier; pipe keeps one batch in flight (wgmma.wait_group 1; copies then run STAGES-2 tiles
    # ahead; needs STAGES >= 3).
    "LOOP": ("v1", "addr32", "pipe"),
    # How C leaves the registers in the STAGING=tma kernels (the cp.async and sync ones always store directly, so
    # there EPI=staged runs the direct code). direct: each thread stores its
    # C fragments, 4 bytes at a time (two half-filled 32-byte sectors a warp store). staged: the consumer warps
    # write the fragments into an f32 tile over the drained ring and copy it out a row at a time, 16 bytes a
    # thread (kernels.gemm_tiles.c_tile_store).
    "EPI": ("staged", "direct"),
    # MMA=wgmma kernels only. 1: no subroutine call in the kernel, so ptxas keeps its wgmma asynchronous: the tile
    # and k-slice index divisions in uint32 (a div.s64 / rem.s64 is a call) and gemm_f16_glu's SwiGLU division as
    # div.approx (an IEEE division is a call). 0: 64-bit index divisions, and ptxas warns C7509 ("wgmma.mma_async
    # instructions are serialized due to the presence of Extern calls"): it waits for each wgmma before the next.
    "NOCALL": (0, 1),
}
# Launch knob (not compiled in: one kernel serves every value). SPLITK: k slices per C tile, each a CUDA block
# that multiplies one contiguous range of k tiles and writes f32 partials to a workspace; a second kernel adds the
# slices in slice order (deterministic) into C. For grids that leave SMs idle: short prompts (a 7B ffn_down at
# nt=128 is 14 tiles of 256x128 on 132 SMs) and the last, partial wave of a larger grid (a 7B ffn_gate_up at
# nt=128 is 148 tiles: one full wave and 16). 0: auto, the plan `split_plan` gives the shape; 1: no split;
# s > 1: every tile in s slices. MMA=wgmma only.
# AUTOTILE (STAGING=tma with TM=256; chooses among compiled kernels at launch): 1 runs a product whose
# 256-wide grid quantizes badly on the SMs with TM=128 instead (`kernels.gemm_f16.launch_config`: a 7B qkv at
# nt=2048 is 288 tiles of 256, 2.2 waves, and 576 of 128; attn_output at nt=512 is 56 tiles of 256 on 132 SMs);
# 0: the tile as configured. 4 (the default): the same whole-wave choice among TM=256, 192, 144 and 128 (`TILE_TIME`;
# 192 and 144 not for the SwiGLU epilogue, whose gate and up halves are TM / 2 = 64-aligned column blocks;
# `kernels.gemm_f16.launch_config`): a 7B qkv at nt=512 runs one wave of 144 (ledger #361: pp512 +1.4%). 2 was the
# choice priced with each tile's split-K plan: it lost (ledger #320-#322); 3, the choice among 256, 192 and 128,
# was neutral three times (#335, #336, #340) and 4 holds it: both deleted.
# NARROWTAIL (STAGING=tma with TM=256): 1 runs the whole waves of 256-wide tiles a grid holds, then its last,
# partial wave's columns as 128-wide tiles in a second launch (`kernels.gemm_f16.tail_plan`: a 7B ffn_gate_up at
# nt=512 is 592 tiles of 256, 4.5 waves; 528 of them, then 128 of 128); 0: one launch.
REGS_ONLY_TN = (256,)
"""TN values only `kernels.gemm_fused_regs` compiles (`kernels.gemm_f16.resolve_config` refuses them elsewhere)."""
LAUNCH_KNOBS: dict[str, tuple] = {"SPLITK": (0, 1, 2, 3, 4, 6, 8, 12, 16), "AUTOTILE": (0, 1, 4),
                                  "NARROWTAIL": (0, 1)}
LAUNCH_DEFAULT: dict = {"SPLITK": 0, "AUTOTILE": 4, "NARROWTAIL": 1}
NARROW_TILE_TIME = 0.58
"""Time of a 128-wide (TM=128) tile over a 256-wide one's, in full waves at the same k (ledger #232: ffn_gate_up at
nt=512, 9 waves of 128 in 249.8 µs, 5 waves of 256 in 239.5 µs); `launch_config`'s wave model."""
MID_TILE_TIME = 0.86
"""Time of a 192-wide (TM=192) tile over a 256-wide one's at the same k, AUTOTILE=4's wave model: one wave of
each on a 7B qkv at nt=512 (72 tiles of 256, 96 of 192), the 192-wide one 16.1% faster (ledger #333, H100:
`minfer ab gemm_f16 -w qkv_nt512 --arm AUTOTILE=0 --arm AUTOTILE=0,TM=192`), so 1 / 1.161."""
TILE_TIME = {256: 1.0, 192: MID_TILE_TIME, 144: 0.76, 128: NARROW_TILE_TIME}
"""The wave model of `kernels.gemm_f16.launch_config`: time of one wave of TM-wide tiles over a 256-wide one's at
the same k. 144: one wave of a 7B qkv at nt=512 in 128 tiles of 144 took 0.880 of its 96 tiles of 192 (ledger #359,
H100: `minfer ab gemm_f16 -w qkv_nt512 --arm AUTOTILE=0,TM=192 --arm AUTOTILE=0,TM=144`), so 0.880 *
MID_TILE_TIME."""
TMA_ONLY_TM = (144, 192)
"""TM values only the STAGING=tma kernel has (the cp.async kernels split TM over warps in power-of-two widths)."""
AUTOTILE_WIDTHS = {1: (256, 128), 4: (256, 192, 144, 128)}
"""The STAGING=tma widths each AUTOTILE value chooses among (the SwiGLU epilogue takes only multiples of 128)."""
MAX_SLICES = 16
MIN_KTILES_PER_SLICE = 12


@dataclass(frozen=True)
class SplitPlan:
    """How a launch covers its C tiles: the first ``whole`` tiles in program order each by one block over all of k
    (written straight to C); every later tile by ``slices`` blocks, one contiguous range of k tiles each (f32
    partials, summed in slice order by a second kernel). ``whole == 0`` and ``slices == 1``: no split."""

    whole: int
    slices: int

    def blocks(self, tiles: int) -> int:
        """CUDA blocks of the launch for a grid of ``tiles`` C tiles."""
        return self.whole + (tiles - self.whole) * self.slices


def glu_tile_refusal(cfg: dict) -> str | None:
    """Why the tile knobs of ``cfg`` (a knob dict; missing knobs at DEFAULT) give no SwiGLU epilogue for
    `kernels.gemm_f16.gemm_f16_glu`, in one line, or None: it reads the staged C tile's TM / 2-column gate and up
    halves, so it needs STAGING=tma, EPI=staged and TM a multiple of 128."""
    staging, epi, tm = (cfg.get(k, DEFAULT[k]) for k in ("STAGING", "EPI", "TM"))
    if staging != "tma" or epi != "staged" or int(tm) % 128:
        return (f"gemm_f16_glu's SwiGLU epilogue reads the staged C tile's TM / 2-column gate and up halves: it needs "
                f"STAGING=tma, EPI=staged and TM=128 or 256 (got STAGING={staging}, EPI={epi}, TM={tm})")
    return None


def accumulate_refusal(cfg: dict) -> str | None:
    """Why the knobs of ``cfg`` (a knob dict; missing knobs at DEFAULT) give no residual epilogue (C += A · B^T,
    `kernels.gemm_f16.gemm_f16`'s ``accumulate``), in one line, or None: only the STAGING=tma kernels (either EPI)
    have it."""
    staging = cfg.get("STAGING", DEFAULT["STAGING"])
    if staging != "tma":
        return (f"gemm_f16's residual epilogue (C += A·B^T) is in the STAGING=tma kernels only (got STAGING="
                f"{staging})")
    return None


def narrow_tail_refusal(cfg: dict) -> str | None:
    """Why the knobs of ``cfg`` (a knob dict; missing knobs at their defaults) never take NARROWTAIL's two launches
    (`kernels.gemm_f16.tail_plan`), in one line, or None: it splits the 256-wide tiles of the STAGING=tma kernels
    with SPLITK 0 or 1."""
    staging, tm, splitk = cfg.get("STAGING", DEFAULT["STAGING"]), cfg.get("TM", DEFAULT["TM"]), cfg.get("SPLITK", 0)
    if staging != "tma" or int(tm) != 256 or int(splitk) > 1:
        return (f"NARROWTAIL splits the 256-wide tiles of the STAGING=tma kernels with SPLITK 0 or 1 (got "
                f"STAGING={staging}, TM={tm}, SPLITK={splitk})")
    return None


def split_plan(tiles: int, ktiles: int, sms: int, splitk: int) -> SplitPlan:
    """The SplitPlan of SPLITK=``splitk`` for ``tiles`` C tiles of ``ktiles`` k tiles each on ``sms`` SMs (one
    256x128 wgmma block a SM); never more slices than k tiles.

    SPLITK=1: no split. SPLITK=s > 1: every tile in s slices. SPLITK=0 (auto), a wave-quantization rule for grids
    of less than two waves: the blocks of a last, partial wave (``tiles % sms`` of them, all of them when tiles <
    sms) leave the other SMs idle for a whole tile's time. Those tiles are split into the most slices that still
    fit one wave (``rest * slices <= sms``), at most MAX_SLICES, each at least MIN_KTILES_PER_SLICE k tiles (the
    ring's prologue and the partials' write and read stay small beside the slice's k loop); a full wave's tiles
    stay whole. Grids of two waves or more are not split: blocks there do not run in lockstep waves, and splitting
    their last tiles measured slower (the ledger's SPLITK sweeps on ffn_gate_up_nt512 and qkv). A heuristic:
    `minfer sweep gemm_f16 SPLITK=...` measures the alternatives."""
    if splitk == 1 or tiles <= 0:
        return SplitPlan(tiles, 1)
    if splitk > 1:
        return SplitPlan(0, max(1, min(splitk, ktiles)))
    if tiles >= 2 * sms:
        return SplitPlan(tiles, 1)
    rest = tiles % sms
    if rest == 0:
        return SplitPlan(tiles, 1)
    count = min(MAX_SLICES, sms // rest, ktiles // MIN_KTILES_PER_SLICE)
    if count < 2:
        return SplitPlan(tiles, 1)
    return SplitPlan(tiles - rest, count)


BASELINE: dict = {"MMA": "mma_sync", "TM": 64, "TN": 64, "KS": 32, "STAGES": 2, "STAGING": "cp_async", "GROUP": 1,
                  "LOOP": "v1", "EPI": "direct", "NOCALL": 0}
# The fastest measured on the H200 (DEFAULT: wgmma, 2 warpgroups of m64n256k16 on a 128 x 256 tile, k step 64 with
# the 128-byte swizzle, a 4-stage ring filled by a TMA producer warp, grouped order 8, one wgmma batch in flight, C
# staged through shared memory) and
# the fastest mma_sync arm (MMA_SYNC_BEST), the A/B baseline the wgmma work is judged against; figures in the ledger
# and baselines/gemm-notes.yaml.
DEFAULT: dict = {"MMA": "wgmma", "TM": 256, "TN": 128, "KS": 64, "STAGES": 4, "STAGING": "tma", "GROUP": 8,
                 "LOOP": "pipe", "EPI": "staged", "NOCALL": 1}
MMA_SYNC_BEST: dict = {"MMA": "mma_sync", "TM": 256, "TN": 128, "KS": 32, "STAGES": 3, "STAGING": "cp_async",
                       "GROUP": 8, "LOOP": "pipe", "EPI": "direct", "NOCALL": 0}
