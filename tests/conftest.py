"""Test modes. numba reads NUMBA_ENABLE_CUDASIM once, at import, so one pytest process runs one mode:

* simulator session (``NUMBA_ENABLE_CUDASIM=1 pytest -m "not gpu and not compile"``): logic, CLI, and every
  kernel through numba's CUDA simulator at small shapes;
* device session (``pytest -m "compile or gpu"``): `compile` tests build PTX for sm_90a with NVVM (no GPU
  needed); `gpu` tests run on a real GPU at real shapes and are skipped where none is present.
"""

from __future__ import annotations

import os

import pytest

SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


def _gpu_present() -> bool:
    if SIMULATOR:
        return False
    try:
        from numba import cuda

        return bool(cuda.is_available())
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    gpu = _gpu_present()
    for item in items:
        if "gpu" in item.keywords and not gpu:
            item.add_marker(pytest.mark.skip(reason="needs a real NVIDIA GPU (none present, or simulator mode)"))
        if "compile" in item.keywords and SIMULATOR:
            item.add_marker(pytest.mark.skip(reason="compile checks need real NVVM, not the CUDA simulator"))


@pytest.fixture(autouse=True)
def _private_cache_dir(tmp_path_factory, monkeypatch):
    """Every test gets its own minfer cache directory (the ledger's derived index, unrecorded results), never the
    user's ~/.cache."""
    monkeypatch.setenv("MINFER_CACHE_DIR", str(tmp_path_factory.mktemp("minfer-cache")))


@pytest.fixture
def console_width():
    """Sets the shared console's width for one test (rich reads COLUMNS once; tests set the width directly)."""
    from minfer_cli.console import out

    saved = out._width

    def set_width(width: int) -> None:
        out._width = width

    yield set_width
    out._width = saved


@pytest.fixture(scope="module")
def micro_weights():
    """Synthetic weights of `tests.decode_models.micro` (1 layer of `tiny`), seed 11: one build per test module."""
    from minfer_cli.engine.weights import synth_weights
    from tests.decode_models import micro

    return synth_weights(micro(), 11)
