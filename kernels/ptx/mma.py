"""Warp-level tensor-core MMA (sm_80+, checked for sm_90): `mma.sync` m16n8k16 with f16 operands and f32
accumulators, `ldmatrix` (x4, .trans, byte-offset form) that loads its operand fragments from shared memory, and
the `.f16x2` register pack / unpack.

Register conventions (f16x2 packing, g = lane >> 2, t = lane & 3) and the simulator's per-warp rendezvous:
kernels/ptx/_base.py. Fragment layouts: PTX ISA §9.7.14.5.8 "Matrix Fragments for mma.m16n8k16 with floating point
type"; the simulator forms use the same layouts.
"""

from __future__ import annotations

from numba import types

from kernels.ptx._base import SIMULATOR, _check_1d_array, _check_scalars

if SIMULATOR:
    import numpy as np

    from kernels.ptx._base import _h2, _ndarray, _unpack_h, _warp_exchange
else:
    from llvmlite import ir
    from numba.cuda.extending import intrinsic

    from kernels.ptx._base import _any_element_pointer, _asm, _shared_base_u32, _shared_u32


# ---- .f16x2 registers -----------------------------------------------------------------------------------------

if SIMULATOR:

    def pack_f16x2(lo, hi):
        """Simulator form of `mov.b32 d, {lo, hi}`: two f16 packed in one uint32 (``lo`` in bits 0..15)."""
        bits = np.array([lo, hi], dtype=np.float16).view(np.uint16)
        return np.uint32(_h2(bits[0], bits[1]))

    def unpack_f16x2(reg):
        """Simulator form of `mov.b32 {lo, hi}, r`: the two f16 of a packed uint32, low half first."""
        lo, hi = _unpack_h(reg)
        return np.float16(lo), np.float16(hi)

else:

    @intrinsic
    def pack_f16x2(typingctx, lo, hi):
        """`mov.b32 d, {lo, hi}` (PTX ISA §9.7.9.1 "mov", vector-to-scalar pack): two f16 in one uint32, ``lo``
        in bits 0..15 — the `.f16x2` register that mma/wmma take (PTX ISA §5.2.4 "Packed data types")."""
        _check_scalars("pack_f16x2", (lo, hi), types.Float, 2)
        sig = types.uint32(lo, hi)

        def codegen(context, builder, sig, args):
            h = [context.cast(builder, v, t, types.float16) for v, t in zip(args, sig.args)]
            return _asm(builder, ir.IntType(32), h, "mov.b32 $0, {$1, $2};", "=r,h,h", False)

        return sig, codegen

    @intrinsic
    def unpack_f16x2(typingctx, reg):
        """`mov.b32 {lo, hi}, r` (PTX ISA §9.7.9.1 "mov"): the two f16 of a packed uint32, low half first."""
        _check_scalars("unpack_f16x2", (reg,), types.Integer, 1)
        sig = types.UniTuple(types.float16, 2)(reg)

        def codegen(context, builder, sig, args):
            r = context.cast(builder, args[0], sig.args[0], types.uint32)
            half = ir.IntType(16)  # numba-cuda's LLVM form of float16
            res = _asm(builder, ir.LiteralStructType([half, half]), [r], "mov.b32 {$0, $1}, $2;", "=h,=h,r", False)
            return context.make_tuple(builder, sig.return_type, [builder.extract_value(res, i) for i in range(2)])

        return sig, codegen


# ---- mma.sync m16n8k16 ----------------------------------------------------------------------------------------

