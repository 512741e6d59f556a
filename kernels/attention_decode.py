"""Decode attention (flash-decoding): one new query token of every head over the f16 KV cache, split along L.

``out[h, :] = softmax_j(q[h, :] · K[j, h // G, :] / sqrt(D), j < L) · V[j, h // G, :]``, q f32 or f16
``[n_heads, D]``, K/V cache f16 ``[L_max, n_kv_heads, D]``, L read on the device from ``length_dev[0]`` (an int32
device scalar: one CUDA graph replays every decode step), out f32 ``[n_heads, D]``; head_dim D one of
`kernels.attention_config.HEAD_DIMS` (64, 80, 96, 128, 256), compiled per D.

Two kernels (Flash-Decoding, Dao, Haziza, Massa, Sizov 2023):

1. ``partial``: grid (splits, n_kv_heads), 4 warps per block. Warp p of the first U = min(4 * splits, L) takes the
   contiguous keys p·c .. p·c + c - 1 with c = ceil(L / U) (the last partitions may be short or empty; U computed
   on the device from L, so any L in 1..L_max
   works with a fixed grid; a block whose warps all lie past U returns at once). A warp serves all G query heads of
   its KV head (each K/V row is read once for G heads). A group of DP/8 lanes, DP = `padded_head_dim(D)` (a
   quarter-, half- or whole warp for DP = 64, 128, 256) takes one cache row: lane l owns dims 8(l % (DP/8))..+7,
   one 16-byte load of K and one of V per row (lanes past D/8, at D = 80 or 96, load nothing and add zeros), two
   rows a lane group in flight; a score is a lane's 8-term dot reduced by log2(DP/8) shuffles inside the group
   (all groups share each shuffle), then an online softmax in f32 (log2 domain), one rescale per head per
   iteration. The lane groups' states join by shuffles, the block's four warps' through shared memory, and the block
   writes one workspace row per head: its keys' (m, l) and the unnormalised accumulator acc[D] (an empty partition
   joins as m = -1e30, l = 0, acc = 0).
2. ``combine``: grid (n_heads, ceil(D / 32)), 8 warps per block, lane = one of the block's 32 dims, over the
   ceil(U / 4) block rows: M = max_p m_p, out = Σ 2^(m_p-M) acc_p / Σ 2^(m_p-M) l_p. Each warp finds M and the
   denominator over all rows itself (shuffles, no barrier) and sums every 8th row's acc with four rows' loads in
   flight; one shared-memory sum joins the 8 warps.

Plain FMA (memory-bound: each step reads 2 · L · n_kv_heads · D · 2 bytes of cache). Sources: Flash-Decoding
(https://crfm.stanford.edu/2023/10/12/flashdecoding.html); online softmax (Milakov & Gimelshein 2018).
"""

from __future__ import annotations

import math
import threading

import numpy as np
from numba import cuda, float32, types
from numba.cuda.cudadrv import devicearray

from kernels.attention_config import head_dim_refusal, padded_head_dim
from kernels.errors import KernelConstraintError
from kernels.jit import kernel
from kernels.launch import launch_kernel
from kernels.ptx import SIMULATOR, ld_global_v4_b32, pdl_enter, shfl_xor_f32, unpack_f16x2
from kernels.quantize_q8 import check_q8, quantize_warp_block, store_residual

WARPS = 4
COMBINE_WARPS = 8
"""Warps of a combine block: each sums every 8th partition for one 32-dim slice of one head."""
DEFAULT_SPLITS = 64
"""The engine's ATTN_SPLITS default: 64 tied 128 at tg128 and beat it at 16384 cached tokens (the ledger)."""
SPLITS_VALUES = (1, 2, 4, 8, 16, 32, 64, 128)
MAX_GROUP = 16
"""Largest GQA group G = n_heads / n_kv_heads at head_dim <= 128: a block joins its warps' G x D accumulators in
32 KiB of static shared memory at G = 16, D = 128 (48 KiB is the static limit); ptxas keeps G <= 9 in registers,
larger groups put part of their accumulators on the stack (local memory). `max_group` gives the limit per D."""


