"""The core's own tables in the blackboard's database: inbox, outbox, nodes, cluster,
workflow versions and what operators set on the lanes.

:class:`ServiceStore` is the one interface the rest of the service uses
(``_store``); each table lives in a module of its own (``_outbox`` holds the
inbox and the outbox, ``_nodes`` the members' heartbeats, ``_cluster`` the
leader, its fencing epoch and the established view, ``_versions`` the
workflow versions each process runs, ``_flow`` what
operators set on the lanes: paused queues, cancellations, the message IDs chalk push
published, ordered keys; ``_secrets`` the cluster's keys) and ``_schema`` creates and upgrades
them (a feature's tables are its own: a :class:`Schema` next to the feature,
reached with :meth:`ServiceStore.tables`).  Database errors become the
service's :class:`~listener_router.StoreUnavailable` (retry later) or
:class:`~listener_router.CommitRefused` (the data's fault) here.
"""

from listener_router.store._cluster import ClusterRow, ClusterState
from listener_router.store._flow import (
    Cancellation,
    Cancellations,
    LaneState,
    LaneStates,
    OrderedKeys,
    Pushed,
)
from listener_router.store._nodes import Member, Nodes
from listener_router.store._outbox import INBOX, InboxLog, InboxLogRow, Outbox
from listener_router.store._schema import CORE, Schema, reading, row_as
from listener_router.store._secrets import Secrets
from listener_router.store._store import ServiceStore, commit_failure, unavailable
from listener_router.store._versions import RunningVersion, WorkflowVersions

__all__ = ["CORE", "INBOX", "Cancellation", "Cancellations", "ClusterRow", "ClusterState",
           "LaneState", "LaneStates", "OrderedKeys", "Pushed", "InboxLog", "InboxLogRow", "Member",
           "Nodes", "Outbox", "RunningVersion", "Schema", "Secrets", "ServiceStore", "WorkflowVersions",
           "commit_failure", "reading", "row_as", "unavailable"]
