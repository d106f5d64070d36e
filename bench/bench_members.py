"""Throughput of one and of several Chalk services on one queue, against as many
hand-written consumers: does spreading the service over processes raise the rate?

The overhead-bound bench (``bench_listener.py --pipelets user``) runs one
service.  This one runs N services as members of one cluster (each a process
of its own, with its own broker I/O process and worker processes, sharing a
PostgreSQL database, since SQLite is for one process) on one queue of
one-record messages, and the hand-written consumer
(``bench_handwritten.py``) as N processes on one queue and one SQLite file.
The pipelets are the user's three steps (``--pipelets user`` of
``bench_listener.py``), run on the members' own worker processes
(``--runner local``, the default: N JVMs would not fit beside them on a
small machine) or on Spark's warm workers (``--runner spark``, a
``local[2]`` session per member).

Each pass makes a new database and a new queue, publishes ``--messages``
messages and then starts the members.  Its rate counts from the first message
routed (the members' start-up is not counted) to the last, read from the
output queue's depth; its CPU is that of every member's processes (the service, its
broker I/O process, its workers), the database server's and the RabbitMQ
node's over the same span, per message.  ``--rounds`` rounds, each running
every ``--members`` count in turn (Chalk, then the hand-written consumer with
as many processes); the medians and each round's figures are printed.

Run: ``.venv/bin/python bench/bench_members.py --members 1,2 --rounds 3``
(needs RabbitMQ and PostgreSQL: ``--postgres URL`` of a database to create
the bench's own next to, default ``scripts/services.sh start-postgres``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import tempfile
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pika
from _measure import (
    broker_pid,
    cpu_seconds,
    delete_lanes,
    machine,
    median,
    new_database,
    postgres_pids,
    tree_cpu,
)
from bench_failover import services
from bench_handwritten import WORK, body_for, own_cpu
from bench_handwritten import measure as measure_handwritten
from bench_listener import USER_PIPELETS, USER_WORKFLOW, publish

from listener_router import ListenerRule, RouterRule, Service, Settings
from listener_router.broker import connection_parameters, declare_all, ensure_local_broker


def _member(name: str, settings: Settings, idle_exit: float) -> None:
    """One member: a service that runs until nothing has come for ``idle_exit`` s."""
    spark = None
    if settings.runner == "spark":
        import engine
        spark = engine.spark_session(settings.spark_master,
                                     {"spark.sql.shuffle.partitions": "2"})
    with Service(replace(settings, node=name), spark=spark) as service:
        service.run(idle_exit=idle_exit)


def chalk_pass(args: argparse.Namespace, members: int, base: str, first: int) -> dict[str, Any]:
    """``args.messages`` messages through ``members`` services (see the module doc)."""
    n = args.messages
    with new_database(base, "bench_members") as url, \
            tempfile.TemporaryDirectory(prefix="chalk-members-") as tmp:
        workflows = Path(tmp) / "workflows"
        workflows.mkdir()
        (workflows / "bench3.xml").write_text(USER_WORKFLOW)
        (workflows / "bench_user.py").write_text(USER_PIPELETS)
        tag = uuid.uuid4().hex[:6]
        rule = ListenerRule(name="bench", queue=f"bench.{tag}.members.in", workflow="Bench3")
        settings = Settings(blackboard_url=url, broker_url=args.broker,
                            workflows_dir=str(workflows), listeners=(rule,),
                            routers=(RouterRule(queue=f"bench.{tag}.members.out",
                                                attributes=WORK["text"][1]),),
                            runner=args.runner, spark_master="local[2]")
        conn = pika.BlockingConnection(connection_parameters(args.broker))
        declare_all(conn, settings)
        conn.close()
        publish(args.broker, rule.queue,
                [body_for(first + i, per_message=1, work="text") for i in range(n)], tag)
        spawn = multiprocessing.get_context("spawn")
        procs = [spawn.Process(target=_member, args=(f"bench-m{i + 1}", settings, 3.0))
                 for i in range(members)]
        for p in procs:
            p.start()
        rabbit = broker_pid(args.broker)

        def cpu() -> float:
            return (sum(tree_cpu(p.pid) for p in procs if p.pid is not None)
                    + sum(cpu_seconds(p) for p in postgres_pids(url)))

        out = pika.BlockingConnection(connection_parameters(args.broker))
        channel = out.channel()
        started = cpu_at = rabbit_at = 0.0
        first_count = count = 0
        try:
            deadline = time.monotonic() + 60 + n / 500
            while time.monotonic() < deadline:
                count = channel.queue_declare(settings.routers[0].queue,
                                              passive=True).method.message_count
                now = time.perf_counter()
                if count and not first_count:
                    started, first_count = now, count
                    cpu_at, rabbit_at = cpu(), cpu_seconds(rabbit)
                if count >= n:
                    break
                time.sleep(0.02)
            else:
                raise SystemExit(f"{members} member(s) routed {count:,} of {n:,} in time")
            spent, rabbit_spent = cpu() - cpu_at, cpu_seconds(rabbit) - rabbit_at
        finally:
            out.close()
            for p in procs:
                p.join(120)
                if p.is_alive():
                    p.kill()
            delete_lanes(args.broker, [rule.queue, settings.routers[0].queue])
    done = n - first_count
    return {"members": members, "rate": done / (now - started),
            "cpu_us": spent / done * 1e6, "rabbit_us": rabbit_spent / done * 1e6}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--members", default="1,2",
                        help="the member counts, comma-separated (default 1,2)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--runner", choices=["local", "spark"], default="local")
    parser.add_argument("--broker", default=os.environ.get(
        "CHALK_BENCH_BROKER", "amqp://guest:guest@127.0.0.1:5672/%2F"))
    parser.add_argument("--postgres", help="SQLAlchemy URL of a database to create the "
                        "bench's own next to (default: scripts/services.sh start-postgres)")
    parser.add_argument("--json", metavar="FILE", help="write every figure here")
    args = parser.parse_args(argv)
    counts = [int(c) for c in args.members.split(",") if c.strip()]
    if not counts or min(counts) < 1:
        parser.error("--members: positive integers, comma-separated (1,2)")
    ensure_local_broker(args.broker)
    base = args.postgres or services("start-postgres")
    print(f"machine: {machine()}")
    print(f"{args.messages:,} one-record messages a pass, user pipelets, runner {args.runner}; "
          f"members {counts}, {args.rounds} round(s)", flush=True)
    rows: list[dict[str, Any]] = []
    first = 0
    for r in range(args.rounds):
        for members in counts:
            chalk = chalk_pass(args, members, base, first)
            first += args.messages
            hand = measure_handwritten(args.broker, args.messages, processes=members,
                                       first=first)
            first += args.messages
            hand_cpu = own_cpu(hand["cpu_us"])
            row = {"round": r + 1, "members": members, "chalk": chalk,
                   "hand_rate": hand["rate"], "hand_cpu_us": hand_cpu,
                   "ratio": chalk["rate"] / hand["rate"]}
            rows.append(row)
            print(f"round {r + 1}, {members} member(s): chalk {chalk['rate']:,.0f} records/s, "
                  f"CPU {chalk['cpu_us']:.0f} µs a message (members and database); "
                  f"hand-written x{members} {hand['rate']:,.0f} records/s, CPU "
                  f"{hand_cpu:.0f} µs; ratio {row['ratio']:.2f}", flush=True)
    print(f"medians ({machine()}):")
    for members in counts:
        mine = [row for row in rows if row["members"] == members]
        each = ", ".join(f"{m['ratio']:.2f}" for m in mine)
        print(f"  {members} member(s): chalk "
              f"{median([m['chalk']['rate'] for m in mine]):,.0f} records/s, hand-written x"
              f"{members} {median([m['hand_rate'] for m in mine]):,.0f}; ratio "
              f"{median([m['ratio'] for m in mine]):.2f} (rounds "
              f"{each}); CPU "
              f"{median([m['chalk']['cpu_us'] for m in mine]):.0f} against "
              f"{median([m['hand_cpu_us'] for m in mine]):.0f} µs a message")
    if args.json:
        Path(args.json).write_text(json.dumps({"bench": "members", "machine": machine(),
                                               "messages": args.messages, "rows": rows},
                                              indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
