"""Inbox and outbox: the offsets stored with the data.

In the transaction that commits a batch's records the service also writes
the IDs of the messages it processed (inbox, a row per message) and the
messages it is going to send (outbox).  A redelivered message found in the
inbox is not processed again: if its outgoing messages were never confirmed
sent they are published again, and it is acked.

The outbox keeps one row per committed batch, holding all of that batch's
outgoing messages, and each inbox row names the batch its outgoing messages
are in.  Publishing is all-or-nothing per batch (one confirm wait), so "sent"
is a property of the batch: marking it is one row update, not one per
message.  Measured on SQLite, a row per outgoing message cost 15-20 µs of
CPU per message to insert and mark, more than the records' own writes: its
key is a hash, so every insert landed on a random page of a growing index.
A batch published again (its input redelivered, or found orphaned by the
leader) is published whole; its messages keep their deterministic IDs, so
receivers drop the copies they already have.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from sqlalchemy import (
    Column,
    Connection,
    Float,
    Index,
    Integer,
    String,
    Table,
    Text,
    delete,
    func,
    inspect,
    select,
    text,
    update,
)
from sqlalchemy.engine import Engine

from listener_router.broker import OutMessage
from listener_router.store._schema import CORE, reading

__all__ = ["INBOX", "InboxLog", "InboxLogRow", "Outbox", "inbox", "outbox"]

inbox = Table(
    "chalk_inbox", CORE.metadata,
    Column("queue", String(255), primary_key=True),
    Column("message_id", String(255), primary_key=True),
    # committed; or the step of a plug-in that committed it without a run (``unchanged``)
    Column("status", String(16), nullable=False),
    Column("processed_at", Float, nullable=False),
    Column("batch", String(64), nullable=True),    # the outbox batch of its outgoing messages
    # The job log's entry of the committed message (``InboxLog``; NULL when the log is
    # off): a commit is logged on the row that makes it exactly once, not on a row of
    # its own.  ``member`` is set on every logged row.
    Column("round", Integer, nullable=True),       # replays before this attempt
    Column("attempt", Integer, nullable=True),     # x-chalk-attempts when received
    Column("received_at", Float, nullable=True),
    Column("record", String(512), nullable=True),  # the first record ID
    Column("records", Integer, nullable=True),     # how many records the message names
    Column("outgoing", Integer, nullable=True),    # messages routed for it
    Column("workflow", String(255), nullable=True),
    Column("member", String(255), nullable=True),
    Column("log_batch", String(32), nullable=True),  # chalk_job_batches.id
    Index("ix_chalk_inbox_logged_at", "processed_at",
          sqlite_where=text("member IS NOT NULL"), postgresql_where=text("member IS NOT NULL")),
    Index("ix_chalk_inbox_record", "record",
          sqlite_where=text("record IS NOT NULL"), postgresql_where=text("record IS NOT NULL")),
)
INBOX = inbox  # what a feature reading the inbox (the job log) names

outbox = Table(
    "chalk_outbox_batches", CORE.metadata,
    Column("id", String(64), primary_key=True),
    Column("created_at", Float, nullable=False),
    Column("sent_at", Float, nullable=True),
    Column("size", Integer, nullable=False),       # messages in it
    # JSON: [[message_id, source message_id, exchange, routing_key, body, headers,
    #         content_type], ...]
    Column("messages", Text, nullable=False),
    Column("writer", String(255), nullable=True),  # the member that committed it (failover)
    Index("ix_chalk_outbox_batches_unsent", "sent_at"),
)

_CHUNK = 2000

# Hot statements (once per batch) in the driver's own SQL with positional
# rows: SQLAlchemy's per-row parameter processing costs more than SQLite's
# work for a batch of a thousand.  ID sets go in as one JSON array (SQLite)
# or one text array (PostgreSQL): one statement whatever the batch size.
_INBOX_INSERT = ("INSERT INTO chalk_inbox (queue, message_id, status, processed_at, batch) "
                 "VALUES (?, ?, ?, ?, ?)")
_INBOX_INSERT_LOGGED = (
    "INSERT INTO chalk_inbox (queue, message_id, status, processed_at, batch, round, attempt, "
    "received_at, record, records, outgoing, workflow, member, log_batch) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
_OUTBOX_INSERT = ("INSERT INTO chalk_outbox_batches (id, created_at, sent_at, size, messages, "
                  "writer) VALUES (?, ?, NULL, ?, ?, ?)")
_SEEN = {
    "sqlite": "SELECT message_id, batch FROM chalk_inbox WHERE queue = ? AND message_id IN "
              "(SELECT value FROM json_each(?))",
    "postgresql": "SELECT message_id, batch FROM chalk_inbox WHERE queue = %s AND "
                  "message_id = ANY(%s::text[])",
}


# One committed message's job-log values: round, attempt, received_at, first record,
# records, outgoing.
InboxLogRow = tuple[int, int, float | None, str | None, int, int]


@dataclass
class InboxLog:
    """The job-log entries of a commit's messages, written on their inbox rows: the
    values the messages share, and ``rows`` in the order of the processed messages."""

    workflow: str | None
    member: str                        # never None: a logged row is one with a member
    batch: str | None                  # chalk_job_batches.id
    rows: list[InboxLogRow] = field(default_factory=list)


def _chunks(items: Sequence[str]) -> Iterable[Sequence[str]]:
    for start in range(0, len(items), _CHUNK):
        yield items[start:start + _CHUNK]


def _driver_sql(conn: Connection, sql: str) -> str:
    return sql.replace("?", "%s") if conn.dialect.name == "postgresql" else sql


def _decode(messages: str) -> list[OutMessage]:
    return [OutMessage(routing_key=key, body=body.encode("utf-8"), message_id=mid,
                       headers=headers, exchange=exchange, content_type=content_type)
            for mid, _source, exchange, key, body, headers, content_type in orjson.loads(messages)]


class Outbox:
    """Inbox/outbox tables in the blackboard's database (made by ``_schema``)."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._pg = engine.dialect.name == "postgresql"

    def _ids(self, ids: Sequence[str]) -> Any:
        return list(ids) if self._pg else orjson.dumps(list(ids)).decode()

    def _reading(self) -> Connection:
        # Read-only: on SQLite this is a plain BEGIN, not the writer's BEGIN
        # IMMEDIATE, so an inbox check never waits for a commit.
        return reading(self.engine)

    def seen(self, queue: str, message_ids: Sequence[str]) -> dict[str, str | None]:
        """Which of these messages from ``queue`` were already committed, and the
        outbox batch of each one's outgoing messages (None: it had none).

        Keyed by queue too: one message fanned out to two queues is two units of work.
        """
        found: dict[str, str | None] = {}
        sql = _SEEN[self.engine.dialect.name]
        with self._reading() as conn:
            for part in _chunks(list(message_ids)):
                found.update(conn.exec_driver_sql(sql, (queue, self._ids(part))).all())
        return found

    @staticmethod
    def write(conn: Connection, processed: Sequence[tuple[str, str]],
              messages: Sequence[tuple[str | None, OutMessage]],
              writer: str | None = None, logged: InboxLog | None = None,
              status: Sequence[str] | None = None) -> str | None:
        """Inside the commit transaction: record ``(message_id, queue)`` and the outgoing
        ``(source message_id, message)``; returns the outbox batch (None: no messages).
        ``writer`` names the member (its node name): when it is gone, the leader
        publishes its unsent batches at once (failover).

        A message with no source (``None``: one a commit extension added for the
        batch as a whole) makes the first processed message's inbox row name the
        batch, so that a redelivery of it publishes the batch again.

        ``logged``: the job log's entries of the processed messages, one row each in
        their order, written on their inbox rows.  ``status``: each processed message's
        (default ``committed`` for all).
        """
        now = time.time()
        batch = uuid.uuid4().hex if messages else None
        if messages:
            conn.exec_driver_sql(_driver_sql(conn, _OUTBOX_INSERT), (
                batch, now, len(messages), orjson.dumps([
                    (m.message_id, source, m.exchange, m.routing_key, m.body.decode("utf-8"),
                     m.headers, m.content_type) for source, m in messages]).decode(), writer))
        if processed:
            sources = {source for source, _m in messages}
            if None in sources:
                sources.add(processed[0][0])
            states = ["committed"] * len(processed) if status is None else list(status)
            if len(states) != len(processed):
                raise ValueError(f"{len(states)} status(es) for {len(processed)} processed "
                                 "message(s)")
            if logged is None:
                conn.exec_driver_sql(_driver_sql(conn, _INBOX_INSERT), [
                    (q, mid, state, now, batch if mid in sources else None)
                    for (mid, q), state in zip(processed, states, strict=True)])
            else:
                if len(logged.rows) != len(processed):
                    raise ValueError(f"{len(logged.rows)} job-log row(s) for {len(processed)} "
                                     "processed message(s)")
                shared = (logged.workflow, logged.member, logged.batch)
                conn.exec_driver_sql(_driver_sql(conn, _INBOX_INSERT_LOGGED), [
                    (q, mid, state, now, batch if mid in sources else None, *row, *shared)
                    for (mid, q), state, row in zip(processed, states, logged.rows,
                                                    strict=True)])
        return batch

    def unsent(self, batches: Iterable[str] | None = None,
               older_than: float | None = None,
               conn: Connection | None = None) -> dict[str, list[OutMessage]]:
        """The messages of batches not yet confirmed sent, by batch (of those given,
        or all created before ``older_than``), read in ``conn``'s transaction when given."""
        query = select(outbox.c.id, outbox.c.messages).where(outbox.c.sent_at.is_(None))
        if older_than is not None:
            query = query.where(outbox.c.created_at < older_than)
        rows: list[Any] = []
        with contextlib.nullcontext(conn) if conn is not None else self._reading() as conn:
            if batches is None:
                rows = list(conn.execute(query.order_by(outbox.c.created_at)))
            else:
                for part in _chunks(sorted(set(batches))):
                    rows.extend(conn.execute(query.where(outbox.c.id.in_(part))))
        return {r.id: _decode(r.messages) for r in rows}

    @staticmethod
    def unsent_written_by(conn: Connection, writer: str,
                          before: float | None = None) -> dict[str, list[OutMessage]]:
        """Inside a transaction: the unsent batches ``writer`` committed (before ``before``)."""
        query = select(outbox.c.id, outbox.c.messages).where(
            outbox.c.sent_at.is_(None), outbox.c.writer == writer).order_by(outbox.c.created_at)
        if before is not None:
            query = query.where(outbox.c.created_at < before)
        return {r.id: _decode(r.messages) for r in conn.execute(query)}

    def mark_sent(self, batches: Sequence[str]) -> None:
        if not batches:
            return
        with self.engine.begin() as conn:
            for part in _chunks(list(batches)):
                conn.execute(update(outbox).where(outbox.c.id.in_(part))
                             .values(sent_at=time.time()))

    def unsent_count(self) -> int:
        """Outgoing messages not yet confirmed sent."""
        with self._reading() as conn:
            return int(conn.execute(select(func.coalesce(func.sum(outbox.c.size), 0))
                                    .where(outbox.c.sent_at.is_(None))).scalar_one())

    def processed_count(self) -> int:
        """Messages in the inbox (processed and kept by retention)."""
        with self._reading() as conn:
            return int(conn.execute(select(func.count()).select_from(inbox)).scalar_one())

    def recent(self, limit: int) -> list[Any]:
        """The last ``limit`` inbox rows, newest first (``message_id, queue, status,
        processed_at, batch``)."""
        with self._reading() as conn:
            return list(conn.execute(select(inbox).order_by(inbox.c.processed_at.desc())
                                     .limit(limit)).all())

    def outgoing_counts(self, processed: Sequence[tuple[str, str | None]]) -> list[int]:
        """For ``(message_id, batch)`` pairs from the inbox: how many messages each sent."""
        batches = sorted({b for _mid, b in processed if b})
        sources: dict[str, list[str]] = {}
        with self._reading() as conn:
            for part in _chunks(batches):
                for row in conn.execute(select(outbox.c.id, outbox.c.messages)
                                        .where(outbox.c.id.in_(part))):
                    sources[row.id] = [m[1] for m in orjson.loads(row.messages)]
        return [sources.get(b, []).count(mid) if b else 0 for mid, b in processed]

    def purge(self, older_than_seconds: float, conn: Connection | None = None) -> int:
        """Retention: drop sent outbox batches and inbox rows older than the limit
        (in ``conn``'s transaction when given)."""
        limit = time.time() - older_than_seconds
        with contextlib.nullcontext(conn) if conn is not None else self.engine.begin() as conn:
            count = conn.execute(delete(outbox).where(outbox.c.sent_at < limit)).rowcount or 0
            count += conn.execute(delete(inbox).where(inbox.c.processed_at < limit)).rowcount or 0
        return count


