"""Quantized matrix-vector product for decode (nt = 1): ``y[od] = W[od, id] · x[id]`` with W in GGUF blocks.

The kernels read W's GGUF blocks straight from device memory (no f16 copy of the weight), decode them in
registers and accumulate in float32 against an f32 activation vector x. Block layouts: ggml-common.h
``block_q4_0`` .. ``block_q6_K``, ``block_mxfp4`` (see `kernels.quant.formats`); the work split follows
llama.cpp's MMVQ kernel (ggml-cuda/mmvq.cu: one CUDA block owns ``rows_per_cuda_block`` rows, its ``nwarps``
warps split each row's blocks between them, a shared-memory sum joins the warps). Two forms of x:

* f32 x (llama.cpp's dmmv.cu route): every weight is converted to float32 and FMA'd (below), every format.
* Q8_1 x (MMVQ, llama.cpp's mmvq.cu + vecdotq.cuh route; Q4_K, Q6_K, Q8_0): x quantized once per step by
  `kernels.quantize_q8` (int8 per element, f32 d and sum per 32); the weights' bytes are unpacked into int8 lanes
  and multiplied four at a time with ``dp4a`` (`kernels.ptx.dp4a_s32`), one float multiply per 32-weight block.
  On the H200 at the ffn shapes: -37% time for Q4_K and -31% for Q6_K against f32 x (ledger #26, #27).

Work split (the same for every format):

* A CUDA block owns ``RPB`` consecutive rows and has ``32 * WPR`` threads. Every warp decodes *all* ``RPB`` rows
  at once: it loads its x values into registers once per step and reuses them for each row, so x is read from
  L1/L2 ``1/RPB`` times per weight (x in f32 is 4 bytes a weight against Q4_K's 0.56, so this reuse matters).
* A row is cut into *chunks* of 32 lanes' work: ``LPB`` lanes share one GGUF block (they read contiguous,
  lane-ordered pieces of it), so a chunk is ``32 / LPB`` consecutive blocks. Warp ``w`` takes chunks
  ``w, w + WPR, w + 2*WPR, ...``; a lane whose block lies past the row's end idles for that step.
* Each lane's piece of a block is decoded into per-byte integers, turned into float32 with the exponent trick
  (``bits(2^23 | q) - (2^23 + offset)`` is exactly ``q - offset``: integer pipe + one FADD instead of the
  quarter-rate ``cvt``) and dotted with its x values; the block's scales multiply the per-sub-block sums
  (``d*sc*Σq·x - dmin*m*Σx``), so a scale costs one multiply per sub-block, not one per weight.
* Lane sums are reduced with ``shfl_xor_sync`` (5 steps), warps through shared memory (when ``WPR > 1``); rows
  past ``od`` in the last CUDA block read row ``od - 1`` (valid memory) and are never written.

Loads: never wider than the format's ``align`` (`kernels.quant.formats`): Q4_K, Q5_K, F16, BF16, F32 use 16-byte
``ld.global.v4.u32``; Q5_1 8-byte; Q4_1, Q2_K 4-byte; the 2-byte-aligned Q4_0, Q5_0, Q8_0, Q3_K, Q6_K halfwords;
MXFP4 bytes. x (16-byte aligned, f32) is always read with 16-byte loads; Q8_1 x with 16-byte loads (Q4_K, Q8_0)
or 4-byte words (Q6_K).

Knobs (compile-time: one specialised kernel per combination, cached): ``RPB`` rows per CUDA block (rows each warp
decodes together), ``WPR`` warps per row (threads per block = 32*WPR), ``UNROLL`` chunks per loop iteration,
``PREFETCH`` (an L2 bulk prefetch of the block's rows first, or a per-chunk lookahead), ``PDL`` (a programmatic
dependent launch, `kernels.launch`), ``residual`` (fused ``y += residual``), the x form
(f32, or Q8_1 blocks: the MMVQ kernels), and GLU (`gemv_glu`: two weights of one shape, gate and up, and
``y = silu(gate·x) * (up·x)`` in the epilogue).
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from kernels.activation import silu_mul
from kernels.errors import KernelConstraintError
from kernels.launch import launch_kernel
from kernels.ptx import (
    cp_async_16_off,
    cp_async_commit_group,
    cp_async_wait_group,
    dp4a_s32,
    griddepcontrol_launch_dependents,
    griddepcontrol_wait,
    ld_global_v2_b32,
    ld_global_v4_b32,
    prefetch_l2,
    prefetch_l2_bulk,
    st_shared_v4_b32,
    syncwarp,
)
from kernels.quant.bits import SIMULATOR, f32_from_bits, f32_from_f16_bits, ld_global_v4_u32
from kernels.quant.dequant import _address, _as_device_array, _check_raw, _check_shape
from kernels.quant.formats import SUPPORTED, block_format
from kernels.quantize_q8 import Q8Blocks, check_q8

RPB_VALUES = (1, 2, 4, 8)
"""Rows per CUDA block (= rows each warp decodes at once, sharing its x registers)."""
WPR_VALUES = (1, 2, 4, 8)
"""Warps per row (each takes every WPR-th chunk of the row); threads per block = 32 * WPR."""
UNROLL_VALUES = (1, 2)
"""Chunks of a row each warp takes per loop iteration (2: both chunks' loads issued before either is decoded)."""
PREFETCH_VALUES = (0, 1, 2, 3)
"""How W's bytes are asked into L2 ahead of the loads that use them; 0: the warps' own loads only.

* 1: thread 0 of every CUDA block first asks the TMA engine to stream the block's RPB rows into L2
  (`kernels.ptx.prefetch_l2_bulk`), so the whole block's weight bytes are in flight at once, not the few rows the
  warps' registers hold. On the H200 slower at the best launch shapes (Q4_K ffn_up 17.0 -> 22.2 µs, Q6_K
  ffn_down 29.1 -> 52.8 µs; ledger #36, #37).
* 2, 3 (lookahead): at the top of every step each warp prefetches the 128-byte lines of the chunk it will decode
  ``PREFETCH - 1`` steps later, for all RPB rows (`_lookahead`: one ``prefetch.global.L2`` per lane and weight
  for up to 32 lines, `kernels.ptx.prefetch_l2`), so the next chunks' DRAM reads overlap this chunk's decode
  without holding registers or shared memory. UNROLL=1 and STAGE 0 or a ring (`prefetch_refusal`). On the H200
  slower at every shape measured: Q4_K MMVQ ffn_down (RPB=4, WPR=4, MINB=7) 16.00 -> 18.94 / 20.26 µs, the Q6_K
  ring two steps ahead 24.27 -> 26.04, the Q4_K gate/up pass (RPB=8, WPR=1) 39.39 -> 40.85 / 43.85 (ledger #76,
  #77, #78)."""
STAGE_VALUES = (0, 1, 2, 3, 4)
"""Shared-memory slots per warp that W's chunks pass through before they are decoded, for the 2-byte-aligned
formats ``STAGE_TYPES``, whose decode otherwise issues one 2-byte global load per halfword (Q6_K: 17 a lane a
block); 0: decode straight from global memory.

* 1: each warp copies a chunk through registers with aligned 16-byte loads, then decodes it (`_staged_body`). On
  the H200 this was slower: Q6_K MMVQ RPB=4, WPR=2 at ffn_down 34.78 vs 29.73 µs (+17%, ledger #47), at the
  output head +7% (#49): the copy, its two warp barriers and the shared-memory halfword loads cost more than the
  2-byte global loads they replace, and no more bytes are in flight.
* 2, 3, 4: a ring of that many slots filled by ``cp.async`` (`_ring_loop`): the copies of the next STAGE - 1
  chunks are in flight while the warp decodes the current one, without holding registers, so the bytes in flight
  per warp no longer depend on how ptxas schedules the decode's loads (see HOIST_VALUES). Alone it was slower on
  the H200 (Q6_K MMVQ at ffn_down, RPB=4, WPR=2: STAGE=3 34.88 vs 30.02 µs for STAGE=0, +16%, REVERTED, #59).
  Session 7 made its copy and window addressing lean (`_ring_copy`, `_RING_FETCH`: ~15% fewer instructions).
  With FOLD=1, 4 warps a row and MINB=7 (72 registers, 23 warps an SM) it is the fastest Q6_K shape at
  ffn_down: 24.08 µs vs 28.30 for RPB=4, WPR=2 without it (#69, #73), the engine's DEEP=1 launch (tg128 +2.2%,
  #71). Hardware counters (ncu) of that kernel: issue slots 58.5% busy, DRAM 49.8%."""
HOIST_VALUES = (0, 1)
"""1: the PTX issues every load of a chunk (x, and all RPB rows' pieces of every weight) before it decodes any of
them; 0: row by row as the block dots are written. In the SASS, HOIST=1 keeps Q4_K's loads ahead (one round trip a
chunk, not 2-3) but ptxas still interleaves Q6_K's 68 halfword loads with the decode in groups of ~12, as with 0.
On the H200 at ffn_down (MMVQ): Q6_K -0.5%, NEUTRAL (#51); Q4_K +15% at RPB=2, WPR=2 (#50: 79 registers leave 12
blocks of 64 threads a SM, too few for 1792 in one wave) but 16.33 µs with RPB=4, WPR=4 and MINB=7 (#52) against
19.81 for the best HOIST=0 shape (#44); with RPB=4, WPR=4, MINB=7 HOIST=0 is now 16.03 µs vs 16.37 (#68), so
decode's DEEP=1 does not hoist. #50's and #52's HOIST=0 arms ran a Q4_K dot order reverted
since (both loads first; now the header is decoded between them, as in #44)."""
VLOAD_VALUES = (0, 1)
"""1: Q6_K's four 8-byte pieces per lane and block come from aligned 8-byte vector loads (two per piece, then a
funnel shift), 9 loads of which 8 move 256 bytes a warp, not 17 halfword loads of 64 bytes (`_q6_k_lane8`):
more bytes in flight per outstanding load, which is what ptxas's load grouping limits (see HOIST_VALUES). W must
start 8-byte aligned and be a multiple of 8 bytes (`vload_refusal`). On the H200 slower: Q6_K MMVQ RPB=4, WPR=2 at
ffn_down 38.14 vs 29.54 µs (+29%, REVERTED, ledger #56)."""
FOLD_VALUES = (0, 1)
"""1: Q6_K's MMVQ dot takes its -32 offset from the x loader: per plane ``-32 * Σx`` of the lane's 8 x values, once
per chunk for all RPB rows (`_xq_k_planes_fold`), starts the plane's dp4a chain over the stored 6-bit q (0..63,
the same bytes as int8), instead of an add and an xor on every word of every row (`_mathq_q6_k_fold`); x indexes
unsigned (no negative-index wraparound code). Bit-identical (the same integer sums). Offline sm_90 SASS at RPB=4,
WPR=2: 480 instructions a chunk instead of 640. On the H200, measured as a commit before it was a knob (ffn_down,
one device call): RPB=4, WPR=2 29.57 -> 37.41 µs, RPB=2, WPR=2 34.13 -> 30.78, RPB=8, WPR=1 131.1 -> 88.7 (sweeps
#60, #62); tg128 331.36 -> 312.98 tok/s at the engine's shapes (#61, #63). Faster per warp, slower at the best shape
without the ring; with the ring (STAGE=2), RPB=4, WPR=4, MINB=7: 24.11 µs vs 26.57 without the fold (#69), the
engine's DEEP=1 launch for Q6_K ffn_down."""
PDL_VALUES = (0, 1)
"""1: programmatic dependent launch (`kernels.launch`): the kernel lets the next one start early
(`kernels.ptx.griddepcontrol_launch_dependents` first thing), and is itself launched with programmatic stream
serialization, so its CUDA blocks take the SM slots the previous kernel's last blocks leave; before it waits for
that kernel (`kernels.ptx.griddepcontrol_wait`) it touches only W: the ring's first copies (STAGE 2..4), else an
L2 prefetch of its warp's first chunk (`_lookahead`). x, the residual and y come after the wait. Needs a stream
other than 0. 0: an ordinary launch. On the H200 at ffn_down, timed as graphs of 6 back-to-back launches: Q4_K
(RPB=4, WPR=4, MINB=7) 16.03 -> 15.27 µs (61.3% of copy), the Q6_K ring (FOLD=1) 24.11 -> 20.85 (65.5%); the
Q4_K gate/up pass 37.35 -> 36.40 (ledger #79-#81). At ffn_down the kernel's fixed cost (launch, ramp, tail) is
~4 µs of Q4_K's 16 and ~8.6 of Q6_K's 24 (times at 1, 2 and 4 x 3584 rows): that is what PDL overlaps."""
MINB_VALUES = (0, 1, 2, 4, 7, 8, 14, 16)
"""CUDA blocks per SM the kernel is compiled to fit (the second number of ``__launch_bounds__``, which caps the
registers per thread at what that many blocks of ``32 * WPR`` threads leave: `min_blocks_registers`, 65536 /
(MINB * 32 * WPR) rounded down to 8); 0: no bound, ptxas's own register count; MINB * 32 * WPR must fit the SM's
``MAX_THREADS_PER_SM``. A grid of few CUDA blocks (ffn_down: 3584 rows / RPB) runs in one wave only if
they all fit at once: with RPB=4, WPR=4 that is 896 blocks, 7 per SM of 132, at most 72 registers; Q4_K uses
86-107 unbounded (Q4_K MMVQ at ffn_down, RPB=4, WPR=4, HOIST=1, MINB=7: 16.33 µs vs 20.35 at RPB=2, WPR=2, ledger
#52; a launch-bounds probe before the knob existed gave 22.5 -> 17.6 µs for HOIST=0, unrecorded)."""
STAGE_TYPES = ("Q4_0", "Q5_0", "Q8_0", "Q3_K", "Q6_K")
"""Formats STAGE > 0 takes: the ones whose blocks are only 2-byte aligned (their kernels read ``uint16`` views)."""
STAGE_SMEM_LIMIT = 48 * 1024
"""Bytes of static shared memory a staged kernel may use (CUDA's static limit): its windows are
``WPR * STAGE * RPB * (2 with GLU) * window`` bytes (Q6_K: 864-byte windows, so STAGE * RPB * WPR * weights
<= 56)."""
DEFAULT_RPB = 4
DEFAULT_WPR = 4
DEFAULT_UNROLL = 1
DEFAULT_PREFETCH = 0
DEFAULT_STAGE = 0
DEFAULT_HOIST = 0
DEFAULT_MINB = 0
MAX_THREADS_PER_SM = 2048
"""Resident threads an sm_90 SM holds: MINB * 32 * WPR above it is refused (ptxas ignores such a bound)."""
DEFAULT_VLOAD = 0
DEFAULT_FOLD = 0
DEFAULT_PDL = 0

U = np.uint64
MB = 0x4B000000  # float32 bits of 2^23: bits(MB | q) = 2^23 + q for 0 <= q < 2^23
M0 = np.float32(8388608.0)
M4 = np.float32(8388608.0 + 4.0)
M8 = np.float32(8388608.0 + 8.0)
M16 = np.float32(8388608.0 + 16.0)
M32 = np.float32(8388608.0 + 32.0)
M128 = np.float32(8388608.0 + 128.0)
N4 = 0x0F0F0F0F
N2 = 0x03030303
N1 = 0x01010101
ZERO = np.float32(0.0)


# ---- shared device helpers -------------------------------------------------------------------------------------


@cuda.jit(device=True, inline="always")
def _x8(xv, i):
    """x[i .. i+7] as an 8-tuple of float32 (two 16-byte loads; ``i`` a multiple of 4)."""
    a0, a1, a2, a3 = ld_global_v4_u32(xv, i)
    b0, b1, b2, b3 = ld_global_v4_u32(xv, i + 4)
    return (
        f32_from_bits(a0),
        f32_from_bits(a1),
        f32_from_bits(a2),
        f32_from_bits(a3),
        f32_from_bits(b0),
        f32_from_bits(b1),
        f32_from_bits(b2),
        f32_from_bits(b3),
    )


@cuda.jit(device=True, inline="always")
def _sum8(t):
    return ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]))


