"""What is in flight: messages and records taken up by this service and not yet settled.

A message or record is *in flight* from the moment the gather stage takes it
up until it is settled (committed, failed or held) and its records have left
the blackboard.  A message that names a message or record in flight in
another batch (an earlier one of its lane, another lane's, or the one being
gathered) cannot be taken up now: loading it would read the version that
batch is about to replace, and the inbox would not yet show that batch's
commit.  It is *parked* on that key (:meth:`InFlight.park`) and handed back
(``wake``) the moment the batch releases it — an event, not a timer; the
messages behind it go on.  Messages parked on one key come back in the
order they were parked.  While records are in flight (loaded ahead of their
run, or waiting for their commit) one thread renews their leases.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Hashable, Iterable
from typing import Any

__all__ = ["InFlight"]

log = logging.getLogger(__name__)


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
        self._parked: dict[Hashable, deque[tuple[Any, Callable[[list[Any]], None]]]] = {}
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

    def release(self, keys: Iterable[Hashable]) -> None:
        woken: dict[Callable[[list[Any]], None], list[Any]] = {}
        with self._cond:
            pop = self._held.pop
            parked = self._parked
            for key in keys:
                pop(key, None)
                if parked and key in parked:
                    for item, wake in parked.pop(key):
                        woken.setdefault(wake, []).append(item)
            self._cond.notify_all()
        for wake, items in woken.items():
            wake(items)

    def take_or_park(self, keys: list[Hashable], holder: object, item: Any,
                     wake: Callable[[list[Any]], None], *, fifo: bool = False,
                     mine: object = None) -> bool:
        """Reserve every one of ``keys`` for ``holder`` and return True; or, when any is held
        (by any batch, ``holder`` too), reserve none, park ``item`` on the first held one
        (handed to ``wake([item, ...])`` when it is released) and return False.

        ``fifo``: a key with items parked on it counts as held (they were first).  A key
        held by ``mine`` (a hold the item itself left, equal by value) is taken over."""
        return self.take_or_park_each([(keys, item, mine)], holder, wake, fifo=fifo)[0]

    def take_or_park_each(self, items: Iterable[tuple[list[Hashable], Any, object]],
                          holder: object, wake: Callable[[list[Any]], None], *,
                          fifo: bool = False) -> list[bool]:
        """:meth:`take_or_park` for each ``(keys, item, mine)`` in turn, under one hold of the
        lock (a chunk of deliveries: not a lock round trip per message)."""
        held = self._held
        parked = self._parked
        out: list[bool] = []
        with self._cond:
            for keys, item, mine in items:
                for key in keys:
                    owner = held.get(key)
                    if owner is not None and mine is not None and owner == mine:
                        continue  # its own hold (a retry's): it goes first
                    if owner is not None or (fifo and parked.get(key)):
                        parked.setdefault(key, deque()).append((item, wake))
                        out.append(False)
                        break
                else:
                    for key in keys:
                        held[key] = holder
                    out.append(True)
        return out

    def reserve_free(self, keys: Iterable[Hashable], holder: object) -> None:
        """Reserve those of ``keys`` no one holds for ``holder``."""
        with self._cond:
            for key in keys:
                self._held.setdefault(key, holder)

    def parked(self) -> int:
        """Items parked, waiting for a key to be released."""
        with self._cond:
            return sum(len(q) for q in self._parked.values())

    def unpark_all(self) -> list[Any]:
        """Every parked item, no longer parked (the service is stopping)."""
        with self._cond:
            items = [item for q in self._parked.values() for item, _wake in q]
            self._parked.clear()
        return items

    def __len__(self) -> int:
        with self._cond:
            return len(self._held)
