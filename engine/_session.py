"""The SparkSession Chalk runs on: one per process, with defaults that fit its jobs."""

from __future__ import annotations

import os
import re
import sys
from typing import Any

__all__ = ["exclude_local_folding", "spark_session"]

_LOCAL_JVM_OPTIONS = "-XX:+UseSerialGC"
# Spark folds a projection over local data into the driver, single-threaded and
# interpreted; a DataFrame job must run as tasks with generated code instead.
_LOCAL_FOLDING = "org.apache.spark.sql.catalyst.optimizer.ConvertToLocalRelation"


def exclude_local_folding(spark: Any) -> None:
    """Keep Spark from folding a projection over local data into the driver (DataFrame forms)."""
    rules = [r.strip() for r in (spark.conf.get("spark.sql.optimizer.excludedRules", "") or "").split(",") if r.strip()]
    if _LOCAL_FOLDING not in rules:
        spark.conf.set("spark.sql.optimizer.excludedRules", ",".join([*rules, _LOCAL_FOLDING]))


def _cores(master: str) -> int | None:
    """The cores a local master runs on; None for a cluster (its executors' cores count)."""
    m = re.fullmatch(r"local\[(\d+|\*)(?:,\s*\d+)?\]", master.strip())
    if m and m.group(1) != "*":
        return int(m.group(1))
    if master.strip().startswith("local"):
        return os.cpu_count() or 2
    return None


def spark_session(master: str = "local[*]", conf: dict[str, str] | None = None, *, app_name: str = "chalk") -> Any:
    """A SparkSession for Chalk (get-or-create: one per process).

    Sets ``PYSPARK_PYTHON``/``PYSPARK_DRIVER_PYTHON`` to this interpreter (so
    workers find pyarrow and the project; ``conf["spark.pyspark.python"]``
    names another one for executors, e.g. the path of the environment on
    the worker hosts), and defaults that fit: on a local master parallelism
    and shuffle partitions = cores (on a cluster Spark counts the executors'
    cores), Arrow on, UI and console progress off, worker reuse on (pipelets
    are configured once per worker), Spark's Python daemon without shutdown
    tracebacks (:mod:`engine._daemon`).  ``conf`` overrides them.
    """
    # PySpark sends the driver's PYSPARK_PYTHON with every task as the
    # executors' interpreter; an in-process driver never reads spark.pyspark.python.
    os.environ["PYSPARK_PYTHON"] = (conf or {}).get("spark.pyspark.python") or sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    cores = _cores(master)
    settings = {
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.python.worker.reuse": "true",
        "spark.sql.adaptive.enabled": "false",
        # The JVM and its Python workers talk over a Unix socket: over TCP on
        # loopback each Python job waited ~40 ms for its input (Nagle's
        # algorithm against a delayed ACK), most of a small job's fixed cost.
        "spark.python.unix.domain.socket.enabled": "true",
        # Spark's daemon, quiet when the JVM closes an idle worker's connection at the
        # end (engine._daemon): no BrokenPipeError tracebacks in the service's log.
        "spark.python.daemon.module": "engine._daemon",
    }
    if cores is not None:
        # A cluster's default parallelism is its executors' cores, which the
        # runner reads per batch: the driver host's cores would leave the rest idle.
        settings["spark.sql.shuffle.partitions"] = str(cores)
        settings["spark.default.parallelism"] = str(cores)
    if master.startswith("local"):
        settings["spark.driver.bindAddress"] = "127.0.0.1"
        settings["spark.driver.host"] = "127.0.0.1"
        # The serial collector: the embedded JVM's heap is small and a parallel
        # collector's threads would take cores from the Python workers.  The
        # optimizing JIT stays on: pipelets' DataFrame forms run their regular
        # expressions in the JVM (measured 1.4x the records/s of C1 alone).
        settings["spark.driver.extraJavaOptions"] = _LOCAL_JVM_OPTIONS
    settings.update(conf or {})
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(settings.get("spark.log.level", "WARN"))
    return spark
