"""``[jobs]``: the job log and its statistics."""

from __future__ import annotations

from dataclasses import dataclass

from listener_router._keys import section, setting

__all__ = ["JobsSettings"]


@section("jobs", "The job log: every message's life and statistics per queue and workflow, "
         "kept in the database (`chalk jobs`, `chalk status`, `chalk dlq`).",
         flat={"job_log": "log", "stats_interval": "stats_interval"})
@dataclass(frozen=True)
class JobsSettings:
    """The ``[jobs]`` keys."""

    log: bool = setting(True, "keep the job log: every message's steps and statistics "
                        "(false: `chalk jobs` and the statistics stay empty)")
    stats_interval: float = setting(60.0, "seconds per statistics row (rates and p50/p99 "
                                    "sum the rows)", minimum=1)
