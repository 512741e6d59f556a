"""`minfer ledger verify`: is a recorded verdict still true at this commit, on this GPU?

For each chosen record this module decides what can be re-run (`plan`), asks a `Runner` to measure it with the
record's protocol, and judges the new measurement against the recorded one (`judge_effect`, `judge_figure`):

* an A/B (kind ab): the effect — B's speed-up over A, same run, interleaved — against the recorded effect.
  HOLDS when the new CI overlaps [recorded - bar, recorded + bar]; REGRESSED when it lies wholly below
  recorded - bar; IMPROVED when wholly above recorded + bar.
* a figure (bench tests, a run, a sweep's best point): the new value against the recorded value on the same GPU
  model, as a speed-up; REGRESSED below -bar, IMPROVED above +bar, else HOLDS.
* CANNOT-RUN, named in one line: the experiment, workload or a knob value no longer exists, the knob under test
  was removed, another GPU model, a model file that is gone, a kind with no claim to re-check.
* RETIRED: a `retire` record names it.

Knobs a record predates (the experiment has them now, the record does not) take the value of their time — the
knob's ``legacy`` value (what the code did before the knob existed) where it declares one, else its default — and
are listed;
a knob the code no longer has is dropped and listed when every arm holds the value the code still runs (the
experiment's ``removed_knobs``: the knob's old default); a removed knob at any other value (a deleted variant), one
the arms disagree on (the knob under test) or one the experiment does not declare is CANNOT-RUN. Nothing here
touches the GPU: the runner does (`minfer_cli.measure.verify_runner`), so every outcome is testable with a fake.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol

from minfer_cli.ledger import figures

DEFAULT_FIGURE_BAR = 0.03
"""Bar for a figure (bench, run, sweep point) re-measured in another process: run-to-run spread of whole-process
benchmarks is larger than an interleaved A/B's, so a figure counts as moved only beyond 3%."""


@dataclass(frozen=True)
class Plan:
    """What to re-run for one record. ``mode``: "ab" (two configurations, interleaved), "figure" (each of
    ``configs`` measured alone, compared with ``recorded_values``) or "none" (``outcome`` and ``reason`` say why
    not). ``workloads``: the workload of each configuration (a bench record has one per test). ``dropped`` and
    ``predated``: knob adjustments, listed in the verify record. ``rounds``: the paired rounds the recorded A/B
    ran (None when it does not say): a re-run needs no more before its adaptive stop may end it."""

    record_id: int
    kind: str
    mode: str
    experiment: str | None = None
    workloads: tuple[str, ...] = ()
    configs: tuple[dict, ...] = ()
    labels: tuple[str, ...] = ()
    recorded_values: tuple[float, ...] = ()
    higher_is_better: bool = False
    bar: float = 0.0
    outcome: str | None = None
    reason: str = ""
    dropped: dict = field(default_factory=dict)
    predated: dict = field(default_factory=dict)
    superseded_by: int | None = None
    source: str | None = None
    preset: str | None = None
    model: str | None = None
    reps: int = 3
    rounds: int | None = None


@dataclass(frozen=True)
class Measured:
    """What a runner measured: per arm its label, knobs and stats {median, mean, std, p10, p90, n} (the metric's
    unit), and for an A/B the comparison {delta, ci_low, ci_high, p_value, rounds} (B/A - 1). ``record`` holds the
    measurement's own ledger fields (environment, software, metric, arms, workload) for the verify record."""

    arms: list[dict]
    comparison: dict | None = None
    record: dict = field(default_factory=dict)
    error: str | None = None


class Runner(Protocol):
    """Measures what a `Plan` asks for (the GPU lives behind this)."""

    def device_name(self) -> str | None: ...

    def run(self, plan: Plan) -> Measured: ...


