"""Where a message's CPU goes: Chalk's budget per stage beside the hand-written consumer's.

Runs the service as ``bench_listener.py`` does (default settings, the three
Python pipelets, SQLite, Spark ``local[2]`` with warm workers) over
``--messages`` one-record messages, ``--runs`` times after a warm-up, and
the hand-written consumer (``bench_handwritten.py``) over as many, alternating.
Every figure is CPU time (user + system), in µs per message, median of the runs:

* **per process** from ``/proc`` (the service, its broker I/O process, Spark's
  JVM and Python workers, the RabbitMQ node), as ``bench_listener.py`` reports;
* **per thread** of the service (``/proc/self/task``; threads that end, such as
  a batch's runner thread, are counted at their end with ``time.thread_time``);
* **per step** inside the threads: each step of the hot path is wrapped, at
  the class or module level, in a probe that adds the thread's CPU clock
  across the call (``time.thread_time``: CPU of that thread only, whatever the
  other threads and processes do meanwhile), less what the probes inside it
  take: the steps of a thread add up.  A probed call costs ~2 µs more (two
  clock reads); the steps called once per message (parse + match, write
  attributes, route)
  pay it on every message, the others once a batch.  The script calibrates
  it and prints what it adds to the service's figures (they include it).
  Threads and steps are read as ``Service.run`` starts and returns, the
  window in which ``bench_listener.py`` reads the processes.

Inside the processes no probe reaches (the broker I/O process, Spark's Python
workers), the split comes from micro-benchmarks of the same code on the same
records in this process (``--no-micro`` skips them): what crossing the
broker process's socket pair costs (pickling both ways) against what pika's
frame codec costs, and what a worker does with a chunk (decode, the
blackboard, the pipelets, encode) against the same three steps on plain dicts.

One figure is wall time, not CPU: how long each of the service's threads held the
store's writer lock (on SQLite one write transaction at a time: the gather stage's
leases, the commit, the finish stage's "sent" marks) and waited for it, as a share
of the pass's wall time.  A stage waiting there is idle while another works.

For the hand-written consumer the same probes wrap its steps (pika's
delivery callback, the SQL statements, the three steps, the publishes,
the confirms and acks); the rest of its process is pika's I/O loop.

Run: ``.venv/bin/python bench/bench_budget.py --messages 50000 --runs 3``
(``--json FILE`` writes every figure).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from _measure import machine, median

# -- probes ---------------------------------------------------------------------------

_spent: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
_ended: dict[str, float] = defaultdict(float)   # CPU of threads that ended, by name
_lock = threading.Lock()
_local = threading.local()


def _probe(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` adding its thread's CPU to ``name``, less what probes called inside it take
    (every figure is exclusive: the steps of a thread add up); a probe called inside one of
    the same name counts in the outer one."""
    clock = time.thread_time

    entry = _spent[name]

    def probed(*args: Any, **kwargs: Any) -> Any:
        try:
            stack, active = _local.stack, _local.active
        except AttributeError:
            stack, active = _local.stack, _local.active = [], set()
        if name in active:
            return fn(*args, **kwargs)
        active.add(name)
        frame = [clock(), 0.0]  # started, CPU of the probes inside
        stack.append(frame)
        try:
            return fn(*args, **kwargs)
        finally:
            stack.pop()
            active.discard(name)
            spent = clock() - frame[0]
            if stack:
                stack[-1][1] += spent
            entry[0] += spent - frame[1]
            entry[1] += 1

    probed.__wrapped__ = fn  # type: ignore[attr-defined]
    return probed


def _patch(owner: Any, attr: str, name: str) -> None:
    """Wrap ``owner.attr`` (a class's method or a module's function) and every module-level
    binding of the same function in the project's modules."""
    original = getattr(owner, attr)
    wrapped = _probe(name, original)
    setattr(owner, attr, wrapped)
    if isinstance(owner, type):
        return
    for module in list(sys.modules.values()):
        mod_name = getattr(module, "__name__", "") or ""
        if not mod_name.startswith(("engine", "listener_router", "blackboard", "pipelets")):
            continue
        for key, value in list(vars(module).items()):
            if value is original:
                setattr(module, key, wrapped)


