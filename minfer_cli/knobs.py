"""Knobs (named, typed parameters of a kernel variant), arm parsing, and every MINFER_* environment variable.

A knob is declared once by the experiment that owns it, e.g. ``Knob("VEC", (1, 2, 4), 4, "4-byte elements per
load/store per thread")``. An *arm* is a set of knob settings written ``K=V[,K=V...]`` on the command line; knobs
an arm does not name take their defaults.
"""

from __future__ import annotations

import re

import os
from dataclasses import dataclass
from typing import Iterable, Mapping

from minfer_cli.errors import UsageError

# Every environment variable minfer reads, declared here and nowhere else.
ENV_LEDGER = "MINFER_LEDGER"  # ledger directory (default: ledger/records under the project root)
ENV_GIT_COMMIT = "MINFER_GIT_COMMIT"  # commit to stamp on records (a copy of the tree; overrides git)
ENV_GIT_DIRTY = "MINFER_GIT_DIRTY"  # "1"/"0": whether that copy had uncommitted changes
ENV_CACHE_DIR = "MINFER_CACHE_DIR"  # minfer's cache (the ledger's derived index, unrecorded results)
ENV_KERNEL_CACHE = "MINFER_KERNEL_CACHE"  # "0": compile every kernel in every process (read by kernels.jit)
ENV_VARS = {
    ENV_LEDGER: "directory of the YAML ledger records (default: ./ledger/records of the project)",
    ENV_GIT_COMMIT: "git commit stamped on records instead of what git says (a copy of the tree on a GPU host)",
    ENV_GIT_DIRTY: "1 or 0: whether that copy had uncommitted changes (with MINFER_GIT_COMMIT)",
    ENV_CACHE_DIR: "minfer's cache directory (default: $XDG_CACHE_HOME/minfer, else ~/.cache/minfer)",
    ENV_KERNEL_CACHE: "0 turns the compiled-kernel cache (<cache dir>/kernels) off: every process compiles again",
}


def env(name: str) -> str | None:
    """Value of a declared MINFER_* variable, or None when unset. Raises KeyError for an undeclared name."""
    if name not in ENV_VARS:
        raise KeyError(f"{name} is not a declared minfer environment variable")
    value = os.environ.get(name)
    return value if value else None


KnobValue = int | str


@dataclass(frozen=True)
class Knob:
    """A named compile-time or launch parameter of a kernel variant.

    name: upper-case identifier (``TM``, ``KS``, ``VEC``); values: the allowed values, all int or all str;
    default: one of ``values``; doc: one line saying what the knob changes; legacy: the value that reproduces
    what the code did before this knob existed, when that is not the default (``ledger verify`` gives it to a
    record that predates the knob; None: the default did).
    """

    name: str
    values: tuple[KnobValue, ...]
    default: KnobValue
    doc: str
    legacy: KnobValue | None = None

    def __post_init__(self) -> None:
        if self.default not in self.values:
            raise ValueError(f"knob {self.name}: default {self.default!r} is not one of {self.values!r}")
        if self.legacy is not None and self.legacy not in self.values:
            raise ValueError(f"knob {self.name}: legacy {self.legacy!r} is not one of {self.values!r}")
        if len({type(v) for v in self.values}) != 1:
            raise ValueError(f"knob {self.name}: values must all be int or all be str, got {self.values!r}")

    @property
    def before(self) -> KnobValue:
        """The value of a record that predates this knob: `legacy` when set, else the default."""
        return self.default if self.legacy is None else self.legacy

    def parse(self, text: str) -> KnobValue:
        """Convert the text of ``K=V`` into an allowed value, or raise UsageError listing the allowed ones."""
        allowed = ", ".join(str(v) for v in self.values)
        value: KnobValue = text.strip()
        if isinstance(self.values[0], int):
            if not re.fullmatch(r"\s*[+-]?[0-9]+\s*", text):  # ASCII digits: int() also takes "１" and "٣"
                raise UsageError(f"{self.name}={text!r} is not an integer; allowed values: {allowed}")
            value = int(text)
        if value not in self.values:
            raise UsageError(f"{self.name}={text} is not allowed; allowed values: {allowed}")
        return value