@cuda.jit(device=True, inline="always")
def _dot8(w0, w1, off, t):
    """Σ_k (byte k of the 8 bytes w0 | w1 << 32, as an integer) - (off - 2^23)) * t[k]; every byte < 2^8."""
    a = (f32_from_bits(MB | (w0 & 0xFF)) - off) * t[0]
    a += (f32_from_bits(MB | ((w0 >> 8) & 0xFF)) - off) * t[1]
    a += (f32_from_bits(MB | ((w0 >> 16) & 0xFF)) - off) * t[2]
    a += (f32_from_bits(MB | ((w0 >> 24) & 0xFF)) - off) * t[3]
    a += (f32_from_bits(MB | (w1 & 0xFF)) - off) * t[4]
    a += (f32_from_bits(MB | ((w1 >> 8) & 0xFF)) - off) * t[5]
    a += (f32_from_bits(MB | ((w1 >> 16) & 0xFF)) - off) * t[6]
    a += (f32_from_bits(MB | ((w1 >> 24) & 0xFF)) - off) * t[7]
    return a


@cuda.jit(device=True, inline="always")
def _h2(raw, i):
    """Two consecutive uint16 words i, i+1 as one 32-bit value (2-byte-aligned formats)."""
    return int(raw[U(i)]) | (int(raw[U(i + 1)]) << 16)


@cuda.jit(device=True, inline="always")
def _spread4(n):
    """Bits 0..3 of n -> bit 0 of bytes 0..3 (no carries: the four shifted copies do not overlap)."""
    return ((n & 0xF) * 0x00204081) & N1


if SIMULATOR:
    from kernels.ptx import _warp_exchange  # numba's simulator has no shuffles; this emulates one warp's lanes

    def _butterfly(slots):
        v = [np.float32(s) for s in slots]
        for off in (16, 8, 4, 2, 1):
            v = [np.float32(v[lane] + v[lane ^ off]) for lane in range(32)]
        return v

    def _warp_sum(v):
        """Simulator form of the ``shfl_xor_sync`` butterfly below (same order of float32 additions)."""
        return _warp_exchange(_butterfly, v)

else:

    @cuda.jit(device=True, inline="always")
    def _warp_sum(v):
        """Sum of ``v`` over the 32 lanes of the (fully active) warp, in every lane: a 5-step xor butterfly."""
        v += cuda.shfl_xor_sync(0xFFFFFFFF, v, 16)
        v += cuda.shfl_xor_sync(0xFFFFFFFF, v, 8)
        v += cuda.shfl_xor_sync(0xFFFFFFFF, v, 4)
        v += cuda.shfl_xor_sync(0xFFFFFFFF, v, 2)
        v += cuda.shfl_xor_sync(0xFFFFFFFF, v, 1)
        return v


# ---- per-format x loads and block dots ---------------------------------------------------------------------------
# x loader: (x as uint32, weight index of the block's first weight in the row, lane-in-block j) -> tuple of x values
# block dot: (raw view, block index in the tensor, j, that tuple) -> float32 contribution of this lane's piece.


@cuda.jit(device=True, inline="always")
def _x_legacy(xv, wb, j):
    """LPB = 2 on 32-weight blocks with nibble planes: lane j has weights 8j..8j+7 and 16+8j..16+8j+7."""
    t0 = _x8(xv, wb + 8 * j)
    t1 = _x8(xv, wb + 16 + 8 * j)
    return (t0, t1, _sum8(t0) + _sum8(t1))


@cuda.jit(device=True, inline="always")
def _dot_q4_0(raw, bi, j, xs):
    """Q4_0, uint16 view (9 per block): d | qs[16]; lane j reads qs bytes 8j..8j+7."""
    base = bi * 9
    d = f32_from_f16_bits(int(raw[U(base)]))
    qi = base + 1 + 4 * j
    w0 = _h2(raw, qi)
    w1 = _h2(raw, qi + 2)
    s = _dot8(w0 & N4, w1 & N4, M8, xs[0]) + _dot8((w0 >> 4) & N4, (w1 >> 4) & N4, M8, xs[1])
    return d * s


@cuda.jit(device=True, inline="always")
def _dot_q4_1(raw, bi, j, xs):
    """Q4_1, uint32 view (5 per block): d|m | qs[16]; w = d*q + m."""
    base = bi * 5
    dm = int(raw[U(base)])
    w0 = int(raw[U(base + 1 + 2 * j)])
    w1 = int(raw[U(base + 2 + 2 * j)])
    s = _dot8(w0 & N4, w1 & N4, M0, xs[0]) + _dot8((w0 >> 4) & N4, (w1 >> 4) & N4, M0, xs[1])
    return f32_from_f16_bits(dm & 0xFFFF) * s + f32_from_f16_bits(dm >> 16) * xs[2]


@cuda.jit(device=True, inline="always")
def _dot_q5_0(raw, bi, j, xs):
    """Q5_0, uint16 view (11 per block): d | qh[4] | qs[16]; q = nibble | qh bit << 4; w = d*(q - 16)."""
    base = bi * 11
    d = f32_from_f16_bits(int(raw[U(base)]))
    qh = _h2(raw, base + 1)  # bytes 2..5: two halfword loads, never one (misaligned) uint32 load
    qi = base + 3 + 4 * j
    w0 = _h2(raw, qi)
    w1 = _h2(raw, qi + 2)
    hl = qh >> (8 * j)
    hh = qh >> (16 + 8 * j)
    lo0 = (w0 & N4) | (_spread4(hl) << 4)
    lo1 = (w1 & N4) | (_spread4(hl >> 4) << 4)
    hi0 = ((w0 >> 4) & N4) | (_spread4(hh) << 4)
    hi1 = ((w1 >> 4) & N4) | (_spread4(hh >> 4) << 4)
    return d * (_dot8(lo0, lo1, M16, xs[0]) + _dot8(hi0, hi1, M16, xs[1]))


@cuda.jit(device=True, inline="always")
def _dot_q5_1(raw, bi, j, xs):
    """Q5_1, uint64 view (3 per block): d|m|qh[4] | qs[16]; w = d*q + m."""
    base = bi * 3
    h = raw[U(base)]
    qw = raw[U(base + 1 + j)]
    dm = int(h & U(0xFFFFFFFF))
    qh = int(h >> U(32))
    w0 = int(qw & U(0xFFFFFFFF))
    w1 = int(qw >> U(32))
    hl = qh >> (8 * j)
    hh = qh >> (16 + 8 * j)
    lo0 = (w0 & N4) | (_spread4(hl) << 4)
    lo1 = (w1 & N4) | (_spread4(hl >> 4) << 4)
    hi0 = ((w0 >> 4) & N4) | (_spread4(hh) << 4)
    hi1 = ((w1 >> 4) & N4) | (_spread4(hh >> 4) << 4)
    s = _dot8(lo0, lo1, M0, xs[0]) + _dot8(hi0, hi1, M0, xs[1])
    return f32_from_f16_bits(dm & 0xFFFF) * s + f32_from_f16_bits(dm >> 16) * xs[2]


@cuda.jit(device=True, inline="always")
def _x_q8_0(xv, wb, j):
    """Q8_0, LPB = 2: lane j has weights 16j .. 16j+15."""
    return (_x8(xv, wb + 16 * j), _x8(xv, wb + 16 * j + 8))


@cuda.jit(device=True, inline="always")
def _q8_0_words(raw, bi, j):
    """Q8_0, uint16 view (17 per block): d | qs[32] int8. Lane j's loads: d (as float32) and qs bytes
    16j..16j+15 as four words (eight halfword loads)."""
    base = bi * 17
    qi = base + 1 + 8 * j
    return (f32_from_f16_bits(int(raw[U(base)])), _h2(raw, qi), _h2(raw, qi + 2), _h2(raw, qi + 4),
            _h2(raw, qi + 6))


@cuda.jit(device=True, inline="always")
def _dot_q8_0(raw, bi, j, xs):
    """Q8_0 x f32 (layout: `_q8_0_words`); int8 b = (b ^ 0x80) - 128."""
    return _math_q8_0(_q8_0_words(raw, bi, j), j, xs)


@cuda.jit(device=True, inline="always")
def _math_q8_0(t, j, xs):
    """The decode half of `_dot_q8_0`, from lane j's `_q8_0_words` tuple ``t``."""
    d = t[0]
    w0 = t[1] ^ 0x80808080
    w1 = t[2] ^ 0x80808080
    w2 = t[3] ^ 0x80808080
    w3 = t[4] ^ 0x80808080
    return d * (_dot8(w0, w1, M128, xs[0]) + _dot8(w2, w3, M128, xs[1]))


@cuda.jit(device=True, inline="always")
def _x_k_planes(xv, wb, j):
    """Q2_K / Q3_K / Q6_K, LPB = 8: lane j (n = j/4, t0 = 8*(j%4)) has weights 128n + 32s + t0 + (0..7), s < 4."""
    b = wb + 128 * (j >> 2) + 8 * (j & 3)
    t0 = _x8(xv, b)
    t1 = _x8(xv, b + 32)
    t2 = _x8(xv, b + 64)
    t3 = _x8(xv, b + 96)
    return (t0, t1, t2, t3, _sum8(t0), _sum8(t1), _sum8(t2), _sum8(t3))


@cuda.jit(device=True, inline="always")
def _dot_q2_k(raw, bi, j, xs):
    """Q2_K, uint32 view (21 per block): scales[16] | qs[64] | d|dmin. Weight 128n + 32s + t: 2 bits at shift 2s
    of qs[32n + t]; sub-block scale byte 8n + 2s + t/16 (low nibble scale, high nibble min)."""
    base = bi * 21
    n = j >> 2
    e = (j & 3) >> 1
    dd = int(raw[U(base + 20)])
    sw0 = int(raw[U(base + 2 * n)]) >> (8 * e)  # scales 8n + e + {0, 2}
    sw1 = int(raw[U(base + 2 * n + 1)]) >> (8 * e)  # scales 8n + e + {4, 6}
    qi = base + 4 + 8 * n + 2 * (j & 3)
    w0 = int(raw[U(qi)])
    w1 = int(raw[U(qi + 1)])
    c0 = sw0 & 0xFF
    c1 = (sw0 >> 16) & 0xFF
    c2 = sw1 & 0xFF
    c3 = (sw1 >> 16) & 0xFF
    sq = np.float32(c0 & 0xF) * _dot8(w0 & N2, w1 & N2, M0, xs[0])
    sq += np.float32(c1 & 0xF) * _dot8((w0 >> 2) & N2, (w1 >> 2) & N2, M0, xs[1])
    sq += np.float32(c2 & 0xF) * _dot8((w0 >> 4) & N2, (w1 >> 4) & N2, M0, xs[2])
    sq += np.float32(c3 & 0xF) * _dot8((w0 >> 6) & N2, (w1 >> 6) & N2, M0, xs[3])
    sm = np.float32(c0 >> 4) * xs[4] + np.float32(c1 >> 4) * xs[5]
    sm += np.float32(c2 >> 4) * xs[6] + np.float32(c3 >> 4) * xs[7]
    return f32_from_f16_bits(dd & 0xFFFF) * sq - f32_from_f16_bits(dd >> 16) * sm


@cuda.jit(device=True, inline="always")
def _q3_scale(lo_hw, hi_hw, e, lshift, hshift):
    """Signed 6-bit Q3_K scale: low 4 bits from byte e of lo_hw >> lshift, high 2 from byte e of hi_hw >> hshift."""
    low = (lo_hw >> (8 * e + lshift)) & 0xF
    high = (hi_hw >> (8 * e + hshift)) & 3
    return np.float32((low | (high << 4)) - 32)


