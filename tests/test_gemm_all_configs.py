"""Every valid gemm_f16 knob combination compiles to PTX for sm_90 with NVVM (no GPU) and carries the instructions
its knobs promise: a knob that silently changes nothing, or a helper that silently falls back, fails here.
(828 combinations, 180 of them MMA=wgmma for sm_90a; compiled in parallel, a few minutes on a 2-core machine.)"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor

import pytest


def _check(config: dict) -> str | None:
    from kernels import gemm_f16 as G

    try:
        ptx = G.kernel_ptx(config)
    except Exception as exc:  # reported, not raised across the process boundary
        return f"{config}: does not compile ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
    mma, wg = config["MMA"] == "mma_sync", config["MMA"] == "wgmma"
    want = {"mma.sync.aligned.m16n8k16": mma, "ldmatrix.sync.aligned": mma, "wmma.mma.sync": config["MMA"] == "wmma",
            "wgmma.mma_async.sync.aligned.m64n": wg, "fence.proxy.async.shared::cta": wg,
            "cp.async.cg.shared.global": config["STAGING"] == "cp_async"}
    wrong = [f"{text} {'missing' if need else 'present'}" for text, need in want.items() if (text in ptx) != need]
    if ".local" in ptx:
        wrong.append("uses local memory")
    return f"{config}: {', '.join(wrong)}" if wrong else None


@pytest.mark.compile
def test_every_gemm_knob_combination_compiles_with_its_instructions():
    from kernels import gemm_f16 as G

    configs = list(G.all_configs())
    assert len(configs) == 828
    with ProcessPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        problems = [p for p in pool.map(_check, configs, chunksize=8) if p]
    assert not problems, "\n".join(problems[:20])
