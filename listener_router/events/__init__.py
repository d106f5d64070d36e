"""Distributed events: the ``chalk.events`` topic exchange (see ``_events`` for the model).

- ``_events``: :class:`EventKind`, :class:`Events` (makes and emits a member's
  events into a transaction's outbox), :func:`event_id` (deterministic IDs);
- ``_pipeline``: where the pipeline writes them (:class:`CommittedEvents` in
  the commit transaction, :class:`FailureEvents` for failures and dead letters);
- ``_follow``: a live subscriber (``chalk events --follow``).

The leader writes ``topology.changed`` (``cluster/``); the scheduler writes
``job.finished`` with :meth:`Events.emit` in its fenced transaction.  The
pipeline's extensions are imported on first use, so that the cluster and
``chalk events`` do not import the pipeline.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from listener_router._config import EventSettings
from listener_router.events._events import (
    APPLICATION_HEADER,
    TOPIC_HEADER,
    EventKind,
    Events,
    Publisher,
    event_id,
)
from listener_router.events._follow import ReceivedEvent, declare_exchange, follow

if TYPE_CHECKING:
    from listener_router.events._pipeline import CommittedEvents, FailureEvents

__all__ = [
    "APPLICATION_HEADER",
    "TOPIC_HEADER",
    "CommittedEvents",
    "EventKind",
    "EventSettings",
    "Events",
    "FailureEvents",
    "Publisher",
    "ReceivedEvent",
    "declare_exchange",
    "event_id",
    "follow",
]


def __getattr__(name: str) -> Any:
    if name in ("CommittedEvents", "FailureEvents"):
        value = getattr(importlib.import_module("listener_router.events._pipeline"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'listener_router.events' has no attribute {name!r}")
