"""gemm_f16 knob combinations compile to PTX for sm_90 with NVVM and carry the instructions their knobs promise: a
knob that silently changes nothing, or a helper that silently falls back, fails here.

In CI (`compile`): a covering set — every pair of knob values that some valid combination holds appears in at least
one compiled combination (greedy all-pairs over the valid ones), plus the default, the baseline and
MMA_SYNC_BEST. On the GPU machine (`gpu`, for its cores, not its GPU): all 1368 valid combinations (720 of them
MMA=wgmma for sm_90a). Both compile in parallel."""

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


def _compile_all(configs: list) -> None:
    with ProcessPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        problems = [p for p in pool.map(_check, configs, chunksize=4) if p]
    assert not problems, "\n".join(problems[:20])


def _pairs(config: dict) -> set:
    items = sorted(config.items())
    return {(a, b) for i, a in enumerate(items) for b in items[i + 1:]}


def covering_set(every: list, must: list) -> list:
    """``must``, then greedily the combination of ``every`` that holds the most knob-value pairs not yet held, until
    every pair held by some combination of ``every`` is held (deterministic: ties go to the first in order)."""
    chosen = list(must)
    held = set().union(*(_pairs(c) for c in chosen))
    left = set().union(*(_pairs(c) for c in every)) - held
    while left:
        best = max(every, key=lambda c: len(_pairs(c) & left))
        chosen.append(best)
        left -= _pairs(best)
    return chosen


@pytest.mark.compile
def test_a_covering_set_of_gemm_knob_combinations_compiles_with_its_instructions():
    from kernels import gemm_f16 as G

    every = list(G.all_configs())
    configs = covering_set(every, [dict(G.DEFAULT), dict(G.BASELINE), dict(G.MMA_SYNC_BEST)])
    assert all(c in every for c in configs) and len(configs) < 40
    assert set().union(*(_pairs(c) for c in configs)) == set().union(*(_pairs(c) for c in every))
    _compile_all(configs)


@pytest.mark.gpu
def test_every_gemm_knob_combination_compiles_with_its_instructions():
    from kernels import gemm_f16 as G

    configs = list(G.all_configs())
    assert len(configs) == 1368
    _compile_all(configs)
