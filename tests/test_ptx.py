"""kernels.ptx tensor-core helpers, each tested three ways with the same tiny kernels:

* simulator session: the Python fallbacks' numbers, checked against per-lane expectations written here
  independently from the PTX ISA fragment tables (not from the fallbacks' own code);
* `compile`: the kernel compiled with NVVM for sm_90 contains the instruction (a silent fallback is a failure),
  and ptxas (nvJitLink, `tests/ptx_assembly.py`) assembles it for sm_90a;
* `gpu`: the same numbers on a real GPU.
"""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda, float32, types

from kernels import ptx as P
from kernels.ptx import SIMULATOR
from minfer_cli.experiment import rel_l2

sim = pytest.mark.skipif(not SIMULATOR, reason="simulator session only (NUMBA_ENABLE_CUDASIM=1)")

# ---- per-lane layouts, straight from the PTX ISA tables ("Matrix fragments for mma.m16n8k16 with floating
# point type"; "ldmatrix"): g = lane >> 2, t = lane & 3; a .f16x2 register holds the lower index in bits 0..15.


def _pack(lo, hi) -> int:
    bits = np.array([lo, hi], dtype=np.float16).view(np.uint16)
    return int(bits[0]) | (int(bits[1]) << 16)


def _a_regs(a):  # a: 16x16 (m, k)
    out = np.zeros((32, 4), np.uint32)
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        out[lane] = [_pack(a[g, 2 * t], a[g, 2 * t + 1]), _pack(a[g + 8, 2 * t], a[g + 8, 2 * t + 1]),
                     _pack(a[g, 2 * t + 8], a[g, 2 * t + 9]), _pack(a[g + 8, 2 * t + 8], a[g + 8, 2 * t + 9])]
    return out


def _b_regs(b):  # b: 16x8 (k, n)
    out = np.zeros((32, 2), np.uint32)
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        out[lane] = [_pack(b[2 * t, g], b[2 * t + 1, g]), _pack(b[2 * t + 8, g], b[2 * t + 9, g])]
    return out


def _c_regs(c):  # c: 16x8 f32
    out = np.zeros((32, 4), np.float32)
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        out[lane] = [c[g, 2 * t], c[g, 2 * t + 1], c[g + 8, 2 * t], c[g + 8, 2 * t + 1]]
    return out


def _c_from_regs(regs):
    c = np.zeros((16, 8), np.float64)
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        c[g, 2 * t], c[g, 2 * t + 1], c[g + 8, 2 * t], c[g + 8, 2 * t + 1] = regs[lane]
    return c


# ---- kernels ---------------------------------------------------------------------------------------------


@cuda.jit
def _k_mma(areg, breg, creg, dreg):
    lane = cuda.threadIdx.x
    d0, d1, d2, d3 = P.mma_m16n8k16_f32_f16(
        areg[lane * 4], areg[lane * 4 + 1], areg[lane * 4 + 2], areg[lane * 4 + 3],
        breg[lane * 2], breg[lane * 2 + 1],
        creg[lane * 4], creg[lane * 4 + 1], creg[lane * 4 + 2], creg[lane * 4 + 3],
    )
    dreg[lane * 4] = d0
    dreg[lane * 4 + 1] = d1
    dreg[lane * 4 + 2] = d2
    dreg[lane * 4 + 3] = d3


@cuda.jit
def _k_ldmatrix(src, rowsel, out):
    sm = cuda.shared.array(256, types.float16)  # 32 rows of 8 halves (16 bytes each)
    lane = cuda.threadIdx.x
    for i in range(8):
        sm[lane * 8 + i] = src[lane * 8 + i]
    cuda.syncthreads()
    r0, r1, r2, r3 = P.ldmatrix_x4(sm, rowsel[lane] * 8)
    t0, t1, t2, t3 = P.ldmatrix_x4_trans(sm, rowsel[lane] * 8)
    out[lane * 8] = r0
    out[lane * 8 + 1] = r1
    out[lane * 8 + 2] = r2
    out[lane * 8 + 3] = r3
    out[lane * 8 + 4] = t0
    out[lane * 8 + 5] = t1
    out[lane * 8 + 6] = t2
    out[lane * 8 + 7] = t3


