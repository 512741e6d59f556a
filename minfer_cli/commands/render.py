"""Rich renderings shared by `run`, `ab` and `calibrate`: the arm table, the comparison line, the environment."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text

from minfer_cli.console import out, verdict_text
from minfer_cli.knobs import format_config

if TYPE_CHECKING:
    from minfer_cli.measure.harness import ArmOutcome, Session


def _num(x, fmt: str) -> str:
    return "—" if x is None else format(x, fmt)


def knob_columns(configs: list) -> tuple[list[str], str]:
    """Each arm's knobs column and the table's caption: with two or more arms, the column shows only the knobs
    whose values differ between the arms and the caption the ones every arm shares (``every arm: K=V,...``), so an
    A/B of one knob reads as that knob; one arm shows all its knobs and no caption."""
    if len(configs) < 2:
        return [format_config(c) for c in configs], ""
    keys = list(dict.fromkeys(k for c in configs for k in c))  # every arm's knobs, in first-seen order
    varying = [k for k in keys if len({str(c[k]) if k in c else None for c in configs}) > 1]
    shared = {k: configs[0][k] for k in keys if k not in varying}
    columns = [format_config({k: c[k] for k in varying if k in c}) or "(same knobs)" for c in configs]
    return columns, f"every arm: {format_config(shared)}" if shared else ""


def arms_table(session: Session, arms: list[ArmOutcome]) -> Text:
    """One row per arm: knobs (those that differ between the arms; the shared ones under the table, once), check,
    median µs [p10, p90], n, TFLOP/s, GB/s, % of roofline. Rows never wrap: a long cell ends in … at the
    terminal's width, and a narrow terminal leaves whole figure columns out, naming them (a one-arm run's knobs,
    which are long, go under the table whole instead; a column with no figure at all, TFLOP/s of a copy, is not
    shown)."""
    from minfer_cli.commands.ledger_common import fitted_table

    exp, wl = session.experiment, session.workload
    columns, caption = knob_columns([a.config for a in arms])
    if len(arms) == 1:
        columns, caption = [""], f"knobs: {columns[0]}" if columns[0] else ""
    unit = exp.metric.unit
    names = ["arm", *(["knobs"] if len(arms) > 1 else []), "check", f"median {unit}", f"p10–p90 {unit}", "n",
             "TFLOP/s", "GB/s", "% roofline"]
    rows = []
    for a, knobs in zip(arms, columns):
        if a.status != "ok":
            check = f"FAIL {a.error}"
        else:
            check = f"ok ({a.parity_error:.2g})" if a.parity_error else "ok (exact)"
        s, f = a.stats, a.figures
        rows.append({
            "arm": a.label, "knobs": knobs, "check": check,
            f"median {unit}": _num(s.median if s else None, ".2f"),
            f"p10–p90 {unit}": f"{s.p10:.2f}–{s.p90:.2f}" if s else "—",
            "n": str(s.n) if s else "—",
            "TFLOP/s": _num(f.tflops if f else None, ".1f") if (f and f.tflops) else "—",
            "GB/s": _num(f.gbps if f else None, ".0f"),
            "% roofline": _num(f.pct_roofline if f else None, ".1f"),
        })
    shrink = (("knobs", 16), ("check", 10), (f"p10–p90 {unit}", 9), ("knobs", 8), ("check", 4))
    table = fitted_table(names, rows, out.width, shrink, right=tuple(names[names.index("check") + 1:]),
                         title=f"{exp.name} · {wl.name} ({wl.describe()})",
                         droppable=("TFLOP/s", "GB/s", "n", "% roofline"),
                         more="a wider terminal shows them; --json has every figure")
    if caption:
        table.append(f"\n{caption}")
    return table


def timing_lines(session: Session, arms: list[ArmOutcome]) -> list[str]:
    lines = []
    for a in arms:
        if a.timing:
            lines.append(f"timing {a.label}: {a.timing.describe()}")
    c = session.ceilings
    lines.append(
        f"roofline: {c.copy_gbps:.0f} GB/s copy, {c.f16_matmul_tflops:.0f} TFLOP/s f16 ({c.source})"
        if c else f"roofline: no measured ceilings for {session.device.name} in baselines/ (% of roofline not shown)"
    )
    return lines


def environment_line(session: Session, end) -> str:
    d, s = session.device, session.env_start
    text = (f"{d.name} (sm_{d.compute_capability.replace('.', '')}, {d.sm_count} SMs, L2 {d.l2_bytes / 2**20:.0f} MiB), "
            f"driver {d.driver_version}, runtime {d.runtime_version}; "
            f"SM {s.sm_clock_mhz} MHz, mem {s.mem_clock_mhz} MHz, {s.temperature_c} °C, {s.power_w} W at start")
    if end is not None:
        text += f"; {end.sm_clock_mhz} MHz, {end.temperature_c} °C, {end.power_w} W at end"
    return text


def verdict_line(comparison, verdict: str, bar: float, higher_is_better: bool) -> str:
    if comparison is None:
        return f"verdict: {verdict_text(verdict)}"
    from minfer_cli.ledger.figures import fmt_change, fmt_p, speedup, speedup_interval

    gain = speedup(comparison.delta, higher_is_better)
    low, high = speedup_interval(comparison.ci_low, comparison.ci_high, higher_is_better)
    p_text = fmt_p(comparison.p_value)
    return (f"B vs A: {fmt_change(gain)} [95% CI {low * 100:+.2f}%, {high * 100:+.2f}%] (speed-up = old time / new "
            f"time - 1, or new rate / old rate - 1), Wilcoxon p {p_text if p_text.startswith('<') else '= ' + p_text}, "
            f"{comparison.rounds} rounds (bar {bar * 100:.2g}%) → {verdict_text(verdict)}")
