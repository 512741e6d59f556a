"""Quantized matrix-vector product for decode (nt = 1): ``y[od] = W[od, id] · x[id]`` with W in GGUF blocks.

The kernels read W's GGUF blocks straight from device memory (no f16 copy of the weight), decode them in
registers and accumulate in float32 against an f32 activation vector x. Block layouts: ggml-common.h
``block_q4_0`` .. ``block_q6_K``, ``block_mxfp4`` (see `kernels.quant.formats`); the work split follows
llama.cpp's MMVQ kernel (ggml-cuda/mmvq.cu: one CUDA block owns ``rows_per_cuda_block`` rows, its ``nwarps``
warps split each row's blocks between them, a shared-memory sum joins the warps). Two forms of x:

* f32 x (llama.cpp's dmmv.cu route, `kernels.gemv.dots`): every weight is converted to float32 and FMA'd, every
  format.
* Q8_1 x (MMVQ, llama.cpp's mmvq.cu + vecdotq.cuh route; Q4_K, Q6_K, Q8_0): x quantized once per step by
  `kernels.quantize_q8` (int8 per element, f32 d and sum per 32); the weights' bytes are unpacked into int8 lanes
  and multiplied four at a time with ``dp4a`` (`kernels.ptx.dp4a_s32`), one float multiply per 32-weight block:
  faster than f32 x at the decode shapes (x read as int8, four weights a dp4a).

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
decodes together), ``WPR`` warps per row (threads per block = 32*WPR), ``STAGE`` (a per-warp cp.async ring of
shared-memory windows W passes through), ``MINB`` (the launch bound), ``FOLD`` (Q6_K's offset taken from x),
``PDL`` (a programmatic
dependent launch, `kernels.launch`), ``residual`` (fused ``y += residual``), the x form
(f32, or Q8_1 blocks: the MMVQ kernels), and GLU (`gemv_glu`: two weights of one shape, gate and up, and
``y = silu(gate·x) * (up·x)`` in the epilogue).

Package layout: `kernels.gemv.device` (float tricks, x loads, warp sum, the lane fetches both x forms share),
`kernels.gemv.dots` (f32-x loaders and block dots), `kernels.gemv.dots_q8` (Q8_1-x loaders and dp4a dots),
`kernels.gemv.formats` (per-format tables: which loader and dot), `kernels.gemv.tables` (no numba: lanes per block,
which formats each knob takes),
`kernels.gemv.config` (`GemvConfig`: knob values, defaults, limits and refused combinations),
`kernels.gemv.codegen` (the generated kernel source) and `kernels.gemv.launch` (`gemv_q`, `gemv_glu`,
`gemv_pair`: two mat-vecs of any two formats over one x in one launch, `kernel_for`). This module re-exports
their public names, each imported on first use.
"""

from __future__ import annotations

from kernels.lazy import lazy_exports

# Public name -> the submodule that defines it. The names load on first use (PEP 562), so that importing
# `kernels.gemv.config` or `kernels.gemv.tables` (the knob table, `minfer experiments list`) imports no numba.
_SOURCES = {
    "lookahead_lines": "codegen",
    **dict.fromkeys((
        "DEFAULT_RPB", "DEFAULT_WPR", "FOLD_VALUES", "MAX_THREADS_PER_SM", "MINB_REGISTER_FLOOR", "MINB_VALUES",
        "PDL_VALUES", "RPB_VALUES", "STAGE_SMEM_LIMIT", "STAGE_VALUES", "WPR_VALUES", "GemvConfig",
        "min_blocks_registers", "one_wave_min_blocks", "stage_smem_bytes", "stage_window_bytes", "threads_per_block",
    ), "config"),
    **dict.fromkeys(("M0", "M4", "M8", "M16", "M32", "M128", "MB", "N1", "N2", "N4", "U", "ZERO"), "device"),
    "Q6_OFFSET": "dots_q8",
    **dict.fromkeys(("FLOAT_GROUP", "FOLD_TYPES", "GEMV_TYPES", "MMVQ_TYPES", "STAGE_TYPES"), "tables"),
    **dict.fromkeys(("_IMPLS", "_MMVQ_IMPLS"), "formats"),
    **dict.fromkeys(("gemv_glu", "gemv_pair", "gemv_q", "kernel_for", "kernel_signature", "pair_refusal"), "launch"),
}


__getattr__, __dir__ = lazy_exports(__name__, _SOURCES, globals())

__all__ = sorted(_SOURCES)
