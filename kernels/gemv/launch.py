"""The gemv launchers (`kernels.gemv`): `gemv_q` (one weight, optional fused residual) and `gemv_glu` (gate and up
in one kernel, SwiGLU epilogue) check every argument, allocate y and enqueue the kernel `kernel_for` returns (built
by `kernels.gemv.codegen`, cached per format and knob combination).
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from kernels.errors import KernelConstraintError
from kernels.gemv.codegen import _build
from kernels.gemv.config import STAGE_SMEM_LIMIT, GemvConfig
from kernels.gemv.formats import _IMPLS, _MMVQ_IMPLS
from kernels.gemv.tables import FLOAT_GROUP, _format_name
from kernels.launch import launch_kernel
from kernels.quant.dequant import _address, _as_device_array, _check_raw, _check_shape
from kernels.quant.formats import block_format
from kernels.quantize_q8 import Q8Blocks, check_q8


_CACHE: dict[GemvConfig, object] = {}
_PAIR_CACHE: dict[tuple, object] = {}  # (first config, second config) -> the `gemv_pair` kernel


def kernel_for(config: GemvConfig):
    """The (cached) numba dispatcher of ``config``: one specialised kernel per `GemvConfig` value (its key)."""
    if not isinstance(config, GemvConfig):
        raise KernelConstraintError(f"kernel_for takes a GemvConfig, got {type(config).__name__}")
    k = _CACHE.get(config)
    if k is None:
        k = _CACHE[config] = _build(config)
    return k


def kernel_signature(config: GemvConfig) -> tuple:
    """The numba argument types ``config``'s kernel is launched with (for `compile_ptx`)."""
    from numba import types
    from numba.np.numpy_support import from_dtype

    view = (_MMVQ_IMPLS if config.mmvq else _IMPLS)[config.qtype][4]
    f32 = types.Array(types.float32, 1, "C")
    u32 = types.Array(types.uint32, 1, "C")
    x = ((u32, f32, f32, u32) if config.xres else (u32, f32, f32)) if config.mmvq else (u32,)
    w = types.Array(from_dtype(np.dtype(view)), 1, "C")
    return (*(w, w)[: 1 + bool(config.glu)], *x, f32, f32, types.int64, types.int64)


