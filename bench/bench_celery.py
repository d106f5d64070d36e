"""Celery baseline: the bench_listener work as a Celery chain per record.

What Chalk does for one record with the 3-pipelet workflow of
``bench/bench_listener.py``, written the way a Celery user would:
``chain(normalize, count, fingerprint, publish)`` per record.  The first
three tasks each read the record's row from SQLite, change one attribute as
the matching pipelet does (``text`` whitespace-collapsed and lowercased as
NormalizeWhitespace; ``words`` as WordCount; ``hash``, a sha256 of ``text``,
as Fingerprint — the string work is mirrored here, not imported, so workers
do not import pipelets or Spark) and write the row back in one transaction;
the fourth publishes the record ID to an output queue with publisher
confirms.  The records are bench_listener's (its ``body_for``), stored by
Chalk's own blackboard (``chalk_records``: the JSON document, version,
updated_at), so the rows are the ones the service reads and writes.

Measured: wall time from the first enqueue (by this process, once the
worker is up) to the last ID received on the output queue (consumed by this
process), records/s, and CPU seconds of the worker (main process and pool
children, from /proc), of the broker node (found by its port) and of this
process; the wall time the pool processes spent inside the task bodies; the
load average before and after (the figure moves with whatever else runs).
``--preload`` fills the queue first and starts the clock when the warm worker
starts consuming it, as bench_listener does for Chalk (its input is published
before the service starts).  Then checked: every record's version went up by
exactly three and its three attributes hold the expected values; every ID
arrived exactly once (a killed pool process shows here: acks_late runs its
task again).  Exit status 1 if not.  ``--runs N`` runs each in a process of
its own (fresh worker, database and queues) and gives the median.

Settings (Celery's own or its documented advice for many short tasks that
must not be lost; a baseline, not a strawman):

* one worker node, prefork pool, ``--concurrency`` = ``os.cpu_count()``;
* ``task_acks_late`` and ``task_reject_on_worker_lost``: a task whose process
  dies is delivered again (at least once, as Chalk's input);
* ``worker_prefetch_multiplier`` 4, Celery's default (``--prefetch-multiplier
  1`` is the documented choice for long tasks; try both);
* the output publish waits for the broker's confirm (kombu's
  ``confirm_publish`` transport option, on a connection of its own per pool
  process), as Chalk's does.  The chain's hops (and the enqueue) are not
  confirmed: Celery's default, and the faster.  ``--confirm-hops`` sets
  ``confirm_publish`` for every message the worker and the enqueuer publish,
  so that an acked task never loses its successor if the broker fails —
  the guarantee Chalk gives — at about half the rate;
* durable queue, persistent messages, classic queue (Celery's default;
  ``--queue-type quorum`` for Chalk's default: the worker then sets up
  Celery's delayed-delivery exchanges and queues, ``celery_delayed_*``, which
  stay on the vhost);
* ``task_ignore_result`` and no result backend: a chain carries its remaining
  tasks in the message (protocol 2), nothing is stored or awaited;
* ``--without-gossip --without-mingle --without-heartbeat``, log level
  WARNING, rate limits off: no chatter the work does not need;
* SQLite as Chalk's blackboard opens it (WAL, ``synchronous=NORMAL``,
  ``busy_timeout`` 30 s), one connection per pool process, and each
  read-modify-write in ``BEGIN IMMEDIATE`` (a deferred transaction that reads
  and then writes can fail with "database is locked" at once, whatever the
  busy timeout).  A task that still meets "database is locked" is retried by
  Celery (``self.retry``, countdown 0.1–1 s, up to 10 times); retries and the
  time spent waiting for the write lock are counted and reported.

Run (RabbitMQ at ``--broker``; needs ``pip install -e '.[bench]'``)::

    .venv/bin/python bench/bench_celery.py --records 10000 --runs 3 [--json]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from _measure import broker_pid, cpu_seconds, descendants, tree_cpu

try:
    from celery import Celery, chain
    from kombu import Connection
except ImportError:  # pragma: no cover - the bench extra is missing
    sys.exit("bench_celery needs Celery: .venv/bin/pip install -e '.[bench]'")

_ENV = "CHALK_CELERY_BENCH"  # the worker's settings, as JSON (set by the bench for its workers)
_CHILD = "CHALK_CELERY_BENCH_CHILD"  # set for the process of one run of several
_LOCKED_RETRIES = 10


@dataclasses.dataclass(frozen=True)
class Config:
    broker: str = "amqp://guest:guest@127.0.0.1:5672/%2F"
    db: str = ""                 # the SQLite file
    queue: str = "chalk.celery"  # the tasks' queue
    out: str = "chalk.celery.out"
    stats_dir: str = ""          # where each pool process writes its counters
    prefetch_multiplier: int = 4
    confirm_hops: bool = False
    queue_type: str = "classic"

    @classmethod
    def from_env(cls) -> Config:
        return cls(**json.loads(os.environ.get(_ENV, "{}")))


app = Celery("chalk_bench")


def configure(cfg: Config) -> None:
    app.conf.update(
        broker_url=cfg.broker,
        broker_connection_retry_on_startup=True,
        broker_transport_options={"confirm_publish": True} if cfg.confirm_hops else {},
        task_default_queue=cfg.queue,
        task_default_exchange=cfg.queue,
        task_default_routing_key=cfg.queue,
        task_default_queue_type=cfg.queue_type,
        task_default_delivery_mode="persistent",
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_ignore_result=True,
        result_backend=None,
        worker_prefetch_multiplier=cfg.prefetch_multiplier,
        worker_disable_rate_limits=True,
        worker_hijack_root_logger=False,
    )


CFG = Config.from_env()
configure(CFG)


# -- the work (a mirror of the three pipelets' Python paths) ---------------------

_SPACE = re.compile(r"\s+")
_WORD = re.compile(r"[^\W_]+(?:['\u2019\-][^\W_]+)*")  # pipelets.text._WORD


def normalized(text: str) -> str:
    return _SPACE.sub(" ", text).strip().lower()


def word_count(texts: list[Any]) -> int:
    return sum(1 for t in texts if isinstance(t, str) for _ in _WORD.finditer(t))


def fingerprint(texts: list[Any]) -> str:
    h = hashlib.sha256()
    for part in (json.dumps(t, ensure_ascii=False).encode() for t in texts):
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.hexdigest()


def _normalize(attrs: dict[str, list[Any]]) -> None:
    attrs["text"] = [normalized(v) if isinstance(v, str) else v for v in attrs.get("text", [])]


def _count(attrs: dict[str, list[Any]]) -> None:
    attrs["words"] = [word_count(attrs.get("text", []))]


def _hash(attrs: dict[str, list[Any]]) -> None:
    attrs["hash"] = [fingerprint(attrs.get("text", []))]


# -- per pool process: the database, the output connection, the counters --------


class _Process:
    """What one pool process keeps between tasks (made after the fork, on first use)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.db = sqlite3.connect(CFG.db, timeout=30.0, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("PRAGMA busy_timeout=30000")
        self.out: Any = None
        self.counts: collections.Counter[str] = collections.Counter()
        self.seconds: collections.Counter[str] = collections.Counter()
        self.lock = threading.Lock()
        self.dirty = False
        threading.Thread(target=self._flush_loop, daemon=True).start()

    def producer(self) -> Any:
        # The output publish is confirmed whatever the hops do: Chalk confirms it.
        if self.out is None:
            conn = Connection(CFG.broker, transport_options={"confirm_publish": True})
            self.out = conn.Producer()
        return self.out

    def count(self, key: str, n: int = 1, **seconds: float) -> None:
        with self.lock:
            self.counts[key] += n
            self.seconds.update(seconds)
            self.dirty = True

    def _flush_loop(self) -> None:
        path = Path(CFG.stats_dir) / f"{self.pid}.json"
        while True:
            time.sleep(0.25)
            with self.lock:
                if not self.dirty:
                    continue
                data = {"counts": dict(self.counts), "seconds": dict(self.seconds)}
                self.dirty = False
            if CFG.stats_dir:
                tmp = path.with_suffix(".tmp")
                tmp.write_text(json.dumps(data))
                tmp.replace(path)


_here: _Process | None = None


def _process() -> _Process:
    global _here
    if _here is None or _here.pid != os.getpid():
        _here = _Process()
    return _here


def _read_modify_write(task: Any, record_id: str, change: Any) -> None:
    here = _process()
    db = here.db
    try:
        started = time.perf_counter()
        db.execute("BEGIN IMMEDIATE")
        waited = time.perf_counter() - started
        try:
            doc_text, version = db.execute(
                "SELECT doc, version FROM chalk_records WHERE id = ?", (record_id,)).fetchone()
            doc = json.loads(doc_text)
            change(doc["meta"]["attrs"])
            db.execute("UPDATE chalk_records SET doc = ?, version = ?, updated_at = ? WHERE id = ?",
                       (json.dumps(doc, ensure_ascii=False, separators=(",", ":")), version + 1,
                        time.time(), record_id))
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
    except sqlite3.OperationalError as e:
        if "locked" not in str(e) and "busy" not in str(e):
            raise
        here.count("locked_retries")
        raise task.retry(exc=e, countdown=0.1 + 0.9 * (task.request.retries / _LOCKED_RETRIES),
                         max_retries=_LOCKED_RETRIES) from e
    here.count("writes", lock_wait=waited, write=time.perf_counter() - started)
    if waited > 0.01:
        here.count("lock_waits_over_10ms")


@app.task(bind=True, name="chalk_bench.normalize")
def normalize_task(self: Any, record_id: str) -> None:
    _read_modify_write(self, record_id, _normalize)


@app.task(bind=True, name="chalk_bench.count")
def count_task(self: Any, record_id: str) -> None:
    _read_modify_write(self, record_id, _count)


@app.task(bind=True, name="chalk_bench.fingerprint")
def fingerprint_task(self: Any, record_id: str) -> None:
    _read_modify_write(self, record_id, _hash)


@app.task(bind=True, name="chalk_bench.publish")
def publish_task(self: Any, record_id: str) -> None:
    here = _process()
    started = time.perf_counter()
    here.producer().publish(record_id, exchange="", routing_key=CFG.out, delivery_mode=2,
                            content_type="text/plain", content_encoding="utf-8",
                            retry=True, retry_policy={"max_retries": 5})
    here.count("published", publish=time.perf_counter() - started)


def record_chain(record_id: str) -> Any:
    return chain(normalize_task.si(record_id), count_task.si(record_id),
                 fingerprint_task.si(record_id), publish_task.si(record_id))


# -- the bench (this process) ------------------------------------------------------


def seed(db: Path, n: int) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """bench_listener's records, stored with Chalk's blackboard (the rows the service uses),
    and their stored versions."""
    from bench_listener import body_for  # imports listener_router: only here, not in workers

    from blackboard import Blackboard

    records = [r for i in range(n) for r in json.loads(body_for(i))["records"]]
    bb = Blackboard.connect(f"sqlite:///{db}")
    try:
        for start in range(0, n, 1000):
            part = records[start:start + 1000]
            ids = [r["id"] for r in part]
            bb.load_many(ids)
            for record in part:
                bb.set_attributes(record["id"], record["attributes"])
            bb.commit_many(ids)
    finally:
        bb.close()
    conn = sqlite3.connect(db)
    versions = dict(conn.execute("SELECT id, version FROM chalk_records").fetchall())
    conn.close()
    return records, versions


class Worker:
    """The Celery worker node as a subprocess (its own session, killed with it)."""

    def __init__(self, cfg: Config, name: str, concurrency: int, log: Path, consume: str):
        env = dict(os.environ, **{_ENV: json.dumps(dataclasses.asdict(cfg))})
        here = str(Path(__file__).resolve().parent)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [here, env.get("PYTHONPATH")]))
        self.log, self.name = log, name
        self.output = open(log.with_suffix(".out"), "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "bench_celery", "worker", "--pool=prefork",
             f"--concurrency={concurrency}", "-Q", consume, "-n", name,
             "--loglevel=WARNING", f"--logfile={log}", "--without-gossip", "--without-mingle",
             "--without-heartbeat", f"--prefetch-multiplier={cfg.prefetch_multiplier}"],
            env=env, cwd=here, stdin=subprocess.DEVNULL, stdout=self.output,
            stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, concurrency: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"celery worker exited with {self.proc.returncode}:\n{self.tail()}")
            if (len(descendants(self.proc.pid)) >= concurrency
                    and app.control.ping(destination=[self.name], timeout=0.5)):
                return
            time.sleep(0.2)
        raise RuntimeError(f"celery worker not ready after {timeout:.0f} s:\n{self.tail()}")

    def tail(self) -> str:
        text = ""
        for path in (self.log, self.log.with_suffix(".out")):
            if path.exists():
                text += path.read_text(errors="replace")[-3000:]
        return text

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # warm shutdown: running tasks finish, reserved ones go back
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the pool processes too, if any are left
        except ProcessLookupError:
            pass
        self.proc.wait(5)
        self.output.close()


