"""What a ledger record may hold: schema 1 (the records written until schema 2) and schema 2 (docs/ledger.md).

`validate` returns every way a record departs from its schema as sentences; it never raises. A record's
``schema`` key picks the rules: 1 keeps the old rules forever (old files are never rewritten), 2 adds the kinds
``verify``, ``check`` and ``retire`` and the per-kind verdict sets. Both refuse non-finite numbers in the figures
a view prints (``delta: .nan`` would print ``+nan%``).
"""

from __future__ import annotations

import math
import re
from typing import Any, Mapping

SCHEMA = 2
SCHEMAS = (1, 2)
ID_MAX = 999_999_999
"""Largest record id read or written; a file name with a larger id is skipped (a junk name cannot move ids)."""

MEASUREMENT_KINDS = ("ab", "run", "calibrate", "sweep", "bench")
KINDS = (*MEASUREMENT_KINDS, "verify", "check", "retire")
VERIFY_OUTCOMES = ("HOLDS", "REGRESSED", "IMPROVED", "CANNOT-RUN", "RETIRED")
CHECK_OUTCOMES = ("PASS", "FAIL", "INVALID")
VERDICTS_BY_KIND: dict[str, tuple[str, ...]] = {
    "ab": ("LANDED", "REVERTED", "NEUTRAL", "INVALID"),
    "run": ("MEASURED", "INVALID"),
    "calibrate": ("MEASURED", "INVALID"),
    "sweep": ("MEASURED", "INVALID"),
    "bench": ("MEASURED", "INVALID"),
    "verify": VERIFY_OUTCOMES,
    "check": CHECK_OUTCOMES,
    "retire": ("RETIRED",),
}
VERDICTS = tuple(dict.fromkeys(v for vs in VERDICTS_BY_KIND.values() for v in vs))
SCHEMA1_KINDS = MEASUREMENT_KINDS
SCHEMA1_VERDICTS = ("LANDED", "REVERTED", "NEUTRAL", "INVALID", "MEASURED")
ARM_STATUSES = ("ok", "invalid")
# Kinds whose verdict was judged against ``bar``; the others (run, sweep, bench) store 0.0, meaning "no bar".
KINDS_WITH_BAR = ("ab", "calibrate")
# Kinds whose arms are not alternatives but the workloads one configuration was measured on: a bench record holds
# one arm per pp/tg test, labelled with the test (pp512, tg128: the workload names `minfer ab bench -w` takes).
KINDS_WITH_WORKLOAD_ARMS = ("bench",)
NUMBER_MAX = 1e15
"""Largest magnitude of any number a record holds (µs, tok/s, GB/s, counts): beyond it a value is no measurement."""
INT_MAX = 10**15
SAMPLES_MAX = 4096
"""Most per-round values an arm's ``samples`` keeps (a record stays far under the size limit)."""

_TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z$")


def _real_timestamp(text: str) -> bool:
    import datetime as _dt

    if not _TIMESTAMP.match(text):
        return False
    try:
        _dt.datetime.fromisoformat(text[:19])
    except ValueError:
        return False
    return True


