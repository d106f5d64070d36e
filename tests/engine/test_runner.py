"""Runners: Spark and local give the same records; failures stay in their instance."""

from __future__ import annotations

from typing import Any

import pytest
from engine_helpers import REPO, VALID_DIR, pipelet, records, snapshot

from blackboard import Blackboard
from engine import InstanceResult, LocalRunner, SparkRunner, load_workflow

pytestmark = pytest.mark.spark

BATCH: dict[str, dict[str, Any]] = {
    "r0": {"text": "alpha", "size": "big"},
    "r1": {"text": "beta"},
    "r2": {"text": "gamma", "fail": True},
    "r3": {"text": "delta", "size": "big"},
    "r4": {"text": "eps", "drop": True},
    "r5": {"text": "zeta"},
    "r6": {"text": "eta", "size": "big", "fail": True},
    "r7": {"text": "theta"},
}
INSTANCES = [["r0"], ["r1", "r2"], ["r3"], ["r4", "r5"], ["r6"], ["r7"]]


def run_both(workflow: Any, spark: Any, batch: dict[str, dict[str, Any]], instances: list[list[str]]) -> tuple:
    out = []
    for runner in (LocalRunner(), SparkRunner(spark, batch_timeout=120)):
        bb = Blackboard.local()
        records(bb, batch)
        results = runner.run(workflow, bb, instances)
        out.append((results, snapshot(bb)))
    return out[0], out[1]


def test_spark_and_local_runners_leave_identical_records(spark: Any) -> None:
    wf = load_workflow(VALID_DIR / "mixed.xml")
    (local_results, local_records), (spark_results, spark_records) = run_both(wf, spark, BATCH, INSTANCES)
    assert spark_records == local_records
    assert [(r.index, r.ok, r.result_ids, r.record_ids) for r in spark_results] == [
        (r.index, r.ok, r.result_ids, r.record_ids) for r in local_results
    ]


def test_a_failing_pipelet_fails_only_its_instances(spark: Any) -> None:
    wf = load_workflow(VALID_DIR / "mixed.xml")
    _, (results, after) = run_both(wf, spark, BATCH, INSTANCES)
    assert [r.ok for r in results] == [True, False, True, True, False, True]
    failed = results[1]
    assert "pipeletError" in (failed.error or "") and "'r2'" in (failed.error or "")
    assert failed.record_ids == ["r1", "r2"]
    # failed instances' records are left as loaded: nothing imported
    assert after["r1"] == BATCH["r1"] and after["r2"] == BATCH["r2"]
    assert after["r6"] == BATCH["r6"] and "r6#a" not in after
    # OK instances: changes imported, fragments made, filtered record not returned
    assert results[0].result_ids == ["r0#a", "r0#b"]
    assert results[0].record_ids == ["r0", "r0#a", "r0#b"]
    assert after["r0#a"]["part"] == "a" and after["r0#a"]["text"] == "ALPHA"
    assert after["r5"] == {"text": "ZETA", "trail": ["small", "failwhen"]}
    assert results[3].result_ids == ["r5"]
    assert results[3].record_ids == ["r4", "r5"]
    assert isinstance(results[0], InstanceResult)


def test_an_anonymous_pipelet_exception_reruns_the_others_from_their_original_records(
    spark: Any, make_workflow: Any
) -> None:
    wf = make_workflow(
        "<sequence>" + pipelet("mark", "Mark", value="one") + pipelet("fail", "FailWhen", named="false")
        + pipelet("mark2", "Mark", value="two") + "</sequence>"
    )
    batch = {f"x{i}": {"n": i} for i in range(7)}
    batch["x3"]["fail"] = True
    local, spark = run_both(wf, spark, batch, [[rid] for rid in batch])
    for results, after in (local, spark):
        assert [r.ok for r in results] == [True, True, True, False, True, True, True]
        assert "RuntimeError" in (results[3].error or "")
        # reruns start from the original records: marks are not doubled
        assert after["x0"]["trail"] == ["one", "failwhen", "two"]
        assert after["x3"] == {"n": 3, "fail": True}


def test_demo_workflow_normalizes_text_and_counts_words(spark: Any) -> None:
    wf = load_workflow(REPO / "workflows" / "demo.xml")
    assert wf.name == "Demo"
    batch = {"d1": {"text": "  Hello\n  WORLD  "}, "d2": {"text": "one two   three"}}
    local, spark = run_both(wf, spark, batch, [["d1"], ["d2"]])
    assert local[1] == spark[1]
    assert spark[1]["d1"] == {"text": "hello world", "words": 2}
    assert spark[1]["d2"]["words"] == 3


