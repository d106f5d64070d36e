"""What the Spark runner keeps of the work it has in flight.

A batch's interpreter part runs as attempts (``engine._isolation``): chunks
on the warm workers (:class:`WarmChunk`, each a request with the rows it
holds) or a job of its own on a thread of its own, in a job group of its own
(:class:`JobAttempt` over a :class:`Pending`); a batch may also have a
DataFrame part (:class:`Batch`).  A job of its own that failed, or ran past
the runner's ``batch_timeout`` and was cancelled, is :class:`JobFailed` with
a short reason.  The rows of an attempt that failed are suspects, each rerun
alone as an attempt of the same kind: a chunk of its own on the warm workers
(its task kills it at its limit) or, where there are none, a job of its own
(cancelled at its deadline; which pipelet it was in is not known there, so
its reason names the records).
"""

from __future__ import annotations

import logging
import re
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from engine._errors import RunnerError
from engine._frames import FramePlan
from engine._isolation import Outcome, lone_or_suspects
from engine._progress import died_reason, on_records, timeout_reason
from engine._results import failed
from engine._warm import ChunkFailed, Request, WarmUnavailable, WarmWorkers
from engine._worker import InstanceInput, InstanceOutput, frozen_heap, outputs_from_chunks

__all__ = ["Batch", "Failure", "JobAttempt", "JobFailed", "Pending", "WarmChunk", "chunk_failure",
           "short_reason"]

log = logging.getLogger(__name__)