@dataclass(frozen=True)
class Outcome:
    """One record's verify result: ``outcome`` (HOLDS, REGRESSED, IMPROVED, CANNOT-RUN, RETIRED), a one-line
    ``reason``, the recorded and measured figures (speed-ups for an A/B, values for figures) and the text a table
    shows."""

    record_id: int
    outcome: str
    reason: str
    recorded: dict = field(default_factory=dict)
    measured: dict = field(default_factory=dict)
    text: str = ""
    plan: Plan | None = None
    measurement: Measured | None = None


# ---------------------------------------------------------------------------------------------------- judging


def judge_effect(recorded: float, low: float, high: float, bar: float) -> str:
    """HOLDS / REGRESSED / IMPROVED for an A/B: ``recorded`` the recorded speed-up of B over A, [``low``,
    ``high``] the new speed-up's 95% CI, ``bar`` a fraction (0.01 = 1%)."""
    if high < recorded - bar:
        return "REGRESSED"
    if low > recorded + bar:
        return "IMPROVED"
    return "HOLDS"


def judge_figure(recorded: float, value: float, higher_is_better: bool, bar: float) -> tuple[str, float]:
    """(outcome, change) for a figure: change = speed-up of ``value`` over ``recorded`` (positive = faster now);
    REGRESSED when it is below -``bar``, IMPROVED above +``bar``, else HOLDS."""
    change = figures.speedup(value / recorded - 1.0, higher_is_better)
    if change < -bar:
        return "REGRESSED", change
    if change > bar:
        return "IMPROVED", change
    return "HOLDS", change


# ---------------------------------------------------------------------------------------------------- planning


def retired_ids(records: list[Mapping[str, Any]]) -> dict[int, tuple[int, str]]:
    """Record id -> (id of the retire record, why) for every record a `retire` tombstone names."""
    out: dict[int, tuple[int, str]] = {}
    for record in records:
        if record.get("kind") == "retire":
            retire = record.get("retire") or {}
            for rid in retire.get("ids") or []:
                out[int(rid)] = (int(record["id"]), str(retire.get("why", "")))
    return out


def ab_key(record: Mapping[str, Any]) -> tuple | None:
    """What makes two A/B records measure the same thing: experiment, workload and both arms' knobs."""
    arms = record.get("arms") or []
    if record.get("kind") != "ab" or len(arms) != 2:
        return None
    knobs = tuple(tuple(sorted((str(k), repr(v)) for k, v in (a.get("knobs") or {}).items())) for a in arms)
    return (record.get("experiment"), (record.get("workload") or {}).get("name"), knobs)


def supersessions(records: list[Mapping[str, Any]]) -> dict[int, int]:
    """Record id -> id of the later A/B record that measured the same A/B (the latest governs)."""
    latest: dict[tuple, int] = {}
    for record in sorted(records, key=lambda r: r["id"]):
        key = ab_key(record)
        if key is not None:
            latest[key] = record["id"]
    return {r["id"]: latest[ab_key(r)] for r in records if ab_key(r) is not None and latest[ab_key(r)] != r["id"]}


def _resolve_knobs(experiment: Any, arms: list[Mapping[str, Any]]) -> tuple[list[dict], dict, dict, str | None]:
    """Each arm's knobs as a configuration the experiment accepts today: (configs, dropped, predated, problem)."""
    known = {k.name: k for k in experiment.knobs}
    removed = dict(getattr(experiment, "removed_knobs", {}) or {})
    configs: list[dict] = []
    dropped: dict[str, Any] = {}
    stored = [dict(a.get("knobs") or {}) for a in arms]
    for knobs in stored:
        config = dict(experiment.default_config())
        for name, value in knobs.items():
            if name not in known:
                if any(other.get(name) != value for other in stored):
                    return [], {}, {}, f"knob {name} (the one under test: {' vs '.join(str(o.get(name)) for o in stored)}) no longer exists"
                if name not in removed:
                    return [], {}, {}, (f"knob {name}={value} no longer exists and {experiment.name} does not say "
                                        "which value its code still runs")
                if value != removed[name]:
                    return [], {}, {}, (f"knob value {name}={value} was deleted (the code runs only what was "
                                        f"{name}={removed[name]})")
                dropped[name] = value
                continue
            if value not in known[name].values:
                allowed = ", ".join(map(str, known[name].values))
                return [], {}, {}, f"knob value {name}={value} no longer exists (allowed: {allowed})"
            config[name] = value
        configs.append(config)
    predated = {name: knob.before for name, knob in known.items() if all(name not in s for s in stored)}
    for config in configs:
        config.update(predated)
    return configs, dropped, predated, None