Config = dict[str, KnobValue]


def parse_arm_text(text: str) -> dict[str, str]:
    """Split ``K=V[,K=V...]`` into {K: V} (values still text). Raises UsageError for malformed input."""
    if not text or not text.strip():
        raise UsageError("empty --arm; expected K=V[,K=V...], e.g. --arm VEC=4 or --arm TM=128,KS=64")
    pairs: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise UsageError(f"malformed arm {text!r}: {part!r} is not K=V; expected K=V[,K=V...], e.g. TM=128,KS=64")
        if key in pairs:
            raise UsageError(f"malformed arm {text!r}: knob {key} is set twice")
        pairs[key] = value
    return pairs


def resolve_config(knobs: Iterable[Knob], settings: Mapping[str, str], owner: str,
                   removed: Iterable[str] = ()) -> Config:
    """Full configuration: every knob of ``knobs`` at its default, overridden by ``settings`` (text values).

    Raises UsageError naming the valid knobs of ``owner`` for an unknown knob (saying so when it is one of
    ``removed``, the owner's deleted knobs), and the allowed values for a value outside the allowed set.
    """
    by_name = {k.name: k for k in knobs}
    config: Config = {k.name: k.default for k in by_name.values()}
    for key, text in settings.items():
        if key not in by_name:
            raise UsageError(_unknown(key, by_name, owner, removed))
        config[key] = by_name[key].parse(text)
    return config


def format_config(config: Mapping[str, KnobValue]) -> str:
    """``K=V,K=V`` in declaration order: the same syntax ``--arm`` takes."""
    return ",".join(f"{k}={v}" for k, v in config.items())


def _unknown(key: str, by_name: Mapping[str, Knob], owner: str, removed: Iterable[str] = ()) -> str:
    """The message for an unknown knob: a removed knob said to be removed; else the closest names first (knob names
    are upper case); then every knob."""
    import difflib

    upper = key.upper()
    if upper in set(removed):
        return (f"knob {upper} was removed from {owner} (a deleted variant; `minfer ledger show` has the records "
                f"that measured it); its knobs are: {', '.join(by_name) or '(none)'}")
    near = difflib.get_close_matches(upper, list(by_name), n=2, cutoff=0.6)
    if len(upper) >= 3:  # GLU -> FUSE_GLU: a knob name that contains the given one
        near = [n for n in by_name if upper in n and n not in near][:2] + near
    if upper in by_name:
        near = [upper]
    hint = f" (did you mean {' or '.join(near)}?)" if near else ""
    return f"unknown knob {key} for {owner}{hint}; its knobs are: {', '.join(by_name) or '(none)'}"


def parse_grid(knobs: Iterable[Knob], axes: Iterable[str], owner: str, removed: Iterable[str] = ()) -> list[Config]:
    """Every configuration of a grid written as ``K=v1,v2 K2=v3`` (one text per knob); knobs not named stay at
    their defaults. Raises UsageError for an axis that is not ``K=v[,v...]``, an unknown knob, a knob given twice
    or a value outside its allowed set."""
    import itertools

    by_name = {k.name: k for k in knobs}
    names: list[str] = []
    values: list[list[KnobValue]] = []
    for axis in axes:
        key, sep, text = axis.partition("=")
        key = key.strip()
        if not sep or not key or not text.strip():
            raise UsageError(f"malformed grid axis {axis!r}; expected K=v1,v2,... e.g. TM=64,128,256")
        if key not in by_name:
            raise UsageError(_unknown(key, by_name, owner, removed))
        if key in names:
            raise UsageError(f"knob {key} is given twice in the grid")
        names.append(key)
        values.append(list(dict.fromkeys(by_name[key].parse(v) for v in text.split(","))))
    base: Config = {k.name: k.default for k in by_name.values()}
    return [base | dict(zip(names, combo)) for combo in itertools.product(*values)]
