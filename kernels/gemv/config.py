"""The gemv kernels' knobs (`kernels.gemv`): each knob's allowed values, default and the reason for it, the limits
they are checked against, and the refusal functions, each the one owner of a knob's rules (the launchers raise
them; the gemv experiment and the decode engine ask first).

Every knob is a compile-time constant: one specialised kernel per combination (`kernels.gemv.launch.kernel_for`).
"""

from __future__ import annotations

from kernels.errors import KernelConstraintError
from kernels.gemv.formats import FOLD_TYPES, STAGE_TYPES, _IMPLS, _known_format
from kernels.quant.dequant import _address
from kernels.quant.formats import block_format


RPB_VALUES = (1, 2, 4, 8)
"""Rows per CUDA block (= rows each warp decodes at once, sharing its x registers)."""
WPR_VALUES = (1, 2, 4, 8)
"""Warps per row (each takes every WPR-th chunk of the row); threads per block = 32 * WPR."""
STAGE_VALUES = (0, 2, 3, 4)
"""Shared-memory slots per warp that W's chunks pass through before they are decoded, for the 2-byte-aligned
formats ``STAGE_TYPES``, whose decode otherwise issues one 2-byte global load per halfword (Q6_K: 17 a lane a
block); 0: decode straight from global memory.

* 2, 3, 4: a ring of that many slots filled by ``cp.async`` (`_ring_loop`): the copies of the next STAGE - 1
  chunks are in flight while the warp decodes the current one, without holding registers, so the bytes in flight
  per warp no longer depend on how ptxas schedules the decode's loads. Alone it was slower on
  the H200 (Q6_K MMVQ at ffn_down, RPB=4, WPR=2: STAGE=3 34.88 vs 30.02 µs for STAGE=0, +16%, REVERTED, #59).
  Its copy and window addressing were later made lean (`_ring_copy`, `_RING_FETCH`: ~15% fewer instructions).
  With FOLD=1, 4 warps a row and MINB=7 (72 registers, 23 warps an SM) it is the fastest Q6_K shape at
  ffn_down: 24.08 µs vs 28.30 for RPB=4, WPR=2 without it (#69, #73), the engine's DEEP=1 launch (tg128 +2.2%,
  #71). Hardware counters (ncu) of that kernel: issue slots 58.5% busy, DRAM 49.8%."""
FOLD_VALUES = (0, 1)
"""1: Q6_K's MMVQ dot takes its -32 offset from the x loader: per plane ``-32 * Σx`` of the lane's 8 x values, once
per chunk for all RPB rows (`_xq_k_planes_fold`), starts the plane's dp4a chain over the stored 6-bit q (0..63,
the same bytes as int8), instead of an add and an xor on every word of every row (`_mathq_q6_k_fold`); x indexes
unsigned (no negative-index wraparound code). Bit-identical (the same integer sums). Offline sm_90 SASS at RPB=4,
WPR=2: 480 instructions a chunk instead of 640. On the H200, measured as a commit before it was a knob (ffn_down,
one device call): RPB=4, WPR=2 29.57 -> 37.41 µs, RPB=2, WPR=2 34.13 -> 30.78, RPB=8, WPR=1 131.1 -> 88.7 (sweeps
#60, #62); tg128 331.36 -> 312.98 tok/s at the engine's shapes (#61, #63). Faster per warp, slower at the best shape
without the ring; with the ring (STAGE=2), RPB=4, WPR=4, MINB=7: 24.11 µs vs 26.57 without the fold (#69), the
engine's DEEP=1 launch for Q6_K ffn_down."""
PDL_VALUES = (0, 1)
"""1: programmatic dependent launch (`kernels.launch`): the kernel lets the next one start early
(`kernels.ptx.griddepcontrol_launch_dependents` first thing), and is itself launched with programmatic stream
serialization, so its CUDA blocks take the SM slots the previous kernel's last blocks leave; before it waits for
that kernel (`kernels.ptx.griddepcontrol_wait`) it touches only W: the ring's first copies (STAGE 2..4), else an
L2 prefetch of its warp's first chunk (`_lookahead`). x, the residual and y come after the wait. Needs a stream
other than 0. 0: an ordinary launch. On the H200 at ffn_down, timed as graphs of 6 back-to-back launches: Q4_K
(RPB=4, WPR=4, MINB=7) 16.03 -> 15.27 µs (61.3% of copy), the Q6_K ring (FOLD=1) 24.11 -> 20.85 (65.5%); the
Q4_K gate/up pass 37.35 -> 36.40 (ledger #79-#81). At ffn_down the kernel's fixed cost (launch, ramp, tail) is
~4 µs of Q4_K's 16 and ~8.6 of Q6_K's 24 (times at 1, 2 and 4 x 3584 rows): that is what PDL overlaps."""
MINB_VALUES = (0, 1, 2, 4, 7, 8, 14, 16)
"""CUDA blocks per SM the kernel is compiled to fit (the second number of ``__launch_bounds__``, which caps the
registers per thread at what that many blocks of ``32 * WPR`` threads leave: `min_blocks_registers`, 65536 /
(MINB * 32 * WPR) rounded down to 8); 0: no bound, ptxas's own register count; MINB * 32 * WPR must fit the SM's
``MAX_THREADS_PER_SM``. A grid of few CUDA blocks (ffn_down: 3584 rows / RPB) runs in one wave only if
they all fit at once: with RPB=4, WPR=4 that is 896 blocks, 7 per SM of 132, at most 72 registers; Q4_K uses
86-107 unbounded (Q4_K MMVQ at ffn_down, RPB=4, WPR=4, HOIST=1, MINB=7: 16.33 µs vs 20.35 at RPB=2, WPR=2, ledger
#52; a launch-bounds probe before the knob existed gave 22.5 -> 17.6 µs for HOIST=0, unrecorded)."""
STAGE_SMEM_LIMIT = 48 * 1024
"""Bytes of static shared memory a staged kernel may use (CUDA's static limit): its windows are
``WPR * STAGE * RPB * (2 with GLU) * window`` bytes (Q6_K: 864-byte windows, so STAGE * RPB * WPR * weights
<= 56)."""
DEFAULT_RPB = 4
DEFAULT_WPR = 4
DEFAULT_STAGE = 0
DEFAULT_MINB = 0
MAX_THREADS_PER_SM = 2048
"""Resident threads an sm_90 SM holds: MINB * 32 * WPR above it is refused (ptxas ignores such a bound)."""
DEFAULT_FOLD = 0
DEFAULT_PDL = 0


