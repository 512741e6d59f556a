"""Vector loads and stores (global and shared), shared-window addresses, an optimisation barrier for a register,
and L2 prefetch hints (per line and bulk through the TMA engine)."""

from __future__ import annotations

from numba import types

from kernels.ptx._base import SIMULATOR, _check_1d_array, _check_scalars, _check_u32_vector_access

if SIMULATOR:
    import numpy as np

    from kernels.ptx._base import _bytes, _ndarray
else:
    from llvmlite import ir
    from numba.cuda import cgutils
    from numba.cuda.extending import intrinsic

    from kernels.ptx._base import _any_element_pointer, _asm, _element_pointer, _shared_u32


# ---- 16-byte vector loads / stores of uint32 arrays ---------------------------------------------------------

if SIMULATOR:

    def ld_global_v4_u32(array, index):
        """Simulator form of `ld.global.v4.u32`: elements index..index+3 of ``array`` as a 4-tuple."""
        return (array[index], array[index + 1], array[index + 2], array[index + 3])

    def st_global_v4_u32(array, index, x0, x1, x2, x3):
        """Simulator form of `st.global.v4.u32`: store four uint32 at elements index..index+3."""
        array[index] = x0
        array[index + 1] = x1
        array[index + 2] = x2
        array[index + 3] = x3

else:

    @intrinsic
    def ld_global_v4_u32(typingctx, array, index):
        """`ld.global.v4.u32 {a,b,c,d}, [addr]` (PTX ISA §9.7.9.8 "ld"): one 16-byte load of elements
        index..index+3 of a 1-D uint32 array, returned as a 4-tuple. ``index`` must be a multiple of 4 and the
        array 16-byte aligned (a misaligned vector load faults)."""
        _check_u32_vector_access("ld_global_v4_u32", array, index)
        sig = types.UniTuple(types.uint32, 4)(array, index)

        def codegen(context, builder, sig, args):
            ptr = _element_pointer(context, builder, sig.args[0], args[0], args[1])
            i32 = ir.IntType(32)
            fnty = ir.FunctionType(ir.LiteralStructType([i32] * 4), [ptr.type])
            asm = ir.InlineAsm(fnty, "ld.global.v4.u32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,l", side_effect=True)
            result = builder.call(asm, [ptr])
            return context.make_tuple(builder, sig.return_type, [builder.extract_value(result, i) for i in range(4)])

        return sig, codegen

    @intrinsic
    def st_global_v4_u32(typingctx, array, index, x0, x1, x2, x3):
        """`st.global.v4.u32 [addr], {a,b,c,d}` (PTX ISA §9.7.9.10 "st"): one 16-byte store of four uint32 at
        elements index..index+3 of a 1-D uint32 array. Same alignment rule as `ld_global_v4_u32`."""
        _check_u32_vector_access("st_global_v4_u32", array, index)
        sig = types.void(array, index, types.uint32, types.uint32, types.uint32, types.uint32)

        def codegen(context, builder, sig, args):
            ptr = _element_pointer(context, builder, sig.args[0], args[0], args[1])
            i32 = ir.IntType(32)
            values = [context.cast(builder, v, t, types.uint32) for v, t in zip(args[2:], sig.args[2:])]
            fnty = ir.FunctionType(ir.VoidType(), [ptr.type, i32, i32, i32, i32])
            asm = ir.InlineAsm(fnty, "st.global.v4.u32 [$0], {$1, $2, $3, $4};", "l,r,r,r,r", side_effect=True)
            builder.call(asm, [ptr, *values])
            return context.get_dummy_value()

        return sig, codegen


# ---- 8- and 16-byte vector loads / stores of any element type ------------------------------------------------

