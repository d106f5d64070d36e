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
    # local_below 16: every batch runs on the service's workers, two at once
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


def test_a_message_naming_a_key_in_flight_is_parked_and_woken_in_order_at_its_release():
    inflight = InFlight(renew=lambda ids: None, interval=60.0)
    earlier, mine = object(), object()
    woken: list[str] = []
    assert inflight.take_or_park(["a", ("message", "q", "m1")], earlier, "m1", woken.extend)
    assert not inflight.take_or_park(["b", "a"], mine, "m2", woken.extend)  # a is held: parked
    assert not inflight.take_or_park(["a"], mine, "m3", woken.extend)
    assert inflight.take_or_park(["b"], mine, "m4", woken.extend)   # b was not taken by m2
    assert woken == [] and inflight.parked() == 2
    inflight.release(["a", ("message", "q", "m1")])                  # an event, not a timer
    assert woken == ["m2"] and inflight.parked() == 1   # a is m2's; m3 waits behind it
    assert not inflight.take_or_park(["a"], earlier, "m6", woken.extend)  # not m6's
    assert not inflight.take_or_park(["b"], earlier, "m5", woken.extend)  # m4 holds b
    assert inflight.unpark_all() == ["m3", "m6", "m5"] and len(inflight) == 2


def test_a_released_ordered_key_goes_to_the_first_message_in_line_not_to_a_later_one():
    """An ordered queue: the key is handed to the first parked message; one gathered before
    it came back (a later version of the record) parks behind the rest, never overtakes."""
    inflight = InFlight(renew=lambda ids: None, interval=60.0)
    woken: list[str] = []
    first, second = object(), object()
    assert inflight.take_or_park(["k"], first, "v1", woken.extend, fifo=True)
    assert not inflight.take_or_park(["k"], second, "v2", woken.extend, fifo=True)
    assert not inflight.take_or_park(["k"], second, "v3", woken.extend, fifo=True)
    inflight.release(["k"])
    assert woken == ["v2"]                     # v2 alone: v3 stays in line behind it
    assert not inflight.take_or_park(["k"], second, "v4", woken.extend, fifo=True)  # later
    assert inflight.take_or_park(["k"], second, "v2", woken.extend, fifo=True)      # its own
    inflight.release(["k"])
    assert woken == ["v2", "v3"]
    inflight.drop(["v3"])                      # v3's connection went: v4 is next
    assert woken == ["v2", "v3", "v4"]
    assert inflight.take_or_park(["k"], second, "v4", woken.extend, fifo=True)


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
