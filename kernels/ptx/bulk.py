"""Hopper (sm_90) asynchronous bulk copies and the shared-memory barriers (mbarriers) that track them; register
reallocation between warpgroups (`setmaxnreg`).

The producer side of a warp-specialised pipeline (CUTLASS sm90, FlashAttention-3): one thread arms a stage's
mbarrier with the bytes it expects (`mbarrier_arrive_expect_tx`) and issues `cp_async_bulk_g2s` copies that
complete those bytes on the barrier; consumers spin on `mbarrier_try_wait_parity` for the stage's phase and then
read the stage. A barrier's phase completes when its pending arrivals reach zero and every expected byte has
landed; waiting on parity P returns once the phase of parity P has completed (phases alternate 0, 1, 0, ...).

The simulator models the asynchrony a kernel's correctness depends on: a bulk copy's destination holds
``BULK_POISON`` bytes from issue until a thread's `mbarrier_try_wait_parity` observes the phase complete (the data
lands then), so reading a stage before waiting on its barrier fails in CI as on the GPU. `setmaxnreg_*` are no-ops
there.

Source: PTX ISA 9.x §9.7.13.15 "mbarrier" (init, arrive, expect-tx, try_wait.parity), §9.7.9.25.4.1
"cp.async.bulk", §9.7.19.5 "setmaxnreg".
"""

from __future__ import annotations

from numba import types

from kernels.ptx._base import SIMULATOR, _check_1d_array, _check_scalars

if SIMULATOR:
    import threading
    import time

    import numpy as np

    from kernels.ptx._base import _BARRIER_TIMEOUT_S, _bytes, _ndarray
else:
    from llvmlite import ir
    from numba.cuda.extending import _intrinsic, intrinsic

    from kernels.ptx._base import _any_element_pointer, _asm, _shared_u32

BULK_POISON = 0x5A
"""The byte a simulated bulk copy's destination holds from issue until a wait observes its barrier's phase
complete."""


def _check_barrier(name: str, bar, index) -> None:
    from numba.cuda.core.errors import NumbaTypeError

    _check_1d_array(name, bar, index)
    if bar.dtype != types.uint64:
        raise NumbaTypeError(f"{name} needs a 1-D uint64 shared array (one 8-byte mbarrier an element), got {bar}")


