"""A full-text index of records in a local SQLite file (FTS5), and searching it.

SMILA indexed with an embedded Lucene (``lucene.pipelets.LuceneIndexPipelet``,
``LuceneSearchPipelet``); these do the same job without a server: one SQLite
file per index name in a directory, written in one transaction per batch.
Several processes on one machine may write the same index (SQLite locks it);
on a cluster each machine has its own files, so point ``directory`` at
shared storage or index on one machine.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from blackboard import Blackboard
from pipelets._base import Pipelet, PipeletError
from pipelets._config import PipeletConfig
from pipelets.values import text_of

__all__ = ["FullTextIndex", "FullTextSearch", "index_path"]

_SCHEMA = "CREATE VIRTUAL TABLE IF NOT EXISTS records USING fts5(id UNINDEXED, content)"


def index_path(directory: str, name: str) -> Path:
    """The file of index ``name`` in ``directory``."""
    if not name or any(c in name for c in "/\\\x00") or name.startswith("."):
        raise ValueError(f"bad index name {name!r}")
    return Path(directory) / f"{name}.fts.sqlite"


_BUSY_SECONDS = 60.0


def _switch_to_wal(conn: sqlite3.Connection) -> None:
    """WAL mode, waiting for other processes opening the same new file.

    Switching a file to WAL takes an exclusive lock, and SQLite answers
    "database is locked" at once (no busy wait) while another connection opens
    it: two Spark workers opening a new index together.  Tried again for up to
    the busy timeout.
    """
    deadline = time.monotonic() + _BUSY_SECONDS
    delay = 0.005
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() + delay > deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.25)


class _Index:
    """One open index file (a connection per pipelet object; SQLite locks across processes)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None

    @contextmanager
    def connection(self) -> Iterator[sqlite3.Connection]:
        with self.lock:
            if self._conn is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                conn = sqlite3.connect(self.path, timeout=_BUSY_SECONDS, check_same_thread=False,
                                       isolation_level=None)
                try:
                    _switch_to_wal(conn)
                    conn.execute(_SCHEMA)
                except BaseException:
                    conn.close()
                    raise
                self._conn = conn
            yield self._conn


def _index_settings(s: PipeletConfig, config: dict[str, Any]) -> tuple[str, str]:
    directory = s.name("directory", default=os.environ.get("CHALK_INDEX_DIR", "indexes"))
    name = s.name("indexname", "indexName", default=None)
    if name is None:
        raise s.error("indexname", "is required (the index to use)")
    try:
        index_path(directory, name)
    except ValueError as e:
        raise s.error("indexname", str(e)) from None
    return directory, name


