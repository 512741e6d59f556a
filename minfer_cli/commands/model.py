"""`minfer model synth PRESET -o FILE`: a preset's random-but-valid weights, generated on the GPU, as a GGUF file."""

from __future__ import annotations

from pathlib import Path

import typer

from minfer_cli.console import guard, out, progress

PRESET_COLUMNS_DROPPED_FIRST = ("Q4_K/Q6_K/F32", "context", "arch", "vocab")
"""`model list` columns left out, in this order, while the table is wider than the terminal."""

app = typer.Typer(name="model", help="Model presets and GGUF files.", no_args_is_help=True)


@app.command("list")
@guard
def list_presets() -> None:
    """List the built-in presets (`minfer bench --preset`, `minfer model synth`) with their shapes, Q4_K_M tensor
    types, parameter count and size, computed from the shapes: nothing is generated and no GPU is needed.

    Columns: layers, hidden (d_model), ffn, heads (q/kv x head_dim), vocab, context (the KV-cache rows a preset
    allows), params, size (GiB or MiB, llama-bench's "size") and the number of Q4_K / Q6_K / F32 tensors.
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
            "Q4_K/Q6_K/F32": "/".join(str(sum(s.qtype == q for s in specs)) for q in ("Q4_K", "Q6_K", "F32")),
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
    preset: str = typer.Argument("qwen2-7b-q4_k_m", help="Preset name (qwen2-7b-q4_k_m, llama2-7b-q4_k_m, llama3-8b-q4_k_m, tiny, tiny-llama)."),
    output: Path = typer.Option(..., "--output", "-o", help="GGUF file to write (never inside the ledger; an existing "
                                "file only with --force)."),
    seed: int = typer.Option(0, "--seed", "-s", min=0, help="Seed: the same seed writes the same bytes."),
    force: bool = typer.Option(False, "--force", help="Replace an existing --output file."),
) -> None:
    """Generate PRESET's weights on the GPU from SEED (Q4_K_M type mix) and write them as a GGUF file that
    llama.cpp and `minfer` load. The weights are random, the shapes and types are the real model's.

    Example: minfer model synth qwen2-7b-q4_k_m -o /tmp/qwen2-7b-synth.gguf --seed 1
    """
    from minfer_cli import ledger
    from minfer_cli.engine.gguf_io import write_gguf
    from minfer_cli.engine.presets import preset as get_preset
    from minfer_cli.engine.weights import synth_weights
    from minfer_cli.outputs import check_output_path, write_output

    config = get_preset(preset)
    check_output_path(output, force=force, ledger_dir=ledger.ledger_dir(None), suffixes=(".gguf",))
    with progress(f"synth {preset}") as report:
        weights = synth_weights(config, seed, progress=lambda text, f: report(text, 0.2 * f))
        write_output(output, lambda tmp: write_gguf(weights, tmp, progress=lambda text, f: report(
            f"write {text}", 0.2 + 0.8 * f)), force=force, ledger_dir=ledger.ledger_dir(None), suffixes=(".gguf",))
    size, params = weights.size_bytes(), weights.n_params()
    size_text = f"{size / 2**30:.2f} GiB" if size >= 2**30 else f"{size / 2**20:.2f} MiB"
    params_text = f"{params / 1e9:.2f} B" if params >= 1e9 else f"{params / 1e6:.2f} M"
    out.print(
        f"{output}: {weights.describe()}, {size_text}, {params_text} params, {len(weights.tensors)} tensors, "
        f"seed {seed}",
        soft_wrap=True,
    )
