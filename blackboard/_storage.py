"""SQLAlchemy storage of records, attachments and leases.

Theory of operation.  A record on a blackboard is *leased* in
``chalk_leases`` (owner, expiry).  Taking a lease is an upsert that succeeds
when the row is absent, expired, or already ours; ids left with another
owner are the conflicts.  A commit ends the leases with ``DELETE … WHERE
owner = me RETURNING``: what comes back is what we still held.  Then:

* a loaded record is written with ``UPDATE … WHERE version = loaded``; the
  row count is the version check (a holder whose lease lapsed and whose
  record was meanwhile committed by the taker changes nothing);
* a record loaded as absent is inserted with ``ON CONFLICT DO NOTHING``;
  the row count says it is still absent;
* a created record (``create``/``split``: overwrite semantics) is upserted,
  and needs a lease we still held;
* a lease now held by another owner refuses the commit whatever the versions.

Anything refused rolls the transaction back and raises
:class:`StaleRecordError`; nothing is written.  On PostgreSQL, concurrent
commits and loads of one record serialise on its lease row.

Round trips: every batch operation is a constant number of statements
whatever the batch size (PostgreSQL: ``unnest``/``= ANY`` over arrays, and a
lease upsert + read in one statement; SQLite: ``json_each`` for id sets and
executemany, which is one call into the in-process library).  Attachments
are 1 MiB chunk rows, written and read a chunk at a time.

SQLite ignores ``FOR UPDATE``: correctness there rests on SQLite's single
writer (``BEGIN IMMEDIATE`` for every writing transaction), never on row locks.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
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
    bindparam,
    create_engine,
    delete,
    event,
    exc,
    func,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite

from blackboard import _json
from blackboard._errors import StaleRecordError, StorageError
from blackboard._urls import hide_url, safe_url

__all__ = ["SqlStore", "WriteSet", "SCHEMA_VERSION", "CHUNK_SIZE", "metadata"]

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
CHUNK_SIZE = 1 << 20          # attachment chunk: 1 MiB
_WRITE_BUFFER = 8 << 20       # attachment bytes collected per executemany

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
    # SQLite: small rows keyed by a string are one B-tree without a rowid (no
    # separate key index to update on every take and release).  Databases made
    # before keep their rowid table; the statements are the same.
    sqlite_with_rowid=False,
)
meta = Table(
    "chalk_meta", metadata,
    Column("key", String(64), primary_key=True),
    Column("value", Text, nullable=False),
)

Found = dict[str, tuple[dict[str, Any], int]]
Raw = dict[str, tuple[str, int]]     # id -> (stored JSON text, version)


@dataclass
class WriteSet:
    """What one commit writes, all in one transaction."""

    # Documents as compact JSON text.
    updates: list[tuple[str, str, int]] = field(default_factory=list)  # id, doc, loaded version
    inserts: list[tuple[str, str]] = field(default_factory=list)  # loaded as absent
    overwrites: list[tuple[str, str]] = field(default_factory=list)  # created: overwrite
    deletes: list[tuple[str, int | None]] = field(default_factory=list)  # id, loaded version or None
    attachment_copies: list[tuple[str, str, str, str]] = field(default_factory=list)  # to id, name, from id, name
    attachment_writes: list[tuple[str, str, Callable[[], IO[bytes]]]] = field(default_factory=list)
    attachment_removals: list[tuple[str, str]] = field(default_factory=list)
    clear_attachments: list[str] = field(default_factory=list)  # overwritten: old ones go
    take: list[str] = field(default_factory=list)      # never leased (imported): lease now
    release: list[str] = field(default_factory=list)   # leases that end with this commit

    def written(self) -> list[str]:
        """IDs whose stored data this commit changes."""
        ids = dict.fromkeys(rid for rid, *_ in self.updates)
        ids.update(dict.fromkeys(rid for rid, *_ in self.inserts))
        ids.update(dict.fromkeys(rid for rid, *_ in self.overwrites))
        ids.update(dict.fromkeys(rid for rid, _ in self.deletes))
        ids.update(dict.fromkeys(rid for rid, *_ in self.attachment_copies))
        ids.update(dict.fromkeys(rid for rid, *_ in self.attachment_writes))
        ids.update(dict.fromkeys(rid for rid, _ in self.attachment_removals))
        return list(ids)


@contextmanager
def gc_paused() -> Iterator[None]:
    # Parsing thousands of documents allocates millions of small containers,
    # and the cyclic collector then walks the whole heap again and again
    # (measured: 3-7x the parse time itself for 10,000 1 KB records).  JSON
    # makes no reference cycles, so nothing is lost by collecting afterwards.
    # Threads share the switch: the first one in turns it off, the last one
    # out turns it back on (if it was on), so none re-enables it under another.
    global _gc_pause_depth, _gc_was_enabled
    with _gc_pause_lock:
        if _gc_pause_depth == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pause_depth += 1
    try:
        yield
    finally:
        with _gc_pause_lock:
            _gc_pause_depth -= 1
            if _gc_pause_depth == 0 and _gc_was_enabled:
                gc.enable()


_gc_pause_lock = threading.Lock()
_gc_pause_depth = 0
_gc_was_enabled = True


def _sqlite_connect(dbapi_connection: Any, _record: Any) -> None:
    # Let SQLAlchemy, not pysqlite, issue BEGIN, so that BEGIN IMMEDIATE works.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()


def _sqlite_begin(conn: Connection) -> None:
    # Writers take the write lock at BEGIN: two deferred transactions that
    # both read and then write would otherwise fail with SQLITE_BUSY.
    readonly = conn.get_execution_options().get("chalk_readonly", False)
    conn.exec_driver_sql("BEGIN" if readonly else "BEGIN IMMEDIATE")


# -- PostgreSQL statements: whole batches as arrays, one statement each --------
_PG_TAKE = """
  INSERT INTO chalk_leases (record_id, owner, expires_at, acquired_at)
  SELECT w.id, :owner, :expires, :now FROM unnest(CAST(:ids AS text[])) AS w(id) ORDER BY w.id
  ON CONFLICT (record_id) DO UPDATE
     SET owner = excluded.owner, expires_at = excluded.expires_at,
         acquired_at = CASE WHEN chalk_leases.owner = excluded.owner
                            THEN chalk_leases.acquired_at ELSE excluded.acquired_at END
     WHERE chalk_leases.expires_at < excluded.acquired_at
        OR chalk_leases.owner = excluded.owner
  RETURNING record_id"""
_PG_TAKE_AND_READ = text(f"""
WITH taken AS ({_PG_TAKE})
SELECT t.record_id, r.doc, r.version FROM taken t LEFT JOIN chalk_records r ON r.id = t.record_id
""")
_PG_TAKE_ONLY = text(_PG_TAKE)
_PG_RELEASE = text("""
DELETE FROM chalk_leases WHERE owner = :owner AND record_id IN (
  SELECT record_id FROM chalk_leases WHERE record_id = ANY(CAST(:ids AS text[])) AND owner = :owner
  ORDER BY record_id FOR UPDATE)