def _none(record: Mapping[str, Any], outcome: str, reason: str, **extra: Any) -> Plan:
    return Plan(record["id"], str(record.get("kind")), "none", outcome=outcome, reason=reason, **extra)


def plan(record: Mapping[str, Any], records: list[Mapping[str, Any]], *, bar: float | None = None,
         registry: Any = None, retired: dict | None = None, superseded: dict | None = None) -> Plan:
    """What re-running ``record`` means today (see the module docstring); ``records`` is the whole ledger (for
    retire tombstones and supersession; pass ``retired`` = `retired_ids` and ``superseded`` = `supersessions` of it
    when planning many records, so each is computed once), ``bar`` overrides the record's bar (a fraction),
    ``registry`` is a callable name -> Experiment (default `minfer_cli.experiment.get`; raises UsageError for an
    unknown name)."""
    from minfer_cli.errors import UsageError

    if registry is None:
        from minfer_cli.experiment import get as registry
    retired = retired if retired is not None else retired_ids(list(records))
    if record["id"] in retired:
        rid, why = retired[record["id"]]
        return _none(record, "RETIRED", f"retired by #{rid}: {why}")
    kind = record.get("kind")
    if kind not in ("ab", "bench", "run", "sweep"):
        return _none(record, "CANNOT-RUN", f"a {kind} record makes no claim that can be re-measured")
    if record.get("verdict") == "INVALID":
        return _none(record, "CANNOT-RUN", "the record is INVALID: nothing was measured to re-check")
    later = (superseded if superseded is not None else supersessions(list(records))).get(record["id"])
    try:
        experiment = registry(str(record.get("experiment")))
    except UsageError:
        return _none(record, "CANNOT-RUN", f"experiment {record.get('experiment')!r} no longer exists")
    higher = bool((record.get("metric") or {}).get("higher_is_better"))
    arms = [a for a in record.get("arms") or [] if isinstance(a, Mapping)]
    workload = str((record.get("workload") or {}).get("name"))
    if kind == "sweep":
        best = figures.sweep_point(record, "best")
        if best is None:
            return _none(record, "CANNOT-RUN", "the sweep names no best point")
        arms = [best]
    if kind == "bench":
        workloads = tuple(str(a.get("label")) for a in arms)
        shape = (record.get("workload") or {}).get("shape") or {}
        source, preset = str(shape.get("source", "")), shape.get("preset")
    else:
        workloads = (workload,) * (1 if kind == "ab" else len(arms))
        source = preset = None
    valid = {w.name for w in experiment.workloads}
    if kind != "bench" and workload not in valid:
        return _none(record, "CANNOT-RUN", f"workload {workload!r} of {experiment.name} no longer exists")
    configs, dropped, predated, problem = _resolve_knobs(experiment, arms)
    if problem:
        return _none(record, "CANNOT-RUN", problem)
    if kind != "bench":  # knobs the workload never reads take today's defaults: they cannot change the result
        unread = experiment.unread_knobs(experiment.workload(workload))
        defaults = experiment.default_config()
        for config in configs:
            config.update({k: defaults[k] for k in unread if k in config})
        predated = {k: v for k, v in predated.items() if k not in unread}
    bar_value = bar if bar is not None else (float(record.get("bar") or 0.0) if kind == "ab" else DEFAULT_FIGURE_BAR)
    if kind == "ab":
        change = figures.comparison_change(record)
        if change is None:
            return _none(record, "CANNOT-RUN", "the record has no comparison to re-check")
        return Plan(record["id"], "ab", "ab", experiment.name, workloads, tuple(configs),
                    tuple(str(a.get("label")) for a in arms), (change[0],), higher, bar_value,
                    dropped=dropped, predated=predated, superseded_by=later,
                    rounds=_recorded_rounds(record))
    values = tuple(figures.stats_of(a)["mean" if kind == "bench" else "median"] or math.nan for a in arms)
    if not all(math.isfinite(v) and v > 0 for v in values):
        return _none(record, "CANNOT-RUN", "the record holds no figure to re-check")
    reps = max(3, int(figures.stats_of(arms[0])["n"] or 3)) if kind == "bench" else 3
    return Plan(record["id"], str(kind), "figure", experiment.name, workloads, tuple(configs),
                tuple(str(a.get("label")) for a in arms), values, higher, bar_value, dropped=dropped,
                predated=predated, superseded_by=later, source=source,
                preset=str(preset) if preset else None, model=workload, reps=min(reps, 10))


