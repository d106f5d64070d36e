"""``chalk queue pause|resume|list`` and ``chalk jobs cancel|uncancel|cancellations``: flow
control.

Both write to the store through ``listener_router._control`` (the dashboard
does the same); every member of the cluster reads it within about a second
and obeys, also after a restart.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import Any

from listener_router._control import (
    cancel,
    parse_duration,
    queue_list,
    set_paused,
    withdraw_all,
)
from listener_router._errors import ConfigError
from listener_router._settings import LANE_KEYS, Settings
from listener_router.cli._common import cmd_with_settings, settings_for
from listener_router.cli._show import Out, add_json_options, iso
from listener_router.store import Cancellation, ServiceStore

__all__ = ["add_parsers", "cancel", "cancellation_records", "describe", "lane_records",
           "queue_list", "set_paused"]


# -- chalk queue ---------------------------------------------------------------------------
def lane_records(settings: Settings) -> list[dict[str, Any]]:
    """Each lane as ``chalk queue list --json`` prints it (times ISO 8601)."""
    rows = queue_list(settings)
    for row in rows:
        if "changed_at" in row:
            row["changed_at"] = iso(row["changed_at"])
    return rows


def cmd_queue(settings: Settings, args: argparse.Namespace) -> int:
    if args.action in ("pause", "resume"):
        if not args.queue:
            raise ConfigError(f"chalk queue {args.action} QUEUE: name the queue")
        set_paused(settings, args.queue, args.action == "pause", reason=args.reason)
        print(f"{args.queue}: {'paused' if args.action == 'pause' else 'resumed'} (every "
              "member obeys within a second)")
        return 0
    rows = lane_records(settings)
    out = Out.of(args)
    if out.listing(rows):
        return 0
    out.table("lanes (listener queues)",
              ["queue", "state", *(k.replace("_", " ") for k in LANE_KEYS), "since", "by",
               "reason"],
              [[row["queue"], "paused" if row["paused"] else "running",
                *("" if row[k] in (None, 0) else row[k] for k in LANE_KEYS),
                (row.get("changed_at") or "")[:19].replace("T", " ") if row["paused"] else "",
                (row.get("changed_by") or "") if row["paused"] else "",
                (row.get("reason") or "") if row["paused"] else ""] for row in rows])
    return 0


# -- chalk jobs cancel | uncancel | cancellations -----------------------------------------------
def _unknown(settings: Settings, store: ServiceStore, message_ids: Sequence[str]) -> list[str]:
    """The message IDs Chalk knows nothing of: not pushed by ``chalk push`` lately, no step
    in the job log, no dead letter."""
    from listener_router.dead_letters import DeadLetters
    from listener_router.jobs import JobLogTables

    known = set(store.pushed.known(message_ids))
    log = store.tables(JobLogTables)
    letters = store.tables(DeadLetters)
    queues = list(dict.fromkeys(r.queue for r in settings.listeners))
    return [m for m in message_ids if m not in known
            and not log.entries(message_id=m, limit=1)
            and not letters.list(queues, message_id=m)]


def cancellation_records(settings: Settings) -> list[dict[str, Any]]:
    """The cancellations in force, oldest first, as ``chalk jobs cancellations --json``
    prints them."""
    store = ServiceStore.connect(settings.blackboard_url)
    try:
        found = store.cancellations.active()
    finally:
        store.close()
    return [{"kind": c.kind, "value": c.value, "what": describe(c), "at": iso(c.at),
             "until": iso(c.until), "by": c.by, "ends": _ends(c)} for c in found]


def describe(c: Cancellation) -> str:
    """What a cancellation cancels, in words."""
    return {"message": f"message {c.value}", "prefix": f"messages {c.value}*",
            "record": f"every message naming record {c.value}",
            "queued": f"the messages naming record {c.value} queued by then"}.get(
        c.kind, f"{c.kind} {c.value}")


def _ends(c: Cancellation) -> str:
    if c.kind == "queued":
        return "with the messages queued then"
    if c.until is not None:
        return (iso(c.until, "seconds") or "").replace("T", " ")
    return "when withdrawn"


def _cancellations(settings: Settings, args: argparse.Namespace) -> int:
    rows = cancellation_records(settings)
    out = Out.of(args)
    if out.listing(rows, empty="no cancellations in force"):
        return 0
    out.table(f"cancellations in force, oldest first: {len(rows)}",
              ["cancelled", "since", "ends", "by"],
              [[r["what"], (r["at"] or "")[:19].replace("T", " "), r["ends"], r["by"] or ""]
               for r in rows])
    return 0


def _cancel(settings: Settings, args: argparse.Namespace) -> int:
    if args.all:
        raise ConfigError("--all goes with uncancel (withdraw every cancellation); cancel "
                          "names what it cancels")
    if args.for_ and not args.record:
        raise ConfigError("--for goes with --record (how long the record's cancellation lasts)")
    if args.lasting and not args.record:
        raise ConfigError("--lasting goes with --record (message IDs and ticks are cancelled "
                          "for good anyway)")
    if args.ids and not args.ahead:
        store = ServiceStore.connect(settings.blackboard_url)
        try:
            unknown = _unknown(settings, store, args.ids)
        finally:
            store.close()
        if unknown:
            raise ConfigError(
                f"no message {', '.join(unknown)} is known: not pushed by chalk push lately, "
                "not in the job log, not a dead letter.  Check the ID (chalk push --ids prints "
                "them; chalk jobs shows those that ran); one published by another program "
                "(queued or running), or not published yet, is cancelled with --ahead")
    until = time.time() + parse_duration(args.for_, "--for") if args.for_ else None
    n = cancel(settings, messages=args.ids, records=[args.record] if args.record else [],
               schedule=args.schedule, tick=args.tick, until=until, lasting=args.lasting)
    what = [*(f"message {m}" for m in args.ids)]
    if args.record:
        what.append(f"every message naming record {args.record}"
                    + (f" for {args.for_}" if args.for_ else " until withdrawn")
                    if args.lasting or args.for_ else
                    f"the messages naming record {args.record} queued now (--lasting: "
                    "also later ones)")
    if args.schedule:
        what.append(f"the messages of schedule {args.schedule}'s tick {args.tick}")
    print(f"cancelled {'; '.join(what)} ({n} new cancellation(s)); every member obeys "
          "within a second")
    return 0


def _uncancel(settings: Settings, args: argparse.Namespace) -> int:
    if args.all:
        if args.ids or args.record or args.schedule:
            raise ConfigError("uncancel --all withdraws every cancellation: name nothing with it")
        n = withdraw_all(settings)
        print(f"withdrew {n} cancellation(s): none is in force now")
        return 0
    n = cancel(settings, messages=args.ids, records=[args.record] if args.record else [],
               schedule=args.schedule, tick=args.tick, undo=True)
    if n == 0:
        print("no such cancellation is in force (chalk jobs cancellations lists them)",
              file=sys.stderr)
        return 1
    print(f"withdrew {n} cancellation(s); every member obeys within a second")
    return 0


def _jobs_or_cancel(original: Any) -> Any:
    """``chalk jobs`` lists the job log; ``chalk jobs cancel|uncancel|cancellations``."""
    def run(args: argparse.Namespace) -> int:
        if args.action is None:
            if args.ids:
                raise ConfigError(f"chalk jobs: unexpected {args.ids[0]!r} (did you mean "
                                  "chalk jobs cancel …?)")
            return int(original(args) or 0)
        settings = settings_for(args)
        if args.action == "cancellations":
            return _cancellations(settings, args)
        return (_cancel if args.action == "cancel" else _uncancel)(settings, args)
    return run


def add_parsers(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """``chalk queue``, and ``cancel``/``uncancel``/``cancellations`` on ``chalk jobs`` (made
    before)."""
    p = sub.add_parser("queue", parents=[common],
                       help="pause or resume a queue's lane on every member; list the lanes")
    p.add_argument("action", choices=["list", "pause", "resume"])
    p.add_argument("queue", nargs="?", help="for pause/resume: the input queue")
    p.add_argument("--reason", help="for pause: why (shown by chalk queue list and the page)")
    add_json_options(p, "for list: the lanes as one array")
    p.set_defaults(func=cmd_with_settings(cmd_queue))

    jobs = sub.choices["jobs"]
    jobs.add_argument("action", nargs="?", choices=["cancel", "uncancel", "cancellations"],
                      help="cancel: messages not yet run are acked without running, one in "
                           "flight is invalidated before its commit (persisted: a restart or "
                           "a redelivery does not bring them back); uncancel withdraws; "
                           "cancellations lists those in force")
    jobs.add_argument("ids", nargs="*", metavar="MESSAGE_ID", help="with cancel: message IDs")
    jobs.add_argument("--schedule", metavar="NAME", help="with cancel: a scheduled job's …")
    jobs.add_argument("--tick", metavar="TICK", help="… tick (as chalk schedules shows it)")
    jobs.add_argument("--lasting", action="store_true",
                      help="with cancel --record: also the messages naming it published later, "
                           "until withdrawn (default: only those queued now)")
    jobs.add_argument("--for", dest="for_", metavar="DURATION",
                      help="with cancel --record: lasting, for this long (2h, 1d)")
    jobs.add_argument("--ahead", action="store_true",
                      help="with cancel: message IDs Chalk does not know (not published yet, "
                           "or by another program)")
    jobs.add_argument("--all", action="store_true",
                      help="with uncancel: withdraw every cancellation in force")
    jobs.set_defaults(func=_jobs_or_cancel(jobs.get_default("func")))
