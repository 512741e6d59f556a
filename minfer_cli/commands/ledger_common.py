"""What the `minfer ledger` commands share: the --ledger option, where the ledger is, skipped-file reports, and one
record printed whole for a person."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Optional

import typer
from rich.cells import cell_len, set_cell_size
from rich.text import Text

from minfer_cli import ledger as core
from minfer_cli.console import ASCII_FALLBACK, VERDICT_STYLE, ascii_stdout, clean, err, out, plain, verdict_text
from minfer_cli.errors import UsageError
from minfer_cli.knobs import ENV_LEDGER, env
from minfer_cli.ledger import figures

LEDGER = typer.Option(None, "--ledger", help="Ledger directory (default: $MINFER_LEDGER, else ledger/records of "
                      "the minfer project).")


def resolve_dir(ledger: Optional[Path]) -> Path:
    """The ledger directory of a reading command; UsageError when one named explicitly does not exist."""
    directory = core.ledger_dir(ledger)
    if (ledger is not None or env(ENV_LEDGER)) and not directory.is_dir():
        what = "is not a directory" if directory.exists() else "does not exist"
        raise UsageError(f"ledger directory {directory} {what} (from {'--ledger' if ledger is not None else ENV_LEDGER}; "
                         "give the directory that holds the records)")
    return directory


def load_contents(directory: Path) -> core.LedgerContents:
    """`minfer_cli.ledger.load` of ``directory``, with a progress bar on stderr when records must be parsed for the
    first time in numbers (a fresh clone of a large ledger); an indexed ledger draws nothing."""
    from minfer_cli.console import progress_if_needed

    with progress_if_needed("reading the ledger") as report:
        return core.load(directory, progress=report)


def report_problems(contents: core.LedgerContents) -> bool:
    """Print skipped files and duplicate ids on stderr (one line each); True when there was any."""
    for problem in contents.problems:
        err.print(f"skipped {clean(problem.file)}: {clean(problem.reason)}", markup=False, soft_wrap=True, style="yellow")
    for record_id, files in sorted(contents.duplicates.items()):
        err.print(f"duplicate id {record_id}: {', '.join(map(clean, files))} (both shown, flagged *; the first is the "
                  "one verify and diff use)", markup=False, soft_wrap=True, style="yellow")
    return bool(contents.problems or contents.duplicates)


def fit_widths(natural: dict[str, int], width: int, shrink: tuple[tuple[str, int], ...]) -> dict[str, int]:
    """Column widths that fit ``width`` terminal columns: each column's natural width (its longest cell), shrunk
    in the order of ``shrink`` ((column, least width) pairs; a column may appear twice, with a smaller least width
    the second time) until the row, with 3 characters between columns, fits."""
    widths = dict(natural)
    excess = sum(widths.values()) + 3 * (len(widths) - 1) - width
    for name, least in shrink:
        if excess <= 0:
            break
        if name in widths:
            give = min(excess, max(0, widths[name] - least))
            widths[name] -= give
            excess -= give
    return widths


def _cell(text: str, width: int, right: bool) -> str:
    """``text`` in exactly ``width`` terminal cells: cut with an ellipsis when too long, padded otherwise."""
    text = clean(text)
    if cell_len(text) > width:
        text = set_cell_size(text, max(0, width - 1)) + "…" if width > 0 else ""
    pad = " " * (width - cell_len(text))
    return pad + text if right else text + pad


def _ascii_cell(text: str, width: int, right: bool) -> str:
    """`_cell` for a stdout that writes ASCII: the text transliterated first, so its width is the written one."""
    text = clean(text).translate(ASCII_FALLBACK)
    if len(text) > width:
        text = text[:max(0, width - 3)] + "..." if width >= 3 else text[:width]
    return text.rjust(width) if right else text.ljust(width)


def fitted_table(names: list[str], rows: list[dict[str, str]], width: int | None,
                 shrink: tuple[tuple[str, int], ...], right: tuple[str, ...] = (), title: str | None = None,
                 droppable: tuple[str, ...] = (), more: str = "--wide shows every column") -> Text:
    """A table whose rows never wrap, as one styled text (fast for thousands of rows): columns ``names``, cells
    ``rows`` (plain text by column name; a ``verdict`` or ``outcome`` column is coloured), sized by `fit_widths`
    for ``width`` terminal columns (a cut cell ends in ``…``); ``width`` None keeps every cell whole. Columns of
    ``droppable`` are left out, in that order, while the shrunk table is still wider than ``width`` (a last line
    names them and ends with ``more``, how to see them), and always when every cell of theirs is ``—``."""
    fit = _ascii_cell if ascii_stdout() else _cell
    measure = (lambda t: len(clean(t).translate(ASCII_FALLBACK))) if fit is _ascii_cell else (lambda t: cell_len(clean(t)))
    names = [n for n in names if n not in droppable or any(r.get(n, "—") != "—" for r in rows)]
    natural = {n: max([measure(n)] + [measure(r.get(n, "")) for r in rows]) for n in names}
    widths = natural if width is None else fit_widths(natural, width, shrink)
    left_out = []
    for column in droppable if width is not None else ():
        if sum(widths.values()) + 3 * (len(widths) - 1) <= width:
            break
        if column in names:
            names.remove(column)
            left_out.append(column)
            natural.pop(column)
            widths = fit_widths(natural, width, shrink)
    text = Text(no_wrap=True, overflow="ignore", end="\n")
    if title:
        text.append(title + "\n")
    text.append(" ┃ ".join(fit(n, widths[n], n in right) for n in names).rstrip(), style="bold")
    text.append("\n" + "━╇━".join("━" * widths[n] for n in names))
    for cells in rows:
        text.append("\n")
        for i, n in enumerate(names):
            if i:
                text.append(" │ ")
            value = fit(cells.get(n, ""), widths[n], n in right)
            text.append(value, style=VERDICT_STYLE.get(cells.get(n, ""), "") if n in ("verdict", "outcome") else "")
    if left_out:
        text.append(f"\n(left out at this width: {', '.join(left_out)}; {more})")
    return text


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []


def environment_text(record: Mapping[str, Any]) -> str:
    """GPU, driver and clocks of a record in one line (what is there; old records lack some)."""
    environment = _mapping(record.get("environment"))
    device = _mapping(environment.get("device"))
    parts = []
    if device.get("name"):
        cc = str(device.get("compute_capability") or "").replace(".", "")
        parts.append(f"{device['name']}" + (f" (sm_{cc}, {device.get('sm_count')} SMs)" if cc else ""))
    if device.get("driver_version"):
        parts.append(f"driver {device['driver_version']}")
    start, end = _mapping(environment.get("gpu_start")), _mapping(environment.get("gpu_end"))
    if start.get("sm_clock_mhz") is not None:
        clocks = f"SM {start.get('sm_clock_mhz')} MHz, mem {start.get('mem_clock_mhz')} MHz"
        if start.get("temperature_c") is not None:
            clocks += f", {start.get('temperature_c')}" + (f"→{end.get('temperature_c')}" if end else "") + " °C"
        if start.get("power_w") is not None:
            clocks += f", {start.get('power_w')}" + (f"→{end.get('power_w')}" if end else "") + " W"
        throttle = sorted({str(t) for t in [*_list(start.get("throttle")), *_list(end.get("throttle"))]})
        parts.append(clocks + (f", throttle: {', '.join(map(str, throttle))}" if throttle else ""))
    return " · ".join(parts) or "not recorded"


def _arms_table(record: Mapping[str, Any], wide: bool, width: int) -> tuple[Text, str]:
    """The arms of a measurement record (knobs that differ first) and the line of knobs they share."""
    arms = [a for a in record.get("arms") or [] if isinstance(a, Mapping)]
    unit = (record.get("metric") or {}).get("unit") or ""
    varying = figures.differing_knobs(arms)
    first = dict(arms[0].get("knobs") or {}) if arms else {}
    shared = {k: v for k, v in first.items() if k not in varying}
    if len(arms) == 1 or record.get("kind") == "bench":
        varying, shared = [], first  # one configuration: its knobs go under the table
    if len(arms) > 2 and not wide:
        shared = {k: v for k, v in first.items() if k not in varying}
    names = ["arm", *varying, f"median {unit}".strip(), "mean ± std", "p10–p90", "n", "GB/s", "% roof", "check"]
    best = _mapping(record.get("best")).get("label")
    default = _mapping(record.get("default")).get("label")
    rows = []
    for arm in arms:
        s = figures.stats_of(arm)
        tags = "".join(t for t, label in ((" (best)", best), (" (default)", default)) if label == arm.get("label"))
        check = str(arm.get("error") or "") if arm.get("status") != "ok" else (
            f"ok ({arm['parity_error']:.2g})" if isinstance(arm.get("parity_error"), (int, float)) else "ok")
        knobs = _mapping(arm.get("knobs"))
        rows.append({
            "arm": str(arm.get("label")) + tags, **{k: str(knobs.get(k, "—")) for k in varying},
            names[1 + len(varying)]: figures.fmt_num(s["median"]),
            "mean ± std": (f"{figures.fmt_num(s['mean'])} ± {figures.fmt_num(s['std'])}" if s["std"] is not None
                           else figures.fmt_num(s["mean"])),
            "p10–p90": f"{figures.fmt_num(s['p10'])}–{figures.fmt_num(s['p90'])}" if s["p10"] is not None else "—",
            "n": str(int(s["n"])) if s["n"] is not None else "—",
            "GB/s": figures.fmt_num(arm.get("gbps")) if isinstance(arm.get("gbps"), (int, float)) else "—",
            "% roof": f"{arm['pct_roofline']:.1f}" if isinstance(arm.get("pct_roofline"), (int, float)) else "—",
            "check": check,
        })
    shrink = (("check", 6), ("arm", 6), *((k, 4) for k in varying))
    table = fitted_table(names, rows, None if wide else width, shrink,
                         right=tuple(n for n in names if n not in ("arm", "check", *varying)),
                         droppable=("GB/s", "% roof", "check", "mean ± std", "n", "p10–p90"))
    return table, figures.knobs_text(shared)


def print_record(record: Mapping[str, Any], wide: bool = False, retired_by: int | None = None) -> None:
    """One record whole, for a person: title, verdict, kind, workload, commit, GPU and clocks, the result, each
    arm's knobs (those that differ first) and statistics, the kind's own fields, the command and the notes. A part
    that cannot be shown (an odd optional value) is named in one line; `--format yaml` shows the record as read."""
    try:
        _print_record(record, wide, retired_by)
    except Exception as exc:  # a valid record may still hold odd optional values
        out.print(f"(record #{record.get('id')} cannot be shown whole: {type(exc).__name__}; "
                  "`--format yaml` prints it as read)", markup=False)


CHANGE_KEYS = ("speedup", "ci_low", "ci_high", "delta", "delta_median")
RATE_KEYS = ("bar", "false_positive_rate", "suggested_bar", "delta_std", "delta_p95_abs")
"""Keys of a record's own parts that hold fractions: changes (signed) and rates, shown as percentages, as every
table shows them."""
HIDDEN_KEYS = ("trial_deltas", "trial_verdicts", "measured_text")
"""Parts `show ID` leaves to `--format yaml`: per-trial lists, and a verify's text that repeats its reason."""


