"""Delta processing under kill -9: a full crawl with unchanged, changed, new and unseen
records, while the service (a real ``chalk run`` process) is killed with SIGKILL several
times and ``chalk delta finish`` is killed with SIGKILL between a page's confirms and its
cursor; afterwards each changed record ran once more, no unchanged one did, each unseen
one was deleted and routed as DELETE under one message ID, and the crawl's counts add up."""

from __future__ import annotations

import random
import subprocess
import sys
import time

import pytest
from listener_router_helpers import (
    Broker,
    kill_group,
    message_ids_by_record,
    records_of,
    start_service,
    stored_attributes,
    wait_for_log,
    write_config,
)

from blackboard import RecordLockedError
from listener_router import load_settings, push_records
from listener_router.broker import dlq_name
from listener_router.delta import crawl_status, finish, seen_on_push, start
from listener_router.store import ServiceStore

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.broker]

KILLS = 3
PAGE = 20

WORKFLOW = """<?xml version="1.0"?>
<process name="DeltaCount" xmlns="http://docs.oasis-open.org/wsbpel/2.0/process/executable"
         xmlns:proc="http://www.eclipse.org/smila/processor">
  <sequence>
    <proc:invokePipelet name="count">
      <proc:pipelet class="delta_chaos_pipelets.Increment"/>
    </proc:invokePipelet>
  </sequence>
</process>
"""

PIPELET = '''
from pipelets import Pipelet


class Increment(Pipelet):
    """Adds one to ``count`` (absent counts as 0)."""

    def process(self, blackboard, ids):
        for rid in ids:
            current = blackboard.get_literal(rid, "count").value \\
                if blackboard.has_literals(rid, "count") else 0
            blackboard.set_literal(rid, "count", current + 1)
        return ids
'''

# ``chalk delta finish`` that dies by SIGKILL once its second page of DELETE messages is
# confirmed by the broker, before the crawl's cursor moves past it
DYING_FINISH = '''
import os, signal, sys
from listener_router import load_settings
from listener_router.delta import _crawls
from listener_router.store import ServiceStore

confirmed = []
publish = _crawls.publish_confirmed


def dies(*args, **kwargs):
    publish(*args, **kwargs)
    confirmed.append(1)
    if len(confirmed) == 2:
        os.kill(os.getpid(), signal.SIGKILL)


_crawls.publish_confirmed = dies
settings = load_settings(sys.argv[1])
_crawls.finish(settings, ServiceStore.connect(settings.blackboard_url), "web",
               page=int(sys.argv[2]))
'''


def _doc(rid: str, body: str = "B") -> dict:
    return {"id": rid, "attributes": {"title": f"T {rid}", "body": f"{body} {rid}"}}


def _wait_counts(db: str, expected: dict[str, int | None], timeout: float = 240.0) -> None:
    got: dict[str, int | None] | None = None
    deadline = time.monotonic() + timeout
    while True:
        try:
            found = stored_attributes(db, sorted(expected), ["count"])
        except RecordLockedError:   # the service has some of them on its blackboard
            got = None
        else:
            got = {r: (a or {}).get("count") for r, a in found.items()}
        if got == expected or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    assert got == expected