WS = 40  # shared row stride in elements for the wmma test: 32 k + 8 padding
WS_TILE = 16 * WS  # (a global constant: numba does not fold 16 * WS inside the kernel)


@cuda.jit
def _k_wmma(a, b, out_shared, out_global):
    """D = A[:, :16]·B[:16] + A[:, 16:]·B[16:] + C from 16x32 A (row-major) and 16x32 B^T rows ([n][k]), both
    staged with row stride WS: the second k-half is at +16 ELEMENTS."""
    sa = cuda.shared.array(WS_TILE, types.float16)
    sb = cuda.shared.array(WS_TILE, types.float16)
    sc = cuda.shared.array(256, types.float32)
    lane = cuda.threadIdx.x
    for e in range(16):
        idx = lane * 16 + e  # 0..511 over a 16x32 tile
        r = idx // 32
        k = idx % 32
        sa[r * WS + k] = a[idx]
        sb[r * WS + k] = b[idx]
    cuda.syncthreads()
    acc = cuda.local.array(8, float32)  # the accumulator layout is opaque: start from zero
    for e in range(8):
        acc[e] = float32(0.0)
    for kh in range(2):
        fa = P.wmma_load_a_f16(sa, kh * 16, WS)
        fb = P.wmma_load_b_f16(sb, kh * 16, WS)
        d = P.wmma_mma_f32_f16(
            fa[0], fa[1], fa[2], fa[3], fa[4], fa[5], fa[6], fa[7],
            fb[0], fb[1], fb[2], fb[3], fb[4], fb[5], fb[6], fb[7],
            acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7],
        )
        for e in range(8):
            acc[e] = d[e]
    P.wmma_store_d_f32_shared(sc, 0, 16, acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7])
    P.wmma_store_d_f32_global(out_global, 0, 16, acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7])
    P.syncwarp()
    for e in range(8):
        out_shared[lane * 8 + e] = sc[lane * 8 + e]


@cuda.jit
def _k_cp_async(src, sizes, dst_chunk, out):
    sm = cuda.shared.array(64, types.uint16)
    lane = cuda.threadIdx.x
    for i in range(2):
        sm[lane * 2 + i] = 0xFFFF  # sentinel: every byte must be overwritten (data or zero-fill)
    cuda.syncthreads()
    if lane < 8:
        P.cp_async_16(sm, dst_chunk[lane] * 8, src, lane * 8, sizes[lane])
    P.cp_async_commit_group()
    P.cp_async_wait_group(0)
    cuda.syncthreads()
    for i in range(2):
        out[lane * 2 + i] = sm[lane * 2 + i]


@cuda.jit
def _k_scalar(src, out_f16, out_u32):
    sm = cuda.shared.array(8, types.uint32)
    lane = cuda.threadIdx.x
    if lane == 0:
        x0, x1, x2, x3 = P.ld_global_v4_b32(src, 8)  # halves 8..15
        P.st_shared_v4_b32(sm, 4, x0, x1, x2, x3)
        packed = P.pack_f16x2(src[0], src[1])
        lo, hi = P.unpack_f16x2(packed)
        out_f16[0] = lo
        out_f16[1] = hi
        out_u32[0] = packed
        for i in range(4):
            out_u32[1 + i] = sm[4 + i]


@cuda.jit
def _k_offsets(src, rowsel, sizes, out, out_cp):
    """The byte-offset forms: ldmatrix_x4_off (lane row = rowsel[l], as a byte offset through opaque_u32) and
    cp_async_16_off (lanes 0..7 copy chunk l of src to chunk 7-l of shared, src_size sizes[l])."""
    sm = cuda.shared.array(256, types.float16)
    sc = cuda.shared.array(64, types.uint16)
    lane = cuda.threadIdx.x
    for i in range(8):
        sm[lane * 8 + i] = src[lane * 8 + i]
    for i in range(2):
        sc[lane * 2 + i] = 0xFFFF
    cuda.syncthreads()
    r0, r1, r2, r3 = P.ldmatrix_x4_off(sm, P.opaque_u32(rowsel[lane] * 16))
    out[lane * 4] = r0
    out[lane * 4 + 1] = r1
    out[lane * 4 + 2] = r2
    out[lane * 4 + 3] = r3
    if lane < 8:
        P.cp_async_16_off(sc, (7 - lane) * 16, src, lane * 16, sizes[lane])
    P.cp_async_commit_group()
    P.cp_async_wait_group(0)
    cuda.syncthreads()
    for i in range(2):
        out_cp[lane * 2 + i] = sc[lane * 2 + i]


