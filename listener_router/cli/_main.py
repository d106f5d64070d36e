"""The ``chalk`` command: its parser and one function per subcommand."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from listener_router._errors import ConfigError
from listener_router._messages import OPERATIONS
from listener_router._runners import close_runner, make_runner
from listener_router.cli import _reprocess as reprocess
from listener_router.cli._common import settings_for
from listener_router.cli._help import describe

__all__ = ["main"]

log = logging.getLogger("chalk")


# -- chalk run ------------------------------------------------------------------------
def cmd_run(args: argparse.Namespace) -> int:
    from listener_router._rules import check_conditions
    from listener_router._service import Service
    from listener_router.broker import ensure_local_broker
    settings = settings_for(args)
    check_conditions(settings)   # every bad condition, with its file and line, before Spark
    ensure_local_broker(settings.broker_url)
    with Service(settings) as service:
        service.install_signal_handlers()
        stats = service.run(idle_exit=args.idle_exit)
    print(_summary_line(stats.counts))
    return 0


def _summary_line(counts: Any) -> str:
    keys = ("received", "committed", "duplicate", "retrying", "dead", "deferred",
            "records_committed", "batches")
    return ", ".join(f"{k}={counts.get(k, 0)}" for k in keys)


# -- chalk push -----------------------------------------------------------------------
def cmd_push(args: argparse.Namespace) -> int:
    from rich.progress import Progress

    from listener_router._records import push_records, read_records
    from listener_router.broker import ensure_local_broker
    settings = settings_for(args)
    if args.ids:
        records = [{"id": i, "attributes": {}} for i in args.ids]
    elif args.file:
        records = list(read_records(args.file))
    else:
        raise ConfigError("give a JSONL file of records or --id ID (one or more)")
    ensure_local_broker(settings.broker_url)
    seen = None
    if args.source:  # a crawl of the source sees them, in the transaction that stores them
        from listener_router.delta import seen_on_push
        seen = seen_on_push(settings.blackboard_url, args.source)
    with Progress(disable=not sys.stderr.isatty()) as progress:
        task = progress.add_task(f"push → {args.queue}", total=len(records))
        sent = push_records(settings, args.queue, records, store=not args.ids_only and not args.ids,
                            operation=args.operation, per_message=args.per_message,
                            progress=lambda n: progress.advance(task, n), source=args.source,
                            hook=seen)
    print(f"pushed {len(records)} record(s) in {sent} message(s) to {args.queue}")
    return 0


# -- chalk process --------------------------------------------------------------------
def cmd_process(args: argparse.Namespace) -> int:
    """Through the pipeline's own stages (``listener_router._offline``), a chunk at a time."""
    from rich.progress import Progress

    import engine
    from blackboard import Blackboard
    from listener_router._offline import ProcessRun
    from listener_router._records import read_records
    from listener_router.cli._output import result_record
    from listener_router.store import ServiceStore
    settings = settings_for(args)
    registry = engine.WorkflowRegistry(settings.workflows_dir, aliases=settings.aliases,
                                       services=settings.services)
    for problem in registry.errors:
        print(problem, file=sys.stderr)
    workflow = registry.get(args.workflow)
    records = list(read_records(args.input))
    keep = None
    if args.output:
        listed = {r["id"]: {k for k, v in r["attributes"].items() if isinstance(v, list)}
                  for r in records}

        def keep(bb: Blackboard, result_ids: list[str]) -> list[dict[str, Any]]:
            return [result_record(bb, rid, listed.get(rid, ())) for rid in result_ids]
    runner = make_runner(settings)   # before the clock starts, as ever (Spark's start-up)
    ok = failed = 0
    out = open(args.output, "w", encoding="utf-8") if args.output else None  # noqa: SIM115
    started = time.monotonic()
    store = ServiceStore.connect(settings.blackboard_url)
    try:
        plugins = []
        jobs = settings.section("jobs")
        if jobs.log:
            from listener_router.jobs import ProcessLog
            plugins.append(ProcessLog(store, interval=jobs.stats_interval))
        with ProcessRun(settings, workflow.name, store=store, registry=registry,
                        runner=runner, plugins=plugins, keep=keep) as run, \
                Progress(disable=not sys.stderr.isatty()) as progress:
            task = progress.add_task(f"{workflow.name}", total=len(records))
            for chunk in run.chunks(records, args.batch_size):
                for done in chunk:
                    if not done.ok:
                        print(f"record {done.record_id!r}: {done.error}", file=sys.stderr)
                if out is not None:
                    for done in chunk:
                        for result in done.kept or ():
                            out.write(json.dumps(result, ensure_ascii=False) + "\n")
                good = sum(1 for done in chunk if done.ok)
                ok += good
                failed += len(chunk) - good
                progress.advance(task, len(chunk))
    finally:
        if out is not None:
            out.close()
        store.close()
        close_runner(runner)
    elapsed = time.monotonic() - started
    print(f"{workflow.name}: {ok} succeeded, {failed} failed in {elapsed:.1f} s")
    return 0 if failed == 0 else 1


