"""Ledger records built from harness results (the schema lives in `minfer_cli/ledger.py`)."""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict

from minfer_cli.knobs import format_config
from minfer_cli.ledger.schema import SAMPLES_MAX, SCHEMA
from minfer_cli.measure import environment as envmod
from minfer_cli.measure.harness import ABResult, ArmOutcome, CalibrationResult, RunResult, Session


def _round(x, digits=6):
    return None if x is None else float(round(float(x), digits))


def arm_entry(arm: ArmOutcome) -> dict:
    stats = None
    if arm.stats is not None:
        s = arm.stats
        stats = {"median": _round(s.median, 4), "p10": _round(s.p10, 4), "p90": _round(s.p90, 4),
                 "mean": _round(s.mean, 4), "std": _round(s.std, 4), "n": int(s.n), "throttled": int(s.throttled)}
    fig = arm.figures
    return {
        "label": arm.label,
        "knobs": dict(arm.config),
        "status": arm.status,
        "error": arm.error,
        "parity_error": _round(arm.parity_error, 9),
        "tolerance": _round(arm.tolerance, 9),
        "stats": stats,
        "tflops": _round(fig.tflops, 3) if fig else None,
        "gbps": _round(fig.gbps, 2) if fig else None,
        "pct_roofline": _round(fig.pct_roofline, 2) if fig and fig.pct_roofline is not None else None,
        "timing": arm.timing.describe() if arm.timing else None,
        "samples": [_round(v, 4) for v in arm.samples[:SAMPLES_MAX]],
    }


def _environment(session: Session, end: envmod.GpuState | None) -> dict:
    return {
        "device": session.device.as_dict(),
        "ceilings": asdict(session.ceilings) if session.ceilings else None,
        "gpu_start": envmod.gpu_state_dict(session.env_start),
        "gpu_end": envmod.gpu_state_dict(end) if end else None,
    }


def _common(session: Session, kind: str, title: str, notes: str, arms: list[ArmOutcome], end) -> dict:
    exp, wl = session.experiment, session.workload
    return {
        "schema": SCHEMA,
        "title": title,
        "timestamp": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "kind": kind,
        "experiment": exp.name,
        "workload": {"name": wl.name, "shape": dict(wl.shape)},
        "metric": {"name": exp.metric.name, "unit": exp.metric.unit, "higher_is_better": exp.metric.higher_is_better},
        "arms": [arm_entry(a) for a in arms],
        "timing": {"ring": session.plan.mode, "ring_sets": session.plan.sets,
                   "set_mib": round(session.plan.set_bytes / 2**20, 3)},
        "environment": _environment(session, end),
        "software": envmod.software_versions() | {"cuda_driver": session.device.driver_version,
                                                 "cuda_runtime": session.device.runtime_version},
        "git": envmod.git_state(),
        "command": envmod.command_line(),
        "notes": notes or "",
    }


def ab_record(result: ABResult, title: str | None = None, notes: str = "") -> dict:
    session = result.session
    a, b = result.arms[0].config, result.arms[1].config
    differing = [k for k in a if a[k] != b.get(k)] or list(a)
    title = title or (f"{session.experiment.name} {session.workload.name}: "
                      f"{format_config({k: a[k] for k in differing})} vs {format_config({k: b[k] for k in differing})}")
    rec = _common(session, "ab", title, notes, result.arms, result.env_end)
    c = result.comparison
    rec["comparison"] = None if c is None else {
        "delta": _round(c.delta), "ci_low": _round(c.ci_low), "ci_high": _round(c.ci_high),
        "p_value": _round(c.p_value, 8), "rounds": int(c.rounds),
        "stop_reason": result.stop_reason, "throttled_rounds": int(result.throttled_rounds),
    }
    rec["bar"] = float(result.bar)
    rec["verdict"] = result.verdict
    return rec


def run_record(result: RunResult, title: str | None = None, notes: str = "") -> dict:
    session = result.session
    title = title or f"{session.experiment.name}: {format_config(result.arm.config)}"
    rec = _common(session, "run", title, notes, [result.arm], result.env_end)
    rec["comparison"] = None
    rec["bar"] = 0.0
    rec["verdict"] = "MEASURED" if result.arm.status == "ok" else "INVALID"
    return rec


def calibration_record(result: CalibrationResult, bar: float, title: str | None = None, notes: str = "") -> dict:
    session = result.session
    title = title or f"{session.experiment.name}: A/A calibration of {format_config(result.config)}"
    last = result.trials[-1]
    rec = _common(session, "calibrate", title, notes, last.arms, last.env_end)
    rec["comparison"] = None
    rec["bar"] = float(bar)
    rec["verdict"] = "MEASURED" if result.summary is not None else "INVALID"
    rec["calibration"] = None if result.summary is None else {
        **{k: (_round(v) if isinstance(v, float) else v) for k, v in asdict(result.summary).items()},
        "trial_deltas": [_round(t.comparison.delta) for t in result.trials if t.comparison],
        "trial_verdicts": [t.verdict for t in result.trials],
    }
    return rec


def sweep_ranking(experiment, outcomes: list[ArmOutcome]) -> list[ArmOutcome]:
    """``outcomes`` best first, invalid points last. Points that differ in a knob that changes the work itself
    (`Experiment.work_knobs`: gemv's TYPE, dequant's TYPE) are ranked by throughput (GB/s when the experiment
    reports bytes, else TFLOP/s): their times measure different tasks. Otherwise by the metric in its direction
    (the lowest time, the highest rate)."""
    valid = [a for a in outcomes if a.stats is not None]
    invalid = [a for a in outcomes if a.stats is None]
    varied = {k for a in valid for k in a.config if a.config[k] != valid[0].config[k]} if valid else set()
    if varied & set(getattr(experiment, "work_knobs", ())) and all(a.figures is not None for a in valid):
        rate = "gbps" if any(a.figures.gbps for a in valid) else "tflops"
        return sorted(valid, key=lambda a: -(getattr(a.figures, rate) or 0.0)) + invalid
    higher = experiment.metric.higher_is_better
    return sorted(valid, key=lambda a: -a.stats.median if higher else a.stats.median) + invalid


def sweep_record(session: Session, outcomes: list[ArmOutcome], end, title: str | None = None, notes: str = "",
                 default_label: str | None = None) -> dict:
    """One record for a whole grid: every point as an arm; `best` names the fastest valid point (by throughput
    when the points do different work, as `minfer sweep` ranks them) and `default` the point with the experiment's
    default knobs (``default_label``), when the sweep measured it."""
    exp = session.experiment
    varied = sorted({k for a in outcomes for k in a.config if a.config[k] != outcomes[0].config[k]})
    title = title or f"{exp.name} sweep over {', '.join(varied) or 'one point'}"
    rec = _common(session, "sweep", title, notes, outcomes, end)
    valid = [a for a in outcomes if a.stats is not None]
    best = sweep_ranking(exp, valid)[0] if valid else None
    rec["comparison"] = None
    rec["bar"] = 0.0
    rec["verdict"] = "MEASURED" if best else "INVALID"
    rec["best"] = None if best is None else {"label": best.label, "knobs": dict(best.config)}
    default = next((a for a in outcomes if a.label == default_label), None)
    rec["default"] = None if default is None else {"label": default.label, "knobs": dict(default.config)}
    return rec
