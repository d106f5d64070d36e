"""Operator commands over the job log: ``chalk jobs`` and ``chalk schedules``.

Each builds its rows as plain values (what ``--json`` prints, one object a
line) and prints them through :class:`~listener_router.cli._show.Out`.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

from listener_router._errors import ConfigError
from listener_router._settings import Settings
from listener_router.cli._show import Out, iso
from listener_router.jobs import JobLogTables, Step, steps
from listener_router.schedules import schedule_status, tick_label
from listener_router.store import ServiceStore

__all__ = ["jobs", "parse_time", "schedule_rows", "schedules", "step_record"]

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
def _print(line: str) -> None:
    print(line, flush=True)


def step_record(step: Step) -> dict[str, Any]:
    """One step as ``chalk jobs --json`` prints it (attempts numbered from 1)."""
    e = step.entry
    return {"at": iso(step.at), "step": step.what, "message_id": e.message_id, "queue": e.queue,
            "attempt": e.attempt, "replay": e.round, "workflow": e.workflow,
            "member": e.member, "record": e.record, "record_count": e.records,
            "outgoing": e.outgoing, "batch": e.batch,
            "seconds": {k: v for k, v in (step.seconds or {}).items() if k in _SHOWN_STAGES}
            if step.what != "received" else {},
            "reason": e.reason, "resolved": e.resolved, "resolved_at": iso(e.resolved_at)}


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
                              if k in _SHOWN_STAGES)
            parts.append(f"batch {e.batch[:8] if e.batch else '-'} ({shown})")
        if e.reason:
            parts.append(f"— {e.reason}")
        if e.resolved:
            parts.append(f"[{e.resolved} {_when(e.resolved_at)}]")
    return "  ".join(parts)


def jobs(settings: Settings, *, states: Sequence[str] = (), queues: Sequence[str] = (),
         workflows: Sequence[str] = (), record: str | None = None, message: str | None = None,
         since: float | None = None, until: float | None = None, limit: int = 50,
         follow: bool = False, poll: float = 1.0, out: Callable[[str], None] | None = None,
         stop: Callable[[], bool] | None = None, as_json: bool = False) -> int:
    """Print matching job-log steps, oldest first; ``follow``: then new ones as they come
    (``as_json``: one JSON object a step, :func:`step_record`).  ``out`` takes each line
    (default: stdout).  Returns how many entries were printed."""
    write = out or _print

    def show(found: list[Any]) -> None:
        for step in steps(store, found):
            write(json.dumps(step_record(step), ensure_ascii=False, default=str) if as_json
                  else _line(step))

    store = ServiceStore.connect(settings.blackboard_url)
    filters = dict(states=states, queues=queues, workflows=workflows, record=record,
                   message_id=message, until=until)
    try:
        entries = store.tables(JobLogTables).entries(since=since, limit=limit, **filters)  # type: ignore[arg-type]
        if not entries and not follow and not as_json:
            write("no job-log entries match")
        show(entries)
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
            show(fresh)
            for e in fresh:
                seen[e.id] = e.at
                newest = max(newest, e.at)
            seen = {i: at for i, at in seen.items() if at >= newest - 60}
            shown += len(fresh)
        return shown
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


def schedules(settings: Settings, as_json: bool = False) -> None:
    out = Out(as_json)
    if not settings.section("schedule"):
        out.text("no [[schedule]] entries in the configuration")
        return
    rows = schedule_rows(settings)
    if as_json:
        for row in rows:
            out.record(row)
        return
    out.table("schedules", ["schedule", "when", "publishes", "to", "last run", "next run",
                            "catch up"],
              [[r["schedule"], r["when"], r["publishes"],
                r["queue"] + (f" → {r['workflow']}" if r["workflow"] else ""), _last(r),
                "running" if r["running"] else r["next"] + (" (due now)" if r["due"] else ""),
                r["catch_up"]] for r in rows])
