"""Tiled tensor-core f16 GEMM for prefill: ``C[nt, od] = A[nt, id] · B[od, id]^T``, f16 in, f32 accumulate/out.

A = activations (f16, row-major [nt, id]); B = a dequantized weight (f16, row-major [od, id], i.e. K-major, which
is exactly mma's "col" B operand); C = f32 [nt, od]. One thread block computes a TN (nt) x TM (od) tile of C,
walking k in KS-wide steps through a STAGES-deep ring of shared-memory tiles; each warp owns a sub-tile of the
block tile. Two tensor-core paths:

* ``MMA="mma_sync"``: `ldmatrix.x4` from an XOR-swizzled shared tile (16-byte chunk index ^ row bits: conflict-free
  ldmatrix rows) into `mma.sync.m16n8k16` fragments; the epilogue writes C straight from the C fragments
  (documented per-lane layout) with nt/od tail masks.
* ``MMA="wmma"``: `wmma.load` from a padded shared tile (row stride KS+8 elements), `wmma.mma` 16x16x16, and the
  epilogue through an f32 C tile in shared memory (the wmma fragment layout is opaque; the tile reuses the ring,
  so shared memory is max(ring, TN*(TM+4)*4 bytes)), written out coalesced with the tail masks.

* ``MMA="wgmma"`` (sm_90a, Hopper): `wgmma.mma_async.m64nNk16` with both operands read by the tensor cores
  straight from the same XOR-swizzled cp.async tiles (which are wgmma's 64-/128-byte swizzled K-major layout)
  through shared-memory matrix descriptors; one warpgroup (4 warps) per 64 x N sub-tile, accumulators in registers
  in the mma C-fragment layout, so the epilogue is the mma_sync one (kernels/ptx/wgmma.py); with STAGING="tma"
  the fragments go through an f32 C tile in shared memory (the ring, reused) and leave it as 16-byte row stores
  (`kernels.gemm_tiles.c_tile_store`; the kernel: `kernels.gemm_tma`). The thread-staged kernels (STAGING=cp_async
  / sync, every MMA) are `kernels.gemm_cp_async`'s.

Staging: ``STAGING="cp_async"`` issues `cp.async.cg` 16-byte copies (src-size 0 = hardware zero-fill for rows past
nt/od and k past id: tails need no branches) and keeps STAGES-1 tiles in flight (`cp.async.wait_group STAGES-2`);
``STAGING="sync"`` runs the same ring schedule with predicated `ld.global.v4` + `st.shared.v4`.

Program order: a 1-D grid; ``GROUP`` od tiles form a group whose blocks run od-fastest, so GROUP od-tile B panels
and the nt-tile A panels they pair with are reused from L2 (Triton tutorial 03 "L2 cache optimizations");
GROUP=1 is nt-fastest order, where consecutive blocks share one B panel (the prefill-GEMM chapter's order).

Sources: PTX ISA 9.x (mma m16n8k16 fragments, ldmatrix, cp.async, wmma; wgmma §9.7.15); the prefill-GEMM chapter (64x64x32,
cp.async double buffering, the "+16 elements, not +16 rows" wmma trap, the >48 KB opt-in before graph capture);
Triton's matmul tutorial (grouped order).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
from numba import cuda, types

from kernels.activation import silu_mul
from kernels.errors import KernelConstraintError
from kernels import gemm_cp_async, gemm_f16_config, gemm_tiles as tiles, gemm_tma
from kernels.gemm_f16_config import DEFAULT, KNOBS, LAUNCH_DEFAULT, LAUNCH_KNOBS, SplitPlan
from kernels.jit import kernel
from kernels.ptx.tma import device_address
from kernels.quant.dequant import _as_device_array
from kernels.specialize import BuiltKernel, KernelCache, is_contiguous

BASELINE, MMA_SYNC_BEST = gemm_f16_config.BASELINE, gemm_f16_config.MMA_SYNC_BEST
"""The knob table lives in `kernels.gemm_f16_config` (no numba); these two arms are re-exported from it."""


@dataclass(frozen=True)
class Geometry:
    """Everything derived from one knob combination: the compile-time constants and the launch shape."""

    mma: str
    tm: int
    tn: int
    ks: int
    stages: int
    staging: str
    group: int
    loop: str
    epi: str
    nocall: bool  # MMA=wgmma: no subroutine call (32-bit index division), so ptxas keeps the wgmma asynchronous
    warps: int
    warps_m: int  # warps along od
    warps_n: int  # warps along nt
    row: int  # shared tile row stride in f16 elements (KS for the swizzled mma_sync layout, KS+8 for wmma)
    smem_bytes: int
    glu: bool = False  # the gate|up product with the SwiGLU epilogue (`gemm_f16_glu`)
    accumulate: bool = False  # C += A · B^T: the residual epilogue (`gemm_f16`'s ``accumulate``)

    @property
    def threads(self) -> int:
        """The consumer warps' threads, plus the producer warp of STAGING=tma."""
        return 32 * self.warps + (32 if self.staging == "tma" else 0)

    def grid(self, nt: int, od: int) -> int:
        return -(-nt // self.tn) * -(-od // self.tm)


def resolve_config(config: dict | None, fused_regs: bool = False) -> dict:
    """The full knob dict (compile knobs and the SPLITK launch knob): DEFAULT and LAUNCH_DEFAULT overridden by
    ``config``; KernelConstraintError on an unknown knob or value, or a combination refused. ``fused_regs``: for
    `kernels.gemm_fused_regs`, which also takes the TN values of `kernels.gemm_f16_config.REGS_ONLY_TN`."""
    cfg = dict(DEFAULT, **LAUNCH_DEFAULT)
    table = dict(KNOBS, **LAUNCH_KNOBS)
    for key, value in (config or {}).items():
        if key not in table:
            raise KernelConstraintError(f"gemm_f16 has no knob {key!r}; knobs: {', '.join(table)}")
        allowed = table[key]
        if value not in allowed:
            # accept "64" for 64 (arm texts arrive as strings)
            match = [a for a in allowed if str(a) == str(value)]
            if not match:
                raise KernelConstraintError(f"gemm_f16 {key}={value!r} is not allowed; allowed: {', '.join(map(str, allowed))}")
            value = match[0]
        cfg[key] = value
    problem = _invalid(cfg, fused_regs)
    if problem:
        raise KernelConstraintError(problem)
    return cfg


def _invalid(cfg: dict, fused_regs: bool = False) -> str | None:
    """Why a (complete) knob combination is refused, or None (``fused_regs``: for `kernels.gemm_fused_regs`)."""
    if cfg["TN"] in gemm_f16_config.REGS_ONLY_TN and not fused_regs:
        return (f"gemm_f16 TN={cfg['TN']} is the register-A fused kernel's tile only (IMPL=fused_regs, "
                f"kernels.gemm_fused_regs); gemm_f16's kernels take TN 64 or 128")
    if cfg.get("SPLITK", 1) > 1 and cfg["MMA"] != "wgmma":
        return f"gemm_f16 SPLITK={cfg['SPLITK']} needs MMA=wgmma (only its main loop takes a k range); use SPLITK=1"
    if cfg["TM"] in gemm_f16_config.TMA_ONLY_TM and cfg["STAGING"] != "tma":
        return (f"gemm_f16 TM={cfg['TM']} is a STAGING=tma tile (the cp.async kernels split TM over 2 or 4 warps in "
                f"power-of-two widths; got STAGING={cfg['STAGING']}); use TM=128 or 256 there")
    if cfg["STAGING"] == "tma":
        if cfg["MMA"] != "wgmma" or cfg["KS"] != 64 or cfg["LOOP"] != "pipe":
            return (f"gemm_f16 STAGING=tma (the default) needs MMA=wgmma, KS=64 (one 128-byte swizzled box row a k "
                    f"tile) and LOOP=pipe (got MMA={cfg['MMA']}, KS={cfg['KS']}, LOOP={cfg['LOOP']}); add "
                    f"STAGING=cp_async for the cp.async kernels")
        return None
    if cfg["MMA"] == "wgmma":
        if cfg["STAGING"] != "cp_async" or cfg["LOOP"] == "v1":
            return (f"gemm_f16 MMA=wgmma needs STAGING=cp_async with LOOP=addr32 or pipe, or STAGING=tma "
                    f"(got STAGING={cfg['STAGING']}, LOOP={cfg['LOOP']})")
        if cfg["LOOP"] == "pipe" and cfg["STAGES"] < 3:
            return ("gemm_f16 MMA=wgmma LOOP=pipe needs STAGES >= 3 (one wgmma batch in flight holds a ring slot; "
                    f"got STAGES={cfg['STAGES']}); use LOOP=addr32 with 2 stages")
        return None
    if cfg["LOOP"] != "v1" and (cfg["MMA"] != "mma_sync" or cfg["STAGING"] != "cp_async"):
        return (f"gemm_f16 LOOP={cfg['LOOP']} needs MMA=mma_sync and STAGING=cp_async "
                f"(got MMA={cfg['MMA']}, STAGING={cfg['STAGING']}); only LOOP=v1 has the wmma and sync paths")
    return None


def geometry(config: dict | None, glu: bool = False, accumulate: bool = False) -> Geometry:
    """The `Geometry` of a knob dict (``glu``: `gemm_f16_glu`'s kernel; ``accumulate``: the residual epilogue, C += A ·
    B^T). KernelConstraintError for a knob the table refuses, ``glu`` with a kernel other than STAGING=tma,
    EPI=staged, TM a multiple of 128, ``accumulate`` with a kernel other than STAGING=tma, or both."""
    cfg = resolve_config(config)
    if glu and (why := gemm_f16_config.glu_tile_refusal(cfg)) is not None:
        raise KernelConstraintError(why)
    if accumulate and (why := gemm_f16_config.accumulate_refusal(cfg)) is not None:
        raise KernelConstraintError(why)
    if accumulate and glu:
        raise KernelConstraintError("gemm_f16: the SwiGLU epilogue writes f16 activations, which take no residual "
                                    "add; accumulate only with gemm_f16")
    tm, tn, ks, stages = cfg["TM"], cfg["TN"], cfg["KS"], cfg["STAGES"]
    warps = 4 if tm * tn <= 64 * 128 else 8
    warps_n = 2
    warps_m = warps // warps_n
    row = ks + 8 if cfg["MMA"] == "wmma" else ks
    smem = stages * (tm + tn) * row * 2
    epi = cfg["EPI"] if cfg["STAGING"] == "tma" else "direct"  # only the tma kernels stage C
    if epi == "staged":
        smem = max(smem, tiles.c_tile_bytes(tn, tm))  # the staged C tile reuses the ring
    if cfg["STAGING"] == "tma":
        smem += 16 * stages  # a full and an empty mbarrier a stage, after the ring (or the C tile)
    if cfg["MMA"] == "wmma":
        smem = max(smem, tn * (tm + 4) * 4)  # the epilogue's f32 C tile reuses the ring
    nocall = bool(cfg["NOCALL"]) and cfg["MMA"] == "wgmma"  # the other kernels issue no wgmma to serialize
    return Geometry(cfg["MMA"], tm, tn, ks, stages, cfg["STAGING"], cfg["GROUP"], cfg["LOOP"], epi, nocall, warps,
                    warps_m, warps_n, row, smem, bool(glu), bool(accumulate))


def all_configs():
    """Every valid knob combination, as dicts: 432 with LOOP=v1, plus 2 x 108 mma_sync + cp_async ones with LOOP
    addr32 / pipe (648), plus 180 MMA=wgmma + cp_async ones (addr32, or pipe with 3-4 stages), plus 90 MMA=wgmma +
    tma ones (KS=64, LOOP=pipe; TM=144 and 192 only there) with each EPI: 1008 (EPI=direct for the others: their
    EPI=staged is the same kernel); the 360 MMA=wgmma ones also with NOCALL=1: 1368."""
    keys = list(KNOBS)
    for values in itertools.product(*(KNOBS[k] for k in keys)):
        cfg = dict(zip(keys, values))
        if (_invalid(cfg) or (cfg["EPI"] == "staged" and cfg["STAGING"] != "tma")
                or (cfg["NOCALL"] and cfg["MMA"] != "wgmma")):
            continue
        yield cfg

def _make_kernel(g: Geometry):
    """The kernel function of geometry ``g``: STAGING=tma's (`kernels.gemm_tma`) or a thread-staged one
    (`kernels.gemm_cp_async`)."""
    return gemm_tma.make_kernel(g) if g.staging == "tma" else gemm_cp_async.make_kernel(g)


SIGNATURE = types.void(types.float16[::1], types.float16[::1], types.float32[:, ::1], types.float32[:, ::1], types.int64,
                       types.int64, types.int64, types.int64, types.int64, types.uint64[::1], types.uint64[::1],
                       types.int64, types.int64, types.int64)
"""(a, b, out, split target, nt, od, kdim, whole, count, A's tensor map, B's, cvec, m_lo, m_hi): the columns m_lo ..
m_hi - 1 are the launch's (`tail_plan`), in the wgmma kernels (STAGING=tma and cp_async); the mma_sync / wmma
kernels, which NARROWTAIL never splits, ignore them and take all od."""
_CACHE = KernelCache("gemm_f16", SIGNATURE)
SIGNATURE_GLU = types.void(types.float16[::1], types.float16[::1], types.uint32[::1], types.float32[:, ::1],
                           types.int64, types.int64, types.int64, types.int64, types.int64, types.uint64[::1],
                           types.uint64[::1], types.int64, types.int64, types.int64)
"""`gemm_f16_glu`'s kernel: ``out`` is the f16 activation as flat uint32 words."""
_CACHE_GLU = KernelCache("gemm_f16_glu", SIGNATURE_GLU)


def kernel_ptx(config: dict | None, cc=(9, 0, "a"), glu: bool = False, accumulate: bool = False) -> str:
    """PTX of the kernel for ``config`` (``glu``: `gemm_f16_glu`'s; ``accumulate``: with the residual epilogue; compiled
    with NVVM for ``cc``, sm_90a by default -- the target a CUDA launch on an H200 compiles for, and the only one
    where MMA=wgmma exists; needs no GPU; not under the simulator)."""
    g = geometry(config, glu, accumulate)
    ptx, _ = cuda.compile_ptx(_make_kernel(g), SIGNATURE_GLU if glu else SIGNATURE, cc=cc, launch_bounds=(g.threads,))
    return ptx


def build(config: dict | None = None, glu: bool = False, accumulate: bool = False) -> BuiltKernel:
    """Compile (once per knob combination; cached) and return the kernel for ``config`` (``glu``: `gemm_f16_glu`'s;
    ``accumulate``: with the residual epilogue). Refuses a combination whose shared memory exceeds the device's opt-in
    limit; opts in above 48 KB (kernels/specialize.py)."""
    g = geometry(config, glu, accumulate)
    return (_CACHE_GLU if glu else _CACHE).get(g, _make_kernel, g.smem_bytes, g.threads,
                                               hint="lower TM/TN/KS/STAGES")


def check_inputs(a, b, out=None) -> tuple[int, int, int]:
    """Validate the operands; return (nt, od, id). One-line KernelConstraintError saying what is expected."""
    for name, x in (("a", a), ("b", b)):
        if getattr(x, "ndim", None) != 2:
            raise KernelConstraintError(f"gemm_f16: {name} must be a 2-D f16 device array, got ndim {getattr(x, 'ndim', None)}")
        if np.dtype(x.dtype) != np.float16:
            raise KernelConstraintError(f"gemm_f16: {name} must be float16, got {x.dtype}")
        if not is_contiguous(x):
            raise KernelConstraintError(f"gemm_f16: {name} must be C-contiguous (row-major), got strides {x.strides}")
    nt, kdim = a.shape
    od, kb = b.shape
    if kb != kdim:
        raise KernelConstraintError(f"gemm_f16: inner dimensions differ: a is [nt={nt}, id={kdim}], b is [od={od}, id={kb}]")
    if kdim % 32:
        raise KernelConstraintError(f"gemm_f16: id must be a multiple of 32, got id={kdim}")
    if nt == 0 or od == 0 or kdim == 0:
        raise KernelConstraintError(f"gemm_f16: empty operand (nt={nt}, od={od}, id={kdim})")
    if out is not None:
        if tuple(out.shape) != (nt, od) or np.dtype(out.dtype) != np.float32 or not is_contiguous(out):
            raise KernelConstraintError(
                f"gemm_f16: out must be a C-contiguous float32 [{nt}, {od}] array, got {out.dtype} {tuple(out.shape)}"
            )
    return nt, od, kdim


def split_plan(config: dict | None, nt: int, od: int, kdim: int, sms: int | None = None) -> SplitPlan:
    """The `kernels.gemm_f16_config.SplitPlan` a launch of ``config`` uses for C[nt, od] over ``kdim``
    (`kernels.gemm_f16_config.split_plan` of its SPLITK; no split unless MMA=wgmma) on ``sms`` SMs, the current
    device's by default."""
    cfg = resolve_config(config)
    g = geometry(cfg)
    tiles = g.grid(nt, od)
    if g.mma != "wgmma":
        return SplitPlan(tiles, 1)
    if cfg["SPLITK"] == 0 and sms is None:
        sms = device_sms()
    return gemm_f16_config.split_plan(tiles, -(-kdim // g.ks), sms or 1, cfg["SPLITK"])


def launch_config(config: dict | None, nt: int, od: int, sms: int | None = None, glu: bool = False) -> dict:
    """The resolved knob dict a launch of ``config`` runs for C[nt, od] on ``sms`` SMs (the current device's by
    default). AUTOTILE=1 with STAGING=tma and TM=256: TM=128 when its grid, in whole waves times
    `gemm_f16_config.NARROW_TILE_TIME`, finishes before the 256-wide grid's whole waves (wave quantization: a grid
    of 2.2 waves takes 3; split-K's partials, the other cure, cost a tile's worth of memory traffic). AUTOTILE=4
    (the default): the same rule over TM=256, 192, 144 and 128 (`gemm_f16_config.TILE_TIME`); the wider on a tie;
    ``glu`` (`gemm_f16_glu`'s launch) only among multiples of 128. Otherwise the config itself. Idempotent."""
    cfg = resolve_config(config)
    if cfg["AUTOTILE"] == 0 or cfg["TM"] != 256 or cfg["STAGING"] != "tma":
        return cfg
    sms = sms or device_sms()
    best, best_time = cfg, -(-geometry(cfg).grid(nt, od) // sms)
    for tm in gemm_f16_config.AUTOTILE_WIDTHS[cfg["AUTOTILE"]][1:]:
        if glu and tm % 128:
            continue
        tile_time = gemm_f16_config.TILE_TIME[tm]
        other = dict(cfg, TM=tm)
        waves = -(-geometry(other).grid(nt, od) // sms)
        if waves * tile_time < best_time:
            best, best_time = other, waves * tile_time
    return best


def tail_plan(config: dict | None, nt: int, od: int, kdim: int, sms: int | None = None, glu: bool = False) -> int:
    """NARROWTAIL=1: the od column where a launch of ``config`` for C[nt, od] over ``kdim`` on ``sms`` SMs (the
    current device's by default) switches from 256-wide to 128-wide tiles, or 0 for one launch as `launch_config`
    says. The columns before it hold whole waves of 256-wide tiles (nt tiles x their od tiles a multiple of ``sms``); a second launch
    runs the rest, the grid's last, partial wave, as 128-wide tiles (`gemm_f16_config.NARROW_TILE_TIME`), which
    keeps more SMs busy with no split-K partials to write and read. Taken when its whole waves finish before those
    of `launch_config`'s choice, and only where that choice splits nothing (STAGING=tma, TM=256, SPLITK 0 or 1; a
    split plan already fills the last wave). ``glu``: `gemm_f16_glu`'s launch (the tail at TM=128 takes 64 gate
    and 64 up columns a tile). A 7B ffn_gate_up at nt=512 on 132 SMs: 528 tiles of 256 (4 waves), then 128 of 128
    (one), against 5 waves of 592."""
    cfg = resolve_config(config)
    if not cfg["NARROWTAIL"] or gemm_f16_config.narrow_tail_refusal(cfg) is not None:
        return 0
    sms = sms or device_sms()
    chosen = launch_config(cfg, nt, od, sms, glu)
    if split_plan(chosen, nt, od, kdim, sms).slices > 1:
        return 0
    tn = cfg["TN"]
    nt_tiles, od_tiles = -(-nt // tn), -(-od // 256)
    step = sms // math.gcd(nt_tiles, sms)  # od tiles a whole number of waves holds
    wide = (od_tiles - 1) // step * step
    if wide == 0:
        return 0
    tail_tiles = nt_tiles * -(-(od - wide * 256) // 128)
    time = nt_tiles * wide // sms + -(-tail_tiles // sms) * gemm_f16_config.NARROW_TILE_TIME
    tile_time = gemm_f16_config.TILE_TIME[chosen["TM"]]
    return wide * 256 if time < -(-geometry(chosen).grid(nt, od) // sms) * tile_time else 0


def device_sms() -> int:
    """The current device's SM count (the waves `split_plan` plans for)."""
    return int(getattr(cuda.get_current_device(), "MULTIPROCESSOR_COUNT", 1))


def partials_elements(config: dict | None, nt: int, od: int, kdim: int, sms: int | None = None) -> int:
    """f32 elements of the split-K partials buffer a launch of ``config`` needs for this shape (0 without a
    split): slices * nt * od when every tile is split, else (split tiles) * slices * TN * TM; the largest of the
    plans of ``config`` itself and of its `launch_config` (`gemm_f16`) and its SwiGLU launch's (`gemm_f16_glu`)."""
    sizes = []
    for cfg in (resolve_config(config), launch_config(config, nt, od, sms), launch_config(config, nt, od, sms, True)):
        plan = split_plan(cfg, nt, od, kdim, sms)
        if plan.slices == 1:
            sizes.append(0)
        elif plan.whole == 0:
            sizes.append(plan.slices * nt * od)
        else:
            g = geometry(cfg)
            sizes.append((g.grid(nt, od) - plan.whole) * plan.slices * g.tn * g.tm)
    return max(sizes)


def partials_capacity(config: dict | None, max_nt: int, max_od: int, sms: int) -> int:
    """f32 elements of a partials buffer that serves every launch of ``config`` with nt <= ``max_nt`` and od <=
    ``max_od`` on ``sms`` SMs: SPLITK=0 (auto) keeps the split tiles' blocks within one wave, so split tiles x
    slices <= sms and the partials <= sms * TN * TM elements; a fixed SPLITK=s needs s * max_nt * max_od; 0 with
    SPLITK=1."""
    cfg = resolve_config(config)
    g = geometry(cfg)
    if cfg["SPLITK"] == 0:
        return sms * g.tn * g.tm if g.mma == "wgmma" else 0
    return 0 if cfg["SPLITK"] == 1 else int(cfg["SPLITK"]) * max_nt * max_od


@kernel
def _sum_slices(partials, out, n, count, accumulate):
    """out[i] = partials[0 * n + i] + partials[1 * n + i] + ... (``count`` slices, in slice order: the same sum
    whichever block of the GEMM finished last); f32, flat [count * n] and [n]. ``accumulate`` nonzero: out[i] += the sum
    (the residual epilogue)."""
    i = cuda.grid(1)
    if i < n:
        v = partials[i]
        for s in range(1, count):
            v += partials[s * n + i]
        if accumulate:
            out[i] += v
        else:
            out[i] = v


@cuda.jit(device=True, inline="always")
def _split_cell(i, width, nt, od, whole, tn, tm, group):
    """Thread ``i``'s cell of the split tiles, each ``tn`` rows x ``width`` cells: (q, r, c, row, tile_m) with q the
    split tile's index after the ``whole`` ones (grouped program order of tn x tm tiles, ``group`` od tiles a group,
    as the GEMM's), r and c the cell's row and column in it, row its C row; q = -1 past the grid."""
    per = tn * width
    q = i // per
    e = i - q * per
    r = e // width
    c = e - r * width
    num_n = (nt + tn - 1) // tn
    num_m = (od + tm - 1) // tm
    pid = whole + q
    if pid >= num_n * num_m:
        return -1, r, c, 0, 0
    in_group = group * num_n
    first_m = (pid // in_group) * group
    gsize = min(num_m - first_m, group)
    local = pid % in_group
    return q, r, c, (local // gsize) * tn + r, first_m + local % gsize


@kernel
def _sum_tiles(parts, out, nt, od, whole, count, tn, tm, group, accumulate):
    """The compact partials of a plan with whole > 0: C tile ``whole + q`` (grouped program order of tn x tm tiles,
    ``group`` od tiles a group, as the GEMM's) = the sum in slice order of partial tiles q * count .. q * count +
    count - 1 (rows of ``parts``, f32 [(tiles - whole) * count * tn, tm]); written to ``out`` (f32 [nt, od]) within
    its tails (``accumulate`` nonzero: added to it). One thread an element of a split tile."""
    q, r, c, row, tile_m = _split_cell(cuda.grid(1), tm, nt, od, whole, tn, tm, group)
    col = tile_m * tm + c
    if q >= 0 and row < nt and col < od:
        base = q * count * tn + r
        v = parts[base, c]
        for s in range(1, count):
            v += parts[base + s * tn, c]
        if accumulate:
            out[row, col] += v
        else:
            out[row, col] = v


def gemm_f16(a, b, out=None, *, config: dict | None = None, stream=0, partials=None, accumulate: bool = False):
    """Enqueue ``C[nt, od] = A[nt, id] · B[od, id]^T`` on ``stream`` and return C; with ``accumulate``,
    ``out += A · B^T`` (the residual epilogue: BLAS's beta = 1).

    a: f16 device array [nt, id], row-major (activations). b: f16 device array [od, id], row-major (a dequantized
    weight, K-major). out: optional f32 device array [nt, od], row-major; allocated when None. Products are
    accumulated in f32 on the tensor cores (mma.sync m16n8k16, wmma m16n16k16, or wgmma m64nNk16 on sm_90a).
    config: knob dict (see KNOBS and LAUNCH_KNOBS; missing knobs take DEFAULT / LAUNCH_DEFAULT): MMA, TM, TN, KS,
    STAGES, STAGING, GROUP, LOOP, EPI, SPLITK, AUTOTILE (the tile a shape runs: `launch_config`). MMA=wgmma (the
    default) needs an sm_90a device (H100/H200), STAGING=cp_async and LOOP=addr32|pipe.

    accumulate (needs ``out`` and STAGING=tma, the default): every C value is added to the one in ``out`` as f32,
    ``out[r, c] + (A · B^T)[r, c]`` -- the numbers `gemm_f16` into a buffer and then `kernels.residual.residual_add`
    give, bit for bit, without the buffer's write and read: unsplit tiles add in the epilogue, split ones in the
    slice sum.

    Split-K (SPLITK > 1, or 0 = auto; `split_plan`): the tiles the plan splits are multiplied by one block a k slice
    each, into f32 partial tiles in ``partials`` (a flat f32 device array of at least `partials_elements` elements;
    allocated here when None, which a CUDA graph capture cannot do: callers that capture pass their own); a second
    kernel adds each tile's slices in slice order into C (the result does not depend on which block finished
    first). NARROWTAIL=1 may make it two launches, neither split (`launches`, `tail_plan`).

    Constraints (KernelConstraintError, a ValueError, one line): both operands 2-D, float16, C-contiguous; inner
    dimensions equal; ``id % 32 == 0`` (16-byte cp.async chunks never straddle a row; all GGUF block sizes are
    multiples of 32); out f32 [nt, od]; partials too small for the split; SPLITK other than 1 without MMA=wgmma;
    a knob combination whose shared memory exceeds the device's opt-in limit is refused. nt and od may be any
    size (tails are zero-filled by cp.async src-size 0 / predicated loads and masked in the epilogue).

    Algorithm: tiled tensor-core GEMM with a multi-stage cp.async ring (CUTLASS/Triton style); see the module
    docstring for sources. Split-K: CUTLASS's "split-K parallel" GEMM (partials + a reduction kernel).
    """
    nt, od, kdim = check_inputs(a, b, out)
    if accumulate and out is None:
        raise KernelConstraintError("gemm_f16: accumulate adds the product to out; pass the f32 [nt, od] array")
    if out is None:
        out = cuda.device_array((nt, od), dtype=np.float32, stream=stream)
    for cfg, m_lo, m_hi in launches(config, nt, od, kdim):
        plan, parts = _launch(a, b, out, cfg, stream, partials, accumulate, m_lo, m_hi)
        sum_parts(plan, parts, out, geometry(cfg), stream, accumulate)
    return out


def gemm_f16_split(a, b, out=None, *, config: dict | None = None, stream=0, partials=None):
    """`gemm_f16` without the split-K slice sum when every tile is split: enqueue the GEMM and return ``(parts,
    count)``, where parts is a flat f32 device array of ``count`` row-major [nt, od] slices whose sum (in slice
    order) is C. count 1: parts is ``out`` itself (allocated when None), holding C (also when the plan splits only
    the last wave's tiles: their slices are summed into ``out`` here). count > 1: the first count * nt * od elements
    of ``partials`` (allocated when None), and ``out`` is not written. For a consumer that sums the slices itself
    (`kernels.norm.add_rms_norm`). Arguments and errors as `gemm_f16`."""
    nt, od, kdim = check_inputs(a, b, out)
    if out is None:
        out = cuda.device_array((nt, od), dtype=np.float32, stream=stream)
    runs = launches(config, nt, od, kdim)
    for cfg, m_lo, m_hi in runs:
        plan, parts = _launch(a, b, out, cfg, stream, partials, False, m_lo, m_hi)
        if plan.whole == 0 and plan.slices > 1:  # one launch (NARROWTAIL's two split nothing)
            return parts, plan.slices
        sum_parts(plan, parts, out, geometry(cfg), stream)
    return out.reshape(nt * od), 1


def glu_refusal(config: dict | None, od: int | None = None) -> str | None:
    """Why `gemm_f16_glu` cannot multiply a gate|up weight of ``od`` (= 2 ffn) rows with knob dict ``config``, in
    one line, or None: its kernel needs STAGING=tma, EPI=staged and TM a multiple of 128 (`geometry`), and od a
    multiple of TM (every tile takes TM / 2 gate rows and the same up rows; AUTOTILE only narrows its 256 to 128, so a
    multiple of the configured TM fits either tile; od None: the kernel alone). The prefill engine asks it to
    choose between `gemm_f16_glu` and `gemm_f16` + swiglu."""
    try:
        tm = geometry(config, glu=True).tm
    except KernelConstraintError as e:
        return str(e)
    if od is not None and od % tm:
        return (f"gemm_f16_glu: b has {od} rows (2 x ffn), not a multiple of TM={tm}: every tile takes TM / 2 gate "
                f"rows and the same up rows; use TM=128 for a ffn that is a multiple of 64 only")
    return None


def gemm_f16_glu(a, b, out=None, *, config: dict | None = None, stream=0, partials=None):
    """Enqueue the gate/up product with its SwiGLU, ``act[nt, ffn] = silu(A · Bg^T) * (A · Bu^T)``, on ``stream``
    and return act (f16): `gemm_f16` then `kernels.activation.swiglu` without C, whose f32 [nt, 2 ffn] would be
    written and read again (4 bytes an element each way, against act's 2).

    a: f16 [nt, id] as `gemm_f16`; b: the f16 gate|up weight [2 ffn, id] (gate rows 0 .. ffn - 1, then up);
    out: optional C-contiguous f16 [nt, ffn] device array at a 16-byte aligned address (allocated when None);
    config, partials: as `gemm_f16` (AUTOTILE picks TM, NARROWTAIL may make two launches; split-K plans as
    `gemm_f16`, the slices summed by a second kernel that applies the SwiGLU). Each tile of TM columns multiplies gate rows m0 / 2 .. m0 / 2 + TM / 2 - 1 and
    the same up rows (two boxes of one tensor map: `kernels.gemm_tma`), so its staged C tile holds each output's
    gate and up values; the epilogue rounds ``silu_mul(g, u)`` (`kernels.activation`) to f16 as swiglu does. Every
    C value is the one `gemm_f16` computes for that (row, weight row), so with NOCALL=0 act equals `gemm_f16` +
    swiglu bit for bit; NOCALL=1 (the default) divides with div.approx.f32 (no subroutine call), one f16 ulp at most
    from swiglu's (tests check both).

    Raises KernelConstraintError (one line) for what `gemm_f16` refuses, a kernel other than STAGING=tma,
    EPI=staged and TM of 128 or 256, 2 ffn not a multiple of the launch's TM, or a wrong out.
    """
    a, b = _as_device_array(a, "gemm_f16_glu: a"), _as_device_array(b, "gemm_f16_glu: b")
    out = None if out is None else _as_device_array(out, "gemm_f16_glu: out")
    nt, od, kdim = check_inputs(a, b)
    refused = glu_refusal(config, od)
    if refused is not None:
        raise KernelConstraintError(refused)
    out = glu_out(out, nt, od // 2, stream, "gemm_f16_glu")
    words = out.view(np.uint32).reshape(nt * od // 4)
    for cfg, m_lo, m_hi in launches(config, nt, od, kdim, glu=True):
        built = build(cfg, glu=True)
        g = built.geometry
        plan = split_plan(cfg, nt, m_hi - m_lo, kdim)
        parts, target = split_target(plan, g, nt, od, no_parts(), partials, stream)
        amap, bmap = gemm_tma.tensor_map(a, g.tn), gemm_tma.tensor_map(b, g.tm // 2)
        built.kernel[plan.blocks(g.grid(nt, m_hi - m_lo)), g.threads, stream, g.smem_bytes](
            a.reshape(nt * kdim), b.reshape(od * kdim), words, target, nt, od, kdim, plan.whole, plan.slices, amap,
            bmap, gemm_tma.c_vectors(target, target), m_lo, m_hi
        )
        sum_parts_glu(plan, parts, out, od, g, stream)
    return out


def glu_out(out, nt: int, ffn: int, stream, who: str):
    """The f16 [nt, ffn] activation a SwiGLU epilogue writes: ``out`` checked (C-contiguous, 16-byte aligned: its
    rows are written 16 bytes at a time), or allocated when None. KernelConstraintError (one line, naming ``who``)."""
    if out is None:
        return cuda.device_array((nt, ffn), dtype=np.float16, stream=stream)
    if tuple(out.shape) != (nt, ffn) or np.dtype(out.dtype) != np.float16 or not is_contiguous(out):
        raise KernelConstraintError(f"{who}: out must be a C-contiguous float16 [{nt}, {ffn}] array, got "
                                    f"{out.dtype} {tuple(out.shape)}")
    if device_address(out) % 16:
        raise KernelConstraintError(f"{who}: out must start at a 16-byte aligned address (its rows are written "
                                    f"16 bytes at a time), got address % 16 = {device_address(out) % 16}")
    return out


def sum_parts_glu(plan: SplitPlan, parts, act, od: int, g, stream) -> None:
    """Enqueue the SwiGLU of a split plan's summed partials into ``act`` (f16 [nt, od / 2]; nothing without a split):
    the partials hold the GLU kernel's C tiles (TM / 2 gate columns, then their up columns); ``g`` the launch's tile
    (``tn``, ``tm``, ``group``) as `sum_parts`."""
    if plan.slices == 1:
        return
    nt = act.shape[0]
    if plan.whole == 0:
        n = nt * (od // 2)
        _sum_slices_glu[-(-n // 256), 256, stream](parts, act, nt, od, plan.slices, g.tm)
        return
    rest = parts.shape[0] // (plan.slices * g.tn * g.tm)
    n = rest * g.tn * g.tm // 2
    _sum_tiles_glu[-(-n // 256), 256, stream](parts.reshape(rest * plan.slices * g.tn, g.tm), act, nt, od,
                                              plan.whole, plan.slices, g.tn, g.tm, g.group)


_NO_PARTS: list = []


def no_parts():
    """The f32 [1, 4] placeholder for the split target of an unsplit SwiGLU launch (`gemm_f16_glu`,
    `kernels.gemm_fused_regs.gemm_fused_regs_glu`; never written)."""
    if not _NO_PARTS:
        _NO_PARTS.append(cuda.device_array((1, 4), dtype=np.float32))
    return _NO_PARTS[0]


@kernel
def _sum_slices_glu(partials, act, nt, od, count, tm):
    """`gemm_f16_glu` with every tile split: act[r, j] = silu_mul(gate, up) of the slice sums (slice order, as
    `_sum_slices`) of partials (f32 flat [count * nt * od]: count [nt, od] slices in the GLU kernel's column order,
    tile t's tm columns = gate of act columns t * tm / 2 .., then their up), into act (f16 [nt, od / 2])."""
    i = cuda.grid(1)
    half = tm // 2
    w = od // 2
    if i < nt * w:
        r = i // w
        j = i - r * w
        t = j // half
        base = r * od + t * tm + (j - t * half)
        n = nt * od
        gate = partials[base]
        up = partials[base + half]
        for s in range(1, count):
            gate += partials[s * n + base]
            up += partials[s * n + base + half]
        act[r, j] = silu_mul(gate, up)


@kernel
def _sum_tiles_glu(parts, act, nt, od, whole, count, tn, tm, group):
    """`gemm_f16_glu`'s compact partials (a plan with whole > 0; layout as `_sum_tiles`): tile ``whole + q``'s
    slices summed in slice order, gate half and up half, and act[row, tile_m * tm / 2 + c] = silu_mul(gate, up)
    within the tails. One thread an activation element of a split tile."""
    half = tm // 2
    q, r, c, row, tile_m = _split_cell(cuda.grid(1), half, nt, od, whole, tn, tm, group)
    col = tile_m * half + c
    if q >= 0 and row < nt and col < od // 2:
        base = q * count * tn + r
        gate = parts[base, c]
        up = parts[base, c + half]
        for s in range(1, count):
            gate += parts[base + s * tn, c]
            up += parts[base + s * tn, c + half]
        act[row, col] = silu_mul(gate, up)


def launches(config: dict | None, nt: int, od: int, kdim: int, sms: int | None = None,
             glu: bool = False) -> list[tuple[dict, int, int]]:
    """The launches of `gemm_f16` (``glu``: `gemm_f16_glu`) with ``config`` for C[nt, od] over ``kdim`` on ``sms``
    SMs (the current device's by default), as (resolved knob dict, first column, end column): one launch of
    `launch_config`'s choice over all od, or NARROWTAIL's two (`tail_plan`: 256-wide tiles up to its column, then
    128-wide ones; neither split)."""
    cut = tail_plan(config, nt, od, kdim, sms, glu)
    if cut:
        cfg = dict(resolve_config(config), SPLITK=1)
        return [(cfg, 0, cut), (dict(cfg, TM=128), cut, od)]
    return [(launch_config(config, nt, od, sms, glu), 0, od)]


def _launch(a, b, out, config, stream, partials, accumulate: bool = False, m_lo: int = 0, m_hi: int | None = None):
    """Enqueue the GEMM kernel (``accumulate``: with the residual epilogue) for C's columns ``m_lo`` .. ``m_hi`` - 1
    (all od by default) with its split plan; return (plan, the flat partials used or None)."""
    nt, od, kdim = check_inputs(a, b, out)
    m_hi = od if m_hi is None else m_hi
    built = build(config, accumulate=accumulate)
    g = built.geometry
    plan = split_plan(config, nt, m_hi - m_lo, kdim)
    parts, target = split_target(plan, g, nt, od, out, partials, stream)
    if g.staging == "tma":
        amap, bmap = gemm_tma.tensor_map(a, g.tn), gemm_tma.tensor_map(b, g.tm)
    else:
        amap = bmap = gemm_tma.no_map()
    built.kernel[plan.blocks(g.grid(nt, m_hi - m_lo)), g.threads, stream, g.smem_bytes](
        a.reshape(nt * kdim), b.reshape(od * kdim), out, target, nt, od, kdim, plan.whole, plan.slices, amap, bmap,
        gemm_tma.c_vectors(out, target), m_lo, m_hi
    )
    return plan, parts



def split_target(plan: SplitPlan, g: Geometry, nt: int, od: int, out, partials, stream):
    """(the flat partials a launch of ``plan`` uses or None, the 2-D array its kernel writes: ``out``, or the
    partials as [slices * nt, od] / compact [tiles * slices * TN, TM]); allocates the partials when None.
    KernelConstraintError when ``partials`` is too small."""
    if plan.slices == 1:
        return None, out
    need = plan.slices * (nt * od if plan.whole == 0 else (g.grid(nt, od) - plan.whole) * g.tn * g.tm)
    if partials is None:
        partials = cuda.device_array(need, dtype=np.float32, stream=stream)
    if np.dtype(partials.dtype) != np.float32 or partials.ndim != 1 or partials.shape[0] < need:
        raise KernelConstraintError(
            f"gemm_f16: split-K over {plan.slices} slices needs a flat float32 partials array of at least {need} "
            f"elements, got {partials.dtype} {tuple(partials.shape)}")
    parts = partials[:need]
    return parts, (parts.reshape(plan.slices * nt, od) if plan.whole == 0 else parts.reshape(need // g.tm, g.tm))



def sum_parts(plan: SplitPlan, parts, out, g, stream, accumulate: bool = False) -> None:
    """Enqueue the sum of a split plan's partials into C (``accumulate``: added to C; nothing without a split). ``g``:
    the launch's tile (``tn``, ``tm``, ``group``: a `Geometry`, or `kernels.gemm_fused_regs.RegsGeometry`), which
    lays out the partial tiles of a plan that splits only some tiles."""
    if plan.slices == 1:
        return
    nt, od = out.shape
    if plan.whole == 0:
        n = nt * od
        _sum_slices[-(-n // 256), 256, stream](parts, out.reshape(n), n, plan.slices, int(accumulate))
        return
    rest = parts.shape[0] // (plan.slices * g.tn * g.tm)
    n = rest * g.tn * g.tm
    _sum_tiles[-(-n // 256), 256, stream](parts.reshape(rest * plan.slices * g.tn, g.tm), out, nt, od, plan.whole,
                                          plan.slices, g.tn, g.tm, g.group, int(accumulate))
