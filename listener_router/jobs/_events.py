"""Events of scheduled jobs: the one hook the events exchange is wired to.

:func:`job_finished_events` is called once per tick, in the transaction that
writes the tick's last page of messages to the outbox; the messages it
returns go into that page's outbox batch, so they are published (with
confirms, again after a crash) exactly when the tick's work is all written.
Today it returns nothing.  The cluster's events module wires it to its
topic exchange: return ``[events.job_finished(schedule.name, payload)]``
(routing key ``job.finished.<schedule>``), with the payload built here.
"""

from __future__ import annotations

from typing import Any

from listener_router._config import ScheduleRule
from listener_router.broker import OutMessage
from listener_router.jobs._ticks import tick_label

__all__ = ["job_finished_events", "job_finished_payload"]


def job_finished_payload(schedule: ScheduleRule, tick: float, messages: int, records: int,
                         member: str) -> dict[str, Any]:
    """What a ``job.finished.<schedule>`` event says about a finished tick."""
    return {"schedule": schedule.name, "tick": tick_label(tick), "queue": schedule.queue,
            "workflow": schedule.workflow, "messages": messages, "records": records,
            "member": member}


def job_finished_events(schedule: ScheduleRule, tick: float, messages: int, records: int,
                        member: str) -> list[OutMessage]:
    """The events to publish with a finished tick's last page (see the module doc)."""
    return []
