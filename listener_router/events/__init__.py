"""Distributed events: the ``chalk.events`` topic exchange (see ``_kinds`` for the model).

A plug-in (``_plugin``: :class:`EventsPlugin`) built when ``[events]``
(``_settings``) turns any kind on:

- ``_kinds``: :class:`EventKind`, :class:`Events` (makes and emits a member's
  events into a transaction's outbox), :func:`event_id` (deterministic IDs);
- ``_plugin``: where the service writes them (commit transactions, settled
  failures, the leader's view, and :meth:`EventsPlugin.emit` for the scheduler);
- ``_follow``: a live subscriber (``chalk events --follow``).

Names are imported on first use, so that reading the settings (which loads
``_settings``) does not import the pipeline.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from listener_router._lazy import lazy_names

if TYPE_CHECKING:
    from listener_router.events._follow import ReceivedEvent, declare_exchange, follow
    from listener_router.events._kinds import (
        APPLICATION_HEADER,
        TOPIC_HEADER,
        EventKind,
        Events,
        Publisher,
        event_id,
    )
    from listener_router.events._plugin import EventsPlugin
    from listener_router.events._settings import EVENTS_EXCHANGE, EventSettings

_HOMES = {
    "APPLICATION_HEADER": "_kinds", "TOPIC_HEADER": "_kinds", "EventKind": "_kinds",
    "Events": "_kinds", "Publisher": "_kinds", "event_id": "_kinds",
    "EventsPlugin": "_plugin", "EVENTS_EXCHANGE": "_settings", "EventSettings": "_settings",
    "ReceivedEvent": "_follow", "declare_exchange": "_follow", "follow": "_follow",
}

__all__ = [
    "APPLICATION_HEADER",
    "EVENTS_EXCHANGE",
    "TOPIC_HEADER",
    "EventKind",
    "EventSettings",
    "Events",
    "EventsPlugin",
    "Publisher",
    "ReceivedEvent",
    "declare_exchange",
    "event_id",
    "follow",
]

__getattr__, __dir__ = lazy_names(__name__, _HOMES, __all__, globals())
