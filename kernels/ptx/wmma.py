"""Warp-level `wmma` m16n16k16 (sm_70+, checked for sm_90): fragment loads of f16 A / B tiles from shared memory,
the f32-accumulating multiply, and accumulator stores to shared or global memory.

The hardware's wmma fragment layout is unspecified (PTX ISA §9.7.14.4: "the mapping of matrix elements into
fragments is ... unspecified"); code must only pass fragments between wmma instructions. The simulator forms use
the mma.m16n8k16 layouts (kernels.ptx.mma): A regs 0..3 = the A fragment, B regs 0..1 / 2..3 = the B fragment of
columns 0..7 / 8..15, accumulator regs 0..3 / 4..7 = the C fragment of columns 0..7 / 8..15; A and B regs 4..7
repeat 0..3 (the hardware also holds 8 registers per lane for 4 registers' worth of data).
"""

from __future__ import annotations

from numba import types

from kernels.ptx._base import SIMULATOR, _check_1d_array, _check_scalars

if SIMULATOR:
    import threading

    import numpy as np

    from kernels.ptx._base import _h2, _ndarray, _warp_exchange
    from kernels.ptx.mma import _a_frag_matrix, _b_frag_matrix, _c_frag_lanes, _c_frag_matrix
else:
    from llvmlite import ir
    from numba.cuda.extending import intrinsic

    from kernels.ptx._base import _any_element_pointer, _asm, _shared_u32


# ---- wmma.load ------------------------------------------------------------------------------------------------

if SIMULATOR:

    def _frag_a_lane(mat, lane):
        g, t = lane >> 2, lane & 3
        bits = mat.astype(np.float16).view(np.uint16)
        regs = tuple(
            np.uint32(_h2(bits[r, c], bits[r, c + 1]))
            for r, c in ((g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8))
        )
        return regs + regs

    def _frag_b_lane(mat_kn, lane):
        g, t = lane >> 2, lane & 3
        bits = mat_kn.astype(np.float16).view(np.uint16)
        regs = tuple(
            np.uint32(_h2(bits[k, n], bits[k + 1, n]))
            for n in (g, g + 8)
            for k in (2 * t, 2 * t + 8)
        )
        return regs + regs

    def _strided_tile(array, index, stride, rows, cols, dtype):
        flat = _ndarray(array).reshape(-1)
        return np.stack([flat[index + r * stride : index + r * stride + cols] for r in range(rows)]).astype(dtype)

    def _lane():
        return threading.current_thread().thread_id % 32

    def wmma_load_a_f16(array, index, stride):
        """Simulator form of `wmma.load.a.sync.aligned.row.m16n16k16.shared.f16`: A[m, k] at
        ``array[index + m*stride + k]`` (stride in ELEMENTS)."""
        return _frag_a_lane(_strided_tile(array, index, stride, 16, 16, np.float16), _lane())

    def wmma_load_b_f16(array, index, stride):
        """Simulator form of `wmma.load.b.sync.aligned.col.m16n16k16.shared.f16`: B[k, n] at
        ``array[index + n*stride + k]`` (column-major; stride in ELEMENTS)."""
        return _frag_b_lane(_strided_tile(array, index, stride, 16, 16, np.float16).T, _lane())

