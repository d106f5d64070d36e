"""Failover benchmark: from SIGKILL of a member holding records to those records committed
by another member.

Two (``--members``) ``chalk run`` processes share one PostgreSQL database and
one queue, with ``[node] heartbeat_seconds = 1`` and ``ttl_seconds = 5`` (the
options change them).  Each round pushes records, waits until a member holds
leases on some of them (a workflow that pauses per batch makes that likely),
SIGKILLs that member, and measures how long until every record it held at
its death is committed by another member.  Then the member is started again
under its name and the next round begins.

With failover the leader notices the lapsed heartbeat after the
time-to-live, drops the dead member's leases and establishes the new view;
the other members' held messages are gathered again at once.  In the
baseline (a time-to-live of an hour: nobody is seen to die) the
records wait for their leases to expire (``--lease-seconds``, 60 by
default, as in ``[blackboard] lease_seconds``): the behaviour before
failover, the baseline.

Run (the broker and PostgreSQL of scripts/services.sh; the exports pick a
private node and cluster)::

    .venv/bin/python bench/bench_failover.py     # 5 rounds, 3 of the baseline, the ratio
    .venv/bin/python bench/bench_failover.py --only failover   # without the baseline
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from _measure import delete_lanes, machine
from sqlalchemy import create_engine, make_url, text
from sqlalchemy.pool import NullPool

from listener_router import ListenerRule, Settings, push_records
from listener_router.store import ServiceStore

ROOT = Path(__file__).resolve().parents[1]

WORKFLOW = """<?xml version="1.0"?>
<process name="PausedCounting" xmlns="http://docs.oasis-open.org/wsbpel/2.0/process/executable"
         xmlns:proc="http://www.eclipse.org/smila/processor">
  <sequence>
    <proc:invokePipelet name="count"><proc:pipelet class="bench_pause.Count"/></proc:invokePipelet>
    <proc:invokePipelet name="pause"><proc:pipelet class="bench_pause.Pause"/></proc:invokePipelet>
  </sequence>
</process>
"""
PIPELETS = """
import time
from pipelets import Pipelet


class Count(Pipelet):
    def process(self, blackboard, ids):
        for rid in ids:
            has = blackboard.has_literals(rid, "count")
            blackboard.set_literal(rid, "count", (blackboard.get_literal(rid, "count").value if has else 0) + 1)
        return ids


class Pause(Pipelet):
    def process(self, blackboard, ids):
        time.sleep(0.5)
        return ids
"""


def services(command: str) -> str:
    done = subprocess.run(["bash", str(ROOT / "scripts" / "services.sh"), command],
                          capture_output=True, text=True, check=True, timeout=300)
    return done.stdout.strip().splitlines()[-1]


def config(path: Path, *, name: str, db: str, broker: str, workflows: Path, queue: str,
           heartbeat: float, ttl: float, lease: float) -> Path:
    path.write_text(f"""[blackboard]
