"""Flow control across members on PostgreSQL: a cluster-wide rate limit, and order per key
through retries and kills."""

from __future__ import annotations

import json
import random
import signal
import time
from pathlib import Path

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
from sqlalchemy import text

from listener_router import ListenerRule, Settings, push_records
from listener_router.broker import AmqpLink, OutMessage, connect, declare_all
from listener_router.store import ServiceStore

pytestmark = [pytest.mark.postgres, pytest.mark.broker, pytest.mark.slow]

NAMES = ("m1", "m2", "m3")

ORDERED = """<?xml version="1.0"?>
<process name="Ordered" xmlns="http://docs.oasis-open.org/wsbpel/2.0/process/executable"
         xmlns:proc="http://www.eclipse.org/smila/processor">
  <sequence>
    <proc:invokePipelet name="count">
      <proc:pipelet class="lr_test_pipelets.Increment"/>
      <proc:configuration><proc:param name="attribute">count</proc:param></proc:configuration>
    </proc:invokePipelet>
    <proc:invokePipelet name="flaky"><proc:pipelet class="flow_flaky.FailOnce"/></proc:invokePipelet>
  </sequence>
</process>
"""
FLAKY = """
import os
from pipelets import Pipelet


class FailOnce(Pipelet):
    \"\"\"Fails the first attempt of an update whose "flaky" attribute is true.\"\"\"

    def process(self, blackboard, ids):
        for rid in ids:
            if blackboard.has_literals(rid, "flaky") and blackboard.get_literal(rid, "flaky").value:
                mark = os.path.join(os.environ["FLOW_MARKS"], f"{rid}-{blackboard.get_literal(rid, 'v').value}")
                if not os.path.exists(mark):
                    open(mark, "w").close()
                    raise RuntimeError(f"update {mark} fails once")
        return ids
"""


class Members:
    """Three ``chalk run`` processes on one PostgreSQL, each with a log."""

    def __init__(self, tmp_path: Path, broker_url: str, pg_url: str, rule: dict):
        workflows = write_test_workflows(tmp_path / "workflows")
        (workflows / "ordered.xml").write_text(ORDERED)
        (workflows / "flow_flaky.py").write_text(FLAKY)
        self.configs, self.logs, self.procs = {}, {}, {}
        for name in NAMES:
            self.configs[name] = write_config(
                tmp_path / f"{name}.toml", db=pg_url, broker=broker_url, workflows=workflows,
                engine={"runner": "local"}, node={"name": name, "heartbeat_seconds": 1.0,
                                                  "ttl_seconds": 5.0},
                listeners=[rule], routers=[])
            self.logs[name] = tmp_path / f"{name}.log"

    def start(self, name: str) -> None:
        self.procs[name] = start_service(self.configs[name], self.logs[name])
        wait_for_log(self.logs[name], " up: queues ")

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=60)
            except Exception:
                kill_group(proc)

    def kill_all(self) -> None:
        for proc in self.procs.values():
            kill_group(proc)


@pytest.fixture
def members(tmp_path, broker_url, pg_url, monkeypatch):
    made: list[Members] = []

    def make(rule: dict) -> Members:
        made.append(Members(tmp_path, broker_url, pg_url, rule))
        return made[-1]

    marks = tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setenv("FLOW_MARKS", str(marks))
    yield make
    for m in made:
        m.kill_all()