RETURNING record_id""")
_PG_DELETE_ATTACHMENTS = text("""
DELETE FROM chalk_attachments AS a USING unnest(CAST(:ids AS text[]), CAST(:names AS text[]))
     AS v(id, name)
WHERE a.record_id = v.id AND a.name = v.name""")
_PG_COPY_ATTACHMENTS = text("""
INSERT INTO chalk_attachments (record_id, name, chunk, data)
SELECT v.id, v.name, a.chunk, a.data
FROM unnest(CAST(:ids AS text[]), CAST(:names AS text[]), CAST(:src_ids AS text[]),
            CAST(:src_names AS text[])) AS v(id, name, src_id, src_name)
JOIN chalk_attachments a ON a.record_id = v.src_id AND a.name = v.src_name""")


# -- Record writes: driver-level SQL with positional tuples, run with
# executemany (the hot path skips SQLAlchemy's per-row parameter processing;
# psycopg pipelines the rows in one round trip — 5x faster than passing 10 MB
# of documents as a text array, which psycopg must escape).  "?" becomes
# "%s" on PostgreSQL.
_LITE_TAKE = """
INSERT INTO chalk_leases (record_id, owner, expires_at, acquired_at)
SELECT value, ?, ?, ? FROM json_each(?) WHERE true
ON CONFLICT (record_id) DO UPDATE
   SET owner = excluded.owner, expires_at = excluded.expires_at,
       acquired_at = CASE WHEN chalk_leases.owner = excluded.owner
                          THEN chalk_leases.acquired_at ELSE excluded.acquired_at END
   WHERE chalk_leases.expires_at < excluded.acquired_at OR chalk_leases.owner = excluded.owner"""
_LITE_RELEASE = ("DELETE FROM chalk_leases WHERE owner = ? AND record_id IN "
                 "(SELECT value FROM json_each(?)) RETURNING record_id")
_UPDATE = ("UPDATE chalk_records SET doc = ?, version = version + 1, updated_at = ? "
                "WHERE id = ? AND version = ?")
_INSERT_NEW = ("INSERT INTO chalk_records (id, doc, version, updated_at) VALUES (?, ?, 1, ?) "
                    "ON CONFLICT (id) DO NOTHING")
_OVERWRITE = ("INSERT INTO chalk_records (id, doc, version, updated_at) VALUES (?, ?, 1, ?) "
                   "ON CONFLICT (id) DO UPDATE SET doc = excluded.doc, "
                   "version = chalk_records.version + 1, updated_at = excluded.updated_at")
_DELETE_CHECKED = "DELETE FROM chalk_records WHERE id = ? AND version = ?"

# PostgreSQL: COPY the documents into a session-local staging table (emptied
# at every commit), then one set-based statement per kind.  2x faster than
# pipelined executemany for 10,000 1 KB documents, ~5x faster than unnest()
# over text arrays; for one record it costs two more short round trips.
_PG_STAGE = ("CREATE TEMP TABLE IF NOT EXISTS chalk_stage (kind smallint NOT NULL, "
             "id text NOT NULL, doc text NOT NULL, v integer) ON COMMIT DELETE ROWS")
_PG_STAGE_COPY = "COPY chalk_stage (kind, id, doc, v) FROM STDIN"
_PG_STAGED_UPDATE = """
UPDATE chalk_records r SET doc = s.doc, version = r.version + 1, updated_at = %s
FROM chalk_stage s WHERE s.kind = 0 AND r.id = s.id AND r.version = s.v"""
_PG_STAGED_INSERT = """
INSERT INTO chalk_records (id, doc, version, updated_at)
SELECT id, doc, 1, %s FROM chalk_stage WHERE kind = 1 ORDER BY id
ON CONFLICT (id) DO NOTHING"""
_PG_STAGED_OVERWRITE = """
INSERT INTO chalk_records (id, doc, version, updated_at)
SELECT id, doc, 1, %s FROM chalk_stage WHERE kind = 2 ORDER BY id
ON CONFLICT (id) DO UPDATE SET doc = excluded.doc, version = chalk_records.version + 1,
                              updated_at = excluded.updated_at"""


def _tuples(result: Any) -> list[Any]:
    """All rows as the driver's plain tuples (skips SQLAlchemy's Row objects: 10,000-row results)."""
    try:
        cursor = result.cursor
        return cursor.fetchall() if cursor is not None else result.all()
    except exc.SQLAlchemyError:
        raise
    except Exception as e:  # the driver's own error: fetching is storage work too
        raise StorageError(f"storage failed while reading results: {e}") from e
    finally:
        result.close()


class SqlStore:
    """Records, attachments and leases in one SQL database (SQLite or PostgreSQL URL).

    ``engine`` (the SQLAlchemy engine) and ``dialect`` are public: the
    listener keeps its own tables in the same database and writes them in
    the commit transaction (``Blackboard.commit_many(hook=…)``).  A
    :class:`~blackboard.Blackboard` made over a store it did not open
    (``Blackboard(store, owner=…)``) shares it; ``dispose()`` closes it.
    """

    def __init__(self, url: str, *, engine: Engine | None = None, **engine_options: Any):
        self.url = url
        self.shown = safe_url(url)   # the URL in messages: no password
        try:
            # A pooled SQLite connection to a file never goes stale: no ping (a query) per
            # checkout, which is every batch's commit.
            ping = url.split(":", 1)[0].split("+", 1)[0] != "sqlite"
            self.engine = engine or create_engine(url, pool_pre_ping=ping, **engine_options)
        except (exc.SQLAlchemyError, ImportError, ValueError) as e:
            raise StorageError(f"cannot open storage {safe_url(url)}: "
                               f"{hide_url(str(e), url)}") from e
        self.dialect = self.engine.dialect.name
        if self.dialect not in ("sqlite", "postgresql"):
            raise StorageError(f"storage {safe_url(url)}: dialect {self.dialect!r} is not supported; "
                               "use SQLite or PostgreSQL")
        self._pg = self.dialect == "postgresql"
        # COPY needs psycopg 3 (``postgresql+psycopg://``); other drivers use executemany.
        self._copy = self._pg and self.engine.dialect.driver == "psycopg"
        self._insert = postgresql.insert if self._pg else sqlite.insert
        if not self._pg:
            event.listen(self.engine, "connect", _sqlite_connect)
            event.listen(self.engine, "begin", _sqlite_begin)
        self._build_sqlite_statements()
        self.create_schema()

    # -- schema ---------------------------------------------------------------
    def create_schema(self) -> None:
        """Create the tables and the schema version row when absent (idempotent)."""
        with self.transaction() as tx:
            conn = tx.conn
            if self._pg:  # several processes may open a fresh database at once
                conn.execute(text("SELECT pg_advisory_xact_lock(7011931)"))
            metadata.create_all(conn)
            found = conn.execute(select(meta.c.value).where(meta.c.key == "schema_version")).scalar()
            if found is None:
                conn.execute(self._insert(meta).values(key="schema_version",
                                                       value=str(SCHEMA_VERSION))
                             .on_conflict_do_nothing())
            elif int(found) > SCHEMA_VERSION:
                raise StorageError(f"storage {self.shown} has schema version {found}; this "
                                   f"version of Chalk knows up to {SCHEMA_VERSION}: upgrade Chalk")

    def schema_version(self) -> int:
        with self.transaction(write=False) as tx:
            return int(tx.conn.execute(
                select(meta.c.value).where(meta.c.key == "schema_version")).scalar_one())

    def transaction(self, *, write: bool = True) -> _Transaction:
        """``with store.transaction() as tx: tx.conn.execute(…)`` — commit on success.

        Database failures become :class:`StorageError`.
        """
        return _Transaction(self, write)

    def dispose(self) -> None:
        self.engine.dispose()

    # -- id sets --------------------------------------------------------------
    def _build_sqlite_statements(self) -> None:
        ids = func.json_each(bindparam("ids", type_=Text)).table_valued("value")
        self._id_set = select(ids.c.value).scalar_subquery()
        self._sqlite_delete_attachment = delete(attachments).where(
            attachments.c.record_id == bindparam("b_id"), attachments.c.name == bindparam("b_name"))
        self._sqlite_copy_attachment = text(
            "INSERT INTO chalk_attachments (record_id, name, chunk, data) "
            "SELECT :b_id, :b_name, chunk, data FROM chalk_attachments "
            "WHERE record_id = :b_src_id AND name = :b_src_name")

    def _driver_sql(self, sql: str) -> str:
        return sql.replace("?", "%s") if self._pg else sql

    def _ids_param(self, ids: Sequence[str]) -> Any:
        return list(ids) if self._pg else _json.dumps(list(ids))

    def _in_ids(self, column: Any) -> Any:
        """``column IN <the :ids set>`` (an array on PostgreSQL, json_each on SQLite)."""
        if self._pg:
            return column == func.any(bindparam("ids", type_=postgresql.ARRAY(String)))
        return column.in_(self._id_set)

    # -- leases ---------------------------------------------------------------
    def _take(self, conn: Connection, ids: Sequence[str], owner: str, lease_seconds: float,
              *, read: bool) -> tuple[dict[str, str], Raw]:
        """Upsert our leases on ``ids``; return (holders of the others, stored texts read)."""
        ids = sorted(set(ids))
        now = time.time()
        found: Raw = {}
        if self._pg:
            params = {"ids": ids, "owner": owner, "now": now, "expires": now + lease_seconds}
            rows = _tuples(conn.execute(_PG_TAKE_AND_READ if read else _PG_TAKE_ONLY, params))
            if len(rows) == len(ids):
                if read:
                    found = {rid: (doc, version) for rid, doc, version in rows
                             if doc is not None}
                return {}, found
            return self._holders(conn, ids, owner), {}
        ids_json = _json.dumps(ids)
        taken = conn.exec_driver_sql(_LITE_TAKE, (owner, now + lease_seconds, now,
                                                  ids_json)).rowcount
        # Every row inserted or updated: none held by another owner, no need to ask.
        holders = {} if taken == len(ids) else self._holders(conn, ids, owner)
        if holders or not read:
            return holders, {}
        rows = _tuples(conn.exec_driver_sql(
            "SELECT id, doc, version FROM chalk_records WHERE id IN "
            "(SELECT value FROM json_each(?))", (ids_json,)))
        return {}, {rid: (doc, version) for rid, doc, version in rows}

    @staticmethod
    def _parse(rows: Iterable[tuple[str, str, int]]) -> Found:
        with gc_paused():
            return {rid: (_json.loads(doc), version) for rid, doc, version in rows}

    def _holders(self, conn: Connection, ids: Sequence[str], owner: str) -> dict[str, str]:
        return dict(conn.execute(
            select(leases.c.record_id, leases.c.owner)
            .where(self._in_ids(leases.c.record_id), leases.c.owner != owner),
            {"ids": self._ids_param(ids)}).all())

    def acquire(self, ids: Sequence[str], owner: str, lease_seconds: float) -> dict[str, str]:
        """Lease ``ids`` for ``owner``, all or nothing; return the conflicts (empty on success)."""
        if not ids:
            return {}
        with self.transaction() as tx:
            holders, _ = self._take(tx.conn, ids, owner, lease_seconds, read=False)
            if holders:
                tx.rollback()
            return holders

    def acquire_and_read(self, ids: Sequence[str], owner: str, lease_seconds: float
                         ) -> tuple[dict[str, str], Raw]:
        """Lease ``ids`` (all or nothing) and read their documents, in one transaction.

        Returns ``(holders, found)``: the conflicts (nothing leased then), or
        ``{}`` and ``{id: (JSON text, version)}`` of the records in storage
        (parsing is the caller's, done lazily).
        """
        if not ids:
            return {}, {}
        with self.transaction() as tx:
            holders, found = self._take(tx.conn, ids, owner, lease_seconds, read=True)
            if holders:
                tx.rollback()
            return holders, found

    def read(self, ids: Sequence[str]) -> Found:
        """Read documents without leasing them (for inspection)."""
        with self.transaction(write=False) as tx:
            rows = tx.conn.execute(select(records.c.id, records.c.doc, records.c.version)
                                   .where(self._in_ids(records.c.id)),
                                   {"ids": self._ids_param(list(ids))}).all()
            return self._parse(rows)

    def renew(self, ids: Sequence[str], owner: str, lease_seconds: float) -> int:
        """Extend our leases on ``ids``; return how many we still hold."""
        if not ids:
            return 0
        with self.transaction() as tx:
            return tx.conn.execute(
                update(leases).where(self._in_ids(leases.c.record_id), leases.c.owner == owner)
                .values(expires_at=time.time() + lease_seconds),
                {"ids": self._ids_param(ids)}).rowcount or 0

    def _release(self, conn: Connection, ids: Sequence[str], owner: str) -> set[str]:
        """End our leases on ``ids``; return the ids we still held."""
        if not ids:
            return set()
        if self._pg:
            rows = conn.execute(_PG_RELEASE, {"ids": sorted(ids), "owner": owner})
        else:
            rows = conn.exec_driver_sql(_LITE_RELEASE, (owner, _json.dumps(list(ids))))
        return {rid for (rid,) in _tuples(rows)}

    def release(self, ids: Sequence[str], owner: str) -> None:
        if ids:
            with self.transaction() as tx:
                self._release(tx.conn, ids, owner)

    def purge_expired_leases(self, now: float | None = None) -> int:
        """Drop leases whose holder did not renew them in time (leader maintenance)."""
        with self.transaction() as tx:
            return self.drop_leases(tx.conn, expired_before=time.time() if now is None else now)

    @staticmethod
    def drop_leases(conn: Connection, *, owners: Sequence[str] = (),
                    expired_before: float | None = None) -> int:
        """Inside a transaction the caller opened on this store's engine: drop the
        leases held by ``owners`` (a dead process's) and, with ``expired_before``,
        those that expired before that time.  Returns how many went.

        The caller's transaction makes this part of its own check (a cluster
        leader confirms it still leads in the same transaction).
        """
        dropped = 0
        if owners:
            dropped += conn.execute(delete(leases).where(
                leases.c.owner.in_(list(owners)))).rowcount or 0
        if expired_before is not None:
            dropped += conn.execute(delete(leases).where(
                leases.c.expires_at < expired_before)).rowcount or 0
        return dropped

    def record_count(self) -> int:
        """How many records are stored (``chalk status``)."""
        with self.transaction(write=False) as tx:
            return int(tx.conn.execute(select(func.count()).select_from(records)).scalar_one())

    def scan(self, after: str | None, limit: int, *, docs: bool = False,
             start: str | None = None) -> list[tuple[str, str | None]]:
        """Up to ``limit`` stored records in key order after ``after`` (None: from the
        first, or from ``start`` on): ``(id, stored JSON text or None)``, the text only
        when ``docs``.

        Keyset paging on the primary key: each page is one indexed range read,
        so walking millions of records never holds more than a page.
        """
        columns = [records.c.id, records.c.doc] if docs else [records.c.id]
        query = select(*columns).order_by(records.c.id).limit(limit)
        if after is not None:
            query = query.where(records.c.id > after)
        if start is not None:
            query = query.where(records.c.id >= start)
        with self.transaction(write=False) as tx:
            rows = tx.conn.execute(query).all()
        return [(r[0], r[1] if docs else None) for r in rows]

    def lease_counts(self) -> dict[str, int]:
        """Leases held (expired ones too), by owner (``chalk status``)."""
        with self.transaction(write=False) as tx:
            rows = tx.conn.execute(select(leases.c.owner, func.count()).group_by(leases.c.owner))
            return {owner: int(n) for owner, n in rows}

    def lease_holders(self, ids: Iterable[str]) -> dict[str, tuple[str, float]]:
        """``{id: (owner, expires_at)}`` of the leases on ``ids`` (expired ones too)."""
        with self.transaction(write=False) as tx:
            rows = tx.conn.execute(
                select(leases.c.record_id, leases.c.owner, leases.c.expires_at)
                .where(self._in_ids(leases.c.record_id)), {"ids": self._ids_param(list(ids))})
            return {rid: (owner, expires) for rid, owner, expires in rows}

    # -- commit ---------------------------------------------------------------
    def write(self, ws: WriteSet, owner: str, lease_seconds: float,
              hook: Callable[[Connection], None] | None = None) -> None:
        """Write ``ws`` and end its leases in one transaction (see the module doc).

        ``hook(connection)`` runs last inside the transaction.  Raises
        :class:`StaleRecordError`, writing nothing, when a lease is held by
        another owner, a created record's lease lapsed, or storage changed
        since the load.
        """
        now = time.time()
        with self.transaction() as tx:
            conn = tx.conn
            if ws.take:
                holders, _ = self._take(conn, ws.take, owner, lease_seconds, read=False)
                if holders:
                    tx.rollback()
                    raise self._lost(holders)
            held = self._release(conn, ws.release, owner)
            written = ws.written()
            lost = [rid for rid in written if rid not in held]
            if lost:
                problems: dict[str, str] = dict(self._holders(conn, lost, owner))
                for rid, _ in ws.overwrites:
                    if rid not in held and rid not in problems:
                        problems[rid] = "nobody (the lease lapsed and was released)"
                if problems:
                    tx.rollback()
                    raise self._lost(problems)
            self._write_records(tx, ws, now)
            self._write_attachments(conn, ws)
            if hook is not None:
                hook(conn)

    @staticmethod
    def _lost(holders: dict[str, str]) -> StaleRecordError:
        return StaleRecordError(holders, message=(
            "commit refused, nothing written: the lease on "
            + ", ".join(f"record {r!r} is now held by {h}" if h.startswith("nobody")
                        else f"record {r!r} is now held by {h!r}"
                        for r, h in sorted(holders.items())[:5])
            + (f" and {len(holders) - 5} more" if len(holders) > 5 else "")
            + " (this blackboard held it too long: reload the records and redo the work)"))

    def _write_records(self, tx: _Transaction, ws: WriteSet, now: float) -> None:
        conn = tx.conn
        sql = self._driver_sql
        if self._copy:
            if ws.updates or ws.inserts or ws.overwrites:
                self._copy_records(tx, ws, now)
        else:
            self._execute_records(tx, ws, now)
        checked = [(rid, v) for rid, v in ws.deletes if v is not None]
        if checked:
            count = conn.exec_driver_sql(sql(_DELETE_CHECKED), checked).rowcount
            if count != len(checked):
                self._refuse_stale(tx, dict(checked))
        unchecked = [rid for rid, v in ws.deletes if v is None]
        if unchecked:
            conn.execute(delete(records).where(self._in_ids(records.c.id)),
                         {"ids": self._ids_param(unchecked)})

    def _copy_records(self, tx: _Transaction, ws: WriteSet, now: float) -> None:
        conn = tx.conn
        conn.exec_driver_sql(_PG_STAGE)
        # The driver (psycopg 3) connection is the one SQLAlchemy's transaction
        # runs on, so the COPY is part of that transaction.
        import psycopg  # present: self._copy says the driver is psycopg 3

        driver = conn.connection.driver_connection
        try:
            with driver.cursor() as cur:  # type: ignore[union-attr]
                with cur.copy(_PG_STAGE_COPY) as copy:
                    write = copy.write_row
                    for rid, doc, version in ws.updates:
                        write((0, rid, doc, version))
                    for rid, doc in ws.inserts:
                        write((1, rid, doc, None))
                    for rid, doc in ws.overwrites:
                        write((2, rid, doc, None))
        except psycopg.Error as e:  # not wrapped by SQLAlchemy: the cursor is the driver's
            raise StorageError(f"storage {self.shown} failed: {e}") from e
        if ws.updates:
            count = conn.exec_driver_sql(_PG_STAGED_UPDATE, (now,)).rowcount
            if count != len(ws.updates):
                self._refuse_stale(tx, {rid: v for rid, _, v in ws.updates})
        if ws.inserts:
            count = conn.exec_driver_sql(_PG_STAGED_INSERT, (now,)).rowcount
            if count != len(ws.inserts):
                self._refuse_stale(tx, {rid: 0 for rid, _ in ws.inserts})
        if ws.overwrites:
            conn.exec_driver_sql(_PG_STAGED_OVERWRITE, (now,))

    def _execute_records(self, tx: _Transaction, ws: WriteSet, now: float) -> None:
        conn = tx.conn
        sql = self._driver_sql
        if ws.updates:
            count = conn.exec_driver_sql(sql(_UPDATE), [
                (doc, now, rid, v) for rid, doc, v in ws.updates]).rowcount
            if count != len(ws.updates):
                self._refuse_stale(tx, {rid: v for rid, _, v in ws.updates})
        if ws.inserts:
            count = conn.exec_driver_sql(sql(_INSERT_NEW), [
                (rid, doc, now) for rid, doc in ws.inserts]).rowcount
            if count != len(ws.inserts):
                self._refuse_stale(tx, {rid: 0 for rid, _ in ws.inserts})
        if ws.overwrites:
            # Sorted: concurrent upserts of overlapping batches lock rows in one order.
            conn.exec_driver_sql(sql(_OVERWRITE), sorted(
                (rid, doc, now) for rid, doc in ws.overwrites))

    def _refuse_stale(self, tx: _Transaction, expected: dict[str, int]) -> None:
        """Roll back and raise, naming each record whose stored version moved on."""
        rows = tx.conn.execute(select(records.c.id, records.c.version)
                               .where(self._in_ids(records.c.id)),
                               {"ids": self._ids_param(list(expected))}).all()
        tx.rollback()
        stored = dict(rows)
        stale = {}
        for rid, loaded in expected.items():
            now = stored.get(rid)
            if now == (loaded or None):
                continue
            if loaded == 0:
                stale[rid] = f"created meanwhile by another owner (version {now} in storage)"
            elif now is None:
                stale[rid] = f"deleted meanwhile (version {loaded} was loaded)"
            else:
                stale[rid] = f"version {now} in storage, version {loaded} was loaded"
        stale = stale or {rid: "changed meanwhile" for rid in expected}
        raise StaleRecordError(stale, message=(
            "commit refused, nothing written: storage changed since the load: "
            + ", ".join(f"record {r!r} {why}" for r, why in sorted(stale.items())[:5])
            + (f" and {len(stale) - 5} more" if len(stale) > 5 else "")
            + " (another owner took over an expired lease: reload and redo the work)"))

    def _write_attachments(self, conn: Connection, ws: WriteSet) -> None:
        deleted = [rid for rid, _ in ws.deletes]
        targets = ([(rid, name) for rid, name, _, _ in ws.attachment_copies]
                   + [(rid, name) for rid, name, _ in ws.attachment_writes])
        # Copies first: their source may be a record this same commit deletes
        # (a split parent) or an attachment it rewrites.
        copy_targets = [(rid, name) for rid, name, _, _ in ws.attachment_copies]
        if ws.clear_attachments:
            conn.execute(delete(attachments).where(self._in_ids(attachments.c.record_id)),
                         {"ids": self._ids_param(ws.clear_attachments)})
        self._delete_attachments(conn, copy_targets)
        if ws.attachment_copies:
            if self._pg:
                conn.execute(_PG_COPY_ATTACHMENTS, {
                    "ids": [c[0] for c in ws.attachment_copies],
                    "names": [c[1] for c in ws.attachment_copies],
                    "src_ids": [c[2] for c in ws.attachment_copies],
                    "src_names": [c[3] for c in ws.attachment_copies]})
            else:
                conn.execute(self._sqlite_copy_attachment, [
                    {"b_id": t, "b_name": n, "b_src_id": s, "b_src_name": sn}
                    for t, n, s, sn in ws.attachment_copies])
        if deleted:
            conn.execute(delete(attachments).where(self._in_ids(attachments.c.record_id)),
                         {"ids": self._ids_param(deleted)})
        self._delete_attachments(conn, ws.attachment_removals + targets[len(copy_targets):])
        buffer: list[dict[str, Any]] = []
        size = 0
        for rid, name, opener in ws.attachment_writes:
            stream = opener()
            try:
                number = 0
                while True:
                    data = stream.read(CHUNK_SIZE)
                    if not data:
                        break
                    buffer.append({"record_id": rid, "name": name, "chunk": number, "data": data})
                    size += len(data)
                    number += 1
                    if size >= _WRITE_BUFFER:
                        conn.execute(attachments.insert(), buffer)
                        buffer, size = [], 0
            finally:
                stream.close()
        if buffer:
            conn.execute(attachments.insert(), buffer)

    def _delete_attachments(self, conn: Connection, pairs: list[tuple[str, str]]) -> None:
        if not pairs:
            return
        if self._pg:
            conn.execute(_PG_DELETE_ATTACHMENTS, {"ids": [p[0] for p in pairs],
                                                  "names": [p[1] for p in pairs]})
        else:
            conn.execute(self._sqlite_delete_attachment,
                         [{"b_id": rid, "b_name": name} for rid, name in pairs])

    # -- attachments ----------------------------------------------------------
    def attachment_chunks(self, rid: str, name: str) -> Iterator[bytes]:
        """Yield an attachment's chunks, one short query per chunk (memory stays one chunk)."""
        query = select(attachments.c.data).where(
            attachments.c.record_id == rid, attachments.c.name == name,
            attachments.c.chunk == bindparam("n"))
        number = 0
        while True:
            with self.transaction(write=False) as tx:
                data = tx.conn.execute(query, {"n": number}).scalar()
            if data is None:
                return
            yield bytes(data)
            number += 1

    def attachment_size(self, rid: str, name: str) -> int | None:
        """Stored size of an attachment in bytes (None when absent)."""
        with self.transaction(write=False) as tx:
            row = tx.conn.execute(
                select(func.count(), func.sum(func.length(attachments.c.data))).where(
                    attachments.c.record_id == rid, attachments.c.name == name)).one()
        return int(row[1] or 0) if row[0] else None


_OUTAGES = (exc.DBAPIError, exc.TimeoutError, exc.DisconnectionError)


class _Transaction:
    """``with store.transaction() as tx``: commit on success, roll back on error."""

    def __init__(self, store: SqlStore, write: bool):
        self._store = store
        self._write = write
        self._rolled_back = False

    def __enter__(self) -> _Transaction:
        try:
            self.conn = self._store.engine.connect()
            if not self._write:
                self.conn.execution_options(chalk_readonly=True)
            self._tx = self.conn.begin()
        except _OUTAGES as e:
            if getattr(self, "conn", None) is not None:
                self.conn.close()
            raise StorageError(f"storage {self._store.shown} unavailable: "
                               f"{getattr(e, 'orig', None) or e}") from e
        return self

    def rollback(self) -> None:
        if not self._rolled_back:
            self._rolled_back = True
            self._tx.rollback()

    def __exit__(self, exc_type: Any, exc_value: Any, tb: Any) -> None:
        try:
            if exc_type is None and not self._rolled_back:
                self._tx.commit()
            elif not self._rolled_back:
                self._rolled_back = True
                self._tx.rollback()
        except _OUTAGES as e:
            if exc_type is None:
                raise StorageError(f"storage {self._store.shown}: commit failed: "
                                   f"{getattr(e, 'orig', None) or e}") from e
            log.debug("rollback failed after %r", exc_value, exc_info=True)
        finally:
            self.conn.close()
        if exc_type is not None and issubclass(exc_type, _OUTAGES):
            raise StorageError(f"storage {self._store.shown} failed: "
                               f"{getattr(exc_value, 'orig', None) or exc_value}") from exc_value
