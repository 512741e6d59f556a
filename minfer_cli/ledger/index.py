"""The ledger's derived index: records already parsed, so that listing a large ledger parses nothing twice.

Never the source of truth (docs/ledger.md, "Finding records fast"). One JSON file per ledger directory in minfer's
cache directory, never in the ledger directory. It maps a file name to the BLAKE2b hash of the file's bytes and the
record validated from them; a record is taken from it only when the name and the hash both match the file read
now. The file's first line is an HMAC-SHA256 of the rest, keyed by a random key kept (mode 0600) in the cache
directory: an index that is truncated, corrupt, edited, planted or copied from elsewhere fails the check and is
ignored (then rebuilt from the records). Every failure here costs speed only: nothing raises.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from minfer_cli.knobs import ENV_CACHE_DIR, env

FORMAT = 1
_KEY_BYTES = 32


def cache_dir() -> Path:
    """minfer's cache directory: $MINFER_CACHE_DIR, else $XDG_CACHE_HOME/minfer, else ~/.cache/minfer."""
    explicit = env(ENV_CACHE_DIR)
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "minfer"


def _read_regular(path: Path, limit: int) -> bytes | None:
    """The bytes of ``path`` when it is a regular file of at most ``limit`` bytes (never blocks on a FIFO)."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            return None
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def _key(folder: Path) -> bytes | None:
    path = folder / "ledger-index.key"
    data = _read_regular(path, _KEY_BYTES)
    if data is not None and len(data) == _KEY_BYTES:
        return data
    if path.exists() and not path.is_file():
        return None  # a FIFO or a directory where the key should be: no index, never a hang
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(prefix=".key-", dir=folder)
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(_KEY_BYTES))
        os.replace(temp, path)  # a key that was not 32 bytes is no key; every index signed with it is dropped
        data = path.read_bytes()
        return data if len(data) == _KEY_BYTES else None
    except OSError:
        return None


class Index:
    """The index of one ledger directory: `get` a record by file name and content hash, `put` a freshly parsed
    one, `save` once after a read (only when something changed)."""

    def __init__(self, path: Path | None, key: bytes | None, entries: dict[str, list]) -> None:
        self._path, self._key, self._entries = path, key, entries
        self._changed = False

    def get(self, name: str, digest: str) -> dict | None:
        entry = self._entries.get(name)
        if not isinstance(entry, list) or len(entry) != 2 or entry[0] != digest or not isinstance(entry[1], dict):
            return None
        return entry[1]

    def put(self, name: str, digest: str, record: dict) -> None:
        """Remember ``record`` (parsed from a file whose bytes hash to ``digest``) when it survives a JSON round
        trip unchanged; a record JSON cannot hold exactly (a YAML date, an int key) is parsed every time."""
        try:
            text = json.dumps(record, allow_nan=False)
            if json.loads(text) != record:
                return
        except (TypeError, ValueError):
            return
        self._entries[name] = [digest, json.loads(text)]
        self._changed = True

    def save(self, keep: list[str]) -> None:
        """Write the index (atomically) if it changed or holds files no longer present; errors are ignored."""
        names = set(keep)
        stale = [n for n in self._entries if n not in names]
        for name in stale:
            del self._entries[name]
        if not (self._changed or stale) or self._path is None or self._key is None:
            return
        payload = json.dumps({"format": FORMAT, "entries": self._entries}, separators=(",", ":")).encode()
        mac = hmac.new(self._key, payload, hashlib.sha256).hexdigest().encode()
        with contextlib.suppress(OSError):
            self._path.parent.mkdir(parents=True, exist_ok=True)
            fd, temp = tempfile.mkstemp(prefix=".index-", suffix=".tmp", dir=self._path.parent)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(mac + b"\n" + payload)
                os.replace(temp, self._path)
            except OSError:
                with contextlib.suppress(OSError):
                    os.remove(temp)


def index_path(directory: Path) -> Path:
    """Where the index of ``directory`` lives: one file per resolved directory path, in the cache directory."""
    resolved = str(Path(os.path.realpath(directory)))
    tag = hashlib.blake2b(resolved.encode(), digest_size=10).hexdigest()
    return cache_dir() / f"ledger-index-{tag}.json"


def open_index(directory: Path) -> Index:
    """The index of ``directory``: its checked entries, or an empty index when it is absent, unreadable, or fails
    its HMAC or format check (then it is rebuilt as records are read)."""
    try:
        path = index_path(directory)
        ledger_real = Path(os.path.realpath(directory))
        cache_real = Path(os.path.realpath(path.parent))
        if cache_real == ledger_real or ledger_real in cache_real.parents:
            return Index(None, None, {})  # the cache must never write into the ledger directory
        key = _key(path.parent)
    except (OSError, RuntimeError, ValueError):  # no home directory, an unusable cache path
        return Index(None, None, {})
    entries: dict[str, Any] = {}
    if key is not None:
        with contextlib.suppress(OSError, ValueError):
            data = _read_regular(path, 1 << 30) or b""
            mac, _, payload = data.partition(b"\n")
            if hmac.compare_digest(mac, hmac.new(key, payload, hashlib.sha256).hexdigest().encode()):
                parsed = json.loads(payload)
                if isinstance(parsed, dict) and parsed.get("format") == FORMAT and isinstance(parsed.get("entries"), dict):
                    entries = parsed["entries"]
    return Index(path, key, entries)
