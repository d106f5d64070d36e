"""Listener/router benchmark: the service end to end against a hand-written consumer and the bare broker round trip.

Side by side in one sitting, on the same broker, alternating:

* **bare**: an AMQP loop that consumes each message, publishes one outgoing
  message with asynchronous publisher confirms, and acks the input once the
  outgoing one is confirmed (no database, no workflow) — the floor;
* **hand-written**: ``bench_handwritten.py``, what a careful user writes in
  about a hundred lines of pika and SQLAlchemy Core, in a process of its own:
  batches of up to 500 messages, one SQLite transaction each (inbox check,
  ``SELECT … IN``, the three steps on each record, ``executemany``, inbox
  rows), one outgoing message per record with confirms, ack on confirm —
  exactly once in effect, without Spark, a job log, retries, rules or metrics;
* **chalk**: the Chalk service: queue → 3-pipelet workflow on Spark → commit
  on SQLite (records, inbox, outbox in one transaction) → route → ack.  The
  pipelets (``--pipelets``): ``user`` (the default) normalizes whitespace,
  counts words and hashes the text in Python against the Blackboard API, a
  module next to the workflow as a user writes it — the same work the
  hand-written consumer does; ``builtin``: NormalizeWhitespace, WordCount,
  Fingerprint, whose DataFrame forms run in the JVM; ``real``: the
  work-bound bench, below; ``demo``: the shipped ``workflows/demo.xml``,
  what ``chalk demo`` times (its steady rate is meant to be within 2× of
  this one's on the same machine).

``--pipelets real`` is for pipelines whose steps do real work: each message
carries a web page of a generated corpus (``web_pages.py``: seven
languages, 1–45 KB of HTML), and three Python pipelets, a package next to
the workflow as a user writes it, strip its HTML to text, detect its
language and fingerprint its text (``web_steps.py``, about 1 ms of CPU a
record).  The hand-written consumer runs the same functions on each
record's JSON, once as one process and once as two on the same queue and
database (``bench_handwritten.py --processes 2``); Chalk is compared with
both.  There is no bare loop in this mode: the work, not the broker, is
what bounds it.

By default the listener rule has **no batch keys** (the service's default
settings: adaptive batch size and prefetch, small batches in the service's
process); ``--batch-size N`` sets ``batch_size = N`` (and nothing else).
``--records-per-message 1,100`` carries 1, then 100, records per message in
each run (the same ``--messages`` records a pass: 1/100 as many messages);
every figure is then also given per record.  The bare loop runs for one
record a message only (it sends one message per input, not per record).

``--runner`` says where the pipelets run: on Spark's warm workers (``spark``,
the default), on the service's own worker processes (``local``, ``[engine]
runner = "local"``), or, for a ceiling only, in the service's own thread
(``thread``: ``engine.LocalRunner``, no isolation, no Spark; a hang or a
crash there would take the service down, so it is not a deployment).  Its
rate, set beside the others', says how much of the gap to the hand-written
consumer the crossing to another process accounts for.

1. *Cold*: the first ``--messages`` after the service starts, once (a new
   JVM compiles what each job runs for its first few hundred jobs).
2. *Warm-up*: ``--warmup`` messages in batches of 100, each a Spark job.
3. *Throughput*, ``--runs`` times, for each records-per-message: the bare
   loop, the hand-written consumer, then the service, each over the
   records published before it starts; the ratios of each run are to the
   baselines measured just before it.  The CPU each process spent per
   message is printed — for Chalk the service, its broker I/O process,
   Spark's JVM and Python workers, the RabbitMQ node; for the hand-written
   consumer its process and the RabbitMQ node: on two cores their sum
   bounds the rate.
4. *Latency*, ``--latency-runs`` times: messages offered at ``--rate`` per
   second for ``--seconds`` by a producer in a process of its own; the time
   from publish to arrival in the output queue, p50 and p99.

The summary gives medians against the targets (Chalk's defaults with Python
pipelets: ≥ 1.0× the hand-written consumer's records/s; CPU per message of
Chalk's processes together ≤ 2× the hand-written consumer's process; with 100
records per message, Chalk's CPU per record ≤ 0.5× its one-record figure,
beside the hand-written consumer's; p50 ≤ 50 ms and p99 ≤ 150 ms at 1,000
msg/s; with ``--pipelets real`` on 2 cores, ≥ 1.6× one hand-written process's
records/s and ≥ 0.9× two's) and, for continuity, the ratio to the bare loop.
On a shared machine absolute rates move with the load (it is printed); the
ratios, measured interleaved, move less.

With ``--http HOST:PORT`` (e.g. ``127.0.0.1:0``) the runs are followed by
``--ab-rounds`` rounds of two passes each, without and with the metrics and
dashboard served (``[http] listen``; ``/metrics`` scraped every 5 s as
Prometheus would), and the ratio of the median rates is printed: what
watching the service costs its hot path.  ``--job-log-cost ROUNDS`` does the
same with the job log on and off (``[jobs] log``): what writing it costs.

Run: ``.venv/bin/python bench/bench_listener.py --messages 50000
--records-per-message 1,100`` (defaults: 100,000 records a pass, one per
message, 3 runs, 3 latency runs of 20 s); ``--pipelets builtin``;
``--batch-size 2000``; ``--messages 5000 --runs 1 --latency-runs 0`` for a
quick look; ``--pipelets real --messages 20000 --warmup 5000 --latency-runs
0`` for the work-bound bench; ``--json FILE`` writes every figure.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pika
from _measure import (
    broker_pid,
    cpu_seconds,
    descendants,
    machine,
    median,
    named,
    percentile,
    rss_mb,
    tree_cpu,
)
from bench_handwritten import WORK, body_for, delete_queues
from bench_handwritten import measure as measure_handwritten

import engine
from listener_router import (
    BatchObserver,
    BatchReport,
    BatchSizing,
    ListenerRule,
    RouterRule,
    Service,
    Settings,
)
from listener_router.broker import (
    AmqpLink,
    OutMessage,
    connection_parameters,
    declare_all,
    dlq_name,
    ensure_local_broker,
    retry_name,
)

WORKFLOW = """<?xml version="1.0"?>
<process name="Bench3" xmlns="http://docs.oasis-open.org/wsbpel/2.0/process/executable"
         xmlns:proc="http://www.eclipse.org/smila/processor">
  <sequence>
    <proc:invokePipelet name="normalize">
      <proc:pipelet class="pipelets.text.NormalizeWhitespace"/>
      <proc:configuration><proc:param name="attribute">text</proc:param>
        <proc:param name="lowercase">true</proc:param></proc:configuration>
    </proc:invokePipelet>
    <proc:invokePipelet name="count">
      <proc:pipelet class="pipelets.text.WordCount"/>
      <proc:configuration><proc:param name="attribute">text</proc:param>
        <proc:param name="output">words</proc:param></proc:configuration>
    </proc:invokePipelet>
    <proc:invokePipelet name="hash">
      <proc:pipelet class="pipelets.fingerprint.Fingerprint"/>
      <proc:configuration><proc:param name="attributes">text</proc:param>
        <proc:param name="output">hash</proc:param></proc:configuration>
    </proc:invokePipelet>
  </sequence>
