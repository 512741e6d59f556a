"""The one place that prints: rich console objects, progress bars, and errors turned into exit codes.

Core modules raise `minfer_cli.errors.MinferError` subclasses; `guard()` turns each into one line on stderr
(no traceback) and the error's exit status. `guard_streams()` makes every command stop writing, silently,
once the reader of stdout has gone (`minfer ledger show | head -1`), fall back to ASCII where the terminal cannot
take Unicode, and report a full disk in one line.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from typing import Any, Callable, Iterator, TypeVar

import typer
from rich.console import Console

from kernels.errors import KernelConstraintError
from minfer_cli.errors import MinferError

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)

VERDICT_STYLE = {"LANDED": "bold green", "REVERTED": "bold red", "NEUTRAL": "yellow", "INVALID": "bold magenta"}

F = TypeVar("F", bound=Callable)


def clean(text: object) -> str:
    """``text`` safe to print: every character a terminal would act on instead of showing (control characters,
    escape sequences, bidirectional overrides, tabs, newlines) written as a Python escape (``\\x1b``, ``\\u202e``),
    so a record or a file name can never move the cursor, recolour the screen or split a table row."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)


def plain(text: object) -> str:
    """``text`` cleaned (`clean`) and with rich markup escaped: what came from a user or a file, printed as is."""
    from rich.markup import escape

    return escape(clean(text))


def json_text(value: Any, **options: Any) -> str:
    """``json.dumps(value, ensure_ascii=False, **options)`` with every character a terminal could take as control
    (C1 controls such as U+009B, bidi overrides: what `str.isprintable` rejects and JSON leaves raw) written as its
    ``\\uXXXX`` escape: the same JSON value, safe to print."""
    import json

    text = json.dumps(value, ensure_ascii=False, **options)
    if text.isprintable():
        return text
    out = []
    for ch in text:
        if ch.isprintable() or ch in "\n ":
            out.append(ch)
        else:
            units = ch.encode("utf-16-be")
            out.extend(f"\\u{int.from_bytes(units[i:i + 2], 'big'):04x}" for i in range(0, len(units), 2))
    return "".join(out)


ERROR_LINE_MAX = 600
"""Characters of an error line at most: a message quoting a hostile input (a 2 MB architecture name, a tensor name of
60,000 characters) is cut there, with a count of what was left out."""


def error_line(message: str) -> None:
    """Print one error sentence on stderr, prefixed with `error:` (the message is printed as text, never as markup),
    cut at `ERROR_LINE_MAX` characters."""
    text = plain(message)
    if len(text) > ERROR_LINE_MAX:
        text = f"{text[:ERROR_LINE_MAX]}… ({len(text) - ERROR_LINE_MAX:,} more characters)"
    err.print(f"[bold red]error:[/] {text}", soft_wrap=True)


