"""The guides in docs/ run: their examples cannot rot, and the import rules of docs/architecture.md hold.

A guide's example is written as fenced blocks whose info string names the file the block belongs to:

    ```python file=kernels/scale.py
    ...
    ```

Blocks naming the same file are concatenated in order (a later block adds to or redefines what an earlier one
wrote, as the engineer would edit the file). A guide that builds on another says so on a line of its own,
``<!-- doc-test: after adding-a-kernel.md -->``: that guide's blocks run first. Each file becomes a module of
its dotted name (``kernels.scale``), importable by the blocks after it, for the duration of one test only; the
test functions of ``tests/*`` blocks are then called: the unmarked ones in the simulator session, the ones marked
``@pytest.mark.compile`` in the compile session. Blocks of any other kind (``python`` alone, ``diff``, ``text``) are
illustration and are not run.

`test_import_rules_hold` checks the layering of docs/architecture.md over every module with `ast`;
`test_numba_inventory_names_every_module_using_numba_internals` keeps docs/moving-off-numba.md's list of modules
that reach into numba-cuda internals complete.
"""

from __future__ import annotations

import ast
import re
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import SIMULATOR

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
FENCE = re.compile(r"^```python file=(?P<path>\S+)[ \t]*\n(?P<body>.*?)^```[ \t]*$", re.M | re.S)
AFTER = re.compile(r"^<!-- doc-test: after (?P<guides>[^>]+?) -->$", re.M)
RUNNABLE = ("adding-a-kernel.md", "adding-a-knob.md", "adding-an-experiment.md", "adding-an-architecture.md")


def _blocks(guide: str, seen: tuple[str, ...] = ()) -> list[tuple[str, str, str]]:
    """(file, code, origin) of ``guide``'s runnable blocks, preceded by those of the guides it builds on."""
    text = (DOCS / guide).read_text(encoding="utf-8")
    out: list[tuple[str, str, str]] = []
    for match in AFTER.finditer(text):
        for dep in match["guides"].split(","):
            dep = dep.strip()
            assert dep not in seen + (guide,), f"{guide}: circular doc-test dependency on {dep}"
            out += [b for b in _blocks(dep, seen + (guide,)) if b not in out]
    for m in FENCE.finditer(text):
        line = text.count("\n", 0, m.start("body")) + 1
        out.append((m["path"], m["body"], f"docs/{guide}:{line}"))
    return out


def _module_name(path: str) -> str:
    assert path.endswith(".py") and not path.startswith("/"), f"file={path} must be a relative .py path"
    return path[:-3].replace("/", ".")


def _run_guide(guide: str, monkeypatch) -> dict[str, types.ModuleType]:
    """Build the guide's files as modules (in order of first appearance) and return them by path."""
    from minfer_cli import experiment as registry

    # a private, empty registry marked loaded: a guide's register() leaves no trace, and the real experiments are
    # not imported (seconds each under the simulator) since the guides' tests use only their own
    monkeypatch.setattr(registry, "_REGISTRY", registry.Registry())
    monkeypatch.setattr(registry, "_loaded", True)
    sources: dict[str, list[tuple[str, str]]] = {}
    for path, code, origin in _blocks(guide):
        sources.setdefault(path, []).append((code, origin))
    modules: dict[str, types.ModuleType] = {}
    for path, parts in sources.items():
        name = _module_name(path)
        module = types.ModuleType(name)
        module.__file__ = str(ROOT / path)
        monkeypatch.setitem(sys.modules, name, module)  # removed again after the test
        parent, _, leaf = name.rpartition(".")
        if parent in sys.modules:
            monkeypatch.setattr(sys.modules[parent], leaf, module, raising=False)
        for code, origin in parts:  # each block compiled under its place in the guide, so tracebacks point there
            padded = "\n" * (int(origin.rsplit(":", 1)[1]) - 1) + code
            exec(compile(padded, origin.rsplit(":", 1)[0], "exec"), module.__dict__)
        modules[path] = module
    return modules


def _tests_of(modules: dict[str, types.ModuleType], compile_mode: bool) -> list:
    found = []
    for path, module in modules.items():
        if not path.startswith("tests/"):
            continue
        for name, fn in vars(module).items():
            if name.startswith("test_") and callable(fn):
                marked = any(m.name == "compile" for m in getattr(fn, "pytestmark", []))
                if marked == compile_mode:
                    found.append(fn)
    return found


@pytest.mark.parametrize("guide", RUNNABLE)
def test_guide_examples_run_in_the_simulator(guide, monkeypatch):
    if not SIMULATOR:
        pytest.skip("a guide's kernels run under NUMBA_ENABLE_CUDASIM=1 (the README's first test session)")
    modules = _run_guide(guide, monkeypatch)
    tests = _tests_of(modules, compile_mode=False)
    assert tests, f"docs/{guide} has no test_* function in a ```python file=tests/...``` block"
    for test in tests:
        test()


