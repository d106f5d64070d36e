"""The broker connection in a process of its own.

pika does its frame work in pure Python: decoding each delivery, encoding
each publish, matching the confirms.  In the service that work held the
interpreter lock about 40% of the time at full speed (profiled with
``py-spy --gil``), and the stage, runner and committer threads waited for
it.  :class:`ProcessLink` runs an :class:`~listener_router._amqp.AmqpLink`
in a child process instead, which has an interpreter lock (and a core) of
its own, and talks to it over a socket pair: one pickled message carries a
whole batch of deliveries, publishes or acks.  It has the ``AmqpLink``
surface the service uses (``deliveries``, ``ready``, ``generation``,
``publish``, ``ack``, ``reject``, ``stop_consuming``, ``stop``).

Theory of operation.

- parent → child: ``("publish", id, [OutMessage fields, …])``,
  ``("ack", [(generation, tag), …])``, ``("reject", tags, requeue)``,
  ``("cancel",)``, ``("stop",)``;
- child → parent: lists of events: ``("d", *Delivery fields)``,
  ``("up", generation)``, ``("down", error)``, ``("confirm", id, error or
  None)``, ``("log", level, logger, text)``.

The child dies with its parent: it asks the kernel for SIGKILL when the
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

import contextlib
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from listener_router._amqp import AmqpLink, BrokerUnavailable, Deliveries, Delivery, OutMessage

__all__ = ["ProcessLink"]

log = logging.getLogger(__name__)

_EPOCH = 1_000_000  # generations per child: a child's connections never reach the next epoch


class ProcessLink:
    """An :class:`AmqpLink` run in a child process (see module doc); same arguments."""

    def __init__(self, url: str, *, prefetch: int = 1000, consume: Sequence[str] = (),
                 prepare: Callable[[Any], None] | None = None,
                 reconnect_max_delay: float = 10.0):
        self.url = url
        self._config = {"url": url, "prefetch": prefetch, "consume": list(consume),
                        "prepare": prepare, "reconnect_max_delay": reconnect_max_delay}
        self.reconnect_max_delay = reconnect_max_delay
        self.deliveries = Deliveries()
        self.ready = threading.Event()
        self.generation = 0
        self.last_error: str | None = None
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
        fields = [(m.routing_key, m.body, m.message_id, m.headers, m.exchange, m.content_type)
                  for m in messages]
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
        root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join([root, env["PYTHONPATH"]]) \
            if env.get("PYTHONPATH") else root
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "listener_router._amqp_process", str(theirs.fileno()),
                 str(os.getpid())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, env=env,
                start_new_session=True)  # a Ctrl-C for the service is the service's to handle
        finally:
            theirs.close()
        conn = Connection(ours.detach())
        self._conn = conn
        was_up = False
        config = dict(self._config, first_generation=self._epoch * _EPOCH,
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
            elif kind == "down":
                self.ready.clear()
                self.last_error = event[1]
            elif kind == "log":
                logging.getLogger(event[2]).log(event[1], "%s", event[3])
        if deliveries:
            self.deliveries.put_many(deliveries)
        return up


# -- the child -----------------------------------------------------------------------------
class _Events:
    """What the child has to tell its parent, sent in batches by one thread."""

    def __init__(self, conn: Connection):
        self._conn = conn
        self._items: list[tuple[Any, ...]] = []
        self._cond = threading.Condition()

    def put(self, item: tuple[Any, ...]) -> None:
        with self._cond:
            self._items.append(item)
            if len(self._items) == 1:
                self._cond.notify()

    def pump(self) -> None:
        while True:
            with self._cond:
                while not self._items:
                    self._cond.wait()
                items, self._items = self._items, []
            try:
                self._conn.send(items)
            except OSError:  # the parent is gone
                os._exit(0)


class _RelayLink(AmqpLink):
    """The child's link: deliveries and state changes go to the parent."""

    def __init__(self, events: _Events, **kwargs: Any):
        super().__init__(**kwargs)
        self._events = events

    def _deliver(self, *fields: Any) -> None:
        self._events.put(("d", *fields))

    def _state_changed(self, up: bool) -> None:
        self._events.put(("up", self.generation) if up else ("down", self.last_error))


class _ToParent(logging.Handler):
    def __init__(self, events: _Events):
        super().__init__()
        self._events = events

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._events.put(("log", record.levelno, record.name, record.getMessage()))
        except Exception:  # a log line must never take the link down
            self.handleError(record)


def _die_with_parent(parent: int) -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # it died before the request took effect
        os._exit(0)


def _child(fd: int, parent: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _die_with_parent(parent)
    conn = Connection(fd)
    kind, config = conn.recv()
    assert kind == "config"
    events = _Events(conn)
    root = logging.getLogger()
    root.addHandler(_ToParent(events))
    root.setLevel(config.pop("level"))
    threading.Thread(target=events.pump, name="chalk-amqp-events", daemon=True).start()
    link = _RelayLink(events, **config)  # the parent's AmqpLink arguments
    link.start(wait=None)
    try:
        while True:
            command = conn.recv()
            kind = command[0]
            if kind == "publish":
                ident = command[1]
                future = link.publish([OutMessage(*fields) for fields in command[2]])
                future.add_done_callback(
                    lambda f, ident=ident: events.put(("confirm", ident, _error_of(f))))
            elif kind == "ack":
                link.ack_tags(command[1])
            elif kind == "reject":
                link.reject_tags(command[1], requeue=command[2])
            elif kind == "cancel":
                link.stop_consuming()
            elif kind == "stop":
                break
    except (EOFError, OSError):  # the parent is gone: the broker redelivers what is unacked
        pass
    link.stop()
    os._exit(0)


def _error_of(future: Future[int]) -> str | None:
    error = future.exception()
    return None if error is None else str(error)


if __name__ == "__main__":
    _child(int(sys.argv[1]), int(sys.argv[2]))
