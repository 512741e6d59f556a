"""`minfer ledger ...`: read the YAML ledger of measured results (core: `minfer_cli.ledger`)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional

import typer
import yaml
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from minfer_cli import ledger as core
from minfer_cli.console import err, guard, out, verdict_text
from minfer_cli.errors import UsageError
from minfer_cli.knobs import ENV_LEDGER, env

app = typer.Typer(name="ledger", help="Read the ledger: one YAML record per measured result.", no_args_is_help=True)

SHOW_FORMATS = ("table", *core.FORMATS)


def _delta_text(record: dict[str, Any]) -> str:
    comparison = record.get("comparison")
    if not comparison:
        return ""
    pct = {k: comparison[k] * 100.0 for k in ("delta", "ci_low", "ci_high")}
    return f"{pct['delta']:+.1f}% [{pct['ci_low']:+.1f}, {pct['ci_high']:+.1f}]"


def _records_table(records: list[dict[str, Any]]) -> Table:
    table = Table(show_edge=False, header_style="bold")
    table.add_column("id", justify="right", no_wrap=True)
    table.add_column("date", no_wrap=True)
    table.add_column("experiment")
    table.add_column("arms")
    table.add_column("Δ% [CI]", justify="right", no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    for record in records:
        arms = core.record_arms_text(record)
        date = record["timestamp"][:16].replace("T", " ")
        cells = (str(record["id"]), date, record["experiment"], arms, _delta_text(record))
        table.add_row(*(Text(cell) for cell in cells), Text.from_markup(verdict_text(record["verdict"])))
    return table


def _json_safe(value: Any) -> Any:
    """``value`` with NaN/inf replaced by null, so the output is strict JSON."""
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _show_one(record: dict[str, Any], fmt: str) -> None:
    if fmt == "json":
        print(json.dumps(_json_safe(record), indent=2, ensure_ascii=False))
    elif fmt == "table":
        text = yaml.safe_dump(record, sort_keys=False, allow_unicode=True, width=10**6)
        if out.is_terminal:
            out.print(Syntax(text, "yaml", theme="ansi_dark", background_color="default", word_wrap=True))
        else:  # piped or redirected: plain text, never wrapped, so that it parses back as YAML
            print(text.rstrip("\n"))
    else:
        print(core.export([record], fmt).rstrip("\n"))


@app.command("show")
@guard
def show(
    record_id: Optional[str] = typer.Argument(
        None, metavar="ID", help="Show this one record in full (YAML; JSON with --format json). ID is the record's "
        "number, e.g. 46 (or 0046, as in its file name).", show_default=False,
    ),
    experiment: Optional[str] = typer.Option(
        None, "--experiment", "-e", help="Only records of this experiment, e.g. copy."
    ),
    verdict: Optional[str] = typer.Option(
        None, "--verdict", help=f"Only records with this verdict (any case): {', '.join(core.VERDICTS)}."
    ),
    last: Optional[int] = typer.Option(None, "--last", "-n", help="Only the last N records (highest ids)."),
    fmt: str = typer.Option(
        "table",
        "--format",
        "-f",
        help=f"Output format: {', '.join(SHOW_FORMATS)}. md/csv/json print one flat row per record (a bench "
        "record: one per pp/tg test), for pasting or for pandas.",
    ),
    ledger: Optional[Path] = typer.Option(
        None,
        "--ledger",
        help="Ledger directory (default: $MINFER_LEDGER, else ledger/records of the minfer project).",
    ),
) -> None:
    """List ledger records, or show one in full.

    Files that cannot be read are skipped and named on stderr, with the reason.

    Examples:

      minfer ledger show --experiment copy --verdict LANDED --last 5

      minfer ledger show 12

      minfer ledger show --format csv > ledger.csv
    """
    number = core.parse_id(record_id) if record_id is not None else None
    fmt = fmt.lower()
    if fmt not in SHOW_FORMATS:
        raise UsageError(f"unknown --format {fmt!r}; valid formats: {', '.join(SHOW_FORMATS)}")
    if verdict is not None:
        verdict = verdict.upper()
        if verdict not in core.VERDICTS:
            raise UsageError(f"unknown --verdict {verdict!r}; valid verdicts: {', '.join(core.VERDICTS)}")
    if last is not None and last < 1:
        raise UsageError(f"--last must be at least 1, got {last}")
    directory = core.ledger_dir(ledger)
    if (ledger is not None or env(ENV_LEDGER)) and not directory.is_dir():
        raise UsageError(f"ledger directory {directory} does not exist (from {'--ledger' if ledger is not None else ENV_LEDGER})")

    if number is not None:
        if experiment is not None or verdict is not None or last is not None:
            raise UsageError("give either an ID or --experiment/--verdict/--last, not both")
        _show_one(core.get(directory, number), fmt)
        return

    contents = core.load(directory)
    records = core.query(contents.records, experiment=experiment, verdict=verdict, last=last)
    if fmt != "table":
        print(core.export(records, fmt).rstrip("\n"))
    elif records:
        out.print(_records_table(records))
    for problem in contents.problems:
        err.print(f"skipped {problem.file}: {problem.reason}", markup=False, soft_wrap=True, style="yellow")
    if experiment is not None and not any(r.get("experiment") == experiment for r in contents.records):
        known = sorted({str(r.get("experiment")) for r in contents.records})
        raise UsageError(f"no record of experiment {experiment!r} in {directory}; recorded experiments: "
                         f"{', '.join(known) or 'none yet'}")
    if not records:
        if contents.records:
            message = f"no records match (the ledger in {directory} holds {len(contents.records)})"
        else:
            message = f"no records yet in {directory}"
        (out if fmt == "table" else err).print(message, markup=False, soft_wrap=True)
    if contents.problems:
        raise typer.Exit(code=1)
