"""The broker connection in a process of its own.

pika does its frame work in pure Python: decoding each delivery, encoding
each publish, matching the confirms.  In the service that work held the
interpreter lock about 40% of the time at full speed (profiled with
``py-spy --gil``), and the stage, runner and committer threads waited for
it.  :class:`ProcessLink` runs an :class:`~listener_router.broker.AmqpLink`
in a child process instead, which has an interpreter lock (and a core) of
its own, and talks to it over a socket pair: one pickled message carries a
whole batch of deliveries, publishes or acks.  It has the ``AmqpLink``
surface the service uses (``deliveries``, ``ready``, ``generation``,
``publish``, ``ack``, ``reject``, ``stop_consuming``, ``pause``, ``resume``, ``stop``).

Theory of operation.

- parent → child: ``("publish", id, [OutMessage fields, …])``,
  ``("ack", [(generation, tag), …])``, ``("reject", tags, requeue)``,
  ``("cancel",)``, ``("stop",)``;
- child → parent: lists of events: ``("d", *Delivery fields)``,
  ``("up", generation)``, ``("down", error)``, ``("confirm", id, error or
  None)``, ``("waiting", ready messages in the broker, the same by queue)``, ``("log", level,
  logger, text)``.

The child's side (``_child``, run as ``python -m listener_router.broker._child``)
dies with its parent: it asks the kernel for SIGKILL when the
thread that started it ends (``PR_SET_PDEATHSIG``) and exits when the socket
reaches its end.  Its connection then closes and the broker redelivers
every message the parent had not acked, as it would for a thread.  A child
that dies on its own is started again with backoff; until it is up the link
is not ready, publishes fail with ``BrokerUnavailable``, and the deliveries
of the old child carry a generation no longer current (their acks are
dropped, the broker redelivers them).  Each child numbers its connections
from ``epoch * 1,000,000``, so generations never repeat.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from listener_router._errors import BrokerUnavailable
from listener_router.broker._memory import map_large_bodies
from listener_router.broker._values import Deliveries, Delivery, OutMessage

__all__ = ["ProcessLink"]

log = logging.getLogger(__name__)

_EPOCH = 1_000_000  # generations per child: a child's connections never reach the next epoch


class ProcessLink:
    """An :class:`AmqpLink` run in a child process (see module doc); same arguments."""

    def __init__(self, url: str, *, prefetch: int | Mapping[str, int] = 1000,
                 consume: Sequence[str] = (),
                 prepare: Callable[[Any], None] | None = None,
                 reconnect_max_delay: float = 10.0, deliveries: Deliveries | None = None,
                 paused: Iterable[str] = (), depth_of: Sequence[str] = (),
                 max_inflight_bytes: int | Mapping[str, int] | None = None):
        self.url = url
        self.paused: set[str] = set(paused)
        self._config = {"url": url, "prefetch": prefetch, "consume": list(consume),
                        "prepare": prepare, "reconnect_max_delay": reconnect_max_delay,
                        "paused": self.paused, "depth_of": list(depth_of),
                        "max_inflight_bytes": max_inflight_bytes}
        self.reconnect_max_delay = reconnect_max_delay
        self.deliveries = Deliveries() if deliveries is None else deliveries
        self.ready = threading.Event()
        self.generation = 0
        self.last_error: str | None = None
        self.waiting = 0
        self.waiting_by_queue: dict[str, int] = {}
        self._stopping = False
        self._epoch = 0
        self._conn: Connection | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._send_lock = threading.Lock()
        self._pending: dict[int, tuple[Future[int], int]] = {}
        self._pending_lock = threading.Lock()
        self._next_id = 0
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle -----------------------------------------------------------------
    def start(self, wait: float | None = 30.0) -> ProcessLink:
        map_large_bodies()   # the deliveries' bodies are held here until settled
        self._thread = threading.Thread(target=self._supervise, name="chalk-amqp-process",
                                        daemon=True)
        self._thread.start()
        if wait is not None and not self.ready.wait(wait):
            self.stop()
            raise BrokerUnavailable(f"broker not reachable within {wait:.0f} s"
                                    + (f": {self.last_error}" if self.last_error else ""))
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping = True
        self._wake.set()
        self._send(("stop",))
        proc = self._proc
        if proc is not None:
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("the broker I/O process did not stop within %.0f s; killing it",
                            timeout)
                proc.kill()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def child_pid(self) -> int | None:
        """The process ID of the current broker I/O process (None when there is none)."""
        proc = self._proc
        return None if proc is None or proc.poll() is not None else proc.pid

    # -- the AmqpLink surface --------------------------------------------------------
    def publish(self, messages: Sequence[OutMessage]) -> Future[int]:
        """Publish persistently; the future resolves (to the count) when all are confirmed."""
        future: Future[int] = Future()
        if not messages:
            future.set_result(0)
            return future
        if not self.ready.is_set():
            future.set_exception(BrokerUnavailable("not connected to the broker"))
            return future
        with self._pending_lock:
            self._next_id += 1
            ident = self._next_id
            self._pending[ident] = (future, len(messages))
        fields = [(m.routing_key, m.body, m.message_id, m.headers, m.exchange, m.content_type,
                   m.timestamp) for m in messages]
        if not self._send(("publish", ident, fields)):
            self._resolve(ident, "the broker I/O process is gone")
        return future

    def ack(self, deliveries: Iterable[Delivery]) -> None:
        tags = [(d.generation, d.tag) for d in deliveries]
        if tags:
            self._send(("ack", tags))

    def reject(self, deliveries: Iterable[Delivery], *, requeue: bool) -> None:
        tags = [(d.generation, d.tag) for d in deliveries]
        if tags:
            self._send(("reject", tags, requeue))

    def stop_consuming(self) -> None:
        self._send(("cancel",))

    def pause(self, queue: str) -> None:
        """Stop consuming ``queue`` (also after the child is started again)."""
        self.paused.add(queue)
        self._send(("pause", queue))

    def resume(self, queue: str) -> None:
        self.paused.discard(queue)
        self._send(("resume", queue))

    # -- talking to the child ------------------------------------------------------------
    def _send(self, command: tuple[Any, ...]) -> bool:
        conn = self._conn
        if conn is None:
            return False
        try:
            with self._send_lock:
                conn.send(command)
            return True
        except (OSError, ValueError):  # the child is gone (or its socket closed)
            return False

    def _resolve(self, ident: int, error: str | None) -> None:
        with self._pending_lock:
            entry = self._pending.pop(ident, None)
        if entry is None:
            return
        future, count = entry
        if future.done():
            return
        if error is None:
            future.set_result(count)
        else:
            future.set_exception(BrokerUnavailable(error))

    def _fail_pending(self, error: str) -> None:
        with self._pending_lock:
            idents = list(self._pending)
        for ident in idents:
            self._resolve(ident, error)

    def _supervise(self) -> None:
        """Start the child, relay its events; start it again when it dies (until stopped).

        The child is always started from this thread: ``PR_SET_PDEATHSIG``
        fires when the thread that started a process ends.
        """
        delay = 0.5
        while not self._stopping:
            self._epoch += 1
            try:
                was_up = self._run_child()
            except OSError as e:
                was_up = False
                self.last_error = f"cannot start the broker I/O process: {e}"
                log.error("%s", self.last_error)
            self.ready.clear()
            self._fail_pending(f"connection to the broker lost: {self.last_error}")
            if self._stopping:
                break
            delay = 0.5 if was_up else min(delay * 2, self.reconnect_max_delay)
            self._wake.wait(delay)

    def _run_child(self) -> bool:
        """One child's life; True when it was connected at some point."""
        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])  # the folder holding listener_router
        env["PYTHONPATH"] = os.pathsep.join([root, env["PYTHONPATH"]]) \
            if env.get("PYTHONPATH") else root
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "listener_router.broker._child", str(theirs.fileno()),
                 str(os.getpid())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, env=env,
                start_new_session=True)  # a Ctrl-C for the service is the service's to handle
        finally:
            theirs.close()
        conn = Connection(ours.detach())
        self._conn = conn
        was_up = False
        config = dict(self._config, paused=sorted(self.paused),
                      first_generation=self._epoch * _EPOCH,
                      level=logging.getLogger().getEffectiveLevel())
        try:
            self._send(("config", config))
            while True:
                try:
                    events = conn.recv()
                except (EOFError, OSError):
                    break
                was_up = self._handle(events) or was_up
        finally:
            self._conn = None
            conn.close()
            code = self._proc.wait()
            if not self._stopping:
                self.last_error = f"the broker I/O process exited (code {code})"
                log.warning("%s; starting it again", self.last_error)
        return was_up

    def _handle(self, events: list[tuple[Any, ...]]) -> bool:
        up = False
        deliveries: list[Delivery] = []
        for event in events:
            kind = event[0]
            if kind == "d":
                deliveries.append(Delivery(*event[1:]))
                continue
            if deliveries:  # keep the order: deliveries before the state that follows them
                self.deliveries.put_many(deliveries)
                deliveries = []
            if kind == "confirm":
                self._resolve(event[1], event[2])
            elif kind == "up":
                self.generation = event[1]
                self.last_error = None
                self.ready.set()
                up = True
            elif kind == "waiting":
                self.waiting, self.waiting_by_queue = event[1], event[2]
            elif kind == "down":
                self.ready.clear()
                self.last_error = event[1]
            elif kind == "log":
                logging.getLogger(event[2]).log(event[1], "%s", event[3])
        if deliveries:
            self.deliveries.put_many(deliveries)
        return up
