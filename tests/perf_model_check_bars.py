"""The numerical-truth issue's bars on the GPU machine: `minfer model check` on files llama.cpp's own quantizer
writes. Not a test: run it on the GPU machine with a built ``llama-quantize``, read the summary.

    python tests/perf_model_check_bars.py --llama-quantize /tmp/lbuild/bin/llama-quantize --out /tmp/bars \\
        [--presets qwen2-1.5b-q4_k_m,llama3.1-8b-q4_k_m] [--types F16,Q8_0,...] [--layers llama3.1-8b-q4_k_m=4]
        [--steps 8] [--arm K=V] [--record]

Per preset: `minfer model synth PRESET --type F16` (random weights, the real shapes; ``--layers`` keeps the first
N blocks of a preset, said in the summary), then per type ``llama-quantize F16.gguf TYPE.gguf TYPE`` (F16 is
checked as written) and ``minfer model check TYPE.gguf --steps N --format json`` (``--record``: with a ledger
record each). Prints one line per file: type, the worst relative L2 of the logits over the prefill and every
decode step, the worst layer, PASS/FAIL, seconds; the same lines go to ``OUT/summary.txt``. Exit status 1 when
any check fails or cannot run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

TYPES = ("F16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0", "Q3_K_M", "Q2_K")
PRESETS = ("qwen2-1.5b-q4_k_m", "llama3.1-8b-q4_k_m")
MINFER = [sys.executable, "-m", "minfer_cli"]


def _run(cmd: list[str], log: Path) -> subprocess.CompletedProcess:
    with log.open("a") as f:
        f.write("$ " + " ".join(cmd) + "\n")
    result = subprocess.run(cmd, capture_output=True, text=True)
    with log.open("a") as f:
        f.write(result.stdout[-20000:] + result.stderr[-20000:] + f"[exit {result.returncode}]\n")
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-quantize", required=True, help="path of llama.cpp's llama-quantize")
    ap.add_argument("--out", required=True, help="folder for the GGUF files, logs and summary.txt")
    ap.add_argument("--presets", default=",".join(PRESETS))
    ap.add_argument("--types", default=",".join(TYPES))
    ap.add_argument("--layers", action="append", default=[], help="PRESET=N: keep the first N blocks")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--arm", action="append", default=[], help="engine knobs K=V, passed to model check")
    ap.add_argument("--record", action="store_true", help="append a ledger record per check")
    ap.add_argument("--keep", action="store_true", help="keep the quantized files (default: removed once checked)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log, summary = out / "log.txt", out / "summary.txt"
    layers = dict(item.split("=") for item in args.layers)
    failed = 0

    def say(line: str) -> None:
        print(line, flush=True)
        with summary.open("a") as f:
            f.write(line + "\n")

    for preset in args.presets.split(","):
        f16 = out / f"{preset}-f16.gguf"
        if not f16.exists():
            cmd = MINFER + ["model", "synth", preset, "--type", "F16", "-o", str(f16), "--seed", "1"]
            if preset in layers:
                cmd += ["--layers", layers[preset]]
            t0 = time.perf_counter()
            r = _run(cmd, log)
            if r.returncode:
                say(f"{preset}: synth failed (exit {r.returncode}): {(r.stderr or r.stdout).strip()[-300:]}")
                failed += 1
                continue
            say(f"{preset}: {r.stdout.strip()} ({time.perf_counter() - t0:.0f} s)")
        for qtype in args.types.split(","):
            t0 = time.perf_counter()
            path = f16
            if qtype != "F16":
                path = out / f"{preset}-{qtype.lower()}.gguf"
                r = _run([args.llama_quantize, str(f16), str(path), qtype, str(args.threads)], log)
                if r.returncode:
                    say(f"{preset} {qtype}: llama-quantize failed (exit {r.returncode})")
                    failed += 1
                    continue
            tq = time.perf_counter() - t0
            cmd = MINFER + ["model", "check", str(path), "--steps", str(args.steps), "--prompt", str(args.prompt),
                            "--format", "json"] + [a for k in args.arm for a in ("--arm", k)]
            if args.record:
                cmd.append("--record")
            r = _run(cmd, log)
            try:
                data = json.loads(r.stdout[r.stdout.index("{"):])
            except ValueError:
                say(f"{preset} {qtype}: model check exit {r.returncode}: {(r.stderr or r.stdout).strip()[-400:]}")
                failed += 1
                continue
            worst = data["worst_rel_l2"]
            verdict = "PASS" if data.get("passed") else "FAIL"
            failed += verdict != "PASS"
            say(f"{preset} {qtype:7s} {verdict} worst rel L2 {worst:.3e} prefill {data.get('prefill_rel_l2', 0):.3e} "
                f"steps max {max(data['steps_rel_l2'] or [0]):.3e} top1 {data['top1_agreement']:.2f} quantize {tq:.0f} s, check {time.perf_counter() - t0 - tq:.0f} s")
            if qtype != "F16" and not args.keep:
                path.unlink(missing_ok=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
