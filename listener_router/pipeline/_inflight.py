"""What is in flight: messages and records taken up by this service and not yet settled.

A message or record is *in flight* from the moment the gather stage takes it
up until it is settled (committed, failed or held) and its records have left
the blackboard.  A message that names a message or record in flight in
another batch (an earlier one of its lane, another lane's, or the one being
gathered) cannot be taken up now: loading it would read the version that
batch is about to replace, and the inbox would not yet show that batch's
commit.  It is *parked* (:meth:`InFlight.take_or_park`) and handed back
(``wake``) the moment it can go — an event, not a timer; the messages behind
it go on.  While records are in flight (loaded ahead of their run, or
waiting for their commit) one thread renews their leases.

Theory of operation: a line per key.  A parked message waits in the line of
*every* key it needs, at the place it had when it was first parked.  It may
take its keys when none is held and it is first in each of their lines; the
moment a key is released, the first message of its line is looked at and
handed back when it may go.  So a record's messages take effect in the order
they were gathered, even when a later one is gathered before an earlier one
came back through the lane's queue, and no two messages wait for each other:
the lines of any two share one order, the order they were parked in.  A
message with a hold of its own on one of its keys (``mine``: a retry, whose
keys waited for it) goes before its lines.  A parked message that will not
be gathered here again (its connection is gone, it went back to the queue,
it was cancelled meanwhile) is :meth:`dropped <InFlight.drop>` from its
lines.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Hashable, Iterable
from typing import Any

__all__ = ["InFlight"]

log = logging.getLogger(__name__)

Wake = Callable[[list[Any]], None]


class _Wait:
    """A parked message: the keys it needs, where to hand it back, and whether it was."""

    __slots__ = ("first", "item", "keys", "mine", "wake", "woken")

    def __init__(self, item: Any, wake: Wake, keys: tuple[Hashable, ...], mine: object,
                 first: bool):
        self.item = item
        self.wake = wake
        self.keys = keys
        self.mine = mine
        self.first = first    # it holds a key of its own: it goes before its lines
        self.woken = False    # handed back, not yet gathered again


class InFlight:
    """Messages and records taken up by this service and not yet settled (see module doc).

    Keys are record IDs (``str``) and message keys (``("message", queue, id)``);
    each is held by one batch.  ``renew(ids)`` extends the leases of records,
    called every ``interval`` seconds from a thread of its own.
    """

    def __init__(self, renew: Callable[[list[str]], Any], interval: float):
        self._renew = renew
        self._interval = interval
        self._held: dict[Hashable, object] = {}
        self._lines: dict[Hashable, deque[_Wait]] = {}
        self._waits: dict[int, _Wait] = {}          # by id() of the parked item
        self._cond = threading.Condition()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> InFlight:
        self._thread = threading.Thread(target=self._keep, name="chalk-leases", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()

    def _keep(self) -> None:
        while not self._done.wait(self._interval):
            with self._cond:
                ids = [key for key in self._held if type(key) is str]
            if ids:
                try:
                    self._renew(ids)
                except Exception as e:  # the database is gone: leases lapse, commits say so
                    log.warning("lease renewal of %d record(s) failed: %s", len(ids), e)

    def reserve(self, keys: Iterable[Hashable], holder: object) -> None:
        with self._cond:
            for key in keys:
                self._held[key] = holder

    def reserve_free(self, keys: Iterable[Hashable], holder: object) -> None:
        """Reserve those of ``keys`` no one holds for ``holder``."""
        with self._cond:
            for key in keys:
                self._held.setdefault(key, holder)

    def release(self, keys: Iterable[Hashable]) -> None:
        ready: list[_Wait] = []
        with self._cond:
            pop = self._held.pop
            lines = self._lines
            for key in keys:
                pop(key, None)
                line = lines.get(key) if lines else None
                if line:
                    self._look(line[0], ready)
            self._cond.notify_all()
        _hand_back(ready)

    def take_or_park(self, keys: list[Hashable], holder: object, item: Any, wake: Wake, *,
                     mine: object = None) -> bool:
        """Reserve every one of ``keys`` for ``holder`` and return True; or, when it may not go
        yet (a key is held, or another message waits before it in a key's line), reserve
        none, park ``item`` in the line of each of its keys (``wake([item, ...])`` hands it
        back when it may go) and return False.

        A key held by ``mine`` (a hold the item itself left, equal by value: a retry's) is
        taken over, and the item goes before the messages in its lines."""
        with self._cond:
            return self._take_or_park(keys, holder, item, wake, mine)

    def take_or_park_each(self, items: Iterable[tuple[list[Hashable], Any, object]],
                          holder: object, wake: Wake) -> list[bool]:
        """:meth:`take_or_park` for each ``(keys, item, mine)`` in turn, under one hold of the
        lock (a chunk of deliveries: not a lock round trip per message); what each did."""
        with self._cond:
            return [self._take_or_park(keys, holder, item, wake, mine)
                    for keys, item, mine in items]

    def _take_or_park(self, keys: list[Hashable], holder: object, item: Any, wake: Wake,
                      mine: object) -> bool:
        wait = self._waits.get(id(item))
        if self._may_go(keys, item, wait, mine):
            held = self._held
            for key in keys:
                held[key] = holder
            if wait is not None:
                self._leave(wait, [])
            return True
        if wait is None:
            first = mine is not None and any(self._held.get(k) == mine for k in keys)
            wait = self._waits[id(item)] = _Wait(item, wake, tuple(keys), mine, first)
            lines = self._lines
            for key in wait.keys:
                lines.setdefault(key, deque()).append(wait)
        wait.woken = False
        wait.wake = wake
        return False

    def drop(self, items: Iterable[Any]) -> None:
        """These messages will not be gathered here again (their connection is gone, they
        went back to the queue, they were settled without a run): they leave their lines,
        and those behind them are handed back when they may go."""
        ready: list[_Wait] = []
        with self._cond:
            for item in items:
                wait = self._waits.get(id(item))
                if wait is not None:
                    self._leave(wait, ready)
            self._cond.notify_all()
        _hand_back(ready)

    def parked(self) -> int:
        """Items parked, waiting for their keys."""
        with self._cond:
            return len(self._waits)

    def unpark_all(self) -> list[Any]:
        """Every parked item, no longer parked (the service is stopping), in the order they
        were parked."""
        with self._cond:
            items = [wait.item for wait in self._waits.values()]
            self._waits.clear()
            self._lines.clear()
        return items

    def __len__(self) -> int:
        with self._cond:
            return len(self._held)

    # -- the lines (lock held) --------------------------------------------------------------
    def _may_go(self, keys: Iterable[Hashable], item: Any, wait: _Wait | None,
                mine: object) -> bool:
        held, lines = self._held, self._lines
        first = wait.first if wait is not None else (
            mine is not None and any(held.get(k) == mine for k in keys))
        for key in keys:
            owner = held.get(key)
            if owner is not None and not (mine is not None and owner == mine):
                return False
            if not first:
                line = lines.get(key)
                if line and line[0] is not wait:
                    return False
        return True

    def _leave(self, wait: _Wait, ready: list[_Wait]) -> None:
        """``wait`` leaves its lines; the new first of each is looked at."""
        del self._waits[id(wait.item)]
        lines = self._lines
        for key in wait.keys:
            line = lines.get(key)
            if line is None:
                continue
            was_first = line[0] is wait
            line.remove(wait)
            if not line:
                del lines[key]
            elif was_first:
                self._look(line[0], ready)

    def _look(self, wait: _Wait, ready: list[_Wait]) -> None:
        if not wait.woken and self._may_go(wait.keys, wait.item, wait, wait.mine):
            wait.woken = True
            ready.append(wait)


def _hand_back(ready: list[_Wait]) -> None:
    """Hand the messages that may go back to their lanes (lock not held)."""
    woken: dict[Wake, list[Any]] = {}
    for wait in ready:
        woken.setdefault(wait.wake, []).append(wait.item)
    for wake, items in woken.items():
        wake(items)
