"""Reading the job log back: statistics summed over members and intervals, a message's steps.

What ``chalk status``, ``chalk jobs`` and ``chalk dlq`` print, as data (the
tests read the same functions).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from listener_router.jobs._sketch import Sketch
from listener_router.jobs._tables import JobLogTables, LogEntry, StatRow
from listener_router.store import ServiceStore

__all__ = ["Summary", "Step", "statistics", "steps"]


@dataclass
class Summary:
    """One queue and workflow's statistics over a window: counts by metric (states and
    ``records``) and a histogram by duration metric (``latency``, ``stage:<name>``)."""

    queue: str
    workflow: str
    counts: dict[str, int] = field(default_factory=dict)
    durations: dict[str, Sketch] = field(default_factory=dict)
    first: float | None = None          # start of the earliest interval with data
    members: set[str] = field(default_factory=set)

    def rate(self, metric: str = "committed", now: float | None = None) -> float:
        """``metric`` per second from the first interval with data until ``now``."""
        if self.first is None:
            return 0.0
        seconds = max((time.time() if now is None else now) - self.first, 1.0)
        return self.counts.get(metric, 0) / seconds

    def percentile(self, metric: str, q: float) -> float | None:
        sketch = self.durations.get(metric)
        return None if sketch is None else sketch.quantile(q)


def summarize(rows: Iterable[StatRow]) -> dict[tuple[str, str], Summary]:
    """Sum statistics rows into one :class:`Summary` per ``(queue, workflow)``."""
    out: dict[tuple[str, str], Summary] = {}
    for row in rows:
        summary = out.get((row.queue, row.workflow))
        if summary is None:
            summary = out[(row.queue, row.workflow)] = Summary(row.queue, row.workflow)
        summary.first = row.period if summary.first is None else min(summary.first, row.period)
        summary.members.add(row.member)
        if row.sketch is None:
            summary.counts[row.metric] = summary.counts.get(row.metric, 0) + row.count
        else:
            sketch = summary.durations.setdefault(row.metric, Sketch())
            sketch.merge(Sketch.loads(row.sketch, row.count, row.total))
    return out


def statistics(store: ServiceStore, since: float | None = None, until: float | None = None
               ) -> dict[tuple[str, str], Summary]:
    """Statistics of intervals starting in ``[since, until)``, per ``(queue, workflow)``,
    all members and restarts summed."""
    return summarize(store.tables(JobLogTables).statistics(since, until))


@dataclass(frozen=True)
class Step:
    """One line of a message's life: ``received``, or the state its attempt ended in
    (``committed``, ``retrying``, ``dead``, ``duplicate``, ``replayed``, ``processed``,
    ``failed``), with the batch's seconds by stage when known."""

    at: float
    what: str
    entry: LogEntry
    seconds: dict[str, float] | None = None


def steps(store: ServiceStore, entries: list[LogEntry]) -> list[Step]:
    """The entries as steps in time order: each attempt's ``received`` and its outcome."""
    timings = store.tables(JobLogTables).batches(e.batch for e in entries if e.batch)
    out: list[Step] = []
    for e in entries:
        seconds = timings[e.batch][1] if e.batch in timings else None
        if e.received_at is not None and e.state not in ("replayed",):
            out.append(Step(e.received_at, "received", e))
        out.append(Step(e.at, e.state, e, seconds))
    out.sort(key=lambda s: (s.at, s.entry.id, s.what != "received"))
    return out
