"""The cluster: membership with heartbeats, a stable fenced leader, views, failover, leader tasks.

``_membership``: every service process writes a heartbeat and advertises
its properties; the leader holds a fencing epoch, fails over members whose
heartbeat lapsed and establishes the view; :meth:`Membership.fenced` is the
transaction all leader work runs in.  ``_views``: the view and the
topology events in-process listeners hear.  ``_failover``: what the leader
does for a member that is gone.  ``_leader``: periodic tasks only the
leader runs (today's maintenance; a scheduler is one more task).
"""

from listener_router.cluster._failover import FailedOver, Failover
from listener_router.cluster._leader import (
    MAINTAIN_EVERY,
    ORPHAN_AGE,
    ExpiredLeases,
    ForgetDeadMembers,
    LeaderTask,
    LeaderTasks,
    OrphanedOutbox,
    Retention,
)
from listener_router.cluster._membership import (
    LeaderTransaction,
    Membership,
    OnView,
    claim_node_name,
)
from listener_router.cluster._views import (
    ClusterView,
    MemberDescription,
    TopologyEvent,
    TopologyEventType,
    TopologyListener,
    TopologyListeners,
    ViewChange,
)

__all__ = [
    "MAINTAIN_EVERY",
    "ORPHAN_AGE",
    "ClusterView",
    "ExpiredLeases",
    "FailedOver",
    "Failover",
    "ForgetDeadMembers",
    "LeaderTask",
    "LeaderTasks",
    "LeaderTransaction",
    "MemberDescription",
    "Membership",
    "OnView",
    "OrphanedOutbox",
    "Retention",
    "TopologyEvent",
    "TopologyEventType",
    "TopologyListener",
    "TopologyListeners",
    "ViewChange",
    "claim_node_name",
]
