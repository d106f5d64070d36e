"""Reading the settings: ``chalk.toml`` and the environment, checked, every problem at once.

:func:`load_settings` reads the core's sections (the fields of
:class:`~listener_router.Settings`) and every plug-in's (``feature_sections``)
from one file and ``CHALK_<SECTION>_<KEY>`` variables, which win over the
file.  Problems are collected, not raised one by one: a file with three
mistakes says all three, each with its place (``chalk.toml:12: [broker] …``).
A ``CHALK_<SECTION>_…`` variable that names no setting is logged as a warning.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import os
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from listener_router._entry_points import broken_plugins
from listener_router._errors import ConfigError
from listener_router._keys import Key, check_value, env_names, key_of, kind_of, parse_env
from listener_router._settings import (
    CORE_SECTIONS,
    Settings,
    configured,
    default_features,
    feature_sections,
    rule_extras,
    rules_of,
    settings_keys,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["Part", "load_settings", "parts"]

log = logging.getLogger(__name__)

_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]#]+?)\s*\]\]?\s*(?:#.*)?$")
_KEY = re.compile(r"^\s*(\"[^\"]*\"|'[^']*'|[A-Za-z0-9_.-]+)\s*=")


class _Lines:
    """Where each table and key of a TOML text is: ``line(section, index, key)``.

    TOML parsers give values, not places; this reads the text's headers and key
    lines (enough for the places of the errors a settings file can have).
    """

    def __init__(self, text: str):
        self._at: dict[tuple[str | None, int | None, str | None], int] = {}
        here: tuple[str | None, int | None] = (None, None)
        counts: dict[str, int] = {}
        for number, line in enumerate(text.splitlines(), 1):
            header = _HEADER.match(line)
            if header:
                name = header.group(2).strip().replace('"', "").replace("'", "")
                if header.group(1) == "[[":
                    counts[name] = counts.get(name, 0) + 1
                    here = (name, counts[name] - 1)
                else:
                    here = (name, None)
                self._at.setdefault((*here, None), number)
                continue
            key = _KEY.match(line)
            if key:
                self._at.setdefault((*here, key.group(1).strip("\"'")), number)

    def line(self, section: str | None, index: int | None = None,
             key: str | None = None) -> int | None:
        at = self._at
        return (at.get((section, index, key)) if key is not None else None) \
            or (at.get((f"{section}.{key}", None, None)) if key is not None else None) \
            or at.get((section, index, None)) or at.get((None, None, section))


class _Problems:
    """Every error of one settings file, each with its place; raised together."""

    def __init__(self, source: str | None, lines: _Lines | None):
        self.where = source or "defaults"
        self.source = source
        self.lines = lines
        self.found: list[tuple[int, str]] = []

    def at(self, section: str | None = None, index: int | None = None,
           key: str | None = None) -> str:
        """``file:line:`` of the place (``file`` alone when unknown)."""
        line = self.lines.line(section, index, key) if self.lines and section else None
        return f"{self.where}:{line}:" if line else self.where

    def add(self, message: str, line_of: tuple[Any, ...] = ()) -> None:
        line = self.lines.line(*line_of) if self.lines and line_of and line_of[0] else None
        self.found.append((line or 0, message))

    def check(self) -> None:
        if self.found:
            ordered = [m for _line, m in sorted(self.found, key=lambda p: p[0])]
            raise ConfigError(ordered[0] if len(ordered) == 1 else
                              f"{len(ordered)} problems:\n  " + "\n  ".join(ordered))


def _unknown(table: Mapping[str, Any], allowed: Iterable[str], where: str) -> str | None:
    unknown = sorted(set(table) - set(allowed))
    if not unknown:
        return None
    hints = [f"{u!r} → {m[0]!r}" for u in unknown
             if (m := difflib.get_close_matches(u, list(allowed), n=1))]
    return (f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(allowed))}"
            + (f" (did you mean {', '.join(hints)}?)" if hints else ""))


@dataclass(frozen=True)
class _Spot:
    """Where a table came from: ``[[name]]`` number ``index`` of the file, or an
    environment variable; :meth:`text` names it (with the line of ``key``)."""

    problems: _Problems
    name: str
    index: int | None = None
    variable: str | None = None

    def text(self, key: str | None = None) -> str:
        number = "" if self.index is None else f" #{self.index + 1}"
        if self.variable is not None:
            return f"environment {self.variable}{number}"
        brackets = f"[[{self.name}]]" if self.index is not None else f"[{self.name}]"
        return f"{self.problems.at(self.name, self.index, key)} {brackets}{number}"

    def add(self, message: str, key: str | None = None) -> None:
        self.problems.add(message, () if self.variable else (self.name, self.index, key))


def _rule(cls: type, table: Any, spot: _Spot) -> Any:
    """One table of a ``[[section]]`` list as ``cls``; None (and the problems noted) if bad."""
    if not isinstance(table, dict):
        spot.add(f"{spot.text()} must be a table, got {table!r}")
        return None
    fields = [f for f in dataclasses.fields(cls) if key_of(f) is not None]
    extras = rule_extras(spot.name) \
        if "extras" in {f.name for f in dataclasses.fields(cls)} else []
    bad = _unknown(table, [f.name for f in fields]
                   + [f.name for keys in extras for f, _k in keys.keys()], spot.text())
    if bad:
        spot.add(bad)
        return None
    values = _values(cls, fields, table, spot)
    added = {keys.name: _values(keys.cls, [f for f, _k in keys.keys()], table, spot)
             for keys in extras if any(f.name in table for f, _k in keys.keys())}
    if values is None or any(v is None for v in added.values()):
        return None
    # keys set to their defaults are a rule without them (the reference file's rule is the
    # default rule)
    added = {name: v for name, v in added.items()
             if next(k for k in extras if k.name == name).cls(**(v or {}))
             != next(k for k in extras if k.name == name).cls()}
    if added:
        values["extras"] = tuple(sorted((name, next(k for k in extras if k.name == name)
                                         .cls(**(v or {}))) for name, v in added.items()))
    rule = cls(**values)
    problems = [getattr(part, "problem", lambda: None)()
                for part in (rule, *(v for _name, v in values.get("extras", ())))]
    problem = next((p for p in problems if p), None)
    if problem:
        spot.add(f"{spot.text()}: {problem}")
        return None
    return rule


def _values(cls: type, fields: list[dataclasses.Field[Any]], table: Mapping[str, Any],
            spot: _Spot) -> dict[str, Any] | None:
    """The keys of ``fields`` in ``table`` as ``cls``'s values; None (and the problems noted)
    if any is bad."""
    values: dict[str, Any] = {}
    ok = True
    for f in fields:
        if f.name in table:
            key = key_of(f)
            assert key is not None
            try:
                values[f.name] = check_value(kind_of(cls, f.name), key, table[f.name],
                                             f"{spot.text(f.name)} {f.name}")
            except ConfigError as e:
                spot.add(str(e), f.name)
                ok = False
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            assert spot.index is not None
            values[f.name] = f"{spot.name}{spot.index + 1}"  # the name: listener1, listener2, …
    return values if ok else None


def _from_env(env: Mapping[str, str], key: Key) -> tuple[str, str] | None:
    for name in env_names(key):
        if env.get(name):
            return name, env[name]
    return None


@dataclass
class Part:
    """One section as the loader reads it (and the reference documents it): the core's
    (its fields of Settings) or a feature's (its leaf class)."""

    name: str
    doc: str
    keys: list[tuple[dataclasses.Field[Any], Key]]   # for a list: the core's field, or none
    rules: type | None                               # a list's rule class
    owner: type                                      # the class whose fields ``keys`` are
    default: Any                                     # its value when nothing sets it
    empty: str = ""                                  # a list: what none at all means
    feature: bool = False

    def env_keys(self) -> list[Key]:
        """The keys whose environment variables set it (a list: one for all its rules)."""
        return [key for _f, key in self.keys] if self.rules is None else [
            self.keys[0][1] if self.keys else Key("", section=self.name)]


