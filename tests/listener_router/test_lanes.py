"""Lanes: a slow lane holds back no other, and a message waiting for a record in flight
waits for that batch's commit, not for a timer, and holds back nothing behind it."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from listener_router_helpers import stored_counts, write_test_workflows

from listener_router import BatchObserver, ListenerRule, RouterRule, Service, push_records
from listener_router.pipeline import SLOW_AFTER


class Finished(BatchObserver):
    """When each batch of each lane finished, and its committed messages."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.batches: list[tuple[str, float, int]] = []

    def batch_finished(self, report):
        with self.lock:
            self.batches.append((report.lane, time.monotonic(), report.states()["committed"]))

    def of(self, lane: str) -> list[tuple[float, int]]:
        with self.lock:
            return [(at, n) for q, at, n in self.batches if q == lane]


@pytest.mark.broker
@pytest.mark.slow
def test_a_slow_lane_holds_back_no_other_lane(tmp_path, make_settings, qname, declare, spark):
    workflows = write_test_workflows(tmp_path / "workflows")
    slow, steady = qname("slow"), qname("steady")
    settings = make_settings(workflows_dir=workflows, rules=(
        ListenerRule(name="slow", queue=slow, workflow="Slow", batch_size=1, max_wait_ms=10),
        ListenerRule(name="steady", queue=steady, workflow="Counting", max_wait_ms=10)),
        routers=(RouterRule(queue=qname("out")),))
    declare(settings)
    tag = uuid.uuid4().hex[:6]
    seconds = 3 * SLOW_AFTER
    push_records(settings, slow, [{"id": f"s{tag}-{i}", "attributes": {"sleep": seconds}}
                                  for i in range(2)])
    finished = Finished()
    steady_ids = [f"t{tag}-{i}" for i in range(20)]
    published: dict[str, float] = {}

    def offer() -> None:  # steady traffic while the slow lane's batches run
        time.sleep(1.0)
        for rid in steady_ids:
            published[rid] = time.monotonic()
            push_records(settings, steady, [{"id": rid, "attributes": {"n": 1}}])
            time.sleep(0.1)

    producer = threading.Thread(target=offer)
    with Service(settings, spark=spark, observers=[finished]) as service:
        producer.start()
        service.run(until=lambda s: s["committed"] >= 22, idle_exit=120)
    producer.join()
    slow_done = [at for at, n in finished.of(slow) if n]
    steady_done = finished.of(steady)
    assert len(slow_done) == 2 and sum(n for _at, n in steady_done) == 20
    # Every steady message was committed while the slow lane's batches still ran
    # (one after the other: its lane runs one batch at a time until it turns slow)...
    assert max(at for at, _n in steady_done) < max(slow_done)
    # ... and none of them waited for a slow batch: within a couple of seconds each.
    last_published = max(published.values())
    assert max(at for at, _n in steady_done) - last_published < SLOW_AFTER + 2.0
    assert stored_counts(settings.blackboard_url, steady_ids) == {1: 20}


@pytest.mark.broker
@pytest.mark.slow
def test_messages_sharing_a_record_wait_for_its_commit_and_no_one_waits_behind_them(
        tmp_path, make_settings, declare, spark):
    workflows = write_test_workflows(tmp_path / "workflows")
    settings = make_settings("Counting", workflows_dir=workflows, max_wait_ms=20)
    declare(settings)
    queue = settings.listeners[0].queue
    tag = uuid.uuid4().hex[:6]
    shared = f"shared-{tag}"
    others = [f"o{tag}-{i}" for i in range(50)]
    # Twelve messages naming one record, then fifty that name others: the twelve can only
    # run one per batch, and the fifty must not wait for them.
    for i in range(12):
        push_records(settings, queue, [{"id": shared, "attributes": {"n": 1}}], store=i == 0)
    push_records(settings, queue, [{"id": rid, "attributes": {"n": 1}} for rid in others])
    finished = Finished()
    started = time.monotonic()
    with Service(settings, spark=spark, observers=[finished]) as service:
        service.run(until=lambda s: s["committed"] >= 62, idle_exit=120)
    took = time.monotonic() - started
    assert stored_counts(settings.blackboard_url, [shared]) == {12: 1}
    assert stored_counts(settings.blackboard_url, others) == {1: 50}
    # No hold waited on a timer: twelve batches in a row take as long as twelve batches.
    assert took < 60
    assert service.stats["parked"] >= 11 and service.stats["deferred"] == 0