def _count_thread_ends() -> None:
    """Threads that end (a batch's runner thread) leave their CPU in ``_ended``."""
    run = threading.Thread.run

    def counted(self: threading.Thread) -> None:
        try:
            run(self)
        finally:
            with _lock:
                _ended[_thread_kind(self.name)] += time.thread_time()

    threading.Thread.run = counted  # type: ignore[method-assign]


def _thread_kind(name: str) -> str:
    for prefix in ("chalk-gather", "chalk-run", "chalk-warm", "chalk-commit", "chalk-finish",
                   "Thread-"):
        if name.startswith(prefix):
            return prefix
    head = name.split("-", 1)[0]
    if len(head) >= 16 and all(c in "0123456789abcdef" for c in head):
        return "spark-job"  # a Spark job's thread, or one feeding the warm tasks (by group)
    return name


def _thread_cpu() -> dict[str, float]:
    """CPU seconds of this process's threads by kind: the live ones from /proc, plus the
    ended ones."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = defaultdict(float)
    with _lock:
        for kind, spent in _ended.items():
            out[kind] += spent
    for t in threading.enumerate():
        tid = t.native_id
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[_thread_kind(t.name)] += (int(fields[11]) + int(fields[12])) / tick
    return dict(out)


_writer: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])  # kind → [waited, held] s


class _TimedWriter:
    """The store's writer lock (on SQLite one transaction writes at a time in the service's
    process), timing by thread how long each waited for it and held it: wall time, where
    the CPU figures cannot show a stage that waits for another."""

    def __init__(self, lock: Any):
        self._lock = lock

    def __enter__(self) -> None:
        started = time.perf_counter()
        self._lock.acquire()
        now = time.perf_counter()
        kind = _thread_kind(threading.current_thread().name)
        _writer[kind][0] += now - started   # under the lock: one writer at a time
        _local.writer = (kind, now)

    def __exit__(self, *exc: Any) -> None:
        kind, since = _local.writer
        _writer[kind][1] += time.perf_counter() - since
        self._lock.release()


def _time_the_writer() -> None:
    from listener_router.store import _store

    init = _store.ServiceStore.__init__

    def timed(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        if not isinstance(self.writes, contextlib.nullcontext):  # SQLite's
            self.writes = _TimedWriter(self.writes)

    _store.ServiceStore.__init__ = timed  # type: ignore[method-assign]


def writer() -> dict[str, tuple[float, float]]:
    return {k: (v[0], v[1]) for k, v in _writer.items()}


def install_service_probes() -> None:
    """Probes on the service's hot path (see the module doc)."""
    import blackboard
    import engine._results as results
    import engine._warm as warm
    import engine._worker as worker
    from listener_router import jobs
    from listener_router.broker import _process
    from listener_router.pipeline import _commit, _finish, _gather, _loading
    from listener_router.store import _outbox

    _patch(_gather.GatherStage, "_stage", "gather: other (batching, lanes)")
    _patch(_gather.GatherStage, "_receive", "gather: parse + match")
    _patch(_gather.GatherStage, "_check_inbox", "gather: inbox check")
    _patch(_loading.Loader, "load", "gather: load records")
    _patch(_loading.Loader, "apply", "gather: write attributes")
    _patch(results, "inputs_for", "ship out: export + pack")
    _patch(worker, "inputs_to_chunks", "ship out: chunks")
    _patch(warm.WarmWorkers, "_exchange", "ship: socket to the warm tasks")
    _patch(results, "apply_outputs", "ship back: decode + import")
    _patch(_commit.CommitStage, "settle", "commit: other (settling, states)")
    _patch(_commit.CommitStage, "_route", "commit: route")
    _patch(blackboard.Blackboard, "commit_many", "commit: records written, SQL commit")
    _patch(_outbox.Outbox, "write", "commit: inbox + outbox rows")
    _patch(jobs.JobLog, "in_transaction", "commit: job log rows")
    _patch(_finish.FinishStage, "_publish_and_ack", "finish: other (states, settlement)")
    _patch(_process.ProcessLink, "publish", "finish: publish (to the broker process)")
    _patch(_outbox.Outbox, "mark_sent", "finish: mark sent")
    _patch(jobs.JobLog, "settled", "finish: job log settled")
    _patch(_process.ProcessLink, "ack", "finish: ack (to the broker process)")
    _patch(_process.ProcessLink, "_handle", "relay: deliveries from the broker process")
    _count_thread_ends()
    _time_the_writer()
    _window_on_run()


