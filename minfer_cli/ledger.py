"""The YAML ledger: one file per measured result, append-only, readable by people and by pandas.

A ledger is a directory of records named ``NNNN-slug.yaml`` (zero-padded id, slug from the title). Each record is
a plain mapping with ``schema: 1`` (see `validate` for every key and type). Records are written once, atomically,
and never rewritten; several processes may append to the same directory at once (see `append`).

Reading never executes anything: files are parsed with ``yaml.safe_load`` only, and a file that is not valid
(corrupt, truncated, hand-broken, an unsafe tag such as ``!!python/object``) is reported as a `Problem` while
every other record still loads.

This module returns data and raises `LedgerError`; it never prints. pandas is imported only by `to_frame` and
`export`, so that reading or appending records does not pay for it.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import math
import os
import re
import tempfile
import tomllib
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, NamedTuple

import yaml

from minfer_cli.errors import LedgerError
from minfer_cli.knobs import ENV_LEDGER, env

if TYPE_CHECKING:
    import pandas as pd

SCHEMA = 1
KINDS = ("ab", "run", "calibrate", "sweep", "bench")
VERDICTS = ("LANDED", "REVERTED", "NEUTRAL", "INVALID", "MEASURED")
ARM_STATUSES = ("ok", "invalid")
FORMATS = ("md", "csv", "json")
# Kinds whose verdict was judged against ``bar``; the others (run, sweep, bench) store 0.0, meaning "no bar".
KINDS_WITH_BAR = ("ab", "calibrate")
# Kinds whose arms are not alternatives but the workloads one configuration was measured on: a bench record holds
# one arm per pp/tg test, labelled with the test (pp512, tg128: the workload names `minfer ab bench -w` takes).
KINDS_WITH_WORKLOAD_ARMS = ("bench",)

# Columns of `to_frame` and their pandas dtypes (nullable, so a missing value is <NA> in every column). The
# exports read back to the same frame with ``pd.read_csv(buf, dtype=COLUMNS)`` and
# ``pd.read_json(buf, orient="records", dtype=False).astype(COLUMNS)``.
COLUMNS: dict[str, str] = {
    "id": "Int64",
    "date": "string",
    "kind": "string",
    "experiment": "string",
    "workload": "string",
    "arm_a": "string",
    "arm_b": "string",
    "a_median": "Float64",
    "b_median": "Float64",
    "unit": "string",
    "delta_pct": "Float64",
    "ci_low_pct": "Float64",
    "ci_high_pct": "Float64",
    "p_value": "Float64",
    "bar_pct": "Float64",
    "verdict": "string",
    "title": "string",
    "commit": "string",
    "dirty": "boolean",
}

_RECORD_NAME = re.compile(r"^(\d{4,})-.*\.yaml$")  # `append` writes slugs of [a-z0-9-]; reading takes any
_RESERVATION_NAME = re.compile(r"^\.(\d{4,})\.reserve$")
_TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z$")
_SLUG_MAX = 48


@dataclass(frozen=True)
class AppendResult:
    """Where `append` put a record: its assigned id and the path of its YAML file."""

    id: int
    path: Path


class Problem(NamedTuple):
    """A ledger file that was skipped: its file name and why (one line)."""

    file: str
    reason: str


@dataclass(frozen=True)
class LedgerContents:
    """Everything `load` read from a directory: valid records sorted by id, and the files it skipped."""

    directory: Path
    records: list[dict]
    problems: list[Problem]


# ---------------------------------------------------------------------------------------------------- location


def ledger_dir(explicit: str | Path | None = None) -> Path:
    """The ledger directory to use.

    Order: ``explicit`` (the ``--ledger`` option) > the MINFER_LEDGER environment variable > ``ledger/records``
    under the project root (the nearest ancestor of the working directory holding a pyproject.toml whose
    [project] name is "minfer") > the project this module was installed from (an editable install) > ``ledger/records``
    under the working directory. The directory need not exist.
    """
    if explicit:
        return Path(explicit).expanduser()
    from_env = env(ENV_LEDGER)
    if from_env:
        return Path(from_env).expanduser()
    cwd = Path.cwd()
    installed = Path(__file__).resolve().parents[1]
    for folder in (cwd, *cwd.parents, installed):
        if _is_minfer_project(folder / "pyproject.toml"):
            return folder / "ledger" / "records"
    return cwd / "ledger" / "records"


def check_writable(directory: str | Path) -> None:
    """Raise LedgerError (before any measurement) when a record could not be written to ``directory``: it is a
    file, it exists but is not writable, or neither it nor its parent exists (a mistyped --ledger)."""
    directory = Path(directory)
    if directory.exists():
        if not directory.is_dir():
            raise LedgerError(f"ledger directory {directory} is a file, not a directory; fix --ledger or MINFER_LEDGER")
        if not os.access(directory, os.W_OK | os.X_OK):
            raise LedgerError(f"ledger directory {directory} is not writable; fix its permissions or choose another with --ledger")
        return
    if not directory.parent.is_dir():
        raise LedgerError(f"ledger directory {directory} does not exist, nor does its parent; create it or fix --ledger / MINFER_LEDGER")


def _is_minfer_project(pyproject: Path) -> bool:
    try:
        with pyproject.open("rb") as f:
            data = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError):
        return False
    project = data.get("project")
    return isinstance(project, dict) and project.get("name") == "minfer"


def slugify(title: str) -> str:
    """File-name part of a title: lowercase ASCII letters, digits and single dashes, at most 48 characters.

    ``"VEC=4 vs VEC=2 (copy, 1 GiB)"`` -> ``"vec-4-vs-vec-2-copy-1-gib"``; a title with nothing usable -> "record".
    """
    ascii_title = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode()
    slug = re.sub(r"[^a-z0-9]+", "-", ascii_title.lower()).strip("-")
    return slug[:_SLUG_MAX].rstrip("-") or "record"


def utc_timestamp(when: _dt.datetime | None = None) -> str:
    """ISO-8601 UTC timestamp to the second, as records store it, e.g. ``2026-11-29T23:10:00Z`` (default: now)."""
    when = when or _dt.datetime.now(_dt.timezone.utc)
    return when.astimezone(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---------------------------------------------------------------------------------------------------- schema


def _is_number(value: Any) -> bool:
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
        "number": _is_number,
        "bool": lambda v: isinstance(v, bool),
        "mapping": lambda v: isinstance(v, Mapping),
        "list": lambda v: isinstance(v, list),
    }[kind](value)
    if not ok:
        expected = f"{kind} or null" if optional else kind
        problems.append(f"{where} must be a {expected}, got {type(value).__name__} {value!r:.60}")


def _check_fields(problems: list[str], where: str, mapping: Any, fields: Mapping[str, str], required: bool) -> None:
    if not isinstance(mapping, Mapping):
        return
    missing = [name for name in fields if name not in mapping]
    if required and missing:
        problems.append(f"{where} is missing {', '.join(missing)}" if where else f"missing {', '.join(missing)}")
    for name, kind in fields.items():
        if name in mapping:
            _check_type(problems, f"{where}.{name}" if where else name, mapping[name], kind)


_TOP_LEVEL = {
    "schema": "int",
    "id": "int",
    "title": "str",
    "timestamp": "str",
    "kind": "str",
    "experiment": "str",
    "workload": "mapping",
    "metric": "mapping",
    "arms": "list",
    "comparison": "mapping?",
    "bar": "number",
    "verdict": "str",
    "environment": "mapping",
    "software": "mapping",
    "git": "mapping",
    "command": "str",
    "notes": "str",
}
_ARM_REQUIRED = {"label": "str", "knobs": "mapping", "status": "str"}
_ARM_OPTIONAL = {
    "error": "str?",
    "parity_error": "number?",
    "stats": "mapping?",
    "tflops": "number?",
    "gbps": "number?",
    "pct_roofline": "number?",
}
_COMPARISON = {"delta": "number", "ci_low": "number", "ci_high": "number", "p_value": "number", "rounds": "int"}


def _schema_problems(record: Any, require_id: bool) -> list[str]:
    if not isinstance(record, Mapping):
        return [f"a record must be a mapping, got {type(record).__name__}"]
    problems: list[str] = []
    fields = dict(_TOP_LEVEL)
    if not require_id:
        fields.pop("id")
    _check_fields(problems, "", record, fields, required=True)
    if record.get("schema", SCHEMA) != SCHEMA:
        problems.append(f"schema {record['schema']!r} is not supported (this minfer reads schema {SCHEMA})")
    if require_id and isinstance(record.get("id"), int) and record["id"] < 1:
        problems.append(f"id must be at least 1, got {record['id']}")
    for key in ("title", "experiment"):
        if record.get(key) == "":
            problems.append(f"{key} must not be empty")
    if isinstance(record.get("timestamp"), str) and not _TIMESTAMP.match(record["timestamp"]):
        problems.append(f"timestamp {record['timestamp']!r} is not ISO-8601 UTC like 2026-11-29T23:10:00Z")
    if isinstance(record.get("kind"), str) and record["kind"] not in KINDS:
        problems.append(f"kind {record['kind']!r} is not one of {', '.join(KINDS)}")
    if isinstance(record.get("verdict"), str) and record["verdict"] not in VERDICTS:
        problems.append(f"verdict {record['verdict']!r} is not one of {', '.join(VERDICTS)}")
    _check_fields(problems, "workload", record.get("workload"), {"name": "str", "shape": "mapping"}, required=True)
    metric_fields = {"name": "str", "unit": "str", "higher_is_better": "bool"}
    _check_fields(problems, "metric", record.get("metric"), metric_fields, required=True)
    _check_fields(problems, "comparison", record.get("comparison"), _COMPARISON, required=True)
    _check_fields(problems, "git", record.get("git"), {"commit": "str?", "dirty": "bool?"}, required=True)
    arms = record.get("arms")
    if isinstance(arms, list):
        if not arms:
            problems.append("arms must hold at least one arm")
        for i, arm in enumerate(arms):
            where = f"arms[{i}]"
            if not isinstance(arm, Mapping):
                problems.append(f"{where} must be a mapping, got {type(arm).__name__}")
                continue
            _check_fields(problems, where, arm, _ARM_REQUIRED, required=True)
            _check_fields(problems, where, arm, _ARM_OPTIONAL, required=False)
            if arm.get("label") == "":
                problems.append(f"{where}.label must not be empty")
            if isinstance(arm.get("status"), str) and arm["status"] not in ARM_STATUSES:
                problems.append(f"{where}.status {arm['status']!r} is not one of {', '.join(ARM_STATUSES)}")
    return problems


def validate(record: Any) -> list[str]:
    """Every way ``record`` departs from schema 1, as human-readable sentences; empty when it is valid.

    Required keys (extra keys such as ``timing`` or ``calibration`` are allowed):
    ``schema`` (1), ``id`` (int >= 1), ``title`` (non-empty str), ``timestamp`` (ISO-8601 UTC str, see
    `utc_timestamp`), ``kind`` (one of `KINDS`), ``experiment`` (non-empty str), ``workload`` {name: str,
    shape: mapping}, ``metric`` {name: str, unit: str, higher_is_better: bool}, ``arms`` (non-empty list of
    {label: non-empty str, knobs: mapping, status: "ok"|"invalid"} with optional error (str|null),
    parity_error, tflops, gbps, pct_roofline (number|null) and stats (mapping|null)), ``comparison`` (null or
    {delta, ci_low, ci_high, p_value: number, rounds: int}, where delta = median per-round ratio B/A - 1),
    ``bar`` (number, a fraction like delta: 0.02 means 2%; the kinds of `KINDS_WITH_BAR` were judged against it,
    the others store 0.0), ``verdict`` (one of `VERDICTS`), ``environment``
    and ``software`` (mappings), ``git`` {commit: str|null, dirty: bool|null}, ``command`` and ``notes`` (str).
    """
    return _schema_problems(record, require_id=True)


# ---------------------------------------------------------------------------------------------------- append


def _plain(value: Any) -> Any:
    """``value`` as plain YAML data: numpy scalars -> Python numbers, tuples -> lists, mappings -> dicts."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):  # numpy scalars (np.float64, np.bool_, ...)
        return value.item()
    return value  # anything else is left for yaml.safe_dump to store or refuse


