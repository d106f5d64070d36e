"""Subscriber discovery and status: status messages, the journal's head, the view.

Each subscriber agent publishes a status message to the journal's status
stream every ``status_every`` seconds and whenever its state changes (the
discovery message: its last processed offset, running or blocked, its
error count), and a last one saying ``stopped`` when it stops.  The
publisher's side needs no registry of subscribers: :func:`journal_status`
reads the status stream from ``forget_after`` seconds ago, keeps each
subscriber's latest message, reads the head of the journal (its last
entry), and computes per subscriber the lag in entries (stream offsets) and
in seconds (how much older the subscriber's last applied entry is than the
head's), its state, last seen.  A running agent not heard from for three
of its status intervals is ``silent`` (it died without a word).

A subscriber of the configuration (``[[subscriber]]`` of this journal, with
its ``store``) is always in the view, stopped or not: when no agent spoke
lately, its row in its own database says where it is (``stopped``, or
``blocked``), so one that stopped with a backlog stays visible, with its
lag, until it is removed from the configuration.  One run without a
``[[subscriber]]`` entry is known only by its messages: it leaves the view
after ``forget_after`` seconds of silence.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import orjson
import pika
import pika.exceptions
from sqlalchemy import create_engine

from listener_router._errors import BrokerUnavailable, ConfigError
from listener_router._settings import Settings
from listener_router.broker import connect
from listener_router.journal._offsets import peek_state
from listener_router.journal._settings import JournalRule, SubscriberRule

__all__ = ["Head", "SubscriberView", "journal_rule", "journal_status", "read_head",
           "subscriber_rule",
           "read_stream", "status_body"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Head:
    """The last entry of a journal's stream."""

    offset: int
    seq: int
    published_at: float


@dataclass(frozen=True)
class SubscriberView:
    """One subscriber as the publisher's side sees it."""

    subscriber: str
    state: str                    # running | blocked | stopped | silent
    offset: int | None            # last offset it consumed
    lag_entries: int              # stream entries after its offset
    lag_seconds: float            # how much older its last applied entry is than the head's
    errors: int                   # entries it sent to its error queue
    last_seen: float | None       # seconds since its last status message (None: none lately)
    blocked_reason: str | None
    host: str
    note: str | None = None       # why the state, when it is not plain (a store not readable)


def journal_rule(settings: Settings, name: str) -> JournalRule:
    """The ``[[journal]]`` called ``name``; a clear error when there is none."""
    for rule in settings.section("journal"):
        if rule.name == name:
            return rule
    known = ", ".join(r.name for r in settings.section("journal")) or "none"
    where = settings.source or "the configuration"
    raise ConfigError(f"{where}: no [[journal]] named {name!r} (known: {known})")


def read_stream(url: str, stream: str, offset: Any, *, idle: float = 0.3,
                wait_first: float = 1.5, limit: int | None = None,
                keep: Callable[[int, bytes], bool] | None = None,
                stamp: str | None = None) -> list[tuple[int, bytes]]:
    """``(offset, body)`` of a stream's messages from ``offset`` (an x-stream-offset value),
    until none arrived for ``idle`` seconds (``wait_first`` for the first one).

    ``stamp`` names a JSON field holding the time a message was written: reading stops
    at the first message written after the read began (it has caught up with a stream
    that is still being written, where a quiet moment may never come)."""
    began = time.time()
    conn = connect(url)   # BrokerUnavailable with the reason when none
    found: list[tuple[int, bytes]] = []
    last = [time.monotonic()]
    caught_up = [False]
    try:
        channel = conn.channel()
        channel.basic_qos(prefetch_count=1000)

        def on_message(ch: Any, method: Any, props: Any, body: bytes) -> None:
            position = int((props.headers or {}).get("x-stream-offset", -1))
            if keep is None or keep(position, body):
                found.append((position, body))
            ch.basic_ack(method.delivery_tag)
            last[0] = time.monotonic()
            if stamp is not None and _written(body, stamp) >= began:
                caught_up[0] = True

        channel.basic_consume(stream, on_message, arguments={"x-stream-offset": offset})
        started = time.monotonic()
        while (limit is None or len(found) < limit) and not caught_up[0]:
            conn.process_data_events(time_limit=0.05)
            quiet = time.monotonic() - last[0]
            if (found and quiet > idle) or (not found and time.monotonic() - started > wait_first):
                break
    except pika.exceptions.ChannelClosedByBroker as e:
        if e.reply_code == 404:
            raise ConfigError(f"stream {stream} does not exist (has the service with this "
                              "journal run yet?)") from e
        raise BrokerUnavailable(f"reading stream {stream}: {e}") from e
    except (pika.exceptions.AMQPError, OSError) as e:
        raise BrokerUnavailable(f"reading stream {stream}: {e}") from e
    finally:
        _close(conn)
    return found


def _written(body: bytes, stamp: str) -> float:
    try:
        return float(orjson.loads(body)[stamp])
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return 0.0