def parts() -> list[Part]:
    """Every section, the core's first (in the order of the fields of Settings)."""
    found: dict[str, Part] = {}
    defaults = Settings.__dataclass_fields__
    for f, key in settings_keys():
        assert key.section is not None
        rules = rules_of(f)
        part = found.setdefault(key.section, Part(
            key.section, CORE_SECTIONS.get(key.section, ""), [], rules, Settings,
            defaults[f.name].default if rules else None, key.doc if rules else ""))
        part.keys.append((f, key))
    for sec in feature_sections():
        if sec.name in found:
            raise ConfigError(f"two sections are named [{sec.name}]")
        keys = [] if sec.array else [(f, replace(k, section=sec.name, name=f.name))
                                     for f, k in sec.keys()]
        found[sec.name] = Part(sec.name, sec.doc, keys, sec.cls if sec.array else None,
                               sec.cls, sec.default(), sec.empty, True)
    return list(found.values())


def load_settings(path: str | os.PathLike[str] | None = None,
                  env: Mapping[str, str] | None = None) -> Settings:
    """Read ``path`` (default ``chalk.toml`` when present), then ``CHALK_<SECTION>_<KEY>``
    from ``env`` (default ``os.environ``), which wins over the file.

    Raises:
        ConfigError: every problem of the file and the environment, each with its place
            (``chalk.toml:12: [broker] …``).
    """
    env = os.environ if env is None else env
    data: dict[str, Any] = {}
    source = None
    text = ""
    candidate = Path(path) if path is not None else Path("chalk.toml")
    if path is not None and not candidate.is_file():
        raise ConfigError(f"{candidate}: no such configuration file")
    if candidate.is_file():
        source = str(candidate)
        try:
            text = candidate.read_text(encoding="utf-8")
            data = tomllib.loads(text)
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise ConfigError(f"{candidate}: not valid TOML: {e}") from e
    problems = _Problems(source, _Lines(text) if source else None)
    sections = parts()
    names = [p.name for p in sections]
    unknown = sorted(set(data) - set(names))
    broken = broken_plugins() if unknown else []
    for name in unknown:
        problems.add(f"{problems.at(name)} " + (_unknown({name: 0}, names, "") or "")[2:]
                     + "".join(f"; {b} (it may be the one that reads [{name}])"
                               for b in broken), (name,))
    _warn_unknown_env(env, sections)
    core: dict[str, Any] = {}
    features: dict[str, Any] = {}
    for part in sections:
        value = _read_list(part, data, env, problems) if part.rules is not None else \
            _read_table(part, data, env, problems)
        if value is None:
            continue
        if part.feature:
            features[part.name] = value
        elif part.rules is not None:
            core[part.keys[0][0].name] = value
        else:
            core.update(value)
    problems.check()
    settings = Settings(**core, features={**default_features(), **features}, source=source)
    problem = settings.problem()
    if problem:
        raise ConfigError(f"{problems.at('node', None, 'ttl_seconds')} {problem}")
    return configured(settings)