def test_attachments_travel_to_workers_and_back(spark: Any, make_workflow: Any) -> None:
    wf = make_workflow("<sequence>" + pipelet("split", "SplitInTwo") + "</sequence>")
    bb = Blackboard.local()
    records(bb, {"p": {"t": "x"}})
    bb.set_attachment("p", "raw", b"\x00\xffbytes")
    results = SparkRunner(spark).run(wf, bb, [["p"]])
    assert results[0].ok
    assert bb.get_attachment("p#a", "raw") == b"\x00\xffbytes"
    assert bb.get_attachment("p", "raw") == b"\x00\xffbytes"


def test_run_stream_gives_each_batch_the_results_run_gives(spark: Any) -> None:
    wf = load_workflow(VALID_DIR / "mixed.xml")
    runner = SparkRunner(spark, batch_timeout=120)
    once = Blackboard.local()
    records(once, BATCH)
    expected = [runner.run(wf, once, INSTANCES[:3]), runner.run(wf, once, INSTANCES[3:])]

    streamed = Blackboard.local()
    records(streamed, BATCH)
    got = list(runner.run_stream(wf, streamed, [INSTANCES[:3], [], INSTANCES[3:]]))
    assert got[1] == []
    assert [got[0], got[2]] == expected
    assert snapshot(streamed) == snapshot(once)


def test_run_stream_refuses_a_record_in_two_batches_in_flight(spark: Any) -> None:
    wf = load_workflow(VALID_DIR / "mixed.xml")
    bb = Blackboard.local()
    records(bb, BATCH)
    stream = SparkRunner(spark, batch_timeout=120).run_stream(wf, bb, [[["r0"], ["r1"]], [["r1"]]])
    with pytest.raises(ValueError, match="'r1' is in two batches in flight"):
        list(stream)


def test_the_sweep_counts_the_jobs_of_every_runner_in_the_process(spark: Any, monkeypatch: Any) -> None:
    """Runners closed before SWEEP_EVERY jobs each (a service restarted in one process)
    still get their jobs' proxies collected: the JVM is the process's."""
    import gc

    import engine._runner

    monkeypatch.setattr(engine._runner, "SWEEP_EVERY", 2)
    monkeypatch.setattr(engine._runner, "_unswept", 0)
    collections = []
    monkeypatch.setattr(gc, "collect", lambda *a: collections.append(a) or 0)
    wf = load_workflow(VALID_DIR / "mixed.xml")
    for _ in range(2):   # one batch each, a job of its own
        bb = Blackboard.local()
        records(bb, BATCH)
        SparkRunner(spark, batch_timeout=120, warm=False).run(wf, bb, INSTANCES)
    assert len(collections) == 1


def test_finished_jobs_leave_no_py4j_proxies_to_the_rare_full_collection(spark: Any, monkeypatch: Any) -> None:
    """Each proxy keeps its Java object (a Dataset, its plans) alive in the JVM until freed."""
    import gc

    from py4j.java_gateway import JavaObject

    import engine._runner

    monkeypatch.setattr(engine._runner, "SWEEP_EVERY", 1)
    wf = load_workflow(VALID_DIR / "mixed.xml")
    runner = SparkRunner(spark, batch_timeout=120, warm=False)
    gc.collect()
    gc.disable()  # what a long-lived process sees: the oldest generation is rarely collected
    try:
        bb = Blackboard.local()
        records(bb, BATCH)
        runner.run(wf, bb, INSTANCES)
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        left = [o for o in gc.garbage if isinstance(o, JavaObject)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert left == []


def test_a_run_leaves_no_reference_cycles_behind() -> None:
    """Refcounting frees what a run made (its interpreter, the partition's blackboard and
    every record on it): a service runs with the cyclic collector off most of the time."""
    import gc

    from blackboard._blackboard import Blackboard as BlackboardClass
    from engine._interpreter import Interpreter

    wf = load_workflow(VALID_DIR / "mixed.xml")
    runner = LocalRunner()
    runner.run(wf, _loaded(), INSTANCES)  # what a first run sets up (pipelets, caches) stays
    gc.collect()
    gc.disable()
    try:
        gc.set_debug(gc.DEBUG_SAVEALL)
        runner.run(wf, _loaded(), INSTANCES)
        gc.collect()
        left = [o for o in gc.garbage if isinstance(o, (BlackboardClass, Interpreter))]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert left == []


def _loaded() -> Blackboard:
    bb = Blackboard.local()
    records(bb, BATCH)
    return bb
