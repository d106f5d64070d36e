"""Warm workers: interpreter batches on Spark tasks that stay up between batches."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pytest
from engine_helpers import pipelet, records, snapshot

from blackboard import Blackboard
from engine import LocalRunner, SparkRunner
from engine._warm import WarmWorkers

pytestmark = [pytest.mark.spark]

WHERE = "<sequence>" + pipelet("where", "WhereAmI") + "</sequence>"
WORK = ("<sequence>" + pipelet("inc", "Increment") + pipelet("split", "SplitInTwo")
        + pipelet("mark", "Mark", value="done") + "</sequence>")
FRAME = """<sequence><extensionActivity><proc:invokePipelet name="norm">
  <proc:pipelet class="pipelets.text.NormalizeWhitespace"/>
  <proc:configuration><proc:param name="attribute">text</proc:param></proc:configuration>
</proc:invokePipelet></extensionActivity></sequence>"""


def batch(bb: Blackboard, prefix: str, n: int = 20) -> list[list[str]]:
    records(bb, {f"{prefix}{i}": {"counter": i, "text": f"  a   b {i} "} for i in range(n)})
    return [[f"{prefix}{i}"] for i in range(n)]


def wait_until(check: Any, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return check()


def test_batches_run_in_spark_tasks_that_stay_up_between_batches(spark: Any, make_workflow: Any) -> None:
    runner = SparkRunner(spark, batch_timeout=120)
    warm = runner.warm
    assert warm is not None  # a local master: on by default
    warm.park()
    starts = warm.starts
    wf = make_workflow(WHERE)
    pids = set()
    for k in range(5):
        bb = Blackboard.local()
        instances = batch(bb, f"w{k}-")
        assert all(r.ok for r in runner.run(wf, bb, instances))
        for [rid] in instances:
            attrs = bb.get_attributes(rid)
            assert attrs["in_task"] is True and attrs["pid"] != os.getpid()
            pids.add(attrs["pid"])
    assert warm.starts == starts + 1  # one warm job for the five batches
    assert len(pids) <= warm.slots


def test_warm_workers_leave_the_same_records_as_the_local_runner(spark: Any, make_workflow: Any) -> None:
    wf = make_workflow(WORK)
    here, there = Blackboard.local(), Blackboard.local()
    instances = batch(here, "s", 300)
    batch(there, "s", 300)
    expected = LocalRunner().run(wf, here, instances)
    got = SparkRunner(spark, batch_timeout=120).run(wf, there, instances)
    assert [(r.ok, r.result_ids) for r in got] == [(r.ok, r.result_ids) for r in expected]
    assert snapshot(there) == snapshot(here) and len(there.ids()) == 900  # two fragments each came back


def test_another_job_parks_the_warm_workers_and_they_start_again(spark: Any, make_workflow: Any) -> None:
    runner = SparkRunner(spark, batch_timeout=120)
    warm = runner.warm
    assert warm is not None
    interpreted, framed = make_workflow(WHERE, name="Where"), make_workflow(FRAME, name="Frame")
    bb = Blackboard.local()
    assert all(r.ok for r in runner.run(interpreted, bb, batch(bb, "a")))
    starts = warm.starts
    # a DataFrame form's job needs the cores the warm tasks hold: they end first
    assert all(r.ok for r in runner.run(framed, bb, batch(bb, "b")))
    assert runner.frame_records == 20
    assert bb.get_attributes("b3")["text"] == "a b 3"
    assert all(r.ok for r in runner.run(interpreted, bb, batch(bb, "c")))
    assert warm.starts == starts + 1


def test_a_job_run_beside_them_waits_at_most_until_they_idle(spark: Any, make_workflow: Any) -> None:
    runner = SparkRunner(spark, batch_timeout=120)
    bb = Blackboard.local()
    assert all(r.ok for r in runner.run(make_workflow(WHERE), bb, batch(bb, "x")))
    counted: list[int] = []
    other = threading.Thread(target=lambda: counted.append(spark.range(10).count()))
    other.start()
    other.join(60.0)
    assert counted == [10]


def test_idle_warm_workers_give_the_cores_back(spark: Any, make_workflow: Any) -> None:
    runner = SparkRunner(spark, batch_timeout=120)
    warm = runner.warm
    assert warm is not None
    bb = Blackboard.local()
    assert all(r.ok for r in runner.run(make_workflow(WHERE), bb, batch(bb, "i")))
    assert warm._gen is not None
    assert wait_until(lambda: warm._gen is None, warm.idle + 30)
    assert wait_until(lambda: not spark.sparkContext.statusTracker().getActiveJobsIds())


def test_batches_from_several_threads_share_the_warm_workers(spark: Any, make_workflow: Any) -> None:
    runner = SparkRunner(spark, batch_timeout=120)
    wf = make_workflow(WORK)
    outcomes: list[bool] = []

    def run(thread: int) -> None:
        for k in range(4):
            bb = Blackboard.local()
            instances = batch(bb, f"t{thread}-{k}-", 50)
            results = runner.run(wf, bb, instances)
            outcomes.append(all(r.ok for r in results)
                            and bb.get_attributes(f"t{thread}-{k}-7")["counter"] == 8)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert outcomes == [True] * 12


def test_tasks_that_cannot_connect_leave_batches_to_jobs_of_their_own(
        spark: Any, make_workflow: Any, monkeypatch: Any) -> None:
    runner = SparkRunner(spark, batch_timeout=120)
    assert runner.warm is not None
    runner.warm.park()
    broken = runner.warm = WarmWorkers(spark)
    listen = broken._listen

    def unreachable() -> Any:
        server, address, tmpdir = listen()
        return server, address + ".nobody-listens", tmpdir

    monkeypatch.setattr(broken, "_listen", unreachable)
    bb = Blackboard.local()
    instances = batch(bb, "u")
    results = runner.run(make_workflow(WHERE), bb, instances)
    assert all(r.ok for r in results)
    assert bb.get_attributes("u4")["in_task"] is True  # a job of its own ran them
    assert not broken.available() and broken.starts == 0


def test_a_workflow_changed_back_and_forth_runs_each_version(spark: Any, make_workflow: Any) -> None:
    """Each warm worker keeps every version it was sent (a file edited, then reverted)."""
    runner = SparkRunner(spark, batch_timeout=120)
    one = make_workflow("<sequence>" + pipelet("m", "Mark", value="one") + "</sequence>", name="V")
    two = make_workflow("<sequence>" + pipelet("m", "Mark", value="two") + "</sequence>", name="V")
    assert one.version != two.version
    for k, (wf, value) in enumerate([(one, "one"), (two, "two"), (one, "one"), (two, "two")]):
        bb = Blackboard.local()
        instances = batch(bb, f"v{k}-", 8)
        assert all(r.ok for r in runner.run(wf, bb, instances)), k
        assert bb.get_attributes(f"v{k}-3")["trail"] == value
