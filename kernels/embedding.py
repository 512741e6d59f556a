"""Token embedding gather from a GGUF ``token_embd`` matrix: ``out[t, :] = dequant(token_embd[ids[t], :])``, f32.

``token_embd`` stays in its file format (``vocab`` rows of ``hidden`` weights, `kernels.quant.formats`), ids
are int32 on the device, out is f32 ``[nt, hidden]`` (the residual stream). Supported: Q4_K, Q6_K, Q8_0 (the
token_embd types of the common llama.cpp quantizations) and F32, F16, BF16.

Why not the `kernels.quant` kernels: they are ``@cuda.jit`` kernels over whole tensors (thread g -> flat output
8g..8g+7), not device functions, and they round to f16, while the residual stream wants gguf-py's float32
values exactly (a Q4_K weight ``d*sc*q - dmin*m`` is generally not an f16). So the block decoders below are
per-row copies of `kernels.quant.kquants` / `legacy` (same word views, same field extraction, same
``fmul_rn``/``fsub_rn`` float32 operations from `kernels.quant.bits`) that stop before the f16 rounding and index
the row ``ids[t]``: bit-identical to ``gguf.quants.dequantize(row bytes, qtype)`` (float32). Factoring the
decoders as device functions in `kernels.quant` (one copy, two callers) is the better end state.

Threads: block formats, thread g of row t decodes weights 8g..8g+7 of row ids[t] (g = 32*superblock + group for
the K-quants, 4*block + part for Q8_0) and writes them as 8 f32; float formats, one element per thread
(coalesced loads and stores). A 1-D grid of ``nt * ceil(groups_per_row / tpb)`` blocks. An id outside
``[0, vocab)`` (the launcher cannot check device data without a sync) writes a row of NaN instead of reading out
of bounds.

Sources: ggml-common.h ``block_q4_K`` / ``block_q6_K`` / ``block_q8_0``; gguf-py ``quants.py``; llama.cpp
``get_rows.cu``.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float32
from numba.cuda.cudadrv import devicearray

from kernels.errors import KernelConstraintError
from kernels.quant.bits import F32_MAGIC, F32_MAGIC_BITS, f32_from_bits, f32_from_f16_bits, fmul_rn, fsub_rn
from kernels.quant.dequant import _address
from kernels.quant.formats import block_format
from kernels.jit import kernel

DEFAULT_TPB = 128
U = np.uint64
LO32 = np.uint64(0xFFFFFFFF)
HI32 = np.uint64(32)
NAN = np.float32(np.nan)
F32_MAGIC_P32 = np.float32(8388608.0 + 32.0)  # Q6_K: q6 - 32
F32_MAGIC_P128 = np.float32(8388608.0 + 128.0)  # Q8_0: (byte ^ 0x80) - 128 = int8


@cuda.jit(device=True, inline="always")
def _row_and_group(bpr):
    b = cuda.blockIdx.x
    t = b // bpr
    return t, (b - t * bpr) * cuda.blockDim.x + cuda.threadIdx.x


@kernel
def _gather_q4_k(raw, ids, out, row_words, vocab, bpr):
    """Q4_K rows (144-byte super-blocks, uint64 words, 18 per block) -> f32; see `kquants.dequant_q4_k`."""
    t, g = _row_and_group(bpr)
    col = 8 * g
    if col >= out.shape[1]:
        return
    tok = ids[t]
    if tok < 0 or tok >= vocab:
        for k in range(8):
            out[t, col + k] = NAN
        return
    p = g & 31
    base = tok * row_words + (g >> 5) * 18
    h0 = raw[U(base)]  # d | dmin | scales[0..3]
    h1 = raw[U(base + 1)]  # scales[4..11]
    qw = raw[U(base + 2 + 4 * (p >> 3) + (p & 3))]
    w0 = int(h0 & LO32)
    d = f32_from_f16_bits(w0 & 0xFFFF)
    dmin = f32_from_f16_bits(w0 >> 16)
    s = p >> 2
    sh = 8 * (s & 3)
    a = (int(h0 >> HI32) >> sh) & 0xFF
    c = (int(h1 & LO32) >> sh) & 0xFF
    e = (int(h1 >> HI32) >> sh) & 0xFF
    sc = (a & 63) if s < 4 else ((e & 0xF) | ((a >> 6) << 4))
    m = (c & 63) if s < 4 else ((e >> 4) | ((c >> 6) << 4))
    dsc = fmul_rn(d, np.float32(sc))
    dm = fmul_rn(dmin, np.float32(m))
    shift = 4 * (s & 1)
    lo = (int(qw & LO32) >> shift) & 0x0F0F0F0F
    hi = (int(qw >> HI32) >> shift) & 0x0F0F0F0F
    for k in range(8):
        word = lo if k < 4 else hi
        q = f32_from_bits(F32_MAGIC_BITS | ((word >> (8 * (k & 3))) & 0xF)) - F32_MAGIC
        out[t, col + k] = fsub_rn(fmul_rn(dsc, q), dm)


@kernel
def _gather_q6_k(raw, ids, out, row_words, vocab, bpr):
    """Q6_K rows (210-byte super-blocks, uint16 words, 105 per block) -> f32; see `kquants.dequant_q6_k`."""
    t, g = _row_and_group(bpr)
    col = 8 * g
    if col >= out.shape[1]:
        return
    tok = ids[t]
    if tok < 0 or tok >= vocab:
        for k in range(8):
            out[t, col + k] = NAN
        return
    p = g & 31
    base = tok * row_words + (g >> 5) * 105
    d = f32_from_f16_bits(int(raw[U(base + 104)]))
    sb = int(raw[U(base + 96 + (p >> 2))]) >> (8 * ((p >> 1) & 1)) & 0xFF  # scales[p/2]
    dsc = fmul_rn(d, np.float32(sb - ((sb & 0x80) << 1)))  # int8
    li = base + 32 * (p >> 4) + 4 * (p & 7)
    hi_ = base + 64 + 16 * (p >> 4) + 4 * (p & 3)
    lshift = 4 * ((p >> 3) & 1)
    hshift = 2 * ((p >> 2) & 3)
    l0 = int(raw[U(li)]) | (int(raw[U(li + 1)]) << 16)
    l1 = int(raw[U(li + 2)]) | (int(raw[U(li + 3)]) << 16)
    m0 = int(raw[U(hi_)]) | (int(raw[U(hi_ + 1)]) << 16)
    m1 = int(raw[U(hi_ + 2)]) | (int(raw[U(hi_ + 3)]) << 16)
    q0 = ((l0 >> lshift) & 0x0F0F0F0F) | (((m0 >> hshift) & 0x03030303) << 4)
    q1 = ((l1 >> lshift) & 0x0F0F0F0F) | (((m1 >> hshift) & 0x03030303) << 4)
    for k in range(8):
        word = q0 if k < 4 else q1
        q = f32_from_bits(F32_MAGIC_BITS | ((word >> (8 * (k & 3))) & 0x3F)) - F32_MAGIC_P32
        out[t, col + k] = fmul_rn(dsc, q)


@kernel
def _gather_q8_0(raw, ids, out, row_words, vocab, bpr):
    """Q8_0 rows (34-byte blocks, uint16 words, 17 per block) -> f32; see `legacy.dequant_q8_0`."""
    t, g = _row_and_group(bpr)
    col = 8 * g
    if col >= out.shape[1]:
        return
    tok = ids[t]
    if tok < 0 or tok >= vocab:
        for k in range(8):
            out[t, col + k] = NAN
        return
    base = tok * row_words + (g >> 2) * 17
    d = f32_from_f16_bits(int(raw[U(base)]))
    qi = base + 1 + 4 * (g & 3)
    lo = int(raw[U(qi)]) | (int(raw[U(qi + 1)]) << 16)
    hi = int(raw[U(qi + 2)]) | (int(raw[U(qi + 3)]) << 16)
    for k in range(8):
        word = lo if k < 4 else hi
        q = f32_from_bits(F32_MAGIC_BITS | (((word >> (8 * (k & 3))) & 0xFF) ^ 0x80)) - F32_MAGIC_P128
        out[t, col + k] = fmul_rn(q, d)


@kernel
def _gather_float(table, ids, out, vocab, bpr):
    """F32 / F16 rows (table f32 or f16 [vocab, hidden]) -> f32, one element per thread (exact)."""
    t, c = _row_and_group(bpr)
    if c >= out.shape[1]:
        return
    tok = ids[t]
    if tok < 0 or tok >= vocab:
        out[t, c] = NAN
    else:
        out[t, c] = float32(table[tok, c])


@kernel
def _gather_bf16(table, ids, out, vocab, bpr):
    """BF16 rows (table uint16 bits [vocab, hidden]) -> f32 = bits << 16 (exact), one element per thread."""
    t, c = _row_and_group(bpr)
    if c >= out.shape[1]:
        return
    tok = ids[t]
    if tok < 0 or tok >= vocab:
        out[t, c] = NAN
    else:
        out[t, c] = f32_from_bits(int(table[tok, c]) << 16)


# format -> (kernel, the word the kernel reads raw as)
_BLOCK_KERNELS = {
    "Q4_K": (_gather_q4_k, np.uint64),
    "Q6_K": (_gather_q6_k, np.uint16),
    "Q8_0": (_gather_q8_0, np.uint16),
}
_ELEMENT_KERNELS = {
    "F32": (_gather_float, np.float32),
    "F16": (_gather_float, np.float16),
    "BF16": (_gather_bf16, np.uint16),
}
SUPPORTED = tuple(_BLOCK_KERNELS) + tuple(_ELEMENT_KERNELS)
"""token_embd formats `embedding` takes."""


def embedding(raw, qtype, vocab: int, hidden: int, ids, out=None, stream=0, tpb: int = DEFAULT_TPB):
    """Enqueue ``out[t, :] = float32(dequant(token_embd[ids[t], :]))`` on ``stream`` and return ``out``.

    raw: 1-D C-contiguous uint8 device array, the token_embd tensor's bytes as stored in the GGUF file (``vocab``
    rows of ``hidden / block_size`` blocks), starting at a device address that is a multiple of the word the
    kernel reads (8 bytes for Q4_K, 4 for F32, 2 for Q6_K/Q8_0/F16/BF16; every GGUF tensor is 32-byte aligned).
    qtype: one of ``SUPPORTED`` (a name, ``gguf.GGMLQuantizationType`` member or its value). vocab, hidden: the
    tensor's rows and columns (``hidden`` a multiple of the block size: 256 for the K-quants, 32 for Q8_0).
    ids: int32 device array ``[nt]`` of token ids; an id outside ``[0, vocab)`` yields a NaN row.
    out: optional C-contiguous f32 device array ``[nt, hidden]``; allocated when None. tpb: threads per block, a
    multiple of 32 from 32 to 1024.

    Bit-identical to ``gguf.quants.dequantize(row bytes, qtype)`` (float32) for every supported type.
    Sources: ggml-common.h, gguf-py ``quants.py``, llama.cpp ``get_rows.cu``.

    Raises KernelConstraintError (a ValueError) for: an unsupported type (listing the supported ones), a
    non-device array, raw not 1-D contiguous uint8 of exactly ``vocab * row_bytes`` bytes or misaligned, a
    ``hidden`` that is not a positive multiple of the block size, ids not a contiguous int32 ``[nt]`` array, an
    out of the wrong dtype, shape or layout, or a bad tpb.
    """
    try:
        fmt = block_format(qtype)
    except KeyError as e:
        raise KernelConstraintError(e.args[0]) from None
    if fmt.name not in SUPPORTED:
        raise KernelConstraintError(f"embedding does not support {fmt.name}; supported: {', '.join(SUPPORTED)}")
    for name, v in (("vocab", vocab), ("hidden", hidden)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise KernelConstraintError(f"{name} must be a positive integer, got {v!r}")
    vocab, hidden = int(vocab), int(hidden)
    if hidden % fmt.block_size:
        raise KernelConstraintError(f"hidden={hidden} is not a multiple of the {fmt.name} block size {fmt.block_size}")
    if not devicearray.is_cuda_ndarray(raw):
        raise KernelConstraintError(f"raw must be a CUDA device array, got {type(raw).__name__}")
    if raw.ndim != 1 or raw.dtype != np.uint8 or not raw.is_c_contiguous():
        raise KernelConstraintError(f"raw must be a 1-D C-contiguous uint8 array, got {raw.dtype} ndim {raw.ndim}")
    row_bytes = fmt.row_bytes(hidden)
    if raw.size != vocab * row_bytes:
        raise KernelConstraintError(
            f"raw holds {raw.size} bytes but vocab={vocab} rows of hidden={hidden} {fmt.name} weights need "
            f"{vocab * row_bytes}"
        )
    kernel, word = _BLOCK_KERNELS.get(fmt.name) or _ELEMENT_KERNELS[fmt.name]
    word_size = np.dtype(word).itemsize
    if _address(raw) % word_size:
        raise KernelConstraintError(f"raw must start at a {word_size}-byte aligned device address for {fmt.name}")
    if not devicearray.is_cuda_ndarray(ids):
        raise KernelConstraintError(f"ids must be a CUDA device array, got {type(ids).__name__}")
    if ids.dtype != np.int32 or ids.ndim != 1 or not ids.is_c_contiguous():
        raise KernelConstraintError(f"ids must be a contiguous 1-D int32 array, got {ids.dtype} ndim {ids.ndim}")
    nt = ids.size
    if tpb % 32 or not 32 <= tpb <= 1024:
        raise KernelConstraintError(f"tpb={tpb} must be a multiple of 32 between 32 and 1024")
    if out is None:
        out = cuda.device_array((nt, hidden), dtype=np.float32, stream=stream)
    elif not devicearray.is_cuda_ndarray(out):
        raise KernelConstraintError(f"out must be a CUDA device array, got {type(out).__name__}")
    elif out.dtype != np.float32 or tuple(out.shape) != (nt, hidden) or not out.is_c_contiguous():
        raise KernelConstraintError(
            f"out must be a C-contiguous float32 array of shape ({nt}, {hidden}), got {out.dtype} {tuple(out.shape)}"
        )
    if nt == 0:
        return out
    if fmt.name in _BLOCK_KERNELS:
        groups = hidden // 8
        bpr = (groups + tpb - 1) // tpb
        kernel[nt * bpr, tpb, stream](raw.view(word), ids, out, row_bytes // word_size, vocab, bpr)
    else:
        bpr = (hidden + tpb - 1) // tpb
        kernel[nt * bpr, tpb, stream](raw.view(word).reshape(vocab, hidden), ids, out, vocab, bpr)
    return out
