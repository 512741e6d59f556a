"""Random but valid GGUF tensor bytes generated on the GPU from a seed: one kernel per format family.

Every byte comes from a counter-based hash, ``splitmix64(key + word * GOLDEN)`` (Steele, Lea, Flood,
"Fast splittable pseudorandom number generators", OOPSLA 2014; the finaliser is Stafford's "Mix13"), where
``key`` is a per-tensor 64-bit key (the caller derives it from the seed and the tensor's index) and ``word`` the
index of the output word. The bytes therefore depend only on (key, word): not on the grid, the block size,
the device or the simulator. Each thread writes one word per grid-stride step, then the next.

Formats (layouts: ggml-common.h ``block_q4_K``, ``block_q5_K``, ``block_q6_K``):

* ``Q4_K`` (144-byte blocks, read and written as 18 uint64 words; weight ``w = d*sc*q - dmin*m`` with 6-bit
  sub-block scale ``sc`` and min ``m``, 4-bit ``q``). Word 0, bytes ``d f16 | dmin f16 | scales[0..3]``: the
  ``d`` bit pattern is drawn uniformly from ``[d_lo, d_lo + d_span)`` (a positive finite f16's bit pattern is
  monotonic in its value, so a range of patterns is a range of values; subnormals allowed), ``dmin`` is
  ``f16(dmin_ratio * d)``. Word 1, ``scales[4..11]``, is written so that every sub-block's min equals its scale
  (``scales[4..7] = scales[0..3]``, both nibbles of ``scales[8..11]`` equal): ``w = sc*(d*q - dmin)``, which
  with ``dmin_ratio = 7.5`` (the mean of q) has zero mean in every sub-block. Independent random mins would
  give each 32-weight sub-block a random offset that dominates the variance, and the products of two such
  matrices grow by ~3x per matmul (the offsets add coherently over a sub-block). Scales and the 4-bit quants
  (words 2..17) are random.
* ``Q5_K`` (176-byte blocks, 22 uint64 words): Q4_K's header words (d, dmin, scales with every min equal to its
  scale; ``dmin_ratio = 15.5``, the mean of the 5-bit q, centres every sub-block on zero), then qh[32] and
  qs[128] random (words 2..21).
* ``Q6_K`` (210-byte blocks, 2-byte aligned: written as 105 uint16 words): every word random (ql, qh, int8
  scales), except word 104 (``d f16``), drawn from ``[d_lo, d_lo + d_span)`` as above.
* ``F32`` (norm weights, biases): ``center + spread * (2u - 1)``, ``u`` uniform in [0, 1) with 24 bits.

Under ``NUMBA_ENABLE_CUDASIM=1`` the hash is a Python-integer function computing the same bits (numpy's uint64
scalars warn on the wrapping multiply), so the simulator writes exactly the bytes the GPU writes.
"""

from __future__ import annotations

import numpy as np
from numba import cuda
from numba.cuda import config

from kernels.errors import KernelConstraintError
from kernels.quant.bits import f16x2_bits, f32_from_f16_bits
from kernels.jit import kernel

SIMULATOR = bool(config.ENABLE_CUDASIM)

U = np.uint64
MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB

Q4_K_WORDS = 18  # 144 bytes / 8
Q5_K_WORDS = 22  # 176 bytes / 8
Q6_K_WORDS = 105  # 210 bytes / 2
Q6_K_D_WORD = 104  # bytes 208..209: d f16
THREADS = 256
FORMATS = ("Q4_K", "Q5_K", "Q6_K", "F32")


def splitmix64(x: int) -> int:
    """Host form of the hash (Python integers): splitmix64's finaliser of ``x`` (mod 2**64)."""
    z = x & MASK64
    z = ((z ^ (z >> 30)) * MIX1) & MASK64
    z = ((z ^ (z >> 27)) * MIX2) & MASK64
    return z ^ (z >> 31)


def tensor_key(seed: int, index: int) -> int:
    """The 64-bit key of tensor number ``index`` of a model generated from ``seed`` (host, Python integers)."""
    return splitmix64(splitmix64(seed & MASK64) ^ ((index + 1) * GOLDEN & MASK64))


def word_hash_host(key: int, word: int) -> int:
    """The 64 random bits of word ``word`` of the tensor with key ``key``: what the kernels compute."""
    return splitmix64(key + word * GOLDEN)


if SIMULATOR:

    def _hash(key, i):
        """Simulator form of the device hash (Python integers, wrapped to 64 bits)."""
        return U(word_hash_host(int(key), int(i)))

else:
    _G, _M1, _M2 = U(GOLDEN), U(MIX1), U(MIX2)
    _S30, _S27, _S31 = U(30), U(27), U(31)

    @cuda.jit(device=True, inline=True)
    def _hash(key, i):
        """splitmix64 of ``key + i * GOLDEN`` in uint64 arithmetic (wrapping multiplies)."""
        z = key + U(i) * _G
        z = (z ^ (z >> _S30)) * _M1
        z = (z ^ (z >> _S27)) * _M2
        return z ^ (z >> _S31)


_LO16 = U(0xFFFF)
_HI32 = U(0xFFFFFFFF00000000)
_SH16 = U(16)
_SH32 = U(32)
_SH40 = U(40)
_SH4 = U(4)
_NIBBLES = U(0x0F0F0F0F)
_INV24 = np.float32(1.0 / (1 << 24))


