"""Chaos: a two-stage chain survives SIGKILLs of the service and a broker restart.

queue A → workflow ChaosOne → queue B → workflow ChaosTwo → queue C, over
5,000 records.  The service (a real ``chalk run`` process on Spark) is killed
with SIGKILL at random moments at least ten times and restarted; the broker
is restarted once.  Afterwards each record shows each workflow applied
exactly once, every ID reached C (duplicates only with the same message ID),
and nothing was dead-lettered.
"""

from __future__ import annotations

import os
import random
import time
import uuid
from pathlib import Path

import pytest
from _services import restart_broker
from listener_router_helpers import (
    Broker,
    kill_group,
    message_ids_by_record,
    start_service,
    wait_for_log,
    write_config,
)

from blackboard import Blackboard
from listener_router import ListenerRule, Settings, push_records
from listener_router.broker import dlq_name

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.broker, pytest.mark.spark]

RECORDS = 5000
KILLS = 8   # kill -9s of the service (one suite run: ~20 s each, with its start)

STAGE = """<?xml version="1.0"?>
<process name="{name}" xmlns="http://docs.oasis-open.org/wsbpel/2.0/process/executable"
         xmlns:proc="http://www.eclipse.org/smila/processor">
  <sequence>
    <proc:invokePipelet name="count">
      <proc:pipelet class="chaos_pipelets.Increment"/>
      <proc:configuration><proc:param name="attribute">{counter}</proc:param></proc:configuration>
    </proc:invokePipelet>
  </sequence>
</process>
"""

PIPELET = '''
import time

from pipelets import Pipelet


class Increment(Pipelet):
    """Adds one to an integer attribute (absent counts as 0), after 2 ms of work a record
    (without it the whole chain is done in a second, before most kills come)."""

    parameters = frozenset({"attribute"})

    def process(self, blackboard, ids):
        time.sleep(0.002 * len(ids))
        name = self.config["attribute"]
        for rid in ids:
            current = blackboard.get_literal(rid, name).value if blackboard.has_literals(rid, name) else 0
            blackboard.set_literal(rid, name, current + 1)
        return ids
'''

def batches_seen(log: Path) -> int:
    return log.read_text(errors="replace").count("batch of ")


def test_two_stage_chain_is_exactly_once_under_kills_and_a_broker_restart(tmp_path, broker_url):
    broker = Broker(broker_url)
    tag = uuid.uuid4().hex[:6]
    a, b, c = f"chaos.{tag}.a", f"chaos.{tag}.b", f"chaos.{tag}.c"
    workflows = tmp_path / "workflows"
    workflows.mkdir()
    (workflows / "one.xml").write_text(STAGE.format(name="ChaosOne", counter="stage1"))
    (workflows / "two.xml").write_text(STAGE.format(name="ChaosTwo", counter="stage2"))
    (workflows / "chaos_pipelets.py").write_text(PIPELET)
    db = f"sqlite:///{tmp_path / 'chaos.db'}"
    config = write_config(
        tmp_path / "chalk.toml", db=db, broker=broker_url, workflows=workflows,
        blackboard={"lease_seconds": 30}, broker_options={"delivery_limit": 100},
        listeners=[{"name": name, "queue": queue, "workflow": workflow, "batch_size": 100,
                    "max_wait_ms": 100, "prefetch": 500}
                   for name, queue, workflow in (("one", a, "ChaosOne"), ("two", b, "ChaosTwo"))],
        routers=[{"workflow": "ChaosOne", "queue": b}, {"workflow": "ChaosTwo", "queue": c}],
        spark={"master": "local[2]", "conf": {"spark.sql.shuffle.partitions": "2"}})
    log = tmp_path / "service.log"
    settings = Settings(blackboard_url=db, broker_url=broker_url, delivery_limit=100,
                        listeners=(ListenerRule(name="one", queue=a, workflow="ChaosOne"),))
    data = [{"id": f"c{i:05d}", "attributes": {"n": i}} for i in range(RECORDS)]
    push_records(settings, a, data)
    rng = random.Random(2026)
    mid_work = 0
    started = time.monotonic()
    try:
        for round_ in range(1, KILLS + 1):
            proc = start_service(config, log)
            wait_for_log(log, " up: queues ", round_)
            if round_ % 2 == 0:  # every other round: once work is under way
                mid_work += wait_for_log(log, "batch of ", batches_seen(log) + 1, timeout=20,
                                         required=False)
            if round_ == KILLS // 2:
                time.sleep(rng.uniform(0.2, 1.0))
                restart_broker(mode="app")
            time.sleep(rng.uniform(0.1, 1.5))
            kill_group(proc)
        proc = start_service(config, log, "--idle-exit", "8")
        proc.wait(timeout=600)
        assert proc.returncode == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            kill_group(proc)
        keep = os.environ.get("CHALK_CHAOS_LOG")
        if keep:
            Path(keep).write_bytes(log.read_bytes())
    assert mid_work >= 2, "too few kills came while batches were being processed"
    print(f"\nchaos run: {KILLS} kills ({mid_work} right after a batch), 1 broker restart, "
          f"{batches_seen(log)} batches, "
          f"{time.monotonic() - started:.0f} s")

    by_record = message_ids_by_record(broker.drain(c))
    missing = sorted(set(r["id"] for r in data) - set(by_record))
    assert not missing, f"{len(missing)} record(s) never reached C, e.g. {missing[:5]}"
    assert all(len(ids) == 1 for ids in by_record.values()), "a record reached C under two IDs"
    for queue in (a, b):
        assert broker.depth(dlq_name(queue)) == 0
        assert broker.depth(queue) == 0
    with Blackboard.connect(db) as bb:
        bb.load_many([r["id"] for r in data])
        wrong = [(r["id"], bb.get_attributes(r["id"], ["stage1", "stage2"])) for r in data
                 if bb.get_attributes(r["id"], ["stage1", "stage2"]) != {"stage1": 1, "stage2": 1}]
        bb.invalidate_many([r["id"] for r in data])
    assert not wrong, f"{len(wrong)} record(s) not processed exactly once, e.g. {wrong[:5]}"
    names = [a, b, c, dlq_name(a), dlq_name(b), dlq_name(c)]
    names += [f"{q}.retry.{i}" for q in (a, b) for i in (1, 2, 3)]
    broker.delete(*names)