else:

    def _wmma_load(which: str, layout: str):
        @intrinsic
        def impl(typingctx, array, index, stride):
            _check_1d_array(f"wmma_load_{which}_f16", array, index)
            _check_scalars(f"wmma_load_{which}_f16 stride", (stride,), types.Integer, 1)
            sig = types.UniTuple(types.uint32, 8)(array, index, stride)

            def codegen(context, builder, sig, args):
                addr = _shared_u32(builder, _any_element_pointer(context, builder, sig.args[0], args[0], args[1]))
                ld = context.cast(builder, args[2], sig.args[2], types.int32)
                i32 = ir.IntType(32)
                text = (
                    f"wmma.load.{which}.sync.aligned.{layout}.m16n16k16.shared.f16 "
                    "{$0, $1, $2, $3, $4, $5, $6, $7}, [$8], $9;"
                )
                res = _asm(builder, ir.LiteralStructType([i32] * 8), [addr, ld], text, "=r," * 8 + "r,r,~{memory}", True)
                return context.make_tuple(builder, sig.return_type, [builder.extract_value(res, i) for i in range(8)])

            return sig, codegen

        return impl

    wmma_load_a_f16 = _wmma_load("a", "row")
    wmma_load_a_f16.__doc__ = """`wmma.load.a.sync.aligned.row.m16n16k16.shared.f16 {r0..r7}, [addr], stride` (PTX
        ISA §9.7.14.4.3 "wmma.load"): the 16x16 f16 A tile A[m, k] = ``array[index + m*stride + k]`` of a 1-D
        `cuda.shared.array` (32-byte aligned; ``stride`` in ELEMENTS, a multiple of 8) into 8 .f16x2 registers
        per lane. The element-to-register mapping is unspecified by the ISA (§9.7.14.4.1): pass the fragment only
        to wmma.mma. The second k-half of a 32-wide row is ``index + 16`` (elements), not ``+ 16*stride``."""

    wmma_load_b_f16 = _wmma_load("b", "col")
    wmma_load_b_f16.__doc__ = """`wmma.load.b.sync.aligned.col.m16n16k16.shared.f16 {r0..r7}, [addr], stride` (PTX
        ISA §9.7.14.4.3 "wmma.load"): the 16x16 B tile, column-major, B[k, n] = ``array[index + n*stride + k]``
        — i.e. rows of a K-major weight [n, k] tile. ``stride`` in ELEMENTS; fragment layout opaque."""


# ---- wmma.mma -------------------------------------------------------------------------------------------------

if SIMULATOR:

    def _wmma_op(slots):
        a = _a_frag_matrix([s[0:8] for s in slots])
        b = np.concatenate([_b_frag_matrix([s[8:16] for s in slots], r0) for r0 in (0, 2)], axis=1)
        c = np.concatenate([_c_frag_matrix([s[16:24] for s in slots], r0) for r0 in (0, 4)], axis=1)
        d = a @ b + c
        lo, hi = _c_frag_lanes(d[:, :8]), _c_frag_lanes(d[:, 8:])
        return [lo[lane] + hi[lane] for lane in range(32)]

    def wmma_mma_f32_f16(*regs):
        """Simulator form of `wmma.mma.sync.aligned.row.col.m16n16k16.f32.f32`: 8 A regs, 8 B regs, 8 f32
        accumulators in; 8 f32 out."""
        if len(regs) != 24:
            raise TypeError(f"wmma_mma_f32_f16 takes 24 registers (8 A, 8 B, 8 C), got {len(regs)}")
        return _warp_exchange(_wmma_op, regs)

else:

    @intrinsic
    def wmma_mma_f32_f16(
        typingctx, a0, a1, a2, a3, a4, a5, a6, a7, b0, b1, b2, b3, b4, b5, b6, b7, c0, c1, c2, c3, c4, c5, c6, c7
    ):
        """`wmma.mma.sync.aligned.row.col.m16n16k16.f32.f32 {d0..d7}, {a0..a7}, {b0..b7}, {c0..c7}` (PTX ISA
        §9.7.14.4.4 "wmma.mma"): D[16x16] = A · B + C for a whole warp, A row-major and B column-major f16
        fragments from `wmma_load_a_f16` / `wmma_load_b_f16` (8 uint32 each), C/D 8 float32 each (opaque layout,
        see `wmma_store_d_f32_*`). Takes the 24 registers flat (a0..a7, b0..b7, c0..c7); returns (d0..d7)."""
        regs = (a0, a1, a2, a3, a4, a5, a6, a7, b0, b1, b2, b3, b4, b5, b6, b7, c0, c1, c2, c3, c4, c5, c6, c7)
        _check_scalars("wmma_mma_f32_f16 (A, B)", regs[:16], types.Integer, 16)
        _check_scalars("wmma_mma_f32_f16 (C)", regs[16:], types.Float, 8)
        sig = types.UniTuple(types.float32, 8)(*regs)

        def codegen(context, builder, sig, args):
            ins = [context.cast(builder, v, t, types.uint32) for v, t in zip(args[:16], sig.args[:16])]
            ins += [context.cast(builder, v, t, types.float32) for v, t in zip(args[16:], sig.args[16:])]
            f32 = ir.FloatType()
            text = (
                "wmma.mma.sync.aligned.row.col.m16n16k16.f32.f32 {$0, $1, $2, $3, $4, $5, $6, $7}, "
                "{$8, $9, $10, $11, $12, $13, $14, $15}, {$16, $17, $18, $19, $20, $21, $22, $23}, "
                "{$24, $25, $26, $27, $28, $29, $30, $31};"
            )
            cons = ",".join(["=f"] * 8 + ["r"] * 16 + ["f"] * 8)
            res = _asm(builder, ir.LiteralStructType([f32] * 8), ins, text, cons, False)
            return context.make_tuple(builder, sig.return_type, [builder.extract_value(res, i) for i in range(8)])

        return sig, codegen


