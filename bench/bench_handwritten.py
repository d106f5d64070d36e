"""The hand-written baseline: what a careful user writes with pika and SQLAlchemy Core.

No framework, no Spark, one process (or several: ``--processes``), one thread each
(:class:`Consumer`):

* a ``SelectConnection`` consumer on a quorum queue, prefetch 4 × batch;
* per batch (up to 500 messages, 100 for the ``real`` work, or what arrived
  once 20 ms passed without a message), one SQLite transaction (WAL): the
  messages whose IDs the inbox table already holds are dropped, the records'
  JSON loaded with one ``SELECT … IN``, each message's attributes written over
  its records, the bench's three steps run on each record, the records written
  back (``executemany`` upsert) and the inbox rows inserted;
* then one persistent outgoing message per record to a quorum queue with
  publisher confirms, and the inputs acked (``multiple=True``) once the broker
  has confirmed every outgoing message of their batch.

The three steps are those of bench_listener's Python pipelets (``--pipelets
user``): the text's whitespace collapsed and lowercased, its words counted, its
SHA-256 taken; ``words`` (and ``sent``, for latency) go out, as the bench's
router rule copies them.  ``--work counters`` adds 1 to three counters instead
(the tests count with it).  ``--work real`` is the work-bound bench's (about
1 ms of CPU a record): each message carries a web page of ``web_pages.py``'s
corpus, whose HTML the steps of ``web_steps.py`` strip to text, whose language
they detect and whose text they fingerprint (bench_listener's ``--pipelets
real`` runs the same functions); ``language`` and ``fingerprint`` go out.

Exactly once in effect under kill -9, like Chalk: the inbox row commits with the
records, so a redelivered message changes nothing.  The row also keeps the
message's outgoing records, which go out again, with the same message IDs, when
the input comes back: a crash between the commit and the confirms loses no
output (a consumer downstream drops the repeats by message ID).  What Chalk
adds and this has not: Spark isolation, a job log, retries, dead letters,
routing rules, metrics.

``--processes N`` runs N consumers on the same queue and the same SQLite
database.  Each then does its batch's work outside the write lock: it reads
the inbox and the records, runs the steps, and only then takes the lock
(``BEGIN IMMEDIATE``), checks again, and writes.  A message another process
committed meanwhile (a redelivery) is dropped, and a record another process
wrote meanwhile is worked again from what it wrote, under the lock, so the
consumers stay exactly once in effect together; the work itself, the bulk of
a work-bound record's cost, runs on both cores.  (A database per process
would not be: a message redelivered to the other process would apply twice.)

As a benchmark (:func:`measure`): the messages are published to a fresh queue,
then the consumer runs in a process of its own (a fresh interpreter that imports
only this module, and ``web_steps.py`` for the ``real`` work, as a user's would be)
until it has acked them all; records/s and the CPU per message of its process (of
each, with ``--processes``) and of the RabbitMQ node over that time.

Run: ``.venv/bin/python bench/bench_handwritten.py --messages 50000
--records-per-message 1`` (``--runs 3`` for medians; ``--json FILE``);
``--work real --processes 2 --messages 10000`` for the work-bound bench.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import re
import selectors
import subprocess
import sys
import tempfile
import time
import uuid
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pika
from _measure import broker_pid, cpu_seconds, machine, median
from sqlalchemy import (
    Column,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    create_engine,
    event,
    select,
)
from sqlalchemy.dialects.sqlite import insert
from web_pages import page

metadata = MetaData()
records = Table("records", metadata, Column("id", String, primary_key=True),
                Column("data", Text, nullable=False))
inbox = Table("inbox", metadata, Column("message_id", String, primary_key=True),
              Column("outgoing", LargeBinary, nullable=False))  # the message's outgoing records

_SPACE = re.compile(r"\s+")


def three_steps(doc: dict[str, Any]) -> None:
    """What the bench's three Python pipelets do to a record."""
    text = _SPACE.sub(" ", doc.get("text", "")).strip().lower()
    doc["text"] = text
    doc["words"] = len(text.split())
    doc["hash"] = hashlib.sha256(text.encode()).hexdigest()


