"""Reading dead letters without redelivering them: the one place ``chalk dlq`` gets them.

A quorum queue counts every message given back (``basic.nack`` with requeue,
or a channel closed with it unacked) as a delivery, raising its
``x-delivery-count``; at the queue's delivery limit (an argument or a
policy) the broker drops it.  Browsing ``Q.dlq`` by taking and giving back
would therefore lose dead letters.  Instead :func:`collect` *moves* them:
it takes a chunk from ``Q.dlq``, writes it to the database
(``_tables``) in one transaction, and acks it only then.
Nothing is lost (a message leaves the queue only once it is committed), and
nothing is doubled (a chunk taken again after a crash between commit and
ack writes the same rows, keyed by queue and message ID).  Everything
else — list, show, replay, purge — reads and changes the table.

:func:`dead_letters` is what readers call (``chalk dlq`` and the dashboard).
The job log records each dead letter as it dies, with the message's whole history:
:func:`logged` reads it for a letter, :func:`replay` and :func:`purge` mark
the log's entries (a replayed message carries ``x-chalk-replays``, so its
new attempts are told apart from those before the replay).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import pika
import pika.exceptions

from listener_router._errors import UserError
from listener_router._messages import (
    ATTEMPTS_HEADER,
    ERROR_HEADER,
    QUEUE_HEADER,
    WORKFLOW_HEADER,
    derive_message_id,
)
from listener_router._settings import Settings
from listener_router.broker import connect, dlq_name
from listener_router.dead_letters._tables import DeadLetter, DeadLetters
from listener_router.jobs import REPLAYS_HEADER, JobLogTables, LogEntry
from listener_router.store import ServiceStore

__all__ = ["AmbiguousMessageId", "DeadLetter", "collect", "dead_letters", "logged",
           "message_id_of", "purge", "record_ids", "replay"]

CHUNK = 500        # dead letters moved per transaction


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _plain(value: Any) -> Any:
    """An AMQP header value as JSON (bytes as text, tables and lists inside too)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def _reason(headers: dict[str, Any]) -> str:
    """Why it died: the service's reason, or what the broker says about it."""
    if ERROR_HEADER in headers:
        return _text(headers[ERROR_HEADER])
    why = _text(headers.get("x-first-death-reason", "")) or "unknown"
    if why == "delivery_limit":
        return ("dead-lettered by the broker: delivered more often than the queue's delivery "
                "limit (a service process died while it was in a batch)")
    return f"dead-lettered by the broker ({why})"


def _letter(queue: str, props: Any, body: bytes) -> DeadLetter:
    headers = {str(k): _plain(v) for k, v in (props.headers or {}).items()}
    try:
        attempts = int(_text(headers.get(ATTEMPTS_HEADER, 0)))
    except ValueError:
        attempts = 0
    return DeadLetter(queue=_text(headers.get(QUEUE_HEADER, "")) or queue,
                      message_id=props.message_id or derive_message_id(body),
                      error=_reason(headers), attempts=attempts,
                      workflow=_text(headers.get(WORKFLOW_HEADER, "")), headers=headers,
                      body=body, content_type=props.content_type)


def collect(settings: Settings, store: ServiceStore, queues: Sequence[str]) -> int:
    """Move every dead letter of ``queues`` (input queues) from ``Q.dlq`` into ``store``."""
    moved = 0
    conn = connect(settings.broker_url)
    try:
        for queue in queues:
            ch = conn.channel()
            try:
                waiting = ch.queue_declare(dlq_name(queue), passive=True).method.message_count
            except pika.exceptions.ChannelClosedByBroker as e:
                if e.reply_code != 404:
                    raise
                continue  # no dead-letter queue: nothing ever died there
            while waiting > 0:
                taken: list[tuple[int, DeadLetter]] = []
                while len(taken) < min(CHUNK, waiting):
                    method, props, body = ch.basic_get(dlq_name(queue), auto_ack=False)
                    if method is None:
                        break
                    taken.append((method.delivery_tag, _letter(queue, props, body)))
                if not taken:
                    break
                store.tables(DeadLetters).keep([letter for _tag, letter in taken])
                ch.basic_ack(taken[-1][0], multiple=True)
                moved += len(taken)
                waiting -= len(taken)
            ch.close()
    finally:
        if conn.is_open:
            conn.close()
    return moved


class AmbiguousMessageId(UserError, LookupError):
    """A short message ID that starts the IDs of several dead letters."""


