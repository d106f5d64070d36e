"""Leader tasks: periodic work that only the cluster's leader does.

A :class:`LeaderTask` says what (``run``) and how often (``every``);
:class:`LeaderTasks` runs the due ones on a thread of its own
(``chalk-leader``: a long task never holds up the pipeline) while
:attr:`Membership.is_leader <listener_router.cluster.Membership.is_leader>`
holds.  Each task does its work in :meth:`LeaderTask.fenced` transactions,
so a process that lost leadership while frozen is refused
(:class:`~listener_router.NotLeader`) instead of doing leader work.  Today's
maintenance is four tasks: expired leases, orphaned outbox batches,
retention of the inbox and outbox, members long dead (failing over a member whose heartbeat lapsed
is the membership's own, at the heartbeat).
A task that fails is logged and tried again at its next turn; it never stops
the service or the other tasks.  Plug-ins add tasks of their own
(the scheduler, the job log's retention).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager

from listener_router._errors import InfrastructureError, NotLeader
from listener_router.broker import OutMessage
from listener_router.cluster._membership import LeaderTransaction, Membership
from listener_router.store import ServiceStore, unavailable

__all__ = ["LeaderTask", "LeaderTasks", "ExpiredLeases", "OrphanedOutbox", "Retention",
           "ForgetDeadMembers", "MAINTAIN_EVERY", "ORPHAN_AGE"]

log = logging.getLogger(__name__)

MAINTAIN_EVERY = 30.0     # seconds between rounds of today's maintenance tasks
ORPHAN_AGE = 120.0        # an unsent outbox batch this old has lost its inputs' redelivery


class LeaderTask:
    """Work the leader does every ``every`` seconds; ``run`` returns how much it did.

    Do the work in ``with self.fenced() as tx:`` (rows with
    ``tx.connection``, messages and events with ``tx.publish``/``tx.emit``):
    it commits only while this process still leads.
    """

    name = "task"
    every = MAINTAIN_EVERY
    membership: Membership | None = None     # set when registered with LeaderTasks

    def run(self) -> int:
        return 0

    def fenced(self) -> AbstractContextManager[LeaderTransaction]:
        """A transaction that commits only while this process leads
        (:meth:`Membership.fenced`); raises :class:`~listener_router.NotLeader`."""
        if self.membership is None:
            raise RuntimeError(f"leader task {self.name} is not registered with LeaderTasks")
        return self.membership.fenced()


class ExpiredLeases(LeaderTask):
    """Drop record leases whose holder did not renew them in time."""

    name = "expired_leases"

    def __init__(self, store: ServiceStore):
        self.store = store

    def run(self) -> int:
        with self.fenced() as tx:
            return self.store.sql.drop_leases(tx.connection, expired_before=time.time())


class OrphanedOutbox(LeaderTask):
    """Publish outbox batches committed long ago and never confirmed sent (their inputs
    were acked by a process that died before publishing, or will never come again)."""

    name = "orphans"

    def __init__(self, store: ServiceStore, publish: Callable[[dict[str, list[OutMessage]]], None],
                 age: float = ORPHAN_AGE):
        self.store = store
        self.publish = publish
        self.age = age

    def run(self) -> int:
        with self.fenced() as tx:
            orphans = self.store.outbox.unsent(older_than=time.time() - self.age,
                                               conn=tx.connection)
        count = sum(len(messages) for messages in orphans.values())
        if orphans:
            log.warning("publishing %d orphaned outbox message(s) of %d batch(es)", count,
                        len(orphans))
            self.publish(orphans)
        return count


class Retention(LeaderTask):
    """Drop sent outbox batches, inbox rows and cancellations older than ``retention_days``
    (a feature with history of its own drops it with a task of its own)."""

    name = "retention"

    def __init__(self, store: ServiceStore, days: float):
        self.store = store
        self.days = days

    def run(self) -> int:
        with self.fenced() as tx:
            purged = self.store.outbox.purge(self.days * 86400.0, conn=tx.connection)
        with self.store.writes, unavailable():
            return purged + self.store.cancellations.purge(self.days * 86400.0)


class ForgetDeadMembers(LeaderTask):
    """Drop the heartbeat rows of members silent for an hour."""

    name = "forgotten_members"

    def __init__(self, membership: Membership):
        self.membership = membership

    def run(self) -> int:
        assert self.membership is not None
        return self.membership.forget_dead()


class LeaderTasks:
    """The leader's tasks, each run when due while this process leads (see module doc)."""

    def __init__(self, membership: Membership, tasks: Iterable[LeaderTask] = ()):
        self.membership = membership
        self._tasks: list[tuple[LeaderTask, list[float]]] = []
        self._lock = threading.Lock()
        self._running = threading.Lock()   # one task at a time (the thread, or run_all)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        for task in tasks:
            self.add(task)

    def start(self) -> LeaderTasks:
        """Run the due tasks on thread ``chalk-leader`` until :meth:`stop`."""
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="chalk-leader", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.wait(self._next_due()):
            self.tick()

    def _next_due(self) -> float:
        """Seconds until the next task is due (at least 10 ms, at most 1 s)."""
        now = time.monotonic()
        with self._lock:
            waits = [last[0] + task.every - now for task, last in self._tasks]
        return min(1.0, max(0.01, min(waits, default=1.0)))

    def add(self, task: LeaderTask) -> None:
        """Run ``task`` every ``task.every`` seconds from now on, while leader."""
        task.membership = self.membership
        with self._lock:
            self._tasks.append((task, [time.monotonic()]))

    @property
    def tasks(self) -> list[LeaderTask]:
        return [task for task, _last in self._tasks]

    def tick(self) -> None:
        """Run the tasks that are due, if this process leads (the leader thread calls this)."""
        now = time.monotonic()
        due = []
        with self._lock:
            for task, last in self._tasks:
                if now - last[0] >= task.every:
                    last[0] = now
                    due.append(task)
        if due and self.membership.is_leader:
            with self._running:
                for task in due:
                    self._run(task)

    def run_all(self) -> dict[str, int]:
        """Run every task now, leader or not; what each did, by name (failed ones absent)."""
        done: dict[str, int] = {}
        with self._running:
            for task in self.tasks:
                count = self._run(task)
                if count is not None:
                    done[task.name] = count
        return done

    @staticmethod
    def _run(task: LeaderTask) -> int | None:
        try:
            return task.run()
        except NotLeader as e:
            log.warning("leader task %s refused: %s", task.name, e)
        except InfrastructureError as e:
            log.warning("leader task %s failed, trying again later: %s", task.name, e)
        except Exception:  # a task's bug: logged, never the service's end
            log.exception("leader task %s failed, trying again later", task.name)
        return None
