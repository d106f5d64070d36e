"""Starting a warm job (``engine._warm``): a socket to listen on, the job, the tasks' hellos.

The driver listens on a Unix socket for a local master (in a directory only
this user can enter) and on TCP at ``spark.driver.host`` otherwise; each
task connects and proves itself with the secret its function carries, then
says its partition and pid.  Any failure is :class:`WarmUnavailable`.
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
import shutil
import socket
import struct
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from engine._warm_task import CONNECT_TIMEOUT, HELLO, LENGTH, SECRET_SIZE, warm_task

__all__ = ["Slot", "WarmUnavailable", "cancel_group", "listen", "start_job"]

log = logging.getLogger(__name__)


class WarmUnavailable(RuntimeError):
    """The warm workers could not be started (the runner submits a job of its own)."""


class Slot:
    """One task's connection and the thread that feeds it."""

    def __init__(self, conn: socket.socket, partition: int, pid: int):
        self.conn = conn
        self.partition = partition
        self.pid = pid
        self.sent: set[tuple[str, str]] = set()   # workflow versions its runner process has
        self.thread: threading.Thread | None = None
        self.request: Any = None   # the request it runs (``engine._warm.Request``), or None
        self.sending = threading.Lock()  # a request and a cancellation never interleave



def listen(spark: Any, local: bool, backlog: int) -> tuple[socket.socket, Any, str | None]:
    """A socket for the tasks to connect to: (server, address, its directory or None)."""
    if local:
        tmpdir = tempfile.mkdtemp(prefix="chalk-warm-")  # mode 0700
        address: Any = os.path.join(tmpdir, "s")
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(address)
    else:
        tmpdir = None
        conf = spark.sparkContext.getConf()
        host = conf.get("spark.driver.host")
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.bind((conf.get("spark.driver.bindAddress") or host or "0.0.0.0", 0))
        address = (host, server.getsockname()[1])
    server.listen(backlog)
    return server, address, tmpdir


def start_job(sc: Any, n: int, server: socket.socket, address: Any, tmpdir: str | None, *,
              on_end: Callable[[], None]) -> tuple[str, list[Slot], threading.Thread]:
    """Submit a warm job of ``n`` tasks and wait for each to connect to ``server`` (which is
    closed after); its group, slots and thread (``on_end`` is called when the job ends)."""
    secret = secrets.token_bytes(SECRET_SIZE)
    group = f"chalk-warm-{uuid.uuid4().hex[:12]}"
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
            on_end()

    started = time.monotonic()
    thread = threading.Thread(target=job, name=group, daemon=True)
    slots: list[Slot] = []
    try:
        thread.start()
        server.settimeout(0.5)
        deadline = started + CONNECT_TIMEOUT
        while len(slots) < n and time.monotonic() < deadline and thread.is_alive():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            slot = _greet(conn, secret, min(deadline, time.monotonic() + 5.0))
            if slot is not None:
                slots.append(slot)
    except BaseException:
        for slot in slots:
            slot.conn.close()
        cancel_group(sc, group)
        raise
    finally:
        server.close()
        if tmpdir is not None:
            shutil.rmtree(tmpdir, ignore_errors=True)
    if len(slots) < n:
        for slot in slots:
            slot.conn.close()
        cancel_group(sc, group)
        thread.join(30.0)
        why = (f"the job failed: {box['error']}" if "error" in box
               else f"{len(slots)} of {n} task(s) connected in {CONNECT_TIMEOUT:g} s")
        raise WarmUnavailable(f"the warm workers did not start: {why}")
    log.debug("warm workers up in %.3f s: %d task(s), pids %s", time.monotonic() - started,
              n, ", ".join(str(s.pid) for s in slots))
    return group, slots, thread


def _greet(conn: socket.socket, secret: bytes, deadline: float) -> Slot | None:
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
        return Slot(conn, partition, pid)
    except (OSError, struct.error):
        conn.close()
        return None


def cancel_group(sc: Any, group: str) -> None:
    try:
        sc.cancelJobGroup(group)
    except Exception as e:  # the context is stopped: its jobs are gone with it
        log.debug("cancelling %s: %s", group, e)
