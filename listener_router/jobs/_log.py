"""The job log's writer: every message's life and the statistics, per batch.

:class:`JobLog` is a plug-in (built while ``[jobs] log`` is on) with three hooks:

- in the commit transaction (``in_commit``) it logs each committed message
  on the inbox row its commit writes (``Commit.inbox_log``), and adds to
  the outcome counts: no row of its own per message, never a write of its
  own on the hot path, and a committed message is logged exactly when its
  records are.  A message a plug-in committed without a run (``Work.step``,
  the delta plug-in's ``unchanged``) is logged and counted under that step;
- settled (``settled``) it sees every settled message before its ack: it
  writes rows for the retried, dead-lettered and duplicate ones (one small
  transaction, only when there are any; a step written again after a crash
  is skipped by the log's unique index) and counts each committed message's
  latency (taken up → settled);
- once a batch is finished (``batch_finished``) it keeps the batch's row
  (member, seconds by stage) and adds its stage times to the duration
  histograms.

Batch rows and histograms are merged into this member's statistics rows
every ``flush_every`` seconds and at close, in one transaction (a crash
loses at most that much of the durations; the counts and the log rows are
never lost).  A failed write is kept and tried again with the next one.
The leader drops rows older than ``[node] retention_days`` (:class:`JobLogRetention`).

``chalk process`` runs through the pipeline too (``listener_router._offline``),
with no inbox: :class:`ProcessLog`, the log of such a run, writes its
messages (queue ``(process)``) as rows of their own, ``processed`` in the
commit transaction and ``failed`` when settled; batch rows and stage times
as above.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import orjson
from sqlalchemy import Connection

from listener_router._messages import ATTEMPTS_HEADER, derive_message_id
from listener_router._offline import PROCESS_QUEUE
from listener_router._plugin import Host, Plugin
from listener_router.cluster import LeaderTask
from listener_router.jobs._settings import JobsSettings
from listener_router.jobs._sketch import Sketch
from listener_router.jobs._tables import SCHEMA, JobLogTables, LogRow, StatRow
from listener_router.pipeline import BatchReport, Commit, State, Work
from listener_router.store import InboxLog, Schema, ServiceStore, unavailable

if TYPE_CHECKING:
    from listener_router._settings import Settings

__all__ = ["JobLog", "JobLogRetention", "ProcessLog", "PROCESS_QUEUE", "REPLAYS_HEADER"]

log = logging.getLogger(__name__)

REPLAYS_HEADER = "x-chalk-replays"    # set by ``chalk dlq replay``: the round of a message
FLUSH_EVERY = 2.0

_OUTCOMES = {State.RETRYING: "retrying", State.DEAD: "dead", State.DUPLICATE: "duplicate",
             State.CANCELLED: "cancelled"}

Key = tuple[float, str, str, str]     # (period, queue, workflow, metric)
Other = tuple[str, str, str, str, float]


@dataclass(eq=False)
class _Seen:
    """What the log knows of a batch in flight."""

    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    pairs: set[tuple[str, str]] = field(default_factory=set)   # (queue, workflow)


def _int(value: object) -> int:
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    try:
        return int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return 0


class JobLog(Plugin):
    """Writes the job log and its statistics for one member (see the module doc).

    As a plug-in it is built by :meth:`build` and given its store and member
    at install; ``JobLog(store, member)`` makes one ready to write (``chalk
    process``, tests).
    """

    name = "jobs"
    sections = (JobsSettings,)

    @classmethod
    def build(cls, settings: Settings) -> JobLog | None:
        jobs: JobsSettings = settings.section("jobs")
        if not jobs.log:
            return None
        log_ = cls(None, "", interval=jobs.stats_interval)
        log_.retention_days = settings.retention_days
        return log_

    def __init__(self, store: ServiceStore | None, member: str, *, interval: float = 60.0,
                 flush_every: float = FLUSH_EVERY):
        self.store: ServiceStore = cast(ServiceStore, store)   # given at install when None
        self.member = member
        self.interval = interval
        self.flush_every = flush_every
        self.retention_days = 7.0
        self.log_tables: JobLogTables | None = store.tables(JobLogTables) if store else None
        self._lock = threading.Lock()
        self._batches: weakref.WeakKeyDictionary[BatchReport, _Seen] = weakref.WeakKeyDictionary()
        self._sketches: dict[Key, Sketch] = {}
        self._batch_rows: list[tuple[str, str, float, float, int, str]] = []
        self._unwritten: list[tuple[list[LogRow], list[Other]]] = []
        self._flushed = time.monotonic()

    # -- as a plug-in ------------------------------------------------------------------------
    def tables(self) -> list[Schema]:
        return [SCHEMA]

    def install(self, host: Host) -> None:
        self.store = host.store
        self.member = host.node
        self.log_tables = host.store.tables(JobLogTables)

    def stop(self) -> None:
        self.flush()

    def leader_tasks(self) -> list[LeaderTask]:
        assert self.log_tables is not None
        return [JobLogRetention(self.store, self.log_tables, self.retention_days)]

    def in_commit(self, commit: Commit) -> None:
        self.in_transaction(commit)

    # -- writing ---------------------------------------------------------------------------
    def period(self, at: float) -> float:
        """The start of the statistics interval ``at`` falls in."""
        return math.floor(at / self.interval) * self.interval

    def _seen(self, report: BatchReport | None) -> _Seen | None:
        if report is None:
            return None
        with self._lock:
            seen = self._batches.get(report)
            if seen is None:
                seen = self._batches[report] = _Seen()
            return seen

    # -- in the commit transaction --------------------------------------------------------
    def in_transaction(self, commit: Commit) -> None:
        seen = self._seen(commit.report)
        batch = seen.id if seen is not None else None
        at = time.time()
        period = self.period(at)
        workflow, member = commit.workflow, self.member
        logged = commit.inbox_log = InboxLog(workflow, member, batch)
        append = logged.rows.append
        others: list[Other] = []
        messages: dict[tuple[str, str], int] = {}    # (queue, committed or a step) → n
        records: dict[str, int] = {}
        sent: dict[str, int] = {}
        for source, _message in commit.outgoing:
            sent[source] = sent.get(source, 0) + 1
        for w in commit.committed:
            m = w.received
            assert m is not None and w.message is not None
            ids = m.record_ids
            queue = m.queue
            replays = m.headers.get(REPLAYS_HEADER)
            append((_int(replays) if replays else 0, m.attempts, w.received_at,
                    ids[0] if ids else None, len(ids), sent.get(m.message_id, 0)))
            if len(ids) > 1:
                others += [(rid, queue, m.message_id, ids[0], at) for rid in ids[1:]]
            key = (queue, w.step or "committed")
            messages[key] = messages.get(key, 0) + 1
            if w.step is None:  # the records its run committed
                records[queue] = records.get(queue, 0) + len(w.message.record_ids)
        counts = {(period, q, workflow, step): n for (q, step), n in messages.items()}
        counts.update({(period, q, workflow, "records"): n for q, n in records.items()})
        conn = commit.connection
        JobLogTables.write(conn, (), others)
        JobLogTables.add_counts(conn, member, counts)
        if seen is not None:
            with self._lock:
                seen.pairs.update((q, workflow) for q, _step in messages)

    # -- settled, before the ack ----------------------------------------------------------
    def settled(self, works: Sequence[Work], report: BatchReport | None) -> None:
        at = time.time()
        period = self.period(at)
        seen = self._seen(report)
        batch = seen.id if seen is not None else None
        rows: list[LogRow] = []
        others: list[Other] = []
        taken: dict[tuple[str, str], list[float]] = {}   # committed: when each was taken up
        committed = State.COMMITTED
        for w in works:
            if w.state is committed:
                key = (w.message.queue, w.workflow or "")  # type: ignore[union-attr]
                found = taken.get(key)
                if found is None:
                    found = taken[key] = []
                found.append(w.received_at)
                continue
            outcome = _OUTCOMES.get(w.state)
            if outcome is not None:
                row, extra = self._row(w, outcome, at, batch)
                rows.append(row)
                others += extra
                taken.setdefault((row[2], row[6] or ""), [])
        with self._lock:
            for (queue, workflow), times in taken.items():
                if times:
                    self._sketch((period, queue, workflow, "latency")).add_many(
                        at - t for t in times)
            if seen is not None:
                seen.pairs.update(taken)
        if rows:
            self._write_outcomes(rows, others)

    def _row(self, w: Work, state: str, at: float, batch: str | None
             ) -> tuple[LogRow, list[Other]]:
        m, d = w.received, w.delivery
        if m is not None:
            queue, mid, attempt, ids, headers = (m.queue, m.message_id, m.attempts, m.record_ids,
                                                 m.headers)
        else:  # not parsed: bad input
            queue, mid, ids, headers = (d.queue, d.message_id or derive_message_id(d.body), [],
                                        d.headers)
            attempt = _int(headers.get(ATTEMPTS_HEADER))
        workflow = w.workflow or (w.rule.workflow if w.rule is not None else None)
        first = ids[0] if ids else None
        row: LogRow = (at, state, queue, mid, _int(headers.get(REPLAYS_HEADER)), attempt,
                       workflow, self.member, batch, w.received_at, first, len(ids), 0,
                       None if state == "duplicate" else (w.error or "")[:4000])
        return row, [(rid, queue, mid, ids[0], at) for rid in ids[1:]]

    def _write_outcomes(self, rows: list[LogRow], others: list[Other]) -> None:
        """Rows of steps outside a commit transaction (each once; counted when new)."""
        try:
            with self.store.writes, unavailable(), self.store.engine.begin() as conn:
                self._insert_once(conn, rows, others)
        except Exception as e:  # the ack goes ahead; the rows wait for the next write
            log.warning("job log: could not write %d row(s), trying again later: %s",
                        len(rows), e)
            with self._lock:
                self._unwritten.append((rows, others))

    def _insert_once(self, conn: Connection, rows: Sequence[LogRow],
                     others: Sequence[Other]) -> None:
        """Insert each row unless its step is logged already; count the new ones (rows
        outside commits are few: a statement each lets the counts stay exact)."""
        counts: dict[Key, int] = {}
        for row in rows:
            if JobLogTables.write_once(conn, row):
                key = (self.period(row[0]), row[2], row[6] or "", row[1])
                counts[key] = counts.get(key, 0) + 1
        JobLogTables.write(conn, (), others)
        JobLogTables.add_counts(conn, self.member, counts)

    # -- the batch is finished ------------------------------------------------------------
    def batch_finished(self, report: BatchReport) -> None:
        with self._lock:
            seen = self._batches.pop(report, None)
            if seen is not None and seen.pairs:
                period = self.period(report.finished)
                for stage, seconds in report.seconds.items():
                    for queue, workflow in seen.pairs:
                        self._sketch((period, queue, workflow, f"stage:{stage}")).add(seconds)
                self._batch_rows.append((seen.id, self.member, report.opened, report.finished,
                                         report.messages, orjson.dumps(report.seconds).decode()))
        if time.monotonic() - self._flushed >= self.flush_every:
            self.flush()

    def _sketch(self, key: Key) -> Sketch:
        sketch = self._sketches.get(key)
        if sketch is None:
            sketch = self._sketches[key] = Sketch()
        return sketch

    def flush(self) -> None:
        """Write kept batch rows and merge the histograms into the stored statistics."""
        with self._lock:
            sketches, self._sketches = self._sketches, {}
            batch_rows, self._batch_rows = self._batch_rows, []
            unwritten, self._unwritten = self._unwritten, []
            self._flushed = time.monotonic()
        if not (sketches or batch_rows or unwritten):
            return
        try:
            with self.store.writes, unavailable(), self.store.engine.begin() as conn:
                for rows, others in unwritten:
                    self._insert_once(conn, rows, others)
                JobLogTables.write_batches(conn, batch_rows)
                stored = JobLogTables.stat_rows(conn, self.member, sketches)
                JobLogTables.put_sketches(conn, self.member, {
                    key: _merged(stored.get(key), delta) for key, delta in sketches.items()})
        except Exception as e:  # kept for the next flush
            log.warning("job log: could not write statistics, trying again later: %s", e)
            with self._lock:
                for key, delta in sketches.items():
                    self._sketch(key).merge(delta)
                self._batch_rows[:0] = batch_rows
                self._unwritten[:0] = unwritten

    def close(self) -> None:
        self.flush()


def _merged(stored: StatRow | None, delta: Sketch) -> tuple[int, float, str]:
    total = Sketch.loads(stored.sketch, stored.count, stored.total) if stored else Sketch()
    total.merge(delta)
    return total.count, total.total, total.dumps()


class JobLogRetention(LeaderTask):
    """Drop the job log's rows and statistics older than ``retention_days``."""

    name = "job_log_retention"

    def __init__(self, store: ServiceStore, tables: JobLogTables, days: float):
        self.store = store
        self.tables = tables
        self.days = days

    def run(self) -> int:
        with self.store.writes, unavailable():
            return self.tables.purge(self.days * 86400.0)


