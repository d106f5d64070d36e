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
from listener_router._errors import BrokerUnavailable
from listener_router.broker import connect, dlq_name
from listener_router.cli._dead_letters import dead_letters, purge, replay
from listener_router.store import ServiceStore

__all__ = ["status", "jobs", "dlq_list", "dlq_show", "dlq_replay", "dlq_purge", "channel", "depth"]

console = Console()


@contextmanager
def channel(settings: Settings) -> Iterator[Any]:
    """A channel on a connection of its own to the configured broker."""
    conn = connect(settings.broker_url)
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
    except BrokerUnavailable as e:
        console.print(f"broker: unreachable ({e})")
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
    _versions(store, [m.name for m in members])
    store.close()


def _versions(store: ServiceStore, members: Sequence[str]) -> None:
    """The workflow versions the live members run, with their last reload."""
    import datetime as dt

    running = store.workflow_versions.running(members)
    if not running:
        console.print("workflows: no running service reports its versions (chalk run does)")
        return
    table = Table(title="running workflows")
    for column in ("workflow", "version", "last reload", "process", "file"):
        table.add_column(column, overflow="fold")
    for v in running:
        when = dt.datetime.fromtimestamp(v.loaded_at).isoformat(sep=" ", timespec="seconds")
        table.add_row(v.name, v.version[:12], f"{when} ({time.time() - v.loaded_at:.0f} s ago)",
                      v.node, v.path)
    console.print(table)


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


def dlq_list(settings: Settings, queues: Sequence[str], limit: int = 50) -> int:
    """Print the first ``limit`` dead letters of ``queues``; returns how many there are."""
    letters = dead_letters(settings, queues, limit=limit)
    table = Table(title="dead letters")
    for column in ("queue", "message", "attempts", "workflow", "error"):
        table.add_column(column, overflow="fold")
    for letter in letters:
        table.add_row(letter.queue, letter.message_id, str(letter.attempts), letter.workflow,
                      letter.error[:200])
    console.print(table)
    return len(letters)


def dlq_show(settings: Settings, queues: Sequence[str], message_id: str | None) -> int:
    """Print dead letters in full (``message_id``'s only, when given); returns how many."""
    letters = dead_letters(settings, queues, message_id=message_id)
    for letter in letters:
        try:
            shown: Any = json.loads(letter.body)
        except ValueError:
            shown = letter.body.decode("utf-8", "replace")
        console.print_json(json.dumps({
            "queue": letter.queue, "message_id": letter.message_id, "error": letter.error,
            "attempts": letter.attempts, "workflow": letter.workflow,
            "headers": letter.headers, "body": shown}, default=str))
    return len(letters)


def dlq_replay(settings: Settings, queues: Sequence[str], message_id: str | None = None) -> int:
    """Put dead letters back on their original queue, attempts reset, error dropped."""
    return replay(settings, queues, message_id)


def dlq_purge(settings: Settings, queues: Sequence[str]) -> int:
    """Drop the dead letters of ``queues``; returns how many."""
    return purge(settings, queues)
