"""The experiment protocol and its registry.

An experiment lives in one file under `experiments/`, subclasses `Experiment` and calls `register()` on an
instance at import time (no GPU work at import). `load_all()` imports every module of the `experiments` package,
so the registry is kept in one place: the files themselves.

What the harness (`minfer_cli/measure/`) needs from an experiment, per configuration ("arm") and workload:
  * `input_set_bytes(workload)`: device bytes of one input set, to size the L2-defeating ring;
  * `make_input_set(workload, rng)`: one set of fresh random device inputs (never zeros);
  * `make_output(workload)`: the device output buffer(s);
  * `prepare(config, workload)`: compile/specialise the variant and return a `launch(inputs, output, stream)`
    callable that enqueues exactly one sample on `stream` (no host synchronisation);
  * `poison(output)`: fill the output with NaN (or a sentinel for integer outputs) before the correctness gate;
  * `check(config, workload, inputs, output)`: the relative error (`rel_l2`) of `output` against an independent
    reference computed from `inputs`;
  * `tolerance(config)`: the largest relative error that passes;
  * `cost(workload, config)`: FLOPs and the fewest bytes moved by one sample, for TFLOP/s, GB/s and % of the ceiling.
  * `after_timing(config, workload)` (optional): raise when what happened while the arm was timed makes its samples
    wrong (a persistent kernel's barrier that gave up); the arm is then INVALID.
"""

from __future__ import annotations

import importlib
import pkgutil
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from minfer_cli.errors import UsageError
from minfer_cli.knobs import Config, Knob, KnobValue, parse_arm_text, resolve_config


def rel_l2(got: Any, want: Any) -> float:
    """The relative error every check reports: ||got - want|| / ||want||, both taken as float64 arrays of one shape;
    inf when ``got`` holds a non-finite value (a NaN poison never overwritten, an overflow)."""
    import numpy as np

    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if not np.isfinite(got).all():
        return float("inf")
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))

Launch = Callable[[Any, Any, Any], None]


@dataclass(frozen=True)
class Workload:
    """A named problem shape, e.g. ``Workload("1GiB", {"nbytes": 1 << 30})`` or a GEMM's nt/od/id."""

    name: str
    shape: dict[str, int]
    doc: str = ""

    def describe(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.shape.items())


@dataclass(frozen=True)
class Cost:
    """Work of one sample: floating-point operations and the fewest bytes that must move through DRAM."""

    flops: float
    bytes: float


@dataclass(frozen=True)
class KernelInstance:
    """One compiled kernel of a configuration, for `minfer kernels`: a numba CUDA dispatcher, the signature it was
    compiled for, and its launch shape (threads per block, dynamic shared memory in bytes)."""

    name: str
    dispatcher: Any
    signature: Any
    threads: int
    dynamic_smem: int = 0


@dataclass(frozen=True)
class Metric:
    """What a sample measures. Kernels: time in µs, lower is better. Whole-model runs: tok/s, higher is better."""

    name: str = "time"
    unit: str = "µs"
    higher_is_better: bool = False


TIME_US = Metric()


