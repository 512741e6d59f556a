"""kernels/ptx/wgmma.py and gemm_f16's MMA=wgmma path (sm_90a warpgroup MMA), tested like kernels.ptx's other helpers:

* simulator session: the fallback's numbers for one m64nNk16 product read through descriptors (no-swizzle core
  matrices with LBO/SBO, and the 64-byte swizzle the GEMM tiles use), checked against the accumulator fragment
  table of the PTX ISA written out here independently; the shared-memory layout rule against the GEMM's
  cp.async staging formula; small GEMMs with nt/od (and k) tails against float64;
* `compile`: the instructions are in the sm_90a PTX, the wait depths follow the knobs, nothing spills;
* `gpu`: the same product on the H200, and real Qwen2-7B shapes against torch.
"""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda, float32, types

from kernels import gemm_f16 as G, gemm_tma
from kernels.ptx import wgmma as W
from kernels.errors import KernelConstraintError
from kernels.ptx import SIMULATOR

sim = pytest.mark.skipif(not SIMULATOR, reason="simulator session only (NUMBA_ENABLE_CUDASIM=1)")
# 256x128x32, 3 stages, GROUP 8, LOOP=pipe: 2 warpgroups of m64n256 (64-byte swizzle); G.DEFAULT is the same with
# KS=64 (128-byte swizzle) and 4 stages
WG = dict(G.MMA_SYNC_BEST, MMA="wgmma")


# ---- the shared-memory layouts, written from the PTX ISA independently of operand_byte_offsets -------------


