"""The process's garbage-collector settings for a long-running service.

Theory of operation.  Under load a service holds a million or more young
containers at any moment: prefetched deliveries, records on the blackboards,
outgoing messages, each living a second or two.  CPython's collector walks
the young ones at every collection and again as they age, holding the
interpreter lock every pipeline thread needs: with automatic collection
(thresholds raised to 50,000, batches run with the collector paused) the
collections of one 100,000-message pass took 1.4-2.0 s of its 14 s, each
20-200 ms.  The batches' data make no reference cycles (JSON documents,
lists of records), so refcounting frees them; what does make cycles (py4j's
proxies, exceptions with their frames) is little.  (An interpreter kept its
activity table as bound methods, a cycle that held its blackboard and every
record on it: 110,000 objects of garbage per 10 s at 1,000 msg/s, and a
collection of 160-230 ms.  No longer: ``engine._activities.RUNNERS``.)  So the service turns
automatic collection off and collects everything (not what was alive at
start: modules, Spark's proxies, the workflows, frozen out of every
collection) on a schedule of its own, :data:`COLLECT_EVERY` seconds apart
or more: a full collection under a backlog takes 0.5-0.7 s (a million live
objects), and the next one then waits long enough to keep the collector
under :data:`MAX_SHARE` of the time.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["COLLECT_EVERY", "Collector", "service_gc"]

log = logging.getLogger(__name__)

COLLECT_EVERY = 10.0  # seconds between the service's collections, at least
MAX_SHARE = 0.02      # of the time: a collection that took t waits t / MAX_SHARE for the next

_FROZEN = False


@contextmanager
def service_gc() -> Iterator[None]:
    """Around a service's run: what is alive at the first run frozen out of every
    collection (once per process), automatic collection off until the run ends (a
    :class:`Collector` collects meanwhile).  A process that turned automatic collection
    off itself keeps it so."""
    global _FROZEN
    if not _FROZEN:
        _FROZEN = True
        gc.collect()
        gc.freeze()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class Collector:
    """Collects the cyclic garbage every ``every`` seconds (the service's loop calls
    :meth:`tick`)."""

    def __init__(self, every: float = COLLECT_EVERY):
        self.every = every
        self._next = every
        self._last = time.monotonic()
        #: collections made, and the seconds they took
        self.collections = 0
        self.seconds = 0.0

    def tick(self) -> None:
        now = time.monotonic()
        if now - self._last < self._next:
            return
        started = time.perf_counter()
        found = gc.collect()
        took = time.perf_counter() - started
        self._last = time.monotonic()
        self._next = max(self.every, took / MAX_SHARE)
        self.collections += 1
        self.seconds += took
        log.debug("garbage collection: %d object(s) freed in %.3f s; the next in %.0f s", found,
                  took, self._next)
