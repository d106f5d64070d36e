"""``[[journal]]`` and ``[[subscriber]]`` tables of ``chalk.toml``: read once, then frozen.

Each field is declared with :func:`~listener_router._keys.setting`, so
``load_settings`` reads, checks and documents these tables as it does
``[[listener]]`` (docs/configuration.md); :func:`check_journals` adds what
one table cannot say alone (names unique, a subscriber's journal exists).
Light on purpose: the settings loader imports this module.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from listener_router._errors import ConfigError
from listener_router._keys import section, setting

__all__ = ["JournalRule", "SubscriberRule", "check_journals", "parse_start", "stream_name"]

_AGE = re.compile(r"^\d+[YMDhms]$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


def stream_name(journal: str) -> str:
    """The default stream of a journal."""
    return f"chalk.journal.{journal}"


def _check_name(value: str, where: str) -> None:
    if value and not _NAME.match(value):
        raise ConfigError(f"{where}: {value!r} must be letters, digits, '_', '.' or '-' "
                          "(up to 100)")


def _check_age(value: str, where: str) -> None:
    if not _AGE.match(value):
        raise ConfigError(f"{where} must be a number and a unit Y, M, D, h, m or s "
                          f"(e.g. \"7D\"), got {value!r}")


def _check_condition(value: str | None, where: str) -> None:
    if not value:
        return
    import engine  # compiled here so a bad condition fails at start, with its place

    try:
        engine.compile_condition(value)
    except engine.WorkflowDefinitionError as e:
        raise ConfigError(f"{where} {value!r}: {e}") from e


def _check_start(value: str, where: str) -> None:
    parse_start(value, where)


@section("journal", "Committed records on a RabbitMQ stream, for subscribers (a list; "
         "docs/journal.md).", array=True, empty="none: no journal is written",
         attribute="journals")
@dataclass(frozen=True)
class JournalRule:
    """Which commits go to which stream, and what an entry holds (``[[journal]]``)."""

    name: str = setting("", "the journal's name, as subscribers name it (required)",
                        check=_check_name)
    stream: str = setting("", "the RabbitMQ stream (default `chalk.journal.<name>`); its "
                          "status stream is `<stream>.status`", check=_check_name)
    workflow: str | None = setting(None, "only commits of this workflow")
    condition: str | None = setting(
        None, "XPath over the committed record (`$record/Val[@key='lang'] = 'de'`); "
        "absent: every record", check=_check_condition)
    attributes: tuple[str, ...] | None = setting(
        None, "the attributes an entry carries (absent: all of the record's)")
    attachments: bool = setting(True, "carry the record's attachments (small ones inline, "
                                "large ones by reference)")
    inline_below: int = setting(65536, "attachments smaller than this (bytes) travel inside "
                                "the entry; larger ones as a reference", minimum=0)
    max_age: str = setting("7D", "retention of the stream by age (`x-max-age`: a number and "
                           "Y, M, D, h, m or s)", check=_check_age)
    max_bytes: int = setting(20_000_000_000, "retention of the stream by size "
                             "(`x-max-length-bytes`)", minimum=0, positive=True)
    segment_bytes: int = setting(100_000_000, "the stream's segment size "
                                 "(`x-stream-max-segment-size-bytes`), retention's unit",
                                 minimum=0, positive=True)
    forget_after: float = setting(60.0, "seconds after which a subscriber not in the "
                                  "configuration, and silent, leaves the status view",
                                  minimum=0, positive=True)

    def __post_init__(self) -> None:
        if not self.stream and self.name:
            object.__setattr__(self, "stream", stream_name(self.name))

    def problem(self) -> str | None:
        return None if self.name else "'name' is required"

    @property
    def status_stream(self) -> str:
        return f"{self.stream}.status"

    def error_queue(self, subscriber: str) -> str:
        return f"{self.stream}.errors.{subscriber}"

    def stream_arguments(self) -> dict[str, Any]:
        return {"x-queue-type": "stream", "x-max-age": self.max_age,
                "x-max-length-bytes": self.max_bytes,
                "x-stream-max-segment-size-bytes": self.segment_bytes}


@section("subscriber", "Agents that read a journal and apply its entries exactly once (a "
         "list; `chalk subscribe --subscriber ID` runs one).", array=True, empty="none",
         attribute="subscribers")
@dataclass(frozen=True)
class SubscriberRule:
    """One subscriber agent (``[[subscriber]]``): where it reads, applies and keeps its offset."""

    id: str = setting("", "the subscriber's name, unique per journal (required)",
                      check=_check_name)
    journal: str = setting("", "the `[[journal]]` it reads (required)")
    store: str = setting("", "its database URL: its effects, its offset and its error log in "
                         "one transaction (required here or as `chalk subscribe --store`)")
    apply: str | None = setting(None, "`module:function` called with (entries, connection)")
    workflow: str | None = setting(None, "or a workflow run over the entries' records on a "
                                   "blackboard over `store`")
    source: str | None = setting(None, "the publisher's blackboard URL, read for attachment "
                                 "references (default: `[blackboard] url`)")
    start: str = setting("first", "where a new subscriber starts: `first`, `last`, `next`, an "
                         "offset (`\"42\"`) or a time (`2024-05-01T12:00:00+00:00`)",
                         check=_check_start)
    batch_size: int = setting(100, "entries per transaction", minimum=1)
    prefetch: int = setting(1000, "entries the broker sends ahead", minimum=1)
    max_retries: int = setting(3, "retries of a failing entry before it goes to the error "
                               "queue (or blocks)", minimum=0)
    backoff_ms: tuple[int, ...] = setting((500, 2000, 10000), "waits before retry 1, 2, 3… "
                                          "(the last one repeats)", minimum=0)
    on_error: str = setting("queue", "`queue`: to the error queue, go on; `block`: stop at "
                            "the entry until `chalk journal skip` or `retry`",
                            choices=("queue", "block"))
    on_gap: str = setting("block", "entries retention removed before they were read: `block` "
                          "until skipped, or `continue` (recorded as an error)",
                          choices=("block", "continue"))
    status_every: float = setting(5.0, "seconds between status messages", minimum=0,
                                  positive=True)
    events_exchange: str = setting("", "a topic exchange for `journal.subscriber.blocked` "
                                   "events (e.g. `chalk.events`); empty: none")

    def __post_init__(self) -> None:
        object.__setattr__(self, "start", parse_start(self.start))

    def problem(self) -> str | None:
        for key in ("id", "journal"):
            if not getattr(self, key):
                return f"{key!r} is required"
        if self.apply and self.workflow:
            return "give 'apply' (a callable) or 'workflow', not both"
        return None


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


def check_journals(journals: Sequence[JournalRule], subscribers: Sequence[SubscriberRule],
                   where: str) -> None:
    """What the tables cannot check one by one: journal names and streams are unique, each
    subscriber's journal is one of them."""
    for kind in ("name", "stream"):
        seen: set[str] = set()
        for rule in journals:
            value = getattr(rule, kind)
            if value in seen:
                raise ConfigError(f"{where} [[journal]]: two journals with {kind} {value!r} "
                                  "(a stream has one journal: entry numbers are per stream)")
            seen.add(value)
    names = {j.name for j in journals}
    for i, sub in enumerate(subscribers):
        if sub.journal not in names:
            raise ConfigError(f"{where} [[subscriber]] #{i + 1}: journal {sub.journal!r} is not "
                              f"a [[journal]] of this file (known: {', '.join(sorted(names)) or 'none'})")