if SIMULATOR:

    def ld_global_v2_b32(array, index):
        """Simulator form of `ld.global.v2.b32`: the 8 bytes starting at element ``index`` as 2 uint32. Bytes past
        the array's end raise IndexError here (on the GPU they would be read from past the allocation)."""
        s0 = index * _ndarray(array).itemsize
        b = _bytes(array)
        if s0 < 0 or s0 + 8 > b.size:
            raise IndexError(f"ld.global.v2.b32 of bytes {s0}..{s0 + 7} outside the array's {b.size} bytes")
        words = b[s0 : s0 + 8].copy().view(np.uint32)
        return np.uint32(words[0]), np.uint32(words[1])

else:

    @intrinsic
    def ld_global_v2_b32(typingctx, array, index):
        """`ld.global.v2.b32 {a,b}, [addr]` (PTX ISA §9.7.9.8 "ld"): the 8 bytes starting at element ``index`` of a
        1-D array of any dtype, as 2 uint32 (8-byte aligned: a misaligned vector load faults). Not volatile: the
        compiler may schedule it like any load of read-only data."""
        _check_1d_array("ld_global_v2_b32", array, index)
        sig = types.UniTuple(types.uint32, 2)(array, index)

        def codegen(context, builder, sig, args):
            ptr = _any_element_pointer(context, builder, sig.args[0], args[0], args[1])
            i32 = ir.IntType(32)
            res = _asm(builder, ir.LiteralStructType([i32] * 2), [ptr], "ld.global.v2.b32 {$0, $1}, [$2];", "=r,=r,l",
                       False)
            return context.make_tuple(builder, sig.return_type, [builder.extract_value(res, i) for i in range(2)])

        return sig, codegen


if SIMULATOR:

    def ld_global_v4_b32(array, index):
        """Simulator form of `ld.global.v4.b32`: the 16 bytes starting at element ``index`` as 4 uint32."""
        s0 = index * _ndarray(array).itemsize
        words = _bytes(array)[s0 : s0 + 16].copy().view(np.uint32)
        return tuple(np.uint32(w) for w in words)

else:

    @intrinsic
    def ld_global_v4_b32(typingctx, array, index):
        """`ld.global.v4.b32 {a,b,c,d}, [addr]` (PTX ISA §9.7.9.8 "ld"): the 16 bytes starting at element
        ``index`` of a 1-D array of any dtype, as 4 uint32 (16-byte aligned)."""
        _check_1d_array("ld_global_v4_b32", array, index)
        sig = types.UniTuple(types.uint32, 4)(array, index)

        def codegen(context, builder, sig, args):
            ptr = _any_element_pointer(context, builder, sig.args[0], args[0], args[1])
            i32 = ir.IntType(32)
            res = _asm(builder, ir.LiteralStructType([i32] * 4), [ptr], "ld.global.v4.b32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,l,~{memory}", True)
            return context.make_tuple(builder, sig.return_type, [builder.extract_value(res, i) for i in range(4)])

        return sig, codegen


if SIMULATOR:

    def ld_shared_v4_b32(array, index):
        """Simulator form of `ld.shared.v4.b32`: the 16 bytes starting at element ``index`` as 4 uint32; an address
        that is not 16-byte aligned or runs past the array raises, as the load faults on the GPU."""
        s0 = index * _ndarray(array).itemsize
        if s0 % 16 or s0 < 0 or s0 + 16 > _bytes(array).size:
            raise IndexError(f"ld.shared.v4.b32 at byte {s0} of a {_bytes(array).size}-byte array: needs 16-byte "
                             f"alignment inside the array")
        words = _bytes(array)[s0 : s0 + 16].copy().view(np.uint32)
        return tuple(np.uint32(w) for w in words)