def three_counters(doc: dict[str, Any]) -> None:
    for key in ("n1", "n2", "n3"):
        doc[key] = doc.get(key, 0) + 1


# work → (what it does to a record, the attributes its outgoing message carries); the
# web steps by name: only that work imports lxml and Chalk's two pipelet functions
WORK: dict[str, tuple[Callable[[dict[str, Any]], None] | str, tuple[str, ...]]] = {
    "text": (three_steps, ("words", "sent")),
    "counters": (three_counters, ("n1", "n2", "n3")),
    "real": ("web_steps.web_steps", ("language", "fingerprint", "sent")),
}


def batch_for(work: str) -> int:
    """Messages per transaction, at most: 500, and 100 for the ``real`` work (a tenth of a
    second of work, so that two processes split a backlog evenly and its tail is short)."""
    return 100 if work == "real" else 500


def steps_of(work: str) -> Callable[[dict[str, Any]], None]:
    """What ``work`` does to a record."""
    steps = WORK[work][0]
    if isinstance(steps, str):
        module, name = steps.rsplit(".", 1)
        steps = getattr(importlib.import_module(module), name)
    return steps


def open_store(path: str | Path) -> Any:
    """A SQLite engine in WAL mode whose transactions are real ones (pysqlite would
    start them only at the first write) and take the write lock at once."""
    engine = create_engine(f"sqlite:///{path}", connect_args={"timeout": 60})

    @event.listens_for(engine, "connect")
    def _connect(dbapi: Any, _record: Any) -> None:
        dbapi.isolation_level = None
        dbapi.execute("PRAGMA journal_mode=WAL")
        dbapi.execute("PRAGMA synchronous=NORMAL")

    @event.listens_for(engine, "begin")
    def _begin(conn: Any) -> None:  # a connection with the option "reading": a snapshot, no lock
        conn.exec_driver_sql("BEGIN" if conn.get_execution_options().get("reading")
                             else "BEGIN IMMEDIATE")

    metadata.create_all(engine)
    return engine