def gemv_q(raw, qtype, od: int, id: int, x, out=None, *, config: GemvConfig | None = None, residual=None, stream=0):
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
    quantized x (relative difference to the f32-x product ~1e-2..1e-3, the int8 rounding of x); compensated blocks
    (``x.r``, `kernels.quantize_q8`) select the XRES kernel, exact with ``d * (q + r / 254)``.
    out: optional 1-D C-contiguous float32 device array of ``od`` elements (allocated when None).
    config: the kernel (`kernels.gemv.GemvConfig`: launch shape, STAGE, MINB, FOLD, PDL); its qtype, mmvq and
    residual must be this call's (W's format, x given as Q8_1 blocks, a residual given); None: the defaults for
    this call. Every knob gives a result bit-identical to the same launch shape without it; STAGE needs raw
    starting at a 16-byte aligned address and a multiple of 16 bytes long; PDL=1 a numba stream, not 0.
    residual: optional float32 device array of ``od`` elements added to y in the epilogue (fused ``y += r``;
    may be ``out`` itself: each element is read before it is written, by the same thread).

    Accumulation is float32 (per-lane partial sums, then a shuffle tree and a shared-memory sum across warps);
    against float64 ``dequantize(W) @ x`` the relative error is ~1e-7 (tests assert < 1e-5).
    Source: llama.cpp ggml-cuda mmvq.cu (work split; with Q8_1 x, vecdotq.cuh's dp4a dots) and dmmv.cu (f32
    activations), ggml-common.h (blocks).

    Raises KernelConstraintError (a ValueError) with one sentence saying what is wrong, for: an unsupported type,
    raw not a 1-D C-contiguous uint8 device array, misaligned, or of a length other than ``od`` rows of
    ``id / block_size`` blocks; ``id`` not a multiple of the block size; x, out or residual of the wrong dtype,
    length or layout (x also misaligned); Q8_1 x for a format without an MMVQ kernel; a config for another call
    (`GemvConfig` itself refuses impossible knob values and combinations); raw the ring cannot read
    (`GemvConfig.weight_refusal`); pdl=1 on stream 0.
    """
    return _launch(raw, None, qtype, od, id, x, out, residual, config, stream)


def gemv_glu(raw_gate, raw_up, qtype, od: int, id: int, x, out=None, *, config: GemvConfig | None = None, stream=0):
    """Enqueue the SwiGLU of two mat-vecs in one kernel, ``y[r] = silu(Wg[r]·x) * (Wu[r]·x)`` with
    ``silu(g) = g / (1 + exp(-g))`` (the expression of `kernels.activation`: bit-identical to `gemv_q` twice and
    `swiglu`), and return ``y`` (f32, ``[od]``). Each CUDA block decodes the same RPB rows of both weights, so the
    gate and up outputs never go to memory and one launch replaces three.

    raw_gate, raw_up: the two weights' GGUF bytes, both of format ``qtype`` and shape ``[od, id]`` (as for
    `gemv_q`); x: f32 or `Q8Blocks` as for `gemv_q`; out, stream: as for `gemv_q` (no residual); config: as for
    `gemv_q`, with glu set.
    Source: the fused gate/up pass of llama.cpp's ``ggml_cuda_mul_mat_vec_q`` with ``GGML_GLU_OP_SWIGLU``.

    Raises KernelConstraintError for everything `gemv_q` refuses, for either weight (the message names which).
    """
    if raw_up is None:
        raise KernelConstraintError("gemv_glu needs raw_up, the up weight's bytes (for one weight, use gemv_q)")
    return _launch(raw_gate, raw_up, qtype, od, id, x, out, None, config, stream)


def gemv_pair(first: tuple, second: tuple, x, *, stream=0) -> None:
    """Enqueue two mat-vecs over the same x as one launch (decode FUSE_QKV_MIXED: q|k and v of different formats):
    ``first`` and ``second`` are each ``(raw, qtype, od, id, out, residual, config)`` with the meanings of
    `gemv_q`'s arguments (``out`` given, ``residual`` None or a vector, ``config`` a `GemvConfig` for that call).
    The kernel gives each its own CUDA blocks (the first ``config.grid(od)`` to ``first``) and runs each one's
    code unchanged (`kernels.gemv.codegen._pair_source`), so every output is bit-identical to its `gemv_q`.

    The two outputs (and residuals) must not overlap: one launch writes both at once.

    Raises KernelConstraintError for everything `gemv_q` refuses in either (the message names which), a tuple that
    is not those seven values, a GLU config, and two configs that cannot share one launch (`pair_refusal`)."""
    from kernels.gemv.codegen import _build_pair

    prepared = []
    for what, call in (("first", first), ("second", second)):
        if not isinstance(call, tuple) or len(call) != 7:
            raise KernelConstraintError(f"gemv_pair's {what} must be (raw, qtype, od, id, out, residual, config)")
        raw, qtype, od, id, out, residual, config = call
        if out is None or not isinstance(config, GemvConfig) or config.glu:
            raise KernelConstraintError(f"gemv_pair's {what} needs its out and a GemvConfig without glu")
        prepared.append(_named(what, _arguments, raw, None, qtype, od, id, x, out, residual, config, stream))
    (ca, _, args_a), (cb, _, args_b) = prepared
    reason = pair_refusal(ca, cb)
    if reason:
        raise KernelConstraintError(reason)
    if args_a is None or args_b is None:
        raise KernelConstraintError("gemv_pair needs both products non-empty (od >= 1)")
    key = (ca, cb)
    k = _PAIR_CACHE.get(key)
    if k is None:
        k = _PAIR_CACHE[key] = _build_pair(ca, cb)
    nx = len(args_a) - 5  # raw, x args..., y, res, od, id
    grid_a = ca.grid(args_a[-2])
    args = (*args_a, args_b[0], *args_b[1 + nx:], grid_a)
    launch_kernel(k, grid_a + cb.grid(args_b[-2]), ca.threads, stream, args, pdl=ca.pdl)


def pair_refusal(first: GemvConfig, second: GemvConfig) -> str | None:
    """Why two configurations cannot run as one `gemv_pair` launch, in one sentence, or None: one launch has one
    thread count, one PDL mode and one launch bound, and the two kernels' shared memory adds up (x's form is the
    call's, checked with each config)."""
    for field in ("threads", "pdl", "min_blocks"):
        if getattr(first, field) != getattr(second, field):
            return (f"gemv_pair runs one launch: its two configs must agree in {field} "
                    f"({getattr(first, field)} vs {getattr(second, field)})")
    if first.smem_bytes + second.smem_bytes > STAGE_SMEM_LIMIT:
        return (f"gemv_pair's two kernels need {first.smem_bytes} + {second.smem_bytes} bytes of shared memory, over "
                f"the {STAGE_SMEM_LIMIT}-byte static limit; use fewer stages, rows or warps")
    return None