else:

    @intrinsic
    def ld_shared_v4_b32(typingctx, array, index):
        """`ld.shared.v4.b32 {a,b,c,d}, [addr]` (PTX ISA §9.7.9.8 "ld"): the 16 bytes starting at element
        ``index`` of a 1-D shared array of any dtype, as 4 uint32 (16-byte aligned). Volatile with a memory clobber:
        it stays after the barrier wait that makes the bytes valid."""
        _check_1d_array("ld_shared_v4_b32", array, index)
        sig = types.UniTuple(types.uint32, 4)(array, index)

        def codegen(context, builder, sig, args):
            addr = _shared_u32(builder, _any_element_pointer(context, builder, sig.args[0], args[0], args[1]))
            i32 = ir.IntType(32)
            res = _asm(builder, ir.LiteralStructType([i32] * 4), [addr], "ld.shared.v4.b32 {$0, $1, $2, $3}, [$4];",
                       "=r,=r,=r,=r,r,~{memory}", True)
            return context.make_tuple(builder, sig.return_type, [builder.extract_value(res, i) for i in range(4)])

        return sig, codegen


if SIMULATOR:

    def st_shared_v4_b32(array, index, x0, x1, x2, x3):
        """Simulator form of `st.shared.v4.b32`: 4 uint32 to the 16 bytes starting at element ``index``."""
        d0 = index * _ndarray(array).itemsize
        _bytes(array)[d0 : d0 + 16] = np.array([x0, x1, x2, x3], dtype=np.uint32).view(np.uint8)

else:

    @intrinsic
    def st_shared_v4_b32(typingctx, array, index, x0, x1, x2, x3):
        """`st.shared.v4.b32 [addr], {a,b,c,d}` (PTX ISA §9.7.9.10 "st"): 4 uint32 to the 16 bytes starting at
        element ``index`` of a 1-D shared array of any dtype (16-byte aligned)."""
        _check_1d_array("st_shared_v4_b32", array, index)
        sig = types.void(array, index, types.uint32, types.uint32, types.uint32, types.uint32)

        def codegen(context, builder, sig, args):
            addr = _shared_u32(builder, _any_element_pointer(context, builder, sig.args[0], args[0], args[1]))
            vals = [context.cast(builder, v, t, types.uint32) for v, t in zip(args[2:], sig.args[2:])]
            _asm(builder, ir.VoidType(), [addr, *vals], "st.shared.v4.b32 [$0], {$1, $2, $3, $4};", "r,r,r,r,r,~{memory}", True)
            return context.get_dummy_value()

        return sig, codegen


# ---- f32 vectors: a staged C tile (shared, 8-byte writes and 16-byte reads) and its 16-byte rows to global ------

if SIMULATOR:

    def _check_aligned(name: str, array, byte_offset: int, width: int) -> None:
        """Raise as the GPU faults: a ``width``-byte vector access at ``byte_offset`` of ``array`` whose address is
        not a multiple of ``width`` or that runs past the array."""
        nd = _ndarray(array)
        if byte_offset < 0 or byte_offset + width > nd.nbytes or (nd.ctypes.data + byte_offset) % width:
            raise IndexError(f"{name} at byte {byte_offset} of a {nd.nbytes}-byte array (address "
                             f"{nd.ctypes.data + byte_offset:#x}): needs {width}-byte alignment inside the array")

    def st_shared_v2_f32(array, index, x0, x1):
        """Simulator form of `st.shared.v2.f32`: x0, x1 to elements index, index + 1 of a 1-D float32 shared
        array (8-byte aligned, else IndexError as the store faults)."""
        _check_aligned("st.shared.v2.f32", array, int(index) * 4, 8)
        nd = _ndarray(array)
        nd[index] = x0
        nd[index + 1] = x1

    def ld_shared_v4_f32(array, index):
        """Simulator form of `ld.shared.v4.f32`: elements index .. index + 3 of a 1-D float32 shared array as a
        4-tuple (16-byte aligned, else IndexError)."""
        _check_aligned("ld.shared.v4.f32", array, int(index) * 4, 16)
        nd = _ndarray(array)
        return (nd[index], nd[index + 1], nd[index + 2], nd[index + 3])

    def st_global_v4_f32(array, row, col, x0, x1, x2, x3):
        """Simulator form of `st.global.v4.f32`: x0..x3 to elements (row, col .. col + 3) of a C-contiguous 2-D
        float32 array (16-byte aligned address, else IndexError)."""
        nd = _ndarray(array)
        _check_aligned("st.global.v4.f32", array, (int(row) * nd.shape[1] + int(col)) * 4, 16)
        nd[row, col: col + 4] = (x0, x1, x2, x3)

    def ld_global_v4_f32(array, row, col):
        """Simulator form of `ld.global.v4.f32`: elements (row, col .. col + 3) of a C-contiguous 2-D float32
        array as a 4-tuple (16-byte aligned address, else IndexError)."""
        nd = _ndarray(array)
        _check_aligned("ld.global.v4.f32", array, (int(row) * nd.shape[1] + int(col)) * 4, 16)
        return tuple(nd[row, col: col + 4])

