"""`cp.async`: asynchronous 16-byte copies global -> shared (element-index and byte-offset forms) and the
commit / wait of their groups.

The simulator's cp.async is asynchronous in the way that matters for a kernel's correctness: at issue the 16
destination bytes become undefined (``CP_ASYNC_POISON``), and the data lands only when this thread's
`cp_async_wait_group` retires the group holding the copy. A read before the wait, a wrong wait count or a slot
refilled before it was read then gives wrong results in the simulator too, as it would on the GPU.
"""

from __future__ import annotations

from numba import types

from kernels.ptx._base import SIMULATOR, _check_1d_array, _check_scalars

if SIMULATOR:
    import threading

    import numpy as np

    from kernels.ptx._base import _bytes, _ndarray
else:
    from llvmlite import ir
    from numba.cuda.extending import _intrinsic, intrinsic

    from kernels.ptx._base import _any_element_pointer, _asm, _shared_base_u32, _shared_u32

CP_ASYNC_POISON = 0xA5
"""The byte a simulated ``cp.async`` destination holds from the copy's issue until the `cp_async_wait_group` that
retires its group (then the data lands): a kernel that reads a slot too early decodes this, not the weights."""

if SIMULATOR:

    def _cp_async_groups():
        """This simulated thread's (open group, committed groups) of pending copies."""
        thread = threading.current_thread()
        state = getattr(thread, "_minfer_cp_async", None)
        if state is None:
            state = thread._minfer_cp_async = ([], [])
        return state

    def _cp_async_issue(d, d0, s, s0, n):
        if not 0 <= n <= 16:
            raise ValueError(f"cp.async src-size must be 0..16 bytes, got {n}")
        data = np.zeros(16, dtype=np.uint8)
        data[:n] = s[s0 : s0 + n]
        d[d0 : d0 + 16] = CP_ASYNC_POISON
        _cp_async_groups()[0].append((d, d0, data))

    def cp_async_16(dst, dst_index, src, src_index, src_size):
        """Simulator form of `cp.async.cg.shared.global [dst], [src], 16, src_size`: ``src_size`` bytes (0..16)
        and zero-fill of the rest of the 16-byte chunk, landing at this thread's `cp_async_wait_group` that
        retires its group (until then the destination holds ``CP_ASYNC_POISON``)."""
        _cp_async_issue(_bytes(dst), dst_index * _ndarray(dst).itemsize, _bytes(src),
                        src_index * _ndarray(src).itemsize, int(src_size))

else:

    @intrinsic
    def cp_async_16(typingctx, dst, dst_index, src, src_index, src_size):
        """`cp.async.cg.shared.global [dst], [src], 16, src_size` (PTX ISA §9.7.9.25.3.1 "cp.async"): an
        asynchronous 16-byte copy global -> shared, bypassing L1 (.cg). ``dst[dst_index]`` (1-D shared array) and
        ``src[src_index]`` (1-D global array) must be 16-byte aligned. Only ``src_size`` bytes (0..16) are read;
        the rest of the 16 are zero-filled — src_size 0 is the branch-free way to zero a tile's out-of-bounds
        chunks (the source address must still be a valid one). Complete with commit_group + wait_group."""
        _check_1d_array("cp_async_16 dst", dst, dst_index)
        _check_1d_array("cp_async_16 src", src, src_index)
        _check_scalars("cp_async_16 src_size", (src_size,), types.Integer, 1)
        sig = types.void(dst, dst_index, src, src_index, src_size)

        def codegen(context, builder, sig, args):
            d = _shared_u32(builder, _any_element_pointer(context, builder, sig.args[0], args[0], args[1]))
            s = _any_element_pointer(context, builder, sig.args[2], args[2], args[3])
            n = context.cast(builder, args[4], sig.args[4], types.uint32)
            text = "cp.async.cg.shared.global [$0], [$1], 16, $2;"
            _asm(builder, ir.VoidType(), [d, s, n], text, "r,l,r,~{memory}", True)
            return context.get_dummy_value()

        return sig, codegen


if SIMULATOR:

    def cp_async_commit_group():
        """Simulator form of `cp.async.commit_group`: close this thread's open group of copies."""
        open_group, committed = _cp_async_groups()
        committed.append(list(open_group))
        open_group.clear()

else:

    @intrinsic
    def cp_async_commit_group(typingctx):
        """`cp.async.commit_group` (PTX ISA §9.7.9.25.3.2): close the group of this thread's cp.async issued
        since the last commit."""
        sig = types.void()

        def codegen(context, builder, sig, args):
            _asm(builder, ir.VoidType(), [], "cp.async.commit_group;", "~{memory}", True)
            return context.get_dummy_value()

        return sig, codegen


