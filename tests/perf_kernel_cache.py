"""Benchmark: wall time of a whole `minfer bench` process with an empty kernel cache, then again with the cache
the first one wrote (the codebase issue's bar: the second `minfer bench -p 2048 -n 128 -r 3` on the H200 <= 15 s).
Not a test: run it on the GPU machine, read the figures.

    python tests/perf_kernel_cache.py [bench arguments ...]     # default: -p 2048 -n 128 -r 3

Each run is a fresh process with its own MINFER_CACHE_DIR (a temporary directory, empty before the first run); it
prints the wall seconds, and how many kernels the process loaded from the cache and compiled (numba-cuda's
per-dispatcher counters, summed at exit), then the bench output's last lines. A third run with
MINFER_KERNEL_CACHE=0 times a process that neither reads nor writes the cache.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_RUN = """
import atexit, gc, json, sys
def _report():
    from numba.cuda.dispatcher import CUDADispatcher
    hits = misses = 0
    for obj in gc.get_objects():
        if isinstance(obj, CUDADispatcher):
            stats = obj.stats
            hits += sum(stats.cache_hits.values())
            misses += sum(stats.cache_misses.values())
    sys.stderr.write("KERNEL-CACHE " + json.dumps({"loaded": hits, "compiled": misses}) + "\\n")
atexit.register(_report)
sys.argv = ["minfer", *sys.argv[1:]]
from minfer_cli.main import cli
cli()
"""


def run(args: list[str], env: dict) -> tuple[float, dict, str]:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _RUN, *args], env=env, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - start
    counts = next((json.loads(line.split(" ", 1)[1]) for line in done.stderr.splitlines()
                   if line.startswith("KERNEL-CACHE ")), {})
    tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-6:])
    return wall, counts, tail if done.returncode == 0 else f"exit {done.returncode}:\n{done.stderr[-2000:]}"


def main(bench: list[str]) -> None:
    args = ["bench", *(bench or ["-p", "2048", "-n", "128", "-r", "3"])]
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, MINFER_CACHE_DIR=tmp)
        env.pop("MINFER_KERNEL_CACHE", None)
        for label, extra in (("empty cache", {}), ("second process", {}), ("cache off", {"MINFER_KERNEL_CACHE": "0"})):
            wall, counts, tail = run(args, {**env, **extra})
            print(f"minfer {' '.join(args)} -- {label}: {wall:.1f} s wall, kernels loaded {counts.get('loaded')}, "
                  f"compiled {counts.get('compiled')}\n{tail}\n", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
