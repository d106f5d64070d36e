"""``[engine] local_below``: small batches run on the service's own workers, the rest on Spark.

The service's workers are processes it supervises, never its own: a batch
that hangs there has its worker killed at ``batch_timeout`` and the hung
message found alone, and a pipelet that ends its process ends a worker, not
the service (which goes on, and retries and dead-letters the record as
Spark's warm workers would).
"""

from __future__ import annotations

import json

import pika
import pytest
from listener_router_helpers import (
    message_ids_by_record,
    publish_ids,
    start_service,
    stored_counts,
    write_config,
    write_test_workflows,
)

from listener_router import ListenerRule, RouterRule, push_records
from listener_router.broker import connection_parameters, dlq_name
from listener_router.cli import main

pytestmark = [pytest.mark.broker, pytest.mark.spark]


@pytest.fixture
def counting(make_settings, tmp_path, declare):
    workflows = write_test_workflows(tmp_path / "workflows")
    settings = make_settings("Counting", workflows_dir=workflows, batch_size=500,
                             max_wait_ms=300, prefetch=1000, create_missing=True)
    settings = settings.with_overrides(local_below=50)
    declare(settings)
    return settings


def test_small_batches_run_on_the_service_workers_and_large_ones_on_spark(counting, run_service):
    large = [f"lg{i:03d}" for i in range(300)]
    publish_ids(counting, large)
    stats = run_service(counting, until=lambda s: s["committed"] >= len(large), idle_exit=60)
    assert stats["committed"] == len(large)
    assert stats["batches"] > stats["local_batches"]  # a batch of 50 or more took Spark

    small = [f"sm{i}" for i in range(5)]
    publish_ids(counting, small)
    stats = run_service(counting, until=lambda s: s["committed"] >= len(small), idle_exit=60)
    assert stats["committed"] == len(small)
    assert stats["local_batches"] == stats["batches"] >= 1
    assert stored_counts(counting.blackboard_url, large + small) == {1: len(large) + len(small)}


def test_a_redelivered_message_runs_on_the_service_workers_too(counting, run_service):
    ids = ["rd1", "rd2", "rd3"]
    publish_ids(counting, ids)
    conn = pika.BlockingConnection(connection_parameters(counting.broker_url))
    ch = conn.channel()
    taken = [ch.basic_get(counting.listeners[0].queue, auto_ack=False) for _ in ids]
    assert all(method is not None for method, _props, _body in taken)
    conn.close()  # unacked: the broker delivers them again, marked redelivered

    stats = run_service(counting, until=lambda s: s["committed"] >= len(ids), idle_exit=60)
    assert stats["committed"] == len(ids)
    assert stats["local_batches"] == stats["batches"] >= 1  # a crash there costs a worker
    assert stored_counts(counting.blackboard_url, ids) == {1: len(ids)}


@pytest.mark.slow
def test_a_batch_that_hangs_on_the_service_workers_costs_the_hung_message_alone(
        tmp_path, broker_url, qname, broker, make_settings):
    queue, out = qname("in"), qname("out")
    db = f"sqlite:///{tmp_path / 'chalk.db'}"
    log = tmp_path / "service.log"
    workflows = write_test_workflows(tmp_path / "workflows")
    config = write_config(tmp_path / "chalk.toml", db=db, broker=broker_url, workflows=workflows,
                          engine={"local_below": 100, "batch_timeout": 4},
                          listeners=[{"name": "hang", "queue": queue, "workflow": "Hanging",
                                      "batch_size": 50, "max_wait_ms": 300, "max_retries": 0}],
                          routers=[{"queue": out}], spark={"master": "local[2]"})
    settings = make_settings("Hanging", rules=(ListenerRule(name="hang", queue=queue,
                                                            workflow="Hanging", max_retries=0),),
                             routers=(RouterRule(queue=out),)).with_overrides(blackboard_url=db)
    data = [{"id": f"h{i}", "attributes": {"hang": i == 2}} for i in range(5)]
    push_records(settings, queue, data)

    proc = start_service(config, log, "--idle-exit", "8")  # no exit of its own: it goes on
    assert proc.wait(timeout=240) == 0, log.read_text()[-3000:]
    text = log.read_text()
    assert "isolating" in text and "on the service workers" in text

    dead = broker.drain(dlq_name(queue))
    assert [json.loads(body)["records"] for _props, body in dead] == [[{"id": "h2"}]]
    reason = dead[0][0].headers["x-chalk-error"]
    assert reason.startswith("timeout: pipelet lr_test_pipelets.HangWhenFlagged (")
    assert f"{workflows / 'hanging.xml'}:" in reason and "invokePipelet 's1'" in reason
    assert "ran longer than 4 s on record 'h2'" in reason
    assert set(message_ids_by_record(broker.drain(out))) == {"h0", "h1", "h3", "h4"}
    assert stored_counts(db, ["h0", "h1", "h3", "h4"]) == {1: 4}


@pytest.mark.slow
def test_a_pipelet_that_ends_its_process_costs_a_worker_never_the_service(
        tmp_path, broker_url, qname, broker, make_settings, capsys):
    queue, out = qname("in"), qname("out")
    db = f"sqlite:///{tmp_path / 'chalk.db'}"
    log = tmp_path / "service.log"
    config = write_config(tmp_path / "chalk.toml", db=db, broker=broker_url,
                          workflows=write_test_workflows(tmp_path / "workflows"),
                          engine={"local_below": 100},
                          listeners=[{"name": "crash", "queue": queue, "workflow": "Crashing",
                                      "batch_size": 50, "max_wait_ms": 300, "max_retries": 2,
                                      "backoff_ms": [100]}],
                          routers=[{"queue": out}], spark={"master": "local[2]"})
    settings = make_settings("Crashing", rules=(ListenerRule(name="crash", queue=queue,
                                                             workflow="Crashing"),),
                             routers=(RouterRule(queue=out),)).with_overrides(blackboard_url=db)
    push_records(settings, queue, [{"id": "c1", "attributes": {"crash": True}},
                                   {"id": "c2", "attributes": {}}])

    proc = start_service(config, log, "--idle-exit", "8")   # it never exits on the crash
    assert proc.wait(timeout=240) == 0, log.read_text()[-3000:]
    dead = broker.drain(dlq_name(queue))
    assert [json.loads(body)["records"] for _props, body in dead] == [[{"id": "c1"}]]
    reason = dead[0][0].headers["x-chalk-error"]
    assert reason.startswith("the worker process died (exit 3) in pipelet "
                             "lr_test_pipelets.CrashWhenFlagged (") and "record 'c1'" in reason
    assert set(message_ids_by_record(broker.drain(out))) == {"c2"}
    assert main(["jobs", "--record", "c1", "--config", str(config)]) == 0
    shown = capsys.readouterr().out
    # three runs (max_retries = 2): in the batch and alone, both counted, then its retry
    assert reason.endswith("(after 3 attempt(s))")
    assert shown.count("retrying") == 1 and "dead" in shown
    steps = [line.split()[2:6:3] for line in shown.splitlines()[2:]]   # step, attempt
    assert steps == [["received", "1"], ["retrying", "1"], ["received", "3"], ["dead", "3"]], shown
