"""The journal outbox: entries written in the commit transaction, numbered and sent by one relay.

Theory of operation.  A commit writes one row per journal entry
(``chalk_journal_entries``: journal, body, no number yet) in the same
transaction as the records.  The relay of a journal — one in a cluster, the
holder of the journal's row in ``chalk_journal_relays`` (a lease: owner and
expiry) — takes unnumbered rows in row-ID order, gives them the next entry
numbers (``seq``, dense per journal, kept in the relay row) and commits
that *before* publishing.  It publishes them in ``seq`` order with
confirms and deletes them once confirmed.  A relay that dies between
numbering and deleting leaves numbered rows behind; whoever holds the lease
next publishes those again first, with the same numbers, so a copy of an
entry always carries the number of the original and subscribers skip any
entry whose number is not above the last one they applied.

Why the order per record holds: a record is leased from load to commit, so
its next commit's transaction starts after the previous one committed, and
its row ID (drawn in that transaction) is larger; numbering in row-ID order
over the rows visible at the time never numbers the later row before the
earlier (the earlier was visible first).  Rows of different records may be
numbered out of commit order on PostgreSQL (a transaction that commits late
with a smaller row ID); no per-record order depends on that.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

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
    delete,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.engine import Engine

from listener_router.store import Schema, reading

__all__ = ["JournalOutbox", "journal_entries", "journal_relays"]

SCHEMA = Schema("journal")

_ID = BigInteger().with_variant(Integer, "sqlite")   # SQLite: the rowid itself

journal_entries = Table(
    "chalk_journal_entries", SCHEMA.metadata,
    Column("id", _ID, primary_key=True, autoincrement=True),
    Column("journal", String(100), nullable=False),
    Column("seq", BigInteger, nullable=True),        # given by the relay just before publishing
    Column("body", Text, nullable=False),            # the entry as JSON, without seq
    Column("created_at", Float, nullable=False),
    Index("ix_chalk_journal_entries_next", "journal", "seq", "id"),
)
journal_relays = Table(
    "chalk_journal_relays", SCHEMA.metadata,
    Column("journal", String(100), primary_key=True),
    Column("owner", String(255), nullable=True),
    Column("expires_at", Float, nullable=False),
    Column("last_seq", BigInteger, nullable=False),  # the last number given
    Column("published_at", Float, nullable=True),    # when the last confirmed entry went out
)

_INSERT = ("INSERT INTO chalk_journal_entries (journal, body, created_at) VALUES (?, ?, ?)")


class JournalOutbox:
    """The journal outbox in the service's database (see the module doc)."""

    def __init__(self, engine: Engine):
        SCHEMA.create(engine)
        self.engine = engine
        self._pg = engine.dialect.name == "postgresql"

    @staticmethod
    def write(conn: Connection, journal: str, bodies: Sequence[str]) -> None:
        """Inside the commit transaction: add entries (JSON text without ``seq``)."""
        if not bodies:
            return
        sql = _INSERT.replace("?", "%s") if conn.dialect.name == "postgresql" else _INSERT
        now = time.time()
        conn.exec_driver_sql(sql, [(journal, body, now) for body in bodies])

    def waiting(self, journal: str) -> bool:
        """Whether any entry of ``journal`` waits to be published (a cheap read)."""
        e = journal_entries.c
        with reading(self.engine) as conn:
            return conn.execute(select(e.id).where(e.journal == journal).limit(1)).first() \
                is not None

    def take(self, journal: str, owner: str, lease: float,
             limit: int) -> list[tuple[int, str]] | None:
        """Hold (or renew) the journal's relay lease and return ``(seq, body)`` to publish.

        First the numbered rows a relay left behind (publish them again),
        else up to ``limit`` new rows, numbered now.  ``None`` when another
        live owner holds the lease.
        """
        now = time.time()
        with self.engine.begin() as conn:
            taken = conn.execute(
                update(journal_relays)
                .where(journal_relays.c.journal == journal,
                       (journal_relays.c.owner == owner) | journal_relays.c.owner.is_(None)
                       | (journal_relays.c.expires_at < now))
                .values(owner=owner, expires_at=now + lease)).rowcount
            if not taken:
                exists = conn.execute(select(journal_relays.c.journal)
                                      .where(journal_relays.c.journal == journal)).first()
                if exists is not None:
                    return None
                conn.execute(insert(journal_relays).values(
                    journal=journal, owner=owner, expires_at=now + lease, last_seq=0))
            e = journal_entries.c
            left = conn.execute(select(e.seq, e.body)
                                .where(e.journal == journal, e.seq.is_not(None))
                                .order_by(e.seq).limit(limit)).all()
            if left:
                return [(int(seq), body) for seq, body in left]
            rows = conn.execute(select(e.id, e.body)
                                .where(e.journal == journal, e.seq.is_(None))
                                .order_by(e.id).limit(limit)).all()
            if not rows:
                return []
            last = int(conn.execute(select(journal_relays.c.last_seq)
                                    .where(journal_relays.c.journal == journal)).scalar_one())
            numbered = [(last + i, row_id, body) for i, (row_id, body) in enumerate(rows, 1)]
            sql = "UPDATE chalk_journal_entries SET seq = ? WHERE id = ?"
            conn.exec_driver_sql(sql.replace("?", "%s") if self._pg else sql,
                                 [(seq, row_id) for seq, row_id, _ in numbered])
            conn.execute(update(journal_relays).where(journal_relays.c.journal == journal)
                         .values(last_seq=numbered[-1][0]))
            return [(seq, body) for seq, _, body in numbered]

    def sent(self, journal: str, up_to: int) -> None:
        """The entries numbered up to ``up_to`` are confirmed in the stream: drop them."""
        e = journal_entries.c
        with self.engine.begin() as conn:
            conn.execute(delete(journal_entries).where(e.journal == journal, e.seq.is_not(None),
                                                       e.seq <= up_to))
            conn.execute(update(journal_relays).where(journal_relays.c.journal == journal)
                         .values(published_at=time.time()))

    def release(self, journal: str, owner: str) -> None:
        """Give the relay lease up (a clean stop: the next relay need not wait)."""
        with self.engine.begin() as conn:
            conn.execute(update(journal_relays)
                         .where(journal_relays.c.journal == journal,
                                journal_relays.c.owner == owner)
                         .values(owner=None, expires_at=0.0))

    def pending(self, journal: str | None = None) -> dict[str, int]:
        """Entries not yet confirmed in their stream, by journal."""
        e = journal_entries.c
        query = select(e.journal, func.count()).group_by(e.journal)
        if journal is not None:
            query = query.where(e.journal == journal)
        with reading(self.engine) as conn:
            return {name: int(n) for name, n in conn.execute(query)}

    def relays(self) -> list[Any]:
        """The relay rows: ``journal, owner, expires_at, last_seq, published_at``."""
        with reading(self.engine) as conn:
            return list(conn.execute(select(journal_relays)).all())
