"""Warp synchronisation and exchange (`bar.warp.sync`, `shfl.sync.bfly`), named block barriers (`barrier.sync`
with an id and a thread count: a subset of the block's warps meets while the others run on), programmatic
dependent launch (`griddepcontrol.wait` / `.launch_dependents`, sm_90, and `pdl_enter`, the two at the top of a
kernel) and the GPU-scope release / acquire pair that CUDA blocks of one grid synchronise through
(`red.release.gpu.global.add.s32`, `ld.acquire.gpu.global.s32`: `kernels.grid_sync`)."""

from __future__ import annotations

from numba import cuda, types

from kernels.ptx._base import SIMULATOR, _check_1d_array, _check_scalars

if SIMULATOR:
    import numpy as np

    from kernels.ptx._base import _warp_exchange
else:
    from llvmlite import ir
    from numba.cuda.extending import intrinsic

    from kernels.ptx._base import _any_element_pointer, _asm


# ---- warp barrier and shuffle ---------------------------------------------------------------------------------

if SIMULATOR:

    def syncwarp():
        """Simulator form of `bar.warp.sync 0xffffffff`: the calling warp's 32 lanes rendezvous."""
        _warp_exchange(_NO_OP, None)

    def _NO_OP(slots):
        return slots

else:

    @intrinsic
    def syncwarp(typingctx):
        """`bar.warp.sync 0xffffffff` (PTX ISA §9.7.13.3 "bar.warp.sync"): all 32 lanes of the warp meet here, and
        their shared-memory writes before it are visible to each other after it."""
        sig = types.void()

        def codegen(context, builder, sig, args):
            _asm(builder, ir.VoidType(), [], "bar.warp.sync -1;", "~{memory}", True)
            return context.get_dummy_value()

        return sig, codegen


# ---- named barriers -------------------------------------------------------------------------------------------

if SIMULATOR:
    import threading

    from kernels.ptx._base import _BARRIER_TIMEOUT_S

    _NAMED_LOCK = threading.Lock()

    def bar_sync(barrier_id, count):
        """Simulator form of `barrier.sync.aligned id, count`: the first ``count`` threads to arrive at barrier
        ``id`` of the calling block meet (a threading barrier of ``count`` parties per block and id);
        RuntimeError after the simulator's barrier timeout."""
        manager = getattr(threading.current_thread(), "_manager", None)
        if manager is None:
            raise RuntimeError("bar_sync must be called from inside a simulated CUDA kernel")
        if not 1 <= int(barrier_id) <= 15 or int(count) % 32:
            raise ValueError(f"bar_sync: id must be 1..15 (0 is syncthreads') and count a multiple of 32, got "
                             f"{barrier_id}, {count}")
        with _NAMED_LOCK:
            named = manager.__dict__.setdefault("_minfer_named_barriers", {})
            barrier = named.get(int(barrier_id))
            if barrier is None:
                barrier = named[int(barrier_id)] = threading.Barrier(int(count))
        barrier.wait(timeout=_BARRIER_TIMEOUT_S)

else:

    @intrinsic
    def bar_sync(typingctx, barrier_id, count):
        """`barrier.sync.aligned id, count` (PTX ISA §9.7.13.1 "bar/barrier"): wait until ``count`` threads (a
        multiple of 32, whole warps) have arrived at named barrier ``id`` (1..15; 0 is ``__syncthreads``'s); their
        shared-memory writes before it are visible to each other after it. For a group of warps that synchronise
        among themselves while other warps of the block (a producer) never arrive."""
        _check_scalars("bar_sync", (barrier_id, count), types.Integer, 2)
        sig = types.void(barrier_id, count)

        def codegen(context, builder, sig, args):
            v = [context.cast(builder, x, t, types.uint32) for x, t in zip(args, sig.args)]
            _asm(builder, ir.VoidType(), v, "barrier.sync.aligned $0, $1;", "r,r,~{memory}", True)
            return context.get_dummy_value()

        return sig, codegen


