"""Where the pipeline writes events: commit transactions and settled failures.

- :class:`CommittedEvents` (a commit extension): one ``record.committed``
  event per record a commit transaction writes, in that transaction — never
  for a rolled-back one.  Event ID: (input queue, input message ID, record ID).
- :class:`FailureEvents` (a settle extension): for messages that end
  *retrying* or *dead*, one ``record.invalidated`` event per record of a
  message whose records were taken up, and one ``message.dead_lettered``
  event per dead letter.  A group with nothing to commit opens no commit
  transaction, and bad input never reaches one, so these are written by the
  finish stage in a transaction of their own, before the retry copies and
  dead letters are published and the inputs acked.  Event IDs include the
  attempt, so a message that fails on each of its attempts has one event per
  attempt, and the same delivery failing again after a crash has the same IDs.

Neither is registered when its kinds are off: nothing is written then.
"""

from __future__ import annotations

from engine import InstanceResult
from listener_router._messages import derive_message_id
from listener_router.broker import OutMessage
from listener_router.events._events import EventKind, Events
from listener_router.pipeline import Commit, CommitExtension, SettleExtension, State, Work

__all__ = ["CommittedEvents", "FailureEvents"]


class CommittedEvents(CommitExtension):
    """``record.committed.<workflow>`` per committed record, in the commit transaction."""

    def __init__(self, events: Events):
        self.events = events

    def in_transaction(self, commit: Commit) -> None:
        events = self.events
        results: list[InstanceResult | None] = list(commit.results) or [None] * len(commit.committed)
        for w, result in zip(commit.committed, results, strict=True):
            message = w.message
            assert message is not None
            ids = result.record_ids if result is not None else message.record_ids
            for rid in ids:
                events.emit(commit, EventKind.COMMITTED, commit.workflow, {
                    "workflow": commit.workflow, "record": rid, "queue": message.queue,
                    "message_id": message.message_id, "operation": message.operation,
                }, key=(message.queue, message.message_id, rid))


class FailureEvents(SettleExtension):
    """``record.invalidated.<workflow>`` and ``message.dead_lettered.<queue>`` (module doc)."""

    def __init__(self, events: Events):
        self.events = events
        self.invalidated = events.enabled(EventKind.INVALIDATED)
        self.dead_lettered = events.enabled(EventKind.DEAD_LETTERED)

    def messages(self, done: list[Work]) -> list[OutMessage]:
        out: list[OutMessage] = []
        events = self.events
        for w in done:
            state = w.state
            if state is not State.RETRYING and state is not State.DEAD:
                continue
            message = w.message
            queue = w.delivery.queue
            mid = message.message_id if message is not None else (
                w.delivery.message_id or derive_message_id(w.delivery.body))
            attempt = str(message.attempts if message is not None else 0)
            error = (w.error or "")[:1000]
            if self.invalidated and w.loaded and message is not None and w.workflow:
                for rid in message.record_ids:
                    out.append(events.build(EventKind.INVALIDATED, w.workflow, {
                        "workflow": w.workflow, "record": rid, "queue": queue,
                        "message_id": mid, "attempt": int(attempt), "state": state.value,
                        "error": error,
                    }, key=(queue, mid, attempt, rid)))
            if self.dead_lettered and state is State.DEAD:
                out.append(events.build(EventKind.DEAD_LETTERED, queue, {
                    "queue": queue, "message_id": mid, "workflow": w.workflow,
                    "attempt": int(attempt), "error": error,
                }, key=(queue, mid, attempt)))
        return out
