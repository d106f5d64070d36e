"""The job log: every message's life, the batches it ran in, and statistics per interval.

Tables (made by ``_schema``):

- ``chalk_job_log``: a row per step of a message that is not a commit:
  ``retrying``, ``dead``, ``duplicate``, each ``chalk process`` record
  (``processed``, ``failed``) and each replay (``replayed``); written by the
  finish stage before their messages are acked.  A unique index over
  ``(queue, message_id, round, attempt, state)`` makes writing those again
  (a crash between publishing a retry copy and acking the original) a
  no-op; ``round`` counts replays.  ``record`` is the message's first
  record ID (indexed); the others of a message with several records are in
  ``chalk_job_records``.  (Databases written by earlier versions also hold
  ``committed`` rows here; they are read as before.)
- the inbox (``chalk_inbox``, in ``_outbox``): a committed message's entry
  is the inbox row its commit writes anyway, with the log's columns
  (:class:`~listener_router.store.InboxLog`), so the log never disagrees
  with the inbox and a commit costs the log no row of its own.  Those
  entries are read as ``committed`` ones (or under the step of a plug-in
  that committed the message without a run, the inbox row's status:
  ``unchanged``), with a negative ID made from the row's key; the inbox's
  retention is the log's.
- ``chalk_job_batches``: a row per batch: member, when, and seconds by stage.
- ``chalk_job_stats``: per interval (``period``, its start), member, queue,
  workflow and metric: a count, a sum and, for durations, a
  :class:`~listener_router.jobs.Sketch` (JSON).  Counts of outcomes are
  added in the same transactions as the log rows; durations are merged
  into this member's rows from memory every few seconds.  Rows are keyed
  by member, so two members never wait for each other's row locks, and a
  reader sums over members and intervals.

Writes use the driver's SQL.  On the hot path the log adds, per committed
message, its columns on the inbox row and an entry in two partial indexes
of the inbox (time and record), and per commit one upsert of counts.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    Float,
    Index,
    Integer,
    String,
    Table,
    Text,
    and_,
    delete,
    func,
    or_,
    select,
    text,
    tuple_,
    update,
)
from sqlalchemy.engine import Engine

from listener_router.store import INBOX, Schema, reading

__all__ = ["JobLogTables", "LogEntry", "LogRow", "StatRow", "job_log",
           "job_records", "job_batches", "job_stats", "COUNTED_STATES"]

SCHEMA = Schema("jobs")

job_log = Table(
    "chalk_job_log", SCHEMA.metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
           autoincrement=True),
    Column("at", Float, nullable=False),              # when this step happened
    Column("state", String(16), nullable=False),
    Column("queue", String(255), nullable=False),
    Column("message_id", String(255), nullable=False),
    Column("round", Integer, nullable=False),         # replays before this attempt
    Column("attempt", Integer, nullable=False),       # x-chalk-attempts when received (read: +1)
    Column("workflow", String(255), nullable=True),
    Column("member", String(255), nullable=True),
    Column("batch", String(32), nullable=True),       # chalk_job_batches.id
    Column("received_at", Float, nullable=True),
    Column("record", String(512), nullable=True),     # the first record ID
    Column("records", Integer, nullable=False),       # how many records the message names
    Column("outgoing", Integer, nullable=False),      # messages routed for it (committed)
    Column("reason", Text, nullable=True),
    Column("resolved", String(16), nullable=True),    # dead letters: replayed | purged
    Column("resolved_at", Float, nullable=True),
    Index("ix_chalk_job_log_at", "at"),
    Index("ix_chalk_job_log_record", "record"),
    # The steps other than commits are few: only they are indexed by state (dead letters,
    # ``--state retrying``), and only they carry the unique index that makes writing one
    # again a no-op; a committed row pays for neither.
    Index("ix_chalk_job_log_state", "state", "at", sqlite_where=text("state <> 'committed'"),
          postgresql_where=text("state <> 'committed'")),
    Index("ux_chalk_job_log_step", "queue", "message_id", "round", "attempt", "state",
          unique=True, sqlite_where=text("state <> 'committed'"),
          postgresql_where=text("state <> 'committed'")),
)
job_records = Table(
    "chalk_job_records", SCHEMA.metadata,
    Column("record_id", String(512), primary_key=True),
    Column("queue", String(255), primary_key=True),
    Column("message_id", String(255), primary_key=True),
    Column("first_record", String(512), nullable=False),   # chalk_job_log.record
    Column("at", Float, nullable=False),
    Index("ix_chalk_job_records_at", "at"),
    sqlite_with_rowid=False,
)
job_batches = Table(
    "chalk_job_batches", SCHEMA.metadata,
    Column("id", String(32), primary_key=True),
    Column("member", String(255), nullable=False),
    Column("opened", Float, nullable=False),
    Column("finished", Float, nullable=False),
    Column("messages", Integer, nullable=False),
    Column("seconds", Text, nullable=False),          # JSON {stage: seconds}
    Index("ix_chalk_job_batches_finished", "finished"),
)
job_stats = Table(
    "chalk_job_stats", SCHEMA.metadata,
    Column("period", Float, primary_key=True),        # the interval's start (epoch seconds)
    Column("member", String(255), primary_key=True),
    Column("queue", String(255), primary_key=True),
    Column("workflow", String(255), primary_key=True),
    Column("metric", String(32), primary_key=True),   # a state, "records", "stage:<s>", "latency"
    Column("count", BigInteger, nullable=False),
    Column("total", Float, nullable=False),           # sum of the values (seconds)
    Column("sketch", Text, nullable=True),            # durations: the histogram
)

# States whose messages count in the statistics (and "records" for committed records).
COUNTED_STATES = ("committed", "unchanged", "retrying", "dead", "duplicate", "processed", "failed",
                  "cancelled", "crashed")

_COLUMNS = ("at", "state", "queue", "message_id", "round", "attempt", "workflow", "member",
            "batch", "received_at", "record", "records", "outgoing", "reason")
_INSERT = (f"INSERT INTO chalk_job_log ({', '.join(_COLUMNS)}) "
           f"VALUES ({', '.join('?' * len(_COLUMNS))})")
_INSERT_ONCE = _INSERT + " ON CONFLICT DO NOTHING"
_INSERT_RECORDS = ("INSERT INTO chalk_job_records (record_id, queue, message_id, first_record, at) "
                   "VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING")
_ADD_COUNT = (
    "INSERT INTO chalk_job_stats (period, member, queue, workflow, metric, count, total, sketch) "
    "VALUES (?, ?, ?, ?, ?, ?, 0, NULL) ON CONFLICT (period, member, queue, workflow, metric) "
    "DO UPDATE SET count = chalk_job_stats.count + excluded.count")
_PUT_SKETCH = (
    "INSERT INTO chalk_job_stats (period, member, queue, workflow, metric, count, total, sketch) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (period, member, queue, workflow, metric) "
    "DO UPDATE SET count = excluded.count, total = excluded.total, sketch = excluded.sketch")

# A log row as written: the values of _COLUMNS, in order.
LogRow = tuple[float, str, str, str, int, int, str | None, str | None, str | None,
               float | None, str | None, int, int, str | None]

@dataclass(frozen=True)
class LogEntry:
    """A job-log entry as read back.  ``id`` is a step's row ID, or for a commit (logged on
    its inbox row) a negative number made from the row's key: unique, the same at every read.

    ``attempt`` is the attempt's number, 1 for the first delivery: the rows keep
    ``x-chalk-attempts`` as the message carried it (the attempts made before), and
    reading adds one, so the log, ``chalk dlq show``, the events and the dead letter's
    ``x-chalk-attempts`` (the attempts made in all) and reason ("after 2 attempt(s)")
    count alike.
    """

    id: int
    at: float
    state: str
    queue: str
    message_id: str
    round: int
    attempt: int
    workflow: str | None
    member: str | None
    batch: str | None
    received_at: float | None
    record: str | None
    records: int
    outgoing: int
    reason: str | None
    resolved: str | None
    resolved_at: float | None


@dataclass(frozen=True)
class StatRow:
    """A statistics row as read back (``sketch`` is the JSON text, or None for counts)."""

    period: float
    member: str
    queue: str
    workflow: str
    metric: str
    count: int
    total: float
    sketch: str | None


def _sql(conn: Connection, sql: str) -> str:
    return sql.replace("?", "%s") if conn.dialect.name == "postgresql" else sql


def _entry(row: Any) -> LogEntry:
    values = {name: getattr(row, name) for name in LogEntry.__dataclass_fields__}
    values["attempt"] = (row.attempt or 0) + 1
    return LogEntry(**values)


# A logged commit, read from its inbox row as a log entry.
_LOGGED = (INBOX.c.queue, INBOX.c.message_id, INBOX.c.status, INBOX.c.processed_at,
           INBOX.c.round, INBOX.c.attempt, INBOX.c.workflow, INBOX.c.member, INBOX.c.log_batch,
           INBOX.c.received_at, INBOX.c.record, INBOX.c.records, INBOX.c.outgoing)


def _committed_id(queue: str, message_id: str) -> int:
    """The entry ID of a commit logged on its inbox row: negative (the steps' IDs count up
    from 1) and the same at every read, from the row's key."""
    digest = hashlib.blake2b(f"{queue}\0{message_id}".encode(), digest_size=8).digest()
    return -(int.from_bytes(digest, "big") >> 1) - 1


