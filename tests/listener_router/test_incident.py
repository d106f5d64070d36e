"""A stuck record stops nothing but itself: the incident of ``bench/bench_incident.py``.

A steady queue's traffic goes on while another queue's burst holds a record
that hangs, one that ends its process and one that raises, in each runner
mode: nothing lost or doubled, each poison record dead-lettered with a reason
naming its pipelet and record, the good ones committed in about one timeout,
the steady latency bounded (bounds here are generous, the machine is shared;
the bench reports the real figures).  And, without Spark: the good messages
of a batch the runner is still isolating are committed before it returns.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from listener_router_helpers import message_ids_by_record, write_test_workflows

import engine
from listener_router import push_records

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
incident = importlib.import_module("bench_incident")

TIMEOUT = 8.0   # batch_timeout of the incident runs


class EarlyRunner:
    """The in-process runner, except that it hands all but the first instance to
    ``settle_early`` and, before it returns the first, waits to see them published."""

    def __init__(self, broker: Any, out: str):
        self.inner = engine.LocalRunner()
        self.broker = broker
        self.out = out
        self.published_before_return: list[int] = []

    def run(self, workflow, blackboard, instances, *, settle_early=None):
        results = self.inner.run(workflow, blackboard, instances)
        if settle_early is None or len(results) < 2:
            return results
        settle_early(results[1:])
        deadline = time.monotonic() + 30
        while self.broker.depth(self.out) < len(results) - 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        self.published_before_return.append(self.broker.depth(self.out))
        return results[:1]


@pytest.mark.broker
def test_a_batchs_early_part_is_committed_published_and_acked_before_the_rest(
        make_settings, run_service, broker, tmp_path):
    settings = make_settings("Counting", workflows_dir=write_test_workflows(tmp_path / "wf"),
                             batch_size=20, max_wait_ms=500)
    queue, out = settings.listeners[0].queue, settings.routers[0].queue
    ids = [f"early{i}" for i in range(8)]
    push_records(settings, queue, [{"id": rid, "attributes": {}} for rid in ids])
    runner = EarlyRunner(broker, out)
    finished = []
    stats = run_service(settings, runner=runner, until=lambda s: s["committed"] >= len(ids),
                        observers=[_Reports(finished)])

    assert stats["committed"] == len(ids) and stats["batches"] == len(finished)
    assert runner.published_before_return and all(
        n >= 1 for n in runner.published_before_return)  # out before the batch's last part
    assert set(message_ids_by_record(broker.drain(out))) == set(ids)
    assert sum(r.messages for r in finished) == len(ids)  # each batch reported once, whole
    assert broker.depth(queue) == 0


class _Reports:
    def __init__(self, into: list[Any]):
        self.into = into

    def batch_finished(self, report: Any) -> None:
        self.into.append(report)


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.parametrize("mode", ["spark", "local", "service"])
def test_a_burst_with_a_hang_a_crash_and_a_raise_stops_nothing_but_itself(
        mode, broker_url, tmp_path):
    scenario = incident.Scenario(mode, batch_timeout=TIMEOUT, rate=20.0, good=3, warmup=5.0,
                                 tail=1.0, lead="hang", retries=1)
    figures = incident.run(scenario, broker_url, tmp_path, log=lambda _s: None)
    shown = json.dumps(figures.__dict__, indent=1)

    assert not figures.lost and not figures.doubled and not figures.stray, shown
    assert len(figures.good) == 3 and max(figures.good) < TIMEOUT + 40, shown
    assert set(figures.dead) == {"hang", "crash", "raise"}, shown
    # within (max_retries + 1) x batch_timeout + 15 s: the hang's rerun alone, after the run it
    # shared timed out, was its second attempt (so was the crash's); the raise was retried
    assert figures.dead["hang"] < 2 * TIMEOUT + 15, shown
    assert all(reason.endswith("(after 2 attempt(s))") for reason in figures.reasons.values()), shown
    record = {what: f"-{what}'" for what in figures.dead}
    hang = figures.reasons["hang"]
    assert hang.startswith("timeout: pipelet incident_pipelets.Trouble (") and \
        "incident.xml:6, invokePipelet 'trouble')" in hang and record["hang"] in hang, shown
    crash = figures.reasons["crash"]  # in every mode it ended a worker, never the service
    assert crash.startswith("the worker process died (exit 3) in pipelet "
                            "incident_pipelets.Trouble (") and record["crash"] in crash, shown
    assert figures.restarts == 0, shown
    assert "incident.xml:6" in figures.reasons["raise"] and \
        "RuntimeError: record" in figures.reasons["raise"], shown
    assert figures.during["n"] > 0 and figures.during["p99"] < 10.0, shown
    assert figures.during["max"] < 20.0, shown


@pytest.mark.broker
def test_a_message_retried_after_a_hang_runs_alone_after_its_batch_mates(
        make_settings, run_service, broker, declare, tmp_path, caplog):
    """Its batch-mates commit at once, not one ``batch_timeout`` later; then it runs alone
    and hangs again, costing only itself.  The retry copy is the service's own: its first
    run hangs alone, and the copy waits out a long backoff, to be put back beside others."""
    from dataclasses import replace

    from listener_router.broker import retry_name
    from listener_router.jobs import JobLogTables
    from listener_router.store import ServiceStore

    timeout = 6.0
    settings = replace(make_settings("Hanging", workflows_dir=write_test_workflows(tmp_path / "wf"),
                                     batch_size=10, max_wait_ms=1000, max_retries=1,
                                     backoff_ms=(600_000,)),
                       runner="local", batch_timeout=timeout)
    queue = settings.listeners[0].queue
    declare(settings)
    body = json.dumps({"id": "again", "attributes": {"hang": True}}).encode()
    broker.publish(queue, body, message_id="m-again")
    stats = run_service(settings, until=lambda s: s["retrying"] >= 1, idle_exit=60)
    assert stats["retrying"] == 1, stats
    [(props, copy)] = broker.drain(retry_name(queue, 1))   # as the service published it
    broker.publish(queue, copy, message_id=props.message_id, headers=props.headers)
    for i in range(4):
        broker.publish(queue, json.dumps({"id": f"mate{i}", "attributes": {"n": i}}),
                       message_id=f"m-mate{i}")
    with caplog.at_level("INFO", logger="listener_router.pipeline._execute"):
        stats = run_service(settings, until=lambda s: s["committed"] >= 4 and s["dead"] >= 1,
                            idle_exit=60)

    assert stats["committed"] == 4 and stats["dead"] == 1, stats
    store = ServiceStore.connect(settings.blackboard_url)
    try:
        log = store.tables(JobLogTables)
        entries = log.entries(queues=(queue,), limit=100)
    finally:
        store.close()
    committed = [e for e in entries if e.state == "committed"]
    dead, = [e for e in entries if e.state == "dead"]
    assert len(committed) == 4 and "ran longer than" in (dead.reason or ""), entries
    # the batch-mates did not wait out the hang's timeout (before: one timeout, then its
    # isolation, before any of them was committed)
    assert all(e.at - e.received_at < timeout / 2 for e in committed), \
        [(e.message_id, e.at - e.received_at) for e in committed]
    assert dead.at - dead.received_at >= timeout
    assert "1 message(s) whose last run hung or died run alone, after their 4 batch-mate(s)" \
        in caplog.text
