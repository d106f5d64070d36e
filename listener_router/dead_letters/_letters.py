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
else — list, show, replay, purge — reads and changes the table.  In a
running service the leader moves them on a timer (:class:`Collector`, a
leader task), so that looking at the page never does; ``chalk dlq`` moves
them itself before it reads (no service need be running).

:func:`dead_letters` is what readers call (``chalk dlq`` and the dashboard).
A body is whatever a publisher sent: :func:`read_body` parses each on its
own and says why one cannot be read ("unreadable body (nested deeper than
64 levels)"), so one bad letter never hides the others.
The job log records each dead letter as it dies, with the message's whole history:
:func:`logged` reads it for a letter, :func:`replay` and :func:`purge` mark
the log's entries (a replayed message carries ``x-chalk-replays``, so its
new attempts are told apart from those before the replay).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import orjson
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
from listener_router._signing import HeaderSigner
from listener_router.broker import (
    Link,
    OutMessage,
    connect,
    dlq_name,
    properties_of,
    publish_confirmed,
)
from listener_router.cluster import LeaderTask
from listener_router.dead_letters._tables import DeadLetter, DeadLetters
from listener_router.jobs import REPLAYS_HEADER, JobLogTables, LogEntry
from listener_router.store import ServiceStore

__all__ = ["COLLECT_EVERY", "MAX_DEPTH", "PREVIEW_BYTES", "READ_BYTES", "AmbiguousMessageId", "Collector",
           "DeadLetter", "body_records", "collect", "dead_letters", "logged", "message_id_of",
           "purge", "read_body", "record_ids", "replay"]

log = logging.getLogger(__name__)

CHUNK = 500        # dead letters moved per transaction, at most
CHUNK_BYTES = 16 << 20   # and bodies of at most this many bytes (one more letter may pass it)
COLLECT_EVERY = 5.0    # seconds between the leader's moves of dead letters into the store
MAX_DEPTH = 64         # a body nested deeper is shown as text, never parsed
PREVIEW_BYTES = 64 * 1024   # the start of a body a page shows
READ_BYTES = 1 << 20        # bodies up to this size are read whole by the panel and the page


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


_FORGED = "(not written by this cluster: its x-chalk- headers are unsigned) "


def _letter(queue: str, props: Any, body: bytes, signer: HeaderSigner) -> DeadLetter:
    headers = {str(k): _plain(v) for k, v in (props.headers or {}).items()}
    if not signer.holds(headers, props.message_id, body):
        # a publisher's: it may not pick the replay queue or the attempts; its words are
        # kept, marked, for the operator to judge
        said = _text(headers.get(ERROR_HEADER, ""))
        headers = signer.trusted(headers, props.message_id, body)
        if said:
            headers[ERROR_HEADER] = _FORGED + said
    try:
        attempts = int(_text(headers.get(ATTEMPTS_HEADER, 0)))
    except ValueError:
        attempts = 0
    return DeadLetter(queue=_text(headers.get(QUEUE_HEADER, "")) or queue,
                      message_id=props.message_id or derive_message_id(body),
                      error=_reason(headers), attempts=attempts,
                      workflow=_text(headers.get(WORKFLOW_HEADER, "")), headers=headers,
                      body=body, content_type=props.content_type)


def collect(settings: Settings, store: ServiceStore, queues: Sequence[str],
            connection: pika.BlockingConnection | None = None) -> int:
    """Move every dead letter of ``queues`` (input queues) from ``Q.dlq`` into ``store``
    (on ``connection``, left open, when given)."""
    moved = 0
    signer = HeaderSigner.of(store)
    conn = connection or connect(settings.broker_url)
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
                size = 0
                while len(taken) < min(CHUNK, waiting) and size < CHUNK_BYTES:
                    method, props, body = ch.basic_get(dlq_name(queue), auto_ack=False)
                    if method is None:
                        break
                    taken.append((method.delivery_tag, _letter(queue, props, body, signer)))
                    size += len(body)
                if not taken:
                    break
                store.tables(DeadLetters).keep([letter for _tag, letter in taken])
                ch.basic_ack(taken[-1][0], multiple=True)
                moved += len(taken)
                waiting -= len(taken)
            ch.close()
    finally:
        if connection is None and conn.is_open:
            conn.close()
    return moved


class Collector(LeaderTask):
    """The leader's move of dead letters off ``Q.dlq`` into the store, every ``every``
    seconds (``[dead_letters] move_every``), on one broker connection it keeps (opened
    again after a failure).  Moving is idempotent (rows keyed by queue and message ID), so it takes no
    fenced transaction: a member that just lost the lead and moves once more writes the
    same rows."""

    name = "dead_letters"
    every = COLLECT_EVERY

    def __init__(self, settings: Settings, store: ServiceStore, queues: Sequence[str], *,
                 every: float = COLLECT_EVERY):
        self.every = every
        self.settings = settings
        self.store = store
        self.queues = list(dict.fromkeys(queues))
        self._connection: pika.BlockingConnection | None = None

    def run(self) -> int:
        if self._connection is None or not self._connection.is_open:
            self._connection = connect(self.settings.broker_url)
        try:
            return collect(self.settings, self.store, self.queues, self._connection)
        except Exception:
            self.close()
            raise

    def close(self) -> None:
        conn, self._connection = self._connection, None
        if conn is not None and conn.is_open:
            try:
                conn.close()
            except Exception as e:  # already gone
                log.debug("closing the dead-letter collector's connection: %s", e)


class AmbiguousMessageId(UserError, LookupError):
    """A short message ID that starts the IDs of several dead letters."""


