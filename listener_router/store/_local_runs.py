"""Runs in the service's own process, and the records that must never run there again.

A small batch may run in the service's process rather than on Spark
(``local_below``, ``runs_in_service``).  There, a pipelet that crashes the
process (``os._exit``, a segfault, out of memory) takes the service down,
and one that hangs can only be abandoned.  So:

- before such a run, its messages are written to ``chalk_local_runs`` (one
  row: member, incarnation, workflow, messages with their attempts and
  records), and the row is deleted after the run returns.  A row left by an
  earlier incarnation of a member (found when it starts again, or by the
  leader failing it over) is a run that took its process down;
- the records of such a run, and of a run that hung past ``batch_timeout``,
  go to ``chalk_quarantine``, keyed by record: a quarantined record never
  runs in the service's process again — whatever message carries it next
  (the retry copy, a replay, a schedule); it runs on Spark, which isolates a
  crash or a hang.  (All records of the run are quarantined: which one did
  it is not known; the others only lose the in-process shortcut.)
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from sqlalchemy import Column, Float, Index, String, Table, Text, delete, insert, select, update
from sqlalchemy.engine import Engine

from listener_router.store._schema import CORE

__all__ = ["LocalRun", "LocalRuns", "Quarantine", "RunMessage"]

local_runs = Table(
    "chalk_local_runs", CORE.metadata,
    Column("id", String(36), primary_key=True),
    Column("member", String(255), nullable=False),
    Column("incarnation", String(64), nullable=False),
    Column("started_at", Float, nullable=False),
    Column("workflow", String(255), nullable=False),
    # JSON: [[queue, message_id, attempt, {headers}, [record IDs]], ...]
    Column("messages", Text, nullable=False),
    Index("ix_chalk_local_runs_member", "member"),
)
quarantine = Table(
    "chalk_quarantine", CORE.metadata,
    Column("record", String(512), primary_key=True),
    Column("reason", Text, nullable=False),
    Column("member", String(255), nullable=True),
    Column("at", Float, nullable=False),
)


@dataclass(frozen=True)
class RunMessage:
    """One message of a run in the service's process."""

    queue: str
    message_id: str
    attempt: int
    headers: dict[str, Any]
    records: tuple[str, ...]


@dataclass(frozen=True)
class LocalRun:
    """A run in the service's process, as written before it started."""

    id: str
    member: str
    incarnation: str
    started_at: float
    workflow: str
    messages: tuple[RunMessage, ...]

    @property
    def records(self) -> list[str]:
        return list(dict.fromkeys(r for m in self.messages for r in m.records))


class LocalRuns:
    """``chalk_local_runs``: runs in the service's process, while they run."""

    def __init__(self, engine: Engine):
        self.engine = engine

    def begin(self, member: str, incarnation: str, workflow: str,
              messages: Sequence[RunMessage]) -> str:
        """Write the run down before it starts; its ID."""
        run_id = uuid.uuid4().hex
        body = orjson.dumps([[m.queue, m.message_id, m.attempt, m.headers, list(m.records)]
                             for m in messages], default=str).decode()
        with self.engine.begin() as conn:
            conn.execute(insert(local_runs).values(
                id=run_id, member=member, incarnation=incarnation, started_at=time.time(),
                workflow=workflow, messages=body))
        return run_id

    def end(self, run_id: str) -> None:
        """The run returned (whatever its outcome): it did not take the process down."""
        with self.engine.begin() as conn:
            conn.execute(delete(local_runs).where(local_runs.c.id == run_id))

    def left(self, member: str, besides: str | None = None) -> list[LocalRun]:
        """Runs ``member`` wrote and never ended, but those of incarnation ``besides``."""
        c = local_runs.c
        query = select(local_runs).where(c.member == member)
        if besides is not None:
            query = query.where(c.incarnation != besides)
        with self.engine.connect() as conn:
            rows = conn.execute(query.order_by(c.started_at)).all()
        return [LocalRun(r.id, r.member, r.incarnation, r.started_at, r.workflow, tuple(
            RunMessage(q, mid, int(att), dict(headers), tuple(ids))
            for q, mid, att, headers, ids in orjson.loads(r.messages))) for r in rows]

    def forget(self, runs: Sequence[LocalRun]) -> None:
        if runs:
            with self.engine.begin() as conn:
                conn.execute(delete(local_runs).where(local_runs.c.id.in_([r.id for r in runs])))


class Quarantine:
    """``chalk_quarantine``: records that never run in the service's process again."""

    def __init__(self, engine: Engine):
        self.engine = engine

    def add(self, records: Sequence[str], reason: str, member: str | None, *,
            replace: bool = False) -> None:
        """Quarantine ``records`` (those already there keep their first reason, unless
        ``replace``: a record found to be the culprit after it was quarantined as a suspect)."""
        records = list(dict.fromkeys(records))
        if not records:
            return
        with self.engine.begin() as conn:
            known = set(conn.execute(select(quarantine.c.record).where(
                quarantine.c.record.in_(records))).scalars())
            if replace and known:
                conn.execute(update(quarantine).where(quarantine.c.record.in_(known)).values(
                    reason=reason[:4000], member=member, at=time.time()))
            fresh = [r for r in records if r not in known]
            if fresh:
                now = time.time()
                conn.execute(insert(quarantine), [
                    {"record": r, "reason": reason[:4000], "member": member, "at": now}
                    for r in fresh])

    def which(self, records: Sequence[str]) -> dict[str, str]:
        """Those of ``records`` that are quarantined, with the reason."""
        if not records:
            return {}
        c = quarantine.c
        with self.engine.connect() as conn:
            return dict(conn.execute(select(c.record, c.reason).where(
                c.record.in_(list(dict.fromkeys(records))))).all())
