"""Deliveries held unacked, to be gathered again after a backoff.

A message is held when it cannot go on now and must not be rejected (a
reject would raise its delivery count towards the queue's limit): its
records are locked by another owner, the database or the broker failed, or
the service lets go of a batch it will not run.  The gather stage takes the
held deliveries first, after :attr:`Held.backoff` seconds; the backoff grows
while batches keep deferring messages and ends once nothing is held.
:meth:`Held.wake` ends the wait at once (the cluster released a dead
member's leases: the records they wait for are free now).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

from listener_router.broker import Delivery

__all__ = ["Held"]


class Held:
    """The held deliveries and the backoff before they are gathered again."""

    def __init__(self) -> None:
        self._items: list[Delivery] = []
        self._lock = threading.Lock()
        self._woken = threading.Event()
        self.backoff = 0.0

    def __bool__(self) -> bool:
        return bool(self._items)

    def hold(self, deliveries: Iterable[Delivery]) -> None:
        with self._lock:
            self._items.extend(deliveries)

    def hold_first(self, deliveries: Iterable[Delivery]) -> None:
        """Hold ahead of those already held (they were gathered before them)."""
        with self._lock:
            self._items[:0] = deliveries

    def take(self) -> list[Delivery]:
        """Every held delivery (none is held afterwards)."""
        with self._lock:
            items, self._items = self._items, []
        return items

    def wait(self, stop: threading.Event) -> bool:
        """Wait out the backoff (less when woken); True when ``stop`` was set."""
        deadline = time.monotonic() + self.backoff
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or self._woken.is_set():
                self._woken.clear()
                return stop.is_set()
            if stop.wait(min(left, 0.05)):
                return True

    def wake(self) -> None:
        """Gather the held deliveries now, and start the backoff again from nothing."""
        self.backoff = 0.0
        self._woken.set()

    def deferred(self) -> None:
        """A batch deferred messages: wait longer before gathering them again."""
        self.backoff = min(max(self.backoff * 2, 0.2), 30.0)

    def publish_failed(self) -> None:
        """Publishing failed (the broker): wait longer, starting at half a second."""
        self.backoff = min(max(self.backoff * 2, 0.5), 30.0)

    def settled(self) -> None:
        """A batch deferred nothing: no backoff once nothing is held."""
        if not self._items:
            self.backoff = 0.0
