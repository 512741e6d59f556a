"""`minfer model synth PRESET -o FILE`: a preset's random-but-valid weights, generated on the GPU, as a GGUF file."""

from __future__ import annotations

from pathlib import Path

import typer

from minfer_cli.console import guard, out, progress

app = typer.Typer(name="model", help="Model presets and GGUF files.", no_args_is_help=True)


@app.command("synth")
@guard
def synth(
    preset: str = typer.Argument("qwen2-7b-q4_k_m", help="Preset name (qwen2-7b-q4_k_m, llama2-7b-q4_k_m, llama3-8b-q4_k_m, tiny, tiny-llama)."),
    output: Path = typer.Option(..., "--output", "-o", help="GGUF file to write (overwritten)."),
    seed: int = typer.Option(0, "--seed", "-s", min=0, help="Seed: the same seed writes the same bytes."),
) -> None:
    """Generate PRESET's weights on the GPU from SEED (Q4_K_M type mix) and write them as a GGUF file that
    llama.cpp and `minfer` load. The weights are random, the shapes and types are the real model's.

    Example: minfer model synth qwen2-7b-q4_k_m -o /tmp/qwen2-7b-synth.gguf --seed 1
    """
    from minfer_cli.engine.gguf_io import write_gguf
    from minfer_cli.engine.presets import preset as get_preset
    from minfer_cli.engine.weights import synth_weights

    config = get_preset(preset)
    with progress(f"synth {preset}") as report:
        weights = synth_weights(config, seed, progress=lambda text, f: report(text, 0.2 * f))
        write_gguf(weights, output, progress=lambda text, f: report(f"write {text}", 0.2 + 0.8 * f))
    size, params = weights.size_bytes(), weights.n_params()
    size_text = f"{size / 2**30:.2f} GiB" if size >= 2**30 else f"{size / 2**20:.2f} MiB"
    params_text = f"{params / 1e9:.2f} B" if params >= 1e9 else f"{params / 1e6:.2f} M"
    out.print(
        f"{output}: {weights.describe()}, {size_text}, {params_text} params, {len(weights.tensors)} tensors, "
        f"seed {seed}",
        soft_wrap=True,
    )
