"""kernels/gemm_fused_regs.py: the fused-dequantization GEMM whose weight is wgmma's register A operand.

* simulator session: random valid Q4_K weights in 1-3 segments, nt / od tails, rings that wrap; C against float64
  of gguf-py's dequantization (f16-rounded) and, closer, against float64 of the f16 weights the kernel's arithmetic
  makes (`tests.test_gemm_fused.fused_f16_weights`); poisoned out;
* `compile`: the register-A wgmma, the f16x2 dequantization and the TMA copies in the sm_90a PTX; registers within
  the block's share, no spills, wgmma not serialized;
* `gpu`: real Qwen2-7B shapes against torch float64 of both weight forms.
Refusals of bad input run everywhere.
"""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

from kernels import gemm_f16 as G
from kernels import gemm_fused_regs as R
from kernels.errors import KernelConstraintError
from kernels.ptx import SIMULATOR
from minfer_cli.experiment import rel_l2
from minfer_cli.quant_blocks import reference_f16
from ptx_assembly import wgmma_register_hazards
from tests.test_gemm_fused import _operands, fused_f16_weights

sim = pytest.mark.skipif(not SIMULATOR, reason="simulator session only (NUMBA_ENABLE_CUDASIM=1)")


def _run(fn, a, raws, rows, config):
    out = cuda.to_device(np.full((a.shape[0], sum(rows)), np.nan, np.float32))
    fn(cuda.to_device(a), [(cuda.to_device(raw), r) for raw, r in zip(raws, rows)], "Q4_K", out, config=config)
    return out.copy_to_host()


def _kernel_weights_product(a, raws, rows):
    """float64 A times the f16 weights the kernel's arithmetic makes (`fused_f16_weights`)."""
    w = np.concatenate([fused_f16_weights(raw, r, a.shape[1]) for raw, r in zip(raws, rows)])
    return a.astype(np.float64) @ w.astype(np.float64).T


def _assert_matches(a, raws, rows, config):
    """Within 1e-3 of float64 over gguf's f16 weights, and within 1e-5 of float64 over the kernel's own f16 weights
    (only the f32 sums differ)."""
    got = _run(R.gemm_fused_regs, a, raws, rows, config)
    assert np.isfinite(got).all(), "some outputs were never written (still the NaN poison)"
    w16 = np.concatenate([reference_f16(raw, "Q4_K", r, a.shape[1]) for raw, r in zip(raws, rows)])
    assert rel_l2(got, a.astype(np.float64) @ w16.astype(np.float64).T) < 1e-3
    assert rel_l2(got, _kernel_weights_product(a, raws, rows)) < 1e-5
    return got


SIM_CASES = [
    ("TN=64, 3 stages (the ring wraps), 2 segments, nt and od tails", dict(G.DEFAULT, TN=64, STAGES=3), 17, [64, 70],
     256),
    ("TN=128 default, 3 segments, 12 k tiles (8 raw slots wrap)", {}, 20, [128, 64, 40], 768),
    ("TN=256: the producer warpgroup, 2 stages (the ring wraps), nt and od tails", dict(G.DEFAULT, TN=256, STAGES=2),
     33, [128, 70], 256),
    ("TN=256: od 40, a 64-row box never copied, 12 k tiles (raw slots reused)", dict(G.DEFAULT, TN=256, STAGES=2),
     9, [40], 768),
]


@sim
@pytest.mark.parametrize("config,nt,rows,id_", [c[1:] for c in SIM_CASES], ids=[c[0] for c in SIM_CASES])
def test_regs_simulator_matches_float64_of_both_weight_forms(config, nt, rows, id_):
    a, raws, _ = _operands(nt, rows, id_, seed=None)
    _assert_matches(a, raws, rows, config)


def _bad_calls():
    """(call, the words its one-line refusal must hold)."""
    a = np.zeros((4, 256), np.float16)
    raw = np.zeros(2 * 144, np.uint8)
    return [
        (lambda: R.regs_geometry(None, "Q6_K"), "Q6_K have no dequantizer in the fused GEMM; types: Q4_K"),
        (lambda: R.regs_geometry({"TN": 96}, "Q4_K"), "TN=96 is not allowed"),
        (lambda: G.resolve_config({"TN": 256}), "TN=256 is the register-A fused kernel's tile only"),
        (lambda: R.gemm_fused_regs(a, [(raw, 2)], "Q4_K"), "segment 0 is a host array"),
        (lambda: R.gemm_fused_regs(a, [(raw, 3)], "Q4_K"), "segment 0 must be the 3 x 144 bytes"),
        (lambda: R.gemm_fused_regs(a, [(raw, 2)], "Q4_K", accumulate=True), "accumulate adds the product to out"),
        (lambda: R.gemm_fused_regs_glu(a, [(np.zeros(192 * 144, np.uint8), 192)], "Q4_K"),
         "has 192 rows \\(2 x ffn\\); each tile takes 64 gate rows and the same up rows, so ffn must be a multiple of 64"),
        (lambda: R.gemm_fused_regs_glu(a, [(np.zeros(256 * 144, np.uint8), 256)], "Q4_K"), "segment 0 is a host array"),
    ]