def _read_list(part: Part, data: Mapping[str, Any], env: Mapping[str, str],
               problems: _Problems) -> tuple[Any, ...] | None:
    """A ``[[name]]`` list (the environment's, when set, replaces the file's); None when
    absent or bad (its problems noted)."""
    name = part.name
    found = _from_env(env, part.env_keys()[0])
    variable = None
    if found is not None:
        variable = found[0]
        try:
            tables = parse_env(list, found[0], found[1])
        except ConfigError as e:
            problems.add(str(e))
            return None
    else:
        tables = data.get(name, [])
    if not isinstance(tables, list):
        where = f"environment {variable}" if variable else f"{problems.at(name)} [[{name}]]"
        problems.add(f"{where} must be a list of tables ([[{name}]])",
                     () if variable else (name,))
        return None
    if not tables:
        return None
    assert part.rules is not None
    read = [_rule(part.rules, table, _Spot(problems, name, i, variable))
            for i, table in enumerate(tables)]
    return tuple(read) if all(r is not None for r in read) else None


def _read_table(part: Part, data: Mapping[str, Any], env: Mapping[str, str],
                problems: _Problems) -> Any:
    """A ``[name]`` table: the core's values by field, or a feature's section; None when
    bad (its problems noted)."""
    name = part.name
    spot = _Spot(problems, name)
    table = data.get(name, {})
    if not isinstance(table, dict):
        spot.add(f"{spot.text()} must be a table")
        return None
    allowed = [k.name for _f, k in part.keys if k.name]
    unknown = sorted(set(table) - set(allowed))
    if unknown:
        spot.add(f"{spot.text(unknown[0])}: " + (_unknown(table, allowed, "") or "")[2:],
                 unknown[0])
    values: dict[str, Any] = {}
    for f, key in part.keys:
        assert key.name is not None
        kind = kind_of(part.owner, f.name)
        found = _from_env(env, key)
        try:
            if found is not None:
                values[f.name] = check_value(kind, key, parse_env(kind, *found),
                                             f"environment {found[0]}")
            elif key.name in table:
                values[f.name] = check_value(kind, key, table[key.name],
                                             f"{spot.text(key.name)} {key.name}")
        except ConfigError as e:
            spot.add(str(e), key.name if found is None else None)
    if not part.feature:
        return values
    leaf = part.owner(**values)
    problem = getattr(leaf, "problem", lambda: None)()
    if problem:
        spot.add(f"{spot.text()}: {problem}")
        return None
    return leaf


def _warn_unknown_env(env: Mapping[str, str], sections: list[Part]) -> None:
    """Log a warning for each ``CHALK_<SECTION>_…`` variable that names no setting (a
    misspelling would otherwise be ignored in silence)."""
    known: set[str] = set()
    for part in sections:
        for key in part.env_keys():
            known.update(env_names(key))
    prefixes = sorted((f"CHALK_{p.name.upper()}_" for p in sections), key=len, reverse=True)
    for name in sorted(env):
        if name in known or not any(name.startswith(p) for p in prefixes):
            continue
        guess = difflib.get_close_matches(name, sorted(known), n=1)
        log.warning("environment variable %s names no setting%s; it is ignored", name,
                    f" (did you mean {guess[0]}?)" if guess else "")




