"""The Blackboard: records being processed, their locks, attachments and notes.

A blackboard holds the records one process is working on.  Records enter
with ``create``/``load``/``split`` (which lease them in storage) and leave
with ``commit`` (write, release) or ``invalidate`` (drop, release).  A
blackboard made with :meth:`Blackboard.local` has no storage: it is the
partition-local "proxy blackboard" that workers use; its contents travel back
to the driver's blackboard with ``export_records``/``import_records``.

Each record on a blackboard came in one of three ways, which decides what
its commit checks (see ``blackboard._storage``): ``loaded`` (it was in
storage: the commit needs the version still there), ``absent`` (``load``
found nothing: the commit needs it still absent), ``created`` (``create``,
``split``: the commit overwrites whatever is stored, and needs the lease).

A blackboard is used by one thread at a time.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Callable, Iterable
from typing import IO, Any

from blackboard._attachments import AttachmentsMixin
from blackboard._blobs import Attachment
from blackboard._entry import (
    ABSENT,
    ADD1,
    CREATED,
    LOADED,
    SET,
    SET1,
    no_attachments,
    set_literals_in,
    set_one_in,
)
from blackboard._entry import Entry as _Entry
from blackboard._errors import (
    BlackboardError,
    PathError,
    RecordLockedError,
    RecordNotFoundError,
    ValueTypeError,
    where,
)
from blackboard._model import (
    Annotation,
    Literal,
    copy_document,
    is_object,
    literal_to_value,
    new_document,
    plain_scalar,
    text_literal,
    value_to_literal,
)
from blackboard._navigate import Steps, annotation_map, object_at, objects_of, parent_of, show
from blackboard._notes import NotesMixin
from blackboard._path import TOP_LEVEL, PathLike, path_steps, top_level_step
from blackboard._storage import SqlStore, WriteSet, gc_paused
from blackboard._transport import TransportMixin

__all__ = ["Blackboard", "FRAGMENT_SEPARATOR", "default_owner"]

FRAGMENT_SEPARATOR = "#"
_MAX_ID = 512
_INT_MIN, _INT_MAX = -(1 << 63), (1 << 63) - 1   # what a document holds as a plain int


def default_owner() -> str:
    """A lease owner name unique to this blackboard: ``host:pid:random``."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _check_id(record_id: Any) -> str:
    if not isinstance(record_id, str) or not record_id.strip():
        raise BlackboardError(f"bad record ID {record_id!r}: IDs are non-empty strings")
    if len(record_id) > _MAX_ID:
        raise BlackboardError(f"bad record ID {record_id[:40]!r}…: longer than {_MAX_ID} "
                              "characters")
    return record_id


