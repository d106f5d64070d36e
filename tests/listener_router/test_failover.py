"""Three service processes on one PostgreSQL and one queue, heartbeat 1 s, time-to-live 5 s.

- The leader is SIGKILLed again and again while records flow: a new leader
  within the time-to-live (plus a heartbeat), every record committed once,
  nothing left in the queue or unsent in the outbox, and a subscriber of
  chalk.events sees one ``record.committed`` per record (by event ID).
- The leader is SIGSTOPped past the time-to-live and continued: another
  member took over meanwhile; the woken one is refused leader work, joins the
  view again at the end, and doubles nothing.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from listener_router_helpers import (
    bind_subscriber,
    kill_group,
    message_ids_by_record,
    start_service,
    stored_counts,
    wait_for_log,
    wait_until,
    write_config,
    write_test_workflows,
)

from blackboard import RecordLockedError
from listener_router import ListenerRule, Settings, push_records
from listener_router.store import ServiceStore

pytestmark = [pytest.mark.slow, pytest.mark.chaos, pytest.mark.broker, pytest.mark.postgres]

HEARTBEAT, TTL = 1.0, 5.0
NAMES = ("m1", "m2", "m3")

# Counting, with a pause per batch: a member killed at any moment most likely
# holds records (the batch it runs and the one it gathered behind it).
SLOW = """<?xml version="1.0"?>
<process name="SlowCounting" xmlns="http://docs.oasis-open.org/wsbpel/2.0/process/executable"
         xmlns:proc="http://www.eclipse.org/smila/processor">
  <sequence>
    <proc:invokePipelet name="count">
      <proc:pipelet class="lr_test_pipelets.Increment"/>
      <proc:configuration><proc:param name="attribute">count</proc:param></proc:configuration>
    </proc:invokePipelet>
    <proc:invokePipelet name="pause"><proc:pipelet class="failover_pause.Pause"/></proc:invokePipelet>
  </sequence>
</process>
"""
PAUSE = """
import time
from pipelets import Pipelet


class Pause(Pipelet):
    def process(self, blackboard, ids):
        time.sleep(0.3)
        return ids
