"""What the runner's processes say to each other: frames, hellos, requests, answers, reports.

Theory of operation.  A chunk runs in a *worker*: a process a *supervisor*
forked (``engine._supervisor``; the supervisor is a warm Spark task on an
executor, or a process the service started).  Each of them connects to the
*driver* (the process that runs the batch, ``engine._pool``) over a socket
of its own and says who it is in a hello.  Then:

- the driver sends a worker a request and reads the answer on the worker's
  own connection: no process relays either way;
- the supervisor never sees a request or an answer.  Its worker tells it,
  through a pipe, when a request begins (with its limit) and ends; the
  supervisor kills a worker past its limit, reaps one that died, forks a new
  one (milliseconds) and *reports* each death on its own connection, the
  control channel, with the pipelet call the worker was in (read from memory
  they share, ``engine._progress.CallSlot``);
- the driver sends cancellations on the control channel; the supervisor puts
  them where its workers look before each pipelet call
  (``engine._progress.StopSlot``).

A connection opens with a challenge: the driver sends a random nonce, the
process answers with an HMAC of it under the secret its starter gave it, then
its hello, so the secret never crosses the wire (the frames after it are not
encrypted: on a cluster, keep the driver's port on a network you trust).
A frame is a length (8 bytes, big-endian) and that many bytes.  An answer is
several frames: a head (``A``, the request's number, the kind, how many parts
follow) and its parts.  A worker that dies or is killed in the middle of an
answer leaves it short: the driver drops what it got and waits for the
supervisor's report, which says whether the request had begun (its number)
and how the worker ended.  Requests are pickled (the driver is trusted by
whoever it started); answers and reports never are, so nothing that connects
can make the driver unpickle.
"""

from __future__ import annotations

import hashlib
import hmac
import socket
import struct
from collections.abc import Sequence

from engine._progress import PipeletCall

__all__ = [
    "ANSWER",
    "NONCE_SIZE",
    "CANCEL",
    "CHILD",
    "ChunkFailed",
    "HELLO",
    "LENGTH",
    "REPORT",
    "REQUEST",
    "SECRET_SIZE",
    "SUPERVISOR",
    "WorkerLost",
    "Report",
    "chunk_parts",
    "decode_report",
    "encode_report",
    "parts_chunk",
    "read_answer",
    "recv",
    "prove",
    "send",
]

SECRET_SIZE = 32                   # bytes of the secret a process proves itself with
NONCE_SIZE = 32                    # bytes of the challenge the driver sends first
LENGTH = struct.Struct("!Q")       # of a frame
# A hello, after the secret: role, generation token, supervisor id, pid, the
# supervisor's home (a Spark partition, or 0) and the worker's place under it.
HELLO = struct.Struct("!BqqqiI")
SUPERVISOR, CHILD = 1, 2
# The driver's frames.  To a worker: a request (number, limit in seconds or 0,
# the version of the cancelled set it carries), then its pickled payload.  To a
# supervisor: the cancelled set (version, then record IDs, one a line).
REQUEST = b"R"
REQUEST_HEAD = struct.Struct("!QdI")
CANCEL = b"X"
CANCEL_HEAD = struct.Struct("!I")
# A worker's answer head: the request's number, its kind (C a chunk, N nothing
# changed, E the text of an error), the parts that follow and the seconds it ran.
ANSWER = b"A"
ANSWER_HEAD = struct.Struct("!QcId")
# A supervisor's report of a worker that ended: its place, pid, the request it
# had begun (0: none), T (killed at the limit) or D (died), how (``exit 3``),
# the call it was in.
REPORT = b"D"
REPORT_HEAD = struct.Struct("!IqQcH")
_CODEC = struct.Struct("!Q")


class WorkerLost(RuntimeError):
    """A request did not come back: its worker's connection broke, or nobody waits for
    it any more (abandoned), or the workers stopped before it ran."""


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


def prove(secret: bytes, nonce: bytes) -> bytes:
    """What a process answers the driver's challenge with: it knows the secret, and the
    secret never crosses the wire (``SECRET_SIZE`` bytes)."""
    return hmac.new(secret, nonce, hashlib.sha256).digest()


def send(sock: socket.socket, *parts: bytes | memoryview) -> None:
    """One frame made of ``parts`` (written back to back, no copy joins them)."""
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
    """The next frame, or None when the connection ended (before or inside it)."""
    head = _recv_exact(sock, LENGTH.size)
    if head is None:
        return None
    return _recv_exact(sock, LENGTH.unpack(head)[0])


def read_answer(sock: socket.socket) -> tuple[int, bytes, list[bytes], float] | None:
    """A whole answer: (request number, kind, parts, seconds run); None when the
    connection ended before the last part (a half-written answer is dropped)."""
    head = recv(sock)
    if head is None or head[:1] != ANSWER or len(head) != 1 + ANSWER_HEAD.size:
        return None
    seq, kind, count, seconds = ANSWER_HEAD.unpack_from(head, 1)
    parts: list[bytes] = []
    for _ in range(count):
        part = recv(sock)
        if part is None:
            return None
        parts.append(part)
    return seq, kind, parts, seconds


# -- a chunk as parts (never pickled) -------------------------------------------------

def chunk_parts(chunk: tuple[bytes, str, int, bytes, list[bytes]]) -> list[bytes]:
    """A chunk (``engine._worker.Chunk``) as an answer's parts: meta, codec and size, the
    data block, each blob."""
    meta, codec, size, data, blobs = chunk
    return [meta, _CODEC.pack(size) + codec.encode(), data, *blobs]


def parts_chunk(parts: Sequence[bytes]) -> tuple[bytes, str, int, bytes, list[bytes]]:
    if len(parts) < 3:
        raise WorkerLost(f"a worker answered with {len(parts)} part(s), not a chunk")
    (size,) = _CODEC.unpack_from(parts[1], 0)
    return (parts[0], parts[1][_CODEC.size:].decode(), int(size), parts[2], list(parts[3:]))


# -- a supervisor's report --------------------------------------------------------------

class Report:
    """A worker ended: where (``place``, ``pid``), with which request begun (``seq``, 0:
    none), ``timeout`` (killed at its limit) or not, ``how`` (``exit 3``, ``signal 11``)
    and the pipelet call it was in (or None)."""

    __slots__ = ("call", "how", "pid", "place", "seq", "timeout")

    def __init__(self, place: int, pid: int, seq: int, timeout: bool, how: str,
                 call: PipeletCall | None):
        self.place = place
        self.pid = pid
        self.seq = seq
        self.timeout = timeout
        self.how = how
        self.call = call

    def failure(self, limit: float) -> ChunkFailed:
        """The error a request that had begun on that worker fails with."""
        if self.timeout:
            return ChunkFailed("timeout", "", self.call, limit)
        return ChunkFailed("died", self.how, self.call)


def encode_report(place: int, pid: int, seq: int, timeout: bool, how: str,
                  call: bytes) -> list[bytes]:
    text = how.encode()[:1000]
    return [REPORT, REPORT_HEAD.pack(place, pid, seq, b"T" if timeout else b"D", len(text)),
            text, call]


def decode_report(frame: bytes) -> Report:
    place, pid, seq, kind, n = REPORT_HEAD.unpack_from(frame, 1)
    at = 1 + REPORT_HEAD.size
    how = frame[at:at + n].decode("utf-8", "replace")
    data = frame[at + n:]
    call = None
    if data:
        try:
            call = PipeletCall.from_json(data)
        except (ValueError, TypeError):  # a slot written by something else: no call, not a crash
            call = None
    return Report(place, pid, seq, kind == b"T", how, call)
