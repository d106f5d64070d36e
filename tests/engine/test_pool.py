"""The runner's worker processes, talked to straight, supervised from outside the conversation.

A worker killed between two frames of an answer leaves the answer short:
the driver drops it and reruns the chunk's instances, nothing lost or
doubled, on Spark's warm workers and on the service's own.  Chunks go to the
workers by priority.  A supervisor lost from outside costs no record.
Workers started as new interpreters (``spawn``) behave as forked ones.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import pipelet, records

from blackboard import Blackboard
from engine import InstanceResult, ProcessRunner, SparkRunner

pytestmark = [pytest.mark.slow]

CRASH = "<sequence>" + pipelet("crash", "Crash") + "</sequence>"
STAMP = "<sequence>" + pipelet("stamp", "Stamp") + "</sequence>"


def _pause_mid_answer(make_workflow: Any, marker: Path) -> Any:
    return make_workflow("<sequence>" + pipelet("pause", "PauseMidAnswer", marker=marker)
                         + "</sequence>", name="Pause")


def _kill_when_paused(marker: Path) -> threading.Thread:
    def kill() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if marker.exists() and marker.read_text().strip():
                os.kill(int(marker.read_text()), signal.SIGKILL)
                return
            time.sleep(0.05)

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread


def _run_with_a_kill_mid_answer(runner: Any, make_workflow: Any, tmp_path: Path) -> None:
    marker = tmp_path / "paused"
    wf = _pause_mid_answer(make_workflow, marker)
    bb = Blackboard.local()
    records(bb, {f"k{i}": {"counter": 10 * i} for i in range(6)})
    killer = _kill_when_paused(marker)
    results = runner.run(wf, bb, [[f"k{i}"] for i in range(6)])
    killer.join(5)
    assert marker.exists()  # a worker did stop mid-answer, and was killed there
    assert all(r.ok for r in results), [r.error for r in results]
    # each record counted exactly once: the half answer was dropped, never applied
    assert [bb.get_attributes(f"k{i}")["counter"] for i in range(6)] == [10 * i + 1 for i in range(6)]


@pytest.mark.spark
def test_a_warm_worker_killed_between_two_frames_of_its_answer_costs_a_rerun(
        spark: Any, make_workflow: Any, tmp_path: Path) -> None:
    runner = SparkRunner(spark, batch_timeout=20)
    assert runner.warm is not None
    _run_with_a_kill_mid_answer(runner, make_workflow, tmp_path)


def test_a_service_worker_killed_between_two_frames_of_its_answer_costs_a_rerun(
        make_workflow: Any, tmp_path: Path) -> None:
    runner = ProcessRunner(workers=2, batch_timeout=20)
    try:
        _run_with_a_kill_mid_answer(runner, make_workflow, tmp_path)
    finally:
        runner.close()


def test_chunks_go_to_the_workers_by_priority(make_workflow: Any) -> None:
    wf = make_workflow(STAMP, name="Stamped")
    runner = ProcessRunner(workers=1, batch_timeout=60)
    low, high = Blackboard.local(), Blackboard.local()
    records(low, {f"low{i}": {"sleep": 0.4} for i in range(6)})
    records(high, {"high": {}})
    try:
        runner.run(wf, high, [["high"]])  # the worker is up
        runner.costs.measured("Stamped")(200, 200 * 0.4)  # 0.4 s a record, as it is
        done: list[list[InstanceResult]] = []
        thread = threading.Thread(target=lambda: done.append(runner.run(
            wf, low, [[f"low{i}"] for i in range(6)], within=0.5)))
        thread.start()
        time.sleep(0.6)   # the first low chunk runs; the others wait for the one worker
        [result] = runner.run(wf, high, [["high"]], priority=5)
        thread.join(30)
    finally:
        runner.close()
    assert result.ok and all(r.ok for r in done[0])
    finished = sorted((low.get_attributes(f"low{i}")["done"], f"low{i}") for i in range(6))
    stamped = high.get_attributes("high")["done"]
    before = [rid for at, rid in finished if at < stamped]
    assert len(before) <= 2, (before, finished, stamped)  # it jumped the low chunks queued


def _eight_stamps_with(make_workflow: Any, signal_supervisor: Any) -> tuple[Any, Any, Any]:
    """Eight chunks of 0.3 s on two service workers, all of them ok; 0.5 s in,
    ``signal_supervisor(pid)``.  The runner (closed), its processes before and after."""
    wf = make_workflow(STAMP, name="Stamped")
    runner = ProcessRunner(workers=2, batch_timeout=60)
    bb = Blackboard.local()
    records(bb, {f"s{i}": {"sleep": 0.3} for i in range(8)})
    try:
        runner.run(wf, bb, [["s0"]])
        before = runner.pool.processes()
        [supervisor] = before
        timer = threading.Timer(0.5, signal_supervisor, (supervisor,))
        timer.start()
        results = runner.run(wf, bb, [[f"s{i}"] for i in range(8)])
        timer.join()
        after = runner.pool.processes()
    finally:
        runner.close()
    assert all(r.ok for r in results), [r.error for r in results]
    return runner, before, after


def test_a_supervisor_killed_from_outside_costs_no_record(make_workflow: Any) -> None:
    runner, before, after = _eight_stamps_with(make_workflow, lambda pid: os.kill(pid, signal.SIGKILL))
    assert runner.pool.requeued >= 1 and not set(before) & set(after)


def _term_family(pid: int) -> None:
    """SIGTERM to a process and its children, as a stop sent to the service's group does."""
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        children = [int(c) for c in f.read().split()]
    for p in (pid, *children):
        os.kill(p, signal.SIGTERM)


def test_a_stop_signal_to_the_group_leaves_the_chunks_running_to_the_service(
        make_workflow: Any) -> None:
    runner, before, after = _eight_stamps_with(make_workflow, _term_family)
    # nothing died: no chunk ran again, the same processes served to the end
    assert runner.pool.requeued == 0 and after == before


def test_workers_started_as_new_interpreters_behave_as_forked_ones(
        make_workflow: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv("CHALK_WORKER_START", "spawn")
    wf = make_workflow(CRASH)
    bb = Blackboard.local()
    records(bb, {f"p{i}": ({"crash": True} if i == 1 else {}) for i in range(4)})
    runner = ProcessRunner(workers=2, batch_timeout=20)
    try:
        results = runner.run(wf, bb, [[f"p{i}"] for i in range(4)])
    finally:
        runner.close()
    assert [r.ok for r in results] == [True, False, True, True]
    assert "the worker process died (exit 3) in pipelet tests.engine._pipelets.Crash" in (
        results[1].error or "")