def max_group(head_dim: int) -> int:
    """The largest GQA group the partial kernel takes at ``head_dim``: MAX_GROUP, halved at 256 (the same 32 KiB of
    shared accumulators)."""
    return min(MAX_GROUP, MAX_GROUP * 128 // int(head_dim))
KEYS_IN_FLIGHT = 2
"""Cache rows a lane group (D/8 lanes, one row) loads before it computes (four would leave G=7's accumulators in
local memory at D=128: NVVM keeps the larger loops rolled)."""


def used_partitions(L: int, parts: int, l_max: int | None = None) -> int:
    """U, the warp partitions a call over L keys uses out of ``parts`` (at least 1; L clamped to ``l_max`` as the
    kernels do; host twin of their device computation)."""
    if l_max is not None:
        L = min(L, l_max)
    return max(1, min(parts, L))


def _make_partial(G: int, D: int):
    DCH = D // 8  # 8-dim chunks of a row: lanes sub >= DCH (D = 80, 96) own padding and load nothing
    LR = padded_head_dim(D) // 8  # lanes of one cache row (8 dims each): 8, 16 or 32
    LSH = LR.bit_length() - 1
    RPW = 32 // LR  # rows a warp reads at once
    JOINS = (RPW).bit_length() - 1  # shuffle rounds that join the warp's lane groups: log2(RPW)
    KH = KEYS_IN_FLIGHT  # rows a lane group loads per iteration
    KW = KH * 4  # (local.array sizes must be plain constants: numba does not fold products)
    KF = KH * 8
    GK = G * KH
    GQ = G * 8
    SC = float32(math.log2(math.e) / math.sqrt(D))
    M_INIT = float32(-1e30)
    ZERO = float32(0.0)
    NP = WARPS
    NT = NP * 32

    def partial_kernel(q, kc, vc, length, ws_ml, ws_acc, l_max, n_heads, n_kv_heads):
        pdl_enter()
        tid = cuda.threadIdx.x
        lane = tid & 31
        slot = lane >> LSH
        sub = lane & (LR - 1)
        warp = tid >> 5
        hk = cuda.blockIdx.y
        blk = cuda.blockIdx.x
        p = blk * NP + warp
        L = min(length[0], l_max)
        parts = max(1, min(cuda.gridDim.x * NP, L))
        if blk * NP >= parts:
            return  # the whole block idle (uniform: no barrier is skipped)
        chunk = (L + parts - 1) // parts
        kbeg = p * chunk
        kend = min(L, kbeg + chunk) if p < parts else kbeg
        ks = n_kv_heads * D
        col = hk * D + sub * 8
        sm_acc = cuda.shared.array((NP, G, D), float32)
        sm_ml = cuda.shared.array((NP, G, 2), float32)

        qv = cuda.local.array(GQ, float32)
        acc = cuda.local.array(GQ, float32)
        m = cuda.local.array(G, float32)
        ls = cuda.local.array(G, float32)
        kw = cuda.local.array(KW, types.uint32)
        vw = cuda.local.array(KW, types.uint32)
        kf = cuda.local.array(KF, float32)
        sc = cuda.local.array(GK, float32)
        alpha = cuda.local.array(G, float32)
        ok = cuda.local.array(KH, types.boolean)
        real = sub < DCH
        for gi in range(G):
            m[gi] = M_INIT
            ls[gi] = ZERO
            for e in range(8):
                qv[gi * 8 + e] = float32(q[(hk * G + gi) * D + sub * 8 + e]) * SC if real else ZERO
                acc[gi * 8 + e] = ZERO
        for w in range(KW):  # a padding lane's K and V words stay zero
            kw[w] = types.uint32(0)
            vw[w] = types.uint32(0)

        for t in range(kbeg, kend, RPW * KH):
            for u in range(KH):
                j = t + RPW * u + slot
                ok[u] = j < kend
                row = j if j < kend else kbeg
                if real:
                    kw[u * 4], kw[u * 4 + 1], kw[u * 4 + 2], kw[u * 4 + 3] = ld_global_v4_b32(kc, row * ks + col)
                    vw[u * 4], vw[u * 4 + 1], vw[u * 4 + 2], vw[u * 4 + 3] = ld_global_v4_b32(vc, row * ks + col)
            for w in range(KW):
                lo, hi = unpack_f16x2(kw[w])
                kf[2 * w] = float32(lo)
                kf[2 * w + 1] = float32(hi)
            # scores of the G heads x KH keys (lane partial dots, then log2(LR) shuffles inside the lane group)
            for i in range(GK):
                x = (i // KH) * 8
                y = (i % KH) * 8
                s = ZERO
                for e in range(8):
                    s += qv[x + e] * kf[y + e]
                sc[i] = s
            if LR == 32:
                for i in range(GK):
                    sc[i] += shfl_xor_f32(sc[i], 16)
            if LR >= 16:
                for i in range(GK):
                    sc[i] += shfl_xor_f32(sc[i], 8)
            for i in range(GK):
                sc[i] += shfl_xor_f32(sc[i], 4)
            for i in range(GK):
                sc[i] += shfl_xor_f32(sc[i], 2)
            for i in range(GK):
                sc[i] += shfl_xor_f32(sc[i], 1)
            # online softmax: one rescale per head per iteration
            for gi in range(G):
                m_new = m[gi]
                for u in range(KH):
                    if ok[u]:
                        m_new = max(m_new, sc[gi * KH + u])
                alpha[gi] = math.exp2(m[gi] - m_new)
                m[gi] = m_new
                lsum = ls[gi] * alpha[gi]
                for u in range(KH):
                    pj = math.exp2(sc[gi * KH + u] - m_new) if ok[u] else ZERO
                    sc[gi * KH + u] = pj
                    lsum += pj
                ls[gi] = lsum
            for w in range(KW):
                lo, hi = unpack_f16x2(vw[w])
                kf[2 * w] = float32(lo)
                kf[2 * w + 1] = float32(hi)
            for gi in range(G):
                for e in range(8):
                    a = acc[gi * 8 + e] * alpha[gi]
                    for u in range(KH):
                        a += sc[gi * KH + u] * kf[u * 8 + e]
                    acc[gi * 8 + e] = a

        for gi in range(G):
            # join the warp's lane groups (lanes l and l ^ LR, l ^ 2LR own the same dims) into shared memory
            x = gi * 8
            mg = m[gi]
            lg = ls[gi]
            for step in range(JOINS):
                off = LR << step
                mo = shfl_xor_f32(mg, off)
                lo_ = shfl_xor_f32(lg, off)
                mm = max(mg, mo)
                a = math.exp2(mg - mm)
                b = math.exp2(mo - mm)
                lg = lg * a + lo_ * b
                mg = mm
                for e in range(8):
                    acc[x + e] = acc[x + e] * a + shfl_xor_f32(acc[x + e], off) * b
            if lane == 0:
                sm_ml[warp, gi, 0] = mg
                sm_ml[warp, gi, 1] = lg
            if slot == 0 and real:
                for e in range(8):
                    sm_acc[warp, gi, sub * 8 + e] = acc[x + e]
        cuda.syncthreads()
        # join the block's NP warps: thread tid owns dims tid, tid + 128 of every head; one workspace row per block
        for gi in range(G):
            mm = sm_ml[0, gi, 0]
            for w in range(1, NP):
                mm = max(mm, sm_ml[w, gi, 0])
            row = blk * n_heads + hk * G + gi
            for d in range(tid, D, NT):
                num = ZERO
                for w in range(NP):
                    num += math.exp2(sm_ml[w, gi, 0] - mm) * sm_acc[w, gi, d]
                ws_acc[row * D + d] = num
            if tid == 0:
                den = ZERO
                for w in range(NP):
                    den += math.exp2(sm_ml[w, gi, 0] - mm) * sm_ml[w, gi, 1]
                ws_ml[row * 2] = mm
                ws_ml[row * 2 + 1] = den

    return partial_kernel


Q8_MODES = (0, 1, 2)
"""What the combine also writes: 0 nothing, 1 the output's Q8_1 blocks, 2 the compensated Q8_1 blocks (with the
residual values) — the mat-vec input of the output projection (`kernels.quantize_q8`), so no separate quantization
kernel runs (decode's FUSE_ATTN_Q8)."""


def _make_combine(q8_mode: int, D: int):
    Q8 = q8_mode
    RW = WARPS  # warp partitions joined in one workspace row
    CW = COMBINE_WARPS
    M_INIT = float32(-1e30)
    ZERO = float32(0.0)

    def combine_kernel(ws_ml, ws_acc, out, length, l_max, grid_parts, n_heads, q8q, q8d, q8s, q8r):
        pdl_enter()
        L = min(length[0], l_max)
        parts = (max(1, min(grid_parts, L)) + RW - 1) // RW
        h = cuda.blockIdx.x
        lane = cuda.threadIdx.x & 31
        warp = cuda.threadIdx.x >> 5
        d = cuda.blockIdx.y * 32 + lane  # past D (the last block at D = 80) a lane only helps the reductions
        # every warp finds M = max_p m_p and the denominator itself (1 KiB of (m, l) pairs: no barrier needed)
        mx = M_INIT
        for p in range(lane, parts, 32):
            mx = max(mx, ws_ml[(p * n_heads + h) * 2])
        for off in (16, 8, 4, 2, 1):
            mx = max(mx, shfl_xor_f32(mx, off))
        den = ZERO
        for p in range(lane, parts, 32):
            row = p * n_heads + h
            den += math.exp2(ws_ml[row * 2] - mx) * ws_ml[row * 2 + 1]
        for off in (16, 8, 4, 2, 1):
            den += shfl_xor_f32(den, off)
        # warp w sums partitions w, w + CW, ...: four rows' loads issued together per iteration
        n0 = ZERO
        n1 = ZERO
        n2 = ZERO
        n3 = ZERO
        p = warp
        while p + 3 * CW < parts:
            r0 = p * n_heads + h
            r1 = r0 + CW * n_heads
            r2 = r1 + CW * n_heads
            r3 = r2 + CW * n_heads
            dd = min(d, D - 1)  # a lane past D reads a real element and never stores it
            a0 = ws_acc[r0 * D + dd]
            a1 = ws_acc[r1 * D + dd]
            a2 = ws_acc[r2 * D + dd]
            a3 = ws_acc[r3 * D + dd]
            n0 += math.exp2(ws_ml[r0 * 2] - mx) * a0
            n1 += math.exp2(ws_ml[r1 * 2] - mx) * a1
            n2 += math.exp2(ws_ml[r2 * 2] - mx) * a2
            n3 += math.exp2(ws_ml[r3 * 2] - mx) * a3
            p += 4 * CW
        while p < parts:
            r0 = p * n_heads + h
            n0 += math.exp2(ws_ml[r0 * 2] - mx) * ws_acc[r0 * D + min(d, D - 1)]
            p += CW
        part = cuda.shared.array((CW, 32), float32)
        part[warp, lane] = (n0 + n1) + (n2 + n3)
        cuda.syncthreads()
        if warp == 0:
            num = part[0, lane]
            for w in range(1, CW):
                num += part[w, lane]
            v = num / den if den > ZERO else ZERO
            if d < D:
                out[h * D + d] = v
            if Q8 != 0:  # warp 0's 32 lanes are one Q8_1 block of the output: elements h·D + 32·y .. + 31 (D a
                # multiple of 32: `decode_attention` refuses q8 otherwise)
                scaled, qv = quantize_warp_block(v, h * D + d, q8q, q8d, q8s)
                if Q8 == 2:
                    store_residual(scaled, qv, h * D + d, q8r)

    return combine_kernel


def partial_signature(q_dtype) -> types.Signature:
    qt = types.float32 if np.dtype(q_dtype) == np.float32 else types.float16
    return types.void(
        qt[::1], types.float16[::1], types.float16[::1], types.int32[::1], types.float32[::1], types.float32[::1],
        types.int64, types.int64, types.int64,
    )


COMBINE_SIGNATURE = types.void(types.float32[::1], types.float32[::1], types.float32[::1], types.int32[::1], types.int64,
                               types.int64, types.int64, types.int8[::1], types.float32[::1], types.float32[::1],
                               types.int8[::1])
"""The combine's arguments; the last four are the Q8_1 blocks' q, d, s, r (views of the workspace when the mode
writes none: never touched then)."""

_BUILT: dict = {}
_BUILD_LOCK = threading.Lock()


def build(group: int, q_dtype=np.float32, q8_mode: int = 0, head_dim: int = 128):
    """(partial, combine) dispatchers for GQA group size ``group``, q dtype, the combine's ``q8_mode`` (`Q8_MODES`)
    and ``head_dim`` (one of HEAD_DIMS; compiled once; cached). The partial kernel has no launch bound beyond its
    block size (ptxas may take up to 255 registers a thread: capping them spilled G = 7's accumulators and lost,
    ledger #170)."""
    key = (int(group), np.dtype(q_dtype).name, int(q8_mode), int(head_dim))
    with _BUILD_LOCK:
        if key not in _BUILT:
            _BUILT[key] = (
                kernel(_make_partial(int(group), int(head_dim)), partial_signature(q_dtype), threads=WARPS * 32),
                kernel(_make_combine(int(q8_mode), int(head_dim)), COMBINE_SIGNATURE, threads=COMBINE_WARPS * 32),
            )
        return _BUILT[key]


def kernel_ptx(group: int, q_dtype=np.float32, cc=(9, 0), q8_mode: int = 0, head_dim: int = 128) -> tuple[str, str]:
    """PTX of (partial, combine) for ``group``, ``q8_mode`` and ``head_dim`` (NVVM; no GPU needed; not under the
    simulator)."""
    a, _ = cuda.compile_ptx(_make_partial(group, head_dim), partial_signature(q_dtype), cc=cc,
                            launch_bounds=(WARPS * 32,))
    b, _ = cuda.compile_ptx(_make_combine(q8_mode, head_dim), COMBINE_SIGNATURE, cc=cc,
                            launch_bounds=(COMBINE_WARPS * 32,))
    return a, b


def decode_workspace(n_heads: int, splits: int = DEFAULT_SPLITS, stream=0, head_dim: int = 128):
    """Device workspace (ml f32 [splits*n_heads*2], acc f32 [splits*n_heads*head_dim]: one row per block and head)
    for `decode_attention`'s ``workspace``; allocate it once, outside any graph capture, and pass it on every call."""
    return (cuda.device_array(splits * n_heads * 2, dtype=np.float32, stream=stream),
            cuda.device_array(splits * n_heads * head_dim, dtype=np.float32, stream=stream))


def _is_contiguous(x) -> bool:
    flags = getattr(x, "flags", None)
    if flags is not None:
        try:
            return bool(flags["C_CONTIGUOUS"])
        except (KeyError, TypeError):
            pass
    return bool(getattr(x, "is_c_contiguous", lambda: True)())


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _check_workspace(workspace, n_heads: int, splits: int, head_dim: int) -> None:
    if not (isinstance(workspace, tuple) and len(workspace) == 2):
        raise KernelConstraintError("decode_attention: workspace must be the (ml, acc) pair decode_workspace(n_heads, "
                                    f"splits, head_dim=...) returns, got {type(workspace).__name__}")
    for name, w, need in (("ml", workspace[0], splits * n_heads * 2),
                          ("acc", workspace[1], splits * n_heads * head_dim)):
        if not (devicearray.is_cuda_ndarray(w) and w.ndim == 1 and np.dtype(w.dtype) == np.float32 and _is_contiguous(w)
                and w.shape[0] >= need):
            raise KernelConstraintError(f"decode_attention: workspace {name} must be a contiguous 1-D float32 device "
                                        f"array of at least {need} elements (decode_workspace({n_heads}, {splits}, "
                                        f"head_dim={head_dim})), got {getattr(w, 'dtype', type(w).__name__)} "
                                        f"{tuple(getattr(w, 'shape', ()))}")


def check_inputs(q, k_cache, v_cache, length_dev, out, splits) -> tuple[int, int, int, int]:
    """Validate; return (n_heads, n_kv_heads, l_max, head_dim). One-line KernelConstraintError."""
    for name, x in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("length_dev", length_dev), ("out", out)):
        if x is not None and not devicearray.is_cuda_ndarray(x):
            raise KernelConstraintError(f"decode_attention: {name} must be a CUDA device array, got {type(x).__name__}")
    if getattr(q, "ndim", None) != 2 or np.dtype(q.dtype) not in (np.float32, np.float16) or not _is_contiguous(q):
        raise KernelConstraintError(f"decode_attention: q must be a C-contiguous float32/float16 [n_heads, head_dim] "
                                    f"array, got {getattr(q, 'dtype', None)} ndim {getattr(q, 'ndim', None)}")
    hd = q.shape[1]
    why = head_dim_refusal(hd)
    if why:
        raise KernelConstraintError(f"decode_attention: {why}")
    for name, x in (("k_cache", k_cache), ("v_cache", v_cache)):
        if getattr(x, "ndim", None) != 3 or np.dtype(x.dtype) != np.float16 or not _is_contiguous(x):
            raise KernelConstraintError(f"decode_attention: {name} must be a C-contiguous float16 [L_max, n_kv_heads, "
                                        f"head_dim] array, got {getattr(x, 'dtype', None)} ndim {getattr(x, 'ndim', None)}")
        if x.shape[2] != hd:
            raise KernelConstraintError(f"decode_attention: q has head_dim {hd} but {name} has {x.shape[2]}")
    if tuple(k_cache.shape) != tuple(v_cache.shape):
        raise KernelConstraintError(f"decode_attention: k_cache and v_cache shapes differ: {tuple(k_cache.shape)} vs {tuple(v_cache.shape)}")
    if not SIMULATOR:
        for name, x in (("k_cache", k_cache), ("v_cache", v_cache)):
            if x.device_ctypes_pointer.value % 16:
                raise KernelConstraintError(f"decode_attention: {name} must start 16-byte aligned (its rows are read "
                                            f"16 bytes at a time); a view starting mid-row is not")
    if q.shape[0] == 0:
        raise KernelConstraintError("decode_attention: q has no heads")
    n_heads = q.shape[0]
    l_max, n_kv_heads, _ = k_cache.shape
    if n_kv_heads == 0 or n_heads % n_kv_heads:
        raise KernelConstraintError(f"decode_attention: n_heads ({n_heads}) must be a multiple of n_kv_heads ({n_kv_heads})")
    if n_heads // n_kv_heads > max_group(hd):
        raise KernelConstraintError(f"decode_attention: GQA group n_heads / n_kv_heads = {n_heads // n_kv_heads} is "
                                    f"above the supported {max_group(hd)} (at head_dim {hd})")
    if getattr(length_dev, "ndim", None) != 1 or np.dtype(length_dev.dtype) != np.int32 or length_dev.shape[0] < 1:
        raise KernelConstraintError("decode_attention: length_dev must be a 1-D int32 device array holding L in element 0")
    if not _is_int(splits) or splits not in SPLITS_VALUES:
        raise KernelConstraintError(f"decode_attention: splits must be one of {', '.join(map(str, SPLITS_VALUES))}, got {splits}")
    if out is not None and (tuple(out.shape) != (n_heads, hd) or np.dtype(out.dtype) != np.float32 or not _is_contiguous(out)):
        raise KernelConstraintError(f"decode_attention: out must be a C-contiguous float32 [{n_heads}, {hd}] array, got {out.dtype} {tuple(out.shape)}")
    return n_heads, n_kv_heads, l_max, hd


def decode_attention(q, k_cache, v_cache, length_dev, out=None, *, splits: int = DEFAULT_SPLITS, workspace=None,
                     stream=0, pdl: bool = False, q8=None):
    """Enqueue decode attention of one token over the first L = length_dev[0] cache rows; return out.

    q: f32 or f16 device array [n_heads, D], D = head_dim one of HEAD_DIMS (64, 80, 96, 128, 256). k_cache, v_cache: f16
    device arrays [L_max, n_kv_heads, D] (row j = position j). length_dev: int32 device array, L in element 0 (read
    on the device, so a captured CUDA graph replays for every step; L is clamped to L_max; L must be >= 1, L = 0
    gives zeros). GQA: head h reads KV head h // (n_heads // n_kv_heads). Scale 1/sqrt(D). out: optional f32
    [n_heads, D]; allocated when None. splits: blocks along L per KV head (4 warp partitions each; L is cut into
    min(4 * splits, L) partitions), one of SPLITS_VALUES; default DEFAULT_SPLITS (a short cache leaves whole blocks
    idle at once). q8: None, or `kernels.quantize_q8.Q8Blocks` of n_heads * D activations: the combine also writes
    out's Q8_1 blocks (and residual values when they are compensated), bit for bit what `quantize_q8_1(out, q8)`
    would. workspace: from `decode_workspace(n_heads, splits, head_dim=D)`; allocated per call when None (then not
    graph-capture safe). pdl: both kernels are programmatic dependent launches (`kernels.launch`; each waits for the
    kernel before it first: `kernels.ptx.pdl_enter`).

    Constraints (KernelConstraintError, one line): dtypes/shapes as above, C-contiguous, one head_dim in HEAD_DIMS,
    n_heads % n_kv_heads == 0, n_heads / n_kv_heads <= max_group(D) (16; 8 at D = 256); q8 needs D a multiple of 32
    (a Q8_1 block of 32 outputs must lie in one head's combine blocks: not D = 80).

    Algorithm: Flash-Decoding (split-K attention with an online-softmax combine); see the module docstring.
    """
    n_heads, n_kv_heads, l_max, hd = check_inputs(q, k_cache, v_cache, length_dev, out, splits)
    group = n_heads // n_kv_heads
    q8_mode = 0
    if q8 is not None:
        if hd % 32:
            raise KernelConstraintError(f"decode_attention: q8 output needs head_dim a multiple of 32 (a Q8_1 block of "
                                        f"32 outputs must lie in one head), got {hd}; quantize out separately")
        check_q8(q8, n_heads * hd, "q8")
        q8_mode = 2 if q8.compensated else 1
    partial, combine = build(group, q.dtype, q8_mode, hd)
    if out is None:
        out = cuda.device_array((n_heads, hd), dtype=np.float32, stream=stream)
    if workspace is None:
        workspace = decode_workspace(n_heads, splits, stream, head_dim=hd)
    _check_workspace(workspace, n_heads, splits, hd)
    ws_ml, ws_acc = workspace
    parts = WARPS * splits
    flat = l_max * n_kv_heads * hd
    launch_kernel(partial, (splits, n_kv_heads), WARPS * 32, stream,
                  (q.reshape(n_heads * hd), k_cache.reshape(flat), v_cache.reshape(flat), length_dev, ws_ml,
                   ws_acc, l_max, n_heads, n_kv_heads), pdl=pdl)
    if q8 is None:  # typed stand-ins the mode-0 kernel never touches
        q8_args = (ws_acc.view(np.int8), ws_ml, ws_ml, ws_acc.view(np.int8))
    else:
        q8_args = (q8.q, q8.d, q8.s, q8.r if q8.r is not None else q8.q)
    launch_kernel(combine, (n_heads, -(-hd // 32)), COMBINE_WARPS * 32, stream,
                  (ws_ml, ws_acc, out.reshape(n_heads * hd), length_dev, l_max, parts, n_heads) + q8_args,
                  pdl=pdl)
    return out
