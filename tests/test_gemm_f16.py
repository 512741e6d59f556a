"""kernels/gemm_f16.py: numbers in the CUDA simulator (tiny shapes with tails, several knob combinations), the
compiled code of every knob value (`compile`), and real shapes against torch on a GPU (`gpu`)."""

from __future__ import annotations

import numpy as np
import pytest

from kernels.specialize import H200_SMEM_OPTIN
from numba import cuda

from kernels import gemm_f16 as G
from kernels.errors import KernelConstraintError
from kernels.gemm_f16_config import REGS_ONLY_TN, SplitPlan
from kernels.ptx import SIMULATOR

sim = pytest.mark.skipif(not SIMULATOR, reason="simulator session only (NUMBA_ENABLE_CUDASIM=1)")
B = G.BASELINE
MS = G.MMA_SYNC_BEST  # the best mma_sync arm (the default before MMA=wgmma)


def _run(config, nt, od, id_, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((nt, id_)).astype(np.float16)
    b = rng.standard_normal((od, id_)).astype(np.float16)
    out = cuda.to_device(np.full((nt, od), np.nan, np.float32))  # poisoned: every element must be written
    G.gemm_f16(cuda.to_device(a), cuda.to_device(b), out, config=config)
    got = out.copy_to_host()
    ref = a.astype(np.float64) @ b.astype(np.float64).T
    assert np.isfinite(got).all(), "some outputs were never written"
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


# ---- simulator: numbers ------------------------------------------------------------------------------------

SIM_CASES = [
    ("baseline, tails", B, (33, 70, 256)),
    ("wmma", dict(B, MMA="wmma"), (33, 70, 64)),
    ("sync staging", dict(B, STAGING="sync"), (33, 70, 64)),
    ("wmma + sync staging", dict(B, MMA="wmma", STAGING="sync"), (33, 70, 64)),
    ("KS=64, 3 stages, k tail", dict(B, KS=64, STAGES=3), (17, 9, 96)),
    ("4 stages, GROUP=4, 2x3 tiles", dict(B, STAGES=4, GROUP=4), (70, 140, 64)),
    ("default: 256x128 wgmma, KS=64, 4 stages", dict(G.DEFAULT, AUTOTILE=0), (33, 70, 64)),
    ("mma_sync best: 256x128 pipe, 8 warps", MS, (33, 70, 64)),
    ("LOOP=addr32, tails", dict(B, LOOP="addr32"), (33, 70, 128)),
    ("LOOP=pipe, tails", dict(B, LOOP="pipe"), (33, 70, 256)),
    ("LOOP=pipe, KS=64, 3 stages, k tail", dict(B, LOOP="pipe", KS=64, STAGES=3), (17, 9, 96)),
    ("LOOP=addr32, KS=64, 4 stages, k tail, 2x2 tiles", dict(B, LOOP="addr32", KS=64, STAGES=4, GROUP=4), (70, 70, 96)),
    ("LOOP=pipe, 2 k tiles < STAGES-1", dict(B, LOOP="pipe", STAGES=4), (33, 70, 64)),
    ("LOOP=pipe, 256x128, 8 warps", dict(MS, LOOP="pipe", TM=256), (33, 70, 64)),
]


@sim
@pytest.mark.parametrize("config,shape", [c[1:] for c in SIM_CASES], ids=[c[0] for c in SIM_CASES])
def test_simulator_matches_float64(config, shape):
    assert _run(config, *shape) < 1e-3


SPLIT_CASES = [
    ("3 uneven slices of 10 k tiles, tails", 3, (33, 70, 640)),
    ("4 slices, 2x1 tiles", 4, (140, 70, 512)),
    ("more slices than k tiles: one each", 6, (17, 9, 320)),
]


@sim
@pytest.mark.parametrize("splitk,shape", [c[1:] for c in SPLIT_CASES], ids=[c[0] for c in SPLIT_CASES])
def test_simulator_split_k_matches_float64_bit_for_bit_twice(splitk, shape):
    """Split-K (MMA=wgmma): every output written (poisoned), float64 within 1e-3; the partials buffer is poisoned
    too, so a slice that skips its rows shows; the same inputs give the same bits twice (slice-order sum)."""
    nt, od, id_ = shape
    rng = np.random.default_rng(splitk)
    a = cuda.to_device(rng.standard_normal((nt, id_)).astype(np.float16))
    b = cuda.to_device(rng.standard_normal((od, id_)).astype(np.float16))
    config = dict(G.DEFAULT, SPLITK=splitk, AUTOTILE=0)
    assert G.split_plan(config, nt, od, id_) == SplitPlan(0, min(splitk, id_ // 64))  # never more than k tiles
    runs = []
    for _ in range(2):
        out = cuda.to_device(np.full((nt, od), np.nan, np.float32))
        partials = cuda.to_device(np.full(G.partials_elements(config, nt, od, id_), np.nan, np.float32))
        G.gemm_f16(a, b, out, config=config, partials=partials)
        runs.append(out.copy_to_host())
    ref = a.copy_to_host().astype(np.float64) @ b.copy_to_host().astype(np.float64).T
    assert np.isfinite(runs[0]).all(), "some outputs were never written"
    assert np.linalg.norm(runs[0] - ref) / np.linalg.norm(ref) < 1e-3
    assert np.array_equal(runs[0], runs[1])


@sim
def test_simulator_split_last_wave_matches_float64_bit_for_bit(monkeypatch):
    """SPLITK=0 with a grid larger than the GPU: the full wave's tiles whole, the last wave's tiles (here the two
    tail tiles of a 2 x 3 grid on 4 SMs) in 2 slices into compact partial tiles, summed into C by `_sum_tiles`.
    Poisoned C and partials; float64 within 1e-3; `gemm_f16_split` returns the summed C (count 1), same bits."""
    monkeypatch.setattr(G, "device_sms", lambda: 4)
    monkeypatch.setattr(G.gemm_f16_config, "MIN_KTILES_PER_SLICE", 1)
    nt, od, id_ = 140, 600, 256
    config = dict(G.DEFAULT, SPLITK=0, AUTOTILE=0)
    assert G.split_plan(config, nt, od, id_) == SplitPlan(4, 2)
    rng = np.random.default_rng(11)
    a = cuda.to_device(rng.standard_normal((nt, id_)).astype(np.float16))
    b = cuda.to_device(rng.standard_normal((od, id_)).astype(np.float16))
    need = G.partials_elements(config, nt, od, id_)
    assert need == 2 * 2 * 128 * 256
    out = cuda.to_device(np.full((nt, od), np.nan, np.float32))
    G.gemm_f16(a, b, out, config=config, partials=cuda.to_device(np.full(need, np.nan, np.float32)))
    got = out.copy_to_host()
    ref = a.copy_to_host().astype(np.float64) @ b.copy_to_host().astype(np.float64).T
    assert np.isfinite(got).all(), "some outputs were never written"
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-3
    out2 = cuda.to_device(np.full((nt, od), np.nan, np.float32))
    parts, count = G.gemm_f16_split(a, b, out2, config=config,
                                    partials=cuda.to_device(np.full(need, np.nan, np.float32)))
    assert count == 1 and np.array_equal(parts.copy_to_host().reshape(nt, od), got)


def test_split_k_plans():
    """SPLITK=0 (auto) on 132 SMs, grids under two waves: only the tiles of a last, partial wave are split (all of
    them when the grid is smaller than the GPU), into the most slices that fit one wave with at least 12 k tiles a slice; a fixed SPLITK
    splits every tile, capped by the k tiles; SPLITK=1 never splits (any session: host arithmetic)."""
    auto = dict(G.DEFAULT, SPLITK=0)
    assert G.split_plan(auto, 128, 3584, 18944, sms=132) == SplitPlan(0, 9)  # 14 tiles, 296 k tiles
    assert G.split_plan(auto, 128, 3584, 3584, sms=132) == SplitPlan(0, 4)  # 56 k tiles: 12 a slice at least
    assert G.split_plan(auto, 128, 37888, 3584, sms=132) == SplitPlan(132, 4)  # 148 tiles: 16 in a last wave
    assert G.split_plan(auto, 256, 37888, 3584, sms=132) == SplitPlan(296, 1)  # two waves or more: never split
    assert G.split_plan(auto, 2048, 4608, 3584, sms=132) == SplitPlan(288, 1)
    assert G.split_plan(auto, 2048, 3584, 18944, sms=132) == SplitPlan(224, 1)  # 92 left: no room for 2 slices
    assert G.split_plan(auto, 512, 4608, 3584, sms=132) == SplitPlan(72, 1)  # 72 tiles: 2 slices need 144 SMs
    assert G.split_plan(auto, 128, 4608, 256, sms=132) == SplitPlan(18, 1)  # 4 k tiles: too few to split
    assert G.split_plan(auto, 1024, 33792, 3584, sms=132) == SplitPlan(1056, 1)  # 8 full waves
    assert G.split_plan(dict(G.DEFAULT, SPLITK=16), 128, 3584, 256, sms=132) == SplitPlan(0, 4)  # the k tiles
    assert G.split_plan(dict(G.DEFAULT, SPLITK=1), 128, 3584, 18944, sms=132) == SplitPlan(14, 1)
    assert G.split_plan(G.DEFAULT, 128, 3584, 18944, sms=132) == SplitPlan(0, 9)  # SPLITK=0 (auto) is the default
    assert G.split_plan(dict(MS, SPLITK=0), 128, 3584, 18944, sms=132) == SplitPlan(14, 1)  # never without wgmma
    assert SplitPlan(132, 4).blocks(148) == 132 + 16 * 4
    assert G.partials_capacity(auto, 8192, 37888, 132) == 132 * 128 * 256
    assert G.partials_elements(auto, 128, 37888, 3584, sms=132) == 16 * 4 * 128 * 256
    for nt in (1, 100, 128, 300, 512, 1000, 2048, 4096):
        for od, id_ in ((3584, 18944), (4608, 3584), (37888, 3584), (152064, 3584), (3072, 1536)):
            assert G.partials_elements(auto, nt, od, id_, sms=132) <= G.partials_capacity(auto, nt, od, 132)


def test_autotile_runs_badly_quantized_grids_with_128_wide_tiles():
    """AUTOTILE=1 on 132 SMs: TM=128 where its waves x NARROW_TILE_TIME beat the 256-wide grid's
    waves (7B qkv at nt=2048: 288 tiles, 2.2 waves; attn_output / ffn_down at nt=512: 56 tiles; short prompts),
    TM=256 for the full-wave grids (ffn_gate_up at nt 512 and 2048, the output head); AUTOTILE=0, another TM or a
    cp.async kernel: the config as given. partials_elements serves both plans (any session: host arithmetic)."""
    pick = {(nt, od): G.launch_config(dict(AUTOTILE=1), nt, od, sms=132)["TM"]
            for nt, od in ((2048, 37888), (2048, 4608), (2048, 3584), (512, 37888), (512, 4608), (512, 3584),
                           (128, 37888), (128, 3584), (128, 152064))}
    assert pick == {(2048, 37888): 256, (2048, 4608): 128, (2048, 3584): 256, (512, 37888): 256, (512, 4608): 256,
                    (512, 3584): 128, (128, 37888): 128, (128, 3584): 128, (128, 152064): 256}
    assert G.launch_config(dict(AUTOTILE=0), 512, 3584, sms=132)["TM"] == 256
    assert G.launch_config(dict(TM=64), 512, 3584, sms=132)["TM"] == 64
    assert G.launch_config(dict(STAGING="cp_async"), 512, 3584, sms=132)["TM"] == 256
    narrow = G.launch_config(dict(AUTOTILE=1), 128, 37888, sms=132)
    assert G.launch_config(narrow, 128, 37888, sms=132) == narrow  # idempotent
    for nt, od, id_ in ((128, 37888, 3584), (128, 3584, 18944), (512, 3584, 3584), (2048, 4608, 3584)):
        for cfg in (dict(G.DEFAULT, AUTOTILE=0), G.launch_config(None, nt, od, sms=132)):
            assert G.partials_elements(None, nt, od, id_, sms=132) >= G.partials_elements(
                dict(cfg, AUTOTILE=0), nt, od, id_, sms=132)


def test_autotile_4_chooses_among_every_tma_width():
    """AUTOTILE=4 (the default) on 132 SMs: the whole-wave rule over TM=256, 192, 144 and 128 (`TILE_TIME`), the
    wider on a tie. At nt=512 a 7B qkv (od 4608) runs one wave of 144 (128 tiles, against 72 of 256, 96 of 192 and
    two waves of 128) and at nt=2048 three waves of 192 (against 3 of 256, 4 of 144, 5 of 128); attn_output /
    ffn_down at nt=512 stay 128-wide, ffn_down at nt=2048 and the gate|up products 256-wide; the SwiGLU launch only
    multiples of 128; AUTOTILE=1 never picks 192 or 144; idempotent; partials_elements covers every launch."""
    shapes = {"qkv_512": (512, 4608), "qkv_2048": (2048, 4608), "down_512": (512, 3584), "down_2048": (2048, 3584),
              "gate_up_512": (512, 37888), "gate_up_2048": (2048, 37888)}
    for cfg in (None, dict(AUTOTILE=4)):
        pick = {k: G.launch_config(cfg, nt, od, sms=132)["TM"] for k, (nt, od) in shapes.items()}
        assert pick == {"qkv_512": 144, "qkv_2048": 192, "down_512": 128, "down_2048": 256, "gate_up_512": 256,
                        "gate_up_2048": 256}, pick
    assert G.launch_config(None, 512, 4608, sms=132, glu=True)["TM"] == 256  # the qkv shape, as a SwiGLU launch
    assert G.launch_config(None, 128, 37888, sms=132, glu=True)["TM"] == 128
    assert G.launch_config(dict(AUTOTILE=1), 512, 4608, sms=132)["TM"] == 256
    got = G.launch_config(None, 512, 4608, sms=132)
    assert G.launch_config(got, 512, 4608, sms=132) == got  # idempotent
    for nt, od, id_ in ((128, 37888, 3584), (512, 4608, 3584), (2048, 4608, 3584), (512, 3584, 18944)):
        for run in (G.launch_config(None, nt, od, sms=132), G.launch_config(None, nt, od, sms=132, glu=True)):
            assert G.partials_elements(None, nt, od, id_, sms=132) >= G.partials_elements(
                dict(run, AUTOTILE=0), nt, od, id_, sms=132)
            assert G.partials_elements(None, nt, od, id_, sms=132) <= G.partials_capacity(None, nt, od, 132)


def test_narrow_tail_splits_the_last_wave_into_128_wide_tiles():
    """NARROWTAIL=1 on 132 SMs (host arithmetic): a 7B gate|up at nt=512 runs 528 tiles of 256 (4 waves, columns
    0 .. 33791), then 128 of 128 (one wave) against 5 waves; at nt=128 one wave of 256 and one of 128 against three
    of 128 (AUTOTILE's choice); the 1.5B gate|up at nt=512 and 2048 and the output head of a last token take it too;
    a 7B gate|up at nt=2048 (17.9 waves), qkv and ffn_down at nt=512 (no whole wave of 256-wide tiles to keep) do
    not; NARROWTAIL=0, another TM, STAGING or a fixed SPLITK: one launch. Both launches split nothing."""
    on = dict(NARROWTAIL=1)
    cut = {k: G.tail_plan(on, nt, od, id_, 132, glu)
           for k, (nt, od, id_, glu) in {"gate_up_512": (512, 37888, 3584, True), "gate_up_128": (128, 37888, 3584, True),
                                         "gate_up_2048": (2048, 37888, 3584, True), "qkv_512": (512, 4608, 3584, False),
                                         "down_512": (512, 3584, 18944, False), "small_512": (512, 17920, 1536, True),
                                         "small_2048": (2048, 17920, 1536, True), "head": (1, 152064, 3584, False)}.items()}
    assert cut == {"gate_up_512": 33792, "gate_up_128": 33792, "gate_up_2048": 0, "qkv_512": 0, "down_512": 0,
                   "small_512": 16896, "small_2048": 16896, "head": 135168}
    for off in (dict(NARROWTAIL=0), dict(on, TM=128), dict(on, STAGING="cp_async"), dict(on, SPLITK=2)):
        assert G.tail_plan(off, 512, 37888, 3584, 132) == 0
        assert len(G.launches(off, 512, 37888, 3584, 132)) == 1
    runs = G.launches(on, 512, 37888, 3584, 132, glu=True)
    assert [(c["TM"], c["SPLITK"], lo, hi) for c, lo, hi in runs] == [(256, 1, 0, 33792), (128, 1, 33792, 37888)]


def test_experiment_effective_config_sees_autotile(monkeypatch):
    """`ab` refuses arms that run one kernel: the gemm_f16 experiment's effective configuration drops AUTOTILE where
    it cannot act and, on a workload with a device present, resolves the tile AUTOTILE (the default 4) runs there
    (attn_output_nt512: TM=256 runs as 128, so TM=128 vs TM=256 is one kernel twice; ffn_gate_up: two kernels)."""
    import experiments.gemm_f16 as E
    from minfer_cli.commands.options import check_same_work
    from minfer_cli.errors import UsageError

    monkeypatch.setattr(E, "_has_device", lambda: True)
    monkeypatch.setattr(G, "device_sms", lambda: 132)
    exp = E.GemmF16Experiment()
    wide, narrow = dict(E._DEFAULT), dict(E._DEFAULT, TM=128)
    small = exp.workload("attn_output_nt512", [wide])
    big = exp.workload("ffn_gate_up", [wide])
    assert exp.effective(narrow)["AUTOTILE"] == 0 and exp.effective(wide)["AUTOTILE"] == G.LAUNCH_DEFAULT["AUTOTILE"]
    assert exp.effective(wide, small) == exp.effective(narrow, small)
    assert exp.effective(wide, big) != exp.effective(narrow, big)
    assert exp.effective(dict(wide, AUTOTILE=0), small) != exp.effective(narrow, small)
    with pytest.raises(UsageError, match="run the same code.*TM=256 vs 128.*on attn_output_nt512"):
        check_same_work(exp, [wide, narrow], small)
    check_same_work(exp, [wide, narrow], big)
    monkeypatch.setattr(E, "_has_device", lambda: False)  # no device: the SM count, hence the tile, is unknown
    assert exp.effective(wide, small) != exp.effective(narrow, small)


@sim
def test_split_k_refusals():
    a = cuda.to_device(np.ones((33, 640), np.float16))
    b = cuda.to_device(np.ones((70, 640), np.float16))
    with pytest.raises(KernelConstraintError, match="SPLITK=2 needs MMA=wgmma"):
        G.gemm_f16(a, b, config=dict(MS, SPLITK=2))
    small = cuda.device_array(10, np.float32)
    with pytest.raises(KernelConstraintError, match="partials array of at least"):
        G.gemm_f16(a, b, config=dict(G.DEFAULT, SPLITK=2), partials=small)


# ---- constraints (host-side; any session) ------------------------------------------------------------------


def _dev(x):
    return cuda.to_device(np.ascontiguousarray(x)) if x.flags["C_CONTIGUOUS"] else cuda.to_device(x)


@sim
@pytest.mark.parametrize(
    "a_shape,b_shape,dtype,match",
    [
        ((4, 48), (8, 48), np.float16, "multiple of 32"),
        ((4, 64), (8, 32), np.float16, "inner dimensions differ"),
        ((4, 64), (8, 64), np.float32, "must be float16"),
    ],
)
def test_bad_inputs_are_refused(a_shape, b_shape, dtype, match):
    a = cuda.to_device(np.ones(a_shape, dtype))
    b = cuda.to_device(np.ones(b_shape, np.float16))
    with pytest.raises(KernelConstraintError, match=match):
        G.gemm_f16(a, b)


@sim
def test_non_contiguous_and_bad_out_are_refused():
    a = np.ones((4, 128), np.float16)[:, ::2]
    with pytest.raises(KernelConstraintError, match="C-contiguous"):
        G.check_inputs(a, np.ones((8, 64), np.float16))
    with pytest.raises(KernelConstraintError, match="out must be"):
        G.check_inputs(np.ones((4, 64), np.float16), np.ones((8, 64), np.float16), np.ones((4, 8), np.float16))


def test_unknown_knob_and_value_are_refused():
    with pytest.raises(KernelConstraintError, match="no knob"):
        G.resolve_config({"TK": 64})
    with pytest.raises(KernelConstraintError, match="not allowed"):
        G.resolve_config({"TM": 96})
    assert G.resolve_config({"TM": "256"})["TM"] == 256


def test_shared_memory_over_the_device_limit_is_refused(monkeypatch):
    monkeypatch.setattr(G._CACHE, "limit", lambda: 48 * 1024)
    cfg = dict(G.BASELINE, TM=256, TN=128, KS=64, STAGES=4)
    with pytest.raises(KernelConstraintError, match="shared memory"):
        G.build(cfg)


def test_every_combination_fits_the_h200():
    sizes = [G.geometry(c).smem_bytes for c in G.all_configs()]
    # LOOP=addr32/pipe only with mma_sync + cp_async; wgmma: cp_async, addr32 (2-4 stages) or pipe (3-4 stages)
    # + STAGING=tma: wgmma, KS=64, LOOP=pipe, TM 64|128|144|192|256; EPI staged/direct; every wgmma one also with
    # NOCALL=1
    assert len(sizes) == 432 + 2 * 108 + 2 * 180 + 2 * 2 * 90
    assert max(sizes) <= H200_SMEM_OPTIN


def test_launch_geometry_follows_the_tile_knobs():
    g64, g128 = G.geometry(B), G.geometry(dict(B, TM=128, TN=128))
    assert g64.grid(2048, 18944) == 32 * 296 and g128.grid(2048, 18944) == 16 * 148
    assert (g64.threads, g128.threads) == (128, 256)
    assert G.geometry(dict(B, STAGES=3)).smem_bytes > G.geometry(B).smem_bytes
    assert G.geometry(dict(B, KS=64)).smem_bytes > G.geometry(B).smem_bytes


# ---- compile: every knob value changes the code, and the right instructions are there -------------------------

_PTX_CACHE: dict = {}


def _ptx(config) -> str:
    key = tuple(sorted(G.resolve_config(config).items()))
    if key not in _PTX_CACHE:
        _PTX_CACHE[key] = G.kernel_ptx(config)
    return _PTX_CACHE[key]


def _assert_instructions(config, ptx):
    cfg = G.resolve_config(config)
    d = 0
    if cfg["MMA"] == "mma_sync":
        assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in ptx
        assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in ptx
        assert "wmma." not in ptx and "wgmma" not in ptx
    elif cfg["MMA"] == "wgmma":  # (details in tests/test_gemm_wgmma.py)
        d = 1 if cfg["LOOP"] == "pipe" else 0
        assert "wgmma.mma_async.sync.aligned.m64n" in ptx and "fence.proxy.async.shared::cta" in ptx
        assert f"wgmma.wait_group.sync.aligned {d};" in ptx
        assert "mma.sync" not in ptx and "ldmatrix" not in ptx
    else:
        assert "wmma.mma.sync.aligned.row.col.m16n16k16.f32.f32" in ptx
        assert "wmma.load.a.sync.aligned.row.m16n16k16.shared.f16" in ptx
        assert "wmma.load.b.sync.aligned.col.m16n16k16.shared.f16" in ptx
        assert "mma.sync.aligned.m16n8k16" not in ptx and "ldmatrix" not in ptx
    if cfg["STAGING"] == "cp_async":
        assert "cp.async.cg.shared.global" in ptx and "cp.async.commit_group" in ptx
        assert f"cp.async.wait_group {cfg['STAGES'] - 2 - d};" in ptx
    elif cfg["STAGING"] == "tma":
        assert "cp.async.bulk.tensor.2d" in ptx and "mbarrier.try_wait.parity" in ptx
        assert "cp.async.cg" not in ptx
    else:
        assert "cp.async" not in ptx
        assert "ld.global.v4.b32" in ptx and "st.shared.v4.b32" in ptx
    assert "ld.local" not in ptx and "st.local" not in ptx, "fragments or accumulators spilled to local memory"


PER_KNOB = [(k, v) for k, values in G.KNOBS.items() for v in values if not (k == "TN" and v in REGS_ONLY_TN)]


@pytest.mark.compile
@pytest.mark.parametrize("knob,value", PER_KNOB, ids=[f"{k}={v}" for k, v in PER_KNOB])
def test_each_knob_value_compiles_and_changes_the_code(knob, value):
    config = dict(B, **{knob: value})
    if value == "wgmma":
        config["LOOP"] = "addr32"  # wgmma has no LOOP=v1 (the baseline's)
    if value == "tma" or (knob, value) in (("TM", 144), ("TM", 192)):  # STAGING=tma tiles
        config.update(MMA="wgmma", KS=64, LOOP="pipe", STAGING="tma")  # STAGING=tma's only kernel
    ptx = _ptx(config)
    _assert_instructions(config, ptx)
    if value != B[knob]:
        assert ptx != _ptx(B), f"{knob}={value} compiles to the same PTX as the baseline"


REPRESENTATIVE = [
    G.DEFAULT,
    MS,
    dict(MS, TM=256, KS=64, STAGES=4),
    dict(MS, MMA="wmma", TM=256, KS=64, STAGES=4, STAGING="sync", LOOP="v1"),
    dict(MS, MMA="wmma", TN=64, STAGING="sync", GROUP=1, LOOP="v1"),
    dict(MS, TM=256, LOOP="pipe"),
    dict(MS, TM=256, LOOP="addr32", STAGES=4),
    dict(MS, TM=256, LOOP="pipe", KS=64, STAGES=4),
]


@pytest.mark.compile
@pytest.mark.parametrize("config", REPRESENTATIVE, ids=lambda c: " ".join(f"{k}={v}" for k, v in c.items()))
def test_representative_combinations_compile(config):
    _assert_instructions(config, _ptx(config))


def _main_loop(ptx: str) -> list[str]:
    """Instruction lines of the k loop: the longest backward branch whose body holds mma.sync."""
    import re

    lines = [ln.strip() for ln in ptx.splitlines()]
    labels = {ln[:-1]: i for i, ln in enumerate(lines) if ln.startswith("$L__") and ln.endswith(":")}
    best: list[str] = []
    for i, ln in enumerate(lines):
        m = re.search(r"bra(?:\.uni)?\s+(\$L__\w+);", ln)
        if m and labels.get(m.group(1), i) < i:
            body = lines[labels[m.group(1)] : i + 1]
            if len(body) > len(best) and any("mma.sync" in x for x in body):
                best = body
    return [x for x in best if x and not x.startswith(("//", "$", "{", "}"))]


def _int64_ops(body: list[str]) -> int:
    """64-bit integer/address instructions (numba's int64 widening shows up as these)."""
    ops = [x.split()[1] if x.startswith("@") else x.split()[0] for x in body]
    return sum(1 for op in ops if op.split(".")[-1] in ("s64", "u64", "b64") or op.startswith("mul.wide"))


@pytest.mark.compile
def test_loop_variants_differ_and_shed_64_bit_index_math():
    best = dict(MS, TM=256)
    v1, addr32, pipe = (_ptx(dict(best, LOOP=v)) for v in ("v1", "addr32", "pipe"))
    assert len({v1, addr32, pipe}) == 3
    loops = {name: _main_loop(p) for name, p in (("v1", v1), ("addr32", addr32), ("pipe", pipe))}
    for name, body in loops.items():  # per k tile (KS=32, 64x64 warp tile): 2 k16 steps x (4+4) ldmatrix, 2 x 32 mma
        assert sum("mma.sync" in x for x in body) == 64, name
        assert sum("ldmatrix" in x for x in body) == 16, name
        assert sum("cp.async.cg" in x for x in body) == 6, name
        assert sum(x.startswith("bar.sync") for x in body) == 1, name
    # v1: ~260 64-bit index instructions per k tile (measured 259), incl. a 64-bit division by STAGES; the new
    # loops step a 32-bit ring offset and add precomputed offsets (measured 28-29)
    assert _int64_ops(loops["v1"]) > 200
    assert _int64_ops(loops["addr32"]) < 40 and _int64_ops(loops["pipe"]) < 40
    assert not any("mul.hi" in x or "div." in x or "rem." in x for x in loops["addr32"] + loops["pipe"])


def test_loop_variants_need_mma_sync_and_cp_async():
    for bad in (dict(B, LOOP="pipe", MMA="wmma"), dict(B, LOOP="addr32", STAGING="sync")):
        with pytest.raises(KernelConstraintError, match="LOOP="):
            G.resolve_config(bad)


# ---- gpu: real shapes against torch -------------------------------------------------------------------------


def _torch_rel(a, b, out) -> float:
    try:
        import torch
    except ImportError:
        ref = a.astype(np.float64) @ b.astype(np.float64).T
    else:
        torch.backends.cuda.matmul.allow_tf32 = False
        ref = (torch.from_numpy(a).cuda().float() @ torch.from_numpy(b).cuda().float().T).double().cpu().numpy()
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


@pytest.mark.gpu
@pytest.mark.parametrize("config", [G.DEFAULT, MS, B, dict(B, MMA="wmma")], ids=["default", "mma_sync-best", "baseline", "wmma"])
@pytest.mark.parametrize("shape", [(2048, 18944, 3584), (33, 70, 256), (2047, 4609, 3584)], ids=str)
def test_gpu_matches_torch(config, shape):
    nt, od, id_ = shape
    rng = np.random.default_rng(7)
    a = rng.standard_normal((nt, id_), dtype=np.float32).astype(np.float16)
    b = rng.standard_normal((od, id_), dtype=np.float32).astype(np.float16)
    out = cuda.to_device(np.full((nt, od), np.nan, np.float32))
    G.gemm_f16(cuda.to_device(a), cuda.to_device(b), out, config=config)
    got = out.copy_to_host()
    assert np.isfinite(got).all()
    assert _torch_rel(a, b, got) < 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize("splitk", [0, 3, 16])
@pytest.mark.parametrize("shape", [(128, 3584, 18944), (33, 3584, 3584), (300, 4609, 3584)], ids=str)
def test_gpu_split_k_matches_torch(splitk, shape):
    """Split-K at the short-prompt shapes it exists for (SPLITK=0: auto), partials poisoned, against torch."""
    nt, od, id_ = shape
    rng = np.random.default_rng(splitk + nt)
    a = rng.standard_normal((nt, id_), dtype=np.float32).astype(np.float16)
    b = rng.standard_normal((od, id_), dtype=np.float32).astype(np.float16)
    config = dict(G.DEFAULT, SPLITK=splitk, AUTOTILE=0)
    out = cuda.to_device(np.full((nt, od), np.nan, np.float32))
    need = G.partials_elements(config, nt, od, id_)
    partials = cuda.to_device(np.full(max(need, 1), np.nan, np.float32))
    G.gemm_f16(cuda.to_device(a), cuda.to_device(b), out, config=config, partials=partials)
    got = out.copy_to_host()
    assert np.isfinite(got).all()
    assert _torch_rel(a, b, got) < 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize("config", [G.DEFAULT, dict(G.DEFAULT, EPI="direct"), dict(G.DEFAULT, SPLITK=3)],
                         ids=["default", "EPI=direct", "SPLITK=3"])
@pytest.mark.parametrize("shape", [(512, 3584, 18944), (512, 3584, 3584), (33, 1536, 8960), (2047, 4609, 3584)],
                         ids=str)
def test_gpu_accumulate_is_the_product_then_the_residual_add(config, shape):
    """The residual epilogue at the engine's attn_output / ffn_down shapes (split and unsplit plans, an od tail):
    x0 + the product gemm_f16 writes, the same f32 bits, for a fresh random x0; the product against torch."""
    nt, od, id_ = shape
    rng = np.random.default_rng()
    a = rng.standard_normal((nt, id_), dtype=np.float32).astype(np.float16)
    b = rng.standard_normal((od, id_), dtype=np.float32).astype(np.float16)
    x0 = (4 * rng.standard_normal((nt, od))).astype(np.float32)
    da, db = cuda.to_device(a), cuda.to_device(b)
    need = max(1, G.partials_elements(config, nt, od, id_))
    prod = cuda.to_device(np.full((nt, od), np.nan, np.float32))
    G.gemm_f16(da, db, prod, config=config, partials=cuda.to_device(np.full(need, np.nan, np.float32)))
    x = cuda.to_device(x0)
    G.gemm_f16(da, db, x, config=config, partials=cuda.to_device(np.full(need, np.nan, np.float32)),
               accumulate=True)
    got, prod = x.copy_to_host(), prod.copy_to_host()
    assert np.isfinite(prod).all() and _torch_rel(a, b, prod) < 1e-3
    np.testing.assert_array_equal(got, x0 + prod)
