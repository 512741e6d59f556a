"""Hopper (sm_90) tensor memory access (TMA): 2-D tiles copied from a row-major global matrix into shared memory by
the copy engine, described by a tensor map, completing on an mbarrier (kernels/ptx/bulk.py).

`tensor_map_2d` (host) encodes the map of an f16 matrix [rows, cols] with a box of ``box_rows`` x 64 elements (one
128-byte row a box row) and the 128-byte swizzle: in shared memory box row r is 128 bytes at r * 128 with its
16-byte chunk c stored at chunk c ^ (r & 7) -- exactly wgmma's K-major 128-byte swizzled canonical layout when the
destination is 1024-byte aligned (kernels/ptx/wgmma.py). Elements outside the matrix (rows past ``rows``, columns
past ``cols``) land as zeros, and the box's full byte count completes on the barrier either way. The map lives in
global memory (a 16-element uint64 device array, 64-byte aligned as every allocation is), written once from the host
before any launch that reads it (a map in global memory that no kernel modifies needs no tensormap proxy fence;
numba cannot pass a 128-byte ``__grid_constant__`` parameter).

`tensor_map_bytes_2d` (host) encodes the map of a byte matrix [rows, cols] (uint8, e.g. a GGUF tensor's blocks, a
row per weight row) with a box of ``box_rows`` x ``box_cols`` bytes and no swizzle: box row r lands at r *
box_cols, as in global memory (128-byte aligned destination).

`cp_async_bulk_tensor_2d_g2s` (device) issues one box copy at coordinates (c0 = column, c1 = row) of the box's first
element; one thread issues it after arming the barrier with the bytes (`mbarrier_arrive_expect_tx`).

The simulator keeps each map's matrix in a registry (the map's words hold a magic number and the registry key) and
performs the copy as the hardware would, including the swizzle and the zero fill; like a bulk copy, its destination
holds ``BULK_POISON`` until a wait observes the barrier's phase complete.

Source: PTX ISA 9.x §9.7.9.25.5.1 "cp.async.bulk.tensor", §5.5 "Tensor" (tensor maps, bounding box, swizzle
modes); CUDA driver API `cuTensorMapEncodeTiled`.
"""

from __future__ import annotations

import numpy as np

from kernels.errors import KernelConstraintError
from kernels.ptx._base import SIMULATOR, _check_1d_array, _check_scalars

BOX_COLS = 64
"""f16 elements of a box row: 128 bytes, the 128-byte swizzle's span."""
MAP_WORDS = 16
"""uint64 words of a tensor map (128 bytes)."""

if SIMULATOR:
    import itertools
    import threading

    from kernels.ptx._base import _bytes, _ndarray
    from kernels.ptx.bulk import _issue_copy

    _MAGIC = 0x544D4150  # "TMAP"
    _REGISTRY: dict[int, tuple] = {}
    _KEYS = itertools.count(1)
    _LOCK = threading.Lock()
else:
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    from kernels.ptx._base import _any_element_pointer, _shared_u32
    from kernels.ptx.bulk import _check_barrier


def device_address(array) -> int:
    """The device address of ``array``'s first element (under the simulator, its numpy buffer's address)."""
    if SIMULATOR:
        return int(np.asarray(getattr(array, "_ary", array)).ctypes.data)
    return int(array.device_ctypes_pointer.value)


def _register(matrix, box_rows: int, box_cols: int, swizzle: bool):
    """Simulator: the words of a map whose box copies read ``matrix``."""
    from numba import cuda

    with _LOCK:
        key = next(_KEYS)
        _REGISTRY[key] = (matrix, int(box_rows), int(box_cols), swizzle)
    words = np.zeros(MAP_WORDS, np.uint64)
    words[0], words[1] = _MAGIC, key
    return cuda.to_device(words)


