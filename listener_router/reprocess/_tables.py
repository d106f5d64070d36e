"""Reprocessing runs: one row each, its cursor moved by compare-and-set.

``chalk_reprocess_runs`` holds what a run was asked for (workflow, queue,
selection, rate), where it stands (the cursor after the last part whose
messages the broker confirmed, the records looked at, the messages
published, listed IDs not stored) and its state.  ``step`` is the row's
fencing token: every change is an ``UPDATE … WHERE step = <the step
read>`` that also raises it, so of two processes that both believe they
run a run, the one that read it last is the only one that moves it.

What may happen to a run (anything else is refused)::

    running  --part-->    running    a part published and confirmed, the cursor after it
    running  --last-->    finished   the selection's last part
    running  --stop-->    stopped    Ctrl-C, SIGTERM, an error: resumable
    stopped  --resume-->  running
    running  --resume-->  running    only when its process is gone (a crash, SIGKILL)

A run is ``owner``'s (``host:pid``) while it runs: it is taken over when
that process is gone (same host) or the row has not moved for
:data:`STALE` seconds (another host).
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, fields

from sqlalchemy import (
    Column,
    Connection,
    Float,
    Index,
    Integer,
    String,
    Table,
    Text,
    func,
    select,
)
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from listener_router.store import INBOX, Schema, reading, row_as

__all__ = ["MESSAGE_PREFIX", "MOVES", "STALE", "Run", "RunTakenOver", "Runs", "this_process"]

SCHEMA = Schema("reprocess")

runs = Table(
    "chalk_reprocess_runs", SCHEMA.metadata,
    Column("id", String(32), primary_key=True),
    Column("workflow", String(255), nullable=False),
    Column("queue", String(255), nullable=False),
    Column("selection", Text, nullable=False),       # canonical JSON (RunSelection)
    Column("rate", Float, nullable=True),            # messages a second at most; NULL: no limit
    Column("cursor", Text, nullable=True),           # after the last confirmed part
    Column("total", Integer, nullable=False),        # records to look at, when it started
    Column("looked", Integer, nullable=False),       # records (or listed IDs) looked at
    Column("published", Integer, nullable=False),    # messages confirmed by the broker
    Column("missing", Integer, nullable=False),      # listed IDs with no stored record
    Column("state", String(16), nullable=False),     # running, stopped, finished
    Column("note", Text, nullable=True),             # why it stopped
    Column("owner", String(255), nullable=True),     # host:pid of the process running it
    Column("step", Integer, nullable=False),         # raised by every change: the fencing token
    Column("started_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    Column("finished_at", Float, nullable=True),
    Index("ix_chalk_reprocess_runs_started", "started_at"),
)

MESSAGE_PREFIX = "reprocess:"   # message IDs are reprocess:<run>:<record>
STALE = 120.0                   # seconds without a change after which another host takes over

# (state, what happens) -> the state after it
MOVES: dict[tuple[str, str], str] = {
    ("running", "part"): "running",
    ("running", "last"): "finished",
    ("running", "stop"): "stopped",
    ("stopped", "resume"): "running",
    ("running", "resume"): "running",
}


def this_process() -> str:
    """The owner name of this process: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class Run:
    id: str
    workflow: str
    queue: str
    selection: str
    rate: float | None
    cursor: str | None
    total: int
    looked: int
    published: int
    missing: int
    state: str
    note: str | None
    owner: str | None
    step: int
    started_at: float
    updated_at: float
    finished_at: float | None

    def gone(self, now: float | None = None) -> bool:
        """Whether a running run's process is gone: it was on this host and its pid is
        not alive, or its row has not moved for :data:`STALE` seconds."""
        now = time.time() if now is None else now
        if now - self.updated_at > STALE:
            return True
        host, _, pid = (self.owner or "").rpartition(":")
        if host != socket.gethostname() or not pid.isdigit():
            return False
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return True
        except PermissionError:  # alive, someone else's
            return False
        return False

    @property
    def shown_state(self) -> str:
        """The state as an operator reads it: a running run whose process is gone is
        ``interrupted`` (resumable)."""
        return "interrupted" if self.state == "running" and self.gone() else self.state


class RunTakenOver(Exception):
    """Another process moved the run's row first: this one must stop."""


