"""The STAGING=tma GEMM kernel of `kernels.gemm_f16` (a producer warp's tensor-map box copies on mbarriers feeding
wgmma consumer warpgroups) and its host side: the tensor-map cache and the C-row alignment check of the staged
epilogue.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from numba import cuda, float32, types, uint32, uint64

from kernels import gemm_tiles as tiles
from kernels.ptx import SIMULATOR
from kernels.ptx.bulk import mbarrier_arrive, mbarrier_arrive_expect_tx, mbarrier_init, mbarrier_try_wait_parity
from kernels.ptx.tma import MAP_WORDS, cp_async_bulk_tensor_2d_g2s, device_address, tensor_map_2d
from kernels.ptx.wgmma import SWIZZLE_128B, fence_proxy_async_shared, wgmma_desc, wgmma_wait_group

if TYPE_CHECKING:
    from kernels.gemm_f16 import Geometry


def make_kernel(g: Geometry):
    """STAGING=tma (MMA=wgmma, KS=64, LOOP=pipe; sm_90a): the wgmma kernel's warpgroups and tiles, fed by the copy
    engine instead of every thread's cp.async, in the warp-specialized form of CUTLASS sm90 and FlashAttention-3.

    * Warps: the consumer warpgroups of MMA=wgmma (threads 0 .. 32 * warps - 1, same tile split, descriptors and
      epilogue) plus one producer warp whose lane 0 issues every copy.
    * Ring: STAGES slots of [A box TN x 64 | B box TM x 64] f16, each box row 128 bytes in the 128-byte swizzle the
      tensor map applies (kernels/ptx/tma.py), i.e. wgmma's K-major swizzled layout: the descriptors of the
      cp.async path apply unchanged. Rows past nt / od and columns past kdim arrive as zeros.
    * Two mbarriers a slot, after the ring in shared memory: full[s] (1 arrival, the producer's expect-tx of the
      slot's bytes, plus the bytes) and empty[s] (one arrival from each consumer warp). Producer, k tile i into
      slot s = i % STAGES: wait empty[s] for the phase of the previous round (a fresh barrier passes parity 1),
      arm full[s], issue the A and B boxes. Consumers, k tile i: wait full[s] (phase i // STAGES), wgmma.fence, the
      K16 * MT64 wgmma, commit, wgmma.wait_group 1 (one batch in flight, as LOOP=pipe), then each warp's lane 0
      arrives on empty[] of tile i - 1's slot, whose batch has now finished reading it. No block-wide barrier in
      the main loop.
    * Split-K plans as the cp.async path (`split_work`): a block's k range is its slice's.
    * Epilogue: EPI=staged, `c_tile_store` (C through an f32 tile over the ring, 16-byte row stores; the barriers
      sit after max(ring, C tile)); EPI=direct, `c_fragment_store`.
    * ``g.glu`` (`kernels.gemm_f16.gemm_f16_glu`): B is a gate|up weight [od, id] (gate rows first) and tile m0 of
      the od / TM tiles loads gate rows m0 / 2 .. and up rows od / 2 + m0 / 2 .. as its two TM / 2-row halves (two
      boxes of a TM / 2-row tensor map, the same bytes a slot), so its C tile pairs every gate column with its up
      column; an unsplit tile leaves as the f16 ``silu(gate) * up`` (`gemm_tiles.c_tile_store_glu`).
    * ``g.accumulate`` (`kernels.gemm_f16.gemm_f16`'s ``accumulate``): an unsplit tile is added to C (`c_tile_store` /
      `c_fragment_store` with ACCUMULATE); split slices go to the partials as without it.

    Sources: PTX ISA §9.7.9.25.5.1 (cp.async.bulk.tensor), §9.7.13.15 (mbarrier), §9.7.15 (wgmma); CUTLASS sm90
    warp-specialized GEMM (producer / consumer pipeline); FlashAttention-3 (Shah et al., 2024) §3.1.
    """
    TM, TN, KS, STAGES, GROUP = g.tm, g.tn, g.ks, g.stages, g.group
    ROWB = KS * 2
    WG_N, WTN, MT64, N, NH, ACC_N = tiles.warpgroup_split(g)
    SBO = 8 * ROWB
    LBO = 16
    A_ELEMS = TN * KS
    STAGE_ELEMS = (TN + TM) * KS
    STAGE_B = STAGE_ELEMS * 2
    SA_B = TN * ROWB
    STAGED = g.epi == "staged"
    # index of full[0] (empty[s]: FULL0 + STAGES + s), after the ring, or after the staged C tile when it is larger
    FULL0 = (max(STAGES * STAGE_B, tiles.c_tile_bytes(TN, TM)) if STAGED else STAGES * STAGE_B) // 8
    CONSUMERS = 32 * g.warps
    CONSUMER_WARPS = g.warps
    K16 = KS // 16
    M64_B = 64 * ROWB
    block_work = tiles.split_work(TN, TM, GROUP, g.nocall)
    k_range = tiles.k_range(KS, g.nocall)
    GLU = g.glu
    HALF_E = TM // 2 * KS  # GLU: the up box's element offset in the B tile
    epilogue = tiles.consumer_epilogue(MT64, N, TN, TM, CONSUMERS, STAGED, GLU, g.nocall, g.accumulate)
    ktile_mma = tiles.ktile_mma(K16, MT64, NH, N, M64_B)
    SMEM_ALIGN = None if SIMULATOR else 1024

    def gemm_kernel(a, b, out, parts, nt, od, kdim, whole, count, amap, bmap, cvec, m_lo, m_hi):
        smem = cuda.shared.array(0, types.float16, alignment=SMEM_ALIGN)
        bars = cuda.shared.array(0, types.uint64)
        tid = cuda.threadIdx.x
        n0, m0, sl, nsl, roff, coff = block_work(cuda.blockIdx.x, nt, od, whole, count, m_lo, m_hi)
        kt0, ktiles = k_range(kdim, sl, nsl)
        if tid == 0:
            for s in range(STAGES):
                mbarrier_init(bars, FULL0 + s, 1)
                mbarrier_init(bars, FULL0 + STAGES + s, CONSUMER_WARPS)
            fence_proxy_async_shared()  # the copy engine completes bytes on the barriers: it must see them initialised
        cuda.syncthreads()

        if tid >= CONSUMERS:
            if tid == CONSUMERS:
                s = 0
                phase = uint32(0)
                for i in range(ktiles):
                    while mbarrier_try_wait_parity(bars, FULL0 + STAGES + s, phase ^ uint32(1)) == 0:
                        pass
                    mbarrier_arrive_expect_tx(bars, FULL0 + s, STAGE_B)
                    k0 = (kt0 + i) * KS
                    cp_async_bulk_tensor_2d_g2s(smem, s * STAGE_ELEMS, amap, 0, k0, n0, bars, FULL0 + s)
                    if GLU:  # gate rows m0 / 2 .. and up rows od / 2 + m0 / 2 .. as the tile's two halves
                        cp_async_bulk_tensor_2d_g2s(smem, s * STAGE_ELEMS + A_ELEMS, bmap, 0, k0, m0 // 2, bars,
                                                    FULL0 + s)
                        cp_async_bulk_tensor_2d_g2s(smem, s * STAGE_ELEMS + A_ELEMS + HALF_E, bmap, 0, k0,
                                                    od // 2 + m0 // 2, bars, FULL0 + s)
                    else:
                        cp_async_bulk_tensor_2d_g2s(smem, s * STAGE_ELEMS + A_ELEMS, bmap, 0, k0, m0, bars,
                                                    FULL0 + s)
                    s += 1
                    if s == STAGES:
                        s = 0
                        phase ^= uint32(1)
            return

        wg = tid >> 7
        row0 = (wg % WG_N) * WTN
        col0 = (wg // WG_N) * N
        lane = tid & 31
        acc = cuda.local.array(ACC_N, float32)  # the first k tile runs with scale-d = 0: no zero fill
        desc_a0 = wgmma_desc(smem, row0 * ROWB, LBO, SBO, SWIZZLE_128B)
        desc_b0 = wgmma_desc(smem, SA_B + col0 * ROWB, LBO, SBO, SWIZZLE_128B)
        s = 0
        prev = 0
        phase = uint32(0)
        for i in range(ktiles):
            while mbarrier_try_wait_parity(bars, FULL0 + s, phase) == 0:
                pass
            ktile_mma(smem, acc, desc_a0, desc_b0, uint64((s * STAGE_B) >> 4), i > 0)
            wgmma_wait_group(1)
            if i > 0 and lane == 0:
                mbarrier_arrive(bars, FULL0 + STAGES + prev)
            prev = s
            s += 1
            if s == STAGES:
                s = 0
                phase ^= uint32(1)
        epilogue(out, parts, acc, tid, row0, col0, n0, m0, nt, od, nsl, roff, coff, cvec)

    return gemm_kernel


def c_vectors(out, target) -> int:
    """1 when every row of ``out`` and of the split target ``target`` (2-D f32, C-contiguous) starts on a 16-byte
    boundary, so `c_tile_store` may write them 16 bytes at a time; else 0 (4-byte stores)."""
    return int(all(x.shape[1] % 4 == 0 and device_address(x) % 16 == 0 for x in (out, target)))



MAPS: dict = {}


def tensor_map(x, box_rows: int):
    """The tensor map of f16 matrix ``x`` for boxes of ``box_rows`` x 64 (`kernels.ptx.tma.tensor_map_2d`), made once
    per (address, shape, box) and kept: a map is device memory written from the host, which a CUDA graph capture
    cannot do, so the eager run before a capture (the engine's first prefill of a length, the harness's warm-up)
    makes the maps the captured launches use. A buffer freed and reallocated at the same address with the same
    shape has the same map."""
    key = (device_address(x), tuple(x.shape), box_rows)
    tmap = MAPS.get(key)
    if tmap is None:
        tmap = MAPS[key] = tensor_map_2d(x, box_rows)
    return tmap


def no_map():
    """The placeholder map arguments of the kernels that do not use TMA."""
    tmap = MAPS.get(None)
    if tmap is None:
        tmap = MAPS[None] = cuda.to_device(np.zeros(MAP_WORDS, np.uint64))
    return tmap
