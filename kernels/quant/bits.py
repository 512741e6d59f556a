"""Bit-level scalar helpers the dequantization kernels share, each with a CUDA-simulator fallback.

The kernels must reproduce gguf-py's float32 arithmetic bit for bit (their f16 output is compared with
``float16(gguf.quants.dequantize(...))`` element for element), so:

* ``fmul_rn`` / ``fadd_rn`` / ``fsub_rn`` emit ``mul.rn.f32`` / ``add.rn.f32`` / ``sub.rn.f32`` (what
  libdevice's ``__nv_f*_rn`` lower to). Per the PTX ISA (§9.7.3, floating-point ``mul``/``add``), an instruction
  without a rounding modifier may be optimised by the code generator, e.g. a ``mul.f32`` and a following
  ``add.f32`` contracted into one ``fma`` (one rounding where numpy rounds twice); an explicit ``.rn`` forbids
  that. Every product that is then added or subtracted uses them. They are intrinsics, not device functions,
  because numba compiles a device function for the current device, which `compile_ptx` on a GPU-less CI
  machine does not have.
* ``ld_global_v4_u32`` / ``st_global_v4_u32``: 16-byte loads and stores (same semantics as
  `kernels.ptx`'s helpers of the same names; duplicated because that module did not import while this one was
  written; prefer one copy).
* ``f32_from_f16_bits`` (``cvt.f32.f16``), ``f16x2_bits`` (``cvt.rn.f16x2.f32``, sm_80+; round to nearest even,
  like numpy's ``astype(float16)``) and ``f32_from_bits`` (``__nv_int_as_float``) move between bit patterns
  and values without a memory round trip (``f32_from_bits`` is an LLVM bitcast, no PTX of its own).

Inline PTX follows the `kernels.ptx` pattern (numba-cuda ``cache_hints.py``); kept here, not imported from
there, so that the quant kernels depend on nothing but numba. Under ``NUMBA_ENABLE_CUDASIM=1``
each helper is a numpy function computing exactly what the instruction computes.
Source: PTX ISA 9.x §9.7.3 (floating-point instructions), §9.7.9.21 "cvt".
"""

from __future__ import annotations

import numpy as np
from numba import types
from numba.cuda import config

SIMULATOR = bool(config.ENABLE_CUDASIM)

F32_MAGIC_BITS = 0x4B000000
F32_MAGIC = np.float32(8388608.0)
"""``f32_from_bits(F32_MAGIC_BITS | q) - (F32_MAGIC + c)`` is the exact float32 of ``q - c`` for integers
0 <= q < 2**23 (2**23 + q is exact, so is the subtraction): an integer-to-float conversion on the full-rate
integer and FP32 pipes instead of ``cvt.rn.f32.s32``, which runs at a quarter of that rate on sm_90."""

if SIMULATOR:

    def fmul_rn(x, y):
        """Simulator form of ``mul.rn.f32``."""
        return np.float32(x) * np.float32(y)

    def fadd_rn(x, y):
        """Simulator form of ``add.rn.f32``."""
        return np.float32(x) + np.float32(y)

    def fsub_rn(x, y):
        """Simulator form of ``sub.rn.f32``."""
        return np.float32(x) - np.float32(y)

    def f32_from_bits(u):
        """Simulator form of ``__nv_int_as_float``: the float32 whose bits are the low 32 bits of ``u``."""
        return np.uint32(int(u) & 0xFFFFFFFF).view(np.float32)

    def f32_from_f16_bits(u):
        """Simulator form of ``cvt.f32.f16``: the f16 whose bits are the low 16 bits of ``u``, as float32."""
        return np.float32(np.uint16(int(u) & 0xFFFF).view(np.float16))

    def ld_global_v4_u32(array, index):
        """Simulator form of ``ld.global.v4.u32``: elements index..index+3 of ``array`` as a 4-tuple."""
        return (array[index], array[index + 1], array[index + 2], array[index + 3])

    def st_global_v4_u32(array, index, x0, x1, x2, x3):
        """Simulator form of ``st.global.v4.u32``: store four uint32 at elements index..index+3."""
        array[index] = x0
        array[index + 1] = x1
        array[index + 2] = x2
        array[index + 3] = x3

    def f16x2_bits(lo, hi):
        """Simulator form of ``cvt.rn.f16x2.f32``: f16(hi) bits << 16 | f16(lo) bits, round to nearest even."""
        lo16 = int(np.float16(np.float32(lo)).view(np.uint16))
        hi16 = int(np.float16(np.float32(hi)).view(np.uint16))
        return np.uint32((hi16 << 16) | lo16)

