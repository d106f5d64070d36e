"""The DataFrame form of pipelets: what it touches, and Python regexes in Java.

A pipelet may offer, next to ``process``, a DataFrame form that Spark runs in
the JVM over a whole batch (``frame_io`` + ``transform``, see
:class:`pipelets.Pipelet`).  The engine gives the form a frame with one row
per record and one column per attribute it touches; the form must compute
exactly what ``process`` would, because the in-process runner and records
the frame cannot carry still go through ``process``.

Exactness is kept by construction:

* A frame column holds an attribute with one plain string value (no
  semantic type, no annotations) or null when the attribute is absent; a
  record whose touched attributes are anything else takes ``process``.
* Strings go to the JVM only when they are *portable*: ASCII.  On ASCII
  Python's ``re`` and ``str.lower`` agree with Java's regex and ``lower``,
  once ``\\s`` is widened to the separator controls ``\\x1c``-``\\x1f``
  (Python counts those as whitespace, Java does not).
* Python regular expressions are translated to Java from their parse tree
  (:func:`java_regex`), construct by construct, never as text; a construct
  the two engines treat differently makes the translation refuse, and the
  pipelet then has no DataFrame form for that configuration.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def _private(name: str, before_311: str) -> Any:
    """A module of the parser behind ``re.compile`` (private; Python 3.11 moved it)."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError:  # pragma: no cover - Python 3.10
        return importlib.import_module(before_311)


_sre = _private("re._constants", "sre_constants")
_sre_parse = _private("re._parser", "sre_parse")

__all__ = ["STRING", "INT", "STRINGS", "DECLINED", "FrameIO", "cached_column", "column", "decline",
           "frame_name", "java_regex", "java_replacement", "portable", "top_group"]

#: Column types a DataFrame form may write (Spark DDL names).
STRING, INT, STRINGS = "string", "int", "array<string>"

#: The boolean frame column of rows a form declined (see :func:`decline`).
DECLINED = "_declined"

_NAME = re.compile(r"[^\[\]/]+")


@dataclass(frozen=True)
class FrameIO:
    """The attributes a pipelet's DataFrame form reads and writes.

    ``reads`` are string columns; ``writes`` pairs each written attribute
    with its column type (:data:`STRING`, :data:`INT` or :data:`STRINGS`).
    ``declines``: the form may hand some rows back (:func:`decline`).
    """

    reads: tuple[str, ...]
    writes: tuple[tuple[str, str], ...]
    declines: bool = False


def frame_name(path: str) -> bool:
    """True when ``path`` is a plain top-level attribute name (a frame column can hold it)."""
    return bool(_NAME.fullmatch(path)) and path == path.strip()


def portable(text: str) -> bool:
    """True when Python's and Java's text functions agree on ``text`` (see the module doc)."""
    return text.isascii()


def cached_column(owner: Any, build: Callable[[], Any]) -> Any:
    """``build()``, made once per pipelet object and Spark JVM, then reused.

    Building a Column costs a py4j call per function; a pipelet's expression
    does not change between batches, so a ``transform`` asks for it here.
    A Column belongs to its JVM: a new SparkContext builds it again.
    """
    from pyspark import SparkContext

    sc = SparkContext._active_spark_context
    key = id(sc._jvm) if sc is not None else None
    cached = owner.__dict__.get("_frame_column")
    if cached is None or cached[0] != key:
        cached = (key, build())
        owner.__dict__["_frame_column"] = cached
    return cached[1]


def decline(frame: Any, condition: Any) -> Any:
    """``frame`` with the rows where ``condition`` holds declined: for a value the form
    cannot compute exactly but that is too rare to make the whole form refuse.

    The engine runs a declined record through ``process`` instead (from the
    record as it was loaded: the frame's results for it are dropped).  A form
    that declines says so in its :class:`FrameIO`.
    """
    from pyspark.sql import functions as F

    return frame.withColumn(DECLINED, F.col(DECLINED) | F.coalesce(condition, F.lit(False)))


def column(name: str) -> Any:
    """The Spark column of attribute ``name`` (quoted: names may hold dots or spaces)."""
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")


# A character class is sent as the explicit set of ASCII characters it holds,
# computed with Python's own definitions (\s, \w, \d): exact on ASCII text,
# and a bit-set lookup in Java instead of Unicode property tests.
_CATEGORY_TESTS = {
    _sre.CATEGORY_DIGIT: r"\d", _sre.CATEGORY_NOT_DIGIT: r"\D", _sre.CATEGORY_SPACE: r"\s",
    _sre.CATEGORY_NOT_SPACE: r"\S", _sre.CATEGORY_WORD: r"\w", _sre.CATEGORY_NOT_WORD: r"\W",
}
_CATEGORY_SETS = {cat: frozenset(c for c in range(128) if re.match(test, chr(c)))
                  for cat, test in _CATEGORY_TESTS.items()}
