"""The Blackboard: records being processed, their locks, attachments and notes.

A blackboard holds the records one process is working on.  Records enter
with ``create``/``load``/``split`` (which lease them in storage) and leave
with ``commit`` (write, release) or ``invalidate`` (drop, release).  A
blackboard made with :meth:`Blackboard.local` has no storage: it is the
partition-local "proxy blackboard" that workers use; its contents travel back
to the driver's blackboard with ``export_records``/``import_records``.

A blackboard is used by one thread at a time.
"""

from __future__ import annotations

import io
import json
import os
import socket
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import IO, Any

from blackboard._errors import (
    BlackboardError,
    PathError,
    RecordLockedError,
    RecordNotFoundError,
    where,
)
from blackboard._model import (
    Annotation,
    Literal,
    copy_document,
    is_object,
    literal_to_value,
    migrate,
    new_document,
    value_to_literal,
)
from blackboard._navigate import annotation_map, literals_of, object_at, objects_of, parent_of
from blackboard._path import Path, PathLike, as_path
from blackboard._storage import SqlStore, WriteSet

__all__ = ["Blackboard", "FRAGMENT_SEPARATOR", "default_owner"]

FRAGMENT_SEPARATOR = "#"
_SPOOL_MEMORY = 1 << 20  # bytes of a streamed attachment kept in memory before spilling to disk
_MAX_ID = 512


