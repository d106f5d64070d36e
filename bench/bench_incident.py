"""Incident benchmark: a steady queue's latency while another queue's burst holds a record
that hangs, one that crashes its process (``os._exit``) and one that raises.

For each runner mode, a ``chalk run`` process (restarted when it exits, as
systemd's ``Restart=on-failure`` would; the restarts are counted) reads two
queues:

* ``steady``: one message a record, offered at ``--rate`` per second by a
  producer process for the whole run (workflow ``Steady``: one pipelet);
* ``risky``: after ``--warmup`` seconds, one burst of ``--good`` good
  messages and three poison ones — ``hang`` (the pipelet sleeps an hour),
  ``crash`` (``os._exit(3)``) and ``raise`` (a ``RuntimeError``) — published
  together, so that they meet in one batch (workflow ``Incident``: the same
  pipelet, then the one that misbehaves; ``max_retries = --retries``).  The
  pipelet meets the batch's records in order, so the first poison decides
  how its first run ends: ``--lead hang,crash`` runs each mode once with the
  hang first (the run hangs: the longest way to the good records) and once
  with the crash first (the worker that runs it dies).

The modes: ``spark`` (``[engine] local_below = 0``: every batch on Spark's
warm workers), ``local`` (``runner = "local"``: every batch on the
service's own workers, no Spark) and ``service`` (Spark, with batches under
``local_below = 1000`` records on the service's workers, as small batches of
pipelets that declare ``runs_in_service`` are by default).  In every mode a
pipelet runs in a supervised worker process, never in the service's: a
restart counted here is a failure.

Figures, from the burst until its last record is settled (the incident):
the steady queue's latency (publish → its outgoing message in the output
queue) p50 / p99 / max over the messages published meanwhile, and before
the burst; the seconds from the burst to each of its good records'
outgoing messages and to each poison record's dead letter (with its reason);
the service's restarts.  Then nothing lost or doubled: every steady and
good record is stored once (its count is 1) and arrived in its output queue,
every poison record is dead-lettered once and not stored.

Run (the broker of scripts/services.sh)::

    .venv/bin/python bench/bench_incident.py                       # 3 modes, batch_timeout 30
    .venv/bin/python bench/bench_incident.py --modes spark --batch-timeout 10
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pika
from _measure import delete_lanes, machine, percentile

from blackboard import Blackboard
from listener_router.broker import connection_parameters, dlq_name

MODES = {"spark": {"local_below": 0}, "local": {"runner": "local"},
         "service": {"local_below": 1000}}
TROUBLE = ("hang", "crash", "raise")
TARGETS = {"p99": 2.0, "max": 5.0}   # steady latency during the incident, seconds

PIPELETS = '''"""The incident bench's pipelets: a count, and a step that misbehaves on demand."""
import os
import time

from pipelets import Pipelet


class Count(Pipelet):
    """Adds one to "count": a record committed twice would show 2."""

    runs_in_service = True

    def process_record(self, blackboard, rid):
        before = blackboard.get_literal(rid, "count").value if blackboard.has_literals(rid, "count") else 0
        blackboard.set_literal(rid, "count", before + 1)


class Trouble(Pipelet):
    """Hangs, ends its process or raises on a record whose "trouble" says so."""

    runs_in_service = True

    def process(self, blackboard, ids):
        for rid in ids:
            what = blackboard.get_literal(rid, "trouble").value if blackboard.has_literals(rid, "trouble") else ""
            if what == "hang":
                time.sleep(3600)
            elif what == "crash":
                os._exit(3)
            elif what == "raise":
                raise RuntimeError(f"record {rid} asked to fail")
        return ids