@pytest.mark.compile
@pytest.mark.parametrize("guide", ("adding-a-kernel.md", "adding-a-knob.md"))
def test_guide_compile_checks(guide, monkeypatch):
    modules = _run_guide(guide, monkeypatch)
    tests = _tests_of(modules, compile_mode=True)
    assert tests, f"docs/{guide} has no @pytest.mark.compile test"
    for test in tests:
        test()


def test_every_guide_block_names_its_file():
    """A ```python block that is meant to run but lost its file= would silently stop being tested."""
    for guide in RUNNABLE:
        text = (DOCS / guide).read_text(encoding="utf-8")
        assert FENCE.search(text), f"docs/{guide} has no runnable block"
        for info in re.findall(r"^```python(.*)$", text, re.M):
            assert info.strip() == "" or info.strip().startswith("file="), f"docs/{guide}: odd fence ```python{info}"


def test_the_scale_experiment_passes_the_harness_gate_for_every_knob_value(monkeypatch):
    """adding-an-experiment.md's experiment, registered, through the harness's correctness gate (NaN poison, one
    launch, reference check) as `run` and `ab` do it, for every value of every knob; and an arm that writes
    nothing is INVALID."""
    if not SIMULATOR:
        pytest.skip("runs the guide's kernel under the CUDA simulator")
    from numba import cuda

    from minfer_cli.experiment import get
    from minfer_cli.measure import environment as envmod
    from minfer_cli.measure import harness
    from minfer_cli.measure.device import DeviceInfo
    from minfer_cli.measure.timing import plan_ring

    _run_guide("adding-an-experiment.md", monkeypatch)
    exp = get("scale")
    wl = exp.workload("tiny")
    rng = np.random.default_rng()
    l2 = 60 << 20
    session = harness.Session(
        experiment=exp, workload=wl, device=DeviceInfo("Fake GPU", "9.0", 132, l2, 227 << 10, 80 << 30, "", "13.0", "13.0"),
        ceilings=None, stream=cuda.stream(), plan=plan_ring(exp.input_set_bytes(wl), l2),
        ring=[exp.make_input_set(wl, rng) for _ in range(2)], output=exp.make_output(wl), flush_buffer=None,
        nvml=envmod.Nvml.__new__(envmod.Nvml), env_start=envmod.GpuState(), warmup_s=0.0,
    )
    for knob in exp.knobs:
        for value in knob.values:
            outcome, timer = harness.prepare_arm(session, "A", exp.config(f"{knob.name}={value}"))
            assert outcome.status == "ok" and timer is not None, (knob.name, value, outcome.error)
    monkeypatch.setattr(exp, "prepare", lambda config, workload: (lambda inputs, output, stream: None))
    outcome, _ = harness.prepare_arm(session, "B", exp.default_config())
    assert outcome.status == "invalid" and "relative error" in outcome.error


def test_the_scale_experiment_is_listed_by_the_cli(monkeypatch):
    from typer.testing import CliRunner

    from minfer_cli.main import app

    if not SIMULATOR:
        pytest.skip("builds the guide's kernel module under the CUDA simulator")
    _run_guide("adding-an-experiment.md", monkeypatch)
    result = CliRunner().invoke(app, ["experiments", "show", "scale"])
    assert result.exit_code == 0, result.output
    assert "THREADS" in result.output and "tiny" in result.output


# ------------------------------------------------------------------------------- docs/architecture.md's rules


def _imports(rel: str, tree: ast.Module) -> set[str]:
    """Every dotted name the module imports, anywhere in the file (function-level imports included): ``import a.b``
    gives a.b; ``from a.b import c`` gives a.b and a.b.c; relative imports are resolved against ``rel``."""
    here = rel[:-3].replace("/", ".").split(".")
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            module = ".".join(here[: len(here) - node.level] + [node.module or ""]).strip(".") if node.level \
                else node.module or ""
            names.add(module)
            names |= {f"{module}.{a.name}" for a in node.names}
    return names