def _place_noswizzle(mat, lbo, sbo):
    """Byte image of a K-major [rows, 16] f16 operand as 8x16-byte core matrices (PTX ISA "Shared Memory Matrix
    Layout", no swizzle): core matrix (r // 8, k // 8) at (r // 8) * sbo + (k // 8) * lbo, its row r % 8 at +16 B."""
    rows = mat.shape[0]
    img = np.zeros((rows // 8 - 1) * sbo + lbo + 128, np.uint8)
    bits = mat.astype(np.float16).view(np.uint8).reshape(rows, 16, 2)
    for r in range(rows):
        for kc in range(2):
            at = (r // 8) * sbo + kc * lbo + (r % 8) * 16
            img[at : at + 16] = bits[r, 8 * kc : 8 * kc + 8].reshape(-1)
    return img


def _place_gemm_tile(mat, ks):
    """Byte image of a [rows, ks] f16 tile as gemm_f16 stages it (kernels/gemm_f16.py copy plan): row r at r * 2ks
    bytes, its 16-byte chunk c at chunk c ^ ((r >> 1) & 3) (KS=32) or c ^ (r & 7) (KS=64)."""
    rows = mat.shape[0]
    rowb = 2 * ks
    img = np.zeros(rows * rowb, np.uint8)
    bits = mat.astype(np.float16).view(np.uint8).reshape(rows, ks // 8, 16)
    for r in range(rows):
        for c in range(ks // 8):
            p = c ^ (((r >> 1) & 3) if ks == 32 else (r & 7))
            img[r * rowb + 16 * p : r * rowb + 16 * p + 16] = bits[r, c]
    return img


def _d_from_fragments(regs, n):
    """D[64, n] from the 128 threads' n/2 accumulators (PTX ISA "Matrix Fragments for wgmma.m64nNk16", f32 D)."""
    d = np.zeros((64, n), np.float64)
    for tw in range(128):
        w, lane = tw // 32, tw % 32
        g, t = lane // 4, lane % 4
        for j in range(n // 8):
            d[16 * w + g, 8 * j + 2 * t], d[16 * w + g, 8 * j + 2 * t + 1] = regs[tw, 4 * j], regs[tw, 4 * j + 1]
            d[16 * w + g + 8, 8 * j + 2 * t], d[16 * w + g + 8, 8 * j + 2 * t + 1] = regs[tw, 4 * j + 2], regs[tw, 4 * j + 3]
    return d


@pytest.mark.parametrize("ks", [32, 64])
def test_swizzled_layout_rule_is_the_gemm_staging(ks):
    """Descriptors over gemm_f16's cp.async tiles: element (r, k) of the k16 step kq, addressed by the swizzle rule
    with start 32 * kq and SBO = 8 rows, is where the staging put it."""
    rng = np.random.default_rng(1)
    tile = rng.standard_normal((64, ks)).astype(np.float16)
    img = _place_gemm_tile(tile, ks)
    mode = W.SWIZZLE_64B if ks == 32 else W.SWIZZLE_128B
    for kq in range(ks // 16):
        addr = W.operand_byte_offsets(W.desc_value(32 * kq, 16, 16 * ks, mode), 64)
        got = (img[addr].astype(np.uint16) | (img[addr + 1].astype(np.uint16) << 8)).view(np.float16)
        np.testing.assert_array_equal(got, tile[:, 16 * kq : 16 * kq + 16])


def test_descriptor_bits():
    d = W.desc_value(0x1_2340, 128, 1024, W.SWIZZLE_128B)
    assert d & 0x3FFF == 0x1234 and (d >> 16) & 0x3FFF == 8 and (d >> 32) & 0x3FFF == 64 and d >> 62 == 1
    assert (d >> 49) & 7 == 0


# ---- one m64nNk16 product through a kernel --------------------------------------------------------------------

N_TEST = 16
N_HALF = N_TEST // 2  # (numba needs the array size as a plain global constant)
_IMG = 8192
_ALIGN = None if SIMULATOR else 1024  # the simulator refuses an alignment argument


@cuda.jit
def _k_wgmma(img, lbo, sbo, mode, b_off, c, out, scale):
    smem = cuda.shared.array(_IMG, types.uint8, alignment=_ALIGN)  # swizzled layouts: 512/1024-byte aligned
    tid = cuda.threadIdx.x
    for i in range(tid, _IMG, 128):
        smem[i] = img[i]
    acc = cuda.local.array(N_HALF, float32)
    for i in range(N_HALF):
        acc[i] = c[tid * (N_HALF) + i]
    W.fence_proxy_async_shared()
    cuda.syncthreads()
    da = W.wgmma_desc(smem, 0, lbo, sbo, mode)
    db = W.wgmma_desc(smem, b_off, lbo, sbo, mode)
    W.wgmma_fence()
    W.wgmma_m64nNk16_f32_f16(smem, acc, 0, da, db, scale, N_TEST)
    W.wgmma_commit_group()
    W.wgmma_wait_group(0)
    for i in range(N_HALF):
        out[tid * (N_HALF) + i] = acc[i]


def _check_one_product(layout: str, scale: int, placed_sbo: int | None = None):
    rng = np.random.default_rng(3)
    a = rng.standard_normal((64, 16)).astype(np.float16)
    b = rng.standard_normal((N_TEST, 16)).astype(np.float16)
    c = rng.standard_normal((128, N_TEST // 2)).astype(np.float32)
    img = np.zeros(_IMG, np.uint8)
    if layout == "none":
        lbo, sbo, mode, b_off = 128, 256, W.SWIZZLE_NONE, 2048  # K-adjacent core matrices 128 B apart, 8-row groups 256 B
        ia, ib = _place_noswizzle(a, lbo, placed_sbo or sbo), _place_noswizzle(b, lbo, placed_sbo or sbo)
    else:  # the gemm's KS=32 tiles: 64-byte rows, 64-byte swizzle, 8-row groups 512 B apart; k16 step 0
        lbo, sbo, mode, b_off = 16, 512, W.SWIZZLE_64B, 4096
        pad = np.zeros((64, 16), np.float16)
        ia = _place_gemm_tile(np.concatenate([a, pad], 1), 32)
        ib = _place_gemm_tile(np.concatenate([b, pad[:N_TEST]], 1), 32)
    img[: ia.size] = ia
    img[b_off : b_off + ib.size] = ib
    out = cuda.to_device(np.full(128 * (N_TEST // 2), np.nan, np.float32))
    _k_wgmma[1, 128](cuda.to_device(img), lbo, sbo, mode, b_off, cuda.to_device(c.reshape(-1)), out, scale)
    got = _d_from_fragments(out.copy_to_host().reshape(128, N_TEST // 2), N_TEST)
    ref = a.astype(np.float64) @ b.astype(np.float64).T
    if scale:
        ref += _d_from_fragments(c, N_TEST)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-4)


@sim
@pytest.mark.parametrize("layout", ["none", "swizzle64"])
def test_wgmma_simulator_numbers(layout):
    _check_one_product(layout, 1)


@sim
def test_wgmma_simulator_scale_d_zero_ignores_c():
    _check_one_product("swizzle64", 0)


_IMG_RS = 17408  # B from byte 1024: up to two 8192-byte MN-major blocks


def _rs_kernel(trans_b: int, n: int = N_TEST):
    """The register-A product's test kernel for D [64 x n]: B K-major (64-byte swizzle, SBO 512) or, ``trans_b``,
    MN-major (128-byte swizzle, SBO 1024 between 8-row k groups, LBO 8192 between 64-element n blocks)."""
    mode, lbo, sbo = (W.SWIZZLE_128B, 8192, 1024) if trans_b else (W.SWIZZLE_64B, 16, 512)
    half = n // 2

    def k_wgmma_rs(img, afrag, b_off, c, out, scale):
        smem = cuda.shared.array(_IMG_RS, types.uint8, alignment=_ALIGN)
        tid = cuda.threadIdx.x
        for i in range(tid, _IMG_RS, 128):
            smem[i] = img[i]
        acc = cuda.local.array(half, float32)
        for i in range(half):
            acc[i] = c[tid * half + i]
        W.fence_proxy_async_shared()
        cuda.syncthreads()
        db = W.wgmma_desc(smem, b_off, lbo, sbo, mode)
        W.wgmma_fence()
        W.wgmma_m64nNk16_f32_f16_rs(smem, acc, 0, afrag[tid * 4], afrag[tid * 4 + 1], afrag[tid * 4 + 2],
                                    afrag[tid * 4 + 3], db, scale, n, trans_b)
        W.wgmma_commit_group()
        W.wgmma_wait_group(0)
        for i in range(half):
            out[tid * half + i] = acc[i]

    return k_wgmma_rs


_K_RS = {(t, n): cuda.jit(_rs_kernel(t, n)) for t, n in ((0, N_TEST), (1, N_TEST), (1, 128))}


def _a_fragments(a):
    """[128, 4] uint32: each thread's f16x2 A registers of a [64, 16] A, per the PTX ISA's register fragment table
    for wgmma's A (a warp's 16 rows as mma.m16n8k16's A fragment), written out here independently."""
    words = np.zeros((128, 4), np.uint32)
    bits = a.astype(np.float16).view(np.uint16).astype(np.uint32)
    for tw in range(128):
        w, lane = tw // 32, tw % 32
        g, t = lane // 4, lane % 4
        for i, (dr, dk) in enumerate(((0, 0), (8, 0), (0, 8), (8, 8))):
            r, k = 16 * w + g + dr, 2 * t + dk
            words[tw, i] = bits[r, k] | (bits[r, k + 1] << 16)
    return words


def _place_mn_major(b):
    """Byte image (placed 1024-aligned) of B [n, 16] stored MN-major with the 128-byte swizzle: element n's block
    of 64 at (n // 64) * 8192 (the LBO), in it k row (k % 8) of 8-row group k // 8 at (k % 8) * 128 + (k // 8) *
    1024, element n % 64 at 2 (n % 64) in it, 16-byte chunks XORed with the row (CUTLASS's Layout_MN_SW128_Atom:
    64 f16 along MN x 8 along K, Swizzle<3,4,3>), written out here independently."""
    img = np.zeros(8192 * ((b.shape[0] + 63) // 64), np.uint8)
    bits = b.astype(np.float16).view(np.uint8).reshape(b.shape[0], 16, 2)
    for n in range(b.shape[0]):
        for k in range(16):
            row = (n // 64) * 8192 + (k // 8) * 1024 + (k % 8) * 128
            m = n % 64
            chunk = ((2 * m) // 16) ^ (k % 8)
            img[row + chunk * 16 + (2 * m) % 16: row + chunk * 16 + (2 * m) % 16 + 2] = bits[n, k]
    return img


def _check_one_rs_product(scale: int, trans_b: int = 0, n: int = N_TEST):
    rng = np.random.default_rng()
    a = rng.standard_normal((64, 16)).astype(np.float16)
    b = rng.standard_normal((n, 16)).astype(np.float16)
    c = rng.standard_normal((128, n // 2)).astype(np.float32)
    img = np.zeros(_IMG_RS, np.uint8)
    if trans_b:
        ib = _place_mn_major(b)
    else:
        ib = _place_gemm_tile(np.concatenate([b, np.zeros((n, 16), np.float16)], 1), 32)
    img[1024 : 1024 + ib.size] = ib
    out = cuda.to_device(np.full(128 * (n // 2), np.nan, np.float32))
    _K_RS[(trans_b, n)][1, 128](cuda.to_device(img), cuda.to_device(_a_fragments(a).reshape(-1)), 1024,
                                cuda.to_device(c.reshape(-1)), out, scale)
    got = _d_from_fragments(out.copy_to_host().reshape(128, n // 2), n)
    ref = a.astype(np.float64) @ b.astype(np.float64).T
    if scale:
        ref += _d_from_fragments(c, n)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-4)


@sim
@pytest.mark.parametrize("scale,trans_b,n", [(1, 0, N_TEST), (0, 0, N_TEST), (1, 1, N_TEST), (1, 1, 128)])
def test_wgmma_register_a_simulator_numbers(scale, trans_b, n):
    """The register-A form: A from the threads' fragments (written out independently above), B through a K-major
    64-byte swizzled descriptor or an MN-major 128-byte one (n = 128: two 64-element blocks, LBO apart); a
    transposed or misplaced fragment word would move rows or k columns of A."""
    _check_one_rs_product(scale, trans_b, n)


@sim
def test_wgmma_simulator_catches_a_wrong_sbo():
    with pytest.raises(AssertionError):  # core matrices placed 384 B apart, the descriptor says 256
        _check_one_product("none", 1, placed_sbo=384)


# ---- gemm_f16 MMA=wgmma in the simulator ----------------------------------------------------------------------


def _product(config, nt, od, id_, rng):
    """(a, b, got, ref): random f16 operands A[nt, id_], B[od, id_], gemm_f16's C into a NaN-poisoned output (every
    element checked written) and float64's A Bᵀ."""
    a = rng.standard_normal((nt, id_)).astype(np.float16)
    b = rng.standard_normal((od, id_)).astype(np.float16)
    out = cuda.to_device(np.full((nt, od), np.nan, np.float32))
    G.gemm_f16(cuda.to_device(a), cuda.to_device(b), out, config=config)
    got = out.copy_to_host()
    assert np.isfinite(got).all(), "some outputs were never written"
    return a, b, got, a.astype(np.float64) @ b.astype(np.float64).T


def _run(config, nt, od, id_, seed=0):
    _, _, got, ref = _product(config, nt, od, id_, np.random.default_rng(seed))
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


SIM_CASES = [
    ("64x64, pipe, 3 stages, tails, 2 od tiles", dict(WG, TM=64, TN=64), (33, 70, 128)),
    ("64x64, addr32, 2 stages, GROUP 1", dict(WG, TM=64, TN=64, STAGES=2, LOOP="addr32", GROUP=1), (33, 70, 96)),
    ("128x64 (2 m64 slices per warpgroup), KS=64 k tail", dict(WG, TM=64, TN=128, KS=64, STAGES=4), (17, 9, 96)),
    ("256x128x32: 2 warpgroups m64n256", WG, (33, 70, 64)),
    ("default: 256x128x64, 4 stages, k tail", dict(G.DEFAULT, AUTOTILE=0), (33, 70, 96)),
    ("tma: 64x64, 3 stages, tails, 4 k tiles", dict(G.DEFAULT, STAGING="tma", TM=64, TN=64, STAGES=3), (33, 70, 224)),
    ("tma: 128x64, 2 stages (the ring wraps twice)", dict(G.DEFAULT, STAGING="tma", TM=128, TN=64, STAGES=2),
     (65, 130, 256)),
    ("tma: 128x128, 2 stages (staged C tile larger than the ring), 16-byte rows", dict(G.DEFAULT, TM=128, STAGES=2),
     (70, 136, 128)),
    ("tma: EPI=direct", dict(G.DEFAULT, TM=64, TN=64, STAGES=3, EPI="direct"), (33, 72, 128)),
    ("tma: EPI=direct, 128x128, 2 stages (the barriers right after the ring)",
     dict(G.DEFAULT, TM=128, STAGES=2, EPI="direct", AUTOTILE=0), (70, 136, 128)),
    ("tma: 192x128, m64n192, 48 chunks a staged C row (a warp across two rows), od and nt tails",
     dict(G.DEFAULT, TM=192, SPLITK=1), (70, 260, 128)),
    ("tma: 192x128, EPI=direct", dict(G.DEFAULT, TM=192, EPI="direct", SPLITK=1), (33, 200, 128)),
    ("tma: 144x128, m64n144, 36 chunks a staged C row, od and nt tails", dict(G.DEFAULT, TM=144, SPLITK=1),
     (70, 236, 128)),
    ("tma: 144x128, EPI=direct, tails", dict(G.DEFAULT, TM=144, EPI="direct", SPLITK=1), (33, 150, 128)),
]

TMA = dict(G.DEFAULT, STAGING="tma")


@sim
@pytest.mark.parametrize("nocall", [0, 1])
def test_gemm_tma_simulator_split_k_matches_float64(nocall):
    """STAGING=tma with every tile in 3 uneven k slices (each producer starts at its slice's k tile): poisoned C and
    partials, float64 within 1e-3; NOCALL=1 divides the slice and tile indices in uint32."""
    nt, od, id_ = 33, 70, 640
    config = dict(TMA, TM=64, TN=64, SPLITK=3, NOCALL=nocall)
    rng = np.random.default_rng(5)
    a = rng.standard_normal((nt, id_)).astype(np.float16)
    b = rng.standard_normal((od, id_)).astype(np.float16)
    out = cuda.to_device(np.full((nt, od), np.nan, np.float32))
    partials = cuda.to_device(np.full(G.partials_elements(config, nt, od, id_), np.nan, np.float32))
    G.gemm_f16(cuda.to_device(a), cuda.to_device(b), out, config=config, partials=partials)
    got = out.copy_to_host()
    ref = a.astype(np.float64) @ b.astype(np.float64).T
    assert np.isfinite(got).all()
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-3


@sim
def test_gemm_tma_staged_epilogue_writes_a_misaligned_out_with_4_byte_stores():
    """An out whose rows do not start on 16-byte boundaries (a view one float into its buffer) gets the staged tile
    through 4-byte stores (c_vectors = 0; a 16-byte store there would fault, as the simulator's does); the float
    before it keeps its poison."""
    nt, od, id_ = 20, 68, 128
    rng = np.random.default_rng(7)
    a = rng.standard_normal((nt, id_)).astype(np.float16)
    b = rng.standard_normal((od, id_)).astype(np.float16)
    flat = cuda.to_device(np.full(nt * od + 1, np.nan, np.float32))
    out = flat[1:].reshape(nt, od)
    assert gemm_tma.c_vectors(out, out) == 0 and gemm_tma.c_vectors(flat[:nt * od].reshape(nt, od), out) == 0
    G.gemm_f16(cuda.to_device(a), cuda.to_device(b), out, config=dict(G.DEFAULT, TM=64, TN=64, STAGES=3))
    got = flat.copy_to_host()
    ref = a.astype(np.float64) @ b.astype(np.float64).T
    assert np.isnan(got[0])
    assert np.linalg.norm(got[1:].reshape(nt, od) - ref) / np.linalg.norm(ref) < 1e-3


@sim
@pytest.mark.parametrize("config,shape", [c[1:] for c in SIM_CASES], ids=[c[0] for c in SIM_CASES])
def test_gemm_wgmma_simulator_matches_float64(config, shape):
    assert _run(config, *shape) < 1e-3


# ---- the residual epilogue: accumulate, C += A · B^T -----------------------------------------------------------

SMALL_TMA = dict(G.DEFAULT, TM=64, TN=64, STAGES=3, SPLITK=1)
ADD_CASES = [  # (config, (nt, od, id), SMs, out one float into its buffer: 4-byte stores)
    ("whole tiles, 16-byte rows", SMALL_TMA, (33, 72, 128), 132, False),
    ("whole tiles, a misaligned out", SMALL_TMA, (20, 68, 128), 132, True),
    ("EPI=direct", dict(SMALL_TMA, EPI="direct"), (33, 70, 128), 132, False),
    ("every tile in 3 slices", dict(SMALL_TMA, SPLITK=3), (33, 70, 192), 132, False),
    ("the last wave's tiles in 2 slices", dict(SMALL_TMA, SPLITK=0), (33, 200, 128), 3, False),
    ("192-wide tiles, 4-byte rows at the od tail", dict(G.DEFAULT, TM=192, SPLITK=1), (20, 198, 128), 132, False),
    ("192-wide tiles in 3 slices", dict(G.DEFAULT, TM=192, SPLITK=3), (20, 200, 192), 132, False),
    ("144-wide tiles, an od tail", dict(G.DEFAULT, TM=144, SPLITK=1), (20, 230, 128), 132, False),
]


def _accumulate_case(config, nt, od, id_, offset, rng, gemm):
    """(x0, the product into a poisoned buffer, x0 after ``gemm(out=x, accumulate=True)``), all host arrays; the
    word before an offset x keeps its poison."""
    x0 = (4 * rng.standard_normal((nt, od))).astype(np.float32)
    prod = cuda.to_device(np.full((nt, od), np.nan, np.float32))
    gemm(prod, False)
    flat = cuda.to_device(np.concatenate([np.full(offset, np.nan, np.float32), x0.reshape(-1)]))
    x = flat[offset:].reshape(nt, od)
    assert gemm(x, True) is x
    got = flat.copy_to_host()
    assert np.isnan(got[:offset]).all()
    return x0, prod.copy_to_host(), got[offset:].reshape(nt, od)


@sim
@pytest.mark.parametrize("config,shape,sms,misaligned", [c[1:] for c in ADD_CASES], ids=[c[0] for c in ADD_CASES])
def test_accumulate_is_the_product_then_the_residual_add_bit_for_bit(monkeypatch, config, shape, sms, misaligned):
    """gemm_f16(accumulate=True) leaves x0 + (the product gemm_f16 writes) in every element, the same f32 bits as
    the product into a buffer then the residual add, over whole tiles (staged and direct epilogues, 16- and 4-byte
    rows) and split ones (every tile: the slice sum adds; the last wave's: the tile sum adds); fresh random x0 and
    operands, poisoned partials; and the sum is x0 plus the float64 product within 1e-3."""
    monkeypatch.setattr(G, "device_sms", lambda: sms)
    monkeypatch.setattr(G.gemm_f16_config, "MIN_KTILES_PER_SLICE", 1)
    nt, od, id_ = shape
    plan = G.split_plan(config, nt, od, id_)
    assert (plan.slices, plan.whole > 0) == {0: (2, True), 3: (3, False)}.get(config.get("SPLITK", 1), (1, True))
    rng = np.random.default_rng()
    a = rng.standard_normal((nt, id_)).astype(np.float16)
    b = rng.standard_normal((od, id_)).astype(np.float16)
    da, db = cuda.to_device(a), cuda.to_device(b)
    need = max(1, G.partials_elements(config, nt, od, id_))

    def gemm(out, accumulate):
        partials = cuda.to_device(np.full(need, np.nan, np.float32))
        return G.gemm_f16(da, db, out, config=config, partials=partials, accumulate=accumulate)

    x0, prod, got = _accumulate_case(config, nt, od, id_, int(misaligned), rng, gemm)
    assert np.isfinite(prod).all()
    assert np.array_equal(got, x0 + prod)
    ref = x0 + a.astype(np.float64) @ b.astype(np.float64).T
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref - x0) < 1e-3


def test_accumulate_refusals():
    """accumulate without out, with the cp.async kernels, or with the SwiGLU epilogue: one line each, before any
    launch."""
    a, b = np.zeros((4, 64), np.float16), np.zeros((8, 64), np.float16)
    with pytest.raises(KernelConstraintError, match="accumulate adds the product to out; pass the f32"):
        G.gemm_f16(a, b, accumulate=True)
    with pytest.raises(KernelConstraintError, match=r"residual epilogue \(C \+= A·B\^T\) is in the STAGING=tma"):
        G.geometry(dict(WG), accumulate=True)
    with pytest.raises(KernelConstraintError, match="SwiGLU epilogue writes f16 activations"):
        G.geometry(None, glu=True, accumulate=True)
    assert G.geometry(None, accumulate=True).accumulate and G.geometry(dict(G.DEFAULT, EPI="direct"), accumulate=True).accumulate


def test_wgmma_invalid_combinations_are_refused():
    for bad, match in (
        (dict(WG, STAGING="sync"), "MMA=wgmma needs STAGING=cp_async"),
        (dict(WG, STAGING="tma"), r"STAGING=tma \(the default\) needs MMA=wgmma, KS=64"),  # WG has KS=32
        (dict(G.DEFAULT, STAGING="tma", LOOP="addr32"), "LOOP=pipe"),
        (dict(G.MMA_SYNC_BEST, STAGING="tma", KS=64), r"STAGING=tma \(the default\) needs MMA=wgmma"),
        (dict(WG, LOOP="v1"), "LOOP=addr32 or pipe"),
        (dict(WG, STAGES=2), "STAGES >= 3"),
        (dict(WG, TM=192), "TM=192 is a STAGING=tma tile"),
    ):
        with pytest.raises(KernelConstraintError, match=match):
            G.resolve_config(bad)
    assert G.resolve_config(dict(WG, STAGES=2, LOOP="addr32"))["MMA"] == "wgmma"


def test_wgmma_geometry():
    # 256x128: 2 warpgroups split nt (m64 each), n = 256; 64x256: 2 warpgroups split od, n = 128
    assert G.geometry(WG).threads == 256
    assert G.geometry(dict(WG, TN=64, TM=64)).threads == 128
    n_wgmma = sum(1 for c in G.all_configs() if c["MMA"] == "wgmma" and c["STAGING"] == "cp_async")
    assert n_wgmma == 3 * 2 * 2 * 3 * (3 + 2) * 2  # TM x TN x KS x GROUP x (addr32: 3 stage counts, pipe: 2) x NOCALL
    # TM (64, 128, 144, 192, 256) x TN x STAGES x GROUP x EPI x NOCALL
    assert sum(1 for c in G.all_configs() if c["STAGING"] == "tma") == 5 * 2 * 3 * 3 * 2 * 2
    assert G.geometry(dict(G.DEFAULT, STAGING="tma")).threads == 256 + 32  # plus the producer warp
    assert G.geometry(dict(G.DEFAULT, STAGING="tma")).smem_bytes == 4 * (256 + 128) * 128 + 4 * 16


# ---- compile: sm_90a PTX -------------------------------------------------------------------------------------


def _expected_n(cfg):
    g = G.geometry(cfg)
    wgs = g.warps // 4
    wg_n = min(wgs, g.tn // 64)
    return g.tm // (wgs // wg_n)


COMPILE_CASES = [  # the cp.async kernels (STAGING=tma: test_tma_ptx)
    dict(G.DEFAULT, STAGING="cp_async"),
    WG,
    dict(WG, LOOP="addr32"),
    dict(WG, KS=64, STAGES=4),
    dict(WG, TM=64, TN=64, STAGES=2, LOOP="addr32"),
    dict(WG, TM=256, TN=64),
    dict(WG, TM=64, TN=128),
]


@pytest.mark.compile
@pytest.mark.parametrize("config", COMPILE_CASES, ids=lambda c: " ".join(f"{k}={v}" for k, v in c.items()))
def test_wgmma_ptx(config):
    cfg = G.resolve_config(config)
    ptx = G.kernel_ptx(config)
    d = 1 if cfg["LOOP"] == "pipe" else 0
    assert ".target sm_90a" in ptx
    assert f"wgmma.mma_async.sync.aligned.m64n{_expected_n(cfg)}k16.f32.f16.f16" in ptx
    assert "fence.proxy.async.shared::cta" in ptx and "wgmma.fence.sync.aligned" in ptx
    assert "wgmma.commit_group.sync.aligned" in ptx and f"wgmma.wait_group.sync.aligned {d};" in ptx
    assert f"cp.async.wait_group {cfg['STAGES'] - 2 - d};" in ptx
    assert ".extern .shared .align 1024" in ptx
    assert "ldmatrix" not in ptx and "mma.sync" not in ptx
    assert "ld.local" not in ptx and "st.local" not in ptx, "accumulators in local memory"


@pytest.mark.compile
@pytest.mark.parametrize("config", [TMA, dict(TMA, TM=128, TN=64, STAGES=2), dict(TMA, EPI="direct"),
                                    dict(TMA, TM=192)],
                         ids=["default", "128x64", "EPI=direct", "192x128"])
def test_tma_ptx(config):
    """STAGING=tma: the producer's box copies and mbarriers, the consumers' wgmma at n = the warpgroup's od columns
    with one batch in flight, no cp.async, nothing in local memory; ptxas accepts it for sm_90a."""
    from ptx_assembly import ptxas_resources

    ptx = G.kernel_ptx(config)
    for needle in ("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes",
                   "mbarrier.init.shared::cta.b64", "mbarrier.arrive.expect_tx.shared::cta.b64",
                   "mbarrier.try_wait.parity.shared::cta.b64", "mbarrier.arrive.shared::cta.b64",
                   f"wgmma.mma_async.sync.aligned.m64n{_expected_n(config)}k16.f32.f16.f16",
                   "wgmma.wait_group.sync.aligned 1;", ".extern .shared .align 1024"):
        assert needle in ptx, needle
    # EPI=staged: C through shared memory, out in 16-byte rows, the consumer warps' named barrier
    staged = G.resolve_config(config)["EPI"] == "staged"
    for needle in ("st.shared.v2.f32", "ld.shared.v4.f32", "st.global.v4.f32", "barrier.sync.aligned"):
        assert (needle in ptx) == staged, needle
    assert "cp.async.cg" not in ptx
    assert "ld.local" not in ptx and "st.local" not in ptx, "accumulators in local memory"
    res = ptxas_resources(ptx)
    assert res["spill_bytes"] == 0 and res["local_bytes"] == 0
    assert res["registers"] * G.geometry(config).threads <= 65536


@pytest.mark.compile
@pytest.mark.parametrize("epi", ["staged", "direct"])
def test_residual_epilogue_ptx(epi):
    """The residual epilogue reads C before it writes it (16-byte loads with the staged tile), keeps the wgmma
    asynchronous with NOCALL=1 and spills nothing."""
    from ptx_assembly import ptxas_resources

    config = dict(G.DEFAULT, EPI=epi)
    ptx = G.kernel_ptx(config, accumulate=True)
    assert ("ld.global.v4.f32" in ptx) == (epi == "staged") and "ld.global.v4.f32" not in G.kernel_ptx(config)
    assert ptx.count("ld.global.f32") > G.kernel_ptx(config).count("ld.global.f32")
    got = ptxas_resources(ptx)
    assert not got["wgmma_serialized"] and got["spill_bytes"] == 0, got


@pytest.mark.compile
def test_wgmma_helper_kernel_ptx():
    sig = (types.uint8[::1], types.int64, types.int64, types.int64, types.int64, types.float32[::1], types.float32[::1],
           types.int64)
    ptx, _ = cuda.compile_ptx(_k_wgmma.py_func, types.void(*sig), cc=(9, 0, "a"))
    assert f"wgmma.mma_async.sync.aligned.m64n{N_TEST}k16.f32.f16.f16" in ptx
    assert "wgmma.wait_group.sync.aligned 0;" in ptx and "fence.proxy.async.shared::cta" in ptx


@pytest.mark.compile
@pytest.mark.parametrize("kernel", ["tma", "tma-glu", "tma-direct", "cp_async", "fused_regs"])
def test_nocall_keeps_every_wgmma_kernel_asynchronous(kernel):
    """ptxas (nvJitLink, sm_90a): with NOCALL=0 the kernels' 64-bit index divisions (and gemm_f16_glu's IEEE
    division) are subroutine calls and ptxas serializes their wgmma (warning C7509); with NOCALL=1 it does not, and
    nothing spills. If the NOCALL=0 half ever stops holding, the knob has nothing left to do."""
    from ptx_assembly import ptxas_resources

    from kernels import gemm_fused_regs

    base = {"tma": G.DEFAULT, "tma-glu": G.DEFAULT, "tma-direct": dict(G.DEFAULT, EPI="direct", TM=128),
            "cp_async": WG, "fused_regs": G.DEFAULT}[kernel]

    def ptx(nocall):
        cfg = dict(base, NOCALL=nocall)
        if kernel == "fused_regs":
            return gemm_fused_regs.kernel_ptx(cfg, "Q4_K")
        return G.kernel_ptx(cfg, glu=kernel == "tma-glu")

    assert ptxas_resources(ptx(0))["wgmma_serialized"]
    got = ptxas_resources(ptx(1))
    assert not got["wgmma_serialized"] and got["spill_bytes"] == 0, got


@pytest.mark.compile
def test_wgmma_register_a_kernel_assembles():
    """ptxas (nvJitLink, sm_90a) accepts the register-A wgmma's operand list."""
    from ptx_assembly import assemble

    sig = (types.uint8[::1], types.uint32[::1], types.int64, types.float32[::1], types.float32[::1], types.int64)
    for trans_b in (0, 1):
        ptx, _ = cuda.compile_ptx(_rs_kernel(trans_b), types.void(*sig), cc=(9, 0, "a"))
        assert f"wgmma.mma_async.sync.aligned.m64n{N_TEST}k16.f32.f16.f16" in ptx and f", p, 1, 1, {trans_b};" in ptx
        assert len(assemble(ptx)) > 0


# ---- gpu ------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["none", "swizzle64"])
def test_wgmma_gpu_numbers(layout):
    _check_one_product(layout, 1)
    _check_one_product(layout, 0)
    _check_one_rs_product(1)
    _check_one_rs_product(0)
    _check_one_rs_product(1, trans_b=1)
    _check_one_rs_product(1, trans_b=1, n=128)


def _torch_rel(a, b, out) -> float:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    ref = (torch.from_numpy(a).cuda().float() @ torch.from_numpy(b).cuda().float().T).double().cpu().numpy()
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


@pytest.mark.gpu
@pytest.mark.parametrize("config", [G.DEFAULT, WG, dict(WG, LOOP="addr32"), dict(WG, TM=128, TN=128),
                                    dict(WG, TM=64, TN=128, STAGES=2, LOOP="addr32"), TMA,
                                    dict(TMA, TM=128, TN=64, STAGES=2), dict(TMA, SPLITK=3), dict(G.DEFAULT, NOCALL=0),
                                    dict(TMA, SPLITK=3, NOCALL=1), dict(WG, NOCALL=1), dict(TMA, TM=192),
                                    dict(TMA, TM=192, SPLITK=3), dict(TMA, TM=144, SPLITK=1),
                                    dict(TMA, TM=144, SPLITK=3)],
                         ids=["default", "ks32", "addr32", "128x128", "128x64", "tma", "tma-128x64", "tma-split3",
                              "default-nocall0", "nocall-split3", "nocall-ks32", "tma-192", "tma-192-split3",
                              "tma-144", "tma-144-split3"])
@pytest.mark.parametrize("shape", [(2048, 18944, 3584), (2048, 3584, 18944), (33, 70, 256), (2047, 4609, 3584)], ids=str)
def test_wgmma_gpu_matches_torch(config, shape):
    pytest.importorskip("torch")
    nt, od, id_ = shape
    rng = np.random.default_rng(7)
    a = rng.standard_normal((nt, id_), dtype=np.float32).astype(np.float16)
    b = rng.standard_normal((od, id_), dtype=np.float32).astype(np.float16)
    out = cuda.to_device(np.full((nt, od), np.nan, np.float32))
    G.gemm_f16(cuda.to_device(a), cuda.to_device(b), out, config=config)
    got = out.copy_to_host()
    assert np.isfinite(got).all()
    assert _torch_rel(a, b, got) < 1e-3
    if config.get("STAGING") == "tma" and config.get("TM") not in (144, 192):  # the same bits as the cp.async
        # path's (same wgmma order, same k split; TM=144 and 192 are tma tiles only)
        ref = cuda.to_device(np.full((nt, od), np.nan, np.float32))
        loop = "pipe" if config.get("STAGES", G.DEFAULT["STAGES"]) >= 3 else "addr32"
        G.gemm_f16(cuda.to_device(a), cuda.to_device(b), ref, config=dict(config, STAGING="cp_async", LOOP=loop))
        assert np.array_equal(ref.copy_to_host(), got)


# ---- gemm_f16_glu: the gate/up product with the SwiGLU in its epilogue ---------------------------------------


def _glu_case(config, nt, ffn, id_, seed, partials=False):
    """(fused act, gemm_f16 + swiglu act, float64 silu(g) * u) for random f16 a [nt, id] and gate|up b [2 ffn, id];
    both outputs (and the split partials) poisoned with NaN first."""
    from kernels.activation import swiglu

    rng = np.random.default_rng(seed)
    a = rng.standard_normal((nt, id_)).astype(np.float16)
    b = (rng.standard_normal((2 * ffn, id_)) * 0.5).astype(np.float16)
    da, db = cuda.to_device(a), cuda.to_device(b)
    extra = {}
    if partials:
        extra["partials"] = cuda.to_device(np.full(G.partials_elements(config, nt, 2 * ffn, id_), np.nan, np.float32))
    act = cuda.to_device(np.full((nt, ffn), np.nan, np.float16))
    G.gemm_f16_glu(da, db, act, config=config, **extra)
    c = cuda.to_device(np.full((nt, 2 * ffn), np.nan, np.float32))
    G.gemm_f16(da, db, c, config=config, **extra)
    unfused = swiglu(c).copy_to_host()
    ref = a.astype(np.float64) @ b.astype(np.float64).T
    g, u = ref[:, :ffn], ref[:, ffn:]
    return act.copy_to_host(), unfused, g / (1.0 + np.exp(-g)) * u


GLU_CASES = [
    ("128x64, 3 stages, nt tail, 3 tiles", dict(TMA, TM=128, TN=64, STAGES=3, AUTOTILE=0, SPLITK=1), (33, 192, 128)),
    ("256x128 default tile, 2 tiles", dict(TMA, AUTOTILE=0, SPLITK=1), (20, 256, 64)),
    ("every tile in 3 k slices", dict(TMA, TM=128, TN=64, STAGES=3, AUTOTILE=0, SPLITK=3), (33, 128, 640)),
]


@sim
@pytest.mark.parametrize("config,shape", [c[1:] for c in GLU_CASES], ids=[c[0] for c in GLU_CASES])
def test_gemm_glu_simulator_is_gemm_and_swiglu_bit_for_bit(config, shape):
    """Each tile's two boxes (gate rows, the same up rows) and the SwiGLU epilogue give exactly `gemm_f16` +
    `swiglu` (the same C values, the same f32 expression, the same rounding to f16), every element written, and
    float64's silu(g) * u within f16 rounding."""
    fused, unfused, ref = _glu_case(config, *shape, seed=11, partials=config["SPLITK"] > 1)
    assert not np.isnan(fused).any(), "some activations were never written"
    assert np.array_equal(fused.view(np.uint16), unfused.view(np.uint16))
    assert np.linalg.norm(fused.astype(np.float64) - ref) / np.linalg.norm(ref) < 2e-3


NARROW_TAIL = dict(TMA, NARROWTAIL=1, NOCALL=0)


@sim
def test_narrow_tail_launches_write_every_column_once(monkeypatch):
    """NARROWTAIL=1 on 2 SMs: C[140, 640] (two rows of tiles) runs as two waves of 256-wide tiles over columns 0 ..
    511, then 128-wide tiles over the last 128 columns (`tail_plan`: 512): every element written (poisoned out),
    float64 within 1e-3, the residual epilogue adds each product once (x0 + the product, bit for bit); the SwiGLU
    launch of a [20, 768] gate|up (two wide tiles, then two narrow ones whose 64 gate and 64 up rows start at gate
    row 256) equals gemm_f16 + swiglu bit for bit and float64's silu(g) * u within 2e-3."""
    monkeypatch.setattr(G, "device_sms", lambda: 2)
    nt, od, id_ = 140, 640, 128
    assert G.tail_plan(NARROW_TAIL, nt, od, id_) == 512 and G.tail_plan(NARROW_TAIL, 20, 768, id_, glu=True) == 512
    assert [(c["TM"], lo, hi) for c, lo, hi in G.launches(NARROW_TAIL, nt, od, id_)] == [(256, 0, 512), (128, 512, 640)]
    rng = np.random.default_rng()
    a, b, got, ref = _product(NARROW_TAIL, nt, od, id_, rng)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-3
    x0 = rng.standard_normal((nt, od)).astype(np.float32)
    x = cuda.to_device(x0)
    G.gemm_f16(cuda.to_device(a), cuda.to_device(b), x, config=NARROW_TAIL, accumulate=True)
    assert np.array_equal(x.copy_to_host(), x0 + got)
    fused, unfused, ref = _glu_case(NARROW_TAIL, 20, 384, id_, seed=int(rng.integers(1 << 30)))
    assert not np.isnan(fused).any()
    assert np.array_equal(fused.view(np.uint16), unfused.view(np.uint16))
    assert np.linalg.norm(fused.astype(np.float64) - ref) / np.linalg.norm(ref) < 2e-3


@sim
def test_gemm_glu_nocall_simulator_matches_gemm_and_swiglu():
    """NOCALL=1: the SwiGLU epilogue divides with div.approx (exact f32 division in the simulator) and the indices in
    uint32; the activations equal gemm_f16 + swiglu's to f16 rounding (one f16 ulp: the simulator's IEEE division
    is float64 before its f16 rounding) and float64's silu(g) * u within 2e-3."""
    config = dict(TMA, TM=128, TN=64, STAGES=3, AUTOTILE=0, SPLITK=1, NOCALL=1)
    fused, unfused, ref = _glu_case(config, 33, 192, 128, seed=13)
    assert not np.isnan(fused).any()
    ulp = np.abs(fused.view(np.int16).astype(np.int64) - unfused.view(np.int16).astype(np.int64))
    assert ulp.max() <= 1
    assert np.linalg.norm(fused.astype(np.float64) - ref) / np.linalg.norm(ref) < 2e-3


@sim
def test_gemm_glu_simulator_splits_the_last_wave(monkeypatch):
    """SPLITK=0 (auto), a 2 x 3 grid on 4 SMs: the first wave's tiles leave through the SwiGLU epilogue, the last
    wave's two in 2 k slices through compact partials and the GLU tile sum; the same bits as gemm_f16 + swiglu."""
    from kernels.gemm_f16_config import SplitPlan

    monkeypatch.setattr(G, "device_sms", lambda: 4)
    monkeypatch.setattr(G.gemm_f16_config, "MIN_KTILES_PER_SLICE", 1)
    config = dict(TMA, TM=128, TN=64, STAGES=3, AUTOTILE=0, SPLITK=0)
    assert G.split_plan(config, 70, 384, 256) == SplitPlan(4, 2)
    fused, unfused, ref = _glu_case(config, 70, 192, 256, seed=12, partials=True)
    assert not np.isnan(fused).any()
    assert np.array_equal(fused.view(np.uint16), unfused.view(np.uint16))
    assert np.linalg.norm(fused.astype(np.float64) - ref) / np.linalg.norm(ref) < 2e-3


def test_gemm_glu_refusals():
    """One line each, before any launch: a kernel without the staged TMA epilogue or with 64-wide tiles, 2 ffn not
    a multiple of TM, an out of the wrong dtype or shape."""
    a = cuda.to_device(np.zeros((8, 64), np.float16))
    b = cuda.to_device(np.zeros((256, 64), np.float16))
    for config, match in ((dict(TMA, EPI="direct"), "needs STAGING=tma, EPI=staged and TM=128 or 256"),
                          (dict(G.DEFAULT, STAGING="cp_async"), "needs STAGING=tma"),
                          (dict(TMA, TM=64, TN=64), "got STAGING=tma, EPI=staged, TM=64")):
        with pytest.raises(KernelConstraintError, match=match):
            G.gemm_f16_glu(a, b, config=config)
    for nt in (8, 2048):  # whatever tile AUTOTILE would pick at this nt: the configured TM decides
        with pytest.raises(KernelConstraintError, match=r"b has 384 rows \(2 x ffn\), not a multiple of TM=256"):
            G.gemm_f16_glu(cuda.to_device(np.zeros((nt, 64), np.float16)), cuda.to_device(np.zeros((384, 64), np.float16)),
                           config=TMA)
    with pytest.raises(KernelConstraintError, match="b must be a CUDA device array"):
        G.gemm_f16_glu(a, np.zeros((256, 64), np.float16))
    flat = cuda.to_device(np.zeros(8 * 128 + 1, np.float16))
    with pytest.raises(KernelConstraintError, match="out must start at a 16-byte aligned address"):
        G.gemm_f16_glu(a, b, flat[1:].reshape(8, 128), config=dict(TMA, TM=128, TN=64, STAGES=3))
    for out in (np.zeros((8, 128), np.float32), np.zeros((8, 64), np.float16)):
        with pytest.raises(KernelConstraintError, match=r"out must be a C-contiguous float16 \[8, 128\]"):
            G.gemm_f16_glu(a, b, cuda.to_device(out), config=dict(TMA, TM=128, TN=64, STAGES=3))


@pytest.mark.compile
def test_glu_ptx():
    """The GLU kernel: two box copies a k tile, the staged tile read back in 16-byte pieces, the SwiGLU's exp, f16
    pairs packed by cvt.rn.f16x2 and stored 16 bytes at a time; nothing in local memory, no spill."""
    from ptx_assembly import ptxas_resources

    ptx = G.kernel_ptx(TMA, glu=True)
    assert ptx.count("cp.async.bulk.tensor.2d") >= 3  # the A box and the gate and up boxes
    for needle in ("ld.shared.v4.f32", "cvt.rn.f16x2.f32", "st.global.v4.u32", "ex2.approx", "barrier.sync.aligned"):
        assert needle in ptx, needle
    assert "ld.local" not in ptx and "st.local" not in ptx
    res = ptxas_resources(ptx)
    assert res["spill_bytes"] == 0 and res["local_bytes"] == 0


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(512, 37888, 3584), (128, 37888, 3584), (512, 17920, 1536)], ids=str)
def test_narrow_tail_gpu_matches_torch_and_one_launch(shape):
    """NARROWTAIL=1 where `tail_plan` splits the launch (7B / 1.5B gate|up products at pp512 / pp128 on the GPU's
    SMs): the product within 1e-3 of torch's (poisoned out), and the SwiGLU launch's activations within one f16 ulp
    of NARROWTAIL=0's (the narrow tail's tiles are other kernels: the same sums, maybe another wgmma order)."""
    pytest.importorskip("torch")
    nt, od, id_ = shape
    config = dict(TMA, NARROWTAIL=1)
    if not (G.tail_plan(config, nt, od, id_) and G.tail_plan(config, nt, od, id_, glu=True)):
        pytest.skip(f"NARROWTAIL keeps one launch for {shape} on {G.device_sms()} SMs")
    rng = np.random.default_rng()
    a = rng.standard_normal((nt, id_), dtype=np.float32).astype(np.float16)
    b = (rng.standard_normal((od, id_), dtype=np.float32) * 0.5).astype(np.float16)
    da, db = cuda.to_device(a), cuda.to_device(b)
    out = cuda.to_device(np.full((nt, od), np.nan, np.float32))
    G.gemm_f16(da, db, out, config=config)
    got = out.copy_to_host()
    assert np.isfinite(got).all() and _torch_rel(a, b, got) < 1e-3
    acts = []
    for tail in (1, 0):
        act = cuda.to_device(np.full((nt, od // 2), np.nan, np.float16))
        G.gemm_f16_glu(da, db, act, config=dict(TMA, NARROWTAIL=tail))
        acts.append(act.copy_to_host())
    assert not np.isnan(acts[0]).any()
    ulp = np.abs(acts[0].view(np.int16).astype(np.int64) - acts[1].view(np.int16).astype(np.int64))
    assert ulp.max() <= 1


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(2048, 18944, 3584), (33, 128, 256)], ids=str)
def test_gemm_glu_nocall_gpu_matches_gemm_and_swiglu(shape):
    """NOCALL=1's div.approx SwiGLU against gemm_f16 + swiglu (IEEE division) on the H200: at most one f16 ulp apart
    (div.approx is within 2 f32 ulp), float64 within f16 rounding."""
    nt, ffn, id_ = shape
    fused, unfused, ref = _glu_case(dict(G.DEFAULT, NOCALL=1), nt, ffn, id_, seed=14, partials=True)
    assert not np.isnan(fused).any()
    ulp = np.abs(fused.view(np.int16).astype(np.int64) - unfused.view(np.int16).astype(np.int64))
    assert ulp.max() <= 1
    assert np.linalg.norm(fused.astype(np.float64) - ref) / np.linalg.norm(ref) < 2e-3


@pytest.mark.gpu
@pytest.mark.parametrize("config", [G.DEFAULT, dict(TMA, SPLITK=3), dict(TMA, TM=128, TN=64, STAGES=2)],
                         ids=["default", "split3", "128x64"])
@pytest.mark.parametrize("shape", [(2048, 18944, 3584), (128, 18944, 3584), (33, 128, 256)], ids=str)
def test_gemm_glu_gpu_is_gemm_and_swiglu_bit_for_bit(config, shape):
    """Qwen2-7B's gate/up at nt 2048 and 128 (AUTOTILE and the auto split at work) and a tail shape: the fused
    activation equals gemm_f16 + swiglu bit for bit on the H200 (each C value does not depend on its column's place
    in the tile), and float64 within f16 rounding."""
    nt, ffn, id_ = shape
    fused, unfused, ref = _glu_case(config, nt, ffn, id_, seed=13, partials=True)
    assert not np.isnan(fused).any()
    assert np.array_equal(fused.view(np.uint16), unfused.view(np.uint16))
    assert np.linalg.norm(fused.astype(np.float64) - ref) / np.linalg.norm(ref) < 2e-3


@pytest.mark.compile
@pytest.mark.parametrize("kernel", ["gemm_f16", "gemm_f16_glu", "gemm_f16_accumulate", "attention"])
def test_no_register_an_issued_wgmma_reads_is_written_before_its_wait(kernel):
    """The wgmma kernels' PTX as NVVM writes it: no instruction writes a register an issued wgmma.mma_async still
    reads (A in registers, D) before the wgmma.wait_group (`ptx_assembly.wgmma_register_hazards`; the register-A
    GEMM's own check is in test_gemm_fused_regs)."""
    from ptx_assembly import wgmma_register_hazards

    from kernels import attention, gemm_f16

    ptx = {"gemm_f16": lambda: gemm_f16.kernel_ptx(None), "gemm_f16_glu": lambda: gemm_f16.kernel_ptx(None, glu=True),
           "gemm_f16_accumulate": lambda: gemm_f16.kernel_ptx(None, accumulate=True),
           "attention": lambda: attention.kernel_ptx({"MMA": "wgmma"}, cc=(9, 0, "a"))}[kernel]()
    assert "wgmma.mma_async" in ptx
    assert not wgmma_register_hazards(ptx)
