"""``chalk reprocess``: send stored records through a workflow again, resumably."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from typing import TYPE_CHECKING, Any

from listener_router._errors import ConfigError
from listener_router._settings import Settings
from listener_router.cli._common import cmd_with_settings
from listener_router.cli._show import Out, add_json_options, iso

if TYPE_CHECKING:
    from listener_router.reprocess import Begun, Run
    from listener_router.store import ServiceStore

__all__ = ["add_parsers", "cmd_reprocess"]


def _interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def cmd_reprocess(settings: Settings, args: argparse.Namespace) -> int:
    from listener_router.broker import ensure_local_broker
    from listener_router.reprocess import RunSelection, begin
    from listener_router.store import ServiceStore

    store = ServiceStore.connect(settings.blackboard_url)
    try:
        if args.list:
            return _list(store, args)
        asked = any(getattr(args, k) for k in ("prefix", "source", "xpath", "ids_from", "queue"))
        if args.resume and (asked or args.workflow or args.new):
            raise ConfigError("--resume continues a run with its own workflow, queue and "
                              "selection; give only --rate with it")
        selection, ids, repeats = RunSelection.asked(
            prefix=args.prefix, source=args.source, xpath=args.xpath, ids_from=args.ids_from)
        ensure_local_broker(settings.broker_url)
        begun = begin(settings, store, workflow=args.workflow, queue=args.queue,
                      selection=selection, ids=ids, repeats=repeats, rate=args.rate,
                      resume=args.resume, new=args.new)
        run = begun.run
        selected = RunSelection.parse(run.selection)
        if begun.resumed:
            print(f"run {run.id}: resuming ({selected.describe()}; {run.looked:,} of "
                  f"{run.total:,} looked at, {run.published:,} published; --new starts over)",
                  file=sys.stderr)
        else:
            print(f"run {run.id}: {selected.describe()} → {run.queue} (workflow "
                  f"{run.workflow})", file=sys.stderr)
        if begun.repeats:
            print(f"{selected.ids_from}: {begun.repeats} repeated ID(s) left out",
                  file=sys.stderr)
        return _run(settings, store, begun)
    finally:
        store.close()


def _run(settings: Settings, store: ServiceStore, begun: Begun) -> int:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from listener_router.reprocess import Reprocess

    run = begun.run
    started = time.monotonic()
    signal.signal(signal.SIGTERM, _interrupt)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("looked at, {task.fields[published]:,} published"),
                  TimeElapsedColumn(), console=Console(stderr=True),
                  disable=not sys.stderr.isatty()) as progress:
        task = progress.add_task(f"reprocess {run.id} → {run.queue}", total=run.total,
                                 completed=run.looked, published=run.published)

        def show(now: Run) -> None:
            progress.update(task, completed=now.looked, published=now.published)

        worker = Reprocess(settings, store, run, ids=begun.ids, progress=show)
        try:
            done = worker.run()
        except KeyboardInterrupt:
            progress.stop()
            now = worker.run_row
            print(f"run {run.id} stopped: {now.published:,} record(s) published, "
                  f"{now.looked:,} of {now.total:,} looked at; chalk reprocess --resume "
                  f"{run.id} goes on from there", file=sys.stderr)
            return 130
        progress.update(task, completed=max(done.looked, run.total))
    print(f"run {done.id} finished: {done.published:,} record(s) published to {done.queue} "
          f"for workflow {done.workflow} in {time.monotonic() - started:.1f} s"
          + (f"; {done.missing:,} listed ID(s) not stored, left out" if done.missing else ""))
    print(f"the service runs them: chalk jobs --queue {done.queue}; chalk reprocess --list")
    return 0


def run_records(store: ServiceStore, limit: int) -> list[dict[str, Any]]:
    """The newest runs as ``chalk reprocess --list --json`` prints them (times ISO 8601)."""
    from listener_router.reprocess import run_views

    return [{**v.json(), **{k: iso(getattr(v, k)) for k in
                            ("started_at", "updated_at", "finished_at")}}
            for v in run_views(store, limit)]


def _progress(r: dict[str, Any]) -> str:
    """Records looked at of those to look at; a finished run looked at all there were."""
    if r["state"] == "finished":
        return f"{r['looked']:,} (all)"
    bound = "" if r["selection"].endswith("listed record(s)") else "≤ "  # else: every record
    return f"{r['looked']:,} of {bound}{r['total']:,} ({r['done']:.0%})"


def _list(store: ServiceStore, args: argparse.Namespace) -> int:
    rows = run_records(store, args.limit)
    out = Out.of(args)
    if out.listing(rows, empty="no reprocess runs"):
        return 0
    out.table("reprocess runs, newest first",
              ["run", "state", "workflow → queue", "selection", "looked at", "published",
               "committed", "updated", "note"],
              [[r["run"], r["state"], f"{r['workflow']} → {r['queue']}", r["selection"],
                _progress(r), f"{r['published']:,}", f"{r['committed']:,}",
                (r["updated_at"] or "-")[:19].replace("T", " "),
                r["note"] or (f"{r['missing']:,} listed ID(s) not stored" if r["missing"]
                              else "")] for r in rows],
              right=("published", "committed"))
    return 0


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """The ``reprocess`` subcommand."""
    p = sub.add_parser("reprocess", parents=[common],
                       help="send stored records through a workflow again (resumable)")
    p.add_argument("--workflow", metavar="NAME",
                   help="the workflow to run them through (a listener rule must run it)")
    p.add_argument("--queue", metavar="QUEUE",
                   help="publish here (default: the queue of the first listener rule that "
                        "runs the workflow)")
    p.add_argument("--prefix", metavar="TEXT", help="stored records whose ID starts with this")
    p.add_argument("--source", metavar="NAME", help="stored records of this source")
    p.add_argument("--xpath", metavar="EXPR",
                   help="stored records for which this XPath holds "
                        "('$record/Val[@key=\"lang\"] = \"de\"')")
    p.add_argument("--ids-from", metavar="FILE",
                   help="the records listed in FILE: one ID a line, or JSON Lines records "
                        "(as chalk push reads)")
    p.add_argument("--rate", type=float, metavar="N",
                   help="publish at most N records (messages) a second (default: no limit)")
    p.add_argument("--resume", metavar="RUN",
                   help="go on with this run from its cursor (the same command without it "
                        "goes on with the unfinished run of the same selection)")
    p.add_argument("--new", action="store_true",
                   help="start a new run even when one of the same selection is unfinished")
    p.add_argument("--list", action="store_true",
                   help="show the runs with their progress and what the service committed")
    add_json_options(p, "with --list: the runs as one array")
    p.add_argument("--limit", type=int, default=20, metavar="N",
                   help="with --list: the N newest runs (default 20)")
    p.set_defaults(func=cmd_with_settings(cmd_reprocess))