@pytest.mark.parametrize("index", range(len(_bad_calls())))
def test_regs_refuses_bad_input_in_one_line(index):
    call, match = _bad_calls()[index]
    with pytest.raises(KernelConstraintError, match=match) as err:
        call()
    assert "\n" not in str(err.value)


@pytest.mark.compile
@pytest.mark.parametrize("tn", [128, 64])
def test_regs_ptx(tn):
    """The register-A wgmma (m64nTNk16, A in four 32-bit registers), prmt / sub / fma f16x2, the TMA copies and
    mbarriers; within the 168 registers the 9 warps leave a thread, no spills, and ptxas keeps the wgmma async."""
    from ptx_assembly import ptxas_resources

    ptx = R.kernel_ptx({"TN": tn}, "Q4_K")
    for needle in (f"wgmma.mma_async.sync.aligned.m64n{tn}k16.f32.f16.f16", "prmt.b32", "sub.rn.f16x2",
                   "fma.rn.f16x2", "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes",
                   "mbarrier.try_wait.parity.shared::cta.b64", "wgmma.wait_group.sync.aligned 0;",
                   ".extern .shared .align 1024"):
        assert needle in ptx, needle
    assert "ld.local" not in ptx and "st.local" not in ptx, "accumulators in local memory (NVVM)"
    res = ptxas_resources(ptx)
    assert res["registers"] <= 168 and res["spill_bytes"] == 0 and not res["wgmma_serialized"], res
    assert not wgmma_register_hazards(ptx)


def test_the_hazard_check_flags_a_write_to_an_in_flight_a_register():
    """`wgmma_register_hazards` on hand-written PTX: the next A word computed into a register the issued wgmma reads
    (what NVVM once made of this kernel's loop) is flagged, the same write after the wait or to another register is
    not, nor is a second wgmma accumulating into the same D registers."""

    issue = ("wgmma.fence.sync.aligned;\n{ .reg .pred p; setp.ne.b32 p, %r9, 0; wgmma.mma_async.sync.aligned."
             "m64n8k16.f32.f16.f16 {%f1, %f2, %f3, %f4}, {%r1, %r2, %r3, %r4}, %rd1, p, 1, 1, 0; }\n"
             "wgmma.commit_group.sync.aligned;\n")
    wait = "wgmma.wait_group.sync.aligned 0;\n"
    hazard = wgmma_register_hazards(issue + "fma.rn.f16x2 %r3, %r7, %r8, %r9;\n" + wait)
    assert len(hazard) == 1 and "line 4: fma.rn.f16x2 %r3" in hazard[0]
    assert wgmma_register_hazards(issue + "add.f32 %f2, %f5, %f6;\n" + wait)  # an accumulator too
    assert not wgmma_register_hazards(issue + "fma.rn.f16x2 %r5, %r7, %r8, %r9;\n" + wait
                                      + "mov.b32 %r3, %r5;\n")
    assert not wgmma_register_hazards(issue + issue.replace("%r1, %r2, %r3, %r4", "%r5, %r6, %r7, %r8") + wait)


