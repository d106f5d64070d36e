"""Supervisors and their workers: the processes chunks run in, and the one that watches them.

A *supervisor* (a warm Spark task on an executor, or the process the service
starts for its own runs: :data:`COMMAND`) connects to the
driver (its control channel), then forks its *workers*: each connects to the
driver on a socket of its own, takes requests there and answers there
(``engine._wire``).  The supervisor is never in that conversation.  It only

- keeps each worker to its request's limit: the worker writes a note into a
  pipe when a request begins (its number and limit) and when it ends; past
  the limit the supervisor kills the worker;
- reaps a worker that ends (its note pipe closes), reports how on the control
  channel, with the request it had begun and the pipelet call it was in (the
  worker writes each call, before making it, into memory they share:
  ``engine._progress.CallSlot``), and forks a new worker (milliseconds: the
  supervisor has everything imported);
- writes the cancelled records the driver sends into memory its workers read
  before each pipelet call (``engine._progress.StopSlot``).

When the driver closes the control channel the supervisor kills its workers
and returns.  Workers (and the service's supervisor) ignore ``SIGTERM`` and
``SIGINT``: a stop sent to the service's process group is the service's to
carry out, and must not end a chunk mid-way (it would look like the chunk's
fault).  Workers die with their supervisor (``PR_SET_PDEATHSIG``) and
with their connection to the driver, and tell the kernel to take them first
when memory runs out.  Where ``fork`` is not available, workers are started
as new interpreters (``spawn``): slower, the same otherwise.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import pickle
import random
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from engine._progress import CallSlot, StopSlot, stoppable, watched
from engine._wire import (
    ANSWER,
    ANSWER_HEAD,
    CANCEL,
    CANCEL_HEAD,
    CHILD,
    HELLO,
    NONCE_SIZE,
    REQUEST_HEAD,
    SUPERVISOR,
    chunk_parts,
    encode_report,
    prove,
    recv,
    send,
)

__all__ = ["COMMAND", "CONNECT_TIMEOUT", "GONE", "START", "connect", "main", "send_answer",
           "start_method", "supervise"]

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 30.0   # seconds a process waits to connect to the driver
GONE = 70                # a worker's exit code when it could not go on (EX_SOFTWARE)
NOTE = struct.Struct("!cQd")   # a worker's note to its supervisor: B(egin)/E(nd), request, limit
OOM_SCORE = 800          # workers are the kernel's first choice when memory runs out
QUICK = 1.0              # seconds: a worker that ends sooner after its start is started again
BACKOFF = 30.0           #   only after a pause that doubles each time, up to this many seconds
START = "CHALK_WORKER_START"   # environment: ``fork`` (the default where there is one) or ``spawn``


def start_method() -> str:
    """How workers are started here: ``fork``, or ``spawn`` where there is no ``fork`` (or
    the environment asks for it)."""
    asked = os.environ.get(START, "").strip().lower()
    if asked == "spawn" or not hasattr(os, "fork"):
        return "spawn"
    return "fork"


def connect(address: Any, secret: bytes, hello: bytes) -> socket.socket:
    """A connection to the driver (a Unix socket's path, or a host and port), its challenge
    answered (``engine._wire``) and ``hello`` said."""
    family = socket.AF_UNIX if isinstance(address, str) else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.settimeout(CONNECT_TIMEOUT)
    sock.connect(address if isinstance(address, str) else tuple(address))
    nonce = recv(sock)
    if nonce is None or len(nonce) != NONCE_SIZE:
        raise ConnectionError("the driver sent no challenge")
    send(sock, prove(secret, nonce), hello)
    sock.settimeout(None)
    if family == socket.AF_INET:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)  # a path that dropped it
    return sock


# -- the supervisor -------------------------------------------------------------------

class _Worker:
    """The supervisor's view of one worker."""

    def __init__(self, place: int, pid: int, notes: int, slot: CallSlot,
                 process: subprocess.Popen[bytes] | None = None):
        self.place = place
        self.pid = pid
        self.notes = notes           # read end of its note pipe (non-blocking)
        self.slot = slot
        self.process = process       # spawned, not forked
        self.seq = 0                 # the request it began and has not ended (0: none)
        self.deadline: float | None = None
        self.buffer = b""
        self.started = time.monotonic()
        os.set_blocking(notes, False)


class _Supervisor:
    def __init__(self, address: Any, secret: bytes, token: int, home: int, workers: int,
                 method: str):
        self.address = address
        self.secret = secret
        self.token = token
        self.home = home
        self.count = workers
        self.method = method
        self.id = random.getrandbits(62) + 1
        self.control = connect(address, secret, HELLO.pack(SUPERVISOR, token, self.id,
                                                           os.getpid(), home, workers))
        self.scratch: str | None = None
        if method == "spawn":  # slots as files: a spawned worker maps them by name
            self.scratch = tempfile.mkdtemp(prefix="chalk-workers-")
        self.stops = StopSlot(self._file("stops"))
        self.cancel_version = -1
        self.workers: dict[int, _Worker] = {}
        self.later: dict[int, float] = {}    # places to start a worker in again, and when
        self.pauses: dict[int, float] = {}   # the pause before a place's next quick restart

    def _file(self, name: str) -> str | None:
        return None if self.scratch is None else os.path.join(self.scratch, name)

    def run(self) -> None:
        from engine._worker import freeze_worker_heap

        freeze_worker_heap()  # once here, not in each worker it forks
        try:
            for place in range(self.count):
                self._start(place)
            self._watch()
        finally:
            for worker in self.workers.values():
                self._end(worker, kill=True)
            self.control.close()
            if self.scratch is not None:
                import shutil

                shutil.rmtree(self.scratch, ignore_errors=True)

    def _watch(self) -> None:
        while True:
            now = time.monotonic()
            wakes = [w.deadline for w in self.workers.values() if w.deadline is not None]
            wakes += self.later.values()
            wait = max(0.0, min(wakes) - now) if wakes else None
            watched: list[Any] = [self.control, *(w.notes for w in self.workers.values())]
            ready, _, _ = select.select(watched, [], [], wait)
            if self.control in ready:
                frame = recv(self.control)
                if frame is None:
                    return  # the driver is gone, or done with us
                if frame[:1] == CANCEL:
                    (version,) = CANCEL_HEAD.unpack_from(frame, 1)
                    if version > self.cancel_version:  # an older set sent late is no news
                        self.cancel_version = version
                        text = frame[1 + CANCEL_HEAD.size:].decode("utf-8", "replace")
                        self.stops.replace(version, [i for i in text.split("\n") if i])
            for worker in list(self.workers.values()):
                if worker.notes in ready and not self._read_notes(worker):
                    self._replace(worker, timeout=False)
            now = time.monotonic()
            for worker in list(self.workers.values()):
                if self._overdue(worker, now):
                    self._replace(worker, timeout=True)
            for place, at in list(self.later.items()):
                if now >= at:
                    del self.later[place]
                    self._start(place)

    def _overdue(self, worker: _Worker, now: float) -> bool:
        """Whether the worker's request ran past its limit (notes written meanwhile count:
        it may have ended that request and begun the next)."""
        if worker.deadline is None or now < worker.deadline:
            return False
        if not self._read_notes(worker):
            return False  # gone: reaped as such on the next look
        return worker.deadline is not None and now >= worker.deadline

    def _read_notes(self, worker: _Worker) -> bool:
        """Take the worker's notes (those written so far); False when it is gone (its pipe
        closed)."""
        try:
            data = os.read(worker.notes, 4096)
        except BlockingIOError:
            return True
        except OSError:
            data = b""
        if not data:
            return False
        worker.buffer += data
        while len(worker.buffer) >= NOTE.size:
            kind, seq, limit = NOTE.unpack_from(worker.buffer, 0)
            worker.buffer = worker.buffer[NOTE.size:]
            if kind == b"B":
                worker.seq = seq
                worker.deadline = time.monotonic() + limit if limit > 0 else None
            else:
                worker.seq, worker.deadline = 0, None
        return True

    def _replace(self, worker: _Worker, *, timeout: bool) -> None:
        """Kill (``timeout``) or reap a worker, report it, start another in its place (at
        once; after a pause that grows when workers there keep ending right after they
        start)."""
        how = self._end(worker, kill=timeout)
        call = worker.slot.read()
        parts = encode_report(worker.place, worker.pid, worker.seq, timeout, how, call)
        with contextlib.suppress(OSError):  # the driver gone: the loop ends on its next look
            send(self.control, *parts)
        worker.slot.close()
        del self.workers[worker.place]
        if not timeout and time.monotonic() - worker.started < QUICK:
            pause = self.pauses[worker.place] = min(BACKOFF,
                                                    2 * self.pauses.get(worker.place, 0.05))
            self.later[worker.place] = time.monotonic() + pause
        else:
            self.pauses.pop(worker.place, None)
            self._start(worker.place)

    def _end(self, worker: _Worker, *, kill: bool) -> str:
        """Reap the worker (killed first when ``kill``, or when it still runs although its
        notes ended: it closed the pipe itself); how it ended."""
        with contextlib.suppress(OSError):
            os.close(worker.notes)
        if worker.process is not None:
            if kill or worker.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    worker.process.kill()
            code = worker.process.wait()
        else:
            try:
                done, status = (0, 0) if kill else os.waitpid(worker.pid, os.WNOHANG)
                if not done:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(worker.pid, signal.SIGKILL)
                    _, status = os.waitpid(worker.pid, 0)
            except ChildProcessError:
                return ""
            code = os.waitstatus_to_exitcode(status)
        return f"exit {code}" if code >= 0 else f"signal {-code}"

    def _start(self, place: int) -> None:
        """A worker in ``place`` (when the system cannot make one now, again later)."""
        try:
            self.workers[place] = self._make(place)
        except OSError as e:  # out of processes or memory: the others go on meanwhile
            pause = self.pauses[place] = min(BACKOFF, 2 * self.pauses.get(place, 0.5))
            self.later[place] = time.monotonic() + pause
            log.warning("could not start a worker (%s); trying again in %g s", e, pause)

    def _make(self, place: int) -> _Worker:
        slot = CallSlot(self._file(f"call-{place}"))
        notes, write = os.pipe()
        if self.method == "spawn":
            try:
                process = self._spawn(place, write)
            finally:
                os.close(write)
            return _Worker(place, process.pid, notes, slot, process)
        keep = {write, *(w.notes for w in self.workers.values())}
        me = os.getpid()
        pid = os.fork()
        if pid == 0:
            os.close(notes)
            for fd in keep - {write}:
                with contextlib.suppress(OSError):
                    os.close(fd)
            self.control.close()
            _work(self.address, self.secret, HELLO.pack(CHILD, self.token, self.id, os.getpid(),
                                                          self.home, place),
                  write, slot, self.stops, me)
        os.close(write)
        return _Worker(place, pid, notes, slot)

    def _spawn(self, place: int, write: int) -> subprocess.Popen[bytes]:
        config = {"address": self.address, "secret": self.secret.hex(), "token": self.token,
                  "supervisor": self.id, "home": self.home, "place": place, "notes": write,
                  "call": self._file(f"call-{place}"), "stops": self._file("stops"),
                  "path": sys.path, "cwd": os.getcwd(), "parent": os.getpid()}
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        process = subprocess.Popen([*COMMAND, "--worker"], stdin=subprocess.PIPE,
                                   pass_fds=(write,), env=env)
        assert process.stdin is not None
        process.stdin.write(json.dumps(config).encode())
        process.stdin.close()
        return process


def supervise(address: Any, secret: bytes, token: int, home: int, workers: int,
              method: str | None = None) -> None:
    """Connect to the driver at ``address``, start ``workers`` workers and watch them until the
    driver closes the control channel (then they are killed, and this returns)."""
    _Supervisor(address, secret, token, home, workers, method or start_method()).run()


# -- a worker ---------------------------------------------------------------------------

def send_answer(conn: socket.socket, seq: int, kind: bytes, parts: Sequence[bytes],
                seconds: float) -> None:
    """An answer: its head, then each part as a frame of its own."""
    send(conn, ANSWER, ANSWER_HEAD.pack(seq, kind, len(parts), seconds))
    for part in parts:
        send(conn, part)


def _work(address: Any, secret: bytes, hello: bytes, notes: int, slot: CallSlot,
          stops: StopSlot, parent: int) -> None:
    """A worker's life: connect to the driver, run each request it sends, tell the
    supervisor when one begins and ends.  Never returns."""
    code = 0
    try:
        # A signal to the service's process group (^C, a service manager's stop) is the
        # service's to handle: a worker dies only by its supervisor, with it, or with its
        # connection to the driver -- never in the middle of a chunk the service waits for.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        _die_with(parent)
        with contextlib.suppress(OSError):
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write(str(OOM_SCORE))
        conn = connect(address, secret, hello)
        _serve(conn, notes, slot, stops)
    except SystemExit as e:  # a pipelet's sys.exit(n): reported as that exit
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        code = GONE
    finally:
        os._exit(code)


def _serve(conn: socket.socket, notes: int, slot: CallSlot, stops: StopSlot) -> None:
    from engine._worker import chunk_partition

    workflows: dict[tuple[str, str], Any] = {}
    while True:
        frame = recv(conn)
        if frame is None:
            return
        seq, limit, version = REQUEST_HEAD.unpack_from(frame, 1)
        os.write(notes, NOTE.pack(b"B", seq, limit))
        slot.tell(None)
        started = time.perf_counter()
        try:
            key, workflow, chunk, compress, cancelled = pickle.loads(
                memoryview(frame)[1 + REQUEST_HEAD.size:])
            if workflow is not None:  # every version it was sent: the driver counts on it
                workflows[key] = workflow
            with watched(slot.tell), stoppable(_among(stops, version, frozenset(cancelled))):
                out = list(chunk_partition(workflows[key], [chunk], compress))
            kind, parts = (b"C", chunk_parts(out[0])) if out else (b"N", [])
        except Exception:
            kind, parts = b"E", [traceback.format_exc().encode()]
        del frame
        send_answer(conn, seq, kind, parts, time.perf_counter() - started)
        os.write(notes, NOTE.pack(b"E", seq, 0.0))


def _among(stops: StopSlot, version: int, given: frozenset[str]) -> Callable[[Sequence[str]], set[str]]:
    """Which of a call's records are cancelled: the set the request brought, until the
    supervisor holds a newer one (which may have withdrawn some)."""

    def among(ids: Sequence[str]) -> set[str]:
        now, cancelled = stops.current()
        if now < version:
            cancelled = given
        return set(cancelled.intersection(ids)) if cancelled else set()

    return among


def _die_with(parent: int) -> None:
    """Have the kernel kill this process when its supervisor dies (Linux)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # it died before that took hold
        os._exit(GONE)


# -- main: the service's own supervisor, or a spawned worker ----------------------------

def _preload() -> None:
    """What every chunk needs, imported before the workers are forked (they share it)."""
    import blackboard  # noqa: F401
    import engine._worker  # noqa: F401
    import pipelets  # noqa: F401


def main(argv: list[str]) -> int:
    """A supervisor (or, with ``--worker``, a spawned worker) told what to do on stdin."""
    # The service stops us (it closes the control channel), not a signal to its group.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    config = json.loads(sys.stdin.buffer.read())
    sys.stdin.close()
    sys.path[:] = list(config["path"])
    with contextlib.suppress(OSError):
        os.chdir(config["cwd"])
    address = config["address"]
    address = address if isinstance(address, str) else tuple(address)
    secret = bytes.fromhex(config["secret"])
    if "--worker" in argv:  # spawned by a supervisor that has no fork
        hello = HELLO.pack(CHILD, config["token"], config["supervisor"], os.getpid(),
                           config["home"], config["place"])
        _work(address, secret, hello, config["notes"], CallSlot(config["call"]),
              StopSlot(config["stops"]), config["parent"])
        return GONE  # not reached
    logging.basicConfig(level=config.get("log_level", logging.WARNING),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    _preload()
    gc.collect()
    supervise(address, secret, config["token"], 0, config["workers"], config.get("start"))
    return 0


# How a supervisor or a spawned worker starts: a new interpreter, this module's main.
COMMAND = [sys.executable, "-c", "import sys; from engine._supervisor import main; "
           "sys.exit(main(sys.argv[1:]))"]
