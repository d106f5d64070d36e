"""The local runner: a batch in this process, with the semantics of one Spark partition.

Records make the same round trip as on Spark (JSON and blobs), so a value
that cannot travel fails here too, and a run works on copies: never on the
caller's blackboard, which only sees the outcomes it applies.

With a ``batch_timeout`` a run is bounded: it goes on a daemon thread of its
own, watched (``engine._progress``: the thread notes each pipelet call), and
the caller waits at most that long.  A thread cannot be stopped, so a run
past it is *abandoned*: it goes on in the process until its pipelet returns,
and nothing it does is ever applied.  Then, as on Spark, each instance of
the batch runs again alone on a thread of its own with a deadline of its own
(``engine._isolation``), and only the one(s) that run past it fail, naming
the pipelet call they were in; outcomes are settled as soon as they are
known (a rerun that crashes would take the process, and what it had not
settled, with it).  Or, with ``isolate=False``, the run raises
:class:`~engine._errors.RunTimedOut` for the caller to run the batch
elsewhere.  What cannot be bounded here: a pipelet that ends the process
(``os._exit``, a crash) ends it.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from engine._errors import RunTimedOut
from engine._isolation import Attempt, Budget, Outcome, run_attempts
from engine._progress import PipeletCall, stoppable, timeout_reason, watched
from engine._results import InstanceResult, apply_outputs, failed, inputs_for
from engine._specs import Workflow
from engine._worker import InstanceInput, InstanceOutput, frozen_heap, run_instances

__all__ = ["AT_ONCE", "LocalRunner"]

log = logging.getLogger(__name__)

AT_ONCE = 4  # instances rerun at once on threads of their own while isolating

SettleEarly = Callable[[list[InstanceResult]], None]
Watch = Callable[[PipeletCall], None]


class _Watched:
    """``run_instances`` over ``rows`` on a daemon thread of its own, its last pipelet call noted."""

    def __init__(self, workflow: Workflow, rows: list[InstanceInput], name: str,
                 watch: Watch | None = None):
        self.rows = rows
        self.watch = watch
        self.call: PipeletCall | None = None
        self.outputs: list[InstanceOutput] | None = None
        self.error: BaseException | None = None
        self.started = 0.0
        self.done: Future[None] = Future()
        context = contextvars.copy_context()  # the runner's cancellations (LocalRunner.run)
        self.thread = threading.Thread(target=context.run, args=(self._run, workflow),
                                       name=name, daemon=True)

    def _run(self, workflow: Workflow) -> None:
        def tell(call: PipeletCall) -> None:
            self.call = call
            if self.watch is not None:
                self.watch(call)

        try:
            with watched(tell):
                self.outputs = run_instances(workflow, self.rows)
        except BaseException as e:  # the caller's to raise
            self.error = e
        finally:
            self.done.set_result(None)

    def start(self) -> None:
        self.started = time.monotonic()
        self.thread.start()

    def result(self) -> list[InstanceOutput]:
        if self.error is not None:
            raise self.error
        assert self.outputs is not None
        return self.outputs

    def records(self) -> list[str]:
        return [rid for row in self.rows for rid in row.ids]


class _ThreadAttempt:
    """One suspect on a thread of its own, given up past ``seconds`` (``engine._isolation``)."""

    def __init__(self, workflow: Workflow, row: InstanceInput, seconds: float,
                 watch: Watch | None):
        self.row = row
        self.seconds = seconds
        self.run = _Watched(workflow, [row], f"chalk-isolate-{row.index}", watch)
        self.done = self.run.done
        self.deadline: float | None = None

    def start(self) -> None:
        self.run.start()
        self.deadline = self.run.started + self.seconds

    def waiting(self) -> bool:
        return False

    def poll(self, now: float) -> Outcome | None:
        run = self.run
        if run.thread.is_alive():
            if self.deadline is None or now <= self.deadline:
                return None
            reason = timeout_reason(run.call, self.seconds, self.row.ids)
            log.warning("instance %d: %s; abandoned (its thread runs on)", self.row.index, reason)
            return Outcome([failed(self.row, reason)])
        try:
            return Outcome(run.result())
        except Exception as e:
            return Outcome([failed(self.row, f"{type(e).__name__}: {e}")])

    def abandon(self, reason: str) -> list[InstanceOutput]:
        return [failed(self.row, reason)]


class LocalRunner:
    """Runs a batch in this process, with the semantics of one Spark partition (module doc).

    Args:
        batch_timeout: seconds a run may take (None: unbounded, on the
            caller's thread); past it the run is abandoned and its instances
            isolated (or :class:`RunTimedOut` raised, see :meth:`run`).
        isolation_budget: seconds a batch may spend isolating; suspects not
            started by then fail as not run.
    """

    def __init__(self, *, batch_timeout: float | None = None,
                 isolation_budget: float = 900.0) -> None:
        self.batch_timeout = batch_timeout
        self.isolation_budget = isolation_budget
        self._cancelled: set[str] = set()
        self._lock = threading.Lock()

    def cancel(self, ids: Sequence[str]) -> None:
        """The messages of these records were cancelled: a run that has them ends their
        instances before its next pipelet call (``cancelled``).  Until :meth:`uncancel`."""
        with self._lock:
            self._cancelled = self._cancelled | set(ids)

    def uncancel(self, ids: Sequence[str]) -> None:
        """The runs of these records are over (or cancelled no more)."""
        with self._lock:
            self._cancelled = self._cancelled - set(ids)

    def _among(self, ids: Sequence[str]) -> set[str]:
        cancelled = self._cancelled  # replaced, never changed: no lock to read
        return cancelled.intersection(ids) if cancelled else set()

    def run(self, workflow: Workflow, blackboard: Any, instances: list[list[str]], *,
            settle_early: SettleEarly | None = None, isolate: bool = True,
            suspect: bool = False, watch: Watch | None = None) -> list[InstanceResult]:
        """Run ``workflow`` for each instance (a list of record IDs on ``blackboard``).

        Past ``batch_timeout`` the run is abandoned; with ``isolate`` each
        instance then runs again alone, with a deadline of its own, and
        results known while others still run go to ``settle_early`` (on this
        thread, applied onto ``blackboard`` first; the list returned holds
        only the others); without, :class:`RunTimedOut` is raised.
        ``suspect``: isolate from the start (the batch broke a run before).
        ``watch`` hears of each pipelet call before it is made (on the run's
        thread; with a ``batch_timeout`` only).
        """
        if not instances:
            return []
        with stoppable(self._among):
            return self._run(workflow, blackboard, instances, settle_early, isolate, suspect,
                             watch)

    def _run(self, workflow: Workflow, blackboard: Any, instances: list[list[str]],
             settle_early: SettleEarly | None, isolate: bool, suspect: bool,
             watch: Watch | None) -> list[InstanceResult]:
        with frozen_heap():
            rows = inputs_for(blackboard, list(enumerate(instances)))
        seconds = self.batch_timeout
        if seconds is None:
            with frozen_heap():
                return apply_outputs(blackboard, run_instances(workflow, rows))
        if not suspect:
            first = _Watched(workflow, rows, f"chalk-local-{workflow.name}", watch)
            first.start()
            first.thread.join(seconds)
            if not first.thread.is_alive():
                with frozen_heap():
                    return apply_outputs(blackboard, first.result())
            reason = timeout_reason(first.call, seconds, first.records())
            log.warning("workflow %s: a run of %d instance(s) in this process: %s; abandoned "
                        "(its thread runs on until the pipelet returns)", workflow.name,
                        len(rows), reason, extra={"workflow": workflow.name})
            if not isolate:
                raise RunTimedOut(reason, seconds, first.call)
            if len(rows) == 1:
                return apply_outputs(blackboard, [failed(rows[0], reason)])

        def settle(outputs: list[InstanceOutput]) -> None:
            assert settle_early is not None
            settle_early(apply_outputs(blackboard, outputs))

        outputs = isolate_locally(workflow, rows, seconds, Budget(self.isolation_budget),
                                  settle if settle_early is not None else None, watch)
        return apply_outputs(blackboard, outputs)


def isolate_locally(workflow: Workflow, rows: list[InstanceInput], seconds: float,
                    budget: Budget, settle: Callable[[list[InstanceOutput]], None] | None,
                    watch: Watch | None = None) -> list[InstanceOutput]:
    """Each instance alone on a thread of its own, ``AT_ONCE`` at a time, each given up
    past ``seconds``."""
    log.info("isolating %d instance(s) of %s in this process: each alone, at most %g s",
             len(rows), workflow.name, seconds, extra={"workflow": workflow.name})

    def rerun(suspects: list[InstanceInput]) -> list[Attempt]:
        return [_ThreadAttempt(workflow, row, seconds, watch) for row in suspects]

    return run_attempts([], rerun=rerun, capacity=AT_ONCE, budget=budget, settle=settle,
                        suspects=rows, eager=True)