MINB_REGISTER_FLOOR = 72
"""`one_wave_min_blocks` bounds no kernel below this many registers per thread: the measured case (Q4_K MMVQ,
RPB=4, WPR=4, HOIST=1, MINB=7: 72 registers, 28 bytes of spills, 16.33 µs, ledger #52). Tighter bounds spill
hundreds of bytes (MINB=8: 64 registers; MINB=14: 32) and were never measured faster."""


def min_blocks_registers(min_blocks: int, warps_per_row: int) -> int:
    """Registers per thread ptxas may use under ``__launch_bounds__(32 * WPR, MINB)``: 65536 / (MINB * 32 * WPR)
    rounded down to its allocation granularity of 8 (255 with no bound)."""
    if not min_blocks:
        return 255
    return min(255, 65536 // (min_blocks * 32 * warps_per_row) // 8 * 8)


def one_wave_min_blocks(grid: int, sm_count: int, warps_per_row: int) -> int:
    """The smallest ``MINB_VALUES`` entry (> 0) that fits a ``grid`` of CUDA blocks of ``32 * warps_per_row``
    threads on ``sm_count`` SMs at once (``ceil(grid / sm_count)`` blocks per SM), or 0 (no bound) when none does
    within the SM's 2048 threads and `MINB_REGISTER_FLOOR` registers per thread.
    Raises ValueError for a grid or SM count below 1."""
    if grid < 1 or sm_count < 1:
        raise ValueError(f"one_wave_min_blocks needs grid >= 1 and sm_count >= 1, got {grid} and {sm_count}")
    need = -(-int(grid) // int(sm_count))
    return next((m for m in MINB_VALUES if m >= need and m > 0 and m * 32 * warps_per_row <= MAX_THREADS_PER_SM
                 and min_blocks_registers(m, warps_per_row) >= MINB_REGISTER_FLOOR), 0)


def threads_per_block(warps_per_row: int) -> int:
    return 32 * warps_per_row


def _check_knobs(rows_per_block, warps_per_row, stage=0, min_blocks=0, fold=0, pdl=0) -> None:
    if min_blocks in MINB_VALUES and warps_per_row in WPR_VALUES and min_blocks * 32 * warps_per_row > MAX_THREADS_PER_SM:
        fits = [m for m in MINB_VALUES if m * 32 * warps_per_row <= MAX_THREADS_PER_SM]
        raise KernelConstraintError(
            f"min_blocks={min_blocks} with warps_per_row={warps_per_row} asks for {min_blocks * 32 * warps_per_row} "
            f"threads a SM, more than the {MAX_THREADS_PER_SM} an SM holds (ptxas would ignore the bound); allowed "
            f"here: {', '.join(map(str, fits))}"
        )
    if pdl not in PDL_VALUES:
        raise KernelConstraintError(f"pdl={pdl!r} is not supported; allowed: {', '.join(map(str, PDL_VALUES))}")
    if fold not in FOLD_VALUES:
        raise KernelConstraintError(f"fold={fold!r} is not supported; allowed: {', '.join(map(str, FOLD_VALUES))}")
    if min_blocks not in MINB_VALUES:
        raise KernelConstraintError(
            f"min_blocks={min_blocks!r} is not supported; allowed: {', '.join(map(str, MINB_VALUES))}"
        )
    if stage not in STAGE_VALUES:
        raise KernelConstraintError(f"stage={stage!r} is not supported; allowed: {', '.join(map(str, STAGE_VALUES))}")
    if rows_per_block not in RPB_VALUES:
        raise KernelConstraintError(
            f"rows_per_block={rows_per_block!r} is not supported; allowed: {', '.join(map(str, RPB_VALUES))}"
        )
    if warps_per_row not in WPR_VALUES:
        raise KernelConstraintError(
            f"warps_per_row={warps_per_row!r} is not supported; allowed: {', '.join(map(str, WPR_VALUES))}"
        )


def fold_refusal(qtype, *, mmvq: bool) -> str | None:
    """Why ``fold=1`` cannot run, in one sentence, or None: the one owner of FOLD's rules (`kernel_for` raises it;
    the gemv experiment asks first). A format outside ``FOLD_TYPES``, f32 x (the offset is folded into the int8
    dot products of the MMVQ kernel)."""
    name, unknown = _known_format(qtype)
    if unknown:
        return unknown
    if name not in FOLD_TYPES:
        return (f"fold=1 takes {', '.join(FOLD_TYPES)} (the formats with an offset subtracted from every stored q); "
                f"{name} has none, use fold=0")
    if not mmvq:
        return "fold=1 folds the offset into the dp4a dots of the MMVQ kernel: it needs Q8_1 x (MMVQ=1), not f32 x"
    return None


def stage_window_bytes(chunk_bytes: int) -> int:
    """Shared-memory bytes of one staged chunk: the 16-byte vectors covering ``chunk_bytes`` bytes that start at
    any even address (up to 14 bytes before the chunk's start fall in its first vector)."""
    return (chunk_bytes + 14 + 15) // 16 * 16


def stage_smem_bytes(qtype, rows_per_block: int, warps_per_row: int, glu: bool = False, stage: int = 2) -> int:
    """Static shared memory of a staged kernel: one `stage_window_bytes` window per warp, slot (``stage`` of
    them), weight and row."""
    fmt = block_format(qtype)
    chunk = 32 // _IMPLS[fmt.name][2] * fmt.type_size
    return warps_per_row * stage * rows_per_block * (1 + bool(glu)) * stage_window_bytes(chunk)


def stage_refusal(qtype, rows_per_block: int, warps_per_row: int, *, stage: int = 2, glu: bool = False, raw=None, nbytes: int | None = None, what: str = "raw") -> str | None:
    """Why ``stage`` (one of ``STAGE_VALUES`` above 0) cannot run with these knobs, in one sentence, or None: the
    one owner of STAGE's rules (`kernel_for`, `gemv_q` and `gemv_glu` raise it; the gemv experiment and the decode
    engine ask first). A format outside ``STAGE_TYPES``, windows over
    ``STAGE_SMEM_LIMIT``; with ``raw`` (a device array, named ``what``) or only its size ``nbytes``: W not a whole
    number of 16-byte vectors or, for ``raw``, not starting at a 16-byte aligned address (the copy's vector loads
    would fault or pass its end)."""
    name, unknown = _known_format(qtype)
    if unknown:
        return unknown
    if name not in STAGE_TYPES:
        return (f"stage={stage} takes the 2-byte-aligned formats {', '.join(STAGE_TYPES)}; {name} already loads its "
                "blocks with aligned words, use stage=0")
    need = stage_smem_bytes(name, rows_per_block, warps_per_row, glu, stage)
    if need > STAGE_SMEM_LIMIT:
        return (f"stage={stage} with rows_per_block={rows_per_block}, warps_per_row={warps_per_row}"
                f"{' and glu' if glu else ''} needs {need} bytes of shared memory for {name}, over the "
                f"{STAGE_SMEM_LIMIT}-byte static limit; use fewer rows, warps or stages")
    size = raw.size * raw.dtype.itemsize if raw is not None else nbytes
    address = _address(raw) % 16 if raw is not None else 0
    if size is not None and (size % 16 or address):
        return (f"stage={stage} reads {what} in 16-byte vectors: it must start at a 16-byte aligned address and be a "
                f"multiple of 16 bytes long, got {size} bytes" + (f" at address % 16 = {address}" if address else ""))
    return None
