"""The ledger on disk: where it is, appending a record atomically, and reading every record without trusting a file.

A ledger is a directory of records named ``NNNN-slug.yaml`` (zero-padded id, slug from the title); docs/ledger.md
is the design. Records are written once, atomically, and never rewritten; several processes may append to the
same directory at once (see `append`).

Reading never executes anything and never hangs: only regular files are opened, a file over `RECORD_MAX_BYTES` is
not read, parsing is ``yaml.CSafeLoader`` (``SafeLoader`` without libyaml), and any exception while reading one
file makes it a `Problem` while every other record still loads. Records already parsed come from the derived
index (`minfer_cli.ledger.index`), which is checked and never trusted.

This module returns data and raises `LedgerError`; it never prints.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import os
import re
import stat
import tempfile
import tomllib
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, NamedTuple

import yaml

from minfer_cli.errors import LedgerError
from minfer_cli.knobs import ENV_LEDGER, env
from minfer_cli.ledger import index as _index
from minfer_cli.ledger.schema import ID_MAX, KINDS, SCHEMA, VERDICTS, _schema_problems, validate

RECORD_MAX_BYTES = 1 << 20
"""Largest record file read or written (1 MiB); minfer's own records are a few KiB, samples included."""
RECORD_MAX_NODES = 200_000
"""Most values (mapping entries and list items, aliases expanded) one record may hold."""
RECORD_MAX_DEPTH = 64
"""Deepest nesting one record may have."""

_RECORD_NAME = re.compile(r"^([0-9]{4,})-.*\.yaml$")  # ASCII digits only (\d takes "٠٠٢١" as 21)
_RESERVATION_NAME = re.compile(r"^\.(\d{4,})\.reserve$")
_SLUG_MAX = 48
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _NoAliasDumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # type: ignore[misc]
    """The safe dumper (libyaml's emitter where present) that never writes anchors: a record reads the same to a
    person and to any YAML reader."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


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
    """Everything `load` read from a directory.

    records: valid records sorted by id (then file name); files: the file name of each record, same order;
    problems: the files skipped, with the reason; duplicates: id -> the files that share it (all of them are in
    ``records``: a duplicate is shown and flagged, never hidden).
    """

    directory: Path
    records: list[dict]
    problems: list[Problem]
    files: list[str] = field(default_factory=list)
    duplicates: dict[int, list[str]] = field(default_factory=dict)

    def file_of(self, record: Mapping[str, Any]) -> str:
        """The file name ``record`` (one of ``records``) was read from."""
        for rec, name in zip(self.records, self.files):
            if rec is record:
                return name
        raise KeyError("record not from this ledger")


# ---------------------------------------------------------------------------------------------------- location


def ledger_dir(explicit: str | Path | None = None) -> Path:
    """The ledger directory to use.

    Order: ``explicit`` (the ``--ledger`` option) > the MINFER_LEDGER environment variable > ``ledger/records``
    under the project root (the nearest ancestor of the working directory holding a pyproject.toml whose
    [project] name is "minfer") > the project this module was installed from (an editable install) > ``ledger/records``
    under the working directory. The directory need not exist. Raises LedgerError when the working directory was
    deleted (nothing relative can be resolved then).
    """
    if explicit:
        return Path(explicit).expanduser()
    from_env = env(ENV_LEDGER)
    if from_env:
        return Path(from_env).expanduser()
    try:
        cwd = Path.cwd()
    except (FileNotFoundError, OSError):
        raise LedgerError("the working directory no longer exists; cd to an existing directory or give --ledger DIR") from None
    installed = Path(__file__).resolve().parents[2]
    for folder in (cwd, *cwd.parents, installed):
        if _is_minfer_project(folder / "pyproject.toml"):
            return folder / "ledger" / "records"
    return cwd / "ledger" / "records"


def check_writable(directory: str | Path) -> None:
    """Raise LedgerError (before any measurement) when a record could not be written to ``directory``: it is a
    file, it exists but is not writable, or it does not exist and its parent is missing (a mistyped --ledger) or
    not writable (so it could not be created)."""
    directory = Path(directory)
    if directory.exists():
        if not directory.is_dir():
            raise LedgerError(f"ledger directory {directory} is a file, not a directory; fix --ledger or MINFER_LEDGER")
        if not os.access(directory, os.W_OK | os.X_OK):
            raise LedgerError(f"ledger directory {directory} is not writable; fix its permissions or choose another with --ledger")
        return
    parent = directory.parent
    if not parent.is_dir():
        raise LedgerError(f"ledger directory {directory} does not exist, nor does its parent; create it or fix --ledger / MINFER_LEDGER")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise LedgerError(f"ledger directory {directory} cannot be created: {parent} is not writable; choose another with --ledger")


def _is_minfer_project(pyproject: Path) -> bool:
    try:
        with pyproject.open("rb") as f:
            data = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError, ValueError):
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


# ---------------------------------------------------------------------------------------------------- append


def _plain(value: Any) -> Any:
    """``value`` as plain YAML data: numpy scalars -> Python numbers, tuples -> lists, mappings -> dicts, text that
    is not valid UTF-8 (lone surrogates) -> its backslash escape (``\\udcff``)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):  # numpy scalars (np.float64, np.bool_, ...)
        return value.item()
    if isinstance(value, str):  # a byte the shell could not decode arrives as a lone surrogate: keep it visible
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value  # anything else is left for yaml.safe_dump to store or refuse


