"""Runners without Spark: on the service's own worker processes, or in the caller's thread.

:class:`ProcessRunner` runs each batch on worker processes of this process's
own (``engine._pool.ServiceWorkers``: a supervisor process it starts, whose
workers connect back and take chunks, as Spark's warm workers do).  Nothing
of a pipelet runs in the caller's process: one that hangs past
``batch_timeout`` or ends its process (``os._exit``, a segfault, the
out-of-memory killer) costs its worker, which its supervisor kills or reaps
and forks again in milliseconds; the chunk's instances are rerun one by one,
at once, each with a deadline of its own (``engine._isolation``), so that the
culprit fails with the reason and the others complete.  This is where the
service runs ``runner = "local"`` and the small batches it keeps off Spark.

:class:`LocalRunner` runs a batch in the caller's thread, with the semantics
of one Spark partition (records make the same round trip as on Spark, JSON
and blobs, so a value that cannot travel fails here too, and a run works on
copies): for tests, notebooks and programs that embed the engine.  It bounds
nothing: a pipelet that hangs or crashes does so in the caller's process.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from engine._isolation import Attempt, Budget, Outcome, run_attempts
from engine._jobs import ChunkCosts, pool_attempts
from engine._pool import ServiceWorkers, Unavailable, service_workers
from engine._progress import stoppable
from engine._results import InstanceResult, apply_outputs, inputs_for, not_run
from engine._specs import Workflow
from engine._worker import InstanceInput, InstanceOutput, frozen_heap, run_instances

__all__ = ["LocalRunner", "ProcessRunner"]

log = logging.getLogger(__name__)

SettleEarly = Callable[[list[InstanceResult]], None]


class LocalRunner:
    """Runs a batch in the caller's thread, with the semantics of one Spark partition
    (module doc).  Unbounded: for tests and embedding, not for a service."""

    def __init__(self) -> None:
        self._cancelled: frozenset[str] = frozenset()
        self._lock = threading.Lock()

    def cancel(self, ids: Sequence[str]) -> None:
        """The messages of these records were cancelled: a run that has them ends their
        instances before its next pipelet call (``cancelled``).  Until :meth:`uncancel`."""
        with self._lock:
            self._cancelled = self._cancelled | frozenset(ids)

    def uncancel(self, ids: Sequence[str]) -> None:
        """The runs of these records are over (or cancelled no more)."""
        with self._lock:
            self._cancelled = self._cancelled - frozenset(ids)

    def _among(self, ids: Sequence[str]) -> set[str]:
        cancelled = self._cancelled  # replaced, never changed: no lock to read
        return set(cancelled.intersection(ids)) if cancelled else set()

    def run(self, workflow: Workflow, blackboard: Any, instances: list[list[str]],
            **_options: Any) -> list[InstanceResult]:
        """Run ``workflow`` for each instance (a list of record IDs on ``blackboard``)."""
        if not instances:
            return []
        with stoppable(self._among), frozen_heap():
            rows = inputs_for(blackboard, list(enumerate(instances)))
            return apply_outputs(blackboard, run_instances(workflow, rows))


class ProcessRunner:
    """Runs each batch on worker processes of this process's own (module doc).

    Args:
        workers: worker processes (default: the cores).
        batch_timeout: seconds a chunk may run before its worker is killed and its
            instances isolated, each then with as long.
        isolation_budget: seconds a batch may spend isolating; suspects not
            started by then fail as not run (to be retried).
        pool: the workers to use (made and started when None; closed with the runner).
        shared: with no ``pool``, take this process's pool of that many workers, kept up
            for the next runner (closing the runner leaves it up).
    """

    def __init__(self, *, workers: int | None = None, batch_timeout: float = 30.0,
                 isolation_budget: float = 900.0, pool: ServiceWorkers | None = None,
                 shared: bool = False) -> None:
        self.batch_timeout = float(batch_timeout)
        self.isolation_budget = float(isolation_budget)
        self.pool = pool if pool is not None else service_workers(
            workers or os.cpu_count() or 2, shared=shared)
        self._own = pool is None and not shared
        self.costs = ChunkCosts()

    def cancel(self, ids: Sequence[str]) -> None:
        """The messages of these records were cancelled while they run: their instances end
        before the next pipelet call (``cancelled``).  Until :meth:`uncancel`."""
        self.pool.cancel(ids)

    def uncancel(self, ids: Sequence[str]) -> None:
        self.pool.uncancel(ids)

    def healthy(self) -> bool:
        """False once its workers are closed (a start that failed is not: they are tried
        again, and what they could not run meanwhile is deferred)."""
        return not self.pool._closed

    def close(self) -> None:
        """Stop the workers (when this runner made them)."""
        if self._own:
            self.pool.close()

    def run(self, workflow: Workflow, blackboard: Any, instances: list[list[str]], *,
            settle_early: SettleEarly | None = None, suspect: bool = False, priority: int = 0,
            within: float | None = None) -> list[InstanceResult]:
        """Run ``workflow`` for each instance (a list of record IDs on ``blackboard``).

        When the batch needs isolating, the results known while suspects
        still run are applied onto ``blackboard`` and handed to
        ``settle_early`` on this thread; the list returned holds only the
        others.  ``suspect``: isolate from the start (the batch broke a run
        before).  ``priority``: its chunks go before those of lower ones;
        ``within``: cut into chunks that each end within about that many
        seconds (a higher lane waits for a worker no longer).  Instances the
        workers could not begin (they did not start) end as ``not_run``.
        """
        if not instances:
            return []
        with frozen_heap():
            rows = inputs_for(blackboard, list(enumerate(instances)))
        outputs = self.run_rows(workflow, rows, settle_early=(
            None if settle_early is None else
            lambda outs: settle_early(_applied(blackboard, outs))),
            suspect=suspect, priority=priority, within=within)
        with frozen_heap():
            return sorted(apply_outputs(blackboard, outputs), key=lambda r: r.index)

    def run_rows(self, workflow: Workflow, rows: list[InstanceInput], *,
                 settle_early: Callable[[list[InstanceOutput]], None] | None = None,
                 suspect: bool = False, priority: int = 0,
                 within: float | None = None) -> list[InstanceOutput]:
        """:meth:`run` over exported rows; the outputs not settled early."""
        first: list[Attempt] = []
        if not suspect:
            try:
                first = list(self.attempts(workflow, rows, priority=priority, within=within))
            except Unavailable as e:
                return [not_run(row, f"not run: {e}") for row in rows]

        def rerun(suspects: list[InstanceInput]) -> list[Attempt]:
            log.warning("workflow %s: isolating %d instance(s) on the service workers, each "
                        "alone, at most %g s each", workflow.name, len(suspects),
                        self.batch_timeout, extra={"workflow": workflow.name})
            try:
                return list(self.attempts(workflow, suspects, priority=priority, first=False))
            except Unavailable as e:
                return [_NotRun(row, f"not run: {e}") for row in suspects]

        return run_attempts(first, rerun=rerun, capacity=1 << 30,
                            budget=Budget(self.isolation_budget), settle=settle_early,
                            suspects=rows if suspect else [])

    def attempts(self, workflow: Workflow, rows: list[InstanceInput], *, priority: int = 0,
                 within: float | None = None, first: bool = True) -> list[Attempt]:
        """``rows`` on the workers (a first run in chunks, else each alone), submitted."""
        parts = self.costs.parts(workflow.name, rows, self.pool.slots, within)
        return list(pool_attempts(self.pool, workflow, rows, limit=self.batch_timeout,
                                  priority=priority, first=first, parts=parts,
                                  measured=self.costs.measured(workflow.name)))


def _applied(blackboard: Any, outputs: list[InstanceOutput]) -> list[InstanceResult]:
    with frozen_heap():
        return apply_outputs(blackboard, outputs)


class _NotRun:
    """A suspect the workers could not take: it ends at once as not run."""

    def __init__(self, row: InstanceInput, reason: str):
        self.row = row
        self.reason = reason
        self.deadline: float | None = None
        self.done: Future[None] = Future()
        self.done.set_result(None)

    def start(self) -> None:
        pass

    def waiting(self) -> bool:
        return False

    def poll(self, now: float) -> Outcome:
        return Outcome([not_run(self.row, self.reason)])

    def abandon(self, reason: str) -> list[InstanceOutput]:
        return [not_run(self.row, reason)]