@CORE.upgrade
def _upgrade(conn: Connection) -> None:
    """Bring a database written by an earlier Chalk to this layout (idempotent).

    Earlier versions kept a row per outgoing message in ``chalk_outbox`` and
    no batch in the inbox.  Their unsent rows move into one outbox batch (so
    nothing committed goes unpublished), and the old table is dropped.  The
    inbox's job-log columns and their indexes are added where missing.
    """
    found = inspect(conn)
    have = {c["name"] for c in found.get_columns("chalk_inbox")}
    for column in inbox.columns:
        if column.name not in have:
            kind = column.type.compile(dialect=conn.dialect)
            conn.execute(text(f"ALTER TABLE chalk_inbox ADD COLUMN {column.name} {kind}"))
    for index in inbox.indexes:
        index.create(conn, checkfirst=True)
    if "writer" not in {c["name"] for c in found.get_columns("chalk_outbox_batches")}:
        conn.execute(text("ALTER TABLE chalk_outbox_batches ADD COLUMN writer VARCHAR(255)"))
    if "chalk_outbox" not in found.get_table_names():
        return
    old = conn.execute(text(
        "SELECT id, message_id, exchange, routing_key, body, headers FROM chalk_outbox "
        "WHERE sent_at IS NULL ORDER BY created_at")).all()
    if old:
        batch = uuid.uuid4().hex
        conn.execute(outbox.insert().values(
            id=batch, created_at=time.time(), sent_at=None, size=len(old),
            messages=orjson.dumps([(r.id, r.message_id, r.exchange, r.routing_key, r.body,
                                    orjson.loads(r.headers), "application/json")
                                   for r in old]).decode()))
        for part in _chunks(sorted({r.message_id for r in old})):
            conn.execute(update(inbox).where(inbox.c.message_id.in_(part)).values(batch=batch))
    conn.execute(text("DROP TABLE chalk_outbox"))
