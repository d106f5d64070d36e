"""The cluster: membership with heartbeats and a stable leader, and the leader's tasks.

``_membership``: every service process writes a heartbeat; the live member
that started first leads.  ``_leader``: periodic tasks only the leader runs
(today's maintenance; a scheduler or failover check is one more task).
"""

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
from listener_router.cluster._membership import Membership, claim_node_name

__all__ = [
    "MAINTAIN_EVERY",
    "ORPHAN_AGE",
    "ExpiredLeases",
    "ForgetDeadMembers",
    "LeaderTask",
    "LeaderTasks",
    "Membership",
    "OrphanedOutbox",
    "Retention",
    "claim_node_name",
]
