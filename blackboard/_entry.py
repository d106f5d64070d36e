"""A record on a blackboard: its document (parsed lazily), lease and change state.

Loaded records keep the stored JSON text and are parsed on first use:
records a batch never reads cost no parse, no write and no garbage-collector
work (10,000 parsed 1 KB documents are ~170,000 tracked containers, and
every full collection walks them all).  Writes to top-level attributes of a
record not parsed yet are deferred (``ops``) and replayed at the parse, or
on a throw-away parse at commit, so "load, set a few attributes, commit"
builds no long-lived document objects at all.
"""

from __future__ import annotations

from typing import Any

from blackboard import _json
from blackboard._blobs import Attachment
from blackboard._errors import StorageError
from blackboard._model import is_object, migrate

__all__ = ["LOADED", "ABSENT", "CREATED", "SET", "SET1", "ADD", "ADD1", "UPDATE", "Entry", "no_attachments", "replay",
           "set_literals_in", "set_one_in"]

LOADED, ABSENT, CREATED = "loaded", "absent", "created"

# Deferred writes to top-level attributes of a record not parsed yet (see
# Entry): ``ops`` is one flat list ``[kind, name, payload, kind, …]`` (one
# tracked container per record, whatever the number of writes).
SET, SET1, ADD, ADD1, UPDATE = 0, 1, 2, 3, 4   # payload: values, value, values, value, {name: values}


def set_literals_in(obj: dict[str, Any], name: str, new: list[Any]) -> None:
    """Replace the literals of ``obj``'s attribute ``name`` by ``new`` (sub-objects stay)."""
    attrs = obj.setdefault("attrs", {})
    old = attrs.get(name)
    kept = [v for v in old if is_object(v)] if old else []
    if new or kept:
        attrs[name] = new + kept
    else:
        attrs.pop(name, None)


def set_one_in(attrs: dict[str, Any], name: str, value: Any) -> None:
    """Make ``value`` the only literal of attribute ``name`` in ``attrs`` (sub-objects stay)."""
    old = attrs.get(name)
    # Only dicts can be sub-objects (the cheap test first).
    kept = [v for v in old if is_object(v)] if old and dict in map(type, old) else None
    attrs[name] = [value, *kept] if kept else [value]


def replay(doc: dict[str, Any], ops: list[Any]) -> None:
    # Hot at commit (once per changed record): kept tight.  Every kind starts
    # with meta.setdefault("attrs", {}) in its eager form, so do it once here.
    # ``ops`` must survive unchanged (encoded() replays on a throw-away parse):
    # no payload list may end up in the document.
    meta = doc["meta"]
    attrs = meta.get("attrs")
    if attrs is None:
        attrs = meta["attrs"] = {}
    it = iter(ops)
    for kind, name, payload in zip(it, it, it, strict=True):
        if kind == SET1:
            set_one_in(attrs, name, payload)
        elif kind == ADD1:
            old = attrs.get(name)
            if old is None:
                attrs[name] = [payload]
            else:
                old.append(payload)
        elif kind == SET:
            set_literals_in(meta, name, payload)
        elif kind == ADD:
            attrs.setdefault(name, []).extend(payload)
        else:  # copies: a later ADD appends to the list, and ops may be replayed again
            for key, values in payload.items():
                attrs[key] = list(values)


def no_attachments(raw: str | bytes) -> bool:
    """True when the stored JSON text certainly names no attachments.

    Inside a JSON string every quote is escaped, so ``"attachments":`` only
    matches keys; one match followed by ``[]`` is the record's own empty list
    (a missing top-level key with a nested ``[]`` also means none).
    """
    if isinstance(raw, str):
        return raw.count('"attachments":') == 1 and '"attachments":[]' in raw
    return raw.count(b'"attachments":') == 1 and b'"attachments":[]' in raw


class Entry:
    """One record on a blackboard.

    Loaded records keep the stored JSON text (``raw``) and are parsed on
    first use of ``doc``: records a batch never reads cost no parse, no
    write and no garbage-collector work.  ``set_literal``/``add_literal``/
    ``set_attributes`` on a top-level attribute of an unparsed record are
    kept in ``ops`` and replayed at the parse (or at commit, on a throw-away
    parse), so the common "load, set a few attributes, commit" never builds
    long-lived document objects.  Invariant: an unparsed record's text names
    no attachments (``no_attachments``); other records are parsed at once.
    """

    __slots__ = ("_doc", "raw", "ops", "version", "mode", "changed", "deleted", "leased",
                 "attachments", "removed_attachments", "notes")

    def __init__(self, doc: dict[str, Any] | None, version: int | None, mode: str,
                 leased: bool, raw: str | bytes | None = None):
        self._doc = doc
        self.raw = raw               # stored JSON text while _doc is None
        self.ops: list[Any] | None = None
        self.version = version       # stored version when loaded, else None
        self.mode = mode             # LOADED, ABSENT or CREATED
        self.changed = mode != LOADED
        self.deleted = False
        self.leased = leased
        self.attachments: dict[str, Attachment] = {}
        self.removed_attachments: set[str] = set()
        self.notes: dict[str, Any] = {}

    @property
    def doc(self) -> dict[str, Any]:
        doc = self._doc
        if doc is None:
            doc = self._doc = self.materialize()
            self.raw = self.ops = None
        return doc

    @doc.setter
    def doc(self, doc: dict[str, Any]) -> None:
        self._doc = doc
        self.raw = self.ops = None

    def set_raw(self, raw: str | bytes) -> None:
        """Hold JSON text instead of a parsed document (caller checked ``no_attachments``)."""
        self._doc = None
        self.raw = raw
        self.ops = None

    def defer(self, kind: int, name: str | None, payload: Any) -> None:
        self.changed = True
        ops = self.ops
        if ops is None:
            self.ops = [kind, name, payload]
        else:
            ops += (kind, name, payload)

    def materialize(self) -> dict[str, Any]:
        """The parsed document with deferred writes applied (not kept: see ``doc``)."""
        if self._doc is not None:
            return self._doc
        raw = self.raw
        assert raw is not None
        try:
            doc = _json.loads(raw)
        except _json.JSONDecodeError as e:
            text = raw if isinstance(raw, str) else raw.decode(errors="replace")
            raise StorageError(f"stored record is not valid JSON ({e}): {text[:80]!r}") from e
        doc = migrate(doc)
        if self.ops:
            replay(doc, self.ops)
        return doc

    def encoded(self) -> str:
        """The document as compact JSON text, attachment names up to date."""
        if self._doc is None and not self.ops and not self.attachments:
            raw = self.raw
            return raw if isinstance(raw, str) else raw.decode()  # type: ignore[union-attr]
        doc = self.materialize()
        doc["attachments"] = list(self.attachments)
        return _json.dumps(doc)

    def encoded_bytes(self) -> bytes:
        if self._doc is None and not self.ops and not self.attachments:
            raw = self.raw
            if isinstance(raw, bytes):
                return raw
            if isinstance(raw, str):
                return raw.encode()
        doc = self.materialize()
        doc["attachments"] = list(self.attachments)
        return _json.dumps_bytes(doc)