if SIMULATOR:

    def cp_async_wait_group(n):
        """Simulator form of `cp.async.wait_group N`: land every copy of this thread's committed groups but the
        newest ``n``."""
        committed = _cp_async_groups()[1]
        while len(committed) > int(n):
            for d, d0, data in committed.pop(0):
                d[d0 : d0 + 16] = data

else:

    @_intrinsic(target="cuda", prefer_literal=True)
    def cp_async_wait_group(typingctx, n):
        """`cp.async.wait_group N` (PTX ISA §9.7.9.25.3.3): wait until at most N of this thread's committed
        cp.async groups are pending. N must be a compile-time integer constant (a literal or a closure constant);
        a `syncthreads` is still needed before other threads read the data."""
        from numba.cuda.core.errors import NumbaTypeError

        if not isinstance(n, types.IntegerLiteral):
            raise NumbaTypeError(f"cp_async_wait_group needs a compile-time integer constant, got {n}")
        count = int(n.literal_value)
        if not 0 <= count <= 7:
            raise NumbaTypeError(f"cp_async_wait_group: N must be 0..7, got {count}")
        sig = types.void(n)

        def codegen(context, builder, sig, args):
            _asm(builder, ir.VoidType(), [], f"cp.async.wait_group {count};", "~{memory}", True)
            return context.get_dummy_value()

        return sig, codegen


# ---- byte-offset form (32-bit shared offset, 64-bit global byte offset) ---------------------------------------
# `cp_async_16` takes element indices and builds each address through a 64-bit GEP (numba widens every integer to
# int64): in an unrolled GEMM main loop that is several 64-bit IMAD/LEA/SHF per access. This form takes offsets in
# BYTES from the arrays' starts; the shared offset is truncated to 32 bits and added to the 32-bit shared-window
# address of the array (`cvta.to.shared` of a loop-invariant base), so a kernel can precompute per-lane offsets
# once and let ptxas fold constant parts into the instruction's immediate ([reg+imm]). `ldmatrix_x4_off`
# (kernels.ptx.mma) is the same idea for ldmatrix.

if SIMULATOR:

    def cp_async_16_off(dst, dst_byte_offset, src, src_byte_offset, src_size):
        """Simulator form of `cp_async_16_off`: as `cp_async_16` with both places given as BYTE offsets."""
        d0 = int(dst_byte_offset)
        s0 = int(src_byte_offset)
        if d0 % 16 or s0 % 16:
            raise ValueError(f"cp.async needs 16-byte aligned places, got dst +{d0}, src +{s0}")
        _cp_async_issue(_bytes(dst), d0, _bytes(src), s0, int(src_size))

else:

    @intrinsic
    def cp_async_16_off(typingctx, dst, dst_byte_offset, src, src_byte_offset, src_size):
        """`cp.async.cg.shared.global [dst], [src], 16, src_size` (PTX ISA §9.7.9.25.3.1 "cp.async"), as
        `cp_async_16` but with both places given as BYTE offsets: ``dst_byte_offset`` (truncated to 32 bits)
        from the start of the 1-D shared array ``dst``, ``src_byte_offset`` (64-bit) from the start of the 1-D
        global array ``src``. Both 16-byte aligned; src-size 0..16, the rest zero-filled."""
        _check_1d_array("cp_async_16_off dst", dst, dst_byte_offset)
        _check_1d_array("cp_async_16_off src", src, src_byte_offset)
        _check_scalars("cp_async_16_off src_size", (src_size,), types.Integer, 1)
        sig = types.void(dst, dst_byte_offset, src, src_byte_offset, src_size)

        def codegen(context, builder, sig, args):
            base = _shared_base_u32(context, builder, sig.args[0], args[0])
            d = builder.add(base, context.cast(builder, args[1], sig.args[1], types.uint32))
            struct = context.make_array(sig.args[2])(context, builder, value=args[2])
            i8p = ir.IntType(8).as_pointer()
            s = builder.gep(builder.bitcast(struct.data, i8p), [context.cast(builder, args[3], sig.args[3], types.int64)])
            n = context.cast(builder, args[4], sig.args[4], types.uint32)
            text = "cp.async.cg.shared.global [$0], [$1], 16, $2;"
            _asm(builder, ir.VoidType(), [d, s, n], text, "r,l,r,~{memory}", True)
            return context.get_dummy_value()

        return sig, codegen