def _committed(row: Any) -> LogEntry:
    return LogEntry(id=_committed_id(row.queue, row.message_id), at=row.processed_at,
                    state=row.status, queue=row.queue, message_id=row.message_id,
                    round=row.round or 0, attempt=(row.attempt or 0) + 1, workflow=row.workflow,
                    member=row.member, batch=row.log_batch, received_at=row.received_at,
                    record=row.record, records=row.records or 0, outgoing=row.outgoing or 0,
                    reason=None, resolved=None, resolved_at=None)


def _naming(c: Any, record: str, others: Sequence[tuple[str, str, str]]) -> Any:
    """A condition on columns ``c`` (the log's or the inbox's): the message names
    ``record``, first or as one of ``others`` (``JobLogTables._others``)."""
    condition = c.record == record
    for queue, message_id, first in others:
        condition = or_(condition, and_(c.record == first, c.queue == queue,
                                        c.message_id == message_id))
    return condition


class JobLogTables:
    """Reads and writes of the job-log tables (see the module doc)."""

    def __init__(self, engine: Engine):
        SCHEMA.create(engine)
        self.engine = engine

    def _reading(self) -> Connection:
        return reading(self.engine)

    # -- writes --------------------------------------------------------------------------
    @staticmethod
    def write(conn: Connection, rows: Sequence[LogRow],
              others: Sequence[tuple[str, str, str, str, float]] = (), *,
              once: bool = False) -> None:
        """Insert log rows (``once``: skip a step already logged) and the extra record IDs
        of messages with several (``(record_id, queue, message_id, first_record, at)``)."""
        if rows:
            conn.exec_driver_sql(_sql(conn, _INSERT_ONCE if once else _INSERT), list(rows))
        if others:
            conn.exec_driver_sql(_sql(conn, _INSERT_RECORDS), list(others))

    @staticmethod
    def write_once(conn: Connection, row: LogRow) -> bool:
        """Insert one row unless its step is logged already; whether it was new."""
        return (conn.exec_driver_sql(_sql(conn, _INSERT_ONCE), row).rowcount or 0) == 1

    @staticmethod
    def add_counts(conn: Connection, member: str,
                   counts: Mapping[tuple[float, str, str, str], int]) -> None:
        """Add ``{(period, queue, workflow, metric): n}`` to ``member``'s statistics."""
        if counts:
            conn.exec_driver_sql(_sql(conn, _ADD_COUNT), [
                (period, member, queue, workflow, metric, n)
                for (period, queue, workflow, metric), n in counts.items() if n])

    @staticmethod
    def stat_rows(conn: Connection, member: str,
                  keys: Iterable[tuple[float, str, str, str]]) -> dict[tuple[float, str, str, str],
                                                                   StatRow]:
        """``member``'s stored rows for these ``(period, queue, workflow, metric)`` keys."""
        wanted = list(keys)
        found: dict[tuple[float, str, str, str], StatRow] = {}
        c = job_stats.c
        for start in range(0, len(wanted), 200):
            part = wanted[start:start + 200]
            rows = conn.execute(select(job_stats).where(
                c.member == member,
                tuple_(c.period, c.queue, c.workflow, c.metric).in_(part)))
            for r in rows:
                found[(r.period, r.queue, r.workflow, r.metric)] = StatRow(**r._mapping)
        return found

    @staticmethod
    def put_sketches(conn: Connection, member: str,
                     values: Mapping[tuple[float, str, str, str], tuple[int, float, str]]) -> None:
        """Replace ``member``'s duration rows: ``{key: (count, total, sketch JSON)}``."""
        if values:
            conn.exec_driver_sql(_sql(conn, _PUT_SKETCH), [
                (period, member, queue, workflow, metric, count, total, sketch)
                for (period, queue, workflow, metric), (count, total, sketch) in values.items()])

    @staticmethod
    def write_batches(conn: Connection, rows: Sequence[tuple[str, str, float, float, int, str]]
                      ) -> None:
        """``(id, member, opened, finished, messages, seconds JSON)`` per batch."""
        if rows:
            conn.execute(job_batches.insert(), [
                dict(zip(("id", "member", "opened", "finished", "messages", "seconds"), row,
                         strict=True)) for row in rows])

    def resolve(self, conn: Connection, queue: str, message_id: str | None, how: str) -> int:
        """Mark the unresolved dead letters of ``queue`` (one message, or all) ``how``."""
        c = job_log.c
        query = update(job_log).where(c.state == "dead", c.resolved.is_(None), c.queue == queue)
        if message_id is not None:
            query = query.where(c.message_id == message_id)
        return conn.execute(query.values(resolved=how, resolved_at=time.time())).rowcount or 0

    def replayed(self, conn: Connection, queue: str, message_id: str, replays: int,
                 reason: str) -> int:
        """A dead letter was put back on ``queue``: its entries are marked ``replayed`` and
        the message's history gets a ``replayed`` step (round ``replays``)."""
        c = job_log.c
        dead = conn.execute(select(job_log).where(
            c.state == "dead", c.queue == queue, c.message_id == message_id)
            .order_by(c.at.desc()).limit(1)).first()
        self.write_once(conn, (
            time.time(), "replayed", queue, message_id, replays,
            dead.attempt if dead else 0, dead.workflow if dead else None, None, None, None,
            dead.record if dead else None, dead.records if dead else 0, 0, reason))
        return self.resolve(conn, queue, message_id, "replayed")

    def purge(self, older_than_seconds: float) -> int:
        """Retention: drop log rows, batches and statistics older than the limit."""
        limit = time.time() - older_than_seconds
        with self.engine.begin() as conn:
            count = conn.execute(delete(job_log).where(job_log.c.at < limit)).rowcount or 0
            conn.execute(delete(job_records).where(job_records.c.at < limit))
            conn.execute(delete(job_batches).where(job_batches.c.finished < limit))
            conn.execute(delete(job_stats).where(job_stats.c.period < limit))
        return count

    # -- reads ---------------------------------------------------------------------------
    def entries(self, *, states: Sequence[str] = (), queues: Sequence[str] = (),
                workflows: Sequence[str] = (), record: str | None = None,
                message_id: str | None = None, since: float | None = None,
                until: float | None = None, unresolved: bool = False,
                resolved: str | None = None, limit: int = 50) -> list[LogEntry]:
        """The newest ``limit`` entries that match, oldest first: the steps in
        ``chalk_job_log`` and the commits on the inbox rows (``resolved``: only dead
        letters resolved so, ``replayed`` or ``purged``)."""
        c = job_log.c
        query = select(job_log)
        if resolved is not None:
            query = query.where(c.resolved == resolved)
        if states:
            query = query.where(c.state.in_(list(states)))
            if "committed" not in states:  # lets the partial index on state serve
                query = query.where(text("state <> 'committed'"))
        if unresolved:
            query = query.where(c.resolved.is_(None))
        commits = not unresolved and resolved is None
        with self._reading() as conn:
            others = self._others(conn, record) if record is not None else []

            def matching(query: Any, c: Any, at: Any) -> Any:
                conditions = [c.queue.in_(list(queues)) if queues else None,
                              c.workflow.in_(list(workflows)) if workflows else None,
                              c.message_id == message_id if message_id is not None else None,
                              at >= since if since is not None else None,
                              at <= until if until is not None else None,
                              _naming(c, record, others) if record is not None else None]
                return query.where(*(x for x in conditions if x is not None))

            found = [_entry(r) for r in conn.execute(
                matching(query, c, c.at).order_by(c.at.desc(), c.id.desc()).limit(limit))]
            if commits:
                i = INBOX.c
                logged = select(*_LOGGED).where(i.member.is_not(None))
                if states:  # committed, or a step a plug-in committed it under (unchanged)
                    logged = logged.where(i.status.in_(list(states)))
                found += [_committed(r) for r in conn.execute(
                    matching(logged, i, i.processed_at).order_by(i.processed_at.desc())
                    .limit(limit))]
        found.sort(key=lambda e: (e.at, e.id))
        return found[-limit:] if limit else []

    @staticmethod
    def _others(conn: Connection, record: str) -> list[tuple[str, str, str]]:
        """``(queue, message_id, first record)`` of the messages naming ``record`` but not
        first."""
        r = job_records.c
        return [(q, m, f) for q, m, f in conn.execute(
            select(r.queue, r.message_id, r.first_record).where(r.record_id == record))]

    def record_ids(self, entry: LogEntry) -> list[str]:
        """The record IDs of an entry's message, the first one first."""
        if entry.record is None:
            return []
        if entry.records <= 1:
            return [entry.record]
        r = job_records.c
        with self._reading() as conn:
            rest = conn.execute(select(r.record_id).where(
                r.queue == entry.queue, r.message_id == entry.message_id,
                r.first_record == entry.record)).scalars().all()
        return [entry.record, *sorted(set(rest) - {entry.record})]

    def batches(self, ids: Iterable[str]) -> dict[str, tuple[str, dict[str, float]]]:
        """For batch IDs: ``(member, seconds by stage)``."""
        wanted = sorted(set(ids))
        found: dict[str, tuple[str, dict[str, float]]] = {}
        with self._reading() as conn:
            for start in range(0, len(wanted), 500):
                for row in conn.execute(select(job_batches.c.id, job_batches.c.member,
                                               job_batches.c.seconds)
                                        .where(job_batches.c.id.in_(wanted[start:start + 500]))):
                    found[row.id] = (row.member, orjson.loads(row.seconds))
        return found

    def statistics(self, since: float | None = None, until: float | None = None
                   ) -> list[StatRow]:
        """Statistics rows of intervals starting in ``[since, until)`` (all members)."""
        c = job_stats.c
        query = select(job_stats)
        if since is not None:
            query = query.where(c.period >= since)
        if until is not None:
            query = query.where(c.period < until)
        with self._reading() as conn:
            return [StatRow(**r._mapping) for r in conn.execute(query)]

    def count(self) -> int:
        """Entries in the log: steps and logged commits."""
        with self._reading() as conn:
            steps = conn.execute(select(func.count()).select_from(job_log)).scalar_one()
            commits = conn.execute(select(func.count()).select_from(INBOX)
                                   .where(INBOX.c.member.is_not(None))).scalar_one()
        return int(steps) + int(commits)