</process>
"""

# ``--pipelets user``: the same three steps as a user writes them, in Python against the
# Blackboard API (a module next to the workflow; no DataFrame form, not declared
# ``runs_in_service``), each a read-modify-write of one attribute.
USER_PIPELETS = '''"""Three steps of the bench, written as a user would."""
import hashlib
import re

from pipelets import Pipelet

_SPACE = re.compile(r"\\s+")


class Normalize(Pipelet):
    def process_record(self, blackboard, record_id):
        text = blackboard.get_literal(record_id, "text").value
        blackboard.set_literal(record_id, "text", _SPACE.sub(" ", text).strip().lower())


class Count(Pipelet):
    def configure(self, config):
        super().configure(config)
        self.output = config.get("output", "words")

    def process_record(self, blackboard, record_id):
        text = blackboard.get_literal(record_id, "text").value
        blackboard.set_literal(record_id, self.output, len(text.split()))


class Hash(Pipelet):
    def configure(self, config):
        super().configure(config)
        self.output = config.get("output", "hash")

    def process_record(self, blackboard, record_id):
        text = blackboard.get_literal(record_id, "text").value
        blackboard.set_literal(record_id, self.output,
                               hashlib.sha256(text.encode()).hexdigest())
'''


def _sequence(*steps: tuple[str, str]) -> str:
    """Workflow ``Bench3``: these pipelets, (name, class), one after the other."""
    invokes = "".join(f'    <proc:invokePipelet name="{name}"><proc:pipelet class="{cls}"/>'
                      "</proc:invokePipelet>\n" for name, cls in steps)
    return ('<?xml version="1.0"?>\n<process name="Bench3" '
            'xmlns="http://docs.oasis-open.org/wsbpel/2.0/process/executable"\n'
            '         xmlns:proc="http://www.eclipse.org/smila/processor">\n'
            f"  <sequence>\n{invokes}  </sequence>\n</process>\n")


USER_WORKFLOW = _sequence(("normalize", "bench_user.Normalize"), ("count", "bench_user.Count"),
                          ("hash", "bench_user.Hash"))

# ``--pipelets real``: a web pipeline's three steps as a user writes them, a package next
# to the workflow (``bench_real``) whose ``steps`` module is a copy of ``web_steps.py``,
# the functions the hand-written consumer runs.  Not declared ``runs_in_service``.
REAL_PIPELETS = '''"""A web pipeline's three steps, written as a user would."""
from pipelets import Pipelet

from bench_real.steps import detect_language, fingerprint, strip_html


class StripHtml(Pipelet):
    def process_record(self, blackboard, record_id):
        html = blackboard.get_literal(record_id, "content").value
        blackboard.set_literal(record_id, "content", strip_html(html))


class DetectLanguage(Pipelet):
    def process_record(self, blackboard, record_id):
        text = blackboard.get_literal(record_id, "content").value
        blackboard.set_literal(record_id, "language", detect_language(text))


class Fingerprint(Pipelet):
    def process_record(self, blackboard, record_id):
        text = blackboard.get_literal(record_id, "content").value
        blackboard.set_literal(record_id, "fingerprint", fingerprint(text))