def _id_of(name: str) -> int | None:
    match = _RECORD_NAME.match(name) or _RESERVATION_NAME.match(name)
    if not match:
        return None
    value = int(match.group(1)) if len(match.group(1)) <= 10 else ID_MAX + 1
    return value if 1 <= value <= ID_MAX else None


def _record_exists(directory: Path, record_id: int) -> bool:
    return any(_RECORD_NAME.match(n) and _id_of(n) == record_id for n in os.listdir(directory))


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


RESERVATION_STALE_S = 3600
"""A reservation older than this was left by a writer that died: it no longer holds its id back."""


def _used_ids(directory: Path) -> list[int]:
    """Ids taken: those of valid records (a junk or unreadable file cannot push ids up) and of reservations younger
    than `RESERVATION_STALE_S` (a writer at work)."""
    import time

    used = [r["id"] for r in load(directory).records]
    now = time.time()
    for name in os.listdir(directory):
        match = _RESERVATION_NAME.match(name)
        if match and (rid := _id_of(name)) is not None:
            with contextlib.suppress(OSError):
                if now - os.stat(directory / name).st_mtime < RESERVATION_STALE_S:
                    used.append(rid)
    return used


def _reserve_id(directory: Path) -> tuple[int, Path]:
    """Reserve the next free id with an O_EXCL file ``.NNNN.reserve``; returns the id and the reservation.

    The next id follows the valid records and live reservations (`_used_ids`), so a junk file name or a stale
    reservation cannot push ids out of range; an id some file name already holds is skipped."""
    candidate = 1
    while True:
        used = _used_ids(directory)
        candidate = max(candidate, max(used, default=0) + 1)
        if candidate > ID_MAX:
            raise LedgerError(f"ledger directory {directory} has used every id up to {ID_MAX}; start a new ledger")
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


def dump(record: Mapping[str, Any]) -> str:
    """``record`` as the YAML text `append` stores (plain data, key order kept, Unicode as is, no anchors)."""

    return yaml.dump(_plain(record), Dumper=_NoAliasDumper, sort_keys=False, allow_unicode=True, width=10**6)


def append(directory: str | Path, record: Mapping[str, Any]) -> AppendResult:
    """Give ``record`` the next id and write it as ``NNNN-slug.yaml`` in ``directory`` (created if missing).

    The stored record is a copy of ``record`` with ``schema`` and ``id`` first (an ``id`` already present is
    replaced) and numpy scalars turned into plain numbers; the caller's mapping is not changed. The write is
    atomic and never replaces a file: the id is reserved with an O_CREAT|O_EXCL file ``.NNNN.reserve``, the
    YAML goes to a temporary file in the same directory, is fsynced and renamed to its final name (which holds
    the reserved id), the directory is fsynced, and only then is the reservation removed. So several processes
    may append at once and each gets its own id. A process killed mid-write can leave a ``.NNNN.reserve``
    behind; that id is then skipped, never reused.

    Raises LedgerError when the record does not pass `validate` (listing every problem), is larger than
    `RECORD_MAX_BYTES`, or when the directory cannot be created or written (the message names the directory or
    file and the OS reason, e.g. a read-only file system or a full disk).
    """
    directory = Path(directory)
    plain = _plain(record)
    stored: dict[str, Any] = {"schema": plain.get("schema", SCHEMA), "id": None}
    stored.update((k, v) for k, v in plain.items() if k not in ("schema", "id"))
    problems = _schema_problems({k: v for k, v in stored.items() if k != "id"}, require_id=False)
    if problems:
        raise LedgerError("record not written, it is invalid: " + "; ".join(problems))
    try:
        size = len(dump({**stored, "id": ID_MAX}).encode("utf-8"))
    except yaml.YAMLError as exc:
        raise LedgerError(f"record not written, it holds a value YAML cannot store: {exc}") from None
    if size > RECORD_MAX_BYTES:
        raise LedgerError(f"record not written: {size} bytes is over the ledger's limit of {RECORD_MAX_BYTES} bytes")

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
        text = dump(stored)
        fd, temp = tempfile.mkstemp(prefix=f".{record_id:04d}-", suffix=".tmp", dir=directory)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temp, 0o666 & ~umask)  # readable as any file the user creates (mkstemp makes 0600): a shared ledger
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


