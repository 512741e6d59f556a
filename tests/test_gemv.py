"""Decode mat-vec straight from GGUF blocks (`kernels.gemv`) against numpy float64 ``dequantize(W) @ x``.

Simulator session: every format at tiny shapes (od = 5: a partial last CUDA block for RPB 2 and 4; ids with a
partial last warp chunk), several RPB/WPR values, output poisoned with NaN, fresh random W and x each test,
the residual epilogue, buffers that start at an odd block (the misaligned-load trap of 2-byte-aligned formats),
every rejected input, and the experiment's check / knobs / cost.
The `compile` checks of the same kernels are in tests/test_gemv_compile.py.
`gpu`: real Qwen2-7B shapes on the device.
Tolerance: relative error ‖y − ref‖ / ‖ref‖ < 1e-5 (float32 accumulation; float weights are exact inputs), with
‖ref‖ floored at 0.02 ‖|W|·|x|‖ (`_assert_close`); the SwiGLU kernel: `experiments.gemv.glu_error` < 1e-6.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from numba import cuda

from kernels.errors import KernelConstraintError
from kernels.gemv import (GEMV_TYPES, MMVQ_TYPES, STAGE_TYPES, GemvConfig, gemv_glu, gemv_pair, gemv_q, kernel_for,
                          pair_refusal)
from kernels.quant.dequant import _address
from kernels.quant.formats import FORMATS
from minfer_cli.quant_blocks import random_blocks

TOL = 1e-5
SCALE_FLOOR = 0.02
"""`_assert_close` divides by max(‖ref‖, SCALE_FLOOR · ‖|W|·|x|‖). f32 accumulation errs by |z| u (|W|·|x|)_i per row,
|z| <= 1.2 (sd 0.12..0.28) over 7000 simulator rows, u = 2^-24; with 3 rows, cancellation leaves ‖ref‖ below
0.004 ‖|W|·|x|‖ in ~0.1% of draws, where that error exceeds 1e-5 ‖ref‖ (~1e-5 a test, ~1e-4 a run of this file).
The floor, 1e-5 · 0.02 = 3.4 u of ‖|W|·|x|‖, is over 10 sd of z, and ~1e-4 of one wrong term (~‖|W|·|x|‖ / id)."""
ODD_TYPES = [n for n in GEMV_TYPES if FORMATS[n].block_size > 1 and FORMATS[n].type_size % 4]


def _reference(raw, name, od, id, x):
    from experiments.gemv import reference

    return reference(raw, name, od, id, x)


def _tiny_id(name: str) -> int:
    """256-blocks: 2 blocks (a warp chunk holds 4: half idle); 32-blocks: 24 (a chunk holds 16); floats: 40."""
    bs = FORMATS[name].block_size
    return 512 if bs == 256 else 768 if bs == 32 else 40


def _scale(raw, name, od, id, x, residual=None):
    """f32 rounding's scale of each output: ``|W|·|x|`` (+ ``|residual|``), `experiments.gemv.abs_product`."""
    from experiments.gemv import abs_product

    s = abs_product(raw, name, od, id, x)
    return s if residual is None else s + np.abs(residual.astype(np.float64))


def _run(name, od, id, rpb=2, wpr=2, raw_device=None, residual=None, rng=None, mmvq=False, stage=0, min_blocks=0,
         fold=0, pdl=0, stream=0, xres=False, lookahead=1):
    """Run one product on fresh random W and x into a NaN-poisoned y; return (y, float64 reference, `_scale`).
    mmvq: x is quantized to Q8_1 on the device first (``xres``: compensated) and the reference is
    `experiments.gemv.reference_mmvq`."""
    from experiments.gemv import reference_mmvq
    from kernels.quantize_q8 import q8_blocks, quantize_q8_1

    rng = rng or np.random.default_rng()
    raw = random_blocks(name, od, id, rng)
    x = rng.standard_normal(id).astype(np.float32)
    out = cuda.to_device(np.full(od, np.nan, dtype=np.float32))
    dev = cuda.to_device(raw) if raw_device is None else raw_device(raw)
    res = None if residual is None else cuda.to_device(residual)
    xd = quantize_q8_1(cuda.to_device(x), q8_blocks(id, compensated=xres)) if mmvq else cuda.to_device(x)
    config = GemvConfig(name, rows_per_block=rpb, warps_per_row=wpr, stage=stage, min_blocks=min_blocks, fold=fold,
                        pdl=pdl, mmvq=mmvq, residual=residual is not None, xres=xres, lookahead=lookahead)
    got = gemv_q(dev, name, od, id, xd, out, config=config, residual=res, stream=stream)
    assert got is out
    ref = reference_mmvq(raw, name, od, id, x, compensated=xres) if mmvq else _reference(raw, name, od, id, x)
    if residual is not None:
        ref = ref + residual.astype(np.float64)
    return out.copy_to_host(), ref, _scale(raw, name, od, id, x, residual)


GLU_TOL = 1e-6
"""`_assert_glu_close`'s bound on `experiments.gemv.glu_error`, which is in units of the f32 rounding scale: f32
reaches ~1.5 u = 9e-8 there (seen: 2.7e-8 in 240 simulator draws, 5.7e-8 in 80000 modelled ones); 1e-6 = 17 u."""


def _assert_glu_close(got, wg, wu, name, od, id, x, mmvq):
    """The SwiGLU output against silu(g) * u of the float64 products (`reference_mmvq` with ``mmvq``), measured by
    `experiments.gemv.glu_error`, the experiment's own GLU check: a plain ‖y − ref‖ / ‖ref‖ is ill-conditioned here
    (silu squashes most rows to ~0, and the few left can be products with cancellation; it passed 1e-5 only
    ~99.9% of the time); glu_error divides by the first-order propagation of the products' f32 rounding scales."""
    from experiments.gemv import abs_product, glu_error, reference_mmvq

    ref_fn = reference_mmvq if mmvq else _reference
    g, u = ref_fn(wg, name, od, id, x), ref_fn(wu, name, od, id, x)
    err = glu_error(got, g, u, abs_product(wg, name, od, id, x), abs_product(wu, name, od, id, x))
    ref = g / (1.0 + np.exp(-g)) * u
    assert err < GLU_TOL, f"glu_error {err:.3e} >= {GLU_TOL:g}; got {got[:4]} vs reference {ref[:4]}"


def _assert_close(got, ref, scale, tol=TOL):
    """‖got − ref‖ / max(‖ref‖, SCALE_FLOOR · ‖scale‖) < tol (see SCALE_FLOOR); scale: `_scale`."""
    assert not np.isnan(got).any(), f"rows {np.flatnonzero(np.isnan(got))} were never written (NaN poison)"
    den = max(np.linalg.norm(ref), SCALE_FLOOR * np.linalg.norm(scale))
    err = np.linalg.norm(got.astype(np.float64) - ref) / den
    assert err < tol, f"relative error {err:.3e} >= {tol:g}; got {got[:4]} vs reference {ref[:4]}"


# ---- simulator: numbers ---------------------------------------------------------------------------------


@pytest.mark.parametrize("rpb, wpr", [(2, 2), (4, 1)])
@pytest.mark.parametrize("name", GEMV_TYPES)
def test_every_type_against_float64(name, rpb, wpr):
    _assert_close(*_run(name, 5, _tiny_id(name), rpb=rpb, wpr=wpr))


