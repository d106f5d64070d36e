"""The execute stage: run each workflow's group of a batch (one Spark job per group).

Runs on a runner thread (``Service.run`` hands it a batch taken from the
gathering).  Each group's results go to the commit stage's input as an
:class:`~listener_router.pipeline._commit.Executed`; the next group (and the
next batch) runs meanwhile.

When a group needs isolating (an instance hung or took its worker down), the
runner hands over the results it knows while it still reruns suspects
(``settle_early``): they are committed, published and acked at once, on the
runner thread, as one more part of the batch (:meth:`ExecuteStage._settle_early`);
the rest follow when the runner returns.

When the runner fails on the driver (nothing is known to be done), the
group is isolated here, synchronously: its records are dropped and it is
split in halves that are loaded, run and settled again, until the message
that breaks the runner stands alone and fails.

A small batch runs on the service's own workers (``engine.ProcessRunner``:
worker processes the service supervises, never its own process) where the
placement (``_sizing.Placement``) says so, saving even a warm Spark round
trip.  They isolate a hang or a crash as Spark's warm workers do: it costs a
worker process, never the service.

A message retried because its last run hung or took its worker down
(``engine.broke_its_run`` of its ``x-chalk-error``) runs apart from its
batch-mates: they run first, as a run of their own, and are settled at once;
then it runs alone, isolated from the start (a hang costs it one
``batch_timeout``, not its batch-mates).

A lane outranked by a higher one that has work hands its batch to the
workers in chunks that each end within :data:`YIELD_WITHIN` seconds, so that
the higher lane's chunk, which goes to the workers first, waits for a worker
no longer than that.  Instances no runner could begin (their workers did not
start) are deferred, not failed: no attempt is counted.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import engine
from blackboard import Blackboard
from engine import InstanceResult
from listener_router._errors import RunnerUnusable
from listener_router._messages import LAST_ERROR_HEADER
from listener_router.pipeline._batch import Batch, Group
from listener_router.pipeline._cancelled import Cancelled
from listener_router.pipeline._commit import CommitStage, Executed
from listener_router.pipeline._loading import Loader
from listener_router.pipeline._report import BatchReport, Meter
from listener_router.pipeline._retries import fail
from listener_router.pipeline._settlement import Settlement
from listener_router.pipeline._sizing import Placement
from listener_router.pipeline._work import Work

__all__ = ["ExecuteStage", "Runner", "YIELD_WITHIN"]

log = logging.getLogger(__name__)

YIELD_WITHIN = 0.5   # seconds an outranked lane's chunk runs at most (a higher one waits no longer)

SettleEarly = Callable[[list[InstanceResult]], None]


class Runner(Protocol):
    """What runs a workflow over a batch of instances (``engine.SparkRunner``,
    ``engine.LocalRunner``, or a test's stand-in).  ``settle_early`` (when the runner
    takes it) gets the results known while suspects are still rerun; ``run`` then returns
    the others."""

    def run(self, workflow: engine.Workflow, blackboard: Blackboard,
            instances: list[list[str]]) -> Sequence[InstanceResult]: ...


def _keywords(runner: Any) -> frozenset[str]:
    """The keywords ``runner.run`` takes (a stand-in of an earlier version may take none)."""
    try:
        parameters = inspect.signature(runner.run).parameters.values()
    except (AttributeError, TypeError, ValueError):
        return frozenset()
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return frozenset({"settle_early", "suspect", "priority", "within"})
    return frozenset(p.name for p in parameters if p.kind is p.KEYWORD_ONLY)


def _run(runner: Any, keywords: frozenset[str], workflow: engine.Workflow, bb: Blackboard,
         instances: list[list[str]], **options: Any) -> Sequence[InstanceResult]:
    return runner.run(workflow, bb, instances,
                      **{k: v for k, v in options.items() if k in keywords})


def _broke_a_run(w: Work) -> bool:
    """Whether ``w`` is retried because its last run hung or took its worker down."""
    m = w.message
    if m is None or m.attempts <= 0 or not m.headers:
        return False
    error = m.headers.get(LAST_ERROR_HEADER)
    if isinstance(error, bytes):
        error = error.decode("utf-8", "replace")
    return isinstance(error, str) and engine.broke_its_run(error)


def _at(positions: list[int], results: Sequence[InstanceResult]) -> list[InstanceResult]:
    """Results of a run over some of a group's instances, indexed in the whole group."""
    return [dataclasses.replace(r, index=positions[r.index]) for r in results]