def is_number(value: Any) -> bool:
    """True for an int or float that is not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_type(problems: list[str], where: str, value: Any, kind: str) -> None:
    """Append a problem when ``value`` is not of ``kind`` (str, int, number, bool, mapping, list; "?" = or null)."""
    optional = kind.endswith("?")
    kind = kind.rstrip("?")
    if optional and value is None:
        return
    ok = {
        "str": lambda v: isinstance(v, str),
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": is_number,
        "bool": lambda v: isinstance(v, bool),
        "mapping": lambda v: isinstance(v, Mapping),
        "list": lambda v: isinstance(v, list),
    }[kind](value)
    if not ok:
        expected = f"{kind} or null" if optional else kind
        problems.append(f"{where} must be a {expected}, got {type(value).__name__} {value!r:.60}")
    elif kind == "number" and not (math.isfinite(value) and abs(value) <= NUMBER_MAX):
        problems.append(f"{where} must be finite and at most {NUMBER_MAX:.0e} in size, got {value!r:.40}")
    elif kind == "int" and not abs(value) <= INT_MAX:
        problems.append(f"{where} must be at most {INT_MAX:.0e} in size")


def _check_fields(problems: list[str], where: str, mapping: Any, fields: Mapping[str, str], required: bool) -> None:
    if not isinstance(mapping, Mapping):
        return
    missing = [name for name in fields if name not in mapping]
    if required and missing:
        problems.append(f"{where} is missing {', '.join(missing)}" if where else f"missing {', '.join(missing)}")
    for name, kind in fields.items():
        if name in mapping:
            _check_type(problems, f"{where}.{name}" if where else name, mapping[name], kind)


_COMMON = {"schema": "int", "id": "int", "title": "str", "timestamp": "str", "kind": "str", "verdict": "str",
           "git": "mapping", "command": "str", "notes": "str"}
_MEASUREMENT = {"experiment": "str", "workload": "mapping", "metric": "mapping", "arms": "list",
                "comparison": "mapping?", "bar": "number", "environment": "mapping", "software": "mapping"}
_ARM_REQUIRED = {"label": "str", "knobs": "mapping", "status": "str"}
_ARM_OPTIONAL = {"error": "str?", "parity_error": "number?", "stats": "mapping?", "tflops": "number?",
                 "gbps": "number?", "pct_roofline": "number?", "samples": "list?", "device": "mapping?"}
_STATS = {"median": "number?", "p10": "number?", "p90": "number?", "mean": "number?", "std": "number?",
          "n": "int?", "throttled": "number?"}
_COMPARISON = {"delta": "number", "ci_low": "number", "ci_high": "number", "p_value": "number", "rounds": "int"}
_COMPARISON_OPTIONAL = {"throttled_rounds": "number?", "stop_reason": "str?"}


def _check_comparison(problems: list[str], comparison: Any) -> None:
    _check_fields(problems, "comparison", comparison, _COMPARISON, required=True)
    _check_fields(problems, "comparison", comparison, _COMPARISON_OPTIONAL, required=False)
    if not isinstance(comparison, Mapping):
        return
    for key in ("delta", "ci_low", "ci_high"):  # B/A - 1 of two positive figures is above -1
        value = comparison.get(key)
        if is_number(value) and math.isfinite(value) and value <= -1:
            problems.append(f"comparison.{key} must be above -1 (it is B/A - 1), got {value!r}")
    low, high = comparison.get("ci_low"), comparison.get("ci_high")
    if is_number(low) and is_number(high) and low > high:
        problems.append("comparison.ci_low must not be above comparison.ci_high")
    rounds = comparison.get("rounds")
    if isinstance(rounds, int) and not isinstance(rounds, bool) and rounds < 0:
        problems.append(f"comparison.rounds must not be negative, got {rounds}")
    p_value = comparison.get("p_value")
    if is_number(p_value) and not 0 <= p_value <= 1:
        problems.append(f"comparison.p_value must be in [0, 1], got {p_value!r}")


def _check_knobs(problems: list[str], where: str, knobs: Any) -> None:
    if isinstance(knobs, Mapping) and not all(
            isinstance(k, str) and (v is None or isinstance(v, (str, int, float, bool))) for k, v in knobs.items()):
        problems.append(f"{where}.knobs must map knob names (text) to plain values")


def _check_measurement(problems: list[str], record: Mapping[str, Any], required: bool) -> None:
    _check_fields(problems, "", record, _MEASUREMENT, required=required)
    if is_number(record.get("bar")) and not 0 <= record["bar"] <= 1:
        problems.append(f"bar must be a fraction in [0, 1] (0.01 is 1%), got {record['bar']!r:.40}")
    if record.get("experiment") == "":
        problems.append("experiment must not be empty")
    _check_fields(problems, "workload", record.get("workload"), {"name": "str", "shape": "mapping"}, required=True)
    metric_fields = {"name": "str", "unit": "str", "higher_is_better": "bool"}
    _check_fields(problems, "metric", record.get("metric"), metric_fields, required=True)
    _check_comparison(problems, record.get("comparison"))
    arms = record.get("arms")
    if not isinstance(arms, list):
        return
    if not arms and required:
        problems.append("arms must hold at least one arm")
    for i, arm in enumerate(arms):
        where = f"arms[{i}]"
        if not isinstance(arm, Mapping):
            problems.append(f"{where} must be a mapping, got {type(arm).__name__}")
            continue
        _check_fields(problems, where, arm, _ARM_REQUIRED, required=True)
        _check_fields(problems, where, arm, _ARM_OPTIONAL, required=False)
        _check_fields(problems, f"{where}.stats", arm.get("stats"), _STATS, required=False)
        _check_knobs(problems, where, arm.get("knobs"))
        stats = arm.get("stats")
        if isinstance(stats, Mapping):
            negative = [k for k in ("median", "p10", "p90", "mean", "std", "n") if is_number(stats.get(k)) and stats[k] < 0]
            if negative:
                problems.append(f"{where}.stats.{negative[0]} must not be negative")
        if arm.get("label") == "":
            problems.append(f"{where}.label must not be empty")
        if isinstance(arm.get("status"), str) and arm["status"] not in ARM_STATUSES:
            problems.append(f"{where}.status {arm['status']!r} is not one of {', '.join(ARM_STATUSES)}")
        samples = arm.get("samples")
        if isinstance(samples, list):
            if len(samples) > SAMPLES_MAX:
                problems.append(f"{where}.samples holds {len(samples)} values, more than {SAMPLES_MAX}")
            elif not all(is_number(v) and math.isfinite(v) for v in samples):
                problems.append(f"{where}.samples must hold finite numbers only")


def _check_kind_keys(problems: list[str], record: Mapping[str, Any]) -> None:
    kind = record.get("kind")
    if kind == "verify":
        verify = record.get("verify")
        if not isinstance(verify, Mapping):
            problems.append("verify must be a mapping {of: id, ...}")
        else:
            _check_fields(problems, "verify", verify, {"of": "int", "reason": "str"}, required=True)
            _check_fields(problems, "verify", verify, {"bar": "number?", "of_kind": "str?"}, required=False)
            of = verify.get("of")
            if isinstance(of, int) and not isinstance(of, bool) and not 1 <= of <= ID_MAX:
                problems.append(f"verify.of must be a record id 1..{ID_MAX}, got {of}")
    elif kind == "retire":
        retire = record.get("retire")
        if not isinstance(retire, Mapping):
            problems.append("retire must be a mapping {ids: [...], why: text}")
            return
        _check_fields(problems, "retire", retire, {"ids": "list", "why": "str"}, required=True)
        ids = retire.get("ids")
        if isinstance(ids, list) and (not ids or not all(isinstance(i, int) and not isinstance(i, bool)
                                                         and 1 <= i <= ID_MAX for i in ids)):
            problems.append(f"retire.ids must be a non-empty list of record ids 1..{ID_MAX}")
        if retire.get("why") == "":
            problems.append("retire.why must say why the records no longer apply")
    elif kind == "check":
        if not isinstance(record.get("check"), Mapping):
            problems.append("check must be a mapping of the numerical check's figures")
    elif kind in MEASUREMENT_KINDS:
        _check_measurement(problems, record, required=True)
    if kind in ("verify", "check", "retire") and any(k in record for k in _MEASUREMENT):
        _check_measurement(problems, record, required=False)  # whatever a view reads is held to the same types


def _schema_problems(record: Any, require_id: bool) -> list[str]:
    if not isinstance(record, Mapping):
        return [f"a record must be a mapping, got {type(record).__name__}"]
    problems: list[str] = []
    schema = record.get("schema")
    if schema not in SCHEMAS or isinstance(schema, bool):
        return [f"schema {schema!r} is not supported (this minfer reads schemas {', '.join(map(str, SCHEMAS))})"]
    fields = dict(_COMMON)
    if not require_id:
        fields.pop("id")
    if schema == 1:  # schema 1: every record was a measurement
        fields.update(_MEASUREMENT)
    _check_fields(problems, "", record, fields, required=True)
    record_id = record.get("id")
    if require_id and isinstance(record_id, int) and not 1 <= record_id <= ID_MAX:
        problems.append(f"id must be 1..{ID_MAX}, got {record_id}")
    if record.get("title") == "":
        problems.append("title must not be empty")
    if isinstance(record.get("timestamp"), str) and not _real_timestamp(record["timestamp"]):
        problems.append(f"timestamp {record['timestamp']!r:.40} is not ISO-8601 UTC like 2026-11-29T23:10:00Z")
    _check_fields(problems, "git", record.get("git"), {"commit": "str?", "dirty": "bool?"}, required=True)
    kind, verdict = record.get("kind"), record.get("verdict")
    if not isinstance(kind, str) or not isinstance(verdict, str):  # the kind-specific rules key on both
        return problems or [f"kind and verdict must be text, got {type(kind).__name__} and {type(verdict).__name__}"]
    kinds = SCHEMA1_KINDS if schema == 1 else KINDS
    if isinstance(kind, str) and kind not in kinds:
        problems.append(f"kind {kind!r} is not one of {', '.join(kinds)}")
    if isinstance(verdict, str):
        allowed = SCHEMA1_VERDICTS if schema == 1 else VERDICTS_BY_KIND.get(kind, VERDICTS)
        if verdict not in allowed:
            problems.append(f"verdict {verdict!r} is not one of {', '.join(allowed)}")
    if schema == 1:
        _check_measurement(problems, record, required=False)
    else:
        _check_kind_keys(problems, record)
    where = _non_finite(record, "")
    if where is not None:
        problems.append(f"{where or 'a value'} is not a finite number: no figure in a record may be NaN or infinite")
    return problems


def _non_finite(value: Any, where: str) -> str | None:
    """The path of the first NaN or infinite float anywhere in ``value`` (peer figures, check figures, knob
    values, extra keys), or None. The store bounds a record's size and depth before this walks it."""
    stack = [(value, where)]
    while stack:
        item, path = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return path
        if isinstance(item, Mapping):
            stack.extend((v, f"{path}.{k}" if path else str(k)) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((v, f"{path}[{i}]") for i, v in enumerate(item))
    return None


def validate(record: Any) -> list[str]:
    """Every way ``record`` departs from its schema, as human-readable sentences; empty when it is valid.

    Every record: ``schema`` (1 or 2), ``id`` (int 1..`ID_MAX`), ``title`` (non-empty str), ``timestamp``
    (ISO-8601 UTC str), ``kind``, ``verdict`` (schema 2: one of ``VERDICTS_BY_KIND[kind]``), ``git`` {commit:
    str|null, dirty: bool|null}, ``command`` and ``notes`` (str). Measurement kinds (every schema 1 record):
    ``experiment`` (non-empty str), ``workload`` {name: str, shape: mapping}, ``metric`` {name: str, unit: str,
    higher_is_better: bool}, ``arms`` (non-empty list of {label: non-empty str, knobs: mapping, status:
    "ok"|"invalid"} with optional error, parity_error, tflops, gbps, pct_roofline, stats {median, p10, p90, mean,
    std: number|null; n: int|null}, samples (at most `SAMPLES_MAX` finite numbers), device), ``comparison``
    (null or {delta, ci_low, ci_high, p_value: number, rounds: int}, delta = median per-round ratio B/A - 1),
    ``bar`` (a fraction: 0.02 means 2%), ``environment`` and ``software`` (mappings). ``verify``: a mapping
    {of: int, reason: str, bar?, of_kind?}; ``retire``: {ids: [int...], why: non-empty str}; ``check``: a mapping.
    Every number named here must be finite, and no float anywhere in a record may be NaN or infinite (peer and
    check figures, knob values, extra keys). Extra keys are allowed.
    """
    return _schema_problems(record, require_id=True)
