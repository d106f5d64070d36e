"""The cluster's table: one row per live service process (``chalk_nodes``)."""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass

from sqlalchemy import Column, Float, Integer, String, Table, delete, select
from sqlalchemy.engine import Engine

from listener_router.store._schema import metadata

__all__ = ["Member", "Nodes", "nodes"]

nodes = Table(
    "chalk_nodes", metadata,
    Column("name", String(255), primary_key=True),
    Column("host", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("started_at", Float, nullable=False),
    Column("heartbeat_at", Float, nullable=False),
)


@dataclass(frozen=True)
class Member:
    name: str
    host: str
    pid: int
    started_at: float
    heartbeat_at: float


class Nodes:
    """Heartbeat rows: write ours, read the live ones, drop the dead."""

    def __init__(self, engine: Engine):
        self.engine = engine

    def beat(self, name: str, started_at: float) -> None:
        """Write ``name``'s heartbeat (its row made when absent)."""
        now = time.time()
        pid = os.getpid()
        with self.engine.begin() as conn:
            updated = conn.execute(nodes.update().where(nodes.c.name == name).values(
                heartbeat_at=now, pid=pid, started_at=started_at)).rowcount
            if not updated:
                conn.execute(nodes.insert().values(
                    name=name, host=socket.gethostname(), pid=pid, started_at=started_at,
                    heartbeat_at=now))

    def live(self, ttl: float) -> list[Member]:
        """Members whose heartbeat is younger than ``ttl``, the earliest started first."""
        cutoff = time.time() - ttl
        with self.engine.connect() as conn:
            rows = conn.execute(select(nodes).where(nodes.c.heartbeat_at >= cutoff)
                                .order_by(nodes.c.started_at, nodes.c.name)).all()
        return [Member(r.name, r.host, r.pid, r.started_at, r.heartbeat_at) for r in rows]

    def leave(self, name: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(delete(nodes).where(nodes.c.name == name))

    def forget(self, older_than: float) -> int:
        """Drop rows of members silent for longer than ``older_than`` seconds."""
        with self.engine.begin() as conn:
            return conn.execute(delete(nodes).where(
                nodes.c.heartbeat_at < time.time() - older_than)).rowcount or 0
