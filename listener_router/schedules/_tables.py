"""Scheduled jobs' state: the last tick of each schedule, claimed by compare-and-set.

One row per schedule (``chalk_schedules``).  ``tick`` is the last tick
claimed (its scheduled time, epoch seconds), ``done`` whether all of its
messages are written, ``cursor`` where its selection of records stopped
while it runs.  ``step`` is the row's fencing token: every change is an
``UPDATE … WHERE step = <the step read>`` that also raises it, made in the
transaction that writes the tick's messages to the outbox.  A process that
read the row before another changed it (a stale leader, a second process
that thinks it leads) changes nothing and writes nothing; so each page of
each tick is written exactly once, whoever writes it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sqlalchemy import Boolean, Column, Connection, Float, Integer, String, Table, Text, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Engine

from listener_router.store import Schema, reading

__all__ = ["ScheduleState", "Schedules", "schedules"]

SCHEMA = Schema("schedules")

schedules = Table(
    "chalk_schedules", SCHEMA.metadata,
    Column("name", String(255), primary_key=True),
    Column("tick", Float, nullable=False),            # the last tick claimed (or skipped to)
    Column("done", Boolean, nullable=False),          # all of its messages written
    Column("cursor", Text, nullable=True),            # the running tick's place in the selection
    Column("step", Integer, nullable=False),          # raised by every change: the fencing token
    Column("messages", Integer, nullable=False),      # of the last tick, written so far
    Column("records", Integer, nullable=False),
    Column("skipped", Integer, nullable=False),       # missed ticks not run (catch_up), in all
    Column("started_at", Float, nullable=True),       # when the last tick was claimed
    Column("finished_at", Float, nullable=True),
    Column("member", String(255), nullable=True),     # who wrote the last change
)


@dataclass(frozen=True)
class ScheduleState:
    name: str
    tick: float
    done: bool
    cursor: str | None
    step: int
    messages: int
    records: int
    skipped: int
    started_at: float | None
    finished_at: float | None
    member: str | None


class Schedules:
    """Reads and conditional writes of ``chalk_schedules`` (see the module doc)."""

    def __init__(self, engine: Engine):
        SCHEMA.create(engine)
        self.engine = engine

    def read(self, name: str) -> ScheduleState | None:
        with reading(self.engine) as conn:
            row = conn.execute(select(schedules).where(schedules.c.name == name)).first()
        return None if row is None else ScheduleState(**row._mapping)

    def all(self) -> dict[str, ScheduleState]:
        with reading(self.engine) as conn:
            return {r.name: ScheduleState(**r._mapping) for r in conn.execute(select(schedules))}

    @staticmethod
    def create(conn: Connection, name: str, tick: float, member: str) -> bool:
        """A new schedule starts as if ``tick`` had run; False when the row exists."""
        insert = postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert
        made = conn.execute(insert(schedules).values(
            name=name, tick=tick, done=True, cursor=None, step=0, messages=0, records=0,
            skipped=0, started_at=None, finished_at=None, member=member).on_conflict_do_nothing())
        return made.rowcount == 1

    @staticmethod
    def _change(conn: Connection, seen: ScheduleState, **values: object) -> bool:
        c = schedules.c
        done = conn.execute(schedules.update()
                            .where(c.name == seen.name, c.step == seen.step)
                            .values(step=seen.step + 1, **values)).rowcount
        return done == 1

    def claim(self, conn: Connection, seen: ScheduleState, tick: float, member: str,
              skipped: int = 0) -> bool:
        """Start ``tick`` (the row must still be as ``seen``, its tick done), counting
        ``skipped`` ticks passed over on the way."""
        assert seen.done
        return self._change(conn, seen, tick=tick, done=False, cursor=None, messages=0,
                            records=0, skipped=seen.skipped + skipped, started_at=time.time(),
                            finished_at=None, member=member)

    def skip(self, conn: Connection, seen: ScheduleState, tick: float, ticks: int,
             member: str) -> bool:
        """Skip to ``tick`` without running the ``ticks`` missed ones (catch_up)."""
        assert seen.done
        return self._change(conn, seen, tick=tick, skipped=seen.skipped + ticks, member=member)

    def advance(self, conn: Connection, seen: ScheduleState, cursor: str | None, messages: int,
                records: int, done: bool, member: str) -> bool:
        """Record a page of the running tick written (``done``: its last)."""
        assert not seen.done
        return self._change(conn, seen, cursor=cursor, messages=seen.messages + messages,
                            records=seen.records + records, done=done, member=member,
                            finished_at=time.time() if done else None)