class Experiment(ABC):
    """One kernel family under test. Subclasses set the class attributes and implement the methods."""

    name: str
    purpose: str
    knobs: tuple[Knob, ...] = ()
    workloads: tuple[Workload, ...] = ()
    metric: Metric = TIME_US
    self_timed: bool = False
    """True when `prepare`'s launch synchronises and returns the sample's metric value itself (a whole-model
    forward timed on the wall clock, in tok/s); False for kernels timed by the harness's CUDA events."""

    @property
    def default_workload(self) -> Workload:
        return self.workloads[0]

    def workload(self, name: str | None, configs: Sequence[Config] = ()) -> Workload:
        """The workload called ``name``; UsageError listing the valid ones. Without a name: the first declared
        workload that `refuse` accepts for every one of ``configs`` (the arms' knobs pick it: a tg-only engine knob
        picks tg128), else the first declared one (whose refusal the caller then reports)."""
        if name is None:
            fits = (w for w in self.workloads if all(self.refuse(c, w) is None for c in configs))
            return next(fits, self.default_workload) if configs else self.default_workload
        for w in self.workloads:
            if w.name == name:
                return w
        valid = ", ".join(w.name for w in self.workloads)
        raise UsageError(f"experiment {self.name} has no workload {name!r}; its workloads are: {valid}")

    def config(self, arm_text: str | None) -> Config:
        """Full knob configuration from an ``--arm`` text (None means every knob at its default; an empty text is
        a UsageError, since it usually means a shell variable that was not set)."""
        settings = parse_arm_text(arm_text) if arm_text is not None else {}
        return resolve_config(self.knobs, settings, f"experiment {self.name}", self.removed_knobs)

    def default_config(self) -> Config:
        return {k.name: k.default for k in self.knobs}

    removed_knobs: Mapping[str, KnobValue] = {}
    """Knobs this experiment no longer has, each with the one value the code still runs (the old default): `ledger
    verify` leaves such a knob out of an old record's arms only at that value; at any other value (a deleted variant)
    the record cannot be re-run."""

    work_knobs: tuple[str, ...] = ()
    """Knobs that change the work itself (what is computed or how many bytes must move), not how: `ab` refuses two
    arms that differ in one (their times measure different tasks); `sweep` ranks such points by throughput."""

    def unread_knobs(self, workload: Workload) -> tuple[str, ...]:
        """Knobs that ``workload`` never reads (a decode knob on a prefill workload): their values cannot change
        its result. `ledger verify` sets them to today's defaults when it re-runs an old record."""
        return ()

    def effective(self, config: Config, workload: Workload | None = None) -> Mapping[str, KnobValue]:
        """``config`` reduced to what decides the code that runs (knobs a setting makes irrelevant dropped or
        normalised), on ``workload`` when one is given (a knob whose effect depends on the shape): two A/B arms with
        the same effective configuration would time one thing twice, and `minfer ab` refuses them. Default: the
        configuration itself."""
        return config

    def note(self, config: Config, workload: Workload) -> str | None:
        """What ``config`` does on ``workload`` that its knob values do not say (a knob another setting makes a
        no-op), in one line, or None. `run`, `ab` and `calibrate` print it before measuring. Default: None."""
        return None

    def refuse(self, config: Config, workload: Workload) -> str | None:
        """Why ``config`` can never run on ``workload`` (a knob combination the kernels refuse, a knob the workload
        never reads), in one sentence, or None. `run`, `ab` and `calibrate` stop on it before the GPU is opened;
        in a `sweep` such a point is INVALID."""
        return None

    @abstractmethod
    def input_set_bytes(self, workload: Workload) -> int: ...

    @abstractmethod
    def make_input_set(self, workload: Workload, rng) -> Any: ...

    @abstractmethod
    def make_output(self, workload: Workload) -> Any: ...

    @abstractmethod
    def prepare(self, config: Config, workload: Workload) -> Launch: ...

    @abstractmethod
    def poison(self, output: Any) -> None: ...

    @abstractmethod
    def check(self, config: Config, workload: Workload, inputs: Any, output: Any) -> float: ...

    def tolerance(self, config: Config, workload: Workload) -> float:
        """The largest check() value that passes for this arm on this workload (0: exact)."""
        return 0.0

    def after_timing(self, config: Config, workload: Workload) -> None:
        """Raise (one line: why) when what happened while this arm was timed makes its samples wrong, though its
        output passed `check` before timing (a persistent kernel's barrier that gave up); the harness then marks
        the arm INVALID with that reason. Default: nothing to check."""

    @abstractmethod
    def cost(self, workload: Workload, config: Config) -> Cost:
        """FLOPs and fewest bytes of one sample of ``config`` (an arm's knobs can change the bytes, e.g. TYPE)."""

    def kernels(self, config: Config, workload: Workload) -> list[KernelInstance]:
        """The kernels `prepare(config, workload)` launches, compiled, with their launch shapes (for resource
        reports). Default: none declared."""
        return []

    ceiling: str = "copy"
    """Which measured ceiling the roofline uses: "copy" (bandwidth-bound) or "matrix" (f16 tensor-core rate)."""


