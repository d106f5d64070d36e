"""The runner's faults are never a record's: the service killed from outside, and warm
workers that never start.

- SIGKILL of the service at random moments, five times, with ``runner =
  "local"`` and with small batches on the service's workers: no record is
  blamed (nothing dead-lettered), every record is committed and routed once.
  Pipelets never run in the service's process, so its death is never a
  record's fault.
- Spark's Python workers that never start (an interpreter that never
  connects back): the batch runs on the service's workers within
  ``batch_timeout``, no attempt is counted, no record is blamed, and the log
  says which runner did not start.
"""

from __future__ import annotations

import os
import random
import time
import uuid
from pathlib import Path

import pytest
from listener_router_helpers import (
    Broker,
    kill_group,
    message_ids_by_record,
    start_service,
    stored_counts,
    wait_for_log,
    write_config,
    write_test_workflows,
)

from listener_router import ListenerRule, Settings, push_records
from listener_router.broker import dlq_name
from listener_router.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.broker]

RECORDS = 400
KILLS = 5


def _config(tmp_path: Path, broker_url: str, queue: str, out: str, **engine: object) -> Path:
    return write_config(
        tmp_path / "chalk.toml", db=f"sqlite:///{tmp_path / 'chalk.db'}", broker=broker_url,
        workflows=write_test_workflows(tmp_path / "workflows"),
        blackboard={"lease_seconds": 10}, engine={"batch_timeout": 10, **engine},
        listeners=[{"name": "in", "queue": queue, "workflow": "Slow", "batch_size": 20,
                    "max_wait_ms": 100, "max_retries": 0}],
        routers=[{"queue": out}], spark={"master": "local[2]"})


@pytest.mark.chaos
@pytest.mark.parametrize("mode", ["local", "service"])
def test_the_service_killed_from_outside_five_times_dead_letters_no_record(
        mode, tmp_path, broker_url, capsys):
    broker = Broker(broker_url)
    tag = uuid.uuid4().hex[:6]
    queue, out = f"kill.{tag}.in", f"kill.{tag}.out"
    engine = {"runner": "local"} if mode == "local" else {"local_below": 1000}
    config = _config(tmp_path, broker_url, queue, out, **engine)
    db = f"sqlite:///{tmp_path / 'chalk.db'}"
    settings = Settings(blackboard_url=db, broker_url=broker_url,
                        listeners=(ListenerRule(name="in", queue=queue, workflow="Slow"),))
    ids = [f"k{i:04d}" for i in range(RECORDS)]
    push_records(settings, queue, [{"id": rid, "attributes": {"sleep": 0.02}} for rid in ids])
    log = tmp_path / "service.log"
    rng = random.Random(43)
    proc = None
    try:
        for round_ in range(1, KILLS + 1):
            proc = start_service(config, log)
            wait_for_log(log, " up: queues ", round_)
            time.sleep(rng.uniform(0.3, 2.5))   # while batches run on the workers
            os.kill(proc.pid, 9)                 # the service alone, as the OOM killer would
            proc.wait(30)
            kill_group(proc)                     # what it leaves (its JVM) before the next
        proc = start_service(config, log, "--idle-exit", "6")
        assert proc.wait(timeout=600) == 0, log.read_text()[-3000:]
    finally:
        if proc is not None and proc.poll() is None:
            kill_group(proc)
    text = log.read_text(errors="replace")
    assert text.count(" up: queues ") == KILLS + 1
    assert broker.depth(dlq_name(queue)) == 0, broker.drain(dlq_name(queue))[:3]
    assert stored_counts(db, ids) == {1: RECORDS}
    routed = message_ids_by_record(broker.drain(out))
    assert set(routed) == set(ids) and all(len(m) == 1 for m in routed.values())
    assert main(["jobs", "--state", "dead", "--config", str(config)]) == 0
    assert "k0" not in capsys.readouterr().out
    broker.delete(queue, out, dlq_name(queue))


@pytest.mark.spark
def test_warm_workers_that_never_start_cost_no_attempt_and_blame_no_record(
        tmp_path, broker_url, capsys):
    broker = Broker(broker_url)
    tag = uuid.uuid4().hex[:6]
    queue, out = f"nostart.{tag}.in", f"nostart.{tag}.out"
    # Spark's Python workers: an interpreter that never connects back (for a minute)
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\nexec sleep 60\n")
    python.chmod(0o755)
    timeout = 30
    config = write_config(
        tmp_path / "chalk.toml", db=f"sqlite:///{tmp_path / 'chalk.db'}", broker=broker_url,
        workflows=write_test_workflows(tmp_path / "workflows"),
        engine={"batch_timeout": timeout, "local_below": 0},
        listeners=[{"name": "in", "queue": queue, "workflow": "Counting", "batch_size": 50,
                    "max_wait_ms": 100, "max_retries": 0}],
        routers=[{"queue": out}],
        spark={"master": "local[2]", "conf": {"spark.pyspark.python": str(python)}})
    db = f"sqlite:///{tmp_path / 'chalk.db'}"
    log = tmp_path / "service.log"
    proc = start_service(config, log)
    try:
        wait_for_log(log, " up: queues ", timeout=180)
        settings = Settings(blackboard_url=db, broker_url=broker_url,
                            listeners=(ListenerRule(name="in", queue=queue, workflow="Counting"),))
        ids = [f"n{i}" for i in range(20)]
        pushed = time.monotonic()
        push_records(settings, queue, [{"id": rid, "attributes": {}} for rid in ids])
        deadline = pushed + 120
        while broker.depth(out) < len(ids) and time.monotonic() < deadline:
            time.sleep(0.2)
        took = time.monotonic() - pushed
    finally:
        kill_group(proc)
    text = log.read_text(errors="replace")
    assert broker.depth(out) == len(ids), text[-3000:]
    assert took < timeout + 10, (took, text[-3000:])  # elsewhere, well within its timeout
    assert "the warm workers did not start" in text
    assert "on service workers" in text     # where the batch went instead
    assert broker.depth(dlq_name(queue)) == 0
    capsys.readouterr()
    assert main(["jobs", "--state", "retrying", "--config", str(config)]) == 0
    assert "n1" not in capsys.readouterr().out   # no attempt counted
    assert stored_counts(db, ids) == {1: len(ids)}
    assert set(message_ids_by_record(broker.drain(out))) == set(ids)
    broker.delete(queue, out, dlq_name(queue))
