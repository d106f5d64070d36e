"""The driver's side of the runner: worker processes connected to this process, fed chunks
by priority (the protocol and who says what: ``engine._wire``; the processes:
``engine._supervisor``).

Theory of operation.  A *pool* listens on a socket of its own for as long as
it lives.  Its *home* starts supervisors (:meth:`Pool._launch`: a warm Spark
job's tasks, ``engine._warm``; or a process of the service's,
:class:`ServiceWorkers`), all of one *generation*, each of which forks its
workers; every one of them connects and says who it is (a hello, with the
secret and the generation's token the home gave it).  A worker's connection
gets a thread here that takes the next request off the pool's queue (highest
priority first, then the order they came in), sends it and reads the answer;
a supervisor's connection gets one that reads its reports.

A request fails only for what its worker did while it ran it:

- the supervisor killed the worker past the request's limit (``timeout``) or
  saw it die (``died``, ``exit 3``): the worker's connection breaks, maybe in
  the middle of an answer (dropped: :func:`~engine._wire.read_answer`), and
  the report says which request it had begun and the pipelet call it was
  in.  The request fails with that (:class:`~engine._wire.ChunkFailed`), and
  the supervisor has forked a new worker meanwhile;
- a worker that died before it began the request (the report names another
  one, or none), or one lost with its supervisor (a Spark task killed, an
  executor lost, the service's supervisor killed from outside), did nothing
  of it: the request goes back to the head of the queue (``requeued``; lost
  more than :data:`MAX_LOST` times, it fails with :class:`Unavailable`: it
  never ran, the runner runs it elsewhere) and the rest of the generation is
  ended and started again.  A generation that ends before it answered
  anything, within ``connect_timeout`` of its start, counts as a start that
  failed.

If a request runs :data:`GRACE` seconds past its limit with no report (its
supervisor is stopped or stuck) the driver ends the generation itself.
Requests nobody waits for any more (``abandon``) are dropped unrun.  A home
that cannot start (no hello in time) fails the queued requests with
:class:`Unavailable` (they never ran: the runner runs them elsewhere) and
is not tried again for a minute.
"""

from __future__ import annotations

import atexit
import contextlib
import heapq
import hmac
import itertools
import json
import logging
import os
import pickle
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from typing import Any

from engine._specs import Workflow
from engine._supervisor import COMMAND, CONNECT_TIMEOUT, start_method
from engine._wire import (
    CANCEL,
    CANCEL_HEAD,
    CHILD,
    HELLO,
    LENGTH,
    NONCE_SIZE,
    REPORT,
    REQUEST,
    REQUEST_HEAD,
    SECRET_SIZE,
    SUPERVISOR,
    ChunkFailed,
    Report,
    WorkerLost,
    decode_report,
    parts_chunk,
    prove,
    read_answer,
    recv,
    send,
)
from engine._worker import Chunk

__all__ = ["GRACE", "MAX_LOST", "Pool", "Request", "ServiceWorkers", "Unavailable",
           "service_workers"]

log = logging.getLogger(__name__)

LOOK = 0.25          # seconds between the keeper's looks when nothing wakes it
GRACE = 10.0         # seconds past a request's limit before the driver ends its generation
REPORT_WAIT = 5.0    # seconds a broken worker connection waits for its supervisor's report
MAX_LOST = 3         # times a request may be lost with a worker that never began it
STARVE_AFTER = 5.0   # seconds a request waits at most behind requests of higher priority
RETRY_AFTER = 60.0   # seconds a home that failed to start is not tried again
HELLO_WAIT = 5.0     # seconds a connection has to say hello


class Unavailable(RuntimeError):
    """The workers could not be started: the request never ran."""


class Request:
    """One chunk on its way: run at most ``limit`` seconds (None: no limit), before those
    of lower ``priority``.  ``future`` gives its answer (see :meth:`Pool.submit`);
    ``seconds`` is how long its worker ran it, once answered."""

    __slots__ = ("abandoned", "chunk", "compress", "future", "limit", "lost", "priority",
                 "queued", "seconds", "seq", "sends", "started", "workflow")

    def __init__(self, seq: int, workflow: Workflow, chunk: Chunk, compress: bool,
                 limit: float | None, priority: int):
        self.seq = seq
        self.workflow = workflow
        self.chunk = chunk
        self.compress = compress
        self.limit = limit
        self.priority = priority
        self.future: Future[Chunk | None] = Future()
        self.queued = time.monotonic()
        self.started: float | None = None   # monotonic, when a worker took it
        self.abandoned = False
        self.sends = 0
        self.lost = 0
        self.seconds = 0.0


