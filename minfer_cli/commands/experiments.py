"""`minfer experiments list`: every registered experiment, its knobs and its workloads."""

from __future__ import annotations

import json

import typer
from rich.table import Table

from minfer_cli.console import err, guard, out
from minfer_cli.experiment import broken, load_all

app = typer.Typer(name="experiments", help="The registered experiments (one file each under experiments/).",
                  no_args_is_help=True)


@app.command("list")
@guard
def list_experiments(
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """List every experiment: purpose, knobs (allowed values, the default marked *), workloads (name: shape).

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
    t = Table(title="experiments", title_justify="left", show_lines=True)
    for col in ("experiment", "knobs (* default)", "workloads"):
        t.add_column(col)
    for e in registry.values():
        knobs = "\n".join(
            f"{k.name} ∈ {{{', '.join(f'[bold]{v}*[/]' if v == k.default else str(v) for v in k.values)}}}  [dim]{k.doc}[/]"
            for k in e.knobs
        ) or "(none)"
        workloads = "\n".join(f"{w.name}: {w.describe()}" for w in e.workloads)
        t.add_row(f"[bold]{e.name}[/]\n[dim]{e.purpose}[/]", knobs, workloads)
    out.print(t)
    for module, error in broken().items():
        err.print(f"experiments/{module}.py failed to load: {error}", markup=False, style="red", soft_wrap=True)
    if broken():
        raise typer.Exit(code=1)
