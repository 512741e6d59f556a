"""Two records side by side (`minfer ledger diff A B`): the knobs that differ, the environment that differs, and
each shared figure's change, as data."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from minfer_cli.ledger import figures


@dataclass(frozen=True)
class Difference:
    """One named value that differs: ``what`` (``arm A knob TM``, ``commit``), its value in A and in B (text)."""

    what: str
    a: str
    b: str


@dataclass(frozen=True)
class FigureChange:
    """A figure both records hold: ``what`` (``pp2048``, ``arm B median``, ``A/B effect``), the values in ``unit``
    and the change from A to B as a speed-up (positive = B's record is faster), None when it cannot be formed."""

    what: str
    a: float
    b: float
    unit: str
    change: float | None


@dataclass(frozen=True)
class RecordDiff:
    """`diff` of two records: ``knobs`` and ``environment`` differences, ``figures`` changes, and ``notes`` (lines
    saying what could not be paired, e.g. arms only one record has)."""

    knobs: list[Difference]
    environment: list[Difference]
    figures: list[FigureChange]
    notes: list[str]


def _flat(prefix: str, value: Any, into: dict[str, str]) -> None:
    if isinstance(value, Mapping):
        for k, v in value.items():
            _flat(f"{prefix}.{k}" if prefix else str(k), v, into)
    elif isinstance(value, list):
        into[prefix] = ", ".join(map(str, value))
    else:
        into[prefix] = "—" if value is None else str(value)


_ENV_KEYS = {"git.commit": "commit", "git.dirty": "uncommitted changes", "environment.device.name": "GPU",
             "environment.device.uuid": "GPU uuid", "environment.device.driver_version": "driver",
             "environment.device.runtime_version": "CUDA runtime", "environment.gpu_start.sm_clock_mhz": "SM MHz (start)",
             "environment.gpu_start.mem_clock_mhz": "mem MHz (start)", "environment.gpu_start.temperature_c": "°C (start)",
             "environment.gpu_start.power_w": "W (start)", "environment.gpu_start.throttle": "throttle (start)",
             "environment.gpu_end.sm_clock_mhz": "SM MHz (end)", "environment.gpu_end.temperature_c": "°C (end)",
             "environment.gpu_end.throttle": "throttle (end)", "environment.ceilings.copy_gbps": "copy GB/s ceiling",
             "environment.ceilings.f16_matmul_tflops": "f16 TFLOP/s ceiling"}


def _environment(record: Mapping[str, Any]) -> dict[str, str]:
    flat: dict[str, str] = {}
    _flat("", {"git": record.get("git"), "environment": record.get("environment")}, flat)
    picked = {label: flat[k] for k, label in _ENV_KEYS.items() if k in flat}
    software: dict[str, str] = {}
    _flat("software", record.get("software"), software)
    return picked | software


def _arms_by_label(record: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {str(a.get("label")): a for a in record.get("arms") or [] if isinstance(a, Mapping)}


def _higher(record: Mapping[str, Any]) -> bool:
    return bool((record.get("metric") or {}).get("higher_is_better"))


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_bench(record: Mapping[str, Any]) -> bool:
    return record.get("kind") == "bench" or (record.get("kind") == "verify"
                                             and (record.get("verify") or {}).get("of_kind") == "bench")


def diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> RecordDiff:
    """Compare record ``a`` with record ``b``.

    Arms are paired by label (A with A, pp2048 with pp2048, a sweep's p3 with p3); each pair's differing knobs
    are listed, and its median's change (a bench test's mean) is given as a speed-up of ``b`` over ``a`` (in the
    metric's direction).
    Two A/B records also compare their effects (B over A, each as a speed-up). The environment lists every
    commit, GPU, driver, clock, temperature, power, throttle, ceiling and software version that differs.
    """
    knobs: list[Difference] = []
    changes: list[FigureChange] = []
    notes: list[str] = []
    if a.get("experiment") != b.get("experiment") or (a.get("workload") or {}).get("name") != (b.get("workload") or {}).get("name"):
        notes.append(f"different work: {a.get('experiment')} · {(a.get('workload') or {}).get('name')} vs "
                     f"{b.get('experiment')} · {(b.get('workload') or {}).get('name')}")
    unit_a = str((a.get("metric") or {}).get("unit") or "")
    unit_b = str((b.get("metric") or {}).get("unit") or "")
    arms_a, arms_b = _arms_by_label(a), _arms_by_label(b)
    for label in [x for x in arms_a if x in arms_b]:
        ka, kb = dict(arms_a[label].get("knobs") or {}), dict(arms_b[label].get("knobs") or {})
        for k in dict.fromkeys([*ka, *kb]):
            if ka.get(k) != kb.get(k):
                knobs.append(Difference(f"arm {label} {k}", "—" if k not in ka else str(ka[k]),
                                        "—" if k not in kb else str(kb[k])))
        # a bench test's figure is its mean (llama-bench's form, as `show` prints it); every other arm's its median
        stat = "mean" if all(_is_bench(r) for r in (a, b)) else "median"
        ma, mb = figures.stats_of(arms_a[label])[stat], figures.stats_of(arms_b[label])[stat]
        if ma and mb and unit_a == unit_b:
            changes.append(FigureChange(f"{label} {stat}", ma, mb, unit_a,
                                        figures.speedup(mb / ma - 1.0, _higher(b))))
    ka, kb = a.get("knobs"), b.get("knobs")  # a record of one configuration (a check) holds its knobs at the top
    if isinstance(ka, Mapping) and isinstance(kb, Mapping):
        knobs += [Difference(k, str(ka.get(k, "—")), str(kb.get(k, "—"))) for k in dict.fromkeys([*ka, *kb])
                  if ka.get(k) != kb.get(k)]
    ca, cb = a.get("check"), b.get("check")
    if isinstance(ca, Mapping) and isinstance(cb, Mapping):
        for key in ("worst_rel_l2", "prefill_rel_l2"):
            if _number(ca.get(key)) and _number(cb.get(key)):
                changes.append(FigureChange(f"check {key.replace('_', ' ')}", ca[key], cb[key], "", None))
    only = [f"{label} only in #{r['id']}" for r, arms, other in ((a, arms_a, arms_b), (b, arms_b, arms_a))
            for label in arms if label not in other]
    if only:
        notes.append("unpaired arms: " + ", ".join(only))
    effect_a, effect_b = figures.comparison_change(a), figures.comparison_change(b)
    if effect_a and effect_b:
        changes.append(FigureChange("A/B effect (speed-up of B over A)", effect_a[0], effect_b[0], "fraction", None))
    env_a, env_b = _environment(a), _environment(b)
    environment = [Difference(k, env_a.get(k, "—"), env_b.get(k, "—"))
                   for k in dict.fromkeys([*env_a, *env_b]) if env_a.get(k, "—") != env_b.get(k, "—")]
    return RecordDiff(knobs, environment, changes, notes)