def _texts(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for inner in value.values():
            yield from _texts(inner)
    elif isinstance(value, list):
        for inner in value:
            yield from _texts(inner)
    elif value is not None:
        yield text_of(value)


class FullTextIndex(Pipelet):
    """Add records to (or delete them from) a full-text index (SMILA's ``LuceneIndexPipelet``).

    SMILA's configuration works as it is: the ``_indexing`` map with
    ``indexname``/``indexName``, ``executionMode`` (``ADD`` or ``DELETE``) and
    ``allowDoublets``; the same keys may also stand at the top level.  ``ADD``
    indexes the text of the record's ``attributes`` (every attribute, values
    inside sub-objects too, when not given) under its ID and replaces an entry
    of the same ID unless ``allowDoublets``; ``DELETE`` removes the ID's
    entries.  Records go on unchanged.

    Differences from SMILA: fields are not mapped through a data dictionary
    (one text per record); a record that cannot be indexed fails its instance
    (SMILA logged and went on); parameters come from the configuration only,
    not from a record's ``_parameters``.

    Parameters:
        _indexing: SMILA's map of the settings below.
        indexname / indexName: the index (required).
        executionMode: ``ADD`` (default) or ``DELETE``.
        allowDoublets: keep earlier entries of an ID on ADD (default false).
        attributes: the attributes whose text is indexed (default: all).
        directory: where index files are (default ``$CHALK_INDEX_DIR`` or ``indexes``).
    """

    parameters = frozenset({"_indexing", "indexname", "indexName", "executionMode", "allowDoublets",
                            "attributes", "directory"})

    def configure(self, config: dict[str, Any]) -> None:
        super().configure(config)
        merged = dict(config)
        nested = PipeletConfig(type(self).__name__, config).mapping("_indexing", default={})
        for key, value in nested.items():
            if key in merged and key != "_indexing":
                raise PipeletConfig(type(self).__name__, config).error(key, "is given in _indexing and outside it")
            merged[key] = value
        merged.pop("_indexing", None)
        s = PipeletConfig(type(self).__name__, merged)
        unknown = sorted(set(merged) - self.parameters)
        if unknown:
            raise s.error(unknown[0], "unknown in _indexing; accepted: indexname, executionMode, allowDoublets")
        self.directory, self.name = _index_settings(s, merged)
        self.mode: str = s.choice("executionMode", ("ADD", "DELETE"), default="ADD")
        self.doublets: bool = s.boolean("allowDoublets", default=False)
        self.attributes: list[str] | None = s.names("attributes", default=None)
        self._index = _Index(index_path(self.directory, self.name))

    def process(self, blackboard: Blackboard, ids: list[str]) -> list[str]:
        rows: list[tuple[str, str]] = []
        for rid in ids:
            with self.record(rid):
                if self.mode == "ADD":
                    attrs = blackboard.get_attributes(rid, self.attributes)
                    rows.append((rid, "\n".join(t for value in attrs.values() for t in _texts(value))))
        with self._index.connection() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                if self.mode == "DELETE" or not self.doublets:
                    conn.executemany("DELETE FROM records WHERE id = ?", [(rid,) for rid in ids])
                if rows:
                    conn.executemany("INSERT INTO records (id, content) VALUES (?, ?)", rows)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        return ids


class FullTextSearch(Pipelet):
    """Search a full-text index with each record's query (SMILA's ``LuceneSearchPipelet``).

    A record whose ``query`` attribute holds text gets the IDs of the best
    matching indexed records, best first, in ``output`` (and their scores in
    ``scoreAttribute`` when given; higher is better); a record without a query
    passes unchanged.  The query uses SQLite FTS5 syntax (words, "phrases",
    ``AND``/``OR``/``NOT``, ``prefix*``), not Lucene's; a query FTS5 cannot
    read fails its record's instance.  An index that does not exist yet finds
    nothing.

    Parameters:
        indexname / indexName: the index (required).
        query: the attribute holding the query (default ``Query``).
        output: the attribute receiving the IDs (default ``Results``).
        scoreAttribute: an attribute receiving the scores (default: none).
        maxCount: the most results (default 10).
        directory: where index files are (default ``$CHALK_INDEX_DIR`` or ``indexes``).
    """

    parameters = frozenset({"indexname", "indexName", "query", "output", "scoreAttribute", "maxCount",
                            "directory"})

    def configure(self, config: dict[str, Any]) -> None:
        super().configure(config)
        s = PipeletConfig(type(self).__name__, config)
        self.directory, self.name = _index_settings(s, config)
        self.query: str = s.name("query", default="Query")
        self.output: str = s.name("output", default="Results")
        self.score: str | None = s.name("scoreAttribute", default=None)
        self.max_count: int = s.integer("maxCount", default=10, minimum=1)
        self._index = _Index(index_path(self.directory, self.name))

    def process(self, blackboard: Blackboard, ids: list[str]) -> list[str]:
        for rid in ids:
            if not blackboard.has_attribute(rid, self.query):
                continue
            text = text_of(blackboard.get_literals(rid, self.query)[0].value).strip()
            if not text:
                continue
            with self._index.connection() as conn:
                try:
                    found = conn.execute(
                        "SELECT id, -bm25(records) AS score FROM records WHERE records MATCH ? "
                        "ORDER BY score DESC, rowid LIMIT ?", (text, self.max_count)).fetchall()
                except sqlite3.OperationalError as e:
                    raise PipeletError(f"record {rid!r}: query {text!r} is not valid FTS5 syntax: {e}",
                                       record_id=rid, pipelet=type(self).__name__) from e
            with self.record(rid):
                for name, values in ((self.output, [row[0] for row in found]),
                                     (self.score, [float(row[1]) for row in found])):
                    if name is None:
                        continue
                    if values:
                        blackboard.set_literals(rid, name, values)
                    elif blackboard.has_attribute(rid, name):
                        blackboard.remove_attribute(rid, name)
        return ids
