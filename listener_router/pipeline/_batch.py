"""The batch: its groups (one per workflow), the gathering hand-off, and its size policy.

:class:`Gathering` is the queue between the gather stage and the execute
stage: the gather stage adds chunks to the batch being gathered, the
service's loop takes it (:meth:`Gathering.take`) when :class:`BatchSizing`
says it is ready (full, or waited long enough; the default policy,
``_sizing.AdaptiveSizing``, also when nothing more is waiting) and hands it
to the execute stage.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from blackboard import Blackboard
from listener_router.pipeline._report import BatchObserver, BatchReport
from listener_router.pipeline._work import Work

__all__ = ["Batch", "BatchSizing", "Gathering", "Group", "LOCAL_LIMIT", "READY_POLL"]

LOCAL_LIMIT = 400         # records below which a batch may run on the service's workers
READY_POLL = 0.01         # seconds between looks at a batch that is not ready


@dataclass(eq=False)
class Group:
    """One workflow's messages of a batch, loaded on a blackboard of their own."""

    name: str
    bb: Blackboard                           # used by one thread at a time
    works: list[Work] = field(default_factory=list)
    batch: Batch | None = None


@dataclass(eq=False)
class Batch:
    """Messages gathered together; each workflow's part is a :class:`Group`."""

    opened: float = field(default_factory=time.monotonic)
    started: float = field(default_factory=time.perf_counter)
    works: list[Work] = field(default_factory=list)     # every message, for the log line
    groups: dict[str, Group] = field(default_factory=dict)
    pending: int = 0                   # parts not yet settled (its run, each group)
    finishing: int = 0                 # jobs of it the finish stage has not done yet
    settled: bool = False              # every part settled (``pending`` reached 0)
    report: BatchReport = field(default_factory=BatchReport)
    lock: threading.Lock = field(default_factory=threading.Lock)
    lane: str = ""                     # the queue of the lane it was gathered in
    dispatched: float = 0.0            # monotonic, handed to a runner thread
    expected: float = 0.0              # seconds its run should take (the sizing's guess)
    priority: int = 0                  # its lane's: its commit and publish go before lower ones'


class BatchSizing(BatchObserver):
    """How many messages a batch takes (``size``) and how long its first message waits
    for the rest (``max_wait``, seconds).

    This base policy is fixed: a batch is ready when it holds ``size``
    messages or its first one has waited ``max_wait``.  The service's
    default, ``_sizing.AdaptiveSizing``, changes ``size`` as it learns from
    each finished batch's report (a sizing is a :class:`BatchObserver`,
    registered as one by the service) and takes a batch at once when nothing
    more is waiting.
    """

    def __init__(self, size: int, max_wait: float):
        self.size = size
        self.max_wait = max_wait

    def ready(self, messages: int, age: float, waiting: int) -> bool:
        """Whether the batch being gathered is taken now: it holds ``messages``, its first
        one has waited ``age`` seconds, and ``waiting`` more messages wait for a batch (ready
        in the broker or not yet gathered).  Asked while the runner is free."""
        return messages >= self.size or age >= self.max_wait

    def local_limit(self, workflow: str) -> int:
        """Records below which a batch of ``workflow`` may run on the service's workers
        (when its pipelets allow it)."""
        return LOCAL_LIMIT

    def expected(self, batch: Batch) -> float:
        """Seconds ``batch``'s run should take (0: no guess)."""
        return 0.0


class Gathering:
    """The batch being gathered: filled by the gather stage, taken by the service's loop.

    The gather stage holds :attr:`lock` while it adds a chunk (its
    blackboards are in use); :meth:`take` waits for it, so a batch is only
    ever taken between chunks.
    """

    def __init__(self, sizing: BatchSizing, waiting: Callable[[], int] = lambda: 0,
                 on_added: Callable[[], None] | None = None):
        self.sizing = sizing
        self.waiting = waiting  # messages ready in the broker or not yet gathered
        self.on_added = on_added  # told (under the lock) when a chunk was added
        self.cap: int | None = None   # messages a batch takes at most whatever the sizing says
        self.lock = threading.Condition()
        self.batch: Batch | None = None

    def limit(self) -> int:
        """Messages a batch takes at most now."""
        size = self.sizing.size
        return size if self.cap is None else min(size, self.cap)

    def pending(self) -> bool:
        """Whether messages are gathered, or ready in the broker, for a batch (no lock: a
        glance)."""
        batch = self.batch
        return bool(batch is not None and batch.works) or self.waiting() > 0

    def room(self) -> int:
        """Messages the batch being gathered can still take (caller holds the lock)."""
        return self.limit() - (len(self.batch.works) if self.batch is not None else 0)

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
        """The batch once the sizing says it is ready (or at once when ``now``); None when
        none is ready within ``timeout``."""
        deadline = time.monotonic() + timeout
        with self.lock:
            while True:
                batch = self.batch
                wake = deadline
                if batch is not None and batch.works:
                    sizing = self.sizing
                    age = time.monotonic() - batch.opened
                    if now or sizing.ready(len(batch.works), age, self.waiting()):
                        self.batch = None
                        batch.report.size_limit = sizing.size
                        self.lock.notify_all()
                        return batch
                    # Readiness may turn on what is waiting, which changes without a notify.
                    wake = min(deadline, time.monotonic() + READY_POLL)
                remaining = wake - time.monotonic()
                if remaining <= 0 and wake == deadline:
                    return None
                self.lock.wait(max(remaining, 0.001))

    def take_ready(self) -> tuple[Batch | None, float | None]:
        """The batch if the sizing says it is ready now, else (None, seconds after which to
        ask again: when its age will make it ready, or ``READY_POLL`` while readiness may turn
        on what is waiting; None when there is nothing to wait for)."""
        with self.lock:
            batch = self.batch
            if batch is None or not batch.works:
                return None, None
            sizing = self.sizing
            age = time.monotonic() - batch.opened
            if len(batch.works) >= self.limit() or \
                    sizing.ready(len(batch.works), age, self.waiting()):
                self.batch = None
                batch.report.size_limit = sizing.size
                self.lock.notify_all()
                return batch, None
            return None, max(0.001, min(READY_POLL, sizing.max_wait - age))

    def added(self) -> None:
        """The gather stage added a chunk (caller holds the lock)."""
        self.lock.notify_all()
        if self.on_added is not None:
            self.on_added()
