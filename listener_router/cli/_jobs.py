"""Operator commands over the job log: ``chalk jobs`` and ``chalk schedules``.

Each builds its rows as plain values (what ``--json`` prints, one object a
line) and prints them through :class:`~listener_router.cli._show.Out`.
"""

from __future__ import annotations

import datetime as dt
import difflib
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

from listener_router._errors import ConfigError
from listener_router._settings import Settings
from listener_router.cli._common import JOB_STATES
from listener_router.cli._show import Out, iso, plain_rows
from listener_router.jobs import JobLogTables, LogEntry, Step, steps
from listener_router.schedules import schedule_status, tick_label
from listener_router.store import ServiceStore

__all__ = ["STATES", "check_states", "jobs", "parse_time", "schedule_rows", "schedules",
           "step_record"]

_RELATIVE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)\s*$")
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_SHOWN_STAGES = ("run", "commit", "publish", "batch")


def parse_time(value: str | None, *, now: float | None = None) -> float | None:
    """``--since``/``--until``: ``30m`` ago (s, m, h, d), or an ISO 8601 time (UTC if no zone)."""
    if value is None:
        return None
    now = time.time() if now is None else now
    relative = _RELATIVE.match(value)
    if relative:
        return now - float(relative.group(1)) * _UNITS[relative.group(2)]
    try:
        when = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as e:
        raise ConfigError(f"time {value!r}: give an age like 30m, 2h, 1d or an ISO 8601 time "
                          "like 2024-05-01T12:00") from e
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return when.timestamp()


def _when(t: float | None) -> str:
    if t is None:
        return "-"
    return dt.datetime.fromtimestamp(t).isoformat(sep=" ", timespec="milliseconds")


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if value < 10 else f"{value:.1f} s"


# -- chalk jobs -------------------------------------------------------------------------
STATES = JOB_STATES
_MAX_READ = 100_000          # entries read at most to fill --limit with steps that match
_COLUMNS = ["when", "step", "message", "queue", "attempt", "workflow", "member", "records",
            "outgoing", "batch", "reason"]


def check_states(states: Sequence[str]) -> list[str]:
    """``--state`` values, each one of :data:`STATES` (an unknown one is an error)."""
    for state in states:
        if state not in STATES:
            guess = difflib.get_close_matches(state, STATES, n=1)
            raise ConfigError(f"--state {state!r}: not a step; one of {', '.join(STATES)}"
                              + (f" (did you mean {guess[0]!r}?)" if guess else ""))
    return list(states)


def _kind(step: Step) -> tuple[str, int | None]:
    """The step as shown (``deleted`` for a crawl's deletion that committed) and its crawl."""
    from listener_router.delta import deletion_step

    if step.what == "received":
        return "received", None
    return deletion_step(step.what, step.entry.message_id)


def _matches(step: Step, wanted: set[str]) -> bool:
    if not wanted:
        return True
    if step.what == "received":
        return "received" in wanted
    shown, _crawl = _kind(step)
    return bool({shown, step.what, step.entry.resolved} & wanted)


def _stored_states(wanted: set[str]) -> list[str]:
    """The log's states that hold the steps ``wanted`` asks for ([]: any state)."""
    if not wanted or "received" in wanted:
        return []
    stored = wanted - {"deleted", "purged"}
    if "deleted" in wanted:
        stored.add("committed")
    if "purged" in wanted:
        stored.add("dead")
    return sorted(stored)


def step_record(step: Step) -> dict[str, Any]:
    """One step as ``chalk jobs --json`` prints it (attempts numbered from 1)."""
    e = step.entry
    shown, crawl = _kind(step)
    return {"at": iso(step.at), "step": shown, "message_id": e.message_id, "queue": e.queue,
            "attempt": e.attempt, "replay": e.round, "workflow": e.workflow,
            "member": e.member, "record": e.record, "record_count": e.records,
            "outgoing": e.outgoing, "batch": e.batch,
            "seconds": {k: v for k, v in (step.seconds or {}).items() if k in _SHOWN_STAGES}
            if step.what != "received" else {},
            "reason": e.reason, "resolved": e.resolved, "resolved_at": iso(e.resolved_at),
            "crawl": crawl}


