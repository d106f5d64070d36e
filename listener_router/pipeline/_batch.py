"""The batch: its groups (one per workflow), the gathering hand-off, and its size policy.

:class:`Gathering` is the queue between the gather stage and the execute
stage: the gather stage adds chunks to the batch being gathered, the
service's loop takes it (:meth:`Gathering.take`) once it is full or its
first message has waited long enough, and hands it to the execute stage.
How full is full, and how long is long enough, is :class:`BatchSizing`'s
to say.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from blackboard import Blackboard
from listener_router.pipeline._report import BatchObserver, BatchReport
from listener_router.pipeline._work import Work

__all__ = ["Batch", "BatchSizing", "Gathering", "Group"]


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


class BatchSizing(BatchObserver):
    """How many messages a batch takes (``size``) and how long its first message waits
    for the rest (``max_wait``, seconds).

    This policy is fixed: the listener rules' largest ``batch_size`` and
    ``max_wait_ms``.  (A batch still grows to ``size`` only while messages
    are waiting, so it is small under light load.)  An adaptive policy
    changes ``size`` as it learns from each finished batch's report: it is a
    :class:`BatchObserver`, registered as one by the service.
    """

    def __init__(self, size: int, max_wait: float):
        self.size = size
        self.max_wait = max_wait


class Gathering:
    """The batch being gathered: filled by the gather stage, taken by the service's loop.

    The gather stage holds :attr:`lock` while it adds a chunk (its
    blackboards are in use); :meth:`take` waits for it, so a batch is only
    ever taken between chunks.
    """

    def __init__(self, sizing: BatchSizing):
        self.sizing = sizing
        self.lock = threading.Condition()
        self.batch: Batch | None = None

    def room(self) -> int:
        """Messages the batch being gathered can still take (caller holds the lock)."""
        return self.sizing.size - (len(self.batch.works) if self.batch is not None else 0)

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
                    sizing = self.sizing
                    due = batch.opened + sizing.max_wait
                    if now or len(batch.works) >= sizing.size or time.monotonic() >= due:
                        self.batch = None
                        batch.report.size_limit = sizing.size
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
        """The gather stage added a chunk (caller holds the lock)."""
        self.lock.notify_all()
