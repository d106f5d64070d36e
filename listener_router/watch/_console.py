"""The data behind the operator's panels: lanes, cancellations, schedules, journal
subscribers, and the charts drawn from the persisted statistics.

Like ``_panels``, one function per panel, each reading what the service or
the ``chalk`` command reads: the lanes from the live view (what this member
does now) and the store (who paused a lane, when and why: what every
member obeys), schedules as ``chalk schedules`` reads them, subscribers as
``chalk journal status`` does, the charts from the job log's
``chalk_job_stats`` (every member's rows, summed: they survive a restart).
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from listener_router._settings import Settings
from listener_router.jobs import JobLogTables, JobsSettings, Sketch
from listener_router.schedules import ScheduleStatus, schedule_status
from listener_router.store import Cancellation, LaneState, ServiceStore
from listener_router.watch._svg import line_chart

if TYPE_CHECKING:
    from listener_router._live import LiveView
    from listener_router.journal import Head, SubscriberView
    from listener_router.pipeline import LaneView
    from listener_router.watch._history import Sample

__all__ = ["WINDOWS", "JournalView", "LaneRow", "QueueStats", "cancellations", "journals",
           "lanes", "schedules", "statistics", "stats_interval"]


# -- lanes ---------------------------------------------------------------------------
@dataclass(frozen=True)
class LaneRow:
    """A lane as this member runs it (``view``), with what the store says of its pause and
    its back-pressure in numbers."""

    view: LaneView
    state: LaneState | None           # the last pause or resume (by whom, when, why)
    max_output_depth: int | None
    output_depth: int | None          # the depth of the output queue holding it back

    @property
    def paused(self) -> bool:
        """Paused in the store (what every member obeys within a second) or here."""
        return self.view.paused or bool(self.state and self.state.paused)


def lanes(live: LiveView, store: ServiceStore, sample: Sample | None) -> list[LaneRow]:
    """Each lane: paused (by whom, since, why), priority, rate and share, order,
    back-pressure (the output queue over ``max_output_depth``, its depth), batches
    running, waiting messages."""
    states = store.lanes.all()
    limits = {rule.queue: rule.max_output_depth for rule in live.settings.listeners}
    rows = []
    for view in live.lanes():
        depth = None
        if view.backed_up is not None and sample is not None:
            depth = sample.depth.get(view.backed_up)
        rows.append(LaneRow(view, states.get(view.queue), limits.get(view.queue), depth))
    return rows


def cancellations(store: ServiceStore) -> list[Cancellation]:
    """The cancellations in force, newest first."""
    return list(reversed(store.cancellations.active()))


# -- schedules and journal subscribers -----------------------------------------------
def schedules(settings: Settings, store: ServiceStore) -> list[ScheduleStatus]:
    """Each ``[[schedule]]`` with its last and next tick (as ``chalk schedules``)."""
    return schedule_status(settings, store)


@dataclass(frozen=True)
class JournalView:
    name: str
    head: Head | None
    subscribers: list[SubscriberView]
    error: str = ""


def journals(settings: Settings) -> list[JournalView]:
    """Each ``[[journal]]``'s head and subscribers (lag, blocked, errors), as
    ``chalk journal status`` reads them (the status stream: a second or two each)."""
    from listener_router.journal import journal_status

    out = []
    for rule in settings.section("journal"):
        try:
            head, views = journal_status(settings, rule.name)
            out.append(JournalView(rule.name, head, views))
        except Exception as e:  # the broker is down, the stream not made yet: say so
            out.append(JournalView(rule.name, None, [], f"{type(e).__name__}: {e}"))
    return out


# -- charts from the persisted statistics --------------------------------------------
WINDOWS = {"1h": 3600.0, "6h": 6 * 3600.0, "24h": 86400.0}


@dataclass(frozen=True)
class QueueStats:
    """One queue over the window, every member summed: totals and two charts."""

    queue: str
    workflows: list[str]
    counts: dict[str, int]
    p50: float | None
    p99: float | None
    members: int
    rates: str                        # SVG: committed/s and failed/s per interval
    latency: str                      # SVG: p50 and p99 per interval


def statistics(settings: Settings, store: ServiceStore, window: str = "1h",
               now: float | None = None) -> list[QueueStats]:
    """Per queue, from ``chalk_job_stats`` over ``window`` (a key of :data:`WINDOWS`):
    messages by state, latency p50/p99, and the charts per statistics interval."""
    now = time.time() if now is None else now
    seconds = WINDOWS.get(window, WINDOWS["1h"])
    interval = stats_interval(settings)
    start = now - seconds
    counts: dict[str, dict[tuple[float, str], int]] = defaultdict(lambda: defaultdict(int))
    sketches: dict[str, dict[float, Sketch]] = defaultdict(dict)
    workflows: dict[str, set[str]] = defaultdict(set)
    members: dict[str, set[str]] = defaultdict(set)
    for row in store.tables(JobLogTables).statistics(start - interval):
        members[row.queue].add(row.member)
        if row.workflow:
            workflows[row.queue].add(row.workflow)
        if row.sketch is None:
            counts[row.queue][(row.period, row.metric)] += row.count
        elif row.metric == "latency":
            sketch = sketches[row.queue].setdefault(row.period, Sketch())
            sketch.merge(Sketch.loads(row.sketch, row.count, row.total))
    out = []
    for queue in sorted(set(counts) | set(sketches)):
        by_state: dict[str, int] = defaultdict(int)
        periods: dict[float, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for (period, metric), n in counts[queue].items():
            by_state[metric] += n
            periods[period][metric] += n
        points = sorted(periods)
        done = [(p + interval, (c["committed"] + c["processed"]) / interval)
                for p, c in ((p, periods[p]) for p in points)]
        failed = [(p + interval, (c["retrying"] + c["dead"] + c["failed"]) / interval)
                  for p, c in ((p, periods[p]) for p in points)]
        series = [("committed/s", "#2a9d3a", done)]
        if any(v for _t, v in failed):
            series.append(("failed/s", "#c0392b", failed))
        latency = sketches[queue]
        whole = Sketch()
        for sketch in latency.values():
            whole.merge(sketch)
        lat = sorted(latency)
        out.append(QueueStats(
            queue, sorted(workflows[queue]), dict(by_state), whole.quantile(0.5),
            whole.quantile(0.99), len(members[queue]),
            line_chart(series, start=start, end=now),
            line_chart([("p50", "#1f6fd1", [(p + interval, _q(latency[p], 0.5)) for p in lat]),
                        ("p99", "#8e44ad", [(p + interval, _q(latency[p], 0.99)) for p in lat])],
                       start=start, end=now, unit=" s")))
    return out


def _q(sketch: Sketch, q: float) -> float:
    return sketch.quantile(q) or 0.0


def stats_interval(settings: Settings) -> float:
    """Seconds per statistics row (``[jobs] stats_interval``)."""
    try:
        jobs: JobsSettings = settings.section("jobs")
    except KeyError:  # the job log's plug-in is not installed: its default
        jobs = JobsSettings()
    return float(jobs.stats_interval)
