"""Distributed events on chalk.events: one per committed record, one per failed record and
dead letter, none for a rolled-back commit, followed live by ``chalk events --follow``.

The service runs in this process on the session's Spark; the kill-9 version
(three service processes) is in test_failover.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from listener_router_helpers import bind_subscriber, write_config, write_test_workflows

from listener_router import Commit, CommitExtension, push_records
from listener_router.broker import EVENT_TOPIC_HEADER, AmqpLink, OutMessage, connect
from listener_router.events import EventKind, EventSettings, event_id

pytestmark = [pytest.mark.broker, pytest.mark.spark]

ALL = EventSettings(committed=True, invalidated=True, dead_lettered=True)


@pytest.fixture
def subscriber(broker, qname) -> str:
    """A durable queue bound to chalk.events with '#': every event from now on."""
    queue = qname("events")
    bind_subscriber(broker.url, queue)
    return queue


def events_by_kind(messages) -> dict[str, list[tuple[str, dict, dict]]]:
    found: dict[str, list[tuple[str, dict, dict]]] = {}
    for props, body in messages:
        content = json.loads(body)
        found.setdefault(content["event"], []).append((props.message_id, content, props.headers))
    return found


class FailOnce(CommitExtension):
    """Rolls the first commit transaction back (as a failing job log would)."""

    def __init__(self) -> None:
        self.calls = 0

    def in_transaction(self, commit: Commit) -> None:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("not yet")


def test_each_committed_record_has_one_event_and_each_failure_its_own(
        make_settings, tmp_path, run_service, broker, subscriber):
    workflows = write_test_workflows(tmp_path / "workflows")
    settings = make_settings("Fragile", workflows_dir=workflows, batch_size=20,
                             max_wait_ms=50, max_retries=0).with_section("events", ALL)
    queue = settings.listeners[0].queue
    data = [{"id": f"e{i:03d}", "attributes": {"fail": i % 10 == 0}} for i in range(40)]
    push_records(settings, queue, data)
    broker.publish(queue, "not json", message_id="bad-1")
    stats = run_service(settings, until=lambda s: s["committed"] + s["dead"] >= 41,
                        extensions=[FailOnce()])
    assert (stats["committed"], stats["dead"]) == (36, 5)

    found = events_by_kind(broker.drain(subscriber))
    good = sorted(r["id"] for r in data if not r["attributes"]["fail"])
    bad = sorted(r["id"] for r in data if r["attributes"]["fail"])
    committed = found["record.committed"]
    # exactly one per committed record, even with the first commit rolled back
    assert sorted(body["record"] for _mid, body, _h in committed) == good
    assert len({mid for mid, _body, _h in committed}) == len(committed)
    mid, body, headers = committed[0]
    assert headers["event.application"] == settings.node == body["application"]
    assert mid == event_id(EventKind.COMMITTED, queue, body["message_id"], body["record"])
    assert body["workflow"] == "Fragile" and body["operation"] == "ADD"

    invalidated = found["record.invalidated"]
    assert sorted(body["record"] for _mid, body, _h in invalidated) == bad
    assert {(body["state"], body["attempt"]) for _mid, body, _h in invalidated} == {("dead", 1)}
    assert all("asked to fail" in body["error"] for _mid, body, _h in invalidated)

    dead = found["message.dead_lettered"]
    assert len(dead) == 5 and {body["queue"] for _mid, body, _h in dead} == {queue}
    assert "bad-1" in {body["message_id"] for _mid, body, _h in dead}
    assert set(found) == {"record.committed", "record.invalidated", "message.dead_lettered"}


def test_no_events_are_written_when_they_are_off(make_settings, tmp_path, run_service, broker,
                                                 subscriber):
    workflows = write_test_workflows(tmp_path / "workflows")
    settings = make_settings("Fragile", workflows_dir=workflows, max_retries=0)
    push_records(settings, settings.listeners[0].queue,
                 [{"id": "off1", "attributes": {}}, {"id": "off2", "attributes": {"fail": True}}])
    run_service(settings, until=lambda s: s["committed"] + s["dead"] >= 2)
    assert broker.drain(subscriber) == []


def test_chalk_events_follow_prints_the_events_live(make_settings, tmp_path, run_service, broker_url):
    workflows = write_test_workflows(tmp_path / "workflows")
    settings = make_settings("Counting", workflows_dir=workflows).with_section("events",
        EventSettings(committed=True))
    config = write_config(tmp_path / "chalk.toml", db=settings.blackboard_url, broker=broker_url,
                          workflows=workflows, listeners=[], routers=[])
    follower = subprocess.Popen(
        [sys.executable, "-m", "listener_router", "events", "--config", str(config), "--follow",
         "--pattern", "record.committed.Counting", "--json", "--count", "3"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert "following chalk.events (record.committed.Counting)" in follower.stderr.readline()
        push_records(settings, settings.listeners[0].queue,
                     [{"id": f"f{i}", "attributes": {}} for i in range(3)])
        run_service(settings, until=lambda s: s["committed"] >= 3)
        out, err = follower.communicate(timeout=60)
    finally:
        follower.kill()
    assert follower.returncode == 0, err
    lines = json.loads(out)   # --count with --json: one array, at the end
    assert sorted(e["body"]["record"] for e in lines) == ["f0", "f1", "f2"]
    assert Counter(e["routing_key"] for e in lines) == {"record.committed.Counting": 3}
    assert {e["application"] for e in lines} == {settings.node}


def test_chalk_events_without_follow_says_what_to_do(tmp_path: Path):
    done = subprocess.run([sys.executable, "-m", "listener_router", "events"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 2
    assert "chalk events: give --follow" in done.stderr


def test_an_event_nobody_listens_to_is_quiet_and_an_unroutable_message_is_loud(
        broker_url, qname, caplog):
    """A topic exchange without subscribers returns every event: that is normal, not a
    lost message; a routed message the broker returns is one, and is logged as an error."""
    exchange = qname("nobody-listens")
    connection = connect(broker_url)
    try:
        connection.channel().exchange_declare(exchange, exchange_type="topic", durable=False,
                                              auto_delete=False)
        link = AmqpLink(broker_url, consume=()).start()
        try:
            with caplog.at_level("DEBUG", logger="listener_router.broker._link"):
                link.publish([OutMessage(routing_key="topology.changed", body=b"{}",
                                         message_id="evt:quiet", exchange=exchange,
                                         headers={EVENT_TOPIC_HEADER: "topology.changed"}),
                              OutMessage(routing_key="some.key", body=b"{}",
                                         message_id="out:lost", exchange=exchange)]
                             ).result(timeout=30)
            errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
            assert link.returned == 1
            assert len(errors) == 1 and "out:lost" in errors[0] and "unroutable" in errors[0]
            assert any("evt:quiet" in r.getMessage() and "no subscriber" in r.getMessage()
                       for r in caplog.records if r.levelname == "DEBUG")
        finally:
            link.stop()
    finally:
        connection.channel().exchange_delete(exchange)
        connection.close()
