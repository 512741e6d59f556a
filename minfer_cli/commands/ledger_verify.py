"""`minfer ledger verify` (are the recorded verdicts still true here, now?) and `minfer ledger retire` (a tombstone
for records that no longer apply). Core: `minfer_cli.ledger.verify`; the GPU side: `minfer_cli.measure.verify_runner`."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from minfer_cli import ledger as core
from minfer_cli.commands import options
from minfer_cli.commands.ledger_common import LEDGER, fitted_table, load_contents, report_problems, resolve_dir
from minfer_cli.console import clean, err, guard, out, plain, progress, verdict_text
from minfer_cli.errors import UsageError
from minfer_cli.ledger import figures
from minfer_cli.ledger import verify as core_verify


def _choose(contents: core.LedgerContents, ids: list[int], landed: bool, since: Optional[int]) -> list[dict]:
    if ids:
        chosen = [core.find(contents, i)[0] for i in dict.fromkeys(ids)]
    else:
        chosen = [r for r in contents.records if r.get("kind") == "ab" and r.get("verdict") == "LANDED"]
    if since is not None:
        chosen = [r for r in chosen if r["id"] >= since]
    return chosen


def _summary(outcomes: list[core_verify.Outcome], records: dict[int, dict], width: int):
    rows = []
    for o in outcomes:
        record = records[o.record_id]
        superseded = o.plan.superseded_by if o.plan else None
        rows.append({"id": str(o.record_id), "experiment": str(record.get("experiment") or ""),
                     "compared": figures.record_arms_text(record), "outcome": o.outcome,
                     "then → now": o.reason + (f" (superseded by #{superseded})" if superseded else "")})
    shrink = (("compared", 12), ("experiment", 6), ("then → now", 30), ("compared", 8))
    return fitted_table(["id", "experiment", "compared", "outcome", "then → now"], rows, width, shrink,
                        right=("id",), title="verify")


ENVIRONMENT_KEYS = ("GPU", "driver", "CUDA runtime", "SM MHz (start)", "mem MHz (start)", "W (start)",
                    "throttle (start)", "throttle (end)", "°C (end)")
"""What `verify` prints beside a re-measurement when it differs from the record's (a figure is compared across
processes and days: clocks, power, throttling and the driver explain many a difference)."""


def _environment_changes(record: dict, outcome: core_verify.Outcome) -> str:
    from minfer_cli.ledger.diff import diff as diff_records

    measured = outcome.measurement.record if outcome.measurement else None
    if not measured or "environment" not in measured:
        return ""
    changes = diff_records(record, measured).environment
    return ", ".join(f"{d.what} {d.a} → {d.b}" for d in changes if d.what in ENVIRONMENT_KEYS)


def _plan_line(record: dict, p: core_verify.Plan, superseded: bool, min_rounds: Optional[int]) -> str:
    """One `verify --plan` line: what is re-run, how, and what it is judged against."""
    what = figures.record_arms_text(record) if record.get("kind") != "bench" else ", ".join(p.labels)
    workload = (record.get("workload") or {}).get("name")
    head = " ".join(str(x) for x in (f"#{record['id']}", record.get("kind"), record.get("experiment")) if x)
    head += f" · {workload}" if workload and record.get("kind") != "bench" else ""
    head += f": {what}"
    if p.mode == "ab" and len(p.configs) == 2:  # what sets this A/B apart from another of the same knob
        try:
            from minfer_cli.experiment import get

            defaults = get(str(p.experiment)).default_config()
        except Exception:
            defaults = {}
        a, b = p.configs
        special = {k: v for k, v in a.items() if b.get(k) == v and k in defaults and defaults[k] != v
                   and k not in p.predated}
        if special:
            head += f" at {figures.knobs_text(dict(list(special.items())[:4]))}"
    if p.mode == "none":
        return f"{head} — {p.outcome}: {p.reason}"
    if superseded:
        return f"{head} — superseded by #{p.superseded_by} (the same A/B, later), not re-run"
    if p.mode == "ab":
        recorded = p.recorded_values[0]
        how = (f"re-run interleaved, at least {core_verify.min_rounds_for(p, min_rounds)} rounds; recorded "
               f"{figures.fmt_change(recorded)}: HOLDS if the new 95% CI reaches {recorded * 100 - p.bar * 100:+.1f}% "
               f"to {recorded * 100 + p.bar * 100:+.1f}%")
    else:
        figure = "mean" if p.kind == "bench" else "median"
        how = (f"re-measured; recorded {figure} " + ", ".join(
            f"{label} {figures.fmt_num(v)}" for label, v in zip(p.labels, p.recorded_values))
            + f": HOLDS within ±{p.bar * 100:.2g}%")
    extra = "; ".join(x for x in (
        f"knobs since removed, at the value the code still runs, left out: {figures.knobs_text(p.dropped)}"
        if p.dropped else "",
        f"knobs added since, set as before they existed: {figures.knobs_text(p.predated)}" if p.predated else "")
        if x)
    return f"{head} — {how}" + (f" ({extra})" if extra else "")


@guard
def verify(
    ids: Optional[List[str]] = typer.Argument(None, metavar="[ID]...", help="Records to re-check, e.g. 83 86."),
    landed: bool = typer.Option(False, "--landed", help="Every LANDED A/B (where several measured the same A/B, the "
                                "latest governs and the earlier ones are reported as superseded, not re-run)."),
    since: Optional[str] = typer.Option(None, "--since", help="Only records from this id on."),
    bar: Optional[float] = typer.Option(None, "--bar", min=0.01, max=50.0, help="Bar in percent (default: an A/B "
                                        f"record's own bar; {core_verify.DEFAULT_FIGURE_BAR * 100:.0f}% for a figure)."),
    max_time: float = typer.Option(30.0, "--max-time", min=1.0, max=3600.0, help="Seconds of A/B rounds at most "
                                   "per record (the adaptive stop usually ends sooner)."),
    min_rounds: Optional[int] = typer.Option(None, "--min-rounds", min=3, max=10000, help="A/B rounds before the "
                                             "adaptive stop may end one (default: the record's own rounds, 3 to 10)."),
    plan_only: bool = typer.Option(False, "--plan", help="Say what would be re-run and how (knobs dropped or "
                                   "predated, CANNOT-RUN reasons), measure nothing; needs no GPU."),
    no_record: bool = typer.Option(False, "--no-record", help="Do not append the verify records to the ledger."),
    ledger: Optional[Path] = LEDGER,
) -> None:
    """Re-run recorded results at the current commit, on this GPU, with each record's protocol, and say whether
    their verdicts still hold. An A/B is re-run interleaved and its effect (B's speed-up over A) compared with the
    recorded effect: HOLDS (the new CI overlaps the recorded effect ± the bar), REGRESSED (wholly below it),
    IMPROVED (wholly above). A bench test, a run or a sweep's best point is re-measured and compared with the
    recorded figure on the same GPU model. CANNOT-RUN (a knob, workload or experiment that no longer exists,
    another GPU) and RETIRED (`minfer ledger retire`) say why in one line.

    Each result is appended as a `verify` record (--no-record to skip). Exit status 1 when anything REGRESSED,
    so a GPU CI job can gate on it.

    Examples:

      minfer ledger verify --landed

      minfer ledger verify 83 88 --plan
    """
    numbers = [core.parse_id(i) for i in ids or []]
    since_id = core.parse_id(since) if since is not None else None
    if not ids and not landed:
        raise UsageError("name the records to verify (e.g. `minfer ledger verify 83 86`) or give --landed"
                         + (" (--since narrows those)" if since is not None else ""))
    directory = resolve_dir(ledger)
    contents = load_contents(directory)
    chosen = _choose(contents, numbers, landed, since_id)
    if not chosen:
        raise UsageError(f"no record to verify in {directory} (no LANDED A/B{' from #' + str(since_id) if since_id else ''})")
    bar_fraction = bar / 100.0 if bar is not None else None
    retired = core_verify.retired_ids(contents.records)
    superseded_by = core_verify.supersessions(contents.records)
    plans = {r["id"]: core_verify.plan(r, contents.records, bar=bar_fraction, retired=retired,
                                       superseded=superseded_by) for r in chosen}
    superseded = {i for i, p in plans.items() if landed and not numbers and p.superseded_by is not None}
    if plan_only:
        for record in chosen:
            out.print(clean(_plan_line(record, plans[record["id"]], record["id"] in superseded, min_rounds)),
                      markup=False, soft_wrap=True)
        runs = [p for i, p in plans.items() if p.mode != "none" and i not in superseded]
        abs_ = sum(p.mode == "ab" for p in runs)
        out.print(f"{len(chosen)} record(s): {len(runs)} to re-run ({abs_} A/B, at most {max_time:g} s of rounds "
                  f"each, after compiling), {len(chosen) - len(runs)} not; "
                  + ("nothing would be recorded (--no-record)" if no_record else
                     "each re-run appends a verify record to the ledger"), markup=False)
        if report_problems(contents):
            raise typer.Exit(code=1)
        return
    if not no_record:
        options.check_ledger_writable(str(directory))
    from minfer_cli.measure import environment as envmod
    from minfer_cli.measure.verify_runner import HarnessRunner

    to_run = [r for r in chosen if r["id"] not in superseded]
    outcomes: list[core_verify.Outcome] = []
    code = 0
    with progress("ledger verify") as report:
        runner = HarnessRunner(max_time_s=max_time, min_rounds=min_rounds, progress=report)
        for i, record in enumerate(to_run):
            report(f"#{record['id']} ({i + 1}/{len(to_run)})", i / len(to_run))
            outcome = core_verify.verify(record, contents.records, runner, bar=bar_fraction,
                                         given=plans[record["id"]])
            outcomes.append(outcome)
            out.print(f"#{record['id']} {verdict_text(outcome.outcome)}: {plain(outcome.reason)}", soft_wrap=True)
            changed = _environment_changes(record, outcome)
            if changed:
                out.print(f"  environment then → now: {clean(changed)}", markup=False, soft_wrap=True)
            if not no_record:
                rec = core_verify.verify_record(record, outcome, git=envmod.git_state(),
                                                command=envmod.command_line(), timestamp=core.utc_timestamp())
                code = max(code, options.write_record(rec, str(directory)))
    for i in sorted(superseded):
        out.print(f"#{i}: superseded by #{plans[i].superseded_by} (the latest A/B of the same arms governs)",
                  markup=False)
    out.print(_summary(outcomes, {r["id"]: r for r in chosen}, out.width))
    counts = {k: sum(o.outcome == k for o in outcomes) for k in core.schema.VERIFY_OUTCOMES}
    out.print(", ".join(f"{n} {k}" for k, n in counts.items() if n) + (f", {len(superseded)} superseded" if superseded else ""))
    flagged = report_problems(contents)
    if counts["REGRESSED"] or flagged:
        raise typer.Exit(code=1)
    if code:
        raise typer.Exit(code=code)


@guard
def retire(
    ids: List[str] = typer.Argument(..., metavar="ID...", help="Records that no longer apply, e.g. 47 56."),
    why: str = typer.Option(..., "--why", help="Why they no longer apply (e.g. the variant was deleted on purpose, "
                            "naming the commit)."),
    ledger: Optional[Path] = LEDGER,
) -> None:
    """Append a `retire` tombstone: the named records stay as they are (the ledger is append-only), and `ledger
    verify` reports them RETIRED instead of CANNOT-RUN.

    Example: minfer ledger retire 47 56 --why "gemv STAGE=1 deleted in a1b2c3d: it lost its A/B"
    """
    numbers = list(dict.fromkeys(core.parse_id(i) for i in ids))
    if not why.strip():
        raise UsageError("--why must say why the records no longer apply, e.g. --why \"variant deleted in a1b2c3d\"")
    directory = resolve_dir(ledger)
    contents = load_contents(directory)
    found = [core.find(contents, i)[0] for i in numbers]
    already = core_verify.retired_ids(contents.records)
    for rec in found:
        if rec.get("kind") == "retire":
            raise UsageError(f"#{rec['id']} is itself a retire record; only the records it names can be retired, "
                             "and records are never removed")
        if rec["id"] in already:
            rid, reason = already[rec["id"]]
            raise UsageError(f"#{rec['id']} is already retired by #{rid} ({reason[:80]}); leave it out")
    titles = [r.get("title") for r in found]
    options.check_ledger_writable(str(directory))
    from minfer_cli.measure import environment as envmod

    record = {
        "schema": 2, "title": f"retire {', '.join(f'#{i}' for i in numbers)}: {why.strip()}"[:200],
        "timestamp": core.utc_timestamp(), "kind": "retire", "verdict": "RETIRED",
        "retire": {"ids": numbers, "why": why.strip(), "titles": [str(t) for t in titles]},
        "git": envmod.git_state(), "command": envmod.command_line(), "notes": "",
    }
    code = options.write_record(record, str(directory))
    if report_problems(contents) and not code:
        err.print("(the tombstone was written; the skipped files above are unrelated)", markup=False)
    if code:
        raise typer.Exit(code=code)
