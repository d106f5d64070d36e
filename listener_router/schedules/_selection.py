"""Which record IDs a schedule (or ``chalk reprocess``) publishes, walked a page at a time
from a cursor.

A fixed ``ids`` list is walked by position.  Otherwise the store's records
are walked in key order (:meth:`blackboard.SqlStore.scan`: one indexed range
read per page), each page filtered by ``prefix``, ``source`` and ``xpath``;
the cursor is the last ID read.  Nothing holds more than a page, so "all
records" over millions streams.  On SQLite, where keys sort bytewise, a
``prefix`` walk starts at the prefix and ends after it; elsewhere (a
PostgreSQL collation need not keep a prefix's keys together) the whole key
range is walked.

The criteria are any value with ``ids``, ``prefix``, ``source`` and
``xpath`` (a :class:`~listener_router.schedules.ScheduleRule`, or a
:class:`RecordFilter` for a selection no schedule owns).  A :class:`Page`
also says where the walk stands after each of its IDs
(:meth:`Page.after`), so a caller that hands on a page in parts can keep a
cursor between them: a key-order walk goes on after any ID it returned,
a list after any position.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

import engine
from blackboard import SqlStore
from listener_router._errors import ConfigError

__all__ = ["PAGE", "Criteria", "Page", "RecordFilter", "Selection"]

PAGE = 2000               # records read (or IDs taken from a list) per page


class Criteria(Protocol):
    """What a selection is made of (a ``[[schedule]]`` entry is one)."""

    @property
    def ids(self) -> tuple[str, ...] | None: ...
    @property
    def prefix(self) -> str | None: ...
    @property
    def source(self) -> str | None: ...
    @property
    def xpath(self) -> str | None: ...


@dataclass(frozen=True)
class RecordFilter:
    """Criteria that belong to no schedule: a fixed list of IDs, or the stored records
    narrowed by ID prefix, source and an XPath over the record."""

    ids: tuple[str, ...] | None = None
    prefix: str | None = None
    source: str | None = None
    xpath: str | None = None


@dataclass(frozen=True)
class Page:
    """One page of a walk: the selected ``ids``, the ``cursor`` after the page, whether the
    walk is ``over``, how many records (or listed IDs) were ``read``, and ``marks``: the
    cursor and the count read after each ID of ``ids``."""

    start: str | None
    ids: list[str]
    cursor: str | None
    over: bool
    read: int
    marks: list[tuple[str | None, int]] = field(repr=False)

    def after(self, n: int) -> tuple[str | None, int]:
        """The cursor, and the records read, once the first ``n`` IDs are handed on."""
        if n >= len(self.ids):
            return self.cursor, self.read
        return self.marks[n - 1] if n > 0 else (self.start, 0)


class Selection:
    """A selection's records (see the module doc); :meth:`read` reads the next page.

    ``where`` names the criteria in errors (default: the schedule's entry);
    ``stored_only`` leaves listed IDs with no stored record out of the pages.
    """

    def __init__(self, rule: Criteria, sql: SqlStore, page: int = PAGE, *,
                 where: str | None = None, stored_only: bool = False):
        self.rule = rule
        self.sql = sql
        self.size = page
        self.stored_only = stored_only
        self.condition: Any = None
        if rule.xpath:
            where = where or f"[[schedule]] {getattr(rule, 'name', '?')!r}"
            try:
                self.condition = engine.compile_condition(rule.xpath)
            except engine.WorkflowDefinitionError as e:
                raise ConfigError(f"{where}: xpath {rule.xpath!r}: {e}") from e
        self._bytewise = sql.dialect == "sqlite"

    def describe(self) -> str:
        rule = self.rule
        if rule.ids is not None:
            return f"{len(rule.ids)} listed record(s)"
        parts = [f"ID prefix {rule.prefix!r}" if rule.prefix else "",
                 f"source {rule.source!r}" if rule.source else "",
                 f"xpath {rule.xpath}" if rule.xpath else ""]
        return "records with " + ", ".join(p for p in parts if p) if any(parts) else "all records"

    def page(self, cursor: str | None) -> tuple[list[str], str | None, bool]:
        """The selected IDs of the page after ``cursor``, the new cursor, and whether the
        walk is over."""
        found = self.read(cursor)
        return found.ids, found.cursor, found.over

    def read(self, cursor: str | None) -> Page:
        """The page after ``cursor`` (see :class:`Page`)."""
        if self.rule.ids is not None:
            return self._listed(cursor, self.rule.ids)
        prefix = self.rule.prefix or ""
        if cursor is None and prefix and self._bytewise:
            # the walk starts just before the prefix: every key with it sorts at or after it
            rows = self.sql.scan(None, self.size, docs=self._docs, start=prefix)
        else:
            rows = self.sql.scan(cursor, self.size, docs=self._docs)
        if not rows:
            return Page(cursor, [], cursor, True, 0, [])
        chosen: list[str] = []
        marks: list[tuple[str | None, int]] = []
        over = len(rows) < self.size
        read = 0
        for rid, text in rows:
            if prefix and not rid.startswith(prefix):
                if self._bytewise and rid > prefix:
                    over = True
                    break
                read += 1
                continue
            read += 1
            if self._docs and not self._wanted(text):
                continue
            chosen.append(rid)
            marks.append((rid, read))
        return Page(cursor, chosen, rows[-1][0], over, read, marks)

    def _listed(self, cursor: str | None, listed: tuple[str, ...]) -> Page:
        start = int(cursor or 0)
        ids = list(listed[start:start + self.size])
        end = start + len(ids)
        marks: list[tuple[str | None, int]] = [(str(start + n), n)
                                               for n in range(1, len(ids) + 1)]
        if self.stored_only and ids:
            stored = self.sql.read(ids)
            kept = [(rid, mark) for rid, mark in zip(ids, marks, strict=True) if rid in stored]
            ids, marks = [rid for rid, _m in kept], [m for _r, m in kept]
        return Page(cursor, ids, str(end), end >= len(listed), end - start, marks)

    @property
    def _docs(self) -> bool:
        return bool(self.rule.source or self.condition is not None)

    def _wanted(self, text: str | None) -> bool:
        if text is None:
            return False
        doc = orjson.loads(text)
        if self.rule.source is not None and doc.get("source") != self.rule.source:
            return False
        return self.condition is None or bool(self.condition.test([doc]))