_window: dict[str, Any] = {}


def _window_on_run() -> None:
    """Threads and probes read as ``Service.run`` starts and returns: the window in which
    bench_listener reads the processes' CPU (the backlog's publishing, the service's
    start and stop stay out, as they do from its figures)."""
    from listener_router import Service

    run = Service.run

    def windowed(self: Any, *args: Any, **kwargs: Any) -> Any:
        _window["before"] = (_thread_cpu(), probes(), writer(), time.perf_counter())
        try:
            return run(self, *args, **kwargs)
        finally:
            _window["after"] = (_thread_cpu(), probes(), writer(), time.perf_counter())

    Service.run = windowed  # type: ignore[method-assign]


def probes() -> dict[str, tuple[float, int]]:
    return {k: (v[0], int(v[1])) for k, v in _spent.items() if k != "calibration"}


def _diff(after: dict[str, Any], before: dict[str, Any]) -> dict[str, float]:
    out = {}
    for k, v in after.items():
        a = v[0] if isinstance(v, tuple) else v
        b = before.get(k, 0.0)
        b = b[0] if isinstance(b, tuple) else b
        out[k] = a - b
    return out


# -- the service's side -----------------------------------------------------------------

def service_pass(bench: Any, n: int) -> dict[str, Any]:
    """One pass of the service over ``n`` one-record messages: CPU µs/message by
    process, by thread and by probed step."""
    _window.clear()
    one = bench.run(n)
    (before_threads, before_probes, before_writer, started), \
        (after_threads, after_probes, after_writer, ended) = _window["before"], _window["after"]
    per = 1e6 / n
    wall = ended - started
    writer_pct: dict[str, dict[str, float]] = {}
    for kind, (waited, held) in after_writer.items():
        waited_before, held_before = before_writer.get(kind, (0.0, 0.0))
        if waited > waited_before or held > held_before:
            writer_pct[kind] = {"waited": round(100 * (waited - waited_before) / wall, 1),
                                "held": round(100 * (held - held_before) / wall, 1)}
    return {"rate": one["rate"], "processes": one["cpu_us"],
            "threads": {k: v * per for k, v in _diff(after_threads, before_threads).items()
                        if v * per >= 0.05},
            "steps": {k: v * per for k, v in _diff(after_probes, before_probes).items()},
            "calls": {k: (after_probes[k][1] - before_probes.get(k, (0.0, 0))[1]) / n
                      for k in after_probes},
            "stage_ms": one["phases_ms"],  # the service's own meter: wall time by stage
            # % of the pass's wall time each thread kind waited for the writer, and held it
            "writer_pct": writer_pct}


def probe_cost(calls: int = 100_000) -> float:
    """µs of CPU a probed call adds to the call it wraps (a probed no-op against a no-op)."""
    def nothing() -> None:
        return None

    probed = _probe("calibration", nothing)
    best = float("inf")
    for _ in range(3):
        started = time.thread_time()
        for _ in range(calls):
            probed()
        middle = time.thread_time()
        for _ in range(calls):
            nothing()
        best = min(best, (middle - started) - (time.thread_time() - middle))
    return best / calls * 1e6


