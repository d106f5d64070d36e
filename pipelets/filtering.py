"""Dropping records from the flow by a condition on an attribute."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from blackboard import Blackboard
from pipelets._base import Pipelet
from pipelets._config import PipeletConfig

__all__ = ["Filter"]


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dt.date, dt.datetime)):
        return value.isoformat()
    return str(value)


class Filter(Pipelet):
    """Let through only the records that meet a condition on an attribute.

    Records that fail it are left out of the returned IDs: later activities
    do not see them (they are not deleted, and are committed with the rest).

    Parameters:
        attribute: the attribute (or path) tested (required).
        equals: a value or list: some value of the attribute equals one of
            them (compared as text, so "3" matches 3 and "true" matches True).
        matches: a regular expression some string value contains (``re.search``).
        (neither: the record passes when it has the attribute.)
        ignoreCase: for ``equals`` and ``matches`` (default false).
        invert: let through the records that do *not* meet the condition.
    """

    parameters = frozenset({"attribute", "equals", "matches", "ignoreCase", "invert"})

    def configure(self, config: dict[str, Any]) -> None:
        super().configure(config)
        s = PipeletConfig(type(self).__name__, config)
        self.attribute: str = s.name("attribute")
        if s.has("equals") and s.has("matches"):
            raise s.error("matches", "give either 'equals' or 'matches', not both")
        self.ignore_case = s.boolean("ignoreCase", default=False)
        self.invert = s.boolean("invert", default=False)
        equals = s.values("equals", default=None)
        self.equals = None if equals is None else {self._fold(_text(v)) for v in equals}
        self.matches = s.regex("matches", default=None,
                               flags=re.IGNORECASE if self.ignore_case else 0)

    def _fold(self, text: str) -> str:
        return text.casefold() if self.ignore_case else text

    def passes(self, bb: Blackboard, rid: str) -> bool:
        """Whether record ``rid`` meets the condition (before ``invert``)."""
        if not bb.has_attribute(rid, self.attribute):
            return False
        if self.equals is None and self.matches is None:
            return True
        for lit in bb.get_literals(rid, self.attribute):
            if self.equals is not None and self._fold(_text(lit.value)) in self.equals:
                return True
            if self.matches is not None and isinstance(lit.value, str) \
                    and self.matches.search(lit.value):
                return True
        return False

    def process_record(self, blackboard: Blackboard, rid: str) -> list[str] | None:
        return None if self.passes(blackboard, rid) != self.invert else []
