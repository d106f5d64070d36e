"""One record's whole way: push → RabbitMQ → blackboard → Spark workflow → commit → route."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from listener_router_helpers import records_of, write_test_workflows

from blackboard import Blackboard
from listener_router import push_records
from listener_router.broker import dlq_name
from listener_router.cli._demo import sample_records

pytestmark = [pytest.mark.broker, pytest.mark.spark]


def test_thousand_records_are_committed_and_routed_exactly_once(make_settings, run_service,
                                                                broker):
    settings = make_settings()
    rule, out_queue = settings.listeners[0], settings.routers[0].queue
    data = sample_records(1000)
    push_records(settings, rule.queue, data)
    started = time.monotonic()
    stats = run_service(settings, until=lambda s: s["committed"] >= 1000)
    elapsed = time.monotonic() - started
    print(f"\n1,000 records end to end: {elapsed:.2f} s, {1000 / elapsed:.0f} records/s "
          f"({stats['batches']} batches)")

    assert stats["committed"] == 1000
    routed = records_of(broker.drain(out_queue))
    ids = [r["id"] for r in routed]
    assert sorted(ids) == sorted(r["id"] for r in data)
    assert len(ids) == len(set(ids))
    assert broker.depth(rule.queue) == 0
    assert broker.depth(dlq_name(rule.queue)) == 0
    by_id = {r["id"]: r for r in routed}
    with Blackboard.connect(settings.blackboard_url) as bb:
        ids = [r["id"] for r in data]
        bb.load_many(ids)
        for record in data:
            expected = " ".join(record["attributes"]["text"].split()).lower()
            stored = bb.get_attributes(record["id"])
            assert stored["text"] == expected
            assert stored["words"] == len(expected.split())
            assert by_id[record["id"]]["attributes"] == {"text": expected,
                                                         "words": len(expected.split())}
        bb.invalidate_many(ids)


@pytest.fixture
def fragile_workflows(tmp_path: Path) -> Path:
    return write_test_workflows(tmp_path / "workflows")


def test_failing_instances_are_invalidated_and_dead_lettered(make_settings, run_service, broker,
                                                              fragile_workflows):
    settings = make_settings("Fragile", workflows_dir=fragile_workflows, max_retries=1,
                             backoff_ms=(50,))
    rule, out_queue = settings.listeners[0], settings.routers[0].queue
    data = [{"id": f"r{i:03d}", "attributes": {"text": f"record {i}", "fail": i % 10 == 0}}
            for i in range(100)]
    push_records(settings, rule.queue, data)
    stats = run_service(settings, until=lambda s: s["committed"] + s["dead"] >= 100)

    assert stats["committed"] == 90 and stats["dead"] == 10
    assert stats["retrying"] == 10  # one retry each before the dead letter
    dead = broker.drain(dlq_name(rule.queue))
    assert len(dead) == 10
    for props, _body in dead:
        assert "asked to fail" in props.headers["x-chalk-error"]
        assert props.headers["x-chalk-workflow"] == "Fragile"
        assert props.headers["x-chalk-attempts"] == 2
    dead_ids = {r["id"] for r in records_of(dead)}
    assert dead_ids == {f"r{i:03d}" for i in range(0, 100, 10)}
    assert len(broker.drain(out_queue)) == 90
    with Blackboard.connect(settings.blackboard_url) as bb:
        bb.load_many([r["id"] for r in data])
        for record in data:
            count = bb.get_attributes(record["id"]).get("count")
            assert count == (None if record["id"] in dead_ids else 1), record["id"]
        bb.invalidate_many([r["id"] for r in data])
