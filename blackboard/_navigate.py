"""Walking record documents along paths (pure functions, no storage)."""

from __future__ import annotations

from typing import Any

from blackboard._errors import PathError, where
from blackboard._model import is_object
from blackboard._path import Path, PathStep

__all__ = ["object_at", "parent_of", "literals_of", "objects_of", "annotation_map"]


def literals_of(values: list[Any]) -> list[Any]:
    return [v for v in values if not is_object(v)]


def objects_of(values: list[Any]) -> list[dict[str, Any]]:
    return [v["obj"] for v in values if is_object(v)]


def _step_object(rid: str, path: Path, upto: int, obj: dict[str, Any], step: PathStep,
                 create: bool) -> dict[str, Any]:
    attrs = obj.get("attrs")
    values = attrs.get(step.name) if attrs else None
    if step.index < 0:
        raise PathError(f"{where(rid, path)}: step {str(step)!r} addresses annotations, "
                        "not a sub-object", record_id=rid, path=path)
    objs = objects_of(values) if values else []
    if step.index < len(objs):
        return objs[step.index]
    if create and step.index == len(objs):
        new: dict[str, Any] = {}
        obj.setdefault("attrs", {}).setdefault(step.name, []).append({"obj": new})
        return new
    prefix = Path(list(path.steps[:upto + 1]))
    if not objs:
        raise PathError(f"{where(rid, path)}: no sub-object at {str(prefix)!r}",
                        record_id=rid, path=path)
    raise PathError(f"{where(rid, path)}: index {step.index} out of range at {str(prefix)!r}: "
                    f"only {len(objs)} sub-object(s)", record_id=rid, path=path)


def object_at(rid: str, doc: dict[str, Any], path: Path, *, create: bool = False,
              upto: int | None = None) -> dict[str, Any]:
    """The object addressed by the first ``upto`` steps of ``path`` (all when None)."""
    obj = doc["meta"]
    steps = path.steps if upto is None else path.steps[:upto]
    for position, step in enumerate(steps):
        obj = _step_object(rid, path, position, obj, step, create)
    return obj


def parent_of(rid: str, doc: dict[str, Any], path: Path, *,
              create: bool = False) -> tuple[dict[str, Any], PathStep]:
    """The object holding the attribute the last step names, and that step."""
    if path.is_empty():
        raise PathError(f"{where(rid)}: an attribute path is needed here, got the empty path",
                        record_id=rid, path=path)
    return object_at(rid, doc, path, create=create, upto=len(path) - 1), path.last


def annotation_map(rid: str, doc: dict[str, Any], path: Path, *,
                   create: bool = False) -> dict[str, Any] | None:
    """The annotation map a path addresses (record, attribute or sub-object).

    Empty path: the record's annotations.  Last index ``-1``: the attribute's
    own annotations.  Otherwise the sub-object the path addresses.
    """
    if path.is_empty():
        holder, key = doc["meta"], "ann"
    elif path.last.index == PathStep.ATTRIBUTE_ANNOTATION:
        obj, step = parent_of(rid, doc, path, create=create)
        attrs = obj.get("attrs") or {}
        if step.name not in attrs and not create:
            if step.name in (obj.get("attr_ann") or {}):
                return obj["attr_ann"][step.name]
            raise PathError(f"{where(rid, path)}: no attribute {step.name!r}",
                            record_id=rid, path=path)
        if not create:
            return (obj.get("attr_ann") or {}).get(step.name)
        holder, key = obj.setdefault("attr_ann", {}), step.name
    else:
        holder, key = object_at(rid, doc, path, create=create), "ann"
    if create:
        return holder.setdefault(key, {})
    return holder.get(key)
