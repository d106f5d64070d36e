"""The default batch policy: batches as large as the backlog and the measured job cost call
for, and small ones run on the service's own workers where the workflow allows.

Theory of operation.

*When a batch is taken* (:meth:`AdaptiveSizing.ready`, asked by
``Gathering`` whenever the runner is free): when it is full (``size``), or
when nothing more is waiting — no message ready in the broker for the
consumed queues (``Link.waiting``, looked at ten times a second) and every
delivery gathered — since waiting then only adds latency, or when its first
message has waited ``max_wait`` while more were waiting.  Under a light load
a batch is what arrived while the one before ran; under a backlog batches
fill to ``size``.

*How large* ``size`` *is.*  A run of ``n`` records takes about ``F + c·n``
seconds: ``F`` is fixed per run (a Spark job's planning, scheduling and py4j
round trips: 20-50 ms for a job over Python workers, more for a DataFrame
job; a few ms on warm workers, ``engine._warm``), taken as at least
``MIN_FIXED``, since a batch also costs the service per batch (a commit, a
publish round) what the fit of its runs does not see; ``c`` the cost of a
record.  ``size`` is the smallest batch whose fixed cost is at most
``FIXED_SHARE`` of its run, ``F / (FIXED_SHARE·c)``, within ``MIN_SIZE`` …
``MAX_SIZE`` and short enough that a run lasts at most ``MAX_RUN`` seconds
(large records: fewer per batch).  ``F`` and ``c`` are fitted per workflow
to its Spark runs (least squares over about the last twenty, plus one run of
no records taking ``PRIOR_FIXED`` that never ages, so that runs of one size
still give an answer).  A run in which an attempt timed out or died, or a
runner did not start, is left out (``WorkflowRun.faulted``): its time is the
fault's — a hang's ``batch_timeout`` taken as the cost of its few records
made the next batches of the workflow look long, and the dispatcher held
every other lane back behind them until they counted as slow.  ``size`` is the smallest over the
workflows.  A listener rule's ``batch_size`` fixes ``size`` instead, and its
``max_wait_ms`` ``max_wait``.

A workflow's batches start at ``START_SIZE`` and grow at most fourfold from
one measured run to the next (a slow start): the prior cost says nothing of
a workflow whose pipelets take milliseconds a record, and a first batch of
``MAX_SIZE`` of them would run for minutes.  Each batch carries the run time
its size predicts (:meth:`AdaptiveSizing.expected`); the dispatcher counts a
batch as *slow* (no longer holding its lane back, ``_lanes``) only past
twice that, so that batches that are long but not stuck do not pile up on
the workers beside each other.

``MAX_SIZE`` bounds the pipeline's fill and drain: the runner waits while
the first batch of a backlog is gathered, and the last one's commit and
acks follow its run alone, so a burst of a few batches overlaps its stages
poorly.  Draining 100,000 queued messages (``bench/bench_listener.py``, 2
cores) came nearer the bare loop with batches of 5,000 than of 20,000 in 11
of 12 adjacent pairs (Python pipelets: median 0.49 → 0.55 of it, over 9
pairs); smaller batches hold fewer records in memory too.

*Where a batch runs* (:class:`Placement`).  On Spark, where the runner
decides between a job of its own and its warm workers (``engine._warm``:
no job's fixed cost, a round trip over a socket).  A job's fixed cost is
most of a small batch's time, so under a light load it would be most of the
latency; even a warm worker's round trip costs something.  A batch smaller
than :meth:`AdaptiveSizing.local_limit` records runs on the service's own
workers (``engine.ProcessRunner``: supervised processes, isolated as Spark's
are) when every pipelet of its workflow declares ``runs_in_service`` (the
built-ins do, except those running a regular expression, stylesheet or file
the configuration names): the size at which a run there (``c_local·n``,
fitted from runs there) would take as long as a Spark job (``F + c·n``), at
most ``MAX_LOCAL``.  ``[engine] local_below = N`` runs batches under N
records there whatever the pipelets declare; ``0`` never.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

import engine
from listener_router._settings import ListenerRule
from listener_router.pipeline._batch import Batch, BatchSizing
from listener_router.pipeline._report import BatchReport
from listener_router.pipeline._work import Work

__all__ = ["AdaptiveSizing", "DEFAULT_MAX_WAIT", "FIXED_SHARE", "MAX_LOCAL", "MAX_PREFETCH", "MAX_RUN",
           "MAX_SIZE", "MIN_SIZE", "Placement", "PREFETCH_BATCHES", "RunCost", "START_SIZE",
           "default_sizing", "prefetch_by_queue", "prefetch_for"]

log = logging.getLogger(__name__)

FIXED_SHARE = 0.1          # a job's fixed cost is at most this share of its batch's run
MIN_SIZE = 100
START_SIZE = 500           # messages a workflow's batches hold at most before one was measured
MAX_SIZE = 5_000           # messages a batch holds at most (module doc: fill and drain)
MAX_RUN = 10.0             # seconds one run may take (records of large documents: fewer)
MAX_LOCAL = 1_000          # records a batch run on the service's workers holds at most
DEFAULT_MAX_WAIT = 1.0     # seconds a batch waits to fill while more messages wait
PREFETCH_BATCHES = 4       # prefetch: one batch gathering, one running, two committing/acking
MAX_PREFETCH = 65_535      # AMQP's prefetch count is 16 bits
PRIOR_FIXED = 0.1          # seconds: a warm Spark job's fixed cost, before any is measured
MIN_FIXED = 0.05           # seconds: the least fixed cost a run is taken to have (module doc)
PRIOR_PER_RECORD = 50e-6   # seconds per record on Spark, before any is measured
PRIOR_LOCAL = 300e-6       # seconds per record on the service's workers, before any is measured
DECAY = 0.95               # weight of a run after the next one (about the last twenty count)


class RunCost:
    """A workflow's run time: ``fixed + per_record·n`` on Spark, ``local·n`` here."""

    def __init__(self) -> None:
        self.fixed = PRIOR_FIXED
        self.per_record = PRIOR_PER_RECORD
        self.local = PRIOR_LOCAL
        self._sums = [0.0] * 5  # decayed Σw, Σw·n, Σw·n², Σw·t, Σw·n·t of the Spark runs
        self._local_weight = 0.0
        self.largest = 0        # records of the largest run measured (the slow start)

    def add_spark(self, records: int, seconds: float) -> None:
        self.largest = max(self.largest, records)
        sums = self._sums
        n, t = float(records), seconds
        for i, x in enumerate((1.0, n, n * n, t, n * t)):
            sums[i] = sums[i] * DECAY + x
        # The prior fixed cost, as a run of no records that never ages: with runs of one
        # size only, the line goes through it and them.
        s0, s1, s2, t0, t1 = sums
        s0, t0 = s0 + 1, t0 + PRIOR_FIXED
        det = s0 * s2 - s1 * s1
        if det <= 0:
            return
        per_record = (s0 * t1 - s1 * t0) / det
        self.per_record = max(per_record, 1e-7)
        # A loaded machine makes single runs slow at random; the intercept of a few
        # such runs can fall to nothing, and no job costs nothing.
        self.fixed = max((t0 - self.per_record * s1) / s0, MIN_FIXED)

    def add_local(self, records: int, seconds: float) -> None:
        if records <= 0:
            return
        # A mean per record, weighted by records: small runs are mostly noise.
        self._local_weight = self._local_weight * DECAY + records
        share = records / self._local_weight
        self.local += (seconds / records - self.local) * share

    def best_size(self) -> int:
        """The smallest batch whose fixed cost is at most ``FIXED_SHARE`` of its run, within
        the slow start (module doc)."""
        size = self.fixed / (FIXED_SHARE * self.per_record)
        longest = (MAX_RUN - self.fixed) / self.per_record
        grown = max(START_SIZE, 4 * self.largest)
        return int(max(MIN_SIZE, min(MAX_SIZE, grown, size, longest)))

    def predict(self, records: int) -> float:
        """Seconds a run of ``records`` should take on Spark."""
        return self.fixed + self.per_record * records

    def local_limit(self) -> int:
        """Records below which a run here is quicker than a Spark job."""
        gain = self.local - self.per_record
        if gain <= 0:
            return MAX_LOCAL
        return int(max(0, min(MAX_LOCAL, self.fixed / gain)))


