"""Integer arithmetic: `dp4a` (four int8 products summed into an int32 in one instruction), the inner step of the
quantized mat-vec (int8 activations x 4/6/8-bit weights)."""

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

    def dp4a_s32(a, b, c):
        """Simulator form of `dp4a.s32.s32 d, a, b, c`: ``c`` plus the dot product of the four signed bytes of
        ``a`` with those of ``b``, wrapped to int32 like the instruction's 32-bit result."""
        va = np.array([int(a) & 0xFFFFFFFF], dtype=np.uint32).view(np.int8).astype(np.int64)
        vb = np.array([int(b) & 0xFFFFFFFF], dtype=np.uint32).view(np.int8).astype(np.int64)
        r = (int(c) + int((va * vb).sum())) & 0xFFFFFFFF
        return np.int32(r - (1 << 32) if r >= 1 << 31 else r)

else:

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