class OutputConsumer(threading.Thread):
    """Counts the IDs arriving on the output queue and when each new one came."""

    def __init__(self, url: str, queue: str):
        super().__init__(daemon=True)
        self.url, self.queue = url, queue
        self.seen: collections.Counter[str] = collections.Counter()
        self.last_new = 0.0
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        import pika
        try:
            conn = pika.BlockingConnection(pika.URLParameters(self.url))
            ch = conn.channel()
            ch.basic_qos(prefetch_count=1000)
            for method, _props, body in ch.consume(self.queue, inactivity_timeout=0.2):
                if method is not None:
                    rid = body.decode()
                    if rid not in self.seen:
                        self.last_new = time.perf_counter()
                    self.seen[rid] += 1
                    if method.delivery_tag % 100 == 0:
                        ch.basic_ack(method.delivery_tag, multiple=True)
                elif self.stopping.is_set():
                    break
            ch.cancel()
            conn.close()
        except BaseException as e:  # reported by the bench
            self.error = e


def _declare(url: str, cfg: Config) -> None:
    import pika
    try:
        conn = pika.BlockingConnection(pika.URLParameters(url))
    except pika.exceptions.AMQPConnectionError as e:
        raise SystemExit(f"no RabbitMQ at {url} ({e!r}): start one (bash scripts/services.sh "
                         "start-rabbitmq) or pass --broker") from e
    conn.channel().queue_declare(cfg.out, durable=True,
                                 arguments={"x-queue-type": cfg.queue_type})
    conn.close()


