"""What the page shows over time, kept in the service's memory.

:class:`History` is a batch observer: it keeps the last batches' reports
(summarised) and running totals of messages in and out by queue.
:class:`Sampler` is a thread of its own that every few seconds asks the
broker for each queue's depth (a passive declare on a connection of its
own, so the pipeline's link never waits for it), reads this node's leases
from the store, and appends a :class:`Sample` to a ring that holds the last
hour: the queue chart and the rates are drawn from it.  Nothing of this
touches the hot path but the observer's few dictionary updates per batch.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import pika
import pika.exceptions

from listener_router.broker import node_parameters
from listener_router.pipeline import BatchObserver, BatchReport, WorkflowRun

__all__ = ["BatchSummary", "History", "Published", "Sample", "Sampler", "HOUR"]

log = logging.getLogger(__name__)

HOUR = 3600.0


@dataclass(frozen=True)
class Published:
    """What a batch published, told apart: messages routed by the router rules (by target),
    events (on a plug-in's exchange: ``record.committed`` with the commit, the failure
    events with the settling), and copies (a retry copy or a dead letter per message that
    failed)."""

    routed: dict[str, int]
    events: int
    copies: int

    @classmethod
    def of(cls, report: BatchReport, side_exchanges: Collection[str] = ()) -> Published:
        """From ``report`` (call under its lock): ``side_exchanges`` are the exchanges
        plug-ins publish to (``Plugin.exchanges``); a report counts every message it
        published, and by target those published with the commits (routed and events)."""
        routed: dict[str, int] = {}
        events = 0
        for target, n in report.sent.items():
            if "/" in target and target.split("/", 1)[0] in side_exchanges:
                events += n
            else:
                routed[target] = n
        states = report.states()
        copies = states.get("retrying", 0) + states.get("dead", 0)
        # the rest went out with the settling: the plug-ins' messages about failures
        events += max(0, report.published - sum(report.sent.values()) - copies)
        return cls(routed, events, copies)


@dataclass(frozen=True)
class BatchSummary:
    """One finished batch, as the page lists it."""

    opened: float
    finished: float
    messages: int
    size_limit: int
    states: dict[str, int]
    records: dict[tuple[str, str], int]
    published: Published
    seconds: dict[str, float]
    runs: tuple[WorkflowRun, ...]

    @property
    def routed(self) -> int:
        return sum(self.published.routed.values())

    @classmethod
    def of(cls, report: BatchReport, side_exchanges: Collection[str] = ()) -> BatchSummary:
        with report.lock:
            return cls(opened=report.opened, finished=report.finished, messages=report.messages,
                       size_limit=report.size_limit, states=dict(report.states()),
                       records=dict(report.records),
                       published=Published.of(report, side_exchanges),
                       seconds=dict(report.seconds), runs=tuple(report.runs))


class History(BatchObserver):
    """The last ``keep`` batches and message totals by queue (see module doc);
    ``side_exchanges`` are the plug-ins' exchanges, whose messages are not routed ones."""

    def __init__(self, keep: int = 50, side_exchanges: Collection[str] = ()):
        self._lock = threading.Lock()
        self._batches: deque[BatchSummary] = deque(maxlen=keep)
        self._in: Counter[str] = Counter()
        self._out: Counter[str] = Counter()
        self.side_exchanges = frozenset(side_exchanges)
        self.last_batch: float | None = None

    def batch_finished(self, report: BatchReport) -> None:
        summary = BatchSummary.of(report, self.side_exchanges)
        with self._lock:
            self._batches.append(summary)
            for (queue, state), n in report.outcome.items():
                if state != "deferred":  # held, and counted when it is settled for good
                    self._in[queue] += n
            self._out.update(summary.published.routed)
            self.last_batch = summary.finished

    def batches(self) -> list[BatchSummary]:
        """The kept batches, newest first."""
        with self._lock:
            return list(reversed(self._batches))

    def totals(self) -> tuple[dict[str, int], dict[str, int]]:
        """Messages taken from each queue (settled) and routed to each target, so far."""
        with self._lock:
            return dict(self._in), dict(self._out)


