"""Helpers for pipelets that rewrite an attribute's literal values."""

from __future__ import annotations

from collections.abc import Callable

from blackboard import Blackboard, Literal, Path, PathStep

__all__ = ["copy_attribute", "rewrite_strings", "string_values"]


def string_values(blackboard: Blackboard, record_id: str, attribute: str) -> list[str]:
    """The attribute's string literal values (``[]`` when it is absent)."""
    if not blackboard.has_attribute(record_id, attribute):
        return []
    return [lit.value for lit in blackboard.get_literals(record_id, attribute)
            if isinstance(lit.value, str)]


def rewrite_strings(blackboard: Blackboard, record_id: str, attribute: str, output: str,
                    fn: Callable[[str], str]) -> bool:
    """Write ``fn(value)`` of each string literal of ``attribute`` to ``output``.

    Other literals (numbers, dates) are copied unchanged; semantic types and
    annotations of the literals are kept.  A record without the attribute is
    left alone.  Returns whether anything was written (nothing is written when
    ``output`` is ``attribute`` and no value changed, so the record stays clean).
    """
    if not blackboard.has_attribute(record_id, attribute):
        return False
    old = blackboard.get_literals(record_id, attribute)
    new = [Literal(fn(lit.value), lit.semantic_type, lit.annotations)
           if isinstance(lit.value, str) else lit for lit in old]
    if output == attribute and new == old:
        return False
    blackboard.set_literals(record_id, output, new)
    return True


def _annotation_path(path: str) -> str:
    return f"{path}[{PathStep.ATTRIBUTE_ANNOTATION}]"


def _copy_annotations(blackboard: Blackboard, rid: str, src: str, dst: str) -> None:
    for name in blackboard.annotation_names(rid, src):
        blackboard.set_annotations(rid, dst, name, blackboard.get_annotations(rid, src, name))


def _inside(inner: Path, outer: Path) -> bool:
    """True when attribute path ``inner`` is ``outer`` or lies in its values."""
    if len(inner) < len(outer):
        return False
    head = inner.steps[:len(outer)]
    return (all(a == b for a, b in zip(head[:-1], outer.steps[:-1], strict=True))
            and head[-1].name == outer.last.name)


def copy_attribute(blackboard: Blackboard, record_id: str, source: str, target: str) -> None:
    """Make ``target`` a copy of attribute ``source``: literals, sub-objects, annotations.

    Literals keep their semantic types and annotations; sub-objects are
    copied attribute by attribute with their semantic types and annotations.
    Within the copy, literals come before sub-objects.  ``target`` is
    replaced.  Raises ``ValueError`` when one path lies inside the other.
    """
    src, dst = Path(source), Path(target)
    if _inside(dst, src) or _inside(src, dst):
        raise ValueError(f"cannot copy attribute {str(src)!r} to {str(dst)!r}: "
                         "one lies inside the other")
    if blackboard.has_attribute(record_id, dst):
        blackboard.remove_attribute(record_id, dst)
    blackboard.set_literals(record_id, dst, blackboard.get_literals(record_id, src))
    for i in range(blackboard.object_size(record_id, src)):
        s_obj, d_obj = f"{src}[{i}]", f"{dst}[{i}]"
        blackboard.set_object_semantic_type(record_id, d_obj,
                                            blackboard.get_object_semantic_type(record_id, s_obj))
        for name in blackboard.attribute_names(record_id, s_obj):
            copy_attribute(blackboard, record_id, f"{s_obj}/{name}", f"{d_obj}/{name}")
        _copy_annotations(blackboard, record_id, s_obj, d_obj)
    if blackboard.has_annotations(record_id, _annotation_path(str(src))):
        _copy_annotations(blackboard, record_id, _annotation_path(str(src)),
                          _annotation_path(str(dst)))
