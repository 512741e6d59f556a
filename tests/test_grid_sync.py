"""`kernels.grid_sync`: the grid barrier (release / acquire through device memory, bounded by a watchdog), the
phase chain it is timed with (experiment `sync`) and the PTX helpers it uses.

Numbers in the simulator session against a float64 chain (tail n, fresh inputs, NaN-poisoned outputs); the
watchdog reports a barrier some block never reaches instead of hanging; a grid the device cannot hold at once is
refused before launch; the instructions in the compiled PTX (`compile`); real shapes and 132-264 blocks on the GPU
(`gpu`)."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda, types

from experiments.sync import reference
from kernels import grid_sync
from kernels.errors import KernelConstraintError
from kernels.grid_sync import EPS, STATE_WORDS, THREADS, WatchdogError, check_watchdog, new_state, phase_chain
from kernels.ptx import SIMULATOR

sim = pytest.mark.skipif(not SIMULATOR, reason="simulator session only (NUMBA_ENABLE_CUDASIM=1)")


def _inputs(rng, n, phases):
    x = rng.standard_normal(n).astype(np.float32)
    w = rng.uniform(0.5, 1.5, (phases, n)).astype(np.float32)
    return x, w


def _chain(mode, blocks, n, phases, rng, state=None, stream=0):
    x, w = _inputs(rng, n, phases)
    out = cuda.to_device(np.full((2, n), np.nan, np.float32))
    phase_chain(cuda.to_device(x), cuda.to_device(w), out, mode, blocks, stream, state=state)
    got = out.copy_to_host()[(phases - 1) % 2].astype(np.float64)
    ref = reference(x, w, float(EPS))
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


@sim
@pytest.mark.parametrize("mode, blocks, n, phases", [("launch", 3, 300, 3), ("pdl", 2, 129, 4), ("grid", 1, 300, 3),
                                                     ("launch", 1, 64, 1)])
def test_chain_matches_the_float64_chain(mode, blocks, n, phases):
    """Every mode computes the same chain (n not a multiple of the 128 threads; blocks > 1 split the scaling)."""
    state = new_state() if mode == "grid" else None
    assert _chain(mode, blocks, n, phases, np.random.default_rng(), state) < 1e-5


@sim
def test_grid_state_is_left_zeroed_for_the_next_launch():
    """The last block to depart zeroes the counters, so a second launch on the same state barriers afresh."""
    state, rng = new_state(), np.random.default_rng()
    for _ in range(2):
        assert _chain("grid", 1, 200, 5, rng, state) < 1e-5
        assert state.copy_to_host().tolist() == [0] * STATE_WORDS
    check_watchdog(state)


@sim
def test_watchdog_reports_a_barrier_some_block_never_reaches():
    """The simulator runs one CUDA block at a time, so with two blocks block 0 waits at barrier 1 for a block that
    has not started: it gives up after `spins` polls and records barrier 1, no later barrier waits, and
    check_watchdog raises instead of the kernel hanging."""
    rng = np.random.default_rng()
    x, w = _inputs(rng, 256, 3)
    out = cuda.to_device(np.full((2, 256), np.nan, np.float32))
    state = new_state()
    grid_sync._phases_grid[2, THREADS](cuda.to_device(x), cuda.to_device(w), out, state, np.int32(5))
    words = state.copy_to_host()
    assert words[1] == 1 and words[2] == 0, words  # barrier 1 gave up; the last block out zeroed the departures
    with pytest.raises(WatchdogError, match="barrier 1 gave up"):
        check_watchdog(state)


@sim
def test_grid_above_what_the_device_holds_is_refused_before_launch():
    rng = np.random.default_rng()
    with pytest.raises(KernelConstraintError, match="cannot all be resident at once.*use at most 1"):
        _chain("grid", 2, 128, 2, rng, new_state())


@pytest.mark.parametrize("kwargs, needle", [
    ({"mode": "coop"}, "mode 'coop' is not one of launch, pdl, grid"),
    ({"blocks": 0}, "blocks >= 1 expected"),
    ({"out_shape": (3, 64)}, r"out \[2, 64\]"),
    ({"mode": "grid"}, "MODE grid needs state, an int32\\[3\\] device array from new_state\\(\\), got NoneType"),
    ({"mode": "grid", "state": np.zeros(3, np.int32)}, "MODE grid needs state.*got int32 \\(3,\\)"),
    ({"w": np.ones(64, np.float32)}, "w must be a 2-D float32 device array, got float32 \\(64,\\)"),
    ({"w": np.ones((2, 64), np.float64)}, "w must be a 2-D float32 device array, got float64"),
    ({"spins": 0}, "spins must be between 1 and 2\\*\\*31 - 1 polls, got 0"),
    ({"spins": 2 ** 31}, "spins must be between 1 and"),
])
def test_chain_refuses_bad_arguments(kwargs, needle):
    x = cuda.to_device(np.ones(64, np.float32))
    w = cuda.to_device(kwargs.get("w", np.ones((2, 64), np.float32)))
    out = cuda.to_device(np.zeros(kwargs.get("out_shape", (2, 64)), np.float32))
    with pytest.raises(KernelConstraintError, match=needle):
        phase_chain(x, w, out, kwargs.get("mode", "launch"), kwargs.get("blocks", 1), 0, state=kwargs.get("state"),
                    spins=kwargs.get("spins", 100))


@pytest.mark.compile
def test_barrier_instructions_in_ptx():
    """The grid kernel's PTX holds the GPU-scope release reduction and acquire load, and no local memory."""
    ptx, _ = cuda.compile_ptx(grid_sync._phases_grid.py_func, grid_sync.GRID_SIGNATURE, cc=(9, 0))
    assert "red.release.gpu.global.add.s32" in ptx and "ld.acquire.gpu.global.s32" in ptx
    assert "ld.local" not in ptx and "st.local" not in ptx


