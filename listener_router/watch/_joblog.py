"""The job-log panel's data: filters (record, state, queue, workflow, time) and pages.

Pages are keyset pages, newest first: a page is the ``PAGE`` newest entries
that match and are older than its cursor (``before``: an entry's time and
ID), so a page looked at stays the same while new entries arrive.  Commits
of one batch share a time; entries are ordered by time and ID, and the
cursor's ID tells them apart.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from listener_router._control import parse_duration
from listener_router._errors import ConfigError
from listener_router.jobs import COUNTED_STATES, JobLogTables, LogEntry
from listener_router.store import ServiceStore

__all__ = ["PAGE", "SINCE", "STATES", "Job", "JobPage", "JobQuery", "job_page"]

PAGE = 25                    # entries a page
MAX_SCAN = 20_000            # entries read at most to find a page's neighbours
STATES = (*COUNTED_STATES, "replayed", "purged")
SINCE = ("15m", "1h", "6h", "1d", "7d")   # the time filter's choices (and any time)


@dataclass(frozen=True)
class Job:
    """One job-log entry as the page shows it: a settled attempt of a message, a replay or
    purge of a dead letter, a ``chalk process`` record."""

    entry: LogEntry
    records: tuple[str, ...]
    live: bool = False         # a retry still to come: nothing settled the message since


Cursor = tuple[float, int]


def _cursor(text: str) -> Cursor | None:
    at, _, entry = text.partition("_")
    try:
        return float(at), int(entry)
    except ValueError:
        return None


def cursor_text(entry: LogEntry) -> str:
    return f"{entry.at!r}_{entry.id}"


@dataclass(frozen=True)
class JobQuery:
    """What the panel is asked for (the page's query string)."""

    record: str = ""
    state: str = ""
    queue: str = ""
    workflow: str = ""
    since: str = ""
    before: Cursor | None = None

    @classmethod
    def of(cls, params: Mapping[str, str]) -> JobQuery:
        def get(name: str) -> str:
            return str(params.get(name, "")).strip()[:512]
        since = get("since")
        return cls(record=get("record"), state=get("state") if get("state") in STATES else "",
                   queue=get("queue"), workflow=get("workflow"),
                   since=since if since in SINCE else "", before=_cursor(get("before")))

    def filters(self, now: float) -> dict[str, Any]:
        since = None
        if self.since:
            try:
                since = now - parse_duration(self.since, "since")
            except ConfigError:
                since = None
        purged = self.state == "purged"   # a dead letter purged since: its dead entry
        return dict(states=("dead",) if purged else (self.state,) if self.state else (),
                    resolved="purged" if purged else None,
                    queues=(self.queue,) if self.queue else (),
                    workflows=(self.workflow,) if self.workflow else (),
                    record=self.record or None, since=since)

    @property
    def filtered(self) -> bool:
        return bool(self.record or self.state or self.queue or self.workflow or self.since)

    def link(self, **changes: str | None) -> dict[str, str]:
        """The query string's values for a link: these, with ``changes``."""
        values = {"record": self.record, "state": self.state, "queue": self.queue,
                  "workflow": self.workflow, "since": self.since}
        values.update({k: v or "" for k, v in changes.items()})
        return {k: v for k, v in values.items() if v}


@dataclass(frozen=True)
class JobPage:
    query: JobQuery
    jobs: list[Job]                     # newest first
    older: str | None                   # the next page's cursor (None: this is the last)
    newer: str | None                   # the previous page's ("": the newest page)


def _window(tables: JobLogTables, filters: dict[str, Any], cursor: Cursor | None,
            want: int) -> list[LogEntry]:
    """The ``want`` newest entries older than ``cursor`` (any, without one), oldest first.

    The log reads the newest entries of a time by time only: among entries of one time (a
    batch's commits) it takes any.  So once ``want`` are found, every entry of the oldest
    time among them up to the cursor's is read again, and the page is cut from those."""
    until = None if cursor is None else cursor[0]
    limit = want
    while True:
        found = tables.entries(**{**filters, "until": until}, limit=limit)
        if len(found) < limit:   # everything there is up to the cursor's time
            complete = found
        else:
            since = max(found[0].at, filters["since"] or found[0].at)
            complete = tables.entries(**{**filters, "since": since, "until": until},
                                      limit=MAX_SCAN)
        older = [e for e in complete if cursor is None or (e.at, e.id) < cursor]
        if len(older) >= want or len(found) < limit or limit >= MAX_SCAN:
            return older[-want:]
        limit *= 4


def _newer(tables: JobLogTables, filters: dict[str, Any], top: LogEntry) -> str | None:
    """The cursor of the page before the one whose newest entry is ``top``."""
    found = tables.entries(**{**filters, "since": top.at}, limit=MAX_SCAN)
    newer = [e for e in found if (e.at, e.id) > (top.at, top.id)]
    if len(found) >= MAX_SCAN or len(newer) <= PAGE:
        return ""
    return cursor_text(newer[PAGE])


def job_page(store: ServiceStore, query: JobQuery, now: float | None = None) -> JobPage:
    """The page of the job log ``query`` asks for."""
    tables = store.tables(JobLogTables)
    filters = query.filters(time.time() if now is None else now)
    found = _window(tables, filters, query.before, PAGE + 1)
    page = found[-PAGE:]
    older = cursor_text(page[0]) if len(found) > PAGE else None
    newer = None
    if query.before is not None:
        newer = _newer(tables, filters, page[-1]) if page else ""
    jobs = [Job(e, tuple(tables.record_ids(e)), _still_to_come(tables, e))
            for e in reversed(page)]
    return JobPage(query, jobs, older, newer)


def _still_to_come(tables: JobLogTables, entry: LogEntry) -> bool:
    """A ``retrying`` entry whose message has no later step: its retry waits, and can be
    cancelled (one that died or committed since cannot)."""
    if entry.state != "retrying" or entry.resolved:
        return False
    last = tables.entries(queues=(entry.queue,), message_id=entry.message_id, limit=1)
    return bool(last) and last[-1].id == entry.id
