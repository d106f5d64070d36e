"""``[[journal]]`` and ``[[subscriber]]`` tables of ``chalk.toml``: read once, then frozen.

Light on purpose: ``_config`` imports this module, and the broker I/O
process imports ``_config``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from listener_router._errors import ConfigError

__all__ = ["JournalRule", "SubscriberRule", "parse_journals", "parse_subscribers",
           "parse_start", "stream_name"]

_AGE = re.compile(r"^\d+[YMDhms]$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


def stream_name(journal: str) -> str:
    """The default stream of a journal."""
    return f"chalk.journal.{journal}"


@dataclass(frozen=True)
class JournalRule:
    """Which commits go to which stream, and what an entry holds (``[[journal]]``)."""

    name: str
    stream: str = ""                       # default chalk.journal.<name>
    workflow: str | None = None            # only commits of this workflow
    condition: str | None = None           # XPath over the record; None: every record
    attributes: tuple[str, ...] | None = None   # None: all of the record's attributes
    attachments: bool = True               # carry the record's attachments (inline or by reference)
    inline_below: int = 65536              # attachments smaller than this travel in the entry
    max_age: str = "7D"                    # stream retention by age (x-max-age)
    max_bytes: int = 20_000_000_000        # stream retention by size (x-max-length-bytes)
    segment_bytes: int = 100_000_000       # x-stream-max-segment-size-bytes: retention's unit
    forget_after: float = 60.0             # a subscriber silent this long leaves the status view

    @property
    def status_stream(self) -> str:
        return f"{self.stream}.status"

    def error_queue(self, subscriber: str) -> str:
        return f"{self.stream}.errors.{subscriber}"

    def stream_arguments(self) -> dict[str, Any]:
        return {"x-queue-type": "stream", "x-max-age": self.max_age,
                "x-max-length-bytes": self.max_bytes,
                "x-stream-max-segment-size-bytes": self.segment_bytes}


@dataclass(frozen=True)
class SubscriberRule:
    """One subscriber agent (``[[subscriber]]``): where it reads, applies and keeps its offset."""

    id: str
    journal: str
    store: str = ""                        # its database: effects, offset, errors (required)
    apply: str | None = None               # "module:function" called with (entries, connection)
    workflow: str | None = None            # or a workflow run on a blackboard over ``store``
    source: str | None = None              # the publisher's blackboard (attachment references)
    start: str = "first"                   # first | last | next | <offset> | <ISO time or epoch>
    batch_size: int = 100
    prefetch: int = 1000
    max_retries: int = 3
    backoff_ms: tuple[int, ...] = (500, 2000, 10000)
    on_error: str = "queue"                # or "block"
    on_gap: str = "block"                  # or "continue"
    status_every: float = 5.0
    events_exchange: str = ""              # e.g. "chalk.events": journal.subscriber.blocked


def _take(table: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str,
          default: Any) -> Any:
    if key not in table:
        return default
    value = table[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise ConfigError(f"{where}: {key!r} must be {names}, got {value!r}")
    return value


def _keys(table: Mapping[str, Any], fields: Mapping[str, Any], where: str) -> None:
    unknown = sorted(set(table) - set(fields))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; "
                          f"known: {', '.join(sorted(fields))}")


def _name(value: str, key: str, where: str) -> str:
    if not _NAME.match(value):
        raise ConfigError(f"{where}: {key} {value!r} must be letters, digits, '_', '.' or '-' "
                          "(up to 100)")
    return value


def parse_start(value: str | int, where: str = "start") -> str:
    """A start point as stored: ``first``, ``last``, ``next``, ``offset:N`` or ``time:EPOCH``.

    Accepts ``first``/``last``/``next``, an offset (a whole number), a time as
    ISO 8601 (``2024-05-01T12:00:00+00:00``; no zone: local time) or as
    seconds since the epoch with a fraction (``1714564800.0``), and the
    stored forms themselves.
    """
    import datetime

    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return f"offset:{value}"
    text = str(value).strip()
    kind, _, rest = text.partition(":")
    if text in ("first", "last", "next"):
        return text
    if text.isdigit() or (kind == "offset" and rest.isdigit()):
        return f"offset:{int(rest if kind == 'offset' else text)}"
    if kind == "time" and _is_float(rest):
        return f"time:{float(rest)}"
    if "." in text and _is_float(text):
        return f"time:{float(text)}"
    try:
        moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"{where}: {value!r} is not a start point: give first, last, next, an "
                          "offset (a whole number), an ISO time (2024-05-01T12:00:00+00:00) or "
                          "epoch seconds with a fraction (1714564800.0)") from None
    return f"time:{moment.timestamp()}"


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _journal(table: Mapping[str, Any], where: str) -> JournalRule:
    _keys(table, JournalRule.__dataclass_fields__, where)
    if "name" not in table:
        raise ConfigError(f"{where}: 'name' is required")
    base = JournalRule(name="x")
    name = _name(_take(table, "name", str, where, ""), "name", where)
    values: dict[str, Any] = {"name": name}
    values["stream"] = _name(_take(table, "stream", str, where, stream_name(name)), "stream", where)
    for key in ("workflow", "condition"):
        values[key] = _take(table, key, str, where, None) or None
    attributes = _take(table, "attributes", list, where, None)
    if attributes is not None:
        if not all(isinstance(a, str) for a in attributes):
            raise ConfigError(f"{where}: 'attributes' must be a list of attribute names")
        values["attributes"] = tuple(attributes)
    values["attachments"] = _take(table, "attachments", bool, where, base.attachments)
    for key in ("inline_below", "max_bytes", "segment_bytes"):
        values[key] = _take(table, key, int, where, getattr(base, key))
        if values[key] < 0 or (key != "inline_below" and values[key] == 0):
            raise ConfigError(f"{where}: {key!r} must be positive, got {values[key]}")
    values["max_age"] = _take(table, "max_age", str, where, base.max_age)
    if not _AGE.match(values["max_age"]):
        raise ConfigError(f"{where}: 'max_age' must be a number and a unit Y, M, D, h, m or s "
                          f"(e.g. \"7D\"), got {values['max_age']!r}")
    values["forget_after"] = float(_take(table, "forget_after", (int, float), where,
                                         base.forget_after))
    rule = JournalRule(**values)
    if rule.condition:
        import engine  # compiled here so a bad condition fails at start, with its place

        try:
            engine.compile_condition(rule.condition)
        except engine.WorkflowDefinitionError as e:
            raise ConfigError(f"{where}: condition {rule.condition!r}: {e}") from e
    return rule


def _subscriber(table: Mapping[str, Any], where: str) -> SubscriberRule:
    _keys(table, SubscriberRule.__dataclass_fields__, where)
    for key in ("id", "journal"):
        if key not in table:
            raise ConfigError(f"{where}: {key!r} is required")
    base = SubscriberRule(id="x", journal="x")
    values: dict[str, Any] = {}
    values["id"] = _name(_take(table, "id", str, where, ""), "id", where)
    values["journal"] = _take(table, "journal", str, where, "")
    for key in ("store", "events_exchange"):
        values[key] = _take(table, key, str, where, getattr(base, key))
    for key in ("apply", "workflow", "source"):
        values[key] = _take(table, key, str, where, None) or None
    values["start"] = parse_start(_take(table, "start", (str, int), where, base.start),
                                  f"{where}: start")
    for key in ("batch_size", "prefetch", "max_retries"):
        values[key] = _take(table, key, int, where, getattr(base, key))
        if values[key] < (0 if key == "max_retries" else 1):
            raise ConfigError(f"{where}: {key!r} must be positive, got {values[key]}")
    backoff = _take(table, "backoff_ms", (list, int), where, list(base.backoff_ms))
    values["backoff_ms"] = tuple(backoff if isinstance(backoff, list) else [backoff])
    for key, allowed in (("on_error", ("queue", "block")), ("on_gap", ("block", "continue"))):
        values[key] = _take(table, key, str, where, getattr(base, key))
        if values[key] not in allowed:
            raise ConfigError(f"{where}: {key!r} must be {' or '.join(map(repr, allowed))}, "
                              f"got {values[key]!r}")
    values["status_every"] = float(_take(table, "status_every", (int, float), where,
                                         base.status_every))
    rule = SubscriberRule(**values)
    if rule.apply and rule.workflow:
        raise ConfigError(f"{where}: give 'apply' (a callable) or 'workflow', not both")
    return rule


def parse_journals(tables: Sequence[Mapping[str, Any]], where: str) -> tuple[JournalRule, ...]:
    rules = tuple(_journal(t, f"{where} [[journal]] #{i + 1}") for i, t in enumerate(tables))
    for kind in ("name", "stream"):
        seen: set[str] = set()
        for rule in rules:
            value = getattr(rule, kind)
            if value in seen:
                raise ConfigError(f"{where} [[journal]]: two journals with {kind} {value!r} "
                                  "(a stream has one journal: entry numbers are per stream)")
            seen.add(value)
    return rules


def parse_subscribers(tables: Sequence[Mapping[str, Any]], where: str,
                      journals: Sequence[JournalRule]) -> tuple[SubscriberRule, ...]:
    rules = tuple(_subscriber(t, f"{where} [[subscriber]] #{i + 1}")
                  for i, t in enumerate(tables))
    names = {j.name for j in journals}
    for i, rule in enumerate(rules):
        if rule.journal not in names:
            raise ConfigError(f"{where} [[subscriber]] #{i + 1}: journal {rule.journal!r} is not "
                              f"a [[journal]] of this file (known: {', '.join(sorted(names)) or 'none'})")
    return rules