def idle_pass(bench: Any, seconds: float) -> dict[str, float]:
    """CPU ms per second of each process while the service is up with nothing to do: a
    process's fixed cost, which shows in its µs per message as much as the rate is low."""
    from _measure import cpu_seconds, descendants, named

    from listener_router import Service

    with Service(bench.settings, spark=bench.spark) as service:
        time.sleep(2.0)  # the start's own work done
        jvm = named(descendants(os.getpid()), "java")
        pids = {"service": os.getpid(), "broker I/O": getattr(service.link, "child_pid", None),
                "JVM": jvm}

        def cpu() -> dict[str, float]:
            out = {name: cpu_seconds(pid) for name, pid in pids.items() if pid is not None}
            if jvm is not None:
                out["Spark workers"] = sum(cpu_seconds(p) for p in descendants(jvm))
            return out

        before = cpu()
        time.sleep(seconds)
        after = cpu()
    return {k: (after[k] - before.get(k, 0.0)) / seconds * 1000 for k in after}


# -- the hand-written consumer's side ------------------------------------------------------

def serve_probed(config: str) -> None:
    """The hand-written consumer's process with probes on its steps (bench_handwritten.serve's
    protocol); its figures get a "probes" entry."""
    import bench_handwritten as hw
    import pika.channel
    import sqlalchemy.engine

    names = {"_message": "receive: delivery callback",
             "_commit": "commit: JSON, dicts, BEGIN/COMMIT",
             "_flush": "publish: bodies, properties", "_confirmed": "ack: confirms tracked"}
    for attr, name in names.items():
        setattr(hw.Consumer, attr, _probe(name, getattr(hw.Consumer, attr)))
    execute = sqlalchemy.engine.Connection.execute
    select = _probe("load: SELECT inbox, records", execute)
    write = _probe("commit: upsert records, insert inbox", execute)

    def executing(self: Any, statement: Any, *args: Any, **kwargs: Any) -> Any:
        chosen = select if getattr(statement, "is_select", False) else write
        return chosen(self, statement, *args, **kwargs)

    sqlalchemy.engine.Connection.execute = executing  # type: ignore[method-assign]
    work, routed = hw.WORK["text"]
    hw.WORK["text"] = (_probe("pipelets: the three steps", work), routed)
    pika.channel.Channel.basic_publish = _probe(  # type: ignore[method-assign]
        "publish: basic_publish", pika.channel.Channel.basic_publish)
    pika.channel.Channel.basic_ack = _probe(  # type: ignore[method-assign]
        "ack: basic_ack", pika.channel.Channel.basic_ack)
    real_print = print

    def printing(*args: Any, **kwargs: Any) -> None:
        text = args[0] if args else ""
        if isinstance(text, str) and text.startswith("{"):
            figures = json.loads(text)
            figures["probes"] = {k: v[0] for k, v in _spent.items()}
            args = (json.dumps(figures),)
        real_print(*args, **kwargs)

    hw.print = printing  # type: ignore[attr-defined]
    hw.serve(config)


def handwritten_pass(url: str, n: int, db: Path, first: int) -> dict[str, Any]:
    import bench_handwritten as hw

    result = hw.measure(url, n, 1, db=db, first=first, serve="bench_budget.serve_probed")
    per = 1e6 / n
    return {"rate": result["rate"], "processes": result["cpu_us"],
            "steps": {k: v * per for k, v in result.get("probes", {}).items()}}


# -- micro-benchmarks: the broker I/O process and the Spark workers ---------------------------

