"""Walking record documents along paths (pure functions, no storage).

Every function takes the record ID and the path only to name them in errors.
Navigation with ``create=True`` first checks the whole path and only then
creates the missing sub-objects, so a bad path changes nothing.
"""

from __future__ import annotations

from typing import Any

from blackboard._errors import PathError, where
from blackboard._model import is_object
from blackboard._path import PathStep

__all__ = ["object_at", "parent_of", "literals_of", "objects_of", "annotation_map", "show"]

Steps = tuple[PathStep, ...]


def show(steps: Steps) -> str:
    return "/".join(str(s) for s in steps)


def literals_of(values: list[Any]) -> list[Any]:
    return [v for v in values if not is_object(v)]


def objects_of(values: list[Any]) -> list[dict[str, Any]]:
    return [v["obj"] for v in values if is_object(v)]


def _error(rid: str, steps: Steps, message: str) -> PathError:
    return PathError(f"{where(rid, show(steps))}: {message}", record_id=rid, path=show(steps))


def object_at(rid: str, doc: dict[str, Any], steps: Steps, *, create: bool = False,
              upto: int | None = None) -> dict[str, Any]:
    """The sub-object the first ``upto`` steps address (all steps when None).

    With ``create``, missing sub-objects are appended when each missing step's
    index is the next free one (a new object's own attributes are empty, so
    below it only index 0 can be created).
    """
    obj = doc["meta"]
    walk = steps if upto is None else steps[:upto]
    for position, step in enumerate(walk):
        if step.index < 0:
            raise _error(rid, steps, f"step {str(step)!r} addresses annotations, not a "
                                     "sub-object (index -1 is only allowed in the last step)")
        values = (obj.get("attrs") or {}).get(step.name)
        objs = objects_of(values) if values else []
        if step.index < len(objs):
            obj = objs[step.index]
            continue
        prefix = show(steps[:position + 1])
        if create and step.index == len(objs):
            for later in walk[position + 1:]:
                if later.index != 0:
                    raise _error(rid, steps, f"no sub-object at {show(walk[:position + 1])!r}, "
                                             f"so {str(later)!r} cannot be created below it "
                                             "(only index 0 of a new object)")
            for new_step in walk[position:]:
                new: dict[str, Any] = {}
                obj.setdefault("attrs", {}).setdefault(new_step.name, []).append({"obj": new})
                obj = new
            return obj
        if not objs:
            raise _error(rid, steps, f"no sub-object at {prefix!r}")
        raise _error(rid, steps, f"index {step.index} out of range at {prefix!r}: only "
                                 f"{len(objs)} sub-object(s)")
    return obj


def parent_of(rid: str, doc: dict[str, Any], steps: Steps, *,
              create: bool = False) -> tuple[dict[str, Any], PathStep]:
    """The object holding the attribute the last step names, and that step."""
    if not steps:
        raise PathError(f"{where(rid)}: an attribute path is needed here, got the empty path",
                        record_id=rid, path="")
    return object_at(rid, doc, steps, create=create, upto=len(steps) - 1), steps[-1]


def annotation_map(rid: str, doc: dict[str, Any], steps: Steps, *,
                   create: bool = False) -> dict[str, Any] | None:
    """The annotation map a path addresses (record, attribute or sub-object).

    Empty path: the record's annotations.  Last index ``-1``: the attribute's
    own annotations (None when it has none).  Otherwise the sub-object the
    path addresses, which must exist unless ``create``.
    """
    if not steps:
        holder, key = doc["meta"], "ann"
    elif steps[-1].index == PathStep.ATTRIBUTE_ANNOTATION:
        obj, step = parent_of(rid, doc, steps, create=create)
        if not create:
            return (obj.get("attr_ann") or {}).get(step.name)
        holder, key = obj.setdefault("attr_ann", {}), step.name
    else:
        holder, key = object_at(rid, doc, steps, create=create), "ann"
    if create:
        return holder.setdefault(key, {})
    return holder.get(key)
