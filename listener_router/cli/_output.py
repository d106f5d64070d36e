"""The records ``chalk process --output`` writes: attributes as they came in, annotations kept.

One JSON object per line::

    {"id": "r1",
     "attributes": {"title": "x", "tags": ["a"], "author": {"name": "N"}},
     "annotations": {"": {"nextDestination": [{"values": ["out"]}]},
                     "tags[-1]": {"source": [{"values": ["feed"], "named": {"w": 2}}]},
                     "author[0]": {"checked": [{"values": ["yes"]}]}}}

An attribute given as a list in the input stays a list, also with one
value (the blackboard keeps every attribute as a list of values, so only
the input knows); any other attribute is a scalar when it has one value and
a list when it has several, as in routed messages.

``annotations`` is there when the record has any.  Its keys are the paths
the blackboard's annotation methods take (``""`` the record itself, path
``None``; ``"a[-1]"`` attribute ``a``; ``"a[0]"`` the first sub-object of
``a``; ``"a[0]/b[-1]"`` deeper), each with the annotations by name, in the
blackboard's own form ``{"values": [...], "named": {...}, "ann": {...}}``
(keys absent when empty).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from blackboard import Blackboard

__all__ = ["result_record"]


def _annotations(obj: dict[str, Any], prefix: str, out: dict[str, Any]) -> None:
    """Collect the annotation maps of ``obj`` (record or sub-object at ``prefix``)."""
    def at(step: str) -> str:
        return f"{prefix}/{step}" if prefix else step

    if obj.get("ann"):
        out[prefix] = obj["ann"]
    for name, annmap in (obj.get("attr_ann") or {}).items():
        if annmap:
            out[at(f"{name}[-1]")] = annmap
    for name, values in (obj.get("attrs") or {}).items():
        index = 0
        for value in values:
            if isinstance(value, dict) and "obj" in value:
                _annotations(value["obj"], at(f"{name}[{index}]"), out)
                index += 1


def result_record(bb: Blackboard, record_id: str, listed: Collection[str] = ()) -> dict[str, Any]:
    """Record ``record_id`` of ``bb`` as an output line (``listed``: attributes that were
    lists in the input)."""
    attributes = bb.get_attributes(record_id)
    for name in listed:
        if name in attributes and not isinstance(attributes[name], list):
            attributes[name] = [attributes[name]]
    out: dict[str, Any] = {"id": record_id, "attributes": attributes}
    annotations: dict[str, Any] = {}
    _annotations(bb.document(record_id)["meta"], "", annotations)
    if annotations:
        out["annotations"] = annotations
    return out