class AdaptiveSizing(BatchSizing):
    """The default policy (see module doc): ``size`` from the measured run costs unless
    ``limit`` fixes it; a batch is taken at once when nothing more is waiting."""

    def __init__(self, limit: int | None = None, max_wait: float = DEFAULT_MAX_WAIT):
        super().__init__(limit or START_SIZE, max_wait)
        self.limit = limit
        self.costs: dict[str, RunCost] = {}
        self._lock = threading.Lock()

    def ready(self, messages: int, age: float, waiting: int) -> bool:
        return messages >= self.size or waiting <= 0 or age >= self.max_wait

    def local_limit(self, workflow: str) -> int:
        cost = self.costs.get(workflow)
        return (cost or RunCost()).local_limit()

    def expected(self, batch: Batch) -> float:
        seconds = 0.0
        for name, group in batch.groups.items():
            cost = self.costs.get(name)
            if cost is not None:
                seconds += cost.predict(sum(len(w.message.record_ids) for w in group.works
                                            if w.message is not None))
        return seconds

    def batch_finished(self, report: BatchReport) -> None:
        if not report.runs:
            return
        with self._lock:
            for run in report.runs:
                if run.faulted:  # a timeout or a death: nothing to learn of the pipelets' cost
                    continue
                cost = self.costs.get(run.workflow)
                if cost is None:
                    cost = self.costs[run.workflow] = RunCost()
                if run.placed:  # beside the main runner: the size of its batches is not this
                    cost.add_local(run.records, run.seconds)
                else:
                    cost.add_spark(run.records, run.seconds)
            if self.limit is None and self.costs:
                size = min(cost.best_size() for cost in self.costs.values())
                if abs(size - self.size) > self.size / 5:
                    log.debug("batch size %d (was %d): %s", size, self.size, "; ".join(
                        f"{name} {cost.fixed:.3f} s + {cost.per_record * 1e6:.1f} µs/record"
                        for name, cost in self.costs.items()))
                self.size = size