@pytest.mark.parametrize("rpb", [1, 2, 4, 8])
@pytest.mark.parametrize("wpr", [1, 4])
def test_knobs_do_not_change_the_result(rpb, wpr):
    _assert_close(*_run("Q4_K", 5, 1024, rpb=rpb, wpr=wpr))


@pytest.mark.parametrize("name, od, id, rpb, wpr, mmvq, ahead", [
    ("Q4_K", 5, 8192, 2, 1, True, 4), ("Q6_K", 3, 8192, 4, 2, False, 2), ("Q8_0", 3, 1696, 8, 1, True, 8)])
def test_ahead_prefetches_each_warps_first_chunks_and_changes_no_number(monkeypatch, name, od, id, rpb, wpr, mmvq,
                                                                        ahead):
    """AHEAD (PDL=1, no ring): before its wait each warp asks L2 for its first AHEAD chunks of every row (chunks
    warp, warp + WPR, ...): the 128-byte lines asked for cover chunks 0 .. AHEAD * WPR - 1 of every row (all of a
    row that has fewer), every offset inside W; the numbers bit for bit those of AHEAD=1 and of PDL=0."""
    from kernels.gemv import _IMPLS, codegen, launch

    fmt = FORMATS[name]
    asked = []
    real = codegen.prefetch_l2

    def recording(array, byte_offset):
        real(array, byte_offset)
        asked.append(int(byte_offset))

    monkeypatch.setattr(codegen, "prefetch_l2", recording)
    monkeypatch.setattr(launch, "_CACHE", {})
    seed = int(np.random.default_rng().integers(2**63))
    stream = cuda.stream()
    runs = [_run(name, od, id, rpb=rpb, wpr=wpr, mmvq=mmvq, pdl=p, lookahead=a, stream=stream,
                 rng=np.random.default_rng(seed)) for p, a in ((1, ahead), (1, 1), (0, 1))]
    _assert_close(*runs[0])
    np.testing.assert_array_equal(runs[0][0], runs[1][0])
    np.testing.assert_array_equal(runs[0][0], runs[2][0])
    row_bytes = fmt.row_bytes(id)
    chunk = 32 // _IMPLS[name][2] * fmt.type_size
    end = min(ahead * wpr * chunk, row_bytes)
    need = {(r * row_bytes + b) // 128 for r in range(od) for b in range(end)}
    assert not need - {a // 128 for a in asked}, "lines of the first AHEAD chunks were never prefetched"
    assert end < row_bytes or ahead == 8, "the case should leave chunks unprefetched"


def test_ahead_needs_pdl_and_no_ring():
    for kw in ({"pdl": 0}, {"pdl": 1, "stage": 2}):
        with pytest.raises(KernelConstraintError, match="lookahead=2 is PDL's prefetch before the wait"):
            GemvConfig("Q6_K", lookahead=2, **kw)
    with pytest.raises(KernelConstraintError, match="lookahead=3 is not supported; allowed: 1, 2, 4, 8"):
        GemvConfig("Q4_K", pdl=1, lookahead=3)
    assert GemvConfig.from_knobs({"TYPE": "Q4_K", "PDL": 1, "AHEAD": 4}).lookahead == 4


@pytest.mark.parametrize("name, rpb, wpr, mmvq, stage", [("Q4_K", 4, 4, True, 0), ("Q6_K", 2, 2, True, 2),
                                                        ("Q8_0", 8, 1, False, 0)])
def test_pdl_gives_the_same_numbers_and_needs_a_stream(name, rpb, wpr, mmvq, stage):
    """PDL=1 (griddepcontrol, a programmatic dependent launch; the simulator runs kernels in order) with a partial
    last CUDA block: against float64 and bit for bit against PDL=0, on a stream; stream 0 is refused."""
    seed = int(np.random.default_rng().integers(2**63))
    stream = cuda.stream()
    od, id = 4, _tiny_id(name)
    pdl, plain = [_run(name, od, id, rpb=rpb, wpr=wpr, mmvq=mmvq, stage=stage, pdl=p, stream=stream,
                       rng=np.random.default_rng(seed)) for p in (1, 0)]
    _assert_close(*pdl)
    np.testing.assert_array_equal(pdl[0], plain[0])
    raw = cuda.to_device(random_blocks(name, od, id, np.random.default_rng(seed)))
    with pytest.raises(KernelConstraintError, match="pdl=1 .* pass a numba stream, not the default stream 0"):
        gemv_q(raw, name, od, id, cuda.to_device(np.ones(id, np.float32)), config=GemvConfig(name, pdl=1))
    with pytest.raises(KernelConstraintError, match="pdl=2 is not supported; allowed: 0, 1"):
        gemv_q(raw, name, od, id, cuda.to_device(np.ones(id, np.float32)), config=GemvConfig(name, pdl=2), stream=stream)


@pytest.mark.parametrize("name, od, id, rpb, wpr, mmvq, shift", [
    ("Q4_K", 5, 1536, 2, 1, True, 0), ("Q4_K", 3, 2560, 4, 2, False, 1), ("Q6_K", 4, 2560, 8, 2, True, 0),
    ("Q6_K", 9, 2560, 8, 1, False, 1), ("Q8_0", 3, 1696, 8, 4, True, 1)])
def test_pdl_prefetches_each_warps_first_chunk_inside_w(monkeypatch, name, od, id, rpb, wpr, mmvq, shift):
    """PDL=1 (without the ring): before it waits for the previous kernel, each warp asks L2 for its first chunk of
    every row; every prefetched byte offset lies inside W (the simulator's `prefetch_l2` checks it) and the
    128-byte lines counted from W's start cover every byte of chunks 0 .. WPR - 1 of every row, with a partial last
    chunk, a partial last CUDA block, two prefetches a lane (RPB=8 of Q6_K: 64 lines), and W starting ``shift``
    blocks into its allocation; the numbers against float64 and bit for bit against PDL=0. (Lines of the device
    address space: where W does not start on a 128-byte boundary, `lookahead_lines` can fall one line short of a
    chunk's last bytes; a missed line costs a DRAM round trip, never a wrong number.)"""
    from kernels.gemv import _IMPLS, codegen, launch
    from kernels.ptx import _ndarray

    fmt = FORMATS[name]
    asked = []
    real = codegen.prefetch_l2

    def recording(array, byte_offset):
        real(array, byte_offset)
        asked.append((_ndarray(array).__array_interface__["data"][0], int(byte_offset)))

    monkeypatch.setattr(codegen, "prefetch_l2", recording)  # the name the generated kernels are built with
    monkeypatch.setattr(launch, "_CACHE", {})
    seed = int(np.random.default_rng().integers(2**63))
    ts = fmt.type_size
    stream = cuda.stream()
    pdl, plain = [_run(name, od, id, rpb=rpb, wpr=wpr, mmvq=mmvq, pdl=p, stream=stream,
                       raw_device=lambda r: cuda.to_device(np.concatenate([r[: shift * ts], r]))[shift * ts:],
                       rng=np.random.default_rng(seed)) for p in (1, 0)]
    _assert_close(*pdl)
    np.testing.assert_array_equal(pdl[0], plain[0])
    assert len({b for b, _ in asked}) == 1, "one weight, one array prefetched from"
    row_bytes = fmt.row_bytes(id)
    chunk = 32 // _IMPLS[name][2] * ts
    end = min(wpr * chunk, row_bytes)
    lines = {a // 128 for _, a in asked}
    need = {(r * row_bytes + b) // 128 for r in range(od) for b in range(end)}
    assert not need - lines, f"{len(need - lines)} of {len(need)} lines of the first chunks were never prefetched"


def _glu_knob_off_and_on(name, od, id, knob, on=1):
    """The SwiGLU kernel (MMVQ, RPB=4, WPR=2) on fresh random gate/up weights and x into NaN-poisoned outputs,
    with ``knob`` (a `GemvConfig` field) 0 and ``on``: the two outputs on the host."""
    from kernels.quantize_q8 import q8_blocks, quantize_q8_1

    rng = np.random.default_rng()
    wg, wu = (cuda.to_device(random_blocks(name, od, id, rng)) for _ in range(2))
    xd = quantize_q8_1(cuda.to_device((rng.standard_normal(id) * 0.05).astype(np.float32)), q8_blocks(id))
    outs = [cuda.to_device(np.full(od, np.nan, np.float32)) for _ in range(2)]
    for value, out in zip((0, on), outs):
        config = GemvConfig(name, rows_per_block=4, warps_per_row=2, mmvq=True, glu=True, **{knob: value})
        gemv_glu(wg, wu, name, od, id, xd, out, config=config)
    return [out.copy_to_host() for out in outs]


def test_one_wave_min_blocks():
    """MINB for one wave: qwen2 ffn_down at RPB=4, WPR=4 (896 blocks) on 132 SMs needs 7 a SM (72 registers);
    llama's od 4096 (1024 blocks) would need 8 (64 registers, under the floor: no bound); past the SM's threads or
    the largest value, no bound; an empty grid or no SMs is an error."""
    from kernels.gemv import MINB_REGISTER_FLOOR, min_blocks_registers, one_wave_min_blocks

    assert one_wave_min_blocks(896, 132, 4) == 7 and min_blocks_registers(7, 4) == MINB_REGISTER_FLOOR == 72
    assert one_wave_min_blocks(1024, 132, 4) == 0 and min_blocks_registers(8, 4) == 64
    assert one_wave_min_blocks(1792, 132, 2) == 14 and one_wave_min_blocks(1792, 132, 4) == 0  # 14 x 128 threads
    assert one_wave_min_blocks(1792, 132, 1) == 14 and one_wave_min_blocks(128, 132, 4) == 1
    assert one_wave_min_blocks(5000, 132, 1) == 0 and one_wave_min_blocks(1000, 132, 2) == 8
    assert min_blocks_registers(0, 4) == 255
    for grid, sms in ((0, 132), (-5, 132), (896, 0)):
        with pytest.raises(ValueError, match="needs grid >= 1 and sm_count >= 1"):
            one_wave_min_blocks(grid, sms, 4)


def test_min_blocks_bit_for_bit_and_refused_outside_its_values():
    """MINB only bounds the compiler (no effect in the simulator): bit for bit MINB=0; a value outside
    MINB_VALUES is refused naming the allowed ones."""
    seed = int(np.random.default_rng().integers(2**63))
    runs = [_run("Q4_K", 5, 512, rpb=4, wpr=2, mmvq=True, min_blocks=m, rng=np.random.default_rng(seed))
            for m in (7, 0)]
    _assert_close(*runs[0])
    np.testing.assert_array_equal(runs[0][0], runs[1][0])
    with pytest.raises(KernelConstraintError, match="min_blocks=3 is not supported; allowed: 0, 1, 2, 4, 7, 8, 14, 16"):
        GemvConfig("Q4_K", rows_per_block=4, warps_per_row=2, min_blocks=3)
    with pytest.raises(KernelConstraintError, match="min_blocks=16 with warps_per_row=8 asks for 4096 threads a SM, "
                                                    "more than the 2048 .* allowed here: 0, 1, 2, 4, 7, 8"):
        GemvConfig("Q4_K", rows_per_block=4, warps_per_row=8, min_blocks=16)


@pytest.mark.parametrize("name", ["Q6_K", "Q8_0"])
def test_eight_warps_more_warps_than_chunks(name):
    """WPR=8 on a row of fewer chunks than warps: idle warps must still join the shared-memory sum with zeros."""
    _assert_close(*_run(name, 3, _tiny_id(name), rpb=1, wpr=8))


@pytest.mark.parametrize("wpr", [1, 2])
def test_residual_epilogue(wpr):
    rng = np.random.default_rng()
    residual = rng.standard_normal(5).astype(np.float32) * 10
    _assert_close(*_run("Q5_K", 5, 512, rpb=4, wpr=wpr, residual=residual, rng=rng))


def test_residual_may_be_the_output_itself():
    rng = np.random.default_rng()
    od, id = 6, 256
    raw = random_blocks("Q4_K", od, id, rng)
    x = rng.standard_normal(id).astype(np.float32)
    r = rng.standard_normal(od).astype(np.float32)
    y = cuda.to_device(r)
    gemv_q(cuda.to_device(raw), "Q4_K", od, id, cuda.to_device(x), y,
           config=GemvConfig("Q4_K", rows_per_block=4, warps_per_row=2, residual=True), residual=y)
    _assert_close(y.copy_to_host(), _reference(raw, "Q4_K", od, id, x) + r, _scale(raw, "Q4_K", od, id, x, r))


@pytest.mark.parametrize("name", ODD_TYPES)
def test_buffer_starting_at_an_odd_block(name):
    """W's bytes start one block into an aligned allocation: the blocks of the 2-byte-aligned formats then start
    2 mod 4 (MXFP4: 1 mod 4), where any load wider than the format's alignment faults on a GPU."""
    fmt = FORMATS[name]

    def shifted(raw):
        view = cuda.to_device(np.concatenate([np.full(fmt.type_size, 0xA5, np.uint8), raw]))[fmt.type_size :]
        assert _address(view) % 4 in (1, 2)
        return view

    _assert_close(*_run(name, 3, 2 * fmt.block_size, raw_device=shifted))


def test_allocates_out_and_takes_the_gguf_enum():
    from gguf.constants import GGMLQuantizationType as T

    rng = np.random.default_rng()
    raw = random_blocks("Q6_K", 3, 256, rng)
    x = rng.standard_normal(256).astype(np.float32)
    ref = _reference(raw, "Q6_K", 3, 256, x)
    for qtype in (T.Q6_K, int(T.Q6_K)):
        y = gemv_q(cuda.to_device(raw), qtype, 3, 256, cuda.to_device(x))
        assert y.shape == (3,) and y.dtype == np.float32
        _assert_close(y.copy_to_host(), ref, _scale(raw, "Q6_K", 3, 256, x))


# ---- simulator: MMVQ (Q8_1 x, dp4a) ---------------------------------------------------------------------


@pytest.mark.parametrize("rpb, wpr", [(2, 2), (4, 1)])
@pytest.mark.parametrize("name", MMVQ_TYPES)
def test_mmvq_every_type_against_float64(name, rpb, wpr):
    _assert_close(*_run(name, 5, _tiny_id(name), rpb=rpb, wpr=wpr, mmvq=True))


@pytest.mark.parametrize("name", MMVQ_TYPES)
def test_mmvq_is_close_to_the_f32_product(name):
    """The MMVQ reference itself is checked against the f32-x product: only x's int8 rounding separates them.

    64 rows (numpy only): ‖exact‖ over 7 rows could be small by cancellation, and the error then passed 0.1 in
    ~6e-5 of draws (Q4_K, Q6_K); over 64 rows the relative error stays in 1e-3 .. 2.2e-2 (2e4 draws a type)."""
    from experiments.gemv import reference_mmvq

    rng = np.random.default_rng()
    od, id = 64, _tiny_id(name)
    raw = random_blocks(name, od, id, rng)
    x = rng.standard_normal(id).astype(np.float32)
    exact, q8 = _reference(raw, name, od, id, x), reference_mmvq(raw, name, od, id, x)
    err = np.linalg.norm(q8 - exact) / np.linalg.norm(exact)
    assert 1e-5 < err < 0.1, f"{name}: Q8_1 rounding moved the product by {err:.2e} (seen: 1e-3 .. 2.2e-2)"


def test_mmvq_residual_and_an_odd_block_start():
    rng = np.random.default_rng()
    residual = rng.standard_normal(5).astype(np.float32) * 10
    _assert_close(*_run("Q4_K", 5, 512, rpb=2, wpr=2, residual=residual, rng=rng, mmvq=True))
    ts = FORMATS["Q6_K"].type_size
    _assert_close(*_run("Q6_K", 3, 512, rpb=1, wpr=2, mmvq=True,
                        raw_device=lambda r: cuda.to_device(np.concatenate([r[:ts], r]))[ts:]))


@pytest.mark.parametrize("name, od, id, rpb, wpr, stage, fold", [
    ("Q4_K", 5, 768, 2, 2, 0, 0), ("Q4_K", 9, 768, 8, 1, 0, 0), ("Q6_K", 5, 768, 4, 1, 0, 0),
    ("Q6_K", 3, 768, 2, 2, 0, 1), ("Q6_K", 4, 1536, 2, 2, 2, 1), ("Q6_K", 8, 1536, 1, 2, 3, 0),
    ("Q8_0", 5, 800, 2, 2, 0, 0), ("Q8_0", 3, 1280, 4, 1, 2, 0)])
def test_xres_every_type_and_path_against_float64(name, od, id, rpb, wpr, stage, fold):
    """Compensated Q8_1 x (XRES=1) through every MMVQ format, the direct loop and the ring (STAGE; W a whole number
    of 16-byte vectors), FOLD's offset, a residual epilogue (odd od): against float64 ``dequantize(W) @ (d * (q +
    r/254))`` at tail shapes (rows not a multiple of RPB, a chunk past the row's end)."""
    rng = np.random.default_rng()
    residual = rng.standard_normal(od).astype(np.float32) if od % 2 else None
    _assert_close(*_run(name, od, id, rpb=rpb, wpr=wpr, stage=stage, fold=fold, mmvq=True, xres=True,
                        residual=residual, rng=rng))


@pytest.mark.parametrize("name", MMVQ_TYPES)
def test_xres_closes_the_int8_gap_to_the_f32_product(name):
    """The compensated reference is ~254 times closer to the f32-x product than plain Q8_1 (numpy only, 64 rows):
    the residual values carry what the first rounding lost, so a kernel that ignored them would fail
    `test_xres_every_type_and_path_against_float64` by ~1e-2."""
    from experiments.gemv import reference_mmvq

    rng = np.random.default_rng()
    od, id = 64, _tiny_id(name)
    raw = random_blocks(name, od, id, rng)
    x = rng.standard_normal(id).astype(np.float32)
    exact = _reference(raw, name, od, id, x)
    plain, comp = (np.linalg.norm(reference_mmvq(raw, name, od, id, x, compensated=c) - exact) / np.linalg.norm(exact)
                   for c in (False, True))
    assert comp < plain / 50 and comp < 5e-4, f"{name}: compensated {comp:.2e} vs plain {plain:.2e}"


def test_xres_needs_compensated_blocks_and_mmvq():
    from kernels.quantize_q8 import q8_blocks, quantize_q8_1

    raw = cuda.to_device(random_blocks("Q4_K", 2, 256, np.random.default_rng()))
    x = cuda.to_device(np.ones(256, np.float32))
    plain = quantize_q8_1(x, q8_blocks(256))
    with pytest.raises(KernelConstraintError, match=r"config.xres=True does not match this call \(x given as "
                                                    r"compensated Q8_1 blocks: False\)"):
        gemv_q(raw, "Q4_K", 2, 256, plain, config=GemvConfig("Q4_K", mmvq=True, xres=True))
    with pytest.raises(KernelConstraintError, match="xres=1 .* needs mmvq=1"):
        GemvConfig("Q4_K", xres=True)


def test_mmvq_rejects_a_type_without_a_kernel_and_a_wrong_length():
    from kernels.quantize_q8 import q8_blocks

    with pytest.raises(KernelConstraintError, match="Q5_0 has no MMVQ .* covers Q4_K, Q6_K, Q8_0"):
        gemv_q(_w(2, 256, "Q5_0"), "Q5_0", 2, 256, q8_blocks(256))
    with pytest.raises(KernelConstraintError, match="x holds 512 Q8_1 activations; W has id=256"):
        gemv_q(_w(), "Q4_K", 2, 256, q8_blocks(512))
    from kernels.quantize_q8 import Q8Blocks

    good = q8_blocks(256)
    with pytest.raises(KernelConstraintError, match="x must be Q8Blocks of 256 activations .* its d"):
        gemv_q(_w(), "Q4_K", 2, 256, Q8Blocks(good.q, cuda.to_device(np.zeros(1, np.float32)), good.s))


# ---- simulator: the SwiGLU kernel (gate and up in one pass) ------------------------------------------------


@pytest.mark.parametrize("name, rpb, wpr, mmvq", [("Q4_K", 2, 1, True), ("Q6_K", 4, 2, True), ("Q5_0", 2, 2, False),
                                                  ("F16", 4, 1, False)])
def test_glu_matches_two_products_and_swiglu(name, rpb, wpr, mmvq):
    """silu(Wg·x) * (Wu·x) in one kernel: against float64 (each product's own reference, `_assert_glu_close`) and
    bit for bit against `gemv_q` twice plus `kernels.activation.swiglu` (the unfused decode path)."""
    from kernels.activation import swiglu
    from kernels.quantize_q8 import q8_blocks, quantize_q8_1

    rng = np.random.default_rng()
    od, id = 5, _tiny_id(name)
    wg, wu = random_blocks(name, od, id, rng), random_blocks(name, od, id, rng)
    x = rng.standard_normal(id)
    x = (x * 8.0 / np.abs(_reference(wg, name, od, id, x)).max()).astype(np.float32)  # |gate| ~ 8: silu's range
    xd = quantize_q8_1(cuda.to_device(x), q8_blocks(id)) if mmvq else cuda.to_device(x)
    dg, du = cuda.to_device(wg), cuda.to_device(wu)
    out = cuda.to_device(np.full(od, np.nan, np.float32))
    glu = GemvConfig(name, rows_per_block=rpb, warps_per_row=wpr, mmvq=mmvq, glu=True)
    assert gemv_glu(dg, du, name, od, id, xd, out, config=glu) is out
    _assert_glu_close(out.copy_to_host(), wg, wu, name, od, id, x, mmvq)
    gu = cuda.to_device(np.full((1, 2 * od), np.nan, np.float32))
    one = GemvConfig(name, rows_per_block=rpb, warps_per_row=wpr, mmvq=mmvq)
    gemv_q(dg, name, od, id, xd, gu.reshape(2 * od)[:od], config=one)
    gemv_q(du, name, od, id, xd, gu.reshape(2 * od)[od:], config=one)
    unfused = swiglu(gu, out_dtype=np.float32).copy_to_host().reshape(od)
    np.testing.assert_array_equal(out.copy_to_host(), unfused)


def _pair_against_two_launches(names, ods, id, rpb, wpr, mmvq, xres, residual, pdl=0):
    """`gemv_pair` of two weights (formats ``names``, rows ``ods``) over one x equals `gemv_q` on each, bit for bit,
    both outputs poisoned first, and matches the float64 reference."""
    from experiments.gemv import reference_mmvq
    from kernels.quantize_q8 import q8_blocks, quantize_q8_1

    rng = np.random.default_rng()
    x = rng.standard_normal(id).astype(np.float32)
    xd = quantize_q8_1(cuda.to_device(x), q8_blocks(id, compensated=xres)) if mmvq else cuda.to_device(x)
    stream = cuda.stream() if pdl else 0
    calls, want = [], []
    for name, od in zip(names, ods):
        w = random_blocks(name, od, id, rng)
        bias = cuda.to_device(rng.standard_normal(od).astype(np.float32)) if residual else None
        config = GemvConfig(name, rows_per_block=rpb, warps_per_row=wpr, mmvq=mmvq, xres=xres, residual=residual,
                            pdl=pdl)
        dw = cuda.to_device(w)
        want.append(gemv_q(dw, name, od, id, xd, config=config, residual=bias, stream=stream).copy_to_host())
        out = cuda.to_device(np.full(od, np.nan, np.float32))
        calls.append((dw, name, od, id, out, bias, config))
        ref = reference_mmvq(w, name, od, id, x, compensated=xres) if mmvq else _reference(w, name, od, id, x)
        bias_host = bias.copy_to_host() if residual else None
        if residual:
            ref = ref + bias_host.astype(np.float64)
        _assert_close(want[-1], ref, _scale(w, name, od, id, x, bias_host))
    gemv_pair(calls[0], calls[1], xd, stream=stream)
    for (_, _, _, _, out, _, _), expected in zip(calls, want):
        np.testing.assert_array_equal(out.copy_to_host(), expected)


@pytest.mark.parametrize("names, mmvq, xres, residual", [(("Q4_K", "Q6_K"), True, True, True),
                                                         (("Q4_K", "Q8_0"), False, False, False)])
def test_pair_equals_two_launches(names, mmvq, xres, residual):
    """q|k and v of different formats in one launch (FUSE_QKV_MIXED): compensated MMVQ with biases, and f32 x;
    5 and 3 rows (partial last CUDA blocks in both halves)."""
    _pair_against_two_launches(names, (5, 3), 512, 2, 2, mmvq, xres, residual)


def test_pair_rejects_configs_that_cannot_share_a_launch():
    x = _x()
    one = (_w(2), "Q4_K", 2, 256, cuda.device_array(2, np.float32), None, GemvConfig("Q4_K", warps_per_row=2))
    other = (_w(2), "Q4_K", 2, 256, cuda.device_array(2, np.float32), None, GemvConfig("Q4_K", warps_per_row=4))
    with pytest.raises(KernelConstraintError, match="must agree in threads"):
        gemv_pair(one, other, x)
    with pytest.raises(KernelConstraintError, match="second: raw holds 288 bytes"):
        gemv_pair(one, (_w(2), "Q4_K", 3, 256, cuda.device_array(3, np.float32), None, one[-1]), x)
    with pytest.raises(KernelConstraintError, match="needs its out and a GemvConfig without glu"):
        gemv_pair(one, one[:-1] + (None,), x)
    with pytest.raises(KernelConstraintError, match="needs its out and a GemvConfig without glu"):
        gemv_pair(one, one[:-1] + ({"RPB": 2},), x)
    with pytest.raises(KernelConstraintError, match=r"second must be \(raw, qtype, od, id, out, residual, config\)"):
        gemv_pair(one, one[:-1], x)
    staged = GemvConfig("Q6_K", rows_per_block=4, warps_per_row=4, mmvq=True, stage=3)
    assert "over the 49152-byte static limit" in pair_refusal(staged, staged)
    assert pair_refusal(one[-1], one[-1]) is None


def test_glu_rejects_a_wrong_up_and_a_residual():
    with pytest.raises(KernelConstraintError, match="raw_up: raw holds 288 bytes .* od=3 x id=256 needs 432"):
        gemv_glu(_w(3), _w(2), "Q4_K", 3, 256, _x())
    with pytest.raises(KernelConstraintError, match="raw_gate: raw holds 288 bytes"):
        gemv_glu(_w(2), _w(3), "Q4_K", 3, 256, _x())
    with pytest.raises(KernelConstraintError, match="gemv_glu needs raw_up"):
        gemv_glu(_w(2), None, "Q4_K", 2, 256, _x())
    with pytest.raises(KernelConstraintError, match="no residual"):
        GemvConfig("Q4_K", rows_per_block=2, warps_per_row=2, residual=True, glu=True)


# ---- simulator: rejected inputs -----------------------------------------------------------------------------


def _w(od=2, id=256, name="Q4_K"):
    return cuda.to_device(random_blocks(name, od, id, np.random.default_rng(0)))


def _x(n=256, dtype=np.float32):
    return cuda.to_device(np.ones(n, dtype))


@pytest.mark.parametrize(
    "call, needle",
    [
        (lambda: gemv_q(_w(), "Q8_K", 2, 256, _x()), r"Q8_K is not a supported GGUF type"),
        (lambda: gemv_q(_w(), "nope", 2, 256, _x()), r"NOPE is not a supported"),
        (lambda: gemv_q(np.zeros(288, np.uint8), "Q4_K", 2, 256, _x()), r"raw must be a CUDA device array"),
        (lambda: gemv_q(cuda.to_device(np.zeros(144, np.uint16)), "Q4_K", 2, 256, _x()), r"1-D C-contiguous uint8"),
        (lambda: gemv_q(_w(), "Q4_K", 3, 256, _x()), r"holds 288 bytes .* od=3 x id=256 needs 432"),
        (lambda: gemv_q(_w(), "Q4_K", 2, 200, _x(200)), r"id=200 is not a multiple of the Q4_K block size 256"),
        (lambda: gemv_q(_w(2, 12, "F16"), "F16", 2, 12, _x(12)), r"id=12 is not a multiple of 8"),
        (lambda: gemv_q(cuda.to_device(np.zeros(296, np.uint8))[8:], "Q4_K", 2, 256, _x()), r"not 16-byte aligned"),
        (lambda: gemv_q(_w(), "Q4_K", 2, 256, _x(dtype=np.float16)), r"x must be a 1-D float32 device array of 256"),
        (lambda: gemv_q(_w(), "Q4_K", 2, 256, _x(255)), r"x must be a 1-D float32 .* shape \(255,\)"),
        (lambda: gemv_q(_w(), "Q4_K", 2, 256, np.ones(256, np.float32)), r"x must be a CUDA device array"),
        (lambda: gemv_q(_w(), "Q4_K", 2, 256, cuda.to_device(np.ones(260, np.float32))[1:257]), r"x must start at"),
        (lambda: gemv_q(_w(), "Q4_K", 2, 256, _x(), _x(3)), r"out must be a 1-D float32 device array of 2 elements"),
        (lambda: gemv_q(_w(), "Q4_K", 2, 256, _x(), residual=_x(2, np.float64)), r"residual must be a 1-D float32"),
        (lambda: gemv_q(_w(), "Q4_K", 2, 256, _x(), config=GemvConfig("Q6_K")),
         r"config.qtype='Q6_K' does not match this call \(W's format: 'Q4_K'\); make the GemvConfig with qtype='Q4_K'"),
        (lambda: gemv_q(_w(), "Q4_K", 2, 256, _x(), config=GemvConfig("Q4_K", mmvq=True)),
         r"config.mmvq=True does not match this call \(x given as Q8_1 blocks: False\)"),
        (lambda: gemv_q(_w(), "Q4_K", 2, 256, _x(), config=GemvConfig("Q4_K", residual=True)),
         r"config.residual=True does not match this call \(a residual given: False\)"),
        (lambda: gemv_q(_w(), "Q4_K", 2, 256, _x(), config=GemvConfig("Q4_K", glu=True)), r"config.glu=True does not match"),
        (lambda: gemv_q(_w(), "Q4_K", 2, 256, _x(), config=(4, 4)), r"config must be a kernels.gemv.GemvConfig, got tuple"),
        (lambda: kernel_for({"qtype": "Q4_K"}), r"kernel_for takes a GemvConfig, got dict"),
        (lambda: gemv_q(_w(), "Q4_K", 2, 256, _x(), config=GemvConfig("Q4_K", rows_per_block=3)), r"rows_per_block=3 is not supported"),
        (lambda: gemv_q(_w(), "Q4_K", 2, 256, _x(), config=GemvConfig("Q4_K", warps_per_row=16)), r"warps_per_row=16 is not supported"),
        (lambda: gemv_q(_w(8, 256, "Q6_K"), "Q6_K", 8, 256, _x(), config=GemvConfig("Q6_K", stage=5)), r"stage=5 is not supported; allowed: 0, 2, 3, 4"),
        (lambda: gemv_q(_w(8, 256, "Q6_K"), "Q6_K", 8, 256, _x(), config=GemvConfig("Q6_K", stage=1)), r"stage=1 is not supported; allowed: 0, 2, 3, 4"),
        (lambda: gemv_q(_w(), "Q4_K", 2, 256, _x(), config=GemvConfig("Q4_K", stage=2)), r"stage=2 takes the 2-byte-aligned formats Q4_0, .*Q4_K"),
        (lambda: gemv_q(_w(8, 256, "Q6_K"), "Q6_K", 8, 256, _x(), config=GemvConfig("Q6_K", stage=2, rows_per_block=8, warps_per_row=4)),
         r"needs 55296 bytes of shared memory for Q6_K, over the 49152-byte"),
        (lambda: gemv_q(_w(8, 256, "Q6_K"), "Q6_K", 8, 256, _x(), config=GemvConfig("Q6_K", stage=4, rows_per_block=4, warps_per_row=4)),
         r"stage=4 with rows_per_block=4, warps_per_row=4 needs 55296 bytes .* use fewer rows, warps or stages$"),
        (lambda: gemv_q(_w(3, 256, "Q6_K"), "Q6_K", 3, 256, _x(), config=GemvConfig("Q6_K", stage=2)), r"multiple of 16 bytes long, got 630 bytes$"),
        (lambda: gemv_q(cuda.to_device(np.zeros(8 * 210 + 16, np.uint8))[2:-14], "Q6_K", 8, 256, _x(), config=GemvConfig("Q6_K", stage=2)),
         r"stage=2 reads raw in 16-byte vectors: it must start at a 16-byte aligned address .* address % 16 = 2"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_rejects_bad_input(call, needle):
    with pytest.raises(KernelConstraintError, match=needle):
        call()


# ---- experiment ---------------------------------------------------------------------------------------------


def test_experiment_check_passes_and_sees_a_wrong_row():
    from minfer_cli.experiment import get

    exp = get("gemv")
    wl = exp.workload("tiny")
    for arm in ("TYPE=Q6_K,RPB=2,WPR=1", "TYPE=Q5_0", "TYPE=Q4_K,MMVQ=1", "TYPE=Q4_K,MMVQ=1,GLU=1", "TYPE=Q8_0,GLU=1"):
        config = exp.config(arm)
        inputs, output = exp.make_input_set(wl, np.random.default_rng()), exp.make_output(wl)
        launch = exp.prepare(config, wl)
        exp.poison(output)
        assert exp.check(config, wl, inputs, output) == float("inf")  # the NaN poison never passes
        launch(inputs, output, 0)
        assert exp.check(config, wl, inputs, output) < exp.tolerance(config, wl) == TOL
        host = output.copy_to_host()
        host[3] += 1.0 + np.abs(host).max()
        output.copy_to_device(host)
        assert exp.check(config, wl, inputs, output) > TOL


def test_experiment_knobs_reach_the_launch(monkeypatch):
    import kernels.gemv as mod  # the experiment imports the launchers from here when it prepares an arm
    from minfer_cli.experiment import get

    seen = []
    monkeypatch.setattr(
        mod,
        "gemv_q",
        lambda raw, qtype, od, id, x, out, config, stream: seen.append(
            (qtype, config.rows_per_block, config.warps_per_row, config.stage, config.min_blocks, config.fold,
             config.pdl, raw.size)),
    )
    exp = get("gemv")
    wl = exp.workload("tiny")
    inputs, output = exp.make_input_set(wl, np.random.default_rng()), exp.make_output(wl)
    for arm in ("TYPE=Q4_K,RPB=1,WPR=8", "TYPE=Q8_0,RPB=8,WPR=1", "TYPE=Q6_K,MINB=7",
                "TYPE=Q6_K,STAGE=3,FOLD=1,MMVQ=1", "TYPE=Q4_K,PDL=1"):
        exp.prepare(exp.config(arm), wl)(inputs, output, 0)
    assert seen == [("Q4_K", 1, 8, 0, 0, 0, 0, 5 * 2 * 144), ("Q8_0", 8, 1, 0, 0, 0, 0, 5 * 16 * 34),
                    ("Q6_K", 4, 4, 0, 7, 0, 0, 5 * 2 * 210), ("Q6_K", 4, 4, 3, 0, 1, 0, 5 * 2 * 210),
                    ("Q4_K", 4, 4, 0, 0, 0, 1, 5 * 2 * 144)]


@pytest.mark.parametrize("arm, workload, needle", [
    ("TYPE=Q6_K,STAGE=2", "tiny", "stage=2 reads tiny's W in 16-byte vectors: .* got 2100 bytes"),
    ("TYPE=Q4_K,STAGE=2", "ffn_up", "stage=2 takes the 2-byte-aligned formats"),
    ("TYPE=Q6_K,STAGE=2,RPB=8,WPR=8", "ffn_down", "over the 49152-byte static limit"),
    ("TYPE=Q6_K,STAGE=2,RPB=4,WPR=2", "ffn_down", None),
    ("TYPE=Q6_K,STAGE=3,RPB=8,WPR=1", "output", None),
    ("TYPE=Q6_K,STAGE=4,RPB=4,WPR=4", "ffn_down", "stage=4 with rows_per_block=4, warps_per_row=4 needs"),
    ("TYPE=Q6_K,STAGE=2,RPB=4,WPR=4", "ffn_down", None),
    ("TYPE=Q4_K,FOLD=1,MMVQ=1", "ffn_down", "fold=1 takes Q6_K .* Q4_K has none, use fold=0"),
    ("TYPE=Q6_K,FOLD=1", "ffn_down", "fold=1 folds the offset .* needs Q8_1 x"),
    ("TYPE=Q6_K,FOLD=1,MMVQ=1,STAGE=0", "ffn_down", None),
])
def test_experiment_refuses_stage_where_the_kernel_cannot_take_it(arm, workload, needle):
    from minfer_cli.experiment import get

    exp = get("gemv")
    reason = exp.refuse(exp.config(arm), exp.workload(workload))
    assert reason is None if needle is None else re.search(needle, reason)


def test_experiment_cost_and_workloads():
    from minfer_cli.experiment import get

    exp = get("gemv")
    shapes = {w.name: (w.shape["od"], w.shape["id"]) for w in exp.workloads}
    assert shapes["ffn_up"] == (18944, 3584) and shapes["ffn_down"] == (3584, 18944)
    assert shapes["attn_qkv"] == (4608, 3584) and shapes["attn_output"] == (3584, 3584)
    assert shapes["output"] == (152064, 3584)
    from minfer_cli.engine.presets import PRESETS

    small = PRESETS["qwen2-1.5b-q4_k_m"]  # the 1.5B decode shapes follow the preset
    q_kv = small.n_heads * small.head_dim + 2 * small.n_kv_heads * small.head_dim
    assert shapes["ffn_up_1_5b"] == (small.ffn, small.hidden) and shapes["ffn_down_1_5b"] == (small.hidden, small.ffn)
    assert shapes["attn_qkv_1_5b"] == (q_kv, small.hidden) and shapes["attn_output_1_5b"] == (small.hidden,) * 2
    assert shapes["output_1_5b"] == (small.vocab, small.hidden)
    wl = exp.workload("ffn_up")
    od, id = 18944, 3584
    assert exp.cost(wl).bytes == od * id // 256 * 144 + 4 * id + 4 * od
    assert exp.cost(wl, {"TYPE": "Q6_K"}).bytes == od * id // 256 * 210 + 4 * id + 4 * od
    assert exp.cost(wl).flops == 2 * od * id
    assert exp.cost(wl, {"TYPE": "Q4_K", "GLU": 1}).bytes == 2 * od * id // 256 * 144 + 4 * id + 4 * od
    assert exp.cost(wl, {"TYPE": "Q4_K", "MMVQ": 1}).bytes == od * id // 256 * 144 + id + 8 * id // 32 + 4 * od
    assert exp.ceiling == "copy"
    with pytest.raises(KernelConstraintError, match="MMVQ"):
        exp.prepare(exp.config("TYPE=Q5_0,MMVQ=1"), wl)


@pytest.mark.parametrize("name, od, id, rpb, wpr, mmvq, stage", [
    ("Q6_K", 4, 1536, 8, 1, True, 2), ("Q6_K", 3, 2048, 2, 2, False, 3), ("Q6_K", 5, 4096, 1, 2, True, 4),
    ("Q8_0", 3, 1280, 4, 2, True, 4), ("Q4_0", 4, 704, 8, 1, False, 2), ("Q3_K", 4, 1536, 4, 2, False, 3),
    ("Q5_0", 3, 1280, 2, 4, False, 2)])
def test_ring_against_float64_and_bit_for_bit_the_direct_decode(name, od, id, rpb, wpr, mmvq, stage):
    """STAGE=2..4 (a per-warp cp.async ring of shared windows, STAGE - 1 chunks ahead) with a partial last chunk,
    a partial last CUDA block or idle warps, rows with more chunks than slots (the ring wraps) and fewer (a warp's
    ring never fills), chunks at every phase mod 16: against float64, and bit for bit against STAGE=0. A chunk
    decoded from the wrong slot or window, or before its copy's wait (the simulator's cp.async lands only at the
    `wait_group` that retires it: `kernels.ptx.CP_ASYNC_POISON` until then), would miss both."""
    assert name in STAGE_TYPES and od * id // FORMATS[name].block_size * FORMATS[name].type_size % 16 == 0
    seed = int(np.random.default_rng().integers(2**63))
    ring, ref, scale = _run(name, od, id, rpb=rpb, wpr=wpr, mmvq=mmvq, stage=stage, rng=np.random.default_rng(seed))
    _assert_close(ring, ref, scale)
    direct, *_ = _run(name, od, id, rpb=rpb, wpr=wpr, mmvq=mmvq, rng=np.random.default_rng(seed))
    np.testing.assert_array_equal(ring, direct)


def test_ring_glu_bit_for_bit():
    """The SwiGLU kernel with STAGE=3 rings both weights' chunks: bit for bit the STAGE=0 kernel."""
    off, on = _glu_knob_off_and_on("Q6_K", 4, 1536, "stage", on=3)
    assert np.isfinite(on).all()
    np.testing.assert_array_equal(on, off)


@pytest.mark.parametrize("od, id, rpb, wpr, stage", [
    (5, 1536, 2, 2, 0), (3, 2048, 4, 1, 0), (4, 1536, 8, 1, 3), (9, 512, 4, 2, 0)])
def test_fold_against_float64_and_bit_for_bit_the_per_word_offset(od, id, rpb, wpr, stage):
    """FOLD=1 (Q6_K MMVQ: -32*Σx once per chunk starts each plane's dp4a chain) on fresh random blocks, with a
    partial last CUDA block and the cp.async ring: against float64 and bit for bit FOLD=0 (the same integer sums).
    A wrong plane's correction or a sign slip would move every row."""
    seed = int(np.random.default_rng().integers(2**63))
    runs = [_run("Q6_K", od, id, rpb=rpb, wpr=wpr, mmvq=True, stage=stage, fold=f,
                 rng=np.random.default_rng(seed)) for f in (0, 1)]
    _assert_close(*runs[1])
    np.testing.assert_array_equal(runs[1][0], runs[0][0])


def test_fold_refusals():
    """FOLD=1 for another format, with f32 x, or an unknown value."""
    with pytest.raises(KernelConstraintError, match="fold=1 takes Q6_K .* Q4_K has none"):
        GemvConfig("Q4_K", rows_per_block=4, warps_per_row=2, mmvq=True, fold=1)
    with pytest.raises(KernelConstraintError, match="needs Q8_1 x"):
        GemvConfig("Q6_K", rows_per_block=4, warps_per_row=2, fold=1)
    with pytest.raises(KernelConstraintError, match="fold=2 is not supported; allowed: 0, 1"):
        GemvConfig("Q6_K", rows_per_block=4, warps_per_row=2, mmvq=True, fold=2)


# ---- gpu: real shapes ---------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "Q8_0"])
@pytest.mark.parametrize("od, id", [(18944, 3584), (3584, 18944)], ids=["ffn_up", "ffn_down"])
def test_real_ffn_shapes(name, od, id):
    _assert_close(*_run(name, od, id, rpb=4, wpr=4))


@pytest.mark.gpu
@pytest.mark.parametrize("name", MMVQ_TYPES)
@pytest.mark.parametrize("od, id", [(18944, 3584), (3584, 18944), (301, 3584)], ids=["ffn_up", "ffn_down", "tail"])
def test_mmvq_real_shapes(name, od, id):
    _assert_close(*_run(name, od, id, rpb=2, wpr=2, mmvq=True))


@pytest.mark.gpu
@pytest.mark.parametrize("name, rpb, wpr, stage, minb", [("Q4_K", 4, 4, 0, 7), ("Q6_K", 4, 4, 2, 7), ("Q8_0", 4, 2, 0, 0)])
def test_pdl_launches_back_to_back_accumulate_in_place(name, rpb, wpr, stage, minb):
    """Eight PDL=1 launches in a row on one stream at ffn_down, each adding W·x to y in place (y is the residual):
    every launch reads y only after the one before has written it (griddepcontrol.wait), so y = y0 + 8 W·x; a
    launch that read y early would lose a term. Against float64, with the first launch (compiling) ordinary."""
    from experiments.gemv import reference_mmvq
    from kernels.quantize_q8 import q8_blocks, quantize_q8_1

    od, id = 3584, 18944
    rng = np.random.default_rng()
    raw = random_blocks(name, od, id, rng)
    x = rng.standard_normal(id).astype(np.float32)
    y0 = rng.standard_normal(od).astype(np.float32)
    stream = cuda.stream()
    dev, y = cuda.to_device(raw, stream=stream), cuda.to_device(y0, stream=stream)
    xq = quantize_q8_1(cuda.to_device(x, stream=stream), q8_blocks(id), stream=stream)
    for _ in range(8):
        gemv_q(dev, name, od, id, xq, y, config=GemvConfig(name, rows_per_block=rpb, warps_per_row=wpr, stage=stage,
                                                          min_blocks=minb, pdl=1, mmvq=True, residual=True),
               residual=y, stream=stream)
    stream.synchronize()
    ref = y0.astype(np.float64) + 8 * reference_mmvq(raw, name, od, id, x)
    _assert_close(y.copy_to_host(), ref, 8 * _scale(raw, name, od, id, x) + np.abs(y0), tol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("name, mmvq", [("Q6_K", True), ("Q6_K", False), ("Q8_0", True)])
@pytest.mark.parametrize("od, id", [(3584, 18944), (300, 3584)], ids=["ffn_down", "tail"])
def test_ring_real_shapes(name, mmvq, od, id):
    """STAGE=2 and 4 on the device at Q6_K's ffn_down shape and 300 rows: a misaligned cp.async would fault, a
    missing wait or warp barrier would decode a slot before (or after) its copy and miss the reference."""
    _assert_close(*_run(name, od, id, rpb=4, wpr=2, mmvq=mmvq, stage=2))
    _assert_close(*_run(name, od, id, rpb=2, wpr=2, mmvq=mmvq, stage=4))


@pytest.mark.gpu
@pytest.mark.parametrize("name, mmvq", [("Q6_K", True), ("Q4_K", True), ("Q4_K", False), ("Q8_0", True)])
@pytest.mark.parametrize("od, id", [(3584, 18944), (300, 3584)], ids=["ffn_down", "tail"])
def test_min_blocks_real_shapes(name, mmvq, od, id):
    """MINB=7 on the device at ffn_down and 300 rows (a partial last CUDA block): a register cap, so ptxas may
    schedule or spill differently; against float64, and bit for bit against MINB=0 (the arithmetic is the same)."""
    seed = int(np.random.default_rng().integers(2**63))
    runs = [_run(name, od, id, rpb=4, wpr=4, mmvq=mmvq, min_blocks=m, rng=np.random.default_rng(seed)) for m in (7, 0)]
    _assert_close(*runs[0])
    np.testing.assert_array_equal(runs[0][0], runs[1][0])


@pytest.mark.gpu
@pytest.mark.parametrize("od, id", [(3584, 18944), (300, 3584)], ids=["ffn_down", "tail"])
def test_fold_real_shapes(od, id):
    """FOLD=1 on the device at Q6_K's ffn_down shape and 300 rows, with and without the cp.async ring."""
    _assert_close(*_run("Q6_K", od, id, rpb=4, wpr=2, mmvq=True, fold=1))
    _assert_close(*_run("Q6_K", od, id, rpb=2, wpr=2, mmvq=True, stage=2, fold=1))


@pytest.mark.gpu
@pytest.mark.parametrize("rpb, wpr", [(4, 2), (8, 1)])
def test_glu_real_shape(rpb, wpr):
    """The fused gate/up SwiGLU pass at Qwen2-7B's ffn shape, MMVQ Q4_K, against float64 references."""
    from kernels.quantize_q8 import q8_blocks, quantize_q8_1

    rng = np.random.default_rng()
    od, id = 18944, 3584
    wg, wu = random_blocks("Q4_K", od, id, rng), random_blocks("Q4_K", od, id, rng)
    x = rng.standard_normal(id)
    x = (x * 8.0 / np.abs(_reference(wg, "Q4_K", od, id, x)).max()).astype(np.float32)  # |gate| <= 8
    out = cuda.to_device(np.full(od, np.nan, np.float32))
    gemv_glu(cuda.to_device(wg), cuda.to_device(wu), "Q4_K", od, id, quantize_q8_1(cuda.to_device(x), q8_blocks(id)),
             out, config=GemvConfig("Q4_K", rows_per_block=rpb, warps_per_row=wpr, mmvq=True, glu=True))
    _assert_glu_close(out.copy_to_host(), wg, wu, "Q4_K", od, id, x, mmvq=True)


@pytest.mark.gpu
@pytest.mark.parametrize("ods, id", [((1792, 256), 1536), ((4096, 512), 3584)], ids=["1.5B", "7B"])
def test_pair_real_shapes(ods, id):
    """The decode's q|k (Q4_K) and v (Q6_K) launch at the 1.5B and 7B shapes, compensated MMVQ, biases, PDL:
    bit-identical to two launches."""
    _pair_against_two_launches(("Q4_K", "Q6_K"), ods, id, 4, 2, True, True, True, pdl=1)


@pytest.mark.gpu
@pytest.mark.parametrize("name", GEMV_TYPES)
def test_medium_shape(name):
    od, id = 301, 3584  # 301 rows: a partial last CUDA block for every RPB > 1
    _assert_close(*_run(name, od, id, rpb=4, wpr=4))
    if FORMATS[name].block_size > 1:  # start one block in: the misaligned-block case on real hardware
        ts = FORMATS[name].type_size
        _assert_close(
            *_run(name, od, id, rpb=2, wpr=8, raw_device=lambda r: cuda.to_device(np.concatenate([r[:ts], r]))[ts:])
        )
