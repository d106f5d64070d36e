"""``chalk subscribe`` and ``chalk journal status|rewind|skip|retry|errors``."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import signal
from typing import Any

import pika
import pika.exceptions

from listener_router._errors import BrokerUnavailable
from listener_router._messages import ATTEMPTS_HEADER, ERROR_HEADER
from listener_router._settings import Settings
from listener_router.broker import connect
from listener_router.cli._common import cmd_with_settings
from listener_router.cli._show import Out, add_json_options, iso
from listener_router.journal import (
    SubscriberRule,
    SubscriberView,
    attempts_in,
    journal_rule,
    journal_status,
    parse_start,
    recent_errors,
    request_retry,
    request_rewind,
    request_skip,
    subscriber_rule,
    subscriber_state,
)

__all__ = ["add_parsers", "cmd_journal", "cmd_subscribe"]

log = logging.getLogger("chalk")


def _rule(settings: Settings, args: argparse.Namespace) -> SubscriberRule:
    overrides: dict[str, Any] = {"store": getattr(args, "store", None)}
    for key in ("apply", "workflow", "source", "batch_size", "on_error", "max_retries"):
        overrides[key] = getattr(args, key, None)
    if getattr(args, "start", None) is not None:
        overrides["start"] = parse_start(args.start, "--start")
    rule = subscriber_rule(settings, args.subscriber, args.journal, **overrides)
    if not rule.store:
        from listener_router._errors import ConfigError

        raise ConfigError(f"subscriber {rule.id!r}: give --store URL (its database), or a "
                          "[[subscriber]] with 'store' in the configuration")
    return rule


def _engine(rule: SubscriberRule) -> Any:
    from blackboard import SqlStore

    return SqlStore(rule.store).engine


# -- chalk subscribe ------------------------------------------------------------------------
def cmd_subscribe(settings: Settings, args: argparse.Namespace) -> int:
    from listener_router.journal import Subscriber

    rule = _rule(settings, args)
    with Subscriber(settings, rule) as subscriber:
        def stop(signum: int, _frame: Any) -> None:
            log.info("signal %d: finishing the batch being applied, then stopping", signum)
            subscriber.request_stop()
        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        stats = subscriber.run(idle_exit=args.idle_exit)
    print(f"subscriber {rule.id}: applied={stats.applied} copies={stats.copies} "
          f"passed={stats.passed} errors={stats.errors} gaps={stats.gaps} "
          f"blocked={'yes' if stats.blocked else 'no'}")
    return 0


# -- chalk journal ... ------------------------------------------------------------------------
def cmd_journal(settings: Settings, args: argparse.Namespace) -> int:
    action = args.action
    if action == "status":
        return _status(settings, args)
    rule = _rule(settings, args)
    engine = _engine(rule)
    if action == "rewind":
        start = parse_start(args.to, "--to")
        if start in ("last", "next"):
            from listener_router.journal import read_head

            head = read_head(settings.broker_url, journal_rule(settings, rule.journal).stream)
            start = "first" if head is None else \
                f"offset:{head.offset + (1 if start == 'next' else 0)}"
        state = request_rewind(engine, rule.journal, rule.id, start)
        print(f"subscriber {rule.id} of journal {rule.journal}: rewound to {state.start}; "
              "a running agent starts over within a second")
    elif action == "skip":
        before = subscriber_state(engine, rule.journal, rule.id)
        if before is not None and before.blocked and before.blocked_kind == "entry" \
                and before.blocked_entry is not None:
            _to_error_queue(settings, rule, before)
        before = request_skip(engine, rule.journal, rule.id)
        what = ("the gap before offset" if before.blocked_kind == "gap" else "the entry at offset")
        print(f"subscriber {rule.id} of journal {rule.journal}: skipped {what} "
              f"{before.blocked_offset} ({before.blocked_reason})")
    elif action == "retry":
        before = request_retry(engine, rule.journal, rule.id)
        print(f"subscriber {rule.id} of journal {rule.journal}: trying offset "
              f"{before.blocked_offset} again")
    elif action == "errors":
        _errors(engine, rule, args.limit, Out.of(args))
    return 0


def _errors(engine: Any, rule: SubscriberRule, limit: int, out: Out) -> None:
    """A subscriber's failed, skipped and missing entries, newest first."""
    rows = [{"offset": row.offset, "seq": row.seq, "record": row.record_id,
             "attempts": row.attempts, "failed_at": iso(row.failed_at, "seconds"),
             "reason": row.reason}
            for row in recent_errors(engine, rule.journal, rule.id, limit)]
    if out.listing(rows):
        return
    out.table(f"{rule.journal}/{rule.id}: failed, skipped and missing entries",
              ["offset", "seq", "record", "attempts", "when", "reason"],
              [[r["offset"], r["seq"] or "", r["record"] or "", r["attempts"],
                r["failed_at"][:19].replace("T", " "), r["reason"]] for r in rows],
              right=("offset", "seq", "attempts"))


