"""Compiled kernel resources (GPU): no instance of any experiment's default configuration spills to local memory;
(`compile`, no GPU) the wgmma column's reading of ptxas's report."""

from __future__ import annotations

import pytest

from minfer_cli.experiment import load_all


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(load_all()))
def test_default_kernels_do_not_spill(name):
    from minfer_cli.measure.resources import resources

    exp = load_all()[name]
    instances = exp.kernels(exp.default_config(), exp.default_workload)
    for inst in instances:
        r = resources(inst)
        assert r.local_mem == 0, f"{r.name} uses {r.local_mem} B of local memory per thread (spills)"
        assert r.blocks_per_sm >= 1, f"{r.name} cannot be resident at {r.threads} threads"


@pytest.mark.gpu
def test_copy_kernel_resources_are_read():
    from minfer_cli.measure.resources import resources

    exp = load_all()["copy"]
    for vec in (1, 2, 4):
        (inst,) = exp.kernels({"VEC": vec}, exp.default_workload)
        r = resources(inst)
        assert 0 < r.regs <= 255 and r.threads == 256


@pytest.mark.compile
def test_wgmma_state_reads_ptxas_serialization():
    """`minfer kernels`' wgmma column: the default GEMM with NOCALL=0 is serialized (C7509), with NOCALL=1 async,
    and a kernel without wgmma has no entry."""
    from kernels import gemm_f16 as G
    from minfer_cli.measure.resources import assemble_ptx, wgmma_state

    for config, want in ((dict(G.DEFAULT, NOCALL=0), "serialized (C7509)"), (G.DEFAULT, "async"),
                         (G.MMA_SYNC_BEST, "")):
        ptx = G.kernel_ptx(config)
        assert wgmma_state(ptx, assemble_ptx(ptx, "sm_90a")[1]) == want, config
