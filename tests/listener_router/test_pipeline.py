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
    assert not inflight.take_or_park(["b"], mine, "m4", woken.extend)  # m2 waits for b first
    assert woken == [] and inflight.parked() == 3
    inflight.release(["a", ("message", "q", "m1")])                  # an event, not a timer
    assert woken == ["m2"]             # first in both its lines; m3 and m4 wait behind it
    assert not inflight.take_or_park(["a"], earlier, "m5", woken.extend)   # a later one
    assert inflight.take_or_park(["b", "a"], mine, "m2", woken.extend)     # m2 comes back
    inflight.release(["b", "a"])
    assert woken[0] == "m2" and sorted(woken[1:]) == ["m3", "m4"]   # each first in its line
    assert inflight.unpark_all() == ["m3", "m4", "m5"] and len(inflight) == 0


def test_a_released_key_goes_to_the_first_message_in_line_not_to_a_later_one():
    """The key is the first parked message's; one gathered before that one came back (a
    later version of the record) waits behind the rest, never overtakes them."""
    inflight = InFlight(renew=lambda ids: None, interval=60.0)
    woken: list[str] = []
    first, second = object(), object()
    assert inflight.take_or_park(["k"], first, "v1", woken.extend)
    assert not inflight.take_or_park(["k"], second, "v2", woken.extend)
    assert not inflight.take_or_park(["k"], second, "v3", woken.extend)
    inflight.release(["k"])
    assert woken == ["v2"]                     # v2 alone: v3 stays in line behind it
    assert not inflight.take_or_park(["k"], second, "v4", woken.extend)  # later: behind v3
    assert inflight.take_or_park(["k"], second, "v2", woken.extend)      # its turn
    inflight.release(["k"])
    assert woken == ["v2", "v3"]
    inflight.drop(["v3"])                      # v3's connection went: v4 is next
    assert woken == ["v2", "v3", "v4"]
    assert inflight.take_or_park(["k"], second, "v4", woken.extend)


def test_two_messages_that_share_two_keys_never_wait_for_each_other():
    """E waits for r1, A (later) for r0: each is handed back only when it is first in every
    line it is in, so E goes, then A (no key is handed to one while the other holds it)."""
    inflight = InFlight(renew=lambda ids: None, interval=60.0)
    woken: list[str] = []
    y, x, batch = object(), object(), object()
    assert inflight.take_or_park(["r1"], y, "Y", woken.extend)
    assert not inflight.take_or_park(["r0", "r1"], batch, "E", woken.extend)
    assert not inflight.take_or_park(["r0"], x, "X", woken.extend)  # r0 free, but E is first
    assert not inflight.take_or_park(["r0", "r1"], batch, "A", woken.extend)
    inflight.release(["r1"])
    assert woken == ["E"]
    assert inflight.take_or_park(["r0", "r1"], batch, "E", woken.extend)
    inflight.release(["r0", "r1"])
    assert woken == ["E", "X"]              # X was before A in r0's line; A waits for X
    assert inflight.take_or_park(["r0"], x, "X", woken.extend)
    inflight.release(["r0"])
    assert woken == ["E", "X", "A"]


def test_a_retry_goes_before_the_messages_that_wait_for_it():
    inflight = InFlight(renew=lambda ids: None, interval=60.0)
    woken: list[str] = []
    hold, batch = ("retry", "m1"), object()
    inflight.reserve([("order", "k")], hold)           # m1 failed: its key waits for its retry
    assert not inflight.take_or_park([("order", "k"), "r"], batch, "m2", woken.extend)
    assert inflight.take_or_park([("order", "k"), "r"], batch, "m1 again", woken.extend,
                                 mine=hold)             # r is free: the retry goes first
    inflight.release([("order", "k"), "r"])
    assert woken == ["m2"]


def test_a_message_settled_before_it_came_back_leaves_its_lines():
    """Cancelled while parked (or its rule gone): it never takes its keys, and the next in
    line goes."""
    inflight = InFlight(renew=lambda ids: None, interval=60.0)
    woken: list[str] = []
    batch = object()
    assert inflight.take_or_park(["k"], batch, "m1", woken.extend)
    assert not inflight.take_or_park(["k"], batch, "m2", woken.extend)
    assert not inflight.take_or_park(["k"], batch, "m3", woken.extend)
    inflight.release(["k"])
    assert woken == ["m2"]
    inflight.drop(["m2"])                      # gathered again, cancelled meanwhile
    assert woken == ["m2", "m3"] and inflight.parked() == 1
    assert inflight.take_or_park(["k"], batch, "m3", woken.extend) and inflight.parked() == 0


def test_a_chunk_taken_at_once_waits_in_the_same_lines_as_one_message_at_a_time():
    """take_or_park_each (a gathered chunk, one hold of the lock) answers as take_or_park
    does message by message: a free key with a message before it in its line is not taken,
    a key the chunk itself took parks the next one, a retry takes its own hold."""
    inflight = InFlight(renew=lambda ids: None, interval=60.0)
    woken: list[str] = []
    y, batch, hold = object(), object(), ("retry", "R")
    assert inflight.take_or_park(["r1"], y, "Y", woken.extend)
    inflight.reserve([("order", "k")], hold)
    took = inflight.take_or_park_each([(["r0", "r1"], "E", None), (["r0"], "X", None),
                                       (["r2"], "F", None), (["r2"], "G", None),
                                       ([("order", "k"), "r3"], "R", hold)],
                                      batch, woken.extend)
    assert took == [False, False, True, False, True]  # X: r0 is free, but E is first
    assert inflight.parked() == 3
    inflight.release(["r1"])
    assert woken == ["E"]
    assert inflight.take_or_park_each([(["r0", "r1"], "E", None)], batch, woken.extend) == [True]
    inflight.release(["r0", "r1", "r2"])
    assert sorted(woken) == ["E", "G", "X"]


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