class Consumer:
    """Consumes ``queue`` until ``messages`` inputs are acked, or until nothing has
    arrived for ``idle_exit`` seconds and nothing is outstanding (its figures then end
    at its last ack).  ``shared``: other consumers write the same database (the work
    runs outside the write lock)."""

    def __init__(self, url: str, queue: str, out: str, db: str | Path, *, batch: int = 500,
                 idle: float = 0.02, work: str = "text", messages: int | None = None,
                 idle_exit: float | None = None, on_ready: Callable[[], None] | None = None,
                 shared: bool = False):
        self.url, self.queue, self.out, self.batch, self.idle = url, queue, out, batch, idle
        self.work, self.routed = steps_of(work), WORK[work][1]
        self.shared = shared
        self.redone = 0  # (shared) batches worked again: another consumer wrote their records
        self.messages, self.idle_exit, self.on_ready = messages, idle_exit, on_ready
        self.engine = open_store(db)
        upsert = insert(records)
        self.upsert = upsert.on_conflict_do_update(index_elements=[records.c.id],
                                                   set_={"data": upsert.excluded.data})
        self.pending: list[tuple[int, str, bytes]] = []  # (delivery tag, message ID, body)
        self.unacked: deque[tuple[int, int, int]] = deque()  # (last publish seq, last tag, count)
        self.published = self.confirmed = self.acked = 0
        self.early: set[int] = set()                      # single confirms past ``confirmed``
        self.timer: Any = None
        self.last = time.monotonic()
        self.error: BaseException | None = None
        self.closing = False
        self.started = self.finished = self.cpu_started = self.cpu_finished = 0.0
        self.last_ack = (0.0, 0.0)  # (clock, CPU) at the last ack, with ``idle_exit``

    def run(self) -> Consumer:
        self.conn = pika.SelectConnection(pika.URLParameters(self.url), on_open_callback=self._opened,
                                          on_open_error_callback=self._closed,
                                          on_close_callback=self._closed)
        self.conn.ioloop.start()
        if self.error is not None:
            raise RuntimeError(f"consumer stopped: {self.error!r}") from self.error
        return self

    def _opened(self, conn: Any) -> None:
        conn.channel(on_open_callback=self._channel)

    def _channel(self, ch: Any) -> None:
        self.ch = ch
        ch.add_on_close_callback(lambda _ch, reason: self._stop(reason))
        ch.confirm_delivery(self._confirmed)
        ch.basic_qos(prefetch_count=4 * self.batch, callback=self._consume)

    def _consume(self, _frame: Any) -> None:
        if self.on_ready is not None:
            self.on_ready()
        self.started, self.cpu_started = time.monotonic(), time.process_time()
        self.last = time.monotonic()
        self.ch.basic_consume(self.queue, self._message)
        if self.idle_exit is not None:
            self.conn.ioloop.call_later(0.1, self._check_idle)

    def _message(self, _ch: Any, method: Any, props: Any, body: bytes) -> None:
        mid = props.message_id or hashlib.sha256(body).hexdigest()
        self.pending.append((method.delivery_tag, mid, body))
        self.last = time.monotonic()
        if len(self.pending) >= self.batch:
            self._flush()
        elif self.timer is None:
            self.timer = self.conn.ioloop.call_later(self.idle, self._idle)

    def _idle(self) -> None:
        self.timer = None
        wait = self.last + self.idle - time.monotonic()
        if self.pending and wait > 0.001:
            self.timer = self.conn.ioloop.call_later(wait, self._idle)
        elif self.pending:
            self._flush()

    def _flush(self) -> None:
        batch, self.pending = self.pending, []
        for mid, outgoing in self._commit(batch).items():
            for record in outgoing:
                self.ch.basic_publish("", self.out, orjson.dumps({"records": [record]}),
                                      pika.BasicProperties(delivery_mode=2,
                                                           message_id=f"{mid}/{record['id']}"))
                self.published += 1
        self.unacked.append((self.published, batch[-1][0], len(batch)))
        self._ack()

    def _commit(self, batch: list[tuple[int, str, bytes]]) -> dict[str, list[dict[str, Any]]]:
        """One transaction: the batch's new messages applied and in the inbox; returns
        every message's outgoing records (kept ones for messages seen before)."""
        if self.shared:
            return self._commit_shared(batch)
        outgoing: dict[str, list[dict[str, Any]]] = {}
        with self.engine.begin() as db:
            fresh = self._fresh(db, batch, outgoing)
            docs, rows = self._apply(fresh, self._stored(db, fresh), outgoing)
            self._write(db, docs, rows)
        return outgoing

    def _commit_shared(self, batch: list[tuple[int, str, bytes]]) -> dict[str, list[dict[str, Any]]]:
        """:meth:`_commit` beside other consumers of the database: read, work, then lock,
        check again and write."""
        outgoing: dict[str, list[dict[str, Any]]] = {}
        fresh, stored = self._read(batch, outgoing)
        docs, rows = self._apply(fresh, stored, outgoing)  # the work: no lock held
        with self.engine.begin() as db:
            self._recheck(db, fresh, stored, docs, rows, outgoing)
        return outgoing

    def _read(self, batch: list[tuple[int, str, bytes]], outgoing: dict[str, list[dict[str, Any]]]
              ) -> tuple[dict[str, list[dict[str, Any]]], dict[str, str]]:
        """The batch's new messages and their records as stored, from a snapshot."""
        with self.engine.connect() as db:
            db.execution_options(reading=True)
            with db.begin():
                fresh = self._fresh(db, batch, outgoing)
                return fresh, self._stored(db, fresh)

    def _recheck(self, db: Any, fresh: dict[str, list[dict[str, Any]]], stored: dict[str, str],
                 docs: dict[str, dict[str, Any]], rows: list[dict[str, Any]],
                 outgoing: dict[str, list[dict[str, Any]]]) -> None:
        """Under the write lock: what :meth:`_read` saw is checked again, the batch worked
        again if another consumer committed one of its messages or wrote one of its
        records meanwhile, then written."""
        done = self._seen(db, list(fresh))
        for mid, kept in done.items():
            outgoing[mid] = orjson.loads(kept)
            del fresh[mid]
        now = self._stored(db, fresh)
        if done or now != stored:
            self.redone += 1
            docs, rows = self._apply(fresh, now, outgoing)
        self._write(db, docs, rows)

    def _seen(self, db: Any, mids: list[str]) -> dict[str, bytes]:
        """Of these messages, those in the inbox: message ID → their outgoing records."""
        return dict(db.execute(select(inbox.c.message_id, inbox.c.outgoing)
                               .where(inbox.c.message_id.in_(mids))).all())

    def _fresh(self, db: Any, batch: list[tuple[int, str, bytes]],
               outgoing: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
        """The batch's messages not in the inbox: message ID → its records; those in it
        have their kept outgoing records put in ``outgoing``."""
        seen = self._seen(db, [m for _, m, _ in batch])
        fresh: dict[str, list[dict[str, Any]]] = {}
        for _tag, mid, body in batch:
            if mid in seen:
                outgoing[mid] = orjson.loads(seen[mid])
            elif mid not in fresh:
                message = orjson.loads(body)
                fresh[mid] = message["records"] if "records" in message else [message]
        return fresh

    def _stored(self, db: Any, fresh: dict[str, list[dict[str, Any]]]) -> dict[str, str]:
        """The stored JSON of the messages' records (those stored)."""
        ids = list({r["id"]: None for recs in fresh.values() for r in recs})
        stored: dict[str, str] = {}
        for start in range(0, len(ids), 30_000):  # SQLite takes at most 32,766 parameters
            stored.update(db.execute(select(records.c.id, records.c.data)
                                     .where(records.c.id.in_(ids[start:start + 30_000]))).all())
        return stored

    def _apply(self, fresh: dict[str, list[dict[str, Any]]], stored: dict[str, str],
               outgoing: dict[str, list[dict[str, Any]]]
               ) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
        """Each message's attributes written over its records and the steps run, in
        order: the records, and the inbox rows (with each message's outgoing records)."""
        docs: dict[str, dict[str, Any]] = {}
        rows = []
        for mid, recs in fresh.items():
            out = []
            for r in recs:
                doc = docs.get(r["id"])
                if doc is None:
                    doc = docs[r["id"]] = orjson.loads(stored.get(r["id"], "{}"))
                doc.update(r.get("attributes") or {})
                self.work(doc)
                out.append({"id": r["id"], "attributes": {k: doc[k] for k in self.routed if k in doc}})
            outgoing[mid] = out
            rows.append({"message_id": mid, "outgoing": orjson.dumps(out)})
        return docs, rows

    def _write(self, db: Any, docs: dict[str, dict[str, Any]], rows: list[dict[str, Any]]) -> None:
        if rows:
            db.execute(self.upsert, [{"id": i, "data": orjson.dumps(d).decode()}
                                     for i, d in docs.items()])
            db.execute(inbox.insert(), rows)

    def _confirmed(self, frame: Any) -> None:
        m = frame.method
        if isinstance(m, pika.spec.Basic.Nack):  # the inputs go back; their outputs go again
            self._stop(RuntimeError(f"the broker refused outgoing message #{m.delivery_tag}"))
            return
        if m.multiple:
            self.confirmed = max(self.confirmed, m.delivery_tag)
            self.early = {t for t in self.early if t > self.confirmed}
        else:
            self.early.add(m.delivery_tag)
        while self.confirmed + 1 in self.early:
            self.confirmed += 1
            self.early.discard(self.confirmed)
        self._ack()

    def _ack(self) -> None:
        while self.unacked and self.unacked[0][0] <= self.confirmed:
            _seq, tag, count = self.unacked.popleft()
            self.ch.basic_ack(tag, multiple=True)
            self.acked += count
            if self.idle_exit is not None:  # the work's end, not the idle wait after it
                self.last_ack = (time.monotonic(), time.process_time())
        if self.messages is not None and self.acked >= self.messages:
            self._stop()

    def _check_idle(self) -> None:
        assert self.idle_exit is not None
        if not self.pending and not self.unacked and time.monotonic() - self.last >= self.idle_exit:
            self._stop(at=self.last_ack if self.acked else None)
        elif not self.closing:
            self.conn.ioloop.call_later(0.1, self._check_idle)

    def _stop(self, error: BaseException | None = None,
              at: tuple[float, float] | None = None) -> None:
        if self.closing:
            return
        self.closing = True
        self.error = error
        self.finished, self.cpu_finished = at or (time.monotonic(), time.process_time())
        if self.conn.is_open:
            self.conn.close()
        else:
            self.conn.ioloop.stop()

    def _closed(self, _conn: Any, reason: BaseException) -> None:
        if not self.closing:
            self.closing, self.error = True, reason
        self.conn.ioloop.stop()


# --- the benchmark around it --------------------------------------------------------


def body_for(first: int, sent: float | None = None, per_message: int = 1,
             work: str = "text") -> bytes:
    """A message of ``per_message`` records numbered from ``first`` (bench_listener's):
    a short text each, or for the ``real`` work a web page (``content``)."""
    recs: list[dict[str, Any]] = []
    for i in range(first, first + per_message):
        attributes: dict[str, Any] = ({"content": page(i)} if work == "real"
                                      else {"text": f"  Some   TEXT number {i}  with words "})
        if sent is not None:
            attributes["sent"] = sent
        recs.append({"id": f"b{i:07d}", "attributes": attributes})
    return json.dumps({"records": recs}).encode()


def declare(url: str, queue_type: str, *queues: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    for queue in queues:
        ch.queue_declare(queue, durable=True, arguments={"x-queue-type": queue_type})
    conn.close()


def depth(url: str, queue: str) -> int:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        return conn.channel().queue_declare(queue, passive=True).method.message_count
    finally:
        conn.close()


def publish_backlog(url: str, queue: str, bodies: list[bytes], prefix: str,
                    timeout: float = 300) -> None:
    """Publish persistent messages (IDs ``prefix-N``) to an empty ``queue`` and wait until
    it holds them all (quicker than waiting for a confirm per message).

    Without confirms a loaded broker may drop a few (seen: 17 of 50,000, on a quorum queue
    declared just before): when the depth stops growing short of the count for 10 s, the
    shortfall is published again (copies of the last bodies, IDs ``prefix-again-N``), so
    the queue holds exactly as many messages as asked."""
    def send(items: list[tuple[str, bytes]]) -> None:
        conn = pika.BlockingConnection(pika.URLParameters(url))
        ch = conn.channel()
        for mid, body in items:
            ch.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2,
                                                                   message_id=mid))
        conn.close()

    send([(f"{prefix}-{n}", body) for n, body in enumerate(bodies)])
    deadline = time.monotonic() + timeout
    seen, since, again = -1, time.monotonic(), 0
    while (found := depth(url, queue)) < len(bodies):
        now = time.monotonic()
        if now > deadline:
            raise TimeoutError(f"{queue}: fewer than {len(bodies)} messages after {timeout} s")
        if found != seen:
            seen, since = found, now
        elif now - since > 10:
            missing = len(bodies) - found
            send([(f"{prefix}-again-{again + n}", body)
                  for n, body in enumerate(bodies[-missing:])])
            again += missing
            since = now
        time.sleep(0.05)


