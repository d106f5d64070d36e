"""Operator commands over the job log: jobs, schedules, and the statistics of status."""

from __future__ import annotations

import datetime as dt
import re
import time
from collections.abc import Callable, Sequence

from rich.console import Console
from rich.table import Table

from listener_router._errors import ConfigError
from listener_router._settings import Settings
from listener_router.jobs import JobLogTables, Step, statistics, steps
from listener_router.schedules import Schedules, Selection, Ticks, tick_label
from listener_router.store import ServiceStore

__all__ = ["jobs", "schedules", "print_statistics",
           "parse_time", "STAGES"]

console = Console()

STAGES = ("latency", "stage:run", "stage:commit", "stage:publish", "stage:batch")
_RELATIVE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)\s*$")
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


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
def _line(step: Step) -> str:
    e = step.entry
    parts = [_when(step.at), f"{step.what:<10}", e.message_id, e.queue,
             f"attempt {e.attempt}" + (f" (replay {e.round})" if e.round else ""),
             e.workflow or "-", e.member or "-"]
    if step.what != "received":
        if e.records > 1:
            parts.append(f"{e.records} records from {e.record}")
        elif e.record:
            parts.append(f"record {e.record}")
        if e.outgoing:
            parts.append(f"{e.outgoing} outgoing")
        if step.seconds:
            shown = ", ".join(f"{k} {_seconds(v)}" for k, v in step.seconds.items()
                              if k in ("run", "commit", "publish", "batch"))
            parts.append(f"batch {e.batch[:8] if e.batch else '-'} ({shown})")
        if e.reason:
            parts.append(f"— {e.reason}")
        if e.resolved:
            parts.append(f"[{e.resolved} {_when(e.resolved_at)}]")
    return "  ".join(parts)


def jobs(settings: Settings, *, states: Sequence[str] = (), queues: Sequence[str] = (),
         workflows: Sequence[str] = (), record: str | None = None, message: str | None = None,
         since: float | None = None, until: float | None = None, limit: int = 50,
         follow: bool = False, poll: float = 1.0, out: Callable[[str], None] = print,
         stop: Callable[[], bool] | None = None) -> int:
    """Print matching job-log steps, oldest first; ``follow``: then new ones as they come.
    Returns how many entries were printed."""
    store = ServiceStore.connect(settings.blackboard_url)
    filters = dict(states=states, queues=queues, workflows=workflows, record=record,
                   message_id=message, until=until)
    try:
        entries = store.tables(JobLogTables).entries(since=since, limit=limit, **filters)  # type: ignore[arg-type]
        if not entries and not follow:
            out("no job-log entries match")
        for step in steps(store, entries):
            out(_line(step))
        shown = len(entries)
        if not follow:
            return shown
        # Rows of transactions still open may commit with a lower id than rows seen:
        # look back a while by time and skip what is known (printed, or older than the
        # follow).
        newest = time.time()
        seen = {e.id: e.at for e in entries}
        seen.update((e.id, e.at) for e in store.tables(JobLogTables).entries(
            since=newest - 30, limit=10_000, **filters))  # type: ignore[arg-type]
        while stop is None or not stop():
            time.sleep(poll)
            fresh = [e for e in store.tables(JobLogTables).entries(since=newest - 30, limit=10_000, **filters)  # type: ignore[arg-type]
                     if e.id not in seen]
            for step in steps(store, fresh):
                out(_line(step))
            for e in fresh:
                seen[e.id] = e.at
                newest = max(newest, e.at)
            seen = {i: at for i, at in seen.items() if at >= newest - 60}
            shown += len(fresh)
        return shown
    finally:
        store.close()


# -- chalk schedules ----------------------------------------------------------------------
def schedules(settings: Settings) -> None:
    if not settings.section("schedule"):
        console.print("no [[schedule]] entries in the configuration")
        return
    store = ServiceStore.connect(settings.blackboard_url)
    try:
        states = store.tables(Schedules).all()
        table = Table(title="schedules")
        for column in ("schedule", "when", "publishes", "to", "last run", "next run", "catch up"):
            table.add_column(column, overflow="fold")
        now = time.time()
        for rule in settings.section("schedule"):
            ticks = Ticks(rule)
            state = states.get(rule.name)
            if state is None or state.started_at is None:
                last = "never"
            elif state.done:
                last = (f"{tick_label(state.tick)}: {state.messages} message(s), "
                        f"{state.records} record(s), by {state.member}")
            else:
                last = (f"{tick_label(state.tick)}: running, {state.messages} message(s) "
                        f"so far ({state.member})")
            if state is not None and state.skipped:
                last += f"; {state.skipped} missed tick(s) skipped in all"
            if state is not None and not state.done:
                following = "running"
            else:
                due = ticks.after(now if state is None else state.tick)
                following = tick_label(due) + (" (due now)" if due <= now else "")
            table.add_row(rule.name, ticks.describe(),
                          f"{Selection(rule, store.sql).describe()}, {rule.batch_size} per message",
                          rule.queue + (f" → {rule.workflow}" if rule.workflow else ""),
                          last, following, rule.catch_up)
        console.print(table)
    finally:
        store.close()


# -- chalk status: statistics and topology ------------------------------------------------
def print_statistics(store: ServiceStore, since: float, *, now: float | None = None) -> None:
    now = time.time() if now is None else now
    found = statistics(store, since)
    if not found:
        console.print(f"statistics: nothing since {_when(since)}")
        return
    table = Table(title=f"statistics since {_when(since)} (all members)")
    for column in ("queue", "workflow", "committed", "retried", "dead", "dup", "records", "msg/s",
                   *(f"{m.split(':')[-1]} p50/p99" for m in STAGES)):
        table.add_column(column, justify="right" if column not in ("queue", "workflow") else "left")
    for (queue, workflow), s in sorted(found.items()):
        committed = s.counts.get("committed", 0) + s.counts.get("processed", 0)
        dead = s.counts.get("dead", 0) + s.counts.get("failed", 0)
        table.add_row(queue, workflow or "-", str(committed), str(s.counts.get("retrying", 0)),
                      str(dead), str(s.counts.get("duplicate", 0)),
                      str(s.counts.get("records", 0)),
                      f"{(committed / max(now - (s.first or now), 1.0)):.1f}",
                      *(f"{_seconds(s.percentile(m, 0.5))} / {_seconds(s.percentile(m, 0.99))}"
                        for m in STAGES))
    console.print(table)