@dataclass
class Registry:
    experiments: dict[str, Experiment] = field(default_factory=dict)

    def add(self, experiment: Experiment) -> Experiment:
        if experiment.name in self.experiments:
            raise ValueError(f"experiment {experiment.name!r} is registered twice")
        self.experiments[experiment.name] = experiment
        return experiment


_REGISTRY = Registry()
_BROKEN: dict[str, str] = {}
_loaded = False


def register(experiment: Experiment) -> Experiment:
    """Add ``experiment`` to the registry; called once at the bottom of each file in `experiments/`."""
    return _REGISTRY.add(experiment)


def load_all() -> dict[str, Experiment]:
    """Import every module of the `experiments` package (once) and return the registry, name -> experiment.

    A module that fails to import does not take the others down: it is recorded in `broken()` (module name ->
    the error's first line), listed by `minfer experiments list`, and `get` names it.
    """
    global _loaded
    if not _loaded:
        import experiments

        for info in pkgutil.iter_modules(experiments.__path__):
            try:
                importlib.import_module(f"experiments.{info.name}")
            except Exception as exc:  # one broken experiment file must not break the CLI
                text = str(exc).strip().splitlines()
                _BROKEN[info.name] = f"{type(exc).__name__}: {text[0] if text else ''}"
        _loaded = True
    return dict(_REGISTRY.experiments)


def broken() -> dict[str, str]:
    """Experiment modules that failed to import: module name -> error (empty when all loaded)."""
    load_all()
    return dict(_BROKEN)


def get(name: str) -> Experiment:
    """The experiment called ``name``; UsageError listing the registered ones when there is none."""
    registry = load_all()
    if name not in registry and name in _BROKEN:
        raise UsageError(f"experiment file experiments/{name}.py failed to load ({_BROKEN[name]})")
    if name not in registry:
        valid = ", ".join(sorted(registry)) or "(none)"
        raise UsageError(f"no experiment named {name!r}; registered experiments: {valid}")
    return registry[name]


def owners_of(knob_names: Iterable[str]) -> list[Experiment]:
    """Experiments that own every knob in ``knob_names``."""
    wanted = set(knob_names)
    return [e for e in load_all().values() if wanted <= {k.name for k in e.knobs}]


def pick_for_arms(arm_texts: list[str]) -> Experiment:
    """The one experiment owning every knob the arms name (used when `minfer ab` is given no experiment).

    Raises UsageError when no experiment owns them (listing every experiment's knobs) or when several do
    (naming them and asking for one).
    """
    names: set[str] = set()
    for text in arm_texts:
        names |= set(parse_arm_text(text))
    owners = owners_of(names)
    if len(owners) == 1:
        return owners[0]
    if not owners:
        removed = {n: [e.name for e in load_all().values() if n in e.removed_knobs] for n in sorted(names)}
        gone = {n: where for n, where in removed.items() if where}
        if gone:
            said = "; ".join(f"{n} from {', '.join(where)}" for n, where in gone.items())
            raise UsageError(f"knob(s) removed ({said}: deleted variants; `minfer ledger show` has the records that "
                             f"measured them)")
        listing = "; ".join(f"{e.name}: {', '.join(k.name for k in e.knobs) or '(none)'}" for e in load_all().values())
        raise UsageError(f"no experiment owns knob(s) {', '.join(sorted(names))}; knobs by experiment: {listing}")
    raise UsageError(
        f"knob(s) {', '.join(sorted(names))} belong to several experiments ({', '.join(e.name for e in owners)}); "
        "name one, e.g. `minfer ab " + owners[0].name + " --arm ...`"
    )
