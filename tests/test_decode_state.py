"""The decode step's two device-side helpers: `kernels.argmax` (the greedy token, on the device) and
`kernels.decode_state` (the state advance after each step).

Simulator: both against numpy (tiny arrays, ties inside and across blocks, NaN/-inf, bad input refused). Compile
(NVVM, no GPU): both build for sm_90 without local memory.
"""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

from kernels.errors import KernelConstraintError


# ---- argmax ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("values", [
    [1.0, 5.0, 5.0, 2.0],  # tie inside a block -> lowest index
    [3.0, 3.0, 3.0],
    [-np.inf, -np.inf, -np.inf, -np.inf],  # all -inf -> 0, as numpy
    [7.0],
    [-1.0, -2.0, -0.5, -0.5, -3.0],
])
def test_argmax_matches_numpy_on_small_vectors(values):
    from kernels.argmax import argmax

    x = np.array(values, dtype=np.float32)
    out = cuda.to_device(np.full(1, -7, dtype=np.int32))
    argmax(cuda.to_device(x), out=out, tpb=32)
    assert int(out.copy_to_host()[0]) == int(np.argmax(x))


def test_argmax_ties_across_blocks_and_grid_stride():
    from kernels.argmax import argmax

    rng = np.random.default_rng()
    for blocks, n in ((1, 37), (3, 200), (5, 1000)):
        x = rng.standard_normal(n).astype(np.float32)
        hits = np.sort(rng.choice(n, size=3, replace=False))
        x[hits] = 9.5  # the same maximum in (likely) different blocks and grid-stride rounds
        got = int(argmax(cuda.to_device(x), blocks=blocks, tpb=32).copy_to_host()[0])
        assert got == int(np.argmax(x)) == hits[0], (blocks, n, hits)


def test_argmax_skips_nan_and_gives_minus_one_without_a_number():
    from kernels.argmax import argmax

    x = np.array([np.nan, 1.0, np.nan, 1.0, 0.5], dtype=np.float32)
    assert int(argmax(cuda.to_device(x), tpb=32).copy_to_host()[0]) == 1
    allnan = np.full(6, np.nan, dtype=np.float32)
    assert int(argmax(cuda.to_device(allnan), tpb=32).copy_to_host()[0]) == -1


def test_argmax_writes_only_element_0_of_out():
    from kernels.argmax import argmax

    state = cuda.to_device(np.array([-1, 42, 43], dtype=np.int32))
    argmax(cuda.to_device(np.array([0.0, 2.0, 1.0], dtype=np.float32)), out=state[0:1], tpb=32)
    assert state.copy_to_host().tolist() == [1, 42, 43]


@pytest.mark.parametrize("kwargs, needle", [
    ({"x": "host"}, "CUDA device array"),
    ({"x": "f16"}, "float32"),
    ({"x": "empty"}, "non-empty"),
    ({"tpb": 48}, "tpb=48"),
    ({"blocks": 0}, "blocks=0"),
    ({"out": "f32"}, "int32"),
    ({"blocks": 4, "workspace": 2}, "workspace"),
])
def test_argmax_rejects_bad_input(kwargs, needle):
    from kernels.argmax import argmax, argmax_workspace

    x = cuda.to_device(np.zeros(8, np.float32))
    kw = dict(kwargs)
    if kw.get("x") == "host":
        kw["x"] = np.zeros(8, np.float32)
    elif kw.get("x") == "f16":
        kw["x"] = cuda.to_device(np.zeros(8, np.float16))
    elif kw.get("x") == "empty":
        kw["x"] = cuda.to_device(np.zeros(0, np.float32))
    if kw.get("out") == "f32":
        kw["out"] = cuda.to_device(np.zeros(1, np.float32))
    if "workspace" in kw:
        kw["workspace"] = argmax_workspace(kw["workspace"])
    arg = kw.pop("x", x)
    with pytest.raises(KernelConstraintError, match=needle):
        argmax(arg, **kw)


# ---- state advance ---------------------------------------------------------------------------------------------


def test_advance_records_the_token_and_moves_position_and_length():
    from kernels.decode_state import advance

    rng = np.random.default_rng()
    state_h = np.array([int(rng.integers(0, 1000)), 3, 4], dtype=np.int32)
    history_h = np.full(8, -5, dtype=np.int32)
    state, history = cuda.to_device(state_h), cuda.to_device(history_h)
    for _ in range(4):
        token = int(rng.integers(0, 1000))
        state[0:1].copy_to_device(np.array([token], dtype=np.int32))
        state_h[0] = token
        advance(state, history)
        history_h[state_h[1]] = state_h[0]  # numpy model of the kernel
        state_h[1] += 1
        state_h[2] = state_h[1] + 1
        np.testing.assert_array_equal(state.copy_to_host(), state_h)
        np.testing.assert_array_equal(history.copy_to_host(), history_h)
    assert state_h.tolist()[1:] == [7, 8]


def test_advance_rejects_bad_arrays():
    from kernels.decode_state import advance

    good = cuda.to_device(np.zeros(3, np.int32))
    with pytest.raises(KernelConstraintError, match="state"):
        advance(cuda.to_device(np.zeros(4, np.int32)), good)
    with pytest.raises(KernelConstraintError, match="history"):
        advance(good, cuda.to_device(np.zeros(3, np.float32)))


# ---- compile (NVVM, no GPU) --------------------------------------------------------------------------------------


@pytest.mark.compile
def test_argmax_and_advance_compile_for_sm90_without_local_memory():
    from numba import types

    from kernels import argmax, decode_state

    f32, i32 = types.Array(types.float32, 1, "C"), types.Array(types.int32, 1, "C")
    partial, final = argmax.build(256)
    for kernel, sig in ((partial, (f32, types.int64, f32, i32)), (final, (f32, i32, types.int64, i32)),
                        (decode_state._advance, (i32, i32))):
        ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=(9, 0))
        assert ".local" not in ptx and "ld.local" not in ptx, kernel.py_func.__name__
