"""Prefill attention on tensor cores: causal FlashAttention-2, head_dim D in `HEAD_DIMS` (64, 80, 96, 128, 256),
GQA, f16 in/out, f32 softmax.

``O[i, h, :] = softmax_j(Q[i, h, :] · K[j, h // G, :] / sqrt(D), j <= i + (nt_kv - nt)) · V[j, h // G, :]``
with q f16 ``[nt, n_heads, D]``, k/v f16 ``[nt_kv, n_kv_heads, D]`` (the KV cache; nt_kv > nt when a prefix is
already cached), G = n_heads // n_kv_heads, O f16 ``[nt, n_heads, D]``. D is a shape, not a knob: one kernel is
compiled per (knobs, causal, D).

One thread block takes BQ = 64 query rows of one head (4 warps, 16 rows each) and walks the key tiles of BK keys
up to its causal limit (FlashAttention-2, Dao 2023, Algorithm 1):

* Q tile -> shared memory (cp.async) -> `ldmatrix.x4` A fragments, kept in registers for the whole loop;
* K/V tiles -> a two-slot shared ring by `cp.async.cg`, tile j+1 loading while tile j computes (src-size 0
  zero-fills keys past nt_kv), rows XOR-swizzled (16-byte chunk ^ (row & 7): rows of 128, 256 or 512 bytes would
  otherwise put all 8 ldmatrix rows in one bank). A shared row is DP = `padded_head_dim(D)` elements, DP/8 chunks,
  a power of two >= 8, so the XOR stays inside the row; at D = 80 or 96 (DP = 128) the chunks past D/8 are neither
  loaded nor read: the products run D/16 k16 steps and D/8 n8 tiles of O;
* S = Q·K^T with `mma.sync.m16n8k16` (K fragments by non-transposed `ldmatrix`: K rows are mma's "col" B);
* online softmax in f32 in the log2 domain (scores scaled by log2(e)/sqrt(D), `ex2`), running max m and
  per-lane partial row sums l (reduced over the 4 lanes of a row only at the end), accumulator rescaled by
  exp2(m_old - m_new); masked scores are -inf and m starts at -1e30 (finite), so no inf - inf ever occurs;
* P converted to f16 in registers: the m16n8 C fragments of two adjacent key n8 tiles are exactly the m16k16 A
  fragment of the next mma (the FA2 register trick), multiplied with V fragments from `ldmatrix.x4.trans`;
* epilogue O / l -> f16 staged through the (by then unused) swizzled Q tile, written with 16-byte stores, rows
  past nt skipped.

MMA=wgmma (`_make_kernel_wgmma`) keeps this loop and issues both products on Hopper's warpgroup MMA instead, as
FlashAttention-3 does (S = Q·K^T with both operands from shared memory, O += P·V with P from registers and
V read by the instruction's transposed-B path); not yet FA3's producer warp, TMA loads or the softmax overlapped
with the other warpgroup's products.

Program order: grid (heads, q tiles), heads fastest (the G query heads of a KV head read the same K/V tiles
from L2), the heaviest (last) causal q tiles of every head launch first (longest job first: a short tail).

Sources: FlashAttention-2 (Tri Dao, 2023, arXiv:2307.08691); FlashAttention-3 (Shah, Bikshandi, Zhang,
Thakkar, Ramani, Dao, 2024, arXiv:2407.08608); PTX ISA 9.x "wgmma.mma_async", "Matrix Fragments for
mma.m16n8k16 with floating point type", "ldmatrix", "cp.async", "shfl.sync".
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
from numba import cuda, float32, types, uint32, uint64

from kernels.errors import KernelConstraintError
from kernels.attention_config import BQ, DEFAULT, HEAD_DIMS, KNOBS, STAGES, head_dim_refusal, padded_head_dim
from kernels.specialize import BuiltKernel, KernelCache, is_contiguous
from kernels.ptx import (
    SIMULATOR,
    cp_async_16,
    div_approx_f32,
    cp_async_commit_group,
    cp_async_wait_group,
    ldmatrix_x4,
    ldmatrix_x4_trans,
    mma_m16n8k16_f32_f16,
    pack_f16x2,
    shfl_xor_f32,
    st_global_v4_u32,
    syncwarp,
)
from kernels.ptx.wgmma import (
    SWIZZLE_128B,
    fence_proxy_async_shared,
    wgmma_commit_group,
    wgmma_desc,
    wgmma_fence,
    wgmma_m64nNk16_f32_f16,
    wgmma_m64nNk16_f32_f16_rs,
    wgmma_wait_group,
)


@dataclass(frozen=True)
class Geometry:
    bq: int
    bk: int
    stages: int
    causal: bool
    head_dim: int
    mma: str
    warps: int
    smem_bytes: int

    @property
    def threads(self) -> int:
        return 32 * self.warps

    def grid(self, nt: int, n_heads: int) -> tuple[int, int]:
        return (n_heads, -(-nt // self.bq))


def resolve_config(config: dict | None) -> dict:
    """DEFAULT overridden by ``config``; KernelConstraintError on an unknown knob or value ("64" accepted for 64)."""
    cfg = dict(DEFAULT)
    for key, value in (config or {}).items():
        if key not in KNOBS:
            raise KernelConstraintError(f"flash_attention has no knob {key!r}; knobs: {', '.join(KNOBS)}")
        match = [a for a in KNOBS[key] if str(a) == str(value)]
        if not match:
            allowed = ", ".join(map(str, KNOBS[key]))
            raise KernelConstraintError(f"flash_attention {key}={value!r} is not allowed; allowed: {allowed}")
        cfg[key] = match[0]
    return cfg


def geometry(config: dict | None, causal: bool = True, head_dim: int = 128) -> Geometry:
    """The kernel's shape for ``config``'s knobs, the causal flag and ``head_dim`` (one of HEAD_DIMS; else
    KernelConstraintError): Q tile + STAGES K/V tiles of f16 rows in shared memory."""
    cfg = resolve_config(config)
    why = head_dim_refusal(head_dim)
    if why:
        raise KernelConstraintError(f"flash_attention: {why}")
    bk = cfg["BK"]
    smem = 2 * padded_head_dim(head_dim) * (BQ + 2 * STAGES * bk)
    return Geometry(BQ, bk, STAGES, bool(causal), int(head_dim), cfg["MMA"], BQ // 16, smem)


def all_configs():
    """Every knob setting (the product of KNOBS: each compiles)."""
    keys = list(KNOBS)
    for values in itertools.product(*(KNOBS[k] for k in keys)):
        yield dict(zip(keys, values))


def _tile_steps(g: Geometry):
    """(softmax_pack, store_out): the device functions both kernels share, for a warp's 16 query rows (lane l holds
    rows g = l >> 2 and g + 8 of the S and O C fragments, columns 2t, 2t + 1 of each n8 tile, t = l & 3).

    * ``softmax_pack(s, o, ml, p, k0, q0, row_lo, nt_kv, offset)``: scores of keys past nt_kv or (causal) past the
      row's position masked (only on tiles that cross the diagonal or the end of the keys), then the online softmax
      of one key tile in the log2 domain (scores scaled by log2(e)/sqrt(D)): running max ``ml[0:2]`` and per-lane
      partial sums ``ml[2:4]`` of rows g, g+8, O rescaled by exp2(m_old - m_new), P packed to f16 pairs in ``p``
      (the A fragments of P·V for mma.sync m16n8k16 and for the register-A wgmma alike: k16 step kk's are words
      4 kk .. 4 kk + 3);
    * ``store_out(smem32, out32, o, ml, r0, q0, nt, qs, h)``: O / l to f16, staged in the warp's rows r0 .. r0 + 15
      of the (XOR-swizzled, DP-element rows) Q tile region, then 16-byte rows to ``out``, rows past nt skipped. 1 / l
      is an IEEE division in the mma_sync kernel and `div.approx` in the wgmma one (an IEEE division's subroutine
      call would serialize its wgmma: see `_make_kernel_wgmma`)."""
    BK, CAUSAL, D = g.bk, g.causal, g.head_dim
    DP = padded_head_dim(D)  # shared row width (elements)
    APPROX = g.mma == "wgmma"
    NK8 = BK // 8
    ND8 = D // 8
    DCH = D // 8
    DCHP = DP // 8
    CSH = DCHP.bit_length() - 1
    CM = DCHP - 1
    OUT_CH = 16 * DCHP // 32
    SC = float32(math.log2(math.e) / math.sqrt(D))
    NEG_INF = float32(-np.inf)
    ZERO = float32(0.0)
    ONE = float32(1.0)

    @cuda.jit(device=True, inline="always")
    def softmax_pack(s, o, ml, p, k0, q0, row_lo, nt_kv, offset):
        """``s`` is left unwritten (word 2 t8 + hh of ``p``: row g + 8 hh, columns 2t, 2t+1 of n8 tile t8): ptxas
        serializes every wgmma if other instructions define a wgmma's accumulator registers (S's) inside a pipeline
        stage (its warning C7515). A masked score is a select against the row's last key (no branch: NVVM then
        unrolls the loops and keeps ``s`` in registers)."""
        tc = (cuda.threadIdx.x & 3) * 2
        edge = k0 + BK > nt_kv or (CAUSAL and k0 + BK - 1 > q0 + offset)
        for hh in range(2):
            lim = nt_kv - 1  # the row's last key (every key of the tile when it crosses neither edge)
            if CAUSAL:
                lim = min(lim, row_lo + hh * 8 + offset)
            if not edge:
                lim = k0 + BK
            mx = NEG_INF
            for t8 in range(NK8):
                kj = k0 + t8 * 8 + tc
                v0 = s[t8 * 4 + 2 * hh] if kj <= lim else NEG_INF
                v1 = s[t8 * 4 + 2 * hh + 1] if kj + 1 <= lim else NEG_INF
                mx = max(mx, max(v0, v1))
            mx = max(mx, shfl_xor_f32(mx, 1))
            mx = max(mx, shfl_xor_f32(mx, 2))
            m_old = ml[hh]
            m_new = max(m_old, mx * SC)
            alpha = math.exp2(m_old - m_new)
            ml[hh] = m_new
            rs = ZERO
            for t8 in range(NK8):
                kj = k0 + t8 * 8 + tc
                v0 = s[t8 * 4 + 2 * hh] if kj <= lim else NEG_INF
                v1 = s[t8 * 4 + 2 * hh + 1] if kj + 1 <= lim else NEG_INF
                p0 = math.exp2(v0 * SC - m_new)
                p1 = math.exp2(v1 * SC - m_new)
                rs += p0
                rs += p1
                p[t8 * 2 + hh] = pack_f16x2(p0, p1)
            ml[2 + hh] = ml[2 + hh] * alpha + rs
            for dn in range(ND8):
                o[dn * 4 + 2 * hh] *= alpha
                o[dn * 4 + 2 * hh + 1] *= alpha

    @cuda.jit(device=True, inline="always")
    def store_out(smem32, out32, o, ml, r0, q0, nt, qs, h):
        lane = cuda.threadIdx.x & 31
        gr = lane >> 2
        tc = (lane & 3) * 2
        for hh in range(2):
            l = ml[2 + hh]
            l += shfl_xor_f32(l, 1)
            l += shfl_xor_f32(l, 2)
            if APPROX:
                inv = div_approx_f32(ONE, l) if l > ZERO else ZERO
            else:
                inv = ONE / l if l > ZERO else ZERO
            r = r0 + gr + hh * 8
            for dn in range(ND8):
                x = dn * 4 + 2 * hh
                smem32[(r * DP + ((dn ^ (r & 7)) << 3) + tc) >> 1] = pack_f16x2(o[x] * inv, o[x + 1] * inv)
        syncwarp()
        for e in range(OUT_CH):
            c = lane + e * 32
            rr = c >> CSH
            ch = c & CM
            r = r0 + rr
            qi = q0 + r
            if qi < nt and ch < DCH:
                si = (r * DP + ((ch ^ (r & 7)) << 3)) >> 1
                st_global_v4_u32(out32, (qi * qs + h * D + ch * 8) >> 1, smem32[si], smem32[si + 1], smem32[si + 2],
                                 smem32[si + 3])

    return softmax_pack, store_out


def _make_kernel(g: Geometry):
    return _make_kernel_wgmma(g) if g.mma == "wgmma" else _make_kernel_mma_sync(g)


def _make_kernel_mma_sync(g: Geometry):
    BQ, BK, STAGES, CAUSAL = g.bq, g.bk, g.stages, g.causal
    D = g.head_dim
    DP = padded_head_dim(D)  # elements of a shared row
    DCH = D // 8  # 16-byte chunks of a row in memory
    DCHP = DP // 8  # ... of a shared row (a power of two >= 8)
    CSH = DCHP.bit_length() - 1  # log2(DCHP): chunk c of a tile is row c >> CSH, chunk c & (DCHP - 1)
    CM = DCHP - 1
    KS16 = D // 16  # k16 steps of Q·K^T
    QF_N = KS16 * 4  # u32 Q A-fragment registers per lane
    THREADS = g.threads
    NK16 = BK // 16  # k16 steps of P·V
    ND8 = D // 8  # n8 tiles of O
    SQ = BQ * DP  # Q tile elements
    SKV = BK * DP  # one K (or V) tile
    STAGE = 2 * SKV
    O_N = ND8 * 4  # f32 O accumulators per lane
    S_N = BK // 2  # f32 S values per lane
    P_N = BK // 4  # f16x2 A words of P per lane
    Q_CH = BQ * DCHP // THREADS  # 16-byte chunk slots per thread of the Q tile (= DCHP / 2)
    KV_CH = BK * DCHP // THREADS  # ... of one K (or V) tile (all powers of two: exact)
    M_INIT = float32(-1e30)
    ZERO = float32(0.0)
    SMEM_ALIGN = None if SIMULATOR else 128
    PRO_WAIT = STAGES - 1  # after the prologue (Q, K/V tiles 0 .. STAGES-2): Q has landed
    LOOP_WAIT = STAGES - 2  # at the top of key tile j: its group has landed
    softmax_pack, store_out = _tile_steps(g)

    def attn_kernel(q, k, v, out32, nt, nt_kv, n_heads, n_kv_heads, offset):
        smem = cuda.shared.array(0, types.float16, alignment=SMEM_ALIGN)
        smem32 = cuda.shared.array(0, types.uint32, alignment=SMEM_ALIGN)  # the same bytes, for the epilogue
        tid = cuda.threadIdx.x
        lane = tid & 31
        warp = tid >> 5
        gr = lane >> 2
        h = cuda.blockIdx.x  # heads fastest: the G heads of one KV head share its K/V tiles through L2
        qt = cuda.gridDim.y - 1 - cuda.blockIdx.y  # heaviest causal q tiles first (longest-job-first)
        hk = h // (n_heads // n_kv_heads)
        q0 = qt * BQ
        if CAUSAL:
            kend = min(nt_kv, q0 + BQ + offset)
        else:
            kend = nt_kv
        ntiles = (kend + BK - 1) // BK
        qs = n_heads * D  # row stride of q/out (elements)
        ks = n_kv_heads * D

        # ---- prologue: Q tile and K/V tile 0 -------------------------------------------------------------
        for rep in range(Q_CH):
            c = tid + rep * THREADS
            r = c >> CSH
            ch = c & CM
            qi = q0 + r
            if ch < DCH:  # the padding chunks of a DP-wide row are never read
                ok = qi < nt
                gidx = qi * qs + h * D + ch * 8 if ok else 0
                cp_async_16(smem, r * DP + ((ch ^ (r & 7)) << 3), q, gidx, 16 if ok else 0)
        cp_async_commit_group()
        for t in range(STAGES - 1):  # K/V tiles 0 .. STAGES-2, one commit group each
            for rep in range(KV_CH):
                c = tid + rep * THREADS
                r = c >> CSH
                ch = c & CM
                kj = t * BK + r
                if ch < DCH:
                    ok = kj < nt_kv
                    gidx = kj * ks + hk * D + ch * 8 if ok else 0
                    sidx = SQ + t * STAGE + r * DP + ((ch ^ (r & 7)) << 3)
                    cp_async_16(smem, sidx, k, gidx, 16 if ok else 0)
                    cp_async_16(smem, sidx + SKV, v, gidx, 16 if ok else 0)
            cp_async_commit_group()
        cp_async_wait_group(PRO_WAIT)
        cuda.syncthreads()

        qf = cuda.local.array(QF_N, uint32)  # A fragments of the warp's 16 x D Q rows: D/16 k16 steps x 4
        for kk in range(KS16):
            r = warp * 16 + (lane & 15)
            ch = kk * 2 + (lane >> 4)
            a0, a1, a2, a3 = ldmatrix_x4(smem, r * DP + ((ch ^ (r & 7)) << 3))
            qf[kk * 4] = a0
            qf[kk * 4 + 1] = a1
            qf[kk * 4 + 2] = a2
            qf[kk * 4 + 3] = a3

        o = cuda.local.array(O_N, float32)
        s = cuda.local.array(S_N, float32)
        p = cuda.local.array(P_N, uint32)
        ml = cuda.local.array(4, float32)  # m(row g), m(row g+8), l(row g), l(row g+8)
        for x in range(O_N):
            o[x] = ZERO
        ml[0] = M_INIT
        ml[1] = M_INIT
        ml[2] = ZERO
        ml[3] = ZERO
        row_lo = q0 + warp * 16 + gr  # this lane's two query rows: row_lo, row_lo + 8

        for j in range(ntiles):
            cp_async_wait_group(LOOP_WAIT)  # tile j has landed
            cuda.syncthreads()  # tile j visible; every warp is done with tile j-1's slot
            jn = j + STAGES - 1
            if jn < ntiles:
                base = SQ + (jn % STAGES) * STAGE
                for rep in range(KV_CH):
                    c = tid + rep * THREADS
                    r = c >> CSH
                    ch = c & CM
                    kj = jn * BK + r
                    if ch < DCH:
                        ok = kj < nt_kv
                        gidx = kj * ks + hk * D + ch * 8 if ok else 0
                        sidx = base + r * DP + ((ch ^ (r & 7)) << 3)
                        cp_async_16(smem, sidx, k, gidx, 16 if ok else 0)
                        cp_async_16(smem, sidx + SKV, v, gidx, 16 if ok else 0)
            cp_async_commit_group()
            kb = SQ + (j % STAGES) * STAGE
            vb = kb + SKV
            k0 = j * BK

            # ---- S = Q · K^T (16 x BK per warp) ----------------------------------------------------------
            for x in range(S_N):
                s[x] = ZERO
            for kk in range(KS16):
                for jj in range(NK16):
                    r = jj * 16 + (lane & 7) + ((lane >> 4) << 3)
                    ch = kk * 2 + ((lane >> 3) & 1)
                    b0, b1, b2, b3 = ldmatrix_x4(smem, kb + r * DP + ((ch ^ (r & 7)) << 3))
                    c = jj * 8
                    d0, d1, d2, d3 = mma_m16n8k16_f32_f16(
                        qf[kk * 4], qf[kk * 4 + 1], qf[kk * 4 + 2], qf[kk * 4 + 3], b0, b1, s[c], s[c + 1], s[c + 2], s[c + 3]
                    )
                    s[c] = d0
                    s[c + 1] = d1
                    s[c + 2] = d2
                    s[c + 3] = d3
                    d0, d1, d2, d3 = mma_m16n8k16_f32_f16(
                        qf[kk * 4], qf[kk * 4 + 1], qf[kk * 4 + 2], qf[kk * 4 + 3], b2, b3, s[c + 4], s[c + 5], s[c + 6], s[c + 7]
                    )
                    s[c + 4] = d0
                    s[c + 5] = d1
                    s[c + 6] = d2
                    s[c + 7] = d3

            softmax_pack(s, o, ml, p, k0, q0, row_lo, nt_kv, offset)

            # ---- O += P · V (P: f16 A fragments packed from the S C-fragments) ---------------------------
            for kk in range(NK16):
                c = kk * 4
                p0 = p[c]
                p1 = p[c + 1]
                p2 = p[c + 2]
                p3 = p[c + 3]
                for dc in range(ND8 // 2):
                    r = kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3)
                    ch = dc * 2 + (lane >> 4)
                    b0, b1, b2, b3 = ldmatrix_x4_trans(smem, vb + r * DP + ((ch ^ (r & 7)) << 3))
                    y = dc * 8
                    d0, d1, d2, d3 = mma_m16n8k16_f32_f16(p0, p1, p2, p3, b0, b1, o[y], o[y + 1], o[y + 2], o[y + 3])
                    o[y] = d0
                    o[y + 1] = d1
                    o[y + 2] = d2
                    o[y + 3] = d3
                    d0, d1, d2, d3 = mma_m16n8k16_f32_f16(p0, p1, p2, p3, b2, b3, o[y + 4], o[y + 5], o[y + 6], o[y + 7])
                    o[y + 4] = d0
                    o[y + 5] = d1
                    o[y + 6] = d2
                    o[y + 7] = d3
        cp_async_wait_group(0)

        # ---- epilogue: O / l -> f16, staged in the warp's own rows of the Q tile, 16-byte stores ---------
        store_out(smem32, out32, o, ml, warp * 16, q0, nt, qs, h)

    return attn_kernel


def _make_kernel_wgmma(g: Geometry):
    """MMA=wgmma: the same FlashAttention-2 loop (cp.async ring, online softmax, P as f16 A fragments) with both
    products on the Hopper warpgroup MMA (PTX ISA §9.7.15 "wgmma"), as FlashAttention-3 (Shah et al. 2024) issues
    them: each warpgroup (4 warps, 64 query rows) computes S = Q·K^T with one m64nBKk16 a k16 step, both operands
    from shared memory through descriptors, and O += P·V with one m64nDk16 a k16 step of keys, P from registers
    (`wgmma_m64nNk16_f32_f16_rs`: the S C fragments packed to f16 are its A fragments) and V read MN-major (the
    instruction's transposed B: no copy of V^T is made). The per-warp fragments of S and O are mma.sync's, so the
    softmax and epilogue are the mma_sync kernel's.

    Shared memory, 1024-byte aligned, Q, K and V tiles all in one layout: D/64 column blocks of [rows x 128 B], row
    r's 16-byte chunk c at chunk c ^ (r & 7) (the 128-byte swizzle). For Q and K it is the canonical K-major layout
    (a k16 step's descriptor starts 32 bytes on, a column block later every 4 steps; SBO = 1024 between 8-row
    groups); for V, whose rows are keys (the k of P·V) and columns d (its n), it is the canonical MN-major layout
    (`kernels.ptx.wgmma.operand_byte_offsets`: LBO = the column-block stride between 64-d blocks, SBO = 1024
    between 8-key groups, a k16 step 2048 bytes on). Every thread issues `fence.proxy.async` after its cp.async
    bytes land and before the barrier that publishes the tile to the wgmma (async) proxy.

    No subroutine call anywhere in the kernel: ptxas lowers a 64-bit integer division and an IEEE float division
    (rcp.rn / div.rn) to calls, and a call in the function makes it serialize every wgmma (its C7509 warning,
    "wgmma.mma_async instructions are serialized due to the presence of Extern calls"). So the GQA head index
    divides in uint32 and the epilogue's 1 / l is `div.approx`; the compile test checks the warning is absent."""
    BQ, BK, STAGES, CAUSAL = g.bq, g.bk, g.stages, g.causal
    D = g.head_dim
    DP = padded_head_dim(D)  # elements of a shared row: DP / 64 column blocks
    DCH = D // 8
    DCHP = DP // 8
    CSH = DCHP.bit_length() - 1
    CM = DCHP - 1
    KS16 = D // 16  # k16 steps of Q·K^T
    NK16 = BK // 16  # k16 steps of P·V
    THREADS = g.threads
    SQB = BQ * DP * 2  # bytes: the Q tile
    SKVB = BK * DP * 2  # one K (or V) tile
    STB = 2 * SKVB
    QBLK = BQ * 128  # bytes of one 64-column block of the Q tile
    KBLK = BK * 128  # ... of a K or V tile
    # P·V runs m64n(DP)k16: at D = 80 / 96 the V rows' unloaded padding columns land in O columns that are never
    # rescaled or stored (output columns are independent), and the product stays on whole 64-column swizzle atoms
    # of the MN-major V (CUTLASS / FlashAttention-3 never issue a partial atom there; nor do we)
    O_N = DP // 2  # f32 O accumulators per lane (m64n(DP)k16: DP / 2)
    S_N = BK // 2
    P_N = BK // 4  # f16x2 A words of P per lane
    Q_CH = BQ * DCHP // THREADS
    KV_CH = BK * DCHP // THREADS
    SBO = 1024
    LBO = 16  # unused by swizzled K-major operands whose k16 step stays inside a 128-byte row
    M_INIT = float32(-1e30)
    ZERO = float32(0.0)
    SMEM_ALIGN = None if SIMULATOR else 1024
    softmax_pack, store_out = _tile_steps(g)

    @cuda.jit(device=True, inline="always")
    def load_tile(smem, k, v, t, tid, nt_kv, ks, hk):
        """cp.async of key tile t's K and V rows into ring slot t % STAGES (rows past nt_kv zero-filled)."""
        base = SQB + (t % STAGES) * STB
        for rep in range(KV_CH):
            c = tid + rep * THREADS
            r = c >> CSH
            ch = c & CM
            kj = t * BK + r
            if ch < DCH:  # the padding chunks of a DP-wide row are never read
                ok = kj < nt_kv
                gidx = kj * ks + hk * D + ch * 8 if ok else 0
                at = (base + (ch >> 3) * KBLK + r * 128 + (((ch & 7) ^ (r & 7)) << 4)) >> 1
                cp_async_16(smem, at, k, gidx, 16 if ok else 0)
                cp_async_16(smem, at + SKVB // 2, v, gidx, 16 if ok else 0)

    @cuda.jit(device=True, inline="always")
    def issue_s(smem, s, desc_q, desc_k, t):
        """S = Q · K_t^T: one m64nBKk16 a k16 step on the tile in slot t % STAGES, committed, not waited."""
        slot = uint64(((t % STAGES) * STB) >> 4)
        wgmma_fence()
        for kq in range(KS16):
            step_q = uint64(((kq >> 2) * QBLK + (kq & 3) * 32) >> 4)
            step_k = uint64(((kq >> 2) * KBLK + (kq & 3) * 32) >> 4)
            wgmma_m64nNk16_f32_f16(smem, s, 0, desc_q + step_q, desc_k + slot + step_k, uint32(1 if kq > 0 else 0),
                                   BK)
        wgmma_commit_group()

    @cuda.jit(device=True, inline="always")
    def issue_pv(smem, o, p, desc_v, t):
        """O += P · V_t: one m64n(DP)k16 a k16 step of keys, P from the A words ``p`` (`softmax_pack`, written before
        the wgmma.fence, as the PTX ISA asks), V MN-major; committed."""
        slot = uint64(((t % STAGES) * STB) >> 4)
        wgmma_fence()
        for kk in range(NK16):
            c = kk * 4
            wgmma_m64nNk16_f32_f16_rs(smem, o, 0, p[c], p[c + 1], p[c + 2], p[c + 3],
                                      desc_v + slot + uint64(kk * (2 * SBO >> 4)), uint32(1), DP, 1)
        wgmma_commit_group()

    def attn_kernel(q, k, v, out32, nt, nt_kv, n_heads, n_kv_heads, offset):
        smem = cuda.shared.array(0, types.float16, alignment=SMEM_ALIGN)
        smem32 = cuda.shared.array(0, types.uint32, alignment=SMEM_ALIGN)
        tid = cuda.threadIdx.x
        lane = tid & 31
        warp = tid >> 5
        wg = tid >> 7
        gr = lane >> 2
        h = cuda.blockIdx.x
        qt = cuda.gridDim.y - 1 - cuda.blockIdx.y
        hk = uint32(h) // (uint32(n_heads) // uint32(n_kv_heads))  # 32-bit: no subroutine call (see above)
        q0 = qt * BQ
        if CAUSAL:
            kend = min(nt_kv, q0 + BQ + offset)
        else:
            kend = nt_kv
        ntiles = (kend + BK - 1) // BK
        qs = n_heads * D
        ks = n_kv_heads * D

        # ---- prologue: Q, then tiles 0 .. STAGES-2 (one commit group each; the one swizzled layout) ---------
        for rep in range(Q_CH):
            c = tid + rep * THREADS
            r = c >> CSH
            ch = c & CM
            qi = q0 + r
            if ch < DCH:
                ok = qi < nt
                gidx = qi * qs + h * D + ch * 8 if ok else 0
                cp_async_16(smem, ((ch >> 3) * QBLK + r * 128 + (((ch & 7) ^ (r & 7)) << 4)) >> 1, q, gidx,
                            16 if ok else 0)
        cp_async_commit_group()
        for t in range(STAGES - 1):
            if t < ntiles:
                load_tile(smem, k, v, t, tid, nt_kv, ks, hk)
            cp_async_commit_group()

        o = cuda.local.array(O_N, float32)
        s = cuda.local.array(S_N, float32)
        p = cuda.local.array(P_N, uint32)
        ml = cuda.local.array(4, float32)
        for x in range(O_N):
            o[x] = ZERO
        ml[0] = M_INIT
        ml[1] = M_INIT
        ml[2] = ZERO
        ml[3] = ZERO
        row_lo = q0 + warp * 16 + gr
        desc_q = wgmma_desc(smem, wg * 64 * 128, LBO, SBO, SWIZZLE_128B)
        desc_k = wgmma_desc(smem, SQB, LBO, SBO, SWIZZLE_128B)
        desc_v = wgmma_desc(smem, SQB + SKVB, KBLK, SBO, SWIZZLE_128B)  # MN-major: LBO = the 64-d block stride

        for j in range(ntiles):
            cp_async_wait_group(0)  # tile j (and Q) have landed
            fence_proxy_async_shared()  # this thread's landed cp.async bytes (Q, K_j, V_j) -> the wgmma proxy
            cuda.syncthreads()  # tile j visible; every warpgroup's products on tile j-1's slot are done
            if j + 1 < ntiles:
                load_tile(smem, k, v, j + 1, tid, nt_kv, ks, hk)
            cp_async_commit_group()
            issue_s(smem, s, desc_q, desc_k, j)
            wgmma_wait_group(0)
            softmax_pack(s, o, ml, p, j * BK, q0, row_lo, nt_kv, offset)
            issue_pv(smem, o, p, desc_v, j)
            wgmma_wait_group(0)
        cp_async_wait_group(0)
        cuda.syncthreads()  # every warpgroup's last wgmma has read Q before the epilogue stages O over it

        store_out(smem32, out32, o, ml, warp * 16, q0, nt, qs, h)

    return attn_kernel


SIGNATURE = types.void(
    types.float16[::1], types.float16[::1], types.float16[::1], types.uint32[::1],
    types.int64, types.int64, types.int64, types.int64, types.int64,
)
_CACHE = KernelCache("flash_attention", SIGNATURE)


def kernel_ptx(config: dict | None, causal: bool = True, cc=(9, 0), head_dim: int = 128) -> str:
    """PTX of the kernel for ``config`` and ``head_dim`` (NVVM for ``cc``; needs no GPU; not under the simulator)."""
    g = geometry(config, causal, head_dim)
    ptx, _ = cuda.compile_ptx(_make_kernel(g), SIGNATURE, cc=cc, launch_bounds=(g.threads,))
    return ptx


def build(config: dict | None = None, causal: bool = True, head_dim: int = 128) -> BuiltKernel:
    """Compile (once per knob combination, causal flag and head_dim; cached) and return the kernel; opts in above
    48 KB of shared memory."""
    g = geometry(config, causal, head_dim)
    return _CACHE.get(g, _make_kernel, g.smem_bytes, g.threads, hint="lower BK")


def check_inputs(q, k, v, out=None, causal: bool = True) -> tuple[int, int, int, int, int]:
    """Validate the operands; return (nt, nt_kv, n_heads, n_kv_heads, head_dim). One-line KernelConstraintError."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if getattr(x, "ndim", None) != 3:
            raise KernelConstraintError(f"flash_attention: {name} must be a 3-D f16 device array [tokens, heads, "
                                        f"head_dim], got ndim {getattr(x, 'ndim', None)}")
        if np.dtype(x.dtype) != np.float16:
            raise KernelConstraintError(f"flash_attention: {name} must be float16, got {x.dtype}")
        if not is_contiguous(x):
            raise KernelConstraintError(f"flash_attention: {name} must be C-contiguous, got strides {x.strides}")
    nt, n_heads, hd = q.shape
    nt_kv, n_kv_heads, _ = k.shape
    for name, x in (("k", k), ("v", v)):
        if x.shape[2] != hd:
            raise KernelConstraintError(f"flash_attention: q has head_dim {hd} but {name} has {x.shape[2]}")
    why = head_dim_refusal(hd)
    if why:
        raise KernelConstraintError(f"flash_attention: {why}")
    if tuple(v.shape) != tuple(k.shape):
        raise KernelConstraintError(f"flash_attention: k and v shapes differ: {tuple(k.shape)} vs {tuple(v.shape)}")
    if nt == 0 or nt_kv == 0 or n_heads == 0 or n_kv_heads == 0:
        raise KernelConstraintError(f"flash_attention: empty operand (nt={nt}, nt_kv={nt_kv}, heads={n_heads}/{n_kv_heads})")
    if n_heads % n_kv_heads:
        raise KernelConstraintError(f"flash_attention: n_heads ({n_heads}) must be a multiple of n_kv_heads ({n_kv_heads})")
    if causal and nt_kv < nt:
        raise KernelConstraintError(f"flash_attention: causal needs nt_kv >= nt (the queries are the last nt cached positions), got nt={nt}, nt_kv={nt_kv}")
    if out is not None:
        if tuple(out.shape) != (nt, n_heads, hd) or np.dtype(out.dtype) != np.float16 or not is_contiguous(out):
            raise KernelConstraintError(
                f"flash_attention: out must be a C-contiguous float16 [{nt}, {n_heads}, {hd}] array, got {out.dtype} {tuple(out.shape)}"
            )
    if not SIMULATOR:
        for name, x in (("q", q), ("k", k), ("v", v), ("out", out)):
            if x is not None and x.device_ctypes_pointer.value % 16:
                raise KernelConstraintError(f"flash_attention: {name} must start 16-byte aligned (its rows are copied "
                                            f"16 bytes at a time); a view starting mid-row is not")
    return nt, nt_kv, n_heads, n_kv_heads, hd


def flash_attention(q, k, v, out=None, *, causal: bool = True, config: dict | None = None, stream=0):
    """Enqueue attention ``O = softmax(Q·K^T / sqrt(D) + mask) · V`` on ``stream`` and return O.

    q: f16 device array [nt, n_heads, D] (row-major), D = head_dim, one of HEAD_DIMS (64, 80, 96, 128, 256). k, v:
    f16 device arrays [nt_kv, n_kv_heads, D] (the f16 KV cache, positions 0..nt_kv-1). Query row i sits at position
    i + (nt_kv - nt) (a cached prefix of nt_kv - nt tokens precedes it); with ``causal`` it attends keys
    j <= i + (nt_kv - nt), else every key. GQA: query head h reads KV head h // (n_heads // n_kv_heads). out:
    optional f16 [nt, n_heads, D]; allocated when None. Products on the tensor cores (mma.sync m16n8k16, or wgmma
    with MMA=wgmma; f16 operands, f32 accumulation); softmax in f32; P rounded to f16 for P·V (relative error ~1e-3
    vs float64).
    config: knobs BK (keys per tile, 32/64) and MMA (mma_sync, or wgmma: Hopper warpgroup MMA, needs an sm_90a
    device); 64 query rows a block, a two-slot K/V ring.

    Constraints (KernelConstraintError, one line): q, k, v 3-D float16 C-contiguous, 16-byte aligned, with one
    head_dim in HEAD_DIMS; k and v the same shape; n_heads % n_kv_heads == 0; causal needs nt_kv >= nt; out f16
    [nt, n_heads, D]. nt and nt_kv may be any size >= 1 (tails zero-filled by cp.async src-size 0, masked, and
    not written).

    Algorithm: FlashAttention-2 (Dao 2023) forward; fragment layouts from the PTX ISA (see the module docstring).
    """
    nt, nt_kv, n_heads, n_kv_heads, hd = check_inputs(q, k, v, out, causal)
    built = build(config, causal, hd)
    g = built.geometry
    if out is None:
        out = cuda.device_array((nt, n_heads, hd), dtype=np.float16, stream=stream)
    out32 = out.reshape(nt * n_heads * hd).view(np.uint32)
    built.kernel[g.grid(nt, n_heads), g.threads, stream, g.smem_bytes](
        q.reshape(nt * n_heads * hd), k.reshape(nt_kv * n_kv_heads * hd),
        v.reshape(nt_kv * n_kv_heads * hd), out32, nt, nt_kv, n_heads, n_kv_heads, nt_kv - nt,
    )
    return out