@cuda.jit(device=True, inline="always")
def _dot_q3_k(raw, bi, j, xs):
    """Q3_K, uint16 view (55 per block): hmask[32] | qs[64] | scales[12] | d. Weight 128n + 32s + t: 2 bits at
    shift 2s of qs[32n + t], minus 4 unless bit 4n + s of hmask[t] is set; 6-bit scale i = 8n + 2s + t/16."""
    base = bi * 55
    n = j >> 2
    e = (j & 3) >> 1
    d = f32_from_f16_bits(int(raw[U(base + 54)]))
    qi = base + 16 + 16 * n + 4 * (j & 3)
    mi = base + 4 * (j & 3)
    hb = 4 * n
    q0 = _h2(raw, qi)
    q1 = _h2(raw, qi + 2)
    m0 = _h2(raw, mi) >> hb
    m1 = _h2(raw, mi + 2) >> hb
    hi0 = int(raw[U(base + 52)])  # scales[8..9]
    hi1 = int(raw[U(base + 53)])  # scales[10..11]
    sc0 = _q3_scale(int(raw[U(base + 48)]), hi0, e, 4 * n, 4 * n)  # i = 8n + e
    sc1 = _q3_scale(int(raw[U(base + 49)]), hi1, e, 4 * n, 4 * n)  # i = 8n + 2 + e
    sc2 = _q3_scale(int(raw[U(base + 50)]), hi0, e, 4 * n, 4 * n + 2)  # i = 8n + 4 + e
    sc3 = _q3_scale(int(raw[U(base + 51)]), hi1, e, 4 * n, 4 * n + 2)  # i = 8n + 6 + e
    s = sc0 * _dot8((q0 & N2) | ((m0 & N1) << 2), (q1 & N2) | ((m1 & N1) << 2), M4, xs[0])
    s += sc1 * _dot8(((q0 >> 2) & N2) | (((m0 >> 1) & N1) << 2), ((q1 >> 2) & N2) | (((m1 >> 1) & N1) << 2), M4, xs[1])
    s += sc2 * _dot8(((q0 >> 4) & N2) | (((m0 >> 2) & N1) << 2), ((q1 >> 4) & N2) | (((m1 >> 2) & N1) << 2), M4, xs[2])
    s += sc3 * _dot8(((q0 >> 6) & N2) | (((m0 >> 3) & N1) << 2), ((q1 >> 6) & N2) | (((m1 >> 3) & N1) << 2), M4, xs[3])
    return d * s


@cuda.jit(device=True, inline="always")
def _q6_k_lane(raw, bi, j):
    """Q6_K, uint16 view (105 per block): ql[128] | qh[64] | scales[16] int8 | d. Weight 128h + 32s + t (t < 32):
    low 4 bits of ql[64h + 32*(s%2) + t] >> 4*(s/2), high 2 of qh[32h + t] >> 2s; scale 8h + 2s + t/16.
    Lane j (h = j/4, t0 = 8*(j%4)) gets d, the words a0, a1 (ql bytes 64h + t0 ..+7), b0, b1 (ql 64h + 32 + t0
    ..+7), m0, m1 (qh 32h + t0 ..+7) and its four int8 scales as bytes (`_i8`); `_q6_bytes` makes the stored
    6-bit q (0..63, weight = d * scale * (q - 32)) of plane s from the words."""
    return _q6_k_lane_at(raw, bi * 105, j)


@cuda.jit(device=True, inline="always")
def _q6_k_lane_at(raw, base, j):
    """`_q6_k_lane` of the block starting at element ``base`` of the uint16 array ``raw`` (105 elements a block:
    STAGE=2..4 read a block wherever the ring window put it)."""
    h = j >> 2
    e = (j & 3) >> 1
    d = f32_from_f16_bits(int(raw[U(base + 104)]))
    li = base + 32 * h + 4 * (j & 3)
    mi = base + 64 + 16 * h + 4 * (j & 3)
    a0 = _h2(raw, li)
    a1 = _h2(raw, li + 2)
    b0 = _h2(raw, li + 16)
    b1 = _h2(raw, li + 18)
    m0 = _h2(raw, mi)
    m1 = _h2(raw, mi + 2)
    si = base + 96 + 4 * h
    c0 = (int(raw[U(si)]) >> (8 * e)) & 0xFF
    c1 = (int(raw[U(si + 1)]) >> (8 * e)) & 0xFF
    c2 = (int(raw[U(si + 2)]) >> (8 * e)) & 0xFF
    c3 = (int(raw[U(si + 3)]) >> (8 * e)) & 0xFF
    return d, a0, a1, b0, b1, m0, m1, c0, c1, c2, c3


@cuda.jit(device=True, inline="always")
def _piece8(raw, p):
    """The 8 bytes at even byte offset ``p`` of a uint16 view as two 32-bit words, from the two aligned 8-byte
    vectors covering them (`kernels.ptx.ld_global_v2_b32`): the pair of words starting at byte ``p & 4`` of the
    first, shifted right by 16 bits when ``p`` is 2 mod 4. raw must start 8-byte aligned and extend to the second
    vector's end (`vload_refusal`)."""
    q = (p & -8) >> 1
    x0, x1 = ld_global_v2_b32(raw, q)
    x2, x3 = ld_global_v2_b32(raw, q + 4)
    hi4 = (p & 4) != 0
    y0 = int(x1) if hi4 else int(x0)
    y1 = int(x2) if hi4 else int(x1)
    y2 = int(x3) if hi4 else int(x2)
    s = (p & 2) * 8
    return ((y0 >> s) | (y1 << (32 - s))) & 0xFFFFFFFF, ((y1 >> s) | (y2 << (32 - s))) & 0xFFFFFFFF


@cuda.jit(device=True, inline="always")
def _q6_k_lane8(raw, bi, j):
    """`_q6_k_lane` (same tuple) from 8-byte vector loads: lane j's four 8-byte pieces (ql 64h + 8k, ql 64h + 32
    + 8k, qh 32h + 8k and scales 8h, k = j%4, all at even offsets of the 210-byte block) by `_piece8`, 8 loads
    of 8 bytes instead of 16 of 2, and d by one halfword load; scale s is byte 2s + e of the scales piece."""
    base = bi * 210
    h = j >> 2
    k = j & 3
    e = k >> 1
    d = f32_from_f16_bits(int(raw[U(bi * 105 + 104)]))
    a0, a1 = _piece8(raw, base + 64 * h + 8 * k)
    b0, b1 = _piece8(raw, base + 64 * h + 32 + 8 * k)
    m0, m1 = _piece8(raw, base + 128 + 32 * h + 8 * k)
    s0, s1 = _piece8(raw, base + 192 + 8 * h)
    c0 = (s0 >> (8 * e)) & 0xFF
    c1 = (s0 >> (16 + 8 * e)) & 0xFF
    c2 = (s1 >> (8 * e)) & 0xFF
    c3 = (s1 >> (16 + 8 * e)) & 0xFF
    return d, a0, a1, b0, b1, m0, m1, c0, c1, c2, c3


@cuda.jit(device=True, inline="always")
def _i8(c):
    """The int8 value of byte c (0..255), as float32 (converted from 32 bits: ``I2FP.F32.S32``, not the slower
    64-bit ``I2F.S64``)."""
    return np.float32(np.int32(c - ((c & 0x80) << 1)))


@cuda.jit(device=True, inline="always")
def _q6_bytes(lo, m, s):
    """Plane s (0..3) of a Q6_K lane word: low nibble (s < 2) or high nibble of ``lo`` | 2 bits of ``m`` << 4."""
    return ((lo >> (4 * (s >> 1))) & N4) | (((m >> (2 * s)) & N2) << 4)


@cuda.jit(device=True, inline="always")
def _dot_q6_k(raw, bi, j, xs):
    """Q6_K x f32 (layout: `_q6_k_lane`): d * Σ_s sc_s * Σ((q - 32)·x)."""
    return _math_q6_k(_q6_k_lane(raw, bi, j), j, xs)


@cuda.jit(device=True, inline="always")
def _dot_q6_k8(raw, bi, j, xs):
    """`_dot_q6_k` with VLOAD=1's loads (`_q6_k_lane8`)."""
    return _math_q6_k(_q6_k_lane8(raw, bi, j), j, xs)


@cuda.jit(device=True, inline="always")
def _math_q6_k(t, j, xs):
    """The decode half of `_dot_q6_k`, from lane j's `_q6_k_lane` tuple ``t``."""
    d, a0, a1, b0, b1, m0, m1, c0, c1, c2, c3 = t
    s = _i8(c0) * _dot8(_q6_bytes(a0, m0, 0), _q6_bytes(a1, m1, 0), M32, xs[0])
    s += _i8(c1) * _dot8(_q6_bytes(b0, m0, 1), _q6_bytes(b1, m1, 1), M32, xs[1])
    s += _i8(c2) * _dot8(_q6_bytes(a0, m0, 2), _q6_bytes(a1, m1, 2), M32, xs[2])
    s += _i8(c3) * _dot8(_q6_bytes(b0, m0, 3), _q6_bytes(b1, m1, 3), M32, xs[3])
    return d * s


@cuda.jit(device=True, inline="always")
def _x_k_nibbles(xv, wb, j):
    """Q4_K / Q5_K, LPB = 8: lane j (i = j/2, h = j%2) has weights 64i + 16h + (0..15) (low nibbles, sub-block
    2i) and 64i + 32 + 16h + (0..15) (high nibbles, sub-block 2i+1)."""
    b = wb + 64 * (j >> 1) + 16 * (j & 1)
    l0 = _x8(xv, b)
    l1 = _x8(xv, b + 8)
    h0 = _x8(xv, b + 32)
    h1 = _x8(xv, b + 40)
    return (l0, l1, h0, h1, _sum8(l0) + _sum8(l1), _sum8(h0) + _sum8(h1))


@cuda.jit(device=True, inline="always")
def _scale_min_k4(s, a, c, e):
    """ggml's get_scale_min_k4 for sub-block s, given scales[s%4], scales[s%4 + 4], scales[s%4 + 8]. Converted
    from int64 (``I2F.S64``): from 32 bits, Q4_K MMVQ at RPB=4, WPR=4, MINB=7 needs 16 bytes of stack at its 72
    registers and ran 16.03 -> 18.35 µs at ffn_down (ledger #68, #70)."""
    if s < 4:
        return np.float32(a & 63), np.float32(c & 63)
    return np.float32((e & 0xF) | ((a >> 6) << 4)), np.float32((e >> 4) | ((c >> 6) << 4))


@cuda.jit(device=True, inline="always")
def _k4_header(raw4, base, j):
    """d, dmin and the (scale, min) of sub-blocks 2i, 2i+1 from a Q4_K/Q5_K block's first 16 bytes."""
    hd, ha, hc, he = ld_global_v4_u32(raw4, base)
    return _k4_scales(hd, ha, hc, he, j)


@cuda.jit(device=True, inline="always")
def _k4_scales(hd, ha, hc, he, j):
    """`_k4_header` from the header's four words already loaded (d|dmin, scales 0..3, 4..7, 8..11)."""
    w = int(hd)
    s0 = 2 * (j >> 1)
    s1 = s0 + 1
    t0 = 8 * (s0 & 3)
    t1 = 8 * (s1 & 3)
    sc0, mn0 = _scale_min_k4(s0, (int(ha) >> t0) & 0xFF, (int(hc) >> t0) & 0xFF, (int(he) >> t0) & 0xFF)
    sc1, mn1 = _scale_min_k4(s1, (int(ha) >> t1) & 0xFF, (int(hc) >> t1) & 0xFF, (int(he) >> t1) & 0xFF)
    return f32_from_f16_bits(w & 0xFFFF), f32_from_f16_bits(w >> 16), sc0, mn0, sc1, mn1


@cuda.jit(device=True, inline="always")
def _q4_k_words(raw4, bi, j):
    """Q4_K, uint32 view (36 per block): d|dmin | scales[12] | qs[128]. Lane j's loads: the 16-byte header and qs
    bytes 16j..16j+15 (one 16-byte load each; they hold the low nibbles of sub-block 2i and the high nibbles of
    sub-block 2i+1), as 8 words."""
    base = bi * 36
    hd, ha, hc, he = ld_global_v4_u32(raw4, base)
    q0, q1, q2, q3 = ld_global_v4_u32(raw4, base + 4 + 4 * j)
    return hd, ha, hc, he, q0, q1, q2, q3


@cuda.jit(device=True, inline="always")
def _dot_q4_k(raw4, bi, j, xs):
    """Q4_K x f32 (layout: `_q4_k_words`), the header decoded before the qs load is issued. This order, not
    `_math_q4_k` of `_q4_k_words` (both loads first), is HOIST=0's: ptxas schedules the two differently, and the
    engine's default Q4_K mat-vecs were measured in this one (tg128 331 tok/s, ledger #46; with both loads first
    in every Q4_K dot, 265-275 tok/s on the same H200)."""
    base = bi * 36
    d, dmin, sc0, mn0, sc1, mn1 = _k4_header(raw4, base, j)
    q0, q1, q2, q3 = ld_global_v4_u32(raw4, base + 4 + 4 * j)
    return _q4_k_sum(d, dmin, sc0, mn0, sc1, mn1, q0, q1, q2, q3, xs)


@cuda.jit(device=True, inline="always")
def _math_q4_k(t, j, xs):
    """The decode half of `_dot_q4_k`, from lane j's words ``t`` (`_q4_k_words`)."""
    d, dmin, sc0, mn0, sc1, mn1 = _k4_scales(t[0], t[1], t[2], t[3], j)
    return _q4_k_sum(d, dmin, sc0, mn0, sc1, mn1, t[4], t[5], t[6], t[7], xs)


@cuda.jit(device=True, inline="always")
def _q4_k_sum(d, dmin, sc0, mn0, sc1, mn1, q0, q1, q2, q3, xs):
    """Q4_K x f32 of one lane: its decoded scales and qs words against its x values."""
    w0, w1, w2, w3 = int(q0), int(q1), int(q2), int(q3)
    slo = _dot8(w0 & N4, w1 & N4, M0, xs[0]) + _dot8(w2 & N4, w3 & N4, M0, xs[1])
    shi = _dot8((w0 >> 4) & N4, (w1 >> 4) & N4, M0, xs[2]) + _dot8((w2 >> 4) & N4, (w3 >> 4) & N4, M0, xs[3])
    return d * (sc0 * slo + sc1 * shi) - dmin * (mn0 * xs[4] + mn1 * xs[5])


