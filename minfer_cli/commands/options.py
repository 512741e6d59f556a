"""Options shared by the timing commands, declared once, and the ledger write that never loses a measurement."""

from __future__ import annotations

import json
from typing import Optional

import typer
import yaml

from minfer_cli.console import err, error_line, out
from minfer_cli.errors import LedgerError

WORKLOAD = typer.Option(None, "--workload", "-w", help="Workload name (default: the experiment's first that every arm can run on, e.g. tg128 for tg-only engine knobs); see `minfer experiments list`.")
FLUSH = typer.Option(False, "--flush", help="Also write a 2x L2 buffer between samples (outside the timed events).")
WARMUP = typer.Option(1.0, "--warmup", min=0.0, max=60.0, help="Warm-up seconds per arm before sampling (clocks settle; JIT is never timed).")
LEDGER = typer.Option(None, "--ledger", help="Ledger directory (default: $MINFER_LEDGER, else ledger/records of the project).")
NOTE = typer.Option("", "--note", help="Free-text note stored in the ledger record.")
TITLE = typer.Option(None, "--title", help="Record title (default: the experiment and the knobs compared).")
SEED = typer.Option(None, "--seed", min=0, help="Seed of the random inputs, >= 0 (default: fresh each run).")
BAR = typer.Option(1.0, "--bar", min=0.01, max=50.0,
                   help="Smallest change, in percent (0.01..50), that counts as a verdict (LANDED/REVERTED).")
ARM_ONCE = typer.Option(None, "--arm", "-a", help="Knob settings K=V[,K=V...], given once; unset knobs take their defaults.")
JSON = typer.Option(False, "--json", help="Also print the record as JSON on stdout.")
PLOT = typer.Option(None, "--plot", metavar="FILE", help="Also draw the result to FILE (.png or .svg; outside the "
                    "ledger directory), after measuring.")
FORCE = typer.Option(False, "--force", help="Replace an existing --plot FILE.")


def write_record(record: dict, ledger: Optional[str]) -> int:
    """Append `record` to the ledger and say where; on failure save it to a fallback file (named in the one-line
    error; `minfer_cli.ledger.save_unrecorded`), or print the whole record when even that fails: nothing is lost.

    Returns 0 on success, 3 when the record could not be written (the caller exits with it).
    """
    from minfer_cli import ledger as ledger_core

    try:
        directory = ledger_core.ledger_dir(ledger)
        written = ledger_core.append(directory, record)
    except LedgerError as exc:
        try:
            saved = ledger_core.save_unrecorded(record)
        except LedgerError as again:
            error_line(f"{exc}; {again} — the measurement was not lost: the full record follows")
            plain = json.loads(json.dumps(record, default=str))  # numpy scalars and the like become plain values
            err.print(yaml.safe_dump(plain, sort_keys=False, allow_unicode=True, width=10**6), markup=False,
                      highlight=False, soft_wrap=True)  # never wrapped: the text must parse back as YAML
            return 3
        error_line(f"{exc} — the result was not lost: saved to {saved} (copy it into the ledger once it can be written)")
        return 3
    # on stderr: stdout may be data (`--json`, `-f json`), and the confirmation is status, not data
    err.print(f"ledger: record #{written.id} written to {written.path}", markup=False, soft_wrap=True)
    return 0


def single_arm(arms: Optional[list[str]]) -> Optional[str]:
    """The one --arm of a single-arm command; UsageError when it is given more than once."""
    from minfer_cli.errors import UsageError

    if not arms:
        return None
    if len(arms) > 1:
        raise UsageError(f"--arm is given {len(arms)} times; this command takes one arm (for two, use `minfer ab`)")
    return arms[0]


def check_ledger_writable(ledger: Optional[str]) -> None:
    """Fail before measuring when the ledger directory cannot take a record (a typo, a file, a read-only place)."""
    from minfer_cli import ledger as ledger_core

    ledger_core.check_writable(ledger_core.ledger_dir(ledger))


def check_arms_can_run(exp, workload, configs: list, labels: list[str]) -> None:
    """UsageError, before any GPU work, for an arm the experiment refuses on this workload (`Experiment.refuse`)."""
    from minfer_cli.errors import UsageError

    for label, config in zip(labels, configs):
        problem = exp.refuse(config, workload)
        if problem:
            raise UsageError(f"arm {label} cannot run: {problem}")


