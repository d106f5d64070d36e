"""Warm workers across hosts: a batch on a warm task on another host costs about what it
costs on one host, not a Spark job's fixed cost, and is isolated as on one host.

One member on c1 runs the same single-stage workflow of Python pipelets (the host each
record ran on, its words counted) over the same records, sent at the same steady rate
(batches of a few records), with the same batch settings:

- *cluster*: ``[spark] master`` the lab's standalone master, an executor on w1 and one on
  w2, the driver's ports fixed as docs/cluster.md's example has them, warm workers on
  (the default);
- *jobs*: the same with warm workers off (a Spark job per batch: what the checks must
  tell apart);
- *one host*: ``local[2]`` on c1, warm workers on (the default).

The cluster run must really have run on warm workers on the worker hosts: every record
says it ran on w1 or w2 (both seen), and Spark's own event log of the member shows the
warm job's tasks on both workers' addresses and no job of its own for any batch (the
*jobs* run's batches are jobs there).  Its median run stage (``chalk status --json``:
``seconds.run.p50``) is within 2x of the one-host run's (the *jobs* run's is not).  Then
a batch in which one record ends its worker process (``os._exit``) on w1 or w2: that
record alone is dead-lettered, its neighbours are committed.  The three medians go to
``$CHALK_LAB_FIGURES``, where docs/cluster.md's table comes from.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from _lab import (
    DRIVER_PORTS,
    SPARK_CONF,
    Lab,
    _helpers,
    addr,
    broker_urls,
    create_database,
    drop_database,
    report,
    start_member,
    stop_members,
)

from blackboard import Blackboard
from listener_router.broker import AmqpLink, OutMessage, connect, dlq_name

pytestmark = [pytest.mark.slow]

RECORDS = 1200
RATE = 100.0          # messages of one record a second: batches of a few, a light load
WORKERS = {"w1", "w2"}

PIPELETS = '''
import os
import socket

from pipelets import Pipelet


class Where(Pipelet):
    """Notes on each record the host it ran on."""

    def process(self, blackboard, ids):
        host = socket.gethostname()
        for rid in ids:
            blackboard.set_literal(rid, "ran_on", host)
        return ids


class Words(Pipelet):
    """Counts the words of the record's text; ends its process on a record marked "crash"."""

    def process(self, blackboard, ids):
        for rid in ids:
            if blackboard.has_literals(rid, "crash"):
                os._exit(3)
            text = blackboard.get_literal(rid, "text").value
            blackboard.set_literal(rid, "words", len(text.split()))
        return ids