'''

REAL_WORKFLOW = _sequence(("strip", "bench_real.StripHtml"),
                          ("language", "bench_real.DetectLanguage"),
                          ("fingerprint", "bench_real.Fingerprint"))

# The targets, for Chalk's default settings with Python pipelets: records/s against
# the hand-written consumer's; CPU per message of Chalk's processes (the RabbitMQ node
# aside) against the hand-written consumer's process; CPU per record with 100 records a
# message against one; latency at 1,000 msg/s offered.  With ``--pipelets real`` on two
# cores: records/s against one hand-written process's and against two's.
TARGETS = {"vs_handwritten": 1.0, "cpu_vs_handwritten": 2.0, "cpu_per_record_100": 0.5,
           "p50_ms": 50.0, "p99_ms": 150.0, "real_vs_handwritten": 1.6,
           "real_vs_handwritten_2": 0.9}
RABBIT = "RabbitMQ"
REPO = Path(__file__).resolve().parents[1]


def publish(url: str, queue: str, bodies: list[bytes], prefix: str) -> None:
    link = AmqpLink(url, consume=()).start()
    try:
        for start in range(0, len(bodies), 1000):
            link.publish([OutMessage(routing_key=queue, body=b, message_id=f"{prefix}-{start + n}")
                          for n, b in enumerate(bodies[start:start + 1000])]).result(timeout=120)
    finally:
        link.stop()


def purge(url: str, *queues: str) -> None:
    conn = pika.BlockingConnection(connection_parameters(url))
    for queue in queues:
        conn.channel().queue_purge(queue)
    conn.close()


def bare_round_trip(url: str, queue_type: str, n: int) -> float:
    """Consume → publish one outgoing (async confirms) → ack on confirm; messages/s."""
    tag = uuid.uuid4().hex[:6]
    src, dst = f"bench.{tag}.bare.in", f"bench.{tag}.bare.out"
    conn = pika.BlockingConnection(connection_parameters(url))
    ch = conn.channel()
    for q in (src, dst):
        ch.queue_declare(q, durable=True, arguments={"x-queue-type": queue_type})
    conn.close()
    publish(url, src, [body_for(i) for i in range(n)], "bare")
    link = AmqpLink(url, prefetch=2000, consume=[src])
    link.coalesce = False  # as pika writes: the baseline is a plain pika loop
    link.start()
    done = 0
    started = None
    try:
        while done < n:
            batch = [link.deliveries.get(timeout=30)]
            started = started or time.perf_counter()
            while len(batch) < 500:
                try:
                    batch.append(link.deliveries.get_nowait())
                except Exception:
                    break
            link.publish([OutMessage(routing_key=dst, body=d.body, message_id=f"o-{d.message_id}")
                          for d in batch]).result(timeout=60)
            link.ack(batch)
            done += len(batch)
        elapsed = time.perf_counter() - (started or time.perf_counter())
    finally:
        link.stop()
        delete_queues(url, src, dst)
    return n / elapsed


def scrape(url: str, every: float, stop: threading.Event) -> None:
    """GET ``url`` every ``every`` seconds until ``stop`` (what Prometheus does)."""
    import urllib.request
    while not stop.wait(every):
        with urllib.request.urlopen(url, timeout=30) as response:
            response.read()


class Sizes(BatchObserver):
    """The size of every finished batch."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def batch_finished(self, report: BatchReport) -> None:
        self.sizes.append(report.messages)


class Bench:
    """The service's side: settings on fresh queues, one SparkSession, passes over them."""

    def __init__(self, args: argparse.Namespace, tmp: Path):
        self.args = args
        self.tmp = tmp
        (tmp / "workflows").mkdir()
        pipelets = getattr(args, "pipelets", "user")
        self.work = "real" if pipelets == "real" else "text"  # what the messages carry
        workflow = "Bench3"
        if pipelets == "demo":   # the shipped demo workflow, as chalk demo runs it
            (tmp / "workflows" / "demo.xml").write_text((REPO / "workflows" / "demo.xml").read_text())
            workflow = "Demo"
        else:
            (tmp / "workflows" / "bench3.xml").write_text(
                {"user": USER_WORKFLOW, "real": REAL_WORKFLOW}.get(pipelets, WORKFLOW))
        if pipelets == "user":
            (tmp / "workflows" / "bench_user.py").write_text(USER_PIPELETS)
        if pipelets == "real":
            package = tmp / "workflows" / "bench_real"
            package.mkdir()
            (package / "__init__.py").write_text(REAL_PIPELETS)
            shutil.copyfile(Path(__file__).with_name("web_steps.py"), package / "steps.py")
        tag = uuid.uuid4().hex[:6]
        keys: dict[str, Any] = {} if args.batch_size is None else {"batch_size": args.batch_size}
        self.rule = ListenerRule(name="bench", queue=f"bench.{tag}.in", workflow=workflow, **keys)
        self.settings = Settings(
            blackboard_url=f"sqlite:///{tmp / 'bench.db'}", broker_url=args.broker,
            workflows_dir=str(tmp / "workflows"), listeners=(self.rule,),
            routers=(RouterRule(queue=f"bench.{tag}.out", attributes=WORK[self.work][1]),),
            runner="local" if args.runner == "thread" else args.runner, spark_master=args.master)
        self.spark = None
        if args.runner == "spark":
            self.spark = engine.spark_session(args.master, {"spark.sql.shuffle.partitions": "2"})
        conn = pika.BlockingConnection(connection_parameters(args.broker))
        declare_all(conn, self.settings)
        conn.close()
        self.first = 0  # each pass takes new record IDs: every pass creates its records
        self.hand_first = 0  # the same for the hand-written consumer's database
        self.rabbit = broker_pid(args.broker)

    def run(self, n: int, settings: Settings | None = None,
            sizing: BatchSizing | None = None, per_message: int = 1) -> dict[str, Any]:
        """``n`` messages of ``per_message`` records published, then the service started:
        records/s, counters, CPU seconds per message by process (with
        ``settings.http_listen``, its metrics are scraped every 5 s meanwhile)."""
        settings = settings or self.settings
        first, self.first = self.first, self.first + n * per_message
        purge(settings.broker_url, settings.routers[0].queue)
        publish(settings.broker_url, self.rule.queue,
                [body_for(first + i * per_message, per_message=per_message, work=self.work)
                 for i in range(n)], uuid.uuid4().hex[:6])
        sizes = Sizes()
        runner = engine.LocalRunner() if self.args.runner == "thread" else None
        with Service(settings, spark=self.spark, sizing=sizing, observers=[sizes],
                     runner=runner) as service:
            below = descendants(os.getpid())
            jvm = named(below, "java")
            found = {"service": os.getpid(), "broker I/O": getattr(service.link, "child_pid", None),
                     "JVM": jvm, RABBIT: self.rabbit}
            processes = {name: pid for name, pid in found.items() if pid is not None}

            pools = _pools(service.runner)

            def cpu() -> dict[str, float]:
                out = {name: cpu_seconds(pid) for name, pid in processes.items() if name != RABBIT}
                if jvm is not None:  # its Python workers (pyspark.daemon and its forks)
                    out["Spark workers"] = sum(cpu_seconds(p) for p in descendants(jvm))
                if "service workers" in pools:  # the service's supervisor, its live and reaped workers
                    out["service workers"] = sum(tree_cpu(p) for p in
                                                 pools["service workers"].processes())
                if RABBIT in processes:
                    out[RABBIT] = cpu_seconds(processes[RABBIT])
                return out

            before = cpu()
            stop = threading.Event()
            if service.plugin("watch") is not None:
                threading.Thread(target=scrape, args=(service.plugin("watch").url + "metrics", 5.0, stop),
                                 daemon=True).start()
            memory: list[dict[str, float]] = []
            threading.Thread(target=_sample_memory, args=(pools, memory, stop), daemon=True).start()
            started = time.perf_counter()
            stats = service.run(until=lambda s: s["committed"] >= n, idle_exit=60)
            elapsed = time.perf_counter() - started
            stop.set()
            after = cpu()
        counts = dict(stats.counts)
        return {"messages": n, "per_message": per_message, "seconds": elapsed,
                "rate": stats["committed"] * per_message / elapsed,
                "message_rate": stats["committed"] / elapsed,
                "committed": stats["committed"], "batches": counts.get("batches", 0),
                "local_batches": counts.get("local_batches", 0), "sizes": sizes.sizes,
                "cpu_us": {k: (after[k] - before.get(k, 0.0)) / n * 1e6 for k in after},
                "memory_mb": {"first": memory[0] if memory else {},
                              "last": memory[-1] if memory else {}},
                "phases_ms": {k[:-3]: v for k, v in counts.items() if k.endswith("_ms")}}

    def handwritten(self, n: int, per_message: int = 1, processes: int = 1) -> dict[str, Any]:
        """The hand-written consumer over ``n`` messages of ``per_message`` records, in a
        process of its own (or ``processes`` on the same queue), on a SQLite file of its
        own kept for the sitting (as the service's is)."""
        first, self.hand_first = self.hand_first, self.hand_first + n * per_message
        return measure_handwritten(self.args.broker, n, per_message,
                                   queue_type=self.settings.queue_type,
                                   db=self.tmp / "handwritten.db", first=first,
                                   work=self.work, processes=processes)

    def warm_up(self, n: int) -> None:
        """``n`` messages in Spark jobs of 100: the JVM compiles what each job runs."""
        if n and self.spark is not None:
            self.run(n, replace(self.settings, local_below=0), sizing=BatchSizing(100, 0.05))

    def latency(self, rate: float, seconds: float) -> dict[str, Any]:
        """Publish → arrival in the output queue, for messages offered at ``rate``; the
        producer and the consumer run in a process of their own, as they would in use."""
        total = int(rate * seconds)
        settings = self.settings
        purge(settings.broker_url, settings.routers[0].queue)
        ctx = multiprocessing.get_context("spawn")
        receive, send = ctx.Pipe(duplex=False)
        client = ctx.Process(target=offer_and_collect, args=(
            settings.broker_url, self.rule.queue, settings.routers[0].queue, rate, total, send,
            self.work))
        with Service(settings, spark=self.spark) as service:
            client.start()
            stats = service.run(until=lambda s: s["committed"] >= total, idle_exit=30)
            arrivals = receive.recv() if receive.poll(60) else []
            client.join(timeout=30)
        arrivals.sort()
        return {"rate": rate, "seconds": seconds, "messages": len(arrivals),
                "p50_ms": percentile(arrivals, 0.5) * 1000, "p99_ms": percentile(arrivals, 0.99) * 1000,
                "batches": stats["batches"], "local_batches": stats["local_batches"]}

    def close(self) -> None:
        queue, out = self.rule.queue, self.settings.routers[0].queue
        delete_queues(self.args.broker, queue, dlq_name(queue), out, dlq_name(out),
                      *(retry_name(queue, i) for i in range(1, 4)))


def offer_and_collect(url: str, queue: str, out: str, rate: float, total: int,
                      result: Any, work: str = "text") -> None:
    """Publish ``total`` messages at ``rate`` and time their arrival in ``out`` (own process)."""
    arrivals: list[float] = []

    def offer() -> None:
        link = AmqpLink(url, consume=()).start()
        start = time.perf_counter()
        for i in range(total):
            due = start + i / rate
            pause = due - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            link.publish([OutMessage(routing_key=queue,
                                     body=body_for(10_000_000 + i, time.time(), work=work),
                                     message_id=f"lat-{uuid.uuid4().hex}")])
        link.stop()

    sender = threading.Thread(target=offer)
    sender.start()
    conn = pika.BlockingConnection(connection_parameters(url))
    ch = conn.channel()
    for _method, _props, body in ch.consume(out, auto_ack=True, inactivity_timeout=15):
        if body is None:
            break
        now = time.time()
        for record in json.loads(body)["records"]:
            arrivals.append(now - record["attributes"]["sent"])
        if len(arrivals) >= total:
            break
    conn.close()
    sender.join(timeout=60)
    result.send(arrivals)


def _cpu_line(cpu: dict[str, float], per_message: int = 1) -> str:
    total = sum(cpu.values())
    line = ", ".join(f"{name} {us:.0f}" for name, us in cpu.items()) + f"; sum {total:.0f}"
    return line + (f" ({total / per_message:.1f} a record)" if per_message > 1 else "")


def _own(cpu: dict[str, float]) -> float:
    """CPU of the processes of the thing measured: all but the RabbitMQ node."""
    return sum(us for name, us in cpu.items() if name != RABBIT)


def _pools(runner: Any) -> dict[str, Any]:
    """The worker pools of a service's runner, by name (Spark's warm workers, its own)."""
    found = [getattr(runner, "warm", None), getattr(runner, "pool", None),
             getattr(getattr(runner, "service", None), "pool", None)]
    return {pool.name: pool for pool in found if pool is not None}


def _sample_memory(pools: dict[str, Any], into: list[dict[str, float]],
                   stop: threading.Event, every: float = 5.0) -> None:
    """Every ``every`` seconds while the run lasts: the largest RSS (MB) of a supervisor and
    of a worker of each pool that is up (a warm task and its worker; the service's
    supervisor and its workers)."""
    while not stop.wait(every):
        sample: dict[str, float] = {}
        for name, pool in pools.items():
            for supervisor, workers in pool.processes().items():
                key = f"{name}: supervisor"
                sample[key] = max(sample.get(key, 0.0), rss_mb(supervisor))
                for worker in workers:
                    key = f"{name}: worker"
                    sample[key] = max(sample.get(key, 0.0), rss_mb(worker))
        if sample:
            into.append(sample)


def _medians(dicts: list[dict[str, float]]) -> dict[str, float]:
    keys = list(dict.fromkeys(k for d in dicts for k in d))
    return {k: median([d.get(k, 0.0) for d in dicts]) for k in keys}


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: positive integers, comma-separated (1,100)")
    return sizes


def _records(per: int) -> str:
    return f"{per} record{'s' if per > 1 else ''}/message"


def _ratio_line(label: str, mine: list[dict[str, Any]], key: str, note: str) -> float:
    """Print a ratio's median and each run's; return the median."""
    value = median([r[key] for r in mine])
    print(f"    {label:<30}{value:.2f}   (runs {', '.join(format(r[key], '.2f') for r in mine)}; "
          f"{note})")
    return value


def _summary(runs: list[dict[str, Any]], sizes: list[int], defaults: bool,
             real: bool = False) -> dict[str, Any]:
    """Print the medians of the throughput runs against the targets; return them.
    ``real``: the work-bound bench's, against one and two hand-written processes."""
    out: dict[str, Any] = {}
    if not defaults:
        print("  (the targets are for the default settings with Python pipelets on Spark)")
    cpu_per_record: dict[int, dict[str, float]] = {}
    for per in sizes:
        mine = [r for r in runs if r["per_message"] == per]
        if not mine:
            continue
        chalk_cpu = _medians([r["cpu_us"] for r in mine])
        hand_cpu = _medians([r["handwritten"]["cpu_us"] for r in mine])
        cpu_ratio = median([r["cpu_vs_handwritten"] for r in mine])
        cpu_ratio_all = median([r["cpu_vs_handwritten_all"] for r in mine])
        cpu_per_record[per] = {"chalk": sum(chalk_cpu.values()) / per,
                               "handwritten": sum(hand_cpu.values()) / per}
        figures: dict[str, Any] = {
            "rate": median([r["rate"] for r in mine]),
            "handwritten_rate": median([r["handwritten"]["rate"] for r in mine]),
            "cpu_vs_handwritten": cpu_ratio,
            "cpu_vs_handwritten_all": cpu_ratio_all, "cpu_us": chalk_cpu,
            "handwritten_cpu_us": hand_cpu, "cpu_us_per_record": cpu_per_record[per]}
        print(f"  {_records(per)}:")
        bare = [r["bare"] for r in mine if r.get("bare")]
        if real:
            figures["handwritten_2_rate"] = median([r["handwritten_2"]["rate"] for r in mine])
            print(f"    chalk {figures['rate']:,.0f} records/s, hand-written "
                  f"{figures['handwritten_rate']:,.0f} records/s in 1 process, "
                  f"{figures['handwritten_2_rate']:,.0f} in 2")
            figures["vs_handwritten"] = _ratio_line(
                "chalk / hand-written ×1", mine, "vs_handwritten",
                f"target ≥ {TARGETS['real_vs_handwritten']} on 2 cores")
            figures["vs_handwritten_2"] = _ratio_line(
                "chalk / hand-written ×2", mine, "vs_handwritten_2",
                f"target ≥ {TARGETS['real_vs_handwritten_2']} on 2 cores")
        else:
            print(f"    chalk {figures['rate']:,.0f} records/s, hand-written "
                  f"{figures['handwritten_rate']:,.0f} records/s"
                  + (f", bare {median(bare):,.0f} msg/s" if bare else ""))
            figures["vs_handwritten"] = _ratio_line("chalk / hand-written", mine, "vs_handwritten",
                                                    f"target ≥ {TARGETS['vs_handwritten']}")
        if bare:
            figures["bare"] = median(bare)
            figures["ratio"] = _ratio_line("chalk / bare loop", mine, "ratio", "for continuity")
        print(f"    CPU µs/message, chalk         {_cpu_line(chalk_cpu, per)}")
        print(f"    CPU µs/message, hand-written  {_cpu_line(hand_cpu, per)}")
        last = mine[-1].get("memory_mb", {})
        if last.get("first"):
            figures["memory_mb"] = last
            print("    memory (RSS, MB, largest of each kind; first → last sample of the last "
                  "run): " + ", ".join(f"{k} {last['first'][k]:.0f} → "
                                       f"{last['last'].get(k, float('nan')):.0f}"
                                       for k in sorted(last["first"])))
        if real:
            hand2_cpu = _medians([r["handwritten_2"]["cpu_us"] for r in mine])
            figures.update(handwritten_2_cpu_us=hand2_cpu, cpu_vs_handwritten_2=median(
                [r["cpu_vs_handwritten_2"] for r in mine]))
            print(f"    CPU µs/message, 2 hand-written processes  {_cpu_line(hand2_cpu, per)}")
            print(f"    CPU, chalk's processes / the hand-written one's  {cpu_ratio:.2f}×, "
                  f"/ the two's {figures['cpu_vs_handwritten_2']:.2f}×   (no target; with the "
                  f"RabbitMQ node on both sides {cpu_ratio_all:.2f}×)")
        else:
            print(f"    CPU, chalk's processes / the hand-written one's  {cpu_ratio:.1f}×   "
                  f"(target ≤ {TARGETS['cpu_vs_handwritten']:.0f}×; with the RabbitMQ node on "
                  f"both sides {cpu_ratio_all:.1f}×)")
        out[str(per)] = figures
    if 1 in cpu_per_record:
        for per in sizes:
            if per == 1 or per not in cpu_per_record:
                continue
            chalk = cpu_per_record[per]["chalk"] / cpu_per_record[1]["chalk"]
            hand = cpu_per_record[per]["handwritten"] / cpu_per_record[1]["handwritten"]
            out[str(per)]["cpu_per_record_vs_one"] = {"chalk": chalk, "handwritten": hand}
            print(f"  CPU per record, {_records(per)} / 1 record/message (all processes, "
                  f"RabbitMQ included): chalk {chalk:.2f}× (target ≤ "
                  f"{TARGETS['cpu_per_record_100']}× for 100), hand-written {hand:.2f}×")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, default=None,
                        help="the rule's batch_size (default: none, the service's default settings)")
    parser.add_argument("--messages", type=int, default=100_000,
                        help="records per throughput pass: as many one-record messages, or "
                             "1/N as many messages of N records")
    parser.add_argument("--records-per-message", type=_sizes, default=[1], metavar="N[,N…]",
                        help="records per message; several (1,100): each run measures each "
                             "(default 1)")
    parser.add_argument("--runs", type=int, default=3,
                        help="throughput runs (each: bare, hand-written, then chalk)")
    parser.add_argument("--warmup", type=int, default=60_000,
                        help="messages run in Spark jobs of 100 before the runs (0: none)")
    parser.add_argument("--rate", type=float, default=1000.0, help="latency: messages/s offered")
    parser.add_argument("--seconds", type=float, default=20.0, help="latency: seconds offered")
    parser.add_argument("--latency-runs", type=int, default=3, help="latency runs (0: none)")
    parser.add_argument("--no-cold", action="store_true", help="skip the cold pass")
    parser.add_argument("--broker", default=os.environ.get(
        "CHALK_BENCH_BROKER", "amqp://guest:guest@127.0.0.1:5672/%2F"))
    parser.add_argument("--pipelets", choices=["builtin", "real", "user", "demo"], default="user",
                        help="user (default): the three steps written in Python against the "
                             "Blackboard API, as a user's module (the hand-written consumer's "
                             "work); builtin: NormalizeWhitespace, WordCount, Fingerprint "
                             "(their DataFrame forms run in the JVM); real: web pages' HTML "
                             "stripped, language detected, text fingerprinted in Python "
                             "pipelets (about 1 ms a record), against 1 and 2 hand-written "
                             "processes; demo: the shipped workflows/demo.xml "
                             "(NormalizeWhitespace, WordCount), what chalk demo times")
    parser.add_argument("--runner", choices=["spark", "local", "thread"], default="spark",
                        help="spark (default): Spark's warm workers; local: the service's own "
                             "worker processes ([engine] runner = \"local\"); thread: the "
                             "pipelets in the service's own thread (engine.LocalRunner), no "
                             "isolation at all, no Spark: what the rate would be without the "
                             "crossing to another process (a ceiling, not a deployment)")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--http", metavar="HOST:PORT",
                        help="after the runs, compare passes without and with the metrics "
                             "and dashboard served there (e.g. 127.0.0.1:0)")
    parser.add_argument("--ab-rounds", type=int, default=3,
                        help="rounds of the --http comparison (one pass without, one with, each)")
    parser.add_argument("--job-log-cost", type=int, default=0, metavar="ROUNDS",
                        help="after the runs, ROUNDS rounds of two passes, with the job log "
                             "and without ([jobs] log), alternating; the ratio of the medians and the median of each "
                             "round's ratio")
    parser.add_argument("--json", metavar="FILE", help="write every figure here")
    args = parser.parse_args(argv)
    ensure_local_broker(args.broker)
    sizes: list[int] = args.records_per_message
    what = ("default settings (no batch keys)" if args.batch_size is None
            else f"batch_size = {args.batch_size}")
    real = args.pipelets == "real"
    defaults = args.batch_size is None and args.pipelets != "builtin" and args.runner == "spark"
    print(f"machine: {machine()}")
    print(f"chalk: {what}; {args.pipelets} pipelets; {args.messages:,} records a pass, "
          f"{' then '.join(_records(n) for n in sizes)}; runner {args.runner} {args.master}",
          flush=True)
    bench = Bench(args, Path(tempfile.mkdtemp(prefix="chalk-bench-")))
    out: dict[str, Any] = {"bench": "listener", "settings": what, "batch_size": args.batch_size,
                           "pipelets": args.pipelets, "records_per_message": sizes,
                           "machine": machine(), "messages": args.messages,
                           "dir": str(bench.tmp)}  # the stores: bench.db, handwritten.db
    runs: list[dict[str, Any]] = []
    lat: list[dict[str, Any]] = []
    try:
        if not args.no_cold and real:
            out["cold"] = cold = bench.run(args.messages)
            print(f"cold (first {args.messages:,} after start): chalk {cold['rate']:,.0f} "
                  "records/s", flush=True)
        elif not args.no_cold:
            bare = bare_round_trip(args.broker, bench.settings.queue_type, args.messages)
            cold = bench.run(args.messages)
            out["cold"] = {"bare": bare, **cold, "ratio": cold["rate"] / bare}
            print(f"cold (first {args.messages:,} after start): bare {bare:,.0f} msg/s, chalk "
                  f"{cold['rate']:,.0f} records/s, ratio {cold['rate'] / bare:.2f}", flush=True)
        print(f"warm-up: {args.warmup:,} messages in Spark jobs of 100", flush=True)
        bench.warm_up(args.warmup)
        for i in range(args.runs):
            for per in sizes:
                n = max(1, args.messages // per)
                bare = (bare_round_trip(args.broker, bench.settings.queue_type, n)
                        if per == 1 and not real else None)
                hand = bench.handwritten(n, per)
                hand2 = bench.handwritten(n, per, processes=2) if real else None
                chalk = bench.run(n, per_message=per)
                one = {"run": i + 1, "bare": bare, "handwritten": hand, **chalk,
                       "vs_handwritten": chalk["rate"] / hand["rate"],
                       "cpu_vs_handwritten": _own(chalk["cpu_us"]) / _own(hand["cpu_us"]),
                       "cpu_vs_handwritten_all": (sum(chalk["cpu_us"].values())
                                                  / sum(hand["cpu_us"].values()))}
                if bare is not None:
                    one["ratio"] = chalk["rate"] / bare
                if hand2 is not None:
                    one.update(handwritten_2=hand2, vs_handwritten_2=chalk["rate"] / hand2["rate"],
                               cpu_vs_handwritten_2=_own(chalk["cpu_us"]) / _own(hand2["cpu_us"]))
                runs.append(one)
                print(f"run {i + 1}, {_records(per)}: "
                      + (f"bare {bare:,.0f} msg/s, " if bare is not None else "")
                      + f"hand-written {hand['rate']:,.0f} records/s, "
                      + (f"2 hand-written {hand2['rate']:,.0f} records/s, " if hand2 else "")
                      + f"chalk {chalk['rate']:,.0f} records/s; chalk/hand-written "
                      f"{one['vs_handwritten']:.2f}"
                      + (f", chalk/2 hand-written {one['vs_handwritten_2']:.2f}" if hand2 else "")
                      + (f", chalk/bare {one['ratio']:.2f}" if bare is not None else "")
                      + f"; {chalk['batches']} batches (largest {max(chalk['sizes'], default=0):,}, "
                      f"{chalk['local_batches']} in the service's process)\n"
                      f"  CPU µs/message, chalk: {_cpu_line(chalk['cpu_us'], per)}\n"
                      f"  CPU µs/message, hand-written: {_cpu_line(hand['cpu_us'], per)}"
                      + (f"\n  CPU µs/message, 2 hand-written: {_cpu_line(hand2['cpu_us'], per)}"
                         if hand2 else ""), flush=True)
        out["runs"] = runs
        if args.http:
            rates: dict[str, list[float]] = {"without": [], "with": []}
            for _round in range(args.ab_rounds):
                for name, pass_settings in (("without", bench.settings),
                                            ("with", replace(bench.settings, http_listen=args.http))):
                    rates[name].append(bench.run(args.messages, pass_settings)["rate"])
            plain, watched = median(rates["without"]), median(rates["with"])
            out["http"] = {**rates, "ratio": watched / plain}
            print(f"metrics and dashboard served (--http {args.http}), {args.ab_rounds} round(s): "
                  f"without {plain:,.0f} records/s, with {watched:,.0f} records/s (medians)   "
                  f"ratio with/without {watched / plain:.3f}", flush=True)
        if args.job_log_cost:
            logged: dict[str, list[float]] = {"with": [], "without": []}
            spent: dict[str, list[float]] = {"with": [], "without": []}  # all processes' CPU
            for i in range(args.job_log_cost):
                order = ("with", "without") if i % 2 == 0 else ("without", "with")
                for name in order:
                    one = bench.run(args.messages, replace(bench.settings, job_log=name == "with"))
                    logged[name].append(one["rate"])
                    spent[name].append(sum(one["cpu_us"].values()))
                    print(f"  job log {name}: {one['rate']:,.0f} records/s; CPU µs/message: "
                          f"{_cpu_line(one['cpu_us'])}", flush=True)
            on, off = median(logged["with"]), median(logged["without"])
            cpu_on, cpu_off = median(spent["with"]), median(spent["without"])
            # Each round's two passes ran side by side: their ratio is not moved by the
            # machine drifting over the sitting, as the ratio of the medians can be.
            paired = median(a / b for a, b in zip(logged["with"], logged["without"], strict=True))
            out["job_log"] = {**logged, "ratio": on / off, "paired_ratio": paired,
                              "cpu_us": spent, "cpu_ratio": cpu_on / cpu_off}
            print(f"job log, {args.job_log_cost} round(s): with {on:,.0f} records/s, without "
                  f"{off:,.0f} records/s (medians)   ratio with/without {on / off:.3f} "
                  f"({(1 - on / off) * 100:+.1f} % of throughput; median of the rounds' "
                  f"ratios {paired:.3f}); CPU µs/message, all processes: with {cpu_on:.0f}, "
                  f"without {cpu_off:.0f} ({(cpu_on / cpu_off - 1) * 100:+.1f} %)", flush=True)
        for i in range(args.latency_runs):
            one = bench.latency(args.rate, args.seconds)
            lat.append(one)
            print(f"latency run {i + 1}: {args.rate:,.0f} msg/s offered for {args.seconds:.0f} s: "
                  f"p50 {one['p50_ms']:.0f} ms, p99 {one['p99_ms']:.0f} ms ({one['messages']:,} "
                  f"messages, {one['batches']} batches, {one['local_batches']} in the service's "
                  f"process)", flush=True)
        out["latency"] = lat
    finally:
        bench.close()
    print(f"\nsummary ({what}; {args.pipelets} pipelets; medians; load now "
          f"{os.getloadavg()[0]:.1f}):")
    if runs:
        out["summary"] = _summary(runs, sizes, defaults, real)
        if "1" in out["summary"] and "ratio" in out["summary"]["1"]:
            out["ratio_median"] = out["summary"]["1"]["ratio"]
    if lat:
        p50, p99 = median([x["p50_ms"] for x in lat]), median([x["p99_ms"] for x in lat])
        out.update(p50_ms_median=p50, p99_ms_median=p99)
        print(f"  latency at {args.rate:,.0f} msg/s   p50 {p50:.0f} ms, p99 {p99:.0f} ms   "
              f"(targets ≤ {TARGETS['p50_ms']:.0f} and ≤ {TARGETS['p99_ms']:.0f} ms at 1,000 "
              f"msg/s, on Spark's warm workers)")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
