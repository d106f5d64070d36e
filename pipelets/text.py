"""Text on attribute values: whitespace, case, word counts, regular expressions."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from blackboard import Blackboard
from pipelets._base import Pipelet
from pipelets._config import PipeletConfig
from pipelets._frames import (
    INT,
    STRING,
    STRINGS,
    FrameIO,
    cached_column,
    column,
    frame_name,
    java_regex,
    java_replacement,
    top_group,
)
from pipelets._literals import rewrite_strings, string_values

__all__ = ["Lowercase", "NormalizeWhitespace", "RegexExtract", "Replace", "WordCount", "count_words"]

_SPACE = re.compile(r"\s+")
_JAVA_SPACE = java_regex(_SPACE)
# A word is a run of letters/digits; apostrophes and hyphens inside keep it one word.
_WORD = re.compile(r"[^\W_]+(?:['\u2019\-][^\W_]+)*")


_JAVA_WORD = java_regex(_WORD)


def count_words(text: str) -> int:
    """Words in ``text``: runs of letters or digits ("don't", "e-mail" are one word)."""
    return sum(1 for _ in _WORD.finditer(text))


def _rewrite_io(attribute: str, output: str, kind: str = STRING) -> FrameIO | None:
    """The ``FrameIO`` of a pipelet that reads ``attribute``'s string and writes ``output`` (a ``kind``)."""
    if not (frame_name(attribute) and frame_name(output)):
        return None
    return FrameIO(reads=(attribute,), writes=((output, kind),))


def _rewrite_frame(owner: Any, frame: Any, value: Callable[[], Any]) -> Any:
    """``frame`` with ``owner.output`` set to ``value()`` where ``owner.attribute`` is present.

    (What ``rewrite_strings`` does, for one string value.)
    """
    from pyspark.sql import functions as F

    attribute, output = owner.attribute, owner.output
    return frame.withColumn(output, cached_column(
        owner, lambda: F.when(column(attribute).isNull(), column(output)).otherwise(value())))


class NormalizeWhitespace(Pipelet):
    """Collapse runs of whitespace to one space and strip each string value.

    Parameters:
        attribute: the attribute (or path) to clean (required).
        lowercase: also lowercase the values (default false).
        output: where to write (default: the attribute itself).

    Records without the attribute pass unchanged; non-string literals are
    copied as they are.
    """

    runs_in_service = True
    parameters = frozenset({"attribute", "lowercase", "output"})

    def configure(self, config: dict[str, Any]) -> None:
        super().configure(config)
        s = PipeletConfig(type(self).__name__, config)
        self.attribute: str = s.name("attribute")
        self.lowercase: bool = s.boolean("lowercase", default=False)
        self.output: str = s.name("output", default=self.attribute)

    def clean(self, text: str) -> str:
        text = _SPACE.sub(" ", text).strip()
        return text.lower() if self.lowercase else text

    def process_record(self, blackboard: Blackboard, rid: str) -> None:
        rewrite_strings(blackboard, rid, self.attribute, self.output, self.clean)

    def frame_io(self) -> FrameIO | None:
        return _rewrite_io(self.attribute, self.output)

    def transform(self, frame: Any) -> Any:
        from pyspark.sql import functions as F

        def value() -> Any:
            cleaned = F.trim(F.regexp_replace(column(self.attribute), F.lit(_JAVA_SPACE), F.lit(" ")))
            return F.lower(cleaned) if self.lowercase else cleaned

        return _rewrite_frame(self, frame, value)


class Lowercase(Pipelet):
    """Lowercase every string value of an attribute.

    Parameters:
        attribute: the attribute (or path) to lowercase (required).
        output: where to write (default: the attribute itself).
    """

    runs_in_service = True
    parameters = frozenset({"attribute", "output"})

    def configure(self, config: dict[str, Any]) -> None:
        super().configure(config)
        s = PipeletConfig(type(self).__name__, config)
        self.attribute: str = s.name("attribute")
        self.output: str = s.name("output", default=self.attribute)

    def process_record(self, blackboard: Blackboard, rid: str) -> None:
        rewrite_strings(blackboard, rid, self.attribute, self.output, str.lower)

    def frame_io(self) -> FrameIO | None:
        return _rewrite_io(self.attribute, self.output)

    def transform(self, frame: Any) -> Any:
        from pyspark.sql import functions as F

        return _rewrite_frame(self, frame, lambda: F.lower(column(self.attribute)))


class WordCount(Pipelet):
    """Write the number of words in all string values of an attribute (an int).

    Parameters:
        attribute: the attribute (or path) to count (required).
        output: the attribute that receives the count (required).

    A record without the attribute gets 0.  Words are runs of letters or
    digits (see :func:`count_words`).
    """

    runs_in_service = True
    parameters = frozenset({"attribute", "output"})

    def configure(self, config: dict[str, Any]) -> None:
        super().configure(config)
        s = PipeletConfig(type(self).__name__, config)
        self.attribute: str = s.name("attribute")
        self.output: str = s.name("output")

    def process_record(self, blackboard: Blackboard, rid: str) -> None:
        total = sum(count_words(v) for v in string_values(blackboard, rid, self.attribute))
        blackboard.set_literal(rid, self.output, total)

    def frame_io(self) -> FrameIO | None:
        return _rewrite_io(self.attribute, self.output, INT)

    def transform(self, frame: Any) -> Any:
        from pyspark.sql import functions as F

        def count() -> Any:
            source = column(self.attribute)
            return F.when(source.isNull(), F.lit(0)).otherwise(F.regexp_count(source, F.lit(_JAVA_WORD)))

        return frame.withColumn(self.output, cached_column(self, count))


