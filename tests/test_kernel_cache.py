"""The on-disk kernel cache (`kernels.jit`): where entries live, what invalidates them, and that a corrupt entry is
never trusted. Without a GPU (the `compile` session: numba's real CUDA target, no simulator) the parts that need no
driver; on the GPU a second process loads what the first compiled, and a corrupted cache is rebuilt."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.compile


@pytest.fixture
def jit(monkeypatch, tmp_path):
    from kernels import jit as module

    monkeypatch.setenv("MINFER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("MINFER_KERNEL_CACHE", raising=False)
    monkeypatch.setattr(module, "_tag", None)
    return module


def test_the_cache_directory_is_minfers(jit, monkeypatch, tmp_path):
    from minfer_cli import knobs
    from minfer_cli.ledger.index import cache_dir

    assert jit.ENV_KERNEL_CACHE == knobs.ENV_KERNEL_CACHE and knobs.ENV_KERNEL_CACHE in knobs.ENV_VARS
    assert jit.cache_root() == cache_dir() / "kernels" == tmp_path / "cache" / "kernels"
    monkeypatch.delenv("MINFER_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert jit.cache_root() == cache_dir() / "kernels" == tmp_path / "xdg" / "minfer" / "kernels"


def test_the_tag_covers_every_kernel_source_file(jit, monkeypatch, tmp_path):
    """A device function lives in another file than the kernel that inlines it: numba's per-file stamp misses
    its change, the tag does not."""
    copy = tmp_path / "kernels"
    shutil.copytree(Path(jit.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(jit, "_KERNELS_DIR", copy)
    before = jit.source_tag()
    assert jit.source_tag() == before  # deterministic
    device = copy / "gemv" / "device.py"
    device.write_text(device.read_text() + "\n# a change to a device function\n")
    assert jit.source_tag() != before
    (copy / "quant" / "new_format.py").write_text("X = 1\n")
    assert len({before, jit.source_tag()}) == 2


def test_older_tags_are_pruned(jit, monkeypatch):
    root = jit.cache_root()
    for i in range(jit.KEEP_TAGS + 2):
        (root / f"old{i}").mkdir(parents=True)
        os.utime(root / f"old{i}", (i, i))
    tag = jit.tag_dir()
    left = sorted(p.name for p in root.iterdir())
    assert tag.name in left and len(left) == jit.KEEP_TAGS
    assert "old0" not in left and f"old{jit.KEEP_TAGS + 1}" in left  # the oldest go first


def test_generated_source_file_is_keyed_on_source_and_bindings(jit):
    """The same generated text bound to another device function is another kernel: another file."""
    src = "def k(x):\n    x[0] = f(1)\n"
    one = jit.source_file(jit.source_text(src, {"f": json.dumps}))
    assert one == jit.source_file(jit.source_text(src, {"f": json.dumps}))
    other = jit.source_file(jit.source_text(src, {"f": json.loads}))
    assert one != other and one.parent == other.parent == jit.tag_dir() / "source"
    assert one.read_text().endswith(src) and "# f = json.dumps" in one.read_text()
    assert jit.source_file(jit.source_text(src + "\n", {"f": json.dumps})) not in (one, other)
    one.write_text("tampered")  # rewritten, never trusted
    assert jit.source_file(jit.source_text(src, {"f": json.dumps})) == one and one.read_text().endswith(src)


class _Context:
    """What `CUDACache.load_overload` asks of a target context (no driver needed)."""

    def refresh(self):
        pass

    def codegen(self):
        return None


def _defined_in_file(tmp_path, name="scale"):
    path = tmp_path / f"{name}_kernel.py"
    path.write_text("def scale(x):\n    x[0] *= 2\n")
    scope: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), scope)
    return scope["scale"]


def test_a_corrupt_entry_is_rebuilt_never_trusted(jit, tmp_path):
    disp = jit.kernel(_defined_in_file(tmp_path))
    cache = disp._cache
    assert isinstance(cache, jit._DiskCache) and not (jit.cache_root()).exists()  # nothing on disk until compiled
    assert disp.stats.cache_path is None and not disp.stats.cache_hits  # numba's counters work before a compile
    key = ("sig", "arch")
    cache._index_key = lambda sig, codegen: key
    assert cache.load_overload("sig", _Context()) is None  # empty: a miss
    assert Path(cache.cache_path).is_relative_to(jit.tag_dir())
    cache._impl.locator.ensure_cache_path()  # as save_overload does
    cache._cache_file.save(key, {"cubin": b"\x7fELF" + bytes(range(256))})
    assert cache._cache_file.load(key) == {"cubin": b"\x7fELF" + bytes(range(256))}
    (entry,) = Path(cache.cache_path).glob("*.nbc")
    blob = bytearray(entry.read_bytes())
    blob[-7] ^= 0x01  # one flipped bit inside the payload: still a valid pickle, not the bytes written
    entry.write_bytes(bytes(blob))
    with pytest.raises(ValueError, match="checksum"):
        cache._cache_file.load(key)
    assert cache.load_overload("sig", _Context()) is None  # compiled again, not loaded
    entry.write_bytes(b"")  # truncated
    assert cache.load_overload("sig", _Context()) is None
    (index,) = Path(cache.cache_path).glob("*.nbi")
    index.write_bytes(b"\x80garbage")  # an unreadable index is empty, and the next save repairs it
    assert cache.load_overload("sig", _Context()) is None
    cache._cache_file.save(key, {"cubin": b"new"})
    assert cache._cache_file.load(key) == {"cubin": b"new"}


def test_launch_bounds_are_part_of_the_entry_key(jit, tmp_path):
    """One function compiled under two launch bounds (a MINB knob) is two kernels: numba's own key (bytecode,
    closure, target) would give both one entry and the second would run the first's registers."""
    from numba.cuda.core import sigutils

    class Codegen:
        def magic_tuple(self):
            return ("runtime", (9, 0))

    func = _defined_in_file(tmp_path)
    sig, _ = sigutils.normalize_signature("void(float32[::1])")
    keys = []
    for min_blocks in (0, 3, 0):
        cache = jit.kernel(func, threads=128, min_blocks=min_blocks)._cache
        cache._ready()
        keys.append(cache._index_key(sig, Codegen()))
    assert keys[0] != keys[1] and keys[0] == keys[2]


