"""Where the core finds plug-ins: the ``chalk.plugins`` entry points of installed distributions.

A module of its own, importing nothing of the service, so that the settings
loader (which needs each plug-in's sections) and the service (which builds
the plug-ins) both read the one list without importing each other.  The
plug-in classes' contract is in ``_plugin``.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
from dataclasses import dataclass

from listener_router._errors import ConfigError

__all__ = ["ENTRY_POINTS", "BrokenPlugin", "broken_plugins", "plugin_classes"]

log = logging.getLogger(__name__)

ENTRY_POINTS = "chalk.plugins"


@dataclass(frozen=True)
class BrokenPlugin:
    """An installed ``chalk.plugins`` entry point that could not be used, and why."""

    name: str
    value: str          # module:Class, as the entry point says
    error: str

    def __str__(self) -> str:
        return f"plug-in {self.name!r} ({self.value}) cannot be loaded: {self.error}"


_broken: list[BrokenPlugin] = []


@functools.cache
def plugin_classes() -> tuple[type, ...]:
    """Every plug-in class registered under ``chalk.plugins``, by entry-point name.

    An entry point that cannot be loaded (its module fails to import), that is not a
    plug-in class (a class with ``name``, ``sections``, ``configure`` and ``build``), or
    whose name another took already, is left out and reported once as a warning
    (:func:`broken_plugins` lists them): one broken distribution in the environment does
    not stop every ``chalk`` command, only what needs its plug-in (its section in
    ``chalk.toml`` is then unknown, and the error says why).

    Raises:
        ConfigError: no plug-in at all is registered (Chalk is not installed).
    """
    found: list[type] = []
    _broken.clear()
    entries = sorted(importlib.metadata.entry_points(group=ENTRY_POINTS), key=lambda e: e.name)
    for entry in entries:
        try:
            cls = entry.load()
        except Exception as e:
            _left_out(entry, f"{type(e).__name__}: {e}")
            continue
        if not (isinstance(cls, type) and all(hasattr(cls, a) for a in
                                               ("name", "sections", "configure", "build"))):
            _left_out(entry, "it is not a Plugin subclass")
            continue
        if any(c.name == cls.name for c in found):  # type: ignore[attr-defined]
            _left_out(entry, f"another plug-in is named {cls.name!r} already")  # type: ignore[attr-defined]
            continue
        found.append(cls)
    if not entries:
        raise ConfigError(
            f"no plug-in is registered under the {ENTRY_POINTS!r} entry points: Chalk is not "
            "installed (run `pip install -e .` in the project, or bash scripts/install.sh)")
    return tuple(found)


def _left_out(entry: importlib.metadata.EntryPoint, why: str) -> None:
    broken = BrokenPlugin(entry.name, entry.value, why)
    _broken.append(broken)
    log.warning("%s; it is left out (uninstall or fix the distribution that registers it)",
                broken)


def broken_plugins() -> list[BrokenPlugin]:
    """The entry points :func:`plugin_classes` left out, and why."""
    plugin_classes()
    return list(_broken)
