"""Helpers shared by the pipelet tests (import as ``from pipelets_helpers import ...``)."""

from __future__ import annotations

from typing import Any

from blackboard import Blackboard


def configured(cls: type, **config: Any) -> Any:
    """A pipelet of ``cls`` configured with ``config``."""
    p = cls()
    p.configure(config)
    return p


def make(board: Blackboard, record_id: str, **attributes: Any) -> str:
    """Create a record with message-style attributes; return its ID."""
    board.create(record_id)
    board.set_attributes(record_id, attributes)
    return record_id


def values(board: Blackboard, record_id: str, attribute: str) -> list[Any]:
    return [lit.value for lit in board.get_literals(record_id, attribute)]