class Runs:
    """Reads and conditional writes of ``chalk_reprocess_runs`` (see the module doc)."""

    def __init__(self, engine: Engine):
        SCHEMA.create(engine)
        self.engine = engine
        self._pg = engine.dialect.name == "postgresql"

    def _reading(self) -> Connection:
        return reading(self.engine)

    def read(self, run_id: str) -> Run | None:
        with self._reading() as conn:
            row = conn.execute(select(runs).where(runs.c.id == run_id)).first()
        return None if row is None else row_as(Run, row)

    def recent(self, limit: int = 20) -> list[Run]:
        """The newest runs first."""
        with self._reading() as conn:
            rows = conn.execute(select(runs).order_by(runs.c.started_at.desc()).limit(limit))
            return [row_as(Run, r) for r in rows]

    def unfinished(self, workflow: str, queue: str, selection: str) -> Run | None:
        """The newest run of this selection that did not finish (stopped, or running)."""
        c = runs.c
        with self._reading() as conn:
            row = conn.execute(select(runs).where(
                c.workflow == workflow, c.queue == queue, c.selection == selection,
                c.state != "finished").order_by(c.started_at.desc()).limit(1)).first()
        return None if row is None else row_as(Run, row)

    def create(self, *, workflow: str, queue: str, selection: str, rate: float | None,
               total: int, owner: str) -> Run:
        """A new run, running and owned by ``owner``, with a fresh short ID."""
        now = time.time()
        for _ in range(10):
            values = dict(id=uuid.uuid4().hex[:8], workflow=workflow, queue=queue,
                          selection=selection, rate=rate, cursor=None, total=total, looked=0,
                          published=0, missing=0, state="running", note=None, owner=owner,
                          step=0, started_at=now, updated_at=now, finished_at=None)
            try:
                with self.engine.begin() as conn:
                    conn.execute(runs.insert().values(**values))
            except IntegrityError:  # that ID is taken: draw another
                continue
            return Run(**values)  # type: ignore[arg-type]
        raise RuntimeError("could not find a free run ID")

    def _change(self, seen: Run, event: str, **values: object) -> Run:
        after = MOVES.get((seen.state, event))
        if after is None:
            raise ValueError(f"run {seen.id}: cannot {event} a {seen.state} run")
        now = time.time()
        values.update(state=after, step=seen.step + 1, updated_at=now)
        if after == "finished":
            values["finished_at"] = now
        with self.engine.begin() as conn:
            moved = conn.execute(runs.update().where(runs.c.id == seen.id,
                                                     runs.c.step == seen.step)
                                 .values(**values)).rowcount
        if moved != 1:
            raise RunTakenOver(f"run {seen.id} was changed by another process "
                               "(chalk reprocess --list shows who runs it)")
        return Run(**{**{f.name: getattr(seen, f.name) for f in fields(Run)}, **values})

    def resume(self, seen: Run, owner: str, rate: float | None) -> Run:
        """Take ``seen`` (stopped, or running in a process that is gone) over for ``owner``."""
        return self._change(seen, "resume", owner=owner, rate=rate, note=None)

    def advance(self, seen: Run, cursor: str | None, looked: int, published: int,
                missing: int, last: bool) -> Run:
        """A part confirmed: the cursor after it, and the counts so far (``last``: the
        selection's last part, the run is finished)."""
        return self._change(seen, "last" if last else "part", cursor=cursor, looked=looked,
                            published=published, missing=missing)

    def stop(self, seen: Run, note: str) -> Run:
        return self._change(seen, "stop", note=note)

    def committed(self, found: Sequence[Run]) -> dict[str, int]:
        """How many of each run's messages the service committed (its inbox rows, kept for
        ``[node] retention_days``)."""
        out: dict[str, int] = {}
        c = INBOX.c
        with self._reading() as conn:
            for run in found:
                prefix = f"{MESSAGE_PREFIX}{run.id}:"
                # bytewise on SQLite: one range of the primary key; a PostgreSQL collation
                # need not keep a prefix's keys together
                where = ([c.message_id.like(prefix.replace("_", r"\_") + "%", escape="\\")]
                         if self._pg else [c.message_id >= prefix, c.message_id < prefix[:-1] + ";"])
                out[run.id] = int(conn.execute(select(func.count()).select_from(INBOX).where(
                    c.queue == run.queue, *where)).scalar_one())
        return out