def default_sizing(rules: Sequence[ListenerRule]) -> AdaptiveSizing:
    """The policy for these rules: adaptive, within the largest ``batch_size`` when every
    rule gives one, waiting the longest ``max_wait_ms`` any gives."""
    sizes = [rule.batch_size for rule in rules]
    waits = [rule.max_wait_ms for rule in rules if rule.max_wait_ms is not None]
    limit = max(s for s in sizes if s is not None) if sizes and None not in sizes else None
    return AdaptiveSizing(limit, max(waits) / 1000.0 if waits else DEFAULT_MAX_WAIT)


def prefetch_for(rules: Sequence[ListenerRule]) -> int:
    """A queue's prefetch: the largest its rules give, else room for ``PREFETCH_BATCHES``
    batches of the largest size; a rate-limited queue's, two seconds of its limit (a member
    must not take what its share cannot run soon: the others would have none)."""
    given = [rule.prefetch for rule in rules if rule.prefetch is not None]
    if given:
        return max(given)
    limits = [rule.rate_limit for rule in rules if rule.rate_limit is not None]
    if limits:
        return max(10, min(MAX_PREFETCH, int(2 * min(limits))))
    largest = max((rule.batch_size or MAX_SIZE) for rule in rules)
    return min(MAX_PREFETCH, PREFETCH_BATCHES * largest)


def prefetch_by_queue(rules: Sequence[ListenerRule]) -> dict[str, int]:
    """Each queue's prefetch (``prefetch_for`` of its rules)."""
    queues = dict.fromkeys(rule.queue for rule in rules)
    return {q: prefetch_for([r for r in rules if r.queue == q]) for q in queues}


class Placement:
    """Which batches run on the service's own workers rather than on Spark (module doc)."""

    def __init__(self, sizing: BatchSizing, local_below: int | None = None):
        self.sizing = sizing
        self.local_below = local_below
        self._allowed: dict[tuple[str, str], bool] = {}

    def runs_here(self, workflow: engine.Workflow, works: Sequence[Work], records: int) -> bool:
        if self.local_below is not None:
            return records < self.local_below
        if not self._allows(workflow):
            return False
        return records < self.sizing.local_limit(workflow.name)

    def _allows(self, workflow: engine.Workflow) -> bool:
        key = (workflow.name, workflow.version)
        allowed = self._allowed.get(key)
        if allowed is None:
            refusing = engine.classes_not_in_service(workflow)
            allowed = self._allowed[key] = not refusing
            if allowed:
                log.info("workflow %s: small batches run on the service's workers (its "
                         "pipelets declare runs_in_service)", workflow.name)
            else:
                log.info("workflow %s: every batch runs on Spark (%s %s not declare "
                         "runs_in_service)", workflow.name, ", ".join(refusing),
                         "does" if len(refusing) == 1 else "do")
        return allowed
