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
from listener_router.cli._common import JOB_STATES, settings_for
from listener_router.cli._help import describe
from listener_router.cli._show import add_json_options

__all__ = ["main", "summary_line"]

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
    print(summary_line(stats))
    return 0


def summary_line(stats: Any) -> str:
    """``chalk run``'s last line: messages received, then how each gathering ended (every
    outcome: they add up to ``received``), records committed and batches."""
    counts = stats.counts
    outcomes = stats.outcomes()
    first = {k: outcomes.pop(k) for k in ("committed", *sorted(k for k in outcomes if k not in (
        "duplicate", "retrying", "dead", "cancelled", "deferred", "parked", "unsettled",
        "committed")))}
    shown = {"received": counts.get("received", 0), **first, **outcomes,
             "records_committed": counts.get("records_committed", 0),
             "batches": counts.get("batches", 0)}
    return ", ".join(f"{k}={v}" for k, v in shown.items())


# -- chalk push -----------------------------------------------------------------------
def push_queue(settings: Any, queue: str | None, force: bool) -> str:
    """The queue ``chalk push`` publishes to: ``queue``, or the only one the listener rules
    read.

    Raises:
        ConfigError: no ``queue`` and the rules read several; or ``queue`` is read by no
            rule and ``force`` is not given.
    """
    from listener_router._control import input_queues
    listened = input_queues(settings)
    where = settings.source or "the default configuration"
    if queue is None:
        if len(listened) == 1:
            return listened[0]
        raise ConfigError(f"{where} listens on {len(listened)} queues ({', '.join(listened)}): "
                          "say which with --queue")
    if queue not in listened and not force:
        raise ConfigError(f"no listener rule of {where} reads {queue!r} (they read "
                          f"{', '.join(listened) or 'none'}): its messages would wait for a "
                          "service configured otherwise; --force publishes there anyway")
    return queue


def cmd_push(args: argparse.Namespace) -> int:
    from rich.progress import Progress

    from listener_router._records import push_records, read_records
    from listener_router.broker import ensure_local_broker
    from listener_router.cli._show import Out
    from listener_router.store import ServiceStore
    settings = settings_for(args)
    if args.ids:
        records = [{"id": i, "attributes": {}} for i in args.ids]
    elif args.file:
        records = list(read_records(args.file))
    else:
        raise ConfigError("give a JSONL file of records or --id ID (one or more)")
    queue = push_queue(settings, args.queue, args.force)
    out = Out.of(args)
    if args.print_ids and out.json:
        raise ConfigError("--ids prints one ID a line; --json and --json-lines print them "
                          "in JSON: give one of them")
    ensure_local_broker(settings.broker_url)
    seen = None
    if args.source:  # a crawl of the source sees them, in the transaction that stores them
        from listener_router.delta import seen_on_push
        seen = seen_on_push(settings.blackboard_url, args.source)
    messages: list[dict[str, Any]] = []

    def published(message_id: str, record_ids: Any) -> None:
        messages.append({"message_id": message_id, "records": record_ids})
        if args.print_ids:
            print(message_id, flush=True)

    with Progress(disable=not sys.stderr.isatty()) as progress:
        task = progress.add_task(f"push → {queue}", total=len(records))
        sent = push_records(settings, queue, records, store=not args.ids_only and not args.ids,
                            operation=args.operation, per_message=args.per_message,
                            progress=lambda n: progress.advance(task, n), source=args.source,
                            hook=seen, published=published)
    try:  # what chalk jobs cancel knows of a message still queued
        store = ServiceStore.connect(settings.blackboard_url)
        try:
            store.pushed.add(queue, [m["message_id"] for m in messages],
                             keep_seconds=settings.retention_days * 86400.0)
        finally:
            store.close()
    except Exception as e:  # they are published: say what is missing, and go on
        log.warning("the message IDs were published but not written down (%s): chalk jobs "
                    "cancel takes them with --ahead", e)
    said = f"pushed {len(records)} record(s) in {sent} message(s) to {queue}"
    if not out.document({"queue": queue, "records": len(records), "messages": messages}):
        print(said, file=sys.stderr if args.print_ids else sys.stdout)
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
    out = Out.of(args)
    if not out.document(report):
        print_status(report, out)
    return 0


def _listed(values: list[str] | None) -> list[str]:
    """Repeatable options that also take comma-separated values."""
    return [v for value in values or () for v in value.split(",") if v]


def cmd_jobs(args: argparse.Namespace) -> int:
    from listener_router.cli._jobs import jobs, parse_time
    from listener_router.cli._show import Out
    jobs(settings_for(args), states=_listed(args.state), queues=_listed(args.queue),
         workflows=_listed(args.workflow), record=args.record, message=args.message,
         since=parse_time(args.since), until=parse_time(args.until), limit=args.limit,
         follow=args.follow, out=Out.of(args))
    return 0


def cmd_schedules(args: argparse.Namespace) -> int:
    from listener_router.cli._jobs import schedules
    from listener_router.cli._show import Out
    schedules(settings_for(args), Out.of(args))
    return 0


def cmd_dlq(args: argparse.Namespace) -> int:
    from listener_router.cli import _admin
    return _admin.cmd_dlq(settings_for(args), args)