else:

    def _check_f32_array(name: str, array, ndim: int, indices) -> None:
        from numba.cuda.core.errors import NumbaTypeError

        if not (isinstance(array, types.Array) and array.ndim == ndim and array.dtype == types.float32
                and array.layout == "C"):
            raise NumbaTypeError(f"{name} needs a C-contiguous {ndim}-D float32 array, got {array}")
        if not all(isinstance(i, types.Integer) for i in indices):
            raise NumbaTypeError(f"{name} needs integer element indices, got {indices}")

    @intrinsic
    def st_shared_v2_f32(typingctx, array, index, x0, x1):
        """`st.shared.v2.f32 [addr], {a, b}` (PTX ISA §9.7.9.10 "st"): x0, x1 to elements index, index + 1 of a 1-D
        float32 shared array, one 8-byte store (the address must be 8-byte aligned)."""
        _check_f32_array("st_shared_v2_f32", array, 1, (index,))
        sig = types.void(array, index, types.float32, types.float32)

        def codegen(context, builder, sig, args):
            addr = _shared_u32(builder, _element_pointer(context, builder, sig.args[0], args[0], args[1]))
            vals = [context.cast(builder, v, t, types.float32) for v, t in zip(args[2:], sig.args[2:])]
            _asm(builder, ir.VoidType(), [addr, *vals], "st.shared.v2.f32 [$0], {$1, $2};", "r,f,f,~{memory}", True)
            return context.get_dummy_value()

        return sig, codegen

    @intrinsic
    def ld_shared_v4_f32(typingctx, array, index):
        """`ld.shared.v4.f32 {a, b, c, d}, [addr]` (PTX ISA §9.7.9.8 "ld"): elements index .. index + 3 of a 1-D
        float32 shared array as a 4-tuple, one 16-byte load (16-byte aligned). Volatile with a memory clobber: it
        stays after the barrier that makes the values valid."""
        _check_f32_array("ld_shared_v4_f32", array, 1, (index,))
        sig = types.UniTuple(types.float32, 4)(array, index)

        def codegen(context, builder, sig, args):
            addr = _shared_u32(builder, _element_pointer(context, builder, sig.args[0], args[0], args[1]))
            f32 = ir.FloatType()
            res = _asm(builder, ir.LiteralStructType([f32] * 4), [addr], "ld.shared.v4.f32 {$0, $1, $2, $3}, [$4];",
                       "=f,=f,=f,=f,r,~{memory}", True)
            return context.make_tuple(builder, sig.return_type, [builder.extract_value(res, i) for i in range(4)])

        return sig, codegen

    @intrinsic
    def st_global_v4_f32(typingctx, array, row, col, x0, x1, x2, x3):
        """`st.global.v4.f32 [addr], {a, b, c, d}` (PTX ISA §9.7.9.10 "st"): x0..x3 to elements (row, col ..
        col + 3) of a C-contiguous 2-D float32 array, one 16-byte store (the address must be 16-byte aligned: the
        caller checks the array's base and row length)."""
        _check_f32_array("st_global_v4_f32", array, 2, (row, col))
        sig = types.void(array, row, col, types.float32, types.float32, types.float32, types.float32)

        def codegen(context, builder, sig, args):
            struct = context.make_array(sig.args[0])(context, builder, value=args[0])
            ptr = cgutils.get_item_pointer(context, builder, sig.args[0], struct, [args[1], args[2]], wraparound=False)
            vals = [context.cast(builder, v, t, types.float32) for v, t in zip(args[3:], sig.args[3:])]
            _asm(builder, ir.VoidType(), [ptr, *vals], "st.global.v4.f32 [$0], {$1, $2, $3, $4};", "l,f,f,f,f,~{memory}",
                 True)
            return context.get_dummy_value()

        return sig, codegen

    @intrinsic
    def ld_global_v4_f32(typingctx, array, row, col):
        """`ld.global.v4.f32 {a, b, c, d}, [addr]` (PTX ISA §9.7.9.8 "ld"): elements (row, col .. col + 3) of a
        C-contiguous 2-D float32 array as a 4-tuple, one 16-byte load (the address must be 16-byte aligned: the
        caller checks the array's base and row length). Volatile with a memory clobber: it stays in program order
        with the stores around it."""
        _check_f32_array("ld_global_v4_f32", array, 2, (row, col))
        sig = types.UniTuple(types.float32, 4)(array, row, col)

        def codegen(context, builder, sig, args):
            struct = context.make_array(sig.args[0])(context, builder, value=args[0])
            ptr = cgutils.get_item_pointer(context, builder, sig.args[0], struct, [args[1], args[2]], wraparound=False)
            f32 = ir.FloatType()
            res = _asm(builder, ir.LiteralStructType([f32] * 4), [ptr], "ld.global.v4.f32 {$0, $1, $2, $3}, [$4];",
                       "=f,=f,=f,=f,l,~{memory}", True)
            return context.make_tuple(builder, sig.return_type, [builder.extract_value(res, i) for i in range(4)])

        return sig, codegen