@pytest.mark.compile
def test_regs_warpgroup_producer_ptx():
    """TN=256: 384 threads, the producer warpgroup's setmaxnreg.dec and the consumers' .inc in the PTX, the
    m64n256k16 register-A wgmma, the header converters' proxy fence and their rready barriers in the shared memory
    plan; where a whole-program ptxas is installed (not in CI), it assembles with no spill and the wgmma
    asynchronous (what the driver's JIT compiles: `kernels.jit.load_whole_program`)."""
    from ptx_assembly import whole_program_resources

    rg = R.regs_geometry({"TN": 256}, "Q4_K")
    assert rg.warpgroup_producer and rg.threads == 384 and R.regs_geometry({"TN": 128}, "Q4_K").threads == 288
    ptx = R.kernel_ptx({"TN": 256}, "Q4_K")
    for needle in ("wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16", f"setmaxnreg.dec.sync.aligned.u32 "
                   f"{R.PRODUCER_REGS};", f"setmaxnreg.inc.sync.aligned.u32 {R.CONSUMER_REGS};", ".maxntid 384"):
        assert needle in ptx, needle
    assert 128 * R.PRODUCER_REGS + 256 * R.CONSUMER_REGS <= 65536
    assert ptx.count("fence.proxy.async.shared::cta") == 2  # the barriers' initialisation, the converted headers
    assert R.kernel_ptx({"TN": 128}, "Q4_K").count("fence.proxy.async.shared::cta") == 1  # no converters there
    assert rg.smem_bytes == rg.ring_bytes + rg.raw * (rg.raw_slot_bytes + 24) + 16 * rg.stages  # rready a raw slot
    assert not wgmma_register_hazards(ptx)
    res = whole_program_resources(ptx)
    if res is None:
        pytest.skip("no whole-program ptxas on this machine (the relocatable nvJitLink ignores setmaxnreg)")
    assert res["spill_bytes"] == 0 and not res["wgmma_serialized"], res


@pytest.mark.gpu
def test_regs_warpgroup_kernel_is_loaded_whole_program():
    """TN=256 runs from its PTX through the driver's JIT (so setmaxnreg holds): the loaded function uses no local
    memory, where nvJitLink's relocatable link spills."""
    from kernels.jit import is_whole_program

    kernel = R.build({"TN": 256}, "Q4_K").kernel
    assert is_whole_program(kernel, R.SIGNATURE.args) and not is_whole_program(R.build({"TN": 128}, "Q4_K").kernel,
                                                                                 R.SIGNATURE.args)
    assert kernel.get_local_mem_per_thread(R.SIGNATURE) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("tn", [128, 64, 256])
@pytest.mark.parametrize("nt,rows,id_", [(2048, [18944, 18944], 3584), (128, [3584], 18944), (768, [3584], 3584),
                                        (2047, [3584, 512, 513], 3584), (33, [70], 256)], ids=str)
def test_regs_gpu_matches_torch_float64_of_both_weight_forms(tn, nt, rows, id_):
    """Real shapes, the auto split plan (nt=128: every tile split; 768 at TN=128: 36 tiles of the last wave in 3
    slices, the compact partials), tails: within 1e-3 of gguf's f16 weights' product, 1e-5 of the kernel's own."""
    torch = pytest.importorskip("torch")
    a, raws, w16 = _operands(nt, rows, id_, seed=nt)
    got = _run(R.gemm_fused_regs, a, raws, rows, {"TN": tn})
    assert np.isfinite(got).all()
    ref = (torch.from_numpy(a).cuda().double() @ torch.from_numpy(w16).cuda().double().T).cpu().numpy()
    assert rel_l2(got, ref) < 1e-3
    w = np.concatenate([fused_f16_weights(raw, r, id_) for raw, r in zip(raws, rows)])
    own = (torch.from_numpy(a).cuda().double() @ torch.from_numpy(w).cuda().double().T).cpu().numpy()
    assert rel_l2(got, own) < 1e-5


@sim
@pytest.mark.parametrize("tn,stages", [(64, 3), (256, 2)])
def test_experiment_fused_regs_arm_runs_and_is_checked(tn, stages):
    """`minfer run gemm_f16 --arm IMPL=fused_regs` on the tiny workload: the arm multiplies the input set's Q4_K bytes
    and passes the experiment's check; a poisoned element of its output fails it; only its own knobs are effective;
    its cost counts the Q4_K bytes. TN=256 (a tile gemm_f16's own kernels refuse) prepares too."""
    from minfer_cli.experiment import get

    exp = get("gemm_f16")
    wl = exp.workload("tiny")
    config = exp.config(f"IMPL=fused_regs,TN={tn},STAGES={stages}")
    assert exp.effective(config) == {"IMPL": "fused_regs", "TN": tn, "STAGES": stages, "GROUP": G.DEFAULT["GROUP"],
                                     "NOCALL": G.DEFAULT["NOCALL"], "SPLITK": 0}
    assert exp.refuse(exp.config("IMPL=fused_regs,TM=192"), wl) is None  # TM does not apply to it
    inputs, output = exp.make_input_set(wl, np.random.default_rng()), exp.make_output(wl)
    exp.poison(output)
    exp.prepare(config, wl)(inputs, output, 0)
    err = exp.check(config, wl, inputs, output)
    assert 0 < err < exp.tolerance(config, wl)
    host = output.copy_to_host()
    host[3, 5] = np.nan
    output.copy_to_device(host)
    assert exp.check(config, wl, inputs, output) == float("inf")
    assert exp.cost(wl, config).bytes < exp.cost(wl, exp.config("IMPL=minfer")).bytes


