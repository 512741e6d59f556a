"""The launcher: GGUF tensor bytes of any supported format -> row-major f16 ``[od, id]`` on the GPU."""

from __future__ import annotations

import numpy as np
from numba import cuda
from numba.cuda.cudadrv import devicearray

from kernels.errors import KernelConstraintError
from kernels.quant import floats, kquants, legacy
from kernels.quant.config import DEFAULT_TPB, TPB_VALUES
from kernels.quant.formats import SUPPORTED, BlockFormat, block_format

GROUP = 8
"""Output elements per thread: one 16-byte store."""

_BLOCK_KERNELS = {**legacy.KERNELS, **kquants.KERNELS, **floats.KERNELS}
_ELEMENT_KERNELS = floats.ELEMENT_KERNELS
_VIEW = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64, 16: np.uint64}  # element type per ``align``
assert set(_BLOCK_KERNELS) | set(_ELEMENT_KERNELS) == set(SUPPORTED), "every supported format needs a kernel"


def kernel_for(name: str):
    """The numba kernel that dequantizes format ``name`` (for compile checks and inspection)."""
    return _BLOCK_KERNELS.get(name) or _ELEMENT_KERNELS[name]


def kernel_signature(name: str) -> tuple:
    """The numba argument types ``dequantize`` launches format ``name``'s kernel with (for `compile_ptx`)."""
    from numba import types
    from numba.np.numpy_support import from_dtype

    fmt = block_format(name)
    u16, u32 = types.Array(types.uint16, 1, "C"), types.Array(types.uint32, 1, "C")
    if fmt.name in _ELEMENT_KERNELS:
        return (u32, u32 if fmt.type_size == 4 else u16, u32, u16, types.int64)
    return (types.Array(from_dtype(np.dtype(_VIEW[fmt.align])), 1, "C"), u32, types.int64)


def _address(a) -> int:
    """Device address of ``a``'s first element (the simulator's arrays are numpy arrays in host memory)."""
    iface = getattr(a, "__cuda_array_interface__", None)
    if iface is not None:
        return int(iface["data"][0] or 0)
    return int(a._ary.ctypes.data)  # numba's CUDA simulator: FakeCUDAArray wraps a host numpy array


def _as_device_array(a, what: str):
    if devicearray.is_cuda_ndarray(a):
        return a
    if getattr(a, "__cuda_array_interface__", None) is not None:
        return cuda.as_cuda_array(a)
    raise KernelConstraintError(f"{what} must be a CUDA device array, got {type(a).__name__}")


def dequantize(raw, qtype, od: int, id: int, out=None, stream=0, tpb: int = DEFAULT_TPB):
    """Enqueue the dequantization of one GGUF tensor to f16 on ``stream`` and return ``out``.

    raw: 1-D C-contiguous uint8 device array, exactly the tensor's bytes as stored in the GGUF file: ``od`` rows
    of ``id / block_size`` blocks of ``type_size`` bytes (`kernels.quant.formats` lists each block layout;
    source: ggml-common.h, gguf-py ``quants.py``). Its device address must be a multiple of the format's
    ``align`` (16 for F16/BF16/F32/Q4_K/Q5_K, 8 for Q5_1, 4 for Q4_1/Q2_K, 2 for Q4_0/Q5_0/Q8_0/Q3_K/Q6_K, 1 for
    MXFP4): every cudaMalloc'd buffer and every tensor of a GGUF file (32-byte aligned data) is.
    qtype: format name ("Q4_K"), ``gguf.GGMLQuantizationType`` member or its integer value.
    od, id: output rows and columns; ``id`` a multiple of the block size.
    out: optional C-contiguous float16 device array of shape ``[od, id]``, 16-byte aligned; allocated if None.
    tpb: threads per CUDA block, one of ``TPB_VALUES``; each thread writes 8 consecutive f16.

    Returns out (f16 ``[od, id]``), equal element for element to ``float16(gguf.quants.dequantize(raw bytes,
    qtype).reshape(od, id))``.

    Raises KernelConstraintError (a ValueError), with one sentence saying what is wrong, for: an unsupported
    type (listing the supported ones), raw not a 1-D C-contiguous uint8 device array or misaligned, ``id`` not
    a multiple of the block size, a byte length that is not ``od * id / block_size * type_size``, an ``out`` of
    the wrong dtype, shape, layout or alignment, or a ``tpb`` outside ``TPB_VALUES``.
    """
    try:
        fmt = block_format(qtype)
    except KeyError as e:
        raise KernelConstraintError(e.args[0]) from None
    if tpb not in TPB_VALUES:
        raise KernelConstraintError(f"tpb={tpb} is not supported; allowed: {', '.join(map(str, TPB_VALUES))}")
    od, id = _check_shape(fmt, od, id)
    raw = _check_raw(fmt, raw, od, id)
    out = _check_out(out, od, id, stream)
    n = od * id
    if n == 0:
        return out
    flat = out.reshape(n)
    if fmt.name in _BLOCK_KERNELS:
        n_groups = n // GROUP
        raw_view = raw.view(_VIEW[fmt.align]) if fmt.align > 1 else raw
        _BLOCK_KERNELS[fmt.name][_grid(n_groups, tpb), tpb, stream](raw_view, flat.view(np.uint32), n_groups)
    else:
        n8 = n // GROUP * GROUP
        n_groups = n8 // GROUP + (1 if n % GROUP else 0)
        el = np.uint32 if fmt.type_size == 4 else np.uint16
        raw_v4 = raw[: n8 * fmt.type_size].view(np.uint32)
        out_v4 = flat[:n8].view(np.uint32)
        _ELEMENT_KERNELS[fmt.name][_grid(n_groups, tpb), tpb, stream](
            raw_v4, raw.view(el), out_v4, flat.view(np.uint16), n
        )
    return out


