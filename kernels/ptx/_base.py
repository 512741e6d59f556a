"""What every family of `kernels.ptx` shares: the simulator flag, typing-time argument checks, the codegen helpers
of the compiled forms (inline asm, element pointers, shared-window addresses) and, for the simulator forms, the
per-warp rendezvous and the numpy views of simulated arrays.

Register conventions shared by every helper of the package. A ".f16x2" register is a uint32 holding two f16: the
element with the LOWER column/row index in bits 0..15, the next one in bits 16..31 (PTX ISA §5.2.4 "Packed data
types"). In the fragment tables, for lane l of the warp: g = l >> 2 ("groupID"), t = l & 3 ("threadID_in_group").
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


if SIMULATOR:
    # Simulator forms of the warp-wide instructions (mma, wmma.mma, ldmatrix, shfl, bar.warp.sync) need all 32
    # lanes' registers: each lane deposits its operands in a per-warp exchange and waits on a per-warp barrier
    # (`threading.Barrier` of 32 parties, one per warp of the simulated block). One lane, the last to arrive,
    # computes the whole warp's result before anyone is released. Restrictions, all of which the hardware imposes
    # too (".sync.aligned"): the block's thread count must be a multiple of 32, and all 32 lanes of a warp must
    # call the same helper at the same point (no divergence around it). Lanes of different warps need not be in
    # step (the barrier is per warp, not the block's `syncthreads`).
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

else:
    from llvmlite import ir
    from numba.cuda import cgutils

    def _asm(builder, ret, args, text, constraints, side_effect):
        fnty = ir.FunctionType(ret, [a.type for a in args])
        return builder.call(ir.InlineAsm(fnty, text, constraints, side_effect=side_effect), args)

    def _element_pointer(context, builder, array_type, array, index):
        struct = context.make_array(array_type)(context, builder, value=array)
        return cgutils.get_item_pointer(context, builder, array_type, struct, [index], wraparound=False)

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

    def _shared_base_u32(context, builder, array_type, array):
        """The 32-bit shared-window address of a 1-D shared array's first byte (base of the byte-offset forms)."""
        struct = context.make_array(array_type)(context, builder, value=array)
        return _shared_u32(builder, struct.data)