'''

WORKFLOW = """<?xml version="1.0"?>
<process name="{name}" xmlns="http://docs.oasis-open.org/wsbpel/2.0/process/executable"
         xmlns:proc="http://www.eclipse.org/smila/processor">
  <sequence>
    <proc:invokePipelet name="count"><proc:pipelet class="incident_pipelets.Count"/></proc:invokePipelet>{more}
  </sequence>
</process>
"""
TROUBLE_STEP = """
    <proc:invokePipelet name="trouble"><proc:pipelet class="incident_pipelets.Trouble"/></proc:invokePipelet>"""


@dataclass
class Scenario:
    mode: str
    batch_timeout: float = 30.0
    rate: float = 50.0
    good: int = 3
    warmup: float = 15.0
    tail: float = 3.0
    retries: int = 0
    lead: str = "hang"   # the poison record that comes first in the burst
    engine: dict[str, Any] = field(default_factory=dict)   # more [engine] keys
    limit: float = 0.0   # seconds the incident may last at most (0: 4 timeouts + 120)


@dataclass
class Figures:
    mode: str
    lead: str = ""
    before: dict[str, float] = field(default_factory=dict)
    during: dict[str, float] = field(default_factory=dict)
    good: list[float] = field(default_factory=list)          # seconds to each outgoing message
    dead: dict[str, float] = field(default_factory=dict)     # poison -> seconds to its dead letter
    reasons: dict[str, str] = field(default_factory=dict)    # poison -> x-chalk-error
    restarts: int = 0
    steady: int = 0
    lost: list[str] = field(default_factory=list)
    doubled: list[str] = field(default_factory=list)
    stray: list[str] = field(default_factory=list)           # poison records stored, or dead twice


class Arrivals:
    """Consumes the output and dead-letter queues on a thread of its own: (record, message ID,
    seconds since the epoch, headers) per message, by queue."""

    def __init__(self, url: str, queues: list[str]):
        self.url = url
        self.queues = queues
        self.seen: dict[str, list[tuple[str, str, float, dict[str, Any]]]] = {q: [] for q in queues}
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="arrivals", daemon=True)

    def _run(self) -> None:
        conn = pika.BlockingConnection(connection_parameters(self.url))
        ch = conn.channel()
        for queue in self.queues:
            def got(ch: Any, method: Any, props: Any, body: bytes, queue: str = queue) -> None:
                now = time.time()
                for record in json.loads(body).get("records", []):
                    with self.lock:
                        self.seen[queue].append((record["id"], props.message_id, now,
                                                 dict(props.headers or {})))
            ch.basic_consume(queue, got, auto_ack=True)
        while not self.stopping.is_set():
            conn.process_data_events(time_limit=0.1)
        conn.close()

    def of(self, queue: str) -> list[tuple[str, str, float, dict[str, Any]]]:
        with self.lock:
            return list(self.seen[queue])


def steady_producer(url: str, queue: str, rate: float, stop: Any, count: Any) -> None:
    """Offer one message a record at ``rate`` per second; the record's ID carries its publish
    time (ms since the epoch)."""
    conn = pika.BlockingConnection(connection_parameters(url))
    ch = conn.channel()
    ch.confirm_delivery()
    n = 0
    start = time.monotonic()
    while not stop.is_set():
        due = start + n / rate
        pause = due - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        rid = f"s{n}-{int(time.time() * 1000)}"
        ch.basic_publish("", queue, json.dumps({"records": [{"id": rid, "attributes": {"n": n}}]}),
                         pika.BasicProperties(delivery_mode=2, message_id=f"m-{rid}"))
        n += 1
        count.value = n
    conn.close()


class Supervised:
    """``chalk run`` restarted whenever it exits while wanted (the restarts counted)."""

    def __init__(self, config: Path, log: Path):
        self.config, self.log = config, log
        self.restarts = 0
        self.wanted = True
        self.proc: subprocess.Popen[bytes] | None = None
        self.thread = threading.Thread(target=self._run, name="supervisor", daemon=True)

    def _start(self) -> subprocess.Popen[bytes]:
        env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
                   SPARK_LOCAL_IP="127.0.0.1")
        with open(self.log, "ab") as out:
            return subprocess.Popen([sys.executable, "-m", "listener_router", "run", "--config",
                                     str(self.config)], stdout=out, stderr=subprocess.STDOUT,
                                    env=env, start_new_session=True)

    def _run(self) -> None:
        self.proc = self._start()
        while self.wanted:
            code = self.proc.poll()
            if code is None:
                time.sleep(0.05)
                continue
            if not self.wanted:
                break
            self.restarts += 1
            print(f"  [{time.strftime('%H:%M:%S')}] the service exited ({code}); restarting",
                  flush=True)
            self.proc = self._start()

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.wanted = False
        self.thread.join()
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if proc is not None:  # Spark's JVM and its workers, should any be left
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def write_service(folder: Path, scenario: Scenario, url: str, queues: dict[str, str]) -> Path:
    (folder / "workflows").mkdir(parents=True, exist_ok=True)
    (folder / "workflows" / "incident_pipelets.py").write_text(PIPELETS)
    (folder / "workflows" / "steady.xml").write_text(WORKFLOW.format(name="Steady", more=""))
    (folder / "workflows" / "incident.xml").write_text(WORKFLOW.format(name="Incident",
                                                                       more=TROUBLE_STEP))
    engine = {"batch_timeout": scenario.batch_timeout, **MODES[scenario.mode], **scenario.engine}
    lines = ["[blackboard]", f'url = "sqlite:///{folder / "chalk.db"}"', "[broker]",
             f'url = "{url}"', "[workflows]", f'dir = "{folder / "workflows"}"', "[engine]"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in engine.items()]
    lines += ["[spark]", 'master = "local[2]"',
              "[[listener]]", 'name = "steady"', f'queue = "{queues["steady"]}"',
              'workflow = "Steady"', "max_retries = 0",
              "[[listener]]", 'name = "risky"', f'queue = "{queues["risky"]}"',
              'workflow = "Incident"', f"max_retries = {scenario.retries}", "backoff_ms = [100]",
              "[[router]]", f'queue = "{queues["steady.out"]}"', 'workflow = "Steady"',
              "[[router]]", f'queue = "{queues["risky.out"]}"', 'workflow = "Incident"']
    config = folder / "chalk.toml"
    config.write_text("\n".join(lines) + "\n")
    return config


def latency(arrivals: list[tuple[str, str, float, dict[str, Any]]], since: float,
            until: float) -> dict[str, float]:
    """p50/p99/max of the steady messages published in [since, until) (seconds since the epoch)."""
    seconds = sorted(t - int(rid.split("-")[1]) / 1000 for rid, _m, t, _h in arrivals
                     if since <= int(rid.split("-")[1]) / 1000 < until)
    if not seconds:
        return {"n": 0}
    return {"n": len(seconds), "p50": percentile(seconds, 0.5), "p99": percentile(seconds, 0.99),
            "max": seconds[-1]}


def publish_burst(url: str, queue: str, tag: str, good: int, lead: str) -> dict[str, str]:
    """The burst, in one go, ``lead`` the first poison: record ID -> its trouble ("" for a
    good one)."""
    burst = {f"{tag}-good{i}": "" for i in range(good)}
    burst.update({f"{tag}-{what}": what for what in sorted(TROUBLE, key=lambda w: w != lead)})
    conn = pika.BlockingConnection(connection_parameters(url))
    ch = conn.channel()
    ch.confirm_delivery()
    for rid, what in burst.items():
        attributes: dict[str, Any] = {"trouble": what} if what else {"n": 0}
        ch.basic_publish("", queue, json.dumps({"records": [{"id": rid, "attributes": attributes}]}),
                         pika.BasicProperties(delivery_mode=2, message_id=f"m-{rid}"))
    conn.close()
    return burst


def run(scenario: Scenario, url: str, folder: Path, log: Any = print) -> Figures:
    """One mode's incident (module doc); the figures."""
    tag = uuid.uuid4().hex[:8]
    queues = {k: f"bench.incident.{tag}.{k}" for k in ("steady", "risky", "steady.out", "risky.out")}
    queues["risky.dlq"] = dlq_name(queues["risky"])
    queues["steady.dlq"] = dlq_name(queues["steady"])
    config = write_service(folder, scenario, url, queues)
    service = Supervised(config, folder / "service.log")
    figures = Figures(scenario.mode, scenario.lead)
    stop = multiprocessing.Event()
    count = multiprocessing.Value("q", 0)
    producer = multiprocessing.Process(target=steady_producer,
                                       args=(url, queues["steady"], scenario.rate, stop, count),
                                       daemon=True)
    arrivals: Arrivals | None = None
    try:
        service.start()
        deadline = time.monotonic() + 300
        while not _declared(url, queues):  # the service declares its queues when it starts
            if time.monotonic() > deadline:
                raise RuntimeError(f"the service did not start; see {folder / 'service.log'}")
            time.sleep(0.5)
        arrivals = Arrivals(url, [queues["steady.out"], queues["risky.out"], queues["risky.dlq"],
                                  queues["steady.dlq"]])
        arrivals.thread.start()
        producer.start()
        while not arrivals.of(queues["steady.out"]):
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing came out; see {folder / 'service.log'}")
            time.sleep(0.2)
        began = time.time()
        time.sleep(scenario.warmup)
        burst_at = time.time()
        burst = publish_burst(url, queues["risky"], tag, scenario.good, scenario.lead)
        log(f"  [{time.strftime('%H:%M:%S')}] burst published: {', '.join(burst)}")
        limit = scenario.limit or 4 * scenario.batch_timeout + 120
        while time.time() - burst_at < limit:
            settled = {rid for rid, *_ in arrivals.of(queues["risky.out"])}
            settled |= {rid for rid, *_ in arrivals.of(queues["risky.dlq"])}
            if settled >= set(burst):
                break
            time.sleep(0.1)
        ended = max([t for *_, t, _h in arrivals.of(queues["risky.out"])]
                    + [t for *_, t, _h in arrivals.of(queues["risky.dlq"])] + [burst_at])
        time.sleep(scenario.tail)
        stop.set()
        producer.join(30)
        published = count.value
        deadline = time.monotonic() + 60 + 2 * scenario.batch_timeout
        while len({rid for rid, *_ in arrivals.of(queues["steady.out"])}) < published \
                and time.monotonic() < deadline:
            time.sleep(0.2)
        steady = arrivals.of(queues["steady.out"])
        figures.before = latency(steady, began + min(5.0, scenario.warmup / 2), burst_at)
        figures.during = latency(steady, burst_at, ended)
        for rid, _m, t, _h in arrivals.of(queues["risky.out"]):
            if not burst.get(rid, "x"):
                figures.good.append(t - burst_at)
        for rid, _m, t, headers in arrivals.of(queues["risky.dlq"]):
            if burst.get(rid):
                figures.dead[burst[rid]] = t - burst_at
                figures.reasons[burst[rid]] = str(headers.get("x-chalk-error", ""))
        figures.steady = published
        _check(figures, url, folder, burst, published, steady, arrivals.of(queues["risky.dlq"]),
               arrivals.of(queues["steady.dlq"]))
    finally:
        stop.set()
        if producer.is_alive():
            producer.terminate()
        service.stop()
        figures.restarts = service.restarts
        if arrivals is not None:
            arrivals.stopping.set()
            arrivals.thread.join(5)
        delete_lanes(url, list(queues.values()))
    return figures


def _check(figures: Figures, url: str, folder: Path, burst: dict[str, str], published: int,
           steady: list[Any], dead: list[Any], steady_dead: list[Any]) -> None:
    """Nothing lost or doubled (module doc)."""
    ids = [f"s{n}-" for n in range(published)]
    arrived: dict[str, set[str]] = {}
    for rid, mid, _t, _h in steady:
        arrived.setdefault(rid.split("-")[0] + "-", set()).add(mid)
    figures.lost = [p for p in ids if p not in arrived]
    figures.doubled = [p for p, mids in arrived.items() if len(mids) > 1]
    figures.lost += [f"{rid} (dead: {h.get('x-chalk-error')})" for rid, _m, _t, h in steady_dead]
    stored_ids = [rid for rid, *_ in steady] + [rid for rid, what in burst.items() if not what]
    poison = [rid for rid, what in burst.items() if what]
    with Blackboard.connect(f"sqlite:///{folder / 'chalk.db'}") as bb:
        bb.load_many(stored_ids + poison)
        for rid in stored_ids:
            count = bb.get_attributes(rid, ["count"]).get("count") if not bb.is_new(rid) else None
            if count != 1:
                (figures.lost if count is None else figures.doubled).append(f"{rid} (count {count})")
        figures.stray = [rid for rid in poison if not bb.is_new(rid)
                         and bb.get_attributes(rid, ["count"]).get("count")]
        bb.invalidate_many(stored_ids + poison)
    times = [rid for rid, *_ in dead]
    figures.stray += [rid for rid in set(times) if times.count(rid) > 1]


def _declared(url: str, queues: dict[str, str]) -> bool:
    try:
        conn = pika.BlockingConnection(connection_parameters(url))
    except Exception:
        return False
    try:
        for name in (queues["steady.out"], queues["risky.out"], queues["risky.dlq"]):
            conn.channel().queue_declare(name, passive=True)
        return True
    except Exception:
        return False
    finally:
        if conn.is_open:
            conn.close()


def report(figures: Figures, scenario: Scenario) -> str:
    def fmt(d: dict[str, float]) -> str:
        if not d.get("n"):
            return "no messages"
        return f"p50 {d['p50']:.2f} s, p99 {d['p99']:.2f} s, max {d['max']:.2f} s ({d['n']:.0f} msgs)"

    during = figures.during
    met = during.get("n") and during["p99"] <= TARGETS["p99"] and during["max"] <= TARGETS["max"]
    lines = [f"mode {figures.mode}, {figures.lead} first (batch_timeout "
             f"{scenario.batch_timeout:g} s, {scenario.rate:g} msg/s steady, retries "
             f"{scenario.retries}{''.join(f', {k} {v}' for k, v in scenario.engine.items())})",
             f"  steady latency before:  {fmt(figures.before)}",
             f"  steady latency during:  {fmt(during)}  "
             f"[target p99 <= {TARGETS['p99']:g} s, max <= {TARGETS['max']:g} s: "
             f"{'met' if met else 'NOT met'}]",
             f"  good records committed: {len(figures.good)} of {scenario.good}, the last after "
             f"{max(figures.good, default=float('nan')):.1f} s "
             f"[target <= {scenario.batch_timeout:g} s + a few]"]
    bound = (scenario.retries + 1) * scenario.batch_timeout + 15
    for what in TROUBLE:
        seconds = figures.dead.get(what)
        within = seconds is not None and seconds <= bound
        lines.append(f"  {what:5} dead-lettered after "
                     f"{'never' if seconds is None else f'{seconds:.1f} s'} [target <= "
                     f"(retries + 1) x batch_timeout + 15 = {bound:g} s: "
                     f"{'met' if within else 'NOT met'}]: {figures.reasons.get(what, '')}")
    lines.append(f"  restarts: {figures.restarts} [target 0: "
                 f"{'met' if figures.restarts == 0 else 'NOT met'}]; "
                 f"steady messages {figures.steady}, lost "
                 f"{len(figures.lost)}, doubled {len(figures.doubled)}, poison stored or "
                 f"dead twice {len(figures.stray)}")
    for name in ("lost", "doubled", "stray"):
        if getattr(figures, name):
            lines.append(f"    {name}: {', '.join(getattr(figures, name)[:10])}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default="spark,local,service")
    parser.add_argument("--batch-timeout", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--good", type=int, default=3)
    parser.add_argument("--warmup", type=float, default=15.0)
    parser.add_argument("--retries", type=int, default=0)
    parser.add_argument("--lead", default="hang,crash",
                        help="runs per mode, each with this poison first in the burst")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="another [engine] key, e.g. concurrent_batches=2")
    parser.add_argument("--broker", default=os.environ.get("CHALK_TEST_BROKER_URL",
                                                           "amqp://guest:guest@127.0.0.1:5672/%2F"))
    parser.add_argument("--json", help="write every figure to this file")
    parser.add_argument("--keep", help="keep each mode's folder (config, store, service log) here")
    args = parser.parse_args(argv)
    print(f"incident bench on {machine()}", flush=True)
    out = []
    engine = {k: json.loads(v) for k, v in (item.split("=", 1) for item in args.set)}
    for mode, lead in ((m, lead) for m in args.modes.split(",") for lead in args.lead.split(",")):
        scenario = Scenario(mode, args.batch_timeout, args.rate, args.good, args.warmup,
                            retries=args.retries, lead=lead, engine=engine)
        with tempfile.TemporaryDirectory(prefix=f"chalk-incident-{mode}-") as tmp:
            folder = Path(args.keep) / f"{mode}-{lead}" if args.keep else Path(tmp)
            folder.mkdir(parents=True, exist_ok=True)
            print(f"mode {mode}: starting the service ({folder})", flush=True)
            figures = run(scenario, args.broker, folder, log=lambda s: print(s, flush=True))
        print(report(figures, scenario), flush=True)
        out.append(figures.__dict__)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
