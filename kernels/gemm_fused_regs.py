"""The fused-dequantization GEMM with the weight as wgmma's register operand: ``C[nt, od] = A[nt, id] · dequant(W)[od,
id]^T`` computed as ``C^T = dequant(W) · A^T``.

The weight crosses device memory at its quantized size and no f16 copy of it exists (the engine's PFUSED; the
formats, their arithmetic and the raw producer are `kernels.gemm_fused`'s). The operands are swapped, as CUTLASS's
sm90 mixed-input GEMM does: the weight is wgmma's A operand, which may come from registers, so a consumer thread
dequantizes its own A fragment and hands it to the tensor cores directly: no f16 weight tile in shared memory, no
proxy fence and no barrier between the consumers (the B-producer form, which had all three, lost its A/Bs to this
one and was deleted: ledger #405, #415, #416); the activations are the shared-memory B operand, copied by TMA as
the f16 GEMM's A.

* Tile: ``TM`` = 128 weight rows x TN tokens (gemm_f16's TN knob: 64, 128 or 256). Two consumer warpgroups, 64
  weight rows each, every token of the tile: a k16 step is one ``wgmma.m64nTNk16`` with A from registers
  (`wgmma_m64nNk16_f32_f16_rs`), TN / 2 f32 accumulators a thread. TN 64 and 128: one producer warp (lane 0) issues
  the copies; 288 threads. TN = 256 (the same A words serve twice the tokens: half the dequantization a FLOP) needs
  128 accumulators a thread, more than the 168 registers 9 warps leave with the A words: there the producer is a
  warpgroup (384 threads) that gives its registers away (``setmaxnreg.dec`` to `PRODUCER_REGS`) and the consumers
  take them (``setmaxnreg.inc`` to `CONSUMER_REGS`), as CUTLASS's warp-specialised kernels do; ptxas honours
  setmaxnreg only in a whole program, so that kernel is loaded through the driver's JIT
  (`kernels.jit.load_whole_program`).
* Producer, k tile i (64 weights): the raw boxes of the tile's 128 rows into raw slot i % RAW
  (`kernels.gemm_fused.producer`, rfull / rempty mbarriers), then the activation box (TN tokens x 64, the
  128-byte swizzle) into ring slot i % STAGES (full / empty mbarriers). With the producer warpgroup, its warps 1
  .. `CONVERTERS` then turn the slot's block headers into each row's f16x2 scales and minima in place (after rfull;
  their rready barrier), work the four consumer lanes sharing a row would otherwise each repeat between wgmma
  batches.
* Consumer thread (warpgroup w, warp q of it, lane l; g = l >> 2, t = l & 3), k tile i: wait for the activation
  slot, issue the four wgmma of the tile as one batch with the 16 A words made before, then make tile i + 1's
  while the tensor cores run it: wait for its raw slot (rfull, or rready with the converters), read rows r = 64 w
  + 16 q + g and r + 8 (16-byte header or converted scales, two 16-byte qs reads), free the slot (one arrival a
  warp), build the words (the mma.m16n8k16 A fragment: weights
  2t, 2t + 1 and 2t + 8, 2t + 9 of each row and k16 step) in other registers; then wait for the batch (its A
  registers are then free) and free the activation slot.
* Q4_K arithmetic of `kernels.gemm_fused` (`q4_k_low`, `q4_k_high`, `q4_k_scales_mins`): k16 steps 0 and 1
  take the low nibbles of qs bytes 2t, 2t + 1 | 2t + 8, 2t + 9 and 16 + the same, steps 2 and 3 their high nibbles;
  one `prmt` a byte pair (a per-lane selector over two qs words) places the pair at bytes 0 and 2 for both.
* Epilogue: the accumulators hold C^T; staged through the f32 C tile over the ring transposed
  (`gemm_tiles.c_tile_store` with TRANSPOSED) and stored 16 bytes a thread along C's rows; k slices of a split-K
  plan (`kernels.gemm_f16`'s SPLITK) to the partials, summed by gemm_f16's slice sum; the residual epilogue
  (``accumulate``: C += the product) as `kernels.gemm_f16.gemm_f16`'s. The SwiGLU epilogue (`gemm_fused_regs_glu`): the
  tile's halves are 64 gate rows and the same up rows, staged as `kernels.gemm_f16.gemm_f16_glu`'s C tile.

Sources: CUTLASS sm90 mixed-input GEMM (the narrow operand converted in registers as wgmma's A); PTX ISA §9.7.15.5
(wgmma.mma_async, register A fragments §9.7.15.5.1.1), §9.7.13.15 (mbarrier), §9.7.9.25.5.1 (cp.async.bulk.tensor);
ggml-common.h ``block_q4_K``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import cuda, float32, types, uint32, uint64

from kernels import gemm_f16, gemm_f16_config, gemm_fused, gemm_tiles, gemm_tma
from kernels.errors import KernelConstraintError
from kernels.gemm_f16_config import SplitPlan
from kernels.gemm_fused import BLOCK_BYTES, MAX_RAW, MAX_SEGMENTS, RAW_ROW_BYTES, q4_k_high, q4_k_low, q4_k_scales_mins
from kernels.ptx import (SIMULATOR, ld_shared_v4_b32, opaque_u32, prmt_b32, setmaxnreg_dec, setmaxnreg_inc,
                         st_shared_v4_b32, syncwarp)
from kernels.ptx.bulk import mbarrier_arrive, mbarrier_init, mbarrier_try_wait_parity
from kernels.ptx.wgmma import (SWIZZLE_128B, fence_proxy_async_shared, wgmma_commit_group, wgmma_desc, wgmma_fence,
                               wgmma_m64nNk16_f32_f16_rs, wgmma_wait_group)
from kernels.quant.bits import f32_from_f16_bits
from kernels.specialize import H200_SMEM_OPTIN, KernelCache

TM = 128
"""Weight rows a tile: two consumer warpgroups of 64 (wgmma's M)."""
KS = 64
CONSUMERS = 256
WARPGROUP_TN = 256
"""The tile width (tokens) whose producer is a warpgroup that hands its registers to the consumers."""
PRODUCER_REGS = 40
"""Registers a producer thread keeps at TN = `WARPGROUP_TN` (lane 0 only issues copies and waits on mbarriers)."""
CONSUMER_REGS = 232
"""Registers a consumer thread takes at TN = `WARPGROUP_TN`: 128 accumulators, 32 A words (this tile's and the
next's) and addressing. 128 x 40 + 256 x 232 = 64,512 of the SM's 65,536 (one block a SM: its shared memory)."""
CONVERTERS = 2
"""Warps of the producer warpgroup (TN = `WARPGROUP_TN`) that turn each raw slot's block headers into the rows'
f16x2 scales and minima (`kernels.gemm_fused.q4_k_scales_mins`) in place, so the consumers read them ready-made."""


@dataclass(frozen=True)
class RegsGeometry:
    """The compile key of one register-A fused kernel: the weight format, the activation ring's depth, the raw ring's
    slots, the tile order's group and NOCALL's 32-bit index division."""

    qtype: str
    tn: int  # tokens a tile: wgmma's N
    stages: int
    raw: int
    group: int
    nocall: bool
    accumulate: bool = False  # C += the product (the residual epilogue, as `kernels.gemm_f16`'s)
    glu: bool = False  # a gate|up weight: the tile's halves are 64 gate rows and their up rows; SwiGLU epilogue

    tm = TM
    raw_slot_bytes = TM * RAW_ROW_BYTES

    @property
    def warpgroup_producer(self) -> bool:
        """The producer is a warpgroup that gives its registers to the consumers (setmaxnreg; TN = 256)."""
        return self.tn == WARPGROUP_TN

    @property
    def threads(self) -> int:
        return CONSUMERS + (128 if self.warpgroup_producer else 32)

    @property
    def slot_bytes(self) -> int:
        return self.tn * KS * 2

    @property
    def ring_bytes(self) -> int:
        """The activation ring, or the staged C tile over it when that is larger."""
        return max(self.stages * self.slot_bytes, gemm_tiles.c_tile_bytes(self.tn, TM))

    @property
    def raw_barrier_bytes(self) -> int:
        """mbarrier bytes a raw slot takes: rfull and rempty, and rready where the producer warpgroup converts."""
        return 24 if self.warpgroup_producer else 16

    @property
    def smem_bytes(self) -> int:
        return self.ring_bytes + self.raw * (self.raw_slot_bytes + self.raw_barrier_bytes) + 16 * self.stages

    def grid(self, nt: int, od: int) -> int:
        """C tiles of a [nt, od] product."""
        return self.grid_of(self.tn, nt, od)

    @staticmethod
    def grid_of(tn: int, nt: int, od: int) -> int:
        return -(-nt // tn) * -(-od // TM)


def regs_geometry(config: dict | None, qtype: str, accumulate: bool = False, glu: bool = False) -> RegsGeometry:
    """The RegsGeometry of gemm_f16 knobs ``config`` for weights of ``qtype``: its TN (tokens a tile), STAGES, GROUP
    and NOCALL (the tile has 128 weight rows: TM, KS, MMA, STAGING, LOOP, EPI, AUTOTILE and NARROWTAIL do not apply)
    and the raw slots (up to `MAX_RAW`) that fit beside the ring in the H200's 227 KB. KernelConstraintError (one
    line) for a knob value gemm_f16 refuses or a format without a dequantizer. ``accumulate``: with the residual
    epilogue; ``glu``: the SwiGLU one (`gemm_fused_regs_glu`)."""
    if qtype not in gemm_fused.FUSED_TYPES:
        raise KernelConstraintError(f"gemm_fused_regs: weights of type {qtype} have no dequantizer in the fused GEMM; "
                                    f"types: {', '.join(gemm_fused.FUSED_TYPES)}")
    cfg = gemm_f16.resolve_config(config, fused_regs=True)
    base = RegsGeometry(qtype, cfg["TN"], cfg["STAGES"], 0, cfg["GROUP"], bool(cfg["NOCALL"]))
    raw = min(MAX_RAW, (H200_SMEM_OPTIN - base.smem_bytes) // (base.raw_slot_bytes + base.raw_barrier_bytes))
    return RegsGeometry(qtype, base.tn, base.stages, raw, base.group, base.nocall, accumulate, glu)


@cuda.jit(device=True, inline="always")
def _header_scales(h, valid, g):
    """(s_lo, m_lo, s_hi, m_hi) of a row's 16-byte Q4_K block header (words ``h``) for 64-weight group g
    (`q4_k_scales_mins`); zeros when not ``valid`` (a row past od, whose box may not have been copied)."""
    w0 = h[0] if valid else uint32(0)
    return q4_k_scales_mins(f32_from_f16_bits(w0 & 0xFFFF), f32_from_f16_bits(w0 >> 16), g, h[1], h[2], h[3])


def _a_words(converted: bool):
    """``row_words(smem, raw_at, r, kt, valid, sel)``: weight row r's eight A words of k tile kt (Q4_K), read from
    the raw slot at element ``raw_at`` (`kernels.gemm_fused.producer`'s layout): for k16 steps 0..3 the word of
    weights 2t, 2t + 1 (even positions of the tuple) and of 2t + 8, 2t + 9 (odd positions), low half the lower k.
    ``sel``: the lane's `prmt_b32` selector taking qs bytes 2t, 2t + 1 of a pair of words to bytes 0 and 2. Zeros
    when not ``valid`` (a row past od). ``converted``: the row's 16 header bytes already hold its f16x2 scales and
    minima (s_lo, m_lo, s_hi, m_hi; zeros for a row past od: the producer warpgroup's `CONVERTERS`), and ``valid``
    is not read; else the block header, decoded here."""
    QS = TM * 16 // 2  # elements from a raw slot's headers to its qs

    @cuda.jit(device=True, inline="always")
    def row_words(smem, raw_at, r, kt, valid, sel):
        h = ld_shared_v4_b32(smem, raw_at + r * 8)
        if converted:
            lo_s, lo_m, hi_s, hi_m = h[0], h[1], h[2], h[3]  # weights 0..31: low nibbles
        else:
            lo_s, lo_m, hi_s, hi_m = _header_scales(h, valid, kt & 3)
        x = ld_shared_v4_b32(smem, raw_at + QS + r * 16)  # qs bytes 0..15
        y = ld_shared_v4_b32(smem, raw_at + QS + r * 16 + 8)  # 16..31
        pa = prmt_b32(x[0], x[1], sel)  # bytes 2t, 2t + 1
        pb = prmt_b32(x[2], x[3], sel)  # 2t + 8, 2t + 9
        pc = prmt_b32(y[0], y[1], sel)  # 16 + 2t, ..
        pd = prmt_b32(y[2], y[3], sel)  # 24 + 2t, ..
        return (q4_k_low(pa, lo_s, lo_m), q4_k_low(pb, lo_s, lo_m), q4_k_low(pc, lo_s, lo_m), q4_k_low(pd, lo_s, lo_m),
                q4_k_high(pa, hi_s, hi_m), q4_k_high(pb, hi_s, hi_m), q4_k_high(pc, hi_s, hi_m),
                q4_k_high(pd, hi_s, hi_m))

    return row_words


def _make_kernel(rg: RegsGeometry):
    """The register-A fused kernel of one geometry (see the module docstring)."""
    TN, STAGES, RAW = rg.tn, rg.stages, rg.raw
    SLOT_B = rg.slot_bytes
    SLOT_E = SLOT_B // 2
    ROWB = KS * 2
    SBO = 8 * ROWB
    LBO = 16
    RAW0 = rg.ring_bytes // 2  # element offset of the raw ring, after the ring / C tile
    RAW_SLOT = rg.raw_slot_bytes // 2
    FULL0 = (rg.ring_bytes + RAW * rg.raw_slot_bytes) // 8  # full[s], empty[s], rfull[j], rempty[j]
    EMPTY0 = FULL0 + STAGES
    RFULL0 = FULL0 + 2 * STAGES
    REMPTY0 = RFULL0 + RAW
    RREADY0 = REMPTY0 + RAW  # with the producer warpgroup: the raw slot's headers are converted
    CONSUMER_WARPS = CONSUMERS // 32
    ACC = TN // 2
    BLOCK = BLOCK_BYTES[rg.qtype]
    block_work = gemm_tiles.split_work(TN, TM, rg.group, rg.nocall)
    k_range = gemm_tiles.k_range(KS, rg.nocall)
    GLU = rg.glu
    WARPGROUP = rg.warpgroup_producer
    init_barriers, produce = gemm_fused.producer(TM, KS, STAGES, RAW, RAW0, FULL0, CONSUMER_WARPS, BLOCK, SLOT_B,
                                                 SLOT_E, GLU)
    READY0 = RREADY0 if WARPGROUP else RFULL0  # what the consumers wait for before reading a raw slot
    CONVERT_ROWS = TM // (32 * CONVERTERS)
    row_words = _a_words(WARPGROUP)
    store_tile = gemm_tiles.c_tile_store(1, TN // 8, TN, TM, CONSUMERS, TRANSPOSED=True)
    if GLU:
        store_glu = gemm_tiles.c_tile_store_glu(1, TN // 8, TN, TM, CONSUMERS, rg.nocall, TRANSPOSED=True)

        @cuda.jit(device=True, inline="always")
        def store_whole(cs, out, acc, rl, cl, n0, m0, nt, od, cvec, tid):
            store_glu(cs, out, acc, rl, cl, n0, m0, nt, od, tid)
    else:
        store_c = gemm_tiles.c_tile_store(1, TN // 8, TN, TM, CONSUMERS, rg.accumulate, TRANSPOSED=True)

        @cuda.jit(device=True, inline="always")
        def store_whole(cs, out, acc, rl, cl, n0, m0, nt, od, cvec, tid):
            store_c(cs, out, acc, rl, cl, n0, m0, nt, od, 0, 0, cvec, tid)
    SMEM_ALIGN = None if SIMULATOR else 1024

    @cuda.jit(device=True, inline="always")
    def keep_words(w):
        """A use of the eight A words after the batch's wgmma.wait_group. The wgmma reads its A registers
        asynchronously (PTX ISA §9.7.15.5: writing them before the wait is undefined); without a later use LLVM
        ends their life at the wgmma and may compute the next tile's words into the same registers."""
        for j in range(8):
            opaque_u32(w[j])

    @cuda.jit(device=True, inline="always")
    def convert(smem, bars, kt0, ktiles, c, m0, od):
        """Converter thread c (0 .. 32 CONVERTERS - 1) of the producer warpgroup, every k tile: wait for the raw
        slot's bytes, replace rows c, c + 32 CONVERTERS, ..'s 16-byte block headers by their f16x2 (s_lo, m_lo, s_hi,
        m_hi) of the tile's group (`q4_k_scales_mins`; zeros for a row past od, whose box may not have been copied),
        fence those writes before the copy engine's next write to the slot (PTX ISA §9.7.12.15.21: generic then
        async proxy), and arrive on rready (one arrival a warp)."""
        rs = 0
        rph = uint32(0)
        for i in range(ktiles):
            while mbarrier_try_wait_parity(bars, RFULL0 + rs, rph) == 0:
                pass
            raw_at = RAW0 + rs * RAW_SLOT
            g = (kt0 + i) & 3
            for k in range(CONVERT_ROWS):
                r = c + 32 * CONVERTERS * k
                at = raw_at + r * 8
                valid = GLU or m0 + r < od  # GLU: every box is copied
                lo_s, lo_m, hi_s, hi_m = _header_scales(ld_shared_v4_b32(smem, at), valid, g)
                st_shared_v4_b32(smem, at, lo_s, lo_m, hi_s, hi_m)
            fence_proxy_async_shared()
            syncwarp()
            if (c & 31) == 0:
                mbarrier_arrive(bars, RREADY0 + rs)
            rs += 1
            if rs == RAW:
                rs = 0
                rph ^= uint32(1)

    @cuda.jit(device=True, inline="always")
    def tile_words(smem, bars, rs, rph, kt, r0, v0, v1, sel, lane):
        """The thread's A words of k tile kt of the weight, rows r0 and r0 + 8 (`_a_words`): wait for raw slot rs
        (phase parity rph: the block's k tile i is in slot i % RAW, phase (i // RAW) & 1), read it, free it (one
        arrival a warp)."""
        while mbarrier_try_wait_parity(bars, READY0 + rs, rph) == 0:
            pass
        raw_at = RAW0 + rs * RAW_SLOT
        p = row_words(smem, raw_at, r0, kt, v0, sel)
        q = row_words(smem, raw_at, r0 + 8, kt, v1, sel)
        syncwarp()  # the warp's raw reads are done: its lane 0 frees the raw slot
        if lane == 0:
            mbarrier_arrive(bars, REMPTY0 + rs)
        return p, q

    def gemm_kernel(a, rmap, e0, e1, out, parts, nt, od, kdim, whole, count, amap, cvec):
        smem = cuda.shared.array(0, types.float16, alignment=SMEM_ALIGN)
        bars = cuda.shared.array(0, types.uint64)
        tid = cuda.threadIdx.x
        n0, m0, sl, nsl, roff, coff = block_work(cuda.blockIdx.x, nt, od, whole, count, 0, od)
        kt0, ktiles = k_range(kdim, sl, nsl)
        if tid == 0:
            init_barriers(bars)
            if WARPGROUP:
                for j in range(RAW):
                    mbarrier_init(bars, RREADY0 + j, CONVERTERS)
        cuda.syncthreads()

        if tid >= CONSUMERS:  # the producer: lane 0 issues the raw boxes and the activation box of every k tile
            if WARPGROUP:
                setmaxnreg_dec(PRODUCER_REGS)
                c = tid - CONSUMERS - 32
                if 0 <= c < 32 * CONVERTERS:  # warps 1 .. CONVERTERS: the header converters
                    convert(smem, bars, kt0, ktiles, c, m0, od)
                    return
            if tid == CONSUMERS:
                produce(smem, bars, rmap, amap, kt0, ktiles, m0, n0, od, e0, e1)
            return
        if WARPGROUP:
            setmaxnreg_inc(CONSUMER_REGS)

        lane = tid & 31
        r0 = (tid >> 7) * 64 + ((tid >> 5) & 3) * 16 + (lane >> 2)  # weight rows r0 and r0 + 8 of the tile
        t = lane & 3
        sel = uint32(0x0100 + t * 0x0202)  # qs bytes 2t, 2t + 1 of a word pair to bytes 0 and 2
        v0 = GLU or m0 + r0 < od  # GLU: every box is copied (rows past a segment's end are zeros)
        v1 = GLU or m0 + r0 + 8 < od
        acc = cuda.local.array(ACC, float32)  # the first k16 step runs with scale-d = 0: no zero fill
        desc_b0 = wgmma_desc(smem, 0, LBO, SBO, SWIZZLE_128B)
        rs = 0  # raw slot and phase of the next tile's words, counted as s and phase are
        rph = uint32(0)
        p, q = tile_words(smem, bars, rs, rph, kt0, r0, v0, v1, sel, lane)
        s = 0
        phase = uint32(0)
        for i in range(ktiles):
            while mbarrier_try_wait_parity(bars, FULL0 + s, phase) == 0:
                pass
            db = desc_b0 + uint64((s * SLOT_B) >> 4)
            first = uint32(0) if i == 0 else uint32(1)
            wgmma_fence()
            wgmma_m64nNk16_f32_f16_rs(smem, acc, 0, p[0], q[0], p[1], q[1], db, first, TN, 0)
            wgmma_m64nNk16_f32_f16_rs(smem, acc, 0, p[2], q[2], p[3], q[3], db + uint64(2), uint32(1), TN, 0)
            wgmma_m64nNk16_f32_f16_rs(smem, acc, 0, p[4], q[4], p[5], q[5], db + uint64(4), uint32(1), TN, 0)
            wgmma_m64nNk16_f32_f16_rs(smem, acc, 0, p[6], q[6], p[7], q[7], db + uint64(6), uint32(1), TN, 0)
            wgmma_commit_group()
            batch_p, batch_q = p, q
            if i + 1 < ktiles:  # tile i + 1's A words while the tensor cores run tile i (other registers)
                rs += 1
                if rs == RAW:
                    rs = 0
                    rph ^= uint32(1)
                p, q = tile_words(smem, bars, rs, rph, kt0 + i + 1, r0, v0, v1, sel, lane)
            wgmma_wait_group(0)
            keep_words(batch_p)  # the batch's A registers stay live until its wait: never the next tile's
            keep_words(batch_q)
            if lane == 0:
                mbarrier_arrive(bars, EMPTY0 + s)
            s += 1
            if s == STAGES:
                s = 0
                phase ^= uint32(1)
        if nsl > 1:  # a k slice: its partial tile, added by the slice sum
            store_tile(cuda.shared.array(0, float32), parts, acc, r0, 2 * t, n0, m0, nt, od, roff, coff, cvec, tid)
        else:
            store_whole(cuda.shared.array(0, float32), out, acc, r0, 2 * t, n0, m0, nt, od, cvec, tid)

    return gemm_kernel


SIGNATURE = types.void(types.float16[::1], types.uint64[::1], types.int64, types.int64, types.float32[:, ::1],
                       types.float32[:, ::1], types.int64, types.int64, types.int64, types.int64, types.int64,
                       types.uint64[::1], types.int64)
GLU_SIGNATURE = types.void(*[types.uint32[::1] if i == 4 else t for i, t in enumerate(SIGNATURE.args)])
"""The SwiGLU kernel's: ``out`` is the f16 activation as flat uint32 words (`kernels.gemm_tiles.c_tile_store_glu`)."""
_CACHE = KernelCache("gemm_fused_regs", SIGNATURE)
_GLU_CACHE = KernelCache("gemm_fused_regs_glu", GLU_SIGNATURE)


def kernel_ptx(config: dict | None, qtype: str, cc=(9, 0, "a"), glu: bool = False) -> str:
    """PTX of the register-A fused kernel (``glu``: the SwiGLU one) for gemm_f16 knobs ``config`` and weights of
    ``qtype`` (NVVM, sm_90a by default; no GPU needed; not under the simulator)."""
    rg = regs_geometry(config, qtype, glu=glu)
    ptx, _ = cuda.compile_ptx(_make_kernel(rg), GLU_SIGNATURE if glu else SIGNATURE, cc=cc,
                              launch_bounds=(rg.threads,))
    return ptx


def build(config: dict | None, qtype: str, accumulate: bool = False, glu: bool = False):
    """Compile (once per geometry; cached) and return the register-A fused kernel (`kernels.specialize.BuiltKernel`);
    ``accumulate``: with the residual epilogue; ``glu``: the SwiGLU one."""
    rg = regs_geometry(config, qtype, accumulate, glu)
    return (_GLU_CACHE if glu else _CACHE).get(rg, _make_kernel, rg.smem_bytes, rg.threads, hint="lower STAGES",
                                               whole_program=rg.warpgroup_producer)


def split_plan(config: dict | None, nt: int, od: int, kdim: int, sms: int | None = None) -> SplitPlan:
    """The `kernels.gemm_f16_config.SplitPlan` of ``config``'s SPLITK for the register-A kernel's tiles of C[nt, od]
    over ``kdim`` on ``sms`` SMs (the current device's by default)."""
    cfg = gemm_f16.resolve_config(config, fused_regs=True)
    if cfg["SPLITK"] == 0 and sms is None:
        sms = gemm_f16.device_sms()
    return gemm_f16_config.split_plan(RegsGeometry.grid_of(cfg["TN"], nt, od), -(-kdim // KS), sms or 1,
                                      cfg["SPLITK"])


def partials_elements(config: dict | None, nt: int, od: int, kdim: int, sms: int | None = None) -> int:
    """f32 elements of the split-K partials a launch of ``config`` needs for this shape (0 without a split): slices
    * nt * od when every tile is split, else (split tiles) * slices * TN * TM."""
    plan = split_plan(config, nt, od, kdim, sms)
    if plan.slices == 1:
        return 0
    if plan.whole == 0:
        return plan.slices * nt * od
    tn = gemm_f16.resolve_config(config, fused_regs=True)["TN"]
    return (RegsGeometry.grid_of(tn, nt, od) - plan.whole) * plan.slices * tn * TM


def partials_capacity(config: dict | None, max_nt: int, max_od: int, sms: int) -> int:
    """f32 elements of a partials buffer that serves every launch of ``config`` with nt <= ``max_nt`` and od <=
    ``max_od`` on ``sms`` SMs (as `kernels.gemm_f16.partials_capacity`, with this kernel's TN x 128 tiles)."""
    cfg = gemm_f16.resolve_config(config, fused_regs=True)
    if cfg["SPLITK"] == 0:
        return sms * cfg["TN"] * TM
    return 0 if cfg["SPLITK"] == 1 else int(cfg["SPLITK"]) * max_nt * max_od


def gemm_fused_regs(a, segments, qtype: str, out=None, *, config: dict | None = None, stream=0, partials=None,
                    accumulate: bool = False):
    """Enqueue ``C[nt, od] = A[nt, id] · dequant(W)[od, id]^T`` on ``stream`` with the register-A kernel and return C
    (f32 device array); with ``accumulate``, ``out +=`` the product. a: f16 device array [nt, id], row-major.
    segments: [(raw, rows), ...], 1 to 3 weights of format ``qtype`` stacked along od (od = the rows' sum; later
    ones starting on 64-row boxes): raw is one tensor's GGUF blocks (uint8 device array [rows * id / 256 * block
    bytes], row-major). out: f32 [nt, od] or None (allocated). ``config``: the gemm_f16 knobs `regs_geometry`
    reads. The weights are dequantized in f16 arithmetic (`kernels.gemm_fused`): C is within ~1e-3 relative of A
    times the f16 dequantization (`kernels.quant.dequantize`), not bit-identical to `kernels.gemm_f16` on it.
    Needs an sm_90a device. Raises KernelConstraintError (one line) for what `kernels.gemm_fused.check_segments`
    refuses, host weight arrays, partials too small for the split, or accumulate without out.

    Split-K (SPLITK > 1, or 0 = auto: `split_plan`) as `kernels.gemm_f16.gemm_f16`'s: split tiles' k slices into
    ``partials`` (a flat f32 device array of at least `partials_elements`; allocated here when None, which a CUDA
    graph capture cannot do), summed in slice order into C by a second kernel."""
    if accumulate and out is None:
        raise KernelConstraintError("gemm_fused_regs: accumulate adds the product to out; pass the f32 [nt, od] array")
    plan, parts, out, rg = _launch(a, segments, qtype, out, config, stream, partials, accumulate)
    gemm_f16.sum_parts(plan, parts, out, rg, stream, accumulate)
    return out


def gemm_fused_regs_split(a, segments, qtype: str, out=None, *, config: dict | None = None, stream=0, partials=None):
    """`gemm_fused_regs` leaving the slices of an all-split plan unsummed: ``(parts, count)`` as
    `kernels.gemm_f16.gemm_f16_split` (for `kernels.norm.add_rms_norm`). Arguments and errors as `gemm_fused_regs`."""
    plan, parts, out, rg = _launch(a, segments, qtype, out, config, stream, partials)
    if plan.whole == 0 and plan.slices > 1:
        return parts, plan.slices
    gemm_f16.sum_parts(plan, parts, out, rg, stream)
    nt, od = out.shape
    return out.reshape(nt * od), 1


def _launch(a, segments, qtype, out, config, stream, partials, accumulate: bool = False, glu: bool = False):
    """Enqueue the register-A kernel (``accumulate``: with the residual epilogue; ``glu``: the SwiGLU one, ``out``
    the f16 activation) with its split plan; return (plan, the flat partials used or None, out, the geometry)."""
    nt, od, kdim = gemm_fused.check_segments(a, segments, qtype, None if glu else out)
    if glu and (refused := glu_refusal(od)) is not None:
        raise KernelConstraintError(refused)
    gemm_fused.check_on_device(segments)
    if glu:
        out = gemm_f16.glu_out(out, nt, od // 2, stream, "gemm_fused_regs_glu")
    elif out is None:
        out = cuda.device_array((nt, od), dtype=np.float32, stream=stream)
    built = build(config, qtype, accumulate, glu)
    rg = built.geometry
    plan = split_plan(config, nt, od, kdim)
    parts, target = gemm_f16.split_target(plan, rg, nt, od, gemm_f16.no_parts() if glu else out, partials, stream)
    ends = np.cumsum([rows for _, rows in segments]).tolist() + [od] * MAX_SEGMENTS
    built.kernel[plan.blocks(rg.grid(nt, od)), rg.threads, stream, rg.smem_bytes](
        a.reshape(nt * kdim), gemm_fused.raw_maps(segments, kdim // gemm_fused.BLOCK_WEIGHTS * BLOCK_BYTES[qtype]),
        ends[0], ends[1], out.view(np.uint32).reshape(nt * od // 4) if glu else out, target, nt, od, kdim,
        plan.whole, plan.slices, gemm_tma.tensor_map(a, rg.tn), gemm_tma.c_vectors(target if glu else out, target))
    return plan, parts, out, rg


def glu_refusal(od: int) -> str | None:
    """Why `gemm_fused_regs_glu` cannot multiply a gate|up weight of ``od`` (= 2 ffn) rows, in one line, or None:
    each tile takes 64 gate rows and the same up rows as whole raw boxes, so ffn must be a multiple of 64."""
    if od % TM:
        return (f"gemm_fused_regs_glu: the gate|up weight has {od} rows (2 x ffn); each tile takes 64 gate rows and "
                f"the same up rows, so ffn must be a multiple of 64")
    return None


def gemm_fused_regs_glu(a, segments, qtype: str, out=None, *, config: dict | None = None, stream=0, partials=None):
    """Enqueue the gate/up product with its SwiGLU from the quantized weight, ``act[nt, ffn] = silu(A · Wg^T) * (A
    · Wu^T)``, on ``stream`` and return act (f16): `gemm_fused_regs` without the f32 [nt, 2 ffn] C.

    a, segments, qtype, config, partials: as `gemm_fused_regs`, the segments a gate|up weight of od = 2 ffn rows
    (gate rows 0 .. ffn - 1, then up; ffn a multiple of 64: `glu_refusal`). out: optional C-contiguous f16 [nt, ffn]
    device array at a 16-byte aligned address (allocated when None). Each tile's two 64-row halves are gate rows m0
    / 2 .. and up rows ffn + m0 / 2 .. (`kernels.gemm_fused.producer` with GLU), so its staged C tile holds each
    output's gate and up values, and the epilogue is `kernels.gemm_tiles.c_tile_store_glu` (NOCALL=1: div.approx,
    one f16 ulp from `kernels.activation.swiglu`'s IEEE division). Split-K slices go to the partials as f32 and
    `kernels.gemm_f16.sum_parts_glu` sums them and applies the SwiGLU. KernelConstraintError (one line) for what
    `gemm_fused_regs` refuses, a ffn not a multiple of 64 or a wrong out."""
    plan, parts, out, rg = _launch(a, segments, qtype, out, config, stream, partials, glu=True)
    gemm_f16.sum_parts_glu(plan, parts, out, 2 * out.shape[1], rg, stream)
    return out
