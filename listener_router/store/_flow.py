"""What operators set on the lanes, kept where every member reads it: paused queues,
cancellations, and the keys an ordered queue holds for a message being retried.

- ``chalk_lanes``: a row per queue an operator paused or resumed (``chalk
  queue pause|resume``); a paused lane takes nothing new on any member, and
  stays paused across restarts.
- ``chalk_cancelled``: cancellations (``chalk jobs cancel``): of a message
  ID, of every message ID with a prefix (a schedule's tick), of the messages
  naming a record published by the time it was made (``queued``), or of
  every message naming a record (``record``, lasting: until a time or
  withdrawn).  A cancelled message is acked
  without running, or its instance is invalidated before its commit.
- ``chalk_pushed``: the message IDs ``chalk push`` published lately (what
  ``chalk jobs cancel`` knows of a message still queued).
- ``chalk_ordered_keys``: for a queue with ``ordered_by``, the keys of a
  message that failed and waits for its retry: later messages with one of
  those keys wait until it commits or is dead-lettered, on whichever member.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Connection,
    Float,
    Index,
    Integer,
    String,
    Table,
    Text,
    delete,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.engine import Engine

from listener_router.store._schema import CORE

__all__ = ["Cancellation", "Cancellations", "LaneState", "LaneStates", "OrderedKeys", "Pushed"]

lanes = Table(
    "chalk_lanes", CORE.metadata,
    Column("queue", String(255), primary_key=True),
    Column("paused", Boolean, nullable=False),
    Column("changed_at", Float, nullable=False),
    Column("changed_by", String(255), nullable=True),
    Column("reason", Text, nullable=True),
)
cancelled = Table(
    "chalk_cancelled", CORE.metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
           autoincrement=True),
    Column("kind", String(16), nullable=False),    # message | prefix | record | queued
    Column("value", String(512), nullable=False),
    Column("at", Float, nullable=False),
    Column("until", Float, nullable=True),         # a record's cancellation ends then
    Column("by", String(255), nullable=True),
    Index("ix_chalk_cancelled_value", "kind", "value"),
)
pushed = Table(
    "chalk_pushed", CORE.metadata,
    Column("message_id", String(255), primary_key=True),
    Column("queue", String(255), nullable=False),
    Column("at", Float, nullable=False),
    Index("ix_chalk_pushed_at", "at"),
)
ordered_keys = Table(
    "chalk_ordered_keys", CORE.metadata,
    Column("queue", String(255), primary_key=True),
    Column("key", String(512), primary_key=True),
    Column("message_id", String(255), nullable=False),
    Column("at", Float, nullable=False),
)

# record: the messages naming it, until withdrawn or ``until``; queued: the messages naming
# it published up to the cancellation (``at``), not those published later.
KINDS = ("message", "prefix", "record", "queued")


@dataclass(frozen=True)
class LaneState:
    queue: str
    paused: bool
    changed_at: float
    changed_by: str | None
    reason: str | None


class LaneStates:
    """``chalk_lanes``: which queues are paused."""

    def __init__(self, engine: Engine):
        self.engine = engine

    def put(self, queue: str, paused: bool, *, by: str | None, reason: str | None = None
            ) -> None:
        values = {"paused": paused, "changed_at": time.time(), "changed_by": by,
                  "reason": reason}
        with self.engine.begin() as conn:
            if not conn.execute(update(lanes).where(lanes.c.queue == queue)
                                .values(**values)).rowcount:
                conn.execute(insert(lanes).values(queue=queue, **values))

    def all(self) -> dict[str, LaneState]:
        with self.engine.connect() as conn:
            return {r.queue: LaneState(r.queue, bool(r.paused), r.changed_at, r.changed_by,
                                       r.reason) for r in conn.execute(select(lanes))}

    def paused(self) -> set[str]:
        return {q for q, state in self.all().items() if state.paused}


@dataclass(frozen=True)
class Cancellation:
    id: int
    kind: str
    value: str
    at: float
    until: float | None
    by: str | None


class Cancellations:
    """``chalk_cancelled``: what operators cancelled."""

    def __init__(self, engine: Engine):
        self.engine = engine

    def add(self, kind: str, values: Iterable[str], *, by: str | None,
            until: float | None = None) -> int:
        if kind not in KINDS:
            raise ValueError(f"a cancellation is of a {', a '.join(KINDS)}, not {kind!r}")
        now = time.time()
        rows = [{"kind": kind, "value": v, "at": now, "until": until, "by": by}
                for v in dict.fromkeys(values) if v]
        if rows:
            with self.engine.begin() as conn:
                conn.execute(insert(cancelled), rows)
        return len(rows)

    def active(self, now: float | None = None) -> list[Cancellation]:
        now = time.time() if now is None else now
        c = cancelled.c
        with self.engine.connect() as conn:
            rows = conn.execute(select(cancelled).where(or_(c.until.is_(None), c.until > now))
                                .order_by(c.id)).all()
        return [Cancellation(r.id, r.kind, r.value, r.at, r.until, r.by) for r in rows]

    def withdraw(self, kind: str, values: Sequence[str]) -> int:
        c = cancelled.c
        with self.engine.begin() as conn:
            return conn.execute(delete(cancelled).where(c.kind == kind,
                                                        c.value.in_(list(values)))).rowcount

    def purge(self, older_than_seconds: float) -> int:
        """Drop cancellations of messages older than the history kept (their messages are
        long gone) and records' that ended."""
        c = cancelled.c
        now = time.time()
        with self.engine.begin() as conn:
            return conn.execute(delete(cancelled).where(or_(
                c.at < now - older_than_seconds, c.until < now))).rowcount