def delete_queues(url: str, *queues: str, tries: int = 3) -> None:
    """Delete the bench's queues.  RabbitMQ 3.10 sometimes fails the deletion of a quorum
    queue just drained (its log's segment writer restarts: INTERNAL_ERROR); it is tried
    again, and a queue left over only costs disk, so the figures stand."""
    for queue in queues:
        for attempt in range(1, tries + 1):
            try:
                conn = pika.BlockingConnection(pika.URLParameters(url))
                try:
                    conn.channel().queue_delete(queue)
                finally:
                    if conn.is_open:
                        conn.close()
                break
            except pika.exceptions.AMQPError as e:
                if attempt == tries:
                    print(f"warning: queue {queue} not deleted: {e!r}", file=sys.stderr)
                else:
                    time.sleep(2.0)


def serve(config: str) -> None:
    """The measured consumer's process (``config``: JSON of :class:`Consumer`'s arguments):
    "ready" on stdout once connected, consume on a line on stdin, the figures as JSON."""
    kwargs = json.loads(config)

    def ready() -> None:
        print("ready", flush=True)
        sys.stdin.readline()

    c = Consumer(**kwargs, on_ready=ready)
    try:
        c.run()
    except Exception as e:
        print(json.dumps({"error": repr(e)}), flush=True)
        raise
    print(json.dumps({"seconds": c.finished - c.started, "cpu": c.cpu_finished - c.cpu_started,
                      "acked": c.acked, "published": c.published, "started": c.started,
                      "finished": c.finished, "redone": c.redone}), flush=True)


