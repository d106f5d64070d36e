"""Flow-control benchmark: priority under a backlog, a lane's rate limit, pause and resume.

A ``chalk run`` process (SQLite store, Spark ``local[2]``, the defaults
otherwise) reads two queues with one Python pipelet (``Count``: it adds one to
a record's ``count``), each routed to an output queue the bench consumes:

* **priority**: ``--backlog`` messages (default 20,000) wait in ``low``
  before the service starts, and a feeder process keeps at least that many
  ready there for the whole run (it tops the queue up four times a second);
  once ``low``'s records come out, its rate
  alone is taken over ``--alone`` seconds, then a producer process offers
  ``--rate`` messages a second to ``high`` for ``--seconds`` (each record's
  ID carries its publish time). Figures: ``high``'s latency (publish → its
  outgoing message) p50 / p99 / max, ``low``'s records a second meanwhile
  and their share of its rate alone, against the targets (high p99 ≤ 1 s,
  max ≤ 2 s; low keeps ≥ 30 %). Run once with ``high`` at ``priority =
  --priority`` and once with both lanes at the same priority (the
  baseline), alternating.  ``--low-ms N``: ``low``'s pipelet spends N ms of
  CPU a record (slow pipelets; ``high``'s stays quick).
* **rate**: ``low`` with ``rate_limit = --limit`` over a backlog; the
  records a second that come out over ``--seconds`` after a settling time,
  against the limit.
* **pause**: during a backlog, ``chalk queue pause`` then ``resume``: the
  seconds from the pause command's return to the last outgoing message (the
  batches in flight finishing), whether anything came out while paused, and
  the seconds from ``resume`` to the next outgoing message.

Run (the broker of scripts/services.sh)::

    .venv/bin/python bench/bench_flow.py                      # all three
    .venv/bin/python bench/bench_flow.py --only priority --rounds 3
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
from _measure import delete_lanes, machine, percentile
from bench_incident import Arrivals, Supervised, steady_producer

from listener_router.broker import connection_parameters

PIPELETS = '''"""The flow bench's pipelet."""
import time

from pipelets import Pipelet


class Count(Pipelet):
    """Adds one to "count", after spending ``ms`` milliseconds of CPU (default none)."""

    parameters = frozenset({"ms"})

    def configure(self, config):
        super().configure(config)
        self.seconds = float(config.get("ms", 0)) / 1000

    def process_record(self, blackboard, rid):
        if self.seconds:
            until = time.thread_time() + self.seconds
            while time.thread_time() < until:
                pass
        before = blackboard.get_literal(rid, "count").value if blackboard.has_literals(rid, "count") else 0
        blackboard.set_literal(rid, "count", before + 1)
