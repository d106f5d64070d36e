"""``chalk queue pause|resume|list`` and ``chalk jobs cancel|uncancel``: flow control.

Both write to the store (``store/_flow.py``); every member of the cluster
reads it within about a second and obeys, also after a restart.
"""

from __future__ import annotations

import argparse
import getpass
import json
import socket
import time
from collections.abc import Sequence
from typing import Any

from listener_router._errors import ConfigError
from listener_router._settings import LANE_KEYS, Settings
from listener_router.cli._common import cmd_with_settings, settings_for
from listener_router.store import ServiceStore

__all__ = ["add_parsers", "cancel", "queue_list", "set_paused"]

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def _who() -> str:
    return f"{getpass.getuser()}@{socket.gethostname()}"


def _queues(settings: Settings) -> list[str]:
    return list(dict.fromkeys(rule.queue for rule in settings.listeners))


def set_paused(settings: Settings, queue: str, paused: bool, *, reason: str | None = None,
               by: str | None = None) -> None:
    """Pause or resume ``queue``'s lane on every member (persisted)."""
    known = _queues(settings)
    if queue not in known:
        raise ConfigError(f"{queue!r} is not a queue of the listener rules (known: "
                          f"{', '.join(known) or 'none'})")
    store = ServiceStore.connect(settings.blackboard_url)
    try:
        store.lanes.put(queue, paused, by=by or _who(), reason=reason)
    finally:
        store.close()


def queue_list(settings: Settings) -> list[dict[str, Any]]:
    """Each lane: its queue, its flow settings, paused or not (by whom, when, why)."""
    store = ServiceStore.connect(settings.blackboard_url)
    try:
        states = store.lanes.all()
    finally:
        store.close()
    out = []
    for queue in _queues(settings):
        rule = next(r for r in settings.listeners if r.queue == queue)
        state = states.get(queue)
        row: dict[str, Any] = {"queue": queue, "paused": bool(state and state.paused)}
        row.update({key: getattr(rule, key) for key in LANE_KEYS})
        if state is not None:
            row.update({"changed_at": state.changed_at, "changed_by": state.changed_by,
                        "reason": state.reason})
        out.append(row)
    return out


def _duration(text: str) -> float:
    try:
        return float(text[:-1]) * _UNITS[text[-1]] if text[-1] in _UNITS else float(text)
    except (ValueError, IndexError, KeyError):
        raise ConfigError(f"--for {text!r}: give seconds or a number and s, m, h or d "
                          "(e.g. 2h)") from None


def cancel(settings: Settings, *, messages: Sequence[str] = (), records: Sequence[str] = (),
           schedule: str | None = None, tick: str | None = None, until: float | None = None,
           undo: bool = False) -> int:
    """Cancel (or, ``undo``, withdraw the cancellation of) messages by ID, the messages
    naming records (until ``until``), or a schedule's tick; returns how many entries."""
    if (schedule is None) != (tick is None):
        raise ConfigError("give --schedule and --tick together (the tick as chalk schedules or "
                          "chalk jobs shows it, e.g. 2026-11-27T17:00:00Z)")
    if not (messages or records or schedule):
        raise ConfigError("say what to cancel: message IDs, --record ID or --schedule NAME "
                          "--tick TICK")
    prefix = f"schedule:{schedule}:{tick}:" if schedule is not None else None
    store = ServiceStore.connect(settings.blackboard_url)
    try:
        table = store.cancellations
        if undo:
            return (table.withdraw("message", list(messages))
                    + table.withdraw("record", list(records))
                    + (table.withdraw("prefix", [prefix]) if prefix else 0))
        by = _who()
        return (table.add("message", messages, by=by)
                + table.add("record", records, by=by, until=until)
                + (table.add("prefix", [prefix], by=by) if prefix else 0))
    finally:
        store.close()


# -- the commands ------------------------------------------------------------------------
def cmd_queue(settings: Settings, args: argparse.Namespace) -> int:
    if args.action in ("pause", "resume"):
        if not args.queue:
            raise ConfigError(f"chalk queue {args.action} QUEUE: name the queue")
        set_paused(settings, args.queue, args.action == "pause", reason=args.reason)
        print(f"{args.queue}: {'paused' if args.action == 'pause' else 'resumed'} (every "
              "member obeys within a second)")
        return 0
    rows = queue_list(settings)
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    for row in rows:
        state = "paused" if row["paused"] else "running"
        extra = [f"{k}={row[k]}" for k in LANE_KEYS if row[k] not in (None, 0)]
        if row["paused"]:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row["changed_at"]))
            extra.append(f"since {when} by {row['changed_by']}"
                         + (f": {row['reason']}" if row.get("reason") else ""))
        print(f"{row['queue']}\t{state}" + ("\t" + ", ".join(extra) if extra else ""))
    return 0


def _jobs_or_cancel(original: Any) -> Any:
    """``chalk jobs`` lists the job log; ``chalk jobs cancel|uncancel`` cancels."""
    def run(args: argparse.Namespace) -> int:
        if args.action is None:
            if args.ids:
                raise ConfigError(f"chalk jobs: unexpected {args.ids[0]!r} (did you mean "
                                  "chalk jobs cancel …?)")
            return int(original(args) or 0)
        settings = settings_for(args)
        until = time.time() + _duration(args.for_) if args.for_ else None
        undo = args.action == "uncancel"
        n = cancel(settings, messages=args.ids, records=[args.record] if args.record else [],
                   schedule=args.schedule, tick=args.tick, until=until, undo=undo)
        what = "withdrew" if undo else "cancelled"
        print(f"{what} {n} cancellation(s); every member obeys within a second")
        return 0
    return run


def add_parsers(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """``chalk queue``, and ``cancel``/``uncancel`` on ``chalk jobs`` (made before)."""
    p = sub.add_parser("queue", parents=[common],
                       help="pause or resume a queue's lane on every member; list the lanes")
    p.add_argument("action", choices=["list", "pause", "resume"])
    p.add_argument("queue", nargs="?", help="for pause/resume: the input queue")
    p.add_argument("--reason", help="for pause: why (shown by chalk queue list and the page)")
    p.add_argument("--json", action="store_true", help="for list: one JSON object per lane")
    p.set_defaults(func=cmd_with_settings(cmd_queue))

    jobs = sub.choices["jobs"]
    jobs.add_argument("action", nargs="?", choices=["cancel", "uncancel"],
                      help="cancel: messages not yet run are acked without running, one in "
                           "flight is invalidated before its commit (persisted: a restart or "
                           "a redelivery does not bring them back); uncancel withdraws")
    jobs.add_argument("ids", nargs="*", metavar="MESSAGE_ID", help="with cancel: message IDs")
    jobs.add_argument("--schedule", metavar="NAME", help="with cancel: a scheduled job's …")
    jobs.add_argument("--tick", metavar="TICK", help="… tick (as chalk schedules shows it)")
    jobs.add_argument("--for", dest="for_", metavar="DURATION",
                      help="with cancel --record: how long it holds (2h, 1d; default: until "
                           "withdrawn)")
    jobs.set_defaults(func=_jobs_or_cancel(jobs.get_default("func")))