@cuda.jit(device=True, inline="always")
def _dot_q5_k(raw4, bi, j, xs):
    """Q5_K, uint32 view (44 per block): d|dmin | scales[12] | qh[32] | qs[128]; as Q4_K plus the fifth bit
    (bit s of qh[t], t = position in the 32-weight sub-block); lane j reads qh bytes 16h..16h+15 (16-byte load)."""
    base = bi * 44
    d, dmin, sc0, mn0, sc1, mn1 = _k4_header(raw4, base, j)
    h0, h1, h2, h3 = ld_global_v4_u32(raw4, base + 4 + 4 * (j & 1))
    q0, q1, q2, q3 = ld_global_v4_u32(raw4, base + 12 + 4 * j)
    b0 = 2 * (j >> 1)
    b1 = b0 + 1
    m0, m1, m2, m3 = int(h0), int(h1), int(h2), int(h3)
    w0, w1, w2, w3 = int(q0), int(q1), int(q2), int(q3)
    slo = _dot8(
        (w0 & N4) | (((m0 >> b0) & N1) << 4), (w1 & N4) | (((m1 >> b0) & N1) << 4), M0, xs[0]
    ) + _dot8((w2 & N4) | (((m2 >> b0) & N1) << 4), (w3 & N4) | (((m3 >> b0) & N1) << 4), M0, xs[1])
    shi = _dot8(
        ((w0 >> 4) & N4) | (((m0 >> b1) & N1) << 4), ((w1 >> 4) & N4) | (((m1 >> b1) & N1) << 4), M0, xs[2]
    ) + _dot8(((w2 >> 4) & N4) | (((m2 >> b1) & N1) << 4), ((w3 >> 4) & N4) | (((m3 >> b1) & N1) << 4), M0, xs[3])
    return d * (sc0 * slo + sc1 * shi) - dmin * (mn0 * xs[4] + mn1 * xs[5])


@cuda.jit(device=True, inline="always")
def _e2m1x2(v):
    """2 * the E2M1 value of nibble v (OCP MX v1.0 §5.3.3), as float32: |.| in {0,1,2,3,4,6,8,12} (a packed
    4-bit table), sign bit 3."""
    mag = f32_from_bits(MB | ((0xC8643210 >> (4 * (v & 7))) & 0xF)) - M0
    return -mag if v & 8 else mag


@cuda.jit(device=True, inline="always")
def _dot8_e2m1(w0, w1, t):
    """Σ_k 2*e2m1(nibble in byte k of w0 | w1 << 32) * t[k]; every byte < 16."""
    a = _e2m1x2(w0 & 0xF) * t[0]
    a += _e2m1x2((w0 >> 8) & 0xF) * t[1]
    a += _e2m1x2((w0 >> 16) & 0xF) * t[2]
    a += _e2m1x2((w0 >> 24) & 0xF) * t[3]
    a += _e2m1x2(w1 & 0xF) * t[4]
    a += _e2m1x2((w1 >> 8) & 0xF) * t[5]
    a += _e2m1x2((w1 >> 16) & 0xF) * t[6]
    a += _e2m1x2((w1 >> 24) & 0xF) * t[7]
    return a


@cuda.jit(device=True, inline="always")
def _b4(raw, i):
    """Four consecutive bytes i .. i+3 as one 32-bit value (byte loads: MXFP4 blocks are 1-byte aligned)."""
    return (
        int(raw[U(i)])
        | (int(raw[U(i + 1)]) << 8)
        | (int(raw[U(i + 2)]) << 16)
        | (int(raw[U(i + 3)]) << 24)
    )


@cuda.jit(device=True, inline="always")
def _dot_mxfp4(raw, bi, j, xs):
    """MXFP4, uint8 view (17 per block, byte loads): e (E8M0) | qs[16]; lane j reads qs bytes 8j..8j+7;
    w = 2^(e-128) * (2*e2m1) (ggml's ``ggml_e8m0_to_fp32_half`` times the doubled table)."""
    base = bi * 17
    e = int(raw[U(base)])
    d_half = f32_from_bits((0x00200000 << e) if e < 2 else ((e - 1) << 23))
    qi = base + 1 + 8 * j
    w0 = _b4(raw, qi)
    w1 = _b4(raw, qi + 4)
    s = _dot8_e2m1(w0 & N4, w1 & N4, xs[0]) + _dot8_e2m1((w0 >> 4) & N4, (w1 >> 4) & N4, xs[1])
    return d_half * s


@cuda.jit(device=True, inline="always")
def _x_float(xv, wb, j):
    """Float types: a 'block' is 8 consecutive elements, one lane each (LPB = 1)."""
    return (_x8(xv, wb),)


@cuda.jit(device=True, inline="always")
def _dot_f16(raw4, bi, j, xs):
    """F16, uint32 view: elements 8bi .. 8bi+7 with one 16-byte load."""
    a, b, c, d = ld_global_v4_u32(raw4, bi * 4)
    t = xs[0]
    s = f32_from_f16_bits(int(a) & 0xFFFF) * t[0] + f32_from_f16_bits(int(a) >> 16) * t[1]
    s += f32_from_f16_bits(int(b) & 0xFFFF) * t[2] + f32_from_f16_bits(int(b) >> 16) * t[3]
    s += f32_from_f16_bits(int(c) & 0xFFFF) * t[4] + f32_from_f16_bits(int(c) >> 16) * t[5]
    s += f32_from_f16_bits(int(d) & 0xFFFF) * t[6] + f32_from_f16_bits(int(d) >> 16) * t[7]
    return s


@cuda.jit(device=True, inline="always")
def _dot_bf16(raw4, bi, j, xs):
    """BF16, uint32 view: float32 = bf16 bits << 16 (gguf-py ``BF16``); one 16-byte load per 8 elements."""
    a, b, c, d = ld_global_v4_u32(raw4, bi * 4)
    t = xs[0]
    s = f32_from_bits(int(a) << 16) * t[0] + f32_from_bits(int(a) & 0xFFFF0000) * t[1]
    s += f32_from_bits(int(b) << 16) * t[2] + f32_from_bits(int(b) & 0xFFFF0000) * t[3]
    s += f32_from_bits(int(c) << 16) * t[4] + f32_from_bits(int(c) & 0xFFFF0000) * t[5]
    s += f32_from_bits(int(d) << 16) * t[6] + f32_from_bits(int(d) & 0xFFFF0000) * t[7]
    return s


@cuda.jit(device=True, inline="always")
def _dot_f32(raw4, bi, j, xs):
    """F32, uint32 view: elements 8bi .. 8bi+7 with two 16-byte loads."""
    w = _x8(raw4, bi * 8)
    t = xs[0]
    s = w[0] * t[0] + w[1] * t[1]
    s += w[2] * t[2] + w[3] * t[3]
    s += w[4] * t[4] + w[5] * t[5]
    s += w[6] * t[6] + w[7] * t[7]
    return s


# ---- MMVQ: int8 (Q8_1) activations and dp4a ----------------------------------------------------------------------
# x loader: (q as uint32 words, d, s, weight index of the block's first weight, j) -> tuple of words and scales.
# Each dot decodes the lane's weights into packed bytes and multiplies them with x's int8 values four at a time
# (`dp4a_s32`); a 32-weight x block contributes d_x * (integer sum), so per 4 weights the work is one mask/shift
# and one dp4a instead of four converts and four FMAs (llama.cpp ggml-cuda/vecdotq.cuh ``vec_dot_q4_K_q8_1`` etc.).


@cuda.jit(device=True, inline="always")
def _xq_k_nibbles(xq, xd, xsum, wb, j):
    """Q4_K, LPB = 8: lane j (i = j/2) has weights 64i + 16(j%2) + (0..15) of sub-block 2i and the same 16
    positions of sub-block 2i+1: two 16-byte loads of int8 x, and both blocks' d and sum."""
    o = (wb >> 2) + 16 * (j >> 1) + 4 * (j & 1)
    b = (wb >> 5) + 2 * (j >> 1)
    u0, u1, u2, u3 = ld_global_v4_u32(xq, o)
    v0, v1, v2, v3 = ld_global_v4_u32(xq, o + 8)
    return (u0, u1, u2, u3, v0, v1, v2, v3, xd[b], xd[b + 1], xsum[b], xsum[b + 1])


@cuda.jit(device=True, inline="always")
def _dotq_q4_k(raw4, bi, j, xs):
    """Q4_K x Q8_1: d*sc*dx*Σ(q·xq) per sub-block, minus dmin*m*Σx (added once per sub-block: by even lanes).
    Header decoded before the qs load, as `_dot_q4_k` (HOIST=0's order)."""
    base = bi * 36
    d, dmin, sc0, mn0, sc1, mn1 = _k4_header(raw4, base, j)
    q0, q1, q2, q3 = ld_global_v4_u32(raw4, base + 4 + 4 * j)
    return _q4_k_sumq(d, dmin, sc0, mn0, sc1, mn1, q0, q1, q2, q3, j, xs)


@cuda.jit(device=True, inline="always")
def _mathq_q4_k(t, j, xs):
    """The decode half of `_dotq_q4_k`, from lane j's words ``t`` (`_q4_k_words`)."""
    d, dmin, sc0, mn0, sc1, mn1 = _k4_scales(t[0], t[1], t[2], t[3], j)
    return _q4_k_sumq(d, dmin, sc0, mn0, sc1, mn1, t[4], t[5], t[6], t[7], j, xs)


@cuda.jit(device=True, inline="always")
def _q4_k_sumq(d, dmin, sc0, mn0, sc1, mn1, q0, q1, q2, q3, j, xs):
    """Q4_K x Q8_1 of one lane: its decoded scales and qs words against its int8 x words, d and sums."""
    w0, w1, w2, w3 = int(q0), int(q1), int(q2), int(q3)
    lo = dp4a_s32(w0 & N4, xs[0], dp4a_s32(w1 & N4, xs[1], dp4a_s32(w2 & N4, xs[2], dp4a_s32(w3 & N4, xs[3], 0))))
    hi = dp4a_s32((w0 >> 4) & N4, xs[4], dp4a_s32((w1 >> 4) & N4, xs[5],
                  dp4a_s32((w2 >> 4) & N4, xs[6], dp4a_s32((w3 >> 4) & N4, xs[7], 0))))
    r = d * (sc0 * xs[8] * np.float32(lo) + sc1 * xs[9] * np.float32(hi))
    if (j & 1) == 0:
        r -= dmin * (mn0 * xs[10] + mn1 * xs[11])
    return r


@cuda.jit(device=True, inline="always")
def _xq_k_planes(xq, xd, xsum, wb, j):
    """Q6_K, LPB = 8: lane j (h = j/4, t0 = 8*(j%4)) has weights 128h + 32s + t0 + (0..7), s < 4: 8 int8 x (two
    words) from each of x blocks 4h + s, and their d."""
    o = (wb >> 2) + 32 * (j >> 2) + 2 * (j & 3)
    b = (wb >> 5) + 4 * (j >> 2)
    return (xq[o], xq[o + 1], xq[o + 8], xq[o + 9], xq[o + 16], xq[o + 17], xq[o + 24], xq[o + 25],
            xd[b], xd[b + 1], xd[b + 2], xd[b + 3])


Q6_OFFSET = 0xE0E0E0E0
"""Four int8 -32s: ``dp4a(Q6_OFFSET, x, c) = c - 32 * Σx``, Q6_K's offset (weight = d * scale * (q - 32))."""


@cuda.jit(device=True, inline="always")
def _xq_k_planes_fold(xq, xd, xsum, wb, j):
    """`_xq_k_planes` (same lanes, words and d) with unsigned indexes, plus per plane s ``-32 * Σx`` of the lane's
    8 x values of that plane (FOLD=1: computed once per chunk, shared by every row)."""
    o = U((wb >> 2) + 32 * (j >> 2) + 2 * (j & 3))
    b = U((wb >> 5) + 4 * (j >> 2))
    w0, w1, w2, w3 = xq[o], xq[o + U(1)], xq[o + U(8)], xq[o + U(9)]
    w4, w5, w6, w7 = xq[o + U(16)], xq[o + U(17)], xq[o + U(24)], xq[o + U(25)]
    return (w0, w1, w2, w3, w4, w5, w6, w7, xd[b], xd[b + U(1)], xd[b + U(2)], xd[b + U(3)],
            dp4a_s32(Q6_OFFSET, w0, dp4a_s32(Q6_OFFSET, w1, 0)), dp4a_s32(Q6_OFFSET, w2, dp4a_s32(Q6_OFFSET, w3, 0)),
            dp4a_s32(Q6_OFFSET, w4, dp4a_s32(Q6_OFFSET, w5, 0)), dp4a_s32(Q6_OFFSET, w6, dp4a_s32(Q6_OFFSET, w7, 0)))


@cuda.jit(device=True, inline="always")
def _q6_signed(v):
    """Bytes 0..63 of v (no carries) -> the int8 bytes v - 32: + 0x60 per byte (96..159), then flip bit 7."""
    return (v + 0x60606060) ^ 0x80808080


@cuda.jit(device=True, inline="always")
def _dotq_q6_k(raw, bi, j, xs):
    """Q6_K x Q8_1 (layout: `_q6_k_lane`): d * Σ_s sc_s * dx_s * Σ((q - 32)·xq)."""
    return _mathq_q6_k(_q6_k_lane(raw, bi, j), j, xs)


@cuda.jit(device=True, inline="always")
def _dotq_q6_k8(raw, bi, j, xs):
    """`_dotq_q6_k` with VLOAD=1's loads (`_q6_k_lane8`)."""
    return _mathq_q6_k(_q6_k_lane8(raw, bi, j), j, xs)