@kernel
def synth_k_min(out, n_words, key, d_lo, d_span, dmin_ratio, block_words):
    """Q4_K and Q5_K (the K-quants with a min): ``out`` the tensor's bytes as uint64 words (``block_words`` per
    block: 18, 22): word 0 d, dmin, scales[0..3]; word 1 scales[4..11] (mins equal to scales); the rest the quants
    (Q5_K: qh, then qs)."""
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    while i < n_words:
        h = _hash(key, i)
        p = i % block_words
        if p == 0:
            d = d_lo + (h & _LO16) % d_span
            dmin = U(f16x2_bits(f32_from_f16_bits(d) * dmin_ratio, np.float32(0.0))) & _LO16
            h = (h & _HI32) | (dmin << _SH16) | d
        elif p == 1:
            nib = h & _NIBBLES  # scales[8..11]: low nibble (scale bits 0..3) = high nibble (min bits 0..3)
            h = (_hash(key, i - 1) >> _SH32) | ((nib | (nib << _SH4)) << _SH32)
        out[i] = h
        i += stride


@kernel
def synth_q6_k(out, n_words, key, d_lo, d_span):
    """Q6_K: ``out`` the tensor's bytes as uint16 words (105 per block); word 104 of a block is d."""
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    while i < n_words:
        h = _hash(key, i)
        if i % Q6_K_WORDS == Q6_K_D_WORD:
            v = d_lo + (h & _LO16) % d_span
        else:
            v = h & _LO16
        out[i] = np.uint16(v)
        i += stride


@kernel
def synth_f32(out, n, key, center, spread):
    """F32: ``out[i] = center + spread * (2u - 1)``, u in [0, 1) from the top 24 bits of the hash."""
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    while i < n:
        u = np.float32(_hash(key, i) >> _SH40) * _INV24
        out[i] = center + spread * (np.float32(2.0) * u - np.float32(1.0))
        i += stride


def f16_bits_range(lo: float, hi: float) -> tuple[int, int]:
    """``(first, count)``: the f16 bit patterns of the positive values in ``[f16(lo), f16(hi)]``, for the scale
    fields (0 < lo <= hi <= 65504)."""
    if not (0 < lo <= hi <= 65504.0):
        raise KernelConstraintError(f"scale range [{lo}, {hi}] must be positive, ordered and finite in f16")
    a = int(np.float16(lo).view(np.uint16))
    b = int(np.float16(hi).view(np.uint16))
    a = max(a, 1)  # the smallest positive subnormal; never the pattern of +0
    return a, max(1, b - a + 1)


def _blocks(n_threads: int, blocks: int | None) -> int:
    if blocks is not None:
        return blocks
    # at most 8 blocks of 256 threads per SM, grid-stride beyond (the simulator's device reports no SM count)
    cap = 8 * getattr(cuda.get_current_device(), "MULTIPROCESSOR_COUNT", 1)
    return max(1, min(cap, (n_threads + THREADS - 1) // THREADS))


def synth(raw, qtype: str, key: int, *, d_range=(1e-3, 1e-3), dmin_ratio=7.5, center=0.0, spread=1.0,
          stream=0, blocks: int | None = None):
    """Enqueue the generation of one tensor's bytes into ``raw`` on ``stream``; returns ``raw``.

    raw: 1-D C-contiguous uint8 device array holding exactly the tensor's bytes (whole blocks), 16-byte aligned
    for Q4_K, Q5_K and F32, 2-byte for Q6_K (any cudaMalloc'd buffer is).
    qtype: "Q4_K", "Q5_K", "Q6_K" or "F32". key: the tensor's 64-bit key (`tensor_key(seed, index)`).
    d_range: (lo, hi) of the super-block scale ``d`` (the K-quants), positive, rounded to f16 patterns
    (`f16_bits_range`); dmin_ratio: Q4_K's and Q5_K's ``dmin / d`` (7.5 and 15.5, the mean q, centre every
    sub-block on zero); center, spread: the F32 value range.
    blocks: grid size (default: enough for one word per thread, at most 8 blocks of 256 per SM).

    Raises KernelConstraintError for another qtype, a wrong dtype or a length that is not whole blocks.
    """
    if qtype not in FORMATS:
        raise KernelConstraintError(f"synth has no kernel for {qtype}; it writes {', '.join(FORMATS)}")
    if raw.dtype != np.uint8 or raw.ndim != 1:
        raise KernelConstraintError(f"raw must be a 1-D uint8 device array, got {raw.dtype} with ndim {raw.ndim}")
    size = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210, "F32": 4}[qtype]
    if raw.size % size:
        raise KernelConstraintError(f"raw holds {raw.size} bytes, not whole {size}-byte {qtype} blocks")
    if raw.size == 0:
        return raw
    k = U(key & MASK64)
    if qtype in ("Q4_K", "Q5_K"):
        words = raw.view(np.uint64)
        d0, dn = f16_bits_range(*d_range)
        n = words.size
        per_block = Q4_K_WORDS if qtype == "Q4_K" else Q5_K_WORDS
        synth_k_min[_blocks(n, blocks), THREADS, stream](words, n, k, U(d0), U(dn), np.float32(dmin_ratio),
                                                         per_block)
    elif qtype == "Q6_K":
        words = raw.view(np.uint16)
        d0, dn = f16_bits_range(*d_range)
        n = words.size
        synth_q6_k[_blocks(n, blocks), THREADS, stream](words, n, k, U(d0), U(dn))
    else:
        vals = raw.view(np.float32)
        n = vals.size
        synth_f32[_blocks(n, blocks), THREADS, stream](vals, n, k, np.float32(center), np.float32(spread))
    return raw
