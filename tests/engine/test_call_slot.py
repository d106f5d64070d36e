"""The call slot: a warm worker's run process tells each pipelet call in memory its
supervising task shares; the task reads the last one after the run process is gone.  The
stop slot: the other way, the records cancelled now, as the driver last said."""

from __future__ import annotations

import os
import signal
import time

from engine import PipeletCall
from engine._progress import CallSlot, StopSlot

CALL = PipeletCall("pipelet", "mod.Slow", "wf.bpel:14", "invokePipelet", "slow", ("r1", "r2"), 2)
NEXT = PipeletCall("pipelet", "mod.Crash", "wf.bpel:20", "invokePipelet", "crash", ("r1",), 1)


def in_child(slot: CallSlot, *calls: PipeletCall | None, hang: bool = False) -> None:
    """Fork a process that tells ``calls`` and exits (or hangs until killed); wait for it."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the run process
        os.close(read)
        for call in calls:
            slot.tell(call)
        os.write(write, b"x")
        if hang:
            signal.pause()
        os._exit(3)
    os.close(write)
    assert os.read(read, 1) == b"x"
    os.close(read)
    if hang:
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


def test_the_parent_reads_the_last_call_its_child_told_before_it_died() -> None:
    slot = CallSlot()
    in_child(slot, CALL, NEXT)
    assert PipeletCall.from_json(slot.read()) == NEXT


def test_a_killed_child_leaves_its_call_and_a_new_run_starts_with_none() -> None:
    slot = CallSlot()
    in_child(slot, CALL, hang=True)
    assert PipeletCall.from_json(slot.read()) == CALL
    slot.tell(None)  # the task, before the next request
    assert slot.read() == b""
    in_child(slot)   # a run that made no call
    assert slot.read() == b""


def test_a_write_cut_short_leaves_the_previous_call_whole() -> None:
    slot = CallSlot()
    slot.tell(CALL)
    # what a process killed in the middle of its next write leaves: the other half
    # half-written, the index not yet flipped
    other = 8 + (1 - slot._map[0]) * CallSlot._HALF
    slot._map[other:other + 12] = b"\x00\x00\x01\x00{garbage"
    assert PipeletCall.from_json(slot.read()) == CALL


def test_a_call_too_long_for_the_slot_keeps_its_pipelet_and_drops_its_record_ids() -> None:
    slot = CallSlot()
    huge = PipeletCall("pipelet", "mod.Big", "wf.bpel:3", "invokePipelet", "big",
                       tuple("r" * 5000 + str(i) for i in range(5)), 5)
    slot.tell(huge)
    told = PipeletCall.from_json(slot.read())
    assert (told.cls, told.where, told.name, told.records, told.count) == (
        "mod.Big", "wf.bpel:3", "big", (), 5)


def test_records_cancelled_are_seen_by_the_worker_and_withdrawn_ones_no_more() -> None:
    stops = StopSlot()
    read, write = os.pipe()
    ready, told = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker: asks at each "pipelet boundary"
        os.close(read)
        os.read(ready, 1)
        seen = sorted(stops.among(["a", "b", "c"]))
        os.read(ready, 1)                   # "a" and "b" withdrawn, "c" cancelled
        seen2 = sorted(stops.among(["a", "b", "c"]))
        os.write(write, ("|".join(seen) + ";" + "|".join(seen2)).encode())
        os._exit(0)
    os.close(write)
    assert stops.among(["a"]) == set()
    stops.replace(1, ["a", "b", "x"])
    os.write(told, b"1")
    time.sleep(0.2)
    stops.replace(2, ["c"])
    os.write(told, b"1")
    answer = os.read(read, 100).decode()
    os.waitpid(pid, 0)
    assert answer == "a|b;c"
    assert stops.current() == (2, frozenset({"c"}))


def test_a_set_too_large_for_the_stop_slot_keeps_whole_ids() -> None:
    stops = StopSlot()
    stops.replace(1, ["r" * 20000, "s" * 20000])
    stops.replace(2, ["r" * 20000, "s" * 20000])  # both halves are used in turn
    assert stops.among(["r" * 20000, "s" * 20000]) == {"r" * 20000}


def test_a_reader_never_takes_a_set_in_the_middle_of_its_write() -> None:
    stops = StopSlot()
    stops.replace(1, ["a"])
    assert stops.among(["a"]) == {"a"}
    # a writer between its two header writes: the sequence is odd, the set not yet whole
    seq, version, n, half = StopSlot._HEAD.unpack_from(stops._map, 0)
    StopSlot._HEAD.pack_into(stops._map, 0, seq + 1, 2, n, half)
    assert stops.current() == (1, frozenset({"a"}))  # the last whole set


def test_a_stop_slot_over_a_file_is_shared_by_processes_that_map_it(tmp_path) -> None:
    path = str(tmp_path / "stops")
    writer, reader = StopSlot(path), StopSlot(path)   # as a spawned worker maps it
    writer.replace(5, ["q"])
    assert reader.current() == (5, frozenset({"q"}))
