"""Bytes in flight: how much of each queue's message bodies a link holds, against a bound.

AMQP 0.9.1 bounds what a consumer holds by count (the prefetch), never by
size (RabbitMQ ignores ``prefetch_size``), and a broker with a backlog sends
the whole prefetch at once: a cancelled consumer stops only what the broker
had not sent yet.  So the bound is kept where it can be: in the prefetch a
consumer is made with.  :class:`ByteBudget` counts the unacked bodies by
queue and sizes the prefetch of a queue's next consumer to the room left
under the queue's bound, at the size of the largest recent body (the
largest seen, forgotten slowly; before any is seen, ``assumed``): a queue of
900 KB messages with a 64 MiB bound is consumed 72 at a time whatever its
configured prefetch, one of 200-byte messages at its configured prefetch.

The link asks :meth:`ByteBudget.delivered` for each delivery: True means
stop consuming that queue now (its bound is passed, or a body arrived so
much larger than its consumer was made for that the consumer's prefetch of
such bodies would pass it); :meth:`ByteBudget.settled` for each
ack or reject: the queues that may be consumed again (what they hold fell
to half their bound) or, once all they held is settled, with a prefetch at
least twice the one they have (widened between windows, never in the
middle of one: the messages of a window are all taken before the next
window's).
A body larger than any seen before, arriving when the broker has already
sent a prefetch sized for small ones, passes the bound by what was sent;
from then on the prefetch fits the larger size.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

__all__ = ["ByteBudget"]

FORGET = 0.995      # the largest recent body, forgotten by this factor a delivery


class ByteBudget:
    """Unacked bytes by queue against each queue's bound (see the module doc)."""

    def __init__(self, bounds: int | Mapping[str, int] | None, *, assumed: int = 1 << 20):
        self.bounds = bounds
        self.assumed = assumed
        self._sizes: dict[int, tuple[str, int]] = {}   # delivery tag → queue, bytes
        self._bytes: dict[str, int] = {}
        self._largest: dict[str, float] = {}
        self._sized_for: dict[str, float] = {}         # the body size a consumer was made for
        self._prefetch: dict[str, int] = {}            # the prefetch it was made with
        self.stopped: set[str] = set()                 # queues not consumed for their bytes

    def bound(self, queue: str) -> int | None:
        bounds = self.bounds
        return bounds.get(queue) if isinstance(bounds, Mapping) else bounds

    def held(self, queue: str) -> int:
        """Bytes of ``queue``'s bodies delivered and not yet settled."""
        return self._bytes.get(queue, 0)

    def reset(self) -> None:
        """A new connection: nothing is held any more (the broker took it all back)."""
        self._sizes.clear()
        self._bytes.clear()
        self._sized_for.clear()
        self._prefetch.clear()
        self.stopped.clear()

    def _fitting(self, queue: str, configured: int, consumers: int) -> int:
        bound = self.bound(queue)
        if bound is None:
            return configured
        size = max(self._largest.get(queue, self.assumed), 1.0)
        room = max(bound - self.held(queue), 0)
        return max(1, min(configured, int(room // (size * max(consumers, 1)))))

    def prefetch(self, queue: str, configured: int, consumers: int = 1) -> int:
        """The prefetch of a consumer of ``queue`` made now (``configured`` at most)."""
        fit = self._fitting(queue, configured, consumers)
        self._sized_for[queue] = self._largest.get(queue, self.assumed)
        self._prefetch[queue] = fit
        return fit

    def delivered(self, tag: int, queue: str, size: int) -> bool:
        """Count a delivery; True: stop consuming ``queue`` now."""
        bound = self.bound(queue)
        if bound is None:
            return False
        self._sizes[tag] = (queue, size)
        self._bytes[queue] = self.held(queue) + size
        self._largest[queue] = max(float(size), self._largest.get(queue, size) * FORGET)
        if queue in self.stopped:
            return False
        # past the bound, or a body so large that what the consumer may still be sent at
        # its prefetch would pass it
        made = self._prefetch.get(queue)
        if self.held(queue) > bound or (
                size > self._sized_for.get(queue, self.assumed)
                and made is not None and made * size > bound):
            self.stopped.add(queue)
            return True
        return False

    def settled(self, tags: Iterable[int], configured: Mapping[str, int] | int,
                consumers: Mapping[str, int] | None = None) -> list[str]:
        """Forget settled deliveries; the queues to consume again, or to consume with a
        prefetch twice as large as the one they have (``configured``: each queue's
        prefetch as configured)."""
        touched = set()
        for tag in tags:
            found = self._sizes.pop(tag, None)
            if found is not None:
                self._bytes[found[0]] -= found[1]
                touched.add(found[0])
        again = []
        for queue in touched:
            bound = self.bound(queue)
            assert bound is not None
            wanted = configured.get(queue, 1000) if isinstance(configured, Mapping) \
                else configured
            count = (consumers or {}).get(queue, 1)
            if queue in self.stopped:
                if self.held(queue) <= bound // 2:
                    self.stopped.discard(queue)
                    again.append(queue)
            elif self.held(queue) == 0 \
                    and self._fitting(queue, wanted, count) >= 2 * self._prefetch.get(queue, wanted):
                again.append(queue)   # widened between windows: nothing of it is in flight
        return again