def _grid(n_groups: int, tpb: int) -> int:
    return (n_groups + tpb - 1) // tpb


def _check_shape(fmt: BlockFormat, od, id) -> tuple[int, int]:
    for name, v in (("od", od), ("id", id)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise KernelConstraintError(f"{name} must be a non-negative integer, got {v!r}")
    if id % fmt.block_size:
        raise KernelConstraintError(
            f"id={id} is not a multiple of the {fmt.name} block size {fmt.block_size}; GGUF rows hold whole blocks"
        )
    return int(od), int(id)


def _check_raw(fmt: BlockFormat, raw, od: int, id: int):
    raw = _as_device_array(raw, "raw")
    if raw.ndim != 1 or raw.dtype != np.uint8 or not raw.is_c_contiguous():
        raise KernelConstraintError(
            f"raw must be a 1-D C-contiguous uint8 device array (the tensor's bytes), got dtype {raw.dtype}, "
            f"ndim {raw.ndim}, contiguous={raw.is_c_contiguous()}"
        )
    expected = od * fmt.row_bytes(id)
    if raw.size % fmt.type_size:
        raise KernelConstraintError(
            f"raw holds {raw.size} bytes, not a whole number of {fmt.type_size}-byte {fmt.name} blocks"
        )
    if raw.size != expected:
        raise KernelConstraintError(
            f"raw holds {raw.size} bytes ({raw.size // fmt.type_size} {fmt.name} blocks) but od={od} x id={id} "
            f"needs {expected} ({od} rows of {id // fmt.block_size} blocks of {fmt.type_size} bytes)"
        )
    if raw.size and _address(raw) % fmt.align:
        raise KernelConstraintError(
            f"raw starts at a device address that is not {fmt.align}-byte aligned, which the {fmt.name} kernel "
            f"needs (it reads {fmt.align}-byte words); pass a buffer that starts at a whole block of an aligned "
            "allocation"
        )
    return raw


def _check_out(out, od: int, id: int, stream):
    if out is None:
        return cuda.device_array((od, id), dtype=np.float16, stream=stream)
    out = _as_device_array(out, "out")
    if out.dtype != np.float16 or tuple(out.shape) != (od, id):
        raise KernelConstraintError(
            f"out must be a float16 device array of shape ({od}, {id}), got {out.dtype} of shape {tuple(out.shape)}"
        )
    if not out.is_c_contiguous():
        raise KernelConstraintError("out must be C-contiguous (row-major [od, id])")
    if out.size and _address(out) % 16:
        raise KernelConstraintError("out must start at a 16-byte aligned device address (the kernels store 16 bytes)")
    return out