class _Supervisor:
    def __init__(self, conn: socket.socket, ident: int, pid: int, home: int, gen: Generation):
        self.conn = conn
        self.id = ident
        self.pid = pid
        self.home = home
        self.gen = gen
        self.workers: dict[int, _Worker] = {}     # by place: the one connected last
        self.by_pid: dict[int, _Worker] = {}      # every one not yet gone (a report names its pid)
        self.early: dict[int, Report] = {}        # reports of workers gone before they said hello
        self.dead = False
        self.sending = threading.Lock()


class _Worker:
    def __init__(self, conn: socket.socket, sup: _Supervisor, place: int, pid: int):
        self.conn = conn
        self.sup = sup
        self.place = place
        self.pid = pid
        self.request: Request | None = None
        self.report: Report | None = None
        self.alive = True
        self.sent: set[tuple[str, str]] = set()   # workflow versions it has


class Generation:
    """The supervisors one start of a home brought up (a warm job's tasks, a process)."""

    def __init__(self, token: int, expected: int):
        self.token = token
        self.expected = expected
        self.supervisors: dict[int, _Supervisor] = {}
        self.handle: Any = None          # the home's: a job's thread, a process
        self.stopping = False            # its workers take nothing more
        self.closed = False              # its supervisors were told to go
        self.dead = False                # ended for a chunk's sake, or lost
        self.stopped_at = 0.0
        self.launched = time.monotonic()
        self.answered = False            # a worker of it answered a request

    def workers(self) -> list[_Worker]:
        return [w for s in self.supervisors.values() for w in s.by_pid.values()]

    def busy(self) -> bool:
        return any(w.request is not None for w in self.workers())

    def up(self) -> bool:
        return any(not s.dead for s in self.supervisors.values())


