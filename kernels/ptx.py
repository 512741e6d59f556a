"""Inline-PTX helpers for numba.cuda kernels, each with a CUDA-simulator fallback of the same semantics.

Pattern (numba-cuda's own `cache_hints.py`): a plain stub whose docstring names the instruction and its PTX ISA
section, an `@intrinsic` that validates its argument types at typing time and emits `llvmlite.ir.InlineAsm`,
multi-result instructions returned through a `LiteralStructType` and `extract_value`.

Under `NUMBA_ENABLE_CUDASIM=1` (read once, at import) kernels run as Python: each helper is then a Python
function computing exactly what the instruction computes, per lane.

Source: PTX ISA 9.x (https://docs.nvidia.com/cuda/parallel-thread-execution/).
"""

from __future__ import annotations

from numba import types
from numba.cuda import config

SIMULATOR = bool(config.ENABLE_CUDASIM)


def _check_u32_vector_access(name: str, array, index) -> None:
    from numba.cuda.core.errors import NumbaTypeError

    if not (isinstance(array, types.Array) and array.ndim == 1 and array.dtype == types.uint32):
        raise NumbaTypeError(f"{name} needs a 1-D uint32 array, got {array}")
    if not isinstance(index, types.Integer):
        raise NumbaTypeError(f"{name} needs an integer element index, got {index}")


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
    from llvmlite import ir
    from numba.cuda import cgutils
    from numba.cuda.extending import intrinsic

    def _element_pointer(context, builder, array_type, array, index):
        struct = context.make_array(array_type)(context, builder, value=array)
        return cgutils.get_item_pointer(context, builder, array_type, struct, [index], wraparound=False)

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