def _readable(value: Any, key: str = "") -> str:
    """A record's own part as text for a person: ``of 1 (ab) · reason … · recorded speedup +31.3%``; fractions
    as percentages, numbers at four digits, lists joined, missing values left out (`--format yaml` has them all)."""
    if isinstance(value, Mapping):
        texts = ((k, _readable(v, str(k))) for k, v in value.items() if k not in HIDDEN_KEYS and v is not None)
        parts = [f"{k} {text}" for k, text in texts if text not in ("", "()")]
        if not parts:
            return ""
        return ("(" + ", ".join(parts) + ")") if key else " · ".join(parts)
    if isinstance(value, list):
        return ", ".join(_readable(v, key) for v in value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if key in CHANGE_KEYS:
        return figures.fmt_pct(value, 2 if abs(value) < 0.1 else 1)
    if key in RATE_KEYS:
        return f"{value * 100:.3g}%"
    return str(value) if isinstance(value, int) else figures.fmt_num(value)


def _print_record(record: Mapping[str, Any], wide: bool, retired_by: int | None = None) -> None:
    git = _mapping(record.get("git"))
    commit = str(git.get("commit") or "unknown")[:12]
    dirty = {True: " (uncommitted changes)", False: " (clean)"}.get(git.get("dirty"), "")
    retired = f" (RETIRED by #{retired_by})" if retired_by else ""
    out.print(f"[bold]#{record['id']} {plain(record.get('title'))}[/bold]  {verdict_text(plain(record.get('verdict')))}"
              f"{retired}")
    workload = _mapping(record.get("workload"))
    shape = ", ".join(f"{k}={v}" for k, v in _mapping(workload.get("shape")).items())
    where = " · ".join(x for x in (f"kind {record.get('kind')}",
                                   f"experiment {record['experiment']}" if record.get("experiment") else "",
                                   f"workload {workload.get('name')}" + (f" ({shape})" if shape else "")
                                   if workload else "") if x)
    out.print(clean(where), markup=False)
    out.print(f"date {clean(record.get('timestamp')).replace('T', ' ').rstrip('Z')} UTC · commit {clean(commit)}{dirty} · "
              f"schema {record.get('schema')}", markup=False)
    if record.get("environment"):
        out.print(f"GPU {clean(environment_text(record))}", markup=False)
    head = figures.headline(record)
    result = " ".join(x for x in (head.result, head.change, head.ci) if x)
    comparison = _mapping(record.get("comparison"))
    if comparison and head.p:
        result += f" · p {head.p} · {comparison.get('rounds')} rounds"
    if record.get("kind") in core.KINDS_WITH_BAR and isinstance(record.get("bar"), (int, float)):
        result += f" · bar {record['bar'] * 100:.2g}%"
    out.print(f"result {clean(result)}", markup=False)
    if record.get("arms"):
        table, shared = _arms_table(record, wide, out.width)
        out.print(table)
        if shared:
            out.print(f"knobs of every arm: {clean(shared)}", markup=False, soft_wrap=True)
    for key in ("verify", "retire", "check", "calibration", "peer"):
        if isinstance(record.get(key), Mapping):
            out.print(f"{key}: {clean(_readable(record[key]))}", markup=False, soft_wrap=True)
    out.print(f"command: {clean(record.get('command') or '—')}", markup=False, soft_wrap=True)
    if record.get("notes"):
        out.print(f"notes: {clean(record['notes'])}", markup=False, soft_wrap=True)