def test_a_rate_limit_holds_for_the_whole_cluster(members, qname, broker_url, pg_url):
    queue = qname("limited")
    cluster = members({"name": "limited", "queue": queue, "workflow": "Counting",
                       "rate_limit": 200, "max_wait_ms": 50})
    settings = Settings(broker_url=broker_url, blackboard_url=pg_url,
                        listeners=(ListenerRule(name="limited", queue=queue,
                                                workflow="Counting"),))
    push_records(settings, queue, [{"id": f"rl{i:05d}", "attributes": {}}
                                   for i in range(10_000)])
    for name in NAMES:
        cluster.start(name)
    time.sleep(10)                                       # all three members share the rate
    store = ServiceStore.connect(pg_url)

    def committed() -> int:
        with store.engine.connect() as conn:
            return int(conn.execute(text("SELECT count(*) FROM chalk_inbox WHERE queue = :q"),
                                    {"q": queue}).scalar_one())

    start, began = committed(), time.monotonic()
    time.sleep(30)
    rate = (committed() - start) / (time.monotonic() - began)
    per_member = {name: cluster.logs[name].read_text(errors="replace").count("record(s)/s here")
                  for name in NAMES}
    cluster.stop()
    print(f"\nrate over 30 s with 3 members: {rate:.1f} records/s (limit 200)")
    assert 180 <= rate <= 220, rate
    assert all(per_member.values()), per_member           # each member took its share


def _publish(broker_url: str, queue: str, messages: list[tuple[str, dict]]) -> None:
    link = AmqpLink(broker_url, consume=()).start()
    try:
        for start in range(0, len(messages), 500):
            link.publish([OutMessage(routing_key=queue, message_id=mid,
                                     body=json.dumps(body).encode())
                          for mid, body in messages[start:start + 500]]).result(timeout=60)
    finally:
        link.stop()


def test_updates_of_a_record_commit_in_order_through_retries_and_kills(
        members, qname, broker_url, pg_url):
    queue = qname("ordered")
    cluster = members({"name": "ordered", "queue": queue, "workflow": "Ordered",
                       "ordered_by": "record", "max_retries": 5, "backoff_ms": [300],
                       "max_wait_ms": 50, "create_missing": True})
    rng = random.Random(34)
    ids = [f"o{i:03d}" for i in range(100)]
    updates = []
    for v in range(1, 21):
        for rid in rng.sample(ids, len(ids)):
            updates.append((f"{rid}-{v:02d}", {"records": [{"id": rid, "attributes": {
                "v": v, "flaky": rng.random() < 0.1}}]}))
    settings = Settings(broker_url=broker_url, blackboard_url=pg_url, listeners=(ListenerRule(
        name="ordered", queue=queue, workflow="Ordered", ordered_by="record"),))
    conn = connect(broker_url)
    try:
        declare_all(conn, settings)          # with its single active consumer
    finally:
        conn.close()
    _publish(broker_url, queue, updates)
    for name in NAMES:
        cluster.start(name)
    for _kill in range(4):
        time.sleep(4)
        victim = rng.choice(NAMES)
        kill_group(cluster.procs[victim])
        cluster.start(victim)
    store = ServiceStore.connect(pg_url)

    def done() -> bool:
        with store.engine.connect() as conn:
            return int(conn.execute(text("SELECT count(*) FROM chalk_inbox WHERE queue = :q"),
                                    {"q": queue}).scalar_one()) == len(updates)

    wait_until(done, 300, "every update committed", every=1.0,
               explain=lambda: "\n".join(cluster.logs[n].read_text(errors="replace")[-2000:]
                                         for n in NAMES))
    cluster.stop()
    stored = stored_attributes(pg_url, ids, ["v", "count"])
    assert {rid: (a or {}).get("v") for rid, a in stored.items()} == dict.fromkeys(ids, 20)
    assert {rid: (a or {}).get("count") for rid, a in stored.items()} == dict.fromkeys(ids, 20)
    with store.engine.connect() as conn:
        rows = conn.execute(text("SELECT message_id, processed_at FROM chalk_inbox "
                                 "WHERE queue = :q"), {"q": queue}).all()
    by_record: dict[str, list[tuple[float, int]]] = {}
    for mid, at in rows:
        rid, v = mid.rsplit("-", 1)
        by_record.setdefault(rid, []).append((at, int(v)))
    for rid, commits in by_record.items():
        assert [v for _at, v in sorted(commits)] == list(range(1, 21)), rid