# ---- addresses and registers ----------------------------------------------------------------------------------

if SIMULATOR:

    def shared_addr(array, index):
        """Simulator form of `cvta.to.shared`: there are no addresses here; the byte offset of the element."""
        return np.uint32(index * _ndarray(array).itemsize)

else:

    @intrinsic
    def shared_addr(typingctx, array, index):
        """`cvta.to.shared` (PTX ISA §9.7.9.19 "cvta"): the 32-bit shared-window address of element ``index`` of
        a 1-D `cuda.shared.array` — the form the `[addr]` operand of ldmatrix / cp.async / wmma .shared takes.
        Emitted as an LLVM addrspacecast to addrspace(3), which NVVM lowers to cvta.to.shared (or folds away)."""
        _check_1d_array("shared_addr", array, index)
        sig = types.uint32(array, index)

        def codegen(context, builder, sig, args):
            return _shared_u32(builder, _any_element_pointer(context, builder, sig.args[0], args[0], args[1]))

        return sig, codegen


if SIMULATOR:

    def opaque_u32(x):
        """Simulator form of `opaque_u32`: the value itself, as uint32."""
        return np.uint32(int(x) & 0xFFFFFFFF)

else:

    @intrinsic
    def opaque_u32(typingctx, x):
        """`mov.b32 d, x` (PTX ISA §9.7.9.1 "mov") as a volatile asm: ``x`` truncated to uint32, unchanged, but
        opaque to LLVM. For a value computed once before a loop that the compiler would otherwise recompute
        (rematerialize) at every use inside it, e.g. per-lane shared-memory offsets in a GEMM main loop: the
        value then lives in one register."""
        _check_scalars("opaque_u32", (x,), types.Integer, 1)
        sig = types.uint32(x)

        def codegen(context, builder, sig, args):
            v = context.cast(builder, args[0], sig.args[0], types.uint32)
            return _asm(builder, ir.IntType(32), [v], "mov.b32 $0, $1;", "=r,r", True)

        return sig, codegen


# ---- L2 prefetch hints (the mat-vec streams a CUDA block's weight rows into L2) --------------------------------