def _close(conn: Any) -> None:
    """Close a reader's connection.  pika rejects the deliveries still buffered when it
    cancels the consumer, and a stream refuses rejects (540, closing the channel): what
    was read is complete all the same, so that is no error here."""
    try:
        if conn.is_open:
            conn.close()
    except (pika.exceptions.AMQPError, OSError) as e:
        log.debug("closing a stream reader: %s", e)


def read_head(url: str, stream: str) -> Head | None:
    """The stream's last entry (None: the stream is empty)."""
    found = read_stream(url, stream, "last", stamp="published_at")
    if not found:
        return None
    offset, body = max(found, key=lambda item: item[0])
    try:
        data = orjson.loads(body)
        return Head(offset, int(data.get("seq", 0)), float(data.get("published_at", 0.0)))
    except (orjson.JSONDecodeError, TypeError, ValueError, AttributeError):
        return Head(offset, 0, 0.0)


def status_body(**fields: Any) -> bytes:
    return orjson.dumps(fields)


def _since(seconds_ago: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(int(time.time() - seconds_ago),
                                           tz=datetime.timezone.utc)


SILENT_AFTER = 3               # status intervals without a message: a running agent is silent


def _lag(head: Head | None, offset: int | None, entry_at: float | None,
         now: float) -> tuple[int, float]:
    """Entries after ``offset`` and how much older the last applied entry is than the head."""
    if head is None:
        return 0, 0.0
    lag = head.offset - (-1 if offset is None else int(offset))
    if lag <= 0:
        return 0, 0.0
    seconds = head.published_at - float(entry_at) if entry_at else now - head.published_at
    return lag, max(0.0, seconds)


def _heard(name: str, status: dict[str, Any], head: Head | None, now: float) -> SubscriberView:
    """The view of a subscriber from its latest status message."""
    seen = now - float(status.get("at", 0.0))
    state = str(status.get("state", "?"))
    every = float(status.get("every") or 0.0)
    if state in ("running", "blocked") and every and seen > SILENT_AFTER * every:
        state = "silent"
    offset = status.get("offset")
    lag, lag_seconds = _lag(head, offset, status.get("entry_at"), now)
    return SubscriberView(
        subscriber=name, state=state, offset=offset, lag_entries=lag, lag_seconds=lag_seconds,
        errors=int(status.get("errors", 0)), last_seen=seen,
        blocked_reason=status.get("blocked_reason"), host=str(status.get("host", "")))


def _stored(rule: SubscriberRule, head: Head | None, now: float) -> SubscriberView:
    """The view of a configured subscriber no agent spoke for lately: its row, in its store."""
    state, reason = None, None
    try:
        engine = create_engine(rule.store)
        try:
            state = peek_state(engine, rule.journal, rule.id)
        finally:
            engine.dispose()
    except Exception as e:  # its database is not reachable from here: say so
        reason = f"its store cannot be read: {type(e).__name__}: {e}"
    if state is None:
        return SubscriberView(rule.id, "unknown" if reason else "never run", None, 0, 0.0, 0,
                              None, None, "", reason)
    lag, lag_seconds = _lag(head, state.offset, state.entry_at, now)
    return SubscriberView(rule.id, "blocked" if state.blocked else "stopped", state.offset, lag,
                          lag_seconds, state.errors, None, state.blocked_reason, "")


def journal_status(settings: Settings, journal: str, *,
                   forget_after: float | None = None) -> tuple[Head | None, list[SubscriberView]]:
    """The journal's head and its subscribers, by name: those heard from within
    ``forget_after`` seconds (default: the journal's ``forget_after``) and every
    ``[[subscriber]]`` of the configuration for it (see the module doc)."""
    rule = journal_rule(settings, journal)
    window = rule.forget_after if forget_after is None else forget_after
    head = read_head(settings.broker_url, rule.stream)
    latest: dict[str, dict[str, Any]] = {}
    for _offset, body in read_stream(settings.broker_url, rule.status_stream, _since(window + 1),
                                     wait_first=0.5, stamp="at"):
        try:
            status = orjson.loads(body)
            latest[str(status["subscriber"])] = status
        except (orjson.JSONDecodeError, KeyError, TypeError):
            continue
    now = time.time()
    views = {name: _heard(name, status, head, now) for name, status in latest.items()
             if now - float(status.get("at", 0.0)) <= window}
    for configured in settings.section("subscriber"):
        if configured.journal == journal and configured.id not in views and configured.store:
            views[configured.id] = _stored(configured, head, now)
    return head, [views[name] for name in sorted(views)]


def subscriber_rule(settings: Settings, subscriber: str, journal: str | None = None,
                    **overrides: Any) -> SubscriberRule:
    """The ``[[subscriber]]`` with this id (for ``journal``), with ``overrides`` applied;
    made from the overrides alone when the configuration has none."""
    for rule in settings.section("subscriber"):
        if rule.id == subscriber and (journal is None or rule.journal == journal):
            return replace(rule, **{k: v for k, v in overrides.items() if v is not None})
    if journal is None:
        raise ConfigError(f"no [[subscriber]] with id {subscriber!r}: give --journal too")
    journal_rule(settings, journal)
    return SubscriberRule(id=subscriber, journal=journal,
                          **{k: v for k, v in overrides.items() if v is not None})
