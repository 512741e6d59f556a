"""`minfer kernels`: every compiled kernel instance with its registers, shared/local memory and occupancy."""

from __future__ import annotations

import json
from typing import List, Optional

import typer
from rich.table import Table

from minfer_cli.console import guard, out, progress
from minfer_cli.experiment import get, load_all
from minfer_cli.knobs import parse_grid


@guard
def kernels(
    experiment: Optional[str] = typer.Argument(None, help="Only this experiment (default: all)."),
    axes: List[str] = typer.Argument(None, help="Grid axes K=v1,v2,... (default: each experiment's default knobs)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (the form baselines/ snapshots use)."),
) -> None:
    """Compile kernel instances and list registers per thread, static and dynamic shared memory, local memory per
    thread (spills), resident blocks per SM, and for wgmma kernels whether ptxas keeps their wgmma asynchronous. A
    local-memory figure above 0 is flagged: it means spills; so is "serialized" (ptxas waits for every wgmma before
    the next, e.g. because of a 64-bit integer division in the kernel: its warning code is shown).

    Example: minfer kernels copy VEC=1,2,4
    """
    from minfer_cli.measure.device import require_timing_device
    from minfer_cli.measure.resources import resources

    from minfer_cli.errors import UsageError

    exps = [get(experiment)] if experiment else list(load_all().values())
    grids = [(exp, parse_grid(exp.knobs, axes or [], f"experiment {exp.name}", exp.removed_knobs)) for exp in exps]
    for exp, configs in grids:  # a grid no point of which compiles, refused before the GPU (as `sweep` does)
        problems = [exp.refuse(c, exp.default_workload) for c in configs]
        if configs and all(problems):
            raise UsageError(f"no point of the grid compiles for {exp.name}: {problems[0]}")
    require_timing_device()
    rows = []
    with progress("compiling") as report:
        for exp, configs in grids:
            for i, config in enumerate(configs):
                report(f"{exp.name} {i + 1}/{len(configs)}", i / len(configs))
                try:
                    instances = exp.kernels(config, exp.default_workload)
                except Exception as exc:  # a variant that fails to compile is a row, not a crash
                    rows.append({"experiment": exp.name, "name": str(config), "error": str(exc).splitlines()[0]})
                    continue
                rows.extend({"experiment": exp.name, **resources(k).as_dict()} for k in instances)
    if as_json:
        print(json.dumps(rows, indent=1))
        return
    t = Table(title="compiled kernels", title_justify="left")
    for col in ("experiment", "kernel", "threads", "regs", "static smem B", "dynamic smem B", "local B", "blocks/SM",
                "wgmma"):
        t.add_column(col, justify="left" if col in ("experiment", "kernel", "wgmma") else "right")
    for r in rows:
        if "error" in r:
            t.add_row(r["experiment"], r["name"], "[magenta]INVALID[/]", r["error"], "", "", "", "", "")
            continue
        local = f"[bold red]{r['local_mem']} (spills)[/]" if r["local_mem"] else "0"
        wgmma = r["wgmma"] or "-"
        if wgmma.startswith("serialized"):
            wgmma = f"[bold red]{wgmma}[/]"
        t.add_row(r["experiment"], r["name"], str(r["threads"]), str(r["regs"]), str(r["static_smem"]),
                  str(r["dynamic_smem"]), local, str(r["blocks_per_sm"]), wgmma)
    out.print(t)