def _recorded_rounds(record: Mapping[str, Any]) -> int | None:
    rounds = (record.get("comparison") or {}).get("rounds")
    return rounds if isinstance(rounds, int) and not isinstance(rounds, bool) and rounds >= 2 else None


def min_rounds_for(plan: Plan, asked: int | None, default: int = 10) -> int:
    """The rounds an A/B re-run takes before its adaptive stop may end it: ``asked`` when the user gave one, else
    the record's own rounds (at least 3, at most ``default``), else ``default``. A record whose arms take seconds
    per sample (GRAPHS=0 decode) ran few rounds; re-running it with ten would take many minutes."""
    if asked is not None:
        return asked
    if plan.rounds is None:
        return default
    return max(3, min(default, plan.rounds))


# ---------------------------------------------------------------------------------------------------- running


def _device_of(record: Mapping[str, Any]) -> str | None:
    return ((record.get("environment") or {}).get("device") or {}).get("name")


def verify(record: Mapping[str, Any], records: list[Mapping[str, Any]], runner: Runner, *,
           bar: float | None = None, registry: Any = None, given: Plan | None = None) -> Outcome:
    """Plan (or take the ``given`` plan), run and judge one record (see the module docstring). Never raises for a
    record that cannot be re-run: that is a CANNOT-RUN outcome with the reason."""
    p = given if given is not None else plan(record, records, bar=bar, registry=registry)
    if p.mode == "none":
        return Outcome(record["id"], str(p.outcome), p.reason, plan=p)
    here, there = runner.device_name(), _device_of(record)
    if there and here and here != there:
        return Outcome(record["id"], "CANNOT-RUN", f"recorded on {there}, this GPU is {here}", plan=p)
    measured = runner.run(p)
    if measured.error:
        return Outcome(record["id"], "CANNOT-RUN", measured.error, plan=p, measurement=measured)
    adjust = "; ".join(x for x in (
        f"dropped {figures.knobs_text(p.dropped)}" if p.dropped else "",
        f"predated knobs as of their time: {figures.knobs_text(p.predated)}" if p.predated else "") if x)
    adjust = f" ({adjust})" if adjust else ""
    if p.mode == "ab":
        c = measured.comparison or {}
        speed, low, high = figures.comparison_change({"comparison": c, "metric": {"higher_is_better": p.higher_is_better}}) \
            or (math.nan, math.nan, math.nan)
        if not math.isfinite(speed):
            return Outcome(record["id"], "CANNOT-RUN", "the re-run produced no comparison", plan=p, measurement=measured)
        recorded = p.recorded_values[0]
        outcome = judge_effect(recorded, low, high, p.bar)
        text = (f"{figures.fmt_change(recorded)} then, {figures.fmt_change(speed)} [{low * 100:+.1f}, {high * 100:+.1f}] "
                f"now (bar {p.bar * 100:.2g}%)") + arms_moved(record, measured.arms)
        return Outcome(record["id"], outcome, text + adjust, {"speedup": recorded},
                       {"speedup": speed, "ci_low": low, "ci_high": high}, text, p, measured)
    results, worst, parts = {}, "HOLDS", []
    order = {"REGRESSED": 2, "IMPROVED": 1, "HOLDS": 0}
    for label, value, arm in zip(p.labels, p.recorded_values, measured.arms):
        s = (arm.get("stats") or {})
        now = s.get("mean") if p.kind == "bench" else s.get("median")
        if not isinstance(now, (int, float)) or not math.isfinite(now) or now <= 0:
            return Outcome(record["id"], "CANNOT-RUN", f"{label}: the re-run produced no figure", plan=p,
                           measurement=measured)
        outcome, change = judge_figure(value, float(now), p.higher_is_better, p.bar)
        results[label] = {"recorded": value, "measured": float(now), "speedup": change}
        parts.append(f"{label} {figures.fmt_num(value)} → {figures.fmt_num(float(now))} {figures.fmt_change(change)}")
        if order[outcome] > order[worst]:
            worst = outcome
    text = ", ".join(parts) + f" (bar {p.bar * 100:.2g}%)"
    return Outcome(record["id"], worst, text + adjust, {k: v["recorded"] for k, v in results.items()},
                   {k: v["measured"] for k, v in results.items()}, text, p, measured)


