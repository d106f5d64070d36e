"""Operator commands: status, dead letters (list, show, replay, purge).

``chalk jobs`` and ``chalk schedules`` and the job-log parts of the others
are in ``_jobs``: dead letters are listed and shown from the job log
(:func:`~listener_router.cli._jobs.dead_letters`), replayed and purged on
the queue, and the log marks them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pika
from rich.console import Console
from rich.table import Table

from listener_router._config import Settings
from listener_router._messages import QUEUE_HEADER
from listener_router.broker import connection_parameters, dlq_name
from listener_router.cli._jobs import dead_letters, print_statistics, print_topology
from listener_router.jobs import REPLAYS_HEADER
from listener_router.store import ServiceStore

__all__ = ["status", "dlq_list", "dlq_show", "dlq_replay", "dlq_purge", "peek", "channel",
           "depth"]

console = Console()


@contextmanager
def channel(settings: Settings) -> Iterator[Any]:
    """A channel on a connection of its own to the configured broker."""
    conn = pika.BlockingConnection(connection_parameters(settings.broker_url))
    try:
        yield conn.channel()
    finally:
        if conn.is_open:
            conn.close()


def depth(settings: Settings, queue: str) -> int | None:
    """Messages in ``queue`` (None: no such queue)."""
    try:
        with channel(settings) as ch:
            return ch.queue_declare(queue, passive=True).method.message_count
    except pika.exceptions.ChannelClosedByBroker:
        return None


def status(settings: Settings, since: float | None = None) -> None:
    """Queues (depth, committed/s over 5 minutes), the store, the cluster's members, and the
    job log's statistics since ``since`` (default: the last hour)."""
    from listener_router.jobs._read import statistics

    store = ServiceStore.connect(settings.blackboard_url)
    now = time.time()
    recent = statistics(store, now - 300)
    rates: dict[str, float] = {}
    for (queue, _workflow), summary in recent.items():
        rates[queue] = rates.get(queue, 0.0) + summary.rate("committed", now)
    table = Table(title="queues")
    table.add_column("queue")
    table.add_column("messages", justify="right")
    table.add_column("committed/s (5 min)", justify="right")
    names: list[str] = []
    for rule in settings.listeners:
        names += [rule.queue, dlq_name(rule.queue)]
    names += [r.queue for r in settings.routers if r.queue]
    try:
        for name in dict.fromkeys(names):
            found = depth(settings, name)
            table.add_row(name, "absent" if found is None else str(found),
                          f"{rates[name]:.1f}" if name in rates else "")
        console.print(table)
    except pika.exceptions.AMQPConnectionError as e:
        console.print(f"broker: unreachable ({e!r})")
    count = store.sql.record_count()
    held = store.sql.lease_counts()
    done = store.outbox.processed_count()
    console.print(f"store {settings.blackboard_url}: {count} record(s), {done} processed "
                  f"message(s), {store.outbox.unsent_count()} unsent outbox message(s)")
    for owner, n in held.items():
        console.print(f"  leases held by {owner}: {n}")
    print_topology(store)
    print_statistics(store, now - 3600 if since is None else since, now=now)
    store.close()


def peek(settings: Settings, queue: str, limit: int) -> list[tuple[Any, Any, bytes]]:
    """Up to ``limit`` messages of ``queue`` without removing them."""
    out: list[tuple[Any, Any, bytes]] = []
    with channel(settings) as ch:
        while len(out) < limit:
            method, props, body = ch.basic_get(queue, auto_ack=False)
            if method is None:
                break
            out.append((method, props, body))
        for method, _props, _body in out:
            ch.basic_nack(method.delivery_tag, requeue=True)
    return out


def _header(props: Any, key: str) -> str:
    value = (props.headers or {}).get(key, "")
    return value.decode() if isinstance(value, bytes) else str(value)


