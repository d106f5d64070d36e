"""Scheduled jobs and the job log (the Sling jobs model).

- ``_ticks``, ``_selection``, ``_scheduler``: ``[[schedule]]`` entries run by
  the leader, each tick exactly once (a compare-and-set on the schedule's
  row in the transaction that writes its messages to the outbox);
- ``_events``: :func:`job_finished_events`, the hook for
  ``job.finished.<schedule>`` events;
- ``_log``: :class:`JobLog`, every message's life and the statistics,
  written per batch (in the commit transaction where there is one);
- ``_sketch``: :class:`Sketch`, the mergeable duration histogram behind p50/p99;
- ``_read``: what ``chalk jobs``, ``chalk status``, ``chalk schedules`` and
  ``chalk dlq`` read back.
"""

from listener_router.jobs._events import job_finished_events, job_finished_payload
from listener_router.jobs._log import PROCESS_QUEUE, REPLAYS_HEADER, JobLog, ProcessLog
from listener_router.jobs._scheduler import SCHEDULE_PREFIX, Scheduler, scheduled_messages
from listener_router.jobs._selection import PAGE, Selection
from listener_router.jobs._sketch import ACCURACY, Sketch, merged
from listener_router.jobs._ticks import Ticks, tick_label

__all__ = [
    "ACCURACY",
    "PAGE",
    "PROCESS_QUEUE",
    "REPLAYS_HEADER",
    "SCHEDULE_PREFIX",
    "JobLog",
    "ProcessLog",
    "Scheduler",
    "Selection",
    "Sketch",
    "Ticks",
    "job_finished_events",
    "job_finished_payload",
    "merged",
    "scheduled_messages",
    "tick_label",
]