if SIMULATOR:
    _LOCK = threading.Lock()

    class _Barrier:
        """A phase completes the moment its last arrival and last expected byte are in (as on the GPU); the copies
        of completed phases land when a wait first observes a completion (until then they read as poison)."""

        def __init__(self, count: int) -> None:
            self.count = count
            self.pending = count
            self.tx = 0
            self.phase = 0  # completed phases
            self.copies: list = []  # the current phase's copies
            self.completed: list = []  # copies of completed phases no wait has observed yet

        def complete_if_done(self) -> None:
            if self.pending == 0 and self.tx == 0:
                self.completed += self.copies
                self.copies = []
                self.pending = self.count
                self.phase += 1

        def land(self) -> None:
            for dst, d0, data in self.completed:
                dst[d0 : d0 + data.size] = data
            self.completed = []

    def _barriers() -> dict:
        thread = threading.current_thread()
        manager = getattr(thread, "_manager", None)
        if manager is None:
            raise RuntimeError("mbarrier helpers must be called from inside a simulated CUDA kernel")
        return manager.__dict__.setdefault("_minfer_mbarriers", {})

    def _barrier_key(bar, index) -> int:
        """The barrier's shared-memory address: every view of the block's (dynamic or static) shared memory, as
        each simulated thread gets its own, names the same barrier."""
        return int(_ndarray(bar).ctypes.data) + 8 * int(index)

    def _barrier(bar, index) -> "_Barrier":
        key = _barrier_key(bar, index)
        state = _barriers().get(key)
        if state is None:
            raise RuntimeError(f"mbarrier {index} is used before mbarrier_init")
        return state

    def mbarrier_init(bar, index, count):
        """Simulator form of `mbarrier.init.shared::cta.b64 [bar], count`: phase 0, ``count`` pending arrivals."""
        if not 1 <= int(count) < 2**20:
            raise ValueError(f"mbarrier count must be 1..2^20-1, got {count}")
        with _LOCK:
            _barriers()[_barrier_key(bar, index)] = _Barrier(int(count))

    def mbarrier_arrive(bar, index):
        """Simulator form of `mbarrier.arrive.shared::cta.b64`: one arrival on the current phase (the last one
        with every expected byte in completes it)."""
        with _LOCK:
            state = _barrier(bar, index)
            state.pending -= 1
            state.complete_if_done()

    def mbarrier_arrive_expect_tx(bar, index, nbytes):
        """Simulator form of `mbarrier.arrive.expect_tx.shared::cta.b64`: expect ``nbytes`` more, then arrive."""
        with _LOCK:
            state = _barrier(bar, index)
            state.tx += int(nbytes)
            state.pending -= 1
            state.complete_if_done()

    def mbarrier_try_wait_parity(bar, index, parity):
        """Simulator form of `mbarrier.try_wait.parity.shared::cta.b64`: 1 once the phase of ``parity`` has
        completed (completed phases' copies land on the first observation), else 0 after yielding the interpreter;
        RuntimeError after the simulator's barrier timeout (a phase that never completes)."""
        with _LOCK:
            state = _barrier(bar, index)
            done = (state.phase & 1) != (int(parity) & 1)
            if done:
                state.land()
            outstanding = (state.pending, state.tx)
        thread = threading.current_thread()
        if done:
            thread._minfer_wait_since = None
            return np.uint32(1)
        since = getattr(thread, "_minfer_wait_since", None)
        if since is None:
            thread._minfer_wait_since = since = time.monotonic()
        elif time.monotonic() - since > _BARRIER_TIMEOUT_S:
            raise RuntimeError(f"mbarrier {index}: the phase of parity {parity} never completed ({outstanding[0]} "
                               f"arrivals and {outstanding[1]} bytes outstanding)")
        time.sleep(0)
        return np.uint32(0)

    def cp_async_bulk_g2s(dst, dst_index, src, src_index, nbytes, bar, bar_index):
        """Simulator form of `cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes`: ``nbytes`` (a
        multiple of 16; both addresses 16-byte aligned) from ``src[src_index]`` to ``dst[dst_index]``, landing when
        a wait observes the barrier's phase complete (``BULK_POISON`` until then)."""
        n = int(nbytes)
        d, s = _bytes(dst), _bytes(src)
        d0 = int(dst_index) * _ndarray(dst).itemsize
        s0 = int(src_index) * _ndarray(src).itemsize
        if n <= 0 or n % 16 or d0 % 16 or s0 % 16:
            raise ValueError(f"cp.async.bulk needs a positive multiple of 16 bytes at 16-byte aligned addresses, "
                             f"got {n} bytes at offsets {d0} / {s0}")
        if s0 + n > s.size or d0 + n > d.size:
            raise IndexError(f"cp.async.bulk of {n} bytes runs past an array ({s.size} source / {d.size} "
                             f"destination bytes)")
        _issue_copy(bar, bar_index, d, d0, s[s0 : s0 + n].copy())

    def _issue_copy(bar, bar_index, d, d0: int, data) -> None:
        """An asynchronous copy of ``data`` (uint8) to bytes ``d0 ..`` of ``d``: poison until a wait observes the
        barrier's phase complete, its bytes completed on the barrier now (shared by the bulk and tensor copies)."""
        with _LOCK:
            state = _barrier(bar, bar_index)
            d[d0 : d0 + data.size] = BULK_POISON
            state.copies.append((d, d0, data))
            state.tx -= data.size
            state.complete_if_done()

    def _check_maxnreg(n) -> None:
        if not (24 <= int(n) <= 256 and int(n) % 8 == 0):
            raise ValueError(f"setmaxnreg: the register count must be a multiple of 8 in 24..256, got {n}")

    def setmaxnreg_inc(n):
        """Simulator form of `setmaxnreg.inc.sync.aligned.u32 n`: the count is checked as the compiler does;
        registers are not modelled."""
        _check_maxnreg(n)

    def setmaxnreg_dec(n):
        """Simulator form of `setmaxnreg.dec.sync.aligned.u32 n`: the count is checked as the compiler does;
        registers are not modelled."""
        _check_maxnreg(n)