def _best(fn: Callable[[], Any], repeat: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.process_time()
        fn()
        best = min(best, time.process_time() - started)
    return best


def micro_broker(n: int = 2000) -> dict[str, float]:
    """µs per message: the socket pair's pickling (both sides) and pika's frame codec."""
    import pika
    import pika.frame
    import pika.spec
    from bench_handwritten import body_for

    from listener_router.broker import OutMessage

    bodies = [body_for(i) for i in range(n)]
    deliveries = [("d", 7, i + 1, "bench.in", b, f"m-{i}", {}, False,
                   {"content_type": None, "timestamp": None, "routing_key": "bench.in",
                    "exchange": ""}) for i, b in enumerate(bodies)]
    outs = [OutMessage("bench.out", b, f"o-{i}") for i, b in enumerate(bodies)]
    fields = [(m.routing_key, m.body, m.message_id, m.headers, m.exchange, m.content_type)
              for m in outs]
    a, b = socket.socketpair()
    ca, cb = Connection(a.detach()), Connection(b.detach())
    out: dict[str, float] = {}

    def relay_deliveries() -> None:
        for start in range(0, n, 500):
            ca.send(deliveries[start:start + 500])
            cb.recv()

    def relay_publishes() -> None:
        for start in range(0, n, 500):
            ca.send(("publish", 1, fields[start:start + 500]))
            _kind, _ident, got = cb.recv()
            [OutMessage(*f) for f in got]

    out["socket pair: deliveries (pickle, send, recv, unpickle)"] = _best(relay_deliveries) / n * 1e6
    out["socket pair: publishes (pickle, send, recv, unpickle)"] = _best(relay_publishes) / n * 1e6
    ca.close()
    cb.close()

    def encode_publishes() -> None:
        for m in outs:
            props = pika.BasicProperties(delivery_mode=2, message_id=m.message_id,
                                         content_type=m.content_type)
            pika.frame.Method(1, pika.spec.Basic.Publish(exchange="", routing_key=m.routing_key,
                                                         mandatory=True)).marshal()
            pika.frame.Header(1, len(m.body), props).marshal()
            pika.frame.Body(1, m.body).marshal()

    frames = b"".join(
        pika.frame.Method(1, pika.spec.Basic.Deliver("ctag", i + 1, False, "", "bench.in")).marshal()
        + pika.frame.Header(1, len(body), pika.BasicProperties(
            delivery_mode=2, message_id=f"m-{i}", content_type="application/json")).marshal()
        + pika.frame.Body(1, body).marshal() for i, body in enumerate(bodies))

    def decode_deliveries() -> None:
        data = frames
        at = 0
        while at < len(data):
            used, _frame = pika.frame.decode_frame(data[at:at + 4096])
            at += used

    out["pika: encode a publish (method, header, body frames)"] = _best(encode_publishes) / n * 1e6
    out["pika: decode a delivery (method, header, body frames)"] = _best(decode_deliveries) / n * 1e6
    return out


def micro_worker(n: int = 2000) -> dict[str, float]:
    """µs per record: a worker's chunk (decode, blackboard, pipelets, encode) against the
    same three steps on plain dicts; and the driver's ship out and back."""
    import orjson
    from bench_handwritten import body_for, three_steps
    from bench_listener import USER_PIPELETS, USER_WORKFLOW

    import engine
    from blackboard import Blackboard
    from engine._results import apply_outputs, inputs_for
    from engine._worker import (
        chunk_partition,
        inputs_from_chunks,
        inputs_to_chunks,
        outputs_from_chunks,
        outputs_to_chunk,
        run_instances,
    )

    tmp = Path(tempfile.mkdtemp(prefix="chalk-budget-"))
    (tmp / "bench3.xml").write_text(USER_WORKFLOW)
    (tmp / "bench_user.py").write_text(USER_PIPELETS)
    registry = engine.WorkflowRegistry(tmp)
    workflow = registry.get("Bench3")
    records = [orjson.loads(body_for(i))["records"][0] for i in range(n)]
    driver = Blackboard.local()
    for r in records:
        driver.load(r["id"])
        driver.set_attributes(r["id"], r["attributes"])
    # as the service holds them: stored text, loaded unparsed
    stored = driver.export_records([r["id"] for r in records], encoded=True)
    out: dict[str, float] = {}

    def fresh() -> Any:
        bb = Blackboard.local()
        bb.import_records([dict(item) for item in stored], changed=False)
        return bb

    instances = [(i, [r["id"]]) for i, r in enumerate(records)]
    bb = fresh()
    out["driver: export + pack (inputs_for)"] = _best(lambda: inputs_for(bb, instances)) / n * 1e6
    rows = inputs_for(bb, instances)
    out["driver: chunks"] = _best(lambda: inputs_to_chunks(rows, 2, False)) / n * 1e6
    chunks = inputs_to_chunks(rows, 2, False)
    out["worker: decode the chunk"] = _best(lambda: inputs_from_chunks(chunks)) / n * 1e6
    inputs = inputs_from_chunks(chunks)
    out["worker: run (import, interpreter, pipelets, export)"] = \
        _best(lambda: run_instances(workflow, inputs)) / n * 1e6
    outputs = run_instances(workflow, inputs)
    out["worker: encode the answer"] = _best(lambda: outputs_to_chunk(outputs, False)) / n * 1e6
    out["worker: whole chunk (chunk_partition)"] = \
        _best(lambda: list(chunk_partition(workflow, chunks, False))) / n * 1e6
    answers = [outputs_to_chunk(outputs, False)]

    def back() -> None:
        apply_outputs(fresh(), outputs_from_chunks(answers))

    out["driver: decode + import the answer"] = (_best(back) - _best(fresh)) / n * 1e6
    docs = [dict(r["attributes"]) for r in records]
    out["plain: the three steps on dicts"] = _best(lambda: [three_steps(dict(d)) for d in docs]) / n * 1e6
    raws = [orjson.dumps(d) for d in docs]

    def plain_json() -> None:
        for raw in raws:
            d = orjson.loads(raw)
            three_steps(d)
            orjson.dumps(d)

    out["plain: parse, three steps, encode"] = _best(plain_json) / n * 1e6
    return out


# -- the report ---------------------------------------------------------------------------------

# The stages, in a message's order: (stage, Chalk's figures, the hand-written
# consumer's, whether the step is there only because of a layer boundary).  A figure is a
# probed step ("steps"), a process ("processes") or "rest" (the process less its probed
# steps); a stage missing on one side is 0 there.
STAGES: list[tuple[str, list[str], list[str], str]] = [
    ("broker I/O (AMQP frames, socket)",
     ["processes:broker I/O", "steps:relay: deliveries from the broker process"],
     ["rest"], "process"),
    ("gather (parse, match, inbox check, batch)",
     ["steps:gather: parse + match", "steps:gather: inbox check",
      "steps:gather: other (batching, lanes)"],
     ["steps:receive: delivery callback"], ""),
    ("load (records from the store)",
     ["steps:gather: load records", "steps:gather: write attributes"],
     ["steps:load: SELECT inbox, records"], ""),
    ("ship to workers (export, pack, socket)",
     ["steps:ship out: export + pack", "steps:ship out: chunks",
      "steps:ship: socket to the warm tasks"], [], "Spark"),
    ("Spark's JVM (the job, Arrow, py4j)", ["processes:JVM"], [], "Spark"),
    ("pipelets (in Spark's Python workers)", ["processes:Spark workers"],
     ["steps:pipelets: the three steps"], ""),
    ("ship back (decode, import)", ["steps:ship back: decode + import"], [], "Spark"),
    ("route (outgoing messages)", ["steps:commit: route"], [], ""),
    ("commit (records, inbox, outbox)",
     ["steps:commit: records written, SQL commit", "steps:commit: inbox + outbox rows",
      "steps:commit: other (settling, states)"],
     ["steps:commit: upsert records, insert inbox", "steps:commit: JSON, dicts, BEGIN/COMMIT"],
     ""),
    ("job log", ["steps:commit: job log rows", "steps:finish: job log settled"], [], ""),
    ("publish", ["steps:finish: publish (to the broker process)", "steps:finish: mark sent"],
     ["steps:publish: bodies, properties", "steps:publish: basic_publish"], ""),
    ("ack", ["steps:finish: ack (to the broker process)",
             "steps:finish: other (states, settlement)"],
     ["steps:ack: confirms tracked", "steps:ack: basic_ack"], ""),
    ("the service's other threads (run loop, queues, py4j, GC)", ["rest"], [], ""),
]
# The service's thread each probed step runs on (for what each thread does besides them).
STEP_THREADS = {"gather": "chalk-gather", "ship": "chalk-run", "commit": "chalk-commit",
                "finish": "chalk-finish", "relay": "chalk-amqp-process"}
OWN = {"chalk": ("service", "broker I/O", "JVM", "Spark workers"), "handwritten": ("hand-written",)}


def _figure(run: dict[str, Any], ref: str, main: str) -> float:
    if ref == "rest":  # the main process less what its probes account for
        return max(0.0, run["processes"].get(main, 0.0) - sum(run["steps"].values()))
    where, key = ref.split(":", 1)
    return float(run[where].get(key, 0.0))


def budget(chalk: dict[str, Any], hand: dict[str, Any]) -> list[dict[str, Any]]:
    """One run's budget: a row per stage, µs per message on each side."""
    rows = []
    for stage, ours, theirs, boundary in STAGES:
        rows.append({"stage": stage, "boundary": boundary,
                     "chalk": sum(_figure(chalk, r, "service") for r in ours),
                     "handwritten": sum(_figure(hand, r, "hand-written") for r in theirs)})
    own_c = sum(chalk["processes"].get(p, 0.0) for p in OWN["chalk"])
    own_h = sum(hand["processes"].get(p, 0.0) for p in OWN["handwritten"])
    rows.append({"stage": "all own processes", "boundary": "", "chalk": own_c,
                 "handwritten": own_h})
    rows.append({"stage": "RabbitMQ node", "boundary": "",
                 "chalk": chalk["processes"].get("RabbitMQ", 0.0),
                 "handwritten": hand["processes"].get("RabbitMQ", 0.0)})
    return rows


def thread_rests(chalk: dict[str, Any]) -> dict[str, float]:
    """Each service thread's CPU less its probed steps': what it does besides them."""
    rests = dict(chalk["threads"])
    for step, us in chalk["steps"].items():
        thread = STEP_THREADS.get(step.split(":")[0].split()[0])
        if thread is not None and thread in rests:
            rests[thread] -= us
    return rests


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": median(values), "min": min(values), "max": max(values)}


def budget_table(budgets: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Medians and spreads of the runs' budgets, row by row."""
    out = []
    for i, row in enumerate(budgets[0]):
        out.append({"stage": row["stage"], "boundary": row["boundary"],
                    "chalk": _spread([b[i]["chalk"] for b in budgets]),
                    "handwritten": _spread([b[i]["handwritten"] for b in budgets])})
    return out


def _cell(f: dict[str, float]) -> str:
    if f["max"] < 0.05:
        return "–"
    return f"{f['median']:.0f} ({f['min']:.0f}–{f['max']:.0f})"


def print_budget(table: list[dict[str, Any]]) -> None:
    print(f"  {'stage':<58} {'Chalk':>15} {'hand-written':>15}  boundary")
    for row in table:
        print(f"  {row['stage']:<58} {_cell(row['chalk']):>15} {_cell(row['handwritten']):>15}"
              f"  {row['boundary']}")


def _by_key(runs: list[dict[str, float]]) -> dict[str, list[float]]:
    keys = list(dict.fromkeys(k for r in runs for k in r))
    return {k: [r.get(k, 0.0) for r in runs] for k in keys}


def _print_table(title: str, figures: dict[str, float]) -> None:
    print(f"  {title}")
    for k, v in figures.items():
        print(f"    {k:<58} {v:7.1f}")


def main() -> int:
    from bench_listener import Bench  # the service's side, as the bench runs it

    from listener_router.broker import ensure_local_broker

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=20_000,
                        help="one-record messages through the service before the runs")
    parser.add_argument("--broker", default=os.environ.get(
        "CHALK_BENCH_BROKER", "amqp://guest:guest@127.0.0.1:5672/%2F"))
    parser.add_argument("--idle", type=float, default=10.0, metavar="SECONDS",
                        help="then the processes' CPU with the service idle (0: skip)")
    parser.add_argument("--no-micro", action="store_true", help="skip the micro-benchmarks")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    ensure_local_broker(args.broker)
    print(f"machine: {machine()}")
    install_service_probes()
    bench_args = argparse.Namespace(pipelets="user", batch_size=None, broker=args.broker,
                                    runner="spark", master="local[2]")
    tmp = Path(tempfile.mkdtemp(prefix="chalk-budget-"))
    bench = Bench(bench_args, tmp)
    chalk: list[dict[str, Any]] = []
    hand: list[dict[str, Any]] = []
    hand_first = 0
    try:
        if args.warmup:
            bench.run(args.warmup)
        for i in range(args.runs):
            hand.append(handwritten_pass(args.broker, args.messages, tmp / "hand.db", hand_first))
            hand_first += args.messages
            chalk.append(service_pass(bench, args.messages))
            print(f"run {i + 1}: hand-written {hand[-1]['rate']:,.0f} msg/s, chalk "
                  f"{chalk[-1]['rate']:,.0f} msg/s; load {os.getloadavg()[0]:.1f}", flush=True)
        idle = idle_pass(bench, args.idle) if args.idle else {}
    finally:
        bench.close()

    def med(runs: list[dict[str, Any]], key: str) -> dict[str, float]:
        keys = list(dict.fromkeys(k for r in runs for k in r[key]))
        return {k: median([r[key].get(k, 0.0) for r in runs]) for k in keys}

    out: dict[str, Any] = {"machine": machine(), "messages": args.messages, "runs": args.runs,
                           "chalk": {k: med(chalk, k) for k in ("processes", "threads", "steps")},
                           "handwritten": {k: med(hand, k) for k in ("processes", "steps")},
                           "rates": {"chalk": median([r["rate"] for r in chalk]),
                                     "handwritten": median([r["rate"] for r in hand])}}
    out["budget"] = budget_table([budget(c, h) for c, h in zip(chalk, hand, strict=True)])
    out["runs_raw"] = {"chalk": chalk, "handwritten": hand}
    cost = probe_cost()
    out["probes_us"] = {"per_call": cost,
                        "per_message": median([cost * sum(c["calls"].values()) for c in chalk])}
    print(f"\nCPU µs per one-record message, median (min–max) of {args.runs} run(s) of "
          f"{args.messages:,}; records/s: Chalk {out['rates']['chalk']:,.0f}, hand-written "
          f"{out['rates']['handwritten']:,.0f}; load now {os.getloadavg()[0]:.1f}")
    print_budget(out["budget"])
    print(f"  (the probes themselves: {cost:.1f} µs a call, "
          f"{out['probes_us']['per_message']:.1f} µs a message of Chalk's service process, in "
          "the rows above)")
    if idle:
        out["idle_ms_per_s"] = idle
        print(f"\nIdle, CPU ms per second over {args.idle:.0f} s: "
              + ", ".join(f"{k} {v:.0f}" for k, v in idle.items()))
    print("\nThe detail, medians:")
    _print_table("chalk, by process", out["chalk"]["processes"])
    _print_table("chalk, the service's threads", dict(sorted(
        out["chalk"]["threads"].items(), key=lambda kv: -kv[1])))
    _print_table("chalk, probed steps (in their threads)", dict(sorted(out["chalk"]["steps"].items())))
    out["chalk"]["thread_rests"] = {k: median(v) for k, v in _by_key(
        [thread_rests(c) for c in chalk]).items()}
    _print_table("chalk, each thread besides its probed steps", dict(sorted(
        out["chalk"]["thread_rests"].items(), key=lambda kv: -kv[1])))
    runs_writer = [c["writer_pct"] for c in chalk]
    out["chalk"]["writer_pct"] = {
        k: {x: median([r.get(k, {}).get(x, 0.0) for r in runs_writer]) for x in ("held", "waited")}
        for k in dict.fromkeys(k for r in runs_writer for k in r)}
    if out["chalk"]["writer_pct"]:
        print("\nThe store's writer (SQLite: one write transaction at a time), % of a pass's wall "
              "time, median: " + "; ".join(
                  f"{k} held it {v['held']:.0f}, waited {v['waited']:.0f}" for k, v in sorted(
                      out["chalk"]["writer_pct"].items(), key=lambda kv: -kv[1]["held"])))
    _print_table("hand-written, by process", out["handwritten"]["processes"])
    _print_table("hand-written, probed steps", dict(sorted(out["handwritten"]["steps"].items())))
    if not args.no_micro:
        out["micro_broker"] = micro_broker()
        out["micro_worker"] = micro_worker()
        _print_table("micro: the broker I/O process's work, µs a message", out["micro_broker"])
        _print_table("micro: a batch's records through the workers, µs a record", out["micro_worker"])
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
