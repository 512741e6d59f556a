"""Rich renderings shared by `run`, `ab` and `calibrate`: the arm table, the comparison line, the environment."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

from minfer_cli.console import verdict_text
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


def arms_table(session: Session, arms: list[ArmOutcome]) -> Table:
    """One row per arm: knobs (those that differ between the arms; the shared ones in the caption), parity, median
    µs [p10, p90], n, TFLOP/s, GB/s, % of roofline."""
    exp, wl = session.experiment, session.workload
    columns, caption = knob_columns([a.config for a in arms])
    t = Table(title=f"{exp.name} · {wl.name} ({wl.describe()})", title_justify="left", caption=caption or None,
              caption_justify="left")
    unit = exp.metric.unit
    for col, just in (("arm", "left"), ("knobs", "left"), ("check", "left"), (f"median {unit}", "right"),
                      (f"p10–p90 {unit}", "right"), ("n", "right"), ("TFLOP/s", "right"), ("GB/s", "right"),
                      ("% roofline", "right")):
        t.add_column(col, justify=just, overflow="fold")  # a narrow terminal wraps values, never cuts them
    for a, knobs in zip(arms, columns):
        if a.status != "ok":
            check = f"[magenta]FAIL[/] {a.error}"
        else:
            check = f"ok ({a.parity_error:.2g})" if a.parity_error else "ok (exact)"
        s, f = a.stats, a.figures
        t.add_row(
            a.label, knobs, check,
            _num(s.median if s else None, ".2f"),
            f"{s.p10:.2f}–{s.p90:.2f}" if s else "—",
            str(s.n) if s else "—",
            _num(f.tflops if f else None, ".1f") if (f and f.tflops) else "—",
            _num(f.gbps if f else None, ".0f"),
            _num(f.pct_roofline if f else None, ".1f"),
        )
    return t


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
    direction = "higher is better" if higher_is_better else "lower is better"
    return (f"B vs A: Δ {comparison.delta * 100:+.2f}% [95% CI {comparison.ci_low * 100:+.2f}%, "
            f"{comparison.ci_high * 100:+.2f}%], Wilcoxon p = {comparison.p_value:.2g}, {comparison.rounds} rounds "
            f"({direction}; bar {bar * 100:.2g}%) → {verdict_text(verdict)}")
