"""Which `kernels.gemv` kernel each decode mat-vec runs: its input form (f32 or Q8_1 blocks) and launch shape.

`GemvPolicy.config` is the one place that decides; `minfer_cli.engine.decode.DecodeEngine` asks it once per
(weight, role) and reuses the answer on every step. The shapes are the fastest measured for each input form (the
ledger holds the sweeps): f32 x two rows and two warps a row; Q8_1 x (MMVQ) four rows and two warps a row, except
Q4_K with many rows (``WIDE_ROWS``: ffn_gate/ffn_up, the vocabulary head), where one warp per 8 rows wins (on fewer
rows that shape leaves too few warps for the SMs); more warps a row did not pay in general. Long rows
(id >= ``DEEP_COLS``: ffn_down) with DEEP=1: four warps a row, compiled for the grid's one wave (MINB,
`kernels.gemv.one_wave_min_blocks`), and for Q6_K the per-warp cp.async ring (STAGE=2) with the offset fold
(FOLD=1): the combination that pays there. Few rows (od <= ``FEW_ROWS``: the 1.5B's q|k|v and attention output,
the 7B's v in the layers where it is Q6_K and q|k Q4_K) with FEW_ROWS=1: two rows a block, twice the blocks of the
general shape for the SMs. Q6_K matrices of at least ``WIDE_ROWS`` rows (the vocabulary head) with WIDE_RING=1:
`GEMV_MMVQ_WIDE_RING`, the ring and the offset fold at the general shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from minfer_cli.engine.options import DecodeOptions

GEMV_F32 = {"rows_per_block": 2, "warps_per_row": 2}
GEMV_MMVQ = {"rows_per_block": 4, "warps_per_row": 2}
GEMV_MMVQ_WIDE = {"rows_per_block": 8, "warps_per_row": 1}
"""`GEMV_MMVQ_WIDE`: Q4_K matrices of at least ``WIDE_ROWS`` rows (ffn_gate/ffn_up, the vocabulary head)."""
WIDE_ROWS = 8192
GEMV_MMVQ_DEEP = {"Q4_K": {"rows_per_block": 4, "warps_per_row": 4},
                  "Q6_K": {"rows_per_block": 4, "warps_per_row": 4, "stage": 2, "fold": 1}}
"""`GEMV_MMVQ_DEEP` (DEEP=1): format -> the launch of its matrices of at least ``DEEP_COLS`` columns (ffn_down),
plus MINB for one wave."""
DEEP_COLS = 8192
GEMV_MMVQ_FEW = {"rows_per_block": 2, "warps_per_row": 2}
"""`GEMV_MMVQ_FEW` (FEW_ROWS=1): MMVQ matrices of at most ``FEW_ROWS`` rows (the 1.5B's stacked q|k|v, 2048 rows,
and attention output, 1536): twice the CUDA blocks of the general shape, so a small grid reaches more SMs' worth of
warps (the gemv sweeps of those shapes in the ledger)."""
FEW_ROWS = 2048
GEMV_MMVQ_WIDE_RING = {"Q6_K": {"rows_per_block": 4, "warps_per_row": 2, "stage": 2, "fold": 1}}
"""`GEMV_MMVQ_WIDE_RING` (WIDE_RING=1): format -> the launch of its matrices of at least ``WIDE_ROWS`` rows (the Q6_K
vocabulary head): the general shape with the per-warp cp.async ring (STAGE=2) and the offset fold (FOLD=1)."""


@dataclass(frozen=True)
class GemvOperand:
    """One mat-vec weight: a GGUF tensor's raw bytes on the device (uint8), its type name and [od, id]."""

    raw: object
    qtype: str
    od: int
    id: int


def sm_count() -> int:
    """SMs of the current device (1 in the CUDA simulator, whose device has no such attribute)."""
    from numba import cuda

    return int(getattr(cuda.get_current_device(), "MULTIPROCESSOR_COUNT", 1))


