"""Where the core finds plug-ins: the ``chalk.plugins`` entry points of installed distributions.

A module of its own, importing nothing of the service, so that the settings
loader (which needs each plug-in's sections) and the service (which builds
the plug-ins) both read the one list without importing each other.  The
plug-in classes' contract is in ``_plugin``.
"""

from __future__ import annotations

import functools
import importlib.metadata

from listener_router._errors import ConfigError

__all__ = ["ENTRY_POINTS", "plugin_classes"]

ENTRY_POINTS = "chalk.plugins"


@functools.cache
def plugin_classes() -> tuple[type, ...]:
    """Every plug-in class registered under ``chalk.plugins``, by entry-point name.

    Raises:
        ConfigError: an entry point that cannot be loaded, or that is not a plug-in class
            (a class with ``name``, ``sections``, ``configure`` and ``build``).
    """
    found: list[type] = []
    for entry in sorted(importlib.metadata.entry_points(group=ENTRY_POINTS),
                        key=lambda e: e.name):
        try:
            cls = entry.load()
        except Exception as e:
            raise ConfigError(f"plug-in {entry.name!r} ({entry.value}) cannot be loaded: "
                              f"{type(e).__name__}: {e}") from e
        if not (isinstance(cls, type) and all(hasattr(cls, a) for a in
                                               ("name", "sections", "configure", "build"))):
            raise ConfigError(f"plug-in {entry.name!r} ({entry.value}) is not a Plugin "
                              "subclass")
        if any(c.name == cls.name for c in found):  # type: ignore[attr-defined]
            raise ConfigError(f"two plug-ins are named {cls.name!r}")  # type: ignore[attr-defined]
        found.append(cls)
    if not found:
        raise ConfigError(
            f"no plug-in is registered under the {ENTRY_POINTS!r} entry points: Chalk is not "
            "installed (run `pip install -e .` in the project, or bash scripts/install.sh)")
    return tuple(found)
