"""The job log and statistics (the Sling jobs model).

- ``_settings``: ``[jobs]``;
- ``_log``: :class:`JobLog`, a plug-in: every message's life and the
  statistics, written per batch (in the commit transaction where there is
  one); :class:`ProcessLog` for ``chalk process``;
- ``_tables``: its tables (and the inbox rows it reads);
- ``_sketch``: :class:`Sketch`, the mergeable duration histogram behind p50/p99;
- ``_read``: what ``chalk jobs``, ``chalk status`` and ``chalk dlq`` read back.

Names are imported on first use (reading the settings loads ``_settings`` alone).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from listener_router._lazy import lazy_names

if TYPE_CHECKING:
    from listener_router.jobs._log import (
        PROCESS_QUEUE,
        REPLAYS_HEADER,
        JobLog,
        JobLogRetention,
        ProcessLog,
    )
    from listener_router.jobs._read import Step, Summary, statistics, steps
    from listener_router.jobs._settings import JobsSettings
    from listener_router.jobs._sketch import ACCURACY, Sketch, merged
    from listener_router.jobs._tables import COUNTED_STATES, JobLogTables, LogEntry, LogRow, StatRow

_HOMES = {
    "PROCESS_QUEUE": "_log", "REPLAYS_HEADER": "_log", "JobLog": "_log",
    "JobLogRetention": "_log", "ProcessLog": "_log", "JobsSettings": "_settings",
    "Step": "_read", "Summary": "_read", "statistics": "_read", "steps": "_read",
    "ACCURACY": "_sketch", "Sketch": "_sketch", "merged": "_sketch",
    "COUNTED_STATES": "_tables", "JobLogTables": "_tables", "LogEntry": "_tables",
    "LogRow": "_tables", "StatRow": "_tables",
}

__all__ = [
    "ACCURACY",
    "COUNTED_STATES",
    "PROCESS_QUEUE",
    "REPLAYS_HEADER",
    "JobLog",
    "JobLogRetention",
    "JobLogTables",
    "JobsSettings",
    "LogEntry",
    "LogRow",
    "ProcessLog",
    "Sketch",
    "StatRow",
    "Step",
    "Summary",
    "merged",
    "statistics",
    "steps",
]

__getattr__, __dir__ = lazy_names(__name__, _HOMES, __all__, globals())
