"""The `minfer` typer app: global options and the commands from `minfer_cli/commands/`."""

from __future__ import annotations

from typing import Optional

import typer
import typer.core

from minfer_cli import __version__
from minfer_cli.commands import ab, bench, calibrate, doctor, experiments, kernels, ledger, model, run, sweep
from minfer_cli.console import error_line, guard_streams, out, output_failure
from minfer_cli.errors import EnvironmentProblem


def _flags_take_no_value_in_help() -> None:
    """Show no value type after a flag in `--help`.

    typer 0.29's rich help prints a type after every option, flags included (`--record <bool>`, even
    `--help <bool>`, and so for `--x/--no-x` pairs too), as if a flag took a value (`--record true` is an error:
    "unexpected extra argument"). Its plain formatter already leaves flags bare (`not self.is_flag and not
    self.count`); this gives the rich one the same rule, once, for every command. A flag declared with its own
    metavar keeps it. Where typer has no such method (another version), nothing changes.
    """
    option = getattr(typer.core, "TyperOption", None)
    shown = getattr(option, "display_type_rich", None)
    if shown is None or getattr(shown, "_minfer_flags_bare", False):
        return

    def display_type_rich(self, ctx):
        if (getattr(self, "is_flag", False) or getattr(self, "count", False)) and self.metavar is None:
            return None
        return shown(self, ctx)

    display_type_rich._minfer_flags_bare = True
    option.display_type_rich = display_type_rich


_flags_take_no_value_in_help()


def _help_paragraphs_flow() -> None:
    """Let `--help` paragraphs flow to the terminal's width.

    typer 0.29's rich help keeps every single line break of a docstring after its first paragraph, so a sentence
    wrapped at 120 columns in the source breaks mid-line at any other width. This joins the lines of each such
    paragraph, leaving alone a paragraph with an indented line (examples) or one marked ``\\b`` (click's "keep
    as is"). Where typer has no such function (another version), nothing changes.
    """
    try:
        from typer import rich_utils
    except ImportError:
        return
    kept = getattr(rich_utils, "_fix_linebreaks", None)
    if kept is None or getattr(kept, "_minfer_flow", False):
        return

    def fix_linebreaks(paragraphs, markup_mode):
        flowed = [p if p.startswith("\b") or any(line[:1].isspace() for line in p.splitlines())
                  else " ".join(line.strip() for line in p.splitlines()) for p in paragraphs]
        return kept(flowed, markup_mode)

    fix_linebreaks._minfer_flow = True
    rich_utils._fix_linebreaks = fix_linebreaks
    command_help = getattr(rich_utils, "_make_command_help", None)
    if command_help is not None:  # the command list's one-paragraph summaries likewise

        def make_command_help(*, help_text, markup_mode):
            first, *rest = (help_text or "").split("\n\n")
            if not first.lstrip().startswith("\b"):
                first = " ".join(line.strip() for line in first.splitlines())
            return command_help(help_text="\n\n".join([first, *rest]), markup_mode=markup_mode)

        rich_utils._make_command_help = make_command_help


_help_paragraphs_flow()

app = typer.Typer(
    name="minfer",
    help=(
        "minfer: a command-line lab for GPU inference kernels. Experiments with named knobs, timed against "
        "L2-defeating inputs, interleaved A/B comparisons with real statistics, and a YAML ledger of "
        "LANDED / REVERTED / NEUTRAL / INVALID verdicts.\n\n"
        "Example: minfer ab copy --arm VEC=1 --arm VEC=4"
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

NUMPY_MAX = (2, 5)  # numba-cuda 0.30 calls np.row_stack, removed in numpy 2.5 (see pyproject.toml)


def check_numpy() -> None:
    """Refuse to start with a numpy that numba-cuda 0.30 cannot import its CUDA target with (read from the
    installed package's metadata: importing numpy would cost every command ~0.1 s)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version("numpy")
    except PackageNotFoundError:
        return
    major, minor = (int("".join(c for c in x if c.isdigit()) or 0) for x in (installed.split(".") + ["0"])[:2])
    if (major, minor) >= NUMPY_MAX:
        raise EnvironmentProblem(
            f"numpy {installed} is installed, but numba-cuda 0.30 needs numpy < 2.5 (it calls np.row_stack, "
            "removed in 2.5); fix: pip install 'numpy<2.5'"
        )


def _version(value: bool) -> None:
    if value:
        out.print(f"minfer {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Optional[bool] = typer.Option(
        None, "--version", callback=_version, is_eager=True, help="Print minfer's version and exit."
    ),
) -> None:
    try:
        check_numpy()
    except EnvironmentProblem as exc:
        error_line(str(exc))
        raise typer.Exit(code=exc.exit_code) from None


def cli() -> None:
    """The `minfer` console script: the typer app, with command-line errors (a bad option value, a missing
    argument, an unknown command) printed as one `error:` line, exit status 2, like minfer's own errors, and a
    closed stdout (`minfer ledger show | head -1`) met quietly, an ASCII-only terminal given ASCII, and an output that
cannot be written (a full disk) reported in one line, exit status 1 (see `console.guard_streams`)."""
    import sys
    import warnings

    try:  # typer >= 0.20 vendors click as typer._click; older typer uses click itself
        from typer._click import exceptions as click_exceptions
    except ImportError:
        from click import exceptions as click_exceptions

    guard_streams()
    # numba warns when a launch's grid is smaller than the GPU; minfer's launch shapes are chosen (and measured),
    # so the warning is noise in a benchmark's output. Matched by text: the category lives in numba, unimported here.
    warnings.filterwarnings("ignore", message=r".*will likely result in GPU under-utilization")
    try:
        code = app(standalone_mode=False)
    except click_exceptions.UsageError as exc:
        where = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx is not None else ""
        message = " ".join(exc.format_message().split())
        if not message and exc.ctx is not None:  # a command group run without its subcommand (help shown above)
            message = f"`{exc.ctx.command_path}` needs a command"
        error_line((message or "bad command line") + where)
        sys.exit(2)
    except KeyboardInterrupt:
        error_line("interrupted")
        sys.exit(130)
    finally:
        sys.stdout.flush()  # what `print` left buffered meets a closed pipe here, quietly, not at interpreter exit
    failure = output_failure()
    if failure:
        error_line(f"the output could not be written: {failure} (nothing was lost from the ledger)")
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


app.command(name="doctor")(doctor.doctor)
app.command(name="bench")(bench.bench)
app.add_typer(experiments.app)
app.command(name="run")(run.run)
app.command(name="ab")(ab.ab)
app.command(name="calibrate")(calibrate.calibrate)
app.command(name="sweep")(sweep.sweep)
app.command(name="kernels")(kernels.kernels)
app.add_typer(ledger.app)
app.add_typer(model.app)