def message_id_of(table: DeadLetters, queues: Sequence[str], given: str) -> str:
    """The message ID ``given`` stands for among ``queues``' dead letters: itself, or the one
    ID it is a unique start of (whole or after a ``:``, as ``git`` takes a short hash);
    ``given`` when none matches (nothing is found under it).

    Raises:
        AmbiguousMessageId: it starts several IDs (they are named, a few of them).
    """
    if not given:
        return given
    found = table.ids_like(queues, given)
    if given in found or not found:
        return given
    if len(found) == 1:
        return found[0]
    shown = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
    raise AmbiguousMessageId(f"{given!r} starts {len(found)} dead letters' message IDs "
                             f"({shown}); give more of it")


def dead_letters(settings: Settings, queues: Sequence[str], *, limit: int | None = None,
                 message_id: str | None = None, store: ServiceStore | None = None,
                 body_bytes: int | None = None) -> list[DeadLetter]:
    """The dead letters of ``queues``, oldest first (``message_id``'s only, when given: a
    whole ID or a unique start of one, :func:`message_id_of`).

    Without ``store`` (``chalk dlq``) it opens the settings' store and first moves what
    waits in ``Q.dlq``; with one (a running service's, whose leader moves them) it only
    reads.  ``body_bytes``: read only the start of each body (``DeadLetter.size`` says the
    whole size)."""
    own = store is None
    store = ServiceStore.connect(settings.blackboard_url) if store is None else store
    try:
        if own:
            collect(settings, store, queues)
        table = store.tables(DeadLetters)
        if message_id is not None:
            message_id = message_id_of(table, queues, message_id)
        return table.list(queues, limit=limit, message_id=message_id, body_bytes=body_bytes)
    finally:
        if own:
            store.close()


def _too_deep(value: Any) -> bool:
    todo = [(value, 1)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, (dict, list)):
            if depth > MAX_DEPTH:
                return True
            todo += [(v, depth + 1) for v in (item.values() if isinstance(item, dict) else item)]
    return False


def read_body(body: bytes) -> tuple[Any, str | None]:
    """A dead letter's body as JSON, or ``(None, why it cannot be read)``: not JSON, not
    UTF-8, nested deeper than ``MAX_DEPTH`` levels (parsed without recursion, so no body
    can exhaust the stack of whoever reads it)."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        why = str(e)[:200]
        return None, f"nested too deeply: {why}" if "depth" in why else f"not JSON: {why}"
    except Exception as e:  # whatever else a body can do to a parser
        return None, f"{type(e).__name__}: {str(e)[:200]}"
    if _too_deep(data):
        return None, f"nested deeper than {MAX_DEPTH} levels"
    return data, None


def body_records(letter: DeadLetter) -> tuple[list[str], str | None]:
    """The record IDs a dead letter's body names, and what stops them being read ("body of
    5,242,880 bytes: only its start was read", "unreadable body (not JSON: …)"), or None."""
    if not letter.whole:
        return [], (f"body of {letter.body_size:,} bytes: its records are not read here "
                    "(open it)")
    data, problem = read_body(letter.body)
    if problem is not None:
        return [], f"unreadable body ({problem})"
    return _ids_in(data), None


def _ids_in(data: Any) -> list[str]:
    if isinstance(data, dict) and isinstance(data.get("records"), list):
        return [str(r.get("id")) for r in data["records"] if isinstance(r, dict)]
    return [str(data["id"])] if isinstance(data, dict) and "id" in data else []


def record_ids(body: bytes) -> list[str]:
    """The record IDs a message body names (none for a body that is not a message)."""
    data, problem = read_body(body)
    return [] if problem is not None else _ids_in(data)


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


def _publish(settings: Settings, store: ServiceStore, letters: Sequence[DeadLetter],
             link: Link | None) -> None:
    """Each letter back to its queue with confirms, its replay count signed: on the
    service's ``link``, or on a connection of its own."""
    signer = HeaderSigner.of(store)
    messages = []
    for letter in letters:
        headers = {k: v for k, v in letter.headers.items() if not k.startswith(_DROPPED)}
        headers[REPLAYS_HEADER] = _replays(letter) + 1
        messages.append(signer.sign(OutMessage(
            routing_key=letter.queue, body=letter.body, message_id=letter.message_id,
            headers=headers, content_type=letter.content_type or "application/json")))
    if link is not None:
        publish_confirmed(link, messages, timeout=60)
        return
    conn = connect(settings.broker_url)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        for m in messages:   # stamped with the time of the replay, as on the link
            ch.basic_publish("", m.routing_key, m.body, properties_of(m))
    finally:
        if conn.is_open:
            conn.close()


def replay(settings: Settings, queues: Sequence[str], message_id: str | None = None, *,
           by: str = "chalk dlq replay", store: ServiceStore | None = None,
           link: Link | None = None) -> int:
    """Publish dead letters back to their queue (attempts reset, reason dropped), with
    confirms, then forget them (``message_id``: one, or the one it is a unique start of);
    the job log says they were replayed ``by`` whom.  A crash in between publishes one
    again on the next replay: it carries its message ID, so the service takes it once.
    A running service passes its ``store`` and ``link`` (its leader moves the letters);
    without them the settings' store is opened and ``Q.dlq`` emptied into it first."""
    own = store is None
    store = ServiceStore.connect(settings.blackboard_url) if store is None else store
    try:
        table, log = store.tables(DeadLetters), store.tables(JobLogTables)
        if own:
            collect(settings, store, queues)
        if message_id is not None:
            message_id = message_id_of(table, queues, message_id)
        letters = table.list(queues, message_id=message_id)
        if not letters:
            return 0
        _publish(settings, store, letters, link)
        table.remove(letters)
        with store.writes, store.engine.begin() as conn:
            for letter in letters:
                log.replayed(conn, letter.queue, letter.message_id, _replays(letter) + 1,
                             f"replayed by {by}")
        return len(letters)
    finally:
        if own:
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