url = "{db}"
lease_seconds = {lease}
[broker]
url = "{broker}"
[workflows]
dir = "{workflows}"
[engine]
runner = "local"
[node]
name = "{name}"
heartbeat_seconds = {heartbeat}
ttl_seconds = {ttl}
[[listener]]
name = "count"
queue = "{queue}"
workflow = "PausedCounting"
batch_size = 50
max_wait_ms = 50
prefetch = 150
[[router]]
queue = "{queue}.out"
""")
    return path


class Members:
    def __init__(self, folder: Path, names: list[str], **settings: Any):
        self.folder = folder
        self.configs = {n: config(folder / f"{n}.toml", name=n, **settings) for n in names}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str) -> None:
        env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
        log = open(self.folder / f"{name}.log", "ab")  # noqa: SIM115 - the child owns it
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "listener_router", "run", "--config", str(self.configs[name])],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)


def wait(condition: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.02)
    raise SystemExit(f"timed out waiting for {what}")


def committed(store: ServiceStore, ids: list[str]) -> bool:
    found = store.sql.read(ids)
    return len(found) == len(ids) and all(version >= 2 for _doc, version in found.values())


def run(args: argparse.Namespace, *, no_failover: bool,
        rounds_wanted: int) -> dict[str, Any]:
    broker = args.broker or services("broker-url")
    base = make_url(args.postgres or services("start-postgres"))
    dbname = f"bench_failover_{uuid.uuid4().hex[:8]}"
    admin = create_engine(base.set(database="postgres"), isolation_level="AUTOCOMMIT",
                          poolclass=NullPool)
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{dbname}"'))
    db = base.set(database=dbname).render_as_string(hide_password=False)
    ttl = 3600.0 if no_failover else args.ttl
    queue = f"bench.failover.{uuid.uuid4().hex[:6]}"
    names = [f"m{i + 1}" for i in range(args.members)]
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="chalk-failover-") as tmp:
        folder = Path(tmp)
        (folder / "workflows").mkdir()
        (folder / "workflows" / "paused.xml").write_text(WORKFLOW)
        (folder / "workflows" / "bench_pause.py").write_text(PIPELETS)
        members = Members(folder, names, db=db, broker=broker, workflows=folder / "workflows",
                          queue=queue, heartbeat=args.heartbeat, ttl=ttl,
                          lease=args.lease_seconds)
        store = ServiceStore.connect(db)
        settings = Settings(broker_url=broker, blackboard_url=db,
                            listeners=(ListenerRule(name="count", queue=queue),))
        try:
            for name in names:
                members.start(name)
            wait(lambda: len(store.cluster.read().view_members) == len(names), 120,
                 "the view of every member")
            number = 0
            while len(rounds) < rounds_wanted:
                number += 1
                ids = [f"r{number}-{i:04d}" for i in range(args.records)]
                push_records(settings, queue, [{"id": i, "attributes": {}} for i in ids])
                holders = wait(lambda ids=ids: _holders(store, ids, names), 120,
                               "a member holding records")
                victim = max(holders, key=lambda n: len(holders[n]))
                members.kill(victim)
                killed = time.monotonic()
                held = [rid for rid, (owner, _exp) in store.sql.lease_holders(ids).items()
                        if owner == victim and not committed(store, [rid])]
                if held:
                    wait(lambda held=held: committed(store, held), args.lease_seconds + 180,
                         "the dead member's records committed")
                    seconds = time.monotonic() - killed
                    rounds.append({"round": number, "victim": victim, "held": len(held),
                                   "seconds": round(seconds, 2)})
                    print(f"round {number}: killed {victim} holding {len(held)} record(s); "
                          f"committed by another member after {seconds:.2f} s", flush=True)
                else:
                    print(f"round {number}: {victim} committed what it held before it died; "
                          "not counted", flush=True)
                wait(lambda ids=ids: committed(store, ids), 300, "the round's records")
                members.start(victim)
                wait(lambda: len(store.cluster.read().view_members) == len(names)
                     and len(store.nodes.live(ttl)) == len(names), 120, "the victim back")
        finally:
            members.stop()
            store.close()
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)'))
            admin.dispose()
            delete_lanes(broker, [queue, f"{queue}.out"])
    times = [r["seconds"] for r in rounds]
    return {"mode": "lease expiry (no failover)" if no_failover else "failover",
            "members": args.members, "heartbeat_seconds": args.heartbeat,
            "ttl_seconds": ttl, "lease_seconds": args.lease_seconds, "rounds": rounds,
            "median_seconds": round(statistics.median(times), 2), "max_seconds": max(times)}


def _holders(store: ServiceStore, ids: list[str], names: list[str]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for rid, (owner, _expires) in store.sql.lease_holders(ids).items():
        if owner in names:
            found.setdefault(owner, []).append(rid)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds with failover")
    parser.add_argument("--baseline-rounds", type=int, default=3,
                        help="rounds of the lease-expiry baseline")
    parser.add_argument("--only", choices=("failover", "baseline"),
                        help="run one of the two (default: both, and their ratio)")
    parser.add_argument("--members", type=int, default=2)
    parser.add_argument("--records", type=int, default=300, help="records pushed per round")
    parser.add_argument("--heartbeat", type=float, default=1.0, help="[node] heartbeat_seconds")
    parser.add_argument("--ttl", type=float, default=5.0, help="[node] ttl_seconds")
    parser.add_argument("--lease-seconds", type=float, default=60.0,
                        help="[blackboard] lease_seconds")
    parser.add_argument("--broker", help="AMQP URL (default: scripts/services.sh broker-url)")
    parser.add_argument("--postgres", help="SQLAlchemy URL of a database to create the "
                        "bench's own next to (default: scripts/services.sh start-postgres)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    print(f"machine: {machine()}", flush=True)
    results = []
    if args.only != "baseline":
        results.append(run(args, no_failover=False, rounds_wanted=args.rounds))
    if args.only != "failover":
        results.append(run(args, no_failover=True, rounds_wanted=args.baseline_rounds))
    if args.json:
        print(json.dumps(results, indent=2))
    print(f"machine at the end: {machine()}")
    for result in results:
        print(f"{result['mode']}: heartbeat {args.heartbeat:g} s, ttl {result['ttl_seconds']:g} s, "
              f"lease {args.lease_seconds:g} s, {args.members} members, "
              f"{len(result['rounds'])} rounds: SIGKILL -> records committed by another "
              f"member: median {result['median_seconds']:.2f} s, "
              f"max {result['max_seconds']:.2f} s")
    if len(results) == 2:
        fast, slow = results
        print(f"failover / lease-expiry baseline, medians: "
              f"{fast['median_seconds'] / slow['median_seconds']:.2f} "
              f"({slow['median_seconds'] / fast['median_seconds']:.1f}x sooner)")


if __name__ == "__main__":
    main()
