"""`minfer experiments list`: every registered experiment, its knobs and its workloads."""

from __future__ import annotations

import json

import typer

from minfer_cli.console import err, guard, out
from minfer_cli.experiment import broken, load_all

app = typer.Typer(name="experiments", help="The registered experiments (one file each under experiments/).",
                  no_args_is_help=True)


@app.command("list")
@guard
def list_experiments(
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """List every experiment, one line each: its knobs with their defaults, its workloads, its purpose.
    `minfer experiments show NAME` gives one whole; --json all of them whole.

    Example: minfer experiments list
    """
    registry = load_all()
    if as_json:
        data = [
            {
                "name": e.name, "purpose": e.purpose, "ceiling": e.ceiling,
                "metric": {"name": e.metric.name, "unit": e.metric.unit, "higher_is_better": e.metric.higher_is_better},
                "knobs": [{"name": k.name, "values": list(k.values), "default": k.default, "doc": k.doc} for k in e.knobs],
                "workloads": [{"name": w.name, "shape": w.shape, "doc": w.doc} for w in e.workloads],
            }
            for e in registry.values()
        ]
        print(json.dumps(data, indent=2))
        return
    from minfer_cli.commands.ledger_common import fitted_table

    rows = [{"experiment": e.name, "purpose": e.purpose,
             "knobs (default)": ", ".join(f"{k.name}={k.default}" for k in e.knobs) or "(none)",
             "workloads": ", ".join(w.name for w in e.workloads)} for e in registry.values()]
    names = ["experiment", "knobs (default)", "workloads", "purpose"]
    out.print(fitted_table(names, rows, out.width, (("knobs (default)", 24), ("workloads", 20), ("purpose", 24)),
                           title="experiments", droppable=("purpose",), more="a wider terminal shows it"),
              markup=False)
    out.print("`minfer experiments show NAME`: one experiment whole (each knob's values, default and what it does; "
              "each workload's shape)", markup=False)
    for module, error in broken().items():
        err.print(f"experiments/{module}.py failed to load: {error}", markup=False, style="red", soft_wrap=True)
    if broken():
        raise typer.Exit(code=1)


@app.command("show")
@guard
def show_experiment(
    name: str = typer.Argument(..., help="An experiment, e.g. gemv (`minfer experiments list` names them)."),
) -> None:
    """One experiment whole: its purpose and metric, each knob's allowed values (the default marked *) and what it
    does, each workload's shape.

    Example: minfer experiments show gemv
    """
    from minfer_cli.console import clean
    from minfer_cli.experiment import get

    e = get(name)
    out.print(f"[bold]{clean(e.name)}[/bold]: {clean(e.purpose)}")
    out.print(f"metric: {e.metric.name} in {e.metric.unit}, {'higher' if e.metric.higher_is_better else 'lower'} is "
              f"better" + (f"; ceiling: {clean(e.ceiling)}" if e.ceiling else ""), markup=False)
    out.print("\n[bold]knobs[/bold]")
    for k in e.knobs:
        values = ", ".join(f"{v}*" if v == k.default else str(v) for v in k.values)
        out.print(f"  {k.name} ∈ {{{clean(values)}}}", markup=False, soft_wrap=True)
        out.print(f"      {clean(k.doc)}", markup=False)
    out.print("\n[bold]workloads[/bold]")
    for w in e.workloads:
        out.print(f"  {w.name}: {clean(w.describe())}" + (f" — {clean(w.doc)}" if w.doc else ""), markup=False)
