"""The fused-dequantization GEMM's format side: the quantized weight formats it reads, their arithmetic, the producer
that copies their blocks into shared memory, and the argument checks. The kernel is `kernels.gemm_fused_regs` (the
weight dequantized into wgmma's register A operand), which multiplies ``C[nt, od] = A[nt, id] · dequant(W)[od,
id]^T`` with the weight crossing device memory at its quantized size (4.5 bits a weight for Q4_K against 16) and no
f16 copy of it.

* Producer (`producer`), k tile i: the raw boxes of tile i into raw slot i % RAW (per 64 weight rows a box of the
  rows' 16-byte block headers and a box of their 32 qs bytes of the tile, TMA on byte tensor maps, `raw_maps`;
  rfull / rempty mbarriers), then the activation box into ring slot i % STAGES (full / empty mbarriers).
* Arithmetic, two weights an instruction (`q4_k_low`, `q4_k_high`): with a pair of qs bytes at bytes 0 and 2 of a
  word (one `prmt`), a masked OR puts their low nibbles under the f16 exponent of 1024 (bits 0-3 of the mantissa)
  or their high nibbles under that of 64 (bits 4-7), `sub.rn.f16x2` removes the 1024 or 64 exactly, and
  `fma.rn.f16x2` applies the sub-block's scale d·sc and min -dmin·m
  (`q4_k_scales_mins`: float32 products as gguf-py, rounded to f16). A weight differs from `kernels.quant`'s
  (gguf-py's float32, rounded once) by at most about an f16 ulp of |q·d·sc| + |dmin·m| (where the two terms cancel,
  by many ulps of the small weight); the C of a 3584-wide product is within ~4e-4 relative of float64.
* Weights made of several tensors stacked along od (q|k|v, gate|up) are up to three segments of one format, each
  its own device array: rows below ``e0`` read segment 0, below ``e1`` segment 1, the rest segment 2; boundaries
  fall on 64-row boxes (`check_segments`). Rows past od are zeros (no box brings them; a zero header dequantizes
  to zeros); GGUF k-quant rows are whole 256-weight blocks, so k needs no tail.

Formats (`FUSED_TYPES`): Q4_K (ggml-common.h ``block_q4_K``: d f16 | dmin f16 | scales[12] | qs[128], 144 bytes; a
64-wide k tile is qs group g = k/64 % 4: low nibbles of its 32 bytes for the first 32 weights, high for the next
32, scales of sub-blocks 2g and 2g+1 as ggml's ``get_scale_min_k4``).

The B-producer form of this GEMM (consumers dequantizing into a swizzled f16 B tile before each wgmma batch) lost
its A/Bs to the register kernel and was deleted (ledger #405, #415, #416).
A Q6_K form (at TN=256: one 224-byte TMA box a weight row and block, from the block's byte rounded down to 16;
converters realigning each block chunk-major with f16 scales; commit 76bc84e) was right but took 2.9-3.4x
gemm_f16's time on ffn_down, and was deleted (ledger #427-#429).

Sources: CUTLASS sm90 mixed-input (converting) mainloop; PTX ISA §9.7.13.15 (mbarrier), §9.7.9.25.5.1
(cp.async.bulk.tensor), §9.7.8.7 (prmt), §9.7.4 (half precision); gguf-py ``quants.py`` (Q4_K).
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float32, uint32

from kernels import gemm_tma
from kernels.errors import KernelConstraintError
from kernels.ptx import SIMULATOR, fma_f16x2, prmt_b32, sub_f16x2
from kernels.ptx.bulk import mbarrier_arrive_expect_tx, mbarrier_init, mbarrier_try_wait_parity
from kernels.ptx.tma import MAP_WORDS, cp_async_bulk_tensor_2d_g2s, device_address, tensor_map_bytes_2d
from kernels.ptx.wgmma import fence_proxy_async_shared
from kernels.quant.bits import f16x2_bits, f32_from_bits, fmul_rn, fsub_rn
from kernels.specialize import is_contiguous

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
"""Most raw slots (more measured no faster on the deleted B-producer kernel: the raw boxes were not what it
waited for)."""
F16_1024X2 = 0x64006400  # f16x2 (1024, 1024): a code in mantissa bits 0-3 under it is 1024 + code, exactly
F16_64X2 = 0x54005400  # f16x2 (64, 64): a code in mantissa bits 4-7 under it is 64 + code, exactly
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
def q4_k_low(p, s2, m2):
    """Two weights as f16x2 from the low nibbles of bytes 0 and 2 of ``p`` (a pair of qs bytes placed there by
    `prmt_b32`; bytes 1 and 3 are ignored): ``code * s2 + m2`` with the sub-block's `q4_k_scales_mins` pair. The
    codes go under the f16 exponent of 1024 (one masked OR), `sub.rn.f16x2` removes the 1024 exactly, `fma.rn.f16x2`
    rounds once."""
    return fma_f16x2(sub_f16x2((p & 0x000F000F) | F16_1024X2, F16_1024X2), s2, m2)


@cuda.jit(device=True, inline="always")
def q4_k_high(p, s2, m2):
    """`q4_k_low` of the high nibbles of bytes 0 and 2 of ``p``, in place: mantissa bits 4-7 under the f16 exponent
    of 64 are 64 + code exactly, so no shift is needed."""
    return fma_f16x2(sub_f16x2((p & 0x00F000F0) | F16_64X2, F16_64X2), s2, m2)


def producer(TM: int, KS: int, STAGES: int, RAW: int, RAW0: int, FULL0: int, CONSUMER_WARPS: int, BLOCK: int,
             A_BYTES: int, SLOT_E: int, GLU: bool = False):
    """``(init_barriers(bars), produce(smem, bars, rmap, amap, kt0, ktiles, m0, n0, od, e0, e1))``: the barriers and
    the producer thread of the fused kernel (`kernels.gemm_fused_regs`).

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


