"""Dead letters kept in the database (``chalk_dead_letters``), moved there from ``Q.dlq``.

Browsing a queue means taking messages and giving them back, and on a
quorum queue every message given back counts as a delivery: with a
delivery limit (the queue's, or a policy's), browsing would drop dead
letters.  So ``chalk dlq`` moves them out of the queue into this table
(``_letters``) and reads them here.  A row is
keyed by the input queue and the message ID: taking the same dead letter
twice (the mover died between its commit and its ack) writes the same row,
and a message dead-lettered again after a replay replaces its old row.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from sqlalchemy import (
    Column,
    Float,
    Integer,
    LargeBinary,
    String,
    Table,
    Text,
    delete,
    func,
    or_,
    select,
    type_coerce,
)
from sqlalchemy.engine import Engine

from listener_router.store import Schema

__all__ = ["DeadLetter", "DeadLetters", "dead_letters"]

SCHEMA = Schema("dead_letters")

dead_letters = Table(
    "chalk_dead_letters", SCHEMA.metadata,
    Column("queue", String(255), primary_key=True),       # the input queue it failed on
    Column("message_id", String(255), primary_key=True),
    Column("kept_at", Float, nullable=False),             # when it left Q.dlq
    Column("attempts", Integer, nullable=False),
    Column("workflow", String(255), nullable=False),
    Column("error", Text, nullable=False),
    Column("headers", Text, nullable=False),              # JSON object
    Column("content_type", String(255), nullable=True),
    Column("body", LargeBinary, nullable=False),
)


@dataclass(frozen=True)
class DeadLetter:
    """One dead letter: the message as it failed, and why."""

    queue: str
    message_id: str
    error: str
    attempts: int
    workflow: str
    headers: dict[str, Any]
    body: bytes
    content_type: str | None = None
    kept_at: float = 0.0
    size: int | None = None    # the whole body's bytes, when ``body`` holds only its start

    @property
    def body_size(self) -> int:
        return len(self.body) if self.size is None else self.size

    @property
    def whole(self) -> bool:
        """Whether ``body`` is the whole body (not only its start)."""
        return self.size is None or self.size <= len(self.body)


def _headers_text(headers: dict[str, Any]) -> str:
    try:
        return orjson.dumps(headers, default=str).decode()
    except orjson.JSONEncodeError as e:  # nested past orjson's limit: keep the letter anyway
        return orjson.dumps({"(unreadable headers)": str(e)}).decode()


def _row(letter: DeadLetter, now: float) -> dict[str, Any]:
    return {"queue": letter.queue, "message_id": letter.message_id, "kept_at": now,
            "attempts": letter.attempts, "workflow": letter.workflow, "error": letter.error,
            "headers": _headers_text(letter.headers),
            "content_type": letter.content_type, "body": letter.body}


def _headers(text: str) -> dict[str, Any]:
    try:
        found = orjson.loads(text)
    except orjson.JSONDecodeError as e:  # one row's, never the others': say so in its place
        return {"(unreadable headers)": str(e)}
    return found if isinstance(found, dict) else {"(headers)": found}


def _letter(row: Any) -> DeadLetter:
    size = getattr(row, "size", None)
    return DeadLetter(row.queue, row.message_id, row.error, row.attempts, row.workflow,
                      _headers(row.headers), bytes(row.body), row.content_type, row.kept_at,
                      None if size is None else int(size))


class DeadLetters:
    """The dead-letter table (see the module doc)."""

    def __init__(self, engine: Engine):
        SCHEMA.create(engine)
        self.engine = engine

    def keep(self, letters: Sequence[DeadLetter]) -> None:
        """Write ``letters`` in one transaction (a row already there is replaced)."""
        if not letters:
            return
        # the last of one message's copies wins (a message can die twice before it is moved)
        letters = list({(x.queue, x.message_id): x for x in letters}.values())
        now = time.time()
        with self.engine.begin() as conn:
            for letter in letters:
                conn.execute(delete(dead_letters).where(
                    dead_letters.c.queue == letter.queue,
                    dead_letters.c.message_id == letter.message_id))
            conn.execute(dead_letters.insert(), [_row(letter, now) for letter in letters])

    def list(self, queues: Sequence[str], *, limit: int | None = None,
             message_id: str | None = None, body_bytes: int | None = None) -> list[DeadLetter]:
        """Dead letters of ``queues``, the oldest first (only ``message_id``'s, when given;
        ``body_bytes``: only the start of each body is read, its whole size in ``size``)."""
        c = dead_letters.c
        columns: list[Any] = [c.queue, c.message_id, c.kept_at, c.attempts, c.workflow, c.error,
                              c.headers, c.content_type]
        if body_bytes is None:
            columns.append(c.body)
        else:
            columns += [type_coerce(func.substr(c.body, 1, body_bytes), LargeBinary).label("body"),
                        func.length(c.body).label("size")]
        query = select(*columns).where(dead_letters.c.queue.in_(list(queues)))
        if message_id is not None:
            query = query.where(dead_letters.c.message_id == message_id)
        query = query.order_by(dead_letters.c.kept_at, dead_letters.c.queue,
                               dead_letters.c.message_id)
        if limit is not None:
            query = query.limit(limit)
        with self.engine.connect() as conn:
            return [_letter(row) for row in conn.execute(query)]

    def ids_like(self, queues: Sequence[str], given: str) -> tuple[str, ...]:
        """The message IDs of ``queues``' dead letters that are ``given`` or start with it,
        whole or after a ``:`` (``7bdb77b1`` is the start of ``push:7bdb77b1…``), sorted."""
        escaped = given.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        c = dead_letters.c
        query = select(c.message_id).distinct().where(
            c.queue.in_(list(queues)),
            or_(c.message_id.like(f"{escaped}%", escape="\\"),
                c.message_id.like(f"%:{escaped}%", escape="\\")))
        with self.engine.connect() as conn:
            found = conn.execute(query.order_by(c.message_id)).scalars().all()
        return tuple(m for m in found if m == given or m.startswith(given)
                     or any(part.startswith(given) for part in m.split(":")[1:]))

    def count(self, queues: Sequence[str]) -> int:
        return sum(self.counts(queues).values())

    def counts(self, queues: Sequence[str]) -> dict[str, int]:
        """How many dead letters each of ``queues`` has here (0 for one with none)."""
        found = dict.fromkeys(queues, 0)
        c = dead_letters.c
        with self.engine.connect() as conn:
            for queue, n in conn.execute(select(c.queue, func.count()).where(
                    c.queue.in_(list(queues))).group_by(c.queue)):
                found[queue] = int(n)
        return found

    def remove(self, letters: Sequence[DeadLetter]) -> int:
        """Drop these rows (replayed or purged) unless a newer dead letter of the same message
        replaced one since it was read; returns how many went."""
        removed = 0
        with self.engine.begin() as conn:
            for letter in letters:
                removed += conn.execute(delete(dead_letters).where(
                    dead_letters.c.queue == letter.queue,
                    dead_letters.c.message_id == letter.message_id,
                    dead_letters.c.kept_at == letter.kept_at)).rowcount or 0
        return removed
