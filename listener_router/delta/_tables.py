"""Delta processing's tables: content hashes, records seen by crawls, the crawls.

- ``chalk_delta_hashes``: per workflow and record, the content hash of the
  record as its message brought it (``input``) and as its run committed it
  (``output``), written in the commit transaction.  A record whose content
  hash is either one is unchanged (``_plugin``).  A record deleted through
  the service loses its rows (every workflow's).
- ``chalk_delta_seen``: per source and record, the newest crawl of the
  source that saw it: ``chalk push --source`` and the service on receipt
  raise it to the source's newest crawl.
- ``chalk_delta_unseen``: per crawl being finished, the records it
  publishes a DELETE message for, each written *before* its page is
  published: a finish killed between the broker's confirms and its cursor
  finds them on the page again and publishes them again (same message IDs),
  also those seen meanwhile (the service then keeps the record), and counts
  those the service already deleted.  A crawl's rows go when it ends.
- ``chalk_delta_crawls``: one row per crawl (``chalk delta start``): its
  source, the queue its DELETE messages go to, its state, where ``chalk
  delta finish`` stands (the cursor of its walk, records looked at, DELETE
  messages published), and what the service did with those (``deleted``,
  ``kept``: seen after all).  ``step`` fences the finish: every change of
  the walk is an ``UPDATE … WHERE step = <the step read>`` that raises it,
  so of two processes finishing one crawl only one moves it.  A unique
  index keeps one crawl running (crawling or finishing) per source.

What may happen to a crawl (anything else is refused)::

    crawling   --finish-->   finishing   chalk delta finish: the walk starts
    finishing  --part-->     finishing   a page's DELETE messages confirmed, the cursor after it
    finishing  --last-->     finished    the last page
    crawling   --restart-->  abandoned   chalk delta start --restart: no record is deleted for it
    finishing  --restart-->  abandoned   (the DELETE messages already published still go)
    crawling   --abandon-->  abandoned   chalk delta abandon: the same, no new crawl begun
    finishing  --abandon-->  abandoned
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
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
    select,
    text,
    tuple_,
    update,
)
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from listener_router._errors import UserError
from listener_router.store import Schema, reading, row_as

__all__ = ["Crawl", "CrawlMoved", "Crawls", "DeltaTables", "MOVES", "SCHEMA"]

SCHEMA = Schema("delta")

hashes = Table(
    "chalk_delta_hashes", SCHEMA.metadata,
    Column("workflow", String(255), primary_key=True),
    Column("record_id", String(512), primary_key=True),
    Column("input", String(64), nullable=False),     # SHA-256, hex: the content as it came
    Column("output", String(64), nullable=True),     # the content as its run committed it
    Column("at", Float, nullable=False),
    Index("ix_chalk_delta_hashes_record", "record_id"),
)
seen = Table(
    "chalk_delta_seen", SCHEMA.metadata,
    Column("source", String(255), primary_key=True),
    Column("record_id", String(512), primary_key=True),
    Column("crawl", Integer, nullable=False),        # the newest crawl of the source that saw it
    Column("at", Float, nullable=False),
    Index("ix_chalk_delta_seen_crawl", "source", "crawl"),
)
unseen = Table(
    "chalk_delta_unseen", SCHEMA.metadata,
    Column("crawl", Integer, primary_key=True),
    Column("record_id", String(512), primary_key=True),
)
crawls = Table(
    "chalk_delta_crawls", SCHEMA.metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("source", String(255), nullable=False),
    Column("queue", String(255), nullable=False),    # where its DELETE messages go
    Column("state", String(16), nullable=False),     # crawling, finishing, finished, abandoned
    Column("cursor", Text, nullable=True),           # the finish's walk: after the last page
    Column("looked", Integer, nullable=False),       # records of the source the finish looked at
    Column("deletions", Integer, nullable=False),    # records DELETE messages went out for
    Column("seen", Integer, nullable=True),          # records it saw (counted when it finished)
    Column("deleted", Integer, nullable=False),      # records the service deleted for it
    Column("kept", Integer, nullable=False),         # its DELETEs dropped: the record was seen
    Column("step", Integer, nullable=False),         # raised by every move: the fencing token
    Column("started_at", Float, nullable=False),
    Column("started_by", String(255), nullable=True),
    Column("finishing_at", Float, nullable=True),
    Column("finished_at", Float, nullable=True),
    Column("note", Text, nullable=True),
    Index("ux_chalk_delta_crawls_running", "source", unique=True,
          sqlite_where=text("state IN ('crawling', 'finishing')"),
          postgresql_where=text("state IN ('crawling', 'finishing')")),
    sqlite_autoincrement=True,    # crawl numbers only grow: a seen mark compares them
)

# (state, what happens) -> the state after it
MOVES: dict[tuple[str, str], str] = {
    ("crawling", "finish"): "finishing",
    ("finishing", "part"): "finishing",
    ("finishing", "last"): "finished",
    ("crawling", "restart"): "abandoned",
    ("finishing", "restart"): "abandoned",
    ("crawling", "abandon"): "abandoned",
    ("finishing", "abandon"): "abandoned",
}

_UPSERT_HASH = (
    "INSERT INTO chalk_delta_hashes (workflow, record_id, input, output, at) "
    "VALUES (?, ?, ?, ?, ?) ON CONFLICT (workflow, record_id) DO UPDATE SET "
    "input = excluded.input, output = excluded.output, at = excluded.at")
_MARK = (
    "INSERT INTO chalk_delta_seen (source, record_id, crawl, at) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (source, record_id) DO UPDATE SET crawl = excluded.crawl, at = excluded.at "
    "WHERE chalk_delta_seen.crawl < excluded.crawl")
_PLAN = ("INSERT INTO chalk_delta_unseen (crawl, record_id) VALUES (?, ?) "
         "ON CONFLICT (crawl, record_id) DO NOTHING")
_CHUNK = 500


def _sql(conn: Connection, sql: str) -> str:
    return sql.replace("?", "%s") if conn.dialect.name == "postgresql" else sql


def _chunks(items: Sequence[Any]) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), _CHUNK):
        yield items[start:start + _CHUNK]


class DeltaTables:
    """Reads and writes of the hashes and the seen marks, in a caller's connection."""

    @staticmethod
    def hashes(conn: Connection, workflow: str, ids: Sequence[str]
               ) -> dict[str, tuple[str, str | None]]:
        """``{record: (input hash, output hash)}`` of those of ``ids`` that have them."""
        c = hashes.c
        found: dict[str, tuple[str, str | None]] = {}
        for part in _chunks(list(ids)):
            found.update((r.record_id, (r.input, r.output)) for r in conn.execute(
                select(c.record_id, c.input, c.output).where(c.workflow == workflow,
                                                             c.record_id.in_(part))))
        return found

    @staticmethod
    def put_hashes(conn: Connection, rows: Sequence[tuple[str, str, str, str | None]]) -> None:
        """``(workflow, record, input hash, output hash)`` each, replacing what was there."""
        if rows:
            now = time.time()
            conn.exec_driver_sql(_sql(conn, _UPSERT_HASH), [(*row, now) for row in rows])

    @staticmethod
    def forget(conn: Connection, ids: Sequence[str]) -> None:
        """Deleted records: their hashes (every workflow's) and seen marks go."""
        for part in _chunks(list(ids)):
            conn.execute(delete(hashes).where(hashes.c.record_id.in_(part)))
            conn.execute(delete(seen).where(seen.c.record_id.in_(part)))

    @staticmethod
    def newest(conn: Connection, sources: Iterable[str]) -> dict[str, int]:
        """The newest crawl of each of ``sources`` that has any (whatever its state)."""
        wanted = sorted(set(sources))
        if not wanted:
            return {}
        c = crawls.c
        return dict(conn.execute(select(c.source, func.max(c.id)).where(c.source.in_(wanted))
                                 .group_by(c.source)).all())

    @staticmethod
    def marks(conn: Connection, pairs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], int]:
        """The crawl each ``(source, record)`` was last seen in, where it was."""
        c = seen.c
        found: dict[tuple[str, str], int] = {}
        for part in _chunks(sorted(set(pairs))):
            found.update(((r.source, r.record_id), r.crawl) for r in conn.execute(
                select(c.source, c.record_id, c.crawl).where(
                    tuple_(c.source, c.record_id).in_(part))))
        return found

    @staticmethod
    def mark(conn: Connection, rows: Sequence[tuple[str, str, int]]) -> None:
        """``(source, record, crawl)``: seen in that crawl (a mark never goes back)."""
        if rows:
            now = time.time()
            conn.exec_driver_sql(_sql(conn, _MARK), [(*row, now) for row in rows])

    @classmethod
    def mark_newest(cls, conn: Connection, pairs: Sequence[tuple[str, str]]) -> int:
        """Mark each ``(source, record)`` seen in its source's newest crawl (none: nothing);
        returns how many marks were raised (read first: a mark already there costs no write)."""
        newest = cls.newest(conn, (s for s, _r in pairs))
        wanted = [(s, r) for s, r in pairs if s in newest]
        if not wanted:
            return 0
        have = cls.marks(conn, wanted)
        rows = [(s, r, newest[s]) for s, r in wanted if have.get((s, r), -1) < newest[s]]
        cls.mark(conn, rows)
        return len(rows)


