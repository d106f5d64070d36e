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
    update,
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


def _chunks(items: Sequence[str]) -> Iterable[Sequence[str]]:
    for start in range(0, len(items), _CHUNK):
        yield items[start:start + _CHUNK]


class Outbox:
    """Inbox/outbox tables in the blackboard's database."""

    def __init__(self, engine: Engine):
        self.engine = engine
        metadata.create_all(engine)

    def seen(self, queue: str, message_ids: Sequence[str]) -> set[str]:
        """Which of these messages from ``queue`` were already committed.

        Keyed by queue too: one message fanned out to two queues is two units of work.
        """
        found: set[str] = set()
        with self.engine.connect() as conn:
            for part in _chunks(list(message_ids)):
                found.update(conn.execute(select(inbox.c.message_id).where(
                    inbox.c.queue == queue, inbox.c.message_id.in_(part))).scalars())
        return found

    @staticmethod
    def write(conn: Connection, processed: Sequence[tuple[str, str]],
              messages: Sequence[tuple[str, OutMessage]]) -> None:
        """Inside the commit transaction: record ``(message_id, queue)`` and outgoing messages."""
        now = time.time()
        if processed:
            conn.execute(inbox.insert(), [
                {"message_id": mid, "queue": q, "status": "committed", "processed_at": now}
                for mid, q in processed])
        if messages:
            conn.execute(outbox.insert(), [
                {"id": m.message_id, "message_id": mid, "exchange": m.exchange,
                 "routing_key": m.routing_key, "body": m.body.decode("utf-8"),
                 "headers": orjson.dumps(m.headers).decode(), "created_at": now, "sent_at": None}
                for mid, m in messages])

    def unsent(self, message_ids: Sequence[str] | None = None,
               older_than: float | None = None) -> list[OutMessage]:
        """Outbox rows not yet confirmed sent (for some inputs, or all older than a time)."""
        query = select(outbox).where(outbox.c.sent_at.is_(None))
        if older_than is not None:
            query = query.where(outbox.c.created_at < older_than)
        rows: list[Any] = []
        with self.engine.connect() as conn:
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
        with self.engine.begin() as conn:
            for part in _chunks(list(outgoing_ids)):
                conn.execute(update(outbox).where(outbox.c.id.in_(part)).values(sent_at=now))

    def purge(self, older_than_seconds: float) -> int:
        """Retention: drop sent outbox rows and inbox rows older than the limit."""
        limit = time.time() - older_than_seconds
        with self.engine.begin() as conn:
            count = conn.execute(delete(outbox).where(outbox.c.sent_at < limit)).rowcount or 0
            count += conn.execute(delete(inbox).where(inbox.c.processed_at < limit)).rowcount or 0
        return count
