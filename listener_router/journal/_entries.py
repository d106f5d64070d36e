"""The journal entry: what a commit writes for a record, and what a subscriber reads.

An entry is one JSON object (one message in the stream)::

    {"seq": 17, "published_at": 1714564800.123,      # given by the relay
     "journal": "search", "id": "doc-1", "version": 3, "op": "UPDATE",
     "origin": "host/0", "workflow": "AddPipeline", "committed_at": 1714564800.101,
     "attributes": {"title": "Hello"},
     "attachments": {"thumb": {"inline": "<base64>"},
                     "content": {"ref": {"record": "doc-1", "name": "content",
                                         "version": 3, "size": 209715200}}}}

``op`` is ``ADD`` (the record is new in storage: version 1), ``UPDATE`` or
``DELETE`` (no version, attributes or attachments).  ``seq`` numbers the
journal's entries densely in publishing order; a copy of an entry published
again after a crash carries the same number.

Large attachments never enter the log: one of at least ``inline_below``
bytes travels as a reference that :class:`AttachmentSource` resolves,
streamed, through the publisher's blackboard store (the blob store publisher and
subscribers share).  The store keeps only a record's current attachments, so a
reference resolves while the record is still at the entry's version; after
that :class:`AttachmentUnavailable` says so (``superseded``: a later entry
of the record carries the content that replaced it).
"""

from __future__ import annotations

import base64
import io
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

import orjson
from sqlalchemy import Connection

from blackboard import Blackboard, SqlStore, safe_url
from listener_router._errors import InfrastructureError
from listener_router.journal._settings import JournalRule
from listener_router.store import reading

__all__ = ["AttachmentRef", "AttachmentSource", "AttachmentUnavailable", "Entry",
           "EntryEncoder"]

_VERSIONS = {
    "sqlite": "SELECT id, version FROM chalk_records WHERE id IN (SELECT value FROM json_each(?))",
    "postgresql": "SELECT id, version FROM chalk_records WHERE id = ANY(%s::text[])",
}
_SIZE = ("SELECT count(*), coalesce(sum(length(data)), 0) FROM chalk_attachments "
         "WHERE record_id = ? AND name = ?")


class AttachmentUnavailable(InfrastructureError):
    """An attachment reference cannot be resolved (now).

    ``superseded`` is true when the record has moved on to a later version
    (its attachment was replaced or removed): a later entry of the record
    carries what replaced it, and waiting will not bring this one back.
    """

    def __init__(self, message: str, *, superseded: bool = False):
        super().__init__(message)
        self.superseded = superseded


@dataclass(frozen=True, slots=True)
class AttachmentRef:
    """A large attachment left in the publisher's store: record, name, version, size."""

    record: str
    name: str
    version: int
    size: int


