"""The service's own tables in the blackboard's database: inbox, outbox, nodes, cluster,
job log, schedules.

:class:`ServiceStore` is the one interface the rest of the service uses
(``_store``); each table lives in a module of its own (``_outbox`` holds the
inbox and the outbox, ``_nodes`` the members' heartbeats, ``_cluster`` the
leader, its fencing epoch and the established view, ``_joblog`` the job log and its
statistics, ``_schedules`` the scheduled jobs' ticks, ``_dead_letters`` the dead
letters ``chalk dlq`` took off the queues, ``_versions`` the workflow versions each
process runs, ``_journal`` the journal outbox) and ``_schema``
creates and upgrades them all in one place.  Database errors become the
service's :class:`~listener_router.StoreUnavailable` (retry later) or
:class:`~listener_router.CommitRefused` (the data's fault) here.
"""

from listener_router.store._cluster import ClusterRow, ClusterState
from listener_router.store._dead_letters import DeadLetter, DeadLetters
from listener_router.store._joblog import (
    COUNTED_STATES,
    JobLogTables,
    LogEntry,
    LogRow,
    StatRow,
)
from listener_router.store._journal import JournalOutbox
from listener_router.store._nodes import Member, Nodes
from listener_router.store._outbox import InboxLog, InboxLogRow, Outbox
from listener_router.store._schedules import Schedules, ScheduleState
from listener_router.store._store import ServiceStore, commit_failure, unavailable
from listener_router.store._versions import RunningVersion, WorkflowVersions

__all__ = ["COUNTED_STATES", "ClusterRow", "ClusterState", "DeadLetter",
           "DeadLetters", "InboxLog", "InboxLogRow", "JobLogTables", "JournalOutbox", "LogEntry", "LogRow", "Member", "Nodes",
           "Outbox", "RunningVersion", "ScheduleState", "Schedules", "ServiceStore", "StatRow",
           "WorkflowVersions",
           "commit_failure", "unavailable"]