# ---- checks (shared by the simulator and GPU tests) ------------------------------------------------------


def check_mma(rng) -> None:
    a = rng.standard_normal((16, 16)).astype(np.float16)
    b = rng.standard_normal((16, 8)).astype(np.float16)
    c = rng.standard_normal((16, 8)).astype(np.float32)
    dreg = cuda.to_device(np.full(128, np.nan, np.float32))
    _k_mma[1, 32](cuda.to_device(_a_regs(a).ravel()), cuda.to_device(_b_regs(b).ravel()),
                  cuda.to_device(_c_regs(c).ravel()), dreg)
    d = _c_from_regs(dreg.copy_to_host().reshape(32, 4))
    ref = a.astype(np.float64) @ b.astype(np.float64) + c
    assert rel_l2(d, ref) < 1e-3


def check_ldmatrix(rng) -> None:
    src = rng.standard_normal(256).astype(np.float16)
    rowsel = rng.permutation(32).astype(np.int32)  # lane l gives row rowsel[l] as row l%8 of matrix l//8
    out = cuda.to_device(np.zeros(256, np.uint32))
    _k_ldmatrix[1, 32](cuda.to_device(src), cuda.to_device(rowsel), out)
    got = out.copy_to_host().reshape(32, 8)
    rows = src.reshape(32, 8)
    mats = [np.stack([rows[rowsel[8 * i + r]] for r in range(8)]) for i in range(4)]
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for i in range(4):
            assert got[lane, i] == _pack(mats[i][g, 2 * t], mats[i][g, 2 * t + 1]), (lane, i)
            assert got[lane, 4 + i] == _pack(mats[i][2 * t, g], mats[i][2 * t + 1, g]), (lane, i, "trans")


def check_wmma(rng) -> None:
    a = rng.standard_normal((16, 32)).astype(np.float16)
    bt = rng.standard_normal((16, 32)).astype(np.float16)  # [n][k]
    out_s = cuda.to_device(np.full(256, np.nan, np.float32))
    out_g = cuda.to_device(np.full(256, np.nan, np.float32))
    _k_wmma[1, 32](cuda.to_device(a.ravel()), cuda.to_device(bt.ravel()), out_s, out_g)
    ref = a.astype(np.float64) @ bt.astype(np.float64).T
    assert rel_l2(out_s.copy_to_host().reshape(16, 16), ref) < 1e-3
    assert rel_l2(out_g.copy_to_host().reshape(16, 16), ref) < 1e-3


def check_cp_async(rng) -> None:
    src = rng.standard_normal(64).astype(np.float16)
    sizes = np.array([16, 0, 8, 16, 2, 16, 0, 14], np.int32)
    dst_chunk = np.array([7, 6, 5, 4, 3, 2, 1, 0], np.int32)  # reversed: dst and src addressing are independent
    out = cuda.to_device(np.zeros(64, np.uint16))
    _k_cp_async[1, 32](cuda.to_device(src), cuda.to_device(sizes), cuda.to_device(dst_chunk), out)
    got = out.copy_to_host().view(np.uint8)
    src_bytes = src.view(np.uint8)
    for lane in range(8):
        chunk = got[dst_chunk[lane] * 16 : dst_chunk[lane] * 16 + 16]
        n = sizes[lane]
        assert np.array_equal(chunk[:n], src_bytes[lane * 16 : lane * 16 + n]), lane
        assert not chunk[n:].any(), f"lane {lane}: bytes past src_size {n} must be zero-filled"


def check_scalar(rng) -> None:
    src = rng.standard_normal(16).astype(np.float16)
    out_f16 = cuda.to_device(np.zeros(2, np.float16))
    out_u32 = cuda.to_device(np.zeros(5, np.uint32))
    _k_scalar[1, 32](cuda.to_device(src), out_f16, out_u32)
    assert np.array_equal(out_f16.copy_to_host(), src[:2])
    u = out_u32.copy_to_host()
    assert u[0] == _pack(src[0], src[1])
    assert np.array_equal(u[1:], src[8:16].view(np.uint32))