def save_unrecorded(record: Mapping[str, Any]) -> Path:
    """Write ``record`` (which could not go to the ledger) to a new file under ``unrecorded/`` in minfer's cache
    directory and return its path; nothing measured is lost. Raises LedgerError when that fails too."""
    folder = _index.cache_dir() / "unrecorded"
    title = str(record.get("title") or "record")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(prefix=".", suffix=".tmp", dir=folder)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(dump(record))
            f.flush()
            os.fsync(f.fileno())
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
        final = folder / f"{stamp}-{slugify(title)}.yaml"
        os.link(temp, final)  # never replaces a file
        os.remove(temp)
        return final
    except (OSError, yaml.YAMLError) as exc:
        raise LedgerError(f"cannot save the record to {folder}: {getattr(exc, 'strerror', None) or exc}") from None


# ---------------------------------------------------------------------------------------------------- reading


def _bounded(value: Any) -> str | None:
    """Why ``value`` (freshly parsed) is too big or too deep to be a record, or None. Iterative: never recurses,
    and stops counting at the limit, so an alias bomb costs at most `RECORD_MAX_NODES` steps."""
    stack = [(value, 1)]
    nodes = 0
    while stack:
        item, depth = stack.pop()
        if depth > RECORD_MAX_DEPTH:
            return f"nested deeper than {RECORD_MAX_DEPTH} levels"
        if isinstance(item, dict):
            nodes += len(item)
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            nodes += len(item)
            stack.extend((v, depth + 1) for v in item)
        if nodes > RECORD_MAX_NODES:
            return f"holds more than {RECORD_MAX_NODES} values (aliases expanded)"
    return None