else:
    from llvmlite import ir
    from numba.cuda.core.errors import NumbaTypeError
    from numba.cuda.extending import intrinsic

    def _f32_binary(op: str):
        """An intrinsic emitting ``{op}.rn.f32 d, x, y`` on the float32 casts of its two arguments."""

        def impl(typingctx, x, y):
            _check_float(f"{op}_rn", x, y)
            sig = types.float32(x, y)

            def codegen(context, builder, sig, args):
                fx, fy = (context.cast(builder, v, t, types.float32) for v, t in zip(args, sig.args))
                fnty = ir.FunctionType(ir.FloatType(), [ir.FloatType(), ir.FloatType()])
                asm = ir.InlineAsm(fnty, f"{op}.rn.f32 $0, $1, $2;", "=f,f,f", side_effect=False)
                return builder.call(asm, [fx, fy])

            return sig, codegen

        impl.__name__ = f"f{op}_rn"
        impl.__doc__ = f"``{op}.rn.f32`` (PTX ISA §9.7.3): rounded to nearest even, never contracted into an fma."
        return intrinsic(impl)

    fmul_rn = _f32_binary("mul")
    fadd_rn = _f32_binary("add")
    fsub_rn = _f32_binary("sub")

    @intrinsic
    def f32_from_bits(typingctx, u):
        """The float32 whose bits are the low 32 bits of integer ``u`` (an LLVM bitcast: a register move)."""
        _check_int("f32_from_bits", u)
        sig = types.float32(u)

        def codegen(context, builder, sig, args):
            x = context.cast(builder, args[0], sig.args[0], types.uint32)
            return builder.bitcast(x, ir.FloatType())

        return sig, codegen

    def _check_int(name, *args):
        for a in args:
            if not isinstance(a, types.Integer):
                raise NumbaTypeError(f"{name} needs integer bit patterns, got {a}")

    def _check_float(name, *args):
        for a in args:
            if not isinstance(a, (types.Float, types.Integer)):
                raise NumbaTypeError(f"{name} needs numbers, got {a}")

    @intrinsic
    def f32_from_f16_bits(typingctx, u):
        """``cvt.f32.f16 d, h`` (PTX ISA §9.7.9.21 "cvt"): the f16 whose bits are the low 16 bits of ``u``,
        converted exactly to float32."""
        _check_int("f32_from_f16_bits", u)
        sig = types.float32(u)

        def codegen(context, builder, sig, args):
            x = context.cast(builder, args[0], sig.args[0], types.uint32)
            fnty = ir.FunctionType(ir.FloatType(), [ir.IntType(32)])
            asm = ir.InlineAsm(
                fnty, "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $1; cvt.f32.f16 $0, lo; }", "=f,r", side_effect=False
            )
            return builder.call(asm, [x])

        return sig, codegen

    @intrinsic
    def f16x2_bits(typingctx, lo, hi):
        """``cvt.rn.f16x2.f32 d, a, b`` (PTX ISA §9.7.9.21 "cvt", sm_80+): ``hi`` and ``lo`` rounded to f16
        (nearest even) and packed as one uint32, ``hi`` in the upper half (a = hi, b = lo)."""
        _check_float("f16x2_bits", lo, hi)
        sig = types.uint32(lo, hi)

        def codegen(context, builder, sig, args):
            flo = context.cast(builder, args[0], sig.args[0], types.float32)
            fhi = context.cast(builder, args[1], sig.args[1], types.float32)
            fnty = ir.FunctionType(ir.IntType(32), [ir.FloatType(), ir.FloatType()])
            asm = ir.InlineAsm(fnty, "cvt.rn.f16x2.f32 $0, $1, $2;", "=r,f,f", side_effect=False)
            return builder.call(asm, [fhi, flo])

        return sig, codegen

    def _check_u32_vector_access(name: str, array, index) -> None:
        if not (isinstance(array, types.Array) and array.ndim == 1 and array.dtype == types.uint32):
            raise NumbaTypeError(f"{name} needs a 1-D uint32 array, got {array}")
        if not isinstance(index, types.Integer):
            raise NumbaTypeError(f"{name} needs an integer element index, got {index}")

    def _element_pointer(context, builder, array_type, array, index, index_type):
        from numba.cuda import cgutils

        index = context.cast(builder, index, index_type, types.uint64)
        struct = context.make_array(array_type)(context, builder, value=array)
        return cgutils.get_item_pointer(context, builder, array_type, struct, [index], wraparound=False)

    @intrinsic
    def ld_global_v4_u32(typingctx, array, index):
        """``ld.global.v4.u32 {a,b,c,d}, [addr]`` (PTX ISA §9.7.9.8 "ld"): elements index..index+3 of a 1-D
        uint32 array as a 4-tuple. ``index`` must be a multiple of 4 and the array 16-byte aligned."""
        _check_u32_vector_access("ld_global_v4_u32", array, index)
        sig = types.UniTuple(types.uint32, 4)(array, index)

        def codegen(context, builder, sig, args):
            ptr = _element_pointer(context, builder, sig.args[0], args[0], args[1], sig.args[1])
            i32 = ir.IntType(32)
            fnty = ir.FunctionType(ir.LiteralStructType([i32] * 4), [ptr.type])
            asm = ir.InlineAsm(fnty, "ld.global.v4.u32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,l", side_effect=True)
            result = builder.call(asm, [ptr])
            return context.make_tuple(builder, sig.return_type, [builder.extract_value(result, i) for i in range(4)])

        return sig, codegen

    @intrinsic
    def st_global_v4_u32(typingctx, array, index, x0, x1, x2, x3):
        """``st.global.v4.u32 [addr], {a,b,c,d}`` (PTX ISA §9.7.9.10 "st"): four uint32 at elements
        index..index+3 of a 1-D uint32 array. Same alignment rule as ``ld_global_v4_u32``."""
        _check_u32_vector_access("st_global_v4_u32", array, index)
        _check_int("st_global_v4_u32", x0, x1, x2, x3)
        sig = types.void(array, index, x0, x1, x2, x3)

        def codegen(context, builder, sig, args):
            ptr = _element_pointer(context, builder, sig.args[0], args[0], args[1], sig.args[1])
            i32 = ir.IntType(32)
            values = [context.cast(builder, v, t, types.uint32) for v, t in zip(args[2:], sig.args[2:])]
            fnty = ir.FunctionType(ir.VoidType(), [ptr.type, i32, i32, i32, i32])
            asm = ir.InlineAsm(fnty, "st.global.v4.u32 [$0], {$1, $2, $3, $4};", "l,r,r,r,r", side_effect=True)
            builder.call(asm, [ptr, *values])
            return context.get_dummy_value()

        return sig, codegen
