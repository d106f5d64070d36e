"""The default batch policy's arithmetic (``pipeline/_sizing.py``): pure logic, no services.

What it does with a broker and Spark is in ``test_adaptive_batching.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import engine
from blackboard import Blackboard
from listener_router import ListenerRule
from listener_router._messages import Incoming
from listener_router.broker import Delivery
from listener_router.pipeline import (
    SLOW_AFTER,
    AdaptiveSizing,
    Batch,
    BatchReport,
    BatchSizing,
    Group,
    Placement,
    Work,
    WorkflowRun,
    default_sizing,
    prefetch_for,
)
from listener_router.pipeline._lanes import slow_after
from listener_router.pipeline._sizing import (
    MAX_LOCAL,
    MAX_PREFETCH,
    MAX_RUN,
    MAX_SIZE,
    MIN_FIXED,
    MIN_SIZE,
    START_SIZE,
    RunCost,
)


def _spark_runs(cost: RunCost, fixed: float, per_record: float) -> None:
    for n in (500, 20_000, 2_000, 10_000, 1_000, 5_000) * 4:
        cost.add_spark(n, fixed + per_record * n)


def test_the_fit_finds_the_fixed_and_the_per_record_cost():
    cost = RunCost()
    _spark_runs(cost, 0.3, 20e-6)
    assert cost.fixed == pytest.approx(0.3, rel=0.15)
    assert cost.per_record == pytest.approx(20e-6, rel=0.15)


def test_the_batch_is_as_large_as_the_fixed_cost_needs_within_bounds():
    cheap, heavy, huge = RunCost(), RunCost(), RunCost()
    _spark_runs(cheap, 0.2, 5e-6)       # 0.2 s / (0.1 * 5 µs) = 400,000: the ceiling
    _spark_runs(heavy, 0.2, 1e-3)       # 0.2 s / (0.1 * 1 ms) = 2,000
    _spark_runs(huge, 0.2, 0.5)         # half a second a record: the floor
    assert cheap.best_size() == MAX_SIZE
    assert 1_500 <= heavy.best_size() <= 2_500
    assert huge.best_size() == MIN_SIZE


def test_one_size_of_runs_still_gives_an_answer():
    cost = RunCost()
    for _ in range(50):
        cost.add_spark(10_000, 0.6)
    assert 0 < cost.fixed < 0.6 and cost.per_record > 0
    assert cost.fixed + cost.per_record * 10_000 == pytest.approx(0.6, rel=0.05)


def test_slow_small_runs_never_make_a_job_free():
    # A loaded machine: the large runs were slowed, the small ones not, and the line
    # through them meets zero records below zero seconds.
    cost = RunCost()
    for _ in range(10):
        cost.add_spark(1_000, 0.05)
        cost.add_spark(10_000, 1.5)
    assert cost.fixed == MIN_FIXED
    assert cost.best_size() >= MIN_SIZE


def test_small_batches_run_here_while_a_run_here_is_quicker_than_a_job():
    cost = RunCost()
    _spark_runs(cost, 0.2, 20e-6)
    for _ in range(20):
        cost.add_local(100, 100 * 300e-6)
    assert cost.local == pytest.approx(300e-6, rel=0.05)
    assert cost.local_limit() == pytest.approx(0.2 / 280e-6, rel=0.15)
    for _ in range(20):
        cost.add_local(100, 100 * 2e-6)  # cheaper here than on Spark: as large as allowed
    assert cost.local_limit() == MAX_LOCAL


def test_a_batch_is_taken_when_full_when_nothing_waits_or_after_max_wait():
    sizing = AdaptiveSizing(limit=100, max_wait=1.0)
    assert sizing.ready(100, 0.0, waiting=500)       # full
    assert sizing.ready(3, 0.0, waiting=0)           # nothing more to wait for
    assert not sizing.ready(3, 0.5, waiting=500)     # a backlog: fill it
    assert sizing.ready(3, 1.0, waiting=500)         # but not for longer than max_wait
    fixed = BatchSizing(100, 1.0)                    # the base policy ignores what waits
    assert not fixed.ready(3, 0.0, waiting=0)
    assert fixed.ready(3, 1.0, waiting=0)


def _report(*runs: WorkflowRun) -> BatchReport:
    report = BatchReport()
    report.runs.extend(runs)
    return report


def test_finished_batches_set_the_size_the_heaviest_workflow_wins():
    sizing = AdaptiveSizing()
    assert sizing.size == START_SIZE  # before any run: a slow start
    for n in (200, 2_000, 800, 1_500) * 5:
        sizing.batch_finished(_report(WorkflowRun("light", "spark", 0.2 + 5e-6 * n, n),
                                      WorkflowRun("heavy", "spark", 0.2 + 1e-3 * n, n)))
    assert 1_500 <= sizing.size <= 2_500
    assert sizing.local_limit("light") >= 0 and sizing.local_limit("unknown") > 0


def test_batches_start_small_and_grow_at_most_fourfold_a_run():
    sizing = AdaptiveSizing()
    sizing.batch_finished(_report(WorkflowRun("w", "spark", 0.05, START_SIZE)))  # cheap
    assert sizing.size == 4 * START_SIZE
    sizing.batch_finished(_report(WorkflowRun("w", "spark", 0.1, 4 * START_SIZE)))
    assert sizing.size == MAX_SIZE


def test_runs_of_the_main_runner_size_its_batches_wherever_it_runs():
    """runner = "local": every run is on the service's workers, and they size the batches
    (only a small batch placed there beside Spark is the local cost's alone)."""
    sizing = AdaptiveSizing()
    for _ in range(3):
        sizing.batch_finished(_report(WorkflowRun("w", "local", 0.05 + 30e-6 * sizing.size,
                                                  sizing.size)))
    assert sizing.size == MAX_SIZE
    placed = AdaptiveSizing()
    placed.batch_finished(_report(WorkflowRun("w", "local", 0.01, 50, placed=True)))
    assert placed.size == START_SIZE and placed.costs["w"].largest == 0


def test_slow_pipelets_keep_a_run_within_max_run_from_the_first_measured_batch():
    sizing = AdaptiveSizing()
    # 8 ms a record over two cores: the first batch of START_SIZE took 2 s
    sizing.batch_finished(_report(WorkflowRun("slow", "spark", 0.05 + 4e-3 * START_SIZE,
                                              START_SIZE)))
    cost = sizing.costs["slow"]
    assert cost.predict(sizing.size) <= MAX_RUN
    batch = Batch()
    batch.groups["slow"] = Group("slow", Blackboard.local(), [_work(f"m{i}") for i in range(250)])
    assert sizing.expected(batch) == pytest.approx(cost.predict(250))
    batch.expected = sizing.expected(batch)
    assert slow_after(batch) == max(SLOW_AFTER, 2 * batch.expected)


def test_a_run_that_timed_out_teaches_the_sizing_nothing():
    """A hang's batch_timeout is no measure of its pipelets: taken as one, the next batch of
    one record was expected to run 7 s, and every other lane waited twice that behind it
    (bench/bench_incident.py: steady p99 14 s)."""
    sizing = AdaptiveSizing()
    for _ in range(5):
        sizing.batch_finished(_report(WorkflowRun("w", "spark", 0.05 + 20e-6 * 100, 100)))
    before = (sizing.costs["w"].fixed, sizing.costs["w"].per_record, sizing.size)
    sizing.batch_finished(_report(WorkflowRun("w", "spark", 40.0, 2, faulted=True),
                                  WorkflowRun("w", "local", 20.0, 1, placed=True, faulted=True)))
    assert (sizing.costs["w"].fixed, sizing.costs["w"].per_record, sizing.size) == before
    assert sizing.costs["w"].local == RunCost().local
    batch = Batch()
    batch.groups["w"] = Group("w", Blackboard.local(), [_work("hang")])
    batch.expected = sizing.expected(batch)
    assert slow_after(batch) == SLOW_AFTER
    sizing.batch_finished(_report(WorkflowRun("w", "spark", 40.0, 2)))  # the same, unflagged
    assert sizing.costs["w"].predict(1) > 1.0   # what it would have expected of one record


def test_a_batch_size_in_the_rules_fixes_the_size():
    sizing = default_sizing([ListenerRule(name="a", batch_size=2000, max_wait_ms=50)])
    for n in (200, 2_000) * 5:
        sizing.batch_finished(_report(WorkflowRun("heavy", "spark", 0.2 + 1e-3 * n, n)))
    assert (sizing.size, sizing.max_wait) == (2000, 0.05)
    assert default_sizing([ListenerRule(name="a", batch_size=2000),
                           ListenerRule(name="b")]).limit is None  # one rule leaves it open


def test_prefetch_is_derived_from_the_batch_size_unless_given():
    assert prefetch_for([ListenerRule(name="a")]) == min(MAX_PREFETCH, 4 * MAX_SIZE)
    assert prefetch_for([ListenerRule(name="a", batch_size=2000)]) == 8000
    assert prefetch_for([ListenerRule(name="a", batch_size=2000, prefetch=3000)]) == 3000


_WORKFLOW = """<?xml version="1.0"?>
<process name="{name}" xmlns="http://docs.oasis-open.org/wsbpel/2.0/process/executable"
         xmlns:proc="http://www.eclipse.org/smila/processor">
  <sequence>
    <proc:invokePipelet name="a"><proc:pipelet class="pipelets.text.WordCount"/>
      <proc:configuration><proc:param name="attribute">t</proc:param><proc:param name="output">w</proc:param></proc:configuration>
    </proc:invokePipelet>
    <proc:invokePipelet name="b"><proc:pipelet class="{second}"/>
      <proc:configuration>{config}</proc:configuration>
    </proc:invokePipelet>
  </sequence>
</process>
"""


def _workflow(tmp_path: Path, name: str, second: str, config: str = "") -> engine.Workflow:
    path = tmp_path / f"{name}.xml"
    path.write_text(_WORKFLOW.format(name=name, second=second, config=config))
    return engine.load_workflow(path)


def _works(redelivered: bool = False) -> list[Work]:
    return [Work(Delivery(1, 1, "q", b"{}", "m", {}, redelivered))]


def _work(message_id: str) -> Work:
    work = Work(Delivery(1, 1, "q", b"{}", message_id, {}, False))
    work.message = Incoming(message_id, "q", [{"id": message_id}], "ADD", {}, 0,
                            record_ids=[message_id])
    return work


def test_placement_follows_what_the_pipelets_declare(tmp_path):
    safe = _workflow(tmp_path, "Safe", "pipelets.text.NormalizeWhitespace",
                     '<proc:param name="attribute">t</proc:param>')
    regex = _workflow(tmp_path, "Regex", "pipelets.text.RegexExtract",
                      '<proc:param name="attribute">t</proc:param>'
                      '<proc:param name="pattern">a+</proc:param>'
                      '<proc:param name="output">o</proc:param>')
    assert engine.classes_not_in_service(safe) == []
    assert engine.classes_not_in_service(regex) == ["pipelets.text.RegexExtract"]

    placement = Placement(BatchSizing(100, 1.0))  # auto; local limit 400
    assert placement.runs_here(safe, _works(), 10)
    assert not placement.runs_here(safe, _works(), 400)          # too large
    assert not placement.runs_here(regex, _works(), 10)          # a pipelet says no
    assert placement.runs_here(safe, _works(redelivered=True), 10)  # came again: isolated there too

    forced = Placement(BatchSizing(100, 1.0), local_below=50)   # [engine] local_below = 50
    assert forced.runs_here(regex, _works(), 10)
    assert not forced.runs_here(regex, _works(), 50)