class ExecuteStage:
    """Runs a batch's groups (see module doc)."""

    def __init__(self, *, registry: engine.WorkflowRegistry, runner: Runner,
                 local_runner: Runner | None, placement: Placement | None, batch_timeout: float,
                 loader: Loader, commit: CommitStage, settlement: Settlement, meter: Meter,
                 cancelled: Cancelled | None = None):
        self.registry = registry
        self.runner = runner
        self.local_runner = local_runner
        self.placement = placement
        self.batch_timeout = batch_timeout
        self.loader = loader
        self.commit = commit
        self.settlement = settlement
        self.meter = meter
        self._keywords = _keywords(runner)
        self._local_keywords = _keywords(local_runner)
        # the groups running, and their records the runners were told are cancelled
        self.cancelled = cancelled
        self._running: dict[int, list[Work]] = {}
        self._stopping: dict[int, set[str]] = {}
        self._lock = threading.Lock()
        if cancelled is not None:
            cancelled.listen(self._stop_cancelled)

    def execute(self, batch: Batch, placement: Placement | None = None, *, priority: int = 0,
                outranked: bool = False) -> None:
        """Run each workflow's group of the batch; the commit stage settles them.  Small
        batches run on the service's workers where ``placement`` (the lane's; default the
        stage's) says so.  ``priority``: the lane's (its chunks go to the workers first);
        ``outranked``: a higher lane has work (chunks end within ``YIELD_WITHIN``)."""
        groups = [g for g in batch.groups.values() if g.works]
        batch.pending = len(groups) + 1
        placement = placement or self.placement
        urgency = {"priority": priority, "within": YIELD_WITHIN if outranked else None}
        try:
            for position, group in enumerate(groups):
                try:
                    ran = self._run_workflow(group, group.works, placement, urgency)
                except BaseException:
                    for rest in groups[position:]:
                        self.settlement.let_go(rest)
                        self.settlement.part_done(batch)
                    raise
                if ran is None:  # isolated and settled on this thread
                    self.settlement.group_done(group)
                else:
                    group.works, results = ran  # less what was settled early
                    self.commit.input.put(Executed(group, results), batch.priority)
        finally:
            self.settlement.part_done(batch)

    def _run_workflow(self, group: Group, works: list[Work], placement: Placement | None = None,
                      urgency: dict[str, Any] | None = None
                      ) -> tuple[list[Work], list[InstanceResult]] | None:
        """Run ``works`` on the group's blackboard: the works not settled early, with their
        results; None when the runner failed (and the works were isolated)."""
        name, bb = group.name, group.bb
        report = group.batch.report if group.batch is not None else None
        workflow = self.registry.get(name)
        instances = [w.message.record_ids for w in works]  # type: ignore[union-attr]
        records = sum(len(ids) for ids in instances)
        local = self.local_runner is not None and placement is not None and \
            placement.runs_here(workflow, works, records)
        runner, keywords = (self.local_runner, self._local_keywords) if local else \
            (self.runner, self._keywords)
        started = time.perf_counter()
        where = "local" if local or not isinstance(self.runner, engine.SparkRunner) else "spark"

        faulted = False  # results settled early come only from a batch being isolated

        def early(results: list[InstanceResult]) -> None:
            nonlocal faulted
            faulted = True
            self._settle_early(group, [works[r.index] for r in results], results)

        apart = [i for i, w in enumerate(works) if _broke_a_run(w)]
        self._began(group, works)
        try:
            results: Sequence[InstanceResult]
            if apart and len(apart) < len(works):
                results = self._run_apart(runner, keywords, workflow, bb, instances, apart,
                                          early, urgency or {})
                faulted = True
            else:
                results = _run(runner, keywords, workflow, bb, instances, settle_early=early,
                               suspect=bool(apart), **(urgency or {}))
            if local:
                self.meter.stats.add("local_batches")
        except Exception as e:  # the runner failed on the driver: nothing is known done
            self.meter.time("run", time.perf_counter() - started, report)
            self._check_runner(e)
            log.warning("workflow %s: the runner failed on %d message(s): %s", name,
                        len(works), e)
            left = set(map(id, group.works))  # less what was settled early
            self._isolate(group, [w for w in works if id(w) in left],
                          f"runner failed: {type(e).__name__}: {e}")
            return None
        finally:
            self._ended(group)
        seconds = time.perf_counter() - started
        self.meter.time("run", seconds, report)
        if report is not None:
            report.add_run(name, where, seconds, records, placed=local,
                           faulted=faulted or any(r.fault for r in results))
            if local:
                with report.lock:
                    report.local_runs += 1
        return [works[r.index] for r in results], list(results)

    @staticmethod
    def _run_apart(runner: Any, keywords: frozenset[str], workflow: engine.Workflow,
                   bb: Blackboard, instances: list[list[str]], apart: list[int],
                   early: SettleEarly, urgency: dict[str, Any]) -> list[InstanceResult]:
        """Run the instances not in ``apart`` and settle them; then those in ``apart``, each
        alone (module doc).  Returns the results of those not settled early."""
        rest = [i for i in range(len(instances)) if i not in set(apart)]
        first = _run(runner, keywords, workflow, bb, [instances[i] for i in rest],
                     settle_early=lambda rs: early(_at(rest, rs)), **urgency)
        if first:
            early(_at(rest, first))
        log.info("workflow %s: %d message(s) whose last run hung or died run alone, after "
                 "their %d batch-mate(s)", workflow.name, len(apart), len(rest),
                 extra={"workflow": workflow.name})
        alone = _run(runner, keywords, workflow, bb, [instances[i] for i in apart],
                     settle_early=lambda rs: early(_at(apart, rs)), suspect=True, **urgency)
        return _at(apart, alone)

    # -- cancelled while running ----------------------------------------------------
    def _began(self, group: Group, works: list[Work]) -> None:
        with self._lock:
            self._running[id(group)] = works
        if self.cancelled:  # cancelled between the gather and now
            self._stop_cancelled()

    def _ended(self, group: Group) -> None:
        with self._lock:
            self._running.pop(id(group), None)
            ids = self._stopping.pop(id(group), None)
        if ids:
            for runner in self._cancellable():
                runner.uncancel(list(ids))

    def _stop_cancelled(self) -> None:
        """(thread ``chalk-flow``, or a group starting) Tell the runners the records of the
        running messages cancelled since they started: their instances end before their
        next pipelet call."""
        cancelled = self.cancelled
        if cancelled is None:
            return
        told: list[str] = []
        with self._lock:
            for key, works in self._running.items():
                stopping = self._stopping.setdefault(key, set())
                new = [rid for w in works if w.message is not None and
                       cancelled.reason(w.message) is not None
                       for rid in w.message.record_ids if rid not in stopping]
                stopping.update(new)
                told += new
        if told:
            log.info("telling the runners of %d record(s) cancelled while they run", len(told))
            for runner in self._cancellable():
                runner.cancel(told)

    def _cancellable(self) -> list[Any]:
        return [r for r in (self.runner, self.local_runner) if hasattr(r, "cancel")]

    def _settle_early(self, group: Group, works: list[Work],
                      results: list[InstanceResult]) -> None:
        """Commit, publish and ack what the runner knows while it still reruns suspects: one
        more part of the batch (on the runner thread, which holds the group's blackboard)."""
        batch = group.batch
        if batch is not None:
            with batch.lock:
                batch.pending += 1
        done = set(map(id, works))
        group.works = [w for w in group.works if id(w) not in done]
        try:
            self.commit.settle(group, works, results)
        except Exception:  # as the commit stage does: never let the runner thread die of it
            log.exception("settling %d message(s) early failed; they are held and tried again",
                          len(works))
            self.loader.invalidate(group.bb, [rid for r in results for rid in r.record_ids
                                              if rid in group.bb])
        finally:
            self.settlement.works_done(works, batch)

    def _isolate(self, group: Group, works: list[Work], error: str) -> None:
        """Fail a lone message; split a larger group in halves and run each again.

        Synchronous (load, run, route, commit) on the calling thread, which
        must be the runner's; everything on the group's blackboard belongs to
        ``works``.
        """
        bb = group.bb
        self.loader.invalidate(bb, bb.ids())
        if not works:
            return
        if len(works) == 1:
            fail(works[0], error)
            return
        half = len(works) // 2
        for part in (works[:half], works[half:]):
            self._run_again(group, part)

    def _run_again(self, group: Group, works: list[Work]) -> None:
        bb = group.bb
        report: BatchReport | None = group.batch.report if group.batch is not None else None
        try:
            loaded = self.loader.load(bb, works, report)
            runnable = [w for w in loaded if self.loader.apply(bb, w)]
            if not runnable:
                return
            ran = self._run_workflow(group, runnable)
            if ran is not None:
                self.commit.settle(group, *ran)
        finally:
            leftover = bb.ids()
            if leftover:
                self.loader.invalidate(bb, leftover)

    def _check_runner(self, error: Exception) -> None:
        healthy = getattr(self.runner, "healthy", None)
        if healthy is not None and not healthy():
            log.critical("the workflow runner is no longer usable (%s); stopping so that a "
                         "supervisor can restart the service", error)
            raise RunnerUnusable(str(error)) from error
