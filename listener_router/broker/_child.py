"""The broker I/O process: an :class:`AmqpLink` whose events go to its parent.

Started by :class:`~listener_router.broker.ProcessLink` as ``python -m
listener_router.broker._child FD PARENT_PID``; see ``_process`` for the
protocol over the socket pair.  Nothing imports this module but that command.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import signal
import sys
import threading
from concurrent.futures import Future
from multiprocessing.connection import Connection
from typing import Any

from listener_router.broker._link import AmqpLink
from listener_router.broker._values import OutMessage

SEND_BYTES = 4 << 20   # bodies in one message to the parent, about (one larger goes alone)


class _Events:
    """What the child has to tell its parent, sent in batches by one thread; a batch
    carries some ``SEND_BYTES`` of bodies at most, so neither side holds a burst of large
    deliveries twice over (pickled and unpickled) at once."""

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
                size, n = 0, 0
                for item in self._items:
                    n += 1
                    size += len(item[4]) if item[0] == "d" else 0   # ("d", *Delivery): body
                    if size >= SEND_BYTES:
                        break
                items, self._items = self._items[:n], self._items[n:]
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

    def _waiting_changed(self, waiting: int, by_queue: dict[str, int]) -> None:
        self._events.put(("waiting", waiting, by_queue))


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
                future.add_done_callback(functools.partial(_confirmed, events, ident))
            elif kind == "ack":
                link.ack_tags(command[1])
            elif kind == "reject":
                link.reject_tags(command[1], requeue=command[2])
            elif kind == "cancel":
                link.stop_consuming()
            elif kind == "pause":
                link.pause(command[1])
            elif kind == "resume":
                link.resume(command[1])
            elif kind == "stop":
                break
    except (EOFError, OSError):  # the parent is gone: the broker redelivers what is unacked
        pass
    link.stop()
    os._exit(0)


def _confirmed(events: _Events, ident: int, future: Future[int]) -> None:
    error = future.exception()
    events.put(("confirm", ident, None if error is None else str(error)))


if __name__ == "__main__":
    _child(int(sys.argv[1]), int(sys.argv[2]))
