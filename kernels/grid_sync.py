"""Grid-wide synchronisation inside one kernel, and the phase chain that times it against kernel boundaries.

A persistent decode kernel (issue 18's moonshot) replaces the kernel boundaries between a layer's steps with
barriers among its own CUDA blocks. `grid_barrier` is that barrier: thread 0 of every block adds 1 to a device
counter with GPU-scope release semantics (`kernels.ptx.red_release_gpu_add`) and spins until the counter reaches
``blocks * generation`` with acquire loads (`kernels.ptx.ld_acquire_gpu`); CTA barriers before and after carry the
order to the block's other threads. It is only correct when every block of the grid is resident at once (a block
that never starts never arrives): `co_resident_blocks` says how many can be, from the compiled kernel's resources,
and `phase_chain` refuses a grid above it before launching. Every spin is bounded: after ``spins`` polls the block
records the generation it gave up on in a watchdog word and goes on, so a broken barrier reports (`WatchdogError`)
instead of hanging the GPU (and releases the other blocks: no later barrier of the launch waits).

The phase chain (experiment `sync`): P dependent phases over an n-float vector, each as decode's RMSNorm does it
(every CUDA block reduces the whole input's sum of squares, then scales its share: x' = x * w_p / rms(x)), run as P
kernel launches (MODE launch), P programmatic dependent launches (MODE pdl, `kernels.launch`), or one persistent
kernel with a grid barrier between phases (MODE grid). Its time / P is what one dependent step costs each way.

Sources: PTX ISA §8 (memory consistency model: release / acquire patterns at GPU scope), §9.7.13.6 (red), §9.7.9.8
(ld); CUDA Programming Guide, "Programmatic Dependent Launch", and the cooperative-groups grid sync it replaces
(here without a cooperative launch, so the grid can be replayed in a CUDA graph).
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, int32, types

from kernels.errors import KernelConstraintError
from kernels.jit import kernel
from kernels.launch import launch_kernel
from kernels.ptx import SIMULATOR, ld_acquire_gpu, pdl_enter, red_release_gpu_add, shfl_xor_f32

THREADS = 128
"""Threads per CUDA block of the phase kernels (4 warps)."""
MODES = ("launch", "pdl", "grid")
DEFAULT_SPINS = 1 << 22
"""Polls a block makes at one barrier before the watchdog gives up (a poll is an L2 round trip: seconds of spinning,
far beyond any barrier among resident blocks, short of a hang)."""
EPS = np.float32(1e-6)


class WatchdogError(RuntimeError):
    """A grid barrier gave up waiting: some CUDA block never arrived (not resident, or the kernel is wrong)."""


STATE_WORDS = 3
"""int32 words of a grid barrier's state: the arrival counter, the watchdog word and the departure counter."""


RELEASE_ALL = 1 << 30
"""What a block that gives up adds to the arrival counter: past every target of the launch (blocks x barriers stay
far below it), so no barrier waits after a watchdog fired, and nothing is read on the fast path to know it."""


@cuda.jit(device=True, inline="always")
def grid_barrier(state, generation, spins):
    """Wait until every CUDA block of the grid has called this for the ``generation``-th time (1, 2, ... within one
    launch). state: int32[STATE_WORDS] device array, all 0 before the launch (`grid_depart` leaves it so); spins >= 1:
    the polls before giving up. A block that gives up writes ``generation`` into state[1] (the watchdog word) and
    adds `RELEASE_ALL` to the counter, so blocks still waiting pass at their next poll and no later barrier of the
    launch waits (its output is wrong; `check_watchdog` raises, and the state must be replaced). Every thread of
    every block must call it."""
    cuda.syncthreads()  # the block's writes before the barrier happen before thread 0's release
    if cuda.threadIdx.x == 0:
        red_release_gpu_add(state, 0, int32(1))
        target = int32(cuda.gridDim.x) * int32(generation)
        n = 0
        while ld_acquire_gpu(state, 0) < target:
            n += 1
            if n == spins:
                cuda.atomic.exch(state, 1, int32(generation))
                red_release_gpu_add(state, 0, int32(RELEASE_ALL))
    cuda.syncthreads()  # thread 0's acquire happens before the block's reads after the barrier


@cuda.jit(device=True, inline="always")
def grid_depart(state):
    """After a block's last `grid_barrier` of the launch: the last block to depart zeroes the arrival and departure
    counters for the next launch (every block has passed every barrier by then). After a watchdog fired this is not
    guaranteed (a block's late add may land after the zeroing) and the watchdog word stays: replace the state."""
    if cuda.threadIdx.x == 0:
        if cuda.atomic.add(state, 2, 1) == cuda.gridDim.x - 1:
            state[0] = 0
            state[2] = 0


@cuda.jit(device=True, inline="always")
def _phase(xi, w, xo, n, sm):
    """xo[i] = xi[i] * w[i] / sqrt(mean(xi^2) + EPS) for this block's share of i (every block reduces all of xi)."""
    t = cuda.threadIdx.x
    s = float32(0)
    for i in range(t, n, THREADS):
        v = xi[i]
        s += v * v
    for o in (16, 8, 4, 2, 1):
        s += shfl_xor_f32(s, o)
    if (t & 31) == 0:
        sm[t >> 5] = s
    cuda.syncthreads()
    inv = float32(1) / math.sqrt((sm[0] + sm[1] + sm[2] + sm[3]) / float32(n) + EPS)
    cuda.syncthreads()  # sm is rewritten by the next phase
    for i in range(cuda.blockIdx.x * THREADS + t, n, cuda.gridDim.x * THREADS):
        xo[i] = xi[i] * w[i] * inv