def _template_problem(pattern: re.Pattern[str], template: str) -> str | None:
    """Why ``template`` cannot be used with ``pattern`` (``sub`` checks only on a match)."""
    # The parser of replacement templates is private and moved between Python
    # versions (3.11: _compile_repl; 3.12+: _compile_template).
    compile_template = getattr(re, "_compile_template", None) or getattr(re, "_compile_repl", None)
    if compile_template is None:  # pragma: no cover - a future Python
        return None
    try:
        compile_template(pattern, template) if compile_template.__name__ == "_compile_template" \
            else compile_template(template, pattern)
    except (re.error, IndexError) as e:
        return f"not usable with this pattern: {e}"
    return None


def _flags(s: PipeletConfig) -> int:
    flags = 0
    if s.boolean("ignoreCase", default=False):
        flags |= re.IGNORECASE
    if s.boolean("multiline", default=False):
        flags |= re.MULTILINE
    if s.boolean("dotAll", default=False):
        flags |= re.DOTALL
    return flags


class RegexExtract(Pipelet):
    """Write the matches of a regular expression in an attribute to another attribute.

    Parameters:
        attribute: the attribute (or path) to search (required).
        pattern: a Python regular expression (required).
        output: the attribute receiving the matches (required); it is
            replaced, and removed when nothing matches.
        group: the group to take, by number or name (default: 1 when the
            pattern has groups, else the whole match).
        all: every match of every value (default true) or only the first.
        ignoreCase, multiline, dotAll: regular expression flags (default false).
    """

    parameters = frozenset({"attribute", "pattern", "output", "group", "all", "ignoreCase",
                            "multiline", "dotAll"})

    def configure(self, config: dict[str, Any]) -> None:
        super().configure(config)
        s = PipeletConfig(type(self).__name__, config)
        self.attribute: str = s.name("attribute")
        self.output: str = s.name("output")
        self.pattern: re.Pattern[str] = s.regex("pattern", flags=_flags(s))
        self.all: bool = s.boolean("all", default=True)
        group = s.raw("group", default=None)[1]
        if isinstance(group, str) and group.strip() in self.pattern.groupindex:
            self.group: int | str = group.strip()
        else:
            self.group = s.integer("group", default=1 if self.pattern.groups else 0, minimum=0)
            if self.group > self.pattern.groups:
                raise s.error("group", f"the pattern has {self.pattern.groups} group(s), "
                                       f"not {self.group}")

    def process_record(self, blackboard: Blackboard, rid: str) -> None:
        found: list[str] = []
        for text in string_values(blackboard, rid, self.attribute):
            for match in self.pattern.finditer(text):
                value = match.group(self.group)
                if value is not None:
                    found.append(value)
                if found and not self.all:
                    break
            if found and not self.all:
                break
        blackboard.set_literals(rid, self.output, found)

    def frame_io(self) -> FrameIO | None:
        if not isinstance(self.group, int) or java_regex(self.pattern) is None \
                or not top_group(self.pattern, self.group):
            return None
        return _rewrite_io(self.attribute, self.output, STRINGS)

    def transform(self, frame: Any) -> Any:
        from pyspark.sql import functions as F

        def matches() -> Any:
            source = column(self.attribute)
            found = F.regexp_extract_all(source, F.lit(java_regex(self.pattern)), F.lit(self.group))
            if not self.all:
                found = F.slice(found, 1, 1)
            return F.when(source.isNull(), F.array().cast(STRINGS)).otherwise(found)

        return frame.withColumn(self.output, cached_column(self, matches))


class Replace(Pipelet):
    """Replace text in every string value of an attribute.

    Parameters:
        attribute: the attribute (or path) (required).
        pattern: what to find: a regular expression, or plain text with
            ``regex: false`` (required).
        replacement: the replacement (default empty: delete); with regular
            expressions ``\\1`` and ``\\g<name>`` refer to groups.
        regex: whether ``pattern`` is a regular expression (default true).
        count: replace at most this many occurrences per value (default all).
        output: where to write (default: the attribute itself).
        ignoreCase, multiline, dotAll: regular expression flags.
    """

    parameters = frozenset({"attribute", "pattern", "replacement", "regex", "count", "output",
                            "ignoreCase", "multiline", "dotAll"})

    def configure(self, config: dict[str, Any]) -> None:
        super().configure(config)
        s = PipeletConfig(type(self).__name__, config)
        self.attribute: str = s.name("attribute")
        self.output: str = s.name("output", default=self.attribute)
        regex = s.boolean("regex", default=True)
        if regex:
            self.pattern: re.Pattern[str] = s.regex("pattern", flags=_flags(s))
        else:
            self.pattern = re.compile(re.escape(s.text("pattern")), _flags(s))
        self.replacement: str = s.text("replacement", default="", empty=True)
        if not regex:
            # plain text: backslashes in the replacement are literal too
            self.replacement = self.replacement.replace("\\", "\\\\")
        self.count: int = s.integer("count", default=0, minimum=0)
        if regex:
            problem = _template_problem(self.pattern, self.replacement)
            if problem:
                raise s.error("replacement", problem)

    def replace(self, text: str) -> str:
        return self.pattern.sub(self.replacement, text, count=self.count)

    def process_record(self, blackboard: Blackboard, rid: str) -> None:
        rewrite_strings(blackboard, rid, self.attribute, self.output, self.replace)

    def frame_io(self) -> FrameIO | None:
        if self.count or java_regex(self.pattern) is None or java_replacement(self.replacement) is None:
            return None
        return _rewrite_io(self.attribute, self.output)

    def transform(self, frame: Any) -> Any:
        from pyspark.sql import functions as F

        return _rewrite_frame(self, frame, lambda: F.regexp_replace(
            column(self.attribute), F.lit(java_regex(self.pattern)), F.lit(java_replacement(self.replacement))))