if SIMULATOR:

    def prefetch_l2(array, byte_offset):
        """Simulator form of `prefetch.global.L2`: a cache hint, so no visible effect; the byte offset is checked to
        lie inside the array, as the device form requires."""
        nbytes = _ndarray(array).nbytes
        if not 0 <= int(byte_offset) < nbytes:
            raise IndexError(f"prefetch_l2: byte {byte_offset} is outside the array's {nbytes} bytes")

else:

    @intrinsic
    def prefetch_l2(typingctx, array, byte_offset):
        """`prefetch.global.L2 [a]` (PTX ISA, data movement instructions: "prefetch, prefetchu"): bring the cache line holding byte
        ``byte_offset`` of a 1-D array (an offset from its data pointer, any dtype) into L2, asynchronously, with no
        register or shared-memory cost (SASS ``CCTL.E.PF2``). The caller keeps the offset inside the array. A hint:
        no visible effect, no fault."""
        _check_1d_array("prefetch_l2", array, byte_offset)
        _check_scalars("prefetch_l2", (byte_offset,), types.Integer, 1)
        sig = types.void(array, byte_offset)

        def codegen(context, builder, sig, args):
            i64 = ir.IntType(64)
            data = context.make_array(sig.args[0])(context, builder, value=args[0]).data
            offset = context.cast(builder, args[1], sig.args[1], types.int64)
            addr = builder.add(builder.ptrtoint(data, i64), offset)
            _asm(builder, ir.VoidType(), [addr], "prefetch.global.L2 [$0];", "l", True)
            return context.get_dummy_value()

        return sig, codegen


if SIMULATOR:

    def prefetch_l2_bulk(array, byte_begin, byte_end):
        """Simulator form of `cp.async.bulk.prefetch.L2.global`: a cache hint, so no visible effect; the operands
        are checked as on the device (the range inside the array and at least 32 bytes long)."""
        nbytes = _ndarray(array).nbytes
        if not (0 <= int(byte_begin) and int(byte_begin) + 32 <= int(byte_end) <= nbytes):
            raise IndexError(f"prefetch_l2_bulk: bytes [{byte_begin}, {byte_end}) are not a range of at least 32 "
                             f"bytes inside the array's {nbytes}")

else:

    @intrinsic
    def prefetch_l2_bulk(typingctx, array, byte_begin, byte_end):
        """`cp.async.bulk.prefetch.L2.global [a], size` (PTX ISA, data movement instructions:
        "cp.async.bulk.prefetch"; sm_90, PTX 8.0): ask the TMA engine to bring bytes ``[byte_begin, byte_end)`` of a 1-D array (offsets from its
        data pointer, any dtype) into L2, asynchronously, with no register or shared-memory cost. The instruction
        needs a 16-byte aligned address and a size that is a multiple of 16, so both ends are rounded down to 16
        bytes (at most 15 bytes at each end are left out; the start never moves below the array's first byte when
        the array is 16-byte aligned, as device allocations and GGUF tensors are). The caller must ensure
        ``byte_end - byte_begin >= 32``, so the rounded size is never zero. A hint: no visible effect, no fault."""
        _check_1d_array("prefetch_l2_bulk", array, byte_begin)
        _check_scalars("prefetch_l2_bulk", (byte_begin, byte_end), types.Integer, 2)
        sig = types.void(array, byte_begin, byte_end)

        def codegen(context, builder, sig, args):
            i64 = ir.IntType(64)
            data = context.make_array(sig.args[0])(context, builder, value=args[0]).data
            begin, end = (context.cast(builder, v, t, types.int64) for v, t in zip(args[1:], sig.args[1:]))
            addr = builder.ptrtoint(data, i64)
            mask = ir.Constant(i64, ~15)
            lo = builder.and_(builder.add(addr, begin), mask)
            hi = builder.and_(builder.add(addr, end), mask)
            size = builder.trunc(builder.sub(hi, lo), ir.IntType(32))
            _asm(builder, ir.VoidType(), [lo, size], "cp.async.bulk.prefetch.L2.global [$0], $1;", "l,r", True)
            return context.get_dummy_value()

        return sig, codegen
