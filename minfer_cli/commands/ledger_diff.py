"""`minfer ledger diff A B`: two records side by side (core: `minfer_cli.ledger.diff`)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table
from rich.text import Text

from minfer_cli import ledger as core
from minfer_cli.commands.ledger_common import LEDGER, fitted_table, load_contents, report_problems, resolve_dir
from minfer_cli.console import clean, guard, out, plain, verdict_text
from minfer_cli.ledger import figures
from minfer_cli.errors import UsageError
from minfer_cli.ledger.diff import diff as diff_records


def _table(title: str, columns: tuple[str, ...]) -> Table:
    table = Table(title=title, title_justify="left", show_edge=False, header_style="bold", pad_edge=False)
    for i, name in enumerate(columns):
        table.add_column(name, justify="left" if i == 0 else "right", no_wrap=True, overflow="ellipsis")
    return table


@guard
def diff(
    first: str = typer.Argument(..., metavar="A", help="The earlier (reference) record's id, e.g. 83."),
    second: str = typer.Argument(..., metavar="B", help="The record to compare with it, e.g. 88."),
    ledger: Optional[Path] = LEDGER,
) -> None:
    """Two records side by side: the knobs that differ (arms paired by label), the environment that differs
    (commit, GPU, driver, clocks, temperature, power, throttling, software), and each shared figure's change as a
    speed-up of B's record over A's (positive = faster, for time and throughput alike).

    Example: minfer ledger diff 83 88
    """
    ids = core.parse_id(first), core.parse_id(second)
    contents = load_contents(resolve_dir(ledger))
    a, b = (core.find(contents, i)[0] for i in ids)
    try:
        result = diff_records(a, b)
    except Exception as exc:  # a valid record may still hold odd optional values
        raise UsageError(f"records #{a['id']} and #{b['id']} cannot be compared ({type(exc).__name__}); "
                         "`minfer ledger show ID --format yaml` prints each as read") from None
    for record, tag in ((a, "A"), (b, "B")):
        out.print(f"{tag}: #{record['id']} {plain(record.get('title'))} · {plain(str(record.get('timestamp'))[:16]).replace('T', ' ')} "
                  f"· {verdict_text(str(record.get('verdict')))}", soft_wrap=True)
    for note in result.notes:
        out.print(clean(note), markup=False, soft_wrap=True)
    if result.figures:
        table = _table("figures", ("figure", "A", "B", "change"))
        for f in result.figures:
            # record text (arm labels, units) is never markup: every cell is a plain Text
            if f.unit == "fraction":
                cells = (f.what, figures.fmt_change(f.a), figures.fmt_change(f.b), f"{(f.b - f.a) * 100:+.1f} points")
            else:
                cells = (f.what, f"{figures.fmt_num(f.a)} {f.unit}", f"{figures.fmt_num(f.b)} {f.unit}",
                         figures.fmt_change(f.change) if f.change is not None else "—")
            table.add_row(*(Text(clean(c)) for c in cells))
        out.print(table)
    for title, rows in (("knobs that differ", result.knobs), ("environment that differs", result.environment)):
        if rows:
            cells = [{"what": row.what, "A": row.a, "B": row.b} for row in rows]
            out.print(fitted_table(["what", "A", "B"], cells, out.width, (("A", 12), ("B", 12), ("what", 12)),
                                   right=("A", "B"), title=title))
        else:
            out.print(f"{title}: none", markup=False)
    if report_problems(contents):
        raise typer.Exit(code=1)
