"""Two OS processes against one PostgreSQL: locks, takeover after kill -9, stale commits."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from blackboard import Blackboard, RecordLockedError

HOLDER = Path(__file__).with_name("_holder.py")
ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.postgres


class Holder:
    def __init__(self, url: str, owner: str, lease_seconds: float, rid: str):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        self.proc = subprocess.Popen(
            [sys.executable, str(HOLDER), url, owner, str(lease_seconds), rid],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        assert self.read() == "LOADED"

    def read(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        assert line, f"holder died (exit {self.proc.poll()})"
        return line

    def send(self, command: str) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.read()

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


@pytest.fixture
def holders() -> Iterator[list[Holder]]:
    started: list[Holder] = []
    yield started
    for holder in started:
        holder.close()


def test_a_record_held_by_another_process_is_locked_naming_it(pg_url: str, holders: list) -> None:
    holders.append(Holder(pg_url, "proc-A", 30, "doc"))
    with Blackboard.connect(pg_url, owner="main") as bb:
        with pytest.raises(RecordLockedError) as caught:
            bb.load("doc", lock_timeout=0.3)
        assert caught.value.holders == {"doc": "proc-A"}
        assert "held by 'proc-A'" in str(caught.value)
        assert holders[0].send("commit") == "COMMITTED"
        bb.load("doc")
        assert bb.get_literal("doc", "who").value == "proc-A"


def test_the_lease_of_a_killed_process_expires_and_is_taken_over(pg_url: str, holders: list) -> None:
    holder = Holder(pg_url, "proc-A", 1.0, "doc")
    holders.append(holder)
    holder.kill()
    with Blackboard.connect(pg_url, owner="main") as bb:
        with pytest.raises(RecordLockedError, match="proc-A"):
            bb.load("doc")  # dead, but its lease has not lapsed yet
        started = time.monotonic()
        bb.load("doc", lock_timeout=10)
        assert time.monotonic() - started < 5
        assert bb.is_new("doc")  # the dead process's work was never committed
        bb.set_literal("doc", "who", "main")
        bb.commit("doc")


def test_a_stale_holders_commit_is_rejected(pg_url: str, holders: list) -> None:
    with Blackboard.connect(pg_url, owner="setup") as bb:
        bb.create("doc")
        bb.commit("doc")
    holder = Holder(pg_url, "proc-A", 0.5, "doc")
    holders.append(holder)
    time.sleep(0.7)  # proc-A stalls past its lease
    with Blackboard.connect(pg_url, owner="main") as bb:
        bb.load("doc")
        # main holds it now: proc-A's commit names main
        assert json.loads(holder.send("commit").split(" ", 1)[1]) == {"doc": "main"}
        bb.set_literal("doc", "who", "main")
        bb.commit("doc")
    # released, but storage moved on: the version check refuses proc-A
    reply = holder.send("commit")
    assert reply.startswith("STALE") and "version 2 in storage" in reply
    with Blackboard.connect(pg_url) as bb:
        bb.load("doc")
        assert bb.get_literal("doc", "who").value == "main"
