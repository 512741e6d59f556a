"""`minfer bench`: llama-bench-style pp/tg tok/s of a whole model on minfer's kernels."""

from __future__ import annotations

import json
import os
import re
from typing import List, Optional

import typer
from rich.table import Table

from minfer_cli.commands import options
from minfer_cli.console import err, guard, out, progress
from minfer_cli.errors import UsageError

FORMATS = ("md", "csv", "json", "jsonl")


def parse_counts(text: str, flag: str, keep_zero: bool = False) -> list[int]:
    """Comma-separated token counts (`-p 512,2048`): each a non-negative integer; 0 entries are skipped unless
    ``keep_zero`` (depths: `-d 0,4096` is an empty cache and one of 4096 tokens); repeats are dropped."""
    values = []
    for part in str(text).split(","):
        part = part.strip()
        if not re.fullmatch(r"[+-]?[0-9]+", part):  # ASCII digits: int() also takes "٣"
            example = "0,4096" if keep_zero else "512,2048"
            raise UsageError(f"{flag} takes comma-separated token counts, e.g. {flag} {example}; got {text!r}")
        value = int(part)
        if value < 0:
            raise UsageError(f"{flag} token counts must be >= 0, got {value}")
        if value not in values:
            values.append(value)
    return [v for v in values if v > 0 or keep_zero]


def _rows_dicts(rows) -> list[dict]:
    """One export row per test: llama-bench's columns (t_s = mean tok/s, stddev) and the same figures the ledger
    keeps (median, p10, p90, n; numpy's linear-interpolation percentiles of the repetitions)."""
    import numpy as np

    def pct(r, q: float) -> float:
        return round(float(np.percentile(r.samples, q)), 2)

    return [{"model": r.model, "size_gib": round(r.size_bytes / 2**30, 4), "params_b": round(r.n_params / 1e9, 4),
             "test": r.test, "n_depth": r.depth, "t_s": round(r.mean, 2), "stddev": round(r.std, 2), "median": pct(r, 50),
             "p10": pct(r, 10), "p90": pct(r, 90), "n": len(r.samples), "samples": [round(x, 2) for x in r.samples],
             "peak_mem_gib": round(r.peak_mem_bytes / 2**30, 3), "mem_growth_mib": round(r.mem_growth_bytes / 2**20, 1),
             "capture_ms": round(r.capture_seconds * 1e3, 2),
             **({"breakdown_us": {s: round(us, 2) for s, us, _ in r.breakdown}} if r.breakdown else {})}
            for r in rows]


def _check_knobs_are_read(config, pp: list, tg: list) -> None:
    """Refuse an --arm that moves a knob no requested test reads (a tg knob with -n 0, a pp knob with -p 0): its
    numbers would be labelled with a setting that had no effect."""
    from minfer_cli.engine.bench import idle_knobs

    unread = ([f"{k} (pp: needs -p > 0)" for k in idle_knobs(config, tg=True)] if not pp else []) + \
             ([f"{k} (tg: needs -n > 0)" for k in idle_knobs(config, tg=False)] if not tg else [])
    if unread:
        raise UsageError(f"--arm sets a knob no requested test reads: {', '.join(unread)}")


def breakdown_table(row) -> Table:
    """A row's stage breakdown: µs a token (tg) or a prefill (pp), share of the stages' sum, intervals."""
    total = sum(us for _, us, _ in row.breakdown)
    tg = row.test.startswith("tg")
    unit = "token" if tg else "prefill"
    timed = 1e6 / row.mean if tg else 1e6 * row.n_tokens / row.mean
    t = Table(title=f"{row.test}: GPU time a {unit} by stage (CUDA events between stages; {total:.1f} µs in all, "
                    f"the timed {unit} {timed:.1f} µs)", box=None, show_edge=False)
    for col in ("stage", f"µs/{unit}", "%", f"intervals/{unit}"):
        t.add_column(col, justify="left" if col == "stage" else "right")
    for stage, us, count in row.breakdown:
        t.add_row(stage, f"{us:.1f}", f"{100 * us / total:.1f}" if total > 0 else "-", f"{count:g}")
    return t