def check_offsets(rng) -> None:
    src = rng.standard_normal(256).astype(np.float16)
    rowsel = rng.permutation(32).astype(np.int32)
    sizes = np.array([16, 0, 8, 16, 2, 16, 0, 14], np.int32)
    out = cuda.to_device(np.zeros(128, np.uint32))
    out_cp = cuda.to_device(np.zeros(64, np.uint16))
    _k_offsets[1, 32](cuda.to_device(src), cuda.to_device(rowsel), cuda.to_device(sizes), out, out_cp)
    got = out.copy_to_host().reshape(32, 4)
    rows = src.reshape(32, 8)
    mats = [np.stack([rows[rowsel[8 * i + r]] for r in range(8)]) for i in range(4)]
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for i in range(4):
            assert got[lane, i] == _pack(mats[i][g, 2 * t], mats[i][g, 2 * t + 1]), (lane, i)
    cp = out_cp.copy_to_host().view(np.uint8)
    src_bytes = src.view(np.uint8)
    for lane in range(8):
        chunk = cp[(7 - lane) * 16 : (7 - lane) * 16 + 16]
        n = sizes[lane]
        assert np.array_equal(chunk[:n], src_bytes[lane * 16 : lane * 16 + n]), lane
        assert not chunk[n:].any(), f"lane {lane}: bytes past src_size {n} must be zero-filled"


CHECKS = {
    "offsets": check_offsets,
    "mma": check_mma,
    "ldmatrix": check_ldmatrix,
    "wmma": check_wmma,
    "cp_async": check_cp_async,
    "scalar": check_scalar,
}


@sim
@pytest.mark.parametrize("name", list(CHECKS))
def test_fallback_numbers(name):
    CHECKS[name](np.random.default_rng(1234))


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CHECKS))
def test_gpu_numbers(name):
    CHECKS[name](np.random.default_rng(1234))


@cuda.jit
def _k_cp_async_groups(src, out):
    sm = cuda.shared.array(32, types.uint8)
    lane = cuda.threadIdx.x
    if lane == 0:
        P.cp_async_16(sm, 0, src, 0, 16)
        P.cp_async_commit_group()
        P.cp_async_16(sm, 16, src, 16, 16)
        P.cp_async_commit_group()
        for i in range(32):
            out[i] = sm[i]  # both copies in flight
        P.cp_async_wait_group(1)
        for i in range(32):
            out[32 + i] = sm[i]  # the older group has landed, the newer not
        P.cp_async_wait_group(0)
        for i in range(32):
            out[64 + i] = sm[i]


@sim
def test_simulated_cp_async_lands_at_the_wait_that_retires_its_group():
    """The simulator's cp.async is asynchronous where correctness depends on it: the destination reads
    `kernels.ptx.CP_ASYNC_POISON` from issue until the `cp_async_wait_group` that retires the copy's group, so a
    kernel that decodes a slot before its wait fails in CI as it would on the GPU."""
    src = np.random.default_rng().integers(0, 0xA5, 32, dtype=np.uint8)  # never the poison byte
    out = np.full(96, 7, np.uint8)
    _k_cp_async_groups[1, 32](src, out)
    poison = np.full(16, P.CP_ASYNC_POISON, np.uint8)
    assert np.array_equal(out[:16], poison) and np.array_equal(out[16:32], poison)
    assert np.array_equal(out[32:48], src[:16]) and np.array_equal(out[48:64], poison)
    assert np.array_equal(out[64:], src)


BULK_ALIGN = None if SIMULATOR else 128  # bulk copies need 16-byte aligned shared memory; cudasim takes no alignment