# -- chalk validate / graph -----------------------------------------------------------
def cmd_validate(args: argparse.Namespace) -> int:
    import engine
    settings = settings_for(args)
    report = engine.validate_tree(args.path, aliases=settings.aliases, services=settings.services, notes=True)
    for line in report.lines(summary=args.summary, label=args.path):
        print(line)
    return 0 if report.valid else 1


def cmd_graph(args: argparse.Namespace) -> int:
    import engine
    settings = settings_for(args)
    graph, errors = engine.draft_graph(args.file, aliases=settings.aliases,
                                       services=settings.services)
    for error in errors:  # drawn anyway, the faulty activities in red
        print(error, file=sys.stderr)
    if args.output:
        engine.render_graph(graph, args.output)
        print(f"wrote {args.output}" + (f" ({len(errors)} error(s) marked)" if errors else ""))
    else:
        print(engine.to_dot(graph))
    return 1 if errors else 0   # as chalk validate: a script sees the workflow is not valid


# -- chalk status / jobs / dlq --------------------------------------------------------
def cmd_status(args: argparse.Namespace) -> int:
    from listener_router.cli._jobs import parse_time
    from listener_router.cli._show import Out
    from listener_router.cli._status import print_status, status_report
    report = status_report(settings_for(args), since=parse_time(args.since))
    out = Out(args.json)
    if args.json:
        out.record(report, indent=2)
    else:
        print_status(report, out)
    return 0


def _listed(values: list[str] | None) -> list[str]:
    """Repeatable options that also take comma-separated values."""
    return [v for value in values or () for v in value.split(",") if v]


def cmd_jobs(args: argparse.Namespace) -> int:
    from listener_router.cli._jobs import jobs, parse_time
    jobs(settings_for(args), states=_listed(args.state), queues=_listed(args.queue),
         workflows=_listed(args.workflow), record=args.record, message=args.message,
         since=parse_time(args.since), until=parse_time(args.until), limit=args.limit,
         follow=args.follow, as_json=args.json)
    return 0


def cmd_schedules(args: argparse.Namespace) -> int:
    from listener_router.cli._jobs import schedules
    schedules(settings_for(args), as_json=args.json)
    return 0


def cmd_dlq(args: argparse.Namespace) -> int:
    from listener_router.cli import _admin
    from listener_router.cli._show import Out
    settings = settings_for(args)
    queues = [args.queue] if args.queue else [r.queue for r in settings.listeners]
    where = ", ".join(f"{q}.dlq" for q in queues)
    if args.action == "list":
        _admin.dlq_list(settings, queues, limit=args.limit, out=Out(args.json))
    elif args.action == "show":
        if not _admin.dlq_show(settings, queues, args.message_id, out=Out(args.json)):
            what = f"with message ID {args.message_id!r}" if args.message_id else "at all"
            print(f"no dead letter {what} (looked in {where})", file=sys.stderr)
            return 1
    elif args.action == "replay":
        n = _admin.dlq_replay(settings, queues, message_id=args.message_id)
        print(f"replayed {n} message(s)")
    elif args.action == "purge":
        n = _admin.dlq_purge(settings, queues)
        print(f"purged {n} message(s)")
    return 0


# -- chalk events ---------------------------------------------------------------------
def cmd_events(args: argparse.Namespace) -> int:
    from listener_router.events import ReceivedEvent, follow
    settings = settings_for(args)
    if not args.follow:
        raise ConfigError("give --follow: events are not stored, only those published while "
                          "following are shown")
    patterns = args.pattern or ["#"]
    exchange = settings.section("events").exchange

    def show(event: ReceivedEvent) -> None:
        print(event.json() if args.json else event.line(), flush=True)

    def ready() -> None:
        print(f"following {exchange} ({', '.join(patterns)})"
              + ("" if args.count else "; Ctrl-C to stop"), file=sys.stderr, flush=True)

    follow(settings.broker_url, exchange, patterns, show, count=args.count, ready=ready)
    return 0