class Pushed:
    """``chalk_pushed``: the message IDs ``chalk push`` published, for ``[node]
    retention_days``, so that ``chalk jobs cancel`` knows one still queued (a message
    nobody ran yet is in no other table)."""

    def __init__(self, engine: Engine):
        self.engine = engine

    def add(self, queue: str, message_ids: Sequence[str], *, keep_seconds: float) -> None:
        """Remember ``message_ids`` (published to ``queue`` now); forget those older than
        ``keep_seconds``."""
        now = time.time()
        c = pushed.c
        with self.engine.begin() as conn:
            conn.execute(delete(pushed).where(c.at < now - keep_seconds))
            for start in range(0, len(message_ids), 1000):
                conn.execute(insert(pushed), [{"message_id": m, "queue": queue, "at": now}
                                              for m in message_ids[start:start + 1000]])

    def known(self, message_ids: Sequence[str]) -> dict[str, str]:
        """Which of ``message_ids`` were pushed, with the queue of each."""
        c = pushed.c
        found: dict[str, str] = {}
        with self.engine.connect() as conn:
            for start in range(0, len(message_ids), 500):
                part = list(message_ids[start:start + 500])
                found.update((r.message_id, r.queue) for r in conn.execute(
                    select(c.message_id, c.queue).where(c.message_id.in_(part))))
        return found


class OrderedKeys:
    """``chalk_ordered_keys``: keys an ordered queue holds for a message being retried."""

    def __init__(self, engine: Engine):
        self.engine = engine

    @staticmethod
    def hold(conn: Connection, queue: str, keys: Iterable[str], message_id: str) -> None:
        """``message_id`` holds ``keys`` until :meth:`free` (in the caller's transaction)."""
        now = time.time()
        c = ordered_keys.c
        for key in dict.fromkeys(keys):
            if not conn.execute(update(ordered_keys).where(c.queue == queue, c.key == key)
                                .values(message_id=message_id, at=now)).rowcount:
                conn.execute(insert(ordered_keys).values(queue=queue, key=key,
                                                         message_id=message_id, at=now))

    @staticmethod
    def free(conn: Connection, queue: str, message_ids: Sequence[str]) -> None:
        """The keys these messages held (in the caller's transaction)."""
        if message_ids:
            c = ordered_keys.c
            conn.execute(delete(ordered_keys).where(c.queue == queue,
                                                    c.message_id.in_(list(message_ids))))

    def holding(self, queue: str, keys: Sequence[str]) -> dict[str, str]:
        """Those of ``keys`` a message being retried holds, with its message ID."""
        if not keys:
            return {}
        c = ordered_keys.c
        with self.engine.connect() as conn:
            return dict(conn.execute(select(c.key, c.message_id).where(
                c.queue == queue, c.key.in_(list(dict.fromkeys(keys))))).all())