@cuda.jit
def _k_bulk(src, out):
    """Two phases of a one-stage pipeline: thread 0 arms barrier 0 with 128 bytes and bulk-copies src's next 32
    words; every thread waits on the phase's parity, reads the stage and arrives on barrier 1 (all 64 threads), whose
    phase releases the stage for the next copy."""
    bar = cuda.shared.array(2, types.uint64)
    sm = cuda.shared.array(32, types.uint32, alignment=BULK_ALIGN)
    t = cuda.threadIdx.x
    if t == 0:
        P.mbarrier_init(bar, 0, 1)
        P.mbarrier_init(bar, 1, 64)
        P.fence_proxy_async_shared()
    cuda.syncthreads()
    for phase in range(2):
        if t == 0:
            P.mbarrier_arrive_expect_tx(bar, 0, 128)
            P.cp_async_bulk_g2s(sm, 0, src, phase * 32, 128, bar, 0)
        while P.mbarrier_try_wait_parity(bar, 0, phase & 1) == 0:
            pass
        out[phase * 64 + t] = sm[t & 31]
        P.mbarrier_arrive(bar, 1)
        while P.mbarrier_try_wait_parity(bar, 1, phase & 1) == 0:
            pass
    P.setmaxnreg_dec(40)


@cuda.jit
def _k_bulk_early(src, out):
    bar = cuda.shared.array(1, types.uint64)
    sm = cuda.shared.array(8, types.uint32, alignment=BULK_ALIGN)
    P.mbarrier_init(bar, 0, 1)
    P.mbarrier_arrive_expect_tx(bar, 0, 32)
    P.cp_async_bulk_g2s(sm, 0, src, 0, 32, bar, 0)
    out[0] = sm[3]  # before the wait
    while P.mbarrier_try_wait_parity(bar, 0, 0) == 0:
        pass
    out[1] = sm[3]
    P.cp_async_bulk_g2s(sm, 0, src, 8, 32, bar, 0)  # phase 1: the copy before its expect-tx (the ISA allows it)
    P.mbarrier_arrive_expect_tx(bar, 0, 32)  # completes phase 1 here: its last byte and arrival are in
    while P.mbarrier_try_wait_parity(bar, 0, 1) == 0:
        pass
    out[2] = sm[3]


def _check_bulk():
    src = np.random.default_rng().integers(0, 2**32, 64, dtype=np.uint32)
    out = np.zeros(128, np.uint32)
    _k_bulk[1, 64](src, out)
    np.testing.assert_array_equal(out[:64], np.tile(src[:32], 2))
    np.testing.assert_array_equal(out[64:], np.tile(src[32:], 2))


_TMA_ALIGN = None if SIMULATOR else 1024  # the simulator refuses an alignment argument


@cuda.jit
def _k_tma(tmap, out, k0, r0):
    """One 8 x 64 f16 box at column k0, row r0 of the map into 1024-byte aligned shared memory, then out = the 512
    shared elements as they landed (swizzled)."""
    smem = cuda.shared.array(0, types.float16, alignment=_TMA_ALIGN)
    bar = cuda.shared.array(1, types.uint64)
    tid = cuda.threadIdx.x
    if tid == 0:
        P.mbarrier_init(bar, 0, 1)
        P.fence_proxy_async_shared()
    cuda.syncthreads()
    if tid == 0:
        P.mbarrier_arrive_expect_tx(bar, 0, 8 * 128)
        P.cp_async_bulk_tensor_2d_g2s(smem, 0, tmap, 0, k0, r0, bar, 0)
    while P.mbarrier_try_wait_parity(bar, 0, 0) == 0:
        pass
    for i in range(tid, 512, 32):
        out[i] = smem[i]


