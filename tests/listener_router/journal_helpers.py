"""Helpers for the journal tests (``from journal_helpers import …``).

:class:`Journal` is one test's journal: publisher settings on unique queue
and stream names (the service runs workflows in-process), ``publish``
(push records and run the service until they are committed and their
entries are in the stream), subscriber rules, and the streams and queues
deleted afterwards.  ``record_apply`` is a subscriber callable whose
effects are *not* idempotent: one row per application, so a count above
one is an entry applied twice.
"""

from __future__ import annotations

import glob
import json
import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pika
import pytest
from listener_router_helpers import wait_until, write_test_workflows  # noqa: F401 (theirs too)
from sqlalchemy import create_engine, text

from listener_router import ListenerRule, RouterRule, Service, Settings
from listener_router.broker import AmqpLink, OutMessage, connection_parameters, declare_input
from listener_router.journal import JournalOutbox, JournalRule, Subscriber, SubscriberRule

APPLIED_DDL = ("CREATE TABLE IF NOT EXISTS applied (seq INTEGER, id TEXT, stream_offset INTEGER, "
               "version INTEGER, op TEXT)")


def record_apply(entries: list[Any], conn: Any) -> None:
    """A subscriber callable: one row per entry applied (duplicates would show)."""
    conn.execute(text(APPLIED_DDL))
    conn.execute(text("INSERT INTO applied VALUES (:seq, :id, :offset, :version, :op)"),
                 [{"seq": e.seq, "id": e.id, "offset": e.offset, "version": e.version,
                   "op": e.op} for e in entries])


def applied_rows(url: str) -> list[Any]:
    """``(seq, id, stream_offset, version, op)`` rows the callable wrote, in order."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            conn.execute(text(APPLIED_DDL))
            return list(conn.execute(text("SELECT seq, id, stream_offset, version, op FROM "
                                          "applied ORDER BY rowid")))
    finally:
        engine.dispose()


def applications(url: str) -> Counter[int]:
    """How often each entry (by number) was applied."""
    return Counter(row[0] for row in applied_rows(url))


def stream_bytes(stream: str) -> int | None:
    """Bytes of a stream's segment files on the local node (None: not on this machine)."""
    node = os.environ.get("CHALK_RMQ_NODE") or "rabbit"
    pattern = f"/var/lib/rabbitmq/mnesia/{node}@*/stream/__{stream.replace('.', '_')}_*"
    dirs = glob.glob(pattern)
    if not dirs:
        return None
    return sum(os.path.getsize(f) for d in dirs for f in glob.glob(f"{d}/*.segment"))


def read_entries(url: str, stream: str, offset: Any = "first") -> list[tuple[int, bytes]]:
    from listener_router.journal import read_stream
    return read_stream(url, stream, offset, idle=0.5)


class Journal:
    """One test's journal and its publisher (see module doc)."""

    def __init__(self, broker_url: str, tmp_path: Path, **journal: Any):
        tag = uuid.uuid4().hex[:8]
        self.tag = tag
        self.tmp = tmp_path
        self.db = f"sqlite:///{tmp_path / 'publisher.db'}"
        self.workflows = write_test_workflows(tmp_path / "workflows")
        self.rule = JournalRule(name=f"j{tag}", stream=f"t.{tag}.journal", **journal)
        self.queue = f"t.{tag}.in"
        self.settings = Settings(
            blackboard_url=self.db, broker_url=broker_url, workflows_dir=str(self.workflows),
            runner="local", listeners=(ListenerRule(name="t", queue=self.queue,
                                                    workflow="Counting", batch_size=200,
                                                    max_wait_ms=50),),
            routers=(RouterRule(queue=f"t.{tag}.out"),), node=f"pub-{tag}",
            journals=(self.rule,))
        self.published = 0
        self.subscribers: list[str] = []

    def with_journal(self, **changes: Any) -> None:
        self.rule = replace(self.rule, **changes)
        self.settings = replace(self.settings, journals=(self.rule,))

    def push(self, records: Sequence[dict[str, Any]], *, operation: str = "ADD") -> None:
        """Publish one message per record, its attributes in the message (nothing stored)."""
        def prepare(conn: Any) -> None:
            declare_input(conn, self.queue, self.settings)
        link = AmqpLink(self.settings.broker_url, consume=(), prepare=prepare).start()
        try:
            link.publish([OutMessage(routing_key=self.queue, message_id=f"m-{uuid.uuid4().hex}",
                                     headers={"operation": operation},
                                     body=json.dumps({"records": [r]}).encode())
                          for r in records]).result(timeout=120)
        finally:
            link.stop()

    def publish(self, records: Sequence[dict[str, Any]], *, operation: str = "ADD") -> None:
        """Push ``records`` and run the service until their entries are in the stream."""
        self.push(records, operation=operation)
        want = len(records)
        with Service(self.settings) as svc:
            svc.run(until=lambda stats: stats.counts.get("committed", 0) >= want, idle_exit=60)
            deadline = time.monotonic() + 60
            while svc.store.tables(JournalOutbox).pending(self.rule.name) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not svc.store.tables(JournalOutbox).pending(self.rule.name), "entries left unpublished"

    def subscriber(self, name: str, **values: Any) -> SubscriberRule:
        self.subscribers.append(name)
        values.setdefault("store", f"sqlite:///{self.tmp / (name + '.db')}")
        values.setdefault("backoff_ms", (50,))
        values.setdefault("status_every", 0.5)
        return SubscriberRule(id=name, journal=self.rule.name, **values)

    def run(self, rule: SubscriberRule, *, until: Callable[[Any], bool], idle_exit: float = 30.0,
            apply: Any = record_apply) -> Any:
        with Subscriber(self.settings, rule, apply=apply) as sub:
            return sub.run(until=until, idle_exit=idle_exit)

    def start(self, rule: SubscriberRule, apply: Any = record_apply) -> RunningSubscriber:
        return RunningSubscriber(Subscriber(self.settings, rule, apply=apply))

    def queues(self) -> list[str]:
        names = [self.rule.stream, self.rule.status_stream, self.queue, f"t.{self.tag}.out"]
        names += [f"{q}.dlq" for q in (self.queue, f"t.{self.tag}.out")]
        names += [f"{self.queue}.retry.{i}" for i in range(1, 4)]
        return names + [self.rule.error_queue(s) for s in self.subscribers]

    def delete(self) -> None:
        conn = pika.BlockingConnection(connection_parameters(self.settings.broker_url))
        try:
            channel = conn.channel()
            for name in self.queues():
                channel.queue_delete(name)
        except pika.exceptions.AMQPError:
            pass
        finally:
            if conn.is_open:
                conn.close()


class RunningSubscriber:
    """A subscriber agent on a thread of the test (``stop()`` ends it)."""

    def __init__(self, subscriber: Subscriber):
        self.subscriber = subscriber.open()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.subscriber.run()
        except BaseException as e:  # surfaced by stop()
            self.error = e

    @property
    def stats(self) -> Any:
        return self.subscriber.stats

    def stop(self) -> Any:
        self.subscriber.request_stop()
        self.thread.join(60)
        self.subscriber.close()
        if self.error is not None:
            raise self.error
        return self.subscriber.stats


def records(n: int, prefix: str = "doc", **attributes: Any) -> list[dict[str, Any]]:
    return [{"id": f"{prefix}-{i}", "attributes": {"text": f"text {i}", **attributes}}
            for i in range(n)]


@pytest.fixture(name="journal")
def journal_fixture(broker_url: str, tmp_path: Path) -> Iterator[Journal]:
    made = Journal(broker_url, tmp_path)
    yield made
    made.delete()
