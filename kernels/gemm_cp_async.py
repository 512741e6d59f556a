"""The `kernels.gemm_f16` kernels whose own threads stage the tiles (STAGING=cp_async: `cp.async` 16-byte copies;
STAGING=sync: predicated global loads and shared stores): MMA=mma_sync and wmma (LOOP=v1, and mma_sync's LOOP=addr32
/ pipe main loops) and MMA=wgmma over the same swizzled cp.async ring. The STAGING=tma kernel is `kernels.gemm_tma`;
the knobs, launch and split-K plans are `kernels.gemm_f16`'s, whose docstring describes the layouts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from numba import cuda, float32, types, uint32, uint64

from kernels import gemm_tiles as tiles
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

if TYPE_CHECKING:
    from kernels.gemm_f16 import Geometry


def make_kernel(g: Geometry):
    """The kernel of a STAGING=cp_async or sync geometry: MMA=wgmma (`_wgmma`), mma_sync with LOOP=addr32 / pipe
    (`_v2`), else LOOP=v1 (`_v1`)."""
    if g.mma == "wgmma":
        return _wgmma(g)
    if g.loop != "v1":
        return _v2(g)
    return _v1(g)


# ------------------------------------------------------------------------------------------------------------
# Kernel factory: one Python function per knob combination, closing over the constants (numba freezes closure
# variables as compile-time constants, so every loop below has a constant trip count and is fully unrolled;
# fragment arrays are then promoted to registers).
# ------------------------------------------------------------------------------------------------------------


def _v1(g: Geometry):
    """LOOP=v1 (MMA=mma_sync or wmma, STAGING=cp_async or sync): the first main loop, its addresses computed per
    access (LOOP=addr32 / pipe, `_v2`, hoist them)."""
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

    def gemm_kernel(a, b, out, parts, nt, od, kdim, whole, count, amap, bmap, cvec, m_lo, m_hi):
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


def _v2(g: Geometry):
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

    def gemm_kernel(a, b, out, parts, nt, od, kdim, whole, count, amap, bmap, cvec, m_lo, m_hi):
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


def _wgmma(g: Geometry):
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
    block_work = tiles.split_work(TN, TM, GROUP, g.nocall)
    k_range = tiles.k_range(KS, g.nocall)
    store_c = tiles.c_fragment_store(MT64, N // 8, 64)
    ktile_mma = tiles.ktile_mma(K16, MT64, NH, N, M64_B)
    SMEM_ALIGN = None if SIMULATOR else 1024

    def gemm_kernel(a, b, out, parts, nt, od, kdim, whole, count, amap, bmap, cvec, m_lo, m_hi):
        smem = cuda.shared.array(0, types.float16, alignment=SMEM_ALIGN)
        tid = cuda.threadIdx.x
        wg = tid >> 7
        row0 = (wg % WG_N) * WTN
        col0 = (wg // WG_N) * N

        n0, m0, sl, nsl, roff, coff = block_work(cuda.blockIdx.x, nt, od, whole, count, m_lo, m_hi)
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
        kt0, ktiles = k_range(kdim, sl, nsl)
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
