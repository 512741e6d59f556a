"""Inline-PTX helpers for numba.cuda kernels, each with a CUDA-simulator fallback of the same semantics.

Pattern (numba-cuda's own `cache_hints.py`): a plain stub whose docstring names the instruction and its PTX ISA
section, an `@intrinsic` that validates its argument types at typing time and emits `llvmlite.ir.InlineAsm`,
multi-result instructions returned through a `LiteralStructType` and `extract_value`.

Under `NUMBA_ENABLE_CUDASIM=1` (read once, at import) kernels run as Python: each helper is then a Python
function computing exactly what the instruction computes, per lane.

Source: PTX ISA 9.x (https://docs.nvidia.com/cuda/parallel-thread-execution/).
"""

from __future__ import annotations

from numba import cuda, types
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
    from numba.cuda.extending import _intrinsic, intrinsic

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


# ------------------------------------------------------------------------------------------------------------
# Tensor-core helpers (sm_80+, checked for sm_90): mma.sync m16n8k16, wmma m16n16k16, ldmatrix, cp.async.
#
# Register conventions shared by every helper below. A ".f16x2" register is a uint32 holding two f16: the element
# with the LOWER column/row index in bits 0..15, the next one in bits 16..31 (PTX ISA §5.2.4 "Packed data types").
# In the fragment tables, for lane l of the warp: g = l >> 2 ("groupID"), t = l & 3 ("threadID_in_group").
#
# Simulator fallbacks of the warp-wide instructions (mma, wmma.mma, ldmatrix) need all 32 lanes' registers:
# each lane deposits its operands in a per-warp exchange and waits on a per-warp barrier (`threading.Barrier`
# of 32 parties, one per warp of the simulated block). One lane, the last to arrive, computes the whole warp's
# result before anyone is released. Restrictions, all of which the hardware imposes too (".sync.aligned"): the
# block's thread count must be a multiple of 32, and all 32 lanes of a warp must call the same helper at the same
# point (no divergence around it). Lanes of different warps need not be in step (the barrier is per warp, not
# the block's `syncthreads`).
# ------------------------------------------------------------------------------------------------------------


def _check_1d_array(name: str, array, index) -> None:
    from numba.cuda.core.errors import NumbaTypeError

    if not (isinstance(array, types.Array) and array.ndim == 1 and array.layout in "CA"):
        raise NumbaTypeError(f"{name} needs a 1-D contiguous array, got {array}")
    if not isinstance(index, types.Integer):
        raise NumbaTypeError(f"{name} needs an integer element index, got {index}")


def _check_scalars(name: str, values, kind, count: int) -> None:
    from numba.cuda.core.errors import NumbaTypeError

    if len(values) != count:
        raise NumbaTypeError(f"{name} takes {count} register operands here, got {len(values)}")
    for v in values:
        if not isinstance(v, kind):
            raise NumbaTypeError(f"{name}: every register operand must be {kind.__name__}, got {v}")


CP_ASYNC_POISON = 0xA5
"""The byte a simulated ``cp.async`` destination holds from the copy's issue until the `cp_async_wait_group` that
retires its group (then the data lands): a kernel that reads a slot too early decodes this, not the weights."""

