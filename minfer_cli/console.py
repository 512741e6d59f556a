"""The one place that prints: rich console objects, progress bars, and errors turned into exit codes.

Core modules raise `minfer_cli.errors.MinferError` subclasses; `guard()` turns each into one line on stderr
(no traceback) and the error's exit status. `quiet_when_stdout_closes()` makes every command stop writing,
silently, once the reader of stdout has gone (`minfer ledger show | head -1`).
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


def error_line(message: str) -> None:
    """Print one error sentence on stderr, prefixed with `error:`."""
    err.print(f"[bold red]error:[/] {message}", soft_wrap=True)


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
        except KeyboardInterrupt:
            error_line("interrupted")
            raise typer.Exit(code=130) from None

    return wrapper  # type: ignore[return-value]


class _ClosedStdoutIsQuiet:
    """Stands in for ``sys.stdout``: writes and flushes pass through until one fails with a broken pipe; from then
    on the descriptor is pointed at the null device (so the interpreter's last flush cannot fail either) and
    everything written is dropped. Every other attribute (``isatty``, ``fileno``, ``encoding``...) is the stream's."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._closed = False

    def _reader_gone(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError, ValueError, AttributeError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, self._stream.fileno())
            finally:
                os.close(devnull)

    def write(self, text: str) -> int:
        if not self._closed:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._reader_gone()
        return len(text)

    def flush(self) -> None:
        if not self._closed:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._reader_gone()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def quiet_when_stdout_closes() -> None:
    """Once the reader of stdout goes away (`minfer ledger show | head -1`), drop the rest of stdout, silently.

    Installed once, by the console script (`minfer_cli.main.cli`), for every command: `print`, the rich `out`
    console and typer's help all write through ``sys.stdout``. No BrokenPipeError reaches the user or typer (which
    would turn it into exit status 1, the status `ledger show` gives for skipped files); the command runs to its
    end, so a measurement still reaches the ledger, and exits with its own status. stderr is left as it is, so
    errors still show.
    """
    if not isinstance(sys.stdout, _ClosedStdoutIsQuiet) and sys.stdout is not None:
        sys.stdout = _ClosedStdoutIsQuiet(sys.stdout)


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


def verdict_text(verdict: str) -> str:
    style = VERDICT_STYLE.get(verdict, "")
    return f"[{style}]{verdict}[/]" if style else verdict