class GemvPolicy:
    """The decode options' mat-vec choices. ``options``: mmvq (Q8_1 input for `kernels.gemv.MMVQ_TYPES`), xres
    (compensated Q8_1), deep (`GEMV_MMVQ_DEEP` for long rows), pdl (every kernel a programmatic dependent launch),
    ahead (with pdl: chunks each warp prefetches into L2 before its wait, `kernels.gemv.GemvConfig.lookahead`; the
    ring's launches keep their own prologue).
    rows_per_block / warps_per_row: override every shape's (None: the table's)."""

    def __init__(self, options: DecodeOptions, rows_per_block: Optional[int] = None,
                 warps_per_row: Optional[int] = None):
        override = {k: int(v) for k, v in (("rows_per_block", rows_per_block), ("warps_per_row", warps_per_row))
                    if v is not None}
        override["pdl"] = int(options.pdl)
        if options.pdl and options.ahead > 1:
            override["lookahead"] = int(options.ahead)
        self.options, self.override = options, override
        self._f32 = {**GEMV_F32, **override}
        self._mmvq = {**GEMV_MMVQ, **override}
        self._wide = {**GEMV_MMVQ_WIDE, **override}
        self._few = {**GEMV_MMVQ_FEW, **override}
        self.deep_launches: dict[tuple, dict | None] = {}  # (format, od, weight) -> DEEP=1 launch knobs or None
        self.ring_launches: dict[tuple, dict | None] = {}  # (format, weight) -> WIDE_RING=1 launch knobs or None
        self._configs: dict[tuple, object] = {}  # (format, launch shape, x form, glu, residual) -> GemvConfig

    def deep_launch(self, m: GemvOperand) -> dict | None:
        """DEEP=1's launch knobs for ``m``: `GEMV_MMVQ_DEEP` of its format and MINB for the grid's one wave
        (qwen2-7b's ffn_down on 132 SMs: 896 blocks, MINB=7, 72 registers). None (the general shape) when m's format
        has no deep launch, when its ring (STAGE=2) cannot take m's bytes (`kernels.gemv.GemvConfig` and its
        `weight_refusal`), or when no bound of at least `kernels.gemv.MINB_REGISTER_FLOOR` registers fits the grid
        in one wave (llama 7B/8B's od 4096 would need MINB=8, 64 registers and spills; unbounded, RPB=4, WPR=4 is
        slower than the general shape)."""
        key = (m.qtype, m.od, id(m.raw))
        if key not in self.deep_launches:
            from kernels.gemv import one_wave_min_blocks

            launch = self._launch(m, GEMV_MMVQ_DEEP)
            if launch is not None:
                grid = -(-m.od // launch["rows_per_block"])
                launch["min_blocks"] = one_wave_min_blocks(grid, sm_count(), launch["warps_per_row"])
                if not launch["min_blocks"] or self._refusal(m, launch) is not None:
                    launch = None
            self.deep_launches[key] = launch
        return self.deep_launches[key]

    def ring_launch(self, m: GemvOperand) -> dict | None:
        """WIDE_RING=1's launch knobs for ``m``: `GEMV_MMVQ_WIDE_RING` of its format, or None (the general shape)
        when its format has none or its ring (STAGE=2) cannot take m's bytes (`kernels.gemv.GemvConfig`'s
        `weight_refusal`: a whole number of 16-byte vectors at a 16-byte aligned address)."""
        key = (m.qtype, id(m.raw))
        if key not in self.ring_launches:
            launch = self._launch(m, GEMV_MMVQ_WIDE_RING)
            self.ring_launches[key] = None if launch is None or self._refusal(m, launch) is not None else launch
        return self.ring_launches[key]

    def _launch(self, m: GemvOperand, table: dict) -> dict | None:
        """``table``'s launch knobs for m's format with the policy's overrides, or None where it has none; a ring's
        launch (STAGE) drops AHEAD's lookahead: the ring prefetches its own first chunks."""
        launch = table.get(m.qtype)
        if launch is None:
            return None
        launch = {**launch, **self.override}
        if launch.get("stage"):
            launch.pop("lookahead", None)
        return launch

    @staticmethod
    def _refusal(m: GemvOperand, launch: dict) -> str | None:
        """Why m's bytes cannot feed the MMVQ kernel of ``launch``, or None."""
        from kernels.errors import KernelConstraintError
        from kernels.gemv import GemvConfig

        try:
            return GemvConfig(m.qtype, mmvq=True, **launch).weight_refusal(m.raw)
        except KernelConstraintError as e:
            return str(e)

    def config(self, m: GemvOperand, q8: bool, wide: bool, glu: bool = False, residual: bool = False):
        """The `kernels.gemv.GemvConfig` for weight ``m``: an MMVQ kernel when ``q8`` (the input's Q8_1 blocks
        exist: MMVQ on and a width of whole blocks) and m's format has one (``wide``: the one-warp-per-8-rows shape
        for Q4_K with at least WIDE_ROWS rows; with DEEP=1, `deep_launch` for the formats of `GEMV_MMVQ_DEEP` with at
        least DEEP_COLS columns, not GLU; with WIDE_RING=1, `ring_launch` for the formats of `GEMV_MMVQ_WIDE_RING` with
        at least WIDE_ROWS rows, not GLU; with FEW_ROWS=1, `GEMV_MMVQ_FEW` for at most FEW_ROWS rows, not GLU), else
        the f32-input kernel and shape; ``glu``: the SwiGLU kernel; ``residual``: the fused-add epilogue. The
        config's ``mmvq`` says which input the caller passes. Each configuration is made once."""
        from kernels.gemv import MMVQ_TYPES, GemvConfig

        mmvq = q8 and m.qtype in MMVQ_TYPES
        if not mmvq:
            launch = self._f32
        elif wide and m.qtype == "Q4_K" and m.od >= WIDE_ROWS:
            launch = self._wide
        elif (self.options.wide_ring and m.od >= WIDE_ROWS and not glu
              and (ring := self.ring_launch(m)) is not None):
            launch = ring
        elif self.options.deep and m.id >= DEEP_COLS and not glu and (deep := self.deep_launch(m)) is not None:
            launch = deep
        elif self.options.few_rows and m.od <= FEW_ROWS and not glu:
            launch = self._few
        else:
            launch = self._mmvq
        key = (m.qtype, id(launch), mmvq, glu, residual)
        config = self._configs.get(key)
        if config is None:
            config = self._configs[key] = GemvConfig(m.qtype, mmvq=mmvq, glu=glu, residual=residual,
                                                     xres=mmvq and self.options.xres, **launch)
        return config
