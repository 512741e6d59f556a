"""Lazy re-exports for a package's public names (PEP 562), so that importing a numba-free submodule (a knob table)
does not import the numba modules its package re-exports."""

from __future__ import annotations

import importlib
from typing import Callable, Mapping


def lazy_exports(package: str, sources: Mapping[str, str], namespace: dict) -> tuple[Callable, Callable]:
    """``(__getattr__, __dir__)`` for ``package``: name -> the submodule (``sources[name]``, relative to the
    package) that defines it, imported on first use and then kept in the package's ``namespace``."""

    def __getattr__(name: str):
        source = sources.get(name)
        if source is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{source}"), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(sources))

    return __getattr__, __dir__
