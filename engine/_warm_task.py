"""Warm workers, the task's side: the loop that runs in a Spark Python worker, and the
framing both sides speak (see ``engine._warm`` for the theory of operation).

A frame is a length (8 bytes, big-endian) and that many bytes.  The task's
first frame is its hello: the secret its function carries, its partition and
pid.  Then the driver sends requests: ``b"R"``, a limit (seconds, a double;
0: none) and, pickled, ``(key, workflow or None, chunk, compress)`` (the
workflow goes once per runner process and version).  While a chunk runs it
may send ``b"X"`` + record IDs (one a line) whose messages were cancelled
meanwhile: the task puts them where the run process looks before each
pipelet call (:class:`~engine._progress.StopSlot`), and those instances end
there (``chalk jobs cancel``).  The task answers each with ``b"C"`` +
a chunk framed as bytes, ``b"N"`` (nothing to send back), ``b"E"`` + the
text of an error it raised, ``b"T"`` + the call it was in (it ran past its
limit and was killed) or ``b"D"`` + how its process died (``exit 3``,
``signal 11``) + the call it was in; answers are never pickled, so nothing
that connects can make the driver unpickle.  The call (``engine._progress``;
empty when none was made) says where the chunk was when it hung or died: the
run process writes each call into memory it shares with the task
(:class:`~engine._progress.CallSlot`) before making it, and the task reads it
there once the run process is gone.

The task does not run chunks itself: it *supervises* a child process it
forked (:class:`_Child`, with everything the worker imported already there)
that does, relaying requests and answers.  A chunk past its limit gets the
child killed; a pipelet that ends its process ends the child.  Either way the
task answers for the chunk and forks a new child (milliseconds): the Spark
task, the warm job and every other chunk on the warm workers go on.  (A
``T`` or ``D`` answer tells the driver that the new child has no workflow
yet.)
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import socket
import struct
import time
import traceback
from collections.abc import Iterator
from typing import Any

from engine._progress import CallSlot, PipeletCall, StopSlot, stoppable, watched
from engine._specs import Workflow
from engine._worker import Chunk, chunk_partition

__all__ = ["CANCEL", "CONNECT_TIMEOUT", "HELLO", "LENGTH", "LIMIT", "REQUEST", "SECRET_SIZE",
           "ChunkFailed", "WorkerLost", "decode_answer", "decode_failure", "recv", "send",
           "warm_task"]

CONNECT_TIMEOUT = 30.0   # seconds the driver waits for the tasks to connect
SECRET_SIZE = 32         # bytes of the secret a task proves itself with
HELLO = struct.Struct("!iq")       # partition, pid
LENGTH = struct.Struct("!Q")       # of a frame
LIMIT = struct.Struct("!d")        # a request's limit, seconds (0: none)
REQUEST = b"R"                     # the driver's frames: a chunk to run,
CANCEL = b"X"                      # records cancelled while it runs
GONE = 70                          # a child's exit code when it could not go on (EX_SOFTWARE)


class WorkerLost(RuntimeError):
    """A warm worker's connection broke while it ran a chunk (the worker died or was
    killed), or the warm workers stopped before a queued chunk ran."""


class ChunkFailed(WorkerLost):
    """A chunk that did not come back: it ran past its limit (``kind`` ``timeout``, after
    ``seconds``) or the process that ran it died (``died``; ``how`` is ``exit 3``,
    ``signal 9``, or empty when the driver cannot know).  ``call`` is the pipelet call it
    was in, as far as the driver heard."""

    def __init__(self, kind: str, how: str = "", call: PipeletCall | None = None,
                 seconds: float = 0.0) -> None:
        super().__init__(f"{kind} {how}".strip())
        self.kind = kind
        self.how = how
        self.call = call
        self.seconds = seconds


# -- framing --------------------------------------------------------------------------

def send(sock: socket.socket, *parts: bytes | memoryview) -> None:
    sock.sendall(LENGTH.pack(sum(map(len, parts))))
    for part in parts:
        sock.sendall(part)


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            return None
        got += k
    return bytes(buf)


def recv(sock: socket.socket) -> bytes | None:
    head = _recv_exact(sock, LENGTH.size)
    if head is None:
        return None
    return _recv_exact(sock, LENGTH.unpack(head)[0])


# An answer: b"C" + a chunk, b"N" (the partition had nothing to send back), or
# b"E" + the text of an error the task raised.
_U16 = struct.Struct("!H")
_U32 = struct.Struct("!I")
_U64 = struct.Struct("!Q")


def _encode_chunk(chunk: Chunk) -> list[bytes]:
    meta, codec, size, data, blobs = chunk
    parts = [b"C", _U32.pack(len(meta)), meta, _U32.pack(len(codec)), codec.encode(),
             _U64.pack(size), _U64.pack(len(data)), data, _U32.pack(len(blobs))]
    for blob in blobs:
        parts += [_U64.pack(len(blob)), blob]
    return parts


def decode_answer(frame: bytes) -> Chunk | None:
    kind = frame[:1]
    if kind == b"N":
        return None
    if kind == b"E":
        raise RuntimeError(frame[1:].decode("utf-8", "replace"))
    if kind != b"C":
        raise WorkerLost(f"a warm worker answered with an unknown frame ({kind!r})")
    view = memoryview(frame)
    at = 1

    def take(fmt: struct.Struct) -> int:
        nonlocal at
        (value,) = fmt.unpack_from(view, at)
        at += fmt.size
        return int(value)

    def data(n: int) -> bytes:
        nonlocal at
        out = bytes(view[at:at + n])
        at += n
        return out

    meta = data(take(_U32))
    codec = data(take(_U32)).decode()
    size = take(_U64)
    block = data(take(_U64))
    blobs = [data(take(_U64)) for _ in range(take(_U32))]
    return (meta, codec, size, block, blobs)


def decode_failure(frame: bytes, limit: float) -> ChunkFailed:
    """A ``T`` or ``D`` answer as the error it stands for (``limit``: the chunk's)."""
    if frame[:1] == b"T":
        return ChunkFailed("timeout", "", _call(frame[1:]), limit)
    (n,) = _U16.unpack_from(frame, 1)
    how = frame[1 + _U16.size:1 + _U16.size + n].decode("utf-8", "replace")
    return ChunkFailed("died", how, _call(frame[1 + _U16.size + n:]))


def _call(data: bytes) -> PipeletCall | None:
    try:
        return PipeletCall.from_json(data) if data else None
    except (ValueError, TypeError):  # a slot written by something else: no call, not a crash
        return None


# -- the task's side (runs in a Spark Python worker) -----------------------------------

def warm_task(address: Any, secret: bytes, partition: int, items: Iterator[Any]) -> Iterator[Any]:
    """The warm job's ``mapPartitions`` body: connect to the driver, have chunks run until it
    closes the connection.  Yields nothing."""
    for _ in items:  # the partition's one element
        pass
    family = socket.AF_UNIX if isinstance(address, str) else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.settimeout(CONNECT_TIMEOUT)
    sock.connect(address)
    sock.settimeout(None)
    if family == socket.AF_INET:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    child: _Child | None = None
    try:
        send(sock, secret, HELLO.pack(partition, os.getpid()))
        while True:
            frame = recv(sock)
            if frame is None:
                break
            if frame[:1] == CANCEL:  # for a chunk that has ended meanwhile
                continue
            (limit,) = LIMIT.unpack_from(frame, 1)
            if child is None:
                child = _Child(sock)
            answer = child.run(sock, memoryview(frame)[1 + LIMIT.size:], limit or None)
            if not child.alive:
                child = None
            send(sock, *answer)
    finally:
        if child is not None:
            child.close()
        sock.close()
    return iter(())


class _Child:
    """The process that runs a warm worker's chunks, forked from it (module doc)."""

    def __init__(self, driver: socket.socket):
        mine, theirs = socket.socketpair()
        self.slot = CallSlot()
        self.stops = StopSlot()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            mine.close()
            _child(theirs, driver, parent, self.slot, self.stops)  # never returns
        theirs.close()
        self.pid = pid
        self.conn = mine
        self.alive = True

    def run(self, driver: socket.socket, payload: memoryview, limit: float | None) -> list[bytes]:
        """Have the child run one request (cancellations from the driver passed on): its
        answer, or ``T`` / ``D`` with the call it was in when it was killed at ``limit`` or
        died (it is gone then)."""
        self.slot.tell(None)
        self.stops.clear()
        deadline = None if limit is None else time.monotonic() + limit
        try:
            send(self.conn, payload)
            while True:
                wait = None if deadline is None else max(0.0, deadline - time.monotonic())
                ready, _, _ = select.select([self.conn, driver], [], [], wait)
                if not ready:
                    raise TimeoutError
                if self.conn in ready:
                    frame = recv(self.conn)
                    if frame is not None:
                        return [frame]
                    break
                frame = recv(driver)
                if frame is None or frame[:1] != CANCEL:  # the driver is gone, or confused
                    self.end(kill=True)
                    raise ConnectionError("the driver's connection broke while a chunk ran")
                self.stops.add(bytes(frame[1:]).decode("utf-8", "replace").split("\n"))
        except TimeoutError:
            self.end(kill=True)
            return [b"T", self.slot.read()]
        except OSError:
            if not self.alive:
                raise
        how = self.end(kill=False).encode()
        return [b"D", _U16.pack(len(how)), how, self.slot.read()]

    def end(self, *, kill: bool) -> str:
        """Reap the child (killed first when ``kill``); how it ended."""
        self.alive = False
        if kill:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        self.conn.close()
        _, status = os.waitpid(self.pid, 0)
        code = os.waitstatus_to_exitcode(status)
        return f"exit {code}" if code >= 0 else f"signal {-code}"

    def close(self) -> None:
        """The task ends: the child goes (told by its connection closing; killed if it lingers)."""
        if not self.alive:
            return
        self.alive = False
        self.conn.close()
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            if os.waitpid(self.pid, os.WNOHANG)[0]:
                return
            time.sleep(0.01)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)


def _child(conn: socket.socket, driver: socket.socket, parent: int, slot: CallSlot,
           stops: StopSlot) -> None:
    """The child's loop: run each request, its pipelet calls told before they are made."""
    code = 0
    try:
        _die_with_parent(parent)
        driver.close()  # the driver must see the connection break when the worker dies
        workflows: dict[tuple[str, str], Workflow] = {}
        while True:
            frame = recv(conn)
            if frame is None:
                break
            try:
                key, workflow, chunk, compress = pickle.loads(frame)
                if workflow is not None:  # every version it was sent: the driver counts on it
                    workflows[key] = workflow
                with watched(slot.tell), stoppable(stops.among):
                    out = list(chunk_partition(workflows[key], [chunk], compress))
                answer = _encode_chunk(out[0]) if out else [b"N"]
            except Exception:
                answer = [b"E", traceback.format_exc().encode()]
            send(conn, *answer)
    except SystemExit as e:  # a pipelet's sys.exit(n): reported as that exit
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        code = GONE
    finally:
        os._exit(code)


def _die_with_parent(parent: int) -> None:
    """Have the kernel kill this process when the worker that forked it dies (Linux)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # it died before that took hold
        os._exit(GONE)
