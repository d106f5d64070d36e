"""Warm workers: Spark tasks that stay up and run chunk after chunk.

Theory of operation.  A Spark job has a fixed cost whatever its size
(submission, scheduling, shipping the function, starting the task in a Python
worker): 20-50 ms on a warm ``local[2]`` session, most of a small batch's
time and so most of its latency under a light load.  Warm workers pay it once:
one long-running job with a task per core, each task a loop in its own Spark
Python worker that connects back to the driver and takes chunks of instances
(the same chunks an RDD job's partitions get) until told to stop.  A batch is
then a round trip over a socket: it still runs in Spark's Python workers,
apart from the service's process, with the same chunk in, chunk out.

Chunks are *requests* on one queue per SparkContext
(:meth:`WarmWorkers.submit` gives each a future); on the driver, each task's
connection has a thread that takes the next request, sends it and waits for
its answer.  The queue outlives the warm job: a keeper thread starts one when
requests wait and none is up, ends it after ``IDLE`` seconds without a chunk,
and holds each running request to its time limit.

A failure is the chunk's that caused it, never its neighbours'.  A task runs
its chunks in a child process it forked (``engine._warm_task``), which it
kills when a chunk runs past its limit (``ChunkFailed`` ``timeout``) and
whose death it reports (``died``: ``exit 3``, ``signal 11``), each with the
pipelet call the chunk was in; then it forks a new one, and the warm job and
every other chunk go on.  Only when a worker itself dies (killed from
outside) or does not answer past its chunk's limit (+ ``GRACE``) does the
warm job end: the chunk it ran fails, and every other chunk that was running
on a worker ended for its sake goes back to the head of the queue and runs
again on the next warm job, its caller none the wiser (``requeued``).

The tasks hold every core while they are up, and a Spark job needs free
cores: any other job a runner of the context submits (a DataFrame form's
job, a fallback, the workers' warm-up), whether that runner uses warm
workers or not, first *parks* the warm workers
(:meth:`WarmWorkers.regular`: the chunks running are finished, the tasks
end, the job completes; the queued chunks wait), and they start again for
the queued chunks after it.  One set per SparkContext, shared by every
runner of the process (:func:`warm_workers`): two sets would wait for each
other's cores.  Any failure to start them (the tasks do not connect in
``CONNECT_TIMEOUT``, a socket cannot be made) fails the queued chunks with
:class:`WarmUnavailable` (the runner runs them as a job of its own) and
leaves batches to jobs of their own for a minute.

The driver listens on a Unix socket for a local master (a directory only
this user can enter) and on TCP at ``spark.driver.host`` otherwise; a task
proves itself with a secret its function carries.  Requests are pickled (the
workflow goes once per worker and version); answers are not: a chunk's parts
are framed as bytes, so nothing that connects can make the driver unpickle.
This module is the driver's side (starting a warm job: ``engine._warm_start``);
the task's side and the framing are in ``engine._warm_task``.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import pickle
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any

from engine._specs import Workflow
from engine._warm_start import Slot, WarmUnavailable, cancel_group, listen, start_job
from engine._warm_task import (
    CANCEL,
    LIMIT,
    REQUEST,
    ChunkFailed,
    WorkerLost,
    decode_answer,
    decode_failure,
    recv,
    send,
)
from engine._worker import Chunk

__all__ = ["IDLE", "ChunkFailed", "Request", "WarmUnavailable", "WarmWorkers", "WorkerLost",
           "warm_workers"]

log = logging.getLogger(__name__)

IDLE = 2.0          # seconds without a chunk before the tasks end (the cores go back)
LOOK = 0.25         # seconds between the keeper's looks when nothing wakes it
GRACE = 10.0        # seconds past a chunk's limit before the driver ends its worker (the task
                    # kills its child at the limit; this is for a task that could not)


class Request:
    """One chunk on its way: run at most ``limit`` seconds (None: no limit).  ``future``
    gives its answer (see :meth:`WarmWorkers.submit`)."""

    __slots__ = ("abandoned", "chunk", "compress", "future", "limit", "sends", "started",
                 "workflow")

    def __init__(self, workflow: Workflow, chunk: Chunk, compress: bool, limit: float | None):
        self.workflow = workflow
        self.chunk = chunk
        self.compress = compress
        self.limit = limit
        self.future: Future[Chunk | None] = Future()
        self.started: float | None = None   # monotonic, when a worker took it
        self.abandoned = False
        self.sends = 0


class _Generation:
    """One warm job: its group, its slots; ``stopping`` (its slots take nothing more) and
    ``dead`` (ended for a chunk's sake: connections that break now are not their chunks'
    fault)."""

    def __init__(self, group: str, slots: list[Slot], job: threading.Thread):
        self.group = group
        self.slots = slots
        self.job = job
        self.stopping = False
        self.dead = False
        self.stopped_at = 0.0

    def shutdown(self) -> None:
        for slot in self.slots:
            with contextlib.suppress(OSError):
                slot.conn.shutdown(socket.SHUT_RDWR)

    def feeding(self) -> bool:
        return any(s.thread is not None and s.thread.is_alive() for s in self.slots)

    def running(self) -> list[Request]:
        return [s.request for s in self.slots if s.request is not None]


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
        self._queue: deque[Request] = deque()
        self._gen: _Generation | None = None
        self._starting = False
        self._regular = 0       # other jobs running or waiting (the warm job may not start)
        self._last = time.monotonic()
        self._failed_at = -float("inf")
        self._keeper: threading.Thread | None = None
        self._cancelled: frozenset[str] = frozenset()  # replaced, never changed
        #: warm jobs started (each start pays one job's fixed cost)
        self.starts = 0
        #: warm jobs ended for a chunk that hung or whose worker died
        self.kills = 0
        #: chunks run again because their worker was ended for another chunk's sake
        self.requeued = 0

    def available(self) -> bool:
        """False for a minute after the warm workers failed to start."""
        return time.monotonic() - self._failed_at > 60.0

    # -- running chunks ------------------------------------------------------------
    def submit(self, workflow: Workflow, chunks: list[Chunk], compress: bool, *,
               limit: float | None = None) -> list[Request]:
        """Queue each chunk to run on a warm worker (started when down); a request each.

        A request's future gives the answer (a chunk, or None when nothing
        changed) or raises :class:`ChunkFailed` (it ran past ``limit``
        seconds of its own running time, or its worker died),
        ``RuntimeError`` with the task's traceback (it raised outside the
        interpreter), :class:`WarmUnavailable` (the workers could not be
        started: it did not run) or :class:`WorkerLost` (abandoned).
        """
        if not self.available():
            raise WarmUnavailable("the warm workers failed to start less than a minute ago")
        requests = [Request(workflow, chunk, compress, limit) for chunk in chunks]
        with self._cond:
            self._queue.extend(requests)
            self._last = time.monotonic()
            if self._keeper is None:
                self._keeper = threading.Thread(target=self._keep, name="chalk-warm-keeper",
                                                daemon=True)
                self._keeper.start()
                # Tasks that outlive this interpreter end when their connections do, and
                # Spark then reports them to a Python driver that is gone (errors in its log).
                atexit.register(self._stop_at_exit)
            self._cond.notify_all()
        return requests

    def cancel(self, ids: Sequence[str]) -> None:
        """The messages of these records were cancelled: chunks running them end their
        instances before the next pipelet call, and so do chunks sent later, until
        :meth:`uncancel`."""
        with self._cond:
            self._cancelled = self._cancelled | frozenset(ids)
            gen = self._gen
            running = [s for s in gen.slots if s.request is not None] if gen is not None else []
        frame = "\n".join(ids).encode()
        for slot in running:  # a slot sending a request meanwhile sends the set after it
            with slot.sending, contextlib.suppress(OSError):
                send(slot.conn, CANCEL, frame)

    def uncancel(self, ids: Sequence[str]) -> None:
        """The chunks of these records are over (or they are cancelled no more)."""
        with self._cond:
            self._cancelled = self._cancelled - frozenset(ids)

    def abandon(self, requests: list[Request]) -> None:
        """Nobody waits for ``requests`` any more: those not taken yet never run (one that
        runs finishes, or meets its limit)."""
        with self._cond:
            for request in requests:
                request.abandoned = True

    @contextmanager
    def regular(self) -> Iterator[None]:
        """Around another Spark job: the warm workers park first and stay down meanwhile
        (the chunks running finish; queued ones wait for the warm job after it)."""
        with self._cond:
            self._regular += 1
            while self._starting or self._gen is not None:
                gen = self._gen
                if gen is not None and not gen.stopping:
                    self._stop(gen)
                self._cond.wait(0.5)
        try:
            yield
        finally:
            with self._cond:
                self._regular -= 1
                self._cond.notify_all()

    def park(self) -> None:
        """End the warm job now (it starts again with the next chunk)."""
        with self.regular():
            pass

    # -- a connection's thread -------------------------------------------------------
    def _feed(self, gen: _Generation, slot: Slot) -> None:
        """Send the slot the next request and hand back its answer, until the job stops."""
        try:
            while True:
                request = self._take(gen, slot)
                if request is None or not self._exchange(gen, slot, request):
                    return
        finally:
            slot.conn.close()
            with self._cond:
                self._cond.notify_all()

    def _take(self, gen: _Generation, slot: Slot) -> Request | None:
        with self._cond:
            while not gen.stopping:
                while self._queue:
                    request = self._queue.popleft()
                    if request.abandoned or request.future.done():
                        _resolve(request, error=WorkerLost("abandoned before it ran"))
                        continue
                    request.sends += 1
                    request.started = self._last = time.monotonic()
                    slot.request = request
                    return request
                self._cond.wait(1.0)
            return None

    def _exchange(self, gen: _Generation, slot: Slot, request: Request) -> bool:
        """Run ``request`` on the slot's worker; False when the connection broke."""
        workflow = request.workflow
        key = (workflow.name, workflow.version)
        try:
            payload = pickle.dumps((key, None if key in slot.sent else workflow, request.chunk,
                                    request.compress), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:
            self._done(slot, request, error=e)
            return True
        frame: bytes | None = None
        try:
            with slot.sending:
                send(slot.conn, REQUEST, LIMIT.pack(request.limit or 0.0), payload)
                cancelled = self._cancelled  # after the request: see cancel()
                if cancelled:
                    send(slot.conn, CANCEL, "\n".join(cancelled).encode())
            slot.sent.add(key)
            frame = recv(slot.conn)
        except OSError:
            frame = None
        if frame is None:
            self._lost(gen, slot, request)
            return False
        if frame[:1] in (b"T", b"D"):
            slot.sent.clear()  # the task's runner process was replaced: it has no workflow
            self._done(slot, request, error=decode_failure(frame, request.limit or 0.0))
        else:
            try:
                answer = decode_answer(frame)
            except Exception as e:
                self._done(slot, request, error=e)
            else:
                self._done(slot, request, answer)
        return True

    def _done(self, slot: Slot, request: Request, answer: Chunk | None = None,
              error: BaseException | None = None) -> None:
        with self._cond:
            slot.request = None
            self._last = time.monotonic()
            _resolve(request, answer, error)
            self._cond.notify_all()

    def _lost(self, gen: _Generation, slot: Slot, request: Request) -> None:
        """The connection broke while ``request`` ran: its worker died for it (the first to
        break), or was ended for another chunk's sake (it runs again)."""
        with self._cond:
            slot.request = None
            if request.future.done():
                pass  # the keeper failed it already (its limit)
            elif gen.dead:
                request.started = None
                self._queue.appendleft(request)
                self.requeued += 1
            else:
                log.warning("warm worker %d (pid %d) died while it ran a chunk; ending the "
                            "other warm workers (their chunks run again)", slot.partition,
                            slot.pid)
                _resolve(request, error=ChunkFailed("died"))
                self._end(gen)
            self._cond.notify_all()

    # -- the keeper ----------------------------------------------------------------
    def _keep(self) -> None:
        """Start a warm job when chunks wait; hold running chunks to their limits; end the
        job when idle; forget a job once it is over."""
        while True:
            try:
                with self._cond:
                    gen = self._gen
                    self._cond.wait(0.02 if gen is not None and gen.stopping else LOOK)
                    if self._gen is None and getattr(self.spark.sparkContext, "_jsc", None) is None:
                        self._keeper = None
                        return  # the context is stopped: nothing will start here again
                    self._look(time.monotonic())
                    start = (self._gen is None and not self._starting and not self._regular
                             and any(not r.abandoned for r in self._queue))
                    if start:
                        self._starting = True
                if start:
                    self._start()
            except Exception:  # never ends this thread
                log.exception("the warm workers' keeper failed")
                time.sleep(LOOK)

    def _look(self, now: float) -> None:
        """(lock held) Limits, idleness and the end of a stopped job."""
        gen = self._gen
        if gen is None:
            return
        if not gen.dead:
            for slot in gen.slots:
                r = slot.request
                if r is None or r.limit is None or r.started is None:
                    continue
                if now - r.started > r.limit + GRACE:
                    log.warning("warm worker %d (pid %d) did not answer %g s past its chunk's "
                                "limit; ending the warm workers (the other chunks run again)",
                                slot.partition, slot.pid, GRACE)
                    slot.request = None
                    _resolve(r, error=ChunkFailed("timeout", "", None, r.limit))
                    self._end(gen)
                    break
        if gen.stopping:
            if not gen.feeding() and not gen.job.is_alive():
                self._gen = None
                self._cond.notify_all()
            elif now - gen.stopped_at > 30.0 and not gen.dead:
                self._end(gen)  # its tasks did not end by themselves
        elif not gen.running() and not self._queue and now - self._last > self.idle:
            self._stop(gen)

    def _stop(self, gen: _Generation) -> None:
        """(lock held) End the warm job once its running chunks are done."""
        gen.stopping = True
        gen.stopped_at = time.monotonic()
        self._cond.notify_all()

    def _end(self, gen: _Generation) -> None:
        """(lock held) End the warm job now: its workers are killed, the chunks they ran
        (but the one it is ended for) go back to the queue."""
        if gen.dead:
            return
        if not gen.stopping:
            self._stop(gen)
        gen.dead = True
        self.kills += 1
        if self.local:  # ours, on this host: no need to wait for Spark to end them
            for slot in gen.slots:
                with contextlib.suppress(OSError):
                    os.kill(slot.pid, signal.SIGKILL)
        self._cancel(gen.group)
        gen.shutdown()
        self._cond.notify_all()

    def _start(self) -> None:
        """Start a warm job (lock not held: submits go on meanwhile); any failure fails the
        queued requests with :class:`WarmUnavailable`."""
        gen: _Generation | None = None
        error: WarmUnavailable | None = None
        try:
            gen = self._try_start()
        except Exception as e:
            self._failed_at = time.monotonic()
            log.warning("the warm workers did not start (%s: %s); batches run as jobs of "
                        "their own for a minute", type(e).__name__, e)
            error = e if isinstance(e, WarmUnavailable) else WarmUnavailable(
                f"the warm workers did not start: {e}")
        with self._cond:
            self._starting = False
            if gen is not None:
                self._gen = gen
                self._last = time.monotonic()
                self.starts += 1
                for slot in gen.slots:
                    slot.thread = threading.Thread(target=self._feed, args=(gen, slot),
                                                   name=f"{gen.group}-{slot.partition}",
                                                   daemon=True)
                    slot.thread.start()
            else:
                while self._queue:
                    _resolve(self._queue.popleft(), error=error)
            self._cond.notify_all()

    def _try_start(self) -> _Generation:
        group, slots, job = start_job(self.spark.sparkContext, self.slots, *self._listen(),
                                      on_end=self._wake)
        return _Generation(group, slots, job)

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _stop_at_exit(self) -> None:
        if self._cond.acquire(timeout=5.0):
            try:
                gen = self._gen
                if gen is not None and not gen.running():
                    self._stop(gen)
            finally:
                self._cond.release()
            if gen is not None:
                gen.job.join(5.0)

    def _listen(self) -> tuple[socket.socket, Any, str | None]:
        return listen(self.spark, self.local, self.slots + 4)

    def _cancel(self, group: str) -> None:
        cancel_group(self.spark.sparkContext, group)


def _resolve(request: Request, answer: Chunk | None = None,
             error: BaseException | None = None) -> None:
    """Settle a request's future once (a late answer to a request failed meanwhile is dropped)."""
    future = request.future
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(answer)


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
