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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Union

from blackboard._errors import BlackboardError

__all__ = ["Literal", "Annotation", "Scalar", "FORMAT", "new_document"]

FORMAT = 1

Scalar = Union[str, int, float, bool, _dt.date, _dt.datetime]
_PLAIN = (str, int, float, bool)


@dataclass(frozen=True)
class Annotation:
    """An annotation: anonymous values, named values and nested annotations.

    ``annotations`` maps a name to a list of nested :class:`Annotation`.
    """

    values: tuple[Any, ...] = ()
    named: Mapping[str, Any] = field(default_factory=dict)
    annotations: Mapping[str, tuple[Annotation, ...]] = field(default_factory=dict)

    def __init__(self, values: Iterable[Any] = (), named: Mapping[str, Any] | None = None,
                 annotations: Mapping[str, Iterable[Annotation]] | None = None):
        object.__setattr__(self, "values", tuple(values))
        object.__setattr__(self, "named", dict(named or {}))
        object.__setattr__(self, "annotations",
                           {k: tuple(v) for k, v in (annotations or {}).items()})
        for value in (*self.values, *self.named.values()):
            if not isinstance(value, _PLAIN):
                raise BlackboardError(f"annotation value {value!r} must be str, int, float or bool")

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


@dataclass(frozen=True)
class Literal:
    """A literal value with an optional semantic type and annotations."""

    value: Scalar
    semantic_type: str | None = None
    annotations: Mapping[str, tuple[Annotation, ...]] = field(default_factory=dict)

    def __init__(self, value: Scalar, semantic_type: str | None = None,
                 annotations: Mapping[str, Iterable[Annotation]] | None = None):
        if not isinstance(value, (*_PLAIN, _dt.date)):
            raise BlackboardError(
                f"literal value {value!r} has type {type(value).__name__}; "
                "use str, int, float, bool, date or datetime")
        object.__setattr__(self, "value", value)
        object.__setattr__(self, "semantic_type", semantic_type)
        object.__setattr__(self, "annotations",
                           {k: tuple(v) for k, v in (annotations or {}).items()})

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


def literal_to_value(item: Any) -> Any:
    """A plain value or :class:`Literal` → the document's VALUE form."""
    if isinstance(item, Literal):
        value, stype, ann = item.value, item.semantic_type, item.annotations
    else:
        value, stype, ann = item, None, None
    if isinstance(value, bool) or isinstance(value, (str, int, float)):
        if not stype and not ann:
            return value
        out: dict[str, Any] = {"lit": value}
    elif isinstance(value, _dt.datetime):
        out = {"lit": value.isoformat(), "dt": "datetime"}
    elif isinstance(value, _dt.date):
        out = {"lit": value.isoformat(), "dt": "date"}
    else:
        raise BlackboardError(f"literal value {value!r} has type {type(value).__name__}; "
                              "use str, int, float, bool, date or datetime")
    if stype:
        out["type"] = stype
    if ann:
        out["ann"] = annmap_to_json(ann)
    return out


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
    return copy.deepcopy(doc)


def migrate(doc: dict[str, Any]) -> dict[str, Any]:
    """Bring a stored document up to ``FORMAT`` (a no-op while there is one format)."""
    version = doc.get("v", FORMAT)
    if version != FORMAT:
        raise BlackboardError(f"record {doc.get('id')!r}: stored in format {version}, "
                              f"this version of Chalk reads format {FORMAT}")
    return doc