_ATOMS = (_sre.LITERAL, _sre.NOT_LITERAL, _sre.ANY, _sre.IN)


def _ascii_class(members: set[int]) -> str:
    if not members:
        return r"[^\x{0}-\x{10ffff}]"  # matches nothing
    # single characters, no ranges: Java then tests membership in one bit set
    return "[" + "".join(_char(c, False) for c in sorted(members)) + "]"


_ANCHORS = {
    _sre.AT_BEGINNING: "^", _sre.AT_BEGINNING_STRING: r"\A", _sre.AT_END: "$",
    _sre.AT_END_STRING: r"\z", _sre.AT_BOUNDARY: r"\b", _sre.AT_NON_BOUNDARY: r"\B",
}
_REPEATS = {_sre.MAX_REPEAT: "", _sre.MIN_REPEAT: "?"}
if hasattr(_sre, "POSSESSIVE_REPEAT"):
    _REPEATS[_sre.POSSESSIVE_REPEAT] = "+"


class _Untranslatable(Exception):
    pass


def _char(code: int, ascii_only: bool) -> str:
    if ascii_only and code > 127:
        raise _Untranslatable("non-ASCII literal with ignoreCase")
    c = chr(code)
    return c if c.isascii() and c.isalnum() else f"\\x{{{code:x}}}"


class _Java:
    def __init__(self, flags: int) -> None:
        self.ascii_only = bool(flags & re.IGNORECASE)
        self.multiline = bool(flags & re.MULTILINE)

    def seq(self, items: Any) -> str:
        items = list(items)
        out = []
        for n, (op, av) in enumerate(items):
            if op is _sre.AT and av in (_sre.AT_BOUNDARY, _sre.AT_NON_BOUNDARY):
                out.append(self.boundary(av is _sre.AT_BOUNDARY, items[n - 1] if n else None,
                                         items[n + 1] if n + 1 < len(items) else None))
            else:
                out.append(self.item(op, av))
        return "".join(out)

    def boundary(self, at: bool, before: Any, after: Any) -> str:
        """``\\b`` (``at``) or ``\\B`` as a one-sided lookaround when a neighbour settles a side.

        Java tests ``\\b`` with Unicode property calls at every position
        tried; when the next item surely starts with a word character, the
        boundary is only "no word character before" -- a bit-set lookup.
        """
        word = _CATEGORY_SETS[_sre.CATEGORY_WORD]
        cls = _ascii_class(set(word))
        for item, look in ((after, "<"), (before, "")):
            chars = self.edge(item, first=look == "<") if item is not None else None
            if chars and chars <= word:
                return f"(?{look}{'!' if at else '='}{cls})"
            if chars and not chars & word:
                return f"(?{look}{'=' if at else '!'}{cls})"
        return _ANCHORS[_sre.AT_BOUNDARY if at else _sre.AT_NON_BOUNDARY]

    def edge(self, item: Any, first: bool) -> set[int] | None:
        """The characters ``item``'s first (last) consumed character is among, when it surely consumes one."""
        op, av = item
        if op is _sre.LITERAL:
            return self.klass_members([(op, av)])
        if op is _sre.NOT_LITERAL:
            return self.klass_members([(_sre.NEGATE, None), (_sre.LITERAL, av)])
        if op is _sre.IN:
            return self.klass_members(av)
        if op in _REPEATS and av[0] >= 1:
            return self.edge_of(av[2], first)
        if op is _sre.SUBPATTERN and not av[1] and not av[2]:
            return self.edge_of(av[3], first)
        return None

    def edge_of(self, items: Any, first: bool) -> set[int] | None:
        items = list(items)
        return self.edge(items[0 if first else -1], first) if items else None

    def item(self, op: Any, av: Any) -> str:
        if op is _sre.LITERAL:
            return _char(av, self.ascii_only)
        if op is _sre.NOT_LITERAL:
            return self.klass([(_sre.NEGATE, None), (_sre.LITERAL, av)])
        if op is _sre.ANY:
            return "."
        if op is _sre.IN:
            return self.klass(av)
        if op is _sre.BRANCH:
            return "(?:" + "|".join(self.seq(alt) for alt in av[1]) + ")"
        if op is _sre.SUBPATTERN:
            group, add, remove, body = av
            if add or remove:
                raise _Untranslatable("flags inside a group")
            return ("(?:" if group is None else "(") + self.seq(body) + ")"
        if op in _REPEATS:
            low, high, body = av
            bound = {(0, _sre.MAXREPEAT): "*", (1, _sre.MAXREPEAT): "+", (0, 1): "?"}.get(
                (low, high), f"{{{low},}}" if high == _sre.MAXREPEAT else f"{{{low},{high}}}")
            # a quantified single atom stays bare: Java loops over a group far slower
            inner = self.seq(body) if len(body) == 1 and body[0][0] in _ATOMS else "(?:" + self.seq(body) + ")"
            return inner + bound + _REPEATS[op]
        if op is _sre.AT:
            if av is _sre.AT_BEGINNING and self.multiline:
                # Python's multiline ^ also matches after a final newline; Java's does not
                raise _Untranslatable("^ with multiline")
            if av not in _ANCHORS:
                raise _Untranslatable(f"anchor {av}")
            return _ANCHORS[av]
        if op is _sre.GROUPREF:
            return f"\\{av}"
        if op in (_sre.ASSERT, _sre.ASSERT_NOT):
            direction, body = av
            kind = ("=" if op is _sre.ASSERT else "!")
            return "(?" + ("<" if direction < 0 else "") + kind + self.seq(body) + ")"
        raise _Untranslatable(str(op))

    def klass(self, items: Any) -> str:
        return _ascii_class(self.klass_members(items))

    def klass_members(self, items: Any) -> set[int]:
        """The ASCII characters a class (``[...]`` items) matches."""
        members: set[int] = set()
        negate = False
        for op, av in items:
            if op is _sre.NEGATE:
                negate = True
            elif op is _sre.LITERAL:
                members |= self.ascii({av})
            elif op is _sre.RANGE:
                members |= self.ascii(set(range(av[0], av[1] + 1)) if av[1] < 128 or self.ascii_only
                                      else set(range(av[0], 128)))
            elif op is _sre.CATEGORY and av in _CATEGORY_SETS:
                members |= _CATEGORY_SETS[av]
            else:
                raise _Untranslatable(f"{op} in a class")
        if self.ascii_only:
            members |= {ord(chr(c).swapcase()) for c in members if chr(c).isalpha()}
        return set(range(128)) - members if negate else members

    def ascii(self, codes: set[int]) -> set[int]:
        """The ASCII ones of ``codes`` (the text is ASCII); with ignoreCase all must be."""
        if self.ascii_only and any(c > 127 for c in codes):
            raise _Untranslatable("non-ASCII letters with ignoreCase")
        return {c for c in codes if c < 128}