@dataclass(frozen=True)
class Sample:
    """The broker's view of the queues and this process's totals at ``at`` (wall clock)."""

    at: float
    depth: dict[str, int | None]          # None: no such queue
    consumers: dict[str, int | None]
    taken: dict[str, int]                 # History.totals() then
    sent: dict[str, int]
    broker_up: bool
    leases: int | None                    # leases this node holds in storage
    kept: dict[str, int] | None = None    # dead letters moved into the store, by input queue


@dataclass
class _BrokerProbe:
    """Passive declares on a connection of its own, opened again after a failure."""

    url: str
    connection: Any = None
    channel: Any = None

    def depths(self, queues: Sequence[str]) -> tuple[dict[str, int | None], dict[str, int | None]]:
        depth: dict[str, int | None] = {}
        consumers: dict[str, int | None] = {}
        if self.connection is None or not self.connection.is_open:
            self.connection = pika.BlockingConnection(node_parameters(self.url))
            self.channel = None
        for queue in queues:
            if self.channel is None or not self.channel.is_open:
                self.channel = self.connection.channel()
            try:
                ok = self.channel.queue_declare(queue, passive=True).method
            except pika.exceptions.ChannelClosedByBroker:  # 404: not declared (yet)
                depth[queue] = consumers[queue] = None
                self.channel = None
                continue
            depth[queue], consumers[queue] = ok.message_count, ok.consumer_count
        return depth, consumers

    def close(self) -> None:
        try:
            if self.connection is not None and self.connection.is_open:
                self.connection.close()
        except (pika.exceptions.AMQPError, OSError):
            pass
        self.connection = self.channel = None


@dataclass
class Sampler:
    """Samples queues and leases every ``every`` seconds on thread ``chalk-watch``."""

    broker_url: str
    queues: Callable[[], list[str]]
    history: History
    leases: Callable[[], int]
    every: float = 5.0
    kept: Callable[[], dict[str, int]] | None = None
    samples: deque[Sample] = field(init=False)

    def __post_init__(self) -> None:
        self.samples = deque(maxlen=int(HOUR / self.every) + 2)
        self._probe = _BrokerProbe(self.broker_url)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Sampler:
        self._thread = threading.Thread(target=self._run, name="chalk-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self._probe.close()

    def _run(self) -> None:
        while True:
            try:
                self.sample()
            except Exception:  # the page shows the last good sample; never stop sampling
                log.exception("sampling the queues failed")
            if self._stop.wait(self.every):
                return

    def sample(self) -> Sample:
        """Take one sample now (the thread does this every ``every`` seconds)."""
        queues = self.queues()
        try:
            depth, consumers = self._probe.depths(queues)
            up = True
        except (pika.exceptions.AMQPError, OSError) as e:
            log.debug("queue depths unavailable: %s", e)
            self._probe.close()
            depth = dict.fromkeys(queues)
            consumers = dict.fromkeys(queues)
            up = False
        try:
            leases: int | None = self.leases()
        except Exception as e:  # the store is down: the pipeline says so; show "unknown"
            log.debug("lease count unavailable: %s", e)
            leases = None
        kept: dict[str, int] | None = None
        if self.kept is not None:
            try:
                kept = self.kept()
            except Exception as e:  # as for the leases
                log.debug("dead-letter count unavailable: %s", e)
        taken, sent = self.history.totals()
        sample = Sample(time.time(), depth, consumers, taken, sent, up, leases, kept)
        self.samples.append(sample)
        return sample

    def latest(self) -> Sample | None:
        return self.samples[-1] if self.samples else None

    def window(self, seconds: float = HOUR) -> list[Sample]:
        """The samples of the last ``seconds``, oldest first."""
        since = time.time() - seconds
        return [s for s in list(self.samples) if s.at >= since]