# ---- wmma.store -----------------------------------------------------------------------------------------------

if SIMULATOR:

    def _wmma_store(array, index, stride, regs):
        lane = _lane()
        g, t = lane >> 2, lane & 3
        flat = _ndarray(array).reshape(-1)
        for half in (0, 1):
            c0, c1, c2, c3 = regs[4 * half : 4 * half + 4]
            col = 8 * half + 2 * t
            flat[index + g * stride + col] = c0
            flat[index + g * stride + col + 1] = c1
            flat[index + (g + 8) * stride + col] = c2
            flat[index + (g + 8) * stride + col + 1] = c3

    def wmma_store_d_f32_shared(array, index, stride, d0, d1, d2, d3, d4, d5, d6, d7):
        """Simulator form of `wmma.store.d.sync.aligned.row.m16n16k16.shared.f32`: D[m, n] to
        ``array[index + m*stride + n]``."""
        _wmma_store(array, index, stride, (d0, d1, d2, d3, d4, d5, d6, d7))

    def wmma_store_d_f32_global(array, index, stride, d0, d1, d2, d3, d4, d5, d6, d7):
        """Simulator form of `wmma.store.d.sync.aligned.row.m16n16k16.global.f32`."""
        _wmma_store(array, index, stride, (d0, d1, d2, d3, d4, d5, d6, d7))

else:

    def _wmma_store(space: str):
        @intrinsic
        def impl(typingctx, array, index, stride, d0, d1, d2, d3, d4, d5, d6, d7):
            _check_1d_array(f"wmma_store_d_f32_{space}", array, index)
            _check_scalars(f"wmma_store_d_f32_{space} stride", (stride,), types.Integer, 1)
            _check_scalars(f"wmma_store_d_f32_{space}", (d0, d1, d2, d3, d4, d5, d6, d7), types.Float, 8)
            sig = types.void(array, index, stride, d0, d1, d2, d3, d4, d5, d6, d7)

            def codegen(context, builder, sig, args):
                ptr = _any_element_pointer(context, builder, sig.args[0], args[0], args[1])
                if space == "shared":
                    addr, cons = _shared_u32(builder, ptr), "r"
                else:
                    i8 = ir.IntType(8)
                    glob = builder.addrspacecast(ptr, ir.PointerType(i8, 1))
                    addr, cons = builder.ptrtoint(glob, ir.IntType(64)), "l"
                ld = context.cast(builder, args[2], sig.args[2], types.int32)
                vals = [context.cast(builder, v, t, types.float32) for v, t in zip(args[3:], sig.args[3:])]
                text = (
                    f"wmma.store.d.sync.aligned.row.m16n16k16.{space}.f32 [$0], "
                    "{$1, $2, $3, $4, $5, $6, $7, $8}, $9;"
                )
                _asm(builder, ir.VoidType(), [addr, *vals, ld], text, cons + "," + "f," * 8 + "r,~{memory}", True)
                return context.get_dummy_value()

            return sig, codegen

        return impl

    wmma_store_d_f32_shared = _wmma_store("shared")
    wmma_store_d_f32_shared.__doc__ = """`wmma.store.d.sync.aligned.row.m16n16k16.shared.f32 [addr], {d0..d7},
        stride` (PTX ISA §9.7.14.4.5 "wmma.store"): the warp's 16x16 f32 accumulator to D[m, n] =
        ``array[index + m*stride + n]`` of a 1-D float32 `cuda.shared.array` (``stride`` in ELEMENTS)."""

    wmma_store_d_f32_global = _wmma_store("global")
    wmma_store_d_f32_global.__doc__ = """`wmma.store.d.sync.aligned.row.m16n16k16.global.f32 [addr], {d0..d7},
        stride` (PTX ISA §9.7.14.4.5 "wmma.store"): as the shared form, into a 1-D float32 global array (no tail
        masking: the whole 16x16 tile must be in bounds)."""