# -- chalk events ---------------------------------------------------------------------
def cmd_events(args: argparse.Namespace) -> int:
    from listener_router.cli._show import Out, iso
    from listener_router.events import ReceivedEvent, follow
    settings = settings_for(args)
    if not args.follow:
        raise ConfigError("give --follow: events are not stored, only those published while "
                          "following are shown")
    out = Out.of(args)
    if out.form == "json" and not args.count:
        raise ConfigError("--json prints one document, at the end: give --count N with it, "
                          "or --json-lines for one object a line as the events come")
    patterns = args.pattern or ["#"]
    exchange = settings.section("events").exchange
    kept: list[dict[str, Any]] = []

    def show(event: ReceivedEvent) -> None:
        if not out.json:
            print(event.line(), flush=True)
            return
        at = event.body.get("time")
        value = {"at": iso(at) if isinstance(at, (int, float)) else None,
                 **json.loads(event.json())}
        if out.form == "json":
            kept.append(value)
        else:
            out.row(value)

    def ready() -> None:
        print(f"following {exchange} ({', '.join(patterns)})"
              + ("" if args.count else "; Ctrl-C to stop"), file=sys.stderr, flush=True)

    follow(settings.broker_url, exchange, patterns, show, count=args.count, ready=ready)
    if out.form == "json":
        out.listing(kept)
    return 0


# -- chalk demo -----------------------------------------------------------------------
def cmd_demo(args: argparse.Namespace) -> int:
    from listener_router.cli._demo import run_demo
    return run_demo(records=args.records, config=args.config, warmup=args.warmup)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("chalk")
    except PackageNotFoundError:  # a source tree that was never installed
        return "unknown (not installed)"


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
    p.add_argument("--queue", help="queue to publish to (default: the one queue the listener "
                   "rules read; with several, say which)")
    p.add_argument("--force", action="store_true",
                   help="publish to a queue no listener rule reads")
    p.add_argument("--ids", dest="print_ids", action="store_true",
                   help="print each message's ID, one a line (the summary goes to stderr)")
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
    add_json_options(p, "one object: queue, records, messages (each message_id, records)")
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
    add_json_options(p, "the report as one object")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("jobs", parents=[common],
                       help="the job log: each message's steps (received, retried, dead, "
                            "replayed, committed), oldest first")
    p.add_argument("--state", action="append", metavar="STATE",
                   help="only these steps: " + ", ".join(JOB_STATES) + " (repeatable, or "
                        "comma-separated; deleted: a delta crawl's deletion, purged and "
                        "replayed: also dead letters purged or replayed since)")
    p.add_argument("--queue", action="append", metavar="QUEUE", help="input queue (repeatable)")
    p.add_argument("--workflow", action="append", metavar="NAME", help="workflow (repeatable)")
    p.add_argument("--record", metavar="ID", help="messages that name this record ID")
    p.add_argument("--message", metavar="ID", help="one message ID")
    p.add_argument("--since", metavar="TIME", help="an age (30m, 2h, 1d) or an ISO time")
    p.add_argument("--until", metavar="TIME", help="an age (30m, 2h, 1d) or an ISO time")
    p.add_argument("--limit", type=int, default=50, metavar="N",
                   help="show the N most recent steps that match (default 50)")
    p.add_argument("-f", "--follow", action="store_true",
                   help="then print new steps as they come (JSON: --json-lines)")
    add_json_options(p, "the steps as one array")
    p.set_defaults(func=cmd_jobs)

    p = sub.add_parser("schedules", parents=[common],
                       help="scheduled jobs ([[schedule]]) with their last and next run")
    add_json_options(p, "the schedules as one array")
    p.set_defaults(func=cmd_schedules)

    p = sub.add_parser("dlq", parents=[common],
                       help="dead letters: list, show (from the job log), replay, purge")
    p.add_argument("action", choices=["list", "show", "replay", "purge"])
    p.add_argument("message_id", nargs="?", help="for show/replay: one message ID, or a unique "
                   "start of it (whole, or after a ':': 7bdb77b1 for push:7bdb77b1…)")
    p.add_argument("--queue", help="input queue whose dead letters to use (default: every listener queue)")
    p.add_argument("--limit", type=int, default=50, metavar="N",
                   help="for list: show at most N dead letters, oldest first (default 50)")
    p.add_argument("--all", action="store_true",
                   help="for replay and purge without a message ID: every dead letter of the "
                        "queues (asks on a terminal; --yes does not ask)")
    p.add_argument("-y", "--yes", action="store_true",
                   help="with --all: do it without asking")
    add_json_options(p, "for list and show: the letters as one array")
    p.set_defaults(func=cmd_dlq)

    p = sub.add_parser("events", parents=[common],
                       help="print the cluster's events as they are published (chalk.events)")
    p.add_argument("--follow", action="store_true",
                   help="bind a temporary queue to the events exchange and print each event")
    p.add_argument("--pattern", action="append", metavar="KEY",
                   help="routing-key pattern (repeatable; default '#': all), e.g. "
                        "'record.committed.#', 'message.dead_lettered.#', 'topology.changed'")
    add_json_options(p, "the events, with --count, as one array at the end")
    p.add_argument("--count", type=int, metavar="N", help="stop after N events")
    p.set_defaults(func=cmd_events)

    p = sub.add_parser("demo", parents=[common], help="push sample records through the demo workflow and report")
    p.add_argument("--records", type=int, default=20_000,
                   help="sample records timed at the steady rate (default 20000)")
    p.add_argument("--warmup", type=int, default=3_000,
                   help="records run first, in Spark jobs of 100, to warm the path; part of "
                        "the cold start, not timed as steady (default 3000)")
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
    args, extra = parser.parse_known_args(argv)
    if extra and isinstance(getattr(args, "ids", None), list) and args.command == "jobs" \
            and not any(e.startswith("-") for e in extra):
        args.ids += extra   # chalk jobs cancel --ahead ID: message IDs after an option
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
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
