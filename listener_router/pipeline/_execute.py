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

A small batch runs in this process (``engine.LocalRunner``) where the
placement (``_sizing.Placement``) says so, saving a Spark job's fixed cost;
never a redelivered message's, nor one naming a quarantined record (it took a
process down, or hung one, before: ``_in_process``).  The run is written down
before it starts and forgotten after, so one that takes the process down is
known at the next start.  A local run is bounded by ``batch_timeout``: past
it the run is abandoned (its thread goes on until the pipelet returns;
nothing it does is applied), its records are quarantined, and the group runs
on the main runner (Spark) instead, each instance alone from the start, so
that the hung one is found in one more timeout and the others commit.
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
from listener_router.pipeline._batch import Batch, Group
from listener_router.pipeline._cancelled import Cancelled
from listener_router.pipeline._commit import CommitStage, Executed
from listener_router.pipeline._in_process import HUNG, InProcess
from listener_router.pipeline._loading import Loader
from listener_router.pipeline._report import BatchReport, Meter
from listener_router.pipeline._retries import fail
from listener_router.pipeline._settlement import Settlement
from listener_router.pipeline._sizing import Placement
from listener_router.pipeline._work import Work

__all__ = ["ExecuteStage", "Runner"]

log = logging.getLogger(__name__)

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
        return frozenset({"settle_early", "suspect", "isolate", "watch"})
    return frozenset(p.name for p in parameters if p.kind is p.KEYWORD_ONLY)


def _run(runner: Any, keywords: frozenset[str], workflow: engine.Workflow, bb: Blackboard,
         instances: list[list[str]], **options: Any) -> Sequence[InstanceResult]:
    return runner.run(workflow, bb, instances,
                      **{k: v for k, v in options.items() if k in keywords})