def default_owner() -> str:
    """A lease owner name unique to this process: ``host:pid:random``."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class _Attachment:
    __slots__ = ("data", "spool", "dirty", "source")

    def __init__(self, data: bytes | None = None, spool: IO[bytes] | None = None,
                 dirty: bool = False, source: tuple[str, str] | None = None):
        self.data = data          # bytes held in memory
        self.spool = spool        # or a temporary file (streamed in)
        self.dirty = dirty        # must be written on commit
        self.source = source      # or (record id, name) in storage to read from


class _Entry:
    __slots__ = ("doc", "version", "new", "changed", "deleted", "leased", "attachments",
                 "removed_attachments", "notes")

    def __init__(self, doc: dict[str, Any], version: int | None, *, new: bool, leased: bool):
        self.doc = doc
        self.version = version       # stored version when loaded, None when new
        self.new = new               # not in storage when it came on the blackboard
        self.changed = new
        self.deleted = False
        self.leased = leased
        self.attachments: dict[str, _Attachment] = {}
        self.removed_attachments: set[str] = set()
        self.notes: dict[str, Any] = {}


def _check_id(record_id: Any) -> str:
    if not isinstance(record_id, str) or not record_id.strip():
        raise BlackboardError(f"bad record ID {record_id!r}: IDs are non-empty strings")
    if len(record_id) > _MAX_ID:
        raise BlackboardError(f"bad record ID {record_id[:40]!r}…: longer than {_MAX_ID} characters")
    return record_id


def _json_value(value: Any, what: str) -> Any:
    try:
        json.dumps(value)
    except (TypeError, ValueError) as e:
        raise BlackboardError(f"{what}: value is not JSON-compatible ({e}); notes cross "
                              "processes and machines, so only JSON values are allowed") from e
    return value


def json_to_values(value: Any) -> list[Any]:
    """Message JSON for one attribute → document VALUEs (list → many; dict → sub-object)."""
    items = value if isinstance(value, list) else [value]
    out = []
    for item in items:
        if isinstance(item, dict):
            out.append({"obj": {"attrs": {k: json_to_values(v) for k, v in item.items()}}})
        elif isinstance(item, (str, int, float, bool)):
            out.append(item)
        else:
            raise BlackboardError(f"attribute value {item!r}: use strings, numbers, booleans, "
                                  "lists or objects")
    return out


def values_to_json(values: list[Any]) -> Any:
    """Document VALUEs → plain JSON (single value unwrapped)."""
    out = [
        {k: values_to_json(v) for k, v in (value["obj"].get("attrs") or {}).items()}
        if is_object(value) else (value["lit"] if isinstance(value, dict) else value)
        for value in values
    ]
    return out[0] if len(out) == 1 else out


class Blackboard:
    """Records under processing, persisted through SQLAlchemy (see module doc)."""

    def __init__(self, store: SqlStore | None = None, *, owner: str | None = None,
                 lease_seconds: float = 60.0, lock_timeout: float = 0.0):
        self.store = store
        self.owner = owner or default_owner()
        self.lease_seconds = float(lease_seconds)
        self.lock_timeout = float(lock_timeout)
        self._entries: dict[str, _Entry] = {}
        self._global_notes: dict[str, Any] = {}
        self._instance: dict[str, Any] = {}
        self._workflow_notes: dict[Any, dict[str, Any]] = {}

    # -- opening ----------------------------------------------------------------
    @classmethod
    def connect(cls, url: str, *, owner: str | None = None, lease_seconds: float = 60.0,
                lock_timeout: float = 0.0) -> Blackboard:
        """A blackboard over the store at ``url`` (any SQLAlchemy URL).

        ``lock_timeout`` is how long ``load`` waits for a record another owner
        holds before raising :class:`RecordLockedError` (0: do not wait).
        """
        return cls(SqlStore(url), owner=owner, lease_seconds=lease_seconds,
                   lock_timeout=lock_timeout)

    @classmethod
    def local(cls) -> Blackboard:
        """A blackboard with no storage (a worker's partition-local blackboard)."""
        return cls(None, owner="local")

    def close(self) -> None:
        """Invalidate what is still on the blackboard and release the storage."""
        try:
            if self._entries:
                self.invalidate_many(list(self._entries))
        finally:
            if self.store is not None:
                self.store.dispose()

    def __enter__(self) -> Blackboard:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- lifecycle --------------------------------------------------------------
    def _entry(self, record_id: str) -> _Entry:
        try:
            return self._entries[record_id]
        except KeyError:
            raise RecordNotFoundError(
                f"{where(record_id)} is not on this blackboard: load or create it first",
                record_id=_check_id(record_id) if isinstance(record_id, str) else None) from None

    def _lease(self, ids: list[str]) -> None:
        if self.store is None or not ids:
            return
        deadline = time.monotonic() + self.lock_timeout
        delay = 0.02
        while True:
            holders = self.store.acquire(ids, self.owner, self.lease_seconds)
            if not holders:
                return
            if time.monotonic() + delay > deadline:
                raise RecordLockedError(holders)
            time.sleep(delay)
            delay = min(delay * 2, 0.5)

    def create(self, record_id: str, *, source: str | None = None) -> None:
        """Put a new, empty record on the blackboard (storage is not read; commit overwrites)."""
        _check_id(record_id)
        if record_id in self._entries:
            raise BlackboardError(f"{where(record_id)} is already on this blackboard",
                                  record_id=record_id)
        self._lease([record_id])
        self._entries[record_id] = _Entry(new_document(record_id, source=source), None,
                                          new=True, leased=self.store is not None)

    def load(self, record_id: str) -> None:
        """Load the stored record (or start a new one when absent); see :meth:`is_new`."""
        self.load_many([record_id])

    def load_many(self, ids: Iterable[str]) -> None:
        """Load many records in one transaction; all are leased or none.

        Raises :class:`RecordLockedError` naming every record another owner
        holds (after waiting up to ``lock_timeout``).
        """
        wanted = [i for i in dict.fromkeys(_check_id(i) for i in ids) if i not in self._entries]
        if not wanted:
            return
        found: dict[str, tuple[dict[str, Any], int]] = {}
        if self.store is not None:
            deadline = time.monotonic() + self.lock_timeout
            delay = 0.02
            while True:
                holders, found = self.store.acquire_and_read(wanted, self.owner, self.lease_seconds)
                if not holders:
                    break
                if time.monotonic() + delay > deadline:
                    raise RecordLockedError(holders)
                time.sleep(delay)
                delay = min(delay * 2, 0.5)
        leased = self.store is not None
        for rid in wanted:
            if rid in found:
                doc, version = found[rid]
                entry = _Entry(migrate(doc), version, new=False, leased=leased)
                for name in doc.get("attachments", ()):
                    entry.attachments[name] = _Attachment(source=(rid, name))
            else:
                entry = _Entry(new_document(rid), None, new=True, leased=leased)
            self._entries[rid] = entry

    def is_new(self, record_id: str) -> bool:
        """True when the record was not in storage when it came on the blackboard."""
        return self._entry(record_id).new

    def split(self, record_id: str, fragment: str) -> str:
        """Copy a record to the fragment ``id#fragment`` and return the new ID.

        The fragment keeps a reference to its parent, gets copies of the
        record notes and attachments, and belongs to the same workflow instance.
        """
        entry = self._entry(record_id)
        if not isinstance(fragment, str) or not fragment or FRAGMENT_SEPARATOR in fragment:
            raise BlackboardError(f"{where(record_id)}: bad fragment name {fragment!r} "
                                  f"(non-empty, without {FRAGMENT_SEPARATOR!r})",
                                  record_id=record_id)
        fid = _check_id(f"{record_id}{FRAGMENT_SEPARATOR}{fragment}")
        if fid in self._entries:
            raise BlackboardError(f"{where(fid)} is already on this blackboard", record_id=fid)
        self._lease([fid])
        doc = copy_document(entry.doc)
        doc["id"], doc["parent"] = fid, record_id
        frag = _Entry(doc, None, new=True, leased=self.store is not None)
        for name, att in entry.attachments.items():
            frag.attachments[name] = _Attachment(att.data, None, True, att.source)
            if att.spool is not None:
                frag.attachments[name].data = self._read_spool(att)
        frag.notes = copy_document(entry.notes)
        self._entries[fid] = frag
        if record_id in self._instance:
            self._instance[fid] = self._instance[record_id]
        return fid

    def delete(self, record_id: str) -> None:
        """Mark the record for removal from storage on commit."""
        entry = self._entry(record_id)
        entry.deleted = entry.changed = True

    def is_deleted(self, record_id: str) -> bool:
        return self._entry(record_id).deleted

    def commit(self, record_id: str) -> None:
        self.commit_many([record_id])

    def commit_many(self, ids: Iterable[str], *,
                    hook: Callable[[Any], None] | None = None) -> None:
        """Write the records in one transaction, release their leases, drop them.

        ``hook(connection)`` runs inside the same transaction (the listener
        stores its inbox and outbox there).  Raises :class:`StaleRecordError`
        and writes nothing when a lease was lost or storage holds newer data;
        the records then stay on the blackboard (invalidate them).
        """
        ids = list(dict.fromkeys(ids))
        entries = [(rid, self._entry(rid)) for rid in ids]
        if self.store is not None:
            self.store.write(self._write_set(entries), self.owner, self.lease_seconds, hook)
        for rid, _ in entries:
            self._drop(rid)

    def _write_set(self, entries: list[tuple[str, _Entry]]) -> WriteSet:
        ws = WriteSet([], [], [], [], [rid for rid, _ in entries])
        for rid, entry in entries:
            if entry.deleted:
                ws.deletes.append(rid)
                continue
            if entry.changed or entry.new:
                entry.doc["attachments"] = list(entry.attachments)
                ws.upserts.append((rid, entry.doc, None if entry.new else entry.version))
            for name in entry.removed_attachments:
                if name not in entry.attachments:
                    ws.attachment_removals.append((rid, name))
            for name, att in entry.attachments.items():
                if att.dirty:
                    ws.attachment_writes.append((rid, name, self._opener(att)))
        return ws

    def _opener(self, att: _Attachment) -> Callable[[], IO[bytes]]:
        def open_() -> IO[bytes]:
            return self._open_attachment(att)
        return open_

    def invalidate(self, record_id: str) -> None:
        self.invalidate_many([record_id])

    def invalidate_many(self, ids: Iterable[str]) -> None:
        """Drop the records' changes and release their leases (one transaction).

        Records not on the blackboard are ignored, so a failed batch can be
        invalidated whole without bookkeeping.
        """
        ids = [rid for rid in dict.fromkeys(ids) if rid in self._entries]
        leased = [rid for rid in ids if self._entries[rid].leased]
        for rid in ids:
            self._drop(rid)
        if self.store is not None and leased:
            self.store.release(leased, self.owner)

    def _drop(self, record_id: str) -> None:
        entry = self._entries.pop(record_id)
        for att in entry.attachments.values():
            if att.spool is not None:
                att.spool.close()
        key = self._instance.pop(record_id, None)
        if key is not None and key not in self._instance.values():
            self._workflow_notes.pop(key, None)

    def renew_leases(self) -> int:
        """Extend the leases of every record on the blackboard; return how many we hold."""
        leased = [rid for rid, e in self._entries.items() if e.leased]
        return self.store.renew(leased, self.owner, self.lease_seconds) if self.store and leased else 0

    def ids(self) -> list[str]:
        return list(self._entries)

    def __contains__(self, record_id: object) -> bool:
        return record_id in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def changed_ids(self) -> list[str]:
        return [rid for rid, e in self._entries.items() if e.changed]

    # -- metadata: attributes and literals ---------------------------------------
    def _doc(self, record_id: str, *, change: bool = False) -> dict[str, Any]:
        entry = self._entry(record_id)
        if change:
            entry.changed = True
        return entry.doc

    def _values(self, record_id: str, path: PathLike) -> tuple[Path, list[Any]]:
        p = as_path(path)
        obj, step = parent_of(record_id, self._doc(record_id), p)
        return p, (obj.get("attrs") or {}).get(step.name) or []

    def attribute_names(self, record_id: str, path: PathLike = None) -> list[str]:
        """Attribute names of the record, or of the sub-object ``path`` addresses."""
        p = as_path(path)
        return list((object_at(record_id, self._doc(record_id), p).get("attrs") or {}))

    def has_attribute(self, record_id: str, path: PathLike) -> bool:
        p = as_path(path)
        try:
            obj, step = parent_of(record_id, self._doc(record_id), p)
        except PathError:
            if p.is_empty():
                raise
            return False
        return step.name in (obj.get("attrs") or {})

    def has_literals(self, record_id: str, path: PathLike) -> bool:
        return self.literals_size(record_id, path) > 0

    def literals_size(self, record_id: str, path: PathLike) -> int:
        return len(literals_of(self._values(record_id, path)[1]))

    def get_literals(self, record_id: str, path: PathLike) -> list[Literal]:
        """All literal values of the attribute (``[]`` when the attribute is absent)."""
        return [value_to_literal(v) for v in literals_of(self._values(record_id, path)[1])]

    def get_literal(self, record_id: str, path: PathLike) -> Literal:
        """The literal the last step's index selects (default the first)."""
        p, values = self._values(record_id, path)
        lits = literals_of(values)
        index = p.last.index
        if 0 <= index < len(lits):
            return value_to_literal(lits[index])
        if not lits:
            raise PathError(f"{where(record_id, p)}: attribute {p.last.name!r} has no literal "
                            "values", record_id=record_id, path=p)
        raise PathError(f"{where(record_id, p)}: index {index} out of range: only {len(lits)} "
                        "value(s)", record_id=record_id, path=p)

    def _attr_for_update(self, record_id: str, path: PathLike) -> tuple[Path, dict[str, Any], str]:
        p = as_path(path)
        obj, step = parent_of(record_id, self._doc(record_id, change=True), p, create=True)
        if step.index < 0:
            raise PathError(f"{where(record_id, p)}: index -1 addresses annotations, not values",
                            record_id=record_id, path=p)
        return p, obj, step.name

    def _convert(self, record_id: str, path: Path, value: Any) -> Any:
        try:
            return literal_to_value(value)
        except BlackboardError as e:
            raise BlackboardError(f"{where(record_id, path)}: {e}", record_id=record_id,
                                  path=path) from None

    def set_literals(self, record_id: str, path: PathLike, values: Iterable[Any]) -> None:
        """Replace the attribute's literals (plain values or :class:`Literal`s)."""
        p, obj, name = self._attr_for_update(record_id, path)
        new = [self._convert(record_id, p, v) for v in values]
        attrs = obj.setdefault("attrs", {})
        kept = [v for v in attrs.get(name, ()) if is_object(v)]
        if new or kept:
            attrs[name] = new + kept
        else:
            attrs.pop(name, None)

    def set_literal(self, record_id: str, path: PathLike, value: Any) -> None:
        """Make ``value`` the attribute's only literal (the index is irrelevant)."""
        self.set_literals(record_id, path, [value])

    def add_literal(self, record_id: str, path: PathLike, value: Any) -> None:
        """Append a literal to the attribute (the index is irrelevant)."""
        p, obj, name = self._attr_for_update(record_id, path)
        obj.setdefault("attrs", {}).setdefault(name, []).append(self._convert(record_id, p, value))

    def _remove_value(self, record_id: str, path: PathLike, *, objects: bool, every: bool) -> None:
        p = as_path(path)
        obj, step = parent_of(record_id, self._doc(record_id), p)
        attrs = obj.get("attrs") or {}
        values = attrs.get(step.name)
        kind = "sub-object" if objects else "literal"
        positions = [i for i, v in enumerate(values or ()) if is_object(v) == objects]
        if every:
            doomed = set(positions)
        elif 0 <= step.index < len(positions):
            doomed = {positions[step.index]}
        else:
            raise PathError(f"{where(record_id, p)}: no {kind} at index {step.index}: "
                            f"{len(positions)} {kind}(s)", record_id=record_id, path=p)
        self._entry(record_id).changed = True
        rest = [v for i, v in enumerate(values or ()) if i not in doomed]
        if rest:
            attrs[step.name] = rest
        elif step.name in attrs:
            del attrs[step.name]

    def remove_literal(self, record_id: str, path: PathLike) -> None:
        """Remove the literal the last step's index selects."""
        self._remove_value(record_id, path, objects=False, every=False)

    def remove_literals(self, record_id: str, path: PathLike) -> None:
        """Remove every literal of the attribute (sub-objects stay)."""
        self._remove_value(record_id, path, objects=False, every=True)

    def remove_attribute(self, record_id: str, path: PathLike) -> None:
        """Remove the attribute with all its values and annotations."""
        p = as_path(path)
        obj, step = parent_of(record_id, self._doc(record_id, change=True), p)
        (obj.get("attrs") or {}).pop(step.name, None)
        (obj.get("attr_ann") or {}).pop(step.name, None)

    # -- metadata: sub-objects ------------------------------------------------------
    def has_objects(self, record_id: str, path: PathLike) -> bool:
        return self.object_size(record_id, path) > 0

    def object_size(self, record_id: str, path: PathLike) -> int:
        return len(objects_of(self._values(record_id, path)[1]))

    def remove_object(self, record_id: str, path: PathLike) -> None:
        self._remove_value(record_id, path, objects=True, every=False)

    def remove_objects(self, record_id: str, path: PathLike) -> None:
        self._remove_value(record_id, path, objects=True, every=True)

    def get_object_semantic_type(self, record_id: str, path: PathLike) -> str | None:
        return object_at(record_id, self._doc(record_id), as_path(path)).get("type")

    def set_object_semantic_type(self, record_id: str, path: PathLike,
                                 semantic_type: str | None) -> None:
        obj = object_at(record_id, self._doc(record_id, change=True), as_path(path), create=True)
        if semantic_type:
            obj["type"] = semantic_type
        else:
            obj.pop("type", None)

    # -- annotations --------------------------------------------------------------
    def _annmap(self, record_id: str, path: PathLike, create: bool = False) -> dict[str, Any] | None:
        return annotation_map(record_id, self._doc(record_id, change=create), as_path(path),
                              create=create)

    def annotation_names(self, record_id: str, path: PathLike = None) -> list[str]:
        return list(self._annmap(record_id, path) or {})

    def has_annotations(self, record_id: str, path: PathLike = None) -> bool:
        return bool(self._annmap(record_id, path))

    def has_annotation(self, record_id: str, path: PathLike, name: str) -> bool:
        return name in (self._annmap(record_id, path) or {})

    def get_annotations(self, record_id: str, path: PathLike, name: str) -> list[Annotation]:
        return [Annotation.from_json(a) for a in (self._annmap(record_id, path) or {}).get(name, ())]

    def get_annotation(self, record_id: str, path: PathLike, name: str) -> Annotation | None:
        """The first annotation called ``name``, or None when there is none."""
        found = (self._annmap(record_id, path) or {}).get(name)
        return Annotation.from_json(found[0]) if found else None

    def _ann_json(self, record_id: str, path: PathLike, annotation: Any) -> dict[str, Any]:
        if not isinstance(annotation, Annotation):
            raise BlackboardError(f"{where(record_id, path)}: expected an Annotation, got "
                                  f"{type(annotation).__name__}", record_id=record_id, path=path)
        return annotation.to_json()

    def set_annotations(self, record_id: str, path: PathLike, name: str,
                        annotations: Iterable[Annotation]) -> None:
        items = [self._ann_json(record_id, path, a) for a in annotations]
        annmap = self._annmap(record_id, path, create=True)
        assert annmap is not None
        if items:
            annmap[name] = items
        else:
            annmap.pop(name, None)

    def set_annotation(self, record_id: str, path: PathLike, name: str,
                       annotation: Annotation) -> None:
        self.set_annotations(record_id, path, name, [annotation])

    def add_annotation(self, record_id: str, path: PathLike, name: str,
                       annotation: Annotation) -> None:
        item = self._ann_json(record_id, path, annotation)
        annmap = self._annmap(record_id, path, create=True)
        assert annmap is not None
        annmap.setdefault(name, []).append(item)

    def remove_annotation(self, record_id: str, path: PathLike, name: str) -> None:
        annmap = self._annmap(record_id, path)
        if annmap and name in annmap:
            self._entry(record_id).changed = True
            del annmap[name]

    def remove_annotations(self, record_id: str, path: PathLike = None) -> None:
        annmap = self._annmap(record_id, path)
        if annmap:
            self._entry(record_id).changed = True
            annmap.clear()

    # -- attachments --------------------------------------------------------------
    def attachment_names(self, record_id: str) -> list[str]:
        return list(self._entry(record_id).attachments)

    def has_attachment(self, record_id: str, name: str) -> bool:
        return name in self._entry(record_id).attachments

    def _attachment(self, record_id: str, name: str) -> _Attachment:
        att = self._entry(record_id).attachments.get(name)
        if att is None:
            raise BlackboardError(f"{where(record_id)}: no attachment {name!r}", record_id=record_id)
        return att

    def _open_attachment(self, att: _Attachment) -> IO[bytes]:
        if att.data is not None:
            return io.BytesIO(att.data)
        if att.spool is not None:
            att.spool.seek(0)
            return _NoClose(att.spool)
        if att.source is not None and self.store is not None:
            return _ChunkReader(self.store.attachment_chunks(*att.source))
        raise BlackboardError("attachment content is not available on this blackboard "
                              "(it was not shipped to this worker)")

    def _read_spool(self, att: _Attachment) -> bytes:
        with self._open_attachment(att) as stream:
            return stream.read()

    def get_attachment(self, record_id: str, name: str) -> bytes:
        """The attachment's bytes (use :meth:`get_attachment_stream` for large ones)."""
        att = self._attachment(record_id, name)
        if att.data is not None:
            return att.data
        try:
            return self._read_spool(att)
        except BlackboardError as e:
            raise BlackboardError(f"{where(record_id)}: attachment {name!r}: {e}",
                                  record_id=record_id) from None

    def get_attachment_stream(self, record_id: str, name: str) -> IO[bytes]:
        """A binary stream over the attachment; stored ones are read chunk by chunk."""
        return self._open_attachment(self._attachment(record_id, name))

    def set_attachment(self, record_id: str, name: str, data: bytes) -> None:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise BlackboardError(f"{where(record_id)}: attachment {name!r} must be bytes, got "
                                  f"{type(data).__name__}", record_id=record_id)
        self._put_attachment(record_id, name, _Attachment(bytes(data), dirty=True))

    def set_attachment_from_stream(self, record_id: str, name: str, stream: IO[bytes]) -> None:
        """Copy a binary stream into the attachment without holding it all in memory."""
        self._entry(record_id)
        spool = tempfile.SpooledTemporaryFile(max_size=_SPOOL_MEMORY)
        while True:
            chunk = stream.read(1 << 20)
            if not chunk:
                break
            spool.write(chunk)
        self._put_attachment(record_id, name, _Attachment(spool=spool, dirty=True))

    def _put_attachment(self, record_id: str, name: str, att: _Attachment) -> None:
        if not isinstance(name, str) or not name:
            raise BlackboardError(f"{where(record_id)}: bad attachment name {name!r}",
                                  record_id=record_id)
        entry = self._entry(record_id)
        old = entry.attachments.get(name)
        if old is not None and old.spool is not None:
            old.spool.close()
        entry.attachments[name] = att
        entry.changed = True

    def remove_attachment(self, record_id: str, name: str) -> None:
        entry = self._entry(record_id)
        att = self._attachment(record_id, name)
        if att.spool is not None:
            att.spool.close()
        del entry.attachments[name]
        entry.removed_attachments.add(name)
        entry.changed = True

    # -- notes --------------------------------------------------------------------
    def has_global_note(self, name: str) -> bool:
        return name in self._global_notes

    def get_global_note(self, name: str) -> Any:
        try:
            return self._global_notes[name]
        except KeyError:
            raise BlackboardError(f"no global note {name!r}") from None

    def set_global_note(self, name: str, value: Any) -> None:
        self._global_notes[name] = _json_value(value, f"global note {name!r}")

    def has_record_note(self, record_id: str, name: str) -> bool:
        return name in self._entry(record_id).notes

    def get_record_note(self, record_id: str, name: str) -> Any:
        notes = self._entry(record_id).notes
        if name not in notes:
            raise BlackboardError(f"{where(record_id)}: no record note {name!r}",
                                  record_id=record_id)
        return notes[name]

    def set_record_note(self, record_id: str, name: str, value: Any) -> None:
        self._entry(record_id).notes[name] = _json_value(value, f"{where(record_id)}: note {name!r}")

    def bind_instance(self, key: Any, ids: Iterable[str]) -> None:
        """Say which workflow instance the records belong to (fragments inherit it)."""
        for rid in ids:
            self._entry(rid)
            self._instance[rid] = key

    def instance_of(self, record_id: str) -> Any:
        return self._instance.get(record_id)

    def clear_instance(self, key: Any) -> None:
        """Forget a finished workflow instance and its notes."""
        self._workflow_notes.pop(key, None)
        for rid in [r for r, k in self._instance.items() if k == key]:
            del self._instance[rid]

    def _instance_key(self, record_id: str) -> Any:
        self._entry(record_id)
        if record_id not in self._instance:
            raise BlackboardError(f"{where(record_id)}: not bound to a workflow instance "
                                  "(workflow notes exist only while a workflow runs)",
                                  record_id=record_id)
        return self._instance[record_id]

    def has_workflow_note(self, record_id: str, name: str) -> bool:
        key = self._instance.get(record_id)
        return key is not None and name in self._workflow_notes.get(key, {})

    def get_workflow_note(self, record_id: str, name: str) -> Any:
        notes = self._workflow_notes.get(self._instance_key(record_id), {})
        if name not in notes:
            raise BlackboardError(f"{where(record_id)}: no workflow note {name!r}",
                                  record_id=record_id)
        return notes[name]

    def set_workflow_note(self, record_id: str, name: str, value: Any) -> None:
        key = self._instance_key(record_id)
        self._workflow_notes.setdefault(key, {})[name] = _json_value(
            value, f"{where(record_id)}: workflow note {name!r}")

    # -- documents and transport ----------------------------------------------------
    def document(self, record_id: str) -> dict[str, Any]:
        """The record's document (read-only view; see ``blackboard._model``)."""
        entry = self._entry(record_id)
        entry.doc["attachments"] = list(entry.attachments)
        return entry.doc

    def set_attributes(self, record_id: str, attributes: Mapping[str, Any]) -> None:
        """Write message-style JSON attributes (lists: many values; dicts: sub-objects)."""
        attrs = self._doc(record_id, change=True)["meta"].setdefault("attrs", {})
        for name, value in attributes.items():
            if not isinstance(name, str) or not name or any(c in name for c in "[]/"):
                raise PathError(f"{where(record_id)}: bad attribute name {name!r}",
                                record_id=record_id)
            try:
                attrs[name] = json_to_values(value)
            except BlackboardError as e:
                raise BlackboardError(f"{where(record_id, name)}: {e}", record_id=record_id,
                                      path=name) from None

    def get_attributes(self, record_id: str, names: Iterable[str] | None = None) -> dict[str, Any]:
        """The record's attributes as plain JSON (one value unwrapped, sub-objects as dicts)."""
        attrs = self._doc(record_id)["meta"].get("attrs") or {}
        keys = attrs if names is None else [n for n in names if n in attrs]
        return {name: values_to_json(attrs[name]) for name in keys}

    def export_records(self, ids: Iterable[str], *, attachments: str = "all",
                       notes: bool = True) -> list[dict[str, Any]]:
        """Transport items for ``ids``: ``{"doc", "attachments", "deleted", "new", "notes"}``.

        ``attachments`` selects which attachment bytes travel: ``"all"``,
        ``"changed"`` (set on this blackboard) or ``"none"``.
        """
        out = []
        for rid in ids:
            entry = self._entry(rid)
            blobs: dict[str, bytes] = {}
            if attachments != "none":
                for name, att in entry.attachments.items():
                    if attachments == "all" or att.dirty:
                        blobs[name] = self.get_attachment(rid, name)
            item = {"doc": self.document(rid), "attachments": blobs,
                    "deleted": entry.deleted, "new": entry.new}
            if notes and entry.notes:
                item["notes"] = entry.notes
            out.append(item)
        return out

    def import_records(self, items: Iterable[Mapping[str, Any]], *, changed: bool = True) -> None:
        """Put transport items on this blackboard.

        Records already here are replaced (their attachments: named bytes
        replace, names missing from the document are removed).  Unknown IDs
        come on as new records (fragments made by a worker); their leases are
        taken at commit.  ``changed=False`` loads items as unchanged copies
        (a worker receiving its partition).
        """
        for item in items:
            doc = migrate(item["doc"])
            rid = _check_id(doc["id"])
            entry = self._entries.get(rid)
            if entry is None:
                entry = _Entry(doc, None, new=bool(item.get("new", True)), leased=False)
                self._entries[rid] = entry
                parent = doc.get("parent")
                if parent in self._instance:
                    self._instance[rid] = self._instance[parent]
            else:
                entry.doc = doc
            entry.changed = changed
            entry.deleted = bool(item.get("deleted"))
            if "notes" in item:
                entry.notes = dict(item["notes"])
            names = list(doc.get("attachments", ()))
            for name in list(entry.attachments):
                if name not in names:
                    entry.attachments.pop(name)
                    entry.removed_attachments.add(name)
            blobs = item.get("attachments") or {}
            for name in names:
                if name in blobs:
                    entry.attachments[name] = _Attachment(bytes(blobs[name]), dirty=changed)
                elif name not in entry.attachments:
                    entry.attachments[name] = _Attachment(
                        source=(doc.get("parent") or rid, name) if changed else None)
                    if changed:
                        entry.attachments[name].dirty = entry.new


class _NoClose(io.RawIOBase):
    """A view on a spool that does not close the spool itself."""

    def __init__(self, spool: IO[bytes]):
        self._spool = spool

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._spool.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)


class _ChunkReader(io.RawIOBase):
    """A readable stream over an iterator of byte chunks."""

    def __init__(self, chunks: Any):
        self._chunks = iter(chunks)
        self._buffer = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._buffer:
            try:
                self._buffer = next(self._chunks)
            except StopIteration:
                return 0
        size = min(len(buffer), len(self._buffer))
        buffer[:size] = self._buffer[:size]
        self._buffer = self._buffer[size:]
        return size

