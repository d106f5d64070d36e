"""The record data model and its JSON document form.

Records live on a blackboard as JSON-compatible dicts; the public value
classes (:class:`Literal`, :class:`Annotation`) are made from and turned into
that form at the API boundary.  The document form (version ``FORMAT``)::

    RECORD = {"v": 1, "id": str, "source": str|None, "parent": str|None,
              "attachments": [name, ...], "meta": OBJ}
    OBJ    = {"attrs": {name: [VALUE, ...]}, "attr_ann": {name: ANNMAP},
              "ann": ANNMAP, "type": semantic_type}      # keys absent when empty
    VALUE  = str | int | float | bool                    # a plain literal
           | {"lit": scalar, "dt": "date"|"datetime", "type": str, "ann": ANNMAP}
           | {"obj": OBJ}                                # a sub-object
    ANNMAP = {name: [ANN, ...]}
    ANN    = {"values": [scalar, ...], "named": {key: scalar}, "ann": ANNMAP}

An attribute's values list holds literals and sub-objects together; an index
in a path counts within one kind (the ``n``-th literal or ``n``-th object).
"""

from __future__ import annotations

import copy
import datetime as _dt
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Union

from blackboard import _json
from blackboard._errors import BlackboardError, ValueTypeError

__all__ = ["Literal", "Annotation", "Scalar", "FORMAT", "MIGRATIONS", "check_number", "new_document",
           "migrate"]

FORMAT = 1

Scalar = Union[str, int, float, bool, _dt.date, _dt.datetime]
_PLAIN = (str, int, float, bool)


_INT_MIN, _INT_MAX = -(1 << 63), (1 << 63) - 1


def check_number(value: Any, what: str) -> None:
    """Refuse what JSON readers (orjson, Spark, Arrow) cannot carry exactly: NaN, inf, ints past 64 bits."""
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueTypeError(f"{what} {value!r} is not a finite number (records are JSON)")
    elif isinstance(value, int) and not _INT_MIN <= value <= _INT_MAX:
        raise ValueTypeError(f"{what} {value!r} does not fit in a signed 64-bit integer "
                             "(records are JSON read by 64-bit readers: store it as a string)")


def _check_scalar(value: Any, what: str) -> None:
    if not isinstance(value, _PLAIN):
        raise ValueTypeError(f"{what} {value!r} has type {type(value).__name__}; "
                             "use str, int, float or bool")
    if not isinstance(value, str):
        check_number(value, what)


def _typed(value: Any) -> tuple[type, Any]:
    # 1 == 1.0 == True in Python, but they are three different record values.
    return (type(value), value)


def _annmap_key(annmap: Mapping[str, tuple[Annotation, ...]]) -> frozenset[Any]:
    return frozenset((name, anns) for name, anns in annmap.items())


class Annotation:
    """An annotation: anonymous values, named values and nested annotations.

    ``values`` is a tuple of scalars (str, int, float, bool), ``named`` maps
    a name to a scalar, ``annotations`` maps a name to a tuple of nested
    :class:`Annotation`.  Immutable, hashable; equality is type-exact
    (``1`` and ``True`` differ).
    """

    __slots__ = ("values", "named", "annotations", "_key")
    _key: tuple[Any, ...]

    values: tuple[Any, ...]
    named: Mapping[str, Any]
    annotations: Mapping[str, tuple[Annotation, ...]]

    def __init__(self, values: Iterable[Any] = (), named: Mapping[str, Any] | None = None,
                 annotations: Mapping[str, Iterable[Annotation]] | None = None):
        if isinstance(values, (str, bytes)):
            values = (values,)
        vals = tuple(values)
        nmd = dict(named or {})
        anns = {str(k): tuple(v) for k, v in (annotations or {}).items()}
        for value in vals:
            _check_scalar(value, "annotation value")
        for key, value in nmd.items():
            if not isinstance(key, str):
                raise ValueTypeError(f"annotation value name {key!r} must be a string")
            _check_scalar(value, f"annotation value {key!r}")
        for key, items in anns.items():
            for item in items:
                if not isinstance(item, Annotation):
                    raise ValueTypeError(f"nested annotation {key!r}: expected an Annotation, "
                                         f"got {type(item).__name__}")
        object.__setattr__(self, "values", vals)
        object.__setattr__(self, "named", nmd)
        object.__setattr__(self, "annotations", anns)
        object.__setattr__(self, "_key", (
            tuple(_typed(v) for v in vals),
            frozenset((k, _typed(v)) for k, v in nmd.items()),
            _annmap_key(anns)))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Annotation is immutable; make a new one")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Annotation):
            return NotImplemented
        return self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled as the constructor's arguments (slots of an immutable object cannot be set
        # back one by one); a workflow's configuration, which travels to Spark workers, may
        # hold annotations.
        return (Annotation, (self.values, self.named, self.annotations))

    def __repr__(self) -> str:
        parts = []
        if self.values:
            parts.append(f"values={list(self.values)!r}")
        if self.named:
            parts.append(f"named={self.named!r}")
        if self.annotations:
            parts.append(f"annotations={self.annotations!r}")
        return f"Annotation({', '.join(parts)})"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.values:
            out["values"] = list(self.values)
        if self.named:
            out["named"] = dict(self.named)
        if self.annotations:
            out["ann"] = annmap_to_json(self.annotations)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Annotation:
        return cls(data.get("values", ()), data.get("named"),
                   annmap_from_json(data.get("ann", {})))


