"""The distribution journal: committed records on a replayable log, read by many subscribers.

Publishing (the service's side, the plug-in :class:`JournalPublisher`,
built when there is a ``[[journal]]``): a ``[[journal]]`` names a RabbitMQ
stream and which commits go to it.  :class:`JournalWriter`, in each commit
transaction, writes one entry per committed record into the journal outbox
(``_outbox``); :class:`JournalRelay` numbers the entries (``seq``,
dense per journal) and publishes them with confirms, in commit order per
record, one relay per journal in a cluster.

Subscribing: :class:`Subscriber` reads a journal from its stored offset,
applies entries in batches (a Python callable, or a workflow on a
blackboard of its own) and stores offset and entry number in the same
transaction as the effects, so each entry is applied once, across crashes,
broker restarts and re-published entries.  Failing entries go to the
subscriber's error queue or block it; gaps left by retention are reported.

Status: subscribers publish their position and state to the journal's
status stream; :func:`journal_status` turns that into lag, blocked, last
seen.  See ``docs/journal.md``.

Modules: ``_settings`` (the configuration), ``_entries`` (the entry format,
attachment references), ``_outbox`` (the journal outbox in the service's
database), ``_publish`` (the plug-in: writer, relay, stream declarations),
``_offsets`` (a subscriber's tables in its own database), ``_subscriber``
(the agent), ``_status`` (status messages and the view), ``_blocked``
(``journal.subscriber.blocked``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from listener_router._lazy import lazy_names

if TYPE_CHECKING:
    from listener_router.journal._apply import ApplyFn, SubscriberStats, load_callable
    from listener_router.journal._blocked import (
        EVENTS_EXCHANGE,
        blocked_event,
    )
    from listener_router.journal._entries import (
        AttachmentRef,
        AttachmentSource,
        AttachmentUnavailable,
        Entry,
        EntryEncoder,
    )
    from listener_router.journal._offsets import (
        NotBlocked,
        Position,
        PositionMoved,
        SubscriberState,
        attempts_in,
        recent_errors,
        request_retry,
        request_rewind,
        request_skip,
        subscriber_state,
    )
    from listener_router.journal._outbox import JournalOutbox
    from listener_router.journal._publish import (
        JournalPublisher,
        JournalRelay,
        JournalWriter,
        declare_journal,
    )
    from listener_router.journal._settings import (
        JournalRule,
        SubscriberRule,
        check_journals,
        parse_start,
        stream_name,
    )
    from listener_router.journal._status import (
        Head,
        SubscriberView,
        journal_rule,
        journal_status,
        read_head,
        read_stream,
        subscriber_rule,
    )
    from listener_router.journal._subscriber import Subscriber

_HOMES = {
    "ApplyFn": "_apply",
    "AttachmentRef": "_entries",
    "AttachmentSource": "_entries",
    "AttachmentUnavailable": "_entries",
    "EVENTS_EXCHANGE": "_blocked",
    "Entry": "_entries",
    "EntryEncoder": "_entries",
    "Head": "_status",
    "JournalPublisher": "_publish",
    "JournalRelay": "_publish",
    "JournalRule": "_settings",
    "JournalWriter": "_publish",
    "NotBlocked": "_offsets",
    "attempts_in": "_offsets",
    "Position": "_offsets",
    "PositionMoved": "_offsets",
    "Subscriber": "_subscriber",
    "SubscriberRule": "_settings",
    "SubscriberState": "_offsets",
    "SubscriberStats": "_apply",
    "SubscriberView": "_status",
    "blocked_event": "_blocked",
    "declare_journal": "_publish",
    "journal_rule": "_status",
    "journal_status": "_status",
    "load_callable": "_apply",
    "check_journals": "_settings",
    "parse_start": "_settings",
    "JournalOutbox": "_outbox",
    "read_head": "_status",
    "read_stream": "_status",
    "recent_errors": "_offsets",
    "request_retry": "_offsets",
    "request_rewind": "_offsets",
    "request_skip": "_offsets",
    "stream_name": "_settings",
    "subscriber_rule": "_status",
    "subscriber_state": "_offsets",
}

__all__ = [
    "ApplyFn",
    "AttachmentRef",
    "AttachmentSource",
    "AttachmentUnavailable",
    "EVENTS_EXCHANGE",
    "Entry",
    "EntryEncoder",
    "Head",
    "JournalOutbox",
    "JournalPublisher",
    "JournalRelay",
    "JournalRule",
    "JournalWriter",
    "NotBlocked",
    "Position",
    "PositionMoved",
    "Subscriber",
    "SubscriberRule",
    "SubscriberState",
    "SubscriberStats",
    "SubscriberView",
    "attempts_in",
    "blocked_event",
    "check_journals",
    "declare_journal",
    "journal_rule",
    "journal_status",
    "load_callable",
    "parse_start",
    "read_head",
    "read_stream",
    "recent_errors",
    "request_retry",
    "request_rewind",
    "request_skip",
    "stream_name",
    "subscriber_rule",
    "subscriber_state",
]


__getattr__, __dir__ = lazy_names(__name__, _HOMES, __all__, globals())