"""


class Cluster:
    """Three ``chalk run`` processes with the same rules, each with its own log."""

    def __init__(self, tmp_path: Path, broker_url: str, pg_url: str, queue: str, out: str):
        self.pg_url, self.queue, self.out = pg_url, queue, out
        workflows = write_test_workflows(tmp_path / "workflows")
        (workflows / "slow.xml").write_text(SLOW)
        (workflows / "failover_pause.py").write_text(PAUSE)
        self.configs, self.logs, self.procs = {}, {}, {}
        for name in NAMES:
            self.configs[name] = write_config(
                tmp_path / f"{name}.toml", db=pg_url, broker=broker_url, workflows=workflows,
                blackboard={"lease_seconds": 120}, engine={"runner": "local"},
                node={"name": name, "heartbeat_seconds": HEARTBEAT, "ttl_seconds": TTL},
                events={"committed": True, "topology": True},
                listeners=[{"name": "count", "queue": queue, "workflow": "SlowCounting",
                            "batch_size": 50, "max_wait_ms": 50, "prefetch": 150}],
                routers=[{"queue": out}])
            self.logs[name] = tmp_path / f"{name}.log"
        self.store = ServiceStore.connect(pg_url)

    def start(self, name: str) -> None:
        self.procs[name] = start_service(self.configs[name], self.logs[name])

    def log(self, name: str) -> str:
        return self.logs[name].read_text(errors="replace")

    def leader(self) -> tuple[str | None, int, int]:
        """(leader, epoch, view size) from the cluster row."""
        state = self.store.cluster.read()
        return state.leader, state.epoch, len(state.view_members)

    def wait_until(self, condition, timeout: float, what: str):
        return wait_until(condition, timeout, what, every=0.05, explain=lambda: "logs:\n" + "\n".join(
            f"--- {n}\n{self.log(n)[-1500:]}" for n in NAMES))

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for name, proc in self.procs.items():
            try:
                assert proc.wait(timeout=60) == 0, self.log(name)[-3000:]
            except Exception:
                kill_group(proc)
                raise

    def kill_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGCONT)  # a frozen one too
            kill_group(proc)


def push_over_time(settings: Settings, queue: str, data: list[dict], chunks: int,
                   seconds: float) -> threading.Thread:
    def run() -> None:
        size = -(-len(data) // chunks)
        for start in range(0, len(data), size):
            push_records(settings, queue, data[start:start + size])
            time.sleep(seconds / chunks)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def all_committed(pg_url: str, ids: list[str]) -> bool:
    try:
        return stored_counts(pg_url, ids) == Counter({1: len(ids)})
    except RecordLockedError:  # a member is still at work on some of them
        return False


@pytest.fixture
def cluster(tmp_path, broker_url, pg_url, qname):
    made = Cluster(tmp_path, broker_url, pg_url, qname("in"), qname("out"))
    yield made
    made.kill_all()


def test_the_leader_killed_again_and_again_while_records_flow(cluster, broker_url, broker, qname):
    kills, records = 3, 1500
    events = qname("events")
    bind_subscriber(broker_url, events)
    settings = Settings(broker_url=broker_url, blackboard_url=cluster.pg_url,
                        listeners=(ListenerRule(name="count", queue=cluster.queue),))
    data = [{"id": f"k{i:05d}", "attributes": {}} for i in range(records)]
    ids = [r["id"] for r in data]
    for name in NAMES:
        cluster.start(name)
        wait_for_log(cluster.logs[name], " up: queues ")
    cluster.wait_until(lambda: cluster.leader()[2] == 3, 60, "a view of three")
    pusher = push_over_time(settings, cluster.queue, data, chunks=30, seconds=20)
    takeovers = []
    for _round in range(kills):
        leader, epoch, _size = cluster.leader()
        cluster.wait_until(lambda n=leader: cluster.store.sql.lease_counts().get(n, 0) > 0, 60,
                           f"{leader} holding records")
        killed_at = time.monotonic()
        kill_group(cluster.procs[leader])
        new = cluster.wait_until(lambda old=leader: cluster.leader()[0] not in (None, old)
                                 and cluster.leader(), TTL + 30, "a new leader")
        takeovers.append(time.monotonic() - killed_at)
        assert new[1] == epoch + 1
        cluster.wait_until(lambda: cluster.leader()[2] == 2, 30, "a view without the dead one")
        cluster.start(leader)  # back under its name, as a new incarnation, at the end
        cluster.wait_until(lambda: cluster.leader()[2] == 3, 60, "a view of three again")
    pusher.join(120)
    cluster.wait_until(lambda: all_committed(cluster.pg_url, ids), 180, "every record committed")
    cluster.stop()

    released = sum(int(line.split(": ")[-1].split()[0]) for name in NAMES
                   for line in cluster.log(name).splitlines() if "failover of" in line)
    print(f"\nnew leader after a SIGKILL: {', '.join(f'{s:.1f}' for s in takeovers)} s "
          f"(heartbeat {HEARTBEAT:g} s, ttl {TTL:g} s); {released} lease(s) released by failover")
    assert released > 0  # the killed held records: failover, not lease expiry, freed them
    assert max(takeovers) < TTL + 2 * HEARTBEAT + 3  # the ttl, one heartbeat, a loaded machine
    assert broker.depth(cluster.queue) == 0                      # nothing stuck
    assert cluster.store.outbox.unsent_count() == 0              # failover published the rest
    assert cluster.store.sql.lease_counts() == {}
    routed = message_ids_by_record(broker.drain(cluster.out))
    assert set(routed) == set(ids) and all(len(m) == 1 for m in routed.values())
    committed: dict[str, set[str]] = {}
    raw = Counter()
    topology = []
    for props, body in broker.drain(events):
        content = json.loads(body)
        raw[content["event"]] += 1
        if content["event"] == "record.committed":
            committed.setdefault(content["record"], set()).add(props.message_id)
        else:
            topology.append(content["seq"])
    print(f"events: {raw['record.committed']} record.committed for {records} records "
          f"({raw['record.committed'] - records} raw duplicate(s), same IDs); "
          f"{len(set(topology))} topology.changed")
    assert set(committed) == set(ids)
    assert all(len(m) == 1 for m in committed.values())  # one event ID per record
    assert len(set(topology)) >= 1 + 2 * kills            # each view, once by ID


def test_a_leader_frozen_past_the_ttl_does_no_leader_work_and_doubles_nothing(
        cluster, broker_url, broker):
    records = 600
    settings = Settings(broker_url=broker_url, blackboard_url=cluster.pg_url,
                        listeners=(ListenerRule(name="count", queue=cluster.queue),))
    data = [{"id": f"s{i:05d}", "attributes": {}} for i in range(records)]
    ids = [r["id"] for r in data]
    for name in NAMES:
        cluster.start(name)
        wait_for_log(cluster.logs[name], " up: queues ")
    cluster.wait_until(lambda: cluster.leader()[2] == 3, 60, "a view of three")
    frozen, epoch, _ = cluster.leader()
    pusher = push_over_time(settings, cluster.queue, data, chunks=20, seconds=8)
    cluster.wait_until(lambda: cluster.log(frozen).count("batch of ") >= 1, 60,
                       f"{frozen} at work")
    os.killpg(cluster.procs[frozen].pid, signal.SIGSTOP)
    try:
        cluster.wait_until(lambda: cluster.leader()[0] not in (None, frozen)
                           and cluster.leader()[2] == 2, TTL + 30, "another leader")
        successor, new_epoch, _ = cluster.leader()
        assert new_epoch == epoch + 1
        before = len(cluster.log(frozen))
        time.sleep(HEARTBEAT * 2)  # frozen a while longer, as a long pause would be
    finally:
        os.killpg(cluster.procs[frozen].pid, signal.SIGCONT)
    cluster.wait_until(lambda: cluster.leader()[2] == 3, 30, "the woken one back in the view")
    pusher.join(60)
    cluster.wait_until(lambda: all_committed(cluster.pg_url, ids), 120, "every record committed")
    assert cluster.leader()[:2] == (successor, new_epoch)  # nobody took over again
    # read before stopping: a member that outlives the others at shutdown
    # rightly takes over from them
    woken = cluster.log(frozen)[before:]
    cluster.stop()

    assert "heartbeat lapsed" in woken
    assert "no longer leads the cluster" in woken
    assert "leads the cluster from now on" not in woken and "failover of" not in woken
    # the successor failed the frozen one over: a warning when it released leases or outbox
    # batches, else the news that it left with nothing to release
    took_over = cluster.log(successor)
    assert f"failover of {frozen}" in took_over or \
        f"{frozen} left the cluster (heartbeat lapsed; nothing was left to release)" in took_over
    assert broker.depth(cluster.queue) == 0
    routed = message_ids_by_record(broker.drain(cluster.out))
    assert set(routed) == set(ids) and all(len(m) == 1 for m in routed.values())