def _parse(data: bytes, name_id: int) -> tuple[dict | None, str | None]:
    """(record, None) for a valid file's bytes, (None, reason) otherwise. Never raises."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None, "cannot read: not UTF-8 text"
    try:
        record = yaml.load(text, Loader=_Loader)  # noqa: S506 - a safe loader (CSafeLoader / SafeLoader)
    except yaml.MarkedYAMLError as exc:
        where = f" (line {exc.problem_mark.line + 1})" if exc.problem_mark else ""
        what = " ".join(str(exc.problem or exc.context or "malformed").split())
        if isinstance(exc, yaml.constructor.ConstructorError):
            return None, f"refused, not plain YAML: {what}{where}"
        return None, f"invalid YAML: {what}{where}"
    except yaml.YAMLError as exc:
        return None, "invalid YAML: " + " ".join(str(exc).split())
    except RecursionError:
        return None, "refused: nested too deeply to parse"
    except Exception as exc:  # e.g. a 5,000-digit integer (ValueError): one file, one line, never a traceback
        return None, f"refused: {type(exc).__name__}: {' '.join(str(exc).split())[:160]}"
    if record is None:
        return None, "empty file"
    too_big = _bounded(record)
    if too_big:
        return None, f"refused: {too_big}"
    if isinstance(record, dict) and isinstance(record.get("timestamp"), _dt.datetime):
        # A hand-edited, unquoted timestamp is parsed by YAML as a datetime; keep the stored form.
        stamp = record["timestamp"]
        record["timestamp"] = utc_timestamp(stamp if stamp.tzinfo else stamp.replace(tzinfo=_dt.timezone.utc))
    try:
        problems = validate(record)
    except Exception as exc:  # a value no check foresaw: the file is skipped, not the ledger
        return None, f"refused: {type(exc).__name__} while checking it"
    if problems:
        return None, "; ".join(problems)
    if record["id"] != name_id:
        return None, f"file name says id {name_id} but the record says id {record['id']}"
    return record, None


def _read_bytes(directory: Path, name: str) -> tuple[bytes | None, str | None]:
    """The bytes of ``directory/name`` when it is a regular file (or a symlink to one inside the ledger) of at
    most `RECORD_MAX_BYTES`; else (None, reason). Never blocks on a FIFO or a device."""
    path = directory / name
    try:
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode):
            target = Path(os.path.realpath(path))
            if Path(os.path.realpath(directory)) not in target.parents:
                return None, f"refused: a symbolic link to {target}, outside the ledger directory"
            info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            return None, "refused: not a regular file (a FIFO, device or directory is never opened)"
        if info.st_size > RECORD_MAX_BYTES:
            return None, f"refused: {info.st_size} bytes is over the record size limit of {RECORD_MAX_BYTES} bytes"
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # replaced between the check and the open
                return None, "refused: not a regular file"
            chunks, total = [], 0
            while chunk := os.read(fd, 1 << 16):
                chunks.append(chunk)
                total += len(chunk)
                if total > RECORD_MAX_BYTES:
                    return None, f"refused: over the record size limit of {RECORD_MAX_BYTES} bytes"
            return b"".join(chunks), None
        finally:
            os.close(fd)
    except OSError as exc:
        return None, f"cannot read: {exc.strerror or exc}"


PROGRESS_EVERY = 250
"""`load` reports its progress after every this many records it has to parse (none that the index holds)."""


def load(directory: str | Path, progress: Callable[[str, float], None] | None = None) -> LedgerContents:
    """Read every ``*.yaml`` record of ``directory`` (a missing directory is an empty ledger).

    A file that is not a regular file (or a symlink to one inside the directory), is over `RECORD_MAX_BYTES`,
    cannot be read or parsed, holds more than `RECORD_MAX_NODES` values or `RECORD_MAX_DEPTH` levels, fails
    `validate`, is not named ``NNNN-slug.yaml`` with an id 1..`ID_MAX`, or whose name id differs from its ``id``, is
    skipped and listed in ``problems`` with the reason; every other record loads. Files sharing an id all load and
    are listed in ``duplicates``. Hidden files (reservations, temporaries) are ignored. Records parsed before come
    from the derived index when the file's bytes are unchanged (see `minfer_cli.ledger.index`). ``progress(text,
    fraction)`` is called after every `PROGRESS_EVERY` records parsed (a ledger read for the first time).
    Raises LedgerError only when ``directory`` exists but cannot be listed.
    """
    directory = Path(directory)
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".yaml") and not n.startswith("."))
    except FileNotFoundError:
        return LedgerContents(directory, [], [])
    except OSError as exc:
        raise LedgerError(f"cannot read ledger directory {directory}: {exc.strerror or exc}") from None

    cache = _index.open_index(directory)
    found: list[tuple[int, str, dict]] = []
    problems: list[Problem] = []
    parsed = 0
    for position, name in enumerate(names):
        name_id = _id_of(name) if _RECORD_NAME.match(name) else None
        if name_id is None:
            problems.append(Problem(name, f"file name is not NNNN-slug.yaml with an id 1..{ID_MAX} (4+ digits, a dash, a slug)"))
            continue
        data, reason = _read_bytes(directory, name)
        if data is None:
            problems.append(Problem(name, reason or "cannot read"))
            continue
        digest = hashlib.blake2b(data, digest_size=20).hexdigest()
        record = cache.get(name, digest)
        if record is None:
            parsed += 1
            if progress is not None and parsed % PROGRESS_EVERY == 0:
                progress(f"{position + 1:,} of {len(names):,} files", (position + 1) / len(names))
            record, reason = _parse(data, name_id)
            if record is None:
                problems.append(Problem(name, reason or "invalid"))
                continue
            cache.put(name, digest, record)
        found.append((record["id"], name, record))
    cache.save(keep=names)
    found.sort(key=lambda entry: (entry[0], entry[1]))
    by_id: dict[int, list[str]] = {}
    for record_id, name, _ in found:
        by_id.setdefault(record_id, []).append(name)
    duplicates = {i: files for i, files in by_id.items() if len(files) > 1}
    problems.sort()
    return LedgerContents(directory, [r for _, _, r in found], problems, [n for _, n, _ in found], duplicates)


def parse_id(text: str) -> int:
    """The record id in ``text`` as typed on a command line: a whole number 1..`ID_MAX`, in ASCII digits, leading
    zeros allowed (``46``, or ``0046`` as in the file name ``0046-slug.yaml``; surrounding blanks are ignored).

    Raises LedgerError for anything else (``4x``, ``-3``, ``0``, ``4.0``, ``4_6``, ``10000000000``), saying what an
    id looks like.
    """
    digits = text.strip()
    if not re.fullmatch(r"[0-9]{1,12}", digits) or not 1 <= int(digits) <= ID_MAX:
        raise LedgerError(f"record id {text!r} is not a whole number of 1 or more; give one like 46 (or 0046, as in "
                          f"its file name; at most {ID_MAX}); `minfer ledger show` lists the records")
    return int(digits)


def find(contents: LedgerContents, record_id: int) -> list[dict]:
    """Every record of ``contents`` with id ``record_id`` (two or more when files share the id).

    Raises LedgerError when there is none: naming the skipped file and its reason, the range of ids present, or
    saying the ledger is empty.
    """
    chosen = [r for r in contents.records if r["id"] == record_id]
    if chosen:
        return chosen
    for problem in contents.problems:
        if _RECORD_NAME.match(problem.file) and _id_of(problem.file) == record_id:
            raise LedgerError(f"record {record_id} cannot be read: {problem.file}: {problem.reason}")
    if not contents.records:
        raise LedgerError(f"no record {record_id}: the ledger in {contents.directory} has no records yet")
    ids = [r["id"] for r in contents.records]
    raise LedgerError(
        f"no record {record_id} in {contents.directory} (it holds {len(ids)} record(s), ids {min(ids)}..{max(ids)})"
    )


def get(directory: str | Path, record_id: int) -> dict:
    """The record with id ``record_id`` in ``directory`` (the first by file name when several share it).

    Raises LedgerError as `find` does.
    """
    return find(load(directory), record_id)[0]


def _since_ok(record: Mapping[str, Any], since: str | int | None) -> bool:
    if since is None:
        return True
    if isinstance(since, int):
        return record["id"] >= since
    return str(record.get("timestamp", "")) >= since


def parse_since(text: str) -> str | int:
    """``--since`` as typed: a record id (``46``) or a date ``YYYY-MM-DD`` (UTC, inclusive), optionally with a
    time (``2026-11-30T21:00``). Raises LedgerError for anything else."""
    text = text.strip()
    if re.fullmatch(r"[0-9]{1,12}", text):
        return parse_id(text)
    match = re.fullmatch(r"([0-9]{4}-[0-9]{2}-[0-9]{2})(?:[T ]([0-9]{2}:[0-9]{2}(?::[0-9]{2})?))?Z?", text)
    if match:
        try:
            _dt.date.fromisoformat(match.group(1))
            if match.group(2):
                _dt.time.fromisoformat(match.group(2))  # 25:00 is not a time
        except ValueError:
            match = None
    if not match:
        raise LedgerError(f"--since {text!r} is neither a record id nor a date; give e.g. 46 or 2026-11-30 "
                          "(or 2026-11-30T21:00, UTC)")
    return match.group(1) + ("T" + match.group(2) if match.group(2) else "")


def _grep_text(record: Mapping[str, Any]) -> str:
    arms = record.get("arms") if isinstance(record.get("arms"), list) else []
    knobs = " ".join(f"{k}={v}" for arm in arms if isinstance(arm, Mapping)
                     for k, v in (arm.get("knobs") or {}).items())
    return " ".join(str(record.get(k, "")) for k in ("title", "notes", "command", "experiment", "kind",
                                                     "verdict")) + " " + knobs


def query(
    records: Iterable[dict], experiment: str | None = None, verdict: str | None = None, last: int | None = None,
    kind: str | None = None, since: str | int | None = None, grep: str | None = None,
) -> list[dict]:
    """Records (in id order) of ``experiment`` and ``kind`` with ``verdict``, from ``since`` (an id, or a date
    string compared with the timestamp), whose title, notes, command, experiment or knobs contain ``grep`` (any
    case), keeping the ``last`` N; None means no filter.

    Raises LedgerError for a verdict outside `VERDICTS`, a kind outside `KINDS` or a ``last`` below 1.
    """
    if verdict is not None and verdict not in VERDICTS:
        raise LedgerError(f"unknown verdict {verdict!r}; valid verdicts: {', '.join(VERDICTS)}")
    if kind is not None and kind not in KINDS:
        raise LedgerError(f"unknown kind {kind!r}; valid kinds: {', '.join(KINDS)}")
    if last is not None and last < 1:
        raise LedgerError(f"last must be at least 1, got {last}")
    needle = grep.lower() if grep else None
    chosen = sorted(
        (
            r
            for r in records
            if (experiment is None or r.get("experiment") == experiment)
            and (verdict is None or r.get("verdict") == verdict)
            and (kind is None or r.get("kind") == kind)
            and _since_ok(r, since)
            and (needle is None or needle in _grep_text(r).lower())
        ),
        key=lambda r: r["id"],
    )
    return chosen[-last:] if last is not None else chosen
