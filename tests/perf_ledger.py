"""Benchmark: wall time of `minfer ledger show` on a generated ledger (the ledger issue's bar: < 0.5 s for 1,000
records on the project's CPU machine). Not a test: run it, read the figures.

    python tests/perf_ledger.py [N ...]        # default: 1000 10000

For each N it writes N records of every kind (tests/ledger_factory.py) to a temporary ledger, then times the whole
`minfer ledger show` process: once with an empty cache (every file parsed; the derived index is built) and five
times after (records from the index), printing the minimum and median of those five. The timed processes may
write bytecode caches (as an installed minfer has them), so the cold run also includes compiling minfer's modules.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.ledger_factory import write_ledger  # noqa: E402


def _time(args: list[str], env: dict) -> float:
    start = time.perf_counter()
    subprocess.run(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - start


def main(sizes: list[int]) -> None:
    for n in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            ledger_dir, cache = Path(tmp) / "records", Path(tmp) / "cache"
            write_ledger(ledger_dir, n)
            env = dict(os.environ, MINFER_CACHE_DIR=str(cache), COLUMNS="80")
            # an installed minfer runs from cached bytecode; without it every run recompiles minfer's modules
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            args = [sys.executable, "-m", "minfer_cli", "ledger", "show", "--ledger", str(ledger_dir)]
            cold = _time(args, env)
            warm = [_time(args, env) for _ in range(5)]
            print(f"{n:>6} records: cold {cold:.2f} s, warm min {min(warm):.2f} s, median {statistics.median(warm):.2f} s")


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [1000, 10000])
