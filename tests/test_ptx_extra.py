"""Helpers added to kernels.ptx after the tensor-core set: `shfl_xor_f32` (warp butterfly shuffle), `dp4a_s32`
(four-way int8 dot product), `prmt_b32` / `sub_f16x2` / `fma_f16x2`, and the f32 vector loads / stores of a staged
C tile.

Numbers in the simulator session (the fallback), the instruction in the compiled PTX (`compile`), the same numbers
on a real GPU (`gpu`)."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda, types

from kernels import ptx as P
from kernels.ptx import SIMULATOR

sim = pytest.mark.skipif(not SIMULATOR, reason="simulator session only (NUMBA_ENABLE_CUDASIM=1)")


@cuda.jit
def _k_shfl(src, out):
    lane = cuda.threadIdx.x & 31
    x = src[cuda.threadIdx.x]
    for i in range(5):
        out[i * 64 + cuda.threadIdx.x] = P.shfl_xor_f32(x, 1 << i)
    # the reduction idiom: every lane ends with the warp's sum
    s = x
    s += P.shfl_xor_f32(s, 16)
    s += P.shfl_xor_f32(s, 8)
    s += P.shfl_xor_f32(s, 4)
    s += P.shfl_xor_f32(s, 2)
    s += P.shfl_xor_f32(s, 1)
    out[5 * 64 + cuda.threadIdx.x] = s + lane * 0


def check_shfl(rng) -> None:
    src = rng.standard_normal(64).astype(np.float32)
    out = cuda.to_device(np.full(6 * 64, np.nan, np.float32))
    _k_shfl[1, 64](cuda.to_device(src), out)  # two warps: each shuffles within itself
    got = out.copy_to_host().reshape(6, 64)
    for i in range(5):
        for t in range(64):
            w, lane = divmod(t, 32)
            assert got[i, t] == src[w * 32 + (lane ^ (1 << i))], (i, t)
    sums = src.reshape(2, 32).astype(np.float64).sum(axis=1)
    assert np.allclose(got[5].reshape(2, 32), sums[:, None], rtol=1e-5, atol=1e-5)


@sim
def test_shfl_fallback_numbers():
    check_shfl(np.random.default_rng(5))


@pytest.mark.gpu
def test_shfl_gpu_numbers():
    check_shfl(np.random.default_rng(5))


@pytest.mark.compile
def test_shfl_instruction_in_ptx():
    ptx, _ = cuda.compile_ptx(_k_shfl.py_func, (types.float32[::1], types.float32[::1]), cc=(9, 0))
    assert "shfl.sync.bfly.b32" in ptx
    assert "ld.local" not in ptx and "st.local" not in ptx


@pytest.mark.compile
def test_shfl_rejects_an_integer_value():
    from numba.core.errors import TypingError

    def k(x):
        P.shfl_xor_f32(x[0], 1)

    with pytest.raises(TypingError, match="must be Float"):
        cuda.compile_ptx(k, (types.int32[::1],), cc=(9, 0))


# ---- dp4a_s32 ------------------------------------------------------------------------------------------------


@cuda.jit
def _k_dp4a(a, b, c, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = P.dp4a_s32(a[i], b[i], c[i])


def check_dp4a(rng) -> None:
    """Random bytes of both signs, extreme bytes (-128 * -128 four times) and accumulators near the int32 ends."""
    n = 64
    a = rng.integers(0, 2**32, size=n, dtype=np.uint64).astype(np.uint32)
    b = rng.integers(0, 2**32, size=n, dtype=np.uint64).astype(np.uint32)
    a[:2] = b[:2] = 0x80808080
    c = rng.integers(-(2**31), 2**31 - 70000, size=n, dtype=np.int64).astype(np.int32)
    out = cuda.to_device(np.full(n, -7, np.int32))
    _k_dp4a[1, n](cuda.to_device(a), cuda.to_device(b), cuda.to_device(c), out)
    want = c.astype(np.int64) + (a.view(np.int8).reshape(n, 4).astype(np.int64)
                                 * b.view(np.int8).reshape(n, 4).astype(np.int64)).sum(axis=1)
    np.testing.assert_array_equal(out.copy_to_host(), want.astype(np.int32))
    assert want[0] - c[0] == 4 * 128 * 128


@sim
def test_dp4a_fallback_numbers():
    check_dp4a(np.random.default_rng())


@pytest.mark.gpu
def test_dp4a_gpu_numbers():
    check_dp4a(np.random.default_rng())


@pytest.mark.compile
def test_dp4a_instruction_in_ptx():
    u32 = types.Array(types.uint32, 1, "C")
    i32 = types.Array(types.int32, 1, "C")
    ptx, _ = cuda.compile_ptx(_k_dp4a.py_func, (u32, u32, i32, i32), cc=(9, 0))
    assert "dp4a.s32.s32" in ptx


@sim
@pytest.mark.parametrize("begin, end, ok", [(0, 32, True), (32, 256, True), (-32, 32, False), (0, 16, False),
                                            (224, 288, False), (0, 257, False)])
def test_prefetch_l2_bulk_simulator_checks_the_whole_range(begin, end, ok):
    """The simulator form refuses what the device would fault on: a range outside the array or under 32 bytes."""
    import numpy as np

    from kernels.ptx import prefetch_l2_bulk

    array = np.zeros(256, np.uint8)
    if ok:
        prefetch_l2_bulk(array, begin, end)
    else:
        with pytest.raises(IndexError, match="prefetch_l2_bulk"):
            prefetch_l2_bulk(array, begin, end)


# ---- prmt_b32, sub_f16x2, fma_f16x2 ---------------------------------------------------------------------------


@cuda.jit
def _k_f16x2(a, b, c, out):
    i = cuda.grid(1)
    if i < a.size:
        out[4 * i] = P.prmt_b32(a[i], b[i], 0x4140)
        out[4 * i + 1] = P.prmt_b32(a[i], b[i], 0x7362)
        out[4 * i + 2] = P.sub_f16x2(a[i], b[i])
        out[4 * i + 3] = P.fma_f16x2(a[i], b[i], c[i])


def check_f16x2(rng) -> None:
    """prmt against numpy byte picks; sub and fma per f16 half against float64 rounded once to f16 (operands in
    a range where every result is a normal f16)."""
    n = 64
    halves = (rng.uniform(0.5, 2.0, size=(3, n, 2)) * rng.choice((-1.0, 1.0), size=(3, n, 2))).astype(np.float16)
    a, b, c = (h.view(np.uint32).reshape(n) for h in halves)
    out = cuda.to_device(np.zeros(4 * n, np.uint32))
    _k_f16x2[1, n](cuda.to_device(a), cuda.to_device(b), cuda.to_device(c), out)
    got = out.copy_to_host().reshape(n, 4)
    src = np.concatenate([a.view(np.uint8).reshape(n, 4), b.view(np.uint8).reshape(n, 4)], axis=1)
    for col, sel in ((0, 0x4140), (1, 0x7362)):
        picks = [(sel >> (4 * i)) & 7 for i in range(4)]
        np.testing.assert_array_equal(np.ascontiguousarray(got[:, col]).view(np.uint8).reshape(n, 4), src[:, picks])
    ha, hb, hc = (h.astype(np.float64) for h in halves)
    np.testing.assert_array_equal(np.ascontiguousarray(got[:, 2]).view(np.float16).reshape(n, 2),
                                  (ha - hb).astype(np.float16))
    np.testing.assert_array_equal(np.ascontiguousarray(got[:, 3]).view(np.float16).reshape(n, 2),
                                  (ha * hb + hc).astype(np.float16))


@sim
def test_f16x2_fallback_numbers():
    check_f16x2(np.random.default_rng())


@pytest.mark.gpu
def test_f16x2_gpu_numbers():
    check_f16x2(np.random.default_rng())


@pytest.mark.compile
def test_f16x2_instructions_in_ptx():
    u32 = types.Array(types.uint32, 1, "C")
    ptx, _ = cuda.compile_ptx(_k_f16x2.py_func, (u32, u32, u32, u32), cc=(9, 0))
    for needle in ("prmt.b32", "sub.rn.f16x2", "fma.rn.f16x2"):
        assert needle in ptx, needle


# ---- st_shared_v2_f32, ld_shared_v4_f32, st_global_v4_f32 (the GEMM's staged C tile) ---------------------------


@cuda.jit
def _k_f32_vectors(src, out, shift):
    """Thread t writes src[2t], src[2t + 1] into a shared f32 tile 8 bytes at a time (pairs in reverse thread
    order), then thread t < 16 reads 16 bytes of it back and stores them to row t // 4 of ``out`` at column 4 (t % 4)
    + shift: the tile's words land in order, one 16-byte store each."""
    tile = cuda.shared.array(64, np.float32)
    t = cuda.threadIdx.x
    q = 31 - t
    P.st_shared_v2_f32(tile, 2 * q, src[2 * q], src[2 * q + 1])
    cuda.syncthreads()
    if t < 16:
        x0, x1, x2, x3 = P.ld_shared_v4_f32(tile, 4 * t)
        P.st_global_v4_f32(out, t // 4, 4 * (t % 4) + shift, x0, x1, x2, x3)


def check_f32_vectors(rng) -> None:
    """Random floats through the three vector helpers land where the scalar copy would; the untouched outputs keep
    their NaN poison."""
    src = rng.standard_normal(64).astype(np.float32)
    out = cuda.to_device(np.full((4, 20), np.nan, np.float32))
    _k_f32_vectors[1, 32](cuda.to_device(src), out, 4)
    got = out.copy_to_host()
    np.testing.assert_array_equal(got[:, 4:], src.reshape(4, 16))
    assert np.isnan(got[:, :4]).all()


@sim
def test_f32_vector_fallback_numbers():
    check_f32_vectors(np.random.default_rng())


@sim
def test_f32_vector_fallbacks_refuse_misaligned_addresses():
    """As the GPU faults: a 16-byte store at a column that is not a multiple of 4 floats (shift 2) raises."""
    out = cuda.to_device(np.zeros((4, 20), np.float32))
    with pytest.raises(IndexError, match="16-byte alignment"):
        _k_f32_vectors[1, 32](cuda.to_device(np.zeros(64, np.float32)), out, 2)


@pytest.mark.gpu
def test_f32_vector_gpu_numbers():
    check_f32_vectors(np.random.default_rng())


@cuda.jit
def _k_f32_add(src, out, shift):
    """Thread t < 16 adds src[4t .. 4t + 3] to row t // 4 of ``out`` at column 4 (t % 4) + shift: one 16-byte load
    and one 16-byte store (the residual epilogue's read-add-write)."""
    t = cuda.threadIdx.x
    if t < 16:
        r, c = t // 4, 4 * (t % 4) + shift
        y0, y1, y2, y3 = P.ld_global_v4_f32(out, r, c)
        P.st_global_v4_f32(out, r, c, y0 + src[4 * t], y1 + src[4 * t + 1], y2 + src[4 * t + 2], y3 + src[4 * t + 3])


def check_f32_add(rng) -> None:
    """Random floats added to random rows land as the f32 sums, element for element; the columns before keep their
    NaN poison."""
    src = rng.standard_normal(64).astype(np.float32)
    start = rng.standard_normal((4, 20)).astype(np.float32)
    start[:, :4] = np.nan
    out = cuda.to_device(start)
    _k_f32_add[1, 32](cuda.to_device(src), out, 4)
    got = out.copy_to_host()
    np.testing.assert_array_equal(got[:, 4:], start[:, 4:] + src.reshape(4, 16))
    assert np.isnan(got[:, :4]).all()


@sim
def test_f32_vector_load_fallback_numbers():
    check_f32_add(np.random.default_rng())


@sim
def test_f32_vector_load_fallback_refuses_misaligned_addresses():
    with pytest.raises(IndexError, match="ld.global.v4.f32 .* 16-byte alignment"):
        _k_f32_add[1, 32](cuda.to_device(np.zeros(64, np.float32)), cuda.to_device(np.zeros((4, 20), np.float32)), 2)


@pytest.mark.gpu
def test_f32_vector_load_gpu_numbers():
    check_f32_add(np.random.default_rng())


@pytest.mark.compile
def test_f32_vector_load_in_ptx():
    ptx, _ = cuda.compile_ptx(_k_f32_add.py_func, (types.float32[::1], types.float32[:, ::1], types.int64), cc=(9, 0))
    assert "ld.global.v4.f32" in ptx and "st.global.v4.f32" in ptx


@pytest.mark.compile
def test_f32_vector_instructions_in_ptx():
    ptx, _ = cuda.compile_ptx(_k_f32_vectors.py_func, (types.float32[::1], types.float32[:, ::1], types.int64),
                              cc=(9, 0))
    for needle in ("st.shared.v2.f32", "ld.shared.v4.f32", "st.global.v4.f32"):
        assert needle in ptx, needle