def _under(name: str, *prefixes: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


EXPERIMENT_API = ("kernels", "minfer_cli.experiment", "minfer_cli.knobs", "minfer_cli.errors", "minfer_cli.measure",
                  "minfer_cli.engine", "minfer_cli.quant_blocks", "minfer_cli.baselines")
"""What an experiment may import from the project (docs/architecture.md, "Import rules")."""
CLI_LAYER = ("minfer_cli.commands", "minfer_cli.main", "minfer_cli.console", "typer", "rich")
CLI_MODULES = ("minfer_cli/commands/", "minfer_cli/console.py", "minfer_cli/main.py", "minfer_cli/__main__.py")
PRINTERS = ("minfer_cli/commands/", "minfer_cli/console.py")
TEXT_ONLY = {"minfer_cli.console", "minfer_cli.console.clean"}
"""`console.clean` escapes terminal control in text and prints nothing: the ledger's exports may use it."""
ENGINE_USAGE_ERRORS: set = set()
"""Engine modules that still raise the CLI's UsageError (docs/architecture.md, "Known exceptions"): fix one, and
remove it here."""


def _violations(rel: str, source: str) -> list[str]:
    """How the module at ``rel`` (path from the root) breaks docs/architecture.md's rules, one line each."""
    tree = ast.parse(source, rel)
    names = _imports(rel, tree)
    project = {n for n in names if _under(n, "kernels", "experiments", "minfer_cli")}
    broken: list[str] = []
    if rel.startswith("kernels/"):
        broken += [f"{rel} imports {n} (a kernel never imports minfer_cli or experiments)"
                   for n in sorted(project) if not _under(n, "kernels")]
    elif rel.startswith("experiments/"):
        broken += [f"{rel} imports {n} (an experiment imports kernels and the measurement API only)"
                   for n in sorted(project | {n for n in names if _under(n, "typer", "rich")})
                   if not _under(n, *EXPERIMENT_API)]
    if not rel.startswith(CLI_MODULES):
        broken += [f"{rel} imports {n} (only commands/, main.py and console.py are the CLI layer)"
                   for n in sorted(names) if _under(n, *CLI_LAYER) and n not in TEXT_ONLY]
    if not rel.startswith(PRINTERS):
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            if isinstance(f, ast.Name) and f.id == "print":
                broken.append(f"{rel}:{node.lineno} calls print (only commands/ and console.py print)")
            if (isinstance(f, ast.Attribute) and f.attr == "write" and isinstance(f.value, ast.Attribute)
                    and f.value.attr in ("stdout", "stderr")):
                broken.append(f"{rel}:{node.lineno} writes to sys.{f.value.attr} (only console.py does)")
    return broken


def _package_sources():
    for package in ("kernels", "experiments", "minfer_cli"):
        for path in sorted((ROOT / package).rglob("*.py")):
            yield path.relative_to(ROOT).as_posix(), path.read_text(encoding="utf-8")


def test_import_rules_hold():
    broken: list[str] = []
    engine_usage: set[str] = set()
    for rel, source in _package_sources():
        broken += _violations(rel, source)
        if rel.startswith("minfer_cli/engine/") and "minfer_cli.errors.UsageError" in _imports(rel, ast.parse(source)):
            engine_usage.add(rel)
    assert not broken, "\n".join(broken)
    assert engine_usage == ENGINE_USAGE_ERRORS, (
        f"engine modules raising the CLI's UsageError are now {sorted(engine_usage)}; docs/architecture.md lists "
        f"{sorted(ENGINE_USAGE_ERRORS)} (raise ModelError, or update both lists)")


@pytest.mark.parametrize("rel, source, needle", [
    ("kernels/x.py", "def f():\n    from minfer_cli.knobs import Knob\n", "a kernel never imports"),
    ("kernels/sub/x.py", "from ...experiments import copy\n", "imports experiments"),
    ("experiments/x.py", "from minfer_cli.ledger import store\n", "measurement API only"),
    ("experiments/x.py", "import rich\n", "measurement API only"),
    ("minfer_cli/measure/x.py", "from minfer_cli.console import out\n", "CLI layer"),
    ("minfer_cli/engine/x.py", "import typer\n", "CLI layer"),
    ("minfer_cli/ledger/x.py", "def f(x):\n    print(x)\n", "calls print"),
    ("minfer_cli/x.py", "import sys\nsys.stderr.write('x')\n", "writes to sys.stderr"),
])
def test_the_import_rule_scan_sees_each_kind_of_violation(rel, source, needle):
    found = _violations(rel, source)
    assert any(needle in line for line in found), found


def test_the_import_rule_scan_passes_what_the_rules_allow():
    assert _violations("experiments/x.py", "from kernels import copy\nfrom minfer_cli.experiment import register\n") == []
    assert _violations("minfer_cli/ledger/x.py", "from minfer_cli.console import clean\n") == []
    assert _violations("minfer_cli/commands/x.py", "from rich.table import Table\nprint('x')\n") == []


# --------------------------------------------------------------------------- docs/moving-off-numba.md's list

INTERNALS = re.compile(r"cudadrv|_codelibrary|\.overloads\b|_can_compile|_prepare_args|numba\.cuda\.core\b|"
                       r"\bcgutils\b|numba\.cuda\.extending|numba\.np\.numpy_support|numba\.cuda\.typing|"
                       r"\b_intrinsic\b|llvmlite")


def test_numba_inventory_names_every_module_using_numba_internals():
    """Every module of the package that touches numba-cuda internals or llvmlite is named in the guide's table, and
    the table names no module that no longer does."""
    using = set()
    for package in ("kernels", "experiments", "minfer_cli"):
        for path in (ROOT / package).rglob("*.py"):
            if INTERNALS.search(path.read_text(encoding="utf-8")):
                using.add(path.relative_to(ROOT).as_posix())
    text = (DOCS / "moving-off-numba.md").read_text(encoding="utf-8")
    table = text.split("<!-- internals -->")[1].split("<!-- /internals -->")[0]
    listed = set(re.findall(r"`((?:kernels|experiments|minfer_cli)/[\w/]+\.py)`", table))
    assert using == listed, f"missing from the table: {sorted(using - listed)}; no longer using: {sorted(listed - using)}"
