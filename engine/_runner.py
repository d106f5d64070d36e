"""The Spark runner: a batch of workflow instances on warm workers, or as one Spark job.

It takes the driver's blackboard with every instance's records loaded, runs
the workflow, and imports the changes of the instances that succeeded back
onto it.  Failed instances' records are left as loaded: the caller
invalidates them (``record_ids``) and commits the others.  (The runners
without Spark, ``engine._local``, do the same.)

Where a batch runs: on the warm workers (``engine._warm``, on by default);
where they cannot start, on a local master on the ``service`` workers given
(a :class:`~engine._local.ProcessRunner`'s), on a cluster (and where there
are none) as a Spark job of its own.  A
chunk none of them could begin is nobody's failure: it runs on the next of
them, and with none left its instances end as not run (``not_run``).

Poison isolation: a chunk or job that fails as a whole (a Python worker
died: ``os._exit``, segfault, out of memory) or runs past ``batch_timeout``
(a hang) leaves its instances *suspects*; each runs again alone, many at
once, each with a deadline of its own (``engine._isolation``), so that the
culprit is known in about one timeout: it fails with the reason (the
pipelet it was in, its ``file:line`` and records), all others complete.
What is known while the culprit still runs can be settled early
(``settle_early``).
"""

from __future__ import annotations

import functools
import gc
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from engine._errors import RunnerError
from engine._frames import FramePlan, frame_plan
from engine._isolation import Attempt, Budget, run_attempts
from engine._jobs import (
    Batch,
    ChunkCosts,
    JobAttempt,
    JobFailed,
    Pending,
    pool_attempts,
    short_reason,
)
from engine._local import LocalRunner, ProcessRunner
from engine._pool import Pool, Unavailable
from engine._results import InstanceResult, apply_outputs, inputs_for
from engine._session import exclude_local_folding, spark_session
from engine._shipping import ship_pipelet_code
from engine._specs import Workflow
from engine._warm import WarmWorkers, warm_workers
from engine._worker import (
    InstanceInput,
    InstanceOutput,
    chunk_partition,
    frozen_heap,
    inputs_to_chunks,
    outputs_from_chunks,
)

__all__ = ["InstanceResult", "LocalRunner", "ProcessRunner", "SparkRunner", "spark_session"]

log = logging.getLogger(__name__)

SettleEarly = Callable[[list[InstanceResult]], None]


_UNPLANNED = object()
SWEEP_EVERY = 100  # jobs between collections of the py4j proxies finished jobs leave (_sweep)
# Spark jobs of their own (not on warm workers) run since the last sweep, by every runner of
# this process: the JVM and the collector are the process's, and one process may run one
# runner after another.
_unswept = 0
_unswept_lock = threading.Lock()


