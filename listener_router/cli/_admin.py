"""Operator commands: status, dead letters (list, show, replay, purge).

``chalk jobs`` and ``chalk schedules`` and the job-log parts of the others
are in ``_jobs``.  Dead letters come from ``_dead_letters`` (moved off the
queues into the store); the job log adds their records and history, and
marks them replayed or purged.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pika
from rich.console import Console
from rich.table import Table

from listener_router._errors import BrokerUnavailable
from listener_router._settings import Settings
from listener_router.broker import connect, dlq_name
from listener_router.cli._jobs import print_statistics
from listener_router.dead_letters import dead_letters, logged, purge, replay
from listener_router.store import ServiceStore

__all__ = ["status", "dlq_list", "dlq_show", "dlq_replay", "dlq_purge", "channel", "depth"]

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


def status(settings: Settings, since: float | None = None) -> None:
    """Queues (depth, committed/s over 5 minutes), the store, the cluster's members, and the
    job log's statistics since ``since`` (default: the last hour)."""
    from listener_router.jobs import statistics

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
    except BrokerUnavailable as e:
        console.print(f"broker: unreachable ({e})")
    count = store.sql.record_count()
    held = store.sql.lease_counts()
    done = store.outbox.processed_count()
    console.print(f"store {settings.blackboard_url}: {count} record(s), {done} processed "
                  f"message(s), {store.outbox.unsent_count()} unsent outbox message(s)")
    for owner, n in held.items():
        console.print(f"  leases held by {owner}: {n}")
    state = store.cluster.read()
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
    print_statistics(store, now - 3600 if since is None else since, now=now)
    store.close()


def _versions(store: ServiceStore, members: Sequence[str]) -> None:
    """The workflow versions the live members run, with their last reload."""
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


def dlq_list(settings: Settings, queues: Sequence[str], limit: int = 50) -> int:
    """Print the first ``limit`` dead letters of ``queues`` with their records, from the
    store and the job log; returns how many there are."""
    letters = dead_letters(settings, queues, limit=limit)
    table = Table(title="dead letters")
    for column in ("queue", "message", "attempts", "workflow", "died", "records", "error"):
        table.add_column(column, overflow="fold")
    store = ServiceStore.connect(settings.blackboard_url)
    try:
        for letter in letters:
            records, history = logged(store, letter)
            died = [e.at for e in history if e.state == "dead"] or [letter.kept_at]
            table.add_row(letter.queue, letter.message_id, str(letter.attempts), letter.workflow,
                          dt.datetime.fromtimestamp(died[-1]).isoformat(timespec="seconds"),
                          ", ".join(records[:3]) + (" …" if len(records) > 3 else ""),
                          letter.error[:200])
    finally:
        store.close()
    console.print(table)
    return len(letters)


def dlq_show(settings: Settings, queues: Sequence[str], message_id: str | None) -> int:
    """Print dead letters in full (``message_id``'s only, when given) with the message's
    history from the job log; returns how many."""
    letters = dead_letters(settings, queues, message_id=message_id)
    store = ServiceStore.connect(settings.blackboard_url)
    try:
        for letter in letters:
            try:
                shown: Any = json.loads(letter.body)
            except ValueError:
                shown = letter.body.decode("utf-8", "replace")
            records, history = logged(store, letter)
            console.print_json(json.dumps({
                "queue": letter.queue, "message_id": letter.message_id, "error": letter.error,
                "attempts": letter.attempts, "workflow": letter.workflow, "records": records,
                "history": [{"at": h.at, "state": h.state, "attempt": h.attempt,
                             "replays": h.round, "member": h.member, "reason": h.reason}
                            for h in history],
                "headers": letter.headers, "body": shown}, default=str))
    finally:
        store.close()
    return len(letters)


def dlq_replay(settings: Settings, queues: Sequence[str], message_id: str | None = None) -> int:
    """Put dead letters back on their original queue, attempts reset, error dropped; the job
    log marks them replayed."""
    return replay(settings, queues, message_id)


def dlq_purge(settings: Settings, queues: Sequence[str]) -> int:
    """Drop the dead letters of ``queues``; the job log marks them purged. Returns how many."""
    return purge(settings, queues)
