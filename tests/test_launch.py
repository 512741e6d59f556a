"""`kernels.launch`: which compiled kernel a programmatic dependent launch uses, and its launch dimensions.

The PDL launch itself needs a GPU (tests/test_decode_knobs.py, tests/test_gemv.py `gpu`); here, without one: the
overload lookup never lends a lazily compiled dispatcher's kernel of other argument types (the prefill's RMSNorm
with f16 out must not serve the decode's f32 out), an explicit-signature dispatcher's only kernel serves, and the
dimensions numba accepts (lists, numpy integers) reach cuda.core as ints and tuples.
"""

from __future__ import annotations

import numpy as np
from numba.cuda.typing.typeof import Purpose, typeof

from kernels.launch import _compiled, _dim


class _FakeDispatcher:
    """A dispatcher's two attributes `_compiled` reads: its overloads (argument types -> kernel) and whether it may
    compile more (False: built for explicit signatures)."""

    def __init__(self, args, can_compile: bool):
        self.overloads = {tuple(typeof(a, Purpose.argument) for a in args): "kernel"}
        self._can_compile = can_compile


def test_a_lazy_dispatcher_never_lends_another_types_overload():
    rng = np.random.default_rng()
    x = rng.standard_normal((2, 64)).astype(np.float32)
    w = rng.standard_normal(64).astype(np.float32)
    f16_out, f32_out = np.empty((2, 64), np.float16), np.empty((2, 64), np.float32)
    lazy = _FakeDispatcher((x, w, f16_out, np.float32(1e-6)), can_compile=True)
    assert _compiled(lazy, (x, w, f16_out, np.float32(1e-6))) == "kernel"
    assert _compiled(lazy, (x, w, f32_out, np.float32(1e-6))) is None  # numba must compile the f32 one
    fixed = _FakeDispatcher((x, w, f16_out, np.float32(1e-6)), can_compile=False)
    assert _compiled(fixed, (x, w, f32_out, np.float32(1e-6))) == "kernel"  # numba's own rule: its only kernel


def test_launch_dimensions_reach_cuda_core_as_ints_and_tuples():
    assert _dim(np.int64(5)) == 5 and type(_dim(np.int64(5))) is int
    assert _dim([5, np.int32(2)]) == (5, 2) and _dim((3, 4)) == (3, 4)