@sim
def test_regs_accumulate_is_the_product_then_the_residual_add_bit_for_bit():
    """gemm_fused_regs(accumulate=True): x0 + the product, the same f32 bits; fresh random x0 and operands."""
    nt, rows, id_ = 17, [64, 70], 256
    config = dict(G.DEFAULT, TN=64, STAGES=3)
    a, raws, _ = _operands(nt, rows, id_, seed=None)
    x0 = (4 * np.random.default_rng().standard_normal((nt, sum(rows)))).astype(np.float32)
    prod = _run(R.gemm_fused_regs, a, raws, rows, config)
    x = cuda.to_device(x0)
    R.gemm_fused_regs(cuda.to_device(a), [(cuda.to_device(raw), r) for raw, r in zip(raws, rows)], "Q4_K", x,
                      config=config, accumulate=True)
    assert np.isfinite(prod).all() and np.array_equal(x.copy_to_host(), x0 + prod)


@sim
def test_regs_simulator_split_k():
    """Every tile in k slices (3 of 8 k tiles: slices start mid super-block; 4 of 4), with and without the residual
    epilogue (added in the slice sum), and left unsummed (`gemm_fused_regs_split`); poisoned partials; float64 of
    the kernel's f16 weights."""
    nt, rows = 20, [64, 30]
    for id_, splitk in ((512, 3), (256, 4)):
        config = dict(G.DEFAULT, TN=64, STAGES=3, SPLITK=splitk)
        a, raws, _ = _operands(nt, rows, id_, seed=None)
        need = R.partials_elements(config, nt, sum(rows), id_)
        assert need == splitk * nt * sum(rows)
        out = cuda.to_device(np.full((nt, sum(rows)), np.nan, np.float32))
        segments = [(cuda.to_device(raw), r) for raw, r in zip(raws, rows)]
        R.gemm_fused_regs(cuda.to_device(a), segments, "Q4_K", out, config=config,
                          partials=cuda.to_device(np.full(need, np.nan, np.float32)))
        got = out.copy_to_host()
        assert np.isfinite(got).all()
        assert rel_l2(got, _kernel_weights_product(a, raws, rows)) < 1e-5
        x0 = np.random.default_rng().standard_normal(got.shape).astype(np.float32)
        x = cuda.to_device(x0)
        R.gemm_fused_regs(cuda.to_device(a), segments, "Q4_K", x, config=config, accumulate=True,
                          partials=cuda.to_device(np.full(need, np.nan, np.float32)))
        assert np.array_equal(x.copy_to_host(), x0 + got)
        if splitk == 3:  # the unsummed form (FUSE_ADD_NORM's): the slices, whose sum in slice order is C
            parts, count = R.gemm_fused_regs_split(cuda.to_device(a), segments, "Q4_K", config=config,
                                                   partials=cuda.to_device(np.full(need, np.nan, np.float32)))
            slices = parts.copy_to_host()[: count * got.size].reshape(count, *got.shape)
            assert count == splitk and np.array_equal(slices[0] + slices[1] + slices[2], got)


# ---- gemm_fused_regs_glu: the gate/up product with the SwiGLU in its epilogue ----------------------------------


def _glu_case(config, nt, ffn, id_, partials=False):
    """(fused act, gemm_fused_regs + swiglu act, float64 silu(g) * u over the f16 weights) for fresh random f16 a
    [nt, id] and a Q4_K gate|up weight [2 ffn, id] as two segments; the outputs and partials poisoned with NaN."""
    from kernels.activation import swiglu

    a, raws, w16 = _operands(nt, [ffn, ffn], id_, seed=None)
    a = (a * np.float16(2**-8)).astype(np.float16)  # silu(g) * u of the random blocks' products stays within f16
    da, segments = cuda.to_device(a), [(cuda.to_device(raw), ffn) for raw in raws]

    def extra():
        need = R.partials_elements(config, nt, 2 * ffn, id_)
        return {"partials": cuda.to_device(np.full(need, np.nan, np.float32))} if partials else {}

    act = cuda.to_device(np.full((nt, ffn), np.nan, np.float16))
    assert R.gemm_fused_regs_glu(da, segments, "Q4_K", act, config=config, **extra()) is act
    c = cuda.to_device(np.full((nt, 2 * ffn), np.nan, np.float32))
    R.gemm_fused_regs(da, segments, "Q4_K", c, config=config, **extra())
    ref = a.astype(np.float64) @ w16.astype(np.float64).T
    g, u = ref[:, :ffn], ref[:, ffn:]
    return act.copy_to_host(), swiglu(c).copy_to_host(), g / (1.0 + np.exp(-g)) * u


