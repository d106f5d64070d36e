"""Pipelined batches: a record in several batches in flight is applied once per message, in turn."""

from __future__ import annotations

import threading

import pytest
from listener_router_helpers import publish_ids, stored_counts, write_test_workflows

from listener_router.broker import dlq_name
from listener_router.pipeline import InFlight

pytestmark = [pytest.mark.broker, pytest.mark.spark]

RECORDS = 40
ROUNDS = 12


@pytest.mark.parametrize(("concurrent", "local_below"), [(1, 0), (2, 0), (2, 16)])
def test_a_record_in_many_batches_is_counted_once_per_message(make_settings, run_service,
                                                                 broker, tmp_path, declare,
                                                                 concurrent, local_below):
    workflows = write_test_workflows(tmp_path / "workflows")
    settings = make_settings("Counting", workflows_dir=workflows, batch_size=15, max_wait_ms=20,
                             create_missing=True)
    # local_below 16: every batch runs in the service's process, two at once
    settings = settings.with_overrides(concurrent_batches=concurrent, local_below=local_below)
    queue = settings.listeners[0].queue
    declare(settings)
    ids = [f"p{i:03d}" for i in range(RECORDS)]
    # Round after round over the same records: consecutive batches (gathered while
    # the one before runs) keep sharing records, and must wait for each other.
    messages = [rid for _round in range(ROUNDS) for rid in ids]  # a message ID each
    publish_ids(settings, messages, prefix="pipe")

    stats = run_service(settings, until=lambda s: s["committed"] >= len(messages), idle_exit=60)

    assert stats["committed"] == len(messages)
    assert stats["local_batches"] == (stats["batches"] if local_below else 0)
    assert broker.depth(dlq_name(queue)) == 0
    assert stored_counts(settings.blackboard_url, ids) == {ROUNDS: RECORDS}


def test_in_flight_waits_for_an_earlier_holder_and_not_for_its_own():
    inflight = InFlight(renew=lambda ids: None, interval=60.0)
    earlier, mine = object(), object()
    inflight.reserve(["a", ("message", "q", "m1")], earlier)
    inflight.reserve(["b"], mine)
    stop = threading.Event()
    assert inflight.wait_free(["b"], mine, stop)
    released = threading.Timer(0.2, lambda: inflight.release(["a", ("message", "q", "m1")]))
    released.start()
    assert inflight.wait_free(["a", "b"], mine, stop)
    assert inflight.holders(["a", "b"]) == {mine}
    released.join()
    inflight.reserve(["c"], earlier)
    stop.set()
    assert not inflight.wait_free(["c"], mine, stop)


def test_in_flight_renews_the_leases_of_reserved_records_only():
    renewed: list[list[str]] = []
    done = threading.Event()

    def renew(ids: list[str]) -> None:
        renewed.append(sorted(ids))
        done.set()

    inflight = InFlight(renew=renew, interval=0.05).start()
    try:
        inflight.reserve(["r1", "r2", ("message", "q", "m")], object())
        assert done.wait(5)
    finally:
        inflight.stop()
    assert renewed[0] == ["r1", "r2"]
