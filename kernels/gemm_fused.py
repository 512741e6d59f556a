"""The prefill GEMM with the weight dequantized inside it: ``C[nt, od] = A[nt, id] · dequant(W)[od, id]^T``.

`kernels.gemm_f16`'s STAGING=tma kernel (two wgmma consumer warpgroups, a ring of swizzled shared tiles, full /
empty mbarriers a stage) with a second B producer: instead of a TMA box of an f16 copy of the weight, a producer
warpgroup reads the weight's GGUF blocks from global memory and writes the stage's B tile as f16 in wgmma's
128-byte swizzled K-major layout. The weight then crosses device memory once, at its quantized size (4.5 bits a
weight for Q4_K against 16 for the f16 copy), and no f16 copy of it exists (the prefill's ``W16=fused``).

* Warps: consumers as STAGING=tma (threads 0 .. 255 for the 256x128 tile), then one producer warpgroup (128
  threads). Its thread 0 also issues the A box (TMA, as STAGING=tma) of every k tile.
* Producer, k tile i into slot s: the loads of tile i + 1 are issued first (registers, one tile ahead), then it
  waits empty[s], dequantizes tile i's blocks (loaded one tile earlier) and stores them: thread p owns B rows p and
  p + 128 of the tile, 64 k each, written as eight 16-byte chunks, chunk c of row r at chunk c ^ (r & 7) of its
  128-byte row (the layout the TMA's 128-byte swizzle gives; the eight rows of a store phase hit distinct banks).
  Then ``fence.proxy.async.shared::cta`` (generic-proxy writes made visible to wgmma's async proxy) and one
  arrival on full[s]. full[s] expects 1 + 128 arrivals (the A box's expect-tx, every producer thread) and the A
  bytes.
* Arithmetic: each weight exactly as `kernels.quant` dequantizes it (gguf-py's float32 operations with ``.rn``
  rounding, then round to nearest f16), so the tiles equal the f16 copy's and C equals `kernels.gemm_f16`'s on
  that copy bit for bit.
* Weights made of several tensors stacked along od (q|k|v, gate|up) are up to three segments of one format, each
  its own device array: rows below ``e0`` read segment 0, below ``e1`` segment 1, the rest segment 2.
* Rows past od are zeros (a zero header dequantizes to zeros); GGUF k-quant rows are whole 256-weight blocks, so
  k needs no tail. Split-K plans as `kernels.gemm_f16` (`split_plan`, partials and their sums).

Formats (`FUSED_TYPES`): Q4_K (ggml-common.h ``block_q4_K``: d f16 | dmin f16 | scales[12] | qs[128], 144 bytes,
read as uint32 words; a 64-wide k tile is qs group k/64 % 4: low nibbles of its 32 bytes for the first 32 weights,
high for the next 32, scales of sub-blocks 2g and 2g+1 as ggml's ``get_scale_min_k4``).

Sources: CUTLASS sm90 warp-specialized GEMM and its mixed-input (converting) mainloop; PTX ISA §9.7.13.15
(mbarrier), §9.7.12.15.21 (fence.proxy.async), §9.7.15 (wgmma); gguf-py ``quants.py`` (Q4_K).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import cuda, float32, types, uint32, uint64

from kernels import gemm_f16
from kernels.errors import KernelConstraintError
from kernels.gemm_f16 import Geometry, geometry
from kernels.ptx import SIMULATOR, ld_global_v4_b32, st_shared_v4_b32
from kernels.ptx.bulk import mbarrier_arrive, mbarrier_arrive_expect_tx, mbarrier_init, mbarrier_try_wait_parity
from kernels.ptx.tma import cp_async_bulk_tensor_2d_g2s
from kernels.ptx.wgmma import SWIZZLE_128B, fence_proxy_async_shared, wgmma_desc, wgmma_wait_group
from kernels.quant.bits import F32_MAGIC, F32_MAGIC_BITS, f16x2_bits, f32_from_bits, f32_from_f16_bits, fmul_rn, fsub_rn
from kernels.specialize import KernelCache, is_contiguous

FUSED_TYPES = ("Q4_K",)
"""Weight formats the dequantizing B producer reads."""
BLOCK_WEIGHTS = 256
BLOCK_BYTES = {"Q4_K": 144}
PRODUCERS = 128
"""Threads of the producer warpgroup."""
MAX_SEGMENTS = 3


@dataclass(frozen=True)
class FusedGeometry:
    """The gemm_f16 geometry of the knobs plus the weight format: the compile key of one fused kernel."""

    base: Geometry
    qtype: str

    @property
    def threads(self) -> int:
        return 32 * self.base.warps + PRODUCERS

    @property
    def smem_bytes(self) -> int:
        return self.base.smem_bytes


def fused_geometry(config: dict | None, qtype: str) -> FusedGeometry:
    """The FusedGeometry of gemm_f16 knobs ``config`` for weights of ``qtype``; KernelConstraintError (one line) for
    a format the producer does not read or knobs the fused kernel does not take (it is the STAGING=tma kernel:
    MMA=wgmma, KS=64, LOOP=pipe; and TM a multiple of 128: a producer thread owns one B row in each 128)."""
    if qtype not in FUSED_TYPES:
        raise KernelConstraintError(f"gemm_fused: weights of type {qtype} have no dequantizing producer; "
                                    f"types: {', '.join(FUSED_TYPES)}")
    g = geometry(config)
    if g.staging != "tma" or g.tm % PRODUCERS:
        raise KernelConstraintError(f"gemm_fused needs STAGING=tma (the default) and TM=128 or 256 (got STAGING="
                                    f"{g.staging}, TM={g.tm})")
    return FusedGeometry(g, qtype)


def _q4_k_rows():
    """(load, store) device helpers of the Q4_K producer. ``load(b0, b1, b2, e0, e1, od, row, kt, wpr)``: the 12
    uint32 words tile ``kt`` of weight row ``row`` needs (header d|dmin|scales[12], then qs bytes 32 g .. 32 g + 31,
    g = kt % 4), zeros past od. ``store(smem, at, r, kt, w)``: row r's 64 weights of tile kt dequantized into the
    swizzled B tile at element ``at``."""

    @cuda.jit(device=True, inline="always")
    def load(b0, b1, b2, e0, e1, od, row, kt, wpr):
        if row >= od:
            z = uint32(0)
            return (z, z, z, z, z, z, z, z, z, z, z, z)
        arr = b0
        r = row
        if row >= e1:
            arr = b2
            r = row - e1
        elif row >= e0:
            arr = b1
            r = row - e0
        base = r * wpr + (kt >> 2) * 36
        h = ld_global_v4_b32(arr, base)
        q = base + 4 + 8 * (kt & 3)
        x = ld_global_v4_b32(arr, q)
        y = ld_global_v4_b32(arr, q + 4)
        return (h[0], h[1], h[2], h[3], x[0], x[1], x[2], x[3], y[0], y[1], y[2], y[3])

    @cuda.jit(device=True, inline="always")
    def weight(dsc, dm, word, k):
        q = f32_from_bits(F32_MAGIC_BITS | ((word >> (8 * k)) & 0xF)) - F32_MAGIC
        return fsub_rn(fmul_rn(dsc, q), dm)

    @cuda.jit(device=True, inline="always")
    def chunk(smem, at, r, c, dsc, dm, lo, hi):
        st_shared_v4_b32(smem, at + r * 64 + ((c ^ (r & 7)) << 3),
                         f16x2_bits(weight(dsc, dm, lo, 0), weight(dsc, dm, lo, 1)),
                         f16x2_bits(weight(dsc, dm, lo, 2), weight(dsc, dm, lo, 3)),
                         f16x2_bits(weight(dsc, dm, hi, 0), weight(dsc, dm, hi, 1)),
                         f16x2_bits(weight(dsc, dm, hi, 2), weight(dsc, dm, hi, 3)))

    @cuda.jit(device=True, inline="always")
    def half(smem, at, r, c0, shift, dsc, dm, w):
        chunk(smem, at, r, c0, dsc, dm, (w[4] >> shift) & 0x0F0F0F0F, (w[5] >> shift) & 0x0F0F0F0F)
        chunk(smem, at, r, c0 + 1, dsc, dm, (w[6] >> shift) & 0x0F0F0F0F, (w[7] >> shift) & 0x0F0F0F0F)
        chunk(smem, at, r, c0 + 2, dsc, dm, (w[8] >> shift) & 0x0F0F0F0F, (w[9] >> shift) & 0x0F0F0F0F)
        chunk(smem, at, r, c0 + 3, dsc, dm, (w[10] >> shift) & 0x0F0F0F0F, (w[11] >> shift) & 0x0F0F0F0F)

    @cuda.jit(device=True, inline="always")
    def store(smem, at, r, kt, w):
        d = f32_from_f16_bits(w[0] & 0xFFFF)
        dmin = f32_from_f16_bits(w[0] >> 16)
        g = kt & 3
        for h in range(2):  # sub-block s = 2 g + h: low nibbles (chunks 0-3), then high (chunks 4-7)
            t = 8 * ((2 * g + h) & 3)
            a = (w[1] >> t) & 0xFF  # scales[s % 4]
            c = (w[2] >> t) & 0xFF  # scales[s % 4 + 4]
            e = (w[3] >> t) & 0xFF  # scales[s % 4 + 8]
            if g < 2:
                sc = a & 63
                m = c & 63
            else:
                sc = (e & 0xF) | ((a >> 6) << 4)
                m = (e >> 4) | ((c >> 6) << 4)
            half(smem, at, r, 4 * h, 4 * h, fmul_rn(d, float32(sc)), fmul_rn(dmin, float32(m)), w)

    return load, store


def _make_kernel(fg: FusedGeometry):
    """The fused kernel for one geometry (see the module docstring); the consumers are `kernels.gemm_f16`'s
    STAGING=tma consumers unchanged."""
    g = fg.base
    TM, TN, KS, STAGES, GROUP = g.tm, g.tn, g.ks, g.stages, g.group
    ROWB = KS * 2
    WGS = g.warps // 4
    WG_N = min(WGS, TN // 64)
    WG_M = WGS // WG_N
    WTN = TN // WG_N
    MT64 = WTN // 64
    N = TM // WG_M
    NH = N // 2
    ACC_N = MT64 * NH
    SBO = 8 * ROWB
    LBO = 16
    A_ELEMS = TN * KS
    A_BYTES = A_ELEMS * 2
    STAGE_ELEMS = (TN + TM) * KS
    STAGE_B = STAGE_ELEMS * 2
    SA_B = TN * ROWB
    FULL0 = STAGES * STAGE_B // 8
    CONSUMERS = 32 * g.warps
    CONSUMER_WARPS = g.warps
    TWO = TM // PRODUCERS == 2
    K16 = KS // 16
    M64_B = 64 * ROWB
    WORDS = BLOCK_BYTES[fg.qtype] // 4
    block_work = gemm_f16._split_work(TN, TM, GROUP)
    store_c = gemm_f16._c_fragment_store(MT64, N // 8, 64)
    ktile_mma = gemm_f16._ktile_mma(K16, MT64, NH, N, M64_B)
    load, store = _q4_k_rows()
    SMEM_ALIGN = None if SIMULATOR else 1024

    def gemm_kernel(a, b0, b1, b2, e0, e1, out, parts, nt, od, kdim, whole, count, amap):
        smem = cuda.shared.array(0, types.float16, alignment=SMEM_ALIGN)
        bars = cuda.shared.array(0, types.uint64)
        tid = cuda.threadIdx.x
        n0, m0, sl, nsl, roff, coff = block_work(cuda.blockIdx.x, nt, od, whole, count)
        ktotal = (kdim + KS - 1) // KS
        kt0 = (ktotal * sl) // nsl
        ktiles = (ktotal * (sl + 1)) // nsl - kt0
        if tid == 0:
            for s in range(STAGES):
                mbarrier_init(bars, FULL0 + s, 1 + PRODUCERS)
                mbarrier_init(bars, FULL0 + STAGES + s, CONSUMER_WARPS)
            fence_proxy_async_shared()
        cuda.syncthreads()

        if tid >= CONSUMERS:
            p = tid - CONSUMERS
            wpr = (kdim // BLOCK_WEIGHTS) * WORDS
            ra = m0 + p
            rb = m0 + p + PRODUCERS
            na = load(b0, b1, b2, e0, e1, od, ra, kt0, wpr)
            nb = load(b0, b1, b2, e0, e1, od, rb, kt0, wpr) if TWO else na
            s = 0
            phase = uint32(0)
            for i in range(ktiles):
                ca = na
                cb = nb
                kt = kt0 + i
                if i + 1 < ktiles:
                    na = load(b0, b1, b2, e0, e1, od, ra, kt + 1, wpr)
                    if TWO:
                        nb = load(b0, b1, b2, e0, e1, od, rb, kt + 1, wpr)
                while mbarrier_try_wait_parity(bars, FULL0 + STAGES + s, phase ^ uint32(1)) == 0:
                    pass
                if p == 0:
                    mbarrier_arrive_expect_tx(bars, FULL0 + s, A_BYTES)
                    cp_async_bulk_tensor_2d_g2s(smem, s * STAGE_ELEMS, amap, 0, kt * KS, n0, bars, FULL0 + s)
                at = s * STAGE_ELEMS + A_ELEMS
                store(smem, at, p, kt, ca)
                if TWO:
                    store(smem, at, p + PRODUCERS, kt, cb)
                fence_proxy_async_shared()
                mbarrier_arrive(bars, FULL0 + s)
                s += 1
                if s == STAGES:
                    s = 0
                    phase ^= uint32(1)
            return

        wg = tid >> 7
        row0 = (wg % WG_N) * WTN
        col0 = (wg // WG_N) * N
        lane = tid & 31
        acc = cuda.local.array(ACC_N, float32)
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
        wgmma_wait_group(0)

        dst = parts if nsl > 1 else out
        store_c(dst, acc, n0 + row0 + ((tid >> 5) & 3) * 16 + (lane >> 2), m0 + col0 + (lane & 3) * 2, nt, od,
                roff, coff)

    return gemm_kernel


SIGNATURE = types.void(types.float16[::1], types.uint32[::1], types.uint32[::1], types.uint32[::1], types.int64,
                       types.int64, types.float32[:, ::1], types.float32[:, ::1], types.int64, types.int64,
                       types.int64, types.int64, types.int64, types.uint64[::1])
_CACHE = KernelCache("gemm_fused", SIGNATURE)


def kernel_ptx(config: dict | None, qtype: str, cc=(9, 0, "a")) -> str:
    """PTX of the fused kernel for gemm_f16 knobs ``config`` and weights of ``qtype`` (NVVM, sm_90a by default; no
    GPU needed; not under the simulator)."""
    fg = fused_geometry(config, qtype)
    ptx, _ = cuda.compile_ptx(_make_kernel(fg), SIGNATURE, cc=cc, launch_bounds=(fg.threads,))
    return ptx


def build(config: dict | None, qtype: str):
    """Compile (once per knobs and format; cached) and return the fused kernel (`kernels.specialize.BuiltKernel`)."""
    fg = fused_geometry(config, qtype)
    return _CACHE.get(fg, _make_kernel, fg.smem_bytes, fg.threads, hint="lower TM/TN/STAGES")


def check_segments(a, segments, qtype: str, out=None) -> tuple[int, int, int]:
    """Validate the operands of `gemm_fused`; return (nt, od, id). One-line KernelConstraintError saying what is
    expected."""
    if qtype not in FUSED_TYPES:
        raise KernelConstraintError(f"gemm_fused: weights of type {qtype} have no dequantizing producer; "
                                    f"types: {', '.join(FUSED_TYPES)}")
    if getattr(a, "ndim", None) != 2 or np.dtype(a.dtype) != np.float16 or not is_contiguous(a):
        raise KernelConstraintError(f"gemm_fused: a must be a C-contiguous 2-D float16 device array, got "
                                    f"{getattr(a, 'dtype', None)} {tuple(getattr(a, 'shape', ()))}")
    nt, kdim = a.shape
    if kdim % BLOCK_WEIGHTS or nt == 0:
        raise KernelConstraintError(f"gemm_fused: id must be a positive multiple of {BLOCK_WEIGHTS} ({qtype} rows are "
                                    f"whole blocks) and nt > 0, got a [{nt}, {kdim}]")
    if not 1 <= len(segments) <= MAX_SEGMENTS:
        raise KernelConstraintError(f"gemm_fused: 1 to {MAX_SEGMENTS} weight segments, got {len(segments)}")
    row_bytes = kdim // BLOCK_WEIGHTS * BLOCK_BYTES[qtype]
    od = 0
    for i, (raw, rows) in enumerate(segments):
        if (getattr(raw, "ndim", None) != 1 or np.dtype(raw.dtype) != np.uint8 or rows < 1
                or raw.shape[0] != rows * row_bytes):
            raise KernelConstraintError(
                f"gemm_fused: segment {i} must be the {rows} x {row_bytes} bytes of a {qtype} [{rows}, {kdim}] weight "
                f"as a 1-D uint8 device array, got {getattr(raw, 'dtype', None)} {tuple(getattr(raw, 'shape', ()))}")
        od += int(rows)
    if out is not None and (tuple(out.shape) != (nt, od) or np.dtype(out.dtype) != np.float32
                            or not is_contiguous(out)):
        raise KernelConstraintError(f"gemm_fused: out must be a C-contiguous float32 [{nt}, {od}] array, got "
                                    f"{out.dtype} {tuple(out.shape)}")
    return nt, od, kdim


def gemm_fused(a, segments, qtype: str, out=None, *, config: dict | None = None, stream=0, partials=None):
    """Enqueue ``C[nt, od] = A[nt, id] · dequant(W)[od, id]^T`` on ``stream`` and return C (f32 device array).

    a: f16 device array [nt, id], row-major. segments: [(raw, rows), ...], 1 to 3 weights of format ``qtype``
    stacked along od (od = the rows' sum): raw is one tensor's GGUF blocks (uint8 device array [rows * id / 256 *
    block bytes], row-major). out: f32 [nt, od] (allocated when None). config: `kernels.gemm_f16` knobs (the
    STAGING=tma kernel's; SPLITK plans and partials as there). Needs an sm_90a device.

    C equals `kernels.gemm_f16.gemm_f16` of A and the f16 dequantization of W (`kernels.quant.dequantize`) bit for
    bit. Raises KernelConstraintError (one line) for a format without a producer (`FUSED_TYPES`), id not a multiple
    of 256, segments of the wrong size, a wrong out or partials, or knobs the kernel does not take.
    """
    plan, parts, out = _launch(a, segments, qtype, out, config, stream, partials)
    gemm_f16._sum_parts(plan, parts, out, config, stream)
    return out


def gemm_fused_split(a, segments, qtype: str, out=None, *, config: dict | None = None, stream=0, partials=None):
    """`gemm_fused` leaving the slices of an all-split plan unsummed: ``(parts, count)`` as
    `kernels.gemm_f16.gemm_f16_split`. Arguments and errors as `gemm_fused`."""
    plan, parts, out = _launch(a, segments, qtype, out, config, stream, partials)
    if plan.whole == 0 and plan.slices > 1:
        return parts, plan.slices
    gemm_f16._sum_parts(plan, parts, out, config, stream)
    nt, od = out.shape
    return out.reshape(nt * od), 1


def _launch(a, segments, qtype, out, config, stream, partials):
    """Enqueue the fused kernel with its split plan; return (plan, the flat partials used or None, out)."""
    nt, od, kdim = check_segments(a, segments, qtype, out)
    if out is None:
        out = cuda.device_array((nt, od), dtype=np.float32, stream=stream)
    built = build(config, qtype)
    g = built.geometry.base
    plan = gemm_f16.split_plan(config, nt, od, kdim)
    parts, target = gemm_f16._split_target(plan, g, nt, od, out, partials, stream)
    raws = [raw.view(np.uint32) for raw, _ in segments]
    raws += [raws[-1]] * (MAX_SEGMENTS - len(raws))
    ends = np.cumsum([rows for _, rows in segments]).tolist() + [od] * MAX_SEGMENTS
    built.kernel[plan.blocks(g.grid(nt, od)), built.geometry.threads, stream, g.smem_bytes](
        a.reshape(nt * kdim), raws[0], raws[1], raws[2], ends[0], ends[1], out, target, nt, od, kdim, plan.whole,
        plan.slices, gemm_f16._tensor_map(a, g.tn))
    return plan, parts, out
