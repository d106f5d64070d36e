"""Records as plain data: message attributes, documents, and transport items.

Transport items carry records between the driver's blackboard and the
partition-local ones of Spark workers (see docs/internals.md)::

    {"doc": RECORD, "attachments": {name: bytes}, "deleted": bool, "new": bool,
     "notes": {...}, "mode": "loaded"|"absent"|"created", "version": int|None}

The engine's crossing uses the packed form (:meth:`TransportMixin.export_packed`,
:meth:`TransportMixin.import_packed`): per record its document as JSON bytes
and an *envelope*, a short JSON-ready list (``ENVELOPE`` names its fields);
attachment bytes apart, in record order.  A record loaded and not parsed
travels as the text the store gave plus its deferred writes (``ops``: the
message's attributes, set but not yet applied), which apply where the
document is parsed, on either side: the same replay the commit does, so the
same bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from blackboard import _json
from blackboard._blobs import Attachment
from blackboard._entry import UPDATE, no_attachments, replay
from blackboard._errors import BlackboardError, PathError, ValueTypeError, where
from blackboard._model import check_number, is_object, migrate

if TYPE_CHECKING:
    from blackboard._entry import Entry as _Entry

__all__ = ["ENVELOPE", "TransportMixin", "json_to_values", "values_to_json"]

# The packed form's envelope of one record, in this order: its ID, its parent (a
# fragment's) or None, how it came on the blackboard ("loaded", "absent", "created"), the
# stored version (loaded records), whether it is marked deleted, its deferred writes or
# None (the document is then final), its record notes or None, the names of the
# attachments whose bytes travel (in ``blobs``, in this order) or None.
ENVELOPE = ("id", "parent", "mode", "version", "deleted", "ops", "notes", "attachments")


def json_to_values(value: Any) -> list[Any]:
    """Message JSON for one attribute → document VALUEs (list → many; dict → sub-object)."""
    if type(value) is str:  # the common case, ahead of the general one
        return [value]
    items = value if isinstance(value, list) else [value]
    out: list[Any] = []
    for item in items:
        if isinstance(item, dict):
            out.append({"obj": {"attrs": {k: json_to_values(v) for k, v in item.items()}}})
        elif isinstance(item, str):
            out.append(item)
        elif isinstance(item, (int, float)):
            check_number(item, "attribute value")
            out.append(item)
        else:
            raise ValueTypeError(f"attribute value {item!r}: use strings, numbers, booleans, "
                                 "lists or objects")
    return out


_SCALARS = frozenset((str, int, float, bool))


def values_to_json(values: list[Any]) -> Any:
    """Document VALUEs → plain JSON (a single value unwrapped)."""
    if len(values) == 1 and type(values[0]) in _SCALARS:  # the common case, ahead of the rest
        return values[0]
    out = [
        {k: values_to_json(v) for k, v in (value["obj"].get("attrs") or {}).items()}
        if is_object(value) else (value["lit"] if isinstance(value, dict) else value)
        for value in values
    ]
    return out[0] if len(out) == 1 else out


_GOOD_NAMES: set[str] = set()  # attribute names found good (a few hundred in practice)


def _good_name(name: Any) -> bool:
    """True for a usable attribute name (non-empty, unpadded, no ``[]/``); remembered."""
    good = (isinstance(name, str) and bool(name) and name == name.strip()
            and not any(c in name for c in "[]/"))
    if good and len(_GOOD_NAMES) < 10_000:
        _GOOD_NAMES.add(name)
    return good


class TransportMixin:
    """Document and transport methods of :class:`Blackboard`."""

    _entries: dict[str, _Entry]
    _instance: dict[str, Any]

    if TYPE_CHECKING:  # provided by Blackboard; declared for type checkers only
        def _entry(self, record_id: str) -> _Entry:
            ...

        def _doc(self, record_id: str, *, change: bool = False) -> dict[str, Any]:
            ...

        def _bind(self, record_id: str, key: Any) -> None:
            ...

        def _new_entry(self, doc: dict[str, Any] | None, version: int | None, mode: str,
                       leased: bool) -> _Entry:
            ...

        def get_attachment(self, record_id: str, name: str) -> bytes:
            ...

    @staticmethod
    def _parent_of(entry: _Entry) -> str | None:
        raw = entry.raw
        if entry._doc is None and raw is not None and (
                raw.count('"parent":') == 1 and '"parent":null' in raw if isinstance(raw, str)
                else raw.count(b'"parent":') == 1 and b'"parent":null' in raw):
            return None  # not a fragment; no parse needed (see no_attachments for why)
        return entry.doc.get("parent")

    def document(self, record_id: str) -> dict[str, Any]:
        """The record's document (a read-only view; see ``blackboard._model``)."""
        entry = self._entry(record_id)
        entry.doc["attachments"] = list(entry.attachments)
        return entry.doc

    def set_attributes(self, record_id: str, attributes: Mapping[str, Any]) -> None:
        """Write message-style JSON attributes (lists: many values; dicts: sub-objects).

        Each named attribute's values are replaced; its annotations stay.
        """
        converted = {}
        for name, value in attributes.items():
            if name not in _GOOD_NAMES and not _good_name(name):
                raise PathError(f"{where(record_id)}: bad attribute name {name!r}",
                                record_id=record_id)
            try:
                converted[name] = json_to_values(value)
            except BlackboardError as e:
                raise ValueTypeError(f"{where(record_id, name)}: {e}", record_id=record_id,
                                     path=name) from None
        entry = self._entry(record_id)
        if entry._doc is None:  # not parsed yet: replayed at the parse or the commit
            entry.defer(UPDATE, None, converted)
            return
        entry.changed = True
        entry.doc["meta"].setdefault("attrs", {}).update(converted)

    def get_attributes(self, record_id: str, names: Iterable[str] | None = None) -> dict[str, Any]:
        """The record's attributes as plain JSON (one value unwrapped, sub-objects as dicts)."""
        # Copies out: a record not parsed yet is parsed for this read only, and its text
        # stays what a commit writes (not a parse kept, then encoded again).
        attrs = self._entry(record_id).materialize()["meta"].get("attrs") or {}
        keys = attrs if names is None else [n for n in names if n in attrs]
        return {name: values_to_json(attrs[name]) for name in keys}

    def export_records(self, ids: Iterable[str], *, attachments: str = "all",
                       notes: bool = True, encoded: bool = False) -> list[dict[str, Any]]:
        """Transport items for ``ids`` (see the module docstring).

        ``attachments`` selects which attachment bytes travel: ``"all"``,
        ``"changed"`` (set on this blackboard) or ``"none"``.  Items share
        the blackboard's documents (no copies): treat them as read-only.
        ``encoded=True`` puts the document in as compact JSON bytes
        (``item["doc"]``) plus ``item["id"]`` and ``item["parent"]``; a
        record loaded and never read is then not parsed at all (its stored
        text travels as it is).  :meth:`import_records` takes either form.
        """
        _check_attachments(attachments)
        out = []
        for rid in ids:
            entry = self._entry(rid)
            item: dict[str, Any] = {"attachments": self._blobs(rid, entry, attachments),
                                    "deleted": entry.deleted, "new": entry.mode != "loaded",
                                    "mode": entry.mode, "version": entry.version}
            if encoded:
                item["id"] = rid
                item["doc"] = entry.encoded_bytes()
                item["parent"] = self._parent_of(entry)
            else:
                item["doc"] = self.document(rid)
            if notes and entry.notes:
                item["notes"] = entry.notes
            out.append(item)
        return out

    def export_packed(self, ids: Iterable[str], *, attachments: str = "all"
                      ) -> tuple[list[bytes], list[list[Any]], list[bytes]]:
        """The records in the packed form (module doc): ``(docs, envelopes, blobs)``.

        A record loaded and not parsed travels as the stored text plus its
        deferred writes, neither parsed nor encoded again; any other as its
        document encoded once.  ``attachments`` as for :meth:`export_records`.
        Envelopes share the blackboard's notes and writes: treat them as
        read-only (encode them, as the engine does, or import them).
        """
        _check_attachments(attachments)
        docs: list[bytes] = []
        envs: list[list[Any]] = []
        blobs: list[bytes] = []
        entries = self._entries
        dumps = _json.dumps_bytes
        for rid in ids:
            entry = entries[rid] if rid in entries else self._entry(rid)
            ops = None
            parsed = entry._doc
            attached = entry.attachments
            if parsed is not None:  # encoded once, its attachment names up to date
                parsed["attachments"] = list(attached) if attached else []
                doc = dumps(parsed)
                parent = parsed.get("parent")
            elif not attached:
                raw = entry.raw
                doc = raw if type(raw) is bytes else raw.encode()  # type: ignore[union-attr]
                ops = entry.ops
                if ops:
                    ops = list(ops)  # later writes here append to the entry's own list
                parent = self._parent_of(entry)
            else:
                doc = entry.encoded_bytes()
                parent = entry.doc.get("parent")
            names = None
            if attached and attachments != "none":
                sent = self._blobs(rid, entry, attachments)
                if sent:
                    names = list(sent)
                    blobs += sent.values()
            docs.append(doc)
            envs.append([rid, parent, entry.mode, entry.version, entry.deleted, ops,
                         entry.notes or None, names])
        return docs, envs, blobs

    def _blobs(self, rid: str, entry: _Entry, attachments: str) -> dict[str, bytes]:
        """The attachment bytes of ``rid`` that travel (``attachments``: which)."""
        blobs: dict[str, bytes] = {}
        if attachments != "none":
            for name, att in entry.attachments.items():
                if att.data is None and att.spool is None and att.source is None:
                    continue  # never shipped here: the name travels, bytes stay put
                if attachments == "all" or (att.dirty and att.source is None):
                    blobs[name] = self.get_attachment(rid, name)
        return blobs

    def import_records(self, items: Iterable[Mapping[str, Any]], *, changed: bool = True) -> None:
        """Put transport items on this blackboard.

        Records already here are replaced (their attachments: named bytes
        replace, names missing from the document are removed, others stay).
        Unknown IDs come on as new records (fragments made by a worker):
        their leases are taken at commit, and attachments whose bytes did not
        travel are copied from the parent.  ``changed=False`` loads items as
        unchanged copies (a worker receiving its partition).
        """
        for item in items:
            doc: Any = item["doc"]
            raw: str | bytes | None = None
            if isinstance(doc, (bytes, bytearray, memoryview, str)):
                raw = bytes(doc) if not isinstance(doc, (bytes, str)) else doc
                if "id" in item and "parent" in item and no_attachments(raw):
                    doc = None  # stays JSON text until something reads it
                    rid, parent = item["id"], item["parent"]
                else:
                    doc, raw = _json.loads(raw), None
            if doc is not None:
                doc = migrate(doc)
                rid, parent = doc.get("id"), doc.get("parent")
            if not isinstance(rid, str) or not rid:
                raise BlackboardError(f"import_records: item without a record ID: {item!r:.80}")
            mode = item.get("mode") or ("created" if item.get("new", True) else "loaded")
            self._take_in(rid, parent, doc, raw, None, mode, item.get("version"),
                          bool(item.get("deleted")), item.get("notes"),
                          item.get("attachments") or {}, changed)

    def import_packed(self, docs: Sequence[bytes], envelopes: Sequence[Sequence[Any]],
                      blobs: Sequence[bytes] = (), *, changed: bool = True) -> None:
        """Put records in the packed form (:meth:`export_packed`'s) on this blackboard, as
        :meth:`import_records` does with items; deferred writes stay deferred."""
        at = 0
        for data, env in zip(docs, envelopes, strict=True):
            rid, parent, mode, version, deleted, ops, notes, names = env
            doc = None
            raw: bytes | None = data
            if not no_attachments(data):  # parsed now: the attachment names are needed
                doc = migrate(_json.loads(data))
                if ops:
                    replay(doc, ops)
                raw, ops = None, None
            sent: dict[str, bytes] = {}
            if names:
                sent = dict(zip(names, blobs[at:at + len(names)], strict=True))
                at += len(names)
            if not isinstance(rid, str) or not rid:
                raise BlackboardError(f"import_packed: envelope without a record ID: {env!r:.80}")
            self._take_in(rid, parent, doc, raw, ops, mode, version, deleted, notes, sent,
                          changed)

    def _take_in(self, rid: str, parent: str | None, doc: dict[str, Any] | None,
                 raw: str | bytes | None, ops: list[Any] | None, mode: str,
                 version: int | None, deleted: bool, notes: Mapping[str, Any] | None,
                 blobs: Mapping[str, bytes], changed: bool) -> None:
        """One record imported (see :meth:`import_records`): its document parsed (``doc``)
        or as text (``raw``, with deferred writes ``ops``)."""
        entry = self._entries.get(rid)
        if entry is None:
            if mode == "loaded" and version is None:
                mode = "created"
            entry = self._new_entry(doc, version if mode == "loaded" else None, mode,
                                    leased=False)
            self._entries[rid] = entry
            if parent in self._instance:
                self._bind(rid, self._instance[parent])
        if raw is not None:
            entry.set_raw(raw)
            if ops:
                entry.ops = list(ops)  # its own: later writes append to it
        else:
            entry.doc = doc  # type: ignore[assignment]
        entry.changed = changed or entry.mode != "loaded"
        entry.deleted = deleted
        if notes is not None:
            entry.notes = dict(notes)
        names = [] if doc is None else list(doc.get("attachments", ()))
        attached = entry.attachments
        if attached:
            for name in list(attached):
                if name not in names:
                    attached.pop(name).close()
                    entry.removed_attachments.add(name)
        for name in names:
            if name in blobs:
                old = attached.get(name)
                if old is not None:
                    old.close()
                attached[name] = Attachment(bytes(blobs[name]), dirty=changed)
            elif name in attached:
                continue
            elif not changed:
                attached[name] = Attachment()  # not shipped to this worker
            elif parent is not None and parent in self._entries \
                    and name in self._entries[parent].attachments:
                attached[name] = self._entries[parent].attachments[name].copy()
            else:
                owner = parent if parent is not None and entry.mode != "loaded" else rid
                attached[name] = Attachment(source=(owner, name), dirty=owner != rid)


def _check_attachments(attachments: str) -> None:
    if attachments not in ("all", "changed", "none"):
        raise BlackboardError(f"export_records: attachments={attachments!r}: use 'all', "
                              "'changed' or 'none'")
