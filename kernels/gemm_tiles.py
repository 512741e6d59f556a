"""Device-function factories shared by the prefill GEMM kernels (`kernels.gemm_f16`'s mma_sync, wmma and wgmma
kernels, `kernels.gemm_tma`, `kernels.gemm_fused_regs`): the grouped tile order and split-K block work, the C-fragment
stores and the staged C-tile epilogue, and the wgmma pieces (warpgroup split, one k tile's batch).

Each factory closes over compile-time constants and returns an inlined ``@cuda.jit(device=True)`` function, so a
kernel that calls it unrolls every loop (see `kernels.gemm_f16`'s kernel factory).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from numba import cuda, float32, int64, uint32, uint64

from kernels.activation import silu_mul, silu_mul_approx
from kernels.ptx import (bar_sync, ld_global_v4_f32, ld_shared_v4_f32, st_global_v4_f32, st_global_v4_u32,
                         st_shared_v2_f32)
from kernels.ptx.wgmma import wgmma_commit_group, wgmma_fence, wgmma_m64nNk16_f32_f16, wgmma_wait_group
from kernels.quant.bits import f16x2_bits

if TYPE_CHECKING:
    from kernels.gemm_f16 import Geometry


def c_fragment_store(MI: int, NJ: int, ISTEP: int, ACCUMULATE: bool = False):
    """``store_c(out, acc, rbase, cbase, nt, od, roff, coff)``: write a warp's accumulators, MI x NJ mma.m16n8 C fragments
    (PTX ISA "Matrix Fragments for mma.m16n8k16": lane l holds rows g, g+8 and columns 2t, 2t+1 of each, g = l>>2,
    t = l&3; wgmma m64nNk16's per-warp accumulators are the same fragments), to f32 ``out`` with the nt/od tail
    masks. Fragment (i, j) is at accumulator 4 * (i * NJ + j), row ``rbase + i * ISTEP`` (+8), column
    ``cbase + 8 * j`` (+1); rbase/cbase already hold the lane's g and 2t. Element (r, c) with r < nt and c < od
    lands at ``out[roff + r, c - coff]`` (C: 0, 0; split-K partials: the slice's rows, and for a compact partial
    tile its rows and first column). ACCUMULATE: each element is added to the value already there (C += the
    product: the residual epilogue of `kernels.gemm_f16.gemm_f16`'s ``accumulate``)."""

    @cuda.jit(device=True, inline="always")
    def store_c(out, acc, rbase, cbase, nt, od, roff, coff):
        for i in range(MI):
            for h in range(2):
                rowi = rbase + i * ISTEP + h * 8
                if rowi < nt:
                    for j in range(NJ):
                        c = (i * NJ + j) * 4 + 2 * h
                        col = cbase + j * 8
                        if ACCUMULATE:
                            if col < od:
                                out[roff + rowi, col - coff] += acc[c]
                            if col + 1 < od:
                                out[roff + rowi, col + 1 - coff] += acc[c + 1]
                        else:
                            if col < od:
                                out[roff + rowi, col - coff] = acc[c]
                            if col + 1 < od:
                                out[roff + rowi, col + 1 - coff] = acc[c + 1]

    return store_c


C_PAD = 8
"""f32 elements of padding after each row of a staged C tile: with TM a multiple of 32 the row stride is 8 banks
(mod 32), so the 8-byte fragment writes of a half-warp (rows g = 0..3, columns 2t) hit 32 distinct banks."""
C_PAD_T = 4
"""The padding of a TRANSPOSED staged tile (`_stage_fragments`): a warp's 4-byte writes go to tile rows 2t (+ e)
and columns g, so a row stride of 4 banks (mod 32) puts its 32 lanes on 32 distinct banks (with C_PAD's 8, lanes t
and t + 2 would share one: two-way conflicts); rows stay 16-byte aligned for the chunk reads."""


def c_stride(tm: int, transposed: bool = False) -> int:
    """f32 elements from one staged C tile row to the next: TM + C_PAD, or + C_PAD_T when TRANSPOSED."""
    return tm + (C_PAD_T if transposed else C_PAD)


def c_tile_bytes(tn: int, tm: int) -> int:
    """Shared-memory bytes of a staged TN x TM f32 C tile (`c_tile_store`; a TRANSPOSED one takes no more)."""
    return tn * c_stride(tm) * 4


def _stage_fragments(MI: int, NJ: int, S: int, CONSUMERS: int, TRANSPOSED: bool = False):
    """``stage(cs, acc, rl, cl)``: the CONSUMERS threads meet (named barrier 1: no wgmma batch still reads the ring),
    each writes its MI x NJ m16n8 C fragments into the f32 tile ``cs`` of row stride S with 8-byte stores, and they
    meet again (the tile is whole). The first half of `c_tile_store` and `c_tile_store_glu`. TRANSPOSED (MI = 1):
    the fragments hold C^T (wgmma's rows are the tile's columns, `kernels.gemm_fused_regs`): fragment element (row
    ``rl`` + 8 h, column ``cl`` + 8 j + e) lands at tile row ``cl`` + 8 j + e, column ``rl`` + 8 h (4-byte stores)."""

    @cuda.jit(device=True, inline="always")
    def stage(cs, acc, rl, cl):
        bar_sync(1, CONSUMERS)
        if TRANSPOSED:
            for j in range(NJ):
                for e in range(2):
                    at = (cl + 8 * j + e) * S + rl
                    cs[at] = acc[4 * j + e]
                    cs[at + 8] = acc[4 * j + 2 + e]
        else:
            for i in range(MI):
                for h in range(2):
                    at = (rl + i * 64 + h * 8) * S + cl
                    for j in range(NJ):
                        c = (i * NJ + j) * 4 + 2 * h
                        st_shared_v2_f32(cs, at + 8 * j, acc[c], acc[c + 1])
        bar_sync(1, CONSUMERS)

    return stage


def c_tile_store(MI: int, NJ: int, TN: int, TM: int, CONSUMERS: int, ACCUMULATE: bool = False,
                 TRANSPOSED: bool = False):
    """``store_tile(cs, out, acc, rl, cl, n0, m0, nt, od, roff, coff, cvec, tid)``: the warp-specialized kernels'
    epilogue. The CONSUMERS threads (whole warpgroups; named barrier 1) first meet, so no wgmma batch still reads
    the ring; each writes its MI x NJ m16n8 C fragments (`c_fragment_store`'s layout; tile-local row ``rl`` and
    column ``cl`` of its first one, fragment rows 64 apart) into the f32 tile ``cs`` (row stride `c_stride`, over
    the ring) with 8-byte stores; they meet again and copy the tile out a row at a time, 16 bytes a thread, TM / 4
    threads a row (a warp writes 512 contiguous bytes of one row when TM >= 128, two rows' 256 at TM = 64); at
    TM = 144, 192 (36, 48 chunks a row, which do not divide the threads) thread t takes chunks t, t +
    CONSUMERS, ... of the tile in row-major order, so a warp writes 512 bytes of one row, or two runs at the end of
    one row and the start of the next. Element (r, c)
    with n0 + r < nt and m0 + c < od lands at ``out[roff + n0 + r, m0 + c - coff]``. ``cvec`` 0:
    every element a 4-byte store (an ``out`` whose rows are not 16-byte aligned); else 16-byte stores except at the
    od tail. Replaces ~TN * TM / 64 scattered 4-byte stores a
    warp (two half-filled 32-byte sectors each) with full-line writes. CUTLASS sm90 epilogues stage C the same
    way. ACCUMULATE: each element is added to the value already in ``out`` (read with the same 16-byte or 4-byte
    width as the store; C += the product, `kernels.gemm_f16.gemm_f16`'s ``accumulate``). TRANSPOSED: the fragments
    hold C^T (`_stage_fragments`)."""
    S = c_stride(TM, TRANSPOSED)
    CH = TM // 4  # 16-byte chunks a row
    assert TM % 16 == 0 and (TN * CH) % CONSUMERS == 0  # row stride TM + 8 = 8 or 24 banks mod 32: either keeps a
    # half-warp's four fragment rows on distinct banks
    stage = _stage_fragments(MI, NJ, S, CONSUMERS, TRANSPOSED)

    @cuda.jit(device=True, inline="always")
    def store_chunk(cs, out, r, cq, n0, m0, nt, od, roff, coff, cvec):
        """Chunk ``cq`` (first column) of tile row ``r`` from ``cs`` to ``out``."""
        rowi = n0 + r
        col = m0 + cq
        if rowi < nt and col < od:
            x0, x1, x2, x3 = ld_shared_v4_f32(cs, r * S + cq)
            if cvec != 0 and col + 3 < od:
                if ACCUMULATE:
                    y0, y1, y2, y3 = ld_global_v4_f32(out, roff + rowi, col - coff)
                    x0, x1, x2, x3 = y0 + x0, y1 + x1, y2 + x2, y3 + x3
                st_global_v4_f32(out, roff + rowi, col - coff, x0, x1, x2, x3)
            elif ACCUMULATE:
                out[roff + rowi, col - coff] += x0
                if col + 1 < od:
                    out[roff + rowi, col + 1 - coff] += x1
                if col + 2 < od:
                    out[roff + rowi, col + 2 - coff] += x2
                if col + 3 < od:
                    out[roff + rowi, col + 3 - coff] += x3
            else:
                out[roff + rowi, col - coff] = x0
                if col + 1 < od:
                    out[roff + rowi, col + 1 - coff] = x1
                if col + 2 < od:
                    out[roff + rowi, col + 2 - coff] = x2
                if col + 3 < od:
                    out[roff + rowi, col + 3 - coff] = x3

    if CONSUMERS % CH == 0:
        RPI = CONSUMERS // CH  # rows a pass
        assert TN % RPI == 0

        @cuda.jit(device=True, inline="always")
        def store_tile(cs, out, acc, rl, cl, n0, m0, nt, od, roff, coff, cvec, tid):
            stage(cs, acc, rl, cl)
            cq = (tid % CH) * 4
            for p in range(TN // RPI):
                store_chunk(cs, out, tid // CH + p * RPI, cq, n0, m0, nt, od, roff, coff, cvec)

        return store_tile

    @cuda.jit(device=True, inline="always")
    def store_tile_flat(cs, out, acc, rl, cl, n0, m0, nt, od, roff, coff, cvec, tid):
        stage(cs, acc, rl, cl)
        for p in range(TN * CH // CONSUMERS):
            chunk = tid + p * CONSUMERS
            store_chunk(cs, out, chunk // CH, (chunk % CH) * 4, n0, m0, nt, od, roff, coff, cvec)

    return store_tile_flat


def c_tile_store_glu(MI: int, NJ: int, TN: int, TM: int, CONSUMERS: int, APPROX: bool = False,
                     TRANSPOSED: bool = False):
    """``store_glu(cs, out, acc, rl, cl, n0, m0, nt, od, tid)``: `c_tile_store` for a gate|up product whose C tile
    holds gate columns in its first TM / 2 and the matching up columns in its second (`kernels.gemm_f16.gemm_f16_glu`
    loads the B tile as two boxes: gate rows m0 / 2 .., up rows od / 2 + m0 / 2 ..). After the same staging of the
    fragments (named barrier 1, f32 tile over the ring), each thread takes 8 consecutive outputs of a row: two 16-byte
    reads of gate values, two of up values, ``silu(g) * u`` (`kernels.activation.silu_mul`, the expression of
    `kernels.activation.swiglu`), rounded to f16 (nearest even, as swiglu's f16 store) and packed into one 16-byte
    store of ``out`` (the f16 [nt, od / 2] activation as a flat uint32 array, od / 4 words a row; rows 16-byte
    aligned: the launcher checks). Element (r, j) with n0 + r < nt and m0 / 2 + j < od / 2 lands at activation
    column m0 / 2 + j. TM / 16 threads a row. APPROX (NOCALL=1): `silu_mul_approx` (no IEEE division).
    TRANSPOSED: the fragments hold C^T (`_stage_fragments`; `kernels.gemm_fused_regs`)."""
    S = c_stride(TM, TRANSPOSED)
    HALF = TM // 2
    CH = HALF // 8  # 16-byte (8 x f16) output chunks a row
    RPI = CONSUMERS // CH  # rows a pass
    assert TM % 128 == 0 and CONSUMERS % CH == 0 and TN % RPI == 0
    stage = _stage_fragments(MI, NJ, S, CONSUMERS, TRANSPOSED)
    act = silu_mul_approx if APPROX else silu_mul

    @cuda.jit(device=True, inline="always")
    def store_glu(cs, out, acc, rl, cl, n0, m0, nt, od, tid):
        stage(cs, acc, rl, cl)
        cq = (tid % CH) * 8
        col = m0 // 2 + cq
        words = od // 4
        for p in range(TN // RPI):
            r = tid // CH + p * RPI
            rowi = n0 + r
            if rowi < nt and col < od // 2:
                g0, g1, g2, g3 = ld_shared_v4_f32(cs, r * S + cq)
                g4, g5, g6, g7 = ld_shared_v4_f32(cs, r * S + cq + 4)
                u0, u1, u2, u3 = ld_shared_v4_f32(cs, r * S + HALF + cq)
                u4, u5, u6, u7 = ld_shared_v4_f32(cs, r * S + HALF + cq + 4)
                st_global_v4_u32(out, rowi * words + col // 2,
                                 f16x2_bits(act(g0, u0), act(g1, u1)),
                                 f16x2_bits(act(g2, u2), act(g3, u3)),
                                 f16x2_bits(act(g4, u4), act(g5, u5)),
                                 f16x2_bits(act(g6, u6), act(g7, u7)))

    return store_glu


def consumer_epilogue(MT64: int, N: int, TN: int, TM: int, CONSUMERS: int, STAGED: bool, GLU: bool = False,
                      NOCALL: bool = False, ACCUMULATE: bool = False):
    """``epilogue(out, parts, acc, tid, row0, col0, n0, m0, nt, od, nsl, roff, coff, cvec)``: the end of a
    warp-specialized consumer thread (`kernels.gemm_tma`; ``tid`` < CONSUMERS): wait for its
    last wgmma batch, then store its MT64 x N / 8 m16n8 C fragments (warpgroup tile at row ``row0``, column
    ``col0``) to ``out``, or to the split-K target ``parts`` when the block's k range is one of ``nsl`` > 1 slices:
    with STAGED through the f32 C tile over the ring in the kernel's dynamic shared memory (`c_tile_store`), else
    straight from the fragments (`c_fragment_store`). GLU (with STAGED): ``out`` is the f16 activation as flat
    uint32 words and an unsplit tile leaves as ``silu(gate) * up`` (`c_tile_store_glu`, its division div.approx
    with NOCALL); split slices as f32. ACCUMULATE (not with GLU): an unsplit tile is added to ``out`` (C += the
    product); split slices are stored as they are (the slice sum adds them to C)."""
    store_tile = c_tile_store(MT64, N // 8, TN, TM, CONSUMERS)
    store_c = c_fragment_store(MT64, N // 8, 64)
    if ACCUMULATE:
        assert not GLU
        accumulate_tile = c_tile_store(MT64, N // 8, TN, TM, CONSUMERS, True)
        accumulate_c = c_fragment_store(MT64, N // 8, 64, True)

        @cuda.jit(device=True, inline="always")
        def epilogue_accumulate(out, parts, acc, tid, row0, col0, n0, m0, nt, od, nsl, roff, coff, cvec):
            wgmma_wait_group(0)
            lane = tid & 31
            rl = row0 + ((tid >> 5) & 3) * 16 + (lane >> 2)
            cl = col0 + (lane & 3) * 2
            if STAGED:
                if nsl > 1:
                    store_tile(cuda.shared.array(0, float32), parts, acc, rl, cl, n0, m0, nt, od, roff, coff, cvec,
                               tid)
                else:
                    accumulate_tile(cuda.shared.array(0, float32), out, acc, rl, cl, n0, m0, nt, od, roff, coff, cvec,
                                    tid)
            elif nsl > 1:
                store_c(parts, acc, n0 + rl, m0 + cl, nt, od, roff, coff)
            else:
                accumulate_c(out, acc, n0 + rl, m0 + cl, nt, od, roff, coff)

        return epilogue_accumulate
    if GLU:
        assert STAGED
        store_glu = c_tile_store_glu(MT64, N // 8, TN, TM, CONSUMERS, NOCALL)

        @cuda.jit(device=True, inline="always")
        def epilogue_glu(out, parts, acc, tid, row0, col0, n0, m0, nt, od, nsl, roff, coff, cvec):
            wgmma_wait_group(0)
            lane = tid & 31
            rl = row0 + ((tid >> 5) & 3) * 16 + (lane >> 2)
            cl = col0 + (lane & 3) * 2
            if nsl > 1:
                store_tile(cuda.shared.array(0, float32), parts, acc, rl, cl, n0, m0, nt, od, roff, coff, cvec, tid)
            else:
                store_glu(cuda.shared.array(0, float32), out, acc, rl, cl, n0, m0, nt, od, tid)

        return epilogue_glu

    @cuda.jit(device=True, inline="always")
    def epilogue(out, parts, acc, tid, row0, col0, n0, m0, nt, od, nsl, roff, coff, cvec):
        wgmma_wait_group(0)
        dst = parts if nsl > 1 else out
        lane = tid & 31
        rl = row0 + ((tid >> 5) & 3) * 16 + (lane >> 2)
        cl = col0 + (lane & 3) * 2
        if STAGED:
            store_tile(cuda.shared.array(0, float32), dst, acc, rl, cl, n0, m0, nt, od, roff, coff, cvec, tid)
        else:
            store_c(dst, acc, n0 + rl, m0 + cl, nt, od, roff, coff)

    return epilogue


def index_division(U32: bool):
    """``(div, mod)``: floor division and remainder of non-negative integer indices below 2^32, returned as int64.
    U32 (the gemm knob NOCALL): computed in uint32 (div.u32 / rem.u32, short inline sequences). Otherwise Python's
    int64 ``//`` and ``%``, which NVVM lowers with a div.s64 / rem.s64 slow path: ptxas makes those subroutine
    calls, and a call in a kernel makes it serialize every wgmma (warning C7509)."""
    if U32:

        @cuda.jit(device=True, inline="always")
        def div(a, b):
            return int64(uint32(a) // uint32(b))

        @cuda.jit(device=True, inline="always")
        def mod(a, b):
            return int64(uint32(a) % uint32(b))

    else:

        @cuda.jit(device=True, inline="always")
        def div(a, b):
            return a // b

        @cuda.jit(device=True, inline="always")
        def mod(a, b):
            return a % b

    return div, mod


def program_order(TN: int, TM: int, GROUP: int, U32: bool = False):
    """``tile_origin(pid, nt, od) -> (n0, m0)``, the first nt row and od column of C tile ``pid`` in grouped
    program order: GROUP od tiles per group, od-fastest inside a group (GROUP=1: nt-fastest). Triton tutorial 03
    ("L2 cache optimizations"). U32: the divisions in uint32 (`index_division`)."""
    div, mod = index_division(U32)

    @cuda.jit(device=True, inline="always")
    def tile_origin(pid, nt, od):
        num_n = (nt + TN - 1) // TN
        num_m = (od + TM - 1) // TM
        in_group = GROUP * num_n
        first_m = div(pid, in_group) * GROUP
        gsize = min(num_m - first_m, GROUP)
        local = mod(pid, in_group)
        return div(local, gsize) * TN, (first_m + mod(local, gsize)) * TM

    return tile_origin


def k_range(KS: int, U32: bool = False):
    """``k_range(kdim, sl, nsl) -> (kt0, ktiles)``: the k tiles of slice ``sl`` of ``nsl`` over ``kdim`` (KS-wide
    tiles, ceil(kdim / KS) in all, split as evenly as integers allow; the host keeps nsl <= the tile count). U32:
    the divisions in uint32 (`index_division`)."""
    div, _ = index_division(U32)

    @cuda.jit(device=True, inline="always")
    def k_range_(kdim, sl, nsl):
        ktotal = (kdim + KS - 1) // KS
        kt0 = div(ktotal * sl, nsl)
        return kt0, div(ktotal * (sl + 1), nsl) - kt0

    return k_range_


def ktile_mma(K16: int, MT64: int, NH: int, N: int, M64_B: int):
    """``ktile_mma(smem, acc, desc_a0, desc_b0, step, accumulate)``: one k tile's wgmma batch of a warpgroup (the
    wgmma and tma kernels): wgmma.fence, then for each k16 step and m64 slice one m64nNk16 on the stage at descriptor
    offset ``step`` (bytes >> 4), adding to ``acc`` unless this is the first k tile (``accumulate`` False: D = A·B),
    then commit. The caller waits (wgmma.wait_group)."""

    @cuda.jit(device=True, inline="always")
    def ktile_mma(smem, acc, desc_a0, desc_b0, step, accumulate):
        wgmma_fence()
        for kq in range(K16):
            db = desc_b0 + step + uint64(kq * 2)
            scale_d = uint32(1) if kq > 0 or accumulate else uint32(0)
            for i in range(MT64):
                da = desc_a0 + step + uint64(kq * 2 + i * (M64_B >> 4))
                wgmma_m64nNk16_f32_f16(smem, acc, i * NH, da, db, scale_d, N)
        wgmma_commit_group()

    return ktile_mma


def split_work(TN: int, TM: int, GROUP: int, U32: bool = False):
    """``block_work(pid, nt, od, whole, count, m_lo, m_hi) -> (n0, m0, sl, nsl, roff, coff)``: block ``pid``'s share
    of a `kernels.gemm_f16_config.SplitPlan` over the C columns ``m_lo`` .. ``m_hi`` - 1 (0 .. od - 1 but for
    NARROWTAIL's two launches, `kernels.gemm_f16.tail_plan`; the tiles are those of the od = m_hi - m_lo columns,
    moved right by m_lo). Blocks below ``whole`` multiply C tile pid over all of k (sl 0 of nsl 1,
    written to C: roff = coff = 0); block whole + q * count + sl takes k slice sl of tile whole + q (nsl = count),
    written to the partials: with whole == 0 (every tile split) at rows sl * nt .. of [count * nt, od] (roff = sl *
    nt), else as compact partial tile q * count + sl of [(tiles - whole) * count * TN, TM] (roff, coff move the
    tile's rows and columns there; see `c_fragment_store`). (n0, m0): the tile's first nt row and od column. U32:
    the divisions in uint32 (`index_division`)."""
    tile_origin = program_order(TN, TM, GROUP, U32)
    div, _ = index_division(U32)

    @cuda.jit(device=True, inline="always")
    def block_work(pid, nt, od, whole, count, m_lo, m_hi):
        if pid < whole:
            n0, m0 = tile_origin(pid, nt, m_hi - m_lo)
            return n0, m_lo + m0, 0, 1, 0, 0
        q = div(pid - whole, count)
        sl = pid - whole - q * count
        n0, m0 = tile_origin(whole + q, nt, m_hi - m_lo)
        m0 += m_lo
        if count == 1:
            return n0, m0, 0, 1, 0, 0
        if whole == 0:
            return n0, m0, sl, count, sl * nt, 0
        return n0, m0, sl, count, (q * count + sl) * TN - n0, m0

    return block_work




def warpgroup_split(g: Geometry) -> tuple[int, int, int, int, int, int]:
    """How the wgmma kernels split a TN x TM tile over their warps // 4 warpgroups: (WG_N, WTN, MT64, N, NH, ACC_N).
    WG_N = min(warpgroups, TN // 64) warpgroups split the nt rows (WTN each), the rest split the od columns; each
    issues MT64 = WTN / 64 m64nNk16 a k16 step with N = TM / WG_M od columns, and holds NH = N / 2 accumulators per
    m64 slice, ACC_N in all."""
    wgs = g.warps // 4
    wg_n = min(wgs, g.tn // 64)
    wtn = g.tn // wg_n
    n = g.tm // (wgs // wg_n)
    return wg_n, wtn, wtn // 64, n, n // 2, (wtn // 64) * (n // 2)
