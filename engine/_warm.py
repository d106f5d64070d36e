"""Warm workers: Spark tasks that stay up and run batch after batch.

Theory of operation.  A Spark job has a fixed cost whatever its size
(submission, scheduling, shipping the function, starting the task in a Python
worker): 20-50 ms on a warm ``local[2]`` session, most of a small batch's
time and so most of its latency under a light load.  Warm workers pay it once:
one long-running job with a task per core, each task a loop in its own Spark
Python worker that connects back to the driver and takes chunks of instances
(the same chunks an RDD job's partitions get) until told to stop.  A batch is
then a round trip over a socket: it still runs in Spark's Python workers,
apart from the service's process, with the same chunk in, chunk out.

Isolation is Spark's, as for a job of its own:

- a worker that dies (``os._exit``, a segfault, killed for memory) breaks its
  connection: the chunk it ran fails (:class:`WorkerLost`), the warm job ends
  (Spark fails the job when a task fails), and the runner isolates the
  chunk's instances by splitting, as for any failed job;
- a chunk past the runner's ``batch_timeout`` gets the warm job cancelled
  (:meth:`WarmWorkers.abort`): Spark kills the tasks' Python workers, the hang
  with them.

A batch that times out while it waits (behind a job of its own, or a
start) gives up without touching the warm job; one whose chunks were sent
cancels it.  A batch that fails while a chunk of its own still runs ends the
warm job too (nobody waits for that chunk).  Any failure to start them
(the tasks do not connect in ``CONNECT_TIMEOUT``, a socket cannot be made)
leaves batches to jobs of their own for a minute.

The tasks hold every core while they are up, and a Spark job needs free
cores: any other job a runner of the context submits (a DataFrame form's
job, a fallback, the workers' warm-up), whether that runner uses warm
workers or not, first *parks* the warm workers
(:meth:`WarmWorkers.regular`: the queued chunks are finished, the tasks end,
the job completes), and they start again with the next chunk after it.  They
also park after ``IDLE`` seconds without a chunk, so a job someone else runs
on the session waits at most that long.  One set per SparkContext, shared by
every runner of the process (:func:`warm_workers`): two sets would wait for
each other's cores.

The driver listens on a Unix socket for a local master (a directory only
this user can enter) and on TCP at ``spark.driver.host`` otherwise; a task
proves itself with a secret its function carries.  Requests are pickled (the
workflow goes once per worker and version); answers are not: a chunk's parts
are framed as bytes, so nothing that connects can make the driver unpickle.
This module is the driver's side; the task's side and the framing are in
``engine._warm_task``.
"""

from __future__ import annotations

import atexit
import contextlib
import hmac
import logging
import os
import pickle
import queue
import secrets
import shutil
import socket
import struct
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, InvalidStateError
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from typing import Any

from engine._specs import Workflow
from engine._warm_task import (
    CONNECT_TIMEOUT,
    HELLO,
    LENGTH,
    SECRET_SIZE,
    WorkerLost,
    decode_answer,
    recv,
    send,
    warm_task,
)
from engine._worker import Chunk

__all__ = ["IDLE", "Call", "WarmUnavailable", "WarmWorkers", "WorkerLost", "warm_workers"]

log = logging.getLogger(__name__)

IDLE = 2.0               # seconds without a chunk before the tasks end (the cores go back)


class WarmUnavailable(RuntimeError):
    """The warm workers could not be started (the runner submits a job of its own)."""


class Call:
    """One :meth:`WarmWorkers.run` as its caller sees it: cancelled on a timeout; the warm
    job its chunks went to, once they did."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()
        self.gen: _Generation | None = None


class _Request:
    def __init__(self, workflow: Workflow, chunk: Chunk, compress: bool):
        self.workflow = workflow
        self.chunk = chunk
        self.compress = compress
        self.future: Future[Chunk | None] = Future()


class _Slot:
    """One task's connection and the thread that feeds it."""

    def __init__(self, conn: socket.socket, partition: int, pid: int):
        self.conn = conn
        self.partition = partition
        self.pid = pid
        self.sent: set[tuple[str, str]] = set()   # workflow versions this worker has
        self.thread: threading.Thread | None = None