class SparkRunner:
    """Runs each batch as one Spark job (``mapPartitions`` over chunks of instances).

    A workflow whose pipelets all have a DataFrame form (see
    ``engine._frames``) runs in the JVM instead, as a projection over the
    touched attributes, for every record the frame carries exactly; the
    other instances of the batch take the interpreter job.

    Args:
        spark: the SparkSession (one per process; see :func:`spark_session`).
        batch_timeout: seconds a chunk (or a job of its own) may run before it
            is given up and its instances isolated, each then with as long.
        isolation_budget: seconds a batch may spend isolating; suspects not
            started by then fail as not run (to be retried).
        frames: use pipelets' DataFrame forms where a workflow allows
            (default True; False always runs the interpreter).
        warm: run interpreter batches on warm workers (``engine._warm``:
            long-running tasks that take batch after batch, no job's fixed
            cost per batch); default: on a local master.
        service: the service's own workers (a :class:`ProcessRunner`), where
            batches run when the warm workers cannot start (module doc).
    """

    def __init__(self, spark: Any, *, batch_timeout: float = 300.0,
                 isolation_budget: float = 900.0, frames: bool = True,
                 warm: bool | None = None, service: ProcessRunner | None = None) -> None:
        self.spark = spark
        self.frames = frames
        #: records run as DataFrame transformations since this runner was made
        self.frame_records = 0
        self._plans: dict[tuple[str, str], FramePlan | None] = {}
        self._plans_lock = threading.Lock()
        if frames:
            exclude_local_folding(spark)
        self.batch_timeout = float(batch_timeout)
        # Isolating costs about one batch_timeout, unless hangs outnumber the workers
        # (each holds one for its deadline); past this many seconds the suspects not
        # started fail (to be retried), so that a batch never holds its messages
        # longer than the broker's consumer timeout.
        self.isolation_budget = float(isolation_budget)
        # Compressed, the JVM copies a sixth of the bytes: measured 0.2-0.3 CPU-s
        # less per 10,000 records of ~1 KB in local mode, for ~0.1 more in Python.
        self._compress = True
        # Executors of a cluster master may run on hosts without the workflow's
        # directory: its pipelet modules travel with the jobs (engine._shipping).
        self._ships = not str(spark.sparkContext.master).startswith("local")
        self._shipped: set[str] = set()  # zip files added to the SparkContext
        self._shipped_for: set[tuple[str, str]] = set()  # (workflow, version) checked
        # A batch of a few hundred records spends most of its time on a job's fixed
        # cost; warm workers pay it once.  Executors of a cluster must reach the
        # driver on a port of its own for them (``engine._warm.PORT``); where they
        # cannot, batches run as jobs of their own.
        if warm is None:
            warm = True
        # The context's warm workers park for every job of its own of any runner, whether
        # this one runs batches on them or not: their tasks hold the cores.
        self._parker = warm_workers(spark)
        # Batches that wait for warm workers that cannot start go elsewhere well within
        # their timeout (the workers are the context's: the shortest wait of its runners).
        self._parker.connect_timeout = min(self._parker.connect_timeout,
                                           max(15.0, self.batch_timeout / 2))
        self.warm: WarmWorkers | None = self._parker if warm else None
        self.service = service
        self.costs = ChunkCosts()

    def cancel(self, ids: Sequence[str]) -> None:
        """The messages of these records were cancelled while they run: on the warm workers
        their instances end before the next pipelet call (``cancelled``); a job of its own
        cannot be told, and runs them to the end (the caller drops what they did).  Until
        :meth:`uncancel`."""
        for pool in self._pools():
            pool.cancel(ids)

    def uncancel(self, ids: Sequence[str]) -> None:
        """The runs of these records are over (or they are cancelled no more)."""
        for pool in self._pools():
            pool.uncancel(ids)

    def _pools(self) -> list[Pool]:
        return [p for p in (self.warm, self.service.pool if self.service else None)
                if p is not None]

    def run(self, workflow: Workflow, blackboard: Any, instances: list[list[str]], *,
            settle_early: SettleEarly | None = None, suspect: bool = False, priority: int = 0,
            within: float | None = None) -> list[InstanceResult]:
        """Run ``workflow`` for each instance (a list of record IDs on ``blackboard``).

        When the batch needs isolating (module doc), the results known while
        suspects still run are applied onto ``blackboard`` and handed to
        ``settle_early`` on this thread (maybe in more than one call); the
        list returned holds only the others.  ``suspect``: the batch broke a
        run before (a hang or a crash elsewhere): isolate from the start.
        ``priority``: its chunks go to the workers before those of lower
        ones; ``within``: cut into chunks that each end within about that many
        seconds, so that a worker comes free for a higher lane that soon.
        """
        if not instances:
            return []
        if suspect:
            self._ship(workflow)
            with frozen_heap():
                rows = inputs_for(blackboard, list(enumerate(instances)))
            outputs = self._interpreted(workflow, blackboard, [], settle_early, suspects=rows,
                                        priority=priority)
            with frozen_heap():
                return sorted(apply_outputs(blackboard, outputs), key=lambda r: r.index)
        batch = self._start(workflow, blackboard, instances, set(), priority=priority,
                            within=within)
        return self._finish(workflow, blackboard, batch, settle_early, priority=priority)

    def run_stream(self, workflow: Workflow, blackboard: Any,
                   batches: Iterable[list[list[str]]]) -> Iterator[list[InstanceResult]]:
        """Run many batches, each as one job, with the next job in flight while one finishes.

        Yields each batch's results (as :meth:`run` returns them), in order.
        Batch *k+1* is exported and its job submitted before batch *k*'s
        results are applied, so Spark starts it the moment a core is free:
        the job's fixed cost and the driver's encoding overlap the running
        job, and applying batch *k* overlaps job *k+1*.  The batches must not
        share records (batch *k+1* is read before *k* is applied); a record
        in two batches in flight raises ``ValueError``.  The blackboard is
        only touched on the calling thread.
        """
        pending: deque[Batch] = deque()

        def finish_until(left: int) -> Iterator[list[InstanceResult]]:
            while len(pending) > left:
                yield self._finish(workflow, blackboard, pending.popleft())

        try:
            for instances in batches:
                if not instances:
                    yield from finish_until(0)  # keep the order of the results
                    yield []
                    continue
                ids = {rid for one in instances for rid in one}
                for earlier in pending:
                    shared = ids & earlier.ids
                    if shared:
                        raise ValueError(f"record {sorted(shared)[0]!r} is in two batches in flight; "
                                         "run_stream needs batches with disjoint records")
                pending.append(self._start(workflow, blackboard, instances, ids))
                yield from finish_until(1)
            yield from finish_until(0)
        finally:
            for batch in pending:  # abandoned (the caller stopped early): do not leave jobs running
                batch.cancel(self.spark.sparkContext)

    def _plan(self, workflow: Workflow) -> FramePlan | None:
        """The workflow's frame plan (made once per version; a newer version replaces older ones)."""
        key = (workflow.name, workflow.version)
        found = self._plans.get(key, _UNPLANNED)
        if found is not _UNPLANNED:
            return found  # type: ignore[return-value]
        with self._plans_lock:
            found = self._plans.get(key, _UNPLANNED)
            if found is not _UNPLANNED:
                return found  # type: ignore[return-value]
            plan, why = frame_plan(workflow) if self.frames else (None, "frames are off")
            if plan is None:
                log.debug("workflow %s runs in the interpreter: %s", workflow.name, why,
                          extra={"workflow": workflow.name})
            else:
                log.info("workflow %s runs as DataFrame transformations over %s", workflow.name,
                         ", ".join(plan.columns), extra={"workflow": workflow.name})
            # a reload replaces the workflow: the plans of its other versions go
            self._plans = {k: v for k, v in self._plans.items() if k[0] != workflow.name}
            self._plans[key] = plan
            return plan

    def _start(self, workflow: Workflow, blackboard: Any, instances: list[list[str]], ids: set[str],
               *, priority: int = 0, within: float | None = None) -> Batch:
        """Export the batch and submit its job(s); the blackboard is read, not changed.

        ``ids`` are the batch's record IDs where the caller needs them (``run_stream``).
        """
        self._ship(workflow)
        plan = self._plan(workflow)
        pairs = list(enumerate(instances))
        with frozen_heap():
            frame_rows, rest = plan.split(blackboard, pairs) if plan is not None else ([], pairs)
            rows = inputs_for(blackboard, rest) if rest else []
        batch = Batch(rows, [], plan, frame_rows, None, ids)
        if rows:
            batch.attempts = self._submit(workflow, rows, warm_ok=plan is None,
                                          priority=priority, within=within)
        if frame_rows:
            assert plan is not None
            batch.frame_job = self._submit_frame(plan, frame_rows)
        return batch

    def _ship(self, workflow: Workflow) -> None:
        """Add the workflow's own pipelet modules to the SparkContext (once per version; cluster masters)."""
        key = (workflow.name, workflow.version)
        if not self._ships or key in self._shipped_for:
            return
        with self._plans_lock:
            if key not in self._shipped_for:
                added = ship_pipelet_code(self.spark.sparkContext, workflow, self._shipped)
                self._shipped_for.add(key)
                if added and self.warm is not None:
                    self.warm.park()  # tasks started before would not have the new files

    def _finish(self, workflow: Workflow, blackboard: Any, batch: Batch,
                settle_early: SettleEarly | None = None, priority: int = 0) -> list[InstanceResult]:
        started = time.perf_counter()
        outputs: list[InstanceOutput] = []
        if batch.attempts:
            outputs = self._interpreted(workflow, blackboard, batch.attempts, settle_early,
                                        priority=priority)
        framed: list[InstanceResult] = []
        if batch.frame_job is not None:
            assert batch.plan is not None
            try:
                table = self._wait(batch.frame_job)
            except JobFailed as e:
                log.warning("DataFrame job of %s failed (%s); running its %d instance(s) in the interpreter",
                            workflow.name, e.reason, len(batch.frame_rows), extra={"workflow": workflow.name})
                outputs += self._interpret(workflow, blackboard, batch.frame_rows)
            else:
                with frozen_heap():
                    declined = batch.plan.write_back(blackboard, table, batch.frame_rows)
                framed = [InstanceResult(index, True, None, [rid], [rid])
                          for index, rid, _ in batch.frame_rows if rid not in declined]
                self.frame_records += len(framed)
                if declined:  # values a form leaves to process(): those records run here
                    outputs += self._interpret(workflow, blackboard, [
                        row for row in batch.frame_rows if row[1] in declined])
        with frozen_heap():
            results = apply_outputs(blackboard, outputs) + framed
            results.sort(key=lambda r: r.index)
        log.debug("batch of %d instance(s) of %s on Spark (%d as DataFrame), finished in %.3fs",
                  len(results), workflow.name, len(framed), time.perf_counter() - started,
                  extra={"workflow": workflow.name})
        self._sweep()
        return results

    def _interpret(self, workflow: Workflow, blackboard: Any,
                   frame_rows: list[tuple[int, str, list[str | None]]]) -> list[InstanceOutput]:
        """Run frame rows' records in the interpreter job instead (one instance each)."""
        with frozen_heap():
            rows = inputs_for(blackboard, [(index, [rid]) for index, rid, _ in frame_rows])
        return self._interpreted(workflow, blackboard, self._submit(workflow, rows), None)

    def _interpreted(self, workflow: Workflow, blackboard: Any, attempts: list[Attempt],
                     settle_early: SettleEarly | None, suspects: list[InstanceInput] | None = None,
                     priority: int = 0) -> list[InstanceOutput]:
        """The outcomes of the interpreter ``attempts``, isolating where one fails
        (``engine._isolation``); ``suspects``: rows to isolate from the start."""

        def settle(outputs: list[InstanceOutput]) -> None:
            assert settle_early is not None
            with frozen_heap():
                results = apply_outputs(blackboard, outputs)
            settle_early(results)

        return run_attempts(attempts, rerun=functools.partial(self._reruns, workflow, priority),
                            capacity=self._capacity(), budget=Budget(self.isolation_budget),
                            settle=settle if settle_early is not None else None,
                            suspects=suspects or [],
                            elsewhere=functools.partial(self._elsewhere, workflow, priority))

    def _homes(self) -> list[Pool]:
        """The worker pools a batch may run on, in order (those that may start): the warm
        workers, then, on a local master, the service's own (a job of its own would need
        the Python workers that did not start); on a cluster, after the warm workers come
        jobs of their own, on the cluster's cores."""
        homes: list[Pool] = []
        if self.warm is not None and self.warm.available():
            homes.append(self.warm)
        if self.service is not None and not self._ships and self.service.pool.available():
            homes.append(self.service.pool)
        return homes

    def _capacity(self) -> int:
        """Reruns started at once: all (the workers queue them), or on jobs of their own one
        per core."""
        return 1 << 30 if self._homes() else max(1, int(self.spark.sparkContext.defaultParallelism))

    def _on(self, workflow: Workflow, rows: list[InstanceInput], homes: list[Pool], *,
            first: bool, priority: int, within: float | None = None) -> list[Attempt]:
        """``rows`` on the first of ``homes`` that takes them; else as a job of its own."""
        for pool in homes:
            try:
                parts = self.costs.parts(workflow.name, rows, pool.slots, within)
                return list(pool_attempts(pool, workflow, rows, limit=self.batch_timeout,
                                          priority=priority, first=first, parts=parts,
                                          measured=self.costs.measured(workflow.name)))
            except Unavailable:
                continue
        if first:
            return [JobAttempt(self, workflow, rows, self.start_rows(workflow, rows))]
        return [JobAttempt(self, workflow, [row]) for row in rows]

    def _reruns(self, workflow: Workflow, priority: int, rows: list[InstanceInput]) -> list[Attempt]:
        """Each suspect alone: a chunk of its own on the workers, or else a job of its own."""
        log.warning("workflow %s: isolating %d instance(s), each alone, at most %g s each",
                    workflow.name, len(rows), self.batch_timeout, extra={"workflow": workflow.name})
        return self._on(workflow, rows, self._homes(), first=False, priority=priority)

    def _elsewhere(self, workflow: Workflow, priority: int, rows: list[InstanceInput], why: str,
                   after: Any) -> list[Attempt]:
        """Rows whose runner did not start (``after``): on the next one, as a first run."""
        homes = self._homes()
        if after in homes:
            homes = homes[homes.index(after) + 1:]
        elif after == "job":
            return []  # nothing comes after a job of its own: they end as not run
        log.warning("workflow %s: %d instance(s) %s; running them on %s", workflow.name,
                    len(rows), why, homes[0].name if homes else "a Spark job of their own",
                    extra={"workflow": workflow.name})
        return self._on(workflow, rows, homes, first=True, priority=priority)

    def start_rows(self, workflow: Workflow, rows: list[InstanceInput]) -> Pending:
        """``rows`` as a job of its own, started (``JobAttempt``)."""
        return self._start_job(workflow.name, f"{len(rows)} instance(s)",
                               self._job_of(workflow, rows))

    def _sweep(self) -> None:
        """Free the JVM objects of finished jobs (every ``SWEEP_EVERY`` jobs).

        py4j's proxy of a Java object and the proxies of its methods refer to
        each other, so every Java object a job touched (its Datasets, their
        plans and query executions) is released in the JVM only when Python's
        cyclic collector frees the proxies.  The proxies live through a job,
        so they reach the oldest generation, which the collector rarely
        visits: measured, the JVM kept ~450 KB per job until its 1 GB heap
        was full (after ~2,300 jobs) and then spent its time collecting.
        A full collection costs ~0.1-0.7 s in a busy service, so it runs per
        so many jobs, not per job: the JVM holds ~50 MB for them between two
        sweeps of this workflow's size.  Chunks run on warm workers touch no
        Java object and do not count.  The count is the process's, not this
        runner's: a runner closed before its hundredth job (a service restarted in
        the same process, as tests and benchmarks do) would otherwise leave its
        jobs' objects to pile up in the JVM.
        """
        global _unswept
        with _unswept_lock:
            if _unswept < SWEEP_EVERY:
                return
            _unswept = 0
        gc.collect()

    def healthy(self) -> bool:
        """False once the SparkContext is gone (stopped, or its JVM died)."""
        try:
            jsc = self.spark.sparkContext._jsc
            return jsc is not None and not jsc.sc().isStopped()
        except Exception:
            return False

    def warm_up(self, within: float | None = None) -> float:
        """Start the Python workers and import the engine there; return the seconds taken.

        The first job of a session pays for starting workers and importing
        pyarrow, lxml and the engine (seconds); a service does it before it
        takes its first batch.  No workflow or record is involved.  Given up
        (and logged) after ``within`` seconds (default: the warm workers' wait
        to connect): Spark waits for a Python worker that never starts for
        ever, and batches meanwhile run where they can (module doc).
        """
        started = time.perf_counter()
        sc = self.spark.sparkContext
        cores = max(1, int(sc.defaultParallelism))

        def touch(items: Any) -> Any:
            import engine._worker  # noqa: F401  (what a real batch imports first)
            import pipelets  # noqa: F401
            yield from items

        job = self._start_job("warm-up", "its Python workers started",
                              lambda: sc.parallelize(range(cores), cores).mapPartitions(touch)
                              .collect())
        seconds = within if within is not None else self._parker.connect_timeout
        assert job.thread is not None
        job.thread.join(seconds)
        if job.thread.is_alive():
            job.cancel(sc, wait=False)
            log.warning("Spark's Python workers did not start in %g s; batches run on the "
                        "service's workers until they do", seconds)
        elif "error" in job.box:
            log.warning("Spark's Python workers did not start: %s",
                        short_reason(job.box["error"]))
        return time.perf_counter() - started

    def _submit(self, workflow: Workflow, rows: list[InstanceInput], warm_ok: bool = True,
                priority: int = 0, within: float | None = None) -> list[Attempt]:
        """Start the interpreter work for ``rows`` (the blackboard is not touched): on the
        workers, a request per chunk, each given ``batch_timeout`` of running time;
        else (none, or ``warm_ok`` false: a DataFrame job of the same batch will need the
        cores) a job of its own on a thread of its own."""
        # a DataFrame part of the batch will need the cores: a job of its own beside it
        homes = self._homes() if warm_ok else []
        return self._on(workflow, rows, homes, first=True, priority=priority, within=within)

    def _job_of(self, workflow: Workflow, rows: list[InstanceInput]) -> Any:
        """What runs ``rows`` as a job of its own: one RDD job, a partition per chunk."""
        sc = self.spark.sparkContext
        with frozen_heap():
            # one chunk per core: a partition of each
            chunks = inputs_to_chunks(rows, max(1, int(sc.defaultParallelism)), self._compress)
        wf, compress = workflow, self._compress

        def partition(chunks: Any) -> Any:
            return chunk_partition(wf, chunks, compress)

        return lambda: sc.parallelize(chunks, len(chunks)).mapPartitions(partition).collect()

    def _regular(self, produce: Any) -> Any:
        """Run a job of its own: the context's warm workers give the cores back first."""
        global _unswept
        with _unswept_lock:
            _unswept += 1
        with self._parker.regular():
            return produce()

    def _submit_frame(self, plan: FramePlan, rows: list[tuple[int, str, list[str | None]]]) -> Pending:
        """Start the DataFrame job for ``rows`` on its own thread."""
        spark = self.spark
        with frozen_heap():
            table = plan.to_arrow(rows)
        return self._start_job(plan.workflow.name, f"{len(rows)} record(s) as a DataFrame",
                               lambda: plan.apply(spark.createDataFrame(table)).toArrow())

    def _start_job(self, name: str, what: str, produce: Any, *,
                   regular: bool = True) -> Pending:
        """Run ``produce`` on a thread of its own, in a job group of its own (cancelled on
        a timeout); a ``regular`` job parks the warm workers first."""
        sc = self.spark.sparkContext
        job = Pending(f"chalk-{name}-{uuid.uuid4().hex[:12]}")
        if regular:
            produce = functools.partial(self._regular, produce)

        def run() -> None:
            try:
                sc.setJobGroup(job.group, f"workflow {name}: {what}", interruptOnCancel=True)
                job.box["table"] = produce()
            except BaseException as e:  # reported to the caller's thread
                job.box["error"] = e
            finally:
                sc.clearJobGroup() if hasattr(sc, "clearJobGroup") else None
                job.done.set_result(None)

        job.thread = threading.Thread(target=run, name=job.group, daemon=True)
        job.started = time.monotonic()
        job.thread.start()
        return job

    def _wait(self, job: Pending) -> Any:
        """The job's Arrow table (waiting at most ``batch_timeout`` from its start)."""
        assert job.thread is not None
        job.thread.join(max(0.0, job.started + self.batch_timeout - time.monotonic()))
        if job.thread.is_alive():
            job.cancel(self.spark.sparkContext)
            raise JobFailed(f"timeout: the job ran longer than {self.batch_timeout:g} s and was "
                            "cancelled", timeout=True)
        if "error" in job.box:
            e = job.box["error"]
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise e
            raise JobFailed(f"Spark task failed: {short_reason(e)}") from e
        result = job.box.get("table")
        if result is None:
            raise RunnerError("Spark job returned nothing")
        return result

    def collect(self, workflow: Workflow, rows: list[InstanceInput], job: Pending) -> list[InstanceOutput]:
        """Wait for the interpreter ``job`` (of its own) and decode its outputs."""
        result = self._wait(job)
        with frozen_heap():
            outputs = outputs_from_chunks(result)
        missing = {r.index for r in rows} - {o.index for o in outputs}
        if missing:
            raise RunnerError(f"Spark job lost instance(s) {sorted(missing)}")
        return outputs