@pytest.mark.compile
def test_release_add_refuses_a_float_array():
    from numba.core.errors import TypingError

    from kernels.ptx import red_release_gpu_add

    def k(a):
        red_release_gpu_add(a, 0, 1)

    with pytest.raises(TypingError, match="needs an int32 array"):
        cuda.compile_ptx(k, (types.float32[::1],), cc=(9, 0))


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["launch", "pdl", "grid"])
@pytest.mark.parametrize("blocks", [132, 264])
def test_chain_on_gpu(mode, blocks):
    """At the 1.5B's hidden size with every SM busy (264: two blocks an SM, still co-resident), on a stream (PDL
    needs one); the grid barrier never gives up."""
    state = new_state() if mode == "grid" else None
    stream = cuda.stream()
    assert _chain(mode, blocks, 1536, 64, np.random.default_rng(), state, stream) < 1e-5
    if state is not None:
        check_watchdog(state)


@pytest.mark.gpu
def test_grid_beyond_residency_is_refused_on_gpu():
    from kernels.grid_sync import co_resident_blocks

    rng = np.random.default_rng()
    fits = co_resident_blocks(grid_sync._phases_grid, grid_sync.GRID_SIGNATURE, THREADS)
    assert fits >= cuda.get_current_device().MULTIPROCESSOR_COUNT
    with pytest.raises(KernelConstraintError, match=f"use at most {fits}"):
        _chain("grid", fits + 1, 256, 2, rng, new_state())


@sim
@pytest.mark.parametrize("arm", ["MODE=launch,BLOCKS=1", "MODE=pdl,BLOCKS=1", "MODE=grid,BLOCKS=1"])
def test_sync_experiment_checks_its_own_output(arm):
    """The experiment's sample passes its check on the tiny workload; a poisoned output does not, and a grid arm
    whose watchdog fired raises WatchdogError from check and after timing (the harness's INVALID reason)."""
    from minfer_cli.experiment import get

    exp = get("sync")
    config, workload = exp.config(arm), exp.workload("tiny")
    inputs, output = exp.make_input_set(workload, np.random.default_rng()), exp.make_output(workload)
    assert exp.note(config, workload).endswith("the sample's time / 3")
    launch = exp.prepare(config, workload)
    exp.poison(output)
    assert exp.check(config, workload, inputs, output) == float("inf")
    launch(inputs, output, 0)
    assert exp.check(config, workload, inputs, output) <= exp.tolerance(config, workload)
    exp.after_timing(config, workload)
    if config["MODE"] == "grid":
        state = exp._states["grid", 1]
        state.copy_to_device(np.array([0, 2, 0], np.int32))
        with pytest.raises(WatchdogError, match="barrier 2 gave up"):
            exp.check(config, workload, inputs, output)
        with pytest.raises(WatchdogError, match="barrier 2 gave up"):
            exp.after_timing(config, workload)
