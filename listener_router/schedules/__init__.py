"""Scheduled jobs (the Sling scheduler model): ``[[schedule]]`` entries run by the leader.

- ``_settings``: :class:`ScheduleRule` (``[[schedule]]``), :func:`parse_every`,
  the listener rules schedules derive;
- ``_selection``: :class:`Selection`, the walk over stored records (or listed IDs) a
  page at a time, also for criteria no schedule owns (:class:`RecordFilter`; ``chalk
  reprocess`` walks with it);
- ``_ticks``, ``_scheduler``: each tick run exactly once (a
  compare-and-set on the schedule's row, ``_tables``, in the transaction
  that writes its messages to the outbox);
- ``_finished``: :func:`job_finished_events`, ``job.finished.<schedule>``;
- ``_status``: :func:`schedule_status`, each schedule's last and next tick
  (``chalk schedules`` and the page);
- ``_plugin``: :class:`SchedulesPlugin`, the scheduler as a leader task.

Names are imported on first use (reading the settings loads ``_settings`` alone).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from listener_router._lazy import lazy_names

if TYPE_CHECKING:
    from listener_router.schedules._finished import job_finished_events, job_finished_payload
    from listener_router.schedules._plugin import SchedulesPlugin
    from listener_router.schedules._scheduler import SCHEDULE_PREFIX, Scheduler, scheduled_messages
    from listener_router.schedules._selection import PAGE, Criteria, Page, RecordFilter, Selection
    from listener_router.schedules._settings import (
        ScheduleRule,
        parse_every,
        with_schedule_listeners,
    )
    from listener_router.schedules._status import ScheduleStatus, schedule_status
    from listener_router.schedules._tables import Schedules, ScheduleState
    from listener_router.schedules._ticks import Ticks, tick_label

_HOMES = {
    "job_finished_events": "_finished", "job_finished_payload": "_finished",
    "SchedulesPlugin": "_plugin", "SCHEDULE_PREFIX": "_scheduler", "Scheduler": "_scheduler",
    "scheduled_messages": "_scheduler", "PAGE": "_selection", "Selection": "_selection",
    "Criteria": "_selection", "Page": "_selection", "RecordFilter": "_selection",
    "ScheduleStatus": "_status", "schedule_status": "_status",
    "ScheduleRule": "_settings", "parse_every": "_settings",
    "with_schedule_listeners": "_settings", "Schedules": "_tables", "ScheduleState": "_tables",
    "Ticks": "_ticks", "tick_label": "_ticks",
}

__all__ = [
    "PAGE",
    "SCHEDULE_PREFIX",
    "Criteria",
    "Page",
    "RecordFilter",
    "ScheduleRule",
    "ScheduleState",
    "ScheduleStatus",
    "Scheduler",
    "Schedules",
    "SchedulesPlugin",
    "Selection",
    "Ticks",
    "job_finished_events",
    "job_finished_payload",
    "parse_every",
    "schedule_status",
    "scheduled_messages",
    "tick_label",
    "with_schedule_listeners",
]

__getattr__, __dir__ = lazy_names(__name__, _HOMES, __all__, globals())
