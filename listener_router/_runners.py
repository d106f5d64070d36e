"""The workflow runner the settings ask for: Spark (the default) or the service's own workers."""

from __future__ import annotations

import os
from typing import Any

import engine
from listener_router._settings import Settings
from listener_router.pipeline import Runner

__all__ = ["close_runner", "make_runner", "service_workers"]


def service_workers(settings: Settings) -> int:
    """Worker processes the service keeps for runs outside Spark: ``[engine]
    service_workers``, else the cores for ``runner = "local"`` and at most two beside Spark."""
    if settings.service_workers:
        return settings.service_workers
    cores = os.cpu_count() or 2
    return cores if settings.runner == "local" else min(2, cores)


def make_runner(settings: Settings, spark: Any = None) -> Runner:
    """``ProcessRunner`` (``[engine] runner = "local"``), or ``SparkRunner`` on ``spark`` (a
    session made from the settings when None) with the service's own workers beside it
    (small batches, and a home for batches when Spark's warm workers cannot start)."""
    # The process's pool: a service started again in the same process (tests, `chalk
    # process` beside a service) finds its workers up.
    service = engine.ProcessRunner(workers=service_workers(settings),
                                   batch_timeout=settings.batch_timeout,
                                   isolation_budget=settings.isolation_budget, shared=True)
    if settings.runner == "local":
        return service
    if spark is None:
        spark = engine.spark_session(settings.spark_master, dict(settings.spark_conf))
    return engine.SparkRunner(spark,
                              batch_timeout=settings.batch_timeout,
                              isolation_budget=settings.isolation_budget,
                              frames=settings.dataframe_forms,
                              warm=settings.warm_workers,
                              service=service)


def close_runner(runner: Any) -> None:
    """Stop the service's workers a runner :func:`make_runner` made (Spark's warm workers
    belong to the SparkContext)."""
    for one in (runner, getattr(runner, "service", None)):
        close = getattr(one, "close", None)
        if close is not None:
            close()
