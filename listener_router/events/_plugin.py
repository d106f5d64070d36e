"""The events plug-in: where the service writes its distributed events.

- ``record.committed.<workflow>`` (:meth:`EventsPlugin.in_commit`): one per
  record a commit transaction writes, in that transaction — never for a
  rolled-back one.  Event ID: (input queue, input message ID, record ID).
- ``record.invalidated.<workflow>`` and ``message.dead_lettered.<queue>``
  (:meth:`EventsPlugin.settle_messages`): for messages that end *retrying*
  or *dead*, one per record of a message whose records were taken up, and
  one per dead letter.  A group with nothing to commit opens no commit
  transaction, and bad input never reaches one, so these are written by the
  finish stage in a transaction of their own, before the retry copies and
  dead letters are published and the inputs acked.  Event IDs include the
  attempt, so a message that fails on each of its attempts has one event per
  attempt, and the same delivery failing again after a crash has the same IDs.
- ``topology.changed`` (:meth:`EventsPlugin.view_established`): in the
  leader's fenced transaction that establishes the view.
- ``job.finished.<schedule>``: the scheduler emits it with :meth:`EventsPlugin.emit`;
  a leader task of one's own with ``tx.emit(...)`` in its fenced transaction
  (the plug-in is the membership's ``emitter``).

The plug-in is built when any kind is on; a hook whose kinds are off is not
called at all (nothing is written for it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from listener_router._messages import derive_message_id
from listener_router._plugin import Host, Plugin
from listener_router.events._kinds import EventKind, Events, Publisher
from listener_router.events._settings import EventSettings
from listener_router.pipeline import State

if TYPE_CHECKING:
    from engine import InstanceResult
    from listener_router._settings import Settings
    from listener_router.broker import OutMessage
    from listener_router.cluster import LeaderTransaction, ViewChange
    from listener_router.pipeline import Commit, Work

__all__ = ["EventsPlugin"]


class EventsPlugin(Plugin):
    """Writes the kinds of event ``[events]`` turns on (see the module doc)."""

    name = "events"
    sections = (EventSettings,)

    @classmethod
    def build(cls, settings: Settings) -> EventsPlugin | None:
        events: EventSettings = settings.section("events")
        return cls(events) if events.any else None

    @classmethod
    def exchanges(cls, settings: Settings) -> list[tuple[str, str]]:
        events: EventSettings = settings.section("events")
        return [(events.exchange, "topic")] if events.any else []

    def __init__(self, settings: EventSettings):
        self.settings = settings
        self.events: Events | None = None
        # Hooks whose kinds are off are not called (None: not hooked).
        if not settings.committed:
            self.in_commit = None  # type: ignore[assignment]
        if not (settings.invalidated or settings.dead_lettered):
            self.settle_messages = None  # type: ignore[assignment]
        if not settings.topology:
            self.view_established = None  # type: ignore[assignment]

    def install(self, host: Host) -> None:
        self.events = Events(self.settings, host.node)
        host.membership.emitter = self.emit  # leader tasks' tx.emit(...)

    def emit(self, target: Publisher, kind: EventKind, subject: str | None,
             body: Mapping[str, Any], key: Sequence[str]) -> bool:
        """Add an event to ``target``'s transaction; False when its kind is off."""
        assert self.events is not None, "install() first"
        return self.events.emit(target, kind, subject, body, key)

    # -- hooks -------------------------------------------------------------------------------
    def in_commit(self, commit: Commit) -> None:
        events = self.events
        assert events is not None
        results: list[InstanceResult | None] = \
            list(commit.results) or [None] * len(commit.committed)
        for w, result in zip(commit.committed, results, strict=True):
            message = w.message
            assert message is not None
            ids = result.record_ids if result is not None else message.record_ids
            for rid in ids:
                events.emit(commit, EventKind.COMMITTED, commit.workflow, {
                    "workflow": commit.workflow, "record": rid, "queue": message.queue,
                    "message_id": message.message_id, "operation": message.operation,
                }, key=(message.queue, message.message_id, rid))

    def settle_messages(self, done: Sequence[Work]) -> list[OutMessage]:
        events = self.events
        assert events is not None
        invalidated = self.settings.invalidated
        dead_lettered = self.settings.dead_lettered
        out: list[OutMessage] = []
        for w in done:
            state = w.state
            if state is not State.RETRYING and state is not State.DEAD:
                continue
            message = w.message
            queue = w.delivery.queue
            mid = message.message_id if message is not None else (
                w.delivery.message_id or derive_message_id(w.delivery.body))
            made = message.attempts if message is not None else 0   # x-chalk-attempts: before
            attempt = str(made)     # in the event ID, as before: copies keep their IDs
            error = (w.error or "")[:1000]
            if invalidated and w.loaded and message is not None and w.workflow:
                for rid in message.record_ids:
                    out.append(events.build(EventKind.INVALIDATED, w.workflow, {
                        "workflow": w.workflow, "record": rid, "queue": queue,
                        "message_id": mid, "attempt": made + 1, "state": state.value,
                        "error": error,
                    }, key=(queue, mid, attempt, rid)))
            if dead_lettered and state is State.DEAD:
                out.append(events.build(EventKind.DEAD_LETTERED, queue, {
                    "queue": queue, "message_id": mid, "workflow": w.workflow,
                    "attempt": made + 1, "error": error,
                }, key=(queue, mid, attempt)))
        return out

    def view_established(self, tx: LeaderTransaction, change: ViewChange) -> None:
        assert self.events is not None
        self.events.emit(tx, EventKind.TOPOLOGY_CHANGED, None, {
            "cluster_id": change.cluster_id, "seq": change.seq, "leader": change.leader,
            "epoch": change.epoch, "members": list(change.members), "left": list(change.left),
            "joined": list(change.joined), "restarted": list(change.restarted),
        }, key=(change.cluster_id, str(change.seq)))
