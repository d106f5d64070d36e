"""Reprocessing stored records through a workflow (SMILA's Recycler): ``chalk reprocess``.

A run walks a selection of stored records (the schedules'
:class:`~listener_router.schedules.Selection`: by ID prefix, source, XPath,
or a list of IDs) and publishes one message a record to a queue whose
listener rule runs the workflow, so the service runs it with its
exactly-once commit, retries, dead letters and job log.  The run's row
keeps its cursor after the last part the broker confirmed: a run stopped
or killed goes on from there, and the parts published again keep their
message IDs, which the service's inbox drops.

- ``_tables``: :class:`Runs` (``chalk_reprocess_runs``, a :class:`Schema` of its own),
  :class:`Run`, the run's life table :data:`MOVES`;
- ``_selection``: :class:`RunSelection`, what a run walks, and :func:`read_ids`
  (``--ids-from``);
- ``_target``: :func:`target_rule`, the listener rule (and so the queue) for a workflow;
- ``_begin``: :func:`begin`, a new run or an unfinished one taken up again;
- ``_run``: :class:`Reprocess`, the walk and the publishing, :class:`Pacer` (``--rate``);
- ``_views``: :func:`run_views`, runs with their progress (``--list``, the dashboard).

It runs in the ``chalk reprocess`` process, not in the service: it is no
plug-in.  Names are imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from listener_router._lazy import lazy_names

if TYPE_CHECKING:
    from listener_router.reprocess._begin import Begun, begin
    from listener_router.reprocess._run import PART, Pacer, Reprocess, message_id
    from listener_router.reprocess._selection import RunSelection, read_ids
    from listener_router.reprocess._tables import (
        MESSAGE_PREFIX,
        MOVES,
        STALE,
        Run,
        Runs,
        RunTakenOver,
    )
    from listener_router.reprocess._target import headers_for, target_rule
    from listener_router.reprocess._views import RunView, run_views

_HOMES = {
    "Begun": "_begin", "begin": "_begin", "PART": "_run", "Pacer": "_run",
    "Reprocess": "_run", "message_id": "_run", "RunSelection": "_selection",
    "read_ids": "_selection", "MESSAGE_PREFIX": "_tables", "MOVES": "_tables",
    "STALE": "_tables", "Run": "_tables", "Runs": "_tables", "RunTakenOver": "_tables",
    "headers_for": "_target", "target_rule": "_target", "RunView": "_views",
    "run_views": "_views",
}

__all__ = [
    "MESSAGE_PREFIX",
    "MOVES",
    "PART",
    "STALE",
    "Begun",
    "Pacer",
    "Reprocess",
    "Run",
    "RunSelection",
    "RunTakenOver",
    "RunView",
    "Runs",
    "begin",
    "headers_for",
    "message_id",
    "read_ids",
    "run_views",
    "target_rule",
]

__getattr__, __dir__ = lazy_names(__name__, _HOMES, __all__, globals())
