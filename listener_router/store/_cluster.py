"""The cluster's one shared row (``chalk_cluster``): leader, fencing epoch, established view.

Every change is a conditional update, so two processes that both believe
something cannot both write it:

- :meth:`ClusterState.take_over` — ``epoch = epoch + 1`` where the epoch is
  still the one the taker read: of two members that saw the leader gone, one
  wins; the epoch is the new leader's *fencing token*;
- :meth:`ClusterState.confirm` — the first statement of every leader action:
  a row update where ``leader`` and ``epoch`` are still the caller's.  It
  locks the row until the action's transaction ends, so a take-over waits
  for the action, and an action after a take-over updates nothing and is
  refused (:class:`~listener_router.NotLeader`);
- :meth:`ClusterState.establish` — the leader writes the view it agreed
  (members in order, each with its incarnation) and raises ``view_seq``.

The row is made with the schema; ``cluster_id`` is random and never changes.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import orjson
from sqlalchemy import Column, Connection, Float, Integer, String, Table, Text, select
from sqlalchemy.engine import Engine

from listener_router.store._schema import CORE, reading

__all__ = ["ClusterRow", "ClusterState", "cluster"]

cluster = Table(
    "chalk_cluster", CORE.metadata,
    Column("id", Integer, primary_key=True),          # always 1
    Column("cluster_id", String(64), nullable=False),
    Column("leader", String(255), nullable=True),
    Column("leader_incarnation", String(64), nullable=True),
    Column("epoch", Integer, nullable=False),
    Column("view_seq", Integer, nullable=False),
    Column("view_members", Text, nullable=False),     # JSON [[name, incarnation], ...]
    Column("view_at", Float, nullable=False),
    Column("checked_at", Float, nullable=False),
)


@dataclass(frozen=True)
class ClusterRow:
    """The shared row as read."""

    cluster_id: str
    leader: str | None
    leader_incarnation: str | None
    epoch: int
    view_seq: int
    view_members: tuple[tuple[str, str], ...]
    view_at: float


class ClusterState:
    """Reads and conditional updates of ``chalk_cluster`` (see the module doc)."""

    def __init__(self, engine: Engine):
        self.engine = engine

    def read(self, conn: Connection | None = None) -> ClusterRow:
        query = select(cluster).where(cluster.c.id == 1)
        if conn is not None:
            row = conn.execute(query).one()
        else:
            with reading(self.engine) as own:
                row = own.execute(query).one()
        return ClusterRow(row.cluster_id, row.leader, row.leader_incarnation, row.epoch,
                          row.view_seq, tuple(tuple(m) for m in orjson.loads(row.view_members)),
                          row.view_at)

    @staticmethod
    def take_over(conn: Connection, name: str, incarnation: str, seen_epoch: int) -> int | None:
        """Lead from now on, if nobody took over since ``seen_epoch``; the new epoch or None."""
        done = conn.execute(cluster.update().where(cluster.c.id == 1,
                                                   cluster.c.epoch == seen_epoch).values(
            leader=name, leader_incarnation=incarnation, epoch=seen_epoch + 1,
            checked_at=time.time())).rowcount
        return seen_epoch + 1 if done else None

    @staticmethod
    def confirm(conn: Connection, name: str, epoch: int) -> bool:
        """Whether ``name`` still leads at ``epoch``; locks the row for the transaction."""
        return bool(conn.execute(cluster.update().where(
            cluster.c.id == 1, cluster.c.leader == name, cluster.c.epoch == epoch)
            .values(checked_at=time.time())).rowcount)

    @staticmethod
    def establish(conn: Connection, name: str, epoch: int,
                  members: Sequence[tuple[str, str]]) -> int | None:
        """Write the agreed view (fenced by ``epoch``); its sequence number, or None."""
        done = conn.execute(cluster.update().where(
            cluster.c.id == 1, cluster.c.leader == name, cluster.c.epoch == epoch).values(
            view_seq=cluster.c.view_seq + 1, view_at=time.time(),
            view_members=orjson.dumps([list(m) for m in members]).decode())).rowcount
        if not done:
            return None
        return int(conn.execute(select(cluster.c.view_seq).where(cluster.c.id == 1)).scalar_one())

    def resign(self, name: str, epoch: int) -> None:
        """Give up leading (a clean stop): the next member takes over at its next heartbeat."""
        with self.engine.begin() as conn:
            conn.execute(cluster.update().where(
                cluster.c.id == 1, cluster.c.leader == name, cluster.c.epoch == epoch)
                .values(leader=None, leader_incarnation=None))


@CORE.upgrade
def _first_row(conn: Connection) -> None:
    """The row exists from the start (made once, under the schema lock)."""
    if conn.execute(select(cluster.c.id).where(cluster.c.id == 1)).first() is None:
        conn.execute(cluster.insert().values(
            id=1, cluster_id=uuid.uuid4().hex, leader=None, leader_incarnation=None, epoch=0,
            view_seq=0, view_members="[]", view_at=0.0, checked_at=0.0))
