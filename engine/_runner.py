"""Runners: a batch of workflow instances on Spark (one job) or in this process.

Both take the driver's blackboard with every instance's records loaded, run
the workflow, and import the changes of the instances that succeeded back
onto it.  Failed instances' records are left as loaded: the caller
invalidates them (``record_ids``) and commits the others.

Poison isolation (Spark): a job that fails as a whole (a Python worker died:
``os._exit``, segfault, out of memory) or runs past ``batch_timeout`` (a
hang; the job is cancelled) is split in halves and each half rerun, until the
instance(s) that break a job are alone; those are reported failed with the
reason, all others complete.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from engine._errors import RunnerError
from engine._specs import Workflow
from engine._worker import (
    CHUNK_DDL,
    InstanceInput,
    InstanceOutput,
    arrow_partition,
    export_packed,
    frozen_heap,
    import_packed,
    inputs_to_arrow,
    outputs_from_arrow,
    run_instances,
)

__all__ = ["InstanceResult", "LocalRunner", "SparkRunner", "spark_session"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class InstanceResult:
    """How one workflow instance ended.

    ``index`` is the instance's position in the ``instances`` argument of
    ``run``; ``result_ids`` the records the workflow returned (for routing);
    ``record_ids`` every record of the instance on the driver's blackboard:
    for an OK instance its inputs and the fragments it made (all imported),
    for a failed one its inputs (to invalidate).
    """

    index: int
    ok: bool
    error: str | None
    result_ids: list[str] = field(default_factory=list)
    record_ids: list[str] = field(default_factory=list)


def _inputs(blackboard: Any, instances: list[list[str]]) -> list[InstanceInput]:
    out: list[InstanceInput] = []
    for index, ids in enumerate(instances):
        ids = list(dict.fromkeys(ids))
        out.append(InstanceInput(index, ids, export_packed(blackboard, ids, "all")))
    return out


def _apply(blackboard: Any, outputs: list[InstanceOutput]) -> list[InstanceResult]:
    results = []
    for out in outputs:
        if out.ok and out.packed is not None:
            import_packed(blackboard, out.packed)
        results.append(InstanceResult(out.index, out.ok, out.error, list(out.result_ids), list(out.record_ids)))
    failed = sum(1 for r in results if not r.ok)
    if failed:
        log.info("%d of %d instance(s) failed", failed, len(results))
    return results


class LocalRunner:
    """Runs a batch in this process, with the semantics of one Spark partition.

    Records make the same round trip as on Spark (JSON and blobs) so a value
    that cannot travel fails here too.  For debugging (``--local``) and tests.
    """

    def run(self, workflow: Workflow, blackboard: Any, instances: list[list[str]]) -> list[InstanceResult]:
        """Run ``workflow`` for each instance (a list of record IDs on ``blackboard``)."""
        if not instances:
            return []
        with frozen_heap():
            outputs = run_instances(workflow, _inputs(blackboard, instances))
            return _apply(blackboard, outputs)


class _JobFailed(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _short(e: BaseException) -> str:
    text = str(e).strip()
    for pattern in (r"(Python worker exited unexpectedly[^\n]*)", r"(PythonException:[^\n]*)", r"(\w+Error: [^\n]*)"):
        m = re.search(pattern, text)
        if m:
            return m.group(1)[:500]
    return (text.splitlines() or [type(e).__name__])[0][:500]


class SparkRunner:
    """Runs each batch as one Spark job (``mapInArrow`` over instances).

    Args:
        spark: the SparkSession (one per process; see :func:`spark_session`).
        batch_timeout: seconds a job may run before it is cancelled and its
            instances isolated by splitting.
    """

    def __init__(self, spark: Any, *, batch_timeout: float = 300.0,
                 isolation_budget: float = 900.0) -> None:
        self.spark = spark
        self.batch_timeout = float(batch_timeout)
        # Isolating a hang costs a batch_timeout per halving step; past this many
        # seconds the instances not yet run fail (to be retried) so that a batch
        # never holds its messages longer than the broker's consumer timeout.
        self.isolation_budget = float(isolation_budget)
        self._isolation_deadline = float("inf")

    def run(self, workflow: Workflow, blackboard: Any, instances: list[list[str]]) -> list[InstanceResult]:
        """Run ``workflow`` for each instance; see the module docstring."""
        if not instances:
            return []
        started = time.perf_counter()
        self._isolation_deadline = float("inf")
        with frozen_heap():
            outputs = self._run_rows(workflow, _inputs(blackboard, instances))
            outputs.sort(key=lambda o: o.index)
            results = _apply(blackboard, outputs)
        log.debug("batch of %d instance(s) of %s on Spark in %.3fs", len(instances), workflow.name,
                  time.perf_counter() - started, extra={"workflow": workflow.name})
        return results

    def healthy(self) -> bool:
        """False once the SparkContext is gone (stopped, or its JVM died)."""
        try:
            jsc = self.spark.sparkContext._jsc
            return jsc is not None and not jsc.sc().isStopped()
        except Exception:
            return False

    def warm_up(self) -> float:
        """Start the Python workers and import the engine there; return the seconds taken.

        The first job of a session pays for starting workers and importing
        pyarrow, lxml and the engine (seconds); a service does it before it
        takes its first batch.  No workflow or record is involved.
        """
        started = time.perf_counter()
        cores = max(1, int(self.spark.sparkContext.defaultParallelism))

        def touch(batches: Any) -> Any:
            import engine._worker  # noqa: F401  (what a real batch imports first)
            import pipelets  # noqa: F401
            yield from batches

        self.spark.range(cores, numPartitions=cores).mapInArrow(touch, "id long").collect()
        return time.perf_counter() - started

    def _run_rows(self, workflow: Workflow, rows: list[InstanceInput]) -> list[InstanceOutput]:
        if time.monotonic() > self._isolation_deadline:
            reason = (f"not run: isolating a failure in this batch took longer than "
                      f"{self.isolation_budget:g}s")
            return [InstanceOutput(r.index, False, reason, [], list(r.ids), None) for r in rows]
        try:
            return self._job(workflow, rows)
        except _JobFailed as e:
            if self._isolation_deadline == float("inf"):
                self._isolation_deadline = time.monotonic() + self.isolation_budget
            if len(rows) == 1:
                index, ids = rows[0].index, rows[0].ids
                log.warning("instance %d of %s isolated as poison: %s", index, workflow.name, e.reason,
                            extra={"workflow": workflow.name})
                return [InstanceOutput(index, False, e.reason, [], list(ids), None)]
            half = len(rows) // 2
            log.warning("job of %d instance(s) of %s failed (%s); splitting to isolate the cause",
                        len(rows), workflow.name, e.reason, extra={"workflow": workflow.name})
            return self._run_rows(workflow, rows[:half]) + self._run_rows(workflow, rows[half:])

    def _job(self, workflow: Workflow, rows: list[InstanceInput]) -> list[InstanceOutput]:
        spark = self.spark
        sc = spark.sparkContext
        # one chunk row per core: Spark makes a partition of each
        table = inputs_to_arrow(rows, max(1, int(sc.defaultParallelism)))
        wf = workflow

        def partition(batches: Any) -> Any:
            return arrow_partition(wf, batches)

        group = f"chalk-{workflow.name}-{uuid.uuid4().hex[:12]}"
        box: dict[str, Any] = {}

        def job() -> None:
            try:
                sc.setJobGroup(group, f"workflow {workflow.name}: {len(rows)} instance(s)", interruptOnCancel=True)
                df = spark.createDataFrame(table)
                box["table"] = df.mapInArrow(partition, CHUNK_DDL).toArrow()
            except BaseException as e:  # reported to the caller's thread
                box["error"] = e
            finally:
                sc.clearJobGroup() if hasattr(sc, "clearJobGroup") else None

        thread = threading.Thread(target=job, name=group, daemon=True)
        thread.start()
        thread.join(self.batch_timeout)
        if thread.is_alive():
            sc.cancelJobGroup(group)
            thread.join(30.0)
            raise _JobFailed(f"batch timeout: the job ran longer than {self.batch_timeout:g}s and was cancelled")
        if "error" in box:
            e = box["error"]
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise e
            raise _JobFailed(f"Spark task failed: {_short(e)}") from e
        result = box.get("table")
        if result is None:
            raise RunnerError("Spark job returned nothing")
        outputs = outputs_from_arrow(result)
        missing = {r.index for r in rows} - {o.index for o in outputs}
        if missing:
            raise RunnerError(f"Spark job lost instance(s) {sorted(missing)}")
        return outputs


def _cores(master: str) -> int:
    m = re.fullmatch(r"local\[(\d+|\*)(?:,\s*\d+)?\]", master.strip())
    if m and m.group(1) != "*":
        return int(m.group(1))
    return os.cpu_count() or 2


def spark_session(master: str = "local[*]", conf: dict[str, str] | None = None, *, app_name: str = "chalk") -> Any:
    """A SparkSession for Chalk (get-or-create: one per process).

    Sets ``PYSPARK_PYTHON``/``PYSPARK_DRIVER_PYTHON`` to this interpreter (so
    workers find pyarrow and the project), and defaults that fit: shuffle
    partitions = cores, Arrow on, UI and console progress off, worker reuse on
    (pipelets are configured once per worker).  ``conf`` overrides them.
    """
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    cores = _cores(master)
    settings = {
        "spark.sql.shuffle.partitions": str(cores),
        "spark.default.parallelism": str(cores),
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.python.worker.reuse": "true",
        "spark.sql.adaptive.enabled": "false",
    }
    if master.startswith("local"):
        settings["spark.driver.bindAddress"] = "127.0.0.1"
        settings["spark.driver.host"] = "127.0.0.1"
    settings.update(conf or {})
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(settings.get("spark.log.level", "WARN"))
    return spark
