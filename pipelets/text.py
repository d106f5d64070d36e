"""Text clean-up on attribute values: whitespace, case, word counts."""

from __future__ import annotations

import re
from typing import Any

from pipelets._base import Pipelet
from pipelets._config import Settings
from pipelets._literals import rewrite_strings, string_values

__all__ = ["Lowercase", "NormalizeWhitespace", "WordCount", "count_words"]

_SPACE = re.compile(r"\s+")
# A word is a run of letters/digits; apostrophes and hyphens inside keep it one word.
_WORD = re.compile(r"[^\W_]+(?:['\u2019\-][^\W_]+)*")


def count_words(text: str) -> int:
    """Words in ``text``: runs of letters or digits ("don't", "e-mail" are one word)."""
    return sum(1 for _ in _WORD.finditer(text))


class NormalizeWhitespace(Pipelet):
    """Collapse runs of whitespace to one space and strip each string value.

    Parameters:
        attribute: the attribute (or path) to clean (required).
        lowercase: also lowercase the values (default false).
        output: where to write (default: the attribute itself).

    Records without the attribute pass unchanged; non-string literals are
    copied as they are.
    """

    parameters = frozenset({"attribute", "lowercase", "output"})

    def configure(self, config: dict[str, Any]) -> None:
        super().configure(config)
        s = Settings(type(self).__name__, config)
        self.attribute: str = s.name("attribute")
        self.lowercase: bool = s.boolean("lowercase", default=False)
        self.output: str = s.name("output", default=self.attribute)

    def clean(self, text: str) -> str:
        text = _SPACE.sub(" ", text).strip()
        return text.lower() if self.lowercase else text

    def process(self, blackboard: Any, ids: list[str]) -> list[str]:
        for rid in ids:
            with self.record(rid):
                rewrite_strings(blackboard, rid, self.attribute, self.output, self.clean)
        return ids


class Lowercase(Pipelet):
    """Lowercase every string value of an attribute.

    Parameters:
        attribute: the attribute (or path) to lowercase (required).
        output: where to write (default: the attribute itself).
    """

    parameters = frozenset({"attribute", "output"})

    def configure(self, config: dict[str, Any]) -> None:
        super().configure(config)
        s = Settings(type(self).__name__, config)
        self.attribute: str = s.name("attribute")
        self.output: str = s.name("output", default=self.attribute)

    def process(self, blackboard: Any, ids: list[str]) -> list[str]:
        for rid in ids:
            with self.record(rid):
                rewrite_strings(blackboard, rid, self.attribute, self.output, str.lower)
        return ids


class WordCount(Pipelet):
    """Write the number of words in all string values of an attribute (an int).

    Parameters:
        attribute: the attribute (or path) to count (required).
        output: the attribute that receives the count (required).

    A record without the attribute gets 0.  Words are runs of letters or
    digits (see :func:`count_words`).
    """

    parameters = frozenset({"attribute", "output"})

    def configure(self, config: dict[str, Any]) -> None:
        super().configure(config)
        s = Settings(type(self).__name__, config)
        self.attribute: str = s.name("attribute")
        self.output: str = s.name("output")

    def process(self, blackboard: Any, ids: list[str]) -> list[str]:
        for rid in ids:
            with self.record(rid):
                total = sum(count_words(v) for v in string_values(blackboard, rid, self.attribute))
                blackboard.set_literal(rid, self.output, total)
        return ids
