"""Q8_1 activation quantization (`kernels.quantize_q8`) against gguf-py's own Q8_0 quantizer.

The int8 values must equal ``gguf.quants.quantize(x, Q8_0)``'s bit for bit (same d = max|x|/127, same
round-half-away-from-zero of x * (1/d)); d equals max|x|/127 in float32 exactly; the block sum is Σx within float32
rounding. Inputs: fresh random x with a scale per block (tiny to large), a block of zeros (d = 0: q = 0), exact
.5 ties, outputs poisoned before the kernel runs. Simulator in CI; the same test at a real width on the GPU.
"""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

from kernels.errors import KernelConstraintError
from kernels.quantize_q8 import q8_blocks, quantize_q8_1


def _x(n, rng):
    scale = np.exp(rng.uniform(-8, 8, size=n // 32)).astype(np.float32)
    x = (rng.standard_normal(n).astype(np.float32).reshape(-1, 32) * scale[:, None]).reshape(-1)
    x[:32] = 0.0  # a block of zeros: d = 0
    x[32:64] = np.arange(-16, 16, dtype=np.float32) + np.float32(0.5)  # exact .5 ties in q (d = 127/127 = 1)
    x[63] = np.float32(127.0)
    return x


def _run(n, rng):
    x = _x(n, rng)
    out = q8_blocks(n)
    out.q.copy_to_device(np.full(n, 99, dtype=np.int8))
    out.d.copy_to_device(np.full(n // 32, np.nan, dtype=np.float32))
    out.s.copy_to_device(np.full(n // 32, np.nan, dtype=np.float32))
    assert quantize_q8_1(cuda.to_device(x), out) is out
    return x, out.q.copy_to_host(), out.d.copy_to_host(), out.s.copy_to_host()


def _check(x, q, d, s):
    from gguf import GGMLQuantizationType, quants

    packed = quants.quantize(x.reshape(-1, 32), GGMLQuantizationType.Q8_0).reshape(-1, 34)
    ref_q = packed[:, 2:].copy().view(np.int8).reshape(-1)
    bad = np.flatnonzero(q != ref_q)
    assert bad.size == 0, f"{bad.size} int8 values differ from gguf's Q8_0, first at {bad[0]}: {q[bad[0]]} vs {ref_q[bad[0]]}"
    ref_d = np.abs(x.reshape(-1, 32)).max(axis=1) / np.float32(127)
    assert np.array_equal(d, ref_d), "d is not max|x|/127 in float32"
    assert np.array_equal(d.astype(np.float16).view(np.uint16), packed[:, :2].copy().view(np.uint16).reshape(-1))
    ref_s = x.reshape(-1, 32).astype(np.float64).sum(axis=1)
    tol = 1e-6 * np.abs(x.reshape(-1, 32)).astype(np.float64).sum(axis=1) + 1e-30
    assert (np.abs(s - ref_s) <= tol).all(), "block sums differ from Σx beyond float32 rounding"


def test_matches_gguf_q8_0_values():
    rng = np.random.default_rng()
    _check(*_run(320, rng))  # 10 blocks: one full 256-thread CUDA block and a partial one


def test_compensated_residual_values():
    """The compensated form's r (`kernels.quantize_q8`): q, d and s as before, r = roundf((x·(1/d) - q)·254) from an
    independent float64 computation (equal, or one step off where f32 and f64 round a tie differently), |r| <= 127,
    and d·(q + r/254) within d/508 (+ f32 rounding) of x, 254 times closer than d·q."""
    rng = np.random.default_rng()
    n = 320
    x = _x(n, rng)
    out = q8_blocks(n, compensated=True)
    assert out.compensated and not q8_blocks(n).compensated
    out.r.copy_to_device(np.full(n, 99, dtype=np.int8))
    quantize_q8_1(cuda.to_device(x), out)
    q, d, r = out.q.copy_to_host(), out.d.copy_to_host(), out.r.copy_to_host()
    _check(x, q, d, out.s.copy_to_host())
    d64 = np.repeat(d.astype(np.float64), 32)
    with np.errstate(divide="ignore", invalid="ignore"):
        exact = np.where(d64 > 0, (x / d64 - q) * 254, 0.0)
    assert np.abs(r.astype(np.float64) - exact).max() <= 0.5 + 1e-3, "r is not the rounded residual in steps of d/254"
    assert np.abs(r).max() <= 127
    err = np.abs(d64 * (q + r / 254.0) - x)
    assert (err <= d64 / 508 * (1 + 1e-3) + 1e-6 * np.abs(x)).all()
    big = d64 > 0
    assert np.linalg.norm(err[big] / d64[big]) * 50 < np.linalg.norm((d64 * q - x)[big] / d64[big])


def test_rejects_bad_input():
    x = cuda.to_device(np.ones(64, dtype=np.float32))
    with pytest.raises(KernelConstraintError, match="multiple of 32"):
        q8_blocks(40)
    with pytest.raises(KernelConstraintError, match="multiple of 32"):
        quantize_q8_1(cuda.to_device(np.ones(40, dtype=np.float32)), q8_blocks(64))
    with pytest.raises(KernelConstraintError, match="q8_blocks\\(64\\)"):
        quantize_q8_1(x, q8_blocks(96))
    with pytest.raises(KernelConstraintError, match="float32"):
        quantize_q8_1(cuda.to_device(np.ones(64, dtype=np.float16)), q8_blocks(64))
    with pytest.raises(KernelConstraintError, match="device array"):
        quantize_q8_1(np.ones(64, dtype=np.float32), q8_blocks(64))
    with pytest.raises(KernelConstraintError, match="out must be Q8Blocks of 64 activations .* got NoneType"):
        quantize_q8_1(x, None)
    for bad in (64.0, "64", None, True):
        with pytest.raises(KernelConstraintError, match="positive integer multiple of 32"):
            q8_blocks(bad)


def test_check_q8_looks_inside():
    from kernels.quantize_q8 import Q8Blocks, check_q8

    good = q8_blocks(64)
    assert check_q8(good, 64) is good
    short_d = Q8Blocks(good.q, cuda.to_device(np.zeros(1, np.float32)), good.s)
    with pytest.raises(KernelConstraintError, match="its d is float32 of shape \\(1,\\), expected a contiguous float32 array of 2"):
        check_q8(short_d, 64, "x")
    with pytest.raises(KernelConstraintError, match="its q is a ndarray, not a device array"):
        check_q8(Q8Blocks(np.zeros(64, np.int8), good.d, good.s), 64)
    with pytest.raises(KernelConstraintError, match="its s is float16"):
        check_q8(Q8Blocks(good.q, good.d, cuda.to_device(np.zeros(2, np.float16))), 64)
    with pytest.raises(KernelConstraintError, match="its r is int8 of shape \\(32,\\)"):
        check_q8(Q8Blocks(good.q, good.d, good.s, cuda.to_device(np.zeros(32, np.int8))), 64)


@pytest.mark.gpu
def test_real_width_on_the_gpu():
    rng = np.random.default_rng()
    _check(*_run(18944, rng))


@pytest.mark.compile
def test_compiles_for_sm90_with_shuffles_and_no_local_memory():
    from numba import types

    from kernels.quantize_q8 import _quantize_q8_1

    f32, i8 = types.Array(types.float32, 1, "C"), types.Array(types.int8, 1, "C")
    ptx, _ = cuda.compile_ptx(_quantize_q8_1.py_func, (f32, i8, f32, f32, types.int64), cc=(9, 0))
    assert ptx.count("shfl.sync.bfly") == 10  # 5 steps of max, 5 of sum
    assert "div.rn.f32" in ptx, "d = amax / 127 and 1 / d must be IEEE divisions (gguf's float32 numbers)"
    assert ".local" not in ptx and ".f64" not in ptx
