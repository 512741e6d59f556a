"""The GPU side of `minfer ledger verify`: re-measures what a `minfer_cli.ledger.verify.Plan` asks for with the
record's protocol — an A/B through `measure_ab` (interleaved, the record's bar), a run or sweep point through
`measure_run`, a bench record through the engine's pp/tg tests with the same repetitions and model."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from minfer_cli.ledger.verify import Measured, Plan, min_rounds_for

Progress = Callable[[str, float], None]


def _quiet(_: str, __: float) -> None:
    return None


class HarnessRunner:
    """Runs plans on this machine's GPU. ``max_time_s``: an A/B's time budget (its adaptive stop usually ends it
    sooner, never before ``min_rounds`` rounds; None: the record's own rounds, see
    `minfer_cli.ledger.verify.min_rounds_for`); ``warmup_s``: warm-up seconds per arm; ``progress(text,
    fraction)`` is called along the way."""

    def __init__(self, *, max_time_s: float = 30.0, min_rounds: int | None = None, warmup_s: float = 1.0,
                 progress: Progress = _quiet) -> None:
        self.max_time_s, self.min_rounds, self.warmup_s, self.progress = max_time_s, min_rounds, warmup_s, progress
        self._device = None

    def device_name(self) -> str | None:
        from minfer_cli.measure.device import require_timing_device

        if self._device is None:
            self._device = require_timing_device()
        return self._device.name

    def run(self, plan: Plan) -> Measured:
        if plan.kind == "bench":
            return self._bench(plan)
        from minfer_cli.experiment import get
        from minfer_cli.measure.harness import measure_ab, measure_run, open_session
        from minfer_cli.measure.record import ab_record, run_record

        exp = get(str(plan.experiment))
        wl = exp.workload(plan.workloads[0])
        for config in plan.configs:
            problem = exp.refuse(config, wl)
            if problem:
                return Measured([], error=f"an arm cannot run today: {problem}")
        session = open_session(exp, wl, warmup_s=self.warmup_s, progress=self.progress)
        if plan.mode == "ab":
            result = measure_ab(session, list(plan.configs), bar=plan.bar, max_time_s=self.max_time_s,
                                min_rounds=min_rounds_for(plan, self.min_rounds), progress=self.progress)
            if result.verdict == "INVALID":
                errors = "; ".join(f"{a.label}: {a.error}" for a in result.arms if a.error)
                return Measured([], error=f"an arm is INVALID today ({errors})")
            rec = ab_record(result)
            return Measured(rec["arms"], rec["comparison"], rec)
        arms, last = [], None
        for label, config in zip(plan.labels, plan.configs):
            result = measure_run(session, config, progress=self.progress)
            if result.arm.status != "ok":
                return Measured([], error=f"{label} is INVALID today: {result.arm.error}")
            last = run_record(result)
            arms.append(dict(last["arms"][0], label=label))
        rec = dict(last or {}, arms=arms)
        return Measured(arms, None, rec)

    def _bench(self, plan: Plan) -> Measured:
        from minfer_cli.engine.bench import engine_options, parse_bench_test, run_pp, run_tg
        from minfer_cli.engine.presets import DEFAULT_PRESET, preset
        from minfer_cli.engine.record import bench_record
        from minfer_cli.engine.weights import load_gguf, synth_weights

        source = plan.source or ""
        if source.startswith("synth:"):
            seed = int(source.split(":", 1)[1] or 0)
            weights = synth_weights(preset(plan.preset or DEFAULT_PRESET), seed, progress=self.progress)
        elif source and Path(source).is_file():
            weights = load_gguf(source, progress=self.progress)
        else:
            return Measured([], error=f"the model {source or '(unrecorded)'} is not here")
        if plan.model and weights.describe() != plan.model:
            return Measured([], error=f"the recorded model {plan.model!r} is not the preset {plan.preset or DEFAULT_PRESET} "
                                      f"({weights.describe()})")
        config = dict(plan.configs[0])
        options = engine_options(config)
        rows = []
        for test in plan.labels:
            try:
                kind, count, depth = parse_bench_test(test)
            except ValueError as exc:
                return Measured([], error=str(exc))
            run, part = (run_pp, options.prefill) if kind == "pp" else (run_tg, options.decode)
            rows += run(weights, [count], plan.reps, part, 0, progress=self.progress, depths=(depth,))
        rec = bench_record(rows, weights, config, preset=(plan.preset or DEFAULT_PRESET) if source.startswith("synth:") else None)
        return Measured(rec["arms"], None, rec)