if SIMULATOR:
    import threading

    import numpy as np

    _WARPS_LOCK = threading.Lock()
    _BARRIER_TIMEOUT_S = 600.0

    class _WarpExchange:
        """All-lanes rendezvous of one simulated warp: each lane posts its operands, the last lane to arrive
        runs ``op(slots) -> per-lane results`` once, then all 32 are released with their own result.

        One barrier per call suffices: results are replaced only when all 32 lanes have arrived at the NEXT
        call, by which time each has read its result of this one."""

        def __init__(self) -> None:
            self.slots: list = [None] * 32
            self.op = None
            self.results: list = [None] * 32
            self.barrier = threading.Barrier(32, action=self._compute, timeout=_BARRIER_TIMEOUT_S)

        def _compute(self) -> None:
            self.results = self.op(self.slots)

        def run(self, lane: int, op, value):
            self.slots[lane] = value
            self.op = op
            self.barrier.wait()
            return self.results[lane]

    def _warp_exchange(op, value):
        """Run ``op`` over the 32 lanes' ``value``s of the calling simulated warp; return this lane's result."""
        thread = threading.current_thread()
        manager = getattr(thread, "_manager", None)
        if manager is None:
            raise RuntimeError("warp-level PTX fallbacks must be called from inside a simulated CUDA kernel")
        nthreads = int(np.prod(manager._block_dim))
        if nthreads % 32:
            raise RuntimeError(f"warp-level PTX fallbacks need whole warps; the block has {nthreads} threads")
        with _WARPS_LOCK:
            warps = manager.__dict__.setdefault("_minfer_warps", {})
            warp = warps.get(thread.thread_id // 32)
            if warp is None:
                warp = warps[thread.thread_id // 32] = _WarpExchange()
        return warp.run(thread.thread_id % 32, op, value)

    def _ndarray(array):
        """The numpy array behind a simulator kernel argument (FakeWithinKernelCUDAArray) or shared array."""
        inner = getattr(array, "_item", None)
        if inner is not None:
            return inner._ary
        return np.asarray(array)

    def _bytes(array):
        return _ndarray(array).reshape(-1).view(np.uint8)

    def _h2(lo, hi) -> int:
        return int(lo) | (int(hi) << 16)

    def _unpack_h(reg) -> tuple:
        bits = np.array([int(reg) & 0xFFFF, (int(reg) >> 16) & 0xFFFF], dtype=np.uint16)
        return bits.view(np.float16)

    # ---- scalar helpers ----------------------------------------------------------------------------------

    def pack_f16x2(lo, hi):
        """Simulator form of `mov.b32 d, {lo, hi}`: two f16 packed in one uint32 (``lo`` in bits 0..15)."""
        bits = np.array([lo, hi], dtype=np.float16).view(np.uint16)
        return np.uint32(_h2(bits[0], bits[1]))

    def unpack_f16x2(reg):
        """Simulator form of `mov.b32 {lo, hi}, r`: the two f16 of a packed uint32, low half first."""
        lo, hi = _unpack_h(reg)
        return np.float16(lo), np.float16(hi)

    def shared_addr(array, index):
        """Simulator form of `cvta.to.shared`: there are no addresses here; the byte offset of the element."""
        return np.uint32(index * _ndarray(array).itemsize)

    def opaque_u32(x):
        """Simulator form of `opaque_u32`: the value itself, as uint32."""
        return np.uint32(int(x) & 0xFFFFFFFF)

    def syncwarp():
        """Simulator form of `bar.warp.sync 0xffffffff`: the calling warp's 32 lanes rendezvous."""
        _warp_exchange(_NO_OP, None)

    def _NO_OP(slots):
        return slots

    def griddepcontrol_wait():
        """Simulator form of `griddepcontrol.wait`: kernels run one after another here, so nothing is in flight."""

    def griddepcontrol_launch_dependents():
        """Simulator form of `griddepcontrol.launch_dependents`: a scheduling hint, no effect on results."""

    # ---- mma.sync m16n8k16 -------------------------------------------------------------------------------

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

    # ---- ldmatrix ------------------------------------------------------------------------------------------

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

    # ---- wmma m16n16k16 ------------------------------------------------------------------------------------
    # The hardware's wmma fragment layout is unspecified (PTX ISA §9.7.14.4: "the mapping of matrix elements
    # into fragments is ... unspecified"); code must only pass fragments between wmma instructions. The
    # simulator uses the mma.m16n8k16 layouts: A regs 0..3 = the A fragment, B regs 0..1 / 2..3 = the B fragment
    # of columns 0..7 / 8..15, accumulator regs 0..3 / 4..7 = the C fragment of columns 0..7 / 8..15; A and B
    # regs 4..7 repeat 0..3 (the hardware also holds 8 registers per lane for 4 registers' worth of data).

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

    # ---- cp.async ------------------------------------------------------------------------------------------

    # The simulator's cp.async is asynchronous in the way that matters for a kernel's correctness: at issue the
    # 16 destination bytes become undefined (``CP_ASYNC_POISON``), and the data lands only when this thread's
    # `cp_async_wait_group` retires the group holding the copy. A read before the wait, a wrong wait count or a
    # slot refilled before it was read then gives wrong results in the simulator too, as it would on the GPU.

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

    def cp_async_commit_group():
        """Simulator form of `cp.async.commit_group`: close this thread's open group of copies."""
        open_group, committed = _cp_async_groups()
        committed.append(list(open_group))
        open_group.clear()

    def cp_async_wait_group(n):
        """Simulator form of `cp.async.wait_group N`: land every copy of this thread's committed groups but the
        newest ``n``."""
        committed = _cp_async_groups()[1]
        while len(committed) > int(n):
            for d, d0, data in committed.pop(0):
                d[d0 : d0 + 16] = data


    # ---- byte-offset forms (32-bit shared offsets, 64-bit global byte offsets) ----------------------------

    def ldmatrix_x4_off(array, byte_offset):
        """Simulator form of `ldmatrix_x4_off`: as `ldmatrix_x4` with the lane's row given as a BYTE offset
        into ``array`` (16-byte aligned)."""
        return _warp_exchange(_LDMATRIX, (array, int(byte_offset) // _ndarray(array).itemsize))

    def cp_async_16_off(dst, dst_byte_offset, src, src_byte_offset, src_size):
        """Simulator form of `cp_async_16_off`: as `cp_async_16` with both places given as BYTE offsets."""
        d0 = int(dst_byte_offset)
        s0 = int(src_byte_offset)
        if d0 % 16 or s0 % 16:
            raise ValueError(f"cp.async needs 16-byte aligned places, got dst +{d0}, src +{s0}")
        _cp_async_issue(_bytes(dst), d0, _bytes(src), s0, int(src_size))

    # ---- 16-byte vector loads / stores of any element type -----------------------------------------------

    def ld_global_v2_b32(array, index):
        """Simulator form of `ld.global.v2.b32`: the 8 bytes starting at element ``index`` as 2 uint32. Bytes past
        the array's end raise IndexError here (on the GPU they would be read from past the allocation)."""
        s0 = index * _ndarray(array).itemsize
        b = _bytes(array)
        if s0 < 0 or s0 + 8 > b.size:
            raise IndexError(f"ld.global.v2.b32 of bytes {s0}..{s0 + 7} outside the array's {b.size} bytes")
        words = b[s0 : s0 + 8].copy().view(np.uint32)
        return np.uint32(words[0]), np.uint32(words[1])

    def ld_global_v4_b32(array, index):
        """Simulator form of `ld.global.v4.b32`: the 16 bytes starting at element ``index`` as 4 uint32."""
        s0 = index * _ndarray(array).itemsize
        words = _bytes(array)[s0 : s0 + 16].copy().view(np.uint32)
        return tuple(np.uint32(w) for w in words)

    def st_shared_v4_b32(array, index, x0, x1, x2, x3):
        """Simulator form of `st.shared.v4.b32`: 4 uint32 to the 16 bytes starting at element ``index``."""
        d0 = index * _ndarray(array).itemsize
        _bytes(array)[d0 : d0 + 16] = np.array([x0, x1, x2, x3], dtype=np.uint32).view(np.uint8)

else:

    def _any_element_pointer(context, builder, array_type, array, index):
        """Generic i8* to element ``index`` of a 1-D array (any dtype)."""
        ptr = _element_pointer(context, builder, array_type, array, index)
        return builder.bitcast(ptr, ir.IntType(8).as_pointer())

    def _shared_u32(builder, generic_ptr):
        """The 32-bit shared-window address of a generic pointer into shared memory (`cvta.to.shared`)."""
        i8 = ir.IntType(8)
        generic = builder.bitcast(generic_ptr, i8.as_pointer())
        shared = builder.addrspacecast(generic, ir.PointerType(i8, 3))
        return builder.ptrtoint(shared, ir.IntType(32))

    def _asm(builder, ret, args, text, constraints, side_effect):
        fnty = ir.FunctionType(ret, [a.type for a in args])
        return builder.call(ir.InlineAsm(fnty, text, constraints, side_effect=side_effect), args)

    # ---- scalar helpers ----------------------------------------------------------------------------------

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

    @intrinsic
    def syncwarp(typingctx):
        """`bar.warp.sync 0xffffffff` (PTX ISA §9.7.13.3 "bar.warp.sync"): all 32 lanes of the warp meet here, and
        their shared-memory writes before it are visible to each other after it."""
        sig = types.void()

        def codegen(context, builder, sig, args):
            _asm(builder, ir.VoidType(), [], "bar.warp.sync -1;", "~{memory}", True)
            return context.get_dummy_value()

        return sig, codegen

    # ---- programmatic dependent launch (sm_90) -------------------------------------------------------------

    @intrinsic
    def griddepcontrol_wait(typingctx):
        """`griddepcontrol.wait` (PTX ISA, parallel synchronization instructions: "griddepcontrol"; sm_90, PTX 7.8):
        wait until every prerequisite grid in flight (the kernel before this one in the stream, when this one was
        launched with programmatic stream serialization: `kernels.launch`) has completed and its memory operations
        are visible. Returns at once when there is none (an ordinary launch). Every read of what an earlier kernel writes, and every write of what it
        reads or writes, must come after it; a memory clobber keeps the compiler from moving accesses across."""
        sig = types.void()

        def codegen(context, builder, sig, args):
            _asm(builder, ir.VoidType(), [], "griddepcontrol.wait;", "~{memory}", True)
            return context.get_dummy_value()

        return sig, codegen

    @intrinsic
    def griddepcontrol_launch_dependents(typingctx):
        """`griddepcontrol.launch_dependents` (PTX ISA "griddepcontrol"; sm_90, PTX 7.8): allow the next kernel of
        the stream, if launched with programmatic stream serialization, to start before this grid ends (its CUDA
        blocks take SM slots as this grid's blocks leave them). A scheduling hint: the dependent kernel's
        `griddepcontrol_wait` still waits for this grid's completion."""
        sig = types.void()

        def codegen(context, builder, sig, args):
            _asm(builder, ir.VoidType(), [], "griddepcontrol.launch_dependents;", "~{memory}", True)
            return context.get_dummy_value()

        return sig, codegen

    # ---- mma.sync m16n8k16 -------------------------------------------------------------------------------

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

    # ---- ldmatrix ------------------------------------------------------------------------------------------

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

    # ---- wmma m16n16k16 ------------------------------------------------------------------------------------

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

    # ---- cp.async ------------------------------------------------------------------------------------------

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

    @intrinsic
    def cp_async_commit_group(typingctx):
        """`cp.async.commit_group` (PTX ISA §9.7.9.25.3.2): close the group of this thread's cp.async issued
        since the last commit."""
        sig = types.void()

        def codegen(context, builder, sig, args):
            _asm(builder, ir.VoidType(), [], "cp.async.commit_group;", "~{memory}", True)
            return context.get_dummy_value()

        return sig, codegen

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


    # ---- byte-offset forms (32-bit shared offsets, 64-bit global byte offsets) ----------------------------
    # The index forms above take an element index and build the address through a 64-bit GEP (numba widens
    # every integer to int64): in an unrolled GEMM main loop that is several 64-bit IMAD/LEA/SHF per access.
    # These take the offset in BYTES from the array's start; a shared offset is truncated to 32 bits and added
    # to the 32-bit shared-window address of the array (`cvta.to.shared` of a loop-invariant base), so a
    # kernel can precompute per-lane offsets once and let ptxas fold constant parts into the instruction's
    # immediate ([reg+imm]).

    def _shared_base_u32(context, builder, array_type, array):
        struct = context.make_array(array_type)(context, builder, value=array)
        return _shared_u32(builder, struct.data)

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

    # ---- 16-byte vector loads / stores of any element type -----------------------------------------------

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


# ------------------------------------------------------------------------------------------------------------
# Warp shuffle (added for attention's row reductions; numba's CUDA simulator has no `cuda.shfl_*_sync`).
# ------------------------------------------------------------------------------------------------------------

if SIMULATOR:

    def _shfl_xor_op(slots):
        return [slots[lane ^ (int(slots[lane][1]) & 31)][0] for lane in range(32)]

    def shfl_xor_f32(value, lane_mask):
        """Simulator form of `shfl.sync.bfly.b32 d, a, lane_mask, 0x1f, 0xffffffff`: lane l gets the ``value`` of
        lane l ^ lane_mask (all 32 lanes rendezvous, as for mma)."""
        return np.float32(_warp_exchange(_shfl_xor_op, (np.float32(value), lane_mask)))

else:

    @intrinsic
    def shfl_xor_f32(typingctx, value, lane_mask):
        """`shfl.sync.bfly.b32 d, a, lane_mask, 0x1f, 0xffffffff` (PTX ISA §9.7.9.6 "shfl.sync", .bfly mode): lane
        l receives the float32 ``value`` of lane l ^ lane_mask; the whole warp must take part (converged). The
        butterfly for warp reductions: ``x = max(x, shfl_xor_f32(x, 1))`` etc."""
        _check_scalars("shfl_xor_f32 value", (value,), types.Float, 1)
        _check_scalars("shfl_xor_f32 lane_mask", (lane_mask,), types.Integer, 1)
        sig = types.float32(value, lane_mask)

        def codegen(context, builder, sig, args):
            f = context.cast(builder, args[0], sig.args[0], types.float32)
            m = context.cast(builder, args[1], sig.args[1], types.uint32)
            i32 = ir.IntType(32)
            bits = builder.bitcast(f, i32)
            res = _asm(builder, i32, [bits, m], "shfl.sync.bfly.b32 $0, $1, $2, 0x1f, 0xffffffff;", "=r,r,r", True)
            return builder.bitcast(res, ir.FloatType())

        return sig, codegen


# ------------------------------------------------------------------------------------------------------------
# Integer dot products (added for the MMVQ mat-vec: int8 activations x 4/6/8-bit weights).
# ------------------------------------------------------------------------------------------------------------

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


# ------------------------------------------------------------------------------------------------------------
# Cache hints (added for the mat-vec: the TMA engine streams a CUDA block's weight rows into L2).
# ------------------------------------------------------------------------------------------------------------

if SIMULATOR:

    def prefetch_l2_bulk(array, byte_begin, byte_end):
        """Simulator form of `cp.async.bulk.prefetch.L2.global`: a cache hint, so no visible effect; the operands
        are checked as on the device (the range inside the array and at least 32 bytes long)."""
        nbytes = _ndarray(array).nbytes
        if not 0 <= int(byte_begin) and int(byte_begin) + 32 <= int(byte_end) <= nbytes:
            raise IndexError(f"prefetch_l2_bulk: bytes [{byte_begin}, {byte_end}) are not a range of at least 32 "
                             f"bytes inside the array's {nbytes}")

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


@cuda.jit(device=True, inline="always")
def pdl_enter():
    """The first statement of a kernel that may be a programmatic dependent launch (`kernels.launch`) and touches
    nothing before it: wait for the previous kernel of the stream (`griddepcontrol_wait`), then let the next one
    start (`griddepcontrol_launch_dependents`), so that one kernel at a time waits in another's tail. Both are no-ops
    for an ordinary launch."""
    griddepcontrol_wait()
    griddepcontrol_launch_dependents()
