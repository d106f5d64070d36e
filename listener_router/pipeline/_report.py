"""What the pipeline counts: process-wide :class:`Stats`, and a :class:`BatchReport` per batch.

Each stage records its time and its counts twice: summed into the
process's :class:`Stats` (milliseconds under ``<stage>_ms``, read by ``chalk
run``'s summary line, the demo, the benchmark and the tests), and into the
report of the batch it worked on (seconds by stage).  Once a batch is
finished (every message of it published and acked, or held) its report goes
to every :class:`BatchObserver` — metrics, a job log, an adaptive batch size.
Observers are called on a pipeline thread; one that raises is logged and
never stops the service or the other observers.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

__all__ = ["Stats", "BatchReport", "BatchObserver", "Observers", "Meter", "WorkflowRun",
           "hook_name"]

log = logging.getLogger(__name__)

_STATS_LOCK = threading.Lock()


@dataclass
class Stats:
    """Counters of the service process since it started (``stats["committed"]``)."""

    counts: Counter[str] = field(default_factory=Counter)
    started: float = field(default_factory=time.monotonic)
    last_activity: float = field(default_factory=time.monotonic)

    def add(self, key: str, n: int = 1) -> None:
        with _STATS_LOCK:
            self.counts[key] += n

    def __getitem__(self, key: str) -> int:
        return self.counts[key]

    def outcomes(self) -> dict[str, int]:
        """How each gathering of a message ended, adding up to ``received``: the states it
        settled in (``committed``, a plug-in's step such as ``unchanged``, ``duplicate``,
        ``retrying``, ``dead``, ``cancelled``), ``deferred`` and ``parked`` (held and
        gathered again later, which counts in ``received`` again), and ``unsettled``: let go
        unacked (at the stop, or when publishing failed), for the broker to deliver again.
        The core's states are there when zero too."""
        with _STATS_LOCK:
            counts = dict(self.counts)
        found = {key: counts.get(key, 0) for key in _CORE_OUTCOMES}
        found.update((key, n) for key, n in counts.items()
                     if key not in found and key not in _NOT_OUTCOMES and not key.endswith("_ms"))
        unsettled = counts.get("received", 0) - sum(found.values())
        if unsettled:
            found["unsettled"] = unsettled
        return found


# Stats counters that are no message's outcome; the outcomes the summary always names.
_NOT_OUTCOMES = frozenset({"received", "records_committed", "batches", "local_batches"})
_CORE_OUTCOMES = ("committed", "duplicate", "retrying", "dead", "cancelled", "deferred")


@dataclass(frozen=True, slots=True)
class WorkflowRun:
    """One run of a workflow over a group of a batch: where, how many records, how long."""

    workflow: str
    runner: str                    # "spark" (on Spark) or "local" (the service's own workers)
    seconds: float
    records: int = 0
    placed: bool = False           # a small batch the placement sent to the service's workers
    # a run that was not a plain one (an attempt timed out or died and its instances were
    # isolated, or a runner did not start): its time is the fault's, not the pipelets'
    faulted: bool = False

    @property
    def local(self) -> bool:
        return self.runner == "local"


@dataclass(eq=False)
class BatchReport:
    """What one batch did, handed to observers once it is finished.

    ``seconds`` by stage: ``receive`` (parse and match), ``inbox``, ``load``,
    ``stage`` (all of the gathering), ``wait`` (the runner waiting for the
    batch to be ready), ``run`` (workflows), ``route``, ``commit``,
    ``publish`` (publish with confirms, mark sent, ack) and ``batch`` (from
    its first message gathered until every part was settled).  Gathering,
    committing and publishing overlap other batches' runs.
    """

    opened: float = field(default_factory=time.time)     # wall clock, first message gathered
    lane: str = ""                 # the queue of the lane it was gathered in
    size_limit: int = 0            # the batch size the sizing allowed when it was taken
    messages: int = 0              # messages gathered into it
    outcome: Counter[tuple[str, str]] = field(default_factory=Counter)  # (queue, state) → messages
    # (workflow, committed | invalidated | the step of records settled without a run) → records
    records: Counter[tuple[str, str]] = field(default_factory=Counter)
    published: int = 0             # messages published for it (routed, retry copies, dead letters)
    sent: Counter[str] = field(default_factory=Counter)  # routed messages by target queue
    runs: list[WorkflowRun] = field(default_factory=list)  # each run of a workflow, in order
    local_runs: int = 0            # workflow runs on the service's own workers
    seconds: dict[str, float] = field(default_factory=dict)
    finished: float = 0.0          # wall clock, when observers got it
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add_seconds(self, stage: str, seconds: float) -> None:
        with self.lock:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + seconds

    def count_records(self, workflow: str, kind: str, n: int) -> None:
        if n:
            with self.lock:
                self.records[(workflow, kind)] += n

    def count_sent(self, targets: Iterable[str]) -> None:
        """Routed messages published, one target (queue, or ``exchange/key``) each."""
        with self.lock:
            self.sent.update(targets)

    def add_run(self, workflow: str, runner: str, seconds: float, records: int = 0,
                placed: bool = False, faulted: bool = False) -> None:
        """One workflow run of the batch: ``runner`` is ``spark`` or ``local``; ``placed``:
        a small batch sent to the service's workers beside the main runner; ``faulted``:
        its time measures a fault (``WorkflowRun.faulted``)."""
        with self.lock:
            self.runs.append(WorkflowRun(workflow, runner, seconds, records, placed, faulted))

    def states(self) -> Counter[str]:
        """Messages by the state they were settled in (committed, duplicate, retrying, …)."""
        totals: Counter[str] = Counter()
        for (_queue, state), n in self.outcome.items():
            totals[state] += n
        return totals


class BatchObserver:
    """Told about every finished batch; the base does nothing (override what you need)."""

    def batch_finished(self, report: BatchReport) -> None:
        """``report`` of a batch whose messages are all published and acked (or held)."""


def hook_name(hook: Callable[..., object]) -> str:
    """A hook's owner and name for the log (``JobLog.settled``)."""
    owner = getattr(hook, "__self__", None)
    return f"{type(owner).__name__}.{getattr(hook, '__name__', '?')}" if owner is not None \
        else getattr(hook, "__qualname__", repr(hook))


class Observers:
    """What is told about each finished batch: :class:`BatchObserver` objects and plug-ins'
    ``batch_finished`` hooks; :meth:`notify` shields the pipeline from their failures."""

    def __init__(self, observers: Iterable[BatchObserver | Callable[[BatchReport], None]] = ()):
        self._hooks: list[Callable[[BatchReport], None]] = []
        for observer in observers:
            self.add(observer)

    def add(self, observer: BatchObserver | Callable[[BatchReport], None]) -> None:
        self._hooks.append(observer.batch_finished if isinstance(observer, BatchObserver)
                           else observer)

    def notify(self, report: BatchReport) -> None:
        report.finished = time.time()
        for hook in self._hooks:
            try:
                hook(report)
            except Exception:  # an observer's bug never stops the service
                log.exception("batch observer %s failed", hook_name(hook))


class Meter:
    """Where a stage records its time: the process's :class:`Stats` and a batch's report."""

    def __init__(self, stats: Stats):
        self.stats = stats

    def time(self, stage: str, seconds: float, report: BatchReport | None = None) -> None:
        self.stats.add(f"{stage}_ms", int(seconds * 1000))
        if report is not None:
            report.add_seconds(stage, seconds)
