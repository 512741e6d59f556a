"""Bit-level scalar helpers the dequantization kernels share, each with a CUDA-simulator fallback.

The kernels must reproduce gguf-py's float32 arithmetic bit for bit (their f16 output is compared with
``float16(gguf.quants.dequantize(...))`` element for element), so:

* ``fmul_rn`` / ``fadd_rn`` / ``fsub_rn`` emit ``mul.rn.f32`` / ``add.rn.f32`` / ``sub.rn.f32`` (what
  libdevice's ``__nv_f*_rn`` lower to; inline PTX here because a `register_jitable` wrapper needs a GPU to
  compile, which `compile_ptx` on a GPU-less CI machine has not). PTX allows ``ptxas`` to fuse a plain ``mul.f32`` followed by ``add.f32`` into
  one ``fma`` (one rounding instead of numpy's two), but never an instruction with an explicit rounding modifier
  (PTX ISA §9.7.3 "Floating-Point Instructions": "mul/add ... with no rounding modifier may be optimized
  aggressively by the code generator, e.g. contracted into fma"). Every product that is then added uses them.
* ``f32_from_f16_bits`` (``cvt.f32.f16``), ``f16x2_bits`` (``cvt.rn.f16x2.f32``, sm_80+; round to nearest even,
  like numpy's ``astype(float16)``) and ``f32_from_bits`` (``__nv_int_as_float``) move between bit patterns
  and values without a memory round trip (``f32_from_bits`` is an LLVM bitcast, no PTX of its own).

Inline PTX follows the `kernels/ptx.py` pattern (numba-cuda ``cache_hints.py``); kept here, not imported from
there, so that the quant kernels depend on nothing but numba. Under ``NUMBA_ENABLE_CUDASIM=1``
each helper is a numpy function computing exactly what the instruction computes.
Source: PTX ISA 9.x §9.7.3 (floating-point instructions), §9.7.9.21 "cvt".
"""

from __future__ import annotations

import numpy as np
from numba import types
from numba.cuda import config

SIMULATOR = bool(config.ENABLE_CUDASIM)

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