@guard
def bench(
    model: Optional[str] = typer.Option(None, "--model", "-m", help="A GGUF file (llama or qwen2). Default: the built-in preset."),
    preset: Optional[str] = typer.Option(None, "--preset", help="Built-in preset (default qwen2-7b-q4_k_m); weights synthesised on the GPU."),
    prompt: str = typer.Option("512", "--n-prompt", "-p", help="Prompt lengths for pp tests, comma-separated (0 skips)."),
    gen: str = typer.Option("128", "--n-gen", "-n", help="Generation lengths for tg tests, comma-separated (0 skips)."),
    depth: str = typer.Option("0", "--n-depth", "-d", help="Tokens already in the KV cache before each pp and tg test, "
                              "comma-separated (llama-bench -d; e.g. -d 0,4096,16384). Each depth's cache is filled "
                              "by an untimed prefill of random tokens."),
    reps: int = typer.Option(5, "--repetitions", "-r", min=1, max=1000, help="Repetitions of each test (mean ± stddev)."),
    fmt: str = typer.Option("md", "--output", "-o", help="Output format: md, csv, json, jsonl."),
    arm: Optional[List[str]] = typer.Option(None, "--arm", "-a", help="Engine knobs K=V[,K=V...] (W16, PFUSED, PGRAPH, PHEAD, PFUSE_*, PNORM_WIDE, PROPE_ANGLES, GRAPHS, MMVQ, XRES, FUSE_*, DEEP, PDL, AHEAD, ATTN_SPLITS, gemm knobs incl. NOCALL, SPLITK, AUTOTILE, FA_* attention knobs; `minfer experiments show bench`), given once."),
    seed: int = typer.Option(0, "--seed", min=0, help="Seed of the synthesised weights and the prompt tokens."),
    breakdown: bool = typer.Option(False, "--breakdown", help="After each test, run it again with CUDA events between "
                                   "the forward's stages and print each stage's GPU µs (a token for tg, a prefill "
                                   "for pp) and its share; the events stop kernels overlapping across stages, so "
                                   "the stages sum to more than the timed figure."),
    record: bool = typer.Option(False, "--record", help="Append the result to the ledger (verdict MEASURED)."),
    note: str = options.NOTE,
    ledger: Optional[str] = options.LEDGER,
) -> None:
    """Prompt processing (pp) and token generation (tg) throughput, as llama.cpp's llama-bench prints it.

    pp<n>: one prefill of n tokens into an empty cache, tokens / wall seconds, mean ± stddev over -r repetitions,
    after a warm-up (weight synthesis/loading, f16 copies and JIT compilation are never timed).

    tg<n>: n tokens generated one at a time into an empty cache (a random first token at position 0; greedy on
    the device; GRAPHS=1 replays one CUDA graph per step), tokens / wall seconds, mean ± stddev over -r
    repetitions, after a warm-up generation (JIT compilation and graph capture are never timed).

    At a depth d (-d), the test runs after d tokens already sit in the KV cache (llama-bench's `pp512 @ d4096`):
    its attention reads d more rows; the d rows come from an untimed eager prefill of random tokens.

    Example: minfer bench -p 2048 -n 128        minfer bench -p 0 -n 128 -d 0,4096,16384
    """
    from minfer_cli.engine.bench import check_fits_model, engine_options, idle_fusions, run_pp, run_tg
    from minfer_cli.engine.presets import DEFAULT_PRESET, preset as preset_config
    from minfer_cli.measure.device import require_timing_device

    fmt = fmt.lower()
    if fmt not in FORMATS:
        raise UsageError(f"unknown --output {fmt!r}; valid: {', '.join(FORMATS)}")
    if model is not None and not str(model).strip():
        raise UsageError("-m needs a GGUF file (it was empty); leave -m out for the built-in preset")
    if preset is not None and not preset.strip():
        raise UsageError(f"--preset needs a name (it was empty); `minfer model list` names them (default {DEFAULT_PRESET})")
    if model and preset:
        raise UsageError("give either -m FILE or --preset NAME, not both")
    pp = parse_counts(prompt, "-p")
    tg = parse_counts(gen, "-n")
    depths = parse_counts(depth, "-d", keep_zero=True)
    if not pp and not tg:
        raise UsageError("nothing to run: -p and -n are both 0; e.g. -p 512 -n 128")
    config = options.engine_config(arm)
    _check_knobs_are_read(config, pp, tg)
    config_preset = None if model else preset_config(preset or DEFAULT_PRESET)
    from minfer_cli.engine.config import tensor_specs
    from minfer_cli.engine.weights import load_gguf, synth_weights

    if model:  # the whole file checked, no GPU yet
        model_config, specs = options.gguf_model(model, f"-m {model}", "give a GGUF file, or leave -m out for the "
                                                 "built-in preset")
    else:
        model_config, specs = config_preset, tensor_specs(config_preset)
    longest = max(pp + tg)
    if max(depths) + longest > model_config.context_length:
        flag = '-p' if max(pp or [0]) >= max(tg or [0]) else '-n'
        at = f" after a depth of -d {max(depths)}" if max(depths) else ""
        raise UsageError(f"{flag} {longest}{at} is beyond the model's context length {model_config.context_length}")
    if record:
        options.check_ledger_writable(ledger)
    for idle in idle_fusions(config).values() if pp else ():
        err.print(idle, markup=False, soft_wrap=True)
    require_timing_device()
    weight_bytes = os.path.getsize(model) if model else sum(s.n_bytes for s in specs)
    check_fits_model(model_config, weight_bytes, pp, tg, depths, engine_options(config),
                     specs={s.name: s for s in specs})

    with progress("bench") as report:
        weights = load_gguf(model, progress=report) if model else synth_weights(config_preset, seed, progress=report)
        rows = run_pp(weights, pp, reps, engine_options(config).prefill, seed, progress=report,
                      depths=tuple(depths), breakdown=breakdown) if pp else []
        if tg:
            rows += run_tg(weights, tg, reps, engine_options(config).decode, seed, progress=report, depths=tuple(depths),
                           breakdown=breakdown)
    data = _rows_dicts(rows)
    if fmt == "json":
        print(json.dumps(data, indent=1))
    elif fmt == "jsonl":
        for d in data:
            print(json.dumps(d))
    elif fmt == "csv":
        import pandas as pd

        print(pd.DataFrame(data).drop(columns=["samples", "breakdown_us"], errors="ignore").to_csv(index=False).rstrip())
    else:
        t = Table(box=None, show_edge=False)
        for col, just in (("model", "left"), ("size", "right"), ("params", "right"), ("test", "left"), ("t/s", "right")):
            t.add_column(col, justify=just)
        for r in rows:
            t.add_row(r.model, f"{r.size_bytes / 2**30:.2f} GiB", f"{r.n_params / 1e9:.2f} B", r.test,
                      f"{r.mean:.2f} ± {r.std:.2f}")
        out.print(t)
        for r in rows:
            capture = f", graph capture {r.capture_seconds * 1e3:.1f} ms (untimed)" if r.capture_seconds else ""
            out.print(f"{r.test}: peak device memory {r.peak_mem_bytes / 2**30:.2f} GiB, "
                      f"growth over the repetitions {r.mem_growth_bytes / 2**20:+.1f} MiB{capture}", markup=False)
        for r in rows:
            if r.breakdown:
                out.print(breakdown_table(r))
    if record:
        from minfer_cli.engine.record import bench_record

        rec = bench_record(rows, weights, config, note, preset=None if model else (preset or DEFAULT_PRESET))
        raise typer.Exit(code=options.write_record(rec, ledger))