def _launch(raw, raw_up, qtype, od, id, x, out, residual, config, stream):
    """Check every argument (see `gemv_q`), then enqueue the kernel; ``raw_up`` not None selects the GLU kernel."""
    config, out, args = _arguments(raw, raw_up, qtype, od, id, x, out, residual, config, stream)
    if args is not None:
        launch_kernel(kernel_for(config), config.grid(od), config.threads, stream, args, pdl=config.pdl)
    return out


def _arguments(raw, raw_up, qtype, od, id, x, out, residual, config, stream):
    """Check every argument (see `gemv_q`); return (the config, y, the kernel's arguments), the arguments None when
    od = 0 (nothing to launch). ``raw_up`` not None selects the GLU kernel."""
    mmvq, glu = isinstance(x, Q8Blocks), raw_up is not None
    xres = mmvq and x.compensated
    fmt = block_format(_format_name(qtype, mmvq))
    if config is None:
        config = GemvConfig(fmt.name, mmvq=mmvq, glu=glu, residual=residual is not None, xres=xres)
    else:
        _check_config(config, fmt.name, mmvq, glu, residual is not None, xres)
    if config.pdl and not stream:
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
    for name, w in zip(("raw", "raw_up"), weights):
        reason = config.weight_refusal(w, what=name)
        if reason:
            raise KernelConstraintError(reason)
    if mmvq:
        if x.size != id:
            raise KernelConstraintError(f"x holds {x.size} Q8_1 activations; W has id={id} columns")
        check_q8(x, id, "x")
        xargs = (x.q.view(np.uint32), x.d, x.s) + ((x.r.view(np.uint32),) if xres else ())
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
        return config, out, None
    if id == 0:
        raise KernelConstraintError("id must be positive (a product over no columns is not a launch)")
    view = (_MMVQ_IMPLS if mmvq else _IMPLS)[fmt.name][4]
    return config, out, (*(w.view(view) if view is not np.uint8 else w for w in weights), *xargs, out,
                    out if residual is None else residual, od, id)


def _check_config(config, name: str, mmvq: bool, glu: bool, residual: bool, xres: bool) -> None:
    """Refuse a `GemvConfig` made for another call than this one (one sentence naming the field that differs)."""
    if not isinstance(config, GemvConfig):
        raise KernelConstraintError(f"config must be a kernels.gemv.GemvConfig, got {type(config).__name__}")
    call = {"qtype": name, "mmvq": mmvq, "glu": glu, "residual": residual, "xres": xres}
    how = {"qtype": "W's format", "mmvq": "x given as Q8_1 blocks", "glu": "gemv_glu (two weights)",
           "residual": "a residual given", "xres": "x given as compensated Q8_1 blocks"}
    for key, value in call.items():
        if getattr(config, key) != value:
            raise KernelConstraintError(f"config.{key}={getattr(config, key)!r} does not match this call "
                                        f"({how[key]}: {value!r}); make the GemvConfig with {key}={value!r}")


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