class Literal:
    """A literal value with an optional semantic type and annotations.

    ``value`` is a str, int, float, bool, date or datetime.  Immutable,
    hashable; equality is type-exact (``Literal(1) != Literal(True)``).
    """

    __slots__ = ("value", "semantic_type", "annotations", "_key")
    _key: tuple[Any, ...] | None

    value: Scalar
    semantic_type: str | None
    annotations: Mapping[str, tuple[Annotation, ...]]

    def __init__(self, value: Scalar, semantic_type: str | None = None,
                 annotations: Mapping[str, Iterable[Annotation]] | None = None):
        kind = type(value)
        if kind is int or kind is float:
            check_number(value, "literal value")
        elif kind is not str and kind is not bool:
            if not isinstance(value, (*_PLAIN, _dt.date)):
                raise ValueTypeError(
                    f"literal value {value!r} has type {type(value).__name__}; "
                    "use str, int, float, bool, date or datetime")
            if isinstance(value, (int, float)):
                check_number(value, "literal value")
        if semantic_type is not None and not isinstance(semantic_type, str):
            raise ValueTypeError(f"semantic type {semantic_type!r} must be a string")
        if annotations:
            anns = {str(k): tuple(v) for k, v in annotations.items()}
            for key, items in anns.items():
                for item in items:
                    if not isinstance(item, Annotation):
                        raise ValueTypeError(f"literal annotation {key!r}: expected an "
                                             f"Annotation, got {type(item).__name__}")
        else:
            anns = {}
        setattr_ = object.__setattr__
        setattr_(self, "value", value)
        setattr_(self, "semantic_type", semantic_type or None)
        setattr_(self, "annotations", anns)
        setattr_(self, "_key", None)  # computed on first comparison or hash

    def _compare_key(self) -> tuple[Any, ...]:
        key = self._key
        if key is None:
            key = (_typed(self.value), self.semantic_type, _annmap_key(self.annotations))
            object.__setattr__(self, "_key", key)
        return key

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Literal is immutable; make a new one")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Literal):
            return NotImplemented
        return self._compare_key() == other._compare_key()

    def __hash__(self) -> int:
        return hash(self._compare_key())

    def __repr__(self) -> str:
        extra = f", {self.semantic_type!r}" if self.semantic_type else ""
        if self.annotations:
            extra += f", annotations={self.annotations!r}"
        return f"Literal({self.value!r}{extra})"

    @property
    def data_type(self) -> str:
        """``str``, ``int``, ``float``, ``bool``, ``date`` or ``datetime``."""
        if isinstance(self.value, _dt.datetime):
            return "datetime"
        if isinstance(self.value, _dt.date):
            return "date"
        return type(self.value).__name__


def annmap_to_json(annmap: Mapping[str, Iterable[Annotation]]) -> dict[str, list[dict[str, Any]]]:
    return {name: [a.to_json() for a in anns] for name, anns in annmap.items()}


def annmap_from_json(data: Mapping[str, Any]) -> dict[str, tuple[Annotation, ...]]:
    return {name: tuple(Annotation.from_json(a) for a in anns) for name, anns in data.items()}


