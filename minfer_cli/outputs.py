"""Files minfer writes on request (plots, exports): checked before any work, written whole or not at all.

The rules (docs/ledger.md, "Nothing else writes in the ledger directory"): a path inside the ledger directory is
refused, an existing path is refused unless ``force``, a directory or a missing parent directory is refused, and
the file is written to a temporary file in the same directory and renamed into place, so a reader never sees half
a file and a failed write leaves nothing behind. Every refusal is a `UsageError` of one line.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Callable

from minfer_cli.errors import MinferError, UsageError

PLOT_SUFFIXES = (".png", ".svg")
"""File types a plot is written as (matplotlib picks the format from the suffix)."""


def _inside(path: Path, directory: Path) -> bool:
    try:
        path.relative_to(directory)
    except ValueError:
        return False
    return True


def check_output_path(path: str | Path, *, force: bool, ledger_dir: str | Path | None,
                      suffixes: tuple[str, ...] | None = None) -> Path:
    """``path`` as a Path once it may be written; call it before any measurement so a bad path costs nothing.

    Raises UsageError when ``path``'s suffix is not one of ``suffixes`` (any case; None allows any), when it lies
    inside ``ledger_dir`` (as written or through symbolic links), when it is a directory, when its parent directory
    is missing or not writable, or when it exists and ``force`` is false.
    """
    path = Path(path).expanduser()
    if path.name in ("", ".", ".."):
        raise UsageError(f"cannot write {path}: give a file name, e.g. {path / ('out' + (suffixes or ('',))[0])}")
    parent = path.parent
    if not parent.is_dir():
        raise UsageError(f"cannot write {path}: directory {parent} does not exist")
    if ledger_dir is not None:
        ledger = Path(ledger_dir).expanduser()
        try:
            ledger_real = ledger.resolve()  # symbolic links resolved as far as the path exists
            where = parent.resolve() / path.name
            target = path.resolve()
        except (RuntimeError, OSError):  # a symlink loop (RuntimeError before Python 3.13)
            raise UsageError(f"cannot write {path}: it is a loop of symbolic links") from None
        if _inside(where, ledger_real) or _inside(target, ledger_real):
            raise UsageError(f"cannot write {path}: it is inside the ledger directory {ledger}, where only records "
                             "live; write it elsewhere")
    if path.is_dir():
        raise UsageError(f"cannot write {path}: it is a directory; give a file name")
    if suffixes is not None and path.suffix.lower() not in suffixes:
        raise UsageError(f"cannot write {path}: the file name must end in {' or '.join(suffixes)}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write {path}: directory {parent} is not writable")
    if (path.exists() or path.is_symlink()) and not force:
        raise UsageError(f"{path} exists; add --force to replace it, or give another file name")
    return path


def write_output(path: str | Path, write_fn: Callable[[Path], None], *, force: bool,
                 ledger_dir: str | Path | None, suffixes: tuple[str, ...] | None = None) -> Path:
    """Write an output file through ``write_fn(temporary_path)`` and rename it to ``path``; returns ``path``.

    ``write_fn`` writes the whole file to the temporary path it is given (same directory, same suffix). The checks
    of `check_output_path` run first (UsageError). Without ``force`` the rename never replaces a file that appeared
    meanwhile (UsageError); with it, an existing file is replaced atomically. The temporary file is removed when
    ``write_fn`` raises (its exception passes through); an OSError while writing becomes a MinferError naming the
    path.
    """
    path = check_output_path(path, force=force, ledger_dir=ledger_dir, suffixes=suffixes)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix)
    os.close(fd)
    tmp = Path(temporary)
    try:
        try:
            write_fn(tmp)
            os.chmod(tmp, 0o666 & ~_umask())
            if force:
                os.replace(tmp, path)
            else:
                _link_no_clobber(tmp, path)
        except OSError as exc:
            raise MinferError(f"cannot write {path}: {exc.strerror or exc}") from None
        except MinferError:
            raise
        except Exception as exc:  # a drawing library that chokes on a value: one line, nothing half-written
            raise MinferError(f"cannot draw {path}: {type(exc).__name__}: {' '.join(str(exc).split())[:160]}") from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
    return path


def _link_no_clobber(tmp: Path, path: Path) -> None:
    """Put ``tmp`` at ``path`` only if nothing is there (a hard link fails on an existing name)."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise UsageError(f"{path} exists; add --force to replace it, or give another file name") from None
    except OSError:  # a filesystem without hard links: check, then rename
        if path.exists() or path.is_symlink():
            raise UsageError(f"{path} exists; add --force to replace it, or give another file name") from None
        os.replace(tmp, path)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
