"""How a setting is declared: its key in ``chalk.toml``, its type, its check, its one line of doc.

Every field of the core's :class:`~listener_router.Settings` (and of the
rule classes of ``[[listener]]`` and ``[[router]]``) is made with
:func:`setting`, and so is every field of a feature's own section, a
dataclass marked with :func:`section` next to the feature (a *leaf* the
loader composes: adding a section changes no core file).  From those
declarations alone ``load_settings`` reads the file and the environment
(``CHALK_<SECTION>_<KEY>``), checks types and ranges, rejects unknown keys,
and ``configuration_reference`` writes docs/configuration.md.  A new key is
one field; a new section one class::

    @section("jobs", "The job log: every message's life and statistics.")
    @dataclass(frozen=True)
    class JobsSettings:
        log: bool = setting(True, "keep the job log")
        stats_interval: float = setting(60.0, "seconds per statistics row", minimum=1)

The type comes from the field's annotation: ``str``, ``int``, ``float``,
``bool``, ``X | None``, ``Mapping[str, str]`` (a TOML table),
``tuple[X, ...]`` (a TOML array; one value alone is a one-element list),
or ``tuple[Rule, ...]`` of a dataclass whose fields are settings too (an
array of tables, ``[[section]]``).

A plug-in may add keys to each rule of the core's lists (``[[listener]]``):
a dataclass of :func:`setting` fields marked with :func:`rule_keys`, read
from the same table as the rule's own keys and kept on the rule
(``rule.extra("sample")``)::

    @rule_keys("listener", "sample", "Sampling: only one message in N runs.")
    @dataclass(frozen=True)
    class SampleKeys:
        sample_every: int = setting(1, "run one message in N", minimum=1)
"""

from __future__ import annotations

import dataclasses
import sys
import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass
from typing import Any

from listener_router._errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["Key", "RuleKeys", "Section", "setting", "section", "section_of", "key_of", "kind_of",
           "rule_class", "rule_keys", "rule_keys_of", "check_value", "parse_env", "env_names",
           "type_name", "toml_text"]


@dataclass(frozen=True)
class Key:
    """A setting's place and rules: ``[section] name``, what it means, what it accepts.

    ``section`` and ``name`` are None for a field of a rule class (the rule's
    section holds it; ``name`` is then the field's name).
    """

    doc: str
    section: str | None = None
    name: str | None = None
    env: tuple[str, ...] = ()          # older environment names, still read
    choices: tuple[Any, ...] = ()
    minimum: float | None = None
    positive: bool = False             # more than ``minimum`` (> 0 with minimum=0)
    check: Callable[[Any, str], object] | None = None  # check(value, where) raises ConfigError
    parse: Callable[[Any, str], Any] | None = None     # parse(raw, where): the TOML value as the type