def _assert_glu(fused, unfused, ref, ulps):
    assert not np.isnan(fused).any(), "some activations were never written (still the NaN poison)"
    diff = np.abs(fused.view(np.int16).astype(np.int64) - unfused.view(np.int16).astype(np.int64))
    assert diff.max() <= ulps, f"{diff.max()} f16 ulps from gemm_fused_regs + swiglu"
    assert rel_l2(fused, ref) < 2e-3


@sim
def test_regs_glu_simulator_is_the_product_and_swiglu():
    """Each tile's halves (64 gate rows, the same up rows, from the two segments' raw boxes) through the SwiGLU
    epilogue, NOCALL=0 and 1: within one f16 ulp of gemm_fused_regs + swiglu (the same C values and expression; the
    simulator computes silu in float64, which the epilogue's f16x2 packing rounds through f32 and swiglu's store
    straight to f16, so a rare element differs by one ulp; the GPU test holds NOCALL=0 to the bit); nt tail, 2
    tiles of od; and TN=256, whose producer warpgroup converts the headers of both halves' rows."""
    base = dict(G.DEFAULT, TN=64, STAGES=3, SPLITK=1)
    _assert_glu(*_glu_case(dict(base, NOCALL=0), 17, 128, 256), ulps=1)
    _assert_glu(*_glu_case(dict(base, NOCALL=1), 33, 64, 256), ulps=1)
    _assert_glu(*_glu_case(dict(base, TN=256, STAGES=2), 17, 64, 256), ulps=1)  # the converters' GLU rows


@sim
def test_regs_glu_simulator_split_k(monkeypatch):
    """Split-K with the SwiGLU: every tile in 3 k slices (the [slices, nt, od] partials), and the auto plan on 4 SMs
    that leaves a 2 x 3 grid's first wave whole and splits the last two tiles in 2 (compact partials, the GLU tile
    sum); both within one f16 ulp of gemm_fused_regs + swiglu (the simulator's float64 silu: see above)."""
    from kernels.gemm_f16_config import SplitPlan

    _assert_glu(*_glu_case(dict(G.DEFAULT, TN=64, STAGES=3, SPLITK=3, NOCALL=0), 20, 64, 512, partials=True), ulps=1)
    monkeypatch.setattr(G, "device_sms", lambda: 4)
    monkeypatch.setattr(G.gemm_f16_config, "MIN_KTILES_PER_SLICE", 1)
    config = dict(G.DEFAULT, TN=64, STAGES=3, SPLITK=0, NOCALL=0)
    assert R.split_plan(config, 70, 384, 256) == SplitPlan(4, 2)
    _assert_glu(*_glu_case(config, 70, 192, 256, partials=True), ulps=1)


@pytest.mark.compile
def test_regs_glu_ptx():
    """The SwiGLU kernel at the default tile: 16-byte activation stores, within the block's registers, no spills,
    the wgmma async."""
    from ptx_assembly import ptxas_resources

    ptx = R.kernel_ptx(None, "Q4_K", glu=True)
    assert "st.global.v4.u32" in ptx or "st.global.v4.b32" in ptx
    res = ptxas_resources(ptx)
    assert res["registers"] <= 168 and res["spill_bytes"] == 0 and not res["wgmma_serialized"], res
    assert not wgmma_register_hazards(ptx)


@pytest.mark.gpu
@pytest.mark.parametrize("nt,nocall", [(2048, 1), (128, 1), (33, 0), (768, 0)])
def test_regs_glu_gpu_is_the_product_and_swiglu(nt, nocall):
    """Qwen2-7B's gate|up (2 x 18944 rows, id 3584), the auto split plan (nt=128: every tile split; 768: the last
    wave's tiles in slices): NOCALL=0 the same bits as gemm_fused_regs + swiglu, NOCALL=1 (div.approx) within one
    f16 ulp; float64's silu(g) * u within 2e-3."""
    _assert_glu(*_glu_case({"NOCALL": nocall}, nt, 18944, 3584, partials=True), ulps=nocall)