def _to_error_queue(settings: Settings, rule: SubscriberRule, state: Any) -> None:
    """The entry an operator skips goes to the error queue too, with its reason."""
    journal = journal_rule(settings, rule.journal)
    try:
        conn = connect(settings.broker_url)
        try:
            channel = conn.channel()
            channel.confirm_delivery()
            channel.queue_declare(journal.error_queue(rule.id), durable=True,
                                  arguments={"x-queue-type": settings.queue_type})
            channel.basic_publish("", journal.error_queue(rule.id),
                                  state.blocked_entry.encode(), pika.BasicProperties(
                                      delivery_mode=2, content_type="application/json",
                                      message_id=f"{rule.journal}:{state.blocked_seq}:{rule.id}",
                                      headers={ERROR_HEADER: "skipped by an operator; it had "
                                               f"failed: {state.blocked_reason}"[:2000],
                                               ATTEMPTS_HEADER: attempts_in(state.blocked_reason),
                                               "x-chalk-offset": state.blocked_offset}))
        finally:
            if conn.is_open:
                conn.close()
    except (pika.exceptions.AMQPError, OSError) as e:
        raise BrokerUnavailable(f"publishing the skipped entry to "
                                f"{journal.error_queue(rule.id)} failed: {e}") from e


def _state(view: SubscriberView) -> str:
    if view.state == "blocked":
        return f"BLOCKED: {view.blocked_reason}"
    why = view.blocked_reason and f"blocked: {view.blocked_reason}" or view.note
    return f"{view.state} ({why})" if why else view.state


def _status(settings: Settings, args: argparse.Namespace) -> int:
    out = Out.of(args)
    names = [args.journal] if args.journal else [j.name for j in settings.section("journal")]
    if not names:
        if not out.document({}):
            out.text("no [[journal]] in the configuration")
        return 0
    found: dict[str, Any] = {}
    for name in names:
        head, views = journal_status(settings, name)
        found[name] = {"head": None if head is None else
                       {**dataclasses.asdict(head), "published_at": iso(head.published_at)},
                       "subscribers": [dataclasses.asdict(v) for v in views]}
        if out.json:
            continue
        title = (f"journal {name}: " + ("empty" if head is None else
                                        f"last offset {head.offset}, entry {head.seq}"))
        out.table(title, ["subscriber", "state", "offset", "lag (entries)", "lag (s)", "errors",
                          "last seen", "host"],
                  [[v.subscriber, _state(v), "-" if v.offset is None else v.offset,
                    v.lag_entries, f"{v.lag_seconds:.1f}", v.errors,
                    "-" if v.last_seen is None else f"{v.last_seen:.0f} s ago", v.host or "-"]
                   for v in views],
                  right=("offset", "lag (entries)", "lag (s)", "errors"))
    out.document(found)
    return 0


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """The ``subscribe`` and ``journal`` subcommands."""

    who = argparse.ArgumentParser(add_help=False)
    who.add_argument("--journal", help="journal name (a [[journal]] of the configuration)")
    who.add_argument("--subscriber", required=True, metavar="ID", help="the subscriber's id")
    who.add_argument("--store", metavar="URL",
                     help="the subscriber's database (default: its [[subscriber]] 'store')")

    p = sub.add_parser("subscribe", parents=[common, who],
                       help="run a journal subscriber: apply entries from its stored offset, "
                            "exactly once")
    p.add_argument("--apply", metavar="MODULE:FUNCTION",
                   help="callable(entries, connection) that writes a batch's effects")
    p.add_argument("--workflow", help="or: a workflow run over the entries' records on a "
                                      "blackboard over --store")
    p.add_argument("--source", metavar="URL",
                   help="the publisher's blackboard, for attachment references "
                        "(default: [blackboard] url)")
    p.add_argument("--start", help="where a new subscriber starts: first (default), last, next, "
                                    "an offset, or a time (ISO 8601 or epoch seconds)")
    p.add_argument("--batch-size", type=int, help="entries per transaction")
    p.add_argument("--max-retries", type=int, help="retries of a failing entry")
    p.add_argument("--on-error", choices=["queue", "block"],
                   help="after the retries: the error queue (default) or block")
    p.add_argument("--local", action="store_true", help="run the workflow on this process's own workers, not on Spark")
    p.add_argument("--workflows", metavar="DIR", help="workflow directory")
    p.add_argument("--idle-exit", type=float, metavar="SECONDS",
                   help="stop after this many seconds without entries")
    p.set_defaults(func=cmd_with_settings(cmd_subscribe))

    p = sub.add_parser("journal",
                       help="journal subscribers: status, rewind, skip, retry, errors")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    a = actions.add_parser("status", parents=[common],
                           help="subscribers seen lately: lag, blocked, errors, last seen")
    a.add_argument("--journal", help="one journal (default: every [[journal]])")
    add_json_options(a, "one object: each journal's head and subscribers (docs/journal.md)")
    a = actions.add_parser("rewind", parents=[common, who],
                           help="start a subscriber over from a point; it applies again from there")
    a.add_argument("--to", required=True,
                   help="first, last, next, an offset, or a time (ISO 8601 or epoch seconds)")
    actions.add_parser("skip", parents=[common, who],
                       help="unblock a blocked subscriber: pass over its entry (to the error "
                            "queue) or accept its gap")
    actions.add_parser("retry", parents=[common, who],
                       help="unblock a blocked subscriber: try its entry again")
    a = actions.add_parser("errors", parents=[common, who],
                           help="a subscriber's failed, skipped and missing entries")
    a.add_argument("--limit", type=int, default=50, metavar="N",
                   help="show at most N entries, newest first (default 50)")
    add_json_options(a, "the entries as one array")
    p.set_defaults(func=cmd_with_settings(cmd_journal))