'''

WORKFLOW = """<?xml version="1.0"?>
<process name="{name}" xmlns="http://docs.oasis-open.org/wsbpel/2.0/process/executable"
         xmlns:proc="http://www.eclipse.org/smila/processor">
  <sequence>
    <proc:invokePipelet name="count"><proc:pipelet class="flow_pipelets.Count"/>
      <proc:configuration><proc:param name="ms">{ms}</proc:param></proc:configuration>
    </proc:invokePipelet>
  </sequence>
</process>
"""


def write_service(folder: Path, url: str, queues: dict[str, str],
                  lanes: dict[str, dict[str, Any]], ms: dict[str, float] | None = None) -> Path:
    """The service's folder: workflows, pipelets and chalk.toml with one rule per lane
    (``ms``: milliseconds of CPU a record in a lane's pipelet)."""
    (folder / "workflows").mkdir(parents=True, exist_ok=True)
    (folder / "workflows" / "flow_pipelets.py").write_text(PIPELETS)
    for lane in lanes:
        (folder / "workflows" / f"{lane}.xml").write_text(WORKFLOW.format(
            name=lane.title(), ms=(ms or {}).get(lane, 0)))
    lines = ["[blackboard]", f'url = "sqlite:///{folder / "chalk.db"}"', "[broker]",
             f'url = "{url}"', "[workflows]", f'dir = "{folder / "workflows"}"',
             "[spark]", 'master = "local[2]"']
    for lane, keys in lanes.items():
        lines += ["[[listener]]", f'name = "{lane}"', f'queue = "{queues[lane]}"',
                  f'workflow = "{lane.title()}"', "create_missing = true"]
        lines += [f"{k} = {json.dumps(v)}" for k, v in keys.items()]
    for lane in lanes:  # each lane's results to its own output queue
        lines += ["[[router]]", f'queue = "{queues[lane + ".out"]}"',
                  f'workflow = "{lane.title()}"']
    config = folder / "chalk.toml"
    config.write_text("\n".join(lines) + "\n")
    return config


def publish(url: str, queue: str, prefix: str, n: int) -> None:
    conn = pika.BlockingConnection(connection_parameters(url))
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(n):
        _publish_one(ch, queue, prefix, i)
    conn.close()


def _publish_one(ch: Any, queue: str, prefix: str, i: int) -> None:
    """One message of one record ``{prefix}{i}``, persistent."""
    rid = f"{prefix}{i}"
    ch.basic_publish("", queue, json.dumps({"records": [{"id": rid, "attributes": {"n": i}}]}),
                     pika.BasicProperties(delivery_mode=2, message_id=f"m-{rid}"))


def feeder(url: str, queue: str, prefix: str, least: int, stop: Any) -> None:
    """Keep at least ``least`` messages ready in ``queue`` until ``stop`` is set (a backlog
    that lasts: the service would drain a fixed one within seconds)."""
    conn = pika.BlockingConnection(connection_parameters(url))
    ch = conn.channel()
    n = 0
    while not stop.is_set():
        try:
            ready = ch.queue_declare(queue, passive=True).method.message_count
        except pika.exceptions.ChannelClosedByBroker:  # the run deleted it: over
            return
        for _ in range(max(0, least - ready)):
            _publish_one(ch, queue, prefix, n)
            n += 1
        conn.process_data_events(time_limit=0.25)
    conn.close()


def declared(url: str, queues: list[str]) -> bool:
    try:
        conn = pika.BlockingConnection(connection_parameters(url))
    except Exception:
        return False
    try:
        for name in queues:
            conn.channel().queue_declare(name, passive=True)
        return True
    except Exception:
        return False
    finally:
        if conn.is_open:
            conn.close()


class Run:
    """One service over fresh queues: start, look at its output, stop and clean up."""

    def __init__(self, url: str, lanes: dict[str, dict[str, Any]],
                 ms: dict[str, float] | None = None):
        self.url = url
        self.tag = uuid.uuid4().hex[:8]
        self.queues = {k: f"bench.flow.{self.tag}.{k}" for lane in lanes for k in (lane, lane + ".out")}
        self.folder = Path(tempfile.mkdtemp(prefix="chalk-bench-flow-"))
        self.config = write_service(self.folder, url, self.queues, lanes, ms)
        self.service = Supervised(self.config, self.folder / "service.log")
        self.arrivals = Arrivals(url, [self.queues[lane + ".out"] for lane in lanes])

    def start(self, backlog: int = 0) -> None:
        """Start the service; once it has declared its queues, ``backlog`` messages wait in
        ``low`` (put there while the lane is paused) before it runs them."""
        self.service.start()
        deadline = time.monotonic() + 300
        while not declared(self.url, list(self.queues.values())):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the service did not start; see {self.folder / 'service.log'}")
            time.sleep(0.5)
        self.arrivals.thread.start()
        if backlog:
            self.chalk("queue", "pause", self.queues["low"])
            publish(self.url, self.queues["low"], "l", backlog)
            self.chalk("queue", "resume", self.queues["low"])

    def out(self, lane: str) -> list[tuple[str, str, float, dict[str, Any]]]:
        return self.arrivals.of(self.queues[lane + ".out"])

    def wait_for(self, lane: str, n: int = 1, limit: float = 300) -> None:
        deadline = time.monotonic() + limit
        while len(self.out(lane)) < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing came out of {lane}; see {self.folder / 'service.log'}")
            time.sleep(0.1)

    def chalk(self, *args: str) -> None:
        subprocess.run([sys.executable, "-m", "listener_router", *args, "--config",
                        str(self.config)], check=True, capture_output=True)

    def stop(self) -> None:
        self.service.stop()
        self.arrivals.stopping.set()
        self.arrivals.thread.join(5)
        delete_lanes(self.url, list(self.queues.values()))


def rate_between(arrivals: list[tuple[str, str, float, dict[str, Any]]], since: float,
                 until: float) -> float:
    return sum(1 for *_, t, _h in arrivals if since <= t < until) / max(until - since, 1e-9)


TARGETS = {"p99": 1.0, "max": 2.0, "share": 0.30}


def priority(url: str, args: argparse.Namespace, high_priority: int) -> dict[str, float]:
    run = Run(url, {"low": {}, "high": {"priority": high_priority}}, {"low": args.low_ms})
    feeding = multiprocessing.Event()
    try:
        run.start(args.backlog)
        fed = multiprocessing.Process(target=feeder, daemon=True,
                                      args=(url, run.queues["low"], "f", args.backlog, feeding))
        fed.start()
        run.wait_for("low", 200)
        alone_from = time.time()
        time.sleep(args.alone)
        alone = rate_between(run.out("low"), alone_from, time.time())
        stop = multiprocessing.Event()
        count = multiprocessing.Value("q", 0)
        producer = multiprocessing.Process(target=steady_producer, daemon=True,
                                           args=(url, run.queues["high"], args.rate, stop, count))
        began = time.time()
        producer.start()
        time.sleep(args.seconds)
        stop.set()
        producer.join(30)
        ended = time.time()
        run.wait_for("high", count.value, limit=120)
        seconds = sorted(t - int(rid.split("-")[1]) / 1000 for rid, _m, t, _h in run.out("high"))
        during = rate_between(run.out("low"), began, ended)
        return {"n": len(seconds), "p50": percentile(seconds, 0.5),
                "p99": percentile(seconds, 0.99), "max": seconds[-1],
                "low_rate": during, "low_alone": alone,
                "low_share": during / alone if alone else float("nan")}
    finally:
        feeding.set()
        run.stop()


def rate(url: str, args: argparse.Namespace) -> dict[str, float]:
    settle = 10.0
    run = Run(url, {"low": {"rate_limit": args.limit}})
    try:
        run.start(int(args.limit * (args.seconds + settle + 30)))
        run.wait_for("low")
        began = time.time() + settle
        time.sleep(settle + args.seconds)
        return {"limit": args.limit, "rate": rate_between(run.out("low"), began, began + args.seconds)}
    finally:
        run.stop()


def pause(url: str, args: argparse.Namespace) -> dict[str, float]:
    run = Run(url, {"low": {}})
    try:
        run.start(30_000)
        run.wait_for("low", 500)
        time.sleep(3)
        run.chalk("queue", "pause", run.queues["low"], "--reason", "bench")
        paused = time.time()
        time.sleep(10)
        out = [t for *_, t, _h in run.out("low")]
        drained = max(out) - paused
        later = sum(1 for t in out if t > paused + max(drained, 0) + 0.001)
        run.chalk("queue", "resume", run.queues["low"])
        resumed = time.time()
        deadline = time.monotonic() + 60
        while not [t for *_, t, _h in run.out("low") if t > resumed] and time.monotonic() < deadline:
            time.sleep(0.05)
        first = min([t for *_, t, _h in run.out("low") if t > resumed], default=float("nan"))
        return {"drained": drained, "while_paused": later, "resumed": first - resumed}
    finally:
        run.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=["priority", "rate", "pause"], action="append")
    parser.add_argument("--backlog", type=int, default=20_000,
                        help="priority: messages kept ready in low")
    parser.add_argument("--rate", type=float, default=10.0, help="priority: high's messages/s")
    parser.add_argument("--seconds", type=float, default=60.0, help="the measured window")
    parser.add_argument("--priority", type=int, default=5, help="priority: high's priority")
    parser.add_argument("--rounds", type=int, default=1, help="priority: with and without, rounds")
    parser.add_argument("--alone", type=float, default=20.0,
                        help="priority: seconds low's rate alone is taken over")
    parser.add_argument("--low-ms", type=float, default=0.0,
                        help="priority: ms of CPU low's pipelet spends a record")
    parser.add_argument("--limit", type=float, default=200.0, help="rate: rate_limit")
    parser.add_argument("--broker", default="amqp://guest:guest@127.0.0.1:5672/%2F")
    args = parser.parse_args(argv)
    only = set(args.only or ["priority", "rate", "pause"])
    print(machine())
    if "priority" in only:
        for n in range(args.rounds):
            for p in (args.priority, 0):
                f = priority(args.broker, args, p)
                what = f"high at priority {p}" if p else "both at priority 0 "
                met = (f["p99"] <= TARGETS["p99"] and f["max"] <= TARGETS["max"]
                       and f["low_share"] >= TARGETS["share"])
                print(f"priority round {n + 1}, {what}: high p50 {f['p50']:.3f} s, p99 "
                      f"{f['p99']:.3f} s, max {f['max']:.3f} s ({f['n']} messages at "
                      f"{args.rate:g}/s); low meanwhile {f['low_rate']:.0f} records/s, "
                      f"{f['low_share']:.2f} of its {f['low_alone']:.0f} alone (backlog "
                      f"{args.backlog:,}{f', {args.low_ms:g} ms a record' if args.low_ms else ''})"
                      + (f" [targets p99 <= {TARGETS['p99']:g} s, max <= {TARGETS['max']:g} s, "
                         f"low >= {TARGETS['share']:.0%}: {'met' if met else 'NOT met'}]"
                         if p else ""), flush=True)
    if "rate" in only:
        f = rate(args.broker, args)
        print(f"rate limit {f['limit']:g}/s: {f['rate']:.1f} records/s over {args.seconds:g} s "
              f"({f['rate'] / f['limit']:.3f} of the limit)", flush=True)
    if "pause" in only:
        f = pause(args.broker, args)
        print(f"pause: last record out {f['drained']:.2f} s after the command returned, "
              f"{f['while_paused']:.0f} out later while paused; resume: first record out after "
              f"{f['resumed']:.2f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
