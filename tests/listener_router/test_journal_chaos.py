"""Exactly once under crashes: SIGKILLs of three subscribers and the publisher, a broker restart."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import orjson
import pytest
from _services import restart_broker
from journal_helpers import APPLIED_DDL, Journal, applied_rows, read_entries, records, wait_until

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


# Three subscribers with different start points, each in its own process and database.
STARTS = {"all": "first", "from1000": "1000", "from2500": "2500"}


def _config(journal: Journal, path: Path, stores: dict[str, str]) -> Path:
    subscribers = "".join(f"""
[[subscriber]]
id = "{name}"
journal = "{journal.rule.name}"
store = "{stores[name]}"
apply = "jr_chaos_apply:apply"
start = "{start}"
batch_size = 20
status_every = 1.0
""" for name, start in STARTS.items())
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
{subscribers}""")
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
def test_three_subscribers_apply_each_entry_once_across_kills_and_a_broker_restart(
        broker_url: str, tmp_path: Path) -> None:
    """Each round SIGKILLs every subscriber at a random moment (12 rounds: 12 kills of each),
    the publishing service in three of them, and restarts the broker in one."""
    journal = Journal(broker_url, tmp_path)
    journal.subscribers += list(STARTS)
    n = 3000
    stores = {name: f"sqlite:///{tmp_path / (name + '.db')}" for name in STARTS}
    config = _config(journal, tmp_path / "chalk.toml", stores)
    (tmp_path / "jr_chaos_apply.py").write_text(APPLY_MODULE)
    service_args = ("run", "--config", str(config))

    def start_subscribers() -> dict[str, subprocess.Popen[bytes]]:
        return {name: _start(tmp_path, f"{name}.log", "subscribe", "--config", str(config),
                             "--subscriber", name) for name in STARTS}

    def total() -> int:
        nonlocal service
        if service.poll() is not None:   # it gave up on a broker that answered too slowly
            service = _start(tmp_path, "service.log", *service_args)
        return sum(_count(store) for store in stores.values())

    rng = random.Random(20)
    journal.push(records(n))
    service = _start(tmp_path, "service.log", *service_args)
    subscribers = start_subscribers()
    kills = {"subscriber": 0, "service": 0}
    kills_with_work_left = 0
    try:
        for round_ in range(12):
            before = total()
            wait_until(lambda before=before: total() > before or _count(stores["all"]) >= n,
                       timeout=180,
                       what=f"progress before kill {round_ + 1}")
            time.sleep(rng.uniform(0.1, 1.2))
            for proc in subscribers.values():
                _kill(proc)
                kills["subscriber"] += 1
            kills_with_work_left += _count(stores["all"]) < n
            if round_ in (1, 4, 8):
                _kill(service)
                kills["service"] += 1
                service = _start(tmp_path, "service.log", *service_args)
            if round_ == 6:
                restart_broker(broker_url)
            subscribers = start_subscribers()
        wait_until(lambda: _count(stores["all"]) >= n, timeout=300, what="every entry applied")
        stream = read_entries(broker_url, journal.rule.stream)
        # Where the offset starts begin, in entry numbers (a copy published again after a
        # kill of the service takes offsets too: the numbers say which entries those are).
        first_seq = {name: orjson.loads(dict(stream)[int(start)])["seq"] if start.isdigit()
                     else 1 for name, start in STARTS.items()}
        wait_until(lambda: all(_count(stores[name]) >= n - first_seq[name] + 1
                               for name in STARTS), timeout=300, what="every subscriber done")
        time.sleep(2.0)   # copies published again after a kill would show now
    finally:
        for proc in (*subscribers.values(), service):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    _kill(proc)
        journal.delete()
    assert kills == {"subscriber": 36, "service": 3}
    assert kills_with_work_left >= 10             # the kills landed while entries were left
    copies = len(stream) - n
    for name in STARTS:
        rows = applied_rows(stores[name])
        by_seq = Counter(row[0] for row in rows)
        assert [seq for seq, times in by_seq.items() if times != 1] == [], name
        assert sorted(by_seq) == list(range(first_seq[name], n + 1)), name   # nothing lost
        offsets = [row[2] for row in rows]
        assert offsets == sorted(offsets), name           # applied in the stream's order
        if STARTS[name].isdigit():
            assert offsets[0] == int(STARTS[name]), name       # began where it was told
    by_record = Counter(row[1] for row in applied_rows(stores["all"]))
    assert set(by_record) == {f"doc-{i}" for i in range(n)}
    assert [rid for rid, times in by_record.items() if times != 1] == []
    print(f"stream: {len(stream)} messages, {copies} copies published again after kills")
