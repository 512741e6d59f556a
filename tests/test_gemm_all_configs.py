"""Every valid gemm_f16 knob combination (up to GROUP, below) compiles to PTX for sm_90 with NVVM (no GPU) and carries the instructions
its knobs promise: a knob that silently changes nothing, or a helper that silently falls back, fails here.

GROUP enters every kernel only through `kernels.gemm_f16._program_order` (the block's tile origin, computed once
before the main loop), so the combinations are compiled at the default GROUP, and every GROUP value once with each
kernel family (MMA x STAGING x LOOP) at that family's first tile shape: 276 + 16 of the 828 valid combinations (60 +
4 of them MMA=wgmma for sm_90a), compiled in parallel."""

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
def test_every_gemm_knob_combination_up_to_group_compiles_with_its_instructions():
    from kernels import gemm_f16 as G

    every = list(G.all_configs())
    assert len(every) == 828
    seen, configs = set(), []
    for config in every:
        family = (config["MMA"], config["STAGING"], config["LOOP"], config["GROUP"])
        if config["GROUP"] == G.DEFAULT["GROUP"] or family not in seen:
            configs.append(config)
        seen.add(family)
    assert {c["GROUP"] for c in configs} == set(G.KNOBS["GROUP"])
    families = {(c["MMA"], c["STAGING"], c["LOOP"]) for c in every}
    assert len(configs) == 276 + 2 * len(families) and len(families) == 8
    with ProcessPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        problems = [p for p in pool.map(_check, configs, chunksize=8) if p]
    assert not problems, "\n".join(problems[:20])