def message_id_of(table: DeadLetters, queues: Sequence[str], given: str) -> str:
    """The message ID ``given`` stands for among ``queues``' dead letters: itself, or the one
    ID it is a unique start of (whole or after a ``:``, as ``git`` takes a short hash);
    ``given`` when none matches (nothing is found under it).

    Raises:
        AmbiguousMessageId: it starts several IDs (they are named, a few of them).
    """
    found = table.ids_like(queues, given)
    if given in found or not found:
        return given
    if len(found) == 1:
        return found[0]
    shown = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
    raise AmbiguousMessageId(f"{given!r} starts {len(found)} dead letters' message IDs "
                             f"({shown}); give more of it")


def dead_letters(settings: Settings, queues: Sequence[str], *, limit: int | None = None,
                 message_id: str | None = None) -> list[DeadLetter]:
    """The dead letters of ``queues``, oldest first (``message_id``'s only, when given: a
    whole ID or a unique start of one, :func:`message_id_of`)."""
    store = ServiceStore.connect(settings.blackboard_url)
    try:
        collect(settings, store, queues)
        table = store.tables(DeadLetters)
        if message_id is not None:
            message_id = message_id_of(table, queues, message_id)
        return table.list(queues, limit=limit, message_id=message_id)
    finally:
        store.close()


def record_ids(body: bytes) -> list[str]:
    """The record IDs a message body names (none for a body that is not a message)."""
    try:
        data = json.loads(body)
    except ValueError:
        return []
    if isinstance(data, dict) and isinstance(data.get("records"), list):
        return [str(r.get("id")) for r in data["records"] if isinstance(r, dict)]
    return [str(data["id"])] if isinstance(data, dict) and "id" in data else []


def logged(store: ServiceStore, letter: DeadLetter) -> tuple[list[str], list[LogEntry]]:
    """A dead letter's record IDs and its message's history in the job log, oldest first
    (no history: it died before the log was kept, or the broker dead-lettered it)."""
    log = store.tables(JobLogTables)
    history = log.entries(queues=(letter.queue,), message_id=letter.message_id, limit=1000)
    dead = [e for e in history if e.state == "dead"]
    return (log.record_ids(dead[-1]) if dead else record_ids(letter.body)), history


def _replays(letter: DeadLetter) -> int:
    try:
        return int(str(letter.headers.get(REPLAYS_HEADER, 0)))
    except ValueError:
        return 0


_DROPPED = ("x-chalk-", "x-death", "x-first-death", "x-last-death", "x-delivery-count")


def replay(settings: Settings, queues: Sequence[str], message_id: str | None = None, *,
           by: str = "chalk dlq replay") -> int:
    """Publish dead letters back to their queue (attempts reset, reason dropped), with
    confirms, then forget them (``message_id``: one, or the one it is a unique start of); the job log says they were replayed ``by`` whom.  A crash in
    between publishes one again on the next replay: it carries its message ID, so the service
    takes it once."""
    store = ServiceStore.connect(settings.blackboard_url)
    try:
        table, log = store.tables(DeadLetters), store.tables(JobLogTables)
        collect(settings, store, queues)
        if message_id is not None:
            message_id = message_id_of(table, queues, message_id)
        letters = table.list(queues, message_id=message_id)
        if not letters:
            return 0
        conn = connect(settings.broker_url)
        try:
            ch = conn.channel()
            ch.confirm_delivery()
            for letter in letters:
                headers = {k: v for k, v in letter.headers.items() if not k.startswith(_DROPPED)}
                headers[REPLAYS_HEADER] = _replays(letter) + 1
                ch.basic_publish("", letter.queue, letter.body, pika.BasicProperties(
                    delivery_mode=2, message_id=letter.message_id, headers=headers,
                    content_type=letter.content_type, timestamp=int(time.time())))
        finally:
            if conn.is_open:
                conn.close()
        table.remove(letters)
        with store.writes, store.engine.begin() as conn:
            for letter in letters:
                log.replayed(conn, letter.queue, letter.message_id, _replays(letter) + 1,
                             f"replayed by {by}")
        return len(letters)
    finally:
        store.close()


def purge(settings: Settings, queues: Sequence[str], message_id: str | None = None) -> int:
    """Drop the dead letters of ``queues`` (those still in ``Q.dlq`` too; ``message_id``:
    one, or the one it is a unique start of)."""
    store = ServiceStore.connect(settings.blackboard_url)
    try:
        table, log = store.tables(DeadLetters), store.tables(JobLogTables)
        collect(settings, store, queues)
        if message_id is not None:
            message_id = message_id_of(table, queues, message_id)
        letters = table.list(queues, message_id=message_id)
        removed = table.remove(letters)
        with store.writes, store.engine.begin() as conn:
            for letter in letters:
                log.resolve(conn, letter.queue, letter.message_id, "purged")
        return removed
    finally:
        store.close()
