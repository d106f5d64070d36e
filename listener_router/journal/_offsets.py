"""A subscriber's own tables, in its own database: its position, its state, its failed entries.

The offset is stored with the data: the row of a subscriber in
``chalk_journal_subscribers`` is updated in the transaction that writes
the effects of the entries it applied, so the two commit together or not
at all.  Each batch transaction first reads the row (``FOR UPDATE`` on
PostgreSQL; SQLite's writer lock serialises anyway) and goes on only when
the row still says what the agent believes (``epoch`` and ``offset``):
a second agent under the same name, or an operator's command, makes it
start over from what the row says instead of applying anything twice.

Row fields: ``offset`` (the last stream offset consumed: applied, skipped
as a copy, or sent to the error queue; NULL before the first), ``start``
(where a subscriber with no offset begins: ``first``, ``offset:N``,
``time:T``), ``not_before`` (entries published before this time are
passed over: a rewind to a time), ``seq`` (the highest entry number
applied: copies at or below it are passed over), ``state`` (``running`` or
``blocked`` with the entry or gap it is blocked at), ``epoch`` (raised by
every operator command), counts.

Commands (``chalk journal rewind|skip|retry``) write the row directly;
a running agent notices the new epoch within a second.
"""

from __future__ import annotations

import datetime
import re
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    Float,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    insert,
    inspect,
    select,
    update,
)
from sqlalchemy.engine import Engine

from listener_router._errors import InfrastructureError, UserError
from listener_router.journal._entries import Entry
from listener_router.store import reading

__all__ = ["Position", "PositionMoved", "SubscriberState", "NotBlocked", "advance", "attempts_in",
           "block", "given_up",
           "create_tables", "load_state", "peek_state", "record_error", "register", "request_retry",
           "request_rewind", "request_skip", "subscriber_state", "set_running"]

metadata = MetaData()

subscribers = Table(
    "chalk_journal_subscribers", metadata,
    Column("journal", String(100), primary_key=True),
    Column("subscriber", String(100), primary_key=True),
    Column("offset", BigInteger, nullable=True),
    Column("start", String(64), nullable=False),
    Column("not_before", Float, nullable=True),
    Column("seq", BigInteger, nullable=False),
    Column("entry_at", Float, nullable=True),         # publishing time of the last entry applied
    Column("state", String(16), nullable=False),      # running | blocked
    Column("blocked_kind", String(16), nullable=True),  # entry | gap
    Column("blocked_offset", BigInteger, nullable=True),
    Column("blocked_seq", BigInteger, nullable=True),
    Column("blocked_reason", Text, nullable=True),
    Column("blocked_entry", Text, nullable=True),
    Column("blocked_at", Float, nullable=True),
    Column("epoch", Integer, nullable=False),
    Column("applied", BigInteger, nullable=False),
    Column("errors", Integer, nullable=False),
    Column("updated_at", Float, nullable=False),
)
errors = Table(
    "chalk_journal_errors", metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
           autoincrement=True),
    Column("journal", String(100), nullable=False),
    Column("subscriber", String(100), nullable=False),
    Column("offset", BigInteger, nullable=True),
    Column("seq", BigInteger, nullable=True),
    Column("record_id", String(512), nullable=True),
    Column("reason", Text, nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("failed_at", Float, nullable=False),
    Column("entry", Text, nullable=True),
)


class PositionMoved(InfrastructureError):
    """The subscriber's row says something else than this agent believed (another agent of
    the same name, or an operator's command): start over from the row."""


class NotBlocked(UserError):
    """``skip`` asked of a subscriber that is not blocked."""


@dataclass(frozen=True, slots=True)
class Position:
    """Where an agent believes its subscriber is: what the row must still say."""

    epoch: int
    offset: int | None


@dataclass(frozen=True)
class SubscriberState:
    """A subscriber's row (see the module doc)."""

    journal: str
    subscriber: str
    offset: int | None
    start: str
    not_before: float | None
    seq: int
    entry_at: float | None
    state: str
    blocked_kind: str | None
    blocked_offset: int | None
    blocked_seq: int | None
    blocked_reason: str | None
    blocked_entry: str | None
    blocked_at: float | None
    epoch: int
    applied: int
    errors: int
    updated_at: float

    @property
    def position(self) -> Position:
        return Position(self.epoch, self.offset)

    @property
    def blocked(self) -> bool:
        return self.state == "blocked"


def create_tables(engine: Engine) -> None:
    with engine.begin() as conn:
        metadata.create_all(conn)


def _key(journal: str, subscriber: str) -> Any:
    return (subscribers.c.journal == journal) & (subscribers.c.subscriber == subscriber)


def _row(conn: Connection, journal: str, subscriber: str, *, lock: bool = False) -> Any:
    query = select(subscribers).where(_key(journal, subscriber))
    if lock and conn.dialect.name == "postgresql":
        query = query.with_for_update()
    return conn.execute(query).first()


def _state(row: Any) -> SubscriberState:
    return SubscriberState(**{c.name: getattr(row, c.name) for c in subscribers.columns})


