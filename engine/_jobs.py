"""What the runners keep of the work they have in flight.

A batch's interpreter part runs as attempts (``engine._isolation``): chunks
on a pool's workers (:class:`PoolChunk`, each a request with the rows it
holds: Spark's warm workers, or the service's own) or a job of its own on a
thread of its own, in a job group of its own (:class:`JobAttempt` over a
:class:`Pending`); a batch may also have a DataFrame part (:class:`Batch`).
A job of its own that failed, or ran past the runner's ``batch_timeout`` and
was cancelled, is :class:`JobFailed` with a short reason.  The rows of an
attempt that failed are suspects, each rerun alone as an attempt of the same
kind: a chunk of its own on the workers (their supervisor kills it at its
limit) or, where there are none, a job of its own (cancelled at its
deadline; which pipelet it was in is not known there, so its reason names
the records).  An attempt whose runner never began it (its workers did not
start, a Python worker did not connect back) is nobody's failure: its rows
run elsewhere (``Outcome.again``).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from engine._errors import RunnerError
from engine._frames import FramePlan
from engine._isolation import Outcome, lone_or_suspects
from engine._pool import Pool, Request, Unavailable
from engine._progress import died_reason, on_records, timeout_reason
from engine._results import failed
from engine._wire import ChunkFailed
from engine._worker import (
    InstanceInput,
    InstanceOutput,
    frozen_heap,
    inputs_to_chunks,
    outputs_from_chunks,
    split_inputs,
)

__all__ = ["Batch", "ChunkCosts", "Failure", "JobAttempt", "JobFailed", "Pending", "PoolChunk",
           "chunk_failure", "never_started", "pool_attempts", "short_reason"]

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


# What Spark says when a task's Python worker never started: the task ran none of its chunk.
_NOT_STARTED = re.compile(r"Python worker (?:failed )?to connect back|waiting for the Python "
                          r"worker to connect back|Cannot run program|python worker.*"
                          r"(?:could not|failed to) (?:start|launch)", re.I)


def never_started(reason: str) -> bool:
    """Whether a failed job's reason says its Python workers never started."""
    return bool(_NOT_STARTED.search(reason))


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

    def cancel(self, sc: Any, wait: bool = True) -> None:
        if self.thread is not None and self.thread.is_alive():
            sc.cancelJobGroup(self.group)
            if wait:
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


class PoolChunk:
    """A chunk on a pool's workers (killed at its limit by their supervisor,
    ``engine._pool``); ``first``: of the batch's first run (else one suspect, rerun alone).
    ``measured(records, seconds)`` hears how long a chunk that came back ran."""

    def __init__(self, workers: Pool, rows: list[InstanceInput], request: Request,
                 first: bool, measured: Callable[[int, float], None] | None = None):
        self.deadline: float | None = None  # its supervisor keeps it to its limit
        self.workers = workers
        self.rows = rows
        self.request = request
        self.first = first
        self.measured = measured
        self.done = request.future

    def start(self) -> None:
        pass  # submitted already; the workers take the requests in turn

    def waiting(self) -> bool:
        return self.request.started is None

    def poll(self, now: float) -> Outcome | None:
        if not self.done.done():
            return None
        try:
            answer = self.done.result()
        except Unavailable as e:  # it never began: not its instances' fault
            return Outcome(again=self.rows, why=f"not run: {e}", after=self.workers)
        except Exception as e:
            return _failed_attempt(self.rows, chunk_failure(e, self.rows), self.first)
        with frozen_heap():
            outputs = outputs_from_chunks([answer]) if answer is not None else []
        missing = {r.index for r in self.rows} - {o.index for o in outputs}
        if missing:
            raise RunnerError(f"Spark job lost instance(s) {sorted(missing)}")
        if self.measured is not None:
            self.measured(sum(len(r.ids) for r in self.rows), self.request.seconds)
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
            if never_started(str(e.__cause__ or "")) or never_started(e.reason):
                return Outcome(again=self.rows, why=f"not run: a Spark job's Python workers did "
                               f"not start ({e.reason})", after="job")
            return _failed_attempt(self.rows, Failure(f"{e.reason} (on {on_records(records)})",
                                                      not e.timeout), self.first)

    def abandon(self, reason: str) -> list[InstanceOutput]:
        return [failed(row, reason) for row in self.rows]

    def cancel(self, sc: Any) -> None:
        if self.job is not None:
            self.job.cancel(sc)


class ChunkCosts:
    """What a record of each workflow costs a worker (seconds, a running mean of the chunks
    that came back), to cut a batch into chunks that each end within a given time."""

    PRIOR = 5e-4   # seconds a record, before any chunk of the workflow came back

    def __init__(self) -> None:
        self._per_record: dict[str, float] = {}

    def measured(self, workflow: str) -> Callable[[int, float], None]:
        def hear(records: int, seconds: float) -> None:
            if records > 0 and seconds > 0:
                now = seconds / records
                before = self._per_record.get(workflow)
                # a mean weighted by records: a chunk of one record says little
                share = min(1.0, records / 200)
                self._per_record[workflow] = now if before is None else \
                    before + (now - before) * share
        return hear

    def per_record(self, workflow: str) -> float:
        return self._per_record.get(workflow, self.PRIOR)

    def parts(self, workflow: str, rows: list[InstanceInput], slots: int,
              within: float | None) -> int:
        """Chunks for ``rows``: one per worker, or, ``within`` a number of seconds, as many as
        it takes for each to end within them."""
        if within is None or within <= 0:
            return slots
        records = sum(len(r.ids) for r in rows)
        return max(slots, min(len(rows), -(-int(records * self.per_record(workflow) * 1e6)
                                           // max(1, int(within * 1e6)))))


def pool_attempts(pool: Pool, workflow: Any, rows: list[InstanceInput], *, limit: float,
                  priority: int, first: bool, parts: int = 1,
                  measured: Callable[[int, float], None] | None = None) -> list[PoolChunk]:
    """``rows`` submitted to ``pool``: in ``parts`` chunks for a first run, else each alone (a
    suspect); raises :class:`~engine._pool.Unavailable` when the pool cannot run them."""
    compress = not pool.local  # a socket on this host: compressing would only cost CPU
    with frozen_heap():
        groups = split_inputs(rows, parts) if first else [[row] for row in rows]
        chunks = [inputs_to_chunks(group, 1, compress)[0] for group in groups]
    requests = pool.submit(workflow, chunks, compress, limit=limit, priority=priority)
    return [PoolChunk(pool, group, request, first, measured)
            for group, request in zip(groups, requests, strict=True)]