def dlq_list(settings: Settings, queues: Sequence[str], limit: int = 50) -> None:
    """Dead letters not replayed or purged, from the job log (the queue is not touched)."""
    import datetime as dt

    table = Table(title="dead letters")
    for column in ("queue", "message", "attempts", "workflow", "when", "records", "error"):
        table.add_column(column, overflow="fold")
    found = dead_letters(settings, queues, limit=limit)
    for entry, records, _history in found:
        table.add_row(entry.queue, entry.message_id, str(entry.attempt + 1), entry.workflow or "",
                      dt.datetime.fromtimestamp(entry.at).isoformat(timespec="seconds"),
                      ", ".join(records[:3]) + (" …" if len(records) > 3 else ""),
                      (entry.reason or "")[:200])
    console.print(table)
    try:  # letters the log has no entry for: dead-lettered by the broker (delivery limit)
        for queue in queues:
            logged = sum(1 for entry, _r, _h in found if entry.queue == queue)
            waiting = depth(settings, dlq_name(queue))
            if waiting is not None and waiting > logged and len(found) < limit:
                console.print(f"{dlq_name(queue)} holds {waiting} message(s), {waiting - logged} "
                              "without a job-log entry (dead-lettered by the broker's delivery "
                              "limit, or before the job log was kept)")
    except pika.exceptions.AMQPConnectionError as e:
        console.print(f"broker: unreachable ({e!r})")


def dlq_show(settings: Settings, queues: Sequence[str], message_id: str | None) -> None:
    """A dead letter's entry, its records and its whole history, from the job log."""
    for entry, records, history in dead_letters(settings, queues, message_id, limit=10_000):
        console.print_json(json.dumps({
            "queue": entry.queue, "message_id": entry.message_id, "workflow": entry.workflow,
            "attempts": entry.attempt + 1, "replays": entry.round, "error": entry.reason,
            "dead_at": entry.at, "member": entry.member, "records": records,
            "history": [{"at": h.at, "state": h.state, "attempt": h.attempt, "round": h.round,
                         "member": h.member, "reason": h.reason} for h in history]},
            default=str))


def dlq_replay(settings: Settings, queues: Sequence[str], message_id: str | None = None) -> int:
    """Put dead letters back on their original queue, attempts reset, error dropped; the
    job log marks each one replayed (and counts the replay in ``x-chalk-replays``)."""
    count = 0
    store = ServiceStore.connect(settings.blackboard_url)
    with channel(settings) as ch:
        ch.confirm_delivery()
        for queue in queues:
            while True:
                method, props, body = ch.basic_get(dlq_name(queue), auto_ack=False)
                if method is None:
                    break
                if message_id and props.message_id != message_id:
                    continue  # left unacked: returns to the queue when the channel closes
                headers = {k: v for k, v in (props.headers or {}).items()
                           if not k.startswith("x-chalk-") and not k.startswith("x-death")
                           and not k.startswith("x-first-death") and not k.startswith("x-last-death")}
                replays = _int(_header(props, REPLAYS_HEADER)) + 1
                headers[REPLAYS_HEADER] = replays
                target = _header(props, QUEUE_HEADER) or queue
                ch.basic_publish("", target, body, pika.BasicProperties(
                    delivery_mode=2, message_id=props.message_id, headers=headers,
                    content_type=props.content_type))
                _log_replay(store, target, props, replays)
                ch.basic_ack(method.delivery_tag)
                count += 1
    store.close()
    return count


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return 0


def _log_replay(store: ServiceStore, queue: str, props: Any, replays: int) -> None:
    """The dead letter's entry is replayed; its history gets a ``replayed`` step."""
    with store.writes, store.engine.begin() as conn:
        store.joblog.replayed(conn, queue, props.message_id or "", replays,
                              "replayed by chalk dlq replay")


def dlq_purge(settings: Settings, queues: Sequence[str]) -> int:
    """Empty the dead-letter queues; the job log marks their entries purged."""
    count = 0
    store = ServiceStore.connect(settings.blackboard_url)
    with channel(settings) as ch:
        for queue in queues:
            count += ch.queue_purge(dlq_name(queue)).method.message_count
            with store.writes, store.engine.begin() as conn:
                store.joblog.resolve(conn, queue, None, "purged")
    store.close()
    return count