# numba's CUDA simulator has no `cuda.shfl_*_sync`, hence this helper for attention's row reductions.

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


# ---- programmatic dependent launch (sm_90) --------------------------------------------------------------------

if SIMULATOR:

    def griddepcontrol_wait():
        """Simulator form of `griddepcontrol.wait`: kernels run one after another here, so nothing is in flight."""

    def griddepcontrol_launch_dependents():
        """Simulator form of `griddepcontrol.launch_dependents`: a scheduling hint, no effect on results."""

else:

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


@cuda.jit(device=True, inline="always")
def pdl_enter():
    """The first statement of a kernel that may be a programmatic dependent launch (`kernels.launch`) and touches
    nothing before it: wait for the previous kernel of the stream (`griddepcontrol_wait`), then let the next one
    start (`griddepcontrol_launch_dependents`), so that one kernel at a time waits in another's tail. Both are no-ops
    for an ordinary launch."""
    griddepcontrol_wait()
    griddepcontrol_launch_dependents()


# ---- GPU-scope release / acquire (grid-wide synchronisation through device memory) -----------------------------

def _check_int32_array(name: str, array) -> None:
    from numba.cuda.core.errors import NumbaTypeError

    if array.dtype != types.int32:
        raise NumbaTypeError(f"{name} needs an int32 array (a .s32 operation), got {array}")


if SIMULATOR:

    def red_release_gpu_add(array, index, value):
        """Simulator form of `red.release.gpu.global.add.s32`: array[index] += value. Not atomic among the threads
        of one block (the simulator runs them as Python threads): callers let one thread a block do it, as
        `kernels.grid_sync` does; blocks run one at a time there."""
        array[index] += value

    def ld_acquire_gpu(array, index):
        """Simulator form of `ld.acquire.gpu.global.s32`: array[index]."""
        return array[index]

else:

    @intrinsic
    def red_release_gpu_add(typingctx, array, index, value):
        """`red.release.gpu.global.add.s32 [addr], value` (PTX ISA §9.7.13.6 "red", §8 memory consistency model:
        release at GPU scope): atomically add ``value`` to element ``index`` of a 1-D int32 array, after every
        memory operation this thread did before it (and those it observed through a CTA barrier) is visible at GPU
        scope to a thread that acquires the sum. No result is returned (a reduction, not an atomic exchange)."""
        _check_1d_array("red_release_gpu_add", array, index)
        _check_int32_array("red_release_gpu_add", array)
        _check_scalars("red_release_gpu_add", (value,), types.Integer, 1)
        sig = types.void(array, index, value)

        def codegen(context, builder, sig, args):
            ptr = _any_element_pointer(context, builder, sig.args[0], args[0], args[1])
            v = context.cast(builder, args[2], sig.args[2], types.int32)
            _asm(builder, ir.VoidType(), [ptr, v], "red.release.gpu.global.add.s32 [$0], $1;", "l,r,~{memory}", True)
            return context.get_dummy_value()

        return sig, codegen

    @intrinsic
    def ld_acquire_gpu(typingctx, array, index):
        """`ld.acquire.gpu.global.s32 value, [addr]` (PTX ISA §9.7.9.8 "ld" with .acquire, §8: acquire at GPU scope):
        element ``index`` of a 1-D int32 array, read from the point of coherence (never a stale cached copy, so a
        spin on it ends), and no later memory operation of this thread moves before it: what a releasing thread
        wrote before its release is visible after an acquire that reads its update."""
        _check_1d_array("ld_acquire_gpu", array, index)
        _check_int32_array("ld_acquire_gpu", array)
        sig = types.int32(array, index)

        def codegen(context, builder, sig, args):
            ptr = _any_element_pointer(context, builder, sig.args[0], args[0], args[1])
            return _asm(builder, ir.IntType(32), [ptr], "ld.acquire.gpu.global.s32 $0, [$1];", "=r,l,~{memory}", True)

        return sig, codegen