def _check_tma():
    """A box that runs past the matrix's last row and column: zeros there, and element (r, c) of the box at shared
    element r * 64 + ((c // 8) ^ (r % 8)) * 8 + c % 8 (the 128-byte swizzle), against numpy."""
    m = np.random.default_rng().standard_normal((10, 72)).astype(np.float16)
    dm = cuda.to_device(m)
    tmap = P.tensor_map_2d(dm, 8)
    for k0, r0 in ((32, 5), (0, 0), (64, 2)):
        box = np.zeros((8, 64), np.float16)
        part = m[r0 : r0 + 8, k0 : k0 + 64]
        box[: part.shape[0], : part.shape[1]] = part
        want = np.zeros(512, np.float16)
        for r in range(8):
            for c in range(64):
                want[r * 64 + ((c // 8) ^ (r % 8)) * 8 + c % 8] = box[r, c]
        out = cuda.to_device(np.full(512, np.nan, np.float16))
        _k_tma[1, 32, 0, 1024](tmap, out, k0, r0)
        np.testing.assert_array_equal(out.copy_to_host(), want)


@sim
def test_simulated_tma_box_copy():
    _check_tma()


@pytest.mark.gpu
def test_gpu_tma_box_copy():
    _check_tma()


def test_tensor_map_refusals():
    from kernels.errors import KernelConstraintError

    with pytest.raises(KernelConstraintError, match="2-D float16"):
        P.tensor_map_2d(np.zeros((4, 64), np.float32), 8)
    with pytest.raises(KernelConstraintError, match="multiple of 8"):
        P.tensor_map_2d(np.zeros((4, 60), np.float16), 8)
    with pytest.raises(KernelConstraintError, match="box rows must be 1..256"):
        P.tensor_map_2d(np.zeros((4, 64), np.float16), 512)


@sim
def test_simulated_bulk_copy_pipeline_and_its_poison():
    """The two-phase pipeline's words arrive stage by stage; and a stage read before its barrier's wait holds
    `kernels.ptx.BULK_POISON` in the simulator (on the GPU such a read is a race), the data after it."""
    _check_bulk()
    src = np.random.default_rng().integers(0, 2**32, 16, dtype=np.uint32)
    out = np.zeros(3, np.uint32)
    _k_bulk_early[1, 1](src, out)
    assert out[0] == int.from_bytes(bytes([P.BULK_POISON] * 4), "little") and out[1] == src[3] and out[2] == src[11]


@sim
def test_simulated_mbarrier_refuses_misuse():
    @cuda.jit
    def unaligned(src):
        bar = cuda.shared.array(1, types.uint64)
        sm = cuda.shared.array(16, types.uint32)
        P.mbarrier_init(bar, 0, 1)
        P.cp_async_bulk_g2s(sm, 1, src, 0, 16, bar, 0)

    with pytest.raises(ValueError, match="16-byte aligned"):
        unaligned[1, 1](np.zeros(16, np.uint32))

    @cuda.jit
    def uninitialised(out):
        bar = cuda.shared.array(1, types.uint64)
        out[0] = P.mbarrier_try_wait_parity(bar, 0, 0)

    with pytest.raises(RuntimeError, match="before mbarrier_init"):
        uninitialised[1, 1](np.zeros(1, np.uint32))

    @cuda.jit
    def bad_registers(x):
        P.setmaxnreg_dec(36)

    with pytest.raises(ValueError, match="multiple of 8 in 24..256, got 36"):
        bad_registers[1, 32](np.zeros(1, np.uint32))


@pytest.mark.gpu
def test_gpu_bulk_copy_pipeline():
    _check_bulk()


@sim
def test_warp_fallback_needs_whole_warps():
    with pytest.raises(RuntimeError, match="whole warps"):
        a = np.zeros(64, np.uint32)
        _k_mma[1, 16](a, a, np.zeros(64, np.float32), np.zeros(64, np.float32))


# ---- compile: the instruction is really emitted --------------------------------------------------------

U32 = types.uint32[::1]
F16 = types.float16[::1]
F32 = types.float32[::1]
I32 = types.int32[::1]

COMPILED = {
    "mma": (_k_mma, (U32, U32, F32, F32), ["mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"]),
    "ldmatrix": (_k_ldmatrix, (F16, I32, U32),
                 ["ldmatrix.sync.aligned.m8n8.x4.shared.b16", "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"]),
    "wmma": (_k_wmma, (F16, F16, F32, F32), [
        "wmma.load.a.sync.aligned.row.m16n16k16.shared.f16",
        "wmma.load.b.sync.aligned.col.m16n16k16.shared.f16",
        "wmma.mma.sync.aligned.row.col.m16n16k16.f32.f32",
        "wmma.store.d.sync.aligned.row.m16n16k16.shared.f32",
        "wmma.store.d.sync.aligned.row.m16n16k16.global.f32",
        "bar.warp.sync",
    ]),
    "cp_async": (_k_cp_async, (F16, I32, I32, types.uint16[::1]),
                 ["cp.async.cg.shared.global", "cp.async.commit_group", "cp.async.wait_group 0"]),
    "scalar": (_k_scalar, (F16, F16, U32), ["ld.global.v4.b32", "st.shared.v4.b32", "mov.b32"]),
    "offsets": (_k_offsets, (F16, I32, I32, U32, types.uint16[::1]),
                ["ldmatrix.sync.aligned.m8n8.x4.shared.b16", "cp.async.cg.shared.global", "mov.b32"]),
    "bulk": (_k_bulk, (U32, U32), ["mbarrier.init.shared::cta.b64", "mbarrier.arrive.expect_tx.shared::cta.b64",
                                   "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes",
                                   "mbarrier.try_wait.parity.shared::cta.b64", "mbarrier.arrive.shared::cta.b64",
                                   "setmaxnreg.dec.sync.aligned.u32 40"]),
    "tma": (_k_tma, (types.uint64[::1], F16, types.int32, types.int32),
            ["cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes",
             "mbarrier.arrive.expect_tx.shared::cta.b64"]),
}


def _ptx(kernel, sig) -> str:
    ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=(9, 0))
    return ptx


@pytest.mark.compile
@pytest.mark.parametrize("name", list(COMPILED))
def test_instruction_in_ptx(name):
    kernel, sig, needles = COMPILED[name]
    ptx = _ptx(kernel, sig)
    for needle in needles:
        assert needle in ptx, f"{needle!r} missing from the PTX of {name}"
    assert "ld.local" not in ptx and "st.local" not in ptx, "fragments spilled to local memory"


@pytest.mark.compile
@pytest.mark.parametrize("name", list(COMPILED))
def test_ptxas_accepts_the_kernel_for_sm_90a(name):
    """nvJitLink (ptxas) assembles each helper's kernel for sm_90a: operand types, state spaces and the target's
    features are checked, not only the instruction's presence in the PTX text."""
    from ptx_assembly import assemble

    kernel, sig, _ = COMPILED[name]
    assert assemble(_ptx(kernel, sig))[:4] == b"\x7fELF"


@pytest.mark.compile
def test_setmaxnreg_needs_a_constant_multiple_of_8():
    from numba.core.errors import TypingError

    def variable(n):
        P.setmaxnreg_inc(n)

    def odd(x):
        P.setmaxnreg_dec(36)

    with pytest.raises(TypingError, match="compile-time integer constant"):
        cuda.compile_ptx(variable, (types.int32,), cc=(9, 0))
    with pytest.raises(TypingError, match="multiple of 8 in 24..256, got 36"):
        cuda.compile_ptx(odd, (types.int32,), cc=(9, 0))


@pytest.mark.compile
def test_wait_group_needs_a_constant():
    from numba.core.errors import TypingError

    def k(n):
        P.cp_async_wait_group(n)

    with pytest.raises(TypingError, match="compile-time integer constant"):
        cuda.compile_ptx(k, (types.int32,), cc=(9, 0))


@pytest.mark.compile
def test_wait_group_constant_from_closure():
    for n in (1, 3):

        def k(x):
            P.cp_async_wait_group(n)

        assert f"cp.async.wait_group {n};" in cuda.compile_ptx(k, (types.int32,), cc=(9, 0))[0]


@pytest.mark.compile
def test_mma_rejects_wrong_register_types():
    from numba.core.errors import TypingError

    def k(x):
        f = float32(0)
        P.mma_m16n8k16_f32_f16(f, f, f, f, f, f, f, f, f, f)

    with pytest.raises(TypingError, match="must be Integer"):
        cuda.compile_ptx(k, (types.int32,), cc=(9, 0))


@cuda.jit
def _k_tma_bytes(tmap, out, k0, r0):
    """One 8-row x 32-byte box of a byte map at column k0, row r0 into shared memory (no swizzle), out = the 256
    shared bytes as they landed, then the same bytes read back 16 at a time (`ld_shared_v4_b32`) into out[256:]."""
    smem = cuda.shared.array(0, types.uint8, alignment=_TMA_ALIGN)
    bar = cuda.shared.array(1, types.uint64)
    tid = cuda.threadIdx.x
    if tid == 0:
        P.mbarrier_init(bar, 0, 1)
        P.fence_proxy_async_shared()
    cuda.syncthreads()
    if tid == 0:
        P.mbarrier_arrive_expect_tx(bar, 0, 8 * 32)
        P.cp_async_bulk_tensor_2d_g2s(smem, 0, tmap, 0, k0, r0, bar, 0)
    while P.mbarrier_try_wait_parity(bar, 0, 0) == 0:
        pass
    for i in range(tid, 256, 32):
        out[i] = smem[i]
    if tid < 16:
        w = P.ld_shared_v4_b32(smem, tid * 16)
        for j in range(4):
            for b in range(4):
                out[256 + tid * 16 + 4 * j + b] = (w[j] >> (8 * b)) & 0xFF


def _check_tma_bytes():
    """A byte box that runs past the last row and column: zeros there, rows packed 32 bytes apart, against numpy."""
    m = np.random.default_rng().integers(1, 256, size=(10, 48), dtype=np.uint8)
    tmap = P.tensor_map_bytes_2d(cuda.to_device(m), 8, 32)
    for k0, r0 in ((16, 5), (0, 0), (32, 2)):
        box = np.zeros((8, 32), np.uint8)
        part = m[r0 : r0 + 8, k0 : k0 + 32]
        box[: part.shape[0], : part.shape[1]] = part
        out = cuda.to_device(np.full(512, 7, np.uint8))
        _k_tma_bytes[1, 32, 0, 256](tmap, out, k0, r0)
        got = out.copy_to_host()
        np.testing.assert_array_equal(got[:256], box.reshape(-1))
        np.testing.assert_array_equal(got[256:], box.reshape(-1))


@sim
def test_simulated_tma_byte_box_copy_and_shared_vector_load():
    _check_tma_bytes()


@pytest.mark.gpu
def test_gpu_tma_byte_box_copy_and_shared_vector_load():
    _check_tma_bytes()


def test_byte_tensor_map_refusals():
    from kernels.errors import KernelConstraintError

    with pytest.raises(KernelConstraintError, match="2-D uint8"):
        P.tensor_map_bytes_2d(np.zeros((4, 64), np.float16), 8, 16)
    with pytest.raises(KernelConstraintError, match="multiple of 16 \\(row pitch\\)"):
        P.tensor_map_bytes_2d(np.zeros((4, 40), np.uint8), 8, 16)
    with pytest.raises(KernelConstraintError, match="16..256 bytes"):
        P.tensor_map_bytes_2d(np.zeros((4, 64), np.uint8), 8, 24)


@cuda.jit
def _k_named_barrier(out):
    """Warps 0 and 1 exchange through shared memory behind named barrier 1 (64 threads) while warp 2 never joins;
    then every thread meets at syncthreads."""
    sh = cuda.shared.array(64, types.int32)
    tid = cuda.threadIdx.x
    if tid < 64:
        sh[tid] = tid * 3 + 1
        P.bar_sync(1, 64)
        out[tid] = sh[63 - tid]
    else:
        out[tid] = -tid
    cuda.syncthreads()


def _check_named_barrier():
    out = cuda.to_device(np.zeros(96, np.int32))
    _k_named_barrier[1, 96](out)
    got = out.copy_to_host()
    np.testing.assert_array_equal(got[:64], (63 - np.arange(64)) * 3 + 1)
    np.testing.assert_array_equal(got[64:], -np.arange(64, 96))


@sim
def test_simulated_named_barrier():
    _check_named_barrier()


@pytest.mark.gpu
def test_gpu_named_barrier():
    _check_named_barrier()


@pytest.mark.compile
def test_named_barrier_and_shared_vector_load_in_ptx():
    ptx, _ = cuda.compile_ptx(_k_named_barrier.py_func, (types.int32[::1],), cc=(9, 0))
    assert "barrier.sync.aligned" in ptx
    ptx, _ = cuda.compile_ptx(_k_tma_bytes.py_func, (types.uint64[::1], types.uint8[::1], types.int32, types.int32),
                              cc=(9, 0))
    assert "ld.shared.v4.b32" in ptx and "cp.async.bulk.tensor.2d" in ptx