def _cells(step: Step) -> list[str]:
    """One step as the table's cells (:data:`_COLUMNS`)."""
    e = step.entry
    shown, crawl = _kind(step)
    label = shown + (f" (crawl {crawl})" if crawl is not None else "")
    if e.resolved and step.what != "received":
        label += f" ({e.resolved} {_when(e.resolved_at)})"
    attempt = f"{e.attempt}" + (f" (replay {e.round})" if e.round else "")
    if step.what == "received":
        return [_when(step.at), label, e.message_id, e.queue, attempt, e.workflow or "-",
                e.member or "-", "", "", "", ""]
    records = (f"{e.records} from {e.record}" if e.records > 1 else (e.record or ""))
    timing = ""
    if step.seconds:
        shown_stages = ", ".join(f"{k} {_seconds(v)}" for k, v in step.seconds.items()
                                 if k in _SHOWN_STAGES)
        timing = f"{e.batch[:8] if e.batch else '-'} ({shown_stages})"
    return [_when(step.at), label, e.message_id, e.queue, attempt, e.workflow or "-",
            e.member or "-", records, str(e.outgoing) if e.outgoing else "", timing,
            e.reason or ""]


class _Rows:
    """Rows printed under a header whose widths are fixed by the first ones (``--follow``
    prints later rows in the same columns; a longer cell widens its line, nothing is cut)."""

    def __init__(self, write: Callable[[str], None]):
        self.write = write
        self.widths: list[int] | None = None

    def print(self, title: str, rows: list[list[str]]) -> None:
        lines = plain_rows(_COLUMNS, rows)
        self.widths = [max([len(_COLUMNS[i]), *(len(r[i]) for r in rows)]) for i in
                       range(len(_COLUMNS))]
        self.write(title)
        for line in lines:
            self.write(line)

    def more(self, rows: list[list[str]]) -> None:
        assert self.widths is not None
        for row in rows:
            self.write("  ".join(cell.ljust(width) for cell, width
                                 in zip(row, self.widths, strict=True)).rstrip())


def _steps(store: ServiceStore, filters: dict[str, Any], wanted: set[str], since: float | None,
           limit: int) -> tuple[list[LogEntry], list[Step]]:
    """The newest ``limit`` steps that match, oldest first, and the entries read for them
    (more entries are read while too few of their steps match)."""
    tables = store.tables(JobLogTables)
    states = _stored_states(wanted)
    read = max(limit, 1)
    while True:
        entries = tables.entries(since=since, limit=read, states=states, **filters)
        found = [s for s in steps(store, entries) if _matches(s, wanted)]
        if len(found) >= limit or len(entries) < read or read >= _MAX_READ:
            return entries, found[-limit:] if limit else []
        read *= 4


