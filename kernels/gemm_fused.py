"""The prefill GEMM with the weight dequantized inside it: ``C[nt, od] = A[nt, id] · dequant(W)[od, id]^T``.

`kernels.gemm_f16`'s STAGING=tma kernel (a TMA producer warp, two wgmma consumer warpgroups, a ring of 128-byte
swizzled shared tiles) whose B tiles are made in shared memory from the weight's GGUF blocks instead of copied from
an f16 copy of the weight: the weight crosses device memory at its quantized size (4.5 bits a weight for Q4_K
against 16) and no f16 copy of it exists (the prefill's planned ``W16=fused``).

* Producer warp (lane 0), k tile i: the raw boxes of tile i into raw slot i % RAW (per 64 weight rows a box of the
  rows' 16-byte block headers and a box of their 32 qs bytes of the tile, TMA on byte tensor maps; rfull / rempty
  mbarriers), then the A box into ring slot i % STAGES (full / empty mbarriers, as STAGING=tma).
* Consumers: consumer thread t owns B row t (TM is at most the consumer threads in every geometry). Before the
  wgmma batch of tile i, a named barrier over the consumer threads (the producer warp never joins it) makes every
  row of tile i visible; the batch is issued, and while the tensor cores run it each thread dequantizes its row of
  tile i + 1 from the raw slot into the next ring slot (swizzled: chunk c of row r at chunk c ^ (r & 7) of its
  128-byte row, the TMA's 128-byte swizzle), frees the raw slot (one arrival a warp) and fences its stores for
  wgmma's async proxy (``fence.proxy.async.shared::cta``). Tile i + 1's slot was last read by batch i + 1 - STAGES,
  and every warpgroup has finished batch i - 2 when it passes the barrier of tile i (``wgmma.wait_group 1`` before
  it): STAGES >= 3.
* Arithmetic, two weights an instruction: `prmt` puts two 4-bit codes under the f16 exponent of 1024, `sub.rn.f16x2`
  removes the 1024 exactly, `fma.rn.f16x2` applies the sub-block's scale d·sc and min -dmin·m (float32 products
  as gguf-py, rounded to f16). A weight differs from `kernels.quant`'s (gguf-py's float32, rounded once) by at most
  about an f16 ulp of |q·d·sc| + |dmin·m| (where the two terms cancel, by many ulps of the small weight); the C of
  a 3584-wide product is within ~4e-4 relative of float64.
* Weights made of several tensors stacked along od (q|k|v, gate|up) are up to three segments of one format, each
  its own device array: rows below ``e0`` read segment 0, below ``e1`` segment 1, the rest segment 2; boundaries
  fall on 64-row boxes. Rows past od are zeros (no box brings them; a zero header dequantizes to zeros); GGUF
  k-quant rows are whole 256-weight blocks, so k needs no tail. Split-K plans as `kernels.gemm_f16`.

Formats (`FUSED_TYPES`): Q4_K (ggml-common.h ``block_q4_K``: d f16 | dmin f16 | scales[12] | qs[128], 144 bytes; a
64-wide k tile is qs group g = k/64 % 4: low nibbles of its 32 bytes for the first 32 weights, high for the next
32, scales of sub-blocks 2g and 2g+1 as ggml's ``get_scale_min_k4``).

Sources: CUTLASS sm90 warp-specialized GEMM and its mixed-input (converting) mainloop; PTX ISA §9.7.13.15
(mbarrier), §9.7.12.15.21 (fence.proxy.async), §9.7.15 (wgmma), §9.7.8.7 (prmt), §9.7.4 (half precision); gguf-py
``quants.py`` (Q4_K).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import cuda, float32, types, uint32, uint64

from kernels import gemm_f16, gemm_tiles, gemm_tma
from kernels.errors import KernelConstraintError
from kernels.gemm_f16 import Geometry, geometry
from kernels.gemm_f16_config import TMA_ONLY_TM
from kernels.ptx import SIMULATOR, bar_sync, fma_f16x2, ld_shared_v4_b32, prmt_b32, st_shared_v4_b32, sub_f16x2, syncwarp
from kernels.ptx.bulk import mbarrier_arrive, mbarrier_arrive_expect_tx, mbarrier_init, mbarrier_try_wait_parity
from kernels.ptx.tma import MAP_WORDS, cp_async_bulk_tensor_2d_g2s, device_address, tensor_map_bytes_2d
from kernels.ptx.wgmma import SWIZZLE_128B, fence_proxy_async_shared, wgmma_desc, wgmma_wait_group
from kernels.quant.bits import f16x2_bits, f32_from_bits, f32_from_f16_bits, fmul_rn, fsub_rn
from kernels.specialize import H200_SMEM_OPTIN, KernelCache, is_contiguous

FUSED_TYPES = ("Q4_K",)
"""Weight formats the fused GEMM dequantizes."""
BLOCK_WEIGHTS = 256
BLOCK_BYTES = {"Q4_K": 144}
MAX_SEGMENTS = 3
BOX_ROWS = 64
"""Weight rows a raw box copy carries; segment boundaries inside a weight are multiples of it."""
RAW_ROW_BYTES = 48
"""Bytes of one Q4_K row for one 64-wide k tile: the 16-byte header (d, dmin, scales) and 32 bytes of qs."""
MAX_RAW = 8
"""Most raw slots (more measured no faster: the raw boxes are not what the kernel waits for)."""
F16_HI_BYTES = 0x64646464  # prmt's second source: 0x64, the high byte of f16 1024.0 (0x6400), under each code byte
F16_1024X2 = 0x64006400


@dataclass(frozen=True)
class FusedGeometry:
    """The gemm_f16 geometry of the knobs plus the weight format: the compile key of one fused kernel."""

    base: Geometry
    qtype: str
    raw: int  # slots of the raw ring (each the blocks' bytes of one k tile of the TM rows)

    @property
    def threads(self) -> int:
        return self.base.threads

    @property
    def raw_slot_bytes(self) -> int:
        return self.base.tm * RAW_ROW_BYTES

    @property
    def smem_bytes(self) -> int:
        """The f16 ring and its two barriers a stage (the STAGING=tma kernel's), then the raw ring and its two."""
        return self.base.smem_bytes + self.raw * (self.raw_slot_bytes + 16)


def fused_geometry(config: dict | None, qtype: str, accumulate: bool = False) -> FusedGeometry:
    """The FusedGeometry of gemm_f16 knobs ``config`` for weights of ``qtype``: the raw ring gets the slots (up to
    `MAX_RAW`) that fit beside the f16 ring in the H200's 227 KB. KernelConstraintError (one line) for a format
    without a dequantizer or knobs the fused kernel does not take (it is the STAGING=tma kernel: MMA=wgmma, KS=64,
    LOOP=pipe; and STAGES >= 3, TM 64, 128 or 256). ``accumulate``: with the residual epilogue (`kernels.gemm_f16.geometry`)."""
    if qtype not in FUSED_TYPES:
        raise KernelConstraintError(f"gemm_fused: weights of type {qtype} have no dequantizer in the fused GEMM; "
                                    f"types: {', '.join(FUSED_TYPES)}")
    g = geometry(config, accumulate=accumulate)
    if g.tm in TMA_ONLY_TM:
        raise KernelConstraintError(f"gemm_fused: TM={g.tm} has no fused B producer (its dequantizing threads and "
                                    f"header boxes are laid out for TM 64, 128 or 256); use TM=128 or 256")
    if g.staging != "tma" or g.stages < 3:
        raise KernelConstraintError(f"gemm_fused needs STAGING=tma (the default) and STAGES >= 3 (tile i + 1's B is "
                                    f"written while the batch of tile i - 1 may still read its slot; got STAGING="
                                    f"{g.staging}, STAGES={g.stages})")
    raw = min(MAX_RAW, (H200_SMEM_OPTIN - g.smem_bytes) // (g.tm * RAW_ROW_BYTES + 16))
    if raw < 2:
        raise KernelConstraintError(f"gemm_fused: STAGES={g.stages} leaves room for {raw} raw slots of "
                                    f"{g.tm * RAW_ROW_BYTES} bytes (needs 2); lower STAGES")
    return FusedGeometry(g, qtype, raw)


F32_2P23 = 0x4B000000  # f32 2^23: a byte under its exponent (prmt) is that integer plus 2^23, exactly


@cuda.jit(device=True, inline="always")
def q4_k_scales_mins(d, dmin, g, h0, h1, h2):
    """``(s_lo, m_lo, s_hi, m_hi)``, f16x2 (d * sc, d * sc) and (-dmin * m, -dmin * m) of Q4_K sub-blocks 2g (the
    low nibbles) and 2g + 1 (the high nibbles) of 64-weight group g, from scales[12] = words h0, h1, h2 (ggml's
    get_scale_min_k4: sub-block j < 4 takes scales[j] & 63 and scales[j + 4] & 63; j >= 4 the low / high nibble of
    scales[j + 4] under the top two bits of scales[j - 4] / scales[j]). The products in float32 as gguf-py, then
    rounded to f16. 32-bit byte arithmetic: both sub-blocks' four 6-bit codes gathered into one word (`prmt_b32`),
    each turned into float32 under the exponent of 2^23 (exact) rather than by an integer conversion."""
    b = 0x2222 * (g & 1)  # bytes 2 (g % 2) and 2 (g % 2) + 1 of a scales word
    a = prmt_b32(h0, h1, 0x5410 + b)  # scales[2g'], scales[2g' + 1], scales[2g' + 4], scales[2g' + 5]
    if g < 2:
        codes = a & 0x3F3F3F3F
    else:
        e = prmt_b32(h2, h2, 0x1010 + b)  # scales[2g' + 8], scales[2g' + 9], the same again
        codes = (e & 0x00000F0F) | ((e >> 4) & 0x0F0F0000) | ((a >> 2) & 0x30303030)
    sc_lo = fsub_rn(f32_from_bits(prmt_b32(codes, F32_2P23, 0x7540)), float32(8388608.0))
    sc_hi = fsub_rn(f32_from_bits(prmt_b32(codes, F32_2P23, 0x7541)), float32(8388608.0))
    m_lo = fsub_rn(f32_from_bits(prmt_b32(codes, F32_2P23, 0x7542)), float32(8388608.0))
    m_hi = fsub_rn(f32_from_bits(prmt_b32(codes, F32_2P23, 0x7543)), float32(8388608.0))
    s_lo, s_hi = fmul_rn(d, sc_lo), fmul_rn(d, sc_hi)
    n_lo, n_hi = fmul_rn(-dmin, m_lo), fmul_rn(-dmin, m_hi)
    return f16x2_bits(s_lo, s_lo), f16x2_bits(n_lo, n_lo), f16x2_bits(s_hi, s_hi), f16x2_bits(n_hi, n_hi)


@cuda.jit(device=True, inline="always")
def q4_k_pair(x, s2, m2):
    """Two weights as f16x2 from ``x``, two 4-bit codes under the f16 exponent of 1024 (`prmt_b32` with
    `F16_HI_BYTES`): ``(x - 1024) * s2 + m2`` with the sub-block's `q4_k_scales_mins` pair (f16x2 sub and fma, .rn)."""
    return fma_f16x2(sub_f16x2(x, F16_1024X2), s2, m2)


def _q4_k_row(TM: int):
    """``row(smem, raw_at, at, r, kt, valid)``, the Q4_K dequantizer: row r's 64 weights of k tile kt, read from the
    raw slot at element ``raw_at`` (the row's 16-byte header d|dmin|scales[12] at r * 16 bytes, its 32 qs bytes of
    group g = kt % 4 after the slot's TM headers), written as f16 into the swizzled B tile at element ``at``; zeros
    when not ``valid`` (a row past od: no box brought it, and a zero header dequantizes to zeros). The qs are read
    16 bytes at a time, each feeding the low-nibble chunks and the high-nibble chunks it holds, so few words are
    live beside the accumulators."""
    QS = TM * 16 // 2  # elements from a raw slot's headers to its qs
    pair, scales_mins = q4_k_pair, q4_k_scales_mins

    @cuda.jit(device=True, inline="always")
    def chunk(smem, at, r, c, s2, m2, lo, hi):
        st_shared_v4_b32(smem, at + r * 64 + ((c ^ (r & 7)) << 3),
                         pair(prmt_b32(lo, F16_HI_BYTES, 0x4140), s2, m2), pair(prmt_b32(lo, F16_HI_BYTES, 0x4342), s2, m2),
                         pair(prmt_b32(hi, F16_HI_BYTES, 0x4140), s2, m2), pair(prmt_b32(hi, F16_HI_BYTES, 0x4342), s2, m2))

    @cuda.jit(device=True, inline="always")
    def row(smem, raw_at, at, r, kt, valid):
        h = ld_shared_v4_b32(smem, raw_at + r * 8)
        w0 = h[0] if valid else uint32(0)
        d = f32_from_f16_bits(w0 & 0xFFFF)
        dmin = f32_from_f16_bits(w0 >> 16)
        lo_s, lo_m, hi_s, hi_m = scales_mins(d, dmin, kt & 3, h[1], h[2], h[3])  # low nibbles: chunks 0-3, high 4-7
        for q in range(2):  # qs bytes 16 q .. 16 q + 15: chunks 2q, 2q + 1 and 2q + 4, 2q + 5
            x = ld_shared_v4_b32(smem, raw_at + QS + r * 16 + q * 8)
            chunk(smem, at, r, 2 * q, lo_s, lo_m, x[0] & 0x0F0F0F0F, x[1] & 0x0F0F0F0F)
            chunk(smem, at, r, 2 * q + 1, lo_s, lo_m, x[2] & 0x0F0F0F0F, x[3] & 0x0F0F0F0F)
            chunk(smem, at, r, 2 * q + 4, hi_s, hi_m, (x[0] >> 4) & 0x0F0F0F0F, (x[1] >> 4) & 0x0F0F0F0F)
            chunk(smem, at, r, 2 * q + 5, hi_s, hi_m, (x[2] >> 4) & 0x0F0F0F0F, (x[3] >> 4) & 0x0F0F0F0F)

    return row


def producer(TM: int, KS: int, STAGES: int, RAW: int, RAW0: int, FULL0: int, CONSUMER_WARPS: int, BLOCK: int,
             A_BYTES: int, SLOT_E: int, GLU: bool = False):
    """``(init_barriers(bars), produce(smem, bars, rmap, amap, kt0, ktiles, m0, n0, od, e0, e1))``: the barriers and
    the producer warp's lane 0 of the fused kernels (this module's and `kernels.gemm_fused_regs`'s).

    Barriers (uint64 indices of ``bars``): full[s] at ``FULL0 + s`` and empty[s] at ``FULL0 + STAGES + s`` for the
    activation ring's STAGES slots, rfull[j] at ``FULL0 + 2 STAGES + j`` and rempty[j] after them for the RAW raw
    slots; a full barrier takes 1 arrival (the producer's expect-tx) plus the bytes, an empty one an arrival from
    each of the CONSUMER_WARPS warps. ``init_barriers`` (thread 0, before the block's syncthreads) initialises them
    and fences them for the copy engine.

    ``produce``, the block's k tile i (k tile ``kt0 + i`` of the weight) for i < ktiles: wait for rempty, arm rfull
    and copy the tile's header and qs boxes of every 64-row box of the TM rows at weight row m0 below od into raw
    slot i % RAW (elements ``RAW0 + slot * TM * 24`` of the f16 shared array: the TM 16-byte headers, then the TM
    32-byte qs runs of the tile's 64-weight group, row-major; rows below e0 from segment 0's maps in ``rmap``, below
    e1 segment 1's, the rest segment 2's, `raw_maps`; ``BLOCK`` the format's block bytes); then wait for empty, arm
    full with ``A_BYTES`` and copy the activation box (rows n0.., ``amap``) to element ``s * SLOT_E`` of ring slot s
    = i % STAGES. GLU (a gate|up weight of od = 2 ffn rows): the tile's first TM / 2 rows are gate rows m0 / 2 ..,
    its last TM / 2 the up rows od / 2 + m0 / 2 .. (every box copied; rows past a segment's end come as zeros)."""
    EMPTY0 = FULL0 + STAGES
    RFULL0 = FULL0 + 2 * STAGES
    REMPTY0 = RFULL0 + RAW
    raw_slot = TM * RAW_ROW_BYTES // 2
    QS = TM * 16 // 2
    BOX_HDR = BOX_ROWS * 16 // 2  # elements of one header box / one qs box
    BOX_QS = BOX_ROWS * 32 // 2
    NBOX = TM // BOX_ROWS
    BOX_BYTES = BOX_ROWS * RAW_ROW_BYTES

    @cuda.jit(device=True, inline="always")
    def init_barriers(bars):
        for s in range(STAGES):
            mbarrier_init(bars, FULL0 + s, 1)
            mbarrier_init(bars, EMPTY0 + s, CONSUMER_WARPS)
        for j in range(RAW):
            mbarrier_init(bars, RFULL0 + j, 1)
            mbarrier_init(bars, REMPTY0 + j, CONSUMER_WARPS)
        fence_proxy_async_shared()  # the copy engine completes bytes on the barriers: it must see them initialised

    @cuda.jit(device=True, inline="always")
    def issue_raw(smem, bars, rmap, slot, kt, m0, od, e0, e1):
        boxes = NBOX if GLU else min(NBOX, (od - m0 + BOX_ROWS - 1) // BOX_ROWS)
        mbarrier_arrive_expect_tx(bars, RFULL0 + slot, boxes * BOX_BYTES)
        at = RAW0 + slot * raw_slot
        col = (kt >> 2) * BLOCK
        for j in range(NBOX):
            first = m0 + j * BOX_ROWS  # the box's first weight row
            if GLU:
                first = m0 // 2 + (j % (NBOX // 2)) * BOX_ROWS + (j // (NBOX // 2)) * (od // 2)
            if first < od:
                seg = 0
                local = first
                if first >= e1:
                    seg = 2
                    local = first - e1
                elif first >= e0:
                    seg = 1
                    local = first - e0
                cp_async_bulk_tensor_2d_g2s(smem, at + j * BOX_HDR, rmap, 32 * seg, col, local, bars, RFULL0 + slot)
                cp_async_bulk_tensor_2d_g2s(smem, at + QS + j * BOX_QS, rmap, 32 * seg + 16, col + 16 + 32 * (kt & 3),
                                            local, bars, RFULL0 + slot)

    @cuda.jit(device=True, inline="always")
    def produce(smem, bars, rmap, amap, kt0, ktiles, m0, n0, od, e0, e1):
        s = 0
        phase = uint32(0)
        rs = 0
        rphase = uint32(0)
        for i in range(ktiles):
            while mbarrier_try_wait_parity(bars, REMPTY0 + rs, rphase ^ uint32(1)) == 0:
                pass
            issue_raw(smem, bars, rmap, rs, kt0 + i, m0, od, e0, e1)
            while mbarrier_try_wait_parity(bars, EMPTY0 + s, phase ^ uint32(1)) == 0:
                pass
            mbarrier_arrive_expect_tx(bars, FULL0 + s, A_BYTES)
            cp_async_bulk_tensor_2d_g2s(smem, s * SLOT_E, amap, 0, (kt0 + i) * KS, n0, bars, FULL0 + s)
            s += 1
            if s == STAGES:
                s = 0
                phase ^= uint32(1)
            rs += 1
            if rs == RAW:
                rs = 0
                rphase ^= uint32(1)

    return init_barriers, produce


def _make_kernel(fg: FusedGeometry):
    """The fused kernel for one geometry (see the module docstring): `kernels.gemm_f16`'s STAGING=tma tiles,
    descriptors, wgmma batches and epilogue, with the B tiles dequantized by the consumers."""
    g = fg.base
    TM, TN, KS, STAGES, GROUP, RAW = g.tm, g.tn, g.ks, g.stages, g.group, fg.raw
    ROWB = KS * 2
    WG_N, WTN, MT64, N, NH, ACC_N = gemm_tiles.warpgroup_split(g)
    SBO = 8 * ROWB
    LBO = 16
    A_ELEMS = TN * KS
    A_BYTES = A_ELEMS * 2
    STAGE_ELEMS = (TN + TM) * KS
    STAGE_B = STAGE_ELEMS * 2
    SA_B = TN * ROWB
    RAW0 = STAGES * STAGE_ELEMS  # element offset of the raw ring
    RAW_SLOT = fg.raw_slot_bytes // 2  # elements a raw slot
    FULL0 = (STAGES * STAGE_B + RAW * fg.raw_slot_bytes) // 8  # full[s], empty[s], rfull[j], rempty[j]
    EMPTY0 = FULL0 + STAGES
    RFULL0 = FULL0 + 2 * STAGES
    REMPTY0 = RFULL0 + RAW
    CONSUMERS = 32 * g.warps
    CONSUMER_WARPS = g.warps
    assert TM <= CONSUMERS  # gemm_f16's geometry: 8 warps whenever TM * TN > 64 * 128
    K16 = KS // 16
    M64_B = 64 * ROWB
    BLOCK = BLOCK_BYTES[fg.qtype]
    block_work = gemm_tiles.split_work(TN, TM, GROUP, g.nocall)
    k_range = gemm_tiles.k_range(KS, g.nocall)
    assert gemm_tiles.c_tile_bytes(TN, TM) <= STAGES * STAGE_B  # the staged C tile fits the f16 ring (STAGES >= 3)
    STAGED = g.epi == "staged"
    epilogue = gemm_tiles.consumer_epilogue(MT64, N, TN, TM, CONSUMERS, STAGED, ACCUMULATE=g.accumulate)
    ktile_mma = gemm_tiles.ktile_mma(K16, MT64, NH, N, M64_B)
    row = _q4_k_row(TM)
    SMEM_ALIGN = None if SIMULATOR else 1024

    init_barriers, produce = producer(TM, KS, STAGES, RAW, RAW0, FULL0, CONSUMER_WARPS, BLOCK, A_BYTES, STAGE_ELEMS)

    @cuda.jit(device=True, inline="always")
    def dequant(smem, bars, i, kt, tid, lane, valid):
        """Consumer thread tid's B row of k tile i (ring slot i % STAGES) from raw slot i % RAW: wait for the raw
        boxes, dequantize the rows into the slot, free the raw slot (one arrival a warp), fence the stores for
        wgmma."""
        rs = i % RAW
        while mbarrier_try_wait_parity(bars, RFULL0 + rs, uint32((i // RAW) & 1)) == 0:
            pass
        raw_at = RAW0 + rs * RAW_SLOT
        at = (i % STAGES) * STAGE_ELEMS + A_ELEMS
        if tid < TM:
            row(smem, raw_at, at, tid, kt, valid)
        syncwarp()  # the warp's raw reads are done: its lane 0 frees the raw slot
        if lane == 0:
            mbarrier_arrive(bars, REMPTY0 + rs)
        fence_proxy_async_shared()

    def gemm_kernel(a, rmap, e0, e1, out, parts, nt, od, kdim, whole, count, amap, cvec):
        smem = cuda.shared.array(0, types.float16, alignment=SMEM_ALIGN)
        bars = cuda.shared.array(0, types.uint64)
        tid = cuda.threadIdx.x
        n0, m0, sl, nsl, roff, coff = block_work(cuda.blockIdx.x, nt, od, whole, count, 0, od)
        kt0, ktiles = k_range(kdim, sl, nsl)
        if tid == 0:
            init_barriers(bars)
        cuda.syncthreads()

        if tid >= CONSUMERS:  # the producer warp: lane 0 issues the raw boxes and the A box of every k tile
            if tid == CONSUMERS:
                produce(smem, bars, rmap, amap, kt0, ktiles, m0, n0, od, e0, e1)
            return

        wg = tid >> 7
        row0 = (wg % WG_N) * WTN
        col0 = (wg // WG_N) * N
        lane = tid & 31
        valid = m0 + tid < od
        acc = cuda.local.array(ACC_N, float32)
        desc_a0 = wgmma_desc(smem, row0 * ROWB, LBO, SBO, SWIZZLE_128B)
        desc_b0 = wgmma_desc(smem, SA_B + col0 * ROWB, LBO, SBO, SWIZZLE_128B)
        dequant(smem, bars, 0, kt0, tid, lane, valid)
        s = 0
        prev = 0
        phase = uint32(0)
        for i in range(ktiles):
            bar_sync(1, CONSUMERS)  # every consumer's B rows of tile i are in (and fenced)
            while mbarrier_try_wait_parity(bars, FULL0 + s, phase) == 0:
                pass
            ktile_mma(smem, acc, desc_a0, desc_b0, uint64((s * STAGE_B) >> 4), i > 0)
            if i + 1 < ktiles:  # tile i + 1's B while the tensor cores run tile i
                dequant(smem, bars, i + 1, kt0 + i + 1, tid, lane, valid)
            wgmma_wait_group(1)
            if i > 0 and lane == 0:
                mbarrier_arrive(bars, EMPTY0 + prev)
            prev = s
            s += 1
            if s == STAGES:
                s = 0
                phase ^= uint32(1)
        epilogue(out, parts, acc, tid, row0, col0, n0, m0, nt, od, nsl, roff, coff, cvec)

    return gemm_kernel


SIGNATURE = types.void(types.float16[::1], types.uint64[::1], types.int64, types.int64, types.float32[:, ::1],
                       types.float32[:, ::1], types.int64, types.int64, types.int64, types.int64, types.int64,
                       types.uint64[::1], types.int64)
_CACHE = KernelCache("gemm_fused", SIGNATURE)


def kernel_ptx(config: dict | None, qtype: str, cc=(9, 0, "a")) -> str:
    """PTX of the fused kernel for gemm_f16 knobs ``config`` and weights of ``qtype`` (NVVM, sm_90a by default; no
    GPU needed; not under the simulator)."""
    fg = fused_geometry(config, qtype)
    ptx, _ = cuda.compile_ptx(_make_kernel(fg), SIGNATURE, cc=cc, launch_bounds=(fg.threads,))
    return ptx


def build(config: dict | None, qtype: str, accumulate: bool = False):
    """Compile (once per knobs, format and ``accumulate``, the residual epilogue; cached) and return the fused kernel
    (`kernels.specialize.BuiltKernel`)."""
    fg = fused_geometry(config, qtype, accumulate)
    return _CACHE.get(fg, _make_kernel, fg.smem_bytes, fg.threads, hint="lower TM/TN/STAGES")


def check_segments(a, segments, qtype: str, out=None) -> tuple[int, int, int]:
    """Validate the operands of `gemm_fused`; return (nt, od, id). One-line KernelConstraintError saying what is
    expected."""
    if qtype not in FUSED_TYPES:
        raise KernelConstraintError(f"gemm_fused: weights of type {qtype} have no dequantizer in the fused GEMM; "
                                    f"types: {', '.join(FUSED_TYPES)}")
    if getattr(a, "ndim", None) != 2 or np.dtype(a.dtype) != np.float16 or not is_contiguous(a):
        raise KernelConstraintError(f"gemm_fused: a must be a C-contiguous 2-D float16 device array, got "
                                    f"{getattr(a, 'dtype', None)} {tuple(getattr(a, 'shape', ()))}")
    nt, kdim = a.shape
    if kdim <= 0 or kdim % BLOCK_WEIGHTS or nt == 0:
        raise KernelConstraintError(f"gemm_fused: id must be a positive multiple of {BLOCK_WEIGHTS} ({qtype} rows are "
                                    f"whole blocks) and nt > 0, got a [{nt}, {kdim}]")
    if not 1 <= len(segments) <= MAX_SEGMENTS:
        raise KernelConstraintError(f"gemm_fused: 1 to {MAX_SEGMENTS} weight segments, got {len(segments)}")
    row_bytes = kdim // BLOCK_WEIGHTS * BLOCK_BYTES[qtype]
    od = 0
    for i, (raw, rows) in enumerate(segments):
        if (getattr(raw, "ndim", None) != 1 or np.dtype(raw.dtype) != np.uint8 or not is_contiguous(raw)
                or not isinstance(rows, (int, np.integer)) or rows < 1 or raw.shape[0] != rows * row_bytes):
            raise KernelConstraintError(
                f"gemm_fused: segment {i} must be the {rows} x {row_bytes} bytes of a {qtype} [{rows}, {kdim}] weight "
                f"(a whole number of rows) as a contiguous 1-D uint8 device array, got {getattr(raw, 'dtype', None)} "
                f"{tuple(getattr(raw, 'shape', ()))}")
        if i and od % BOX_ROWS:
            raise KernelConstraintError(f"gemm_fused: segment {i} starts at row {od}; segments after the first must "
                                        f"start at a multiple of {BOX_ROWS} rows")
        od += int(rows)
    if out is not None and (tuple(out.shape) != (nt, od) or np.dtype(out.dtype) != np.float32
                            or not is_contiguous(out)):
        raise KernelConstraintError(f"gemm_fused: out must be a C-contiguous float32 [{nt}, {od}] array, got "
                                    f"{out.dtype} {tuple(out.shape)}")
    return nt, od, kdim


def gemm_fused(a, segments, qtype: str, out=None, *, config: dict | None = None, stream=0, partials=None,
               accumulate: bool = False):
    """Enqueue ``C[nt, od] = A[nt, id] · dequant(W)[od, id]^T`` on ``stream`` and return C (f32 device array);
    with ``accumulate``, ``out +=`` the product (as `kernels.gemm_f16.gemm_f16`'s).

    a: f16 device array [nt, id], row-major. segments: [(raw, rows), ...], 1 to 3 weights of format ``qtype``
    stacked along od (od = the rows' sum): raw is one tensor's GGUF blocks (uint8 device array [rows * id / 256 *
    block bytes], row-major). out: f32 [nt, od] (allocated when None). config: `kernels.gemm_f16` knobs (the
    STAGING=tma kernel's, STAGES >= 3; SPLITK plans and partials as there). Needs an sm_90a device.

    The weights are dequantized in f16 arithmetic (module docstring): C is within ~1e-3 relative of A times the
    f16 dequantization (`kernels.quant.dequantize`), not bit-identical to `kernels.gemm_f16` on it. Raises
    KernelConstraintError (one line) for a format without a dequantizer (`FUSED_TYPES`), id not a multiple of 256,
    segments of the wrong size or not starting on 64-row boxes, a wrong out or partials, or knobs the kernel does
    not take, or accumulate without out.
    """
    if accumulate and out is None:
        raise KernelConstraintError("gemm_fused: accumulate adds the product to out; pass the f32 [nt, od] array")
    plan, parts, out = _launch(a, segments, qtype, out, config, stream, partials, accumulate)
    gemm_f16.sum_parts(plan, parts, out, geometry(config), stream, accumulate)
    return out


def gemm_fused_split(a, segments, qtype: str, out=None, *, config: dict | None = None, stream=0, partials=None):
    """`gemm_fused` leaving the slices of an all-split plan unsummed: ``(parts, count)`` as
    `kernels.gemm_f16.gemm_f16_split`. Arguments and errors as `gemm_fused`."""
    plan, parts, out = _launch(a, segments, qtype, out, config, stream, partials)
    if plan.whole == 0 and plan.slices > 1:
        return parts, plan.slices
    gemm_f16.sum_parts(plan, parts, out, geometry(config), stream)
    nt, od = out.shape
    return out.reshape(nt * od), 1


def check_on_device(segments) -> None:
    """KernelConstraintError (one line) when a segment's bytes are a host array."""
    for i, (raw, _) in enumerate(segments):
        if isinstance(raw, np.ndarray) if SIMULATOR else not cuda.is_cuda_array(raw):
            raise KernelConstraintError(f"gemm_fused: segment {i} is a host array; pass the weight's bytes on the device")


def _launch(a, segments, qtype, out, config, stream, partials, accumulate: bool = False):
    """Enqueue the fused kernel (``accumulate``: with the residual epilogue) with its split plan; return (plan, the flat
    partials used or None, out)."""
    nt, od, kdim = check_segments(a, segments, qtype, out)
    check_on_device(segments)
    if out is None:
        out = cuda.device_array((nt, od), dtype=np.float32, stream=stream)
    built = build(config, qtype, accumulate)
    g = built.geometry.base
    plan = gemm_f16.split_plan(config, nt, od, kdim)
    parts, target = gemm_f16.split_target(plan, g, nt, od, out, partials, stream)
    ends = np.cumsum([rows for _, rows in segments]).tolist() + [od] * MAX_SEGMENTS
    fg = built.geometry
    built.kernel[plan.blocks(g.grid(nt, od)), fg.threads, stream, fg.smem_bytes](
        a.reshape(nt * kdim), raw_maps(segments, kdim // BLOCK_WEIGHTS * BLOCK_BYTES[qtype]), ends[0], ends[1], out,
        target, nt, od, kdim, plan.whole, plan.slices, gemm_tma.tensor_map(a, g.tn), gemm_tma.c_vectors(out, target))
    return plan, parts, out


def raw_maps(segments, row_bytes: int):
    """The raw producer's tensor maps, one uint64 device array: for segment i, words 32 i .. 32 i + 15 map its
    header boxes (`BOX_ROWS` rows x 16 bytes), the next 16 its qs boxes (x 32 bytes), over the segment's bytes as a
    [rows, row_bytes] uint8 matrix (`kernels.ptx.tma.tensor_map_bytes_2d`). Made once per segment list and kept,
    as `kernels.gemm_tma.MAPS` (the eager run before a capture makes them)."""
    key = ("raw",) + tuple((device_address(raw), int(rows), row_bytes) for raw, rows in segments)
    maps = gemm_tma.MAPS.get(key)
    if maps is None:
        words = []
        for raw, rows in segments:
            matrix = raw.reshape(int(rows), row_bytes)
            words += [tensor_map_bytes_2d(matrix, BOX_ROWS, 16).copy_to_host(),
                      tensor_map_bytes_2d(matrix, BOX_ROWS, 32).copy_to_host()]
        words += words[:2] * (MAX_SEGMENTS - len(segments))
        maps = gemm_tma.MAPS[key] = cuda.to_device(np.concatenate(words).astype(np.uint64))
        assert maps.shape[0] == 2 * MAP_WORDS * MAX_SEGMENTS
    return maps