def _line(process: subprocess.Popen[str], timeout: float, what: str) -> str:
    assert process.stdout is not None
    with selectors.DefaultSelector() as waiting:
        waiting.register(process.stdout, selectors.EVENT_READ)
        line = process.stdout.readline() if waiting.select(timeout) else ""
    if not line:
        raise RuntimeError(f"the hand-written consumer {what} (exit code {process.poll()})")
    return line


def consume(configs: list[dict[str, Any]], serve: str = "bench_handwritten.serve",
            rabbit: int | None = None) -> tuple[list[dict[str, Any]], float | None]:
    """A consumer process for each of ``configs`` (:class:`Consumer`'s arguments), each
    running ``serve`` (``module.name`` in this folder): all started and ready, then all
    told to go.  Their figures, and the CPU seconds the process ``rabbit`` spent from the
    go to the last figures."""
    here = str(Path(__file__).resolve().parent)
    module = serve.rsplit(".", 1)[0]
    started = [subprocess.Popen(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {here!r}); "
         f"import {module}; {serve}(sys.argv[1])", json.dumps(config)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for config in configs]
    try:
        for process in started:
            if _line(process, 120, "did not start").strip() != "ready":
                raise RuntimeError("the hand-written consumer said something else than ready")
        before = cpu_seconds(rabbit)
        for process in started:
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()
        results = [json.loads(_line(process, 3600, "did not finish")) for process in started]
        after = cpu_seconds(rabbit)
    finally:
        for process in started:
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    for result in results:
        if "error" in result:
            raise RuntimeError(f"the hand-written consumer failed: {result['error']}")
    return results, None if rabbit is None else after - before