def jobs(settings: Settings, *, states: Sequence[str] = (), queues: Sequence[str] = (),
         workflows: Sequence[str] = (), record: str | None = None, message: str | None = None,
         since: float | None = None, until: float | None = None, limit: int = 50,
         follow: bool = False, poll: float = 1.0, out: Out | None = None,
         write: Callable[[str], None] | None = None,
         stop: Callable[[], bool] | None = None) -> int:
    """Print the newest ``limit`` job-log steps that match, oldest first; ``follow``: then
    new ones as they come.  ``states`` are steps (:data:`STATES`): only those are shown.
    ``out`` picks the form (JSON: :func:`step_record` per step; ``--follow`` takes JSON
    Lines); ``write`` takes each text line (default: ``out``'s).  Returns how many steps
    were printed."""
    out = out or Out()
    wanted = set(check_states(states))
    if limit < 0:
        raise ConfigError(f"--limit {limit}: give 0 or more")
    if follow and out.form == "json":
        raise ConfigError("--follow prints a stream: give --json-lines (one object a line), "
                          "not --json (one document)")
    text = write or out.text
    store = ServiceStore.connect(settings.blackboard_url)
    filters: dict[str, Any] = dict(queues=queues, workflows=workflows, record=record,
                                   message_id=message, until=until)
    rows = _Rows(text)
    try:
        entries, shown = _steps(store, filters, wanted, since, limit)
        if out.json:
            out.listing([step_record(s) for s in shown])
        elif shown or follow:
            rows.print(f"job log: {len(shown)} step(s), oldest first"
                       + ("; new ones follow" if follow else ""), [_cells(s) for s in shown])
        else:
            text("no job-log entries match")
        if not follow:
            return len(shown)
        printed = len(shown)
        # Rows of transactions still open may commit with a lower id than rows seen:
        # look back a while by time and skip what is known (printed, or older than the
        # follow).
        tables = store.tables(JobLogTables)
        newest = time.time()
        stored = _stored_states(wanted)
        seen = {e.id: e.at for e in entries}
        seen.update((e.id, e.at) for e in tables.entries(
            since=newest - 30, limit=10_000, states=stored, **filters))
        while stop is None or not stop():
            time.sleep(poll)
            fresh = [e for e in tables.entries(since=newest - 30, limit=10_000, states=stored,
                                               **filters) if e.id not in seen]
            new = [s for s in steps(store, fresh) if _matches(s, wanted)]
            if out.json:
                for s in new:
                    out.row(step_record(s))
            else:
                rows.more([_cells(s) for s in new])
            for e in fresh:
                seen[e.id] = e.at
                newest = max(newest, e.at)
            seen = {i: at for i, at in seen.items() if at >= newest - 60}
            printed += len(new)
        return printed
    finally:
        store.close()


# -- chalk schedules ----------------------------------------------------------------------
def schedule_rows(settings: Settings, now: float | None = None) -> list[dict[str, Any]]:
    """Each ``[[schedule]]`` with its last and next run, as ``schedules --json`` prints it."""
    store = ServiceStore.connect(settings.blackboard_url)
    try:
        rows = []
        for s in schedule_status(settings, store, now):
            state, rule = s.state, s.rule
            last = None
            if state is not None and state.started_at is not None:
                last = {"tick": tick_label(state.tick), "done": state.done,
                        "messages": state.messages, "records": state.records,
                        "member": state.member, "started_at": iso(state.started_at),
                        "finished_at": iso(state.finished_at)}
            rows.append({
                "schedule": rule.name, "when": s.when, "publishes": s.publishes,
                "queue": rule.queue, "workflow": rule.workflow, "last": last,
                "skipped": state.skipped if state is not None else 0,
                "next": s.next_label, "due": s.due, "running": s.running,
                "catch_up": rule.catch_up})
        return rows
    finally:
        store.close()


def _last(row: dict[str, Any]) -> str:
    last = row["last"]
    if last is None:
        text = "never"
    elif last["done"]:
        text = (f"{last['tick']}: {last['messages']} message(s), {last['records']} record(s), "
                f"by {last['member']}")
    else:
        text = f"{last['tick']}: running, {last['messages']} message(s) so far ({last['member']})"
    if row["skipped"]:
        text += f"; {row['skipped']} missed tick(s) skipped in all"
    return text


def schedules(settings: Settings, out: Out | None = None) -> None:
    out = out or Out()
    if not settings.section("schedule"):
        if not out.listing([]):
            out.text("no [[schedule]] entries in the configuration")
        return
    rows = schedule_rows(settings)
    if out.listing(rows):
        return
    out.table("schedules", ["schedule", "when", "publishes", "to", "last run", "next run",
                            "catch up"],
              [[r["schedule"], r["when"], r["publishes"],
                r["queue"] + (f" → {r['workflow']}" if r["workflow"] else ""), _last(r),
                "running" if r["running"] else r["next"] + (" (due now)" if r["due"] else ""),
                r["catch_up"]] for r in rows])
