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
  in the mma C-fragment layout, so the epilogue is the mma_sync one (kernels/ptx/wgmma.py, _make_kernel_wgmma);
  with STAGING="tma" the fragments go through an f32 C tile in shared memory (the ring, reused) and leave it as
  16-byte row stores (`kernels.gemm_tiles.c_tile_store`; the kernel: `kernels.gemm_tma`).

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
from dataclasses import dataclass

import numpy as np
from numba import cuda, float32, types, uint32, uint64

from kernels.errors import KernelConstraintError
from kernels import gemm_f16_config, gemm_tiles as tiles, gemm_tma
from kernels.gemm_f16_config import DEFAULT, KNOBS, LAUNCH_DEFAULT, LAUNCH_KNOBS, SplitPlan
from kernels.jit import kernel
from kernels.specialize import BuiltKernel, KernelCache, is_contiguous
from kernels.ptx import (
    SIMULATOR,
    cp_async_16,
    cp_async_16_off,
    cp_async_commit_group,
    cp_async_wait_group,
    ld_global_v4_b32,
    ldmatrix_x4,
    ldmatrix_x4_off,
    mma_m16n8k16_f32_f16,
    opaque_u32,
    st_shared_v4_b32,
    wmma_load_a_f16,
    wmma_load_b_f16,
    wmma_mma_f32_f16,
    wmma_store_d_f32_shared,
)
from kernels.ptx.wgmma import SWIZZLE_64B, SWIZZLE_128B, fence_proxy_async_shared, wgmma_desc, wgmma_wait_group

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
    warps: int
    warps_m: int  # warps along od
    warps_n: int  # warps along nt
    row: int  # shared tile row stride in f16 elements (KS for the swizzled mma_sync layout, KS+8 for wmma)
    smem_bytes: int

    @property
    def threads(self) -> int:
        """The consumer warps' threads, plus the producer warp of STAGING=tma."""
        return 32 * self.warps + (32 if self.staging == "tma" else 0)

    def grid(self, nt: int, od: int) -> int:
        return -(-nt // self.tn) * -(-od // self.tm)


def resolve_config(config: dict | None) -> dict:
    """The full knob dict (compile knobs and the SPLITK launch knob): DEFAULT and LAUNCH_DEFAULT overridden by
    ``config``; KernelConstraintError on an unknown knob or value."""
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
    problem = _invalid(cfg)
    if problem:
        raise KernelConstraintError(problem)
    return cfg


def _invalid(cfg: dict) -> str | None:
    """Why a (complete) knob combination is refused, or None."""
    if cfg.get("SPLITK", 1) > 1 and cfg["MMA"] != "wgmma":
        return f"gemm_f16 SPLITK={cfg['SPLITK']} needs MMA=wgmma (only its main loop takes a k range); use SPLITK=1"
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


def geometry(config: dict | None) -> Geometry:
    cfg = resolve_config(config)
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
    return Geometry(cfg["MMA"], tm, tn, ks, stages, cfg["STAGING"], cfg["GROUP"], cfg["LOOP"], epi, warps,
                    warps_m, warps_n, row, smem)


def all_configs():
    """Every valid knob combination, as dicts: 432 with LOOP=v1, plus 2 x 108 mma_sync + cp_async ones with LOOP
    addr32 / pipe (648), plus 180 MMA=wgmma + cp_async ones (addr32, or pipe with 3-4 stages), plus 54 MMA=wgmma +
    tma ones (KS=64, LOOP=pipe) with each EPI: 936 (EPI=direct for the others: their EPI=staged is the same kernel)."""
    keys = list(KNOBS)
    for values in itertools.product(*(KNOBS[k] for k in keys)):
        cfg = dict(zip(keys, values))
        if _invalid(cfg) or (cfg["EPI"] == "staged" and cfg["STAGING"] != "tma"):
            continue
        yield cfg


# ------------------------------------------------------------------------------------------------------------
# Kernel factory: one Python function per knob combination, closing over the constants (numba freezes closure
# variables as compile-time constants, so every loop below has a constant trip count and is fully unrolled;
# fragment arrays are then promoted to registers).
# ------------------------------------------------------------------------------------------------------------


def _make_kernel(g: Geometry):
    if g.staging == "tma":
        return gemm_tma.make_kernel(g)
    if g.mma == "wgmma":
        return _make_kernel_wgmma(g)
    if g.loop != "v1":
        return _make_kernel_v2(g)
    TM, TN, KS, STAGES, GROUP = g.tm, g.tn, g.ks, g.stages, g.group
    ROW = g.row
    THREADS = g.threads
    WARPS_N = g.warps_n
    WTM = TM // g.warps_m  # warp tile along od
    WTN = TN // WARPS_N  # warp tile along nt
    CPR = KS // 8  # 16-byte chunks per tile row
    SWIZZLE = g.mma == "mma_sync"
    SWS = 1 if CPR == 4 else 0  # rows per 128-byte line: 2 (KS=32) or 1 (KS=64)
    SWM = CPR - 1
    SA = TN * ROW  # A tile elements per stage
    SB = TM * ROW
    STAGE = SA + SB
    CH_A = TN * CPR // THREADS  # 16-byte chunks per thread per stage
    CH_B = TM * CPR // THREADS
    CP_ASYNC = g.staging == "cp_async"
    WAIT = STAGES - 2
    K16 = KS // 16
    MT = WTN // 16  # mma_sync: m16 tiles (nt) per warp
    NT8 = WTM // 8  # mma_sync: n8 tiles (od) per warp
    FM = WTN // 16  # wmma: 16x16 fragments along nt / od per warp
    FN = WTM // 16
    # Declared alignment of the dynamic shared memory (numba would declare .align 2): ldmatrix/cp.async need 16
    # bytes, wmma 32. The CUDA simulator refuses any alignment argument, hence None there.
    SMEM_ALIGN = None if SIMULATOR else 128
    CROW = TM + 4  # wmma: row stride (f32 elements) of the C tile staged in shared memory for the epilogue
    CTILE_PER_THREAD = TM * TN // THREADS

    MMA_SYNC = g.mma == "mma_sync"
    ACC_N = MT * NT8 * 4 if MMA_SYNC else FM * FN * 8  # f32 accumulators per lane
    AF_N = MT * 4 if MMA_SYNC else FM * 8  # A fragment registers per lane
    BF_N = NT8 * 2 if MMA_SYNC else FN * 8

    tile_origin = tiles.program_order(TN, TM, GROUP)
    store_c = tiles.c_fragment_store(MT, NT8, 16)

    def gemm_kernel(a, b, out, parts, nt, od, kdim, whole, count, amap, bmap, cvec):
        smem = cuda.shared.array(0, types.float16, alignment=SMEM_ALIGN)
        cscr = cuda.shared.array(0, types.float32, alignment=SMEM_ALIGN)  # wmma epilogue C tile (reuses the ring)
        tid = cuda.threadIdx.x
        lane = tid & 31
        warp = tid >> 5
        wn0 = (warp % WARPS_N) * WTN
        wm0 = (warp // WARPS_N) * WTM

        n0, m0 = tile_origin(cuda.blockIdx.x, nt, od)

        acc = cuda.local.array(ACC_N, float32)  # fully unrolled indexing below: these live in registers
        af = cuda.local.array(AF_N, uint32)
        bf = cuda.local.array(BF_N, uint32)
        for i in range(ACC_N):
            acc[i] = float32(0.0)

        ktiles = (kdim + KS - 1) // KS
        # Iteration it loads k-tile `it` into ring slot it % STAGES and computes k-tile it - (STAGES-1): the
        # first STAGES-1 iterations only fill the ring. One barrier per iteration: it makes k-tile kt visible to
        # all warps AND guarantees every warp is done with slot (kt-1) % STAGES, which this iteration refills.
        for it in range(ktiles + STAGES - 1):
            kt = it - (STAGES - 1)
            if kt >= 0:
                if CP_ASYNC:
                    cp_async_wait_group(WAIT)
                cuda.syncthreads()
            if it < ktiles:
                k0 = it * KS
                buf = it % STAGES
                for rep in range(CH_A + CH_B):
                    c = tid + rep * THREADS
                    if rep < CH_A:
                        r = c // CPR
                        grow = n0 + r
                        limit = nt
                        base = 0
                    else:
                        c -= CH_A * THREADS
                        r = c // CPR
                        grow = m0 + r
                        limit = od
                        base = SA
                    ch = c % CPR
                    kk = k0 + ch * 8
                    ok = grow < limit and kk < kdim
                    gidx = grow * kdim + kk if ok else 0
                    sch = (ch ^ ((r >> SWS) & SWM)) if SWIZZLE else ch
                    sidx = buf * STAGE + base + r * ROW + sch * 8
                    if CP_ASYNC:
                        # src-size 0: nothing is read, the 16 bytes are zero-filled (rows past nt/od, k past id).
                        if rep < CH_A:
                            cp_async_16(smem, sidx, a, gidx, 16 if ok else 0)
                        else:
                            cp_async_16(smem, sidx, b, gidx, 16 if ok else 0)
                    else:
                        x0 = x1 = x2 = x3 = uint32(0)
                        if ok:
                            if rep < CH_A:
                                x0, x1, x2, x3 = ld_global_v4_b32(a, gidx)
                            else:
                                x0, x1, x2, x3 = ld_global_v4_b32(b, gidx)
                        st_shared_v4_b32(smem, sidx, x0, x1, x2, x3)
            if CP_ASYNC:
                cp_async_commit_group()  # possibly empty: keeps the group count = tiles issued
            if kt >= 0:
                sa = (kt % STAGES) * STAGE
                sb = sa + SA
                for kq in range(K16):
                    if MMA_SYNC:
                        for i in range(MT):
                            # lane l -> row l % 16, 8-column chunk l // 16 of the m16 x k16 A tile: a0..a3
                            r = wn0 + i * 16 + (lane & 15)
                            ch = kq * 2 + (lane >> 4)
                            q0, q1, q2, q3 = ldmatrix_x4(smem, sa + r * ROW + (ch ^ ((r >> SWS) & SWM)) * 8)
                            af[i * 4] = q0
                            af[i * 4 + 1] = q1
                            af[i * 4 + 2] = q2
                            af[i * 4 + 3] = q3
                        for j in range(NT8 // 2):
                            # two n8 tiles: lane l -> B row (l & 7) + 8 * (l >> 4), k chunk (l >> 3) & 1: b0, b1 of
                            # n-tile 2j, then b0, b1 of n-tile 2j+1
                            r = wm0 + j * 16 + (lane & 7) + ((lane >> 4) << 3)
                            ch = kq * 2 + ((lane >> 3) & 1)
                            q0, q1, q2, q3 = ldmatrix_x4(smem, sb + r * ROW + (ch ^ ((r >> SWS) & SWM)) * 8)
                            bf[j * 4] = q0
                            bf[j * 4 + 1] = q1
                            bf[j * 4 + 2] = q2
                            bf[j * 4 + 3] = q3
                        for i in range(MT):
                            for j in range(NT8):
                                c = (i * NT8 + j) * 4
                                d0, d1, d2, d3 = mma_m16n8k16_f32_f16(
                                    af[i * 4], af[i * 4 + 1], af[i * 4 + 2], af[i * 4 + 3],
                                    bf[j * 2], bf[j * 2 + 1],
                                    acc[c], acc[c + 1], acc[c + 2], acc[c + 3],
                                )
                                acc[c] = d0
                                acc[c + 1] = d1
                                acc[c + 2] = d2
                                acc[c + 3] = d3
                    else:
                        # The kq-th k-half starts kq*16 ELEMENTS along the row (not kq*16 rows): the wmma trap.
                        for i in range(FM):
                            q0, q1, q2, q3, q4, q5, q6, q7 = wmma_load_a_f16(smem, sa + (wn0 + i * 16) * ROW + kq * 16, ROW)
                            x = i * 8
                            af[x], af[x + 1], af[x + 2], af[x + 3] = q0, q1, q2, q3
                            af[x + 4], af[x + 5], af[x + 6], af[x + 7] = q4, q5, q6, q7
                        for j in range(FN):
                            q0, q1, q2, q3, q4, q5, q6, q7 = wmma_load_b_f16(smem, sb + (wm0 + j * 16) * ROW + kq * 16, ROW)
                            y = j * 8
                            bf[y], bf[y + 1], bf[y + 2], bf[y + 3] = q0, q1, q2, q3
                            bf[y + 4], bf[y + 5], bf[y + 6], bf[y + 7] = q4, q5, q6, q7
                        for i in range(FM):
                            for j in range(FN):
                                c = (i * FN + j) * 8
                                x = i * 8
                                y = j * 8
                                d0, d1, d2, d3, d4, d5, d6, d7 = wmma_mma_f32_f16(
                                    af[x], af[x + 1], af[x + 2], af[x + 3], af[x + 4], af[x + 5], af[x + 6], af[x + 7],
                                    bf[y], bf[y + 1], bf[y + 2], bf[y + 3], bf[y + 4], bf[y + 5], bf[y + 6], bf[y + 7],
                                    acc[c], acc[c + 1], acc[c + 2], acc[c + 3],
                                    acc[c + 4], acc[c + 5], acc[c + 6], acc[c + 7],
                                )
                                acc[c], acc[c + 1], acc[c + 2], acc[c + 3] = d0, d1, d2, d3
                                acc[c + 4], acc[c + 5], acc[c + 6], acc[c + 7] = d4, d5, d6, d7
        if CP_ASYNC:
            cp_async_wait_group(0)

        if MMA_SYNC:
            # C fragment: lane l holds rows g, g+8 and columns 2t, 2t+1 of each m16 x n8 tile (g = l>>2, t = l&3).
            store_c(out, acc, n0 + wn0 + (lane >> 2), m0 + wm0 + (lane & 3) * 2, nt, od, 0, 0)
        else:
            # The wmma accumulator layout is opaque: each warp stores its fragments into a block-wide f32 C tile in
            # shared memory (reusing the ring, hence the barrier), then the block writes it out row-contiguously
            # (coalesced) with the tail masks. The fragment loop has tiny bodies, so it unrolls fully and the
            # accumulators stay in registers.
            cuda.syncthreads()
            for i in range(FM):
                for j in range(FN):
                    c = (i * FN + j) * 8
                    wmma_store_d_f32_shared(
                        cscr, (wn0 + i * 16) * CROW + wm0 + j * 16, CROW, acc[c], acc[c + 1], acc[c + 2], acc[c + 3],
                        acc[c + 4], acc[c + 5], acc[c + 6], acc[c + 7],
                    )
            cuda.syncthreads()
            for e in range(CTILE_PER_THREAD):
                idx = tid + e * THREADS
                r = idx // TM
                cc = idx % TM
                rowi = n0 + r
                col = m0 + cc
                if rowi < nt and col < od:
                    out[rowi, col] = cscr[r * CROW + cc]

    return gemm_kernel


def _copy_plan(CPR: int, RPT: int, CH_A: int, CH_B: int, ROWB: int, KS: int, TN: int):
    """The cp.async copy plan of LOOP=addr32/pipe and MMA=wgmma, as two device helpers for one geometry.

    ``plan(tid, n0, m0, nt, od, kdim, goff, gsz)``: thread ``tid`` copies 16-byte chunk column ``tid % CPR`` of
    tile rows ``tid // CPR + rep * RPT`` (A rows of the nt tile at n0: rep < CH_A; then B rows of the od tile at
    m0); fills ``goff`` (int64 [CH_A + CH_B], global byte offsets; rows past nt/od point at element 0) and ``gsz``
    (uint32, the cp.async src-size: 16, or 0 to zero-fill those rows) and returns the thread's XOR-swizzled shared
    byte offset in a stage (every later chunk adds a multiple of RPT rows, which keeps the swizzle term).

    ``copy_tile(smem, woff, dst0, a, b, goff, gsz, it, cch, kdim)``: issue the thread's cp.async chunks of k tile
    ``it`` into the ring slot at byte ``woff`` (a KS=64 tile past ``kdim`` is zero-filled: src-size 0)."""
    KTAIL = KS > 32  # id % 32 == 0 is enforced, so only KS=64 can have a partial last k tile
    KS_B = KS * 2
    REP_B = RPT * ROWB
    SA_B = TN * ROWB
    CH_ALL = CH_A + CH_B
    SWS = 1 if CPR == 4 else 0  # rows per 128-byte line: 2 (KS=32) or 1 (KS=64)
    SWM = CPR - 1

    @cuda.jit(device=True, inline="always")
    def plan(tid, n0, m0, nt, od, kdim, goff, gsz):
        cch = tid % CPR
        crow = tid // CPR
        for rep in range(CH_A):
            grow = n0 + crow + rep * RPT
            if grow < nt:
                goff[rep] = (grow * kdim + cch * 8) * 2
                gsz[rep] = 16
            else:
                goff[rep] = 0
                gsz[rep] = 0
        for rep in range(CH_B):
            grow = m0 + crow + rep * RPT
            if grow < od:
                goff[CH_A + rep] = (grow * kdim + cch * 8) * 2
                gsz[CH_A + rep] = 16
            else:
                goff[CH_A + rep] = 0
                gsz[CH_A + rep] = 0
        return uint32(crow * ROWB + ((cch ^ ((crow >> SWS) & SWM)) << 4))

    @cuda.jit(device=True, inline="always")
    def copy_tile(smem, woff, dst0, a, b, goff, gsz, it, cch, kdim):
        kb = it * KS_B
        kin = True
        if KTAIL:
            kin = it * KS + cch * 8 < kdim
        for rep in range(CH_ALL):
            n = gsz[rep]
            src = goff[rep] + kb
            if not kin:
                n = 0
                src = 0
            if rep < CH_A:
                cp_async_16_off(smem, woff + dst0 + rep * REP_B, a, src, n)
            else:
                cp_async_16_off(smem, woff + SA_B + dst0 + (rep - CH_A) * REP_B, b, src, n)

    return plan, copy_tile


def _make_kernel_v2(g: Geometry):
    """LOOP=addr32 / LOOP=pipe (mma_sync, cp_async): the v1 tile and swizzle layout, with a main loop that does
    no index arithmetic beyond a handful of 32-bit adds per k tile.

    * Addresses are computed once, before the k loop: per thread, the swizzled shared byte offset of its copy
      chunk (the swizzle term depends only on row bits 0..2, and every row step between a thread's chunks is a
      multiple of 16 rows, so it is one offset plus compile-time constants) and a 64-bit global byte offset per
      chunk (rows past nt/od point at element 0 with src-size 0); per lane, one swizzled ldmatrix offset for A
      and one for B (independent of the m16/n16 sub-tile, which adds a constant; k16 step q XORs in q << 5). In
      the loop an access is `stage offset + precomputed offset + constant`, the constant folded into the
      instruction's immediate. Measured in SASS at 256x128x32: 370 -> ~150 instructions per k tile (64 HMMA).
    * The ring slot is a 32-bit byte offset stepped and wrapped by compare/select (v1 divides a 64-bit k tile
      index by STAGES every iteration).
    * addr32 keeps v1's order (wait, barrier, then per k16 step: ldmatrix, mma; the next tile's copies are
      issued after the first k16 step's ldmatrix instead of before it).
      pipe is CUTLASS's sm80 multistage order: fragments are double-buffered in registers; the ldmatrix of k16
      step q+1 is issued before the mma of step q, and the wait + barrier sit before the last k16 step of a tile
      so that the first fragments of the next tile load while the last mma of this one run. One barrier per k
      tile either way.
    """
    TM, TN, KS, STAGES, GROUP = g.tm, g.tn, g.ks, g.stages, g.group
    ROWB = g.row * 2  # shared tile row stride in bytes (the swizzled layout has no padding)
    THREADS = g.threads
    WARPS_N = g.warps_n
    WTM = TM // g.warps_m
    WTN = TN // WARPS_N
    CPR = KS // 8  # 16-byte chunks per tile row
    SWS = 1 if CPR == 4 else 0
    SWM = CPR - 1
    SA_B = TN * ROWB  # A tile bytes per stage (B follows it)
    STAGE_B = (TN + TM) * ROWB
    RING_B = STAGES * STAGE_B
    RPT = THREADS // CPR  # tile rows covered by one round of the block's copies (a multiple of 16)
    CH_A = TN // RPT
    CH_B = TM // RPT
    WAIT = STAGES - 2
    K16 = KS // 16
    MT = WTN // 16
    NT8 = WTM // 8
    SUB_B = 16 * ROWB  # bytes between m16 (A) / 2 x n8 (B) sub-tiles
    PIPE = g.loop == "pipe"
    NBUF = 2 if PIPE else 1
    ACC_N = MT * NT8 * 4
    AF_N = MT * 4
    BF_N = NT8 * 2
    AF_ALL = NBUF * AF_N  # (local.array sizes must be plain constants: numba does not fold products)
    BF_ALL = NBUF * BF_N
    CH_ALL = CH_A + CH_B
    copy_plan, copy_tile = _copy_plan(CPR, RPT, CH_A, CH_B, ROWB, KS, TN)
    tile_origin = tiles.program_order(TN, TM, GROUP)
    store_c = tiles.c_fragment_store(MT, NT8, 16)
    SMEM_ALIGN = None if SIMULATOR else 128

    def gemm_kernel(a, b, out, parts, nt, od, kdim, whole, count, amap, bmap, cvec):
        smem = cuda.shared.array(0, types.float16, alignment=SMEM_ALIGN)
        tid = cuda.threadIdx.x
        lane = tid & 31
        warp = tid >> 5
        wn0 = (warp % WARPS_N) * WTN
        wm0 = (warp // WARPS_N) * WTM

        n0, m0 = tile_origin(cuda.blockIdx.x, nt, od)

        acc = cuda.local.array(ACC_N, float32)
        af = cuda.local.array(AF_ALL, uint32)
        bf = cuda.local.array(BF_ALL, uint32)
        for i in range(ACC_N):
            acc[i] = float32(0.0)

        # Copy plan: chunk column cch of rows crow + rep * RPT (A: rep < CH_A, then B).
        cch = tid % CPR
        goff = cuda.local.array(CH_ALL, types.int64)
        gsz = cuda.local.array(CH_ALL, uint32)
        dst0 = copy_plan(tid, n0, m0, nt, od, kdim, goff, gsz)
        # ldmatrix plan (lane -> row and 8-column chunk as in v1), per k16 step.
        ar = wn0 + (lane & 15)
        br = wm0 + (lane & 7) + ((lane >> 4) << 3)
        # k16 step kq reads chunk 2*kq + (0 or 1); as 2*kq and the lane's chunk bit are disjoint bits,
        # (2*kq + c) ^ s == (c ^ s) ^ 2*kq: the kq-th offset is the kq=0 one XOR (kq << 5). opaque_u32 keeps the
        # two offsets in registers (NVVM otherwise recomputes them from the lane id inside the loop).
        aoff0 = opaque_u32(ar * ROWB + (((lane >> 4) ^ ((ar >> SWS) & SWM)) << 4))
        boff0 = opaque_u32(SA_B + br * ROWB + ((((lane >> 3) & 1) ^ ((br >> SWS) & SWM)) << 4))

        # One loop, every block of code once (numba device helpers cannot be compiled without a GPU here):
        # iteration `it` issues the copies of k tile `it` (the first STAGES-1 iterations only fill the ring) and
        # computes k tile kt = it - (STAGES-1).
        ktiles = (kdim + KS - 1) // KS
        woff = uint32(0)
        roff = uint32(RING_B - STAGE_B) if PIPE else uint32(0)  # pipe: stepped to slot 0 before its first use
        for it in range(ktiles + STAGES - 1):
            kt = it - (STAGES - 1)
            for kq in range(K16):
                if PIPE:
                    # wait + barrier before the last k16 step (and once at the end of the fill, kt == -1): tile
                    # kt+1 landed and is visible; every warp holds its last fragments of tile kt in registers, so
                    # the slot of tile kt is free for the copies issued at the next tile's kq == 0.
                    # The loads (and the buffer move below) run in the fill iterations too, where nothing reads
                    # their (stale, harmless) values: unconditional, they need no selects.
                    sync_here = kq == K16 - 1 and kt >= -1
                    do_load = True
                    lq = (kq + 1) % K16  # fragments of the NEXT k16 step, into buffer 1
                    lbuf = 1
                else:
                    # v1's order: tile kt landed (this thread's copies) and is visible (barrier), and every
                    # warp is done with the slot of tile kt-1, which this iteration's copies refill.
                    sync_here = kq == 0 and kt >= 0
                    do_load = kt >= 0
                    lq = kq
                    lbuf = 0
                if sync_here:
                    cp_async_wait_group(WAIT)
                    cuda.syncthreads()
                    if PIPE:
                        roff = uint32(roff + STAGE_B)
                        if roff == RING_B:
                            roff = uint32(0)
                if do_load:
                    ao = roff + (aoff0 ^ (lq << 5))
                    bo = roff + (boff0 ^ (lq << 5))
                    for i in range(MT):
                        q0, q1, q2, q3 = ldmatrix_x4_off(smem, ao + i * SUB_B)
                        x = lbuf * AF_N + i * 4
                        af[x] = q0
                        af[x + 1] = q1
                        af[x + 2] = q2
                        af[x + 3] = q3
                    for j in range(NT8 // 2):
                        q0, q1, q2, q3 = ldmatrix_x4_off(smem, bo + j * SUB_B)
                        y = lbuf * BF_N + j * 4
                        bf[y] = q0
                        bf[y + 1] = q1
                        bf[y + 2] = q2
                        bf[y + 3] = q3
                if kq == 0:
                    if it < ktiles:
                        copy_tile(smem, woff, dst0, a, b, goff, gsz, it, cch, kdim)
                    cp_async_commit_group()  # possibly empty: keeps the group count = tiles issued
                    woff = uint32(woff + STAGE_B)
                    if woff == RING_B:
                        woff = uint32(0)
                if kt >= 0:
                    for i in range(MT):
                        x = i * 4
                        for j in range(NT8):
                            c = (i * NT8 + j) * 4
                            y = j * 2
                            d0, d1, d2, d3 = mma_m16n8k16_f32_f16(
                                af[x], af[x + 1], af[x + 2], af[x + 3], bf[y], bf[y + 1],
                                acc[c], acc[c + 1], acc[c + 2], acc[c + 3],
                            )
                            acc[c] = d0
                            acc[c + 1] = d1
                            acc[c + 2] = d2
                            acc[c + 3] = d3
                if PIPE:
                    # buffer 1 -> buffer 0 with constant indices: renamed away where LLVM unrolls the k16 loop
                    # (KS=32); register moves where it does not (KS=64), instead of a run-time-indexed (local
                    # memory) fragment array
                    for e in range(AF_N):
                        af[e] = af[AF_N + e]
                    for e in range(BF_N):
                        bf[e] = bf[BF_N + e]
            if not PIPE and kt >= 0:
                roff = uint32(roff + STAGE_B)
                if roff == RING_B:
                    roff = uint32(0)
        cp_async_wait_group(0)

        store_c(out, acc, n0 + wn0 + (lane >> 2), m0 + wm0 + (lane & 3) * 2, nt, od, 0, 0)  # as v1's mma_sync epilogue

    return gemm_kernel


def _make_kernel_wgmma(g: Geometry):
    """MMA=wgmma (sm_90a; STAGING=cp_async; LOOP=addr32 or pipe): Hopper warpgroup MMA with both operands read
    from shared memory through matrix descriptors (kernels/ptx/wgmma.py).

    * Tiles: LOOP=addr32/pipe's copy plan and XOR-swizzled shared tiles, unchanged: a KS=32 tile row is 64 bytes
      with 16-byte chunk c of row r stored at chunk c ^ ((r >> 1) & 3), a KS=64 row 128 bytes with c ^ (r & 7).
      As every tile starts at a multiple of 1024 bytes (declared alignment of the dynamic shared memory; stage,
      A/B and 8-row offsets are multiples of it or of 512 / 1024), that is exactly wgmma's K-major 64-byte /
      128-byte swizzled canonical layout (the XOR of address bits 4.. with bits 7..): descriptors with SBO = 8 rows
      and the swizzle mode describe the cp.async tiles as they are, and the k16 step kq is start + 32 * kq bytes.
    * Warpgroups: warps // 4 of them; WG_N = min(warpgroups, TN // 64) split the nt rows, the rest split the od
      columns; each warpgroup issues, per k16 step, MT64 = (TN / WG_N) / 64 instructions m64nNk16 with
      N = TM / WG_M (the accumulators: MT64 * N / 2 f32 per thread, 128 at 256x128).
    * Schedule per k tile kt: cp.async.wait_group (tile kt landed), fence.proxy.async (generic-proxy writes ->
      wgmma's async proxy), barrier, copies of tile kt + P into the slot of tile kt - 1 - D, wgmma.fence, the
      K16 * MT64 wgmma, commit, wgmma.wait_group D. LOOP=addr32: D = 0 (the batch of tile kt is done before the
      next barrier); LOOP=pipe: D = 1 (one batch stays in flight across the barrier, so the tensor cores never
      wait for it; its ring slot is refilled one tile later, so copies run P = STAGES-1-D tiles ahead). The
      barrier after every thread's wait_group D is what frees the slot of tile kt - 1 - D for the copies.
    * Epilogue: the accumulator fragment is per warp N/8 mma.m16n8k16 C fragments (rows 16 * warp-in-group + g,
      + 8), written with the nt/od tail masks as the mma_sync epilogue.
    """
    TM, TN, KS, STAGES, GROUP = g.tm, g.tn, g.ks, g.stages, g.group
    ROWB = KS * 2
    THREADS = g.threads
    WG_N, WTN, MT64, N, NH, ACC_N = tiles.warpgroup_split(g)
    CPR = KS // 8
    SWIZZLE = SWIZZLE_64B if KS == 32 else SWIZZLE_128B
    SBO = 8 * ROWB  # bytes between 8-row groups
    LBO = 16  # unused by swizzled K-major layouts whose k16 step stays inside one row (encoded 1, as CUTLASS)
    SA_B = TN * ROWB
    STAGE_B = (TN + TM) * ROWB
    RING_B = STAGES * STAGE_B
    RPT = THREADS // CPR
    CH_A = TN // RPT
    CH_B = TM // RPT
    CH_ALL = CH_A + CH_B
    copy_plan, copy_tile = _copy_plan(CPR, RPT, CH_A, CH_B, ROWB, KS, TN)
    K16 = KS // 16
    D = 1 if g.loop == "pipe" else 0
    P = STAGES - 1 - D  # k tiles the copies run ahead
    WAIT = P - 1
    M64_B = 64 * ROWB  # bytes between the m64 slices of a warpgroup's A rows
    block_work = tiles.split_work(TN, TM, GROUP)
    store_c = tiles.c_fragment_store(MT64, N // 8, 64)
    ktile_mma = tiles.ktile_mma(K16, MT64, NH, N, M64_B)
    SMEM_ALIGN = None if SIMULATOR else 1024

    def gemm_kernel(a, b, out, parts, nt, od, kdim, whole, count, amap, bmap, cvec):
        smem = cuda.shared.array(0, types.float16, alignment=SMEM_ALIGN)
        tid = cuda.threadIdx.x
        wg = tid >> 7
        row0 = (wg % WG_N) * WTN
        col0 = (wg // WG_N) * N

        n0, m0, sl, nsl, roff, coff = block_work(cuda.blockIdx.x, nt, od, whole, count)
        dst = parts if nsl > 1 else out

        # No zero fill: the first k tile's wgmma runs with scale-d = 0 (D = A·B), which also spares the 128-iteration
        # store loop that NVVM does not unroll (it would leave the array in local memory).
        acc = cuda.local.array(ACC_N, float32)

        cch = tid % CPR
        goff = cuda.local.array(CH_ALL, types.int64)
        gsz = cuda.local.array(CH_ALL, uint32)
        dst0 = copy_plan(tid, n0, m0, nt, od, kdim, goff, gsz)
        desc_a0 = wgmma_desc(smem, row0 * ROWB, LBO, SBO, SWIZZLE)
        desc_b0 = wgmma_desc(smem, SA_B + col0 * ROWB, LBO, SBO, SWIZZLE)

        # This block's k tiles: kt0 .. kt0 + ktiles - 1 of the (kdim / KS)-tile range, split as evenly as integers
        # allow (the host keeps the slice count <= k tiles).
        ktotal = (kdim + KS - 1) // KS
        kt0 = (ktotal * sl) // nsl
        ktiles = (ktotal * (sl + 1)) // nsl - kt0
        woff = uint32(0)
        rslot = uint32(0)
        for it in range(ktiles + P):
            kt = it - P
            if kt >= 0:
                cp_async_wait_group(WAIT)
                fence_proxy_async_shared()
                cuda.syncthreads()
            if it < ktiles:
                copy_tile(smem, woff, dst0, a, b, goff, gsz, kt0 + it, cch, kdim)
            cp_async_commit_group()  # possibly empty: keeps the group count = tiles issued
            woff = uint32(woff + STAGE_B)
            if woff == RING_B:
                woff = uint32(0)
            if kt >= 0:
                ktile_mma(smem, acc, desc_a0, desc_b0, uint64(rslot >> 4), kt > 0)
                wgmma_wait_group(D)
                rslot = uint32(rslot + STAGE_B)
                if rslot == RING_B:
                    rslot = uint32(0)
        wgmma_wait_group(0)
        cp_async_wait_group(0)

        lane = tid & 31
        store_c(dst, acc, n0 + row0 + ((tid >> 5) & 3) * 16 + (lane >> 2), m0 + col0 + (lane & 3) * 2, nt, od,
                roff, coff)

    return gemm_kernel


SIGNATURE = types.void(types.float16[::1], types.float16[::1], types.float32[:, ::1], types.float32[:, ::1], types.int64,
                       types.int64, types.int64, types.int64, types.int64, types.uint64[::1], types.uint64[::1],
                       types.int64)
_CACHE = KernelCache("gemm_f16", SIGNATURE)


def kernel_ptx(config: dict | None, cc=(9, 0, "a")) -> str:
    """PTX of the kernel for ``config`` (compiled with NVVM for ``cc``, sm_90a by default -- the target a CUDA
    launch on an H200 compiles for, and the only one where MMA=wgmma exists; needs no GPU; not under the
    simulator)."""
    g = geometry(config)
    ptx, _ = cuda.compile_ptx(_make_kernel(g), SIGNATURE, cc=cc, launch_bounds=(g.threads,))
    return ptx


def build(config: dict | None = None) -> BuiltKernel:
    """Compile (once per knob combination; cached) and return the kernel for ``config``. Refuses a combination
    whose shared memory exceeds the device's opt-in limit; opts in above 48 KB (kernels/specialize.py)."""
    g = geometry(config)
    return _CACHE.get(g, _make_kernel, g.smem_bytes, g.threads, hint="lower TM/TN/KS/STAGES")


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


def launch_config(config: dict | None, nt: int, od: int, sms: int | None = None) -> dict:
    """The resolved knob dict a launch of ``config`` runs for C[nt, od] on ``sms`` SMs (the current device's by
    default). AUTOTILE=1 with STAGING=tma and TM=256: TM=128 when its grid, in whole waves times
    `gemm_f16_config.NARROW_TILE_TIME`, finishes before the 256-wide grid's whole waves (wave quantization: a grid
    of 2.2 waves takes 3; split-K's partials, the other cure, cost a tile's worth of memory traffic). Otherwise the
    config itself. Idempotent."""
    cfg = resolve_config(config)
    if cfg["AUTOTILE"] == 0 or cfg["TM"] != 256 or cfg["STAGING"] != "tma":
        return cfg
    sms = sms or device_sms()
    narrow = dict(cfg, TM=128)
    wide_waves = -(-geometry(cfg).grid(nt, od) // sms)
    narrow_waves = -(-geometry(narrow).grid(nt, od) // sms)
    return narrow if narrow_waves * gemm_f16_config.NARROW_TILE_TIME < wide_waves else cfg


def device_sms() -> int:
    """The current device's SM count (the waves `split_plan` plans for)."""
    return int(getattr(cuda.get_current_device(), "MULTIPROCESSOR_COUNT", 1))


def partials_elements(config: dict | None, nt: int, od: int, kdim: int, sms: int | None = None) -> int:
    """f32 elements of the split-K partials buffer a launch of ``config`` needs for this shape (0 without a
    split): slices * nt * od when every tile is split, else (split tiles) * slices * TN * TM; the larger of the
    plans of ``config`` itself (`kernels.gemm_fused`) and of its `launch_config` (`gemm_f16`)."""
    sizes = []
    for cfg in (resolve_config(config), launch_config(config, nt, od, sms)):
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
def _sum_slices(partials, out, n, count):
    """out[i] = partials[0 * n + i] + partials[1 * n + i] + ... (``count`` slices, in slice order: the same sum
    whichever block of the GEMM finished last); f32, flat [count * n] and [n]."""
    i = cuda.grid(1)
    if i < n:
        v = partials[i]
        for s in range(1, count):
            v += partials[s * n + i]
        out[i] = v


@kernel
def _sum_tiles(parts, out, nt, od, whole, count, tn, tm, group):
    """The compact partials of a plan with whole > 0: C tile ``whole + q`` (grouped program order of tn x tm tiles,
    ``group`` od tiles a group, as the GEMM's) = the sum in slice order of partial tiles q * count .. q * count +
    count - 1 (rows of ``parts``, f32 [(tiles - whole) * count * tn, tm]); written to ``out`` (f32 [nt, od]) within
    its tails. One thread an element of a split tile."""
    i = cuda.grid(1)
    per = tn * tm
    q = i // per
    e = i - q * per
    r = e // tm
    c = e - r * tm
    num_n = (nt + tn - 1) // tn
    num_m = (od + tm - 1) // tm
    pid = whole + q
    if pid >= num_n * num_m:
        return
    in_group = group * num_n
    first_m = (pid // in_group) * group
    gsize = min(num_m - first_m, group)
    local = pid % in_group
    row = (local // gsize) * tn + r
    col = (first_m + local % gsize) * tm + c
    if row < nt and col < od:
        base = q * count * tn + r
        v = parts[base, c]
        for s in range(1, count):
            v += parts[base + s * tn, c]
        out[row, col] = v


def gemm_f16(a, b, out=None, *, config: dict | None = None, stream=0, partials=None):
    """Enqueue ``C[nt, od] = A[nt, id] · B[od, id]^T`` on ``stream`` and return C.

    a: f16 device array [nt, id], row-major (activations). b: f16 device array [od, id], row-major (a dequantized
    weight, K-major). out: optional f32 device array [nt, od], row-major; allocated when None. Products are
    accumulated in f32 on the tensor cores (mma.sync m16n8k16, wmma m16n16k16, or wgmma m64nNk16 on sm_90a).
    config: knob dict (see KNOBS and LAUNCH_KNOBS; missing knobs take DEFAULT / LAUNCH_DEFAULT): MMA, TM, TN, KS,
    STAGES, STAGING, GROUP, LOOP, EPI, SPLITK, AUTOTILE (the tile a shape runs: `launch_config`). MMA=wgmma (the default) needs an sm_90a device (H100/H200),
    STAGING=cp_async and LOOP=addr32|pipe.

    Split-K (SPLITK > 1, or 0 = auto; `split_plan`): the tiles the plan splits are multiplied by one block a k slice
    each, into f32 partial tiles in ``partials`` (a flat f32 device array of at least `partials_elements` elements;
    allocated here when None, which a CUDA graph capture cannot do: callers that capture pass their own); a second
    kernel adds each tile's slices in slice order into C (the result does not depend on which block finished
    first).

    Constraints (KernelConstraintError, a ValueError, one line): both operands 2-D, float16, C-contiguous; inner
    dimensions equal; ``id % 32 == 0`` (16-byte cp.async chunks never straddle a row; all GGUF block sizes are
    multiples of 32); out f32 [nt, od]; partials too small for the split; SPLITK other than 1 without MMA=wgmma;
    a knob combination whose shared memory exceeds the device's opt-in limit is refused. nt and od may be any
    size (tails are zero-filled by cp.async src-size 0 / predicated loads and masked in the epilogue).

    Algorithm: tiled tensor-core GEMM with a multi-stage cp.async ring (CUTLASS/Triton style); see the module
    docstring for sources. Split-K: CUTLASS's "split-K parallel" GEMM (partials + a reduction kernel).
    """
    nt, od, kdim = check_inputs(a, b, out)
    if out is None:
        out = cuda.device_array((nt, od), dtype=np.float32, stream=stream)
    config = launch_config(config, nt, od)
    plan, parts = _launch(a, b, out, config, stream, partials)
    sum_parts(plan, parts, out, config, stream)
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
    config = launch_config(config, nt, od)
    plan, parts = _launch(a, b, out, config, stream, partials)
    if plan.whole == 0 and plan.slices > 1:
        return parts, plan.slices
    sum_parts(plan, parts, out, config, stream)
    return out.reshape(nt * od), 1


def _launch(a, b, out, config, stream, partials):
    """Enqueue the GEMM kernel with its split plan; return (plan, the flat partials used or None)."""
    nt, od, kdim = check_inputs(a, b, out)
    built = build(config)
    g = built.geometry
    plan = split_plan(config, nt, od, kdim)
    parts, target = split_target(plan, g, nt, od, out, partials, stream)
    if g.staging == "tma":
        amap, bmap = gemm_tma.tensor_map(a, g.tn), gemm_tma.tensor_map(b, g.tm)
    else:
        amap = bmap = gemm_tma.no_map()
    built.kernel[plan.blocks(g.grid(nt, od)), g.threads, stream, g.smem_bytes](
        a.reshape(nt * kdim), b.reshape(od * kdim), out, target, nt, od, kdim, plan.whole, plan.slices, amap, bmap,
        gemm_tma.c_vectors(out, target)
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



def sum_parts(plan: SplitPlan, parts, out, config, stream) -> None:
    """Enqueue the sum of a split plan's partials into C (nothing without a split)."""
    if plan.slices == 1:
        return
    nt, od = out.shape
    if plan.whole == 0:
        n = nt * od
        _sum_slices[-(-n // 256), 256, stream](parts, out.reshape(n), n, plan.slices)
        return
    g = geometry(config)
    rest = parts.shape[0] // (plan.slices * g.tn * g.tm)
    n = rest * g.tn * g.tm
    _sum_tiles[-(-n // 256), 256, stream](parts.reshape(rest * plan.slices * g.tn, g.tm), out, nt, od, plan.whole,
                                          plan.slices, g.tn, g.tm, g.group)