def _id_of(name: str) -> int | None:
    match = _RECORD_NAME.match(name) or _RESERVATION_NAME.match(name)
    return int(match.group(1)) if match else None


def _record_exists(directory: Path, record_id: int) -> bool:
    return any(_RECORD_NAME.match(n) and int(n.split("-", 1)[0]) == record_id for n in os.listdir(directory))


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _reserve_id(directory: Path) -> tuple[int, Path]:
    """Reserve the next free id with an O_EXCL file ``.NNNN.reserve``; returns the id and the reservation."""
    candidate = 1
    while True:
        used = [i for i in map(_id_of, os.listdir(directory)) if i is not None]
        candidate = max(candidate, max(used, default=0) + 1)
        reservation = directory / f".{candidate:04d}.reserve"
        try:
            os.close(os.open(reservation, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        except FileExistsError:
            candidate += 1
            continue
        # A writer removes its reservation only once its record is in place: if one finished between our scan
        # and our reservation, its record is visible now, and this id is taken.
        if not _record_exists(directory, candidate):
            return candidate, reservation
        os.remove(reservation)
        candidate += 1


def append(directory: str | Path, record: Mapping[str, Any]) -> AppendResult:
    """Give ``record`` the next id and write it as ``NNNN-slug.yaml`` in ``directory`` (created if missing).

    The stored record is a copy of ``record`` with ``schema`` and ``id`` first (an ``id`` already present is
    replaced) and numpy scalars turned into plain numbers; the caller's mapping is not changed. The write is
    atomic and never replaces a file: the id is reserved with an O_CREAT|O_EXCL file ``.NNNN.reserve``, the
    YAML goes to a temporary file in the same directory, is fsynced and renamed to its final name (which holds
    the reserved id), the directory is fsynced, and only then is the reservation removed. So several processes
    may append at once and each gets its own id. A process killed mid-write can leave a ``.NNNN.reserve``
    behind; that id is then skipped, never reused.

    Raises LedgerError when the record does not pass `validate` (listing every problem), or when the directory
    cannot be created or written (the message names the directory or file and the OS reason, e.g. a read-only
    file system or a full disk).
    """
    directory = Path(directory)
    plain = _plain(record)
    stored: dict[str, Any] = {"schema": plain.get("schema", SCHEMA), "id": None}
    stored.update((k, v) for k, v in plain.items() if k not in ("schema", "id"))
    problems = _schema_problems({k: v for k, v in stored.items() if k != "id"}, require_id=False)
    if problems:
        raise LedgerError("record not written, it is invalid: " + "; ".join(problems))

    try:
        directory.mkdir(parents=True, exist_ok=True)
        record_id, reservation = _reserve_id(directory)
    except FileExistsError:
        raise LedgerError(f"cannot write to ledger directory {directory}: it exists and is not a directory") from None
    except OSError as exc:
        raise LedgerError(f"cannot write to ledger directory {directory}: {exc.strerror or exc}") from None

    stored["id"] = record_id
    final = directory / f"{record_id:04d}-{slugify(stored['title'])}.yaml"
    temp: str | None = None
    try:
        try:
            text = yaml.safe_dump(stored, sort_keys=False, allow_unicode=True)
        except yaml.YAMLError as exc:
            raise LedgerError(f"record not written, it holds a value YAML cannot store: {exc}") from None
        fd, temp = tempfile.mkstemp(prefix=f".{record_id:04d}-", suffix=".tmp", dir=directory)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.rename(temp, final)
        temp = None
        _fsync_directory(directory)
    except OSError as exc:
        raise LedgerError(f"cannot write ledger record {final}: {exc.strerror or exc}") from None
    finally:
        if temp is not None:
            with contextlib.suppress(OSError):
                os.remove(temp)
        with contextlib.suppress(OSError):
            os.remove(reservation)
    return AppendResult(record_id, final)


# ---------------------------------------------------------------------------------------------------- reading


def _read_one(path: Path) -> tuple[dict | None, str | None]:
    """(record, None) for a valid file, (None, reason) otherwise."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"cannot read: {getattr(exc, 'strerror', None) or exc}"
    try:
        record = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        where = f" (line {exc.problem_mark.line + 1})" if exc.problem_mark else ""
        what = " ".join(str(exc.problem or exc.context or "malformed").split())
        if isinstance(exc, yaml.constructor.ConstructorError):
            return None, f"refused, not plain YAML: {what}{where}"
        return None, f"invalid YAML: {what}{where}"
    except yaml.YAMLError as exc:
        return None, "invalid YAML: " + " ".join(str(exc).split())
    if record is None:
        return None, "empty file"
    if isinstance(record, dict) and isinstance(record.get("timestamp"), _dt.datetime):
        # A hand-edited, unquoted timestamp is parsed by YAML as a datetime; keep the stored form.
        stamp = record["timestamp"]
        record["timestamp"] = utc_timestamp(stamp if stamp.tzinfo else stamp.replace(tzinfo=_dt.timezone.utc))
    problems = validate(record)
    if problems:
        return None, "; ".join(problems)
    name_id = int(path.name.split("-", 1)[0])
    if record["id"] != name_id:
        return None, f"file name says id {name_id} but the record says id {record['id']}"
    return record, None


def load(directory: str | Path) -> LedgerContents:
    """Read every ``*.yaml`` record of ``directory`` (a missing directory is an empty ledger).

    Files are parsed with ``yaml.safe_load`` only: an unsafe tag (``!!python/object/apply:...``) is refused,
    never executed. A file that cannot be read or parsed, fails `validate`, is not named ``NNNN-slug.yaml``,
    whose name id differs from its ``id``, or shares its id with another file, is skipped and listed in
    ``problems`` with the reason; every other record loads. Hidden files (reservations, temporaries) are ignored.
    Raises LedgerError only when ``directory`` exists but cannot be listed.
    """
    directory = Path(directory)
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".yaml") and not n.startswith("."))
    except FileNotFoundError:
        return LedgerContents(directory, [], [])
    except OSError as exc:
        raise LedgerError(f"cannot read ledger directory {directory}: {exc.strerror or exc}") from None

    by_id: dict[int, list[tuple[str, dict]]] = {}
    problems: list[Problem] = []
    for name in names:
        if not _RECORD_NAME.match(name):
            problems.append(Problem(name, "file name is not NNNN-slug.yaml (an id of 4+ digits, a dash, a slug)"))
            continue
        record, reason = _read_one(directory / name)
        if reason is not None:
            problems.append(Problem(name, reason))
        else:
            by_id.setdefault(record["id"], []).append((name, record))
    records = []
    for record_id, entries in sorted(by_id.items()):
        if len(entries) == 1:
            records.append(entries[0][1])
            continue
        files = [name for name, _ in entries]
        for name in files:
            others = ", ".join(f for f in files if f != name)
            problems.append(Problem(name, f"duplicate id {record_id} (also in {others})"))
    problems.sort()
    return LedgerContents(directory, records, problems)


def parse_id(text: str) -> int:
    """The record id in ``text`` as typed on a command line: a whole number of 1 or more, in ASCII digits, leading
    zeros allowed (``46``, or ``0046`` as in the file name ``0046-slug.yaml``; surrounding blanks are ignored).

    Raises LedgerError for anything else (``4x``, ``-3``, ``0``, ``4.0``, ``4_6``), saying what an id looks like.
    """
    digits = text.strip()
    if not re.fullmatch(r"[0-9]+", digits) or int(digits) < 1:
        raise LedgerError(f"record id {text!r} is not a whole number of 1 or more; give one like 46 (or 0046, as in "
                          "its file name); `minfer ledger show` lists the records")
    return int(digits)


def get(directory: str | Path, record_id: int) -> dict:
    """The record with id ``record_id`` in ``directory``.

    Raises LedgerError when it is absent (naming the range of ids present, or saying the ledger is empty) or
    when its file was skipped by `load` (naming the file and the reason).
    """
    contents = load(directory)
    for record in contents.records:
        if record["id"] == record_id:
            return record
    for problem in contents.problems:
        if _id_of(problem.file) == record_id:
            raise LedgerError(f"record {record_id} cannot be read: {problem.file}: {problem.reason}")
    if not contents.records:
        raise LedgerError(f"no record {record_id}: the ledger in {contents.directory} has no records yet")
    ids = [r["id"] for r in contents.records]
    raise LedgerError(
        f"no record {record_id} in {contents.directory} (it holds {len(ids)} record(s), ids {min(ids)}..{max(ids)})"
    )


def query(
    records: Iterable[dict], experiment: str | None = None, verdict: str | None = None, last: int | None = None
) -> list[dict]:
    """Records (in id order) of ``experiment`` with ``verdict``, keeping the ``last`` N; None means no filter.

    Raises LedgerError for a verdict outside `VERDICTS` or a ``last`` below 1.
    """
    if verdict is not None and verdict not in VERDICTS:
        raise LedgerError(f"unknown verdict {verdict!r}; valid verdicts: {', '.join(VERDICTS)}")
    if last is not None and last < 1:
        raise LedgerError(f"last must be at least 1, got {last}")
    chosen = sorted(
        (
            r
            for r in records
            if (experiment is None or r.get("experiment") == experiment)
            and (verdict is None or r.get("verdict") == verdict)
        ),
        key=lambda r: r["id"],
    )
    return chosen[-last:] if last is not None else chosen


# ---------------------------------------------------------------------------------------------------- tables


def arm_text(arm: Mapping[str, Any]) -> str:
    """How an arm is written in tables: its knobs as ``K=V,K=V`` (the ``--arm`` syntax), or its label if none."""
    knobs = arm.get("knobs") or {}
    return ",".join(f"{k}={v}" for k, v in knobs.items()) if knobs else str(arm.get("label", ""))


def arms_text(arms: list) -> str:
    """The arms of a record as a table shows them: only the knobs that differ between the arms (``TM=64 → TM=128``),
    every knob when there is one arm or when the arms are the same (A/A), more than two arms as a count."""
    if len(arms) > 2:
        return f"{len(arms)} points"
    knob_sets = [dict(a.get("knobs") or {}) for a in arms]
    differing = [k for k in knob_sets[0] if any(ks.get(k) != knob_sets[0].get(k) for ks in knob_sets)]
    if len(arms) < 2 or not differing:
        return " → ".join(arm_text(a) for a in arms)
    return " → ".join(",".join(f"{k}={ks.get(k)}" for k in differing) for ks in knob_sets)


def record_arms_text(record: Mapping[str, Any]) -> str:
    """A record's arms as the ledger table shows them: a bench record's tests (``pp2048, tg128``), since they are
    workloads of one configuration, not arms to compare; any other record's `arms_text`."""
    arms = record.get("arms") or []
    if record.get("kind") in KINDS_WITH_WORKLOAD_ARMS:
        return ", ".join(str(a.get("label")) for a in arms)
    return arms_text(arms)


PCT_DIGITS = 6
"""Decimals a percentage is exported with: a fraction's ``* 100`` leaves binary noise (0.239153 -> 23.915300000000002)
that no measurement has; 1e-6 % is far below any A/B's resolution."""


def _pct(value: Any) -> float | None:
    """A stored fraction as percent, rounded to `PCT_DIGITS` decimals (None for a missing or non-finite value)."""
    return round(value * 100.0, PCT_DIGITS) if _is_number(value) and math.isfinite(value) else None


def _median(arm: Mapping[str, Any] | None) -> float | None:
    stats = (arm or {}).get("stats") or {}
    value = stats.get("median")
    return float(value) if _is_number(value) and math.isfinite(value) else None


def _row(record: Mapping[str, Any], workload: Any, arm_a: Mapping[str, Any] | None,
         arm_b: Mapping[str, Any] | None) -> dict[str, Any]:
    comparison = record.get("comparison") or {}
    git = record.get("git") or {}
    p_value = comparison.get("p_value")
    return {
        "id": record["id"],
        "date": record.get("timestamp"),
        "kind": record.get("kind"),
        "experiment": record.get("experiment"),
        "workload": workload,
        "arm_a": arm_text(arm_a) if arm_a else None,
        "arm_b": arm_text(arm_b) if arm_b else None,
        "a_median": _median(arm_a),
        "b_median": _median(arm_b),
        "unit": (record.get("metric") or {}).get("unit"),
        "delta_pct": _pct(comparison.get("delta")),
        "ci_low_pct": _pct(comparison.get("ci_low")),
        "ci_high_pct": _pct(comparison.get("ci_high")),
        "p_value": p_value if _is_number(p_value) and math.isfinite(p_value) else None,
        "bar_pct": _pct(record.get("bar")) if record.get("kind") in KINDS_WITH_BAR else None,
        "verdict": record.get("verdict"),
        "title": record.get("title"),
        "commit": git.get("commit"),
        "dirty": git.get("dirty"),
    }


def _rows(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The flat rows of one record (see `to_frame`)."""
    arms = record.get("arms") or []
    kind = record.get("kind")
    if kind in KINDS_WITH_WORKLOAD_ARMS:  # one configuration on several workloads: a row per workload
        return [_row(record, arm.get("label"), arm, None) for arm in arms]
    workload = (record.get("workload") or {}).get("name")
    if kind == "sweep":  # a grid: its best point, not the first two points
        best = (record.get("best") or {}).get("label")
        return [_row(record, workload, next((a for a in arms if a.get("label") == best), None), None)]
    return [_row(record, workload, arms[0] if arms else None, arms[1] if len(arms) > 1 else None)]


def to_frame(records: Iterable[Mapping[str, Any]]) -> "pd.DataFrame":
    """One row per record (a bench record: one per pp/tg test) with the flat columns of `COLUMNS` (nullable
    dtypes; a missing value is <NA>).

    ``date`` is the timestamp; ``workload`` the workload's name; ``arm_a``/``arm_b`` are `arm_text` of
    arms[0]/arms[1] (<NA> without a second arm; a sweep gives its best point as ``arm_a`` and no ``arm_b``);
    ``a_median``/``b_median`` the arms' ``stats.median`` in ``unit``. A bench record (`KINDS_WITH_WORKLOAD_ARMS`)
    measured one engine configuration on several tests, so it gives one row per test: ``workload`` is the test
    (``pp2048``, ``tg128``: the names `minfer ab bench -w` takes; the model is in ``title``), ``arm_a`` the
    engine knobs, ``a_median`` its tok/s, and no ``arm_b``. ``delta_pct``, ``ci_low_pct``, ``ci_high_pct`` are the
    comparison in percent (<NA> without one); ``bar_pct`` the bar in percent for the kinds judged against one
    (`KINDS_WITH_BAR`: ab, calibrate), <NA> for the others; ``commit``/``dirty`` come from ``git``. Rows keep the
    records' order. An empty string is stored as missing, so that every export reads back to the same frame.
    """
    import pandas as pd

    rows = [{k: (None if v == "" else v) for k, v in row.items()} for r in records for row in _rows(r)]
    columns = {name: pd.array([row[name] for row in rows], dtype=dtype) for name, dtype in COLUMNS.items()}
    return pd.DataFrame(columns)


def export(records: Iterable[Mapping[str, Any]], fmt: str) -> str:
    """`to_frame` of ``records`` (one row per record, per test for bench) as text ending in a newline: ``md`` (a
    Markdown table), ``csv``, or ``json`` (a list of row objects).

    CSV and JSON read back to the same frame: ``pd.read_csv(buf, dtype=COLUMNS)`` and
    ``pd.read_json(buf, orient="records", dtype=False).astype(COLUMNS)``. Raises LedgerError for another format.
    """
    if fmt not in FORMATS:
        raise LedgerError(f"unknown export format {fmt!r}; valid formats: {', '.join(FORMATS)}")
    frame = to_frame(records)
    if fmt == "csv":
        return frame.to_csv(index=False)
    if fmt == "json":
        return frame.to_json(orient="records", force_ascii=False) + "\n"
    shown = frame.astype(object).where(frame.notna(), None)
    return shown.to_markdown(index=False, missingval="") + "\n"
