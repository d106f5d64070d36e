"""A lane's deliveries held unacked, to be gathered again after a backoff.

A message is held when it cannot go on now for a reason outside the
service's own batches, and must not be rejected (a reject would raise its
delivery count towards the queue's limit): its records are locked by
another owner, the database or the broker failed, or the service lets go of
a batch it will not run.  (A message waiting for a batch of this service
that holds its message or records is *parked* instead, ``_inflight``, and
comes back the moment that batch commits.)

Held deliveries are gathered again once :attr:`Held.backoff` seconds have
passed since they were held; the backoff grows while holds keep coming and
ends once nothing is held.  Waiting for it never holds back the lane's
fresh deliveries: the gather stage takes the held ones that are due
(:meth:`Held.take_due`) and then fresh ones.  :meth:`Held.wake` makes every
held delivery due at once (the cluster released a dead member's leases:
the records they wait for are free now).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

from listener_router.broker import Delivery

__all__ = ["Held", "Holds"]


class Held:
    """A lane's held deliveries and the backoff before they are gathered again."""

    def __init__(self) -> None:
        self._items: list[tuple[float, Delivery]] = []   # (due, delivery), oldest first
        self._lock = threading.Lock()
        self.backoff = 0.0

    def __bool__(self) -> bool:
        return bool(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def hold(self, deliveries: Iterable[Delivery]) -> None:
        """Hold after the current backoff."""
        due = time.monotonic() + self.backoff
        with self._lock:
            self._items.extend((due, d) for d in deliveries)

    def hold_first(self, deliveries: Iterable[Delivery]) -> None:
        """Hold ahead of those already held (they were gathered before them), due now."""
        now = time.monotonic()
        with self._lock:
            self._items[:0] = [(now, d) for d in deliveries]

    def take_due(self, limit: int) -> list[Delivery]:
        """Up to ``limit`` held deliveries whose backoff has passed, oldest first."""
        now = time.monotonic()
        with self._lock:
            if not any(due <= now for due, _d in self._items):
                return []
            taken: list[Delivery] = []
            kept: list[tuple[float, Delivery]] = []
            for due, d in self._items:
                if due <= now and len(taken) < limit:
                    taken.append(d)
                else:
                    kept.append((due, d))
            self._items = kept
        return taken

    def take(self) -> list[Delivery]:
        """Every held delivery, due or not (none is held afterwards)."""
        with self._lock:
            items, self._items = self._items, []
        return [d for _due, d in items]

    def next_due(self) -> float | None:
        """Seconds until the earliest held delivery is due (0: now), or None when none is."""
        with self._lock:
            if not self._items:
                return None
            return max(0.0, min(due for due, _d in self._items) - time.monotonic())

    def wake(self) -> None:
        """Every held delivery is due now, and the backoff starts again from nothing."""
        self.backoff = 0.0
        with self._lock:
            self._items = [(0.0, d) for _due, d in self._items]

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


class Holds:
    """Every lane's :class:`Held`, by queue: what the stages use to hold deliveries (each
    in its own lane; a queue without a lane shares one more)."""

    def __init__(self, queues: Iterable[str]):
        self.by_queue: dict[str, Held] = {q: Held() for q in queues}
        self._other = Held()

    def of(self, queue: str) -> Held:
        return self.by_queue.get(queue, self._other)

    def _sorted(self, deliveries: Iterable[Delivery]) -> dict[str, list[Delivery]]:
        out: dict[str, list[Delivery]] = {}
        for d in deliveries:
            out.setdefault(d.queue, []).append(d)
        return out

    def hold(self, deliveries: Iterable[Delivery]) -> None:
        for queue, some in self._sorted(deliveries).items():
            self.of(queue).hold(some)

    def hold_first(self, deliveries: Iterable[Delivery]) -> None:
        for queue, some in self._sorted(deliveries).items():
            self.of(queue).hold_first(some)

    def defer(self, deliveries: Iterable[Delivery]) -> float:
        """Hold messages a batch deferred, each lane's backoff grown; the longest backoff."""
        longest = 0.0
        for queue, some in self._sorted(deliveries).items():
            held = self.of(queue)
            held.hold(some)
            held.deferred()
            longest = max(longest, held.backoff)
        return longest

    def publish_failed(self, deliveries: Iterable[Delivery]) -> None:
        for queue, some in self._sorted(deliveries).items():
            held = self.of(queue)
            held.hold(some)
            held.publish_failed()

    def settled(self, queues: Iterable[str]) -> None:
        for queue in set(queues):
            self.of(queue).settled()

    def wake(self) -> None:
        for held in (*self.by_queue.values(), self._other):
            held.wake()