def arms_moved(record: Mapping[str, Any], arms_now: list) -> str:
    """Each arm's median then → now (``; A 714.0 → 703.0, B 543.8 → 543.9 µs``): which arm moved when the
    effect changed (a control arm that got faster shrinks the effect with no change to the arm under test)."""
    then = [figures.stats_of(a)["median"] for a in record.get("arms") or [] if isinstance(a, Mapping)]
    now = [figures.stats_of(a)["median"] for a in arms_now if isinstance(a, Mapping)]
    if len(then) != len(now) or any(v is None for v in then + now):
        return ""
    labels = [str(a.get("label")) for a in arms_now]
    unit = str((record.get("metric") or {}).get("unit") or "")
    return "; " + ", ".join(f"{label} {figures.fmt_num(a)} → {figures.fmt_num(b)}"
                            for label, a, b in zip(labels, then, now)) + (f" {unit}" if unit else "")


def verify_record(original: Mapping[str, Any], outcome: Outcome, *, git: dict, command: str, timestamp: str) -> dict:
    """The schema 2 ``verify`` record of ``outcome`` (the measurement's own fields included when it ran)."""
    p = outcome.plan
    record: dict[str, Any] = {
        "schema": 2,
        "title": f"verify #{original['id']}: {original.get('title')}"[:200],
        "timestamp": timestamp,
        "kind": "verify",
        "verdict": outcome.outcome,
        "verify": {
            "of": int(original["id"]),
            "of_kind": str(original.get("kind")),
            "reason": outcome.reason,
            "measured_text": outcome.text or outcome.reason,
            "bar": float(p.bar) if p is not None else None,
            "recorded": dict(outcome.recorded),
            "measured": dict(outcome.measured),
            "knobs": {"dropped": dict(p.dropped) if p else {}, "predated": dict(p.predated) if p else {}},
            "superseded_by": p.superseded_by if p else None,
        },
        "git": git,
        "command": command,
        "notes": "",
    }
    if outcome.measurement is not None and outcome.measurement.record:
        for key in ("experiment", "workload", "metric", "arms", "environment", "software"):
            if key in outcome.measurement.record:
                record[key] = outcome.measurement.record[key]
        record["comparison"] = outcome.measurement.comparison
        record["bar"] = float(p.bar) if p else 0.0
    return record
