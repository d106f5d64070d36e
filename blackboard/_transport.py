"""Records as plain data: message attributes, documents, and transport items.

Transport items carry records between the driver's blackboard and the
partition-local ones of Spark workers (see docs/internals.md)::

    {"doc": RECORD, "attachments": {name: bytes}, "deleted": bool, "new": bool,
     "notes": {...}, "mode": "loaded"|"absent"|"created", "version": int|None}
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from blackboard import _json
from blackboard._blobs import Attachment
from blackboard._entry import UPDATE, no_attachments
from blackboard._errors import BlackboardError, PathError, ValueTypeError, where
from blackboard._model import check_number, is_object, migrate

if TYPE_CHECKING:
    from blackboard._entry import Entry as _Entry

__all__ = ["TransportMixin", "json_to_values", "values_to_json"]


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


def values_to_json(values: list[Any]) -> Any:
    """Document VALUEs → plain JSON (a single value unwrapped)."""
    if len(values) == 1 and type(values[0]) is str:  # the common case, ahead of the general one
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
        if attachments not in ("all", "changed", "none"):
            raise BlackboardError(f"export_records: attachments={attachments!r}: use 'all', "
                                  "'changed' or 'none'")
        out = []
        for rid in ids:
            entry = self._entry(rid)
            blobs: dict[str, bytes] = {}
            if attachments != "none":
                for name, att in entry.attachments.items():
                    if att.data is None and att.spool is None and att.source is None:
                        continue  # never shipped here: the name travels, bytes stay put
                    if attachments == "all" or (att.dirty and att.source is None):
                        blobs[name] = self.get_attachment(rid, name)
            item: dict[str, Any] = {"attachments": blobs, "deleted": entry.deleted,
                                    "new": entry.mode != "loaded", "mode": entry.mode,
                                    "version": entry.version}
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
            entry = self._entries.get(rid)
            if entry is None:
                mode = item.get("mode") or ("created" if item.get("new", True) else "loaded")
                version = item.get("version") if mode == "loaded" else None
                if mode == "loaded" and version is None:
                    mode = "created"
                entry = self._new_entry(doc, version, mode, leased=False)
                self._entries[rid] = entry
                if parent in self._instance:
                    self._bind(rid, self._instance[parent])
            if raw is not None:
                entry.set_raw(raw)
            else:
                entry.doc = doc
            entry.changed = changed or entry.mode != "loaded"
            entry.deleted = bool(item.get("deleted"))
            if "notes" in item:
                entry.notes = dict(item["notes"])
            names = [] if doc is None else list(doc.get("attachments", ()))
            for name in list(entry.attachments):
                if name not in names:
                    entry.attachments.pop(name).close()
                    entry.removed_attachments.add(name)
            blobs = item.get("attachments") or {}
            for name in names:
                if name in blobs:
                    old = entry.attachments.get(name)
                    if old is not None:
                        old.close()
                    entry.attachments[name] = Attachment(bytes(blobs[name]), dirty=changed)
                elif name in entry.attachments:
                    continue
                elif not changed:
                    entry.attachments[name] = Attachment()  # not shipped to this worker
                elif parent is not None and parent in self._entries \
                        and name in self._entries[parent].attachments:
                    entry.attachments[name] = self._entries[parent].attachments[name].copy()
                else:
                    owner = parent if parent is not None and entry.mode != "loaded" else rid
                    entry.attachments[name] = Attachment(source=(owner, name),
                                                         dirty=owner != rid)