def load_state(conn: Connection, journal: str, subscriber: str) -> SubscriberState | None:
    row = _row(conn, journal, subscriber)
    return None if row is None else _state(row)


def subscriber_state(engine: Engine, journal: str, subscriber: str) -> SubscriberState | None:
    """The subscriber's row, or None when it never ran against this database."""
    create_tables(engine)
    with reading(engine) as conn:
        return load_state(conn, journal, subscriber)


def peek_state(engine: Engine, journal: str, subscriber: str) -> SubscriberState | None:
    """The subscriber's row, read without making the tables (None: never ran there)."""
    with reading(engine) as conn:
        if not inspect(conn).has_table(subscribers.name):
            return None
        return load_state(conn, journal, subscriber)


def register(engine: Engine, journal: str, subscriber: str, start: str) -> SubscriberState:
    """The subscriber's row, made with ``start`` (and ``not_before`` for a time) when new."""
    with engine.begin() as conn:
        row = _row(conn, journal, subscriber, lock=True)
        if row is None:
            conn.execute(insert(subscribers).values(
                journal=journal, subscriber=subscriber, offset=None, start=start,
                not_before=_not_before(start), seq=0, state="running", epoch=0, applied=0,
                errors=0, updated_at=time.time()))
            row = _row(conn, journal, subscriber)
        return _state(row)


def _not_before(start: str) -> float | None:
    return float(start.partition(":")[2]) if start.startswith("time:") else None


def _check(conn: Connection, journal: str, subscriber: str, believed: Position) -> Any:
    row = _row(conn, journal, subscriber, lock=True)
    if row is None or row.epoch != believed.epoch or row.offset != believed.offset:
        found = "no row" if row is None else f"epoch {row.epoch}, offset {row.offset}"
        raise PositionMoved(f"subscriber {subscriber!r} of journal {journal!r} moved: the "
                            f"database says {found}, this agent believed epoch "
                            f"{believed.epoch}, offset {believed.offset}")
    return row


def advance(conn: Connection, journal: str, subscriber: str, believed: Position, *,
            offset: int, seq: int, entry_at: float | None, applied: int,
            passed_start: bool) -> Position:
    """Inside the effects' transaction: check the row, then move it to ``offset``."""
    row = _check(conn, journal, subscriber, believed)
    values: dict[str, Any] = {"offset": offset, "seq": max(seq, row.seq),
                              "applied": row.applied + applied, "updated_at": time.time()}
    if entry_at is not None:
        values["entry_at"] = entry_at
    if passed_start:
        values["not_before"] = None
    conn.execute(update(subscribers).where(_key(journal, subscriber)).values(**values))
    return Position(believed.epoch, offset)


def record_error(conn: Connection, journal: str, subscriber: str, believed: Position, *,
                 offset: int, seq: int | None, record_id: str | None, reason: str,
                 attempts: int, entry: str | None) -> Position:
    """Inside a transaction: an entry given up on (sent to the error queue), or a gap
    passed over; the position moves past it."""
    row = _check(conn, journal, subscriber, believed)
    conn.execute(insert(errors).values(
        journal=journal, subscriber=subscriber, offset=offset, seq=seq, record_id=record_id,
        reason=reason, attempts=attempts, failed_at=time.time(), entry=entry))
    conn.execute(update(subscribers).where(_key(journal, subscriber)).values(
        offset=offset, seq=max(seq or 0, row.seq), errors=row.errors + 1,
        updated_at=time.time()))
    return Position(believed.epoch, offset)


def block(conn: Connection, journal: str, subscriber: str, believed: Position, *, kind: str,
          offset: int, seq: int | None, reason: str, entry: str | None) -> None:
    """Inside a transaction: the subscriber stops at an entry (or a gap) until a command."""
    _check(conn, journal, subscriber, believed)
    conn.execute(update(subscribers).where(_key(journal, subscriber)).values(
        state="blocked", blocked_kind=kind, blocked_offset=offset, blocked_seq=seq,
        blocked_reason=reason, blocked_entry=entry, blocked_at=time.time(),
        updated_at=time.time()))


def set_running(engine: Engine, journal: str, subscriber: str) -> None:
    """An agent starting up tries a blocked subscriber's entry again (a restart after a fix)."""
    with engine.begin() as conn:
        conn.execute(update(subscribers).where(_key(journal, subscriber)).values(
            state="running", blocked_kind=None, blocked_offset=None, blocked_seq=None,
            blocked_reason=None, blocked_entry=None, blocked_at=None, updated_at=time.time()))


# -- operators' commands ------------------------------------------------------------------
def _existing(conn: Connection, journal: str, subscriber: str) -> Any:
    row = _row(conn, journal, subscriber, lock=True)
    if row is None:
        raise UserError(f"no subscriber {subscriber!r} of journal {journal!r} in this database "
                        "(has it ever run against it?)")
    return row


