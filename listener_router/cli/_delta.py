"""``chalk delta``: crawls of a source — start, finish (the unseen records deleted), abandon,
status."""

from __future__ import annotations

import argparse
import getpass
import socket
import sys
import time
from typing import Any

from listener_router._errors import ConfigError
from listener_router._settings import Settings
from listener_router.cli._common import cmd_with_settings
from listener_router.cli._show import Out, add_json_options, iso

__all__ = ["add_parsers", "cmd_delta"]


def cmd_delta(settings: Settings, args: argparse.Namespace) -> int:
    from listener_router import delta
    from listener_router.store import ServiceStore

    store = ServiceStore.connect(settings.blackboard_url)
    try:
        if args.action == "status":
            return _status(store, args)
        if not args.source:
            raise ConfigError(f"give the SOURCE: chalk delta {args.action} SOURCE")
        if args.action == "abandon":
            crawl = delta.abandon(store, args.source,
                                  by=f"{getpass.getuser()}@{socket.gethostname()}")
            print(f"crawl {crawl.id} of source {crawl.source} abandoned: nothing more is "
                  "deleted for it" + (f" ({crawl.deletions:,} DELETE message(s) already "
                                      "published still go)" if crawl.deletions else ""))
            return 0
        if args.action == "start":
            crawl, abandoned = delta.start(settings, store, args.source, queue=args.queue,
                                           restart=args.restart,
                                           by=f"{getpass.getuser()}@{socket.gethostname()}")
            if abandoned is not None:
                print(f"crawl {abandoned.id} of {abandoned.source} abandoned ({abandoned.state}; "
                      "nothing is deleted for it)", file=sys.stderr)
            print(f"crawl {crawl.id} of source {crawl.source} started: push its records "
                  f"(chalk push FILE --queue {crawl.queue} --source {crawl.source}), then "
                  f"chalk delta finish {crawl.source}")
            return 0
        return _finish(settings, store, args)
    finally:
        store.close()


def _finish(settings: Settings, store: Any, args: argparse.Namespace) -> int:
    from listener_router import delta
    from listener_router.broker import ensure_local_broker

    ensure_local_broker(settings.broker_url)
    started = time.monotonic()

    def show(crawl: Any) -> None:
        if sys.stderr.isatty():
            print(f"\rcrawl {crawl.id}: {crawl.looked:,} record(s) of {crawl.source} looked at, "
                  f"{crawl.deletions:,} to delete", end="", file=sys.stderr, flush=True)

    done = delta.finish(settings, store, args.source, progress=show)
    if sys.stderr.isatty():
        print(file=sys.stderr)
    print(f"crawl {done.id} of source {done.source} finished in "
          f"{time.monotonic() - started:.1f} s: {done.seen or 0:,} record(s) seen in the "
          f"crawl, {done.looked:,} stored record(s) of the source looked at, "
          f"{done.deletions:,} DELETE message(s) published to {done.queue}")
    if done.deletions:
        print(f"the service deletes those records (one seen meanwhile stays): chalk delta "
              f"status {done.source}; chalk jobs --state deleted --queue {done.queue}")
    else:
        print(f"nothing to delete: the crawl saw every stored record of {done.source}")
    return 0


def _status(store: Any, args: argparse.Namespace) -> int:
    from listener_router import delta

    rows = delta.crawl_status(store, limit=args.limit, source=args.source)
    out = Out.of(args)
    if out.listing([{**row, **{k: iso(row[k]) for k in
                               ("started_at", "finishing_at", "finished_at")}}
                    for row in rows],
                   empty="no crawls" + (f" of source {args.source}" if args.source else "")):
        return 0
    columns = ["crawl", "source", "queue", "state", "started", "finished", "seen", "looked at",
               "deletions", "deleted", "kept", "pending", "note"]
    out.table("crawls, newest first", columns, [
        [r["crawl"], r["source"], r["queue"], r["state"], iso(r["started_at"], "seconds"),
         iso(r["finished_at"], "seconds") or "-", r["seen"], r["looked"], r["deletions"],
         r["deleted"], r["kept"], r["pending"],
         r["note"] or ("finish stopped halfway? run chalk delta finish again"
                       if r["state"] == "finishing" else "")]
        for r in rows], right=("crawl", "seen", "looked at", "deletions", "deleted", "kept",
                               "pending"))
    return 0


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """The ``delta`` subcommand."""
    p = sub.add_parser("delta", parents=[common],
                       help="crawls of a source: start, finish (records not pushed in it are "
                            "deleted), abandon, status")
    p.add_argument("action", choices=["start", "finish", "abandon", "status"])
    p.add_argument("source", nargs="?", metavar="SOURCE",
                   help="the source (records stored with chalk push --source SOURCE); for "
                        "status: only its crawls")
    p.add_argument("--queue", metavar="QUEUE",
                   help="for start: where the crawl's DELETE messages go (default: the queue "
                        "of the first listener rule with delta = \"hash\")")
    p.add_argument("--restart", action="store_true",
                   help="for start: abandon the source's running crawl (nothing is deleted for "
                        "it) and start a new one")
    add_json_options(p, "for status: the crawls as one array")
    p.add_argument("--limit", type=int, default=20, metavar="N",
                   help="for status: the N newest crawls (default 20)")
    p.set_defaults(func=cmd_with_settings(cmd_delta))
