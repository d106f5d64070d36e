"""A record's content as one hash: what delta processing compares.

The content is the record's attributes and attachments, all of them or
those a rule names (:class:`Content`).  It is written out canonically and
hashed (SHA-256), so the hash is the same whatever the order in which the
attributes were set, and differs whenever a value does:

- attributes by name, sorted; an attribute's values in their order (an
  attribute is an ordered list), sub-objects by their own attributes, the
  same way;
- each value with its kind: ``1``, ``1.0``, ``True`` and ``"1"`` differ, as
  they do on the blackboard; a date, a datetime and their ISO text differ;
- not part of the content: annotations (on the record, an attribute, a
  sub-object or a literal) and semantic types — what pipelets note about a
  record, not what it says — and the record's source and parent;
- attachments by name, sorted, each as the SHA-256 of its bytes (read as a
  stream: a large one is never held in memory).

An attribute or attachment the rule names that the record lacks is simply
absent (so adding it later is a change).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from blackboard import Blackboard

__all__ = ["Content", "canonical", "content_hash"]

FORMAT = "chalk.delta/1"      # changes when the canonical form does (every hash then differs)
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Content:
    """Which attributes and attachments are a record's content (None: every one)."""

    attributes: frozenset[str] | None = None
    attachments: frozenset[str] | None = None

    @classmethod
    def of(cls, attributes: Iterable[str] | None, attachments: Iterable[str] | None) -> Content:
        """A rule's keys: neither given, everything; either given, exactly what they name."""
        if attributes is None and attachments is None:
            return cls()
        return cls(frozenset(attributes or ()), frozenset(attachments or ()))


def _value(value: Any) -> Any:
    """One attribute value, canonical: ``[kind, value]``."""
    kind = type(value)
    if kind is str:
        return ("s", value)
    if kind is bool:
        return ("b", value)
    if kind is int:
        return ("i", value)
    if kind is float:
        return ("f", value)
    if "obj" in value:
        return ("o", _attributes(value["obj"].get("attrs") or {}, None))
    dt = value.get("dt")
    if dt is not None:   # "date" or "datetime", its ISO text: not the same as a string's "s"
        return (dt, value["lit"])
    return _value(value["lit"])   # a literal with a semantic type or annotations: its value


def _attributes(attrs: Mapping[str, list[Any]], wanted: frozenset[str] | None) -> list[Any]:
    return [(name, [_value(v) for v in attrs[name]]) for name in sorted(attrs)
            if wanted is None or name in wanted]


def _digest(bb: Blackboard, record_id: str, name: str) -> str:
    digest = hashlib.sha256()
    with bb.get_attachment_stream(record_id, name) as stream:
        while chunk := stream.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def canonical(bb: Blackboard, record_id: str, content: Content = Content()) -> bytes:
    """The record's content (on ``bb``) written out canonically (see the module doc)."""
    doc = bb.document(record_id)
    attrs = (doc.get("meta") or {}).get("attrs") or {}
    wanted = content.attachments
    names = sorted(n for n in bb.attachment_names(record_id) if wanted is None or n in wanted)
    return orjson.dumps([FORMAT, _attributes(attrs, content.attributes),
                         [(n, _digest(bb, record_id, n)) for n in names]])


def content_hash(bb: Blackboard, record_id: str, content: Content = Content()) -> str:
    """The SHA-256 of the record's canonical content, in hex."""
    return hashlib.sha256(canonical(bb, record_id, content)).hexdigest()
