"""The generated source of the gemv kernels (`kernels.gemv`): one kernel per (format, knob combination), its
per-row code written out RPB times (`_source`), then jitted (`_build`); `kernels.gemv.launch.kernel_for` caches
what `_build` returns under its `GemvConfig`.

The pieces: the loop over a row's chunks (`_chunk_body`; STAGE=2..4's cp.async ring `_ring_loop`), PDL's L2
prefetch of each warp's first chunk before it waits for the previous kernel (`_lookahead`), and the epilogue that
joins the warps and stores y (`_epilogue`). Which x loader, block dot, fetch and math go in: `kernels.gemv.formats`.
"""

from __future__ import annotations

import re

import numpy as np
from numba import cuda

from kernels.activation import silu_mul
from kernels.gemv.config import GemvConfig, stage_window_bytes, threads_per_block
from kernels.gemv.device import ZERO, _warp_sum
from kernels.gemv.formats import _FOLD, _FOLD_RES, _IMPLS, _MMVQ_IMPLS, _MMVQ_RES_IMPLS, _RING_FETCH
from kernels.jit import kernel_from_source
from kernels.ptx import (
    cp_async_16_off,
    cp_async_commit_group,
    cp_async_wait_group,
    griddepcontrol_launch_dependents,
    griddepcontrol_wait,
    prefetch_l2,
    syncwarp,
)
from kernels.quant.bits import SIMULATOR
from kernels.quant.formats import block_format


_KERNEL_TEMPLATE = """
def {fname}(raw, {wargs}{xargs}, y, res, od, id):
    tid = cuda.threadIdx.x
    lane = tid & 31
    warp = tid >> 5
    j = lane % {lpb}
    bl = lane // {lpb}
    row0 = cuda.blockIdx.x * {rpb}
    last = od - 1
    nb = id // {bs}
    nchunks = (nb + {bpc} - 1) // {bpc}
{launch_dependents}{per_row_init}
{loop}
{per_row_reduce}
{epilogue}
"""


def _chunk_body(rows, mats, bpc: int, bs: int, xargs: str) -> str:
    """The loop body over one chunk; ``mats`` pairs each accumulator prefix with its weight array. A guarded block:
    a lane whose block lies past the row's end skips it."""
    dots = "\n".join(f"            {p}{r} += dot({w}, rb{r} + b, j, xs)" for r in rows for p, w in mats)
    return f"        b = c * {bpc} + bl\n        if b < nb:\n            xs = xload({xargs}, b * {bs}, j)\n{dots}"


def _stage_init(mats, rpb: int, wpr: int, chunk_bytes: int, slots: int) -> str:
    """The staging buffer: one window per (warp, slot, weight, row), 16-byte aligned; ``wb0`` is this warp's
    first."""
    win = stage_window_bytes(chunk_bytes) // 2
    align = None if SIMULATOR else 16  # the simulator refuses the argument; its numpy arrays are 16-byte aligned
    return (f"    stg = cuda.shared.array({wpr * slots * len(mats) * rpb * win}, np.uint16, alignment={align})\n"
            f"    wb0 = warp * {slots * len(mats) * rpb * win}\n")