def print_notes(exp, workload, configs: list, labels: list[str]) -> None:
    """Each arm's `Experiment.note` (what it does that its knob values do not say), on stderr (stdout may be JSON);
    called once every check has passed, just before measuring."""
    from minfer_cli.console import err

    for label, config in zip(labels, configs):
        note = exp.note(config, workload)
        if note:
            err.print(f"arm {label}: {note}", markup=False, soft_wrap=True)


def check_same_work(exp, configs: list, workload=None) -> None:
    """UsageError, before any GPU work, when two A/B arms run the same code on ``workload``
    (`Experiment.effective`), or differ in a knob that changes the work itself (`Experiment.work_knobs`): their
    times do not measure the same task, so no verdict can come of them."""
    from minfer_cli.errors import UsageError

    a, b = configs
    if exp.effective(a, workload) == exp.effective(b, workload):
        moved = ", ".join(f"{k}={a[k]} vs {b[k]}" for k in a if a[k] != b[k])
        raise UsageError(f"arms A and B run the same code: what they differ in ({moved}) is not read by these "
                         f"configurations{' on ' + workload.name if workload is not None else ''}, so the A/B "
                         f"would time one thing twice")
    differ = [k for k in exp.work_knobs if a[k] != b[k]]
    if differ:
        knobs = ", ".join(f"{k}={a[k]} vs {b[k]}" for k in differ)
        raise UsageError(f"arms A and B do different work ({knobs}), so their times are not comparable; rank them "
                         f"by GB/s or % of roofline with `minfer sweep {exp.name} "
                         f"{' '.join(f'{k}={a[k]},{b[k]}' for k in differ)}`")


def check_plot(plot: Optional[str], force: bool, ledger: Optional[str]) -> None:
    """UsageError, before any GPU work, for a --plot FILE that cannot be written (`outputs.check_output_path`)."""
    if plot is not None:
        from minfer_cli import ledger as ledger_core
        from minfer_cli.outputs import PLOT_SUFFIXES, check_output_path

        check_output_path(plot, force=force, ledger_dir=ledger_core.ledger_dir(ledger), suffixes=PLOT_SUFFIXES)


def draw_plot(plot: Optional[str], force: bool, ledger: Optional[str], draw, record: dict) -> None:
    """Draw ``record`` with ``draw(record, path)`` (a `minfer_cli.ledger.plots` function) to --plot FILE, if given."""
    if plot is not None:
        from minfer_cli import ledger as ledger_core
        from minfer_cli.outputs import PLOT_SUFFIXES, write_output

        plain = json.loads(json.dumps(record, default=str))  # numpy scalars and the like become plain values
        written = write_output(plot, lambda tmp: draw(plain, tmp), force=force,
                               ledger_dir=ledger_core.ledger_dir(ledger), suffixes=PLOT_SUFFIXES)
        out.print(f"plot written to {written}", markup=False, soft_wrap=True)


def engine_config(arm: Optional[list[str]]) -> dict:
    """The whole engine knob configuration of a command's one --arm (defaults elsewhere); UsageError for an unknown
    knob or value, or a combination the engine cannot run (`minfer_cli.engine.bench.engine_conflict`)."""
    from minfer_cli.engine.bench import REMOVED_KNOBS, engine_conflict, engine_knobs
    from minfer_cli.errors import UsageError
    from minfer_cli.knobs import parse_arm_text, resolve_config

    text = single_arm(arm)
    config = resolve_config(engine_knobs(), parse_arm_text(text) if text is not None else {}, "the engine",
                            REMOVED_KNOBS)
    conflict = engine_conflict(config)
    if conflict:
        raise UsageError(conflict)
    return config


def gguf_config(model, named: str, instead: str):
    """The ModelConfig of GGUF file ``model`` (`gguf_model`)."""
    return gguf_model(model, named, instead)[0]


def gguf_model(model, named: str, instead: str):
    """(ModelConfig, [TensorSpec of every weight tensor]) of GGUF file ``model``, the whole file checked on the host
    (`inspect_gguf`) with a progress line while its metadata is read (a huge metadata section takes a while).
    UsageError, naming it as ``named`` and suggesting ``instead``, when the path is not a regular file."""
    from pathlib import Path

    from minfer_cli.console import progress
    from minfer_cli.engine.weights import inspect_gguf
    from minfer_cli.errors import UsageError

    path = Path(model)
    if not path.is_file():
        what = "is not a regular file" if path.exists() else "no such file"
        raise UsageError(f"{named}: {what} ({instead})")
    with progress(f"reading {path.name}") as report:
        report("metadata and tensor list", 0.0)
        weights, tensors = inspect_gguf(path)
        return weights.config, [spec for spec, _ in tensors]