class Pool:
    """Worker processes of one home and the requests they run (see module doc).

    Subclasses say how the home starts (:meth:`_launch`, :meth:`_launched`),
    ends (:meth:`_halt`) and listens (:meth:`_listen`).

    Args:
        supervisors: supervisors a generation has (a warm job's tasks; 1 for a process).
        workers: workers each supervisor forks.
        local: whether they run on this host (a Unix socket; else TCP).
        idle: seconds without a request before the generation ends (None: never).
    """

    name = "workers"

    def __init__(self, supervisors: int, workers: int, *, local: bool,
                 idle: float | None = None, connect_timeout: float = CONNECT_TIMEOUT):
        self.supervisors = max(1, supervisors)
        self.per_supervisor = max(1, workers)
        #: requests at once
        self.slots = self.supervisors * self.per_supervisor
        self.local = local
        self.idle = idle
        self.connect_timeout = connect_timeout
        self._cond = threading.Condition()
        self._queue: list[tuple[int, int, Request]] = []
        self._order = itertools.count(1)
        self._seq = itertools.count(1)
        self._gen: Generation | None = None
        self._starting: Generation | None = None
        self._failed_at = -float("inf")
        self._keeper: threading.Thread | None = None
        self._server: socket.socket | None = None
        self._address: Any = None
        self._tmpdir: str | None = None
        self._secret = secrets.token_bytes(SECRET_SIZE)
        self._cancelled: frozenset[str] = frozenset()   # replaced, never changed
        self._cancel_version = 0
        self._last = time.monotonic()
        self._closed = False
        self._exit_hook = False
        self._hold = 0           # holders that keep a generation from starting (park)
        #: generations that came up (a supervisor of theirs connected)
        self.starts = 0
        #: generations ended for a chunk that hung past its grace, or lost
        self.kills = 0
        #: requests run again because their worker died before it began them
        self.requeued = 0

    # -- for the runners ---------------------------------------------------------------
    def available(self) -> bool:
        """False for a minute after the workers failed to start (and once closed)."""
        return not self._closed and time.monotonic() - self._failed_at > RETRY_AFTER

    def submit(self, workflow: Workflow, chunks: list[Chunk], compress: bool, *,
               limit: float | None = None, priority: int = 0) -> list[Request]:
        """Queue each chunk to run on a worker (the workers started when down); a request each.

        A request's future gives the answer (a chunk, or None when nothing
        changed) or raises :class:`~engine._wire.ChunkFailed` (it ran past
        ``limit`` seconds of its own running time, or its worker died while
        it ran it), ``RuntimeError`` with the worker's traceback (it raised
        outside the interpreter), :class:`Unavailable` (the workers could not
        be started: it did not run) or :class:`~engine._wire.WorkerLost`
        (abandoned, or the pool closed).
        """
        if not self.available():
            raise Unavailable(f"the {self.name} failed to start less than a minute ago")
        requests = [Request(next(self._seq), workflow, chunk, compress, limit, priority)
                    for chunk in chunks]
        with self._cond:
            for request in requests:
                self._push(request)
            self._last = time.monotonic()
            self._ensure_keeper()
            self._cond.notify_all()
        return requests

    def abandon(self, requests: Sequence[Request]) -> None:
        """Nobody waits for ``requests`` any more: those not taken yet never run (one that
        runs finishes, or meets its limit)."""
        with self._cond:
            for request in requests:
                request.abandoned = True

    def cancel(self, ids: Sequence[str]) -> None:
        """The messages of these records were cancelled: requests running them end their
        instances before the next pipelet call, and so do requests sent later, until
        :meth:`uncancel`."""
        with self._cond:
            self._cancelled = self._cancelled | frozenset(ids)
            self._cancel_version += 1
        self._tell_cancelled()

    def uncancel(self, ids: Sequence[str]) -> None:
        """The requests of these records are over (or they are cancelled no more)."""
        with self._cond:
            if not self._cancelled & frozenset(ids):
                return
            self._cancelled = self._cancelled - frozenset(ids)
            self._cancel_version += 1
        self._tell_cancelled()

    def processes(self) -> dict[int, list[int]]:
        """The supervisors up now, each with its workers: pid -> worker pids."""
        with self._cond:
            gen = self._gen
            if gen is None:
                return {}
            return {s.pid: [w.pid for w in s.workers.values() if w.alive]
                    for s in gen.supervisors.values() if not s.dead}

    def close(self) -> None:
        """End the workers and stop listening; queued requests fail (``WorkerLost``)."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            gen, self._gen = self._gen, None
            while self._queue:  # never ran: the caller may run them elsewhere
                _resolve(heapq.heappop(self._queue)[2],
                         error=Unavailable(f"the {self.name} stopped"))
            self._cond.notify_all()
        if gen is not None:
            self._finish(gen)
        server, self._server = self._server, None
        if server is not None:
            with contextlib.suppress(OSError):
                server.shutdown(socket.SHUT_RDWR)
            server.close()
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)

    # -- for the homes -----------------------------------------------------------------
    def _launch(self, gen: Generation, address: Any, secret: bytes) -> Any:
        """Start the generation's supervisors (they connect on their own); a handle."""
        raise NotImplementedError

    def _launched(self, gen: Generation) -> bool:
        """Whether the start may still bring hellos (its job or process still runs)."""
        raise NotImplementedError

    def _halt(self, gen: Generation) -> None:
        """End the generation's processes now (the connections are shut down besides)."""
        raise NotImplementedError

    def _listen(self) -> tuple[socket.socket, Any, str | None]:
        """A socket to listen on: (server, the address the processes connect to, a
        directory to remove at the end or None)."""
        tmpdir = tempfile.mkdtemp(prefix="chalk-workers-")  # mode 0700
        address = os.path.join(tmpdir, "s")
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(address)
        return server, address, tmpdir

    def _keep_up(self) -> bool:
        """Whether a generation is started with no request waiting (kept up)."""
        return False

    # -- the queue ---------------------------------------------------------------------
    def _push(self, request: Request, *, first: bool = False) -> None:
        order = -next(self._order) if first else next(self._order)
        heapq.heappush(self._queue, (-request.priority, order, request))

    def _take(self, worker: _Worker) -> Request | None:
        """(a worker's thread) The next request for it; None when it is to take no more."""
        gen = worker.sup.gen
        with self._cond:
            while worker.alive and not worker.sup.dead and not gen.closed and not self._closed:
                while self._queue and not gen.stopping:
                    request = self._next()
                    if request.abandoned or request.future.done():
                        _resolve(request, error=WorkerLost("abandoned before it ran"))
                        continue
                    request.sends += 1
                    request.started = self._last = time.monotonic()
                    worker.request = request
                    return request
                self._cond.wait(1.0)
            return None

    def _next(self) -> Request:
        """(lock held) The first request by priority; or one that waited ``STARVE_AFTER``
        behind higher ones (a lower lane is slowed, never starved)."""
        queue = self._queue
        oldest = min(range(len(queue)), key=lambda i: queue[i][2].queued)
        if oldest and time.monotonic() - queue[oldest][2].queued > STARVE_AFTER:
            entry = queue[oldest]
            queue[oldest] = queue[-1]
            queue.pop()
            heapq.heapify(queue)
            return entry[2]
        return heapq.heappop(queue)[2]

    def _serve(self, worker: _Worker) -> None:
        """(a worker's thread) Send it requests and hand back their answers, until it goes."""
        try:
            while True:
                request = self._take(worker)
                if request is None or not self._exchange(worker, request):
                    return
        except BaseException as e:  # a fault of this thread's, not of the chunk's records
            log.exception("%s: the thread of worker pid %d failed", self.name, worker.pid)
            request = worker.request
            if request is not None:
                with self._cond:
                    worker.request = None
                    _resolve(request, error=Unavailable(f"the {self.name}' driver thread "
                                                        f"failed: {type(e).__name__}: {e}"))
        finally:
            with contextlib.suppress(OSError):
                worker.conn.close()
            with self._cond:
                worker.alive = False
                if worker.sup.workers.get(worker.place) is worker:
                    del worker.sup.workers[worker.place]
                worker.sup.by_pid.pop(worker.pid, None)
                self._cond.notify_all()

    def _exchange(self, worker: _Worker, request: Request) -> bool:
        """Run ``request`` on ``worker``; False when its connection broke."""
        workflow = request.workflow
        key = (workflow.name, workflow.version)
        with self._cond:
            version, cancelled = self._cancel_version, self._cancelled
        try:
            payload = pickle.dumps((key, None if key in worker.sent else workflow, request.chunk,
                                    request.compress, sorted(cancelled)),
                                   protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:
            self._done(worker, request, error=e)
            return True
        answer = None
        try:
            send(worker.conn, REQUEST, REQUEST_HEAD.pack(request.seq, request.limit or 0.0,
                                                         version), payload)
            worker.sent.add(key)
            del payload
            answer = read_answer(worker.conn)
        except OSError:
            answer = None
        if answer is None or answer[0] != request.seq:
            self._broken(worker, request)
            return False
        _seq, kind, parts, seconds = answer
        request.seconds = seconds
        if kind == b"C":
            try:
                self._done(worker, request, parts_chunk(parts))
            except Exception as e:
                self._done(worker, request, error=e)
        elif kind == b"N":
            self._done(worker, request, None)
        else:
            # it raised outside the interpreter: maybe unpickling the workflow, which it then
            # does not have: sent again next time
            worker.sent.discard(key)
            text = b"".join(parts).decode("utf-8", "replace")
            self._done(worker, request, error=RuntimeError(text))
        return True

    def _done(self, worker: _Worker, request: Request, answer: Chunk | None = None,
              error: BaseException | None = None) -> None:
        with self._cond:
            worker.request = None
            worker.sup.gen.answered = True
            self._last = time.monotonic()
            _resolve(request, answer, error)
            self._cond.notify_all()

    def _broken(self, worker: _Worker, request: Request) -> None:
        """``worker``'s connection broke while it had ``request``: its supervisor's report
        says whether the request had begun there and how the worker ended."""
        with self._cond:
            worker.alive = False
            deadline = time.monotonic() + REPORT_WAIT
            while (not request.future.done() and worker.report is None and not worker.sup.dead
                   and (left := deadline - time.monotonic()) > 0):
                self._cond.wait(left)
            worker.request = None
            if request.future.done():
                return
            report = worker.report
            if report is not None and report.seq == request.seq:
                _resolve(request, error=report.failure(request.limit or 0.0))
            elif report is not None or worker.sup.dead:
                self._requeue(request, "its worker ended before it began the chunk"
                              if report is not None else "its worker's supervisor ended")
            else:  # nobody can say it began: not its records' fault
                log.warning("%s: worker %d of supervisor %d (pid %d) broke off with no "
                            "report from its supervisor", self.name, worker.place,
                            worker.sup.pid, worker.pid)
                self._requeue(request, "its worker broke off, unreported")
            self._cond.notify_all()

    def _requeue(self, request: Request, why: str) -> None:
        """(lock held) ``request`` never began: to the head of the queue again, at most
        ``MAX_LOST`` times."""
        request.lost += 1
        if request.lost > MAX_LOST or self._closed or not self.available():
            _resolve(request, error=Unavailable(
                f"the {self.name} stopped" if self._closed else
                f"the {self.name} lost it {request.lost} times before it began: {why}"))
            return
        request.started = None
        self.requeued += 1
        self._push(request, first=True)

    # -- connections -------------------------------------------------------------------
    def _ensure_listening(self) -> None:
        if self._server is not None:
            return
        server, address, tmpdir = self._listen()
        server.listen(64)
        self._server, self._address, self._tmpdir = server, address, tmpdir
        threading.Thread(target=self._accept, args=(server,), name=f"chalk-{self.name}-accept",
                         daemon=True).start()

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError as e:
                if self._server is not server:
                    return  # closed
                log.warning("%s: accepting a connection failed: %s", self.name, e)
                time.sleep(0.1)  # out of descriptors, say: they come back
                continue
            # each hello on a thread of its own: one that says nothing holds back no other
            threading.Thread(target=self._hello, args=(conn,), name=f"chalk-{self.name}-hello",
                             daemon=True).start()

    def _hello(self, conn: socket.socket) -> None:
        try:
            self._greet(conn)
        except Exception:
            log.exception("%s: a connection's hello failed", self.name)
            conn.close()

    def _greet(self, conn: socket.socket) -> None:
        size = LENGTH.size + SECRET_SIZE + HELLO.size
        conn.settimeout(HELLO_WAIT)
        nonce = secrets.token_bytes(NONCE_SIZE)
        hello = b""
        try:
            send(conn, nonce)
            while len(hello) < size:
                part = conn.recv(size - len(hello))
                if not part:
                    break
                hello += part
        except OSError:
            hello = b""
        if len(hello) != size or LENGTH.unpack(hello[:LENGTH.size])[0] != size - LENGTH.size \
                or not hmac.compare_digest(hello[LENGTH.size:LENGTH.size + SECRET_SIZE],
                                           prove(self._secret, nonce)):
            conn.close()
            return
        role, token, ident, pid, home, place = HELLO.unpack(hello[LENGTH.size + SECRET_SIZE:])
        conn.settimeout(None)
        if conn.family == socket.AF_INET:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        with self._cond:
            gen = next((g for g in (self._gen, self._starting)
                        if g is not None and g.token == token), None)
            if gen is None or self._closed or gen.dead or gen.closed or gen.stopping:
                conn.close()  # a late one of a generation that is gone, or going
                return
            if role == SUPERVISOR:
                sup = _Supervisor(conn, ident, pid, home, gen)
                if not gen.supervisors:
                    self.starts += 1  # the generation is up
                gen.supervisors[ident] = sup
                thread = threading.Thread(target=self._hear, args=(sup,),
                                          name=f"chalk-{self.name}-sup-{pid}", daemon=True)
            elif role == CHILD and (owner := gen.supervisors.get(ident)) is not None \
                    and not owner.dead and owner.early.pop(pid, None) is None:
                worker = _Worker(conn, owner, place, pid)
                owner.workers[place] = owner.by_pid[pid] = worker
                thread = threading.Thread(target=self._serve, args=(worker,),
                                          name=f"chalk-{self.name}-{pid}", daemon=True)
            else:
                conn.close()
                return
            self._cond.notify_all()
        if role == SUPERVISOR and self._cancelled:
            self._tell_cancelled([sup])
        thread.start()

    def _hear(self, sup: _Supervisor) -> None:
        """(a supervisor's thread) Its reports, until its connection ends."""
        try:
            while True:
                frame = recv(sup.conn)
                if frame is None:
                    break
                if frame[:1] == REPORT:
                    report = decode_report(frame)
                    with self._cond:
                        # by pid: the worker forked in its place may have connected already
                        worker = sup.by_pid.get(report.pid)
                        if worker is not None:
                            worker.report = report
                            worker.alive = False
                            with contextlib.suppress(OSError):
                                worker.conn.shutdown(socket.SHUT_RDWR)
                        else:  # gone before its hello was heard: it must not be taken on
                            sup.early[report.pid] = report
                        self._cond.notify_all()
        except OSError:
            pass
        finally:
            with self._cond:
                sup.dead = True
                for worker in sup.by_pid.values():
                    worker.alive = False
                    with contextlib.suppress(OSError):
                        worker.conn.shutdown(socket.SHUT_RDWR)
                gen = sup.gen
                if not gen.closed and not gen.dead and not self._closed:
                    log.warning("%s: supervisor pid %d ended (its workers with it); the "
                                "chunks they had begun run again", self.name, sup.pid)
                    self._end(gen)
                    if not gen.answered and \
                            time.monotonic() - gen.launched < self.connect_timeout:
                        self._failed(Unavailable(
                            f"the {self.name} ended as they started (supervisor pid "
                            f"{sup.pid} of {len(gen.supervisors)})"))
                self._cond.notify_all()

    def _tell_cancelled(self, only: Sequence[_Supervisor] | None = None) -> None:
        with self._cond:
            version, cancelled = self._cancel_version, self._cancelled
            gen = self._gen
            sups = list(only) if only is not None else (
                [s for s in gen.supervisors.values() if not s.dead] if gen is not None else [])
        frame = "\n".join(sorted(cancelled)).encode()
        for sup in sups:
            with sup.sending, contextlib.suppress(OSError):
                send(sup.conn, CANCEL, CANCEL_HEAD.pack(version), frame)

    # -- the keeper --------------------------------------------------------------------
    def _ensure_keeper(self) -> None:
        """(lock held) The keeper thread runs."""
        if self._keeper is None and not self._closed:
            self._keeper = threading.Thread(target=self._keep, name=f"chalk-{self.name}-keeper",
                                            daemon=True)
            self._keeper.start()
            if not self._exit_hook:
                # Processes that outlive this interpreter end when their connections do;
                # a warm job's tasks would then be reported to a driver that is gone.
                self._exit_hook = True
                atexit.register(self.close)

    def _keep(self) -> None:
        """Start a generation when requests wait (or to keep one up); hold running requests
        to their limits plus grace; end an idle or stopped one."""
        while True:
            try:
                with self._cond:
                    if self._closed:
                        self._keeper = None
                        return
                    self._cond.wait(self._wait())
                    if self._closed:
                        continue
                    self._look(time.monotonic())
                    self._give_up_held(time.monotonic())
                    start = (self._gen is None and self._starting is None and not self._hold
                             and self.available() and self._wanted())
                    if start:
                        self._starting = Generation(random.getrandbits(62) + 1, self.supervisors)
                if start:
                    self._start()
            except Exception:  # never ends this thread
                log.exception("%s: the keeper failed", self.name)
                time.sleep(LOOK)

    def _give_up_held(self, now: float) -> None:
        """(lock held) Requests that waited ``connect_timeout`` while another Spark job holds
        the cores (``held``) and no generation can take them: they never ran (the runner
        runs them elsewhere)."""
        if not self._hold or (self._gen is not None and not self._gen.stopping):
            return
        late = [entry for entry in self._queue if now - entry[2].queued > self.connect_timeout]
        if not late:
            return
        self._queue = [entry for entry in self._queue if entry not in late]
        heapq.heapify(self._queue)
        for _p, _o, request in late:
            _resolve(request, error=Unavailable(
                f"the {self.name} were parked for another Spark job for "
                f"{self.connect_timeout:g} s"))

    def _wanted(self) -> bool:
        return self._keep_up() or any(not r.abandoned for _p, _o, r in self._queue)

    def _wait(self) -> float:
        gen = self._gen
        if gen is not None and gen.stopping:
            return 0.02
        return LOOK

    def _look(self, now: float) -> None:
        """(lock held) Limits, idleness and the end of a stopped generation."""
        gen = self._gen
        if gen is None:
            return
        if not gen.dead:
            for worker in gen.workers():
                r = worker.request
                if r is None or r.limit is None or r.started is None or r.future.done():
                    continue
                if now - r.started > r.limit + GRACE:
                    log.warning("%s: worker pid %d did not answer %g s past its chunk's limit "
                                "and its supervisor did not end it; ending the %s (the other "
                                "chunks run again)", self.name, worker.pid, GRACE, self.name)
                    _resolve(r, error=ChunkFailed("timeout", "", None, r.limit))
                    self._end(gen)
                    break
        if gen.stopping:
            if not gen.busy() and not gen.closed:
                self._close_gen(gen)
            if gen.closed and not gen.up() and not self._launched(gen):
                self._gen = None
                self._cond.notify_all()
            elif now - gen.stopped_at > 30.0 and not gen.dead:
                self._end(gen)  # its processes did not end by themselves
        elif not gen.up() and not self._launched(gen):
            self._gen = None  # every supervisor is gone: start again when wanted
            self._cond.notify_all()
        elif self.idle is not None and not gen.busy() and not self._queue and \
                now - self._last > self.idle:
            self._stop(gen)

    def _stop(self, gen: Generation) -> None:
        """(lock held) End the generation once its running requests are done."""
        if not gen.stopping:
            gen.stopping = True
            gen.stopped_at = time.monotonic()
        self._cond.notify_all()

    def _close_gen(self, gen: Generation) -> None:
        """(lock held) Tell its supervisors to go (they end their workers and return)."""
        gen.closed = True
        for sup in gen.supervisors.values():
            with contextlib.suppress(OSError):
                sup.conn.shutdown(socket.SHUT_RDWR)

    def _end(self, gen: Generation) -> None:
        """(lock held) End the generation now: its processes are killed; the requests they
        had begun and not answered run again (see module doc)."""
        if gen.dead:
            return
        self._stop(gen)
        gen.dead = True
        self.kills += 1
        try:
            self._halt(gen)
        except Exception:
            log.exception("%s: ending a generation failed", self.name)
        self._close_gen(gen)
        for worker in gen.workers():
            with contextlib.suppress(OSError):
                worker.conn.shutdown(socket.SHUT_RDWR)
        self._cond.notify_all()

    def _finish(self, gen: Generation) -> None:
        """(closing) End a generation and wait a little for its processes."""
        with self._cond:
            self._stop(gen)
            self._close_gen(gen)
        deadline = time.monotonic() + 5.0
        with self._cond:
            while (gen.up() or self._launched(gen)) and time.monotonic() < deadline:
                self._cond.wait(0.05)
            if gen.up() or self._launched(gen):
                self._end(gen)

    def _start(self) -> None:
        """Start a generation (lock not held: submits go on meanwhile).  Its workers take
        requests as they connect; when no supervisor of it connects in time, the queued
        requests fail with :class:`Unavailable`."""
        gen = self._starting
        assert gen is not None
        error: Exception | None = None
        try:
            self._ensure_listening()
            gen.handle = self._launch(gen, self._address, self._secret)
            deadline = time.monotonic() + self.connect_timeout
            with self._cond:
                if self._closed:
                    raise Unavailable(f"the {self.name} stopped")
                self._gen, self._starting = gen, None
                gen.launched = self._last = time.monotonic()
                while (len(gen.supervisors) < gen.expected and not self._closed
                       and not gen.stopping and self._launched(gen)
                       and (left := deadline - time.monotonic()) > 0):
                    self._cond.wait(min(left, 0.5))
                if not gen.supervisors and not self._closed and not gen.stopping:
                    raise Unavailable(self._why_not(gen))
                if len(gen.supervisors) < gen.expected and not gen.stopping:
                    log.info("%s: %d of %d supervisor(s) connected in %g s; running on those",
                             self.name, len(gen.supervisors), gen.expected, self.connect_timeout)
                return
        except Exception as e:
            error = e
        with self._cond:
            self._starting = None
            if self._gen is gen:
                self._gen = None
            gen.dead = True
        try:
            self._halt(gen)
        except Exception:
            log.debug("%s: halting a generation that did not start", self.name, exc_info=True)
        with self._cond:
            self._close_gen(gen)
            if not self._closed:
                self._failed(error if isinstance(error, Unavailable) else Unavailable(
                    f"the {self.name} did not start: {type(error).__name__}: {error}"))
            self._cond.notify_all()

    def _failed(self, failure: Unavailable) -> None:
        """(lock held) The home did not come up: not tried again for ``RETRY_AFTER``; the
        queued requests never ran (the runner runs them elsewhere)."""
        self._failed_at = time.monotonic()
        log.warning("%s; not tried again for %g s", failure, RETRY_AFTER)
        while self._queue:
            _resolve(heapq.heappop(self._queue)[2], error=failure)

    def _why_not(self, gen: Generation) -> str:
        return (f"the {self.name} did not start: {len(gen.supervisors)} of {gen.expected} "
                f"supervisor(s) connected in {self.connect_timeout:g} s")

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Around something that needs this pool's cores: its generation ends first (the
        requests running finish; queued ones wait) and none starts meanwhile."""
        with self._cond:
            self._hold += 1
            while self._starting is not None or self._gen is not None:
                gen = self._gen
                if gen is not None and not gen.stopping:
                    self._stop(gen)
                self._ensure_keeper()
                self._cond.wait(0.5)
        try:
            yield
        finally:
            with self._cond:
                self._hold -= 1
                self._cond.notify_all()


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


# -- the service's own workers ---------------------------------------------------------

class ServiceWorkers(Pool):
    """Workers of a supervisor process this process starts (``engine._supervisor``'s
    ``main``): where the service runs what it does not send to Spark.  Kept
    up (started at once, started again when it ends)."""

    name = "service workers"

    def __init__(self, workers: int, *, connect_timeout: float = CONNECT_TIMEOUT):
        super().__init__(1, workers, local=True, connect_timeout=connect_timeout)

    def start(self) -> ServiceWorkers:
        """Start the supervisor now (its workers are forked as it comes up)."""
        with self._cond:
            self._ensure_keeper()
            self._cond.notify_all()
        return self

    def _keep_up(self) -> bool:
        return True

    def _launch(self, gen: Generation, address: Any, secret: bytes) -> Any:
        method = start_method()
        config = {"address": address, "secret": secret.hex(), "token": gen.token,
                  "workers": self.per_supervisor, "path": sys.path, "cwd": os.getcwd(),
                  "start": method, "log_level": logging.getLogger().getEffectiveLevel()}
        process = subprocess.Popen(COMMAND, stdin=subprocess.PIPE, close_fds=True)
        assert process.stdin is not None
        process.stdin.write(json.dumps(config).encode())
        process.stdin.close()
        log.debug("%s: supervisor pid %d, %d worker(s) (%s)", self.name, process.pid,
                  self.per_supervisor, method)
        return process

    def _launched(self, gen: Generation) -> bool:
        process = gen.handle
        return process is not None and process.poll() is None

    def _halt(self, gen: Generation) -> None:
        process = gen.handle
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGKILL)
            # reaped off the pool's lock (a killed process goes at once)
            threading.Thread(target=process.wait, daemon=True).start()


_said_spawn = False
_shared: dict[int, ServiceWorkers] = {}
_shared_lock = threading.Lock()


def service_workers(workers: int, *, shared: bool = False) -> ServiceWorkers:
    """A started pool of ``workers`` service workers: made anew, or (``shared``) the one of
    this process with that many workers, made on first use and kept until the process
    ends (a service started again in the same process finds its workers up)."""
    global _said_spawn
    if start_method() == "spawn" and not _said_spawn:
        _said_spawn = True
        log.warning("workers are started as new interpreters (spawn), not forked: %s",
                    "this platform has no fork" if not hasattr(os, "fork")
                    else "CHALK_WORKER_START=spawn")
    if not shared:
        return ServiceWorkers(workers).start()
    with _shared_lock:
        pool = _shared.get(workers)
        if pool is None or pool._closed:
            pool = _shared[workers] = ServiceWorkers(workers)
        return pool.start()
