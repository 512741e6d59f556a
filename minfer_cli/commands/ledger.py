"""`minfer ledger ...`: read the ledger (show, diff, trend), re-check its verdicts (verify) and retire records.

Core: `minfer_cli.ledger`; design: docs/ledger.md.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional

import typer
from rich.text import Text

from minfer_cli import ledger as core
from minfer_cli.commands import ledger_diff, ledger_trend, ledger_verify
from minfer_cli.commands.ledger_common import (LEDGER, fitted_table, load_contents, print_record, report_problems,
                                               resolve_dir)
from minfer_cli.console import clean, err, guard, json_text, out
from minfer_cli.errors import UsageError
from minfer_cli.ledger import figures

app = typer.Typer(name="ledger", help="Read the ledger (one YAML record per result), re-check its verdicts, retire "
                  "records. Design: docs/ledger.md.", no_args_is_help=True)

SHOW_FORMATS = ("table", *core.FORMATS)
ONE_FORMATS = ("table", "yaml", "json", "md", "csv")
SHOW_SHRINK = (("title", 8), ("compared", 40), ("workload", 12), ("result", 48), ("compared", 24), ("experiment", 6),
               ("workload", 6), ("result", 32), ("compared", 12), ("result", 16), ("compared", 8))
"""Which `show` columns give up width first when the table is wider than the terminal, and the least each keeps."""
MEDIUM_WIDTH = 110  # from this terminal width on, `show` adds the workload and the CI columns
WIDE_WIDTH = 150  # and from this one, the p-value, the commit and the title

def records_table(records: list[dict[str, Any]], duplicates: set[int], width: int, wide: bool,
                  retired: dict[int, tuple[int, str]] | None = None) -> Text:
    """The `ledger show` table: columns chosen for ``width`` (all of them with ``wide``); cells never wrap, a
    long one ends in an ellipsis (``wide`` shows every cell whole). A record that a retire tombstone names
    (``retired``: `minfer_cli.ledger.verify.retired_ids`) shows RETIRED as its verdict (`show ID`: its own verdict
    and why it was retired)."""
    retired = retired or {}
    medium = wide or width >= MEDIUM_WIDTH
    full = wide or width >= WIDE_WIDTH
    names = ["id", "date", "experiment", *(["workload"] if medium else []), "compared", "result",
             *(["95% CI"] if medium else []), *(["p", "commit", "title"] if full else []), "verdict"]
    rows = []
    for record in records:
        head = figures.headline(record)
        stamp = str(record["timestamp"])
        cells = {
            "id": f"{record['id']}{'*' if record['id'] in duplicates else ''}",
            "date": stamp[:10] if medium else stamp[5:10],
            "experiment": str(record.get("experiment") or record.get("kind")),
            "workload": str((record.get("workload") or {}).get("name") or ""),
            "compared": figures.record_arms_text(record),
            "result": " ".join(t for t in (head.result, head.change) if t),
            "95% CI": head.ci, "p": head.p, "commit": str((record.get("git") or {}).get("commit") or "")[:8],
            "title": str(record.get("title") or ""),
            "verdict": "RETIRED" if record["id"] in retired else str(record.get("verdict")),
        }
        rows.append(cells)
    return fitted_table(names, rows, None if wide else width, SHOW_SHRINK, right=("id", "95% CI", "p"))


def _json_safe(value: Any) -> Any:
    """``value`` with NaN/inf replaced by null, so the output is strict JSON."""
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _show_one(records: list[dict[str, Any]], fmt: str, wide: bool, retired: dict | None = None) -> None:
    for i, record in enumerate(records):
        if fmt == "json":
            print(json_text(_json_safe(record), indent=2, default=str))
        elif fmt == "yaml":
            print(core.store.dump(record).rstrip("\n"))
        elif fmt == "table":
            if i:
                out.print()
            print_record(record, wide=wide, retired_by=(retired or {}).get(record["id"], (None,))[0])
        else:
            print(core.export([record], fmt).rstrip("\n"))


@app.command("show")
@guard
def show(
    record_id: Optional[str] = typer.Argument(
        None, metavar="ID", help="Show this one record in full. ID is the record's number, e.g. 46 (or 0046, as in "
        "its file name).", show_default=False,
    ),
    experiment: Optional[str] = typer.Option(None, "--experiment", "-e", help="Only records of this experiment, e.g. copy."),
    verdict: Optional[str] = typer.Option(None, "--verdict", help=f"Only records with this verdict (any case): {', '.join(core.VERDICTS)}."),
    kind: Optional[str] = typer.Option(None, "--kind", help=f"Only records of this kind: {', '.join(core.KINDS)}."),
    since: Optional[str] = typer.Option(None, "--since", help="Only records from this id on (46) or from this UTC "
                                        "date on (2026-11-30, or 2026-11-30T21:00)."),
    grep: Optional[str] = typer.Option(None, "--grep", help="Only records whose title, notes, command, experiment or "
                                       "knobs contain this text (any case)."),
    last: Optional[int] = typer.Option(None, "--last", "-n", help="Only the last N records (highest ids)."),
    wide: bool = typer.Option(False, "--wide", help="Every column, every cell whole (cells fold instead of ending in …)."),
    fmt: str = typer.Option(
        "table", "--format", "-f",
        help=f"Output format: {', '.join(SHOW_FORMATS)}; with an ID also yaml (the record as read, written out again: comments and layout are not kept). md/csv/json print "
        "flat rows (a bench record: one per pp/tg test; a sweep: one per point) with each arm's median, mean, std, "
        "p10, p90, n and the change as a speed-up; columns are documented in docs/ledger.md.",
    ),
    plot: Optional[str] = typer.Option(None, "--plot", metavar="FILE", help="With an ID: also draw the record to "
                                       "FILE (.png or .svg): an A/B's per-round samples, a sweep's grid, a bench's "
                                       "tests."),
    force: bool = typer.Option(False, "--force", help="Replace an existing --plot FILE."),
    ledger: Optional[Path] = LEDGER,
) -> None:
    """List ledger records with the figure that matters, or show one record whole.

    The result column speaks one language for every metric: an A/B shows both arms' medians and the speed-up of B
    over A (speed-up = old time / new time - 1, or new rate / old rate - 1): "+14.1% faster". The speed-up is the
    median over rounds of each round's pair (interleaved, so drift cancels), not the ratio of the two medians
    beside it; the two may differ a little. A bench record shows each test's mean ± std, a sweep its best point
    (and its change against the default when recorded), a calibration its false-positive rate and suggested bar,
    a verify the recorded effect then and the re-measured one now. A retired record reads RETIRED. The table fits
    the terminal (a cut cell ends in …); wider terminals show more columns; --wide shows every cell whole, however
    wide.

    Files that cannot be read are skipped and named on stderr with the reason (exit status 1); every other record
    still shows. Two files with one id are both shown, flagged *.

    Examples:

      minfer ledger show --experiment gemv --verdict LANDED --last 5

      minfer ledger show --kind bench --since 2026-11-30

      minfer ledger show 86

      minfer ledger show 98 --plot pdl.png

      minfer ledger show --format csv > ledger.csv
    """
    number = core.parse_id(record_id) if record_id is not None else None
    fmt = fmt.lower()
    allowed = ONE_FORMATS if number is not None else SHOW_FORMATS
    if fmt not in allowed:
        raise UsageError(f"unknown --format {fmt!r}; valid formats{' with an ID' if number is not None else ''}: "
                         f"{', '.join(allowed)}")
    if verdict is not None:
        verdict = verdict.upper()
        if verdict not in core.VERDICTS:
            raise UsageError(f"unknown --verdict {verdict!r}; valid verdicts: {', '.join(core.VERDICTS)}")
    if kind is not None:
        kind = kind.lower()
        if kind not in core.KINDS:
            raise UsageError(f"unknown --kind {kind!r}; valid kinds: {', '.join(core.KINDS)}")
    if last is not None and last < 1:
        raise UsageError(f"--last must be at least 1, got {last}")
    since_value = core.parse_since(since) if since is not None else None
    directory = resolve_dir(ledger)
    if plot is not None and number is None:
        raise UsageError("--plot draws one record: give its ID, e.g. minfer ledger show 86 --plot ab.png "
                         "(a figure over many records is `minfer ledger trend`)")
    if plot is not None:
        from minfer_cli.outputs import PLOT_SUFFIXES, check_output_path

        check_output_path(plot, force=force, ledger_dir=directory, suffixes=PLOT_SUFFIXES)

    if number is not None:
        if any(v is not None for v in (experiment, verdict, kind, since, grep, last)):
            raise UsageError("give either an ID or filters (--experiment/--verdict/--kind/--since/--grep/--last), not both")
        contents = load_contents(directory)
        chosen = core.find(contents, number)
        if plot is not None:
            from minfer_cli.ledger.plots import plot_refusal

            refusal = plot_refusal(chosen[0])
            if refusal:  # before the record is printed: the one line is the whole answer
                raise UsageError(refusal)
        from minfer_cli.ledger.verify import arms_moved, retired_ids

        retired = retired_ids(contents.records)
        _show_one(chosen, fmt, wide, retired)
        if fmt == "table":
            tomb = retired.get(chosen[0]["id"])
            if tomb:
                out.print(f"retired by #{tomb[0]}: {clean(tomb[1])}", markup=False, soft_wrap=True)
            verify = chosen[0].get("verify") if chosen[0].get("kind") == "verify" else None
            original = next((r for r in contents.records if isinstance(verify, dict) and r["id"] == verify.get("of")), None)
            moved = arms_moved(original, chosen[0].get("arms") or []) if original and original.get("kind") == "ab" else ""
            if moved:
                out.print(f"each arm's median then → now{clean(moved).replace(';', ':', 1)}", markup=False,
                          soft_wrap=True)
        if plot is not None:
            from minfer_cli.ledger.plots import plot_record
            from minfer_cli.outputs import PLOT_SUFFIXES, write_output

            written = write_output(plot, lambda tmp: plot_record(chosen[0], tmp), force=force, ledger_dir=directory,
                                   suffixes=PLOT_SUFFIXES)
            err.print(f"plot written to {written}", markup=False, soft_wrap=True)
        if report_problems(contents):
            raise typer.Exit(code=1)
        return

    contents = load_contents(directory)
    records = core.query(contents.records, experiment=experiment, verdict=verdict, last=last, kind=kind,
                         since=since_value, grep=grep)
    if fmt != "table":
        print(core.export(records, fmt).rstrip("\n"))
    elif records:
        width = 10**4 if wide else out.width
        from minfer_cli.ledger.verify import retired_ids

        table = records_table(records, set(contents.duplicates), out.width, wide, retired_ids(contents.records))
        if out.is_terminal:
            out.print(table, width=width, crop=False)
        else:  # piped: the same text without styles; rich's renderer costs ~0.1 s per 1,000 rows
            print(table.plain)
    flagged = report_problems(contents)
    if experiment is not None and not any(r.get("experiment") == experiment for r in contents.records):
        known = sorted({str(r.get("experiment")) for r in contents.records if r.get("experiment")})
        raise UsageError(f"no record of experiment {experiment!r} in {directory}; recorded experiments: "
                         f"{', '.join(known) or 'none yet'}")
    if not records:
        if contents.records:
            message = f"no records match (the ledger in {directory} holds {len(contents.records)})"
        else:
            message = f"no records yet in {directory}"
        (out if fmt == "table" else err).print(message, markup=False, soft_wrap=True)
    if flagged:
        raise typer.Exit(code=1)


app.command("diff")(ledger_diff.diff)
app.command("verify")(ledger_verify.verify)
app.command("retire")(ledger_verify.retire)
app.command("trend")(ledger_trend.trend)