@cuda.jit(device=True, inline="always")
def _q6_k_scaled(d, c0, c1, c2, c3, s0, s1, s2, s3, xs):
    """A Q6_K MMVQ lane's result from its four planes' integer sums ``s0..s3``: d * Σ_s int8(c_s) * dx_s * s_s,
    with x's d of plane s at ``xs[8 + s]``."""
    r = _i8(c0) * xs[8] * np.float32(s0)
    r += _i8(c1) * xs[9] * np.float32(s1)
    r += _i8(c2) * xs[10] * np.float32(s2)
    r += _i8(c3) * xs[11] * np.float32(s3)
    return d * r


@cuda.jit(device=True, inline="always")
def _mathq_q6_k(t, j, xs):
    """The decode half of `_dotq_q6_k`, from lane j's `_q6_k_lane` tuple ``t``."""
    d, a0, a1, b0, b1, m0, m1, c0, c1, c2, c3 = t
    s0 = dp4a_s32(_q6_signed(_q6_bytes(a0, m0, 0)), xs[0], dp4a_s32(_q6_signed(_q6_bytes(a1, m1, 0)), xs[1], 0))
    s1 = dp4a_s32(_q6_signed(_q6_bytes(b0, m0, 1)), xs[2], dp4a_s32(_q6_signed(_q6_bytes(b1, m1, 1)), xs[3], 0))
    s2 = dp4a_s32(_q6_signed(_q6_bytes(a0, m0, 2)), xs[4], dp4a_s32(_q6_signed(_q6_bytes(a1, m1, 2)), xs[5], 0))
    s3 = dp4a_s32(_q6_signed(_q6_bytes(b0, m0, 3)), xs[6], dp4a_s32(_q6_signed(_q6_bytes(b1, m1, 3)), xs[7], 0))
    return _q6_k_scaled(d, c0, c1, c2, c3, s0, s1, s2, s3, xs)


@cuda.jit(device=True, inline="always")
def _xq_q8_0(xq, xd, xsum, wb, j):
    """Q8_0, LPB = 2: lane j has weights 16j .. 16j+15 (one 16-byte load of int8 x) and the block's d."""
    u0, u1, u2, u3 = ld_global_v4_u32(xq, (wb >> 2) + 4 * j)
    return (u0, u1, u2, u3, xd[wb >> 5])


@cuda.jit(device=True, inline="always")
def _dotq_q8_0(raw, bi, j, xs):
    """Q8_0 x Q8_1 (layout: `_q8_0_words`): d * dx * Σ(q·xq) over the lane's 16 int8 pairs."""
    return _mathq_q8_0(_q8_0_words(raw, bi, j), j, xs)


@cuda.jit(device=True, inline="always")
def _mathq_q8_0(w, j, xs):
    """The decode half of `_dotq_q8_0`, from lane j's `_q8_0_words` tuple ``w``."""
    t = dp4a_s32(w[1], xs[0], dp4a_s32(w[2], xs[1], 0))
    t = dp4a_s32(w[3], xs[2], dp4a_s32(w[4], xs[3], t))
    return w[0] * xs[4] * np.float32(t)


# name -> (x loader, block dot, lanes per block, weights per (pseudo-)block, raw view dtype)
_IMPLS = {
    "F32": (_x_float, _dot_f32, 1, 8, np.uint32),
    "F16": (_x_float, _dot_f16, 1, 8, np.uint32),
    "BF16": (_x_float, _dot_bf16, 1, 8, np.uint32),
    "Q4_0": (_x_legacy, _dot_q4_0, 2, 32, np.uint16),
    "Q4_1": (_x_legacy, _dot_q4_1, 2, 32, np.uint32),
    "Q5_0": (_x_legacy, _dot_q5_0, 2, 32, np.uint16),
    "Q5_1": (_x_legacy, _dot_q5_1, 2, 32, np.uint64),
    "Q8_0": (_x_q8_0, _dot_q8_0, 2, 32, np.uint16),
    "Q2_K": (_x_k_planes, _dot_q2_k, 8, 256, np.uint32),
    "Q3_K": (_x_k_planes, _dot_q3_k, 8, 256, np.uint16),
    "Q4_K": (_x_k_nibbles, _dot_q4_k, 8, 256, np.uint32),
    "Q5_K": (_x_k_nibbles, _dot_q5_k, 8, 256, np.uint32),
    "Q6_K": (_x_k_planes, _dot_q6_k, 8, 256, np.uint16),
    "MXFP4": (_x_legacy, _dot_mxfp4, 2, 32, np.uint8),
}
assert set(_IMPLS) == set(SUPPORTED), "every supported format needs a gemv implementation"
GEMV_TYPES = tuple(SUPPORTED)
"""Names of every format ``gemv_q`` takes (all of `kernels.quant.SUPPORTED`)."""
_MMVQ_IMPLS = {
    "Q4_K": (_xq_k_nibbles, _dotq_q4_k, 8, 256, np.uint32),
    "Q6_K": (_xq_k_planes, _dotq_q6_k, 8, 256, np.uint16),
    "Q8_0": (_xq_q8_0, _dotq_q8_0, 2, 32, np.uint16),
}
MMVQ_TYPES = tuple(_MMVQ_IMPLS)
# name -> (fetch: every load of a lane's piece of a block, math: the decode of what fetch returned); the block dot
# above computes math(fetch(...)) (Q4_K's with the header decoded between its two loads), so HOIST=1 and HOIST=0
# compute the same float32 operations in the same order.
_SPLITS = {"Q4_K": (_q4_k_words, _math_q4_k), "Q6_K": (_q6_k_lane, _math_q6_k), "Q8_0": (_q8_0_words, _math_q8_0)}
_MMVQ_SPLITS = {"Q4_K": (_q4_k_words, _mathq_q4_k), "Q6_K": (_q6_k_lane, _mathq_q6_k),
                "Q8_0": (_q8_0_words, _mathq_q8_0)}
HOIST_TYPES = tuple(_SPLITS)
# STAGE=2..4: name -> a lane's fetch from the block at element ``base`` of a uint16 ring window (`_ring_loop`)
_RING_FETCH = {"Q6_K": _q6_k_lane_at}
# VLOAD=1: name -> (f32-x dot, Q8_1-x dot, fetch) reading the blocks with 8-byte vector loads
_VLOAD = {"Q6_K": (_dot_q6_k8, _dotq_q6_k8, _q6_k_lane8)}
VLOAD_TYPES = tuple(_VLOAD)
"""Formats VLOAD=1 takes: Q6_K, whose 210-byte blocks are only 2-byte aligned."""
"""Formats HOIST=1 takes (f32 and MMVQ x): the ones whose block dot is split into a load half and a decode half."""
"""Formats with an MMVQ kernel (x given as `kernels.quantize_q8.Q8Blocks`): the default preset's Q4_K and Q6_K,
and Q8_0."""
FLOAT_GROUP = 8
"""Float types: ``id`` must be a multiple of 8 (each lane reads a row's elements in whole 16-byte groups)."""


@cuda.jit(device=True, inline="always")
def _mathq_q6_k_fold(t, j, xs):
    """`_mathq_q6_k` with FOLD=1 (x from `_xq_k_planes_fold`): each plane's integer sum starts from the loader's
    ``-32 * Σx`` and adds ``dp4a(q, x)`` of the stored q, so ``Σ(q - 32)·x`` needs no per-word offset."""
    d, a0, a1, b0, b1, m0, m1, c0, c1, c2, c3 = t
    s0 = dp4a_s32(_q6_bytes(a0, m0, 0), xs[0], dp4a_s32(_q6_bytes(a1, m1, 0), xs[1], xs[12]))
    s1 = dp4a_s32(_q6_bytes(b0, m0, 1), xs[2], dp4a_s32(_q6_bytes(b1, m1, 1), xs[3], xs[13]))
    s2 = dp4a_s32(_q6_bytes(a0, m0, 2), xs[4], dp4a_s32(_q6_bytes(a1, m1, 2), xs[5], xs[14]))
    s3 = dp4a_s32(_q6_bytes(b0, m0, 3), xs[6], dp4a_s32(_q6_bytes(b1, m1, 3), xs[7], xs[15]))
    return _q6_k_scaled(d, c0, c1, c2, c3, s0, s1, s2, s3, xs)


@cuda.jit(device=True, inline="always")
def _dotq_q6_k_fold(raw, bi, j, xs):
    """`_dotq_q6_k` with FOLD=1 (`_mathq_q6_k_fold`)."""
    return _mathq_q6_k_fold(_q6_k_lane(raw, bi, j), j, xs)


# FOLD=1: name -> (x loader, Q8_1-x dot, math for HOIST=1)
_FOLD = {"Q6_K": (_xq_k_planes_fold, _dotq_q6_k_fold, _mathq_q6_k_fold)}
FOLD_TYPES = tuple(_FOLD)


# ---- the kernel factory ----------------------------------------------------------------------------------------

_CACHE: dict[tuple, object] = {}


_KERNEL_TEMPLATE = """
def {fname}(raw, {wargs}{xargs}, y, res, od, id):
    tid = cuda.threadIdx.x
    lane = tid & 31
    warp = tid >> 5
    j = lane % {lpb}
    bl = lane // {lpb}
    row0 = cuda.blockIdx.x * {rpb}
    last = od - 1
    nb = id // {bs}
    nchunks = (nb + {bpc} - 1) // {bpc}
{prefetch}{per_row_init}
{loop}
{per_row_reduce}
{epilogue}
"""


def _chunk_body(rows, mats, unroll: int, wpr: int, bpc: int, bs: int, xargs: str, hoist: bool = False) -> str:
    """The loop body over ``unroll`` chunks; ``mats`` pairs each accumulator prefix with its weight array. One
    chunk: a guarded block (a lane past the row's end skips it). Several: every chunk's block index is clamped to
    the row (valid memory), all x loads and block dots are issued unconditionally in one basic block, so their
    loads can all be in flight together, and a lane past the end adds zero (a select, not a branch). ``hoist``:
    each block dot is written as its two halves, every ``fetch`` (all chunks, rows and weights) before any
    ``math``, so the loads lead in program order."""
    if unroll == 1:
        if hoist:
            body = [f"            f{p}{r} = fetch({w}, rb{r} + b, j)" for r in rows for p, w in mats]
            body += [f"            {p}{r} += math(f{p}{r}, j, xs)" for r in rows for p, _ in mats]
        else:
            body = [f"            {p}{r} += dot({w}, rb{r} + b, j, xs)" for r in rows for p, w in mats]
        dots = "\n".join(body)
        return f"        b = c * {bpc} + bl\n        if b < nb:\n            xs = xload({xargs}, b * {bs}, j)\n{dots}"
    lines = []
    for u in range(unroll):
        lines += [f"        b{u} = (c + {u * wpr}) * {bpc} + bl",
                  f"        v{u} = b{u} < nb",
                  f"        b{u} = min(b{u}, nb - 1)",
                  f"        xs{u} = xload({xargs}, b{u} * {bs}, j)"]
    if hoist:
        lines += [f"        f{p}{r}_{u} = fetch({w}, rb{r} + b{u}, j)" for u in range(unroll) for r in rows
                  for p, w in mats]
    for u in range(unroll):
        for r in rows:
            for p, w in mats:
                d = f"math(f{p}{r}_{u}, j, xs{u})" if hoist else f"dot({w}, rb{r} + b{u}, j, xs{u})"
                lines += [f"        d = {d}", f"        {p}{r} += d if v{u} else ZERO"]
    return "\n".join(lines)


def stage_window_bytes(chunk_bytes: int) -> int:
    """Shared-memory bytes of one staged chunk: the 16-byte vectors covering ``chunk_bytes`` bytes that start at
    any even address (up to 14 bytes before the chunk's start fall in its first vector)."""
    return (chunk_bytes + 14 + 15) // 16 * 16


def _stage_init(mats, rpb: int, wpr: int, chunk_bytes: int, slots: int = 1) -> str:
    """The staging buffer: one window per (warp, slot, weight, row), 16-byte aligned; ``wb0`` is this warp's
    first."""
    win = stage_window_bytes(chunk_bytes) // 2
    align = None if SIMULATOR else 16  # the simulator refuses the argument; its numpy arrays are 16-byte aligned
    return (f"    stg = cuda.shared.array({wpr * slots * len(mats) * rpb * win}, np.uint16, alignment={align})\n"
            f"    wb0 = warp * {slots * len(mats) * rpb * win}\n")