class ExecuteStage:
    """Runs a batch's groups (see module doc)."""

    def __init__(self, *, registry: engine.WorkflowRegistry, runner: Runner,
                 local_runner: Runner | None, placement: Placement | None, batch_timeout: float,
                 loader: Loader, commit: CommitStage, settlement: Settlement, meter: Meter,
                 in_process: InProcess | None = None, cancelled: Cancelled | None = None):
        self.registry = registry
        self.runner = runner
        self.local_runner = local_runner
        self.placement = placement
        self.batch_timeout = batch_timeout
        self.loader = loader
        self.commit = commit
        self.settlement = settlement
        self.meter = meter
        self.in_process = in_process
        self._keywords = _keywords(runner)
        self._local_keywords = _keywords(local_runner)
        # runner = "local": every run is this process's (written down, see _run_main_here)
        self._main_here = isinstance(runner, engine.LocalRunner) and in_process is not None
        # the groups running, and their records the runners were told are cancelled
        self.cancelled = cancelled
        self._running: dict[int, list[Work]] = {}
        self._stopping: dict[int, set[str]] = {}
        self._lock = threading.Lock()
        if cancelled is not None:
            cancelled.listen(self._stop_cancelled)

    def execute(self, batch: Batch, placement: Placement | None = None) -> None:
        """Run each workflow's group of the batch; the commit stage settles them.  Small
        batches run in this process where ``placement`` (the lane's; default the stage's)
        says so."""
        groups = [g for g in batch.groups.values() if g.works]
        batch.pending = len(groups) + 1
        placement = placement or self.placement
        try:
            for position, group in enumerate(groups):
                try:
                    ran = self._run_workflow(group, group.works, placement)
                except BaseException:
                    for rest in groups[position:]:
                        self.settlement.let_go(rest)
                        self.settlement.part_done(batch)
                    raise
                if ran is None:  # isolated and settled on this thread
                    self.settlement.group_done(group)
                else:
                    group.works, results = ran  # less what was settled early
                    self.commit.input.put(Executed(group, results))
        finally:
            self.settlement.part_done(batch)

    def _run_workflow(self, group: Group, works: list[Work], placement: Placement | None = None
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
        run_id = self._begin_here(name, works, instances) if local else None
        local = run_id is not None
        started = time.perf_counter()
        where = "local" if local or not isinstance(self.runner, engine.SparkRunner) else "spark"

        def early(results: list[InstanceResult]) -> None:
            self._settle_early(group, [works[r.index] for r in results], results)

        self._began(group, works)
        try:
            if local:
                assert run_id is not None
                try:
                    results = self._run_here(workflow, bb, instances, run_id)
                    self.meter.stats.add("local_batches")
                except engine.RunTimedOut:
                    where = "spark" if isinstance(self.runner, engine.SparkRunner) else "local"
                    local = False
                    results = _run(self.runner, self._keywords, workflow, bb, instances,
                                   settle_early=early, suspect=True)
            elif self._main_here:
                results = self._run_main_here(workflow, bb, works, instances, early)
            else:
                results = _run(self.runner, self._keywords, workflow, bb, instances,
                               settle_early=early, suspect=self._crashed(works, instances))
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
            report.add_run(name, where, seconds, records)
            if local:
                with report.lock:
                    report.local_runs += 1
        return [works[r.index] for r in results], list(results)

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

    def _run_here(self, workflow: engine.Workflow, bb: Blackboard, instances: list[list[str]],
                  run_id: str) -> Sequence[InstanceResult]:
        """Run in this process, bounded: past ``batch_timeout`` the run is abandoned, its
        records quarantined, and ``RunTimedOut`` raised (the caller runs it on Spark)."""
        assert self.local_runner is not None and self.in_process is not None
        try:
            return _run(self.local_runner, self._local_keywords, workflow, bb, instances,
                        isolate=False, watch=self.in_process.watch(run_id))
        except engine.RunTimedOut as e:
            ids = list(dict.fromkeys(rid for one in instances for rid in one))
            log.warning("workflow %s: a batch of %d message(s) %s: %s; its %d record(s) are "
                        "quarantined and the batch runs on the runner, each message alone",
                        workflow.name, len(instances), HUNG, e.reason, len(ids))
            self.in_process.quarantine(ids, f"workflow {workflow.name}: {HUNG} ({e.reason})")
            raise
        finally:
            self.in_process.end(run_id)

    def _run_main_here(self, workflow: engine.Workflow, bb: Blackboard, works: list[Work],
                       instances: list[list[str]], early: SettleEarly) -> list[InstanceResult]:
        """``runner = "local"``: each run is written down, so that a crash is known at the next
        start.  There is no Spark to send its records to: after it, the messages of the run
        that crashed run one by one (each written down alone, each settled before the next
        runs, with nothing else running here meanwhile), and one that crashed the process alone
        fails without running."""
        assert self.in_process is not None
        banned = self.in_process.quarantined([rid for ids in instances for rid in ids])
        if not banned:
            with self.in_process.shared():
                run_id = self.in_process.begin(workflow.name, works)
                try:
                    return list(_run(self.runner, self._keywords, workflow, bb, instances,
                                     settle_early=early, watch=self._watch(run_id)))
                finally:
                    if run_id is not None:
                        self.in_process.end(run_id)
        for index, (w, ids) in enumerate(zip(works, instances, strict=True)):
            why = next((f"record {rid!r} {banned[rid]}" for rid in ids
                        if self.in_process.culprit(banned.get(rid, ""))), None)
            if why is not None:
                early([InstanceResult(index, False, f"not run: {why} (runner = \"local\" has "
                                      "nowhere else to run it)", [], list(ids))])
                continue
            with self.in_process.alone():
                run_id = self.in_process.begin(workflow.name, [w])
                try:
                    one = _run(self.runner, self._keywords, workflow, bb, [ids],
                               watch=self._watch(run_id))[0]
                finally:
                    if run_id is not None:
                        self.in_process.end(run_id)
            early([dataclasses.replace(one, index=index)])
        return []

    def _watch(self, run_id: str | None) -> Any:
        return self.in_process.watch(run_id) if self.in_process and run_id else None

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
        if self._main_here:  # acked before a rerun in this process may take it down
            self.settlement.finish.input.drain()

    def _crashed(self, works: list[Work], instances: list[list[str]]) -> bool:
        """Whether a batch delivered again holds records of a run that took this service's
        process down: on Spark each of its messages then runs alone from the start (the
        culprit is among them; its first run would only find that out at a timeout)."""
        if self.in_process is None or not any(w.delivery.redelivered for w in works):
            return False
        return bool(self.in_process.quarantined([rid for ids in instances for rid in ids]))

    def _begin_here(self, name: str, works: list[Work], instances: list[list[str]]
                    ) -> str | None:
        """Write down a run in this process, unless a record of it is quarantined (it took a
        process down, or hung one, before); None: run it on the runner."""
        if self.in_process is None:
            return None
        banned = self.in_process.quarantined([rid for ids in instances for rid in ids])
        if banned:
            rid, why = next(iter(banned.items()))
            log.info("workflow %s: a batch of %d message(s) runs on the runner, not in this "
                     "process: record %r %s", name, len(works), rid, why)
            return None
        return self.in_process.begin(name, works)

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
