"""Poison isolation: a worker that dies or hangs fails only its own instance, in about one
timeout, naming the pipelet and the record; the rest complete (early, when asked)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from engine_helpers import pipelet, records

from blackboard import Blackboard
from engine import InstanceResult, ProcessRunner, SparkRunner

pytestmark = [pytest.mark.spark, pytest.mark.slow]

CRASH = "<sequence>" + pipelet("crash", "Crash") + "</sequence>"
CALL = "pipelet tests.engine._pipelets.Crash ("
SLACK = 25.0  # seconds a busy shared machine may add to a bound


def poisoned(bb: Blackboard, n: int, crash: tuple[int, ...] = (), hang: tuple[int, ...] = (),
             prefix: str = "p") -> list[list[str]]:
    batch: dict[str, dict[str, Any]] = {f"{prefix}{i}": {"n": i} for i in range(n)}
    for i in crash:
        batch[f"{prefix}{i}"]["crash"] = True
    for i in hang:
        batch[f"{prefix}{i}"]["hang"] = True
    records(bb, batch)
    return [[rid] for rid in batch]


@pytest.mark.parametrize("warm", [True, False], ids=["warm-workers", "jobs-of-their-own"])
def test_a_crashing_and_a_hanging_instance_are_isolated_and_the_rest_commit(
    spark: Any, make_workflow: Any, warm: bool
) -> None:
    wf = make_workflow(CRASH)
    bb = Blackboard.local()
    instances = poisoned(bb, 6, crash=(1,), hang=(4,))
    timeout = 8.0
    runner = SparkRunner(spark, batch_timeout=timeout, warm=warm)
    started = time.monotonic()
    results = runner.run(wf, bb, instances)
    took = time.monotonic() - started

    assert [r.ok for r in results] == [True, False, True, True, False, True]
    assert took < 2 * timeout + SLACK  # one timeout to find the batch hung, one for the instance
    if warm:  # the warm worker said which call it was in
        assert results[1].error == (f"the worker process died (exit 3) in {CALL}"
                                    f"{wf.path}:1, invokePipelet 'crash') on record 'p1'")
        assert results[4].error == (f"timeout: {CALL}{wf.path}:1, invokePipelet 'crash') ran "
                                    f"longer than {timeout:g} s on record 'p4'")
    else:  # a job of its own cannot say: the records it ran
        assert "Python worker exited unexpectedly" in (results[1].error or "")
        assert "record 'p1'" in (results[1].error or "")
        assert results[4].error == f"timeout: the run of record 'p4' ran longer than {timeout:g} s"
    for i in (0, 2, 3, 5):
        assert bb.get_attributes(f"p{i}")["trail"] == "survived"
    assert "trail" not in bb.get_attributes("p1") and "trail" not in bb.get_attributes("p4")
    # the session still works afterwards
    records(bb, {"later": {}})
    assert SparkRunner(spark).run(wf, bb, [["later"]])[0].ok


def test_good_instances_are_settled_early_and_the_culprit_within_two_timeouts(
        spark: Any, make_workflow: Any) -> None:
    wf = make_workflow(CRASH)
    bb = Blackboard.local()
    instances = poisoned(bb, 10, hang=(6,), prefix="e")
    timeout = 8.0
    early: list[tuple[float, list[InstanceResult]]] = []
    started = time.monotonic()

    def settle(results: list[InstanceResult]) -> None:
        # on the calling thread, with the changes already on the blackboard
        assert threading.current_thread() is threading.main_thread()
        assert all(bb.get_attributes(instances[r.index][0])["trail"] == "survived" for r in results)
        early.append((time.monotonic() - started, results))

    rest = SparkRunner(spark, batch_timeout=timeout).run(wf, bb, instances, settle_early=settle)
    took = time.monotonic() - started

    settled = [r for _t, results in early for r in results]
    assert sorted(r.index for r in settled) == [0, 1, 2, 3, 4, 5, 7, 8, 9]
    assert all(r.ok for r in settled)
    assert early[-1][0] < timeout + SLACK
    assert [(r.index, r.ok) for r in rest] == [(6, False)]
    assert "ran longer than" in (rest[0].error or "") and "record 'e6'" in (rest[0].error or "")
    assert took < 2 * timeout + SLACK


def test_a_lone_instance_that_hangs_fails_at_the_first_timeout(spark: Any, make_workflow: Any) -> None:
    wf = make_workflow(CRASH)
    bb = Blackboard.local()
    instances = poisoned(bb, 1, hang=(0,), prefix="lone")
    started = time.monotonic()
    [result] = SparkRunner(spark, batch_timeout=5).run(wf, bb, instances)
    assert not result.ok and "ran longer than 5 s on record 'lone0'" in (result.error or "")
    assert time.monotonic() - started < 5 + SLACK
    assert result.runs == 1  # alone, its timeout was its own: not run again


def test_a_hang_or_a_crash_leaves_the_warm_job_and_the_batches_beside_it_alone(
        spark: Any, make_workflow: Any) -> None:
    """Another thread's batches (another lane) go on while a chunk hangs and one crashes:
    none fails, none waits for the timeout, the warm job is never ended."""
    wf = make_workflow(CRASH)
    runner = SparkRunner(spark, batch_timeout=10)
    warm = runner.warm
    assert warm is not None
    bad = Blackboard.local()
    poison = poisoned(bad, 4, crash=(0,), hang=(2,), prefix="bad")
    assert all(r.ok for r in runner.run(wf, bad, [["bad1"]]))  # the warm job is up
    starts, kills = warm.starts, warm.kills
    outcome: list[list[InstanceResult]] = []
    thread = threading.Thread(target=lambda: outcome.append(runner.run(wf, bad, poison)))
    thread.start()
    slowest = 0.0
    k = 0
    while thread.is_alive():
        bb = Blackboard.local()
        batch = poisoned(bb, 5, prefix=f"ok{k}-")
        began = time.monotonic()
        assert all(r.ok for r in runner.run(wf, bb, batch)), k
        slowest = max(slowest, time.monotonic() - began)
        k += 1
    thread.join()
    assert [r.ok for r in outcome[0]] == [False, True, False, True]
    assert k > 10 and slowest < 10.0  # never held for a timeout
    assert (warm.starts, warm.kills) == (starts, kills)


def test_isolation_stops_when_its_time_budget_is_spent(spark: Any, make_workflow: Any) -> None:
    wf = make_workflow(CRASH)
    bb = Blackboard.local()
    instances = poisoned(bb, 8, hang=(6,), prefix="h")
    runner = SparkRunner(spark, batch_timeout=6, isolation_budget=0.0)
    results = runner.run(wf, bb, instances)

    # the warm workers' two chunks: the one that came back commits; the other one's
    # instances were not run again
    ok = [f"h{r.index}" for r in results if r.ok]
    stopped = [f"h{r.index}" for r in results if not r.ok]
    assert len(results) == 8 and ok and "h6" in stopped and stopped == sorted(stopped)
    assert all("not run: isolating a failure" in (r.error or "") for r in results if not r.ok)
    assert all("trail" not in bb.get_attributes(rid) for rid in stopped)
    records(bb, {"after": {}})
    assert runner.run(wf, bb, [["after"]])[0].ok  # the budget is per batch


def test_the_service_workers_kill_a_hung_run_and_isolate_it(make_workflow: Any) -> None:
    wf = make_workflow(CRASH)
    bb = Blackboard.local()
    instances = poisoned(bb, 5, hang=(3,), prefix="l")
    early: list[InstanceResult] = []
    started = time.monotonic()
    runner = ProcessRunner(workers=2, batch_timeout=2)
    try:
        rest = runner.run(wf, bb, instances, settle_early=early.extend)
    finally:
        runner.close()
    assert sorted(r.index for r in early) == [0, 1, 2, 4] and all(r.ok for r in early)
    assert [(r.index, r.ok) for r in rest] == [(3, False)]
    assert rest[0].error == (f"timeout: {CALL}{wf.path}:1, invokePipelet 'crash') ran longer "
                             "than 2 s on record 'l3'")
    assert time.monotonic() - started < 4 + SLACK
    assert bb.get_attributes("l1")["trail"] == "survived"
    assert bb.get_attributes("l3") == {"n": 3, "hang": True}  # nothing of the killed run
    # the culprit's run measured the hang, not the pipelet: the sizing must not learn from it
    assert rest[0].fault
    # it ran twice (with its batch-mates, then alone): its message counts two attempts
    assert rest[0].runs == 2 and all(r.runs == 1 for r in early)


def test_a_crash_on_the_service_workers_costs_a_worker_not_the_process_that_runs_them(
        make_workflow: Any) -> None:
    wf = make_workflow(CRASH)
    bb = Blackboard.local()
    instances = poisoned(bb, 6, crash=(2,), prefix="c")
    runner = ProcessRunner(workers=2, batch_timeout=10)
    runner.run(wf, bb, [["c0"]])   # up
    try:
        supervisor = set(runner.pool.processes())
        results = runner.run(wf, bb, instances)
        again = runner.run(wf, bb, [["c0"], ["c1"]])  # the workers go on
        assert set(runner.pool.processes()) == supervisor  # forked again under the same one
    finally:
        runner.close()
    assert [r.ok for r in results] == [True, True, False, True, True, True]
    assert results[2].error == (f"the worker process died (exit 3) in {CALL}{wf.path}:1, "
                                "invokePipelet 'crash') on record 'c2'")
    assert all(r.ok for r in again) and not any(r.fault for r in again)
    assert results[2].fault  # the crash's batch was isolated: its time is the fault's
    # the crash ran twice (in its chunk, then alone): its message counts two attempts
    assert results[2].runs == 2 and all(r.runs == 1 for r in results if r.ok)
