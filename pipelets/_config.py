"""Reading pipelet settings.

Configuration reaches a pipelet from XML, so values may be strings where the
pipelet wants a bool or a number ("true", "3"), a single string where it
wants a list (``rec:Val`` instead of ``rec:Seq``), and SMILA files use their
own parameter names.  :class:`PipeletConfig` converts, accepts aliases, and raises
:class:`PipeletConfigurationError` naming the pipelet and the parameter.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from pipelets._base import PipeletConfigurationError

__all__ = ["REQUIRED", "PipeletConfig", "Settings"]


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()

_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0", ""}


class PipeletConfig:
    """Typed access to one pipelet's configuration.

    Every getter takes the parameter name and optional ``aliases`` (other
    names for the same setting, e.g. SMILA's); giving two of them is an error.
    """

    def __init__(self, owner: str, config: Mapping[str, Any]):
        self.owner = owner
        self.config = config

    def error(self, name: str, problem: str) -> PipeletConfigurationError:
        return PipeletConfigurationError(f"{self.owner}: parameter {name!r}: {problem}")

    def has(self, name: str, *aliases: str) -> bool:
        return any(n in self.config for n in (name, *aliases))

    def raw(self, name: str, *aliases: str, default: Any = REQUIRED) -> tuple[str, Any]:
        """``(name used, value)``; the default when none is given."""
        used, value, _ = self._get(name, aliases, default)
        return used, value

    def _get(self, name: str, aliases: tuple[str, ...], default: Any) -> tuple[str, Any, bool]:
        """``(name used, value, given)``; raises when required and missing."""
        given = [n for n in (name, *aliases) if n in self.config]
        if len(given) > 1:
            raise self.error(name, f"given twice (as {' and '.join(given)}); keep one")
        if given:
            return given[0], self.config[given[0]], True
        if default is REQUIRED:
            also = f" (or {', '.join(aliases)})" if aliases else ""
            raise PipeletConfigurationError(f"{self.owner}: parameter {name!r}{also} is required")
        return name, default, False

    def text(self, name: str, *aliases: str, default: Any = REQUIRED,
             empty: bool = False) -> Any:
        used, value, given = self._get(name, aliases, default)
        if not given:
            return value
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise self.error(used, f"expected a text value, got {_kind(value)}")
        value = str(value)
        if not empty and not value.strip():
            raise self.error(used, "must not be empty")
        return value

    def name(self, name: str, *aliases: str, default: Any = REQUIRED) -> Any:
        """An attribute, attachment or parameter name (surrounding space removed)."""
        value = self.text(name, *aliases, default=default)
        return value.strip() if isinstance(value, str) else value

    def boolean(self, name: str, *aliases: str, default: bool = False) -> bool:
        used, value, _ = self._get(name, aliases, default)
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        raise self.error(used, f"expected true or false, got {value!r}")

    def integer(self, name: str, *aliases: str, default: Any = REQUIRED,
                minimum: int | None = None) -> Any:
        used, value, given = self._get(name, aliases, default)
        if not given:
            return value
        if isinstance(value, bool):
            raise self.error(used, f"expected a whole number, got {value!r}")
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, str):
            try:
                value = int(value.strip())
            except ValueError:
                raise self.error(used, f"expected a whole number, got {value!r}") from None
        if not isinstance(value, int):
            raise self.error(used, f"expected a whole number, got {value!r}")
        if minimum is not None and value < minimum:
            raise self.error(used, f"must be at least {minimum}, got {value}")
        return value

    def choice(self, name: str, choices: Iterable[str], *aliases: str,
               default: Any = REQUIRED) -> Any:
        """One of ``choices`` (compared without case; the canonical spelling is returned)."""
        options = {c.lower(): c for c in choices}
        used, value, given = self._get(name, aliases, default)
        if not given:
            return value
        if isinstance(value, str) and value.strip().lower() in options:
            return options[value.strip().lower()]
        raise self.error(used, f"expected one of {', '.join(options.values())}, got {value!r}")

    def names(self, name: str, *aliases: str, default: Any = REQUIRED) -> Any:
        """A list of names: a list, or one string split at commas."""
        used, value, given = self._get(name, aliases, default)
        if not given:
            return value
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise self.error(used, f"expected a name or a list of names, got {_kind(value)}")
        out = [i.strip() for i in items if i.strip()]
        if not out:
            raise self.error(used, "must name at least one")
        return out

    def values(self, name: str, *aliases: str, default: Any = REQUIRED) -> Any:
        """A list of literal values: a list, or one value (which is not split)."""
        used, value, given = self._get(name, aliases, default)
        if not given:
            return value
        items = value if isinstance(value, list) else [value]
        for item in items:
            if not isinstance(item, (str, int, float, bool)):
                raise self.error(used, f"values must be text, numbers or booleans, got {_kind(item)}")
        return list(items)

    def mapping(self, name: str, *aliases: str, default: Any = REQUIRED) -> Any:
        used, value, given = self._get(name, aliases, default)
        if not given:
            return value
        if not isinstance(value, Mapping):
            raise self.error(used, f"expected a map (rec:Map), got {_kind(value)}")
        return dict(value)

    def regex(self, name: str, *aliases: str, default: Any = REQUIRED,
              flags: int = 0) -> Any:
        used, value, given = self._get(name, aliases, default)
        if not given:
            return value
        if not isinstance(value, str) or not value:
            raise self.error(used, f"expected a regular expression, got {value!r}")
        try:
            return re.compile(value, flags)
        except re.error as e:
            raise self.error(used, f"not a valid regular expression: {e}") from e


def _kind(value: Any) -> str:
    if isinstance(value, Mapping):
        return "a map"
    if isinstance(value, list):
        return "a list"
    return f"{type(value).__name__} {value!r}"


#: The name :class:`PipeletConfig` had before ``listener_router.Settings`` (the service's
#: settings) took it; kept so pipelets written against it still import.
Settings = PipeletConfig
