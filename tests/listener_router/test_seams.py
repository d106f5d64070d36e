"""The seams the next features plug into: commit extensions, batch reports, leader tasks, sizing,
screening (records settled without a run)."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from listener_router_helpers import (
    records_of,
    stored_attributes,
    stored_counts,
    write_test_workflows,
)
from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine, func, select

from listener_router import (
    BatchObserver,
    BatchReport,
    BatchSizing,
    Commit,
    CommitExtension,
    LeaderTask,
    Plugin,
    Service,
    push_records,
)
from listener_router.broker import OutMessage
from listener_router.jobs import JobLogTables
from listener_router.pipeline import Screen

pytestmark = [pytest.mark.broker, pytest.mark.spark]

RECORDS = 40

job_log = Table("test_job_log", MetaData(),
                Column("id", Integer, primary_key=True, autoincrement=True),
                Column("workflow", String(64), nullable=False),
                Column("messages", Integer, nullable=False),
                Column("records", Integer, nullable=False))


class JobLog(CommitExtension):
    """A row per commit transaction, and an event per commit to a topic exchange."""

    def __init__(self, events_key: str, fail_first: int = 0):
        self.events_key = events_key
        self.fail_first = fail_first
        self.calls = 0

    def in_transaction(self, commit: Commit) -> None:
        self.calls += 1
        commit.connection.execute(job_log.insert().values(
            workflow=commit.workflow, messages=len(commit.committed),
            records=len(commit.committed_ids)))
        first = commit.committed[0].message.message_id  # type: ignore[union-attr]
        commit.publish(OutMessage(exchange="amq.topic", routing_key=self.events_key,
                                  message_id=f"event:{first}",
                                  body=json.dumps({"records": [{"id": f"batch-of-{first}"}],
                                                   "messages": len(commit.committed)}).encode()))
        if self.calls <= self.fail_first:
            raise RuntimeError("the job log is not ready")


class Reports(BatchObserver):
    def __init__(self) -> None:
        self.reports: list[BatchReport] = []

    def batch_finished(self, report: BatchReport) -> None:
        self.reports.append(report)


class Broken(BatchObserver):
    def batch_finished(self, report: BatchReport) -> None:
        raise RuntimeError("observer bug")


@pytest.fixture
def counting(make_settings, tmp_path):
    workflows = write_test_workflows(tmp_path / "workflows")
    settings = make_settings("Counting", workflows_dir=workflows, batch_size=15, max_wait_ms=50)
    engine = create_engine(settings.blackboard_url)
    job_log.metadata.create_all(engine)
    engine.dispose()
    return settings


@pytest.fixture
def events(broker, qname) -> str:
    """A queue bound to amq.topic under its own name: where JobLog's events arrive."""
    queue = qname("events")
    broker.bind(queue, "amq.topic", queue)
    return queue


def push(settings, prefix: str) -> list[dict[str, Any]]:
    data = [{"id": f"{prefix}{i:03d}", "attributes": {}} for i in range(RECORDS)]
    push_records(settings, settings.listeners[0].queue, data)
    return data


def _logged(url: str) -> tuple[int, int]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            rows, messages = conn.execute(select(func.count(), func.sum(job_log.c.messages))).one()
    finally:
        engine.dispose()
    return rows, messages or 0


def test_extensions_write_and_publish_in_the_commit_and_observers_get_each_batch(
        counting, run_service, broker, events):
    push(counting, "x")
    log, reports = JobLog(events), Reports()
    stats = run_service(counting, until=lambda s: s["committed"] >= RECORDS,
                        extensions=[log], observers=[Broken(), reports])

    assert stats["committed"] == RECORDS
    rows, messages = _logged(counting.blackboard_url)
    assert (rows, messages) == (log.calls, RECORDS)  # every commit wrote its row, once
    arrived = broker.drain(events)
    assert len(arrived) == rows  # one event per commit, published with its batch
    assert sum(json.loads(body)["messages"] for _props, body in arrived) == RECORDS
    assert len(broker.drain(counting.routers[0].queue)) == RECORDS  # routing unchanged
    # a failing observer is logged; the others still get every batch
    assert sum(r.states()["committed"] for r in reports.reports) == RECORDS
    assert sum(r.records[("Counting", "committed")] for r in reports.reports) == RECORDS
    assert len(reports.reports) == stats["batches"]
    for report in reports.reports:
        assert {"receive", "load", "run", "commit", "publish", "batch"} <= set(report.seconds)
        assert report.messages and report.size_limit == 15 and report.finished >= report.opened
        assert report.published >= report.states()["committed"]


def test_a_failing_extension_rolls_its_batch_back_and_the_batch_is_tried_again(
        counting, run_service, broker, events):
    data = push(counting, "f")
    log = JobLog(events, fail_first=2)
    stats = run_service(counting, until=lambda s: s["committed"] >= RECORDS, extensions=[log])

    assert stats["committed"] == RECORDS and stats["deferred"] > 0
    rows, messages = _logged(counting.blackboard_url)
    assert rows == log.calls - 2 and messages == RECORDS  # the failed ones wrote nothing
    assert len(broker.drain(events)) == rows  # nor published anything
    assert stored_counts(counting.blackboard_url, [r["id"] for r in data]) == {1: RECORDS}
    assert sorted(r["id"] for r in records_of(broker.drain(counting.routers[0].queue))) == \
        sorted(r["id"] for r in data)


