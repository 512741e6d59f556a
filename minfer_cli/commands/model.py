"""`minfer model list | synth | check`: the presets, a preset's random-but-valid weights as a GGUF file (Q4_K_M on
the GPU, or F16 for llama.cpp's quantizer), and the numerical check of the engine against a float64 reference."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from minfer_cli.console import guard, json_text, out, progress
from minfer_cli.engine.check import DEFAULT_TOLERANCE
from minfer_cli.errors import UsageError

PRESET_COLUMNS_DROPPED_FIRST = ("Q4_K/Q5_K/Q6_K/F32", "context", "arch", "vocab", "layers")
"""`model list` columns left out, in this order, while the table is wider than the terminal."""

app = typer.Typer(name="model", help="Model presets and GGUF files.", no_args_is_help=True)


@app.command("list")
@guard
def list_presets() -> None:
    """List the built-in presets (`minfer bench --preset`, `minfer model synth`) with their shapes, Q4_K_M tensor
    types, parameter count and size, computed from the shapes: nothing is generated and no GPU is needed.

    Columns: layers, hidden (d_model), ffn, heads (q/kv x head_dim), vocab, context (the KV-cache rows a preset
    allows), params, size (GiB or MiB, llama-bench's "size") and the number of Q4_K / Q5_K / Q6_K / F32 tensors.
    """
    from minfer_cli.commands.ledger_common import fitted_table
    from minfer_cli.engine.config import size_label, tensor_specs
    from minfer_cli.engine.presets import DEFAULT_PRESET, PRESETS

    rows = []
    for name, c in PRESETS.items():
        specs = tensor_specs(c)
        size, params = sum(s.n_bytes for s in specs), sum(s.n_elements for s in specs)
        rows.append({
            "preset": name + (" *" if name == DEFAULT_PRESET else ""), "arch": f"{c.arch} {size_label(params, c)}",
            "layers": str(c.n_layers), "hidden": str(c.hidden), "ffn": str(c.ffn),
            "heads": f"{c.n_heads}/{c.n_kv_heads} x {c.head_dim}", "vocab": str(c.vocab),
            "context": str(c.context_length),
            "params": f"{params / 1e9:.2f} B" if params >= 1e9 else f"{params / 1e6:.2f} M",
            "size": f"{size / 2**30:.2f} GiB" if size >= 2**30 else f"{size / 2**20:.2f} MiB",
            "Q4_K/Q5_K/Q6_K/F32": "/".join(str(sum(s.qtype == q for s in specs)) for q in ("Q4_K", "Q5_K", "Q6_K", "F32")),
        })
    names = list(rows[0])
    natural = {n: max(len(n), *(len(r[n]) for r in rows)) for n in names}
    left_out = []
    for column in PRESET_COLUMNS_DROPPED_FIRST:  # a narrow terminal shows fewer columns, never wrapped cells
        if sum(natural[n] for n in names) + 3 * (len(names) - 1) <= out.width:
            break
        names.remove(column)
        left_out.append(column)
    out.print(fitted_table(names, rows, out.width, (("preset", 12),), right=tuple(n for n in names if n not in ("preset", "arch")),
                           title="model presets (Q4_K_M mix)"), markup=False)
    out.print(f"* the default preset{'; a wider terminal also shows ' + ', '.join(left_out) if left_out else ''}",
              markup=False)


@app.command("synth")
@guard
def synth(
    preset: str = typer.Argument("qwen2-7b-q4_k_m", help="Preset name (`minfer model list`)."),
    output: Path = typer.Option(..., "--output", "-o", help="GGUF file to write (never inside the ledger; an existing "
                                "file only with --force)."),
    seed: int = typer.Option(0, "--seed", "-s", min=0, max=2**63 - 1, help="Seed: the same seed writes the same "
                             "bytes (0 to 2^63-1)."),
    file_type: str = typer.Option("Q4_K_M", "--type", "-t", help="Q4_K_M: the preset's Q4_K_M mix, generated on the "
                                  "GPU; F16: every matrix F16, written from the host (no GPU), the input of "
                                  "llama.cpp's llama-quantize for any other type."),
    layers: Optional[int] = typer.Option(None, "--layers", min=1, help="Keep only the first N blocks (a truncated "
                                         "model of the preset's shapes; said in the output)."),
    force: bool = typer.Option(False, "--force", help="Replace an existing --output file."),
) -> None:
    """Write PRESET's weights, random but valid, as a GGUF file that llama.cpp and `minfer` load: the shapes
    (and a Llama 3.1 preset's llama3 `rope_freqs` divisors) are the real model's, the values are random.

    Examples:

      minfer model synth qwen2-7b-q4_k_m -o /tmp/qwen2-7b-synth.gguf --seed 1

      minfer model synth llama3.1-8b-q4_k_m --type F16 --layers 4 -o /tmp/l31-f16.gguf
      llama-quantize /tmp/l31-f16.gguf /tmp/l31-q4_0.gguf Q4_0 && minfer model check /tmp/l31-q4_0.gguf
    """
    import dataclasses

    from minfer_cli import ledger
    from minfer_cli.engine.gguf_io import write_gguf, write_random_f16_gguf
    from minfer_cli.engine.presets import preset as get_preset
    from minfer_cli.outputs import check_output_path, write_output

    if file_type not in ("Q4_K_M", "F16"):
        raise UsageError(f"unknown --type {file_type!r}; valid: Q4_K_M (generated on the GPU), F16 (the input of "
                         "llama-quantize for every other type)")
    config = get_preset(preset)
    if layers is not None:
        if layers > config.n_layers:
            raise UsageError(f"--layers {layers} exceeds {preset}'s {config.n_layers} layers")
        config = dataclasses.replace(config, n_layers=layers)
    truncated = f" (first {layers} of {get_preset(preset).n_layers} layers)" if layers is not None else ""
    check_output_path(output, force=force, ledger_dir=ledger.ledger_dir(None), suffixes=(".gguf",))
    if file_type == "F16":
        with progress(f"synth {preset} F16") as report:
            write_output(output, lambda tmp: write_random_f16_gguf(config, tmp, seed, progress=report), force=force,
                         ledger_dir=ledger.ledger_dir(None), suffixes=(".gguf",))
        size = output.stat().st_size
        size_text = f"{size / 2**30:.2f} GiB" if size >= 2**30 else f"{size / 2**20:.2f} MiB"
        out.print(f"{output}: {config.arch} F16{truncated}, {size_text}, seed {seed}", soft_wrap=True)
        return
    from minfer_cli.engine.weights import synth_weights

    with progress(f"synth {preset}") as report:
        weights = synth_weights(config, seed, progress=lambda text, f: report(text, 0.2 * f))
        write_output(output, lambda tmp: write_gguf(weights, tmp, progress=lambda text, f: report(
            f"write {text}", 0.2 + 0.8 * f)), force=force, ledger_dir=ledger.ledger_dir(None), suffixes=(".gguf",))
    size, params = weights.size_bytes(), weights.n_params()
    size_text = f"{size / 2**30:.2f} GiB" if size >= 2**30 else f"{size / 2**20:.2f} MiB"
    params_text = f"{params / 1e9:.2f} B" if params >= 1e9 else f"{params / 1e6:.2f} M"
    out.print(
        f"{output}: {weights.describe()}{truncated}, {size_text}, {params_text} params, {len(weights.tensors)} "
        f"tensors, seed {seed}",
        soft_wrap=True,
    )


@app.command("check")
@guard
def check(
    model: Optional[Path] = typer.Argument(None, metavar="[FILE]", help="A GGUF file (llama or qwen2); without it "
                                           "the preset's synthesised weights."),
    preset: Optional[str] = typer.Option(None, "--preset", help="A built-in preset instead of a file "
                                         "(`minfer model list`; default qwen2-7b-q4_k_m)."),
    prompt: int = typer.Option(32, "--prompt", min=1, max=4096, help="Prompt tokens (random, from --seed)."),
    steps: int = typer.Option(8, "--steps", min=0, max=256, help="Teacher-forced decode steps after the prompt."),
    tolerance: float = typer.Option(DEFAULT_TOLERANCE, "--tolerance", min=1e-7, max=1.0,
                                    help="Largest relative L2 of the logits that passes, at the prefill and at "
                                    "every decode step."),
    seed: int = typer.Option(0, "--seed", "-s", min=0, max=2**32 - 1, help="Seed of the prompt and continuation."),
    arm: Optional[List[str]] = typer.Option(None, "--arm", help="Engine knobs, e.g. MMVQ=0 (as `minfer bench`)."),
    fmt: str = typer.Option("table", "--format", "-f", help="Output: table or json."),
    record: bool = typer.Option(False, "--record", help="Append a `check` record (PASS/FAIL) to the ledger."),
    ledger_dir: Optional[str] = typer.Option(None, "--ledger", help="Ledger directory (default: $MINFER_LEDGER, "
                                             "else ledger/records of the project)."),
) -> None:
    """Check the engine against an independent float64 reference on a model: is it computing the model the file
    describes? A random prompt is prefilled and a random continuation decoded teacher-forced (each step is fed the
    next continuation token); the reference (numpy, from gguf's own dequantization, streamed layer by layer)
    runs over the same sequence.

    Printed: the relative L2 of the logits at the prompt's last token and at every decode step (PASS when every
    one is within --tolerance), top-1 agreement with the reference's top-1 - top-2 margin (a flip inside twice the
    logit error is a near-tie, not a bug), top-5 overlap, and the prefill's residual-stream error after each
    layer, so a broken layer is named. Exit status 1 on FAIL.

    Examples:

      minfer model check model-q4_0.gguf --steps 12

      minfer model check --preset tiny-llama --arm MMVQ=0 --record
    """
    from minfer_cli.commands import options
    from minfer_cli.engine.bench import engine_options
    from minfer_cli.engine.check import check as run_check
    from minfer_cli.engine.presets import DEFAULT_PRESET, preset as preset_config
    from minfer_cli.engine.weights import load_gguf, synth_weights
    from minfer_cli.measure.device import probe

    if fmt not in ("table", "json"):
        raise UsageError(f"unknown --format {fmt!r}; valid: table, json")
    if model is not None and preset is not None:
        raise UsageError("give either FILE or --preset NAME, not both")
    config = options.engine_config(arm)
    text = options.single_arm(arm)
    model_config = (options.gguf_config(model, str(model), "give a GGUF file, or --preset NAME") if model is not None
                    else preset_config(preset or DEFAULT_PRESET))
    if prompt + steps > model_config.context_length:
        raise UsageError(f"--prompt {prompt} + --steps {steps} exceed the model's context of "
                         f"{model_config.context_length} tokens")
    if record:
        options.check_ledger_writable(ledger_dir)
    probe()
    with progress("model check") as report:
        if model is not None:
            weights = load_gguf(model, progress=lambda t, f: report(f"load {t}", 0.1 * f))
        else:
            weights = synth_weights(model_config, seed, progress=lambda t, f: report(f"synth {t}", 0.1 * f))
        result = run_check(weights, engine_options(config), prompt, steps, seed, tolerance, knobs=config,
                           progress=lambda t, f: report(t, 0.1 + 0.9 * f))
    data = result.as_dict()
    if fmt == "json":
        print(json_text(data, indent=1))
    else:
        _print_check(result)
    code = options.write_record(_check_record(result, model, preset or (None if model else DEFAULT_PRESET), text),
                                ledger_dir) if record else 0
    if code:
        raise typer.Exit(code=code)
    if not result.passed:
        raise typer.Exit(code=1)


def _print_check(result) -> None:
    from minfer_cli.commands.ledger_common import fitted_table

    rows = [{"phase": p.phase, "position": str(p.position), "rel L2": f"{p.rel_l2:.2e}",
             "top-1 (engine / ref)": f"{p.top1_engine} / {p.top1_reference}"
             + ("" if p.top1_agrees else " near-tie" if p.near_tie else " FLIP"),
             "ref margin": f"{p.margin:.3g}", "max |Δ|": f"{p.max_abs:.3g}", "top-5": f"{p.top5}/5"}
            for p in result.positions]
    names = list(rows[0])
    out.print(fitted_table(names, rows, out.width, (), right=tuple(names[1:]),
                           title=f"{result.model} ({result.source}) · prompt {result.prompt}, {result.steps} "
                                 f"teacher-forced steps, seed {result.seed}"), markup=False)
    layers = ", ".join(f"{i}: {e:.1e}" for i, e in enumerate(result.layers))
    out.print(f"residual stream after each layer (0 = embedding), rel L2: {layers}", markup=False)
    if result.decode_skipped:
        out.print(f"decode not compared: {result.decode_skipped}", markup=False)
    verdict = "PASS" if result.passed else "FAIL"
    where = ""
    if not result.passed:
        prefill_ok = result.positions[0].rel_l2 <= result.tolerance
        where = ("; the prefill passes, the decode steps do not (decode runs its own kernels: mat-vecs, with "
                 "MMVQ=1 on int8-quantized inputs)" if prefill_ok else
                 f"; the prefill's error grows most at layer {result.worst_layer}")
    out.print(f"{verdict}: worst relative L2 {result.worst:.2e} against a tolerance of {result.tolerance:.0e}{where}",
              markup=False)


def _check_record(result, model: Optional[Path], preset: Optional[str], arm: Optional[str]) -> dict:
    """The ledger's ``check`` record of ``result`` (docs/ledger.md); ``arm`` the knobs set on the command line."""
    import datetime as dt

    from minfer_cli.ledger.schema import SCHEMA
    from minfer_cli.measure import environment as envmod
    from minfer_cli.measure.device import probe

    data = result.as_dict()
    data.pop("positions")
    data["arm"] = arm or ""
    return {
        "schema": SCHEMA,
        "title": f"model check {result.model}{' ' + arm if arm else ''}: prompt {result.prompt}, {result.steps} steps",
        "timestamp": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "kind": "check",
        "verdict": "PASS" if result.passed else "FAIL",
        "experiment": "model check",
        "workload": {"name": result.model, "shape": {"source": str(model) if model else result.source,
                                                     **({"preset": preset} if preset else {})}},
        "check": data,
        "knobs": dict(result.knobs),
        "environment": {"device": probe().as_dict()},
        "git": envmod.git_state(),
        "command": envmod.command_line(),
        "notes": "",
    }