def _staged_body(rows, mats, rpb: int, bpc: int, bs: int, type_size: int, xargs: str) -> str:
    """The loop body with STAGE=1 (UNROLL=1): the warp copies its chunk (blocks ``cb .. ce-1``) of every row and
    weight into its shared windows, then decodes from there with the same block dots.

    A chunk's bytes ``[s, e)`` start at any even offset; the copy takes the 16-byte vectors of ``[s & ~15, e)``
    (W itself 16-byte aligned and a whole number of vectors long, so none lies past its end) with
    ``ld.global.v4`` (`kernels.ptx.ld_global_v4_b32`), lane ``l`` vectors ``l`` and ``l + 32``, ... clamped to
    the last one (a duplicate load of one line, not a branch), all of them before any store; then
    ``st.shared.v4``. The decode sees the window from ``s`` on as a ``uint16`` array whose block 0 is the chunk's
    first. `kernels.ptx.syncwarp` before the stores (the last chunk's decode is done) and after them (this one's copy is)."""
    win = stage_window_bytes(bpc * type_size) // 2
    nvec = win // 8
    loads, stores, views = [], [], []
    for r in rows:
        for m, (_, w) in enumerate(mats):
            k = f"{m}_{r}"
            base = f"wb0 + {(m * rpb + r) * win}"
            loads += [f"        s{k} = (rb{r} + cb) * {type_size}",
                      f"        a{k} = s{k} & -16",
                      f"        n{k} = ((rb{r} + ce) * {type_size} - a{k} + 15) >> 4"]
            for t in range((nvec + 31) // 32):
                loads += [f"        v{k}_{t} = min(lane + {32 * t}, n{k} - 1)",
                          f"        q{k}_{t} = ld_global_v4_b32({w}, (a{k} >> 1) + 8 * v{k}_{t})"]
                stores.append(f"        st_shared_v4_b32(stg, {base} + 8 * v{k}_{t}, q{k}_{t}[0], q{k}_{t}[1], "
                              f"q{k}_{t}[2], q{k}_{t}[3])")
            views.append(f"            {mats[m][0]}{r} += dot(stg[{base} + ((s{k} - a{k}) >> 1):], bl, j, xs)")
    return "\n".join([f"        cb = c * {bpc}", f"        ce = min(cb + {bpc}, nb)", *loads, "        syncwarp()",
                      *stores, "        syncwarp()", "        b = cb + bl", "        if b < nb:",
                      f"            xs = xload({xargs}, b * {bs}, j)", *views])


def _ring_copy(ind: str, chunk: str, slot: str, rows, mats, rpb: int, bpc: int, type_size: int) -> list[str]:
    """The lines (indented ``ind``) that start the ``cp.async`` copies of chunk ``chunk`` of every row and weight
    into ring slot ``slot``: the 16-byte vectors of ``[s & ~15, e)`` for the chunk's bytes ``[s, e)``, vector
    ``v`` by lane ``v mod 32`` (`kernels.ptx.cp_async_16_off`, which bypasses L1 and holds no register). Row r's
    bytes start at ``ra{r}`` (`_ring_loop`); the chunk's byte range and the slot's first byte are computed once
    for all rows. No branch: a lane past the window's last vector copies that last vector again (the same bytes
    to the same place), so every copy of a chunk is one straight line of code."""
    win = stage_window_bytes(bpc * type_size) // 2
    nvec = win // 8
    per_slot = len(mats) * rpb * win
    lines = [f"{ind}ccs = {chunk} * {bpc * type_size}", f"{ind}cce = min({chunk} * {bpc} + {bpc}, nb) * {type_size}",
             f"{ind}cd = 2 * (wb0 + ({slot}) * {per_slot})"]
    for r in rows:
        lines += [f"{ind}a{r} = (ra{r} + ccs) & -16", f"{ind}n{r} = (ra{r} + cce - a{r} + 15) >> 4"]
        for m, (_, w) in enumerate(mats):
            for t in range((nvec + 31) // 32):
                lines += [f"{ind}v{r}_{t} = 16 * min(lane + {32 * t}, n{r} - 1)"] if m == 0 else []
                lines += [f"{ind}cp_async_16_off(stg, cd + {2 * (m * rpb + r) * win} + v{r}_{t}, {w}, "
                          f"a{r} + v{r}_{t}, 16)"]
    return lines


def _ring_loop(rows, mats, rpb: int, wpr: int, bpc: int, bs: int, type_size: int, xargs: str, slots: int,
               at: bool = False, ahead=(), pdl: bool = False) -> str:
    """The chunk loop with STAGE = ``slots`` >= 2 (UNROLL=1): a ring of ``slots`` shared windows per warp, weight
    and row. The warp first starts the copies of its first ``slots - 1`` chunks; each step then starts the copy of
    the chunk ``slots - 1`` steps ahead into the slot freed by the previous step, waits for the current chunk's
    group (``cp.async.wait_group slots - 1``: every lane commits one group a step, empty past the row's end),
    `kernels.ptx.syncwarp` (the other lanes' copies are visible), decodes the chunk from its slot with the same
    block dots as STAGE=0, and syncwarps again (the slot is read before it is refilled). Window layout and
    alignment rules: as `_staged_body` (W 16-byte aligned, a whole number of 16-byte vectors). ``at``: the
    format has a `_RING_FETCH` (a lane's fetch from a block at any element of the window), used with ``math``
    instead of ``dot`` on a slice of the window: the same operations, without a slice's bounds arithmetic.
    ``ahead``: PREFETCH's lookahead lines (`_lookahead`), first in each step. ``pdl``: the first copies (W only)
    are started before `kernels.ptx.griddepcontrol_wait`, the loop (x, y) after it."""
    win = stage_window_bytes(bpc * type_size) // 2
    per_slot = len(mats) * rpb * win
    step = wpr
    lines = [f"    ra{r} = rb{r} * {type_size}" for r in rows]
    for p in range(slots - 1):
        lines += [f"    cc = warp + {p * step}", "    if cc < nchunks:",
                  *_ring_copy("        ", "cc", str(p), rows, mats, rpb, bpc, type_size), "    cp_async_commit_group()"]
    lines += ["    griddepcontrol_wait()"] if pdl else []
    lines += ["    sl = 0", f"    sw = {slots - 1}", f"    for c in range(warp, nchunks, {step}):", *ahead,
              f"        cc = c + {(slots - 1) * step}", "        if cc < nchunks:",
              *_ring_copy("            ", "cc", "sw", rows, mats, rpb, bpc, type_size),
              "        cp_async_commit_group()", f"        cp_async_wait_group({slots - 1})", "        syncwarp()",
              f"        cb = c * {bpc}", "        b = cb + bl", "        if b < nb:",
              f"            xs = xload({xargs}, b * {bs}, j)"]
    for r in rows:
        for m, (p, w) in enumerate(mats):
            base = f"wb0 + sl * {per_slot} + {(m * rpb + r) * win} + (((ra{r} + cb * {type_size}) & 15) >> 1)"
            if at:
                lines.append(f"            {p}{r} += math(fetch(stg, {base} + bl * {type_size // 2}, j), j, xs)")
            else:
                lines.append(f"            {p}{r} += dot(stg[{base}:], bl, j, xs)")
    lines += ["        syncwarp()", f"        sl = sl + 1 if sl < {slots - 1} else 0",
              f"        sw = sw + 1 if sw < {slots - 1} else 0"]
    return "\n".join(lines)


def _epilogue(rows, mats, rpb: int, wpr: int, residual: bool) -> str:
    """Reduce the warps' row sums (shared memory when WPR > 1) and store y: the sum (+ res), or with two
    matrices (gate, up) silu(gate row) * up row."""
    glu = len(mats) == 2

    def value(a, u, r):
        return f"silu_mul({a}, {u})" if glu else a + (f" + res[{r}]" if residual else "")

    if wpr == 1:
        return "    if lane == 0:\n" + "\n".join(
            f"        if row0 + {r} < od:\n            y[row0 + {r}] = {value(f'acc{r}', f'acu{r}', f'row0 + {r}')}"
            for r in rows)
    lines = [f"    part = cuda.shared.array({len(mats) * rpb * wpr}, np.float32)", "    if lane == 0:"]
    lines += [f"        part[({m * wpr} + warp) * {rpb} + {r}] = {p}{r}" for r in rows for m, (p, _) in enumerate(mats)]
    lines += ["    cuda.syncthreads()", f"    if tid < {rpb}:", "        row = row0 + tid", "        if row < od:"]
    for m, v in enumerate(("v", "u")[: len(mats)]):
        lines += [f"            {v} = part[{m * wpr * rpb} + tid]",
                  f"            for w in range(1, {wpr}):",
                  f"                {v} += part[({m * wpr} + w) * {rpb} + tid]"]
    lines.append(f"            y[row] = {value('v', 'u', 'row')}")
    return "\n".join(lines)


def lookahead_lines(chunk_bytes: int) -> int:
    """128-byte lines a lookahead covers per row: the most that ``chunk_bytes`` bytes at any offset can touch, with
    offsets taken from an array start of any alignment (one more than ``ceil((chunk_bytes - 1) / 128) + 1`` would
    need where lines and array agree)."""
    return chunk_bytes // 128 + 2


def _lookahead(ind: str, mats, rpb: int, chunk_bytes: int, type_size: int, chunk: str) -> list[str]:
    """The lines (indented ``ind``) that prefetch into L2 chunk ``chunk`` (an expression: PREFETCH's ``c + (PREFETCH
    - 1) * WPR``, the chunk this warp decodes PREFETCH - 1 steps later; PDL's ``warp``, its first), every row and
    weight, when it exists. Lane slot ``q = lane + 32 t`` takes row
    ``q // lines`` of the CUDA block (clamped to ``od - 1``) and, of that row's chunk, the line ``q % lines`` after
    the chunk's start rounded down to 128 bytes (``lines``: `lookahead_lines`), clamped to the chunk's last byte;
    slots past ``RPB * lines`` repeat the last one (a line asked for twice: no branch). Every offset lies in its
    row's bytes or the row before (the rounding), inside W. Computed in the step, not kept from the kernel's start:
    at MINB=7's 72 registers, a lane's row and line held across the loop spill (offline ptxas: 16 bytes of stack
    for Q4_K)."""
    lines = lookahead_lines(chunk_bytes)
    slots = rpb * lines
    out = [f"{ind}pc = {chunk}", f"{ind}if pc < nchunks:", f"{ind}    pb = pc * {chunk_bytes}",
           f"{ind}    pe = min(pb + {chunk_bytes}, nb * {type_size}) - 1"]
    for t in range((slots + 31) // 32):
        out += [f"{ind}    pq = min(lane + {32 * t}, {slots - 1})",
                f"{ind}    pr = min(row0 + pq // {lines}, last) * nb * {type_size}",
                f"{ind}    po = min(((pr + pb) & -128) + (pq % {lines}) * 128, pr + pe)"]
        out += [f"{ind}    prefetch_l2({w}, po)" for _, w in mats]
    return out


def prefetch_refusal(prefetch: int, *, unroll: int = 1, stage: int = 0) -> str | None:
    """Why ``prefetch`` (one of ``PREFETCH_VALUES``) cannot run with these knobs, in one sentence, or None: the one
    owner of PREFETCH's rules (`kernel_for` raises it; the gemv experiment asks first). The lookahead (2, 3)
    prefetches ahead of a loop of one chunk a step: UNROLL=1, and STAGE 0 or a ring (2..4), not the register copy
    of STAGE=1."""
    if prefetch < 2:
        return None
    if unroll != 1:
        return f"prefetch={prefetch} (lookahead) needs unroll=1 (one chunk a step), got unroll={unroll}"
    if stage == 1:
        return f"prefetch={prefetch} (lookahead) does not combine with stage=1; use stage 0 or a ring (2..4)"
    return None


def _prefetch(mats, rpb: int, row_bytes_per_block: int) -> str:
    """Thread 0's L2 prefetch of the CUDA block's rows ``row0 .. min(row0 + RPB, od) - 1`` of every weight (one
    contiguous byte range each; ranges under 32 bytes are skipped, as `prefetch_l2_bulk` requires)."""
    return ("    if tid == 0:\n"
            f"        pb = row0 * nb * {row_bytes_per_block}\n"
            f"        pe = min(row0 + {rpb}, od) * nb * {row_bytes_per_block}\n"
            "        if pe - pb >= 32:\n"
            + "".join(f"            prefetch_l2_bulk({w}, pb, pe)\n" for _, w in mats))


def _build(name: str, rpb: int, wpr: int, residual: bool, mmvq: bool = False, unroll: int = 1, glu: bool = False,
           prefetch: int = 0, stage: int = 0, hoist: bool = False, min_blocks: int = 0,
           vload: bool = False, fold: bool = False, pdl: bool = False):
    """Generate and jit the kernel for one (format, RPB, WPR, residual, MMVQ, UNROLL, GLU, PREFETCH, STAGE, HOIST,
    MINB, VLOAD, FOLD, PDL): the per-row
    code is written out RPB times with scalar accumulators (a loop over a local array is left rolled by LLVM when
    the block decode is long, which puts the accumulators in local memory). GLU: a second weight ``up`` of the
    same format and shape, its rows accumulated beside the first's, and y = silu(W·x) * (up·x)."""
    xload, dot, lpb, bs, _ = (_MMVQ_IMPLS if mmvq else _IMPLS)[name]
    # a block dot's two halves, for HOIST=1 and for the ring's window fetch (`_RING_FETCH`); unused otherwise
    fetch, math = (_MMVQ_SPLITS if mmvq else _SPLITS).get(name, (None, None))
    if vload:
        dot = _VLOAD[name][1 if mmvq else 0]
        fetch = _VLOAD[name][2]
    if fold:
        xload, dot, math = _FOLD[name]
    fmt = block_format(name)
    fname = (f"gemv_{name.lower()}_rpb{rpb}_wpr{wpr}_u{unroll}{'_res' if residual else ''}"
             f"{'_mmvq' if mmvq else ''}{'_glu' if glu else ''}{'_pf' if prefetch == 1 else f'_la{prefetch - 1}' if prefetch else ''}{'_stage' if stage == 1 else f'_ring{stage}' if stage else ''}{'_hoist' if hoist else ''}{f'_minb{min_blocks}' if min_blocks else ''}{'_v8' if vload else ''}{'_fold' if fold else ''}{'_pdl' if pdl else ''}")
    xargs = "xq, xd, xsum" if mmvq else "xv"
    mats = [("acc", "raw"), ("acu", "up")] if glu else [("acc", "raw")]
    rows = range(rpb)
    chunk_bytes = 32 // lpb * fmt.type_size
    ahead = (_lookahead("        ", mats, rpb, chunk_bytes, fmt.type_size, f"c + {(prefetch - 1) * wpr}")
             if prefetch > 1 else [])
    if stage > 1:
        at = name in _RING_FETCH
        fetch = _RING_FETCH.get(name, fetch)
        loop = _ring_loop(rows, mats, rpb, wpr, 32 // lpb, bs, fmt.type_size, xargs, stage, at, ahead, pdl)
    else:
        body = (_staged_body(rows, mats, rpb, 32 // lpb, bs, fmt.type_size, xargs) if stage
                else _chunk_body(rows, mats, unroll, wpr, 32 // lpb, bs, xargs, hoist))
        first = _lookahead("    ", mats, rpb, chunk_bytes, fmt.type_size, "warp") + ["    griddepcontrol_wait()"]
        loop = "\n".join([*(first if pdl else []), f"    for c in range(warp, nchunks, {wpr * unroll}):", *ahead, body])
    src = _KERNEL_TEMPLATE.format(
        fname=fname,
        wargs="up, " if glu else "",
        xargs=xargs,
        lpb=lpb,
        bs=bs,
        bpc=32 // lpb,
        rpb=rpb,
        # nb counts pseudo-blocks of bs weights: bs // block_size GGUF blocks each (1, or 8 for the float types)
        prefetch=("    griddepcontrol_launch_dependents()\n" if pdl else "")
        + (_prefetch(mats, rpb, bs // fmt.block_size * fmt.type_size) if prefetch == 1 else ""),
        # rows past od (last CUDA block) re-read row od - 1: valid memory, never written
        per_row_init=(_stage_init(mats, rpb, wpr, chunk_bytes, max(stage, 1)) if stage else "") + "\n".join(f"    rb{r} = min(row0 + {r}, last) * nb\n" + "\n".join(f"    {p}{r} = ZERO" for p, _ in mats)
                                for r in rows),
        loop=loop,
        per_row_reduce="\n".join(f"    {p}{r} = _warp_sum({p}{r})" for r in rows for p, _ in mats),
        epilogue=_epilogue(rows, mats, rpb, wpr, residual),
    )
    scope = {"cuda": cuda, "np": np, "ZERO": ZERO, "_warp_sum": _warp_sum, "silu_mul": silu_mul, "xload": xload,
             "dot": dot, "fetch": fetch, "math": math, "prefetch_l2_bulk": prefetch_l2_bulk, "prefetch_l2": prefetch_l2,
             "griddepcontrol_wait": griddepcontrol_wait,
             "griddepcontrol_launch_dependents": griddepcontrol_launch_dependents,
             "ld_global_v4_b32": ld_global_v4_b32,
             "st_shared_v4_b32": st_shared_v4_b32, "syncwarp": syncwarp, "cp_async_16_off": cp_async_16_off,
             "cp_async_commit_group": cp_async_commit_group, "cp_async_wait_group": cp_async_wait_group}
    exec(compile(src, f"<kernels.gemv_q {fname}>", "exec"), scope)
    if min_blocks and not SIMULATOR:  # a compiler bound: the simulator's jit takes none and has no registers
        return cuda.jit(scope[fname], launch_bounds=(threads_per_block(wpr), min_blocks))
    return cuda.jit(scope[fname])


def _check_knobs(rows_per_block, warps_per_row, unroll=1, prefetch=0, stage=0, hoist=0, min_blocks=0,
                 vload=0, fold=0, pdl=0) -> None:
    if min_blocks in MINB_VALUES and warps_per_row in WPR_VALUES and min_blocks * 32 * warps_per_row > MAX_THREADS_PER_SM:
        fits = [m for m in MINB_VALUES if m * 32 * warps_per_row <= MAX_THREADS_PER_SM]
        raise KernelConstraintError(
            f"min_blocks={min_blocks} with warps_per_row={warps_per_row} asks for {min_blocks * 32 * warps_per_row} "
            f"threads a SM, more than the {MAX_THREADS_PER_SM} an SM holds (ptxas would ignore the bound); allowed "
            f"here: {', '.join(map(str, fits))}"
        )
    if pdl not in PDL_VALUES:
        raise KernelConstraintError(f"pdl={pdl!r} is not supported; allowed: {', '.join(map(str, PDL_VALUES))}")
    if vload not in VLOAD_VALUES:
        raise KernelConstraintError(f"vload={vload!r} is not supported; allowed: {', '.join(map(str, VLOAD_VALUES))}")
    if fold not in FOLD_VALUES:
        raise KernelConstraintError(f"fold={fold!r} is not supported; allowed: {', '.join(map(str, FOLD_VALUES))}")
    if min_blocks not in MINB_VALUES:
        raise KernelConstraintError(
            f"min_blocks={min_blocks!r} is not supported; allowed: {', '.join(map(str, MINB_VALUES))}"
        )
    if hoist not in HOIST_VALUES:
        raise KernelConstraintError(f"hoist={hoist!r} is not supported; allowed: {', '.join(map(str, HOIST_VALUES))}")
    if stage not in STAGE_VALUES:
        raise KernelConstraintError(f"stage={stage!r} is not supported; allowed: {', '.join(map(str, STAGE_VALUES))}")
    if prefetch not in PREFETCH_VALUES:
        raise KernelConstraintError(
            f"prefetch={prefetch!r} is not supported; allowed: {', '.join(map(str, PREFETCH_VALUES))}"
        )
    if unroll not in UNROLL_VALUES:
        raise KernelConstraintError(
            f"unroll={unroll!r} is not supported; allowed: {', '.join(map(str, UNROLL_VALUES))}"
        )
    if rows_per_block not in RPB_VALUES:
        raise KernelConstraintError(
            f"rows_per_block={rows_per_block!r} is not supported; allowed: {', '.join(map(str, RPB_VALUES))}"
        )
    if warps_per_row not in WPR_VALUES:
        raise KernelConstraintError(
            f"warps_per_row={warps_per_row!r} is not supported; allowed: {', '.join(map(str, WPR_VALUES))}"
        )


def _format_name(qtype, mmvq: bool) -> str:
    try:
        name = block_format(qtype).name
    except KeyError as e:
        raise KernelConstraintError(e.args[0]) from None
    if mmvq and name not in _MMVQ_IMPLS:
        raise KernelConstraintError(
            f"{name} has no MMVQ (int8-activation) kernel; MMVQ covers {', '.join(MMVQ_TYPES)} (use f32 x for {name})"
        )
    return name


def kernel_for(qtype, rows_per_block: int = DEFAULT_RPB, warps_per_row: int = DEFAULT_WPR, residual: bool = False,
               mmvq: bool = False, unroll: int = DEFAULT_UNROLL, glu: bool = False, prefetch: int = DEFAULT_PREFETCH,
               stage: int = DEFAULT_STAGE, hoist: int = DEFAULT_HOIST, min_blocks: int = DEFAULT_MINB,
               vload: int = DEFAULT_VLOAD, fold: int = DEFAULT_FOLD, pdl: int = DEFAULT_PDL):
    """The (cached) numba dispatcher of format ``qtype`` specialised for these knobs (``mmvq``: the kernel taking
    Q8_1 activations, for the formats in ``MMVQ_TYPES``; ``unroll``: chunks per loop iteration; ``glu``: the
    two-weight SwiGLU kernel of `gemv_glu`, which has no residual; ``prefetch``: one of ``PREFETCH_VALUES``;
    ``stage``: one of ``STAGE_VALUES``, above 0 for the formats ``STAGE_TYPES`` within ``STAGE_SMEM_LIMIT``; ``hoist``:
    one of ``HOIST_VALUES``, 1 for the formats ``HOIST_TYPES`` without stage; ``min_blocks``: one of
    ``MINB_VALUES``, the launch bound; ``vload``: one of ``VLOAD_VALUES``, 1 for ``VLOAD_TYPES`` without stage;
    ``fold``: one of ``FOLD_VALUES``, 1 for ``FOLD_TYPES`` with mmvq, without vload; ``pdl``: one of
    ``PDL_VALUES``)."""
    name = _format_name(qtype, mmvq)
    _check_knobs(rows_per_block, warps_per_row, unroll, prefetch, stage, hoist, min_blocks, vload, fold, pdl)
    if glu and residual:
        raise KernelConstraintError("the SwiGLU kernel (glu) has no residual epilogue")
    reason = stage_refusal(name, rows_per_block, warps_per_row, stage=stage, unroll=unroll, glu=glu) if stage else None
    reason = reason or (hoist_refusal(name, stage=stage) if hoist else None)
    reason = reason or (vload_refusal(name, stage=stage) if vload else None)
    reason = reason or (fold_refusal(name, mmvq=mmvq, vload=vload) if fold else None)
    reason = reason or prefetch_refusal(prefetch, unroll=unroll, stage=stage)
    if reason:
        raise KernelConstraintError(reason)
    key = (name, int(rows_per_block), int(warps_per_row), bool(residual), bool(mmvq), int(unroll), bool(glu),
           int(prefetch), int(stage), bool(hoist), int(min_blocks), bool(vload), bool(fold), bool(pdl))
    k = _CACHE.get(key)
    if k is None:
        k = _CACHE[key] = _build(*key)
    return k


MINB_REGISTER_FLOOR = 72
"""`one_wave_min_blocks` bounds no kernel below this many registers per thread: the measured case (Q4_K MMVQ,
RPB=4, WPR=4, HOIST=1, MINB=7: 72 registers, 28 bytes of spills, 16.33 µs, ledger #52). Tighter bounds spill
hundreds of bytes (MINB=8: 64 registers; MINB=14: 32) and were never measured faster."""


def min_blocks_registers(min_blocks: int, warps_per_row: int) -> int:
    """Registers per thread ptxas may use under ``__launch_bounds__(32 * WPR, MINB)``: 65536 / (MINB * 32 * WPR)
    rounded down to its allocation granularity of 8 (255 with no bound)."""
    if not min_blocks:
        return 255
    return min(255, 65536 // (min_blocks * 32 * warps_per_row) // 8 * 8)


def one_wave_min_blocks(grid: int, sm_count: int, warps_per_row: int) -> int:
    """The smallest ``MINB_VALUES`` entry (> 0) that fits a ``grid`` of CUDA blocks of ``32 * warps_per_row``
    threads on ``sm_count`` SMs at once (``ceil(grid / sm_count)`` blocks per SM), or 0 (no bound) when none does
    within the SM's 2048 threads and `MINB_REGISTER_FLOOR` registers per thread.
    Raises ValueError for a grid or SM count below 1."""
    if grid < 1 or sm_count < 1:
        raise ValueError(f"one_wave_min_blocks needs grid >= 1 and sm_count >= 1, got {grid} and {sm_count}")
    need = -(-int(grid) // int(sm_count))
    return next((m for m in MINB_VALUES if m >= need and m > 0 and m * 32 * warps_per_row <= MAX_THREADS_PER_SM
                 and min_blocks_registers(m, warps_per_row) >= MINB_REGISTER_FLOOR), 0)


def _known_format(qtype) -> tuple:
    """(the format's name, None), or (None, the sentence naming the supported formats) for an unknown ``qtype``."""
    try:
        return block_format(qtype).name, None
    except KeyError as e:
        return None, e.args[0]


def hoist_refusal(qtype, *, stage: int = 0) -> str | None:
    """Why ``hoist=1`` cannot run for format ``qtype`` (with ``stage``), in one sentence, or None: the one owner of
    HOIST's rules (`kernel_for` raises it; the gemv experiment and the decode engine ask first)."""
    name, unknown = _known_format(qtype)
    if unknown:
        return unknown
    if name not in HOIST_TYPES:
        return (f"hoist=1 takes the formats whose block dot is split into loads and decode, {', '.join(HOIST_TYPES)}; "
                f"{name} has no split, use hoist=0")
    if stage:
        return (f"hoist=1 does not combine with stage={stage} (the staged loop loads through shared memory); "
                "pick one")
    return None


def vload_refusal(qtype, *, stage: int = 0, raw=None, nbytes: int | None = None, what: str = "raw") -> str | None:
    """Why ``vload=1`` cannot run, in one sentence, or None: the one owner of VLOAD's rules (`kernel_for` and the
    launchers raise it; the gemv experiment asks first). A format outside ``VLOAD_TYPES``, stage > 0, or, given W
    (``raw``, a device array named ``what``) or its size ``nbytes``: W not a multiple of 8 bytes or not starting
    8-byte aligned (the last block's second vector would pass W's end, or the vector loads would fault)."""
    name, unknown = _known_format(qtype)
    if unknown:
        return unknown
    if name not in VLOAD_TYPES:
        return (f"vload=1 takes {', '.join(VLOAD_TYPES)} (2-byte-aligned blocks read as 8-byte vectors); {name} "
                "already loads aligned words, use vload=0")
    if stage:
        return (f"vload=1 does not combine with stage={stage} (the staged loop loads through shared memory); "
                "pick one")
    size = raw.size * raw.dtype.itemsize if raw is not None else nbytes
    address = _address(raw) % 8 if raw is not None else 0
    if size is not None and (size % 8 or address):
        return (f"vload=1 reads {what} in 8-byte vectors: it must start at an 8-byte aligned address and be a "
                f"multiple of 8 bytes long, got {size} bytes" + (f" at address % 8 = {address}" if address else ""))
    return None


def fold_refusal(qtype, *, mmvq: bool, vload: int = 0) -> str | None:
    """Why ``fold=1`` cannot run, in one sentence, or None: the one owner of FOLD's rules (`kernel_for` raises it;
    the gemv experiment asks first). A format outside ``FOLD_TYPES``, f32 x (the offset is folded into the int8
    dot products of the MMVQ kernel), or vload=1."""
    name, unknown = _known_format(qtype)
    if unknown:
        return unknown
    if name not in FOLD_TYPES:
        return (f"fold=1 takes {', '.join(FOLD_TYPES)} (the formats with an offset subtracted from every stored q); "
                f"{name} has none, use fold=0")
    if not mmvq:
        return "fold=1 folds the offset into the dp4a dots of the MMVQ kernel: it needs Q8_1 x (MMVQ=1), not f32 x"
    if vload:
        return "fold=1 does not combine with vload=1 (its dot reads halfwords); pick one"
    return None


def stage_smem_bytes(qtype, rows_per_block: int, warps_per_row: int, glu: bool = False, stage: int = 1) -> int:
    """Static shared memory of a staged kernel: one `stage_window_bytes` window per warp, slot (``stage`` of
    them), weight and row."""
    fmt = block_format(qtype)
    chunk = 32 // _IMPLS[fmt.name][2] * fmt.type_size
    return warps_per_row * max(stage, 1) * rows_per_block * (1 + bool(glu)) * stage_window_bytes(chunk)


def stage_refusal(qtype, rows_per_block: int, warps_per_row: int, *, stage: int = 1, unroll: int = 1,
                  glu: bool = False, raw=None, nbytes: int | None = None, what: str = "raw") -> str | None:
    """Why ``stage`` (one of ``STAGE_VALUES`` above 0) cannot run with these knobs, in one sentence, or None: the
    one owner of STAGE's rules (`kernel_for`, `gemv_q` and `gemv_glu` raise it; the gemv experiment and the decode
    engine ask first). A format outside ``STAGE_TYPES``, ``unroll`` other than 1, windows over
    ``STAGE_SMEM_LIMIT``; with ``raw`` (a device array, named ``what``) or only its size ``nbytes``: W not a whole
    number of 16-byte vectors or, for ``raw``, not starting at a 16-byte aligned address (the copy's vector loads
    would fault or pass its end)."""
    name, unknown = _known_format(qtype)
    if unknown:
        return unknown
    if name not in STAGE_TYPES:
        return (f"stage={stage} takes the 2-byte-aligned formats {', '.join(STAGE_TYPES)}; {name} already loads its "
                "blocks with aligned words, use stage=0")
    if unroll != 1:
        return f"stage={stage} needs unroll=1 (the staged loop copies one chunk a step), got {unroll}"
    need = stage_smem_bytes(name, rows_per_block, warps_per_row, glu, stage)
    if need > STAGE_SMEM_LIMIT:
        return (f"stage={stage} with rows_per_block={rows_per_block}, warps_per_row={warps_per_row}"
                f"{' and glu' if glu else ''} needs {need} bytes of shared memory for {name}, over the "
                f"{STAGE_SMEM_LIMIT}-byte static limit; use fewer rows, warps or stages")
    size = raw.size * raw.dtype.itemsize if raw is not None else nbytes
    address = _address(raw) % 16 if raw is not None else 0
    if size is not None and (size % 16 or address):
        return (f"stage={stage} reads {what} in 16-byte vectors: it must start at a 16-byte aligned address and be a "
                f"multiple of 16 bytes long, got {size} bytes" + (f" at address % 16 = {address}" if address else ""))
    return None


def kernel_signature(qtype, mmvq: bool = False, glu: bool = False) -> tuple:
    """The numba argument types ``gemv_q`` launches format ``qtype``'s kernels with (for `compile_ptx`)."""
    from numba import types
    from numba.np.numpy_support import from_dtype

    name = _format_name(qtype, mmvq)
    view = (_MMVQ_IMPLS if mmvq else _IMPLS)[name][4]
    f32 = types.Array(types.float32, 1, "C")
    u32 = types.Array(types.uint32, 1, "C")
    x = (u32, f32, f32) if mmvq else (u32,)
    w = types.Array(from_dtype(np.dtype(view)), 1, "C")
    return (*(w, w)[: 1 + bool(glu)], *x, f32, f32, types.int64, types.int64)


def threads_per_block(warps_per_row: int) -> int:
    return 32 * warps_per_row


def gemv_q(
    raw,
    qtype,
    od: int,
    id: int,
    x,
    out=None,
    *,
    rows_per_block: int = DEFAULT_RPB,
    warps_per_row: int = DEFAULT_WPR,
    unroll: int = DEFAULT_UNROLL,
    prefetch: int = DEFAULT_PREFETCH,
    stage: int = DEFAULT_STAGE,
    hoist: int = DEFAULT_HOIST,
    min_blocks: int = DEFAULT_MINB,
    vload: int = DEFAULT_VLOAD,
    fold: int = DEFAULT_FOLD,
    pdl: int = DEFAULT_PDL,
    residual=None,
    stream=0,
):
    """Enqueue ``y[od] = W[od, id] · x[id] (+ residual[od])`` on ``stream`` and return ``y`` (f32, ``[od]``).

    raw: 1-D C-contiguous uint8 device array, W's bytes exactly as stored in a GGUF file: ``od`` rows of
    ``id / block_size`` blocks (ggml-common.h layouts; `kernels.quant.formats`), starting at a device address that
    is a multiple of the format's ``align`` (any cudaMalloc'd buffer and any GGUF tensor is).
    qtype: format name ("Q4_K"), ``gguf.GGMLQuantizationType`` member or its value; any of ``GEMV_TYPES``.
    od, id: rows and columns of W; ``id`` a multiple of the block size (32 for Q4_0..Q8_0 and MXFP4, 256 for
    the K-quants, 8 for F32/F16/BF16, whose lanes read whole 16-byte groups).
    x: 1-D C-contiguous float32 device array of ``id`` elements, 16-byte aligned; or ``id`` activations already
    quantized to Q8_1 blocks (`kernels.quantize_q8.Q8Blocks`, from `quantize_q8_1`), which selects the MMVQ kernel
    (int8 x, ``dp4a`` integer dot products; formats ``MMVQ_TYPES``). Its result is the exact product with the
    quantized x (relative difference to the f32-x product ~1e-3, the int8 rounding of x).
    out: optional 1-D C-contiguous float32 device array of ``od`` elements (allocated when None).
    rows_per_block: rows per CUDA block, one of ``RPB_VALUES`` (each warp decodes them together, sharing x).
    warps_per_row: warps splitting each row, one of ``WPR_VALUES`` (threads per block = 32 * warps_per_row).
    unroll: chunks each warp takes per loop iteration, one of ``UNROLL_VALUES`` (more loads in flight per warp).
    prefetch: one of ``PREFETCH_VALUES``: 1 to have each CUDA block first stream its rows into L2 with one TMA bulk
    prefetch; 2, 3 to have each warp prefetch the lines of its chunk 1 or 2 steps ahead (not with unroll=2 or
    stage=1: `prefetch_refusal`).
    stage: shared-memory slots per warp that each chunk passes through before it is decoded (``STAGE_VALUES``):
    1 copies it with 16-byte loads through registers, 2..4 a ring filled by cp.async that keeps stage - 1 chunks in
    flight; the formats ``STAGE_TYPES``, with raw starting at a 16-byte aligned address and a multiple of 16 bytes
    long, and the windows within ``STAGE_SMEM_LIMIT``.
    hoist: 1 to issue all of a chunk's loads (every row) before decoding any (``HOIST_VALUES``; the formats
    ``HOIST_TYPES``, not with stage > 0); the result is bit-identical to hoist=0.
    min_blocks: CUDA blocks per SM to compile for (``MINB_VALUES``; 0 none): ``__launch_bounds__``'s register cap,
    so that a grid of few blocks runs in one wave; the result is bit-identical to min_blocks=0.
    vload: 1 to read Q6_K blocks with 8-byte vector loads (``VLOAD_VALUES``; raw 8-byte aligned and a multiple of
    8 bytes long, not with stage > 0); the result is bit-identical to vload=0.
    fold: 1 to take Q6_K's -32 offset into the MMVQ dot once per chunk from x (``FOLD_VALUES``; ``FOLD_TYPES``, Q8_1
    x, not with vload=1); the result is bit-identical to fold=0.
    pdl: 1 for a programmatic dependent launch (``PDL_VALUES``; a numba stream, not 0): the kernel may start while
    the previous kernel of the stream finishes, touching only W until that kernel has completed; the result is
    bit-identical to pdl=0.
    residual: optional float32 device array of ``od`` elements added to y in the epilogue (fused ``y += r``;
    may be ``out`` itself: each element is read before it is written, by the same thread).

    Accumulation is float32 (per-lane partial sums, then a shuffle tree and a shared-memory sum across warps);
    against float64 ``dequantize(W) @ x`` the relative error is ~1e-7 (tests assert < 1e-5).
    Source: llama.cpp ggml-cuda mmvq.cu (work split; with Q8_1 x, vecdotq.cuh's dp4a dots) and dmmv.cu (f32
    activations), ggml-common.h (blocks).

    Raises KernelConstraintError (a ValueError) with one sentence saying what is wrong, for: an unsupported type,
    raw not a 1-D C-contiguous uint8 device array, misaligned, or of a length other than ``od`` rows of
    ``id / block_size`` blocks; ``id`` not a multiple of the block size; x, out or residual of the wrong dtype,
    length or layout (x also misaligned); a knob value outside its allowed set; Q8_1 x for a format without an
    MMVQ kernel; stage > 0, hoist=1, vload=1, fold=1 or prefetch > 1 where `stage_refusal`, `hoist_refusal`,
    `vload_refusal`, `fold_refusal` or `prefetch_refusal` refuses it; pdl=1 on stream 0.
    """
    return _launch(raw, None, qtype, od, id, x, out, residual, rows_per_block, warps_per_row, unroll, prefetch,
                   stage, hoist, min_blocks, vload, fold, pdl, stream)


def gemv_glu(
    raw_gate,
    raw_up,
    qtype,
    od: int,
    id: int,
    x,
    out=None,
    *,
    rows_per_block: int = DEFAULT_RPB,
    warps_per_row: int = DEFAULT_WPR,
    unroll: int = DEFAULT_UNROLL,
    prefetch: int = DEFAULT_PREFETCH,
    stage: int = DEFAULT_STAGE,
    hoist: int = DEFAULT_HOIST,
    min_blocks: int = DEFAULT_MINB,
    vload: int = DEFAULT_VLOAD,
    fold: int = DEFAULT_FOLD,
    pdl: int = DEFAULT_PDL,
    stream=0,
):
    """Enqueue the SwiGLU of two mat-vecs in one kernel, ``y[r] = silu(Wg[r]·x) * (Wu[r]·x)`` with
    ``silu(g) = g / (1 + exp(-g))`` (the expression of `kernels.activation`: bit-identical to `gemv_q` twice and
    `swiglu`), and return ``y`` (f32, ``[od]``). Each CUDA block decodes the same RPB rows of both weights, so the
    gate and up outputs never go to memory and one launch replaces three.

    raw_gate, raw_up: the two weights' GGUF bytes, both of format ``qtype`` and shape ``[od, id]`` (as for
    `gemv_q`); x: f32 or `Q8Blocks` as for `gemv_q`; out, knobs, stream: as for `gemv_q` (no residual).
    Source: the fused gate/up pass of llama.cpp's ``ggml_cuda_mul_mat_vec_q`` with ``GGML_GLU_OP_SWIGLU``.

    Raises KernelConstraintError for everything `gemv_q` refuses, for either weight (the message names which).
    """
    if raw_up is None:
        raise KernelConstraintError("gemv_glu needs raw_up, the up weight's bytes (for one weight, use gemv_q)")
    return _launch(raw_gate, raw_up, qtype, od, id, x, out, None, rows_per_block, warps_per_row, unroll, prefetch,
                   stage, hoist, min_blocks, vload, fold, pdl, stream)


def _launch(raw, raw_up, qtype, od, id, x, out, residual, rows_per_block, warps_per_row, unroll, prefetch, stage,
            hoist, min_blocks, vload, fold, pdl, stream):
    """Check every argument (see `gemv_q`), then enqueue the kernel; ``raw_up`` not None selects the GLU kernel."""
    mmvq = isinstance(x, Q8Blocks)
    fmt = block_format(_format_name(qtype, mmvq))
    _check_knobs(rows_per_block, warps_per_row, unroll, prefetch, stage, hoist, min_blocks, vload, fold, pdl)
    if pdl and not stream:
        raise KernelConstraintError("pdl=1 orders the kernel after the previous one of its stream: pass a numba "
                                    "stream, not the default stream 0")
    od, id = _check_shape(fmt, od, id)
    if fmt.block_size == 1 and id % FLOAT_GROUP:
        raise KernelConstraintError(
            f"id={id} is not a multiple of {FLOAT_GROUP}; gemv_q reads {fmt.name} rows in whole 16-byte groups"
        )
    if raw_up is None:
        weights = (_check_raw(fmt, raw, od, id),)
    else:
        weights = tuple(_named(name, _check_raw, fmt, w, od, id) for name, w in (("raw_gate", raw), ("raw_up", raw_up)))
    for name, w in zip(("raw", "raw_up"), weights) if stage else ():
        reason = stage_refusal(fmt.name, rows_per_block, warps_per_row, stage=stage, unroll=unroll,
                               glu=raw_up is not None, raw=w, what=name)
        if reason:
            raise KernelConstraintError(reason)
    for name, w in zip(("raw", "raw_up"), weights) if vload else ():
        reason = vload_refusal(fmt.name, stage=stage, raw=w, what=name)
        if reason:
            raise KernelConstraintError(reason)
    if mmvq:
        if x.size != id:
            raise KernelConstraintError(f"x holds {x.size} Q8_1 activations; W has id={id} columns")
        check_q8(x, id, "x")
        xargs = (x.q.view(np.uint32), x.d, x.s)
    else:
        x = _check_vector(x, "x", id)
        if id and _address(x) % 16:
            raise KernelConstraintError("x must start at a 16-byte aligned device address (read 16 bytes at a time)")
        xargs = (x.view(np.uint32),)
    if out is None:
        out = cuda.device_array(od, dtype=np.float32, stream=stream)
    else:
        out = _check_vector(out, "out", od)
    if residual is not None:
        residual = _check_vector(residual, "residual", od)
    if od == 0:
        return out
    if id == 0:
        raise KernelConstraintError("id must be positive (a product over no columns is not a launch)")
    view = (_MMVQ_IMPLS if mmvq else _IMPLS)[fmt.name][4]
    kern = kernel_for(fmt.name, rows_per_block, warps_per_row, residual is not None, mmvq, unroll, raw_up is not None,
                      prefetch, stage, hoist, min_blocks, vload, fold, pdl)
    grid = (od + rows_per_block - 1) // rows_per_block
    args = (*(w.view(view) if view is not np.uint8 else w for w in weights), *xargs, out,
            out if residual is None else residual, od, id)
    launch_kernel(kern, grid, threads_per_block(warps_per_row), stream, args, pdl=bool(pdl))
    return out


def _named(name: str, check, *args):
    """``check(*args)``, with a KernelConstraintError's message prefixed by ``name`` (which argument was wrong)."""
    try:
        return check(*args)
    except KernelConstraintError as e:
        raise KernelConstraintError(f"{name}: {e}") from None


def _check_vector(a, what: str, n: int):
    a = _as_device_array(a, what)
    if a.dtype != np.float32 or a.ndim != 1 or a.size != n:
        raise KernelConstraintError(
            f"{what} must be a 1-D float32 device array of {n} elements, got {a.dtype} of shape {tuple(a.shape)}"
        )
    if not a.is_c_contiguous():
        raise KernelConstraintError(f"{what} must be C-contiguous")
    return a
