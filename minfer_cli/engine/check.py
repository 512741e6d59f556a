"""`minfer model check`: the engine against the float64 reference forward (`minfer_cli.engine.reference`) on one
model, so that a user can see whether the numbers minfer benchmarks come from the model the file describes.

A random prompt of ``prompt`` tokens and ``steps`` continuation tokens (seeded). The engine prefills the prompt,
then decodes the continuation teacher-forced: step i is fed continuation token i (not the engine's own choice),
so every step's logits can be compared with the reference's logits at the same position of the same sequence.
The reference runs once over the whole sequence, streaming the weights layer by layer.

Per compared position: the relative L2 of the logits (what governs PASS/FAIL: random weights give near-tied
logits, where top-1 agreement means little), the top-1 of each side, the reference's top-1 minus top-2 margin,
max |engine - reference|, and the overlap of the two top-5 sets. A top-1 that differs where the reference's
margin is within a few typical logit errors is a near-tie, not a bug (`TIE_ERRORS`). Per layer: the relative L2 of the
prefill's residual stream after it, so a broken layer is named.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Callable, Optional

from minfer_cli.experiment import rel_l2

if TYPE_CHECKING:  # this module is imported by the CLI for its defaults: numpy and the engine load when used
    import numpy as np

    from minfer_cli.engine.options import EngineOptions
    from minfer_cli.engine.weights import ModelWeights

DEFAULT_TOLERANCE = 1e-2
"""Relative L2 of the logits at most, at the prefill and at every decode step (the numerical-truth bar)."""

TIE_ERRORS = 5.0
"""A top-1 flip is a near-tie when the reference's top-2 margin is at most this many RMS logit errors (two
independent errors of RMS e differ by more than ~4.2 e once in ~3,000 draws)."""

Progress = Optional[Callable[[str, float], None]]


@dataclass(frozen=True)
class Position:
    """One compared position: ``phase`` "prefill" (the prompt's last token) or "decode" (a teacher-forced step),
    its ``position`` in the sequence, ``rel_l2`` of the logits, the top-1 token of each side, the reference's
    top-1 minus top-2 ``margin``, ``max_abs`` = max |engine - reference|, ``rms_abs`` = its RMS over the vocabulary
    and ``top5`` = |top-5 ∩ top-5|."""

    phase: str
    position: int
    rel_l2: float
    top1_engine: int
    top1_reference: int
    margin: float
    max_abs: float
    rms_abs: float
    top5: int

    @property
    def top1_agrees(self) -> bool:
        return self.top1_engine == self.top1_reference

    @property
    def near_tie(self) -> bool:
        """The reference's margin is within `TIE_ERRORS` typical logit errors (RMS): either token is a faithful
        choice. (Against the largest error every flip would be a tie: a flip needs the margin below twice it.)"""
        return self.margin <= TIE_ERRORS * self.rms_abs


def compare(phase: str, position: int, got: "np.ndarray", want: "np.ndarray") -> Position:
    """The `Position` of engine logits ``got`` against reference logits ``want`` (both [vocab])."""
    import numpy as np

    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    order = np.argsort(want)
    finite = np.isfinite(got).all()
    top5_got = set(np.argsort(got)[-5:].tolist()) if finite else set()
    error = np.abs(got - want) if finite else np.full(want.shape, np.inf)
    return Position(phase, int(position), rel_l2(got, want), int(np.argmax(got)) if finite else -1,
                    int(order[-1]), float(want[order[-1]] - want[order[-2]]), float(error.max()),
                    float(np.sqrt(np.mean(error * error))), len(top5_got & set(order[-5:].tolist())))


@dataclass(frozen=True)
class CheckResult:
    """What `check` found: the model (``model``, its ``source``), the sequence (``prompt`` + ``steps`` tokens from
    ``seed``), the ``tolerance``, the compared ``positions``, the prefill's per-layer residual error ``layers``
    (index 0: after the embedding), the engine ``knobs``, and why decode was not compared (``decode_skipped``)."""

    model: str
    source: str
    prompt: int
    steps: int
    seed: int
    tolerance: float
    positions: list[Position]
    layers: list[float]
    knobs: dict = field(default_factory=dict)
    decode_skipped: str = ""

    @property
    def worst(self) -> float:
        return max(p.rel_l2 for p in self.positions)

    @property
    def passed(self) -> bool:
        return all(p.rel_l2 <= self.tolerance for p in self.positions)  # inf (a non-finite logit) fails

    @property
    def worst_layer(self) -> int:
        """The first layer (1-based; 0 = the embedding) whose residual error is the largest jump over the one
        before it: where an error enters."""
        if not self.layers:
            return -1
        jumps = [self.layers[0]] + [b - a for a, b in zip(self.layers, self.layers[1:])]
        return max(range(len(jumps)), key=jumps.__getitem__)

    def as_dict(self) -> dict:
        """Plain values for JSON and the ledger's ``check`` record."""
        decode = [p for p in self.positions if p.phase == "decode"]
        return {
            "model": self.model, "source": self.source, "prompt": self.prompt, "steps": self.steps,
            "seed": self.seed, "tolerance": self.tolerance, "passed": self.passed,
            "worst_rel_l2": self.worst,
            "prefill_rel_l2": self.positions[0].rel_l2,
            "steps_rel_l2": [p.rel_l2 for p in decode],
            "top1_agreement": sum(p.top1_agrees for p in self.positions) / len(self.positions),
            "top1_flips_outside_ties": sum(not p.top1_agrees and not p.near_tie for p in self.positions),
            "top5_overlap_min": min(p.top5 for p in self.positions),
            "layers_rel_l2": self.layers,
            "positions": [asdict(p) for p in self.positions],
            "decode_skipped": self.decode_skipped,
        }


def check(weights: "ModelWeights", options: "EngineOptions", prompt: int = 32, steps: int = 8, seed: int = 0,
          tolerance: float = DEFAULT_TOLERANCE, knobs: Optional[dict] = None, progress: Progress = None) -> CheckResult:
    """Run the engine's prefill of ``prompt`` random tokens and ``steps`` teacher-forced decode steps, and the
    streaming float64 reference over the same sequence; compare them (see the module docstring).

    Raises ModelError for a model the engine cannot run (the message names why) and ValueError for prompt < 1 or
    steps < 0. A model whose decode the engine cannot run (a GQA group above the decode kernel's limit, a tensor
    type the mat-vecs do not cover) is compared at the prefill only, and ``decode_skipped`` says why.
    """
    import numpy as np
    from numba import cuda

    from minfer_cli.engine.decode import DecodeEngine
    from minfer_cli.engine.errors import ModelError
    from minfer_cli.engine.forward import PrefillEngine
    from minfer_cli.engine.reference import Reference

    if prompt < 1 or steps < 0:
        raise ValueError(f"a check needs prompt >= 1 and steps >= 0, got {prompt} and {steps}")
    c = weights.config
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, c.vocab, size=prompt + steps, dtype=np.int32)
    report = progress or (lambda _text, _fraction: None)

    report("engine prefill", 0.0)
    # the prefill taps every layer, which runs eagerly whatever PGRAPH says (a replayed graph is the same kernels on
    # the same buffers: tests/test_engine.py holds them bit-identical on the GPU)
    pre = PrefillEngine(weights, prompt, replace(options.prefill, pgraph=False), context=prompt + steps)
    taps: list = []
    got = [pre.prefill(cuda.to_device(tokens[:prompt]), taps=taps).copy_to_host(stream=pre.stream)[0]]
    pre.stream.synchronize()
    skipped = ""
    if steps:
        try:
            dec = DecodeEngine(weights, options=options.decode, prefill=pre)
        except ModelError as exc:
            skipped = str(exc)
        else:
            for i in range(steps):  # teacher-forced: continuation token i, whatever the engine would have chosen
                report(f"engine decode step {i + 1}/{steps}", (i + 1) / (steps + 1) * 0.2)
                dec.start(int(tokens[prompt + i]), prompt + i)
                got.append(dec.step().copy_to_host(stream=dec.stream))
                dec.stream.synchronize()
    compared = prompt + (steps if not skipped else 0)
    reference = Reference(weights, keep=False, progress=lambda text, f: report(text, 0.2 + 0.75 * f))
    states = reference.hidden_states(tokens[:compared])
    want = reference.logits(states[-1][prompt - 1:compared])
    positions = [compare("prefill" if i == 0 else "decode", prompt - 1 + i, g, w) for i, (g, w) in enumerate(zip(got, want))]
    layers = [rel_l2(tap, state[:prompt]) for tap, state in zip(taps, states)]
    report("done", 1.0)
    return CheckResult(weights.describe(), weights.source, prompt, steps, int(seed), float(tolerance), positions,
                       layers, dict(knobs or {}), skipped)