@kernel
def _phase_kernel(xi, w, xo):
    """One phase as its own kernel (waits for the previous one first when launched as a PDL: `pdl_enter`)."""
    pdl_enter()
    sm = cuda.shared.array(4, float32)
    _phase(xi, w, xo, xi.size, sm)


@kernel
def _phases_grid(x, w, out, state, spins):
    """Every phase in one kernel: phase p reads x (p = 0) or out[(p + 1) % 2], writes out[p % 2]; a grid barrier
    between consecutive phases (P - 1 of them: the kernel's end follows the last)."""
    sm = cuda.shared.array(4, float32)
    n = x.size
    phases = w.shape[0]
    for p in range(phases):
        xi = x if p == 0 else out[(p + 1) % 2]
        _phase(xi, w[p], out[p % 2], n, sm)
        if p + 1 < phases:
            grid_barrier(state, p + 1, spins)
    grid_depart(state)


GRID_SIGNATURE = (types.float32[::1], types.Array(types.float32, 2, "C"), types.Array(types.float32, 2, "C"),
                  types.int32[::1], types.int32)
"""Argument types of the MODE grid kernel (x, w, out, state, spins)."""


def co_resident_blocks(dispatcher, signature: tuple, threads: int, shmem: int = 0) -> int:
    """CUDA blocks of ``threads`` threads (and ``shmem`` dynamic shared bytes) of ``dispatcher`` compiled for the
    argument types ``signature`` that the whole device holds at once (the occupancy calculator's blocks per SM x
    SMs); 1 in the simulator, which runs one block at a time."""
    if SIMULATOR:
        return 1
    return int(dispatcher.compile(signature).max_cooperative_grid_blocks(threads, shmem))


def _on_device(a) -> bool:
    """Whether ``a`` is a device array (the simulator's are not numpy arrays; a host array would be copied to and
    from the device around every launch, which a CUDA graph cannot capture)."""
    if SIMULATOR:
        return hasattr(a, "copy_to_host")
    return cuda.is_cuda_array(a)


def phase_chain(x, w, out, mode: str, blocks: int, stream, state=None, spins: int = DEFAULT_SPINS) -> None:
    """Enqueue P = w.shape[0] phases (module docstring) on ``stream``: x f32[n] (read only), w f32[P, n], out
    f32[2, n] (the result in out[(P - 1) % 2]); mode one of `MODES`; blocks the CUDA blocks of every phase. MODE grid
    needs ``state`` (`new_state`: the barrier's words, zero before the first launch and left so by each launch whose
    watchdog did not fire); `check_watchdog` reads it after; spins: `grid_barrier`'s bound. Raises
    KernelConstraintError for an unknown mode, arrays that are not float32 device arrays of matching shapes, spins
    outside [1, 2**31), a missing or wrong state, or (MODE grid) more blocks than the device holds at once."""
    if mode not in MODES:
        raise KernelConstraintError(f"phase_chain: mode {mode!r} is not one of {', '.join(MODES)}")
    for name, a, ndim in (("x", x, 1), ("w", w, 2), ("out", out, 2)):
        if not _on_device(a) or a.dtype != np.float32 or a.ndim != ndim:
            raise KernelConstraintError(f"phase_chain: {name} must be a {ndim}-D float32 device array, got "
                                        f"{getattr(a, 'dtype', type(a).__name__)} {tuple(getattr(a, 'shape', ()))}")
    p, n = w.shape
    if x.shape != (n,) or out.shape != (2, n) or p < 1 or blocks < 1:
        raise KernelConstraintError(f"phase_chain: x [{n}], w [P >= 1, {n}], out [2, {n}] and blocks >= 1 expected; "
                                    f"got x {x.shape}, w {w.shape}, out {out.shape}, blocks {blocks}")
    if not 1 <= spins < 2 ** 31:
        raise KernelConstraintError(f"phase_chain: spins must be between 1 and 2**31 - 1 polls, got {spins}")
    if mode != "grid":
        for i in range(p):
            xi = x if i == 0 else out[(i + 1) % 2]
            launch_kernel(_phase_kernel, blocks, THREADS, stream, (xi, w[i], out[i % 2]), pdl=mode == "pdl")
        return
    if state is None or not _on_device(state) or state.shape != (STATE_WORDS,) or state.dtype != np.int32:
        raise KernelConstraintError(f"phase_chain: MODE grid needs state, an int32[{STATE_WORDS}] device array from "
                                    f"new_state(), got {getattr(state, 'dtype', type(state).__name__)} "
                                    f"{tuple(getattr(state, 'shape', ()))}")
    args = (x, w, out, state, np.int32(spins))
    fits = co_resident_blocks(_phases_grid, GRID_SIGNATURE, THREADS)
    if blocks > fits:
        raise KernelConstraintError(f"phase_chain: {blocks} CUDA blocks cannot all be resident at once (the device "
                                    f"holds {fits} of this kernel), so its grid barrier would never complete; use at "
                                    f"most {fits}")
    _phases_grid[blocks, THREADS, stream](*args)


def new_state():
    """A grid barrier's state words, zeroed on the device (int32[STATE_WORDS])."""
    return cuda.to_device(np.zeros(STATE_WORDS, np.int32))


def check_watchdog(state) -> None:
    """Raise WatchdogError when a MODE grid chain's barrier gave up since ``state`` was made (as `phase_chain` took
    it; synchronises with the device to read it)."""
    gave_up = int(state.copy_to_host()[1])
    if gave_up:
        raise WatchdogError(f"grid barrier {gave_up} gave up waiting: not every CUDA block arrived (were they all "
                            f"resident?); the chain's output is wrong, and its state must be replaced (new_state)")