def guard(func: F) -> F:
    """Decorator for command functions: a MinferError becomes one line on stderr and its exit status."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except MinferError as exc:
            error_line(str(exc))
            raise typer.Exit(code=exc.exit_code) from None
        except KernelConstraintError as exc:
            error_line(str(exc))
            raise typer.Exit(code=2) from None
        except OSError as exc:  # a path the system refuses (too long, read-only, vanished): one line, not a traceback
            where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
            error_line(f"{where}{exc.strerror or exc}")
            raise typer.Exit(code=2) from None
        except KeyboardInterrupt:
            error_line("interrupted")
            raise typer.Exit(code=130) from None

    return wrapper  # type: ignore[return-value]


ASCII_FALLBACK = str.maketrans({
    "µ": "u", "→": "->", "±": "+/-", "Δ": "d", "—": "-", "–": "-", "…": "...", "≤": "<=", "≥": ">=", "·": "-",
    "°": "", "×": "x", "━": "-", "─": "-", "╇": "+", "┃": "|", "│": "|", "╭": "+", "╮": "+", "╰": "+", "╯": "+",
    "┏": "+", "┓": "+", "┗": "+", "┛": "+", "┳": "+", "┻": "+", "╋": "+", "┡": "+", "┩": "+", "├": "+", "┤": "+",
    "┼": "+", "┌": "+", "┐": "+", "└": "+", "┘": "+", "┬": "+", "┴": "+", "█": "#", "▏": "|", "▕": "|",
})
"""What minfer's own non-ASCII characters become on a stream that cannot encode them (LC_ALL=C, PYTHONIOENCODING=
ascii); anything else such a stream cannot take is written as ``?``."""


def ascii_stdout() -> bool:
    """True when stdout is a guarded stream that transliterates to ASCII (`ASCII_FALLBACK`): a table fitted to the
    terminal must then measure its cells as they will be written ("…" is three characters there, not one)."""
    import sys

    return bool(getattr(sys.stdout, "_ascii", False)) and isinstance(sys.stdout, _GuardedStream)


def _encodes(stream: Any, text: str) -> bool:
    try:
        text.encode(getattr(stream, "encoding", None) or "ascii")
        return True
    except (UnicodeEncodeError, LookupError):
        return False


class _GuardedStream:
    """Stands in for ``sys.stdout`` / ``sys.stderr``: what is written passes through, except that
    * on a stream whose encoding cannot take minfer's characters (µ, →, box drawing), text is transliterated
      (`ASCII_FALLBACK`) and any other character the encoding lacks becomes ``?``: never a UnicodeEncodeError;
    * once a write fails with a broken pipe (the reader went away: `minfer ledger show | head -1`), the descriptor is
      pointed at the null device and everything later is dropped, silently;
    * once a write fails with another OS error (a full disk: `> /dev/full`), the rest is dropped too and
      ``failure`` keeps the reason, so the console script can say it in one line and exit non-zero.
    Every other attribute (``isatty``, ``fileno``, ``encoding``...) is the stream's."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._closed = False
        self._ascii = not _encodes(stream, "µ→±━┃…")
        self.failure: str | None = None

    def _drop_from_now_on(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError, ValueError, AttributeError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, self._stream.fileno())
            finally:
                os.close(devnull)

    def _fail(self, exc: OSError) -> None:
        if not isinstance(exc, BrokenPipeError) and self.failure is None:
            self.failure = exc.strerror or str(exc)
        self._drop_from_now_on()

    def write(self, text: str) -> int:
        if not self._closed:
            if self._ascii:
                text = text.translate(ASCII_FALLBACK)
                encoding = getattr(self._stream, "encoding", None) or "ascii"
                text = text.encode(encoding, "replace").decode(encoding)
            try:
                return self._stream.write(text)
            except OSError as exc:
                self._fail(exc)
        return len(text)

    def flush(self) -> None:
        if not self._closed:
            try:
                self._stream.flush()
            except OSError as exc:
                self._fail(exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def guard_streams() -> None:
    """Install `_GuardedStream` on stdout and stderr (once, by the console script `minfer_cli.main.cli`), so that
    no command ends in a traceback because of where its output goes: an ASCII-only terminal, a reader that went
    away, a full disk. A closed stdout is met quietly: the command runs to its end (a measurement still reaches
    the ledger) and exits with its own status; stderr still shows errors."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is None:  # started with the descriptor closed (`minfer ... >&-`): write nowhere, quietly
            stream = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - lives as long as the process
        if not isinstance(stream, _GuardedStream):
            setattr(sys, name, _GuardedStream(stream))


def output_failure() -> str | None:
    """Why stdout could not be written (e.g. "No space left on device"), or None; a closed pipe is no failure."""
    stream = sys.stdout
    return stream.failure if isinstance(stream, _GuardedStream) else None


@contextlib.contextmanager
def progress(title: str) -> Iterator[Callable[[str, float], None]]:
    """A rich progress bar on stderr (stdout stays clean for tables and exports); yields report(text, fraction)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    bar = Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    )
    with bar:
        task = bar.add_task(title, total=1.0)

        def report(text: str, fraction: float) -> None:
            bar.update(task, description=f"{title}: {text}", completed=max(0.0, min(1.0, fraction)))

        yield report


@contextlib.contextmanager
def progress_if_needed(title: str) -> Iterator[Callable[[str, float], None]]:
    """`progress` that draws nothing until the first report: for work that is usually instant (reading a ledger
    whose records are indexed) and only sometimes long (10,000 records parsed for the first time)."""
    with contextlib.ExitStack() as stack:
        live: list[Callable[[str, float], None]] = []

        def report(text: str, fraction: float) -> None:
            if not live:
                live.append(stack.enter_context(progress(title)))
            live[0](text, fraction)

        yield report


def verdict_text(verdict: str) -> str:
    style = VERDICT_STYLE.get(verdict, "")
    return f"[{style}]{verdict}[/]" if style else verdict
