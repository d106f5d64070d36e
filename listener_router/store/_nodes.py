"""The cluster's members: one row per service process (``chalk_nodes``).

A row holds the member's name (its lease owner), the *incarnation* (a random
ID made when the process starts, so a restart under the same name is told
apart), its heartbeat, when it joined the current view, and the properties it
advertises (JSON).  :meth:`Nodes.beat` refreshes the heartbeat only while it
is younger than the time-to-live; a member whose heartbeat lapsed (frozen,
cut off) *joins again*: its ``joined_at`` moves to now, so it goes to the end
of the ordered view, as a new member does.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from sqlalchemy import (
    Column,
    Connection,
    Float,
    Integer,
    String,
    Table,
    Text,
    delete,
    inspect,
    select,
    text,
)
from sqlalchemy.engine import Engine

from listener_router.store._schema import CORE, reading

__all__ = ["Member", "Nodes", "nodes"]

nodes = Table(
    "chalk_nodes", CORE.metadata,
    Column("name", String(255), primary_key=True),
    Column("host", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("started_at", Float, nullable=False),
    Column("heartbeat_at", Float, nullable=False),
    Column("joined_at", Float, nullable=True),
    Column("incarnation", String(64), nullable=True),
    Column("properties", Text, nullable=True),     # JSON object
)


@dataclass(frozen=True)
class Member:
    """One row of ``chalk_nodes`` as read."""

    name: str
    host: str
    pid: int
    started_at: float
    heartbeat_at: float
    joined_at: float = 0.0
    incarnation: str = ""
    properties: Mapping[str, Any] = field(default_factory=dict)

    def live(self, now: float, ttl: float) -> bool:
        return self.heartbeat_at >= now - ttl


class Nodes:
    """Heartbeat rows: write ours, read them all, drop the dead."""

    def __init__(self, engine: Engine):
        self.engine = engine

    def beat(self, name: str, started_at: float, *, incarnation: str = "", ttl: float = 30.0,
             properties: Mapping[str, Any] | None = None) -> bool:
        """Write ``name``'s heartbeat; True when it (re)joined.

        The heartbeat of incarnation ``incarnation`` is refreshed while it is
        younger than ``ttl``; otherwise (a new row, a restart, a lapse) the
        member joins: ``joined_at`` becomes now.  ``properties`` are written
        when given (None: unchanged).
        """
        now = time.time()
        values: dict[str, Any] = {"heartbeat_at": now, "pid": os.getpid(), "started_at": started_at}
        if properties is not None:
            values["properties"] = orjson.dumps(dict(properties)).decode()
        with self.engine.begin() as conn:
            kept = conn.execute(nodes.update().where(
                nodes.c.name == name, nodes.c.incarnation == incarnation,
                nodes.c.heartbeat_at >= now - ttl).values(**values)).rowcount
            if kept:
                return False
            values.update(joined_at=now, incarnation=incarnation, host=socket.gethostname())
            if properties is None:
                values["properties"] = "{}"
            if not conn.execute(nodes.update().where(nodes.c.name == name)
                                .values(**values)).rowcount:
                conn.execute(nodes.insert().values(name=name, **values))
        return True

    def all(self, conn: Connection | None = None) -> list[Member]:
        """Every row, in view order: the earliest joined first (then by name)."""
        query = select(nodes).order_by(nodes.c.joined_at, nodes.c.name)
        if conn is not None:
            rows = conn.execute(query).all()
        else:
            # read-only: on SQLite a plain BEGIN, not the writers' BEGIN IMMEDIATE
            with reading(self.engine) as own:
                rows = own.execute(query).all()
        return [_member(r) for r in rows]

    def live(self, ttl: float) -> list[Member]:
        """Members whose heartbeat is younger than ``ttl``, in view order."""
        now = time.time()
        return [m for m in self.all() if m.live(now, ttl)]

    def leave(self, name: str, incarnation: str | None = None) -> None:
        with self.engine.begin() as conn:
            query = delete(nodes).where(nodes.c.name == name)
            if incarnation is not None:
                query = query.where(nodes.c.incarnation == incarnation)
            conn.execute(query)

    def forget(self, older_than: float, conn: Connection | None = None) -> int:
        """Drop rows of members silent for longer than ``older_than`` seconds."""
        query = delete(nodes).where(nodes.c.heartbeat_at < time.time() - older_than)
        if conn is not None:
            return conn.execute(query).rowcount or 0
        with self.engine.begin() as own:
            return own.execute(query).rowcount or 0


def _member(row: Any) -> Member:
    return Member(row.name, row.host, row.pid, row.started_at, row.heartbeat_at,
                  row.joined_at if row.joined_at is not None else row.started_at,
                  row.incarnation or "", orjson.loads(row.properties) if row.properties else {})


@CORE.upgrade
def _upgrade(conn: Connection) -> None:
    """Rows written by an earlier Chalk have no join time, incarnation or properties."""
    have = {c["name"] for c in inspect(conn).get_columns("chalk_nodes")}
    for column, kind in (("joined_at", "FLOAT"), ("incarnation", "VARCHAR(64)"),
                         ("properties", "TEXT")):
        if column not in have:
            conn.execute(text(f"ALTER TABLE chalk_nodes ADD COLUMN {column} {kind}"))