class _Generation:
    """One warm job: its group, its slots and the queue they take requests from."""

    def __init__(self, group: str, slots: list[_Slot], job: threading.Thread):
        self.group = group
        self.slots = slots
        self.job = job
        self.requests: queue.Queue[_Request | None] = queue.Queue()
        self.broken = False       # a slot's connection broke, or the job ended

    def shutdown(self) -> None:
        for slot in self.slots:
            try:
                slot.conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def alive(self) -> bool:
        return any(s.thread is not None and s.thread.is_alive() for s in self.slots)

    def fail_queued(self) -> None:
        while True:
            try:
                request = self.requests.get_nowait()
            except queue.Empty:
                return
            if request is not None and request.future.set_running_or_notify_cancel():
                request.future.set_exception(WorkerLost("the warm workers stopped before this "
                                                        "chunk ran"))


class WarmWorkers:
    """The warm job of one SparkContext and its connections (module doc).

    Args:
        spark: the SparkSession.
        idle: seconds without a chunk before the tasks end.
    """

    def __init__(self, spark: Any, *, idle: float = IDLE):
        self.spark = spark
        sc = spark.sparkContext
        self.local = str(sc.master).startswith("local")
        #: tasks (and so chunks at once): one per core
        self.slots = max(1, int(sc.defaultParallelism))
        self.idle = idle
        self._cond = threading.Condition()
        self._gen: _Generation | None = None
        self._busy = 0          # run() calls in flight
        self._regular = 0       # other jobs running (the warm job may not start)
        self._last = time.monotonic()
        self._failed_at = -float("inf")
        self._watch: threading.Thread | None = None
        #: warm jobs started (each start pays one job's fixed cost)
        self.starts = 0

    def available(self) -> bool:
        """False for a minute after the warm workers failed to start."""
        return time.monotonic() - self._failed_at > 60.0

    # -- running chunks ------------------------------------------------------------
    def run(self, workflow: Workflow, chunks: list[Chunk], compress: bool,
            call: Call | None = None) -> list[Chunk]:
        """Run each chunk on a warm worker (starting them when down); the answers, in order.

        Raises :class:`WorkerLost` when a worker died on a chunk (or the workers
        stopped before it ran, or ``call`` was cancelled), ``RuntimeError`` with
        the task's traceback when the chunk raised outside the interpreter,
        :class:`WarmUnavailable` when the workers could not be started (nothing
        ran).
        """
        call = call or Call()
        with self._cond:
            while True:
                gen = self._gen
                if call.cancelled.is_set():
                    raise WorkerLost("cancelled before it ran (the batch timed out waiting)")
                if self._regular:
                    self._cond.wait(0.5)
                elif gen is not None and gen.broken:
                    if self._busy:
                        self._cond.wait(0.5)
                    else:
                        self._stop_locked()
                else:
                    break
            if gen is None:
                gen = self._start_locked()
            self._busy += 1
            call.gen = gen
        try:
            requests = [_Request(workflow, chunk, compress) for chunk in chunks]
            for request in requests:
                gen.requests.put(request)
            try:
                return [a for a in (self._answer(gen, r, call) for r in requests) if a is not None]
            except BaseException:
                for request in requests:  # the batch failed: what has not started never does
                    request.future.cancel()
                if any(r.future.running() for r in requests):
                    gen.broken = True  # a chunk nobody waits for any more: end the job
                raise
        finally:
            with self._cond:
                self._busy -= 1
                self._last = time.monotonic()
                self._cond.notify_all()

    @staticmethod
    def _answer(gen: _Generation, request: _Request, call: Call) -> Chunk | None:
        while True:
            try:
                return request.future.result(timeout=0.5)
            except FutureTimeout:
                if call.cancelled.is_set():
                    raise WorkerLost("cancelled (the batch timed out)") from None
                if not gen.alive():  # no slot is left to take it, or to answer it
                    gen.fail_queued()
                    with contextlib.suppress(InvalidStateError):
                        request.future.set_exception(WorkerLost(
                            "the warm workers stopped before this chunk ran"))

    @contextmanager
    def regular(self) -> Iterator[None]:
        """Around another Spark job: the warm workers park first and stay down meanwhile."""
        with self._cond:
            self._regular += 1
            while self._busy:
                self._cond.wait(0.5)
            if self._gen is not None:
                self._stop_locked()
        try:
            yield
        finally:
            with self._cond:
                self._regular -= 1
                self._cond.notify_all()

    def abort(self, call: Call) -> None:
        """``call`` timed out: it gives up, and where its chunks were sent to the warm job
        (one may hang), the job is cancelled: Spark kills its workers, and the chunks in
        flight fail with :class:`WorkerLost`."""
        call.cancelled.set()
        gen = call.gen
        if gen is not None and gen is self._gen:
            gen.broken = True
            log.warning("cancelling the warm workers (a chunk ran past the batch timeout)")
            self._cancel(gen.group)
            gen.shutdown()  # what waits on them gives up now, not when Spark kills them

    def park(self) -> None:
        """End the warm job now (it starts again with the next chunk)."""
        with self.regular():
            pass

    # -- starting and stopping -----------------------------------------------------
    def _start_locked(self) -> _Generation:
        """Submit the warm job and wait for its tasks to connect (lock held); any failure
        is :class:`WarmUnavailable`, and none is tried again for a minute."""
        if not self.available():
            raise WarmUnavailable("the warm workers failed to start less than a minute ago")
        try:
            return self._try_start()
        except WarmUnavailable:
            raise
        except Exception as e:
            self._failed_at = time.monotonic()
            log.warning("the warm workers did not start (%s: %s); batches run as jobs of "
                        "their own for a minute", type(e).__name__, e)
            raise WarmUnavailable(f"the warm workers did not start: {e}") from e

    def _try_start(self) -> _Generation:
        sc = self.spark.sparkContext
        server, address, tmpdir = self._listen()
        secret = secrets.token_bytes(SECRET_SIZE)
        group = f"chalk-warm-{uuid.uuid4().hex[:12]}"
        n = self.slots
        box: dict[str, Any] = {}

        def body(partition: int, items: Iterator[Any]) -> Iterator[Any]:
            return warm_task(address, secret, partition, items)

        def job() -> None:
            try:
                sc.setJobGroup(group, "chalk warm workers", interruptOnCancel=True)
                sc.parallelize(range(n), n).mapPartitionsWithIndex(body).collect()
            except BaseException as e:
                box["error"] = e
            finally:
                if hasattr(sc, "clearJobGroup"):
                    sc.clearJobGroup()
                gen = box.get("gen")
                if gen is not None:
                    gen.broken = True  # read without the lock: waiters look every 0.5 s

        started = time.monotonic()
        thread = threading.Thread(target=job, name=group, daemon=True)
        slots: list[_Slot] = []
        try:
            thread.start()
            server.settimeout(0.5)
            deadline = started + CONNECT_TIMEOUT
            while len(slots) < n and time.monotonic() < deadline and thread.is_alive():
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    continue
                slot = self._greet(conn, secret, min(deadline, time.monotonic() + 5.0))
                if slot is not None:
                    slots.append(slot)
        except BaseException:
            for slot in slots:
                slot.conn.close()
            self._cancel(group)
            raise
        finally:
            server.close()
            if tmpdir is not None:
                shutil.rmtree(tmpdir, ignore_errors=True)
        if len(slots) < n:
            for slot in slots:
                slot.conn.close()
            self._cancel(group)
            thread.join(30.0)
            self._failed_at = time.monotonic()
            why = (f"the job failed: {box['error']}" if "error" in box
                   else f"{len(slots)} of {n} task(s) connected in {CONNECT_TIMEOUT:g} s")
            log.warning("the warm workers did not start (%s); batches run as jobs of their own "
                        "for a minute", why)
            raise WarmUnavailable(f"the warm workers did not start: {why}")
        gen = box["gen"] = self._gen = _Generation(group, slots, thread)
        for slot in slots:
            slot.thread = threading.Thread(target=self._feed, args=(gen, slot),
                                           name=f"{group}-{slot.partition}", daemon=True)
            slot.thread.start()
        self._last = time.monotonic()
        self.starts += 1
        log.debug("warm workers up in %.3f s: %d task(s), pids %s", time.monotonic() - started,
                  n, ", ".join(str(s.pid) for s in slots))
        if self._watch is None:
            self._watch = threading.Thread(target=self._park_when_idle, name="chalk-warm-idle",
                                           daemon=True)
            self._watch.start()
            # Tasks that outlive this interpreter end when their connections do, and Spark
            # then reports them to a Python driver that is gone (errors in its log).
            atexit.register(self._stop_at_exit)
        return gen

    def _stop_at_exit(self) -> None:
        if self._cond.acquire(timeout=5.0):
            try:
                if self._gen is not None and not self._busy:
                    self._stop_locked()
            finally:
                self._cond.release()

    def _listen(self) -> tuple[socket.socket, Any, str | None]:
        if self.local:
            tmpdir = tempfile.mkdtemp(prefix="chalk-warm-")  # mode 0700
            address: Any = os.path.join(tmpdir, "s")
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.bind(address)
        else:
            tmpdir = None
            conf = self.spark.sparkContext.getConf()
            host = conf.get("spark.driver.host")
            server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            server.bind((conf.get("spark.driver.bindAddress") or host or "0.0.0.0", 0))
            address = (host, server.getsockname()[1])
        server.listen(self.slots + 4)
        return server, address, tmpdir

    @staticmethod
    def _greet(conn: socket.socket, secret: bytes, deadline: float) -> _Slot | None:
        """The task's hello (a frame of a fixed size, read by ``deadline``), or None."""
        size = LENGTH.size + SECRET_SIZE + HELLO.size
        try:
            hello = b""
            while len(hello) < size:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                conn.settimeout(left)
                part = conn.recv(size - len(hello))
                if not part:
                    break
                hello += part
            if len(hello) != size or LENGTH.unpack(hello[:LENGTH.size])[0] != size - LENGTH.size \
                    or not hmac.compare_digest(hello[LENGTH.size:LENGTH.size + SECRET_SIZE], secret):
                conn.close()
                return None
            partition, pid = HELLO.unpack(hello[LENGTH.size + SECRET_SIZE:])
            conn.settimeout(None)
            if conn.family == socket.AF_INET:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return _Slot(conn, partition, pid)
        except (OSError, struct.error):
            conn.close()
            return None

    @staticmethod
    def _feed(gen: _Generation, slot: _Slot) -> None:
        """A slot's thread: send it the next request, hand back its answer."""
        conn = slot.conn
        try:
            while True:
                request = gen.requests.get()
                if request is None:
                    return
                if not request.future.set_running_or_notify_cancel():
                    continue  # its batch failed meanwhile
                key = (request.workflow.name, request.workflow.version)
                try:
                    payload = pickle.dumps((key, None if key in slot.sent else request.workflow,
                                            request.chunk, request.compress),
                                           protocol=pickle.HIGHEST_PROTOCOL)
                except Exception as e:
                    request.future.set_exception(e)
                    continue
                try:
                    send(conn, payload)
                    slot.sent.add(key)
                    frame = recv(conn)
                except OSError:
                    frame = None
                if frame is None:
                    gen.broken = True
                    request.future.set_exception(WorkerLost(
                        f"Python worker exited unexpectedly: warm worker {slot.partition} "
                        f"(pid {slot.pid}) ended while it ran this chunk"))
                    return
                try:
                    request.future.set_result(decode_answer(frame))
                except Exception as e:
                    request.future.set_exception(e)
        finally:
            conn.close()

    def _stop_locked(self) -> None:
        """End the warm job: the slots finish what is queued, close, the tasks return.  A
        broken job (a worker died or hung; nobody waits for its chunks) is cancelled."""
        gen, self._gen = self._gen, None
        if gen is None:
            return
        if gen.broken:
            self._cancel(gen.group)
            gen.shutdown()
        for _ in gen.slots:
            gen.requests.put(None)
        for slot in gen.slots:
            if slot.thread is not None:
                slot.thread.join(60.0)
        gen.fail_queued()
        gen.job.join(30.0)
        if gen.job.is_alive():
            self._cancel(gen.group)
            gen.job.join(30.0)
        self._cond.notify_all()

    def _cancel(self, group: str) -> None:
        try:
            self.spark.sparkContext.cancelJobGroup(group)
        except Exception as e:  # the context is stopped: its jobs are gone with it
            log.debug("cancelling %s: %s", group, e)

    def _park_when_idle(self) -> None:
        while True:
            time.sleep(min(0.5, self.idle))
            with self._cond:
                gen = self._gen
                if gen is None and getattr(self.spark.sparkContext, "_jsc", None) is None:
                    return  # the context is stopped: nothing will start here again
                if gen is not None and not self._busy and \
                        (gen.broken or time.monotonic() - self._last > self.idle):
                    try:
                        self._stop_locked()
                    except Exception:  # never ends this thread
                        log.exception("stopping the idle warm workers failed")


_all: dict[int, tuple[Any, WarmWorkers]] = {}
_all_lock = threading.Lock()


def warm_workers(spark: Any) -> WarmWorkers:
    """The warm workers of ``spark``'s SparkContext (one set per context, made on first use)."""
    sc = spark.sparkContext
    with _all_lock:
        for key in [k for k, (other, _w) in _all.items() if other._jsc is None]:
            del _all[key]  # a stopped context's
        found = _all.get(id(sc))
        if found is None or found[0] is not sc:
            found = _all[id(sc)] = (sc, WarmWorkers(spark))
        return found[1]