def java_regex(pattern: re.Pattern[str]) -> str | None:
    """``pattern`` as a Java regex matching exactly the same on portable text, or None.

    None when the pattern uses a construct the engines treat differently
    (named groups, conditionals, atomic groups, inline flags in a group,
    multiline ``^``, non-ASCII letters with ``ignoreCase``).
    """
    if not isinstance(pattern.pattern, str) or pattern.groupindex:
        return None
    flags = pattern.flags
    try:
        tree = _sre_parse.parse(pattern.pattern, flags & ~re.UNICODE)
        body = _Java(flags).seq(tree)
    except (_Untranslatable, re.error, RecursionError):
        return None
    # (?d): only \n ends a line, as in Python
    prefix = "(?d" + ("i" if flags & re.IGNORECASE else "") + ("m" if flags & re.MULTILINE else "") \
        + ("s" if flags & re.DOTALL else "") + ")"
    return prefix + body


_TEMPLATE_GROUP = re.compile(r"\\([1-9])(?![0-9])")


def java_replacement(template: str) -> str | None:
    """A ``re.sub`` template as a Java replacement string, or None.

    Literal text and group references ``\\1``..``\\9`` (not followed by a
    digit) translate; any other backslash escape refuses.
    """
    out = []
    at = 0
    for m in _TEMPLATE_GROUP.finditer(template):
        out.append(template[at:m.start()])
        out.append(m.group(1))
        at = m.end()
    out.append(template[at:])
    literals = out[::2]
    if any("\\" in text for text in literals):
        return None
    return "".join(_java_literal(text) if i % 2 == 0 else "$" + text for i, text in enumerate(out))


def _java_literal(text: str) -> str:
    return text.replace("$", "\\$")


def top_group(pattern: re.Pattern[str], group: int) -> bool:
    """True when ``group`` takes part in every match (0, or a group at the pattern's top level)."""
    if group == 0:
        return True
    try:
        tree = _sre_parse.parse(pattern.pattern, pattern.flags & ~re.UNICODE)
    except re.error:
        return False
    return any(op is _sre.SUBPATTERN and av[0] == group for op, av in tree)
