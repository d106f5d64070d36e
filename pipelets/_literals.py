"""Helpers for pipelets that rewrite an attribute's literal values."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from blackboard import Literal

__all__ = ["rewrite_strings", "string_values"]


def string_values(blackboard: Any, record_id: str, attribute: str) -> list[str]:
    """The attribute's string literal values (``[]`` when it is absent)."""
    if not blackboard.has_attribute(record_id, attribute):
        return []
    return [lit.value for lit in blackboard.get_literals(record_id, attribute)
            if isinstance(lit.value, str)]


def rewrite_strings(blackboard: Any, record_id: str, attribute: str, output: str,
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