else:

    def _bar_address(context, builder, sig, args, at: int):
        return _shared_u32(builder, _any_element_pointer(context, builder, sig.args[at], args[at], args[at + 1]))

    def _u32(context, builder, value, ty):
        return context.cast(builder, value, ty, types.uint32)

    @intrinsic
    def mbarrier_init(typingctx, bar, index, count):
        """`mbarrier.init.shared::cta.b64 [bar], count` (PTX ISA §9.7.13.15.9): initialise ``bar[index]`` (a 1-D
        uint64 shared array) to phase 0 with ``count`` expected arrivals a phase (1..2^20-1). One thread initialises,
        then `fence_proxy_async_shared` (the bulk copies complete on the barrier through the async proxy, which must
        see it initialised: the CUDA programming guide's cp.async.bulk example) and a `syncthreads` before any other
        thread uses it."""
        _check_barrier("mbarrier_init", bar, index)
        _check_scalars("mbarrier_init count", (count,), types.Integer, 1)
        sig = types.void(bar, index, count)

        def codegen(context, builder, sig, args):
            addr = _bar_address(context, builder, sig, args, 0)
            _asm(builder, ir.VoidType(), [addr, _u32(context, builder, args[2], sig.args[2])],
                 "mbarrier.init.shared::cta.b64 [$0], $1;", "r,r,~{memory}", True)
            return context.get_dummy_value()

        return sig, codegen

    @intrinsic
    def mbarrier_arrive(typingctx, bar, index):
        """`mbarrier.arrive.shared::cta.b64 state, [bar]` (PTX ISA §9.7.13.15.13): one arrival on ``bar[index]``'s
        current phase (release semantics: this thread's earlier writes are visible to threads that wait on it)."""
        _check_barrier("mbarrier_arrive", bar, index)
        sig = types.void(bar, index)

        def codegen(context, builder, sig, args):
            addr = _bar_address(context, builder, sig, args, 0)
            _asm(builder, ir.IntType(64), [addr], "mbarrier.arrive.shared::cta.b64 $0, [$1];", "=l,r,~{memory}",
                 True)
            return context.get_dummy_value()

        return sig, codegen

    @intrinsic
    def mbarrier_arrive_expect_tx(typingctx, bar, index, nbytes):
        """`mbarrier.arrive.expect_tx.shared::cta.b64 state, [bar], nbytes` (PTX ISA §9.7.13.15.13, sm_90): add
        ``nbytes`` to the bytes ``bar[index]``'s current phase waits for, then arrive once. The producer arms a stage
        with it before (or after) issuing the copies that complete those bytes."""
        _check_barrier("mbarrier_arrive_expect_tx", bar, index)
        _check_scalars("mbarrier_arrive_expect_tx nbytes", (nbytes,), types.Integer, 1)
        sig = types.void(bar, index, nbytes)

        def codegen(context, builder, sig, args):
            addr = _bar_address(context, builder, sig, args, 0)
            _asm(builder, ir.IntType(64), [addr, _u32(context, builder, args[2], sig.args[2])],
                 "mbarrier.arrive.expect_tx.shared::cta.b64 $0, [$1], $2;", "=l,r,r,~{memory}", True)
            return context.get_dummy_value()

        return sig, codegen

    @intrinsic
    def mbarrier_try_wait_parity(typingctx, bar, index, parity):
        """`mbarrier.try_wait.parity.shared::cta.b64 p, [bar], parity` (PTX ISA §9.7.13.15.16, sm_90): 1 (uint32)
        once the phase of ``bar[index]`` with parity ``parity`` (0 or 1) has completed, else 0 after a bounded,
        hardware-chosen wait; loop on it (acquire semantics: the phase's copies and the arrivers' writes are
        visible after a 1)."""
        _check_barrier("mbarrier_try_wait_parity", bar, index)
        _check_scalars("mbarrier_try_wait_parity parity", (parity,), types.Integer, 1)
        sig = types.uint32(bar, index, parity)

        def codegen(context, builder, sig, args):
            addr = _bar_address(context, builder, sig, args, 0)
            text = ("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [$1], $2; selp.u32 $0, 1, 0, p; }")
            return _asm(builder, ir.IntType(32), [addr, _u32(context, builder, args[2], sig.args[2])], text,
                        "=r,r,r,~{memory}", True)

        return sig, codegen

    @intrinsic
    def cp_async_bulk_g2s(typingctx, dst, dst_index, src, src_index, nbytes, bar, bar_index):
        """`cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [dst], [src], nbytes, [bar]` (PTX
        ISA §9.7.9.25.4.1, sm_90): an asynchronous bulk copy of ``nbytes`` (a multiple of 16) from ``src[src_index]``
        (1-D global array) to ``dst[dst_index]`` (1-D shared array), both 16-byte aligned, that completes its bytes
        on ``bar[bar_index]``: no tensor map, one contiguous range. Issued by one thread; the barrier's phase must
        expect the bytes (`mbarrier_arrive_expect_tx`)."""
        _check_1d_array("cp_async_bulk_g2s dst", dst, dst_index)
        _check_1d_array("cp_async_bulk_g2s src", src, src_index)
        _check_scalars("cp_async_bulk_g2s nbytes", (nbytes,), types.Integer, 1)
        _check_barrier("cp_async_bulk_g2s bar", bar, bar_index)
        sig = types.void(dst, dst_index, src, src_index, nbytes, bar, bar_index)

        def codegen(context, builder, sig, args):
            d = _shared_u32(builder, _any_element_pointer(context, builder, sig.args[0], args[0], args[1]))
            s = _any_element_pointer(context, builder, sig.args[2], args[2], args[3])
            n = _u32(context, builder, args[4], sig.args[4])
            b = _bar_address(context, builder, sig, args, 5)
            text = "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [$0], [$1], $2, [$3];"
            _asm(builder, ir.VoidType(), [d, s, n, b], text, "r,l,r,r,~{memory}", True)
            return context.get_dummy_value()

        return sig, codegen

    def _setmaxnreg(direction: str):
        def impl(typingctx, n):
            from numba.cuda.core.errors import NumbaTypeError

            if not isinstance(n, types.IntegerLiteral):
                raise NumbaTypeError(f"setmaxnreg_{direction} needs a compile-time integer constant, got {n}")
            count = int(n.literal_value)
            if not (24 <= count <= 256 and count % 8 == 0):
                raise NumbaTypeError(f"setmaxnreg_{direction}: the register count must be a multiple of 8 in "
                                     f"24..256, got {count}")
            sig = types.void(n)

            def codegen(context, builder, sig, args):
                _asm(builder, ir.VoidType(), [], f"setmaxnreg.{direction}.sync.aligned.u32 {count};", "~{memory}",
                     True)
                return context.get_dummy_value()

            return sig, codegen

        impl.__name__ = f"setmaxnreg_{direction}"
        impl.__doc__ = (f"`setmaxnreg.{direction}.sync.aligned.u32 N` (PTX ISA §9.7.19.5, sm_90a): every warp of the "
                        f"warpgroup {'raises' if direction == 'inc' else 'lowers'} its per-thread register limit to "
                        "N (a compile-time multiple of 8 in 24..256): producer warpgroups give registers to the "
                        "consumers'.")
        return _intrinsic(target="cuda", prefer_literal=True)(impl)

    setmaxnreg_inc = _setmaxnreg("inc")
    setmaxnreg_dec = _setmaxnreg("dec")
