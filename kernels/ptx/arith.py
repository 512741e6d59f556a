"""Register arithmetic: `dp4a` (four int8 products summed into an int32 in one instruction), the inner step of the
quantized mat-vec (int8 activations x 4/6/8-bit weights); `prmt` (byte permute) and the packed-f16 `sub`/`fma`
that turn 4-bit codes into f16 weights two at a time (the fused-dequantization GEMM's consumers,
`kernels.gemm_fused.q4_k_low`); `div.approx` (a float division without the subroutine call ptxas gives an IEEE
one).

An ``f16x2`` value is a uint32 (`kernels.ptx._base`: the lower element in bits 0..15)."""

from __future__ import annotations

from numba import types

from kernels.ptx._base import SIMULATOR, _check_scalars

if SIMULATOR:
    import numpy as np
else:
    from llvmlite import ir
    from numba.cuda.extending import intrinsic

    from kernels.ptx._base import _asm


if SIMULATOR:

    def prmt_b32(a, b, selector):
        """Simulator form of `prmt.b32 d, a, b, c`: byte i of d is byte ``(selector >> 4 i) & 7`` of the 8 bytes
        {b, a} (a's bytes 0..3, b's 4..7)."""
        if int(selector) & 0x8888:
            raise ValueError(f"prmt_b32: selector {int(selector):#06x} asks for sign replication, which this form "
                             f"does not model")
        src = (int(a) & 0xFFFFFFFF) | ((int(b) & 0xFFFFFFFF) << 32)
        d = 0
        for i in range(4):
            d |= ((src >> (8 * ((int(selector) >> (4 * i)) & 7))) & 0xFF) << (8 * i)
        return np.uint32(d)

    def _halves(x):
        return np.array([int(x) & 0xFFFFFFFF], dtype=np.uint32).view(np.float16).astype(np.float64)

    def _pack(v):
        return np.uint32(v.astype(np.float16).view(np.uint32)[0])

    def sub_f16x2(a, b):
        """Simulator form of `sub.rn.f16x2`: a - b per half, rounded to nearest even (float64 is exact here)."""
        return _pack(_halves(a) - _halves(b))

    def fma_f16x2(a, b, c):
        """Simulator form of `fma.rn.f16x2`: a * b + c per half with one rounding (the float64 product of two f16
        is exact; the sum of it and an f16 is exact unless their exponents differ by more than ~30)."""
        return _pack(_halves(a) * _halves(b) + _halves(c))

    def div_approx_f32(x, y):
        """Simulator form of `div.approx.f32`: x / y in float32 (the instruction's ~2-ulp error is not modelled)."""
        return np.float32(np.float32(x) / np.float32(y))

    def dp4a_s32(a, b, c):
        """Simulator form of `dp4a.s32.s32 d, a, b, c`: ``c`` plus the dot product of the four signed bytes of
        ``a`` with those of ``b``, wrapped to int32 like the instruction's 32-bit result."""
        va = np.array([int(a) & 0xFFFFFFFF], dtype=np.uint32).view(np.int8).astype(np.int64)
        vb = np.array([int(b) & 0xFFFFFFFF], dtype=np.uint32).view(np.int8).astype(np.int64)
        r = (int(c) + int((va * vb).sum())) & 0xFFFFFFFF
        return np.int32(r - (1 << 32) if r >= 1 << 31 else r)

else:

    @intrinsic
    def div_approx_f32(typingctx, x, y):
        """`div.approx.f32 d, x, y` (PTX ISA §9.7.3.8 "div"): x / y to about 2 ulp, for |y| in [2^-126, 2^126]
        (0 beyond). Unlike an IEEE division (div.rn.f32, or the rcp.rn.f32 that x / y and 1 / y lower to), which
        ptxas expands with a subroutine call for its slow path, it is a short inline sequence: a function with a
        call in it makes ptxas serialize every wgmma (warning C7509), so the wgmma kernels divide with this."""
        _check_scalars("div_approx_f32", (x, y), types.Float, 2)
        sig = types.float32(x, y)

        def codegen(context, builder, sig, args):
            v = [context.cast(builder, a, t, types.float32) for a, t in zip(args, sig.args)]
            return _asm(builder, ir.FloatType(), v, "div.approx.f32 $0, $1, $2;", "=f,f,f", False)

        return sig, codegen

    @intrinsic
    def dp4a_s32(typingctx, a, b, c):
        """`dp4a.s32.s32 d, a, b, c` (PTX ISA §9.7.1 "Integer Arithmetic Instructions: dp4a"): ``d = c + Σ_k
        a_k · b_k`` over the four bytes k of ``a`` and ``b``, each sign-extended (int8), in 32-bit integer
        arithmetic — four multiply-adds in one full-rate instruction (sm_61+). Operands are truncated to 32 bits;
        returns int32. llama.cpp's MMVQ kernels (ggml-cuda/vecdotq.cuh) are built on it (``ggml_cuda_dp4a``)."""
        _check_scalars("dp4a_s32", (a, b, c), types.Integer, 3)
        sig = types.int32(a, b, c)

        def codegen(context, builder, sig, args):
            v = [context.cast(builder, x, t, types.int32) for x, t in zip(args, sig.args)]
            return _asm(builder, ir.IntType(32), v, "dp4a.s32.s32 $0, $1, $2, $3;", "=r,r,r,r", False)

        return sig, codegen

    @intrinsic
    def prmt_b32(typingctx, a, b, selector):
        """`prmt.b32 d, a, b, c` (PTX ISA §9.7.8.7 "prmt", default mode): byte i of d is byte ``(c >> 4 i) & 7``
        of the 8 bytes {b, a} (a's bytes 0..3, b's 4..7); the sign-replicate bit (8) is not used here. Returns
        uint32."""
        _check_scalars("prmt_b32", (a, b, selector), types.Integer, 3)
        sig = types.uint32(a, b, selector)

        def codegen(context, builder, sig, args):
            v = [context.cast(builder, x, t, types.uint32) for x, t in zip(args, sig.args)]
            return _asm(builder, ir.IntType(32), v, "prmt.b32 $0, $1, $2, $3;", "=r,r,r,r", False)

        return sig, codegen

    @intrinsic
    def sub_f16x2(typingctx, a, b):
        """`sub.rn.f16x2 d, a, b` (PTX ISA §9.7.4.2 "Half Precision sub"): a - b per f16 half, round to nearest
        even. Operands and result are f16x2 bit patterns (uint32)."""
        _check_scalars("sub_f16x2", (a, b), types.Integer, 2)
        sig = types.uint32(a, b)

        def codegen(context, builder, sig, args):
            v = [context.cast(builder, x, t, types.uint32) for x, t in zip(args, sig.args)]
            return _asm(builder, ir.IntType(32), v, "sub.rn.f16x2 $0, $1, $2;", "=r,r,r", False)

        return sig, codegen

    @intrinsic
    def fma_f16x2(typingctx, a, b, c):
        """`fma.rn.f16x2 d, a, b, c` (PTX ISA §9.7.4.4 "Half Precision fma"): a * b + c per f16 half with one
        rounding (to nearest even). Operands and result are f16x2 bit patterns (uint32)."""
        _check_scalars("fma_f16x2", (a, b, c), types.Integer, 3)
        sig = types.uint32(a, b, c)

        def codegen(context, builder, sig, args):
            v = [context.cast(builder, x, t, types.uint32) for x, t in zip(args, sig.args)]
            return _asm(builder, ir.IntType(32), v, "fma.rn.f16x2 $0, $1, $2, $3;", "=r,r,r,r", False)

        return sig, codegen
