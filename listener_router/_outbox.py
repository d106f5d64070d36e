"""Inbox and outbox: the offsets stored with the data.

In the transaction that commits a batch's records the service also writes
the IDs of the messages it processed (inbox) and the messages it is going to
send (outbox).  A redelivered message found in the inbox is not processed
again: its unsent outbox rows are published and it is acked.  Outbox rows
are marked sent after the broker confirmed them.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

import orjson
from sqlalchemy import (
    Column,
    Connection,
    Float,
    Index,
    MetaData,
    String,
    Table,
    Text,
    delete,
    select,
)
from sqlalchemy.engine import Engine

from listener_router._amqp import OutMessage

__all__ = ["Outbox", "inbox", "outbox"]

metadata = MetaData()

inbox = Table(
    "chalk_inbox", metadata,
    Column("queue", String(255), primary_key=True),
    Column("message_id", String(255), primary_key=True),
    Column("status", String(16), nullable=False),  # committed | dead
    Column("processed_at", Float, nullable=False),
)
outbox = Table(
    "chalk_outbox", metadata,
    Column("id", String(255), primary_key=True),
    Column("message_id", String(255), nullable=False),
    Column("exchange", String(255), nullable=False),
    Column("routing_key", String(255), nullable=False),
    Column("body", Text, nullable=False),
    Column("headers", Text, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("sent_at", Float, nullable=True),
    Index("ix_chalk_outbox_message", "message_id"),
    Index("ix_chalk_outbox_unsent", "sent_at"),
)

_CHUNK = 2000

# Hot statements (once per batch) in the driver's own SQL with positional
# rows: SQLAlchemy's per-row parameter processing costs more than SQLite's
# work for a batch of a thousand.  ID sets go in as one JSON array (SQLite)
# or one text array (PostgreSQL): one statement whatever the batch size.
_INBOX_INSERT = ("INSERT INTO chalk_inbox (queue, message_id, status, processed_at) "
                 "VALUES (?, ?, 'committed', ?)")
_OUTBOX_INSERT = ("INSERT INTO chalk_outbox (id, message_id, exchange, routing_key, body, "
                  "headers, created_at, sent_at) VALUES (?, ?, ?, ?, ?, ?, ?, NULL)")
_SEEN = {
    "sqlite": "SELECT message_id FROM chalk_inbox WHERE queue = ? AND message_id IN "
              "(SELECT value FROM json_each(?))",
    "postgresql": "SELECT message_id FROM chalk_inbox WHERE queue = %s AND "
                  "message_id = ANY(%s::text[])",
}
_MARK_SENT = {
    "sqlite": "UPDATE chalk_outbox SET sent_at = ? WHERE id IN (SELECT value FROM json_each(?))",
    "postgresql": "UPDATE chalk_outbox SET sent_at = %s WHERE id = ANY(%s::text[])",
}


def _chunks(items: Sequence[str]) -> Iterable[Sequence[str]]:
    for start in range(0, len(items), _CHUNK):
        yield items[start:start + _CHUNK]


def _driver_sql(conn: Connection, sql: str) -> str:
    return sql.replace("?", "%s") if conn.dialect.name == "postgresql" else sql


class Outbox:
    """Inbox/outbox tables in the blackboard's database."""

    def __init__(self, engine: Engine):
        self.engine = engine
        metadata.create_all(engine)
        self._pg = engine.dialect.name == "postgresql"

    def _ids(self, ids: Sequence[str]) -> Any:
        return list(ids) if self._pg else orjson.dumps(list(ids)).decode()

    def _reading(self) -> Connection:
        # Read-only: on SQLite this is a plain BEGIN, not the writer's BEGIN
        # IMMEDIATE, so an inbox check never waits for a commit.
        return self.engine.connect().execution_options(chalk_readonly=True)

    def seen(self, queue: str, message_ids: Sequence[str]) -> set[str]:
        """Which of these messages from ``queue`` were already committed.

        Keyed by queue too: one message fanned out to two queues is two units of work.
        """
        found: set[str] = set()
        sql = _SEEN[self.engine.dialect.name]
        with self._reading() as conn:
            for part in _chunks(list(message_ids)):
                found.update(mid for (mid,) in conn.exec_driver_sql(sql, (queue, self._ids(part))))
        return found

    @staticmethod
    def write(conn: Connection, processed: Sequence[tuple[str, str]],
              messages: Sequence[tuple[str, OutMessage]]) -> None:
        """Inside the commit transaction: record ``(message_id, queue)`` and outgoing messages."""
        now = time.time()
        if processed:
            conn.exec_driver_sql(_driver_sql(conn, _INBOX_INSERT),
                                 [(q, mid, now) for mid, q in processed])
        if messages:
            dumps = orjson.dumps
            conn.exec_driver_sql(_driver_sql(conn, _OUTBOX_INSERT), [
                (m.message_id, mid, m.exchange, m.routing_key, m.body.decode("utf-8"),
                 dumps(m.headers).decode(), now) for mid, m in messages])

    def unsent(self, message_ids: Sequence[str] | None = None,
               older_than: float | None = None) -> list[OutMessage]:
        """Outbox rows not yet confirmed sent (for some inputs, or all older than a time)."""
        query = select(outbox).where(outbox.c.sent_at.is_(None))
        if older_than is not None:
            query = query.where(outbox.c.created_at < older_than)
        rows: list[Any] = []
        with self._reading() as conn:
            if message_ids is None:
                rows = list(conn.execute(query.order_by(outbox.c.created_at)))
            else:
                for part in _chunks(list(message_ids)):
                    rows.extend(conn.execute(query.where(outbox.c.message_id.in_(part))))
        return [OutMessage(routing_key=r.routing_key, body=r.body.encode("utf-8"),
                           message_id=r.id, headers=orjson.loads(r.headers), exchange=r.exchange)
                for r in rows]

    def mark_sent(self, outgoing_ids: Sequence[str]) -> None:
        if not outgoing_ids:
            return
        now = time.time()
        sql = _MARK_SENT[self.engine.dialect.name]
        with self.engine.begin() as conn:
            for part in _chunks(list(outgoing_ids)):
                conn.exec_driver_sql(sql, (now, self._ids(part)))

    def purge(self, older_than_seconds: float) -> int:
        """Retention: drop sent outbox rows and inbox rows older than the limit."""
        limit = time.time() - older_than_seconds
        with self.engine.begin() as conn:
            count = conn.execute(delete(outbox).where(outbox.c.sent_at < limit)).rowcount or 0
            count += conn.execute(delete(inbox).where(inbox.c.processed_at < limit)).rowcount or 0
        return count