class ProcessLog(JobLog):
    """The job log of a ``chalk process`` run: member ``process <host>/<pid>``, queue
    ``(process)``; a row per record (its hooks write them, see the module doc) and a batch
    row per chunk.  Statistics are written when it stops."""

    def __init__(self, store: ServiceStore, *, interval: float = 60.0):
        super().__init__(store, f"process {socket.gethostname()}/{os.getpid()}",
                         interval=interval, flush_every=math.inf)

    def in_transaction(self, commit: Commit) -> None:
        """A row per committed record (``processed``): there is no inbox row to log on."""
        seen = self._seen(commit.report)
        batch = seen.id if seen is not None else None
        at = time.time()
        workflow, member = commit.workflow, self.member
        rows: list[LogRow] = []
        others: list[Other] = []
        records = 0
        for w in commit.committed:
            m = w.message
            assert m is not None
            ids = m.record_ids
            records += len(ids)
            rows.append((at, "processed", m.queue, m.message_id, 0, m.attempts, workflow,
                         member, batch, w.received_at, ids[0] if ids else None, len(ids), 0,
                         None))
            others += [(rid, m.queue, m.message_id, ids[0], at) for rid in ids[1:]]
        conn = commit.connection
        JobLogTables.write(conn, rows, others)
        period = self.period(at)
        JobLogTables.add_counts(conn, member, {
            (period, PROCESS_QUEUE, workflow, "processed"): len(rows),
            (period, PROCESS_QUEUE, workflow, "records"): records})
        if seen is not None:
            with self._lock:
                seen.pairs.add((PROCESS_QUEUE, workflow))

    def settled(self, works: Sequence[Work], report: BatchReport | None) -> None:
        """A row per record that did not commit (``failed``: nothing is retried); the
        latency of those that did (read → committed)."""
        at = time.time()
        seen = self._seen(report)
        batch = seen.id if seen is not None else None
        rows: list[LogRow] = []
        others: list[Other] = []
        done = [at - w.received_at for w in works
                if w.state is State.COMMITTED and w.received_at is not None]
        if done:
            workflow = next(w.workflow for w in works if w.state is State.COMMITTED) or ""
            with self._lock:
                self._sketch((self.period(at), PROCESS_QUEUE, workflow, "latency")).add_many(done)
        for w in works:
            if w.state is not State.COMMITTED:
                row, extra = self._row(w, "failed", at, batch)
                rows.append(row)
                others += extra
        if rows:
            if seen is not None:
                with self._lock:
                    seen.pairs.update((row[2], row[6] or "") for row in rows)
            self._write_outcomes(rows, others)