def setting(default: Any = MISSING, doc: str = "", *, section: str | None = None,
            key: str | None = None, default_factory: Any = MISSING,
            env: tuple[str, ...] = (), choices: tuple[Any, ...] = (),
            minimum: float | None = None, positive: bool = False,
            check: Callable[[Any, str], object] | None = None,
            parse: Callable[[Any, str], Any] | None = None) -> Any:
    """A dataclass field that is a setting (see the module doc).  ``doc`` is its one line;
    ``check(value, where)``, when given, raises :class:`ConfigError` on a value the other
    rules let through (its message starts with ``where``); ``parse(raw, where)``, when given,
    turns what the file holds into the field's type first (``every = "30s"`` → 30.0)."""
    meta = {"chalk": Key(doc, section, key, env, choices, minimum, positive, check, parse)}
    if default_factory is not MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    if default is MISSING:
        return dataclasses.field(metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


@dataclass(frozen=True)
class Section:
    """A feature's section of ``chalk.toml``: ``[name]`` (one table, ``cls`` its fields) or
    ``[[name]]`` (``array``: a list of tables, each a ``cls``).

    ``empty`` says what no ``[[name]]`` at all means (the reference prints it).
    ``attribute`` is the name the whole section is read by on
    :class:`~listener_router.Settings` besides :meth:`Settings.section`
    (``settings.schedules``), and ``flat`` maps older flat names of its keys
    (``job_log``) to its fields (``log``): both keep code written against the
    flat settings of earlier versions working.
    """

    name: str
    doc: str
    cls: type
    array: bool = False
    empty: str = "none"
    attribute: str | None = None
    flat: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def default(self) -> Any:
        """The section's value when the file and the environment say nothing."""
        return () if self.array else self.cls()

    def keys(self) -> list[tuple[dataclasses.Field[Any], Key]]:
        """The section's settings, in declaration order."""
        return [(f, key) for f in dataclasses.fields(self.cls)
                if (key := key_of(f)) is not None]


def section(name: str, doc: str, *, array: bool = False, empty: str = "none",
            attribute: str | None = None,
            flat: Mapping[str, str] | None = None) -> Callable[[type], type]:
    """Mark a dataclass of :func:`setting` fields as the section ``[name]`` (``[[name]]``
    with ``array``); see :class:`Section`."""
    def mark(cls: type) -> type:
        cls.__chalk_section__ = Section(  # type: ignore[attr-defined]
            name, doc, cls, array, empty, attribute, dict(flat or {}))
        return cls
    return mark


def section_of(cls: type) -> Section:
    """The :class:`Section` a class was marked as (TypeError when it was not)."""
    found = getattr(cls, "__chalk_section__", None)
    if not isinstance(found, Section) or found.cls is not cls:
        raise TypeError(f"{cls.__qualname__} is not marked with @section(...)")
    return found


@dataclass(frozen=True)
class RuleKeys:
    """A plug-in's keys of each rule of a core list: ``[[rules]]`` tables may hold the
    fields of ``cls`` besides the rule's own; ``name`` is what the rule keeps them under
    (``rule.extra(name)``, a ``cls``), ``doc`` one line on what they are for."""

    rules: str
    name: str
    doc: str
    cls: type

    def keys(self) -> list[tuple[dataclasses.Field[Any], Key]]:
        """The keys, in declaration order."""
        return [(f, key) for f in dataclasses.fields(self.cls)
                if (key := key_of(f)) is not None]


def rule_keys(rules: str, name: str, doc: str) -> Callable[[type], type]:
    """Mark a dataclass of :func:`setting` fields as keys a plug-in adds to each rule of the
    core's ``[[rules]]`` list (see the module doc and :class:`RuleKeys`)."""
    def mark(cls: type) -> type:
        cls.__chalk_rule_keys__ = RuleKeys(rules, name, doc, cls)  # type: ignore[attr-defined]
        return cls
    return mark


def rule_keys_of(cls: type) -> RuleKeys:
    """The :class:`RuleKeys` a class was marked as (TypeError when it was not)."""
    found = getattr(cls, "__chalk_rule_keys__", None)
    if not isinstance(found, RuleKeys) or found.cls is not cls:
        raise TypeError(f"{cls.__qualname__} is not marked with @rule_keys(...)")
    return found


def key_of(f: dataclasses.Field[Any]) -> Key | None:
    return f.metadata.get("chalk")


def kind_of(cls: type, name: str) -> Any:
    """The resolved type annotation of ``cls.name``."""
    return typing.get_type_hints(cls)[name]


def _strip_none(kind: Any) -> Any:
    args = typing.get_args(kind)
    if type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return rest[0] if len(rest) == 1 else kind
    return kind


def rule_class(kind: Any) -> type | None:
    """The dataclass of a ``tuple[Rule, ...]`` field (an array of tables), else None."""
    if typing.get_origin(kind) is tuple:
        item = typing.get_args(kind)[0]
        if dataclasses.is_dataclass(item):
            return item  # type: ignore[return-value]
    return None


def _is_mapping(kind: Any) -> bool:
    return typing.get_origin(kind) in (Mapping, dict)


def type_name(kind: Any) -> str:
    """The type as the reference names it."""
    kind = _strip_none(kind)
    if kind is bool:
        return "boolean"
    if kind is int:
        return "integer"
    if kind is float:
        return "number"
    if kind is str:
        return "string"
    if _is_mapping(kind):
        return "table of strings"
    if typing.get_origin(kind) is tuple:
        return f"list of {type_name(typing.get_args(kind)[0])}s"
    return getattr(kind, "__name__", str(kind))


def _check_scalar(kind: Any, value: Any, where: str) -> Any:
    ok = {bool: isinstance(value, bool),
          int: isinstance(value, int) and not isinstance(value, bool),
          float: isinstance(value, (int, float)) and not isinstance(value, bool),
          str: isinstance(value, str)}.get(kind)
    if ok is None:
        raise TypeError(f"{where}: settings of type {kind!r} are not supported")
    if not ok:
        raise ConfigError(f"{where} must be {type_name(kind)}, got {value!r}")
    return float(value) if kind is float else value


def check_value(kind: Any, key: Key, value: Any, where: str) -> Any:
    """``value`` (from TOML) as the field's type, checked against the key's rules."""
    kind = _strip_none(kind)
    if key.parse is not None:
        value = key.parse(value, where)
    if _is_mapping(kind):
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a table, got {value!r}")
        out = {}
        for k, v in value.items():
            if not isinstance(v, (str, int, float, bool)):
                raise ConfigError(f"{where}.{k} must be a string, number or boolean, got {v!r}")
            out[str(k)] = ("true" if v else "false") if isinstance(v, bool) else str(v)
        return out
    if typing.get_origin(kind) is tuple:
        item = typing.get_args(kind)[0]
        items = value if isinstance(value, list) else [value]
        return tuple(check_value(item, key, v, where) for v in items)
    value = _check_scalar(kind, value, where)
    if key.choices and value not in key.choices:
        raise ConfigError(f"{where} must be one of {', '.join(map(toml_text, key.choices))}, "
                          f"got {value!r}")
    if key.minimum is not None and (value <= key.minimum if key.positive else value < key.minimum):
        bound = f"more than {key.minimum:g}" if key.positive else f"{key.minimum:g} or more"
        raise ConfigError(f"{where} must be {bound}, got {value!r}")
    if key.check is not None:
        key.check(value, where)
    return value


def parse_env(kind: Any, name: str, text: str) -> Any:
    """An environment value as TOML would have it: strings as they are, anything else in
    TOML's own syntax (``true``, ``2.5``, ``[1000, 5000]``, ``{ "spark.x" = "1" }``)."""
    if _strip_none(kind) is str:
        return text
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"environment {name}={text!r}: not a TOML value ({e})") from None


def env_names(key: Key) -> tuple[str, ...]:
    """``CHALK_<SECTION>_<KEY>`` (``CHALK_<SECTION>`` for an array of tables), then older names."""
    parts = [key.section or ""] + ([key.name] if key.name else [])
    main = "CHALK_" + "_".join(p.upper().replace(".", "_").replace("-", "_") for p in parts)
    return (main, *key.env)


def toml_text(value: Any) -> str:
    """A default as TOML writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, float) and value.is_integer():
        return f"{value:.1f}"
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(toml_text(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{toml_text(k)} = {toml_text(v)}" for k, v in value.items()) + "}"
    return str(value)