class JobFailed(Exception):
    """A job failed as a whole, or was cancelled (``reason`` says which, shortly;
    ``timeout`` when it ran past the batch timeout)."""

    def __init__(self, reason: str, timeout: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.timeout = timeout


def short_reason(e: BaseException) -> str:
    """The line of a Spark failure that says what went wrong (at most 500 characters)."""
    text = str(e).strip()
    for pattern in (r"(Python worker exited unexpectedly(?: \([^)\n]*\))?)", r"(PythonException:[^\n]*)",
                    r"(\w+Error: [^\n]*)"):
        m = re.search(pattern, text)
        if m:
            return m.group(1)[:500]
    return (text.splitlines() or [type(e).__name__])[0][:500]


@dataclass(frozen=True)
class Failure:
    """Why a chunk or job failed, in words naming its records; ``rerun``: whether an
    instance that was alone in it runs again (a crash may have been a neighbour's or the
    machine's; a timeout is its own)."""

    reason: str
    rerun: bool


def chunk_failure(e: BaseException, rows: list[InstanceInput]) -> Failure:
    """The failure of a warm chunk that raised ``e``."""
    records = [rid for row in rows for rid in row.ids]
    if isinstance(e, ChunkFailed):
        if e.kind == "timeout":
            return Failure(timeout_reason(e.call, e.seconds, records), False)
        return Failure(died_reason(e.how, e.call, records), True)
    return Failure(f"Spark task failed: {short_reason(e)} (on {on_records(records)})", True)


@dataclass
class Pending:
    """A job of its own: its group (for cancelling), thread, result box, and ``done``
    (resolved when the thread ends)."""

    group: str
    box: dict[str, Any] = field(default_factory=dict)
    thread: threading.Thread | None = None
    started: float = 0.0
    done: Future[None] = field(default_factory=Future)

    def cancel(self, sc: Any) -> None:
        if self.thread is not None and self.thread.is_alive():
            sc.cancelJobGroup(self.group)
            self.thread.join(30.0)


@dataclass
class Batch:
    """A batch in flight: its interpreter part (attempts) and its DataFrame part."""

    rows: list[InstanceInput]
    attempts: list[Any]
    plan: FramePlan | None
    frame_rows: list[tuple[int, str, list[str | None]]]
    frame_job: Pending | None
    ids: set[str]

    def cancel(self, sc: Any) -> None:
        for attempt in self.attempts:
            attempt.cancel(sc)
        if self.frame_job is not None:
            self.frame_job.cancel(sc)


def _failed_attempt(rows: list[InstanceInput], failure: Failure, first: bool) -> Outcome:
    if not first:  # a rerun holds one instance: that is the culprit
        return Outcome([failed(row, failure.reason) for row in rows])
    log.warning("%d instance(s) failed together: %s", len(rows), failure.reason)
    return lone_or_suspects(rows, failure.reason, failure.rerun)


class WarmChunk:
    """A chunk on the warm workers (killed at its limit by its task, ``engine._warm_task``);
    ``first``: of the batch's first run (else one suspect, rerun alone)."""

    def __init__(self, workers: WarmWorkers, rows: list[InstanceInput], request: Request,
                 first: bool):
        self.deadline: float | None = None  # its task keeps it to its limit
        self.workers = workers
        self.rows = rows
        self.request = request
        self.first = first
        self.done = request.future

    def start(self) -> None:
        pass  # submitted already; the warm workers take the requests in turn

    def waiting(self) -> bool:
        return self.request.started is None

    def poll(self, now: float) -> Outcome | None:
        if not self.done.done():
            return None
        try:
            answer = self.done.result()
        except WarmUnavailable:
            # the warm workers did not start: rerun its instances as jobs of their own
            return Outcome(suspects=self.rows) if self.first else \
                Outcome([failed(row, "not run: the warm workers could not be started")
                         for row in self.rows])
        except Exception as e:
            return _failed_attempt(self.rows, chunk_failure(e, self.rows), self.first)
        with frozen_heap():
            outputs = outputs_from_chunks([answer]) if answer is not None else []
        missing = {r.index for r in self.rows} - {o.index for o in outputs}
        if missing:
            raise RunnerError(f"Spark job lost instance(s) {sorted(missing)}")
        return Outcome(outputs)

    def abandon(self, reason: str) -> list[InstanceOutput]:
        self.workers.abandon([self.request])
        return [failed(row, reason) for row in self.rows]

    def cancel(self, sc: Any) -> None:
        self.workers.abandon([self.request])


class JobAttempt:
    """Rows as a Spark job of their own, cancelled at ``batch_timeout`` from its start;
    a rerun's job starts with :meth:`start`."""

    def __init__(self, runner: Any, workflow: Any, rows: list[InstanceInput],
                 job: Pending | None = None):
        self.runner = runner
        self.workflow = workflow
        self.rows = rows
        self.first = job is not None
        self.job = job
        self.done: Future[None] = job.done if job is not None else Future()
        self.deadline: float | None = None if job is None else job.started + runner.batch_timeout

    def start(self) -> None:
        self.job = self.runner.start_rows(self.workflow, self.rows)
        self.deadline = self.job.started + self.runner.batch_timeout
        self.job.done.add_done_callback(lambda _f: self.done.set_result(None))

    def waiting(self) -> bool:
        return False

    def poll(self, now: float) -> Outcome | None:
        job = self.job
        if job is None or job.thread is None:
            return None
        seconds = self.runner.batch_timeout
        records = [rid for row in self.rows for rid in row.ids]
        if job.thread.is_alive():
            if self.deadline is None or now <= self.deadline:
                return None
            job.cancel(self.runner.spark.sparkContext)
            return _failed_attempt(self.rows, Failure(timeout_reason(None, seconds, records),
                                                      False), self.first)
        try:
            return Outcome(self.runner.collect(self.workflow, self.rows, job))
        except JobFailed as e:
            return _failed_attempt(self.rows, Failure(f"{e.reason} (on {on_records(records)})",
                                                      not e.timeout), self.first)

    def abandon(self, reason: str) -> list[InstanceOutput]:
        return [failed(row, reason) for row in self.rows]

    def cancel(self, sc: Any) -> None:
        if self.job is not None:
            self.job.cancel(sc)