def _delete_queues(url: str, names: list[str], exchanges: tuple[str, ...] | list[str] = ()) -> None:
    import pika
    try:
        conn = pika.BlockingConnection(pika.URLParameters(url))
        for name in names:
            ch = conn.channel()
            ch.queue_delete(name)
            ch.close()
        for name in exchanges:
            ch = conn.channel()
            ch.exchange_delete(name)
            ch.close()
        conn.close()
    except Exception as e:  # cleaning up: say so and go on
        print(f"warning: could not delete queues {names}: {e}", file=sys.stderr)


def _counters(stats: Path) -> tuple[collections.Counter[str], collections.Counter[str]]:
    """The pool processes' counts and seconds, summed (as last written, every 0.25 s)."""
    counts: collections.Counter[str] = collections.Counter()
    seconds: collections.Counter[str] = collections.Counter()
    for path in stats.glob("*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        counts.update(data["counts"])
        seconds.update(data["seconds"])
    return counts, seconds


def check(db: Path, records: list[dict[str, Any]], versions: dict[str, int],
          seen: collections.Counter[str]) -> dict[str, int]:
    """Each record changed by exactly three writes to the expected values; each ID out once."""
    conn = sqlite3.connect(db)
    rows = dict((rid, (json.loads(doc), v)) for rid, doc, v in
                conn.execute("SELECT id, doc, version FROM chalk_records"))
    conn.close()
    bad = {"wrong_values": 0, "extra_writes": 0, "missing_writes": 0}
    for record in records:
        doc, version = rows[record["id"]]
        text = [normalized(record["attributes"]["text"])]
        want = {"text": text, "words": [word_count(text)], "hash": [fingerprint(text)]}
        if version > versions[record["id"]] + 3:
            bad["extra_writes"] += 1
        elif version < versions[record["id"]] + 3:
            bad["missing_writes"] += 1
        if any(doc["meta"]["attrs"].get(k) != v for k, v in want.items()):
            bad["wrong_values"] += 1
    ids = {r["id"] for r in records}
    bad["ids_missing"] = len(ids - seen.keys())
    bad["ids_duplicated"] = sum(1 for rid, c in seen.items() if c > 1)
    bad["ids_unknown"] = len(seen.keys() - ids)
    return bad


def run_once(args: argparse.Namespace, base: Config) -> dict[str, Any]:
    """One run: a fresh database, worker and queues (the queue names are the invocation's)."""
    tmp = Path(tempfile.mkdtemp(prefix="chalk-celery-"))
    try:
        result = _run_in(tmp, args, base)
    finally:
        if args.keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return result


def _run_in(tmp: Path, args: argparse.Namespace, base: Config) -> dict[str, Any]:
    stats = tmp / "stats"
    stats.mkdir()
    cfg = dataclasses.replace(base, db=str(tmp / "bench.db"), stats_dir=str(stats))
    _declare(args.broker, cfg)
    standby = f"{cfg.queue}.standby"
    try:
        records, versions = seed(Path(cfg.db), args.records)
    except BaseException:
        _delete_queues(args.broker, [cfg.out])
        raise
    name = f"{cfg.queue}@{socket.gethostname()}"
    worker = Worker(cfg, name, args.concurrency, tmp / "worker.log",
                    consume=standby if args.preload else cfg.queue)
    consumer = OutputConsumer(args.broker, cfg.out)
    result: dict[str, Any] = {"records": args.records, "loadavg_before": os.getloadavg()[0]}
    try:
        worker.wait_ready(args.concurrency)
        consumer.start()
        beam = broker_pid(args.broker)
        ids = [r["id"] for r in records]
        chains = [record_chain(rid) for rid in ids]
        if args.preload:
            with app.producer_or_acquire() as producer:
                for c in chains:
                    c.apply_async(producer=producer)
        cpu0 = (tree_cpu(worker.proc.pid), cpu_seconds(beam) if beam else 0.0, time.process_time())
        started = time.perf_counter()
        if args.preload:
            app.control.add_consumer(cfg.queue, destination=[name], reply=True, timeout=5)
        else:
            with app.producer_or_acquire() as producer:
                for c in chains:
                    c.apply_async(producer=producer)
        enqueued = time.perf_counter() - started
        # Progress is any task done, not only IDs out: preloaded, every first task
        # runs before any second one, and the first ID comes near the end.
        deadline, last_progress, last_change, looked = started + args.timeout, -1, 0.0, 0.0
        while len(consumer.seen) < args.records:
            time.sleep(0.05)
            if worker.proc.poll() is not None or consumer.error is not None:
                break
            now = time.monotonic()
            if now - looked >= 1.0:
                looked = now
                progress = len(consumer.seen) + sum(_counters(stats)[0].values())
                if progress != last_progress:
                    last_progress, last_change = progress, now
            if time.perf_counter() > deadline or now - last_change > args.idle_timeout:
                break
        finished = consumer.last_new or time.perf_counter()
        cpu1 = (tree_cpu(worker.proc.pid), cpu_seconds(beam) if beam else 0.0, time.process_time())
        time.sleep(args.grace)  # late duplicates, and the pool processes' last counters
        elapsed = finished - started
        done = len(consumer.seen)
        cpu = {who: b - a for who, a, b in zip(("worker", "broker", "bench"), cpu0, cpu1, strict=True)}
        counters, seconds = _counters(stats)
        result.update(
            received=done, seconds=round(elapsed, 3), records_per_s=round(done / elapsed, 1),
            enqueue_seconds=None if args.preload else round(enqueued, 3),
            cpu_ms_per_record={k: round(v / max(done, 1) * 1e3, 3) for k, v in cpu.items()},
            worker_cpu_cores=round(cpu["worker"] / elapsed, 2),
            writes=counters["writes"], published=counters["published"],
            locked_retries=counters["locked_retries"],
            lock_waits_over_10ms=counters["lock_waits_over_10ms"],
            lock_wait_s=round(seconds["lock_wait"], 3),
            # wall time inside the task bodies, per record: the rest of the pool
            # processes' time is Celery's (messages, the next hop, acks) or idle
            task_body_ms_per_record={k: round(seconds[k] / max(done, 1) * 1e3, 3)
                                     for k in ("write", "publish")},
            loadavg_after=os.getloadavg()[0])
        if worker.proc.poll() is not None:
            result["error"] = f"worker exited with {worker.proc.returncode}"
        elif consumer.error is not None:
            result["error"] = f"output consumer failed: {consumer.error!r}"
        elif done < args.records:
            result["error"] = f"only {done} of {args.records} IDs after {elapsed:.0f} s"
    finally:
        consumer.stopping.set()
        worker.stop()
        consumer.join(10)
        _delete_queues(args.broker, [cfg.queue, cfg.out, standby], exchanges=[cfg.queue, standby])
    result["check"] = check(Path(cfg.db), records, versions, consumer.seen)
    if "error" in result:
        print(worker.tail(), file=sys.stderr)
    return result


def summary(r: dict[str, Any]) -> str:
    bad = {k: v for k, v in r["check"].items() if v}
    cpu = r["cpu_ms_per_record"]
    enqueue = "" if r["enqueue_seconds"] is None else f" (enqueued in {r['enqueue_seconds']:.1f} s)"
    body = r["task_body_ms_per_record"]
    return (f"celery chain: {r['received']:,}/{r['records']:,} records in {r['seconds']:.1f} s"
            f"{enqueue} = "
            f"{r['records_per_s']:,.0f} records/s; CPU ms/record worker {cpu['worker']:.2f} "
            f"({r['worker_cpu_cores']:.2f} cores), broker {cpu['broker']:.2f}, bench {cpu['bench']:.2f}; "
            f"in task bodies ms/record: 3 writes {body['write']:.2f}, publish {body['publish']:.2f}; "
            f"locked retries {r['locked_retries']}, lock waits >10 ms {r['lock_waits_over_10ms']} "
            f"({r['lock_wait_s']:.1f} s); check {'ok' if not bad else bad}; "
            f"load {r['loadavg_before']:.1f}/{r.get('loadavg_after', 0):.1f}"
            + (f"; {r['error']}" if "error" in r else ""))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=10000, help="records (one chain each)")
    parser.add_argument("--broker", default="amqp://guest:guest@127.0.0.1:5672/%2F")
    parser.add_argument("--runs", type=int, default=1, help="runs, each with a fresh worker, "
                        "database and queues; the summary gives the median records/s")
    parser.add_argument("--concurrency", type=int, default=os.cpu_count() or 1,
                        help="pool processes (default: one per core)")
    parser.add_argument("--prefetch-multiplier", type=int, default=4,
                        help="worker_prefetch_multiplier (Celery's default 4)")
    parser.add_argument("--confirm-hops", action="store_true",
                        help="publish the chain's next task (and the enqueued first) with publisher "
                             "confirms, as Chalk's guarantees need (default: Celery's default, none)")
    parser.add_argument("--queue-type", choices=["classic", "quorum"], default="classic")
    parser.add_argument("--preload", action="store_true",
                        help="enqueue every chain first; the clock starts when the worker starts "
                             "consuming (as bench_listener measures Chalk)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="give up after this many s")
    parser.add_argument("--idle-timeout", type=float, default=60.0,
                        help="give up when no task finishes for this many s")
    parser.add_argument("--grace", type=float, default=2.0,
                        help="s to wait after the last ID for duplicates")
    parser.add_argument("--keep", action="store_true", help="keep the database and worker logs")
    parser.add_argument("--json", action="store_true",
                        help="print the results as one JSON object on stdout (the lines go to stderr)")
    args = parser.parse_args()

    stopping: list[int] = []

    def interrupted(signum: int, _frame: Any) -> None:
        if not stopping:  # the first one stops the run; later ones let the clean-up finish
            stopping.append(signum)
            raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)
    if args.runs < 1 or args.records < 1:
        parser.error("--runs and --records must be at least 1")
    lines: Any = sys.stderr if args.json else sys.stdout
    if os.environ.get(_CHILD):  # one run of several: the parent prints the lines
        lines = open(os.devnull, "w")
    settings = {"concurrency": args.concurrency, "prefetch_multiplier": args.prefetch_multiplier,
                "confirmed_hops": args.confirm_hops, "queue_type": args.queue_type,
                "preload": args.preload, "acks_late": True, "celery": app_version()}
    print(f"{args.records:,} records, Celery {settings['celery']}, {args.concurrency} pool processes, "
          f"prefetch multiplier {args.prefetch_multiplier}, {args.queue_type} queue, hops "
          f"{'confirmed' if args.confirm_hops else 'unconfirmed'}"
          f"{', preloaded' if args.preload else ''}", file=lines, flush=True)
    if args.runs == 1:
        queue = f"chalk.celery.{uuid.uuid4().hex[:8]}"
        base = Config(broker=args.broker, queue=queue, out=f"{queue}.out",
                      prefetch_multiplier=args.prefetch_multiplier,
                      confirm_hops=args.confirm_hops, queue_type=args.queue_type)
        configure(base)
        runs = [run_once(args, base)]
        print(summary(runs[0]), file=lines, flush=True)
    else:
        runs = []
        for _ in range(args.runs):
            runs.append(run_child())
            print(summary(runs[-1]) if "check" in runs[-1] else runs[-1]["error"],
                  file=lines, flush=True)
    rates = [r["records_per_s"] for r in runs]
    ok = all("error" not in r and not any(r["check"].values()) for r in runs)
    if args.runs > 1:
        print(f"median {statistics.median(rates):,.0f} records/s (runs: "
              f"{', '.join(f'{x:,.0f}' for x in rates)})", file=lines)
    if args.json:
        json.dump({"bench": "celery", "settings": settings, "runs": runs,
                   "records_per_s_median": statistics.median(rates), "ok": ok}, sys.stdout)
        print()
    return 0 if ok else 1


def run_child() -> dict[str, Any]:
    """One run in a process of its own: a fresh Celery app (Celery and kombu remember the
    queues they declared, so queues deleted after a run would not be declared again)."""
    argv, skip = [], False
    for arg in sys.argv[1:]:
        if skip:
            skip = False
        elif arg in ("--runs", "--json"):
            skip = arg == "--runs"
        elif not arg.startswith("--runs="):
            argv.append(arg)
    child = subprocess.Popen([sys.executable, __file__, *argv, "--runs", "1", "--json"],
                             stdout=subprocess.PIPE, stderr=None, text=True,
                             env=dict(os.environ, **{_CHILD: "1"}))
    try:
        out, _ = child.communicate()
    except BaseException:
        child.terminate()  # it cleans up (SIGTERM: its worker, queues, files)
        child.wait(60)
        raise
    try:
        return dict(json.loads(out)["runs"][0])
    except (ValueError, KeyError, IndexError):
        return {"records_per_s": 0.0, "error": f"run exited with {child.returncode}, no results"}


def app_version() -> str:
    import celery
    return celery.__version__


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted; worker, queues and files cleaned up", file=sys.stderr)
        sys.exit(130)
