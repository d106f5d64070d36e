"""Distributed events: what they are, their routing keys, their deterministic IDs.

An event is a small JSON message on the topic exchange ``chalk.events``
(``[events] exchange``), routed by ``<kind>.<subject>``:

==========================  =============================================
routing key                 when
==========================  =============================================
record.committed.<wf>       a record was committed by workflow ``wf``
record.invalidated.<wf>     a record's instance failed in ``wf`` (retrying or dead)
message.dead_lettered.<q>   a message from queue ``q`` went to ``q.dlq``
topology.changed            the cluster's leader established a new view
job.finished.<schedule>     a scheduled job ended (written by the scheduler)
==========================  =============================================

Every event is written to the outbox in a transaction (the commit's, the
failure's, the leader's) and published from there with confirms, so it
exists exactly when what it reports was written.  Its ``message_id`` is
derived from what it reports (kind, queue, message ID, attempt, record ID;
the view's sequence number; the job's run), never random: a batch published
again after a crash carries the same IDs, and a subscriber drops the copies
by ID.  Each event names the member that wrote it in the ``event.application``
header (and in the body), as Sling's distributed events do.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Any, Protocol

import orjson

from listener_router.broker import EVENT_TOPIC_HEADER, OutMessage
from listener_router.events._settings import EventSettings

__all__ = ["APPLICATION_HEADER", "EventKind", "Events", "Publisher", "TOPIC_HEADER", "event_id"]

APPLICATION_HEADER = "event.application"
TOPIC_HEADER = EVENT_TOPIC_HEADER


class EventKind(str, Enum):
    """The kinds of event; the value is the routing key's prefix."""

    COMMITTED = "record.committed"
    INVALIDATED = "record.invalidated"
    DEAD_LETTERED = "message.dead_lettered"
    TOPOLOGY_CHANGED = "topology.changed"
    JOB_FINISHED = "job.finished"


_SWITCH = {  # the [events] key that turns each kind on
    EventKind.COMMITTED: "committed",
    EventKind.INVALIDATED: "invalidated",
    EventKind.DEAD_LETTERED: "dead_lettered",
    EventKind.TOPOLOGY_CHANGED: "topology",
    EventKind.JOB_FINISHED: "job_finished",
}


class Publisher(Protocol):
    """Where an event goes: anything with ``publish(OutMessage)`` that writes to the
    outbox in a transaction (a :class:`~listener_router.Commit`, a leader's fenced
    transaction)."""

    def publish(self, message: OutMessage) -> None: ...


def event_id(kind: EventKind, *parts: str) -> str:
    """The event's message ID: the same kind and parts give the same ID, always."""
    digest = hashlib.sha256("\x00".join((kind.value, *parts)).encode()).hexdigest()
    return f"evt:{digest[:40]}"


class Events:
    """Makes this member's events, for the kinds ``[events]`` turns on.

    ``application`` is the member's name (``event.application``).  The
    scheduler, a leader task or a plug-in's commit hook emits with::

        events.emit(target, EventKind.JOB_FINISHED, "nightly", {"outcome": "ok"},
                    key=("nightly", "2026-01-01T00:00"))

    where ``target`` is the transaction's publisher (``commit`` in
    ``Plugin.in_commit``, the ``LeaderTransaction`` of ``with task.fenced() as tx``).
    ``key`` are the parts of the event ID: what makes this event this event.
    """

    def __init__(self, settings: EventSettings, application: str):
        self.settings = settings
        self.application = application

    def enabled(self, kind: EventKind) -> bool:
        return bool(getattr(self.settings, _SWITCH[kind]))

    def message(self, kind: EventKind, subject: str | None, body: Mapping[str, Any],
                key: Sequence[str]) -> OutMessage | None:
        """The event as an outgoing message, or None when its kind is off."""
        if not self.enabled(kind):
            return None
        return self.build(kind, subject, body, key)

    def build(self, kind: EventKind, subject: str | None, body: Mapping[str, Any],
              key: Sequence[str]) -> OutMessage:
        """The event as an outgoing message, whether its kind is on or not."""
        content = {"event": kind.value, "application": self.application, "time": time.time(),
                   **body}
        return OutMessage(
            routing_key=f"{kind.value}.{subject}" if subject else kind.value,
            body=orjson.dumps(content), message_id=event_id(kind, *key),
            headers={APPLICATION_HEADER: self.application, TOPIC_HEADER: kind.value},
            exchange=self.settings.exchange)

    def emit(self, target: Publisher, kind: EventKind, subject: str | None,
             body: Mapping[str, Any], key: Sequence[str]) -> bool:
        """Add the event to ``target``'s transaction; False when its kind is off."""
        message = self.message(kind, subject, body, key)
        if message is None:
            return False
        target.publish(message)
        return True