def _ring_copy(ind: str, chunk: str, slot: str, rows, mats, rpb: int, bpc: int, type_size: int) -> list[str]:
    """The lines (indented ``ind``) that start the ``cp.async`` copies of chunk ``chunk`` of every row and weight
    into ring slot ``slot``: the 16-byte vectors of ``[s & ~15, e)`` for the chunk's bytes ``[s, e)``, vector
    ``v`` by lane ``v mod 32`` (`kernels.ptx.cp_async_16_off`, which bypasses L1 and holds no register). Row r's
    bytes start at ``ra{r}`` (`_ring_loop`); the chunk's byte range and the slot's first byte are computed once
    for all rows. No branch: a lane past the window's last vector copies that last vector again (the same bytes
    to the same place), so every copy of a chunk is one straight line of code."""
    win = stage_window_bytes(bpc * type_size) // 2
    nvec = win // 8
    per_slot = len(mats) * rpb * win
    lines = [f"{ind}ccs = {chunk} * {bpc * type_size}", f"{ind}cce = min({chunk} * {bpc} + {bpc}, nb) * {type_size}",
             f"{ind}cd = 2 * (wb0 + ({slot}) * {per_slot})"]
    for r in rows:
        lines += [f"{ind}a{r} = (ra{r} + ccs) & -16", f"{ind}n{r} = (ra{r} + cce - a{r} + 15) >> 4"]
        for m, (_, w) in enumerate(mats):
            for t in range((nvec + 31) // 32):
                lines += [f"{ind}v{r}_{t} = 16 * min(lane + {32 * t}, n{r} - 1)"] if m == 0 else []
                lines += [f"{ind}cp_async_16_off(stg, cd + {2 * (m * rpb + r) * win} + v{r}_{t}, {w}, "
                          f"a{r} + v{r}_{t}, 16)"]
    return lines


def _ring_loop(rows, mats, rpb: int, wpr: int, bpc: int, bs: int, type_size: int, xargs: str, slots: int,
               at: bool = False, pdl: bool = False) -> str:
    """The chunk loop with STAGE = ``slots`` >= 2: a ring of ``slots`` shared windows per warp, weight
    and row. The warp first starts the copies of its first ``slots - 1`` chunks; each step then starts the copy of
    the chunk ``slots - 1`` steps ahead into the slot freed by the previous step, waits for the current chunk's
    group (``cp.async.wait_group slots - 1``: every lane commits one group a step, empty past the row's end),
    `kernels.ptx.syncwarp` (the other lanes' copies are visible), decodes the chunk from its slot with the same
    block dots as STAGE=0, and syncwarps again (the slot is read before it is refilled). Window layout and
    alignment rules: W 16-byte aligned and a whole number of 16-byte vectors (`GemvConfig.weight_refusal`). ``at``: the
    format has a `_RING_FETCH` (a lane's fetch from a block at any element of the window), used with ``math``
    instead of ``dot`` on a slice of the window: the same operations, without a slice's bounds arithmetic.
    ``pdl``: the first copies (W only)
    are started before `kernels.ptx.griddepcontrol_wait`, the loop (x, y) after it."""
    win = stage_window_bytes(bpc * type_size) // 2
    per_slot = len(mats) * rpb * win
    step = wpr
    lines = [f"    ra{r} = rb{r} * {type_size}" for r in rows]
    for p in range(slots - 1):
        lines += [f"    cc = warp + {p * step}", "    if cc < nchunks:",
                  *_ring_copy("        ", "cc", str(p), rows, mats, rpb, bpc, type_size), "    cp_async_commit_group()"]
    lines += ["    griddepcontrol_wait()"] if pdl else []
    lines += ["    sl = 0", f"    sw = {slots - 1}", f"    for c in range(warp, nchunks, {step}):",
              f"        cc = c + {(slots - 1) * step}", "        if cc < nchunks:",
              *_ring_copy("            ", "cc", "sw", rows, mats, rpb, bpc, type_size),
              "        cp_async_commit_group()", f"        cp_async_wait_group({slots - 1})", "        syncwarp()",
              f"        cb = c * {bpc}", "        b = cb + bl", "        if b < nb:",
              f"            xs = xload({xargs}, b * {bs}, j)"]
    for r in rows:
        for m, (p, w) in enumerate(mats):
            base = f"wb0 + sl * {per_slot} + {(m * rpb + r) * win} + (((ra{r} + cb * {type_size}) & 15) >> 1)"
            if at:
                lines.append(f"            {p}{r} += math(fetch(stg, {base} + bl * {type_size // 2}, j), j, xs)")
            else:
                lines.append(f"            {p}{r} += dot(stg[{base}:], bl, j, xs)")
    lines += ["        syncwarp()", f"        sl = sl + 1 if sl < {slots - 1} else 0",
              f"        sw = sw + 1 if sw < {slots - 1} else 0"]
    return "\n".join(lines)


def _epilogue(rows, mats, rpb: int, wpr: int, residual: bool) -> str:
    """Reduce the warps' row sums (shared memory when WPR > 1) and store y: the sum (+ res), or with two
    matrices (gate, up) silu(gate row) * up row."""
    glu = len(mats) == 2

    def value(a, u, r):
        return f"silu_mul({a}, {u})" if glu else a + (f" + res[{r}]" if residual else "")

    if wpr == 1:
        return "    if lane == 0:\n" + "\n".join(
            f"        if row0 + {r} < od:\n            y[row0 + {r}] = {value(f'acc{r}', f'acu{r}', f'row0 + {r}')}"
            for r in rows)
    lines = [f"    part = cuda.shared.array({len(mats) * rpb * wpr}, np.float32)", "    if lane == 0:"]
    lines += [f"        part[({m * wpr} + warp) * {rpb} + {r}] = {p}{r}" for r in rows for m, (p, _) in enumerate(mats)]
    lines += ["    cuda.syncthreads()", f"    if tid < {rpb}:", "        row = row0 + tid", "        if row < od:"]
    for m, v in enumerate(("v", "u")[: len(mats)]):
        lines += [f"            {v} = part[{m * wpr * rpb} + tid]",
                  f"            for w in range(1, {wpr}):",
                  f"                {v} += part[({m * wpr} + w) * {rpb} + tid]"]
    lines.append(f"            y[row] = {value('v', 'u', 'row')}")
    return "\n".join(lines)


def lookahead_lines(chunk_bytes: int) -> int:
    """128-byte lines a lookahead covers per row: the most that ``chunk_bytes`` bytes at any offset can touch, with
    offsets taken from an array start of any alignment (one more than ``ceil((chunk_bytes - 1) / 128) + 1`` would
    need where lines and array agree)."""
    return chunk_bytes // 128 + 2


def _lookahead(ind: str, mats, rpb: int, chunk_bytes: int, type_size: int, chunk: str) -> list[str]:
    """The lines (indented ``ind``) that prefetch into L2 chunk ``chunk`` (an expression: PDL's ``warp``, the warp's
    first chunk), every row and weight, when it exists. Lane slot ``q = lane + 32 t`` takes row
    ``q // lines`` of the CUDA block (clamped to ``od - 1``) and, of that row's chunk, the line ``q % lines`` after
    the chunk's start rounded down to 128 bytes (``lines``: `lookahead_lines`), clamped to the chunk's last byte;
    slots past ``RPB * lines`` repeat the last one (a line asked for twice: no branch). Every offset lies in its
    row's bytes or the row before (the rounding), inside W."""
    lines = lookahead_lines(chunk_bytes)
    slots = rpb * lines
    out = [f"{ind}pc = {chunk}", f"{ind}if pc < nchunks:", f"{ind}    pb = pc * {chunk_bytes}",
           f"{ind}    pe = min(pb + {chunk_bytes}, nb * {type_size}) - 1"]
    for t in range((slots + 31) // 32):
        out += [f"{ind}    pq = min(lane + {32 * t}, {slots - 1})",
                f"{ind}    pr = min(row0 + pq // {lines}, last) * nb * {type_size}",
                f"{ind}    po = min(((pr + pb) & -128) + (pq % {lines}) * 128, pr + pe)"]
        out += [f"{ind}    prefetch_l2({w}, po)" for _, w in mats]
    return out


def _source(config: GemvConfig) -> tuple[str, str, dict]:
    """(kernel name, generated source, the names it runs with) of one `GemvConfig`: the per-row code is written
    out RPB times with scalar accumulators (a loop over a local array is left rolled by LLVM when the block decode
    is long, which puts the accumulators in local memory). GLU: a second weight ``up`` of the same format and
    shape, its rows accumulated beside the first's, and y = silu(W·x) * (up·x)."""
    name, rpb, wpr, residual = config.qtype, config.rows_per_block, config.warps_per_row, config.residual
    mmvq, glu, stage, min_blocks, fold, pdl, xres = (config.mmvq, config.glu, config.stage, config.min_blocks,
                                                     config.fold, config.pdl, config.xres)
    xload, dot, lpb, bs, _ = (_MMVQ_RES_IMPLS if xres else _MMVQ_IMPLS if mmvq else _IMPLS)[name]
    # the ring's window fetch and the decode of what it returns (`_RING_FETCH`); unused otherwise
    fetch, math_f32, math_q8, math_q8r = _RING_FETCH.get(name, (None, None, None, None))
    math = math_q8r if xres else math_q8 if mmvq else math_f32
    if fold:
        xload, dot, math = (_FOLD_RES if xres else _FOLD)[name]
    fmt = block_format(name)
    fname = (f"gemv_{name.lower()}_rpb{rpb}_wpr{wpr}{'_res' if residual else ''}{'_mmvq' if mmvq else ''}"
             f"{'_glu' if glu else ''}{f'_ring{stage}' if stage else ''}{f'_minb{min_blocks}' if min_blocks else ''}"
             f"{'_fold' if fold else ''}{'_pdl' if pdl else ''}{'_xres' if xres else ''}"
             f"{f'_ahead{config.lookahead}' if config.lookahead > 1 else ''}")
    xargs = ("xq, xd, xsum, xr" if xres else "xq, xd, xsum") if mmvq else "xv"
    mats = [("acc", "raw"), ("acu", "up")] if glu else [("acc", "raw")]
    rows = range(rpb)
    chunk_bytes = 32 // lpb * fmt.type_size
    if stage:
        loop = _ring_loop(rows, mats, rpb, wpr, 32 // lpb, bs, fmt.type_size, xargs, stage, name in _RING_FETCH, pdl)
    else:
        first = [line for j in range(config.lookahead)
                 for line in _lookahead("    ", mats, rpb, chunk_bytes, fmt.type_size, f"warp + {j * wpr}")]
        first += ["    griddepcontrol_wait()"]
        loop = "\n".join([*(first if pdl else []), f"    for c in range(warp, nchunks, {wpr}):",
                          _chunk_body(rows, mats, 32 // lpb, bs, xargs)])
    src = _KERNEL_TEMPLATE.format(
        fname=fname,
        wargs="up, " if glu else "",
        xargs=xargs,
        lpb=lpb,
        bs=bs,
        bpc=32 // lpb,
        rpb=rpb,
        launch_dependents="    griddepcontrol_launch_dependents()\n" if pdl else "",
        # rows past od (last CUDA block) re-read row od - 1: valid memory, never written
        per_row_init=(_stage_init(mats, rpb, wpr, chunk_bytes, stage) if stage else "")
        + "\n".join(f"    rb{r} = min(row0 + {r}, last) * nb\n" + "\n".join(f"    {p}{r} = ZERO" for p, _ in mats)
                    for r in rows),
        loop=loop,
        per_row_reduce="\n".join(f"    {p}{r} = _warp_sum({p}{r})" for r in rows for p, _ in mats),
        epilogue=_epilogue(rows, mats, rpb, wpr, residual),
    )
    scope = {"cuda": cuda, "np": np, "ZERO": ZERO, "_warp_sum": _warp_sum, "silu_mul": silu_mul, "xload": xload,
             "dot": dot, "fetch": fetch, "math": math, "prefetch_l2": prefetch_l2,
             "griddepcontrol_wait": griddepcontrol_wait,
             "griddepcontrol_launch_dependents": griddepcontrol_launch_dependents,
             "syncwarp": syncwarp, "cp_async_16_off": cp_async_16_off,
             "cp_async_commit_group": cp_async_commit_group, "cp_async_wait_group": cp_async_wait_group}
    return fname, src, scope


_PER_FORMAT = ("xload", "dot", "fetch", "math")
"""The names of a kernel's scope that differ between formats (`_source`), renamed per body in `_pair_source`."""


def _pair_source(first: GemvConfig, second: GemvConfig) -> tuple[str, str, dict]:
    """(kernel name, source, scope) of one launch running two mat-vecs over the same x (FUSE_QKV_MIXED: q|k and v of
    different formats): each configuration's kernel becomes a device function of its CUDA block index (`_source`,
    with ``cuda.blockIdx.x`` a parameter ``bx`` and its per-format helpers suffixed ``_a`` / ``_b``), and the kernel
    gives CUDA blocks ``0 .. grid_a - 1`` to the first and the rest to the second. Both take the same x; their
    threads, PDL and MINB agree (`kernels.gemv.launch.pair_refusal`)."""
    scope, bodies, names = {}, [], []
    for suffix, config in (("_a", first), ("_b", second)):
        fname, src, sc = _source(config)
        body = fname + suffix
        src = src.replace("cuda.blockIdx.x", "bx").replace(f"def {fname}(", f"def {body}(", 1)
        src = src.replace(", od, id):", ", od, id, bx):", 1)
        for helper in _PER_FORMAT:
            src = re.sub(rf"\b{helper}\(", f"{helper}{suffix}(", src)
            sc = {**sc, f"{helper}{suffix}": sc[helper]}
        scope.update({k: v for k, v in sc.items() if k not in _PER_FORMAT})
        bodies.append('@cuda.jit(device=True, inline="always")' + src)
        names.append(body)
    xargs = ("xq, xd, xsum, xr" if first.xres else "xq, xd, xsum") if first.mmvq else "xv"
    name = f"gemv_pair__{names[0]}__{names[1]}"
    kernel_src = (f"\ndef {name}(raw_a, {xargs}, y_a, res_a, od_a, id_a, raw_b, y_b, res_b, od_b, id_b, grid_a):\n"
                  "    bx = cuda.blockIdx.x\n"
                  "    if bx < grid_a:\n"
                  f"        {names[0]}(raw_a, {xargs}, y_a, res_a, od_a, id_a, bx)\n"
                  "    else:\n"
                  f"        {names[1]}(raw_b, {xargs}, y_b, res_b, od_b, id_b, bx - grid_a)\n")
    return name, "\n".join(bodies) + kernel_src, scope


def _build_pair(first: GemvConfig, second: GemvConfig):
    """Generate (`_pair_source`) and jit the two-mat-vec kernel of ``first`` and ``second``, with MINB's bounds."""
    name, src, scope = _pair_source(first, second)
    return kernel_from_source(src, name, scope, threads=first.threads if first.min_blocks else None,
                              min_blocks=first.min_blocks, label="kernels.gemv")


def _build(config: GemvConfig):
    """Generate (`_source`) and jit the kernel of one `GemvConfig`, with MINB's launch bounds."""
    fname, src, scope = _source(config)
    min_blocks, wpr = config.min_blocks, config.warps_per_row
    # a compiler bound only with MINB (the simulator's jit takes none and has no registers)
    return kernel_from_source(src, fname, scope, threads=threads_per_block(wpr) if min_blocks else None,
                              min_blocks=min_blocks, label="kernels.gemv")
