"""Events of scheduled jobs: ``job.finished.<schedule>`` on the events exchange.

:func:`job_finished_events` is called once per tick, in the transaction that
writes the tick's last page of messages to the outbox; the event it returns
goes into that page's outbox batch, so it is published (with confirms, again
after a crash) exactly when the tick's work is all written.  Its ID is
derived from the schedule and the tick (:meth:`Events.message` with that
key), so a page published twice gives subscribers one event.  Nothing is
written when ``[events] job_finished`` is off.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from listener_router.broker import OutMessage
from listener_router.events import EventKind
from listener_router.schedules._settings import ScheduleRule
from listener_router.schedules._ticks import tick_label

if TYPE_CHECKING:
    from listener_router.events import Events

__all__ = ["job_finished_events", "job_finished_payload"]


def job_finished_payload(schedule: ScheduleRule, tick: float, messages: int, records: int,
                         member: str) -> dict[str, Any]:
    """What a ``job.finished.<schedule>`` event says about a finished tick."""
    return {"schedule": schedule.name, "tick": tick_label(tick), "queue": schedule.queue,
            "workflow": schedule.workflow, "messages": messages, "records": records,
            "member": member}


def job_finished_events(events: Events | None, schedule: ScheduleRule, tick: float,
                        messages: int, records: int, member: str) -> list[OutMessage]:
    """The event to publish with a finished tick's last page (see the module doc)."""
    if events is None:
        return []
    event = events.message(EventKind.JOB_FINISHED, schedule.name,
                           job_finished_payload(schedule, tick, messages, records, member),
                           key=(schedule.name, tick_label(tick)))
    return [] if event is None else [event]
