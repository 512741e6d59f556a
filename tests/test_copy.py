"""The copy kernel (simulator session at small sizes; `gpu` at 1 GiB) and its experiment's check."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

from kernels.copy import copy
from kernels.errors import KernelConstraintError

POISON = np.uint32(0xFFFFFFFF)


def _fresh(n, rng):
    return rng.integers(0, 0xFFFFFFFF, size=n, dtype=np.uint32)


@pytest.mark.parametrize("vec", [1, 2, 4])
@pytest.mark.parametrize("n", [4, 1028, 2000])  # 2000 elements: more than one grid-stride pass at 2 blocks
def test_copy_matches_source_exactly(vec, n):
    rng = np.random.default_rng()
    src = _fresh(n, rng)
    d_src, d_dst = cuda.to_device(src), cuda.to_device(np.full(n, POISON))
    copy(d_src, d_dst, vec=vec, blocks=2)
    np.testing.assert_array_equal(d_dst.copy_to_host(), src)


@pytest.mark.parametrize(
    "make, vec, needle",
    [
        (lambda: (np.zeros(8, np.float32), np.zeros(8, np.uint32)), 1, "1-D uint32"),
        (lambda: (np.zeros(8, np.uint32), np.zeros(12, np.uint32)), 1, "must match"),
        (lambda: (np.zeros(6, np.uint32), np.zeros(6, np.uint32)), 4, "not a multiple of VEC=4"),
        (lambda: (np.zeros(8, np.uint32), np.zeros(8, np.uint32)), 3, "VEC=3 is not supported"),
    ],
)
def test_copy_rejects_bad_input(make, vec, needle):
    a, b = make()
    with pytest.raises(KernelConstraintError, match=needle):
        copy(cuda.to_device(a), cuda.to_device(b), vec=vec, blocks=1)


def test_experiment_check_sees_an_unwritten_element():
    from minfer_cli.experiment import get

    exp = get("copy")
    wl = exp.workload("tiny")
    rng = np.random.default_rng()
    inputs, output = exp.make_input_set(wl, rng), exp.make_output(wl)
    launch = exp.prepare(exp.config("VEC=4"), wl)
    exp.poison(output)
    launch(inputs, output, 0)
    assert exp.check({}, wl, inputs, output) == 0.0
    host = output.copy_to_host()
    host[17] = POISON
    output.copy_to_device(host)
    assert exp.check({}, wl, inputs, output) > 0.0


@pytest.mark.compile
def test_vec4_compiles_to_16_byte_accesses_and_vec1_does_not():
    from kernels import copy as kc

    v4, _ = cuda.compile_ptx(kc._copy_v4.py_func, "uint32[::1], uint32[::1]", cc=(9, 0))
    v1, _ = cuda.compile_ptx(kc._copy_scalar.py_func, "uint32[::1], uint32[::1]", cc=(9, 0))
    v2, _ = cuda.compile_ptx(kc._copy_scalar.py_func, "uint64[::1], uint64[::1]", cc=(9, 0))
    assert "ld.global.v4.u32" in v4 and "st.global.v4.u32" in v4
    assert "ld.global.v4" not in v1 and "ld.global.u32" in v1
    assert "ld.global.u64" in v2


@pytest.mark.gpu
@pytest.mark.parametrize("vec", [1, 2, 4])
def test_copy_1gib_on_gpu(vec):
    n = (1 << 30) // 4
    rng = np.random.default_rng()
    src = _fresh(n, rng)
    d_src, d_dst = cuda.to_device(src), cuda.to_device(np.full(n, POISON))
    copy(d_src, d_dst, vec=vec)
    cuda.synchronize()
    np.testing.assert_array_equal(d_dst.copy_to_host(), src)
