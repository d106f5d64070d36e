"""Exactly once under crashes: SIGKILLs of the subscriber and the publisher, a broker restart."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from _services import restart_broker
from journal_helpers import APPLIED_DDL, Journal, applied_rows, records, wait_until

APPLY_MODULE = f'''
import time
from sqlalchemy import text

def apply(entries, conn):
    conn.execute(text("{APPLIED_DDL}"))
    conn.execute(text("INSERT INTO applied VALUES (:seq, :id, :offset, :version, :op)"),
                 [{{"seq": e.seq, "id": e.id, "offset": e.offset, "version": e.version,
                   "op": e.op}} for e in entries])
    time.sleep(0.25)   # a slow target (80 entries/s): kills land in the middle of batches
'''


def _config(journal: Journal, path: Path, store: str) -> Path:
    path.write_text(f"""
[blackboard]
url = "{journal.db}"
[broker]
url = "{journal.settings.broker_url}"
[workflows]
dir = "{journal.workflows}"
[engine]
runner = "local"
[node]
name = "publisher"

[[listener]]
name = "in"
queue = "{journal.queue}"
workflow = "Counting"
batch_size = 100
max_wait_ms = 50

[[router]]
queue = "t.{journal.tag}.out"

[[journal]]
name = "{journal.rule.name}"
stream = "{journal.rule.stream}"

[[subscriber]]
id = "chaos"
journal = "{journal.rule.name}"
store = "{store}"
apply = "jr_chaos_apply:apply"
batch_size = 20
status_every = 1.0
""")
    return path


def _start(tmp: Path, log: str, *args: str) -> subprocess.Popen[bytes]:
    handle = open(tmp / log, "ab")  # noqa: SIM115 - the child owns it
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    return subprocess.Popen([sys.executable, "-m", "listener_router", *args], cwd=tmp,
                            stdout=handle, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


def _count(store: str) -> int:
    try:
        return len(applied_rows(store))
    except Exception:  # the table is made by the first batch
        return 0


@pytest.mark.slow
@pytest.mark.chaos
def test_each_entry_is_applied_once_across_kills_of_subscriber_and_publisher_and_a_broker_restart(
        broker_url: str, tmp_path: Path) -> None:
    journal = Journal(broker_url, tmp_path)
    journal.subscribers.append("chaos")
    n = 3000
    store = f"sqlite:///{tmp_path / 'subscriber.db'}"
    config = _config(journal, tmp_path / "chalk.toml", store)
    (tmp_path / "jr_chaos_apply.py").write_text(APPLY_MODULE)
    service_args = ("run", "--config", str(config))
    subscriber_args = ("subscribe", "--config", str(config), "--subscriber", "chaos")
    rng = random.Random(20)
    journal.push(records(n))
    service = _start(tmp_path, "service.log", *service_args)
    subscriber = _start(tmp_path, "subscriber.log", *subscriber_args)
    kills = {"subscriber": 0, "service": 0}
    applied_before_last_kill = 0
    try:
        for round_ in range(12):
            before = _count(store)
            wait_until(lambda before=before: _count(store) > before or before >= n,
                       timeout=180, what=f"progress before kill {round_ + 1}")
            time.sleep(rng.uniform(0.1, 1.2))
            _kill(subscriber)
            kills["subscriber"] += 1
            applied_before_last_kill = _count(store)
            if round_ in (1, 4, 8):
                _kill(service)
                kills["service"] += 1
                service = _start(tmp_path, "service.log", *service_args)
            if round_ == 6:
                restart_broker(broker_url)
            subscriber = _start(tmp_path, "subscriber.log", *subscriber_args)
        wait_until(lambda: _count(store) >= n, timeout=300, what="every entry applied")
        time.sleep(2.0)   # copies published again after a kill would show now
    finally:
        for proc in (subscriber, service):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    _kill(proc)
        journal.delete()
    rows = applied_rows(store)
    assert applied_before_last_kill < n            # the kills landed while entries were left
    by_record = Counter(row[1] for row in rows)
    by_seq = Counter(row[0] for row in rows)
    assert kills == {"subscriber": 12, "service": 3}
    assert set(by_record) == {f"doc-{i}" for i in range(n)}
    assert [rid for rid, times in by_record.items() if times != 1] == []
    assert [seq for seq, times in by_seq.items() if times != 1] == []
    assert sorted(by_seq) == list(range(1, n + 1))       # numbered densely, nothing lost
    offsets = [row[2] for row in rows]
    assert offsets == sorted(offsets)                    # applied in the stream's order

