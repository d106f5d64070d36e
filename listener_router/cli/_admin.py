"""Operator commands: status, jobs, dead letters (list, show, replay, purge)."""

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
from listener_router._messages import ATTEMPTS_HEADER, ERROR_HEADER, QUEUE_HEADER
from listener_router.broker import connection_parameters, dlq_name
from listener_router.store import ServiceStore

__all__ = ["status", "jobs", "dlq_list", "dlq_show", "dlq_replay", "dlq_purge", "peek",
           "channel", "depth"]

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


def status(settings: Settings) -> None:
    table = Table(title="queues")
    table.add_column("queue")
    table.add_column("messages", justify="right")
    names: list[str] = []
    for rule in settings.listeners:
        names += [rule.queue, dlq_name(rule.queue)]
    names += [r.queue for r in settings.routers if r.queue]
    try:
        for name in dict.fromkeys(names):
            found = depth(settings, name)
            table.add_row(name, "absent" if found is None else str(found))
        console.print(table)
    except pika.exceptions.AMQPConnectionError as e:
        console.print(f"broker: unreachable ({e!r})")
    store = ServiceStore.connect(settings.blackboard_url)
    count = store.sql.record_count()
    held = store.sql.lease_counts()
    done = store.outbox.processed_count()
    console.print(f"store {settings.blackboard_url}: {count} record(s), {done} processed "
                  f"message(s), {store.outbox.unsent_count()} unsent outbox message(s)")
    for owner, n in held.items():
        console.print(f"  leases held by {owner}: {n}")
    state = store.cluster.read()
    now = time.time()
    members = [m for m in store.nodes.all() if m.live(now, settings.ttl_seconds)]
    console.print(f"cluster {state.cluster_id[:8]}: {len(members)} live member(s), leader "
                  f"{state.leader or 'none'} (epoch {state.epoch}), view {state.view_seq} of "
                  f"{len(state.view_members)} member(s)")
    for m in members:
        queues = ", ".join(m.properties.get("queues", [])) or "-"
        workflows = ", ".join(m.properties.get("workflows", [])) or "-"
        console.print(f"  {m.name} (pid {m.pid} on {m.host}, version "
                      f"{m.properties.get('version', '?')}), heartbeat "
                      f"{now - m.heartbeat_at:.0f} s ago; queues {queues}; workflows {workflows}")
    store.close()


def jobs(settings: Settings, limit: int = 20) -> None:
    import datetime as dt

    store = ServiceStore.connect(settings.blackboard_url)
    table = Table(title=f"last {limit} processed messages")
    for column in ("message", "queue", "status", "processed", "outgoing"):
        table.add_column(column)
    rows = store.outbox.recent(limit)
    counts = store.outbox.outgoing_counts([(row.message_id, row.batch) for row in rows])
    for row, n in zip(rows, counts, strict=True):
        when = dt.datetime.fromtimestamp(row.processed_at).isoformat(timespec="seconds")
        table.add_row(row.message_id, row.queue, row.status, when, str(n))
    console.print(table)
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
    table = Table(title="dead letters")
    for column in ("queue", "message", "attempts", "error"):
        table.add_column(column, overflow="fold")
    for queue in queues:
        for _method, props, _body in peek(settings, dlq_name(queue), limit):
            table.add_row(queue, props.message_id or "", _header(props, ATTEMPTS_HEADER),
                          _header(props, ERROR_HEADER)[:200])
    console.print(table)


def dlq_show(settings: Settings, queues: Sequence[str], message_id: str | None) -> None:
    for queue in queues:
        for _method, props, body in peek(settings, dlq_name(queue), 10_000):
            if message_id and props.message_id != message_id:
                continue
            try:
                shown: Any = json.loads(body)
            except ValueError:
                shown = body.decode("utf-8", "replace")
            console.print_json(json.dumps({
                "queue": queue, "message_id": props.message_id,
                "headers": {k: (v.decode() if isinstance(v, bytes) else v)
                            for k, v in (props.headers or {}).items()},
                "body": shown}, default=str))


def dlq_replay(settings: Settings, queues: Sequence[str], message_id: str | None = None) -> int:
    """Put dead letters back on their original queue, attempts reset, error dropped."""
    count = 0
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
                target = _header(props, QUEUE_HEADER) or queue
                ch.basic_publish("", target, body, pika.BasicProperties(
                    delivery_mode=2, message_id=props.message_id, headers=headers,
                    content_type=props.content_type))
                ch.basic_ack(method.delivery_tag)
                count += 1
    return count


def dlq_purge(settings: Settings, queues: Sequence[str]) -> int:
    count = 0
    with channel(settings) as ch:
        for queue in queues:
            count += ch.queue_purge(dlq_name(queue)).method.message_count
    return count
