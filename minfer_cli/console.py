"""The one place that prints: rich console objects, progress bars, and errors turned into exit codes.

Core modules raise `minfer_cli.errors.MinferError` subclasses; `guard()` turns each into one line on stderr
(no traceback) and the error's exit status.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Callable, Iterator, TypeVar

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

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


@contextlib.contextmanager
def progress(title: str) -> Iterator[Callable[[str, float], None]]:
    """A rich progress bar on stderr (stdout stays clean for tables and exports); yields report(text, fraction)."""
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
