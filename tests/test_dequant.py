"""GGUF blocks -> f16 dequantization (`kernels.quant`): every format bit-exact against gguf-py.

Simulator session: every format at tiny shapes against ``float16(gguf.quants.dequantize(...))`` compared as
f16 bit patterns (no tolerance: the kernels reproduce gguf-py's float32 operations and its rounding), output
poisoned with NaN first, shapes with a partial last CUDA block and a float tail, buffers starting at a block whose
address is 2 mod 4 (the Q5_0 misaligned-load trap), and every rejected input.
`compile` (no simulator): each kernel builds for sm_90 and its global loads are never wider than the alignment
its format guarantees (byte/halfword loads only for the odd block sizes), no fma, no local memory.
`gpu`: real 7B shapes on the device.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from numba import cuda

from kernels.errors import KernelConstraintError
from kernels.quant import FORMATS, SUPPORTED, dequantize, kernel_for, kernel_signature
from kernels.quant.dequant import _address
from minfer_cli.quant_blocks import random_blocks, reference_f16

BLOCK_TYPES = [n for n in SUPPORTED if FORMATS[n].block_size > 1]
FLOAT_TYPES = [n for n in SUPPORTED if FORMATS[n].block_size == 1]
ODD_TYPES = [n for n in BLOCK_TYPES if FORMATS[n].type_size % 4]  # blocks start 2- (or 1-) byte aligned


def _tiny_shape(name: str) -> tuple[int, int]:
    """od, id with a partial last CUDA block at tpb=64 (64 threads x 8 outputs = 512 elements per block)."""
    bs = FORMATS[name].block_size
    return (3, 256) if bs == 256 else (5, 64) if bs == 32 else (3, 37)  # 768 / 320 / 111 (tail of 7) elements


def _run(raw_host, name, od, id, tpb=64, raw_device=None):
    out = cuda.to_device(np.full((od, id), np.nan, dtype=np.float16))
    raw = cuda.to_device(raw_host) if raw_device is None else raw_device
    got = dequantize(raw, name, od, id, out=out, tpb=tpb)
    assert got is out
    return out.copy_to_host()


def _assert_bit_exact(got, ref):
    assert not np.isnan(got).any(), "some output elements were never written (still the NaN poison)"
    bad = np.flatnonzero(got.view(np.uint16) != ref.view(np.uint16))
    if bad.size:
        i = bad[0]
        pytest.fail(f"{bad.size} mismatches, first at flat index {i}: {got.flat[i]} vs reference {ref.flat[i]}")


# ---- simulator: numbers ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SUPPORTED)
def test_bit_exact_against_gguf(name):
    od, id = _tiny_shape(name)
    raw = random_blocks(name, od, id, np.random.default_rng())
    _assert_bit_exact(_run(raw, name, od, id), reference_f16(raw, name, od, id))


@pytest.mark.parametrize("name", FLOAT_TYPES)
@pytest.mark.parametrize("od, id", [(2, 64), (1, 5), (1, 8)])  # no tail, only a tail, exactly one group
def test_float_shapes(name, od, id):
    raw = random_blocks(name, od, id, np.random.default_rng())
    _assert_bit_exact(_run(raw, name, od, id, tpb=128), reference_f16(raw, name, od, id))


@pytest.mark.parametrize("name", BLOCK_TYPES)
def test_buffer_starting_at_an_unaligned_block(name):
    """The tensor's bytes start one block into an aligned allocation: for the odd sizes the first block (and
    every other one after it) starts 2 mod 4 (MXFP4: 1 mod 4), where a 4-byte load faults on a GPU."""
    fmt = FORMATS[name]
    od, id = 2, fmt.block_size * 2
    raw = random_blocks(name, od, id, np.random.default_rng())
    padded = np.concatenate([np.full(fmt.type_size, 0xA5, np.uint8), raw])
    view = cuda.to_device(padded)[fmt.type_size :]
    offset = _address(view) % 16
    assert offset == fmt.type_size % 16  # the allocation itself is 16-byte aligned
    if name in ODD_TYPES:
        assert offset % 4 in (1, 2)
    _assert_bit_exact(_run(raw, name, od, id, raw_device=view), reference_f16(raw, name, od, id))


@pytest.mark.parametrize("tpb", [64, 1024])
def test_launch_shape_does_not_change_the_result(tpb):
    od, id = 3, 512
    raw = random_blocks("Q4_K", od, id, np.random.default_rng())
    _assert_bit_exact(_run(raw, "Q4_K", od, id, tpb=tpb), reference_f16(raw, "Q4_K", od, id))


def test_allocates_out_when_none_is_given():
    raw = random_blocks("Q8_0", 2, 32, np.random.default_rng())
    out = dequantize(cuda.to_device(raw), "Q8_0", 2, 32)
    assert out.shape == (2, 32) and out.dtype == np.float16
    _assert_bit_exact(out.copy_to_host(), reference_f16(raw, "Q8_0", 2, 32))


def test_qtype_may_be_the_gguf_enum_or_its_value():
    from gguf.constants import GGMLQuantizationType as T

    raw = random_blocks("Q6_K", 1, 256, np.random.default_rng())
    ref = reference_f16(raw, "Q6_K", 1, 256)
    _assert_bit_exact(_run(raw, T.Q6_K, 1, 256), ref)
    _assert_bit_exact(_run(raw, int(T.Q6_K), 1, 256), ref)


# ---- simulator: rejected inputs ---------------------------------------------------------------------------


def _q4k(od=2, id=256):
    return cuda.to_device(random_blocks("Q4_K", od, id, np.random.default_rng(0)))


@pytest.mark.parametrize(
    "call, needle",
    [
        (lambda: dequantize(_q4k(), "Q8_K", 2, 256), r"Q8_K is not a supported GGUF type; supported: F32, F16"),
        (lambda: dequantize(_q4k(), "nope", 2, 256), r"NOPE is not a supported"),
        (lambda: dequantize(_q4k(), 999, 2, 256), r"999 is not a supported"),
        (lambda: dequantize(np.zeros(288, np.uint8), "Q4_K", 2, 256), r"raw must be a CUDA device array"),
        (lambda: dequantize(cuda.to_device(np.zeros(144, np.uint16)), "Q4_K", 2, 256), r"1-D C-contiguous uint8"),
        (lambda: dequantize(cuda.to_device(np.zeros((2, 144), np.uint8)), "Q4_K", 2, 256), r"ndim 2"),
        (lambda: dequantize(cuda.to_device(np.zeros(576, np.uint8))[::2], "Q4_K", 2, 256), r"contiguous=False"),
        (lambda: dequantize(cuda.to_device(np.zeros(290, np.uint8)), "Q4_K", 2, 256), r"not a whole number of 144"),
        (lambda: dequantize(_q4k(), "Q4_K", 3, 256), r"holds 288 bytes .* od=3 x id=256 needs 432"),
        (lambda: dequantize(_q4k(), "Q4_K", 2, 200), r"id=200 is not a multiple of the Q4_K block size 256"),
        (lambda: dequantize(_q4k(), "Q4_K", -1, 256), r"od must be a non-negative integer"),
        (lambda: dequantize(cuda.to_device(np.zeros(296, np.uint8))[8:], "Q4_K", 2, 256), r"not 16-byte aligned"),
        (lambda: dequantize(cuda.to_device(np.zeros(69, np.uint8))[1:], "Q8_0", 1, 64), r"not 2-byte aligned"),
        (
            lambda: dequantize(_q4k(), "Q4_K", 2, 256, out=cuda.device_array((2, 256), np.float32)),
            r"out must be a float16 device array of shape \(2, 256\), got float32",
        ),
        (
            lambda: dequantize(_q4k(), "Q4_K", 2, 256, out=cuda.device_array((256, 2), np.float16)),
            r"got float16 of shape \(256, 2\)",
        ),
        (
            lambda: dequantize(_q4k(), "Q4_K", 2, 256, out=cuda.device_array((256, 2), np.float16).T),
            r"out must be C-contiguous",
        ),
        (lambda: dequantize(_q4k(), "Q4_K", 2, 256, tpb=96), r"tpb=96 is not supported; allowed: 64, 128"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_rejects_bad_input(call, needle):
    with pytest.raises(KernelConstraintError, match=needle):
        call()


# ---- generator and experiment -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", SUPPORTED)
def test_random_blocks_are_valid(name):
    fmt = FORMATS[name]
    raw = random_blocks(name, 4, 2 * fmt.block_size if fmt.block_size > 1 else 40, np.random.default_rng())
    assert raw.dtype == np.uint8 and raw.ndim == 1
    assert raw.size == 4 * fmt.row_bytes(2 * fmt.block_size if fmt.block_size > 1 else 40)
    ref = reference_f16(raw, name, 4, raw.size // 4 // fmt.type_size * fmt.block_size)
    assert np.isfinite(ref).all() and np.count_nonzero(ref) > ref.size // 2
    assert np.abs(ref).max() < 1000  # far from the f16 limit 65504


def test_experiment_check_is_exact_and_sees_one_wrong_element():
    from minfer_cli.experiment import get

    exp = get("dequant")
    wl = exp.workload("tiny")
    for arm in ("TYPE=Q6_K,TPB=64", "TYPE=Q5_0"):
        config = exp.config(arm)
        inputs, output = exp.make_input_set(wl, np.random.default_rng()), exp.make_output(wl)
        launch = exp.prepare(config, wl)
        exp.poison(output)
        launch(inputs, output, 0)
        assert exp.check(config, wl, inputs, output) == 0.0 == exp.tolerance(config, wl)
        host = output.copy_to_host()
        host[1, 7] = np.float16(1234.0)
        output.copy_to_device(host)
        assert exp.check(config, wl, inputs, output) == pytest.approx(1 / host.size)


def test_experiment_knobs_reach_the_launch(monkeypatch):
    """TYPE selects the kernel and TPB the CUDA block size of the launch (no knob is ignored)."""
    import kernels.quant as mod  # the experiment imports the launcher from here when it prepares an arm
    from minfer_cli.experiment import get

    seen = []
    monkeypatch.setattr(mod, "dequantize", lambda raw, qtype, od, id, out, stream, tpb: seen.append((qtype, tpb)))
    exp = get("dequant")
    wl = exp.workload("tiny")
    inputs, output = exp.make_input_set(wl, np.random.default_rng()), exp.make_output(wl)
    for arm in ("TYPE=Q4_K,TPB=64", "TYPE=Q8_0,TPB=512"):
        exp.prepare(exp.config(arm), wl)(inputs, output, 0)
    assert seen == [("Q4_K", 64), ("Q8_0", 512)]


def test_experiment_cost():
    from minfer_cli.experiment import get

    exp = get("dequant")
    wl = exp.workload("ffn_up")
    od, id = 18944, 3584
    assert exp.cost(wl).bytes == od * id // 256 * 144 + 2 * od * id
    assert exp.cost(wl, {"TYPE": "Q6_K"}).bytes == od * id // 256 * 210 + 2 * od * id
    assert exp.cost(wl).flops == 0


# ---- compile (real NVVM, no GPU) ------------------------------------------------------------------------

_LOAD = re.compile(r"\bld\.global(?:\.nc)?(?:\.(?:L1|L2)::\S+)?(?:\.v(\d))?\.([usbf])(\d+)")


def _ptx(name):
    ptx, _ = cuda.compile_ptx(kernel_for(name).py_func, kernel_signature(name), cc=(9, 0))
    return ptx


@pytest.mark.compile
@pytest.mark.parametrize("name", SUPPORTED)
def test_kernel_compiles_with_aligned_loads_only(name):
    """Every global load is at most ``align`` bytes wide (the launcher checks the buffer's alignment and every
    load sits at an ``align``-multiple offset of a block start); odd block sizes: u8/u16 loads only."""
    ptx = _ptx(name)
    loads = _LOAD.findall(ptx)
    assert loads, "no global load found: the PTX pattern is stale"
    widths = {int(vec or 1) * int(bits) // 8 for vec, _, bits in loads}
    assert max(widths) <= FORMATS[name].align, f"{name}: load widths {sorted(widths)} > align {FORMATS[name].align}"
    if name in ODD_TYPES:
        assert widths <= {1, 2}, f"{name}: odd-size blocks may only be read byte- or halfword-wise, got {widths}"
    assert "st.global.v4.u32" in ptx  # one 16-byte store per 8 outputs
    assert "fma" not in ptx  # a fused multiply-add would round once where gguf-py rounds twice
    assert ".local" not in ptx  # the 8-value staging array lives in registers


@pytest.mark.compile
@pytest.mark.parametrize("name", [n for n in SUPPORTED if n != "F16"])
def test_kernel_rounds_with_one_packed_conversion_per_pair(name):
    assert "cvt.rn.f16x2.f32" in _ptx(name)


# ---- gpu: real shapes ---------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["Q4_K", "Q6_K"])
def test_real_ffn_up_shape(name):
    od, id = 18944, 3584
    raw = random_blocks(name, od, id, np.random.default_rng())
    _assert_bit_exact(_run(raw, name, od, id, tpb=256), reference_f16(raw, name, od, id))


@pytest.mark.gpu
@pytest.mark.parametrize("name", SUPPORTED)
def test_medium_shape(name):
    od, id = 301, 3584  # 301 rows: a partial last CUDA block for every format
    raw = random_blocks(name, od, id, np.random.default_rng())
    _assert_bit_exact(_run(raw, name, od, id, tpb=256), reference_f16(raw, name, od, id))
    view = cuda.to_device(np.concatenate([np.zeros(FORMATS[name].type_size, np.uint8), raw]))
    if FORMATS[name].block_size > 1:  # start one block in: the misaligned-block case on real hardware
        _assert_bit_exact(
            _run(raw, name, od, id, raw_device=view[FORMATS[name].type_size :]), reference_f16(raw, name, od, id)
        )
