"""What the Spark runner keeps of the jobs it has in flight.

Each job runs on a thread of its own, in a job group of its own
(:class:`Pending`); a batch may have two, its interpreter part and its
DataFrame part (:class:`Batch`).  A job that failed, or ran past the
runner's ``batch_timeout`` and was cancelled, is :class:`JobFailed` with a
short reason; isolating the instances that broke it may take at most the
batch's :class:`Budget` of time.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from engine._frames import FramePlan
from engine._warm import Call, WarmWorkers
from engine._worker import InstanceInput

__all__ = ["Batch", "Budget", "JobFailed", "Pending", "short_reason"]


class JobFailed(Exception):
    """A job failed as a whole, or was cancelled (``reason`` says which, shortly)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def short_reason(e: BaseException) -> str:
    """The line of a Spark failure that says what went wrong (at most 500 characters)."""
    text = str(e).strip()
    for pattern in (r"(Python worker exited unexpectedly[^\n]*)", r"(PythonException:[^\n]*)", r"(\w+Error: [^\n]*)"):
        m = re.search(pattern, text)
        if m:
            return m.group(1)[:500]
    return (text.splitlines() or [type(e).__name__])[0][:500]


@dataclass
class Batch:
    """A batch in flight: its interpreter part and its DataFrame part."""

    rows: list[InstanceInput]
    job: Pending | None
    plan: FramePlan | None
    frame_rows: list[tuple[int, str, list[str | None]]]
    frame_job: Pending | None
    ids: set[str]

    def cancel(self, sc: Any) -> None:
        for job in (self.job, self.frame_job):
            if job is not None:
                job.cancel(sc)


@dataclass
class Pending:
    """A submitted job: its group (for cancelling), thread and result box."""

    group: str
    box: dict[str, Any] = field(default_factory=dict)
    thread: threading.Thread | None = None
    started: float = 0.0
    warm: tuple[WarmWorkers, Call] | None = None   # the job is this call on warm workers

    def cancel(self, sc: Any) -> None:
        if self.thread is not None and self.thread.is_alive():
            if self.warm is not None:
                workers, call = self.warm
                workers.abort(call)
            sc.cancelJobGroup(self.group)  # a job of its own (also where the warm ones fell back)
            self.thread.join(30.0)


class Budget:
    """The time one batch may spend isolating failures (starts at the first failure)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.deadline = float("inf")

    def start(self) -> None:
        if self.deadline == float("inf"):
            self.deadline = time.monotonic() + self.seconds

    def spent(self) -> bool:
        return time.monotonic() > self.deadline
