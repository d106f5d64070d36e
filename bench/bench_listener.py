"""Listener/router benchmark: end to end against the bare broker round trip.

Side by side in one run, on the same broker:

* **bare**: an AMQP loop that consumes each message, publishes one outgoing
  message with asynchronous publisher confirms, and acks the input once the
  outgoing one is confirmed (no database, no workflow) — the floor;
* **chalk**: the Chalk service: queue → 3-pipelet workflow (NormalizeWhitespace,
  WordCount, Fingerprint) on Spark → commit on SQLite (records, inbox,
  outbox in one transaction) → route → ack.

Chalk is measured twice: on the first messages after the service starts, and
warm, after ``--warmup-batches`` small batches, when the JVM has compiled
what each job runs (a new JVM spends most of a core compiling for the first
few hundred jobs).  The bare loop runs first and again just before the warm
pass; the warm ratio is to the higher of the two bare rates.

The output queue is emptied before each pass, as a downstream consumer
would keep it.  For the warm pass the CPU each process spent is printed per
message: the service, its broker I/O process, Spark's JVM and RabbitMQ (on
two cores these share the machine with the broker, so their sum bounds the
rate).

Then latency: messages offered at a fixed rate (default 1,000/s) for a while
by a producer in a process of its own, the time from publish to arrival in
the output queue, p50 and p99 (warm): with every batch on Spark, and with
``[engine] local_below`` (``--local-below``, default 1,000) so that the small
batches such a rate makes run in the service's process.

With ``--http HOST:PORT`` (e.g. ``127.0.0.1:0``) the warm pass is followed by
``--ab-rounds`` rounds of two passes each, without and with the metrics and
dashboard served (``[http] listen``; ``/metrics`` scraped every 5 s as
Prometheus would), and the ratio of the median rates is printed: what
watching the service costs its hot path.

Run: ``.venv/bin/python bench/bench_listener.py`` (``--messages 20000 --batch-size
1000`` for a quicker look; ``--runner local`` to leave Spark out; ``--job-log-cost 3``
for the job log's share of the warm throughput, with and without it alternating).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pika

from listener_router import ListenerRule, RouterRule, Service, Settings
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


def body_for(i: int, sent: float | None = None) -> bytes:
    record: dict[str, Any] = {"id": f"b{i:07d}",
                              "attributes": {"text": f"  Some   TEXT number {i}  with words "}}
    if sent is not None:
        record["attributes"]["sent"] = sent
    return json.dumps({"records": [record]}).encode()


def publish(url: str, queue: str, bodies: list[bytes], prefix: str) -> None:
    link = AmqpLink(url, consume=()).start()
    try:
        for start in range(0, len(bodies), 1000):
            link.publish([OutMessage(routing_key=queue, body=b, message_id=f"{prefix}-{start + n}")
                          for n, b in enumerate(bodies[start:start + 1000])]).result(timeout=120)
    finally:
        link.stop()


def bare_round_trip(url: str, settings: Settings, n: int) -> float:
    """Consume → publish one outgoing (async confirms) → ack on confirm; messages/s."""
    src, dst = settings.listeners[0].queue + ".bare", settings.routers[0].queue + ".bare"
    conn = pika.BlockingConnection(connection_parameters(url))
    ch = conn.channel()
    for q in (src, dst):
        ch.queue_declare(q, durable=True, arguments={"x-queue-type": settings.queue_type})
    conn.close()
    publish(url, src, [body_for(i) for i in range(n)], "bare")
    link = AmqpLink(url, prefetch=2000, consume=[src]).start()
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
        conn = pika.BlockingConnection(connection_parameters(url))
        for q in (src, dst):
            conn.channel().queue_delete(q)
        conn.close()
    return n / elapsed


_FIRST = [0]  # each run takes new record IDs: every run creates its records


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _descendants(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        return out
    return out + [d for c in out for d in _descendants(c)]


def _named(pids: list[int], comm: str) -> int | None:
    for pid in pids:
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == comm:
                    return pid
        except OSError:
            continue
    return None


def purge(url: str, queue: str) -> None:
    conn = pika.BlockingConnection(connection_parameters(url))
    conn.channel().queue_purge(queue)
    conn.close()


def scrape(url: str, every: float, stop: threading.Event) -> None:
    """GET ``url`` every ``every`` seconds until ``stop`` (what Prometheus does)."""
    import urllib.request
    while not stop.wait(every):
        with urllib.request.urlopen(url, timeout=30) as response:
            response.read()


def chalk_run(settings: Settings, n: int, spark: Any) -> tuple[float, dict[str, int], dict[str, float]]:
    """Records/s through the service, its counters, and CPU-s by process (with
    ``settings.http_listen``, its metrics are scraped every 5 s meanwhile)."""
    queue = settings.listeners[0].queue
    first = _FIRST[0]
    _FIRST[0] += n
    purge(settings.broker_url, settings.routers[0].queue)
    publish(settings.broker_url, queue, [body_for(first + i) for i in range(n)], uuid.uuid4().hex[:6])
    with Service(settings, spark=spark) as service:
        child = getattr(service.link, "child_pid", None)
        beam = subprocess.run(["pgrep", "-x", "beam.smp"], capture_output=True, text=True).stdout.split()
        found = {"service": os.getpid(), "broker I/O": child,
                 "JVM": _named(_descendants(os.getpid()), "java"),
                 "RabbitMQ": int(beam[0]) if beam else None}
        processes = {name: pid for name, pid in found.items() if pid is not None}
        before = {name: cpu_seconds(pid) for name, pid in processes.items()}
        stop = threading.Event()
        if service.watch is not None:
            threading.Thread(target=scrape, args=(service.watch.url + "metrics", 5.0, stop),
                             daemon=True).start()
        started = time.perf_counter()
        stats = service.run(until=lambda s: s["committed"] >= n, idle_exit=60)
        elapsed = time.perf_counter() - started
        stop.set()
        cpu = {name: cpu_seconds(pid) - before[name] for name, pid in processes.items()}
    return stats["committed"] / elapsed, dict(stats.counts), cpu


def offer_and_collect(url: str, queue: str, out: str, rate: float, total: int,
                      result: Any) -> None:
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
            link.publish([OutMessage(routing_key=queue, body=body_for(10_000_000 + i, time.time()),
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


def latency(settings: Settings, rate: float, seconds: float, spark: Any) -> list[float]:
    """Latency from publish to the output queue; the producer and the consumer run in a
    process of their own, as they would in use (in the service's process they would take
    turns with it for the interpreter)."""
    total = int(rate * seconds)
    ctx = multiprocessing.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    client = ctx.Process(target=offer_and_collect, args=(
        settings.broker_url, settings.listeners[0].queue, settings.routers[0].queue,
        rate, total, send))
    with Service(settings, spark=spark) as service:
        client.start()
        service.run(until=lambda s: s["committed"] >= total, idle_exit=30)
        arrivals = receive.recv() if receive.poll(60) else []
        client.join(timeout=30)
    return arrivals


def job_log_cost(settings: Settings, n: int, rounds: int, spark: Any) -> None:
    """Warm passes with and without the job log, alternating so that both see the same
    machine; the job log's cost is 1 - (median with) / (median without)."""
    rates: dict[bool, list[float]] = {True: [], False: []}
    for i in range(rounds):
        for on in ((True, False) if i % 2 == 0 else (False, True)):
            rate, _, _ = chalk_run(replace(settings, job_log=on), n, spark)
            rates[on].append(rate)
            print(f"  round {i + 1}, job log {'on ' if on else 'off'}: {rate:,.0f} records/s")
    with_log, without = statistics.median(rates[True]), statistics.median(rates[False])
    print(f"job log cost: median {with_log:,.0f} records/s with it, {without:,.0f} without: "
          f"ratio {with_log / without:.3f} ({(1 - with_log / without) * 100:+.1f} % of throughput)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100000,
                        help="messages per measured pass (one record each)")
    parser.add_argument("--broker", default="amqp://guest:guest@127.0.0.1:5672/%2F")
    parser.add_argument("--runner", choices=["spark", "local"], default="spark")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--batch-size", type=int, default=10000,
                        help="the rule's batch_size (prefetch is 4x); each batch is one Spark job, "
                             "whose fixed cost (~0.1 CPU-s in the JVM) smaller batches pay more often")
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--local-below", type=int, default=1000,
                        help="local_below for the second latency pass (0: skip it)")
    parser.add_argument("--http", metavar="HOST:PORT",
                        help="after the warm pass, compare passes without and with the metrics "
                             "and dashboard served there (e.g. 127.0.0.1:0)")
    parser.add_argument("--ab-rounds", type=int, default=3,
                        help="rounds of the --http comparison (one pass without, one with, each)")
    parser.add_argument("--warmup-batches", type=int, default=600,
                        help="batches of 100 messages the service runs between the cold and the warm pass")
    parser.add_argument("--no-job-log", action="store_true",
                        help="run without the job log ([jobs] log = false), to see what it costs")
    parser.add_argument("--job-log-cost", type=int, default=0, metavar="ROUNDS",
                        help="instead of the warm pass and latency: ROUNDS warm passes with the job "
                             "log and ROUNDS without, alternating, and the ratio of their medians")
    args = parser.parse_args()
    ensure_local_broker(args.broker)
    tmp = Path(tempfile.mkdtemp(prefix="chalk-bench-"))
    (tmp / "workflows").mkdir()
    (tmp / "workflows" / "bench3.xml").write_text(WORKFLOW)
    tag = uuid.uuid4().hex[:6]
    rule = ListenerRule(name="bench", queue=f"bench.{tag}.in", workflow="Bench3",
                        batch_size=args.batch_size, max_wait_ms=50, prefetch=4 * args.batch_size)
    settings = Settings(blackboard_url=f"sqlite:///{tmp / 'bench.db'}", broker_url=args.broker,
                        workflows_dir=str(tmp / "workflows"), listeners=(rule,),
                        routers=(RouterRule(queue=f"bench.{tag}.out", attributes=("words", "sent")),),
                        runner=args.runner, spark_master=args.master, job_log=not args.no_job_log)
    spark = None
    if args.runner == "spark":
        import engine
        spark = engine.spark_session(args.master, {"spark.sql.shuffle.partitions": "2"})
    conn = pika.BlockingConnection(connection_parameters(args.broker))
    declare_all(conn, settings)
    conn.close()

    print(f"{args.messages} messages, batch {args.batch_size}, runner {args.runner} {args.master}, "
          f"job log {'off' if args.no_job_log else 'on'}")
    bare = bare_round_trip(args.broker, settings, args.messages)
    print(f"bare broker round trip: {bare:,.0f} msg/s")
    cold, _, _ = chalk_run(settings, args.messages, spark)
    print(f"chalk end to end, first {args.messages:,} after start: {cold:,.0f} records/s   "
          f"ratio {cold / bare:.2f}")
    if args.warmup_batches:
        # A service that has run a while: the JVM has compiled what every job runs
        # (analysis, planning, scheduling), which takes some hundreds of jobs.
        small = replace(settings, listeners=(replace(rule, batch_size=100),))
        chalk_run(small, 100 * args.warmup_batches, spark)
    if args.job_log_cost:
        job_log_cost(settings, args.messages, args.job_log_cost, spark)
        return 0
    # The bare rate moves between runs on a shared machine (by 2x seen here):
    # measured again next to the warm pass, the ratio takes the higher figure.
    bare_again = bare_round_trip(args.broker, settings, args.messages)
    print(f"bare broker round trip, again: {bare_again:,.0f} msg/s")
    rate, counts, cpu = chalk_run(settings, args.messages, spark)
    print(f"chalk end to end, warm (after {args.warmup_batches} more batches): {rate:,.0f} records/s   "
          f"ratio {rate / max(bare, bare_again):.2f} (to the higher bare rate)")
    print("  CPU per message (µs): " + ", ".join(
        f"{name} {seconds / args.messages * 1e6:.0f}" for name, seconds in cpu.items())
        + f"; sum {sum(cpu.values()) / args.messages * 1e6:.0f}")
    phases = {k[:-3]: counts.get(k, 0) for k in (
        "receive_ms", "inbox_ms", "load_ms", "stage_ms", "wait_ms", "run_ms", "route_ms",
        "commit_ms", "publish_ms", "batch_ms")}
    print(f"  phases (ms, summed over {counts.get('batches', 0)} batches; stage, commit and "
          f"publish overlap the run): {phases}")
    if args.http:
        rates: dict[str, list[float]] = {"without": [], "with": []}
        for _round in range(args.ab_rounds):
            for name, pass_settings in (("without", settings),
                                        ("with", replace(settings, http_listen=args.http))):
                rates[name].append(chalk_run(pass_settings, args.messages, spark)[0])
        plain, watched = statistics.median(rates["without"]), statistics.median(rates["with"])
        print(f"metrics and dashboard served (--http {args.http}), {args.ab_rounds} round(s): "
              f"without {plain:,.0f} records/s, with {watched:,.0f} records/s (medians)   "
              f"ratio with/without {watched / plain:.3f}")
        print("  passes without: " + ", ".join(f"{r:,.0f}" for r in rates["without"])
              + "; with: " + ", ".join(f"{r:,.0f}" for r in rates["with"]))
    passes = [("every batch on Spark", settings)]
    if args.local_below and args.runner == "spark":
        passes.append((f"local_below {args.local_below}",
                       replace(settings, local_below=args.local_below)))
    for name, pass_settings in passes:
        purge(args.broker, settings.routers[0].queue)
        lat = latency(pass_settings, args.rate, args.seconds, spark)
        if lat:
            lat.sort()
            p50 = statistics.median(lat)
            p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
            print(f"latency at {args.rate:.0f} msg/s offered for {args.seconds:.0f} s, {name}: "
                  f"p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms ({len(lat)} messages)")
    conn = pika.BlockingConnection(connection_parameters(args.broker))
    ch = conn.channel()
    out = settings.routers[0].queue
    for q in (rule.queue, dlq_name(rule.queue), out, dlq_name(out),
              *(retry_name(rule.queue, i) for i in range(1, 4))):
        ch.queue_delete(q)
    conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
