"""The cost curve: records/s and CPU per record as one thing grows, the rest fixed.

The fixed point: one record per message, a 200-byte record, a 3-pipelet
workflow, SQLite, one service process, the service's default settings (no
batch keys), Spark local[2].  The pipelets (``--pipelets``): ``user`` (the
default) normalizes whitespace, counts words and hashes the text in Python
against the Blackboard API, a module next to the workflow as a user writes
it (their batches go to Spark's warm workers); ``builtin`` does the same with
NormalizeWhitespace, WordCount and Fingerprint, whose DataFrame forms run in
the JVM.
From there, one axis at a time:

* records per message: 1, 10, 100;
* record size: 200 B, 10 KB of text, a 1 MB attachment (records stored
  first, their IDs published);
* pipelets in the workflow: 1, 3, 10, 30 (the three above, repeated);
* store: SQLite, PostgreSQL (``--pg URL``; skipped without one);
* service processes: 1, 2 (on PostgreSQL, as a cluster; skipped without one).
  Here the messages are published once the processes consume, and the time
  includes publishing: a backlog already waiting when they start would go
  to the first consumer, up to its prefetch (65,535 by default).

Each point: its messages published, then the service process(es) — each
with its SparkSession kept warm from the points before — let go; the time
from then until every routed message (one per record) is in the output
queue.  CPU per record
is the CPU every process spent meanwhile (the services and all below them:
broker I/O, Spark's JVM and Python workers; the RabbitMQ node; the
PostgreSQL server) over the records: on two cores that sum bounds the rate.
A first point, not reported, warms each service's JVM.

Writes ``docs/perf/curve.md`` (the table, with the machine it was made on),
``docs/perf/curve.json`` and one PNG per axis, ``docs/perf/curve-<axis>.png``.

Run: ``.venv/bin/python bench/curve.py --pg postgresql+psycopg://…``
(``--records N`` per point, default 20,000; ``--quick`` for a look at
2,000; ``--out DIR``).  Needs ``pip install -e '.[bench]'`` (matplotlib).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pika
from _measure import broker_pid, cpu_seconds, descendants, machine, postgres_pids
from bench_listener import USER_PIPELETS, delete_queues, publish

from listener_router import ListenerRule, RouterRule, Settings, push_records
from listener_router.broker import (
    connection_parameters,
    declare_all,
    dlq_name,
    ensure_local_broker,
    retry_name,
)

_STEPS = (
    ('<proc:pipelet class="pipelets.text.NormalizeWhitespace"/>',
     '<proc:param name="attribute">text</proc:param><proc:param name="lowercase">true</proc:param>'),
    ('<proc:pipelet class="pipelets.text.WordCount"/>',
     '<proc:param name="attribute">text</proc:param><proc:param name="output">words{i}</proc:param>'),
    ('<proc:pipelet class="pipelets.fingerprint.Fingerprint"/>',
     '<proc:param name="attributes">text</proc:param><proc:param name="output">hash{i}</proc:param>'),
)


# ``--pipelets user``: the same steps in Python against the Blackboard API (bench_listener's
# module next to the workflow; no DataFrame form, not declared ``runs_in_service``).
_USER_STEPS = (
    ('<proc:pipelet class="bench_user.Normalize"/>', ''),
    ('<proc:pipelet class="bench_user.Count"/>', '<proc:param name="output">words{i}</proc:param>'),
    ('<proc:pipelet class="bench_user.Hash"/>', '<proc:param name="output">hash{i}</proc:param>'),
)


def workflow(name: str, pipelets: int, user: bool = False) -> str:
    steps = []
    for i in range(pipelets):
        cls, params = (_USER_STEPS if user else _STEPS)[i % 3]
        steps.append(f'    <proc:invokePipelet name="p{i}">{cls}\n'
                     f'      <proc:configuration>{params.format(i=i)}</proc:configuration>\n'
                     f'    </proc:invokePipelet>')
    return ('<?xml version="1.0"?>\n'
            f'<process name="{name}" xmlns="http://docs.oasis-open.org/wsbpel/2.0/process/executable"\n'
            '         xmlns:proc="http://www.eclipse.org/smila/processor">\n'
            '  <sequence>\n' + "\n".join(steps) + '\n  </sequence>\n</process>\n')


@dataclass(frozen=True)
class Point:
    axis: str
    label: str
    x: float
    per_message: int = 1
    size: str = "200 B"
    pipelets: int = 3
    store: str = "sqlite"
    processes: int = 1
    live: bool = False  # published once the services consume (else: before they start)


def points(with_pg: bool) -> list[Point]:
    out = [Point("records per message", str(n), n, per_message=n) for n in (1, 10, 100)]
    out += [Point("record size", s, x, size=s) for s, x in (("200 B", 200), ("10 KB", 10_000),
                                                           ("1 MB attachment", 1_000_000))]
    out += [Point("pipelets", str(n), n, pipelets=n) for n in (1, 3, 10, 30)]
    if with_pg:
        out += [Point("store", s, x, store=s) for s, x in (("sqlite", 0), ("postgresql", 1))]
        out += [Point("service processes", str(n), n, store="postgresql", processes=n, live=True)
                for n in (1, 2)]
    return out


def _text(i: int, size: str) -> str:
    words = f"  Some   TEXT number {i} with a few words to count and hash. "
    length = 10_000 if size == "10 KB" else 200
    return (words * (length // len(words) + 1))[:length]


def record_count(point: Point, records: int) -> int:
    if point.size == "10 KB":
        return max(point.per_message, records // 4)
    if point.size == "1 MB attachment":
        return max(50, records // 100)
    return records


def worker(conn: Any, stop: Any, master: str) -> None:
    """One service process: a warm SparkSession, a Service for each point it is sent."""
    import engine
    from listener_router import Service

    spark = engine.spark_session(master, {"spark.sql.shuffle.partitions": "2"})
    conn.send(os.getpid())
    while True:
        settings = conn.recv()
        if settings is None:
            return
        # each process a member of its own (a point's processes share the rest)
        settings = replace(settings, node=f"{settings.node}-{os.getpid()}")
        with Service(settings, spark=spark) as service:
            conn.send("ready")
            conn.recv()  # go
            stats = service.run(until=lambda _s: stop.is_set())
        conn.send({"committed": stats["committed"], "batches": stats["batches"],
                   "local_batches": stats["local_batches"]})


class Curve:
    def __init__(self, args: argparse.Namespace, tmp: Path):
        self.args, self.tmp = args, tmp
        self.rabbit = broker_pid(args.broker)
        ctx = multiprocessing.get_context("spawn")
        self.stop = ctx.Event()
        self.workers: list[tuple[Any, Any]] = []
        for _ in range(2 if args.pg else 1):
            parent, child = ctx.Pipe()
            process = ctx.Process(target=worker, args=(child, self.stop, args.master), daemon=True)
            process.start()
            self.workers.append((process, parent))
        for _process, pipe in self.workers:
            pipe.recv()
        self.serial = 0

    def settings(self, point: Point) -> Settings:
        self.serial += 1
        tag = f"{uuid.uuid4().hex[:6]}"
        folder = self.tmp / f"w{self.serial}"
        folder.mkdir()
        user = self.args.pipelets == "user"
        (folder / "curve.xml").write_text(workflow("Curve", point.pipelets, user))
        if user:
            (folder / "bench_user.py").write_text(USER_PIPELETS)
        if point.store == "sqlite":
            url = f"sqlite:///{self.tmp / f'curve{self.serial}.db'}"
        else:
            url = self.args.pg
        return Settings(blackboard_url=url, broker_url=self.args.broker, workflows_dir=str(folder),
                        listeners=(ListenerRule(name="curve", queue=f"curve.{tag}.in", workflow="Curve"),),
                        routers=(RouterRule(queue=f"curve.{tag}.out", attributes=("words0",)),),
                        node=f"curve-{tag}")

    def _publish(self, settings: Settings, point: Point, records: int) -> int:
        queue = settings.listeners[0].queue
        prefix = f"r{self.serial}-"
        if point.size == "1 MB attachment":
            from blackboard import Blackboard

            blob = os.urandom(1 << 20)
            ids = [f"{prefix}{i:07d}" for i in range(records)]
            with Blackboard.connect(settings.blackboard_url) as bb:
                for start in range(0, records, 20):
                    part = ids[start:start + 20]
                    bb.load_many(part)
                    for rid in part:
                        bb.set_attributes(rid, {"text": _text(0, "200 B")})
                        bb.set_attachment(rid, "file", blob)
                    bb.commit_many(part)
            return push_records(settings, queue, [{"id": rid} for rid in ids], store=False,
                                per_message=point.per_message)
        bodies = []
        for m in range(records // point.per_message):
            recs = [{"id": f"{prefix}{m * point.per_message + k:07d}",
                     "attributes": {"text": _text(m, point.size)}} for k in range(point.per_message)]
            bodies.append(json.dumps({"records": recs}).encode())
        publish(settings.broker_url, queue, bodies, uuid.uuid4().hex[:6])
        return len(bodies)

    def _cpu(self, pids: list[int], settings: Settings) -> float:
        below = [p for w in pids for p in descendants(w)]
        total = sum(cpu_seconds(p) for p in [*pids, *below])
        if self.rabbit is not None:
            total += cpu_seconds(self.rabbit)
        if not settings.blackboard_url.startswith("sqlite"):
            total += sum(cpu_seconds(p) for p in postgres_pids(settings.blackboard_url))
        return total

    def run(self, point: Point, records: int) -> dict[str, Any]:
        settings = self.settings(point)
        conn = pika.BlockingConnection(connection_parameters(settings.broker_url))
        declare_all(conn, settings)
        conn.close()
        records = record_count(point, records)
        messages = records // point.per_message
        if not point.live:
            messages = self._publish(settings, point, records)
        records = messages * point.per_message
        used = self.workers[:point.processes]
        self.stop.clear()
        for _process, pipe in used:
            pipe.send(settings)
        for _process, pipe in used:
            pipe.recv()
        pids = [process.pid for process, _pipe in used]
        before = self._cpu(pids, settings)
        started = time.perf_counter()
        for _process, pipe in used:
            pipe.send("go")
        if point.live:
            self._publish(settings, point, records)
        out = settings.routers[0].queue or ""
        conn = pika.BlockingConnection(connection_parameters(settings.broker_url))
        channel = conn.channel()
        deadline = time.monotonic() + self.args.timeout
        # One routed message per record.
        while channel.queue_declare(out, passive=True).method.message_count < records:
            if time.monotonic() > deadline:
                raise SystemExit(f"{point}: not every message routed in {self.args.timeout} s")
            time.sleep(0.05)
        elapsed = time.perf_counter() - started
        cpu = self._cpu(pids, settings) - before
        conn.close()
        self.stop.set()
        stats = [pipe.recv() for _process, pipe in used]
        queue = settings.listeners[0].queue
        delete_queues(settings.broker_url, queue, dlq_name(queue), out, dlq_name(out),
                      *(retry_name(queue, i) for i in range(1, 4)))
        return {"axis": point.axis, "label": point.label, "x": point.x, "records": records,
                "messages": messages, "seconds": elapsed, "records_per_s": records / elapsed,
                "cpu_ms_per_record": cpu / records * 1000,
                "batches": sum(s["batches"] for s in stats),
                "local_batches": sum(s["local_batches"] for s in stats)}

    def close(self) -> None:
        for process, pipe in self.workers:
            pipe.send(None)
            process.join(timeout=60)


def write(out: Path, results: list[dict[str, Any]], head: str, pipelets: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    (out / "curve.json").write_text(json.dumps({"machine": head, "pipelets": pipelets,
                                                "points": results}, indent=1))
    which = ("written in Python against the Blackboard API" if pipelets == "user"
             else "the built-ins, with DataFrame forms")
    lines = ["# The cost curve", "",
             f"Made with `python bench/curve.py --pipelets {pipelets}` on: {head}.", "",
             "Each row changes one thing from the fixed point (1 record per message, 200 B, "
             f"3 pipelets {which}, SQLite, 1 process, default settings, Spark local[2]).", "",
             "| axis | value | records | records/s | CPU ms/record | batches (in the service) |",
             "| --- | --- | ---: | ---: | ---: | ---: |"]
    axes: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        axes.setdefault(r["axis"], []).append(r)
        lines.append(f"| {r['axis']} | {r['label']} | {r['records']:,} | {r['records_per_s']:,.0f} | "
                     f"{r['cpu_ms_per_record']:.3f} | {r['batches']} ({r['local_batches']}) |")
    for axis, rows in axes.items():
        name = axis.replace(" ", "-")
        lines += ["", f"![{axis}](curve-{name}.png)"]
        fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4))
        labels = [r["label"] for r in rows]
        left.bar(labels, [r["records_per_s"] for r in rows], color="tab:blue")
        left.set_title("records/s")
        right.bar(labels, [r["cpu_ms_per_record"] for r in rows], color="tab:orange")
        right.set_title("CPU ms per record")
        for ax in (left, right):
            ax.set_xlabel(axis)
        fig.suptitle(f"Chalk cost curve: {axis}", fontsize=10)
        fig.tight_layout()
        fig.savefig(out / f"curve-{name}.png", dpi=100)
        plt.close(fig)
    (out / "curve.md").write_text("\n".join(lines) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=20_000,
                        help="records per point (10 KB: a quarter, 1 MB: a hundredth, ≥ 50)")
    parser.add_argument("--quick", action="store_true", help="2,000 records per point")
    parser.add_argument("--pg", default=os.environ.get("CHALK_BENCH_POSTGRES_URL"),
                        help="PostgreSQL URL for the store and processes axes (default: "
                             "$CHALK_BENCH_POSTGRES_URL; without one those axes are skipped)")
    parser.add_argument("--broker", default=os.environ.get(
        "CHALK_BENCH_BROKER", "amqp://guest:guest@127.0.0.1:5672/%2F"))
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--pipelets", choices=["user", "builtin"], default="user",
                        help="user: the steps in Python against the Blackboard API (default); "
                             "builtin: NormalizeWhitespace, WordCount, Fingerprint (DataFrame "
                             "forms in the JVM)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds a point may take")
    parser.add_argument("--only", help="only the axis whose name contains this")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "docs" / "perf"))
    args = parser.parse_args()
    records = 2_000 if args.quick else args.records
    ensure_local_broker(args.broker)
    head = machine()
    print(f"machine: {head}", flush=True)
    todo = [p for p in points(bool(args.pg)) if not args.only or args.only in p.axis]
    curve = Curve(args, Path(tempfile.mkdtemp(prefix="chalk-curve-")))
    results = []
    try:
        print("warming up", flush=True)
        for n in range(len(curve.workers)):
            curve.run(replace(Point("warm-up", "", 0), processes=n + 1,
                              store="sqlite" if n == 0 else "postgresql"), records)
        for point in todo:
            one = curve.run(point, records)
            results.append(one)
            print(f"{point.axis:>20} {point.label:>16}: {one['records']:>7,} records, "
                  f"{one['records_per_s']:>8,.0f} records/s, {one['cpu_ms_per_record']:.3f} CPU ms/record, "
                  f"{one['batches']} batches ({one['local_batches']} in the service)", flush=True)
    finally:
        curve.close()
    write(Path(args.out), results, head, args.pipelets)
    print(f"wrote {args.out}/curve.md and its plots")
    return 0


if __name__ == "__main__":
    sys.exit(main())