if SIMULATOR:
    # Fragment <-> matrix conversions, shared with the wmma simulator forms (kernels.ptx.wmma).

    def _a_frag_matrix(slots, k0=0):
        """Rebuild the 16x16 f16 A matrix from 32 lanes' a0..a3 (mma.m16n8k16 A fragment layout)."""
        a = np.zeros((16, 16), dtype=np.float64)
        for lane, regs in enumerate(slots):
            g, t = lane >> 2, lane & 3
            for r, (row, col) in enumerate(((g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8))):
                lo, hi = _unpack_h(regs[k0 + r])
                a[row, col], a[row, col + 1] = lo, hi
        return a

    def _b_frag_matrix(slots, r0=0):
        """Rebuild the 16x8 (k x n) f16 B matrix from 32 lanes' b0, b1 (mma.m16n8k16 B fragment layout)."""
        b = np.zeros((16, 8), dtype=np.float64)
        for lane, regs in enumerate(slots):
            g, t = lane >> 2, lane & 3
            for r, k in enumerate((2 * t, 2 * t + 8)):
                lo, hi = _unpack_h(regs[r0 + r])
                b[k, g], b[k + 1, g] = lo, hi
        return b

    def _c_frag_matrix(slots, r0=0):
        c = np.zeros((16, 8), dtype=np.float64)
        for lane, regs in enumerate(slots):
            g, t = lane >> 2, lane & 3
            c[g, 2 * t], c[g, 2 * t + 1], c[g + 8, 2 * t], c[g + 8, 2 * t + 1] = regs[r0 : r0 + 4]
        return c

    def _c_frag_lanes(d):
        """Distribute a 16x8 f32 matrix to the 32 lanes as the mma.m16n8k16 C/D fragment (4 f32 per lane)."""
        d = d.astype(np.float32)
        out = []
        for lane in range(32):
            g, t = lane >> 2, lane & 3
            out.append((d[g, 2 * t], d[g, 2 * t + 1], d[g + 8, 2 * t], d[g + 8, 2 * t + 1]))
        return out

    def _mma_op(slots):
        a = _a_frag_matrix([s[0:4] for s in slots])
        b = _b_frag_matrix([s[4:6] for s in slots])
        c = _c_frag_matrix([s[6:10] for s in slots])
        # The tensor core multiplies f16 exactly and accumulates in (at least) f32.
        return _c_frag_lanes(a @ b + c)

    def mma_m16n8k16_f32_f16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        """Simulator form of `mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32` (same fragments, see the
        compiled form's docstring); the warp's 32 lanes rendezvous to multiply."""
        return _warp_exchange(_mma_op, (a0, a1, a2, a3, b0, b1, c0, c1, c2, c3))

