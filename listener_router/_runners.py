"""The workflow runner the settings ask for: Spark (the default) or this process."""

from __future__ import annotations

from typing import Any

import engine
from listener_router._settings import Settings
from listener_router.pipeline import Runner

__all__ = ["make_runner"]


def make_runner(settings: Settings, spark: Any = None) -> Runner:
    """``LocalRunner`` (``[engine] runner = "local"``), or ``SparkRunner`` on ``spark`` (a
    session made from the settings when None)."""
    if settings.runner == "local":
        return engine.LocalRunner(batch_timeout=settings.batch_timeout,
                                  isolation_budget=settings.isolation_budget)
    if spark is None:
        spark = engine.spark_session(settings.spark_master, dict(settings.spark_conf))
    return engine.SparkRunner(spark,
                              batch_timeout=settings.batch_timeout,
                              isolation_budget=settings.isolation_budget,
                              frames=settings.dataframe_forms,
                              warm=settings.warm_workers)
