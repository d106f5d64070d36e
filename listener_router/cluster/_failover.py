"""Failover: what the leader does, at once, for a member whose heartbeat lapsed.

It runs inside the leader's fenced transaction that establishes the view
without that member, so the view changes exactly when the failover is done:

- the member's record leases are dropped (they would otherwise block its
  redelivered messages on the other members for ``lease_seconds``);
- its outbox batches never confirmed sent are read, to be published once the
  transaction commits (instead of after the orphan age).

A member that was only frozen and wakes up later does no harm: its commits
need leases it no longer holds and the versions it loaded (another member
that took a record over commits first, or refuses it), its inputs committed
elsewhere are in the inbox, and its re-published batches carry the same
message IDs.  A member restarted under the same name keeps its leases (it
takes them over itself); only the batches its earlier incarnation left are
published.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from sqlalchemy import Connection

from listener_router.broker import OutMessage
from listener_router.store import Member, Outbox, ServiceStore

__all__ = ["Failover", "FailedOver"]

log = logging.getLogger(__name__)


@dataclass
class FailedOver:
    """What a failover did: leases dropped, orphaned batches to publish after the commit."""

    members: list[str] = field(default_factory=list)
    leases: int = 0
    batches: dict[str, list[OutMessage]] = field(default_factory=dict)


class Failover:
    """Drops a gone member's leases and collects its unsent outbox batches (module doc)."""

    def __init__(self, store: ServiceStore):
        self.store = store

    def run(self, conn: Connection, name: str, back: Member | None,
            done: FailedOver | None = None) -> FailedOver:
        """Fail over member ``name`` inside ``conn``'s transaction; ``back`` is its new
        incarnation when it was restarted (then its leases are its own again)."""
        done = done if done is not None else FailedOver()
        done.members.append(name)
        if back is None:
            done.leases += self.store.sql.drop_leases(conn, owners=[name])
            orphans = Outbox.unsent_written_by(conn, name)
        else:
            orphans = Outbox.unsent_written_by(conn, name, before=back.joined_at)
        done.batches.update(orphans)
        return done