def measure(url: str, messages: int, per_message: int = 1, *, queue_type: str = "quorum",
            db: str | Path | None = None, first: int = 0, batch: int | None = None,
            work: str = "text", processes: int = 1,
            serve: str = "bench_handwritten.serve") -> dict[str, Any]:
    """One pass: ``messages`` messages of ``per_message`` records (numbered from ``first``)
    published, then consumed by the hand-written consumer in a process of its own (a
    fresh interpreter importing only this module), or by ``processes`` of them on the
    same queue and database.  ``db``: a SQLite file kept across passes (default: a new
    one).  ``batch``: by default :func:`batch_for` the work.  ``serve``: the function
    the process runs (``module.name`` in this folder; ``bench_budget.serve_probed``
    adds probes).

    With several processes each stops once nothing has come for a second, and the
    pass lasts from the first one's start to the last one's last ack; the CPU of each
    is counted to its last ack."""
    tag = uuid.uuid4().hex[:6]
    src, dst = f"bench.{tag}.hand.in", f"bench.{tag}.hand.out"
    db = db or Path(tempfile.mkdtemp(prefix="chalk-hand-")) / "hand.db"
    open_store(db).dispose()  # the tables, before several processes race to make them
    declare(url, queue_type, src, dst)
    try:
        publish_backlog(url, src, [body_for(first + i * per_message, per_message=per_message,
                                            work=work) for i in range(messages)], f"h{tag}")
        config = {"url": url, "queue": src, "out": dst, "db": str(db), "messages": messages,
                  "batch": batch or batch_for(work), "work": work}
        if processes > 1:
            config.update(messages=None, idle_exit=1.0, shared=True)
        results, rabbit_cpu = consume([config] * processes, serve, broker_pid(url))
        acked = sum(r["acked"] for r in results)
        if acked != messages:
            raise RuntimeError(f"{acked} messages acked of {messages}")
        routed = depth(url, dst)
        if routed != messages * per_message:  # a baseline doing less work would be worthless
            raise RuntimeError(f"{routed} outgoing messages for {messages * per_message} records")
    finally:
        delete_queues(url, src, dst)
    n_records = messages * per_message
    seconds = (results[0]["seconds"] if processes == 1
               else max(r["finished"] for r in results) - min(r["started"] for r in results))
    if processes == 1:
        cpu = {"hand-written": results[0]["cpu"] / messages * 1e6}
    else:
        cpu = {f"hand-written {k}": r["cpu"] / messages * 1e6 for k, r in enumerate(results, 1)}
    if rabbit_cpu is not None:
        cpu["RabbitMQ"] = rabbit_cpu / messages * 1e6
    one = results[0]
    return {"messages": messages, "records": n_records, "per_message": per_message,
            "processes": processes, "seconds": seconds, "rate": n_records / seconds,
            "message_rate": messages / seconds, "cpu_us": cpu,
            **({"acked": [r["acked"] for r in results], "redone": sum(r["redone"] for r in results)}
               if processes > 1 else {}),
            **({"probes": one["probes"]} if "probes" in one else {})}


