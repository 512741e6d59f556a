"""Decode mat-vec kernels (`kernels.gemv`) compiled with the real NVVM for sm_90 (no GPU, no simulator).

Weight loads are never wider than the format's alignment (16-byte loads only for x in the 2/4/8-byte-aligned
formats), no local memory, no float64, every config field and knob changes the code, the PDL prefetch and trigger
order, the cp.async ring, the folded offset, MINB as the launch bound. The numbers of the same kernels are tested
in tests/test_gemv.py (simulator, float64 reference) and on the GPU.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
from numba import cuda
from numba import types as numba_types

from kernels.gemv import GEMV_TYPES, MMVQ_TYPES, GemvConfig, kernel_for, kernel_signature
from kernels.quant.formats import FORMATS

ODD_TYPES = [n for n in GEMV_TYPES if FORMATS[n].block_size > 1 and FORMATS[n].type_size % 4]
_PTX: dict = {}


_LOAD = re.compile(r"\bld\.global(?:\.nc)?(?:\.(?:L1|L2)::\S+)?(?:\.v(\d))?\.([usbf])(\d+)")


def _config_ptx(config: GemvConfig) -> str:
    """The sm_90 PTX of one gemv kernel, compiled with the launch bounds its dispatcher carries (MINB); each config
    compiled once per test process (the compile tests share many)."""
    if config not in _PTX:
        kernel = kernel_for(config)
        _PTX[config] = cuda.compile_ptx(kernel.py_func, kernel_signature(config), cc=(9, 0),
                                        launch_bounds=kernel.targetoptions.get("launch_bounds"))[0]
    return _PTX[config]


def _ptx(name, rpb, wpr, residual=False, mmvq=False, glu=False, stage=0, min_blocks=0, fold=0, pdl=0, xres=False):
    return _config_ptx(GemvConfig(name, rows_per_block=rpb, warps_per_row=wpr, residual=residual, mmvq=mmvq, glu=glu,
                                  stage=stage, min_blocks=min_blocks, fold=fold, pdl=pdl, xres=xres))


def _load_widths(ptx):
    widths: dict[int, int] = {}
    for vec, _, bits in _LOAD.findall(ptx):
        w = int(vec or 1) * int(bits) // 8
        widths[w] = widths.get(w, 0) + 1
    return widths


@pytest.mark.compile
@pytest.mark.parametrize("name", GEMV_TYPES)
def test_loads_no_wider_than_the_format_alignment(name):
    """W's loads are at most ``align`` bytes wide. x (f32, 16-byte aligned) is read with 16-byte loads in every
    format; in the formats aligned below 16 those are the only 16-byte loads, which the test tells apart by their
    count not growing with RPB (x is loaded once per step and shared by the rows, W once per row)."""
    align = FORMATS[name].align
    one, two = _load_widths(_ptx(name, 1, 2)), _load_widths(_ptx(name, 2, 2))
    assert one, "no global load found: the PTX pattern is stale"
    if align < 16:
        assert one.get(16, 0) == two.get(16, 0) > 0, f"{name}: 16-byte loads scale with the rows: {one} vs {two}"
        assert max(w for w in two if w != 16) <= align, f"{name}: weight loads {two} wider than align {align}"
        assert sum(n for w, n in two.items() if w != 16) > sum(n for w, n in one.items() if w != 16)
    else:
        assert set(two) == {16}, f"{name}: expected 16-byte loads only, got {two}"
    if name in ODD_TYPES:
        assert set(two) - {16} <= {1, 2}, f"{name}: odd-size blocks may only be read byte- or halfword-wise"


@pytest.mark.compile
@pytest.mark.parametrize("name", GEMV_TYPES)
def test_default_kernel_has_no_local_memory_and_no_float64(name):
    from kernels.gemv import DEFAULT_RPB, DEFAULT_WPR

    ptx = _ptx(name, DEFAULT_RPB, DEFAULT_WPR)
    assert ".local" not in ptx, "accumulators or x registers spilled to local memory in NVVM's output"
    assert ".f64" not in ptx, "a float64 operation crept in (an int * float32 without np.float32?)"
    assert "shfl.sync.bfly" in ptx
    assert "ld.global.v4.u32" in ptx  # x


@pytest.mark.compile
def test_eight_rows_per_block_stay_in_registers():
    assert ".local" not in _ptx("Q4_K", 8, 4)


@pytest.mark.compile
def test_xres_runs_a_second_dp4a_chain_in_registers():
    """XRES=1 on the decode engine's Q6_K ffn_down launch (ring, FOLD, one-wave MINB): every dp4a of the plain
    kernel twice (the residual chain; FOLD's offsets are computed for both values) and nothing spilled."""
    plain, comp = (_ptx("Q6_K", 4, 4, mmvq=True, stage=2, fold=1, min_blocks=4, pdl=1, xres=x) for x in (False, True))
    assert comp.count("dp4a.s32.s32") == 2 * plain.count("dp4a.s32.s32") > 0
    assert ".local" not in comp


_FIELD_CHANGES = {
    "qtype": ({"qtype": "Q4_K"}, {"qtype": "Q6_K"}),
    "rows_per_block": ({}, {"rows_per_block": 2}),
    "warps_per_row": ({}, {"warps_per_row": 2}),
    "stage": ({"qtype": "Q6_K"}, {"qtype": "Q6_K", "stage": 2}),
    "min_blocks": ({}, {"min_blocks": 4}),
    "fold": ({"qtype": "Q6_K", "mmvq": True}, {"qtype": "Q6_K", "mmvq": True, "fold": 1}),
    "pdl": ({}, {"pdl": 1}),
    "lookahead": ({"pdl": 1}, {"pdl": 1, "lookahead": 2}),
    "glu": ({}, {"glu": True}),
    "mmvq": ({}, {"mmvq": True}),
    "xres": ({"mmvq": True}, {"mmvq": True, "xres": True}),
    "residual": ({}, {"residual": True}),
}
"""Per `GemvConfig` field, two configurations that differ in it alone (`test_every_config_field_changes_the_kernel`)."""


def test_config_is_the_cache_key_and_generates_the_experiment_knobs():
    """`GemvConfig` normalises what it is given (a format's enum or value, numpy integers, 0/1 flags) so that equal
    kernels are equal keys: `kernel_for` returns the same dispatcher; its knob table is the gemv experiment's knobs,
    and `from_knobs` / `knob_values` are inverse."""
    from gguf import GGMLQuantizationType

    from minfer_cli.experiment import get

    a = GemvConfig("Q6_K", rows_per_block=np.int64(2), mmvq=1, stage=2, fold=True)
    b = GemvConfig(GGMLQuantizationType.Q6_K, rows_per_block=2, mmvq=True, stage=np.int32(2), fold=1)
    assert a == b and hash(a) == hash(b) and kernel_for(a) is kernel_for(b)
    assert a.qtype == "Q6_K" and a.fold == 1 and a.mmvq is True
    exp = get("gemv")
    assert [(k.name, k.values, k.default) for k in exp.knobs] == [spec[:3] for spec in GemvConfig.knob_specs()]
    assert GemvConfig.from_knobs(a.knob_values()) == a
    assert GemvConfig.from_knobs(exp.default_config()) == GemvConfig("Q4_K")
    assert set(_FIELD_CHANGES) == {f.name for f in dataclasses.fields(GemvConfig)}, \
        "a GemvConfig field without an entry in _FIELD_CHANGES: say how it changes the kernel"


@pytest.mark.compile
@pytest.mark.parametrize("field", sorted(_FIELD_CHANGES))
def test_every_config_field_changes_the_kernel(field):
    """A declared knob the kernel ignores is a bug: for every `GemvConfig` field, two configurations that differ in
    it alone compile to different sm_90 PTX (the kernel's name, which spells every field, left out) or launch
    differently (threads, grid)."""
    from kernels.gemv import codegen

    def ptx(config):
        return _config_ptx(config).replace(codegen._source(config)[0], "KERNEL")

    base, changed = (GemvConfig(**{"qtype": "Q4_K", "rows_per_block": 4, "warps_per_row": 4, **kw})
                     for kw in _FIELD_CHANGES[field])
    assert [f.name for f in dataclasses.fields(GemvConfig) if getattr(base, f.name) != getattr(changed, f.name)] == [field]
    launch = (base.threads, base.grid(1000)) != (changed.threads, changed.grid(1000))
    assert launch or ptx(base) != ptx(changed), f"{field} changes neither the code nor the launch"


@pytest.mark.compile
def test_launch_shape_and_residual_change_the_code():
    """RPB, WPR (its shared-memory join) and the residual epilogue each change the sm_90 code."""
    base = _ptx("Q4_K", 1, 1)
    assert _ptx("Q4_K", 2, 1) != base  # RPB: rows decoded per warp
    assert _ptx("Q4_K", 1, 2) != base  # WPR: shared-memory join (and the launch's 32*WPR threads)
    assert "bar.sync" in _ptx("Q4_K", 1, 2) and "bar.sync" not in base
    assert _ptx("Q4_K", 1, 1, residual=True) != base


@pytest.mark.compile
def test_glu_kernel_runs_two_dp4a_chains_without_spills():
    glu = _ptx("Q4_K", 4, 2, mmvq=True, glu=True)  # the SwiGLU kernel: two weights, ex2 of the silu, no spills
    assert ".local" not in glu and "ex2.approx" in glu and glu.count("dp4a.s32.s32") == 2 * _ptx(
        "Q4_K", 4, 2, mmvq=True).count("dp4a.s32.s32")


@pytest.mark.compile
def test_pair_kernel_runs_both_formats_without_spills():
    """`gemv_pair`'s kernel (FUSE_QKV_MIXED): the Q4_K and Q6_K bodies both inlined (their dp4a counts add up), no
    local memory, no call."""
    from kernels.gemv import codegen

    a, b = (GemvConfig(n, rows_per_block=4, warps_per_row=2, mmvq=True, xres=True, residual=True, pdl=1)
            for n in ("Q4_K", "Q6_K"))
    k = codegen._build_pair(a, b)
    sig = (*kernel_signature(a), kernel_signature(b)[0], *kernel_signature(b)[-4:], numba_types.int64)
    ptx = cuda.compile_ptx(k.py_func, sig, cc=(9, 0))[0]
    assert ".local" not in ptx and "call." not in ptx
    assert ptx.count("dp4a.s32.s32") == _config_ptx(a).count("dp4a.s32.s32") + _config_ptx(b).count("dp4a.s32.s32")


@pytest.mark.compile
@pytest.mark.parametrize("name, rpb, wpr, mmvq, glu, lines", [
    ("Q4_K", 1, 1, False, False, 1),  # one line a lane
    ("Q4_K", 4, 2, True, True, 2),  # 24 lines a weight: one each
    ("Q4_K", 8, 1, True, False, 2),  # the WIDE shape: 8 rows of 8 lines, two a lane
    ("Q6_K", 4, 1, True, False, 1),  # 4 rows of 8 lines: one a lane
])
def test_pdl_prefetches_each_lanes_first_weight_lines(name, rpb, wpr, mmvq, glu, lines):
    line = "prefetch.global.L2 "
    assert _ptx(name, rpb, wpr, mmvq=mmvq, glu=glu, pdl=1).count(line) == lines
    if (name, rpb) == ("Q4_K", 1):
        assert line not in _ptx(name, rpb, wpr)


@pytest.mark.compile
@pytest.mark.parametrize("stage", [0, 2])
def test_pdl_triggers_then_asks_for_weights_then_waits(stage):
    """PDL: the launch trigger first, then W only (a prefetch, the ring's copies), then the wait, then x."""
    pdl = _ptx("Q6_K", 4, 2, mmvq=True, stage=stage, pdl=1)
    assert "griddepcontrol" not in _ptx("Q6_K", 4, 2, mmvq=True, stage=stage)
    trigger, wait = pdl.index("griddepcontrol.launch_dependents"), pdl.index("griddepcontrol.wait")
    w_first = pdl.index("cp.async" if stage else "prefetch.global.L2")
    assert trigger < w_first < wait < pdl.index("ld.global"), "W's first bytes asked for before the wait, x after"


@pytest.mark.compile
def test_fold_drops_the_per_word_offset():
    """FOLD=1's PTX has no ``xor.b32 ... -2139062144`` (0x80808080, the per-word sign flip of FOLD=0) and 8 more
    dp4a than FOLD=0 per chunk only once (the x loader's corrections), not per row: RPB=4 FOLD=0 has 32, FOLD=1 40."""
    off, on = _ptx("Q6_K", 4, 2, mmvq=True), _ptx("Q6_K", 4, 2, mmvq=True, fold=1)
    assert "-2139062144" in off and "-2139062144" not in on
    assert off.count("dp4a.s32.s32") == 32 and on.count("dp4a.s32.s32") == 40
    assert ".local" not in on


@pytest.mark.compile
def test_min_blocks_is_the_launch_bound_of_the_kernel():
    """MINB=7 with WPR=4: the PTX declares ``.maxntid 128`` and ``.minnctapersm 7`` (the register cap ptxas then
    applies); MINB=0 declares neither."""
    bounded, free = _ptx("Q4_K", 4, 4, mmvq=True, min_blocks=7), _ptx("Q4_K", 4, 4, mmvq=True)
    assert ".maxntid 128" in bounded and ".minnctapersm 7" in bounded
    assert ".minnctapersm" not in free and ".maxntid" not in free


@pytest.mark.compile
@pytest.mark.parametrize("name, mmvq", [("Q6_K", True), ("Q6_K", False), ("Q8_0", True), ("Q3_K", False)])
def test_ring_copies_weights_with_cp_async_and_waits_for_one_chunk(name, mmvq):
    """STAGE=3: W reaches shared memory only through ``cp.async.cg`` (no ``ld.global.u16`` of W, no register
    copy), one ``commit_group`` per prologue chunk and per step, ``wait_group 2`` (STAGE - 1 chunks left in
    flight), two ``bar.warp.sync`` a step, the decode's halfwords from shared memory, no local memory."""
    ptx = _ptx(name, 4, 2, mmvq=mmvq, stage=3)
    assert "ld.global.u16" not in ptx and "ld.global.v4.b32" not in ptx and "st.shared.v4" not in ptx
    assert "cp.async.cg.shared.global" in ptx and ptx.count("cp.async.commit_group") == 3
    assert ptx.count("cp.async.wait_group 2") == 1 and ptx.count("bar.warp.sync") == 2
    assert "ld.shared.u16" in ptx and ".local" not in ptx


@pytest.mark.compile
@pytest.mark.parametrize("name", MMVQ_TYPES)
def test_mmvq_kernels_use_dp4a_and_keep_weight_loads_aligned(name):
    from kernels.gemv import DEFAULT_RPB, DEFAULT_WPR

    ptx = _ptx(name, DEFAULT_RPB, DEFAULT_WPR, mmvq=True)
    assert "dp4a.s32.s32" in ptx, "the MMVQ kernel lost its integer dot products"
    assert ".local" not in ptx and ".f64" not in ptx
    assert ptx != _ptx(name, DEFAULT_RPB, DEFAULT_WPR)
    align = FORMATS[name].align
    widths = _load_widths(_ptx(name, 2, 2, mmvq=True))
    weight_widths = {w for w in widths if w != 16} if align < 16 else set(widths)
    assert max(weight_widths) <= max(align, 4), f"{name}: loads {widths} (align {align}; x words are 4 bytes)"
