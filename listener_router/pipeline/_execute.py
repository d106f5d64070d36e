"""The execute stage: run each workflow's group of a batch (one Spark job per group).

Runs on a runner thread (``Service.run`` hands it a batch taken from the
gathering).  Each group's results go to the commit stage's input as an
:class:`~listener_router.pipeline._commit.Executed`; the next group (and the
next batch) runs meanwhile.

When the runner fails on the driver (nothing is known to be done), the
group is isolated here, synchronously: its records are dropped and it is
split in halves that are loaded, run and settled again, until the message
that breaks the runner stands alone and fails.

A small batch runs in this process (``engine.LocalRunner``) where the
placement (``_sizing.Placement``) says so, saving a Spark job's fixed cost;
never a redelivered message's, nor one naming a quarantined record (it took a
process down, or hung one, before: ``_in_process``; Spark isolates a crash or
a hang where this process cannot).  The run is written down before it starts
and forgotten after, so one that takes the process down is known at the next
start.  A local run past ``batch_timeout`` ends the process
(:func:`hang_watch`): its records are quarantined at the next start.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Protocol

import engine
from blackboard import Blackboard
from engine import InstanceResult
from listener_router._errors import RunnerUnusable
from listener_router.pipeline._batch import Batch, Group
from listener_router.pipeline._commit import CommitStage, Executed
from listener_router.pipeline._in_process import InProcess
from listener_router.pipeline._loading import Loader
from listener_router.pipeline._report import BatchReport, Meter
from listener_router.pipeline._retries import fail
from listener_router.pipeline._settlement import Settlement
from listener_router.pipeline._sizing import Placement
from listener_router.pipeline._work import Work

__all__ = ["ExecuteStage", "HANG_EXIT", "Runner", "hang_watch"]

log = logging.getLogger(__name__)

HANG_EXIT = 75  # EX_TEMPFAIL: a batch run in this process hung (see hang_watch)


class Runner(Protocol):
    """What runs a workflow over a batch of instances (``engine.SparkRunner``,
    ``engine.LocalRunner``, or a test's stand-in)."""

    def run(self, workflow: engine.Workflow, blackboard: Blackboard,
            instances: list[list[str]]) -> Sequence[InstanceResult]: ...


@contextlib.contextmanager
def hang_watch(seconds: float, workflow: str, messages: int) -> Iterator[None]:
    """Exit the process when a batch run here takes longer than ``seconds``.

    A thread cannot be stopped, so a pipelet that hangs in this process would
    hold the service for good.  Exiting (code 75, "try again") leaves its
    messages unacked: the broker redelivers them, and redelivered messages run
    on Spark, which cancels the hang and isolates the message.  Nothing that
    was not committed has been acked.
    """
    def expire() -> None:
        log.critical("workflow %s: a batch of %d message(s) ran in this process for over %.0f s "
                     "(batch_timeout); a pipelet hangs. Exiting so that the broker redelivers "
                     "the batch, to run on Spark, which isolates the hang", workflow, messages,
                     seconds)
        logging.shutdown()
        os._exit(HANG_EXIT)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


class ExecuteStage:
    """Runs a batch's groups (see module doc)."""

    def __init__(self, *, registry: engine.WorkflowRegistry, runner: Runner,
                 local_runner: Runner | None, placement: Placement | None, batch_timeout: float,
                 loader: Loader, commit: CommitStage, settlement: Settlement, meter: Meter,
                 in_process: InProcess | None = None):
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
                    results = self._run_workflow(group, group.works, placement)
                except BaseException:
                    for rest in groups[position:]:
                        self.settlement.let_go(rest)
                        self.settlement.part_done(batch)
                    raise
                if results is None:  # isolated and settled on this thread
                    self.settlement.group_done(group)
                else:
                    self.commit.input.put(Executed(group, results))
        finally:
            self.settlement.part_done(batch)

    def _run_workflow(self, group: Group, works: list[Work],
                      placement: Placement | None = None) -> list[InstanceResult] | None:
        """Run ``works`` on the group's blackboard; None when the runner failed (and the
        works were isolated)."""
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
        try:
            if local:
                assert self.local_runner is not None and self.in_process is not None
                try:
                    with hang_watch(self.batch_timeout, name, len(works)):
                        results = self.local_runner.run(workflow, bb, instances)
                finally:
                    self.in_process.end(run_id)  # type: ignore[arg-type]
                self.meter.stats.add("local_batches")
            else:
                results = self.runner.run(workflow, bb, instances)
        except Exception as e:  # the runner failed on the driver: nothing is known done
            self.meter.time("run", time.perf_counter() - started, report)
            self._check_runner(e)
            log.warning("workflow %s: the runner failed on %d message(s): %s", name,
                        len(works), e)
            self._isolate(group, works, f"runner failed: {type(e).__name__}: {e}")
            return None
        seconds = time.perf_counter() - started
        self.meter.time("run", seconds, report)
        if report is not None:
            report.add_run(name, where, seconds, records)
            if local:
                with report.lock:
                    report.local_runs += 1
        return list(results)

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
            results = self._run_workflow(group, runnable)
            if results is not None:
                self.commit.settle(group, runnable, results)
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