'''

WORKFLOW = """<?xml version="1.0"?>
<process name="LabWarm" xmlns="http://docs.oasis-open.org/wsbpel/2.0/process/executable"
         xmlns:proc="http://www.eclipse.org/smila/processor">
  <sequence>
    <proc:invokePipelet name="where"><proc:pipelet class="lab_warm_pipelets.Where"/></proc:invokePipelet>
    <proc:invokePipelet name="words"><proc:pipelet class="lab_warm_pipelets.Words"/></proc:invokePipelet>
  </sequence>
</process>
"""

# After the timed records, on the cluster: a message of its own for each of these, sent
# at once, the last one ending the worker process it runs in.
NEIGHBOURS = ["n1", "n2", "n3", "n4"]
CRASH = "crash"


def _run(lab: Lab, tmp: Path, name: str, master: str, conf: dict[str, str], *,
         warm: bool = True, crash: bool = False) -> dict[str, Any]:
    """One run on c1: the run stage's median, where each record ran, the Spark jobs; with
    ``crash``, then a batch of which one record ends its worker."""
    tag = uuid.uuid4().hex[:6]
    queue, out, database = f"lab.{tag}.in", f"lab.{tag}.out", f"lab_{tag}"
    folder = tmp / name
    workflows, events = folder / "workflows", folder / "events"
    workflows.mkdir(parents=True)
    events.mkdir()
    (workflows / "warm.xml").write_text(WORKFLOW)
    (workflows / "lab_warm_pipelets.py").write_text(PIPELETS)
    db = create_database(lab, database)
    config = _helpers().write_config(
        folder / "c1.toml", db=db, broker=broker_urls(), workflows=workflows,
        node={"name": "c1"}, engine={"runner": "spark", "warm_workers": warm},
        spark={"master": master, "conf": {
            **conf, "spark.eventLog.enabled": "true", "spark.eventLog.dir": events.as_uri(),
            "spark.eventLog.compress": "false"}},
        listeners=[{"name": "in", "queue": queue, "workflow": "LabWarm", "batch_size": 50,
                    "max_wait_ms": 100, "prefetch": 200, "max_retries": 0}],
        routers=[{"workflow": "LabWarm", "queue": out}])
    log = folder / "c1.log"
    ids = [f"r{i:05d}" for i in range(RECORDS)]
    extra = NEIGHBOURS + [CRASH] if crash else []
    _store(db, {rid: {"text": f"record {i} of the lab"} for i, rid in enumerate(ids + extra)}
           | ({CRASH: {"text": "x", "crash": True}} if crash else {}))
    procs = {"c1": start_member("c1", config, log)}
    try:
        try:
            _wait(lambda: " up: queues " in log.read_text(errors="replace"), 180, "c1 up", log)
            link = AmqpLink(broker_urls(), consume=()).start()
            conn = connect(broker_urls())
            try:
                ch = conn.channel()

                def depth(q: str) -> int:
                    return int(ch.queue_declare(q, passive=True).method.message_count)

                started, sent = time.monotonic(), []
                for i, rid in enumerate(ids):   # steadily
                    time.sleep(max(0.0, started + i / RATE - time.monotonic()))
                    sent.append(_publish(link, queue, [rid]))
                for future in sent:
                    future.result(timeout=60)
                _wait(lambda: depth(out) >= RECORDS, RECORDS / RATE + 120,
                      f"{RECORDS} records through", log)
                status = json.loads(subprocess.run(
                    [sys.executable, "-m", "listener_router", "status", "--json", "--config",
                     str(config)], capture_output=True, text=True, check=True,
                    timeout=60).stdout)
                if crash:   # at once: one batch
                    _publish(link, queue, extra).result(timeout=60)
                    _wait(lambda: depth(out) >= RECORDS + len(NEIGHBOURS)
                          and depth(dlq_name(queue)) >= 1, 120, "the crash batch settled", log)
                    _method, _props, body = ch.basic_get(dlq_name(queue), auto_ack=True)
                    dead = [r["id"] for r in json.loads(body)["records"]]
            finally:
                conn.close()
                link.stop()
        finally:
            stop_members(procs, {"c1": log})   # the event log is whole once the member stopped
        with Blackboard.connect(db) as bb:
            bb.load_many(ids + extra)
            ran = {rid: bb.get_attributes(rid, ["ran_on", "words"]) for rid in ids + extra}
            bb.invalidate_many(ids + extra)
    finally:
        drop_database(lab, database)
    row = next(r for r in status["statistics"]["rows"] if r["workflow"] == "LabWarm")
    assert row["committed"] == RECORDS, row
    assert all(ran[rid].get("words") == 5 for rid in ids)
    found = {"p50": row["seconds"]["run"]["p50"], "p99": row["seconds"]["run"]["p99"],
             "hosts": {ran[rid]["ran_on"] for rid in ids}, "jobs": _jobs(events),
             "log": log.read_text(errors="replace")}
    if crash:
        found.update(dead=dead, neighbours={rid: ran[rid] for rid in NEIGHBOURS},
                     crashed=ran[CRASH])
    return found


def _store(db: str, records: dict[str, dict[str, Any]]) -> None:
    with Blackboard.connect(db) as bb:
        bb.load_many(list(records))
        for rid, attributes in records.items():
            bb.set_attributes(rid, attributes)
        bb.commit_many(list(records))


def _publish(link: AmqpLink, queue: str, ids: list[str]) -> Any:
    """A message of one record for each of ``ids``; the broker's confirm to come."""
    return link.publish([OutMessage(routing_key=queue, message_id=f"warm-{rid}",
                                    body=json.dumps({"records": [{"id": rid}]}).encode())
                         for rid in ids])


def _wait(condition: Any, timeout: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {timeout:.0f} s\n"
                         f"{log.read_text(errors='replace')[-3000:]}")


def _jobs(events: Path) -> list[dict[str, Any]]:
    """The Spark jobs of the member's event log: each one's description and the addresses
    of the executors its tasks ran on."""
    jobs: dict[int, dict[str, Any]] = {}
    stage_job: dict[int, int] = {}
    for path in events.rglob("events_*"):   # Spark's rolling event log: a folder of parts
        for line in path.read_text().splitlines():
            event = json.loads(line)
            if event["Event"] == "SparkListenerJobStart":
                jobs[event["Job ID"]] = {
                    "description": (event.get("Properties") or {}).get("spark.job.description"),
                    "hosts": set()}
                for stage in event["Stage IDs"]:
                    stage_job[stage] = event["Job ID"]
            # (TaskStart: a warm task is still running when the member stops)
            elif event["Event"] == "SparkListenerTaskStart" and event["Stage ID"] in stage_job:
                jobs[stage_job[event["Stage ID"]]]["hosts"].add(event["Task Info"]["Host"])
    return list(jobs.values())


def test_a_batch_on_warm_workers_on_other_hosts_takes_at_most_twice_its_time_on_one_host(
        lab, tmp_path):
    on_cluster = {**SPARK_CONF, **DRIVER_PORTS, "spark.driver.host": addr("c1"),
                  "spark.driver.bindAddress": addr("c1")}
    cluster = _run(lab, tmp_path, "cluster", lab.spark_master, on_cluster, crash=True)
    # the same without warm workers: a Spark job per batch (what the checks below must tell)
    jobs = _run(lab, tmp_path, "jobs", lab.spark_master, on_cluster, warm=False)
    one_host = _run(lab, tmp_path, "one-host", "local[2]",
                    {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"})
    report("warm workers: a batch's run stage on other hosts and on one", {
        "records": RECORDS, "rate": RATE,
        **{f"{name}_{q}": round(run[q], 4) for name, run in
           (("cluster", cluster), ("cluster_jobs", jobs), ("one_host", one_host))
           for q in ("p50", "p99")},
        "ratio": round(cluster["p50"] / one_host["p50"], 2),
        "ratio_jobs": round(jobs["p50"] / one_host["p50"], 2)}, tmp_path)

    assert cluster["hosts"] == WORKERS, cluster["hosts"]
    assert one_host["hosts"] == {"c1"}, one_host["hosts"]
    assert _warm_on(cluster) == {addr(w) for w in WORKERS}, cluster["jobs"]
    assert _own_jobs(cluster) == 0, \
        f"batches ran as Spark jobs of their own:\n{cluster['log'][-3000:]}"
    assert cluster["p50"] <= 2 * one_host["p50"], (cluster["p50"], one_host["p50"])
    # Isolation as on one host: the record that ended its worker on w1 or w2 is dead-lettered
    # alone, its neighbours in the batch are committed.
    assert cluster["dead"] == [CRASH] and cluster["crashed"] == {}, cluster["crashed"]
    assert all(got["words"] == 5 and got["ran_on"] in WORKERS
               for got in cluster["neighbours"].values()), cluster["neighbours"]
    assert "isolating" in cluster["log"]
    # A job per batch is seen as such, and is not within 2x.
    assert jobs["hosts"] == WORKERS and _warm_on(jobs) == set() and _own_jobs(jobs) > 0
    assert jobs["p50"] > 2 * one_host["p50"], (jobs["p50"], one_host["p50"])


def _warm_on(run: dict[str, Any]) -> set[str]:
    """The addresses the warm workers' tasks ran on."""
    return set().union(*(j["hosts"] for j in run["jobs"] if j["description"] == "chalk warm workers"))


def _own_jobs(run: dict[str, Any]) -> int:
    """Spark jobs of the workflow's batches (not on warm workers)."""
    return sum((j["description"] or "").startswith("workflow LabWarm") for j in run["jobs"])
