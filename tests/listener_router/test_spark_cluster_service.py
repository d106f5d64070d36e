"""The service on a Spark standalone cluster commits what it commits on ``local[*]``.

``chalk run`` runs in a process of its own with ``[spark] master =
"spark://…"`` (a master and a worker started from pyspark's own launcher,
``tests/_spark_cluster.py``), PostgreSQL and the test broker, over records
pushed to a queue: a workflow of built-in pipelets and pipelets from a module
next to the workflow (shipped to the executors), some instances failing.
The same records go through the service on the session's ``local[2]``; the
stored records and the dead letters must be the same.
"""

from __future__ import annotations

import json
import signal
from dataclasses import replace

import pytest
from listener_router_helpers import (
    kill_group,
    start_service,
    stored_attributes,
    wait_for_log,
    wait_until,
    write_config,
    write_test_workflows,
)

from listener_router import ListenerRule, RouterRule, push_records
from listener_router.broker import dlq_name

pytestmark = [pytest.mark.slow, pytest.mark.broker, pytest.mark.spark, pytest.mark.postgres]

WORKFLOW = """<?xml version="1.0"?>
<process name="ClusterWords" xmlns="http://docs.oasis-open.org/wsbpel/2.0/process/executable"
         xmlns:proc="http://www.eclipse.org/smila/processor">
  <sequence>
    <proc:invokePipelet name="norm">
      <proc:pipelet class="pipelets.text.NormalizeWhitespace"/>
      <proc:configuration><proc:param name="attribute">text</proc:param></proc:configuration>
    </proc:invokePipelet>
    <proc:invokePipelet name="words">
      <proc:pipelet class="pipelets.text.WordCount"/>
      <proc:configuration><proc:param name="attribute">text</proc:param>
        <proc:param name="output">words</proc:param></proc:configuration>
    </proc:invokePipelet>
    <proc:invokePipelet name="count">
      <proc:pipelet class="lr_test_pipelets.Increment"/>
      <proc:configuration><proc:param name="attribute">count</proc:param></proc:configuration>
    </proc:invokePipelet>
    <proc:invokePipelet name="fail"><proc:pipelet class="lr_test_pipelets.FailWhenFlagged"/>
    </proc:invokePipelet>
  </sequence>
</process>
"""

RECORDS = 120
NAMES = ["text", "words", "count"]


def _records(prefix: str) -> list[dict]:
    return [{"id": f"{prefix}{i:04d}",
             "attributes": {"text": "  ".join(["alpha", "beta  gamma", "delta"][: i % 3 + 1]),
                            "fail": i % 17 == 5}}
            for i in range(RECORDS)]


def _dead(broker, queue: str, prefix: str) -> set[str]:
    return {json.loads(body)["records"][0]["id"].removeprefix(prefix)
            for _props, body in broker.drain(dlq_name(queue))}


def test_the_service_on_a_standalone_master_commits_what_local_commits(
        spark_cluster, tmp_path, broker_url, pg_url, broker, qname, make_settings, run_service):
    before = spark_cluster.status()  # the session's cluster: other modules ran apps on it
    earlier = {a["id"] for a in before["completedapps"] + before["activeapps"]}
    workflows = write_test_workflows(tmp_path / "workflows")
    (workflows / "cluster_words.xml").write_text(WORKFLOW)
    rule = {"name": "words", "workflow": "ClusterWords", "batch_size": 50, "max_wait_ms": 200,
            "prefetch": 150, "max_retries": 0}

    # local[2]: the service in this process, on the session's SparkSession
    local = make_settings(rules=(ListenerRule(queue=qname("local.in"), **rule),),
                          routers=(RouterRule(queue=qname("local.out")),))
    local = replace(local, workflows_dir=str(workflows))
    push_records(local, local.listeners[0].queue, _records("L"))
    run_service(local, until=lambda s: s["committed"] + s["dead"] >= RECORDS)

    # the standalone master: chalk run in a process of its own, on PostgreSQL
    queue, out = qname("cluster.in"), qname("cluster.out")
    config = write_config(
        tmp_path / "cluster.toml", db=pg_url, broker=broker_url, workflows=workflows,
        spark={"master": spark_cluster.master_url,
               "conf": {"spark.task.maxFailures": "1", "spark.executor.memory": "1g",
                        "spark.sql.shuffle.partitions": "2"}},
        listeners=[{"queue": queue, **rule}], routers=[{"queue": out}])
    cluster_settings = replace(local, blackboard_url=pg_url,
                               listeners=(ListenerRule(queue=queue, **rule),))
    push_records(cluster_settings, queue, _records("C"))
    log = tmp_path / "service.log"
    proc = start_service(config, log)
    try:
        wait_for_log(log, " up: queues ", timeout=300)
        expected_dead = sum(1 for r in _records("C") if r["attributes"]["fail"])
        wait_until(lambda: broker.depth(queue) == 0 and broker.depth(dlq_name(queue)) >= expected_dead
                   and log.read_text(errors="replace").count("batch of ") >= 1, 300,
                   "the standalone service through the queue", every=0.5)
        wait_until(lambda: sum(1 for v in stored_attributes(pg_url, [f"C{i:04d}" for i in range(RECORDS)],
                                                            ["count"]).values()
                               if v and v.get("count") == 1) == RECORDS - expected_dead, 120,
                   "every record committed", every=0.5)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0, log.read_text(errors="replace")[-3000:]
    finally:
        kill_group(proc)
    apps = spark_cluster.status()
    assert [a["name"] for a in apps["completedapps"] + apps["activeapps"]
            if a["id"] not in earlier] == ["chalk"]

    ids = [f"{i:04d}" for i in range(RECORDS)]
    on_local = stored_attributes(local.blackboard_url, ["L" + i for i in ids], NAMES)
    on_cluster = stored_attributes(pg_url, ["C" + i for i in ids], NAMES)
    assert {i: on_local["L" + i] for i in ids} == {i: on_cluster["C" + i] for i in ids}
    committed = [i for i in ids if on_cluster["C" + i] and on_cluster["C" + i].get("count") == 1]
    assert len(committed) == RECORDS - expected_dead
    assert on_cluster["C0001"]["words"] == 3  # "alpha beta gamma": the pipelets ran there
    dead_local, dead_cluster = _dead(broker, local.listeners[0].queue, "L"), _dead(broker, queue, "C")
    assert dead_local == dead_cluster and len(dead_cluster) == expected_dead
