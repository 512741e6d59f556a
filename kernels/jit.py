"""The one door from minfer's kernels to numba-cuda's compiler, and the on-disk kernel cache behind it.

Every ``__global__`` kernel is made here: `kernel` for a Python function (module level, or a closure built by a
factory per knob combination) and `kernel_from_source` for generated source (the gemv kernels). Device functions
stay plain ``cuda.jit(device=True)``: they are compiled into the kernels that call them, and cached with them.

The cache is numba-cuda's own (the machinery behind ``cuda.jit(cache=True)``: a compiled kernel, its cubin and
launch metadata, pickled per signature under an index keyed on the function's bytecode, its closure's values, the
codegen's magic tuple - which holds the GPU's compute capability - and numba-cuda's version), with what a
benchmark needs on top, all in this module:

* **Where**: ``<cache>/kernels/<tag>/``, where ``<cache>`` is minfer's cache directory (``$MINFER_CACHE_DIR``, else
  ``$XDG_CACHE_HOME/minfer``, else ``~/.cache/minfer``) and ``<tag>`` hashes the source of every module of the
  ``kernels`` package, the numba-cuda, cuda-bindings and Python versions. numba stamps only the file that holds a
  kernel; a change to a device function in another file would be missed, so any change to ``kernels/`` starts a
  fresh cache (the older tags are pruned, the newest `KEEP_TAGS` kept).
* **Never trusted when corrupt**: every entry is written with its sha256 and checked on load; an entry that fails
  the check, cannot be read or unpickled is compiled again and overwritten; an index that cannot be read counts as
  empty. A cache directory that cannot be written turns the cache off for that kernel (it still compiles).
* **Generated source** is written once to ``<tag>/source/<sha256>.py`` (the hash covers the source and the names
  its globals are bound to), so numba has a file to stamp and the same source finds its entry in the next process.

``MINFER_KERNEL_CACHE=0`` compiles every kernel in every process (nothing read or written). Under the CUDA
simulator nothing is compiled and nothing is cached.

**Whole-program kernels** (`kernel` with ``whole_program``): numba links every kernel's PTX through nvJitLink,
which compiles it as relocatable code, and ptxas then ignores ``setmaxnreg`` ("(C7504) 'setmaxnreg' ignored to
maintain compatibility across compilation units"). A warp-specialised kernel that hands its producer's registers to
its consumers (CUTLASS sm90, FlashAttention-3) is instead loaded from its PTX through the driver's JIT
(``cuLibraryLoadData``), which compiles one whole program and honours it. The PTX's ``.version`` is lowered to the
newest ISA the installed driver reads (`ptx_isa_of_driver`) when NVVM wrote a newer one. The disk cache then holds
the PTX form; the driver's own JIT cache keeps the machine code.

Uses numba-cuda 0.30 internals (``numba.cuda.dispatcher.CUDACache``, ``numba.cuda.core.caching``): this module is
where a move to another compiler starts.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
import threading
from pathlib import Path
from typing import Callable

from numba import cuda

from kernels.errors import KernelConstraintError
from kernels.ptx import SIMULATOR

ENV_KERNEL_CACHE = "MINFER_KERNEL_CACHE"
"""``0`` turns the kernel cache off (declared with minfer's other variables in ``minfer_cli.knobs``; a test checks
the two names agree)."""
KEEP_TAGS = 4
"""Cache tags (source versions of ``kernels/``) kept side by side; older ones are deleted when a new one starts."""

_KERNELS_DIR = Path(__file__).resolve().parent
_tag_lock = threading.Lock()
_tag: Path | None = None
_source_tag: str | None = None


def cache_enabled() -> bool:
    """Whether compiled kernels are read from and written to disk (not under the simulator, not with
    ``MINFER_KERNEL_CACHE=0``)."""
    return not SIMULATOR and os.environ.get(ENV_KERNEL_CACHE, "1").strip() != "0"


def cache_root() -> Path:
    """``<minfer cache>/kernels``: the same cache directory rule as ``minfer_cli.ledger.index.cache_dir`` (kernels
    never import minfer_cli; a test checks the two agree)."""
    explicit = os.environ.get("MINFER_CACHE_DIR")
    if explicit:
        base = Path(explicit).expanduser()
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = (Path(xdg) if xdg else Path.home() / ".cache") / "minfer"
    return base / "kernels"


def source_tag() -> str:
    """sha256 (hex, 16 characters) of every ``kernels/**/*.py`` file's path and bytes, numba-cuda's, cuda-bindings'
    and Python's versions: the part of the cache key numba's own per-file stamp does not cover."""
    from importlib import metadata

    digest = hashlib.sha256()
    for path in sorted(_KERNELS_DIR.rglob("*.py")):
        digest.update(path.relative_to(_KERNELS_DIR).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    for dist in ("numba-cuda", "cuda-bindings"):
        try:
            digest.update(f"{dist}={metadata.version(dist)}\0".encode())
        except metadata.PackageNotFoundError:
            digest.update(f"{dist}=none\0".encode())
    digest.update(sys.version.encode())
    return digest.hexdigest()[:16]


def tag_dir() -> Path:
    """This source version's cache directory under `cache_root` (created; older tags beyond `KEEP_TAGS` pruned
    when it is new). The source is hashed once per process."""
    global _tag, _source_tag
    with _tag_lock:
        root = cache_root()
        if _tag is None or _tag.parent != root:
            if _source_tag is None:
                _source_tag = source_tag()
            _tag = root / _source_tag
            fresh = not _tag.exists()
            _tag.mkdir(parents=True, exist_ok=True)
            if fresh:
                _prune(root, keep=_tag)
        return _tag


def _prune(root: Path, keep: Path) -> None:
    try:
        tags = sorted((p for p in root.iterdir() if p.is_dir() and p != keep), key=lambda p: p.stat().st_mtime)
    except OSError:
        return
    for old in tags[: max(0, len(tags) - (KEEP_TAGS - 1))]:
        shutil.rmtree(old, ignore_errors=True)


def _disk_cache_class():
    """`CUDACache` subclasses (built on first use: importing numba-cuda's caching module costs start-up)."""
    from numba.cuda.core.caching import IndexDataCacheFile, _CacheLocator
    from numba.cuda.dispatcher import CUDACache, CUDACacheImpl

    class _Locator(_CacheLocator):
        """Entries under `tag_dir`, one folder per source file; the stamp is the file's sha256, not its mtime (a
        fresh checkout of the same source hits)."""

        def __init__(self, py_func, py_file):
            self._py_file = py_file
            self._lineno = py_func.__code__.co_firstlineno
            self._cache_path = str(tag_dir() / self.get_suitable_cache_subpath(py_file))

        def get_cache_path(self):
            return self._cache_path

        def get_source_stamp(self):
            return hashlib.sha256(Path(self._py_file).read_bytes()).hexdigest()

        def get_disambiguator(self):
            return str(self._lineno)

        @classmethod
        def from_function(cls, py_func, py_file):
            return cls(py_func, py_file) if os.path.isfile(py_file) else None

    class _Impl(CUDACacheImpl):
        _locator_classes = [_Locator]

    class _CheckedFile(IndexDataCacheFile):
        """Entries carry their sha256; an index that cannot be read is empty."""

        def _load_index(self):
            try:
                return super()._load_index()
            except Exception:
                return {}

        def _save_data(self, name, data):
            payload = self._dump(data)
            with self._open_for_write(self._data_path(name)) as f:
                f.write(hashlib.sha256(payload).digest() + payload)

        def _load_data(self, name):
            import pickle

            blob = Path(self._data_path(name)).read_bytes()
            digest, payload = blob[:32], blob[32:]
            if hashlib.sha256(payload).digest() != digest:
                raise ValueError(f"kernel cache entry {self._data_path(name)} fails its checksum")
            return pickle.loads(payload)

    class DiskCache(CUDACache):
        """Set up on the dispatcher's first compile, not when the kernel is defined (no disk work at import); a
        cache that cannot be set up is off for this kernel."""

        _impl_class = _Impl
        File = _CheckedFile

        def __init__(self, py_func, launch_bounds=None):
            self._pending = py_func
            self._launch_bounds = launch_bounds
            self._enabled = False
            self._launch_config_key = None
            self._launch_config_sensitive_flag = None

        def _ready(self) -> bool:
            if self._pending is not None:
                func, self._pending = self._pending, None
                try:
                    super().__init__(func)
                    self._cache_file = _CheckedFile(
                        cache_path=self._cache_path,
                        filename_base=self._impl.filename_base,
                        source_stamp=self._impl.locator.get_source_stamp(),
                    )
                except Exception:  # no file to stamp, no writable directory: compile as without a cache
                    self._enabled = False
                    self._launch_config_marker_path = os.devnull
            return self._enabled

        def _index_key(self, sig, codegen):
            # numba keys an entry on bytecode, closure and target, not on the launch bounds the dispatcher was made
            # with: two bounds of one function would share (and overwrite) one compiled kernel
            return super()._index_key(sig, codegen), self._launch_bounds

        @property
        def cache_path(self):
            """The entries' folder, or None before the first compile (numba's stats ask every dispatcher)."""
            return getattr(self, "_cache_path", None)

        def set_launch_config_key(self, key):
            self._ready()
            super().set_launch_config_key(key)

        def is_launch_config_sensitive(self):
            return self._ready() and super().is_launch_config_sensitive()

        def mark_launch_config_sensitive(self):
            return self._ready() and super().mark_launch_config_sensitive()

        def flush(self):
            if self._ready():
                super().flush()

        def load_overload(self, sig, target_context):
            if not self._ready():
                return None
            try:
                return super().load_overload(sig, target_context)
            except Exception:  # corrupt, truncated, unreadable: compile again (and overwrite it)
                return None

        def save_overload(self, sig, data):
            if not self._ready():
                return
            try:
                super().save_overload(sig, data)
            except Exception:  # an unwritable or full cache never stops a kernel from running
                self.disable()

    return DiskCache


_DiskCache = None


def _attach_cache(dispatcher, func: Callable) -> None:
    global _DiskCache
    if not cache_enabled():
        return
    if _DiskCache is None:
        _DiskCache = _disk_cache_class()
    dispatcher._cache = _DiskCache(func, dispatcher.targetoptions.get("launch_bounds"))


def kernel(func: Callable, signature=None, *, threads: int | None = None, min_blocks: int = 0,
           whole_program: bool = False):
    """A numba-cuda kernel dispatcher for ``func``, with the disk cache attached.

    ``signature``: a numba signature to compile now (else on first launch, per argument types); ``threads``: the
    block size promised to the compiler (``__launch_bounds__``), with ``min_blocks`` its second number (blocks per
    SM the registers must fit; 0: no bound). ``whole_program``: load it through the driver's JIT as one program
    (`load_whole_program`: needed for ``setmaxnreg`` to take effect); needs ``signature``. Under the simulator the
    simulator's kernel (no signature, no bounds, nothing to load). Raises ValueError for ``whole_program`` without
    a signature; KernelConstraintError (one line) when the driver cannot load the PTX.
    """
    if whole_program and signature is None:
        raise ValueError("jit.kernel: whole_program needs the signature (the PTX is loaded when it is compiled)")
    if SIMULATOR:
        return cuda.jit(func)
    bounds = None if threads is None else ((threads, min_blocks) if min_blocks else (threads,))
    dispatcher = cuda.jit(func, launch_bounds=bounds)
    _attach_cache(dispatcher, func)
    if signature is not None:
        from numba.cuda.core import sigutils

        argtypes, _ = sigutils.normalize_signature(signature)
        dispatcher.compile(argtypes)
        if whole_program:
            load_whole_program(dispatcher, argtypes)
        dispatcher._specialized = True
        dispatcher.disable_compile()
    return dispatcher


PTX_ISA_OF_CUDA_12 = {0: (8, 0), 1: (8, 1), 2: (8, 2), 3: (8, 3), 4: (8, 4), 5: (8, 5), 6: (8, 5), 8: (8, 7),
                      9: (8, 8)}
"""The PTX ISA version each CUDA 12.x release reads (PTX ISA, "Release notes"); CUDA 13.m reads ISA 9.m."""


def ptx_isa_of_driver(version: int) -> tuple[int, int] | None:
    """The newest PTX ISA (major, minor) a driver of ``cuDriverGetVersion`` ``version`` (e.g. 13000 for CUDA 13.0)
    JIT-compiles; None for a release newer than this table knows (its driver reads what NVVM writes). Raises
    KernelConstraintError (one line) below CUDA 12.0, which has no sm_90a."""
    major, minor = version // 1000, (version % 1000) // 10
    if major < 12:
        raise KernelConstraintError(f"whole-program kernels need a CUDA 12.0 or newer driver; this one is "
                                    f"{major}.{minor}")
    if major == 12:
        return PTX_ISA_OF_CUDA_12.get(minor, max(v for k, v in PTX_ISA_OF_CUDA_12.items() if k <= minor))
    return (9, minor) if major == 13 else None


def ptx_for_isa(ptx: str, isa: tuple[int, int] | None) -> str:
    """``ptx`` with its ``.version`` lowered to ``isa`` when it states a newer one (the instructions minfer's kernels
    use are all older than ISA 8.0; the driver then checks the text); unchanged when ``isa`` is None or not older.
    Raises ValueError when ``ptx`` has no ``.version`` line."""
    found = re.search(r"^\.version\s+(\d+)\.(\d+)\s*$", ptx, re.M)
    if found is None:
        raise ValueError("PTX without a .version line")
    if isa is None or (int(found[1]), int(found[2])) <= isa:
        return ptx
    return f"{ptx[:found.start()]}.version {isa[0]}.{isa[1]}{ptx[found.end():]}"


def is_whole_program(dispatcher, argtypes) -> bool:
    """Whether the compiled overload of ``argtypes`` runs from its PTX through the driver's JIT
    (`load_whole_program`; numba-cuda 0.30 internals: its code library's object code)."""
    library = dispatcher.overloads[tuple(argtypes)]._codelibrary
    return any(getattr(code, "code_type", None) == "ptx" for code in library._cubin_cache.values())


def load_whole_program(dispatcher, argtypes) -> None:
    """Make the compiled overload of ``argtypes`` run from its PTX compiled by the driver's JIT as one program
    (numba-cuda 0.30 internals: the code library's per-target object code, which numba fills with nvJitLink's
    relocatable cubin, is replaced by a cuda.core ``ObjectCode.from_ptx`` and the function reloaded), and write that
    form to the disk cache. A cached overload already in PTX form is left as it is. Raises KernelConstraintError
    (one line, the driver's message) when the driver cannot load it."""
    from cuda.bindings import driver
    from cuda.core import ObjectCode

    if is_whole_program(dispatcher, argtypes):
        return
    compiled = dispatcher.overloads[tuple(argtypes)]
    library = compiled._codelibrary
    cc = library._ensure_cc(None)
    _, version = driver.cuDriverGetVersion()
    ptx = ptx_for_isa(library.get_asm_str(cc), ptx_isa_of_driver(int(version)))
    library._cubin_cache[cc] = ObjectCode.from_ptx(ptx.encode(), name=library.name)
    library._cufunc_cache.clear()
    try:
        compiled.bind()
    except Exception as exc:  # the driver's JIT log names the line it refused
        message = " ".join(str(exc).split())
        raise KernelConstraintError(f"{dispatcher.py_func.__name__}: the driver could not load its PTX as one "
                                    f"program: {message[:300]}") from exc
    dispatcher._cache.save_overload(tuple(argtypes), compiled)


def source_text(src: str, scope: dict) -> str:
    """Generated ``src`` under a header naming what each global of ``scope`` is bound to (so a different binding
    is a different file)."""
    return "".join(f"# {name} = {_binding(value)}\n" for name, value in sorted(scope.items())) + src


def source_file(text: str) -> Path | None:
    """Where generated source ``text`` (`source_text`) is written for numba to stamp: ``<tag>/source/<sha256>.py``.
    None when the cache is off or the file cannot be written."""
    if not cache_enabled():
        return None
    try:
        folder = tag_dir() / "source"
        path = folder / f"{hashlib.sha256(text.encode()).hexdigest()[:32]}.py"
        if not path.is_file() or path.read_text() != text:
            folder.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(text)
            os.replace(tmp, path)
        return path
    except OSError:
        return None


def _binding(value) -> str:
    func = getattr(value, "py_func", value)
    module, name = getattr(func, "__module__", None), getattr(func, "__qualname__", None)
    if module and name:
        return f"{module}.{name}"
    return repr(value) if isinstance(value, (int, float, str, bool, type(None))) else type(value).__name__


def kernel_from_source(src: str, name: str, scope: dict, *, threads: int | None = None, min_blocks: int = 0,
                       label: str = "generated"):
    """The kernel ``name`` defined by generated source ``src`` with globals ``scope`` (see `kernel` for ``threads``
    and ``min_blocks``). With the cache on, the source lives in a file under the cache (`source_file`), else it is
    compiled from memory under the name ``<label name>``."""
    text = source_text(src, scope)
    path = source_file(text)
    namespace = dict(scope)
    exec(compile(text, str(path) if path else f"<{label} {name}>", "exec"), namespace)
    return kernel(namespace[name], threads=threads, min_blocks=min_blocks)