def tensor_map_bytes_2d(array, box_rows: int, box_cols: int):
    """The tensor map (uint64 device array [16]) of ``array``, a C-contiguous uint8 device array [rows, cols], for
    boxes of ``box_rows`` x ``box_cols`` bytes, no swizzle, zero fill out of bounds.

    Raises KernelConstraintError (one line) for a non-uint8 or non-2-D array, cols not a multiple of 16 (row pitch),
    box_cols not a multiple of 16 in 16..256, box_rows outside 1..256, or a driver that refuses the encoding."""
    shape = tuple(getattr(array, "shape", ()))
    if len(shape) != 2 or np.dtype(array.dtype) != np.uint8:
        raise KernelConstraintError(f"tensor_map_bytes_2d needs a 2-D uint8 device array, got {getattr(array, 'dtype', None)} {shape}")
    rows, cols = shape
    if cols % 16 or rows < 1:
        raise KernelConstraintError(f"tensor_map_bytes_2d: columns must be a positive multiple of 16 (row pitch), got {shape}")
    if box_cols % 16 or not 16 <= box_cols <= 256 or not 1 <= box_rows <= 256:
        raise KernelConstraintError(f"tensor_map_bytes_2d: box must be 1..256 rows x 16..256 bytes (a multiple of 16), "
                                    f"got {box_rows} x {box_cols}")
    if SIMULATOR:
        return _register(np.asarray(getattr(array, "_ary", array)).reshape(rows, cols), box_rows, box_cols, False)
    from numba import cuda
    from cuda.bindings import driver as cu

    err, tmap = cu.cuTensorMapEncodeTiled(
        cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, device_address(array),
        [cu.cuuint64_t(cols), cu.cuuint64_t(rows)], [cu.cuuint64_t(cols)],
        [cu.cuuint32_t(box_cols), cu.cuuint32_t(box_rows)], [cu.cuuint32_t(1), cu.cuuint32_t(1)],
        cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE,
        cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    if err != cu.CUresult.CUDA_SUCCESS:
        raise KernelConstraintError(f"tensor_map_bytes_2d: cuTensorMapEncodeTiled refused [{rows}, {cols}] uint8 with a "
                                    f"{box_rows}x{box_cols} box: {err.name}")
    return cuda.to_device(np.array(tmap.opaque, dtype=np.uint64))


def tensor_map_2d(array, box_rows: int):
    """The tensor map (uint64 device array [16]) of ``array``, a C-contiguous f16 device array [rows, cols], for
    boxes of ``box_rows`` x `BOX_COLS` with the 128-byte swizzle and zero fill out of bounds.

    Raises KernelConstraintError (one line) for a non-f16 or non-contiguous array, cols not a multiple of 8 (row
    pitch must be a multiple of 16 bytes), box_rows outside 1..256, or a driver that refuses the encoding."""
    shape = tuple(getattr(array, "shape", ()))
    if len(shape) != 2 or np.dtype(array.dtype) != np.float16:
        raise KernelConstraintError(f"tensor_map_2d needs a 2-D float16 device array, got {getattr(array, 'dtype', None)} {shape}")
    rows, cols = shape
    if cols % 8 or rows < 1:
        raise KernelConstraintError(f"tensor_map_2d: columns must be a positive multiple of 8 (16-byte row pitch), got {shape}")
    if not 1 <= box_rows <= 256:
        raise KernelConstraintError(f"tensor_map_2d: box rows must be 1..256, got {box_rows}")
    from numba import cuda

    if SIMULATOR:
        return _register(np.asarray(getattr(array, "_ary", array)).reshape(rows, cols), box_rows, BOX_COLS, True)
    from cuda.bindings import driver as cu

    err, tmap = cu.cuTensorMapEncodeTiled(
        cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, device_address(array),
        [cu.cuuint64_t(cols), cu.cuuint64_t(rows)], [cu.cuuint64_t(cols * 2)],
        [cu.cuuint32_t(BOX_COLS), cu.cuuint32_t(box_rows)], [cu.cuuint32_t(1), cu.cuuint32_t(1)],
        cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    if err != cu.CUresult.CUDA_SUCCESS:
        raise KernelConstraintError(f"tensor_map_2d: cuTensorMapEncodeTiled refused [{rows}, {cols}] f16 with a "
                                    f"{box_rows}x{BOX_COLS} box: {err.name}")
    return cuda.to_device(np.array(tmap.opaque, dtype=np.uint64))


if SIMULATOR:

    def cp_async_bulk_tensor_2d_g2s(dst, dst_index, tmap, tmap_index, c0, c1, bar, bar_index):
        """Simulator form of `cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes`: the
        box at column ``c0``, row ``c1`` of the map at ``tmap[tmap_index]`` into ``dst[dst_index]`` (an f16 map's
        box 128-byte swizzled to a 1024-byte aligned offset in the shared array, a byte map's as it is to a 128-byte
        aligned one), zeros out of bounds; landing when a wait observes the barrier's phase complete
        (``BULK_POISON`` until then)."""
        words = _ndarray(tmap)
        i = int(tmap_index)
        if int(words[i]) != _MAGIC or int(words[i + 1]) not in _REGISTRY:
            raise RuntimeError(f"cp.async.bulk.tensor: tmap[{i}] is not a tensor map made by tensor_map_2d")
        matrix, box_rows, box_cols, swizzle = _REGISTRY[int(words[i + 1])]
        d = _bytes(dst)
        d0 = int(dst_index) * _ndarray(dst).itemsize
        n = box_rows * box_cols * matrix.itemsize
        align = 1024 if swizzle else 128
        if d0 % align or d0 + n > d.size:
            raise ValueError(f"cp.async.bulk.tensor: the box needs a {align}-byte aligned destination inside the "
                             f"array, got byte {d0} of {d.size} for {n} bytes")
        rows, cols = matrix.shape
        box = np.zeros((box_rows, box_cols), matrix.dtype)
        r0, k0 = int(c1), int(c0)
        rs, re = max(r0, 0), min(r0 + box_rows, rows)
        ks, ke = max(k0, 0), min(k0 + box_cols, cols)
        if rs < re and ks < ke:
            box[rs - r0 : re - r0, ks - k0 : ke - k0] = matrix[rs:re, ks:ke]
        if not swizzle:
            _issue_copy(bar, bar_index, d, d0, box.view(np.uint8).reshape(-1))
            return
        chunks = box.view(np.uint8).reshape(box_rows, 8, 16)
        swizzled = np.empty_like(chunks)
        for r in range(box_rows):
            swizzled[r, np.arange(8) ^ (r & 7)] = chunks[r]
        _issue_copy(bar, bar_index, d, d0, swizzled.reshape(-1))

else:

    @intrinsic
    def cp_async_bulk_tensor_2d_g2s(typingctx, dst, dst_index, tmap, tmap_index, c0, c1, bar, bar_index):
        """`cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [dst], [tmap, {c0, c1}],
        [bar]` (PTX ISA §9.7.9.25.5.1, sm_90): copy the box at column ``c0``, row ``c1`` (int32 element
        coordinates; out-of-bounds parts zero-filled) of the tensor map at ``tmap[tmap_index]`` (a 1-D uint64 global
        array holding `tensor_map_2d`'s words; index a multiple of 16) into ``dst[dst_index]`` (1-D shared array,
        1024-byte aligned for the 128-byte swizzle), completing the box's bytes on ``bar[bar_index]``. One thread
        issues it; the barrier's phase must expect the bytes (`mbarrier_arrive_expect_tx`)."""
        from numba.cuda.core.errors import NumbaTypeError

        _check_1d_array("cp_async_bulk_tensor_2d_g2s dst", dst, dst_index)
        _check_1d_array("cp_async_bulk_tensor_2d_g2s tmap", tmap, tmap_index)
        if tmap.dtype != types.uint64:
            raise NumbaTypeError(f"cp_async_bulk_tensor_2d_g2s needs the tensor map as a 1-D uint64 array, got {tmap}")
        _check_scalars("cp_async_bulk_tensor_2d_g2s coordinates", (c0, c1), types.Integer, 2)
        _check_barrier("cp_async_bulk_tensor_2d_g2s bar", bar, bar_index)
        sig = types.void(dst, dst_index, tmap, tmap_index, c0, c1, bar, bar_index)

        def codegen(context, builder, sig, args):
            d = _shared_u32(builder, _any_element_pointer(context, builder, sig.args[0], args[0], args[1]))
            m = builder.ptrtoint(_any_element_pointer(context, builder, sig.args[2], args[2], args[3]), ir.IntType(64))
            x = context.cast(builder, args[4], sig.args[4], types.int32)
            y = context.cast(builder, args[5], sig.args[5], types.int32)
            b = _shared_u32(builder, _any_element_pointer(context, builder, sig.args[6], args[6], args[7]))
            text = ("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
                    "[$0], [$1, {$2, $3}], [$4];")
            fnty = ir.FunctionType(ir.VoidType(), [d.type, m.type, x.type, y.type, b.type])
            builder.call(ir.InlineAsm(fnty, text, "r,l,r,r,r,~{memory}", side_effect=True), [d, m, x, y, b])
            return context.get_dummy_value()

        return sig, codegen
