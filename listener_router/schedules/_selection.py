"""Which record IDs a schedule publishes, walked a page at a time from a cursor.

A fixed ``ids`` list is walked by position.  Otherwise the store's records
are walked in key order (:meth:`blackboard.SqlStore.scan`: one indexed range
read per page), each page filtered by ``prefix``, ``source`` and ``xpath``;
the cursor is the last ID read.  Nothing holds more than a page, so "all
records" over millions streams.  On SQLite, where keys sort bytewise, a
``prefix`` walk starts at the prefix and ends after it; elsewhere (a
PostgreSQL collation need not keep a prefix's keys together) the whole key
range is walked.
"""

from __future__ import annotations

from typing import Any

import orjson

import engine
from blackboard import SqlStore
from listener_router._errors import ConfigError
from listener_router.schedules._settings import ScheduleRule

__all__ = ["PAGE", "Selection"]

PAGE = 2000               # records read (or IDs taken from a list) per page


class Selection:
    """A schedule's records (see the module doc); :meth:`page` reads the next page."""

    def __init__(self, rule: ScheduleRule, sql: SqlStore, page: int = PAGE):
        self.rule = rule
        self.sql = sql
        self.size = page
        self.condition: Any = None
        if rule.xpath:
            try:
                self.condition = engine.compile_condition(rule.xpath)
            except engine.WorkflowDefinitionError as e:
                raise ConfigError(f"[[schedule]] {rule.name!r}: xpath {rule.xpath!r}: {e}") from e
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
        rule = self.rule
        if rule.ids is not None:
            start = int(cursor or 0)
            ids = list(rule.ids[start:start + self.size])
            end = start + len(ids)
            return ids, str(end), end >= len(rule.ids)
        prefix = rule.prefix or ""
        after = cursor
        if cursor is None and prefix and self._bytewise:
            # the walk starts just before the prefix: every key with it sorts at or after it
            rows = self.sql.scan(None, self.size, docs=self._docs, start=prefix)
        else:
            rows = self.sql.scan(after, self.size, docs=self._docs)
        if not rows:
            return [], cursor, True
        chosen: list[str] = []
        over = len(rows) < self.size
        for rid, text in rows:
            if prefix and not rid.startswith(prefix):
                if self._bytewise and rid > prefix:
                    over = True
                    break
                continue
            if self._docs and not self._wanted(text):
                continue
            chosen.append(rid)
        return chosen, rows[-1][0], over

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
