"""Poison isolation: a worker that dies or hangs fails only its own instance."""

from __future__ import annotations

from typing import Any

import pytest
from engine_helpers import pipelet, records

from blackboard import Blackboard
from engine import SparkRunner

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.mark.parametrize("warm", [True, False], ids=["warm-workers", "jobs-of-their-own"])
def test_a_crashing_and_a_hanging_instance_are_isolated_and_the_rest_commit(
    spark: Any, make_workflow: Any, warm: bool
) -> None:
    wf = make_workflow("<sequence>" + pipelet("crash", "Crash") + "</sequence>")
    bb = Blackboard.local()
    batch = {f"p{i}": {"n": i} for i in range(6)}
    batch["p1"]["crash"] = True
    batch["p4"]["hang"] = True
    records(bb, batch)
    # batch_timeout leaves room for Spark to restart crashed workers on a busy machine
    results = SparkRunner(spark, batch_timeout=10, warm=warm).run(wf, bb, [[rid] for rid in batch])
    assert [r.ok for r in results] == [True, False, True, True, False, True]
    assert "Spark task failed" in (results[1].error or "") and "crash" not in bb.get_attributes("p0")
    assert "batch timeout" in (results[4].error or "")
    for i in (0, 2, 3, 5):
        assert bb.get_attributes(f"p{i}")["trail"] == "survived"
    assert "trail" not in bb.get_attributes("p1") and "trail" not in bb.get_attributes("p4")
    # the session still works afterwards
    records(bb, {"later": {}})
    assert SparkRunner(spark).run(wf, bb, [["later"]])[0].ok


def test_isolation_stops_when_its_time_budget_is_spent(spark: Any, make_workflow: Any) -> None:
    wf = make_workflow("<sequence>" + pipelet("crash", "Crash") + "</sequence>")
    bb = Blackboard.local()
    batch = {f"h{i}": {"n": i} for i in range(8)}
    batch["h6"]["hang"] = True
    records(bb, batch)
    runner = SparkRunner(spark, batch_timeout=6, isolation_budget=0.0)
    results = runner.run(wf, bb, [[rid] for rid in batch])

    assert len(results) == 8 and not any(r.ok for r in results)
    assert "batch timeout" not in (results[0].error or "")  # one job, then nothing more was run
    assert all("not run: isolating a failure" in (r.error or "") for r in results)
    assert all("trail" not in bb.get_attributes(rid) for rid in batch)
    records(bb, {"after": {}})
    assert runner.run(wf, bb, [["after"]])[0].ok  # the budget is per batch