class Counted(LeaderTask):
    name, every = "counted", 0.1

    def __init__(self) -> None:
        self.runs = 0

    def run(self) -> int:
        self.runs += 1
        return self.runs


class Failing(LeaderTask):
    name = "failing"

    def run(self) -> int:
        raise RuntimeError("task bug")


def test_leader_tasks_run_with_the_maintenance_and_a_failing_one_stops_nothing(
        make_settings, spark):
    counted = Counted()
    with Service(make_settings(), spark=spark, leader_tasks=[Failing(), counted]) as service:
        assert service.membership is not None and service.membership.is_leader
        done = service.maintain()
        service.run(until=lambda _s: counted.runs >= 3, idle_exit=20)  # the loop runs it too
    assert {"expired_leases", "orphans", "retention", "forgotten_members", "counted"} <= set(done)
    assert "failing" not in done
    assert counted.runs >= 3


class Small(BatchSizing):
    """Batches of at most five messages, whatever the rule says."""

    def __init__(self) -> None:
        super().__init__(5, 0.05)
        self.seen: list[int] = []

    def batch_finished(self, report: BatchReport) -> None:
        self.seen.append(report.messages)


def test_a_batch_sizing_policy_decides_the_batch_size(counting, run_service):
    push(counting, "s")
    sizing = Small()
    stats: Any = run_service(counting, until=lambda s: s["committed"] >= RECORDS, sizing=sizing)

    assert stats["committed"] == RECORDS
    assert sizing.seen and max(sizing.seen) <= 5 and sum(sizing.seen) >= RECORDS


class SkipFlagged(Plugin):
    """Settles a record whose ``skip`` attribute is true without a run (``route`` too: it is
    routed as it is); the first ``fail_first`` screenings raise."""

    name = "skip_flagged"

    def __init__(self, fail_first: int = 0) -> None:
        self.fail_first = fail_first
        self.calls = 0
        self.steps: list[tuple[str, int]] = []   # (step of each committed message, records)

    def screen(self, screen: Screen) -> None:
        self.calls += 1
        if self.calls <= self.fail_first:
            raise RuntimeError("the screen is not ready")
        bb = screen.blackboard
        for w in screen.works:
            for rid in w.message.record_ids:  # type: ignore[union-attr]
                flags = bb.get_attributes(rid, ["skip", "route"])
                if flags.get("skip"):
                    screen.settle(w, [rid], step="skipped", route=bool(flags.get("route")))

    def in_commit(self, commit: Commit) -> None:
        self.steps += [(w.step or "committed", len(w.message.record_ids))  # type: ignore[union-attr]
                       for w in commit.committed]


def test_a_plug_in_settles_records_without_a_run_and_whole_messages_commit_without_one(
        counting, run_service, broker):
    # 12 messages of 3 records: in 4 every record is skipped (2 of them routed), in 4 one
    # record is, in 4 none is.
    data = [{"id": f"s{m:02d}{i}",
             "attributes": {"skip": m < 4 or (m < 8 and i == 0), "route": m < 2}}
            for m in range(12) for i in range(3)]
    push_records(counting, counting.listeners[0].queue, data, per_message=3)
    screen = SkipFlagged(fail_first=1)
    stats = run_service(counting, until=lambda s: s["committed"] + s["skipped"] >= 12,
                        plugins=[screen])

    assert (stats["committed"], stats["skipped"], stats["records_committed"]) == (8, 4, 8 * 3 - 4)
    assert stats["deferred"] >= 1                       # the failed screening held its messages
    assert sorted(screen.steps) == sorted([("skipped", 3)] * 4 + [("committed", 2)] * 4
                                          + [("committed", 3)] * 4)
    counts = stored_attributes(counting.blackboard_url, [r["id"] for r in data], ["count"])
    skipped = {r["id"] for r in data if r["attributes"]["skip"]}
    assert {rid for rid, a in counts.items() if a.get("count") is None} == skipped  # never run
    assert all(a["count"] == 1 for rid, a in counts.items() if rid not in skipped)
    routed = sorted(r["id"] for r in records_of(broker.drain(counting.routers[0].queue)))
    assert routed == sorted([f"s{m:02d}{i}" for m in range(2) for i in range(3)]
                            + [r["id"] for r in data if r["id"] not in skipped])
    tables = JobLogTables(create_engine(counting.blackboard_url))
    assert Counter(e.state for e in tables.entries(limit=100)) == {"committed": 8, "skipped": 4}
    assert len(tables.entries(states=["skipped"], limit=100)) == 4
    (first,) = tables.entries(record="s000", limit=10)
    assert (first.state, first.records) == ("skipped", 3)
    (partial,) = tables.entries(record="s040", limit=10)    # skipped, in a message that ran
    assert (partial.state, partial.records) == ("committed", 3)
