"""The pipeline's shared state: what is in flight, and the batch being gathered.

Theory of operation.  Three threads work on three batches at once:

- the *stage* thread gathers deliveries in small chunks, parses them, checks
  the inbox, loads their records onto the blackboards of the batch being
  gathered (one blackboard per workflow) and writes the messages'
  attributes there;
- the *runner* thread (the one that called ``Service.run``) takes that batch
  when it is ready (full, or its first message older than the rule's
  ``max_wait_ms``) and runs the workflows;
- the *committer* thread routes the results and commits them, then the
  *finisher* publishes and acks, as before.

So while Spark runs batch k, batch k+1 is gathered and loaded and batch
k-1 is committed and published.  The batch grows while the runner is busy,
up to the batch size, so a slow run makes the next batch larger instead of
leaving messages waiting behind small batches.

A message or record is *in flight* from the moment the stage takes it up
until it is settled (committed, failed or held) and its records have left
the blackboard.  A message or record in flight in an earlier batch makes the
stage wait: loading it now would read the version that batch is about to
replace, and the inbox would not yet show that batch's commit.  One already
in the batch being gathered is deferred to a later batch, as before.  While
records are in flight (loaded ahead of their run, or waiting for their
commit) one thread renews their leases.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["InFlight", "Batch", "Group", "Gathering"]

log = logging.getLogger(__name__)


_GC_TUNED = False


def tune_gc() -> None:
    """Set the process's garbage collector for a long-running service (once per process).

    A batch keeps tens of thousands of objects alive for a second or two
    (prefetched deliveries, records on the blackboards, outgoing messages).
    With CPython's default thresholds (700, 10, 10) every few messages a
    collection walks them again, holding the GIL that every pipeline thread
    needs: measured at ~1.4 s per 40,000 messages.  Here what is alive at
    start (modules, Spark's proxies, the workflows) is frozen out of all
    later collections, and the youngest generation is collected after
    50,000 allocations instead of 700: ~0.2 s per 40,000 messages.  Cyclic
    garbage is still collected, later.
    """
    global _GC_TUNED
    if _GC_TUNED:
        return
    _GC_TUNED = True
    gc.collect()
    gc.freeze()
    gen0, gen1, gen2 = gc.get_threshold()
    if gen0:  # 0: the application turned automatic collection off; leave that be
        gc.set_threshold(max(gen0, 50_000), max(gen1, 20), gen2)


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

    def holders(self, keys: Iterable[Hashable]) -> set[object]:
        held = self._held
        with self._cond:
            return {held[key] for key in keys if key in held}

    def held_by(self, keys: Iterable[Hashable], holder: object) -> set[Hashable]:
        """Those of ``keys`` that ``holder`` holds."""
        held = self._held
        with self._cond:
            return {key for key in keys if held.get(key) is holder}

    def reserve(self, keys: Iterable[Hashable], holder: object) -> None:
        with self._cond:
            for key in keys:
                self._held[key] = holder

    def release(self, keys: Iterable[Hashable]) -> None:
        with self._cond:
            pop = self._held.pop
            for key in keys:
                pop(key, None)
            self._cond.notify_all()

    def wait_free(self, keys: list[Hashable], besides: object, stop: threading.Event) -> bool:
        """Wait until no batch but ``besides`` holds any of ``keys``; False when stopped."""
        held = self._held
        with self._cond:
            while any(held.get(key, besides) is not besides for key in keys):
                if stop.is_set():
                    return False
                self._cond.wait(0.1)
        return True

    def __len__(self) -> int:
        with self._cond:
            return len(self._held)


@dataclass(eq=False)
class Group:
    """One workflow's messages of a batch, loaded on a blackboard of their own."""

    name: str
    bb: Any                                  # the blackboard (one thread at a time)
    works: list[Any] = field(default_factory=list)
    batch: Batch | None = None


@dataclass(eq=False)
class Batch:
    """Messages gathered together; each workflow's part is a :class:`Group`."""

    opened: float = field(default_factory=time.monotonic)
    started: float = field(default_factory=time.perf_counter)
    works: list[Any] = field(default_factory=list)      # every message, for the log line
    groups: dict[str, Group] = field(default_factory=dict)
    pending: int = 0                                    # groups not yet settled
    outcome: Counter[str] = field(default_factory=Counter)  # settled messages by state
    lock: threading.Lock = field(default_factory=threading.Lock)


class Gathering:
    """The batch being gathered: filled by the stage thread, taken by the runner thread.

    The stage holds :attr:`lock` while it adds a chunk (its blackboards are
    in use); :meth:`take` waits for it, so a batch is only ever taken between
    chunks.
    """

    def __init__(self, size: int, max_wait: float):
        self.size = size
        self.max_wait = max_wait
        self.lock = threading.Condition()
        self.batch: Batch | None = None

    def room(self) -> int:
        """Messages the batch being gathered can still take (caller holds the lock)."""
        return self.size - (len(self.batch.works) if self.batch is not None else 0)

    def current(self) -> Batch:
        """The batch being gathered, opened now when there is none (caller holds the lock)."""
        if self.batch is None:
            self.batch = Batch()
        return self.batch

    def wait_for_room(self, stop: threading.Event) -> bool:
        with self.lock:
            while self.room() <= 0:
                if stop.is_set():
                    return False
                self.lock.wait(0.1)
        return True

    def take(self, timeout: float, *, now: bool = False) -> Batch | None:
        """The batch once it is full or its first message waited ``max_wait`` (or at once
        when ``now``); None when none is ready within ``timeout``."""
        deadline = time.monotonic() + timeout
        with self.lock:
            while True:
                batch = self.batch
                if batch is not None and batch.works:
                    due = batch.opened + self.max_wait
                    if now or len(batch.works) >= self.size or time.monotonic() >= due:
                        self.batch = None
                        self.lock.notify_all()
                        return batch
                    wake = min(deadline, due)
                else:
                    wake = deadline
                remaining = wake - time.monotonic()
                if remaining <= 0 and wake == deadline:
                    return None
                self.lock.wait(max(remaining, 0.001))

    def added(self) -> None:
        """The stage added a chunk (caller holds the lock)."""
        self.lock.notify_all()
