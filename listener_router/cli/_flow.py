"""``chalk queue pause|resume|list`` and ``chalk jobs cancel|uncancel``: flow control.

Both write to the store through ``listener_router._control`` (the dashboard
does the same); every member of the cluster reads it within about a second
and obeys, also after a restart.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from listener_router._control import cancel, parse_duration, queue_list, set_paused
from listener_router._errors import ConfigError
from listener_router._settings import LANE_KEYS, Settings
from listener_router.cli._common import cmd_with_settings, settings_for

__all__ = ["add_parsers", "cancel", "queue_list", "set_paused"]


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
        until = time.time() + parse_duration(args.for_, "--for") if args.for_ else None
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