# -- writing (the publisher's side) --------------------------------------------------------
class EntryEncoder:
    """Builds a journal's entries for committed records, inside the commit transaction."""

    def __init__(self, rule: JournalRule, origin: str):
        self.rule = rule
        self.origin = origin
        self._condition: Any = None
        if rule.condition:
            import engine

            self._condition = engine.compile_condition(rule.condition)

    def wants(self, workflow: str) -> bool:
        return self.rule.workflow is None or self.rule.workflow == workflow

    def encode(self, conn: Connection, bb: Blackboard, workflow: str,
               record_ids: Sequence[str]) -> list[str]:
        """The entries (JSON text, without ``seq``) of the records of this commit that
        changed and match the journal's condition, in ``record_ids`` order."""
        changed = set(bb.changed_ids())
        chosen = [rid for rid in dict.fromkeys(record_ids) if rid in changed and self._matches(bb, rid)]
        if not chosen:
            return []
        versions = _versions(conn, chosen)
        now = time.time()
        out: list[str] = []
        for rid in chosen:
            entry: dict[str, Any] = {"journal": self.rule.name, "id": rid}
            if bb.is_deleted(rid) or rid not in versions:
                entry.update(op="DELETE", origin=self.origin, workflow=workflow, committed_at=now)
            else:
                version = versions[rid]
                entry.update(version=version, op="ADD" if version == 1 else "UPDATE",
                             origin=self.origin, workflow=workflow, committed_at=now,
                             attributes=bb.get_attributes(rid, self.rule.attributes))
                if self.rule.attachments:
                    attachments = self._attachments(conn, bb, rid, version)
                    if attachments:
                        entry["attachments"] = attachments
            out.append(orjson.dumps(entry).decode())
        return out

    def _matches(self, bb: Blackboard, rid: str) -> bool:
        if self._condition is None:
            return True
        return bool(self._condition.test([bb.document(rid)]))

    def _attachments(self, conn: Connection, bb: Blackboard, rid: str,
                     version: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        limit = self.rule.inline_below
        for name in bb.attachment_names(rid):
            head = b""
            if limit:
                with bb.get_attachment_stream(rid, name) as stream:
                    head = stream.read(limit)
            if limit and len(head) < limit:
                out[name] = {"inline": base64.b64encode(head).decode()}
                continue
            sql = _SIZE.replace("?", "%s") if conn.dialect.name == "postgresql" else _SIZE
            _chunks, size = conn.exec_driver_sql(sql, (rid, name)).one()
            out[name] = {"ref": {"record": rid, "name": name, "version": version,
                                 "size": int(size)}}
        return out


def _versions(conn: Connection, ids: list[str]) -> dict[str, int]:
    """Stored versions of ``ids`` as this transaction sees them (just written)."""
    dialect = conn.dialect.name
    param: Any = ids if dialect == "postgresql" else orjson.dumps(ids).decode()
    return {rid: int(v) for rid, v in conn.exec_driver_sql(_VERSIONS[dialect], (param,))}


def with_number(body: str, seq: int, published_at: float) -> bytes:
    """The stored entry text with its number and publishing time in front."""
    return b'{"seq":%d,"published_at":%.6f,%s' % (seq, published_at, body[1:].encode())


# -- reading (a subscriber's side) -----------------------------------------------------------
@dataclass(slots=True)
class Entry:
    """One journal entry as a subscriber gets it (see the module doc for the fields).

    ``offset`` is its position in the stream.  Attachments: :meth:`attachment`
    (bytes) or :meth:`open_attachment` (a stream; references are read from
    the publisher's store a chunk at a time).
    """

    offset: int
    seq: int
    journal: str
    id: str
    op: str
    version: int | None
    origin: str
    workflow: str
    committed_at: float
    published_at: float
    attributes: dict[str, Any] = field(default_factory=dict)
    attachments: dict[str, bytes | AttachmentRef] = field(default_factory=dict)
    size: int = 0                           # bytes of the entry in the stream
    source: AttachmentSource | None = field(default=None, repr=False)

    @classmethod
    def parse(cls, offset: int, body: bytes, source: AttachmentSource | None = None) -> Entry:
        """Decode a stream message; raises ``ValueError`` naming the offset when it is
        not an entry."""
        try:
            data = orjson.loads(body)
            attachments: dict[str, bytes | AttachmentRef] = {}
            for name, item in (data.get("attachments") or {}).items():
                if "inline" in item:
                    attachments[name] = base64.b64decode(item["inline"])
                else:
                    attachments[name] = AttachmentRef(**item["ref"])
            return cls(offset=offset, seq=int(data["seq"]), journal=data["journal"],
                       id=data["id"], op=data["op"], version=data.get("version"),
                       origin=data.get("origin", ""), workflow=data.get("workflow", ""),
                       committed_at=float(data.get("committed_at", 0.0)),
                       published_at=float(data.get("published_at", 0.0)),
                       attributes=data.get("attributes") or {}, attachments=attachments,
                       size=len(body), source=source)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise ValueError(f"stream offset {offset}: not a journal entry: "
                             f"{type(e).__name__}: {e}") from e

    @property
    def key(self) -> str:
        """The entry's identity: the same for a copy published again (``journal:seq``)."""
        return f"{self.journal}:{self.seq}"

    def attachment(self, name: str) -> bytes:
        """The attachment's bytes (a reference is read whole: prefer :meth:`open_attachment`)."""
        with self.open_attachment(name) as stream:
            return stream.read()

    def open_attachment(self, name: str) -> IO[bytes]:
        """A binary stream over the attachment; raises ``KeyError`` for an unknown name and
        :class:`AttachmentUnavailable` for a reference that cannot be resolved."""
        item = self.attachments[name]
        if isinstance(item, bytes):
            return io.BytesIO(item)
        if self.source is None:
            raise AttachmentUnavailable(
                f"entry {self.key} record {self.id!r}: attachment {name!r} is a reference and "
                "this subscriber has no source store (set 'source' to the publisher's "
                "blackboard URL)")
        return self.source.open(item)

    def describe(self) -> str:
        return f"entry {self.key} (offset {self.offset}, record {self.id!r}, {self.op})"


class AttachmentSource:
    """The publisher's blackboard store, read for attachment references (no leases taken)."""

    def __init__(self, url: str):
        self.url = url
        self._store: SqlStore | None = None

    @property
    def store(self) -> SqlStore:
        if self._store is None:
            self._store = SqlStore(self.url)
        return self._store

    def version(self, rid: str) -> int | None:
        sql = "SELECT version FROM chalk_records WHERE id = ?"
        engine = self.store.engine
        if engine.dialect.name == "postgresql":
            sql = sql.replace("?", "%s")
        with reading(engine) as conn:
            found = conn.exec_driver_sql(sql, (rid,)).scalar()
        return None if found is None else int(found)

    def open(self, ref: AttachmentRef) -> IO[bytes]:
        """A stream over the referenced attachment, checked against the entry's version
        before and after it is read (and its size at the end)."""
        self._check(ref)
        return io.BufferedReader(_RefReader(self, ref), 1 << 20)

    def _check(self, ref: AttachmentRef) -> None:
        now = self.version(ref.record)
        if now == ref.version:
            return
        where = f"record {ref.record!r} attachment {ref.name!r}"
        if now is None:
            raise AttachmentUnavailable(
                f"{where}: the record is no longer in the source store {self._safe_url()} "
                f"(deleted after version {ref.version}); a later entry says so",
                superseded=True)
        raise AttachmentUnavailable(
            f"{where}: the source store has version {now}, the entry version {ref.version}: "
            "it was replaced since; a later entry of the record carries the new content",
            superseded=now > ref.version)

    def _safe_url(self) -> str:
        return safe_url(self.url)

    def chunks(self, ref: AttachmentRef) -> Iterator[bytes]:
        return self.store.attachment_chunks(ref.record, ref.name)

    def close(self) -> None:
        if self._store is not None:
            self._store.dispose()
            self._store = None


class _RefReader(io.RawIOBase):
    """Raw reads over a reference's chunks; at the end the version and size are checked."""

    def __init__(self, source: AttachmentSource, ref: AttachmentRef):
        self._source = source
        self._ref = ref
        self._chunks = source.chunks(ref)
        self._chunk = memoryview(b"")
        self._read = 0
        self._done = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._chunk:
            if self._done:
                return 0
            try:
                self._chunk = memoryview(next(self._chunks))
            except StopIteration:
                self._done = True
                self._finish()
                return 0
        size = min(len(buffer), len(self._chunk))
        buffer[:size] = self._chunk[:size]
        self._chunk = self._chunk[size:]
        self._read += size
        return size

    def _finish(self) -> None:
        self._source._check(self._ref)   # replaced while we read: what we read is mixed
        if self._read != self._ref.size:
            raise AttachmentUnavailable(
                f"record {self._ref.record!r} attachment {self._ref.name!r}: read "
                f"{self._read} bytes, the entry says {self._ref.size}")
