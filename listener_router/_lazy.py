"""Public names imported on first use: a package's ``__getattr__`` and ``__dir__``.

A package lists where each public name lives (``{name: module}``, the module
relative to the package); the name is imported when first asked for and
kept in the package's namespace, so a process that needs one module does
not pay for the others' imports.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(package: str, homes: Mapping[str, str], names: Sequence[str],
               namespace: MutableMapping[str, Any]
               ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package`` (``namespace``: its ``globals()``)."""

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{home}"), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(names))

    return __getattr__, __dir__
