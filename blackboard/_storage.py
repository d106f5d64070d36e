"""SQLAlchemy storage of records, attachments and leases.

Theory of operation: a record on a blackboard is *leased* in
``chalk_leases`` (owner, expiry).  Taking a lease is an upsert that succeeds
when the row is absent, expired, or already ours; the rows that stay with
another owner after the upsert are the conflicts.  Batch operations do a
constant number of round trips: one executemany for the leases, one select
for the conflicts, one select for the documents.  A commit re-takes the
leases inside its transaction, so a holder whose lease lapsed and was taken
over cannot overwrite the newer owner's data; a version check on each
loaded record stops it even where the lease row was since released.

SQLite ignores ``FOR UPDATE``: correctness there rests on SQLite's single
writer (``BEGIN IMMEDIATE``) and on the lease upsert, never on row locks.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Any

from sqlalchemy import (
    Column,
    Connection,
    Engine,
    Float,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    and_,
    create_engine,
    delete,
    event,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from blackboard._errors import StaleRecordError, StorageError

__all__ = ["SqlStore", "WriteSet", "SCHEMA_VERSION", "metadata"]

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
CHUNK_SIZE = 1 << 20  # attachment chunk: 1 MiB
_IN_CHUNK = 2000      # ids per IN (...) list

metadata = MetaData()

records = Table(
    "chalk_records", metadata,
    Column("id", String(512), primary_key=True),
    Column("doc", Text, nullable=False),
    Column("version", Integer, nullable=False),
    Column("updated_at", Float, nullable=False),
)
attachments = Table(
    "chalk_attachments", metadata,
    Column("record_id", String(512), primary_key=True),
    Column("name", String(512), primary_key=True),
    Column("chunk", Integer, primary_key=True),
    Column("data", LargeBinary, nullable=False),
)
leases = Table(
    "chalk_leases", metadata,
    Column("record_id", String(512), primary_key=True),
    Column("owner", String(255), nullable=False),
    Column("expires_at", Float, nullable=False),
    Column("acquired_at", Float, nullable=False),
)
meta = Table(
    "chalk_meta", metadata,
    Column("key", String(64), primary_key=True),
    Column("value", Text, nullable=False),
)


@dataclass
class WriteSet:
    """What one commit writes, all in one transaction."""

    upserts: list[tuple[str, dict[str, Any], int | None]]  # id, doc, expected version
    deletes: list[str]
    attachment_writes: list[tuple[str, str, Callable[[], IO[bytes]]]]  # id, name, opener
    attachment_removals: list[tuple[str, str]]
    release: list[str]


def _chunks(items: Sequence[str], size: int = _IN_CHUNK) -> Iterator[Sequence[str]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    # Let SQLAlchemy, not pysqlite, issue BEGIN, so that BEGIN IMMEDIATE works.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def _sqlite_begin(conn: Connection) -> None:
    conn.exec_driver_sql("BEGIN IMMEDIATE")


class SqlStore:
    """Records, attachments and leases in one SQL database (any SQLAlchemy URL)."""

    def __init__(self, url: str, *, engine: Engine | None = None):
        self.url = url
        try:
            self.engine = engine or create_engine(url, pool_pre_ping=True)
        except (SQLAlchemyError, ImportError, ValueError) as e:
            raise StorageError(f"cannot open storage {url!r}: {e}") from e
        self.dialect = self.engine.dialect.name
        if self.dialect == "sqlite":
            event.listen(self.engine, "connect", _sqlite_pragmas)
            event.listen(self.engine, "begin", _sqlite_begin)
        self._insert = {"sqlite": sqlite.insert, "postgresql": postgresql.insert}.get(self.dialect)
        if self._insert is None:
            raise StorageError(f"storage {url!r}: dialect {self.dialect!r} is not supported; "
                               "use SQLite or PostgreSQL")
        self.create_schema()

    # -- schema ---------------------------------------------------------------
    def create_schema(self) -> None:
        with self.transaction() as tx:
            conn = tx.conn
            metadata.create_all(conn)
            found = conn.execute(select(meta.c.value).where(meta.c.key == "schema_version")).scalar()
            if found is None:
                conn.execute(self._insert(meta).values(key="schema_version",
                                                       value=str(SCHEMA_VERSION))
                             .on_conflict_do_nothing())
            elif int(found) > SCHEMA_VERSION:
                raise StorageError(f"storage {self.url!r} has schema version {found}; this "
                                   f"version of Chalk knows up to {SCHEMA_VERSION}: upgrade Chalk")

    def transaction(self) -> Any:
        """A context manager: one database transaction (errors become StorageError)."""
        return _Transaction(self)

    def dispose(self) -> None:
        self.engine.dispose()

    # -- leases ---------------------------------------------------------------
    def _take_leases(self, conn: Connection, ids: Sequence[str], owner: str,
                     lease_seconds: float) -> dict[str, str]:
        """Upsert our lease on ``ids``; return {id: holder} of those held by others."""
        if not ids:
            return {}
        now = time.time()
        stmt = self._insert(leases)
        stmt = stmt.on_conflict_do_update(
            index_elements=[leases.c.record_id],
            set_={"owner": stmt.excluded.owner, "expires_at": stmt.excluded.expires_at,
                  "acquired_at": stmt.excluded.acquired_at},
            where=(leases.c.expires_at < stmt.excluded.acquired_at)
            | (leases.c.owner == stmt.excluded.owner),
        )
        rows = [{"record_id": i, "owner": owner, "expires_at": now + lease_seconds,
                 "acquired_at": now} for i in sorted(set(ids))]
        conn.execute(stmt, rows)
        holders: dict[str, str] = {}
        for part in _chunks(list(ids)):
            for rid, holder in conn.execute(
                    select(leases.c.record_id, leases.c.owner)
                    .where(leases.c.record_id.in_(part), leases.c.owner != owner)):
                holders[rid] = holder
        return holders

    def acquire(self, ids: Sequence[str], owner: str, lease_seconds: float) -> dict[str, str]:
        """Lease ``ids`` for ``owner``, all or nothing; return the conflicts (empty on success)."""
        with self.transaction() as tx:
            holders = self._take_leases(tx.conn, ids, owner, lease_seconds)
            if holders:
                tx.rollback()
            return holders

    def acquire_and_read(self, ids: Sequence[str], owner: str, lease_seconds: float
                         ) -> tuple[dict[str, str], dict[str, tuple[dict[str, Any], int]]]:
        """Lease ``ids`` (all or nothing) and read their documents in one transaction."""
        with self.transaction() as tx:
            holders = self._take_leases(tx.conn, ids, owner, lease_seconds)
            if holders:
                tx.rollback()
                return holders, {}
            return {}, self._read(tx.conn, ids)

    def _read(self, conn: Connection, ids: Sequence[str]) -> dict[str, tuple[dict[str, Any], int]]:
        found: dict[str, tuple[dict[str, Any], int]] = {}
        for part in _chunks(list(ids)):
            for rid, doc, version in conn.execute(
                    select(records.c.id, records.c.doc, records.c.version)
                    .where(records.c.id.in_(part))):
                found[rid] = (json.loads(doc), version)
        return found

    def read(self, ids: Sequence[str]) -> dict[str, tuple[dict[str, Any], int]]:
        """Read documents without leasing them (for inspection)."""
        with self.transaction() as tx:
            return self._read(tx.conn, ids)

    def renew(self, ids: Sequence[str], owner: str, lease_seconds: float) -> int:
        """Extend our leases on ``ids``; return how many we still hold."""
        count = 0
        with self.transaction() as tx:
            for part in _chunks(list(ids)):
                count += tx.conn.execute(
                    update(leases).where(leases.c.record_id.in_(part), leases.c.owner == owner)
                    .values(expires_at=time.time() + lease_seconds)).rowcount or 0
        return count

    def release(self, ids: Sequence[str], owner: str) -> None:
        if not ids:
            return
        with self.transaction() as tx:
            self._release(tx.conn, ids, owner)

    def _release(self, conn: Connection, ids: Sequence[str], owner: str) -> None:
        for part in _chunks(list(ids)):
            conn.execute(delete(leases).where(leases.c.record_id.in_(part),
                                              leases.c.owner == owner))

    def purge_expired_leases(self, now: float | None = None) -> int:
        """Drop leases whose holder did not renew them in time (leader maintenance)."""
        with self.transaction() as tx:
            return tx.conn.execute(delete(leases).where(
                leases.c.expires_at < (time.time() if now is None else now))).rowcount or 0

    def lease_holders(self, ids: Iterable[str]) -> dict[str, tuple[str, float]]:
        out: dict[str, tuple[str, float]] = {}
        with self.transaction() as tx:
            for part in _chunks(list(ids)):
                for rid, owner, expires in tx.conn.execute(
                        select(leases.c.record_id, leases.c.owner, leases.c.expires_at)
                        .where(leases.c.record_id.in_(part))):
                    out[rid] = (owner, expires)
        return out

    # -- commit ---------------------------------------------------------------
    def write(self, ws: WriteSet, owner: str, lease_seconds: float,
              hook: Callable[[Connection], None] | None = None) -> None:
        """Write ``ws`` in one transaction, checking leases and versions first.

        Raises :class:`StaleRecordError` (and writes nothing) when another
        owner holds one of the leases or stored data is newer than loaded.
        """
        touched = sorted({rid for rid, _, _ in ws.upserts} | set(ws.deletes)
                         | {rid for rid, _, _ in ws.attachment_writes}
                         | {rid for rid, _ in ws.attachment_removals})
        with self.transaction() as tx:
            conn = tx.conn
            holders = self._take_leases(conn, touched, owner, lease_seconds)
            if holders:
                tx.rollback()
                raise StaleRecordError(holders, message=(
                    "commit refused, nothing written: the lease on "
                    + ", ".join(f"record {r!r} is now held by {h!r}" for r, h in sorted(holders.items())[:5])
                    + " (this blackboard held it too long; reload and redo the work)"))
            expected = {rid: v for rid, _, v in ws.upserts if v is not None}
            if expected:
                stored = {rid: version for rid, (_, version) in self._read_versions(conn, list(expected)).items()}
                stale = {rid: f"version {stored.get(rid)} in storage, {v} loaded"
                         for rid, v in expected.items() if stored.get(rid, 0) != v}
                if stale:
                    tx.rollback()
                    raise StaleRecordError(stale, message=(
                        "commit refused, nothing written: newer data in storage for "
                        + ", ".join(f"record {r!r} ({why})" for r, why in sorted(stale.items())[:5])))
            now = time.time()
            if ws.upserts:
                stmt = self._insert(records)
                stmt = stmt.on_conflict_do_update(
                    index_elements=[records.c.id],
                    set_={"doc": stmt.excluded.doc, "updated_at": stmt.excluded.updated_at,
                          "version": records.c.version + 1})
                conn.execute(stmt, [
                    {"id": rid, "doc": json.dumps(doc, separators=(",", ":"), ensure_ascii=False),
                     "version": 1, "updated_at": now} for rid, doc, _ in ws.upserts])
            for part in _chunks(ws.deletes):
                conn.execute(delete(records).where(records.c.id.in_(part)))
                conn.execute(delete(attachments).where(attachments.c.record_id.in_(part)))
            for rid, name in ws.attachment_removals:
                conn.execute(delete(attachments).where(
                    and_(attachments.c.record_id == rid, attachments.c.name == name)))
            for rid, name, opener in ws.attachment_writes:
                conn.execute(delete(attachments).where(
                    and_(attachments.c.record_id == rid, attachments.c.name == name)))
                self._write_chunks(conn, rid, name, opener)
            if hook is not None:
                hook(conn)
            self._release(conn, ws.release, owner)

    def _read_versions(self, conn: Connection, ids: Sequence[str]) -> dict[str, tuple[None, int]]:
        out: dict[str, tuple[None, int]] = {}
        for part in _chunks(list(ids)):
            for rid, version in conn.execute(
                    select(records.c.id, records.c.version).where(records.c.id.in_(part))):
                out[rid] = (None, version)
        return out

    def _write_chunks(self, conn: Connection, rid: str, name: str,
                      opener: Callable[[], IO[bytes]]) -> None:
        stream = opener()
        try:
            number = 0
            while True:
                data = stream.read(CHUNK_SIZE)
                if not data:
                    break
                conn.execute(attachments.insert().values(record_id=rid, name=name,
                                                         chunk=number, data=data))
                number += 1
        finally:
            stream.close()

    # -- attachments ----------------------------------------------------------
    def attachment_chunks(self, rid: str, name: str) -> Iterator[bytes]:
        """Yield an attachment's chunks, one query per chunk (memory stays one chunk)."""
        number = 0
        while True:
            with self.transaction() as tx:
                data = tx.conn.execute(select(attachments.c.data).where(
                    attachments.c.record_id == rid, attachments.c.name == name,
                    attachments.c.chunk == number)).scalar()
            if data is None:
                return
            yield bytes(data)
            number += 1


class _Transaction:
    """``with store.transaction() as tx``: commit on success, roll back on error."""

    def __init__(self, store: SqlStore):
        self._store = store
        self._rolled_back = False

    def __enter__(self) -> _Transaction:
        try:
            self.conn = self._store.engine.connect()
            self._tx = self.conn.begin()
        except DBAPIError as e:
            raise StorageError(f"storage {self._store.url!r} unavailable: {e.orig}") from e
        return self

    def rollback(self) -> None:
        self._tx.rollback()
        self._rolled_back = True

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            if exc_type is None and not self._rolled_back:
                self._tx.commit()
            elif not self._rolled_back:
                self._tx.rollback()
        except DBAPIError as e:
            if exc_type is None:
                raise StorageError(f"storage {self._store.url!r}: commit failed: {e.orig}") from e
        finally:
            self.conn.close()
        if exc_type is not None and issubclass(exc_type, DBAPIError):
            raise StorageError(f"storage {self._store.url!r} failed: {getattr(exc, 'orig', exc)}") from exc