def request_rewind(engine: Engine, journal: str, subscriber: str, start: str) -> SubscriberState:
    """Start the subscriber over at ``start`` (``first``, ``offset:N``, ``time:T``): what it
    applies from there it applies again, once; duplicates of entries are passed over as
    always.  A running agent notices within a second."""
    create_tables(engine)
    with engine.begin() as conn:
        _existing(conn, journal, subscriber)
        conn.execute(update(subscribers).where(_key(journal, subscriber)).values(
            offset=None, start=start, not_before=_not_before(start), seq=0, state="running",
            blocked_kind=None, blocked_offset=None, blocked_seq=None, blocked_reason=None,
            blocked_entry=None, blocked_at=None, epoch=subscribers.c.epoch + 1,
            updated_at=time.time()))
        return _state(_row(conn, journal, subscriber))


_AFTER = re.compile(r"\(after (\d+) attempts?\)$")


def given_up(error: str, attempts: int) -> str:
    """The reason an entry given up on is stored with: the error and the attempts made."""
    return f"{error} (after {attempts} attempt{'s' if attempts > 1 else ''})"


def attempts_in(reason: str | None) -> int:
    """The attempts a reason made by :func:`given_up` names (0: none named)."""
    found = _AFTER.search(reason or "")
    return int(found.group(1)) if found else 0


def _record_of(offset: int | None, entry: str | None) -> str | None:
    """The record ID of a stored entry (None: no entry, or one that is no journal entry)."""
    if entry is None:
        return None
    try:
        return Entry.parse(offset or 0, entry.encode()).id
    except ValueError:
        return None


def request_skip(engine: Engine, journal: str, subscriber: str) -> SubscriberState:
    """Unblock a blocked subscriber by passing over what blocks it: the entry (recorded as
    an error, skipped by the operator) or the gap (accepted).  Returns the row before."""
    create_tables(engine)
    with engine.begin() as conn:
        row = _existing(conn, journal, subscriber)
        if row.state != "blocked":
            raise NotBlocked(f"subscriber {subscriber!r} of journal {journal!r} is not blocked "
                             f"(at offset {row.offset})")
        if row.blocked_kind == "gap":
            offset, seq = row.blocked_offset - 1, row.seq
        else:
            offset, seq = row.blocked_offset, max(row.seq, row.blocked_seq or 0)
            conn.execute(insert(errors).values(
                journal=journal, subscriber=subscriber, offset=row.blocked_offset,
                seq=row.blocked_seq, record_id=_record_of(row.blocked_offset, row.blocked_entry),
                reason=f"skipped by an operator; it had failed: {row.blocked_reason}",
                attempts=attempts_in(row.blocked_reason), failed_at=time.time(),
                entry=row.blocked_entry))
        conn.execute(update(subscribers).where(_key(journal, subscriber)).values(
            offset=offset, seq=seq, state="running", blocked_kind=None, blocked_offset=None,
            blocked_seq=None, blocked_reason=None, blocked_entry=None, blocked_at=None,
            errors=row.errors + (row.blocked_kind != "gap"), epoch=row.epoch + 1,
            updated_at=time.time()))
        return _state(row)


def request_retry(engine: Engine, journal: str, subscriber: str) -> SubscriberState:
    """Unblock a blocked subscriber by trying its entry again (after fixing the cause)."""
    create_tables(engine)
    with engine.begin() as conn:
        row = _existing(conn, journal, subscriber)
        if row.state != "blocked":
            raise NotBlocked(f"subscriber {subscriber!r} of journal {journal!r} is not blocked")
        conn.execute(update(subscribers).where(_key(journal, subscriber)).values(
            state="running", blocked_kind=None, blocked_offset=None, blocked_seq=None,
            blocked_reason=None, blocked_entry=None, blocked_at=None, epoch=row.epoch + 1,
            updated_at=time.time()))
        return _state(row)


def recent_errors(engine: Engine, journal: str, subscriber: str, limit: int = 50) -> list[Any]:
    """The subscriber's last ``limit`` failed or skipped entries, newest first."""
    create_tables(engine)
    with reading(engine) as conn:
        return list(conn.execute(
            select(errors).where(errors.c.journal == journal, errors.c.subscriber == subscriber)
            .order_by(errors.c.id.desc()).limit(limit)).all())


def start_offset(start: str) -> int | None:
    """The offset a stored start point names (``offset:N``), else None."""
    kind, _, value = start.partition(":")
    return int(value) if kind == "offset" else None


def consume_from(position: int | None, start: str) -> dict[str, Any]:
    """The consumer argument that (re)starts reading the stream: after ``position`` (the last
    offset taken in), else at the stored start point."""
    if position is not None:
        return {"x-stream-offset": position + 1}
    kind, _, value = start.partition(":")
    if kind == "offset":
        return {"x-stream-offset": int(value)}
    if kind == "time":  # the broker's resolution is a second: the rest is filtered here
        moment = datetime.datetime.fromtimestamp(int(float(value)), tz=datetime.timezone.utc)
        return {"x-stream-offset": moment}
    return {"x-stream-offset": "first"}
