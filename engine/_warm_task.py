"""Warm workers, the task's side: the loop that runs in a Spark Python worker, and the
framing both sides speak (see ``engine._warm`` for the theory of operation).

A frame is a length (8 bytes, big-endian) and that many bytes.  The task's
first frame is its hello: the secret its function carries, its partition and
pid.  Then the driver sends requests, pickled ``(key, workflow or None, chunk,
compress)`` (the workflow goes once per worker and version), and the task
answers each with ``b"C"`` + a chunk framed as bytes, ``b"N"`` (nothing to send
back) or ``b"E"`` + the text of an error it raised: answers are never pickled,
so nothing that connects can make the driver unpickle.
"""

from __future__ import annotations

import os
import pickle
import socket
import struct
import traceback
from collections.abc import Iterator
from typing import Any

from engine._specs import Workflow
from engine._worker import Chunk, chunk_partition

__all__ = ["CONNECT_TIMEOUT", "HELLO", "LENGTH", "SECRET_SIZE", "WorkerLost", "decode_answer", "recv", "send",
           "warm_task"]

CONNECT_TIMEOUT = 30.0   # seconds the driver waits for the tasks to connect
SECRET_SIZE = 32         # bytes of the secret a task proves itself with
HELLO = struct.Struct("!iq")       # partition, pid
LENGTH = struct.Struct("!Q")       # of a frame


class WorkerLost(RuntimeError):
    """A warm worker's connection broke while it ran a chunk (the worker died or was
    killed), or the warm workers stopped before a queued chunk ran."""


# -- framing --------------------------------------------------------------------------

def send(sock: socket.socket, *parts: bytes) -> None:
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


# -- the task's side (runs in a Spark Python worker) -----------------------------------

def warm_task(address: Any, secret: bytes, partition: int, items: Iterator[Any]) -> Iterator[Any]:
    """The warm job's ``mapPartitions`` body: connect to the driver, run chunks until it
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
    workflows: dict[tuple[str, str], Workflow] = {}
    try:
        send(sock, secret, HELLO.pack(partition, os.getpid()))
        while True:
            frame = recv(sock)
            if frame is None:
                break
            try:
                key, workflow, chunk, compress = pickle.loads(frame)
                if workflow is not None:  # every version it was sent: the driver counts on it
                    workflows[key] = workflow
                out = list(chunk_partition(workflows[key], [chunk], compress))
                answer = _encode_chunk(out[0]) if out else [b"N"]
            except Exception:
                answer = [b"E", traceback.format_exc().encode()]
            send(sock, *answer)
    finally:
        sock.close()
    return iter(())