def plain_scalar(value: Any) -> bool:
    """True for a value a document holds as it is: a str, a bool, a finite float or an int
    that fits in 64 bits (what ``literal_to_value`` returns unchanged)."""
    kind = type(value)
    return kind is str or kind is bool or (kind is int and _INT_MIN <= value <= _INT_MAX) \
        or (kind is float and math.isfinite(value))


def literal_to_value(item: Any) -> Any:
    """A plain value or :class:`Literal` → the document's VALUE form."""
    if isinstance(item, Literal):
        value, stype, ann = item.value, item.semantic_type, item.annotations
    else:
        value, stype, ann = item, None, None
    if isinstance(value, (str, int, float)):  # bool is an int
        if type(value) is not str and not (type(value) is int and _INT_MIN <= value <= _INT_MAX):
            check_number(value, "literal value")
        if not stype and not ann:
            return value
        out: dict[str, Any] = {"lit": value}
    elif isinstance(value, _dt.datetime):
        out = {"lit": value.isoformat(), "dt": "datetime"}
    elif isinstance(value, _dt.date):
        out = {"lit": value.isoformat(), "dt": "date"}
    else:
        raise ValueTypeError(f"literal value {value!r} has type {type(value).__name__}; "
                             "use str, int, float, bool, date or datetime")
    if stype:
        out["type"] = stype
    if ann:
        out["ann"] = annmap_to_json(ann)
    return out


_new_object = object.__new__
_slots: dict[str, Any] = dict(vars(Literal))   # the slots' descriptors: set without __setattr__
_set_value, _set_type = _slots["value"].__set__, _slots["semantic_type"].__set__
_set_annotations, _set_key = _slots["annotations"].__set__, _slots["_key"].__set__


def text_literal(value: str) -> Literal:
    """``Literal(value)`` for a plain string (the getters' most common answer), made
    without the constructor's checks, which a string passes anyway."""
    lit = _new_object(Literal)
    _set_value(lit, value)
    _set_type(lit, None)
    _set_annotations(lit, {})
    _set_key(lit, None)
    return lit


def value_to_literal(value: Any) -> Literal:
    """The document's literal VALUE form → :class:`Literal`."""
    if not isinstance(value, dict):
        return Literal(value)
    raw = value["lit"]
    kind = value.get("dt")
    if kind == "datetime":
        raw = _dt.datetime.fromisoformat(raw)
    elif kind == "date":
        raw = _dt.date.fromisoformat(raw)
    return Literal(raw, value.get("type"), annmap_from_json(value.get("ann", {})))


def is_object(value: Any) -> bool:
    return isinstance(value, dict) and "obj" in value


def plain_value(value: Any) -> Any:
    """The bare Python value of a literal VALUE (dates stay ISO strings)."""
    return value["lit"] if isinstance(value, dict) else value


def new_document(record_id: str, *, source: str | None = None,
                 parent: str | None = None) -> dict[str, Any]:
    return {"v": FORMAT, "id": record_id, "source": source, "parent": parent,
            "attachments": [], "meta": {}}


def copy_document(doc: dict[str, Any]) -> dict[str, Any]:
    # A JSON round trip: documents are JSON, and orjson does it ~10x faster than deepcopy.
    try:
        return _json.loads(_json.dumps_bytes(doc))
    except (TypeError, ValueError):
        return copy.deepcopy(doc)


# Upgrades of stored documents: MIGRATIONS[n] turns a format-n document into
# format n+1.  Add one here (and bump FORMAT) whenever the document form changes.
MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {}


def migrate(doc: dict[str, Any]) -> dict[str, Any]:
    """Bring a stored document up to ``FORMAT`` (documents without ``"v"`` are format 1)."""
    version = doc.get("v", 1)
    if version == FORMAT:
        return doc
    if not isinstance(version, int) or version > FORMAT:
        raise BlackboardError(f"record {doc.get('id')!r}: stored in format {version!r}; this "
                              f"version of Chalk reads formats up to {FORMAT}: upgrade Chalk",
                              record_id=doc.get("id"))
    while version < FORMAT:
        doc = MIGRATIONS[version](doc)
        version += 1
        doc["v"] = version
    return doc