else:

    @intrinsic
    def mma_m16n8k16_f32_f16(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        """`mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {d0..d3}, {a0..a3}, {b0, b1}, {c0..c3}` (PTX ISA
        §9.7.14.5.14 "mma"; layouts: §9.7.14.5.8 "Matrix Fragments for mma.m16n8k16 with floating point type").
        D[16x8] = A[16x16] · B[16x8] + C, f16 operands, f32 accumulation, one warp (all 32 lanes, converged).

        Per lane l, g = l >> 2, t = l & 3 (every .f16x2 register: lower column/row index in bits 0..15):
          a0: A[g,   2t..2t+1]    a1: A[g+8, 2t..2t+1]    a2: A[g, 2t+8..2t+9]    a3: A[g+8, 2t+8..2t+9]
          b0: B[2t..2t+1, g]      b1: B[2t+8..2t+9, g]    (B "col": the k pair of column n = g)
          c0, c1: C[g, 2t], C[g, 2t+1]       c2, c3: C[g+8, 2t], C[g+8, 2t+1]       (D likewise)
        a*, b*: uint32; c*: float32. Returns (d0, d1, d2, d3) as float32.
        """
        _check_scalars("mma_m16n8k16_f32_f16 (A, B)", (a0, a1, a2, a3, b0, b1), types.Integer, 6)
        _check_scalars("mma_m16n8k16_f32_f16 (C)", (c0, c1, c2, c3), types.Float, 4)
        sig = types.UniTuple(types.float32, 4)(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3)

        def codegen(context, builder, sig, args):
            regs = [context.cast(builder, v, t, types.uint32) for v, t in zip(args[:6], sig.args[:6])]
            accs = [context.cast(builder, v, t, types.float32) for v, t in zip(args[6:], sig.args[6:])]
            f32 = ir.FloatType()
            text = (
                "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};"
            )
            res = _asm(builder, ir.LiteralStructType([f32] * 4), regs + accs, text, "=f,=f,=f,=f," + ",".join(["r"] * 6 + ["f"] * 4), False)
            return context.make_tuple(builder, sig.return_type, [builder.extract_value(res, i) for i in range(4)])

        return sig, codegen


# ---- ldmatrix -------------------------------------------------------------------------------------------------

if SIMULATOR:

    def _ldmatrix_op(trans):
        def op(slots):
            mats = []
            for m in range(4):
                rows = []
                for lane in range(8 * m, 8 * m + 8):
                    array, index = slots[lane]
                    rows.append(_ndarray(array).reshape(-1)[index : index + 8].view(np.uint16))
                mats.append(np.stack(rows))
            out = []
            for lane in range(32):
                g, t = lane >> 2, lane & 3
                if trans:
                    out.append(tuple(np.uint32(_h2(mt[2 * t, g], mt[2 * t + 1, g])) for mt in mats))
                else:
                    out.append(tuple(np.uint32(_h2(mt[g, 2 * t], mt[g, 2 * t + 1])) for mt in mats))
            return out

        return op

    _LDMATRIX = _ldmatrix_op(False)
    _LDMATRIX_T = _ldmatrix_op(True)

    def ldmatrix_x4(array, index):
        """Simulator form of `ldmatrix.sync.aligned.m8n8.x4.shared.b16` (lane l gives the row address of matrix
        l // 8, row l % 8 as ``array[index:index+8]``)."""
        return _warp_exchange(_LDMATRIX, (array, index))

    def ldmatrix_x4_trans(array, index):
        """Simulator form of `ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16`."""
        return _warp_exchange(_LDMATRIX_T, (array, index))

else:

    def _ldmatrix(trans: bool):
        suffix = ".trans" if trans else ""

        @intrinsic
        def impl(typingctx, array, index):
            _check_1d_array("ldmatrix", array, index)
            sig = types.UniTuple(types.uint32, 4)(array, index)

            def codegen(context, builder, sig, args):
                addr = _shared_u32(builder, _any_element_pointer(context, builder, sig.args[0], args[0], args[1]))
                i32 = ir.IntType(32)
                text = f"ldmatrix.sync.aligned.m8n8.x4{suffix}.shared.b16 {{$0, $1, $2, $3}}, [$4];"
                res = _asm(builder, ir.LiteralStructType([i32] * 4), [addr], text, "=r,=r,=r,=r,r,~{memory}", True)
                return context.make_tuple(builder, sig.return_type, [builder.extract_value(res, i) for i in range(4)])

            return sig, codegen

        return impl

    ldmatrix_x4 = _ldmatrix(False)
    ldmatrix_x4.__doc__ = """`ldmatrix.sync.aligned.m8n8.x4.shared.b16 {r0..r3}, [addr]` (PTX ISA §9.7.14.5.15
        "ldmatrix"): four 8x8 b16 matrices from shared memory to the warp. Lane l supplies (through its own
        ``array[index]``, a 1-D `cuda.shared.array`, 16-byte aligned) the address of row l % 8 of matrix l // 8:
        8 contiguous b16. Per lane, g = l >> 2, t = l & 3: r_i = M_i[g, 2t..2t+1] (lower column in bits 0..15).
        With the rows of a row-major 16x16 A tile given as lane l -> (row l % 16, col 8 * (l // 16)), r0..r3 are
        exactly mma.m16n8k16's a0..a3."""

    ldmatrix_x4_trans = _ldmatrix(True)
    ldmatrix_x4_trans.__doc__ = """`ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16` (PTX ISA §9.7.14.5.15
        "ldmatrix", .trans): as `ldmatrix_x4` but each matrix is transposed on the way: r_i = (M_i[2t, g],
        M_i[2t+1, g]) — for an operand stored k-major when the fragment wants it n-major (e.g. a row-major
        [k, n] B tile -> mma's b0/b1)."""


# Byte-offset form: the lane's row given as a 32-bit byte offset from the shared array's start, added to the
# array's loop-invariant 32-bit shared-window address instead of a 64-bit GEP per access (see `cp_async_16_off`
# in kernels.ptx.async_copy for why).

if SIMULATOR:

    def ldmatrix_x4_off(array, byte_offset):
        """Simulator form of `ldmatrix_x4_off`: as `ldmatrix_x4` with the lane's row given as a BYTE offset
        into ``array`` (16-byte aligned)."""
        return _warp_exchange(_LDMATRIX, (array, int(byte_offset) // _ndarray(array).itemsize))

else:

    @intrinsic
    def ldmatrix_x4_off(typingctx, array, byte_offset):
        """`ldmatrix.sync.aligned.m8n8.x4.shared.b16 {r0..r3}, [addr]` (PTX ISA §9.7.14.5.15 "ldmatrix"), the
        lane's row address given as ``byte_offset`` (truncated to 32 bits) from the start of the 1-D shared
        array ``array``; otherwise exactly `ldmatrix_x4` (same lane->row rule, same result registers)."""
        _check_1d_array("ldmatrix_x4_off", array, byte_offset)
        sig = types.UniTuple(types.uint32, 4)(array, byte_offset)

        def codegen(context, builder, sig, args):
            base = _shared_base_u32(context, builder, sig.args[0], args[0])
            off = context.cast(builder, args[1], sig.args[1], types.uint32)
            addr = builder.add(base, off)
            i32 = ir.IntType(32)
            text = "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {$0, $1, $2, $3}, [$4];"
            res = _asm(builder, ir.LiteralStructType([i32] * 4), [addr], text, "=r,=r,=r,=r,r,~{memory}", True)
            return context.make_tuple(builder, sig.return_type, [builder.extract_value(res, i) for i in range(4)])

        return sig, codegen