def own_cpu(cpu: dict[str, float]) -> float:
    """CPU per message of the hand-written processes (the RabbitMQ node aside)."""
    return sum(us for name, us in cpu.items() if name.startswith("hand-written"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=50_000, help="messages per run")
    parser.add_argument("--records-per-message", type=int, default=1, metavar="N")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--batch", type=int, help="messages per transaction, at most (default "
                                                   "500; 100 for the real work)")
    parser.add_argument("--work", choices=sorted(WORK), default="text",
                        help="text: the bench's three steps (default); counters: +1 on three "
                             "counters; real: a web page's HTML stripped, its language "
                             "detected, its text fingerprinted (about 1 ms a record)")
    parser.add_argument("--processes", type=int, default=1, metavar="N",
                        help="consumers on the same queue and database (default 1)")
    parser.add_argument("--queue-type", choices=["quorum", "classic"], default="quorum")
    parser.add_argument("--broker", default="amqp://guest:guest@127.0.0.1:5672/%2F")
    parser.add_argument("--json", metavar="FILE", help="write every figure here")
    args = parser.parse_args(argv)
    if args.processes < 1:
        parser.error("--processes: at least 1")
    per = args.records_per_message
    args.batch = args.batch or batch_for(args.work)
    print(f"machine: {machine()}")
    print(f"hand-written consumer: {args.messages:,} messages of {per} record(s), "
          f"batches of ≤ {args.batch}, work {args.work}, {args.queue_type} queues, "
          f"{args.processes} process{'es' if args.processes > 1 else ''}", flush=True)
    runs = []
    for i in range(args.runs):
        one = measure(args.broker, args.messages, per, queue_type=args.queue_type,
                      batch=args.batch, work=args.work, processes=args.processes)
        runs.append(one)
        cpu = one["cpu_us"]
        print(f"run {i + 1}: {one['rate']:,.0f} records/s ({one['message_rate']:,.0f} msg/s); "
              f"CPU µs/message: " + ", ".join(f"{k} {v:.0f}" for k, v in cpu.items())
              + f"; per record: {own_cpu(cpu) / per:.1f} in its process"
              + ("es" if args.processes > 1 else ""), flush=True)
    if args.runs > 1:
        print(f"median: {median([r['rate'] for r in runs]):,.0f} records/s; CPU µs/message "
              f"in its process{'es' if args.processes > 1 else ''} "
              f"{median([own_cpu(r['cpu_us']) for r in runs]):.0f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"bench": "handwritten", "machine": machine(),
                                               "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