class Blackboard(AttachmentsMixin, NotesMixin, TransportMixin):
    """Records under processing, persisted through SQLAlchemy (see the module doc).

    Every method that takes a record ID raises :class:`RecordNotFoundError`
    when the record is not on this blackboard, and :class:`PathError` for a
    malformed path or one that addresses nothing; messages name the record
    and the path.
    """

    def __init__(self, store: SqlStore | None = None, *, owner: str | None = None,
                 lease_seconds: float = 60.0, lock_timeout: float = 0.0,
                 own_store: bool = False):
        if lease_seconds <= 0:
            raise BlackboardError(f"lease_seconds must be positive, got {lease_seconds!r}")
        self.store = store
        self.owner = owner or default_owner()
        self.lease_seconds = float(lease_seconds)
        self.lock_timeout = float(lock_timeout)
        self._own_store = own_store
        self._entries: dict[str, _Entry] = {}
        self._global_notes: dict[str, Any] = {}
        self._instance: dict[str, Any] = {}
        self._members: dict[Any, set[str]] = {}
        self._workflow_notes: dict[Any, dict[str, Any]] = {}

    # -- opening ----------------------------------------------------------------
    @classmethod
    def connect(cls, url: str, *, owner: str | None = None, lease_seconds: float = 60.0,
                lock_timeout: float = 0.0, **engine_options: Any) -> Blackboard:
        """A blackboard over the store at ``url`` (a SQLite or PostgreSQL SQLAlchemy URL).

        ``owner`` names this blackboard's leases (default: unique to it);
        ``lease_seconds`` is how long a lease lasts unless renewed or ended;
        ``lock_timeout`` is how long ``load``/``create`` wait for a record
        another owner holds before raising :class:`RecordLockedError` (0: do
        not wait).  Raises :class:`StorageError` when the store is unreachable.
        """
        return cls(SqlStore(url, **engine_options), owner=owner, lease_seconds=lease_seconds,
                   lock_timeout=lock_timeout, own_store=True)

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
            if self.store is not None and self._own_store:
                self.store.dispose()

    def __enter__(self) -> Blackboard:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- lifecycle --------------------------------------------------------------
    def _entry(self, record_id: str) -> _Entry:
        try:
            return self._entries[record_id]
        except (KeyError, TypeError):
            _check_id(record_id)
            raise RecordNotFoundError(
                f"{where(record_id)} is not on this blackboard: load or create it first",
                record_id=record_id) from None

    def _new_entry(self, doc: dict[str, Any] | None, version: int | None, mode: str,
                   leased: bool) -> _Entry:
        return _Entry(doc, version, mode, leased)

    def _wait(self, attempt: Callable[[], dict[str, str]], lock_timeout: float | None) -> None:
        """Run ``attempt`` until it reports no holders or the lock timeout passes."""
        timeout = self.lock_timeout if lock_timeout is None else float(lock_timeout)
        deadline = time.monotonic() + timeout
        delay = 0.02
        while True:
            holders = attempt()
            if not holders:
                return
            if time.monotonic() + delay > deadline:
                waited = f" after waiting {timeout:g} s" if timeout > 0 else ""
                shown = ", ".join(f"record {r!r} is held by {h!r}"
                                  for r, h in sorted(holders.items())[:5])
                more = f" and {len(holders) - 5} more" if len(holders) > 5 else ""
                raise RecordLockedError(holders, message=(
                    f"cannot lease for {self.owner!r}{waited}: {shown}{more} (their lease "
                    "ends when they commit or invalidate, or when it expires unrenewed)"))
            time.sleep(delay)
            delay = min(delay * 2, 0.5)

    def _lease(self, ids: list[str], lock_timeout: float | None) -> None:
        store = self.store
        if store is not None and ids:
            self._wait(lambda: store.acquire(ids, self.owner, self.lease_seconds), lock_timeout)

    def create(self, record_id: str, *, source: str | None = None,
               lock_timeout: float | None = None) -> None:
        """Put a new, empty record on the blackboard and lease it.

        Storage is not read; committing overwrites a stored record of that ID.
        Raises :class:`RecordLockedError` when another owner holds it.
        """
        _check_id(record_id)
        if record_id in self._entries:
            raise BlackboardError(f"{where(record_id)} is already on this blackboard",
                                  record_id=record_id)
        self._lease([record_id], lock_timeout)
        self._entries[record_id] = _Entry(new_document(record_id, source=source), None,
                                          CREATED, leased=self.store is not None)

    def load(self, record_id: str, *, lock_timeout: float | None = None) -> None:
        """Lease and read the stored record, or start a new one when absent (:meth:`is_new`).

        A record already on this blackboard is left as it is.
        """
        self.load_many([record_id], lock_timeout=lock_timeout)

    def load_many(self, ids: Iterable[str], *, lock_timeout: float | None = None) -> None:
        """Lease and read many records in one transaction: all are leased or none.

        Raises :class:`RecordLockedError` naming every record another owner
        holds (after waiting up to ``lock_timeout``, default the blackboard's).
        """
        entries = self._entries
        wanted = [i for i in dict.fromkeys(ids) if i not in entries]
        for rid in wanted:
            if type(rid) is not str or not rid or len(rid) > _MAX_ID:
                _check_id(rid)
        if not wanted:
            return
        with gc_paused():
            self._load(wanted, lock_timeout)

    def _load(self, wanted: list[str], lock_timeout: float | None) -> None:
        found: dict[str, tuple[str, int]] = {}
        store = self.store
        if store is not None:
            def attempt() -> dict[str, str]:
                nonlocal found
                holders, found = store.acquire_and_read(wanted, self.owner, self.lease_seconds)
                return holders
            self._wait(attempt, lock_timeout)
        leased = store is not None
        entries = self._entries
        for rid in wanted:
            hit = found.get(rid)
            if hit is not None:
                raw, version = hit
                entry = _Entry(None, version, LOADED, leased, raw)
                if not no_attachments(raw):  # parse now: the names are needed
                    for name in entry.doc.get("attachments") or ():
                        entry.attachments[name] = Attachment(source=(rid, name))
            else:
                entry = _Entry(new_document(rid), None, ABSENT, leased)
            entries[rid] = entry

    def is_new(self, record_id: str) -> bool:
        """True when the record was not in storage when it came on the blackboard."""
        return self._entry(record_id).mode != LOADED

    def parent_id(self, record_id: str) -> str | None:
        """The ID of the record a fragment was split from (None for other records)."""
        return self._entry(record_id).doc.get("parent")

    def get_source(self, record_id: str) -> str | None:
        """The source the record belongs to (None: none)."""
        return self._entry(record_id).doc.get("source")

    def set_source(self, record_id: str, source: str | None) -> None:
        """Make the record belong to ``source`` (None: to none); written on commit.

        Raises :class:`ValueTypeError` for a source that is not a string or None.
        """
        if source is not None and not isinstance(source, str):
            raise ValueTypeError(f"{where(record_id)}: source {source!r} is not a string",
                                 record_id=record_id)
        if self._entry(record_id).doc.get("source") != source:
            self._doc(record_id, change=True)["source"] = source

    def split(self, record_id: str, fragment: str, *, lock_timeout: float | None = None) -> str:
        """Copy a record to the fragment ``id#fragment``, lease it, and return its ID.

        The fragment keeps a reference to its parent, gets copies of the
        record notes and attachments, and belongs to the same workflow
        instance.  Committing it overwrites a stored record of that ID.
        """
        entry = self._entry(record_id)
        if not isinstance(fragment, str) or not fragment.strip() \
                or FRAGMENT_SEPARATOR in fragment:
            raise BlackboardError(f"{where(record_id)}: bad fragment name {fragment!r} "
                                  f"(non-empty, without {FRAGMENT_SEPARATOR!r})",
                                  record_id=record_id)
        fid = _check_id(f"{record_id}{FRAGMENT_SEPARATOR}{fragment}")
        if fid in self._entries:
            raise BlackboardError(f"{where(fid)} is already on this blackboard", record_id=fid)
        self._lease([fid], lock_timeout)
        doc = copy_document(entry.doc)
        doc["id"], doc["parent"] = fid, record_id
        frag = _Entry(doc, None, CREATED, leased=self.store is not None)
        for name, att in entry.attachments.items():
            frag.attachments[name] = att.copy()
        frag.notes = copy_document(entry.notes)
        self._entries[fid] = frag
        if record_id in self._instance:
            self._bind(fid, self._instance[record_id])
        return fid

    def delete(self, record_id: str) -> None:
        """Mark the record for removal from storage on commit (with its attachments)."""
        entry = self._entry(record_id)
        entry.deleted = entry.changed = True

    def is_deleted(self, record_id: str) -> bool:
        return self._entry(record_id).deleted

    def commit(self, record_id: str, *, hook: Callable[[Any], None] | None = None) -> None:
        """Write the record, release its lease and drop it (see :meth:`commit_many`)."""
        self.commit_many([record_id], hook=hook)

    def commit_many(self, ids: Iterable[str], *,
                    hook: Callable[[Any], None] | None = None) -> None:
        """Write the records in one transaction, release their leases, drop them.

        ``hook(connection)`` runs inside the same transaction, after the
        records are written (the listener stores its inbox and outbox there).
        Raises :class:`StaleRecordError`, writing nothing, when another owner
        holds a lease now or storage changed since the load; the records then
        stay on the blackboard (invalidate them).  :class:`StorageError` when
        the database fails (nothing written either).
        """
        ids = list(dict.fromkeys(ids))
        known = self._entries
        entries = [(rid, known[rid] if rid in known else self._entry(rid)) for rid in ids]
        if self.store is not None:
            with gc_paused():  # the documents made here die at once: nothing to collect
                ws = self._write_set(entries)
                self.store.write(ws, self.owner, self.lease_seconds, hook)
        self._drop_many(entries)

    def _write_set(self, entries: list[tuple[str, _Entry]]) -> WriteSet:
        ws = WriteSet()
        release, update = ws.release.append, ws.updates.append  # once per record: hot
        for rid, entry in entries:
            release(rid)
            if not entry.leased:
                ws.take.append(rid)
            mode = entry.mode
            if entry.deleted:
                if mode != ABSENT:
                    ws.deletes.append((rid, entry.version if mode == LOADED else None))
                continue
            if entry.changed:
                text = entry.encoded()
                if mode == LOADED:
                    update((rid, text, entry.version))  # type: ignore[arg-type]
                elif mode == ABSENT:
                    ws.inserts.append((rid, text))
                else:
                    ws.overwrites.append((rid, text))
                    ws.clear_attachments.append(rid)
            if not entry.attachments and not entry.removed_attachments:
                continue
            for name in entry.removed_attachments:
                if name not in entry.attachments and mode == LOADED:
                    ws.attachment_removals.append((rid, name))
            for name, att in entry.attachments.items():
                if not att.dirty:
                    continue
                if att.data is None and att.spool is None:
                    if att.source is not None and att.source != (rid, name):
                        ws.attachment_copies.append((rid, name, *att.source))
                else:
                    ws.attachment_writes.append((rid, name, self._opener(rid, name, att)))
        return ws

    def _opener(self, rid: str, name: str, att: Attachment) -> Callable[[], IO[bytes]]:
        return lambda: self._open(rid, name, att)

    def invalidate(self, record_id: str) -> None:
        """Drop the record's changes and release its lease (see :meth:`invalidate_many`)."""
        self.invalidate_many([record_id])

    def invalidate_many(self, ids: Iterable[str]) -> None:
        """Drop the records' changes and release their leases (one transaction).

        Nothing was written for them, so a record created new on this
        blackboard leaves no trace in storage.  Records not on the blackboard
        are ignored, so a failed batch can be invalidated whole.
        """
        known = self._entries
        entries = [(rid, known[rid]) for rid in dict.fromkeys(ids) if rid in known]
        leased = [rid for rid, entry in entries if entry.leased]
        self._drop_many(entries)
        if self.store is not None and leased:
            self.store.release(leased, self.owner)

    def _drop(self, record_id: str) -> None:
        self._drop_many([(record_id, self._entries[record_id])])

    def _drop_many(self, entries: list[tuple[str, _Entry]]) -> None:
        pop, bound = self._entries.pop, self._instance
        for rid, entry in entries:
            pop(rid)
            if entry.attachments:
                for att in entry.attachments.values():
                    att.close()
            if rid in bound:
                self._unbind(rid)

    def renew_leases(self, ids: Iterable[str] | None = None) -> int:
        """Extend the leases of the records (default: all on this blackboard).

        Returns how many leases this blackboard still holds.  Call it during
        work longer than ``lease_seconds``.
        """
        wanted = list(self._entries) if ids is None else list(ids)
        leased = [rid for rid in wanted if rid in self._entries and self._entries[rid].leased]
        return self.store.renew(leased, self.owner, self.lease_seconds) \
            if self.store is not None and leased else 0

    def ids(self) -> list[str]:
        """IDs on the blackboard."""
        return list(self._entries)

    def __contains__(self, record_id: object) -> bool:
        return record_id in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def changed_ids(self) -> list[str]:
        """IDs changed (or new, or marked deleted) since they came on this blackboard."""
        return [rid for rid, e in self._entries.items() if e.changed]

    # -- metadata: attributes and literals ---------------------------------------
    def _doc(self, record_id: str, *, change: bool = False) -> dict[str, Any]:
        entry = self._entry(record_id)
        if change:
            entry.changed = True
        return entry.doc

    def _steps(self, record_id: str, path: PathLike) -> Steps:
        try:
            return path_steps(path)
        except PathError as e:
            raise PathError(f"{where(record_id)}: {e}", record_id=record_id,
                            path=path if isinstance(path, str) else None) from None

    def _values(self, record_id: str, path: PathLike) -> tuple[Steps, list[Any]]:
        steps = self._steps(record_id, path)
        obj, step = parent_of(record_id, self._doc(record_id), steps)
        attrs = obj.get("attrs")
        return steps, (attrs.get(step.name) if attrs else None) or []

    def attribute_names(self, record_id: str, path: PathLike = None) -> list[str]:
        """Attribute names of the record, or of the sub-object ``path`` addresses."""
        steps = self._steps(record_id, path)
        return list(object_at(record_id, self._doc(record_id), steps).get("attrs") or {})

    def has_attribute(self, record_id: str, path: PathLike) -> bool:
        """True when the attribute has values (False also when a sub-object on the way is missing)."""
        steps = self._steps(record_id, path)
        try:
            obj, step = parent_of(record_id, self._doc(record_id), steps)
        except PathError:
            if not steps:
                raise
            return False
        return step.name in (obj.get("attrs") or {})

    def remove_attribute(self, record_id: str, path: PathLike) -> None:
        """Remove the attribute with all its values and annotations."""
        steps = self._steps(record_id, path)
        obj, step = parent_of(record_id, self._doc(record_id), steps)
        self._entry(record_id).changed = True
        (obj.get("attrs") or {}).pop(step.name, None)
        (obj.get("attr_ann") or {}).pop(step.name, None)

    def has_literals(self, record_id: str, path: PathLike) -> bool:
        return self.literals_size(record_id, path) > 0

    def literals_size(self, record_id: str, path: PathLike) -> int:
        """How many literal values the attribute has (0 when it is absent)."""
        return sum(1 for v in self._values(record_id, path)[1] if not is_object(v))

    def _top_values(self, record_id: str, path: PathLike) -> tuple[list[Any], int] | None:
        """The values and index ``path`` addresses when it is one step (a top-level attribute
        with values) on a record here: the reads' inlined hot path.  Else None, for the
        general way (which also raises every error)."""
        entry = self._entries.get(record_id) if type(record_id) is str else None
        if entry is not None and type(path) is str:
            top = top_level_step(path)
            if top is not None:
                attrs = entry.doc["meta"].get("attrs")
                values = attrs.get(top[0]) if attrs else None
                if values:
                    return values, top[1]
        return None

    def get_literals(self, record_id: str, path: PathLike) -> list[Literal]:
        """All literal values of the attribute (``[]`` when the attribute is absent)."""
        top = self._top_values(record_id, path)
        values = top[0] if top is not None else self._values(record_id, path)[1]
        return [value_to_literal(v) for v in values if not is_object(v)]

    def get_literal(self, record_id: str, path: PathLike) -> Literal:
        """The literal the last step's index selects (default the first).

        Raises :class:`PathError` when there is no literal at that index.
        """
        # The hot path (a top-level attribute, the literal there) is inlined; the rest,
        # and every error, takes the general way.
        entry = self._entries.get(record_id) if type(record_id) is str else None
        if entry is not None and type(path) is str:
            top = TOP_LEVEL.get(path) or top_level_step(path)
            if top is not None:
                doc = entry._doc
                attrs = (entry.doc if doc is None else doc)["meta"].get("attrs")
                values = attrs.get(top[0]) if attrs else None
                index = top[1]
                for v in values or ():
                    kind = type(v)
                    if kind is str:
                        if index == 0:
                            return text_literal(v)
                        index -= 1
                    elif kind is not dict or "obj" not in v:
                        if index == 0:
                            return value_to_literal(v)
                        index -= 1
        steps, values = self._values(record_id, path)
        lits = [v for v in values if not is_object(v)]
        index = steps[-1].index
        if 0 <= index < len(lits):
            return value_to_literal(lits[index])
        if index < 0:
            message = "index -1 addresses the attribute's annotations, not a literal"
        elif not lits:
            message = f"attribute {steps[-1].name!r} has no literal values"
        else:
            message = f"index {index} out of range: only {len(lits)} literal value(s)"
        raise PathError(f"{where(record_id, show(steps))}: {message}", record_id=record_id,
                        path=show(steps))

    def _convert(self, record_id: str, steps: Steps, value: Any) -> Any:
        try:
            return literal_to_value(value)
        except BlackboardError as e:
            raise ValueTypeError(f"{where(record_id, show(steps))}: {e}", record_id=record_id,
                                 path=show(steps)) from None

    def _top_level(self, record_id: str, path: PathLike) -> tuple[_Entry, Steps] | None:
        """(entry, steps) when the write can be deferred: unparsed record, top-level attribute."""
        try:
            entry = self._entries.get(record_id)
        except TypeError:
            return None
        if entry is None or entry._doc is not None:
            return None
        steps = self._steps(record_id, path)
        if len(steps) != 1 or steps[0].index < 0:
            return None
        return entry, steps

    def _attr_for_update(self, record_id: str, path: PathLike,
                         values: Iterable[Any]) -> tuple[dict[str, Any], str, list[Any]]:
        steps = self._steps(record_id, path)
        if not steps:
            raise PathError(f"{where(record_id)}: an attribute path is needed here, got the "
                            "empty path", record_id=record_id, path="")
        if steps[-1].index < 0:
            raise PathError(f"{where(record_id, show(steps))}: index -1 addresses the "
                            "attribute's annotations, not its values", record_id=record_id,
                            path=show(steps))
        new = [self._convert(record_id, steps, v) for v in values]
        entry = self._entry(record_id)
        obj, step = parent_of(record_id, entry.doc, steps, create=True)
        entry.changed = True
        return obj, step.name, new

    def set_literals(self, record_id: str, path: PathLike, values: Iterable[Any]) -> None:
        """Replace the attribute's literals (plain values or :class:`Literal`\\ s).

        Sub-objects of the attribute stay.  Missing sub-objects on the way are
        created (only as the next free index).
        """
        if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
            raise ValueTypeError(f"{where(record_id, path)}: set_literals takes a list of "
                                 f"values, got {type(values).__name__} (use set_literal)",
                                 record_id=record_id, path=path)
        top = self._top_level(record_id, path)
        if top is not None:
            entry, steps = top
            new = [self._convert(record_id, steps, v) for v in values]
            entry.defer(SET, steps[0].name, new)
            return
        obj, name, new = self._attr_for_update(record_id, path, values)
        set_literals_in(obj, name, new)

    def set_literal(self, record_id: str, path: PathLike, value: Any) -> None:
        """Make ``value`` the attribute's only literal (the index is irrelevant)."""
        # The hot path (a top-level attribute) is inlined: deferred on a record not
        # parsed yet, set_literals_in's work on a parsed one.
        entry = self._entries.get(record_id) if type(record_id) is str else None
        if entry is not None and type(path) is str:
            top = TOP_LEVEL.get(path) or top_level_step(path)
            if top is not None:
                name = top[0]
                kind = type(value)
                if kind is not str and not (kind is int and _INT_MIN <= value <= _INT_MAX) \
                        and not plain_scalar(value):
                    value = self._convert(record_id, path_steps(path), value)
                doc = entry._doc
                if doc is None:
                    entry.defer(SET1, name, value)
                    return
                entry.changed = True
                meta = doc["meta"]
                attrs = meta.get("attrs")
                if attrs is None:
                    attrs = meta["attrs"] = {}
                old = attrs.get(name)
                if old is None or (len(old) == 1 and type(old[0]) is not dict):
                    attrs[name] = [value]  # nothing to keep (only sub-objects are kept)
                else:
                    set_one_in(attrs, name, value)
                return
        self.set_literals(record_id, path, (value,))

    def add_literal(self, record_id: str, path: PathLike, value: Any) -> None:
        """Append a literal to the attribute (the index is irrelevant)."""
        entry = self._entries.get(record_id) if type(record_id) is str else None
        if entry is not None and entry._doc is None and type(path) is str:
            top = top_level_step(path)
            if top is not None:
                if type(value) is not str:
                    value = self._convert(record_id, path_steps(path), value)
                entry.defer(ADD1, top[0], value)
                return
        obj, name, new = self._attr_for_update(record_id, path, (value,))
        obj.setdefault("attrs", {}).setdefault(name, []).extend(new)

    def _remove_value(self, record_id: str, path: PathLike, *, objects: bool, every: bool) -> None:
        steps = self._steps(record_id, path)
        obj, step = parent_of(record_id, self._doc(record_id), steps)
        attrs = obj.get("attrs") or {}
        values = attrs.get(step.name) or []
        kind = "sub-object" if objects else "literal"
        positions = [i for i, v in enumerate(values) if is_object(v) == objects]
        if every:
            doomed = set(positions)
        elif 0 <= step.index < len(positions):
            doomed = {positions[step.index]}
        else:
            raise PathError(f"{where(record_id, show(steps))}: no {kind} at index {step.index}: "
                            f"the attribute has {len(positions)} {kind}(s)",
                            record_id=record_id, path=show(steps))
        if not doomed:
            return
        self._entry(record_id).changed = True
        rest = [v for i, v in enumerate(values) if i not in doomed]
        if rest:
            attrs[step.name] = rest
        else:
            del attrs[step.name]

    def remove_literal(self, record_id: str, path: PathLike) -> None:
        """Remove the literal the last step's index selects (PathError when there is none)."""
        self._remove_value(record_id, path, objects=False, every=False)

    def remove_literals(self, record_id: str, path: PathLike) -> None:
        """Remove every literal of the attribute (sub-objects stay; absent: no-op)."""
        self._remove_value(record_id, path, objects=False, every=True)

    # -- metadata: sub-objects ------------------------------------------------------
    def has_objects(self, record_id: str, path: PathLike) -> bool:
        return self.object_size(record_id, path) > 0

    def object_size(self, record_id: str, path: PathLike) -> int:
        """How many sub-objects the attribute has (0 when it is absent)."""
        return len(objects_of(self._values(record_id, path)[1]))

    def add_object(self, record_id: str, path: PathLike,
                   semantic_type: str | None = None) -> int:
        """Append an empty sub-object to the attribute; return its index."""
        steps = self._steps(record_id, path)
        if not steps or steps[-1].index < 0:
            raise PathError(f"{where(record_id, show(steps))}: add_object needs an attribute "
                            "path", record_id=record_id, path=show(steps))
        if semantic_type is not None and not isinstance(semantic_type, str):
            raise ValueTypeError(f"{where(record_id, show(steps))}: semantic type must be a "
                                 "string", record_id=record_id, path=show(steps))
        entry = self._entry(record_id)
        obj, step = parent_of(record_id, entry.doc, steps, create=True)
        entry.changed = True
        values = obj.setdefault("attrs", {}).setdefault(step.name, [])
        new: dict[str, Any] = {"type": semantic_type} if semantic_type else {}
        values.append({"obj": new})
        return sum(1 for v in values if is_object(v)) - 1

    def remove_object(self, record_id: str, path: PathLike) -> None:
        """Remove the sub-object the last step's index selects (PathError when there is none)."""
        self._remove_value(record_id, path, objects=True, every=False)

    def remove_objects(self, record_id: str, path: PathLike) -> None:
        """Remove every sub-object of the attribute (literals stay; absent: no-op)."""
        self._remove_value(record_id, path, objects=True, every=True)

    def get_object_semantic_type(self, record_id: str, path: PathLike) -> str | None:
        """The semantic type of the sub-object (of the record for the empty path), or None."""
        steps = self._steps(record_id, path)
        return object_at(record_id, self._doc(record_id), steps).get("type")

    def set_object_semantic_type(self, record_id: str, path: PathLike,
                                 semantic_type: str | None) -> None:
        """Set the sub-object's semantic type (created when it is the next free index)."""
        if semantic_type is not None and not isinstance(semantic_type, str):
            raise ValueTypeError(f"{where(record_id, path)}: semantic type must be a string, "
                                 f"got {type(semantic_type).__name__}", record_id=record_id,
                                 path=path)
        steps = self._steps(record_id, path)
        entry = self._entry(record_id)
        obj = object_at(record_id, entry.doc, steps, create=True)
        entry.changed = True
        if semantic_type:
            obj["type"] = semantic_type
        else:
            obj.pop("type", None)

    # -- annotations --------------------------------------------------------------
    # The empty path (or None) addresses the record's own annotations; a last
    # step with index -1 the attribute's; any other path the sub-object's.
    # Annotations of a literal travel inside its Literal.
    def _annmap(self, record_id: str, path: PathLike, create: bool = False) -> dict[str, Any] | None:
        steps = self._steps(record_id, path)
        entry = self._entry(record_id)
        annmap = annotation_map(record_id, entry.doc, steps, create=create)
        if create:
            entry.changed = True
        return annmap

    def annotation_names(self, record_id: str, path: PathLike = None) -> list[str]:
        return list(self._annmap(record_id, path) or {})

    def has_annotations(self, record_id: str, path: PathLike = None) -> bool:
        return bool(self._annmap(record_id, path))

    def has_annotation(self, record_id: str, path: PathLike, name: str) -> bool:
        return name in (self._annmap(record_id, path) or {})

    def get_annotations(self, record_id: str, path: PathLike, name: str) -> list[Annotation]:
        """All annotations called ``name`` (``[]`` when there are none)."""
        return [Annotation.from_json(a) for a in (self._annmap(record_id, path) or {}).get(name, ())]

    def get_annotation(self, record_id: str, path: PathLike, name: str) -> Annotation | None:
        """The first annotation called ``name``, or None when there is none."""
        found = (self._annmap(record_id, path) or {}).get(name)
        return Annotation.from_json(found[0]) if found else None

    def _ann_json(self, record_id: str, path: PathLike, annotation: Any) -> dict[str, Any]:
        if not isinstance(annotation, Annotation):
            raise ValueTypeError(f"{where(record_id, path)}: expected an Annotation, got "
                                 f"{type(annotation).__name__}", record_id=record_id, path=path)
        return annotation.to_json()

    @staticmethod
    def _check_name(record_id: str, path: PathLike, name: Any) -> None:
        if not isinstance(name, str) or not name:
            raise ValueTypeError(f"{where(record_id, path)}: annotation name must be a "
                                 f"non-empty string, got {name!r}", record_id=record_id, path=path)

    def set_annotations(self, record_id: str, path: PathLike, name: str,
                        annotations: Iterable[Annotation]) -> None:
        """Replace the annotations called ``name`` (an empty list removes them)."""
        self._check_name(record_id, path, name)
        if isinstance(annotations, Annotation):
            annotations = [annotations]
        items = [self._ann_json(record_id, path, a) for a in annotations]
        annmap = self._annmap(record_id, path, create=True)
        assert annmap is not None
        if items:
            annmap[name] = items
        else:
            annmap.pop(name, None)

    def set_annotation(self, record_id: str, path: PathLike, name: str,
                       annotation: Annotation) -> None:
        """Make ``annotation`` the only one called ``name``."""
        self.set_annotations(record_id, path, name, [annotation])

    def add_annotation(self, record_id: str, path: PathLike, name: str,
                       annotation: Annotation) -> None:
        """Append an annotation called ``name``."""
        self._check_name(record_id, path, name)
        item = self._ann_json(record_id, path, annotation)
        annmap = self._annmap(record_id, path, create=True)
        assert annmap is not None
        annmap.setdefault(name, []).append(item)

    def remove_annotation(self, record_id: str, path: PathLike, name: str) -> None:
        """Remove every annotation called ``name`` (no-op when there is none)."""
        annmap = self._annmap(record_id, path)
        if annmap and name in annmap:
            self._entry(record_id).changed = True
            del annmap[name]

    def remove_annotations(self, record_id: str, path: PathLike = None) -> None:
        """Remove all annotations at ``path``."""
        annmap = self._annmap(record_id, path)
        if annmap:
            self._entry(record_id).changed = True
            annmap.clear()