def test_an_unwritable_cache_turns_itself_off(jit, monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("MINFER_CACHE_DIR", str(blocker))
    disp = jit.kernel(_defined_in_file(tmp_path))
    assert disp._cache.load_overload("sig", _Context()) is None
    disp._cache.save_overload("sig", object())  # no error: the kernel still compiles and runs


GPU_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    from numba import cuda
    from kernels.copy import copy, _copy_v4
    from kernels.gemv import GemvConfig, gemv_q, kernel_for
    from kernels.quant.formats import block_format
    rng = np.random.default_rng(int(sys.argv[1]))
    src = rng.integers(0, 2**32, 1 << 16, dtype=np.uint32)
    d_src, d_dst = cuda.to_device(src), cuda.device_array_like(src)
    copy(d_src, d_dst, vec=4)
    ok = bool((d_dst.copy_to_host() == src).all())
    fmt = block_format("Q8_0")
    od, id = 64, 256
    raw = rng.integers(0, 256, od * id // fmt.block_size * fmt.type_size, dtype=np.uint8)
    raw.view(np.uint16)[::fmt.type_size // 2] = np.float16(0.01).view(np.uint16)  # finite block scales
    x = rng.standard_normal(id).astype(np.float32)
    y = cuda.device_array(od, np.float32)
    gemv_q(cuda.to_device(raw), "Q8_0", od, id, cuda.to_device(x), y)
    import gguf
    w = gguf.quants.dequantize(raw.reshape(od, -1), gguf.GGMLQuantizationType.Q8_0).reshape(od, id)
    ref = w.astype(np.float64) @ x
    err = float(np.linalg.norm(y.copy_to_host() - ref) / np.linalg.norm(ref))
    gemv = kernel_for(GemvConfig("Q8_0"))  # the config gemv_q picks for this call
    hits = sum(_copy_v4.stats.cache_hits.values()) + sum(gemv.stats.cache_hits.values())
    misses = sum(_copy_v4.stats.cache_misses.values()) + sum(gemv.stats.cache_misses.values())
    print(json.dumps({"ok": ok, "err": err, "hits": hits, "misses": misses}))
""")


@pytest.mark.gpu
def test_a_second_process_loads_what_the_first_compiled(tmp_path):
    """Two kernels, one written in a module and one generated (gemv), compiled by one process, loaded by the
    next; a corrupted cache is compiled again and still computes the right numbers."""
    env = dict(os.environ, MINFER_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("MINFER_KERNEL_CACHE", None)
    env.pop("NUMBA_ENABLE_CUDASIM", None)

    def run(seed):
        done = subprocess.run([sys.executable, "-c", GPU_SCRIPT, str(seed)], env=env, capture_output=True,
                              text=True, timeout=600, cwd=Path(__file__).parents[1])
        assert done.returncode == 0, done.stderr[-3000:]
        result = json.loads(done.stdout.strip().splitlines()[-1])
        assert result["ok"] and result["err"] < 1e-5, result
        return result

    first = run(1)
    assert first["misses"] == 2 and first["hits"] == 0
    second = run(2)
    assert second["hits"] == 2 and second["misses"] == 0
    for entry in (tmp_path / "cache").rglob("*.nbc"):
        blob = bytearray(entry.read_bytes())
        blob[len(blob) // 2] ^= 0xFF
        entry.write_bytes(bytes(blob))
    third = run(3)
    assert third["misses"] == 2 and third["hits"] == 0


WHOLE_PROGRAM_MODULE = textwrap.dedent("""
    from numba import cuda, types
    from kernels.jit import kernel

    def affine(a, out):
        i = cuda.grid(1)
        if i < a.size:
            out[i] = 2 * a[i] + 1

    AFFINE = kernel(affine, types.void(types.float32[::1], types.float32[::1]), threads=128, whole_program=True)
""")
WHOLE_PROGRAM_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    from numba import cuda
    sys.path.insert(0, sys.argv[1])
    from wp_module import AFFINE
    a = np.random.default_rng().standard_normal(1000).astype(np.float32)
    out = cuda.to_device(np.full(1000, np.nan, np.float32))
    AFFINE[8, 128](cuda.to_device(a), out)
    from kernels.jit import is_whole_program
    (argtypes,) = AFFINE.overloads
    print(json.dumps({"ok": bool((out.copy_to_host() == 2 * a + 1).all()), "whole": is_whole_program(AFFINE, argtypes),
                      "hits": sum(AFFINE.stats.cache_hits.values()), "misses": sum(AFFINE.stats.cache_misses.values())}))
""")


@pytest.mark.gpu
def test_a_whole_program_kernel_runs_from_its_ptx_and_is_cached(tmp_path):
    """`kernel(..., whole_program=True)`: the overload runs from its PTX (the driver's JIT), computes the right
    numbers, and the next process loads that PTX form from the disk cache."""
    (tmp_path / "wp_module.py").write_text(WHOLE_PROGRAM_MODULE)
    env = dict(os.environ, MINFER_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("MINFER_KERNEL_CACHE", None)
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    results = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", WHOLE_PROGRAM_SCRIPT, str(tmp_path)], env=env,
                              capture_output=True, text=True, timeout=300, cwd=Path(__file__).parents[1])
        assert done.returncode == 0, done.stderr[-3000:]
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert all(r["ok"] and r["whole"] for r in results), results
    assert (results[0]["misses"], results[1]["hits"], results[1]["misses"]) == (1, 1, 0), results


def test_whole_program_ptx_states_an_isa_the_driver_reads(jit):
    """`ptx_isa_of_driver`: CUDA 12.x by the release table, 13.m -> 9.m, newer unknown (None), below 12 refused;
    `ptx_for_isa` lowers only a newer .version and touches nothing else."""
    from kernels.errors import KernelConstraintError

    assert jit.ptx_isa_of_driver(13000) == (9, 0) and jit.ptx_isa_of_driver(13020) == (9, 2)
    assert jit.ptx_isa_of_driver(12080) == (8, 7) and jit.ptx_isa_of_driver(12060) == (8, 5)
    assert jit.ptx_isa_of_driver(14000) is None
    with pytest.raises(KernelConstraintError, match="need a CUDA 12.0 or newer driver; this one is 11.8"):
        jit.ptx_isa_of_driver(11080)
    ptx = "//\n// Generated by NVIDIA NVVM Compiler\n.version 9.5\n.target sm_90a\n.address_size 64\n"
    assert jit.ptx_for_isa(ptx, (9, 0)) == ptx.replace(".version 9.5", ".version 9.0")
    assert jit.ptx_for_isa(ptx, (9, 5)) == ptx and jit.ptx_for_isa(ptx, (9, 7)) == ptx and jit.ptx_for_isa(ptx, None) == ptx
    with pytest.raises(ValueError, match="without a .version"):
        jit.ptx_for_isa(".target sm_90a\n", (9, 0))


def test_whole_program_needs_the_signature(jit):
    with pytest.raises(ValueError, match="whole_program needs the signature"):
        jit.kernel(lambda a: None, whole_program=True)


def test_off_switch(jit, monkeypatch):
    monkeypatch.setenv("MINFER_KERNEL_CACHE", "0")
    assert not jit.cache_enabled()
    assert jit.source_file(jit.source_text("def k():\n    pass\n", {})) is None
    assert not jit.cache_root().exists()


def test_every_kernel_is_made_through_kernels_jit():
    """A `__global__` kernel made by `cuda.jit` directly would bypass the cache (and compile in every process)."""
    import ast

    root = Path(__file__).parents[1] / "kernels"
    direct = []
    for path in sorted(root.rglob("*.py")):
        if path.name == "jit.py":
            continue
        def is_cuda_jit(node):
            return isinstance(node, ast.Attribute) and node.attr == "jit" and getattr(node.value, "id", "") == "cuda"

        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and is_cuda_jit(node.func):
                device = {k.arg: k.value for k in node.keywords}.get("device")
                if not (isinstance(device, ast.Constant) and device.value is True):
                    direct.append(f"{path.relative_to(root.parent)}:{node.lineno}")
            elif isinstance(node, ast.FunctionDef):
                direct += [f"{path.relative_to(root.parent)}:{d.lineno}" for d in node.decorator_list if is_cuda_jit(d)]
    assert not direct, f"kernels made with cuda.jit instead of kernels.jit.kernel: {direct}"