def test_a_crawl_and_its_finish_are_exactly_once_under_kill_9(tmp_path, broker_url):
    broker = Broker(broker_url)
    tag = f"{int(time.time() * 1000) % 10**8:08d}"
    queue, out = f"delta.{tag}.in", f"delta.{tag}.out"
    workflows = tmp_path / "workflows"
    workflows.mkdir()
    (workflows / "count.xml").write_text(WORKFLOW)
    (workflows / "delta_chaos_pipelets.py").write_text(PIPELET)
    db = f"sqlite:///{tmp_path / 'delta.db'}"
    config = write_config(
        tmp_path / "chalk.toml", db=db, broker=broker_url, workflows=workflows,
        blackboard={"lease_seconds": 30}, broker_options={"delivery_limit": 100},
        engine={"runner": "local"},
        listeners=[{"name": "web", "queue": queue, "workflow": "DeltaCount", "batch_size": 40,
                    "max_wait_ms": 100, "prefetch": 200, "delta": "hash",
                    "delta_attributes": ["title", "body"]}],
        routers=[{"queue": out}])
    settings = load_settings(config)
    store = ServiceStore.connect(db)
    log = tmp_path / "service.log"
    seen = seen_on_push(db, "web")
    old = [f"r{i:03d}" for i in range(300)]
    new = [f"n{i:02d}" for i in range(50)]
    rng = random.Random(35)
    procs: list[subprocess.Popen] = []
    try:
        # crawl 1: every record new, each run once
        first, _ = start(settings, store, "web")
        push_records(settings, queue, [_doc(r) for r in old], source="web", hook=seen)
        assert finish(settings, store, "web").deletions == 0
        procs.append(start_service(config, log))
        _wait_counts(db, dict.fromkeys(old, 1))
        kill_group(procs[-1])
        assert len(broker.drain(out)) == 300

        # crawl 2: r000-r099 as they were, r100-r199 changed, n00-n49 new (two a message),
        # r200-r299 not pushed: 100 DELETEs
        second, _ = start(settings, store, "web")
        pushed = [_doc(r) for r in old[:100]] + [_doc(r, "changed") for r in old[100:200]]
        push_records(settings, queue, pushed, source="web", hook=seen)
        push_records(settings, queue, [_doc(r) for r in new], source="web", hook=seen,
                     per_message=2)
        for round_ in range(1, KILLS + 1):
            procs.append(start_service(config, log))
            wait_for_log(log, " up: queues ", round_ + 1)
            if round_ == 1:  # the finish dies halfway while the service works
                dying = subprocess.run([sys.executable, "-c", DYING_FINISH, str(config),
                                        str(PAGE)], capture_output=True, timeout=300)
                assert dying.returncode == -9, dying.stderr.decode()[-2000:]
                (halfway, _older) = crawl_status(store, source="web")
                assert halfway["state"] == "finishing" and 0 < halfway["deletions"] < 100
            time.sleep(rng.uniform(0.3, 2.0))
            kill_group(procs[-1])
        done = subprocess.run([sys.executable, "-m", "listener_router", "delta", "finish", "web",
                               "--config", str(config)], capture_output=True, timeout=300)
        assert done.returncode == 0, done.stderr.decode()[-2000:]
        procs.append(start_service(config, log, "--idle-exit", "8"))
        procs[-1].wait(timeout=600)
        assert procs[-1].returncode == 0, log.read_text()[-3000:]
    finally:
        for proc in procs:
            if proc.poll() is None:
                kill_group(proc)
        store.close()

    _wait_counts(db, {**dict.fromkeys(old[:100], 1), **dict.fromkeys(old[100:200], 2),
                      **dict.fromkeys(new, 1), **dict.fromkeys(old[200:], None)}, timeout=5)
    messages = broker.drain(out)
    by_record = message_ids_by_record(messages)
    assert set(by_record) == set(old[100:] + new)       # unchanged ones: skipped, not routed
    assert all(len(ids) == 1 for ids in by_record.values()), "a record routed under two IDs"
    deletes = {r["id"] for props, body in messages
               for r in records_of([(props, body)]) if props.headers["operation"] == "DELETE"}
    assert deletes == set(old[200:])
    (row, _older) = crawl_status(ServiceStore.connect(db), source="web")
    assert row["crawl"] == second.id and second.id > first.id
    assert {k: row[k] for k in ("state", "seen", "deletions", "deleted", "kept", "pending")} == {
        "state": "finished", "seen": 250, "deletions": 100, "deleted": 100, "kept": 0,
        "pending": 0}
    assert broker.depth(dlq_name(queue)) == 0 and broker.depth(queue) == 0
    print(f"\ndelta chaos: {KILLS} service kills, one finish killed after a confirmed page, "
          f"{log.read_text(errors='replace').count('batch of ')} batches")