def check_segments(a, segments, qtype: str, out=None) -> tuple[int, int, int]:
    """Validate the operands of `kernels.gemm_fused_regs.gemm_fused_regs`; return (nt, od, id). One-line
    KernelConstraintError saying what is expected."""
    if qtype not in FUSED_TYPES:
        raise KernelConstraintError(f"gemm_fused_regs: weights of type {qtype} have no dequantizer in the fused GEMM; "
                                    f"types: {', '.join(FUSED_TYPES)}")
    if getattr(a, "ndim", None) != 2 or np.dtype(a.dtype) != np.float16 or not is_contiguous(a):
        raise KernelConstraintError(f"gemm_fused_regs: a must be a C-contiguous 2-D float16 device array, got "
                                    f"{getattr(a, 'dtype', None)} {tuple(getattr(a, 'shape', ()))}")
    nt, kdim = a.shape
    if kdim <= 0 or kdim % BLOCK_WEIGHTS or nt == 0:
        raise KernelConstraintError(f"gemm_fused_regs: id must be a positive multiple of {BLOCK_WEIGHTS} ({qtype} rows are "
                                    f"whole blocks) and nt > 0, got a [{nt}, {kdim}]")
    if not 1 <= len(segments) <= MAX_SEGMENTS:
        raise KernelConstraintError(f"gemm_fused_regs: 1 to {MAX_SEGMENTS} weight segments, got {len(segments)}")
    row_bytes = kdim // BLOCK_WEIGHTS * BLOCK_BYTES[qtype]
    od = 0
    for i, (raw, rows) in enumerate(segments):
        if (getattr(raw, "ndim", None) != 1 or np.dtype(raw.dtype) != np.uint8 or not is_contiguous(raw)
                or not isinstance(rows, (int, np.integer)) or rows < 1 or raw.shape[0] != rows * row_bytes):
            raise KernelConstraintError(
                f"gemm_fused_regs: segment {i} must be the {rows} x {row_bytes} bytes of a {qtype} [{rows}, {kdim}] weight "
                f"(a whole number of rows) as a contiguous 1-D uint8 device array, got {getattr(raw, 'dtype', None)} "
                f"{tuple(getattr(raw, 'shape', ()))}")
        if i and od % BOX_ROWS:
            raise KernelConstraintError(f"gemm_fused_regs: segment {i} starts at row {od}; segments after the first must "
                                        f"start at a multiple of {BOX_ROWS} rows")
        od += int(rows)
    if out is not None and (tuple(out.shape) != (nt, od) or np.dtype(out.dtype) != np.float32
                            or not is_contiguous(out)):
        raise KernelConstraintError(f"gemm_fused_regs: out must be a C-contiguous float32 [{nt}, {od}] array, got "
                                    f"{out.dtype} {tuple(out.shape)}")
    return nt, od, kdim


def check_on_device(segments) -> None:
    """KernelConstraintError (one line) when a segment's bytes are a host array."""
    for i, (raw, _) in enumerate(segments):
        if isinstance(raw, np.ndarray) if SIMULATOR else not cuda.is_cuda_array(raw):
            raise KernelConstraintError(f"gemm_fused_regs: segment {i} is a host array; pass the weight's bytes on "
                                        f"the device")


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
