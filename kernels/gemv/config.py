"""The gemv kernels' configuration (`kernels.gemv`): `GemvConfig`, one frozen value per specialised kernel.

A `GemvConfig` lists the format, the kernel's facts (x form, GLU, residual) and its knobs, each field with its
allowed values, default and the reason for it; it refuses an impossible combination when it is made (one sentence
naming the conflict and what would be right), generates the gemv experiment's knob table (`GemvConfig.knob_specs`)
and is the key of the compile cache (`kernels.gemv.launch.kernel_for`): every field is a compile-time constant.
What W's bytes must satisfy for a configuration (the ring's 16-byte vectors) is `GemvConfig.weight_refusal`.
This module imports no numba (its format facts come from `kernels.gemv.tables`), so the knob table can be listed
without compiling anything.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

import numpy as np

from kernels.errors import KernelConstraintError
from kernels.gemv.tables import FOLD_TYPES, GEMV_TYPES, LANES_PER_BLOCK, STAGE_TYPES, _format_name
from kernels.quant.formats import block_format


RPB_VALUES = (1, 2, 4, 8)
WPR_VALUES = (1, 2, 4, 8)
STAGE_VALUES = (0, 2, 3, 4)
FOLD_VALUES = (0, 1)
PDL_VALUES = (0, 1)
AHEAD_VALUES = (1, 2, 4, 8)
MINB_VALUES = (0, 1, 2, 4, 7, 8, 14, 16)
STAGE_SMEM_LIMIT = 48 * 1024
"""Bytes of static shared memory a staged kernel may use (CUDA's static limit): its windows are
``WPR * STAGE * RPB * (2 with GLU) * window`` bytes (`stage_smem_bytes`)."""
MAX_THREADS_PER_SM = 2048
"""Resident threads an sm_90 SM holds: MINB * 32 * WPR above it is refused (ptxas ignores such a bound)."""
MINB_REGISTER_FLOOR = 72
"""`one_wave_min_blocks` bounds no kernel below this many registers per thread: the tightest bound measured
faster; tighter ones spill hundreds of bytes."""


def _knob(name: str | None, values: tuple, doc: str, default: Any) -> Any:
    """A `GemvConfig` field: its experiment knob ``name`` (None: a fact of the call, not a knob), allowed values and
    one-line doc in the field's metadata."""
    return field(default=default, metadata={"knob": name, "values": values, "doc": doc})


@dataclass(frozen=True)
class GemvConfig:
    """One gemv kernel: W's format, the facts of the call it serves and its knobs; hashable, the compile-cache key.

    Raises KernelConstraintError (one sentence) for a value outside a field's allowed set or an impossible
    combination: MMVQ for a format without an int8 kernel, GLU with a residual, STAGE for a format or shape it
    cannot take, FOLD without Q8_1 x or for a format without Q6_K's offset, XRES without Q8_1 x, MINB beyond the
    SM's threads.
    """

    qtype: str = field(metadata={"knob": "TYPE", "values": GEMV_TYPES, "default": "Q4_K",
                                 "doc": "GGUF format of W (selects the block decoder)"})
    """W's GGUF format: a name ("Q4_K"), a ``gguf.GGMLQuantizationType`` member or its value; stored as the name."""
    rows_per_block: int = _knob("RPB", RPB_VALUES, "rows per CUDA block, decoded together by every warp (x reuse)", 4)
    """Rows per CUDA block (= rows each warp decodes at once, sharing its x registers); 4 by default, the best
    general shape of the Q8_1-x kernels."""
    warps_per_row: int = _knob("WPR", WPR_VALUES, "warps per row (split of each row's blocks); threads = 32*WPR", 4)
    """Warps per row (each takes every WPR-th chunk of the row); threads per block = 32 * WPR."""
    stage: int = _knob("STAGE", STAGE_VALUES, "shared slots per warp that chunks pass through: 2-4 a cp.async ring "
                       "(STAGE-1 chunks ahead); 2-byte-aligned TYPEs", 0)
    """Shared-memory slots per warp that W's chunks pass through before they are decoded, for the 2-byte-aligned
    formats ``STAGE_TYPES``, whose decode otherwise issues one 2-byte global load per halfword; 0: decode straight
    from global memory. 2, 3, 4: a ring of that many slots filled by ``cp.async`` (`_ring_loop`): the copies of the
    next STAGE - 1 chunks are in flight while the warp decodes the current one, without holding registers. 0 by
    default: alone the ring is slower; it pays with FOLD=1, four warps a row and one-wave launch bounds (the decode
    engine's DEEP launch for Q6_K)."""
    min_blocks: int = _knob("MINB", MINB_VALUES, "CUDA blocks per SM to compile for (launch bounds: registers <= "
                            "65536 / (MINB*32*WPR)); 0: no bound", 0)
    """CUDA blocks per SM the kernel is compiled to fit (the second number of ``__launch_bounds__``, which caps the
    registers per thread at what that many blocks of ``32 * WPR`` threads leave: `min_blocks_registers`); 0: no
    bound, ptxas's own register count. A grid of few CUDA blocks (ffn_down: 3584 rows / RPB) runs in one wave only
    if they all fit at once (`one_wave_min_blocks`); 0 by default because a bound pays only there."""
    fold: int = _knob("FOLD", FOLD_VALUES, "1: Q6_K MMVQ's -32 offset as -32*Σx once per chunk, starting each plane's "
                      "dp4a chain (no add+xor a word)", 0)
    """1: Q6_K's MMVQ dot takes its -32 offset from the x loader: per plane ``-32 * Σx`` of the lane's 8 x values,
    once per chunk for all RPB rows (`_xq_k_planes_fold`), starts the plane's dp4a chain over the stored 6-bit q,
    instead of an add and an xor on every word of every row (`_mathq_q6_k_fold`). Bit-identical (the same integer
    sums). 0 by default: fewer instructions per warp, but slower at the best shape without the ring."""
    pdl: int = _knob("PDL", PDL_VALUES, "1: programmatic dependent launch: each launch may start before the previous "
                     "one ends, touching only W until that one has completed (griddepcontrol; overlaps only within a "
                     "batch of launches)", 0)
    """1: programmatic dependent launch (`kernels.launch`): the kernel lets the next one start early
    (`kernels.ptx.griddepcontrol_launch_dependents` first thing) and is itself launched with programmatic stream
    serialization, so its CUDA blocks take the SM slots the previous kernel's last blocks leave; before it waits for
    that kernel (`kernels.ptx.griddepcontrol_wait`) it touches only W: the ring's first copies (STAGE 2..4), else an
    L2 prefetch of its warp's first chunk (`_lookahead`). x, the residual and y come after the wait. Needs a stream
    other than 0, hence 0 by default here (the decode engine launches with 1)."""
    lookahead: int = _knob("AHEAD", AHEAD_VALUES, "PDL=1 without STAGE: each warp's first AHEAD chunks prefetched "
                           "into L2 before the wait for the previous kernel (1: the first chunk)", 1)
    """With PDL=1 and no ring: before `kernels.ptx.griddepcontrol_wait` each warp prefetches into L2 the chunks
    its loop takes first, AHEAD of them (chunks warp, warp + WPR, ...: `_lookahead` each), so that while the
    previous kernel finishes (a decode step's kernels are short and wait on each other) the memory system already
    streams this one's weights. 1 by default (one chunk, the original PDL prologue); a CUDA block whose rows
    span fewer chunks prefetches those."""
    glu: bool = _knob("GLU", (0, 1), "1: gate and up weights in one kernel, y = silu(W·x) * (W_up·x) (decode's "
                      "FUSE_GLU)", False)
    """The two-weight SwiGLU kernel of `gemv_glu` (gate and up of one format and shape; no residual)."""
    mmvq: bool = _knob("MMVQ", (0, 1), "1: x as Q8_1 int8 blocks and dp4a dots (Q4_K, Q6_K, Q8_0); 0: f32 x, f32 "
                       "FMAs", False)
    """x given as Q8_1 blocks (`kernels.quantize_q8.Q8Blocks`): the int8 dp4a kernel, formats ``MMVQ_TYPES``."""
    xres: bool = _knob("XRES", (0, 1), "1 (with MMVQ=1): x in compensated Q8_1, a second int8 value per element "
                       "holding the first rounding's residual at d/254 (x ~ d*(q + r/254)); one more dp4a a word", False)
    """x given as compensated Q8_1 blocks (`kernels.quantize_q8`, ``Q8Blocks.r``): each dot runs a second dp4a
    chain over the residual values with the same decoded weights (`kernels.gemv.dots_q8`), so the int8 rounding
    error of x drops by a factor of 254 (to ~ the f32-x kernel's) for one more dp4a per weight word and x's bytes
    read twice (x is shared by every row of a CUDA block)."""
    residual: bool = _knob(None, (False, True), "fused y += residual in the epilogue", False)
    """The epilogue adds a residual vector (`gemv_q`'s ``residual``)."""

    def __post_init__(self) -> None:
        for f in fields(self)[1:]:  # every field but qtype: a flag or an integer from its allowed values
            value, allowed = getattr(self, f.name), tuple(int(a) for a in f.metadata["values"])
            if not isinstance(value, (numbers.Integral, np.bool_)) or int(value) not in allowed:
                raise KernelConstraintError(f"{f.name}={value!r} is not supported; allowed: "
                                            f"{', '.join(map(str, allowed))}")
            object.__setattr__(self, f.name, bool(value) if f.type == "bool" else int(value))
        object.__setattr__(self, "qtype", _format_name(self.qtype, self.mmvq))
        reason = self._combination_refusal()
        if reason:
            raise KernelConstraintError(reason)

    def _combination_refusal(self) -> str | None:
        wpr, minb = self.warps_per_row, self.min_blocks
        if minb * 32 * wpr > MAX_THREADS_PER_SM:
            fits = [m for m in MINB_VALUES if m * 32 * wpr <= MAX_THREADS_PER_SM]
            return (f"min_blocks={minb} with warps_per_row={wpr} asks for {minb * 32 * wpr} threads a SM, more than "
                    f"the {MAX_THREADS_PER_SM} an SM holds (ptxas would ignore the bound); allowed here: "
                    f"{', '.join(map(str, fits))}")
        if self.glu and self.residual:
            return "the SwiGLU kernel (glu) has no residual epilogue"
        if self.stage:
            if self.qtype not in STAGE_TYPES:
                return (f"stage={self.stage} takes the 2-byte-aligned formats {', '.join(STAGE_TYPES)}; {self.qtype} "
                        "already loads its blocks with aligned words, use stage=0")
            need = self.smem_bytes
            if need > STAGE_SMEM_LIMIT:
                return (f"stage={self.stage} with rows_per_block={self.rows_per_block}, warps_per_row={wpr}"
                        f"{' and glu' if self.glu else ''} needs {need} bytes of shared memory for {self.qtype}, over "
                        f"the {STAGE_SMEM_LIMIT}-byte static limit; use fewer rows, warps or stages")
        if self.fold:
            if self.qtype not in FOLD_TYPES:
                return (f"fold=1 takes {', '.join(FOLD_TYPES)} (the formats with an offset subtracted from every "
                        f"stored q); {self.qtype} has none, use fold=0")
            if not self.mmvq:
                return ("fold=1 folds the offset into the dp4a dots of the MMVQ kernel: it needs Q8_1 x (MMVQ=1), "
                        "not f32 x")
        if self.lookahead > 1 and (not self.pdl or self.stage):
            return (f"lookahead={self.lookahead} is PDL's prefetch before the wait (pdl=1) of a kernel without the ring "
                    f"(stage=0; the ring starts its own copies there): got pdl={self.pdl}, stage={self.stage}; use "
                    f"lookahead=1")
        if self.xres and not self.mmvq:
            return "xres=1 is a form of the Q8_1 x of the MMVQ kernel: it needs mmvq=1 (f32 x has no int8 rounding)"
        return None

    @property
    def threads(self) -> int:
        """Threads per CUDA block: 32 * WPR."""
        return threads_per_block(self.warps_per_row)

    @property
    def smem_bytes(self) -> int:
        """Static shared memory of the ring's windows (0 without STAGE; `stage_smem_bytes`)."""
        return stage_smem_bytes(self.qtype, self.rows_per_block, self.warps_per_row, self.glu, self.stage) \
            if self.stage else 0

    def grid(self, od: int) -> int:
        """CUDA blocks for ``od`` rows."""
        return -(-od // self.rows_per_block)

    def weight_refusal(self, raw=None, *, nbytes: int | None = None, what: str = "raw") -> str | None:
        """Why W cannot feed this kernel, in one sentence, or None: with STAGE, W (``raw``, a device array named
        ``what``, or only its size ``nbytes``) must be a whole number of 16-byte vectors and, for ``raw``, start at
        a 16-byte aligned address (the ring's vector copies would fault or pass its end)."""
        if not self.stage:
            return None
        from kernels.quant.dequant import _address  # numba: only when a device array is checked

        size = raw.size * raw.dtype.itemsize if raw is not None else nbytes
        address = _address(raw) % 16 if raw is not None else 0
        if size is not None and (size % 16 or address):
            return (f"stage={self.stage} reads {what} in 16-byte vectors: it must start at a 16-byte aligned address "
                    f"and be a multiple of 16 bytes long, got {size} bytes"
                    + (f" at address % 16 = {address}" if address else ""))
        return None

    @classmethod
    def knob_specs(cls) -> tuple[tuple[str, tuple, Any, str], ...]:
        """(name, allowed values, default, doc) of every field that is an experiment knob, in field order, with
        integer values (the gemv experiment's knobs: `experiments.gemv`)."""
        out = []
        for f in fields(cls):
            name = f.metadata["knob"]
            if name is None:
                continue
            values = tuple(f.metadata["values"])
            default = f.metadata.get("default", f.default)
            out.append((name, values, int(default) if isinstance(default, bool) else default, f.metadata["doc"]))
        return tuple(out)

    @classmethod
    def from_knobs(cls, knobs: Mapping[str, Any], **facts: Any) -> "GemvConfig":
        """The configuration of an experiment knob dict (TYPE, RPB, ...; missing knobs take their defaults) and
        the facts not among the knobs (``residual``)."""
        by_knob = {f.metadata["knob"]: f.name for f in fields(cls) if f.metadata["knob"]}
        values = {by_knob[k]: v for k, v in knobs.items() if k in by_knob}
        values.setdefault("qtype", fields(cls)[0].metadata["default"])
        return cls(**values, **facts)

    def knob_values(self) -> dict[str, Any]:
        """This configuration as experiment knobs (the inverse of `from_knobs`, integers for flags)."""
        return {f.metadata["knob"]: (int(v) if isinstance(v := getattr(self, f.name), bool) else v)
                for f in fields(self) if f.metadata["knob"]}


DEFAULT_RPB = GemvConfig.__dataclass_fields__["rows_per_block"].default
DEFAULT_WPR = GemvConfig.__dataclass_fields__["warps_per_row"].default


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


def stage_window_bytes(chunk_bytes: int) -> int:
    """Shared-memory bytes of one staged chunk: the 16-byte vectors covering ``chunk_bytes`` bytes that start at
    any even address (up to 14 bytes before the chunk's start fall in its first vector)."""
    return (chunk_bytes + 14 + 15) // 16 * 16


def stage_smem_bytes(qtype, rows_per_block: int, warps_per_row: int, glu: bool = False, stage: int = 2) -> int:
    """Static shared memory of a staged kernel: one `stage_window_bytes` window per warp, slot (``stage`` of
    them), weight and row."""
    fmt = block_format(qtype)
    chunk = 32 // LANES_PER_BLOCK[fmt.name] * fmt.type_size
    return warps_per_row * stage * rows_per_block * (1 + bool(glu)) * stage_window_bytes(chunk)