# -- chalk demo -----------------------------------------------------------------------
def cmd_demo(args: argparse.Namespace) -> int:
    from listener_router.cli._demo import run_demo
    return run_demo(records=args.records, config=args.config)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("chalk")
    except PackageNotFoundError:  # a source tree that was never installed
        return "unknown (not installed)"


_JSON_LINES = "print JSON, one object per line (docs/guide.md)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="chalk", description="Chalk: a record-processing engine (RabbitMQ listener/router, "
        "SQLAlchemy blackboard, BPEL-style XML workflows on PySpark).",
        epilog="chalk COMMAND --help describes a command and shows examples.")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv: debug)")
    parser.add_argument("--version", action="version", version=f"chalk {_version()}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", metavar="FILE", help="chalk.toml (default: ./chalk.toml when present)")
    common.add_argument("--blackboard", metavar="URL",
                        help="blackboard store, any SQLAlchemy URL (overrides the configuration)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("run", parents=[common], help="run the service: consume, process, commit, route")
    p.add_argument("--rules", dest="config", metavar="FILE", help="same as --config")
    p.add_argument("--workflows", metavar="DIR", help="workflow directory (default from config: workflows)")
    p.add_argument("--local", action="store_true", help="run workflows on the service's own worker processes instead of on Spark")
    p.add_argument("--idle-exit", type=float, metavar="SECONDS",
                   help="stop after this many seconds without messages")
    p.add_argument("--http", metavar="HOST:PORT",
                   help="serve Prometheus metrics (/metrics) and the dashboard (/) there, "
                        "e.g. 127.0.0.1:9187 (default: [http] listen; off)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("push", parents=[common], help="store records from JSONL and publish their IDs")
    p.add_argument("file", nargs="?", help="JSON Lines file: {\"id\": …, \"attributes\": {…}} per line")
    p.add_argument("--queue", default="chalk.in", help="queue to publish to (default chalk.in)")
    p.add_argument("--id", dest="ids", action="append", metavar="ID",
                   help="publish this record ID without storing anything (repeatable)")
    p.add_argument("--ids-only", action="store_true", help="publish the file's IDs without storing the records")
    p.add_argument("--operation", default="ADD", type=str.upper, choices=OPERATIONS,
                   help=f"operation header, one the service accepts: {', '.join(OPERATIONS)} "
                        "(default ADD)")
    p.add_argument("--per-message", type=int, default=1, help="record IDs per message (default 1)")
    p.add_argument("--source", metavar="NAME",
                   help="the records belong to this source (stored ones get it); a crawl of it "
                        "(chalk delta start) counts them seen")
    p.set_defaults(func=cmd_push)

    p = sub.add_parser("process", parents=[common], help="run a workflow over a JSONL file, no broker")
    p.add_argument("--workflow", required=True, help="workflow name (<process name=…>)")
    p.add_argument("--input", required=True, help="JSON Lines file of records")
    p.add_argument("--output", help="write the result records as JSON Lines here (attributes "
                   "given as lists stay lists; annotations under \"annotations\")")
    p.add_argument("--workflows", metavar="DIR", help="workflow directory")
    p.add_argument("--local", action="store_true", help="run on this process's own worker processes instead of on Spark")
    p.add_argument("--batch-size", type=int, default=1000, help="records per Spark job (default 1000)")
    p.set_defaults(func=cmd_process)

    p = sub.add_parser("validate", parents=[common], help="check workflow files; exit 1 with file:line errors")
    p.add_argument("path", help="a workflow file, or a directory: every file in its tree")
    p.add_argument("--summary", action="store_true",
                   help="group unknown pipelet classes and services by name, with counts and places "
                        "(the migration to-do list)")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("graph", parents=[common], help="draw a workflow's control-flow graph")
    p.add_argument("file", help="workflow file")
    p.add_argument("-o", "--output", help="out.dot, out.svg or out.png, by the extension (default: "
                   "dot text on stdout); errors go to stderr and into the drawing, and the exit "
                   "code is 1")
    p.set_defaults(func=cmd_graph)

    p = sub.add_parser("status", parents=[common],
                       help="queues (depth, rates), store, cluster members and job statistics")
    p.add_argument("--since", metavar="TIME",
                   help="statistics since: an age (30m, 2h, 1d) or an ISO time (default 1h)")
    p.add_argument("--json", action="store_true", help="print one JSON object (docs/guide.md)")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("jobs", parents=[common],
                       help="the job log: each message's steps (received, retried, dead, "
                            "replayed, committed), oldest first")
    p.add_argument("--state", action="append", metavar="STATE",
                   help="committed, unchanged, retrying, dead, duplicate, replayed, processed, "
                        "failed, crashed "
                        "(repeatable, or comma-separated)")
    p.add_argument("--queue", action="append", metavar="QUEUE", help="input queue (repeatable)")
    p.add_argument("--workflow", action="append", metavar="NAME", help="workflow (repeatable)")
    p.add_argument("--record", metavar="ID", help="messages that name this record ID")
    p.add_argument("--message", metavar="ID", help="one message ID")
    p.add_argument("--since", metavar="TIME", help="an age (30m, 2h, 1d) or an ISO time")
    p.add_argument("--until", metavar="TIME", help="an age (30m, 2h, 1d) or an ISO time")
    p.add_argument("--limit", type=int, default=50, metavar="N",
                   help="show the N most recent entries (default 50)")
    p.add_argument("-f", "--follow", action="store_true", help="then print new entries as they come")
    p.add_argument("--json", action="store_true", help=_JSON_LINES)
    p.set_defaults(func=cmd_jobs)

    p = sub.add_parser("schedules", parents=[common],
                       help="scheduled jobs ([[schedule]]) with their last and next run")
    p.add_argument("--json", action="store_true", help=_JSON_LINES)
    p.set_defaults(func=cmd_schedules)

    p = sub.add_parser("dlq", parents=[common],
                       help="dead letters: list, show (from the job log), replay, purge")
    p.add_argument("action", choices=["list", "show", "replay", "purge"])
    p.add_argument("message_id", nargs="?", help="for show/replay: one message ID, or a unique "
                   "start of it (whole, or after a ':': 7bdb77b1 for push:7bdb77b1…)")
    p.add_argument("--queue", help="input queue whose dead letters to use (default: every listener queue)")
    p.add_argument("--limit", type=int, default=50, metavar="N",
                   help="for list: show at most N dead letters, oldest first (default 50)")
    p.add_argument("--json", action="store_true", help="for list and show: " + _JSON_LINES)
    p.set_defaults(func=cmd_dlq)

    p = sub.add_parser("events", parents=[common],
                       help="print the cluster's events as they are published (chalk.events)")
    p.add_argument("--follow", action="store_true",
                   help="bind a temporary queue to the events exchange and print each event")
    p.add_argument("--pattern", action="append", metavar="KEY",
                   help="routing-key pattern (repeatable; default '#': all), e.g. "
                        "'record.committed.#', 'message.dead_lettered.#', 'topology.changed'")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument("--count", type=int, metavar="N", help="stop after N events")
    p.set_defaults(func=cmd_events)

    p = sub.add_parser("demo", parents=[common], help="push sample records through the demo workflow and report")
    p.add_argument("--records", type=int, default=1000, help="how many sample records (default 1000)")
    p.set_defaults(func=cmd_demo)

    from listener_router.cli._delta import add_parsers as add_delta_parsers
    from listener_router.cli._flow import add_parsers as add_flow_parsers
    from listener_router.cli._journal import add_parsers
    add_parsers(sub, common)
    add_flow_parsers(sub, common)
    reprocess.add_parsers(sub, common)
    add_delta_parsers(sub, common)
    describe(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    level = logging.WARNING - 10 * min(args.verbose, 2)
    if args.command in ("run", "demo", "subscribe") and args.verbose == 0:
        level = logging.INFO
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("pika").setLevel(logging.CRITICAL)  # listener_router.broker reports what matters
    logging.getLogger("py4j").setLevel(logging.WARNING)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `chalk jobs | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as e:  # every error ends as one clear line (traceback with -v)
        if args.verbose:
            log.exception("chalk %s failed", args.command)
        message = e.args[0] if type(e) is KeyError and e.args else e
        print(f"chalk {args.command}: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