@dataclass(frozen=True)
class Crawl:
    id: int
    source: str
    queue: str
    state: str
    cursor: str | None
    looked: int
    deletions: int
    seen: int | None
    deleted: int
    kept: int
    step: int
    started_at: float
    started_by: str | None
    finishing_at: float | None
    finished_at: float | None
    note: str | None

    @property
    def running(self) -> bool:
        return self.state in ("crawling", "finishing")


class CrawlMoved(UserError):
    """Another process moved the crawl's row first (or it is not in a state for this)."""


class Crawls:
    """The crawls' rows, read and moved by compare-and-set (see the module doc)."""

    def __init__(self, engine: Engine):
        SCHEMA.create(engine)
        self.engine = engine

    def _reading(self) -> Connection:
        return reading(self.engine)

    def read(self, crawl_id: int) -> Crawl | None:
        with self._reading() as conn:
            row = conn.execute(select(crawls).where(crawls.c.id == crawl_id)).first()
        return None if row is None else row_as(Crawl, row)

    def running(self, source: str) -> Crawl | None:
        """The crawl of ``source`` that is crawling or finishing, if one is."""
        c = crawls.c
        with self._reading() as conn:
            row = conn.execute(select(crawls).where(
                c.source == source, c.state.in_(("crawling", "finishing")))).first()
        return None if row is None else row_as(Crawl, row)

    def recent(self, limit: int = 20, source: str | None = None) -> list[Crawl]:
        """The newest crawls first."""
        query = select(crawls).order_by(crawls.c.id.desc()).limit(limit)
        if source is not None:
            query = query.where(crawls.c.source == source)
        with self._reading() as conn:
            return [row_as(Crawl, r) for r in conn.execute(query)]

    def seen_count(self, crawl: Crawl) -> int:
        """Records of the crawl's source seen in it, or in a crawl after it."""
        c = seen.c
        with self._reading() as conn:
            return int(conn.execute(select(func.count()).select_from(seen).where(
                c.source == crawl.source, c.crawl >= crawl.id)).scalar_one())

    def start(self, source: str, queue: str, by: str) -> Crawl:
        """A new crawl of ``source``, crawling.

        Raises:
            CrawlMoved: a crawl of ``source`` is running (crawling or finishing).
        """
        now = time.time()
        values = dict(source=source, queue=queue, state="crawling", cursor=None, looked=0,
                      deletions=0, seen=None, deleted=0, kept=0, step=0, started_at=now,
                      started_by=by, finishing_at=None, finished_at=None, note=None)
        try:
            with self.engine.begin() as conn:
                key = conn.execute(crawls.insert().values(**values)).inserted_primary_key
                assert key is not None
                new_id = key[0]
        except IntegrityError:
            running = self.running(source)
            raise CrawlMoved(f"a crawl of source {source!r} is running"
                             + (f" (crawl {running.id}, {running.state})" if running else "")
                             ) from None
        return Crawl(id=int(new_id), **values)  # type: ignore[arg-type]

    def move(self, seen_crawl: Crawl, event: str, **values: Any) -> Crawl:
        """``event`` happens to the crawl as last read (see the module doc)."""
        after = MOVES.get((seen_crawl.state, event))
        if after is None:
            raise CrawlMoved(f"crawl {seen_crawl.id} of source {seen_crawl.source!r} is "
                             f"{seen_crawl.state}: it cannot {event}")
        now = time.time()
        values.update(state=after, step=seen_crawl.step + 1)
        if event == "finish":
            values["finishing_at"] = now
        if after in ("finished", "abandoned"):
            values["finished_at"] = now
        with self.engine.begin() as conn:
            moved = conn.execute(update(crawls).where(
                crawls.c.id == seen_crawl.id, crawls.c.step == seen_crawl.step)
                .values(**values)).rowcount
        if moved != 1:
            raise CrawlMoved(f"crawl {seen_crawl.id} of source {seen_crawl.source!r} was moved "
                             "by another process (chalk delta status shows it)")
        found = self.read(seen_crawl.id)
        assert found is not None
        return found

    @staticmethod
    def count(conn: Connection, crawl_id: int, *, deleted: int = 0, kept: int = 0) -> None:
        """In the service's commit transaction: records deleted or kept for the crawl."""
        if deleted or kept:
            c = crawls.c
            conn.execute(update(crawls).where(c.id == crawl_id).values(
                deleted=c.deleted + deleted, kept=c.kept + kept))

    def plan(self, crawl: Crawl, ids: Sequence[str], unseen_ids: Sequence[str]) -> list[str]:
        """A page's records (``ids``, in order) to publish DELETE messages for: those unseen
        now, written down first, and those written down by a finish that died before its
        cursor moved past the page (seen since or not: a page is published whole again)."""
        c = unseen.c
        with self.engine.begin() as conn:
            planned: set[str] = set()
            for part in _chunks(list(ids)):
                planned.update(conn.execute(select(c.record_id).where(
                    c.crawl == crawl.id, c.record_id.in_(part))).scalars())
            new = [rid for rid in unseen_ids if rid not in planned]
            if new:
                conn.exec_driver_sql(_sql(conn, _PLAN), [(crawl.id, rid) for rid in new])
        wanted = planned | set(unseen_ids)
        return [rid for rid in ids if rid in wanted]

    def planned(self, crawl: Crawl) -> int:
        """Records the crawl's finish wrote down to delete (published, or about to be)."""
        with self._reading() as conn:
            return int(conn.execute(select(func.count()).select_from(unseen).where(
                unseen.c.crawl == crawl.id)).scalar_one())

    def forget_plan(self, crawl: Crawl) -> None:
        """The crawl ended (its counts are on its row): its written-down records go."""
        with self.engine.begin() as conn:
            conn.execute(delete(unseen).where(unseen.c.crawl == crawl.id))

    @staticmethod
    def unseen(conn: Connection, crawl: Crawl, ids: Sequence[str]) -> list[str]:
        """Those of ``ids`` (records of the crawl's source) not seen in it or after it."""
        c = seen.c
        found: set[str] = set()
        for part in _chunks(list(ids)):
            found.update(conn.execute(select(c.record_id).where(
                and_(c.source == crawl.source, c.record_id.in_(part), c.crawl >= crawl.id)))
                .scalars())
        return [rid for rid in ids if rid not in found]
