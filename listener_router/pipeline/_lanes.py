"""Lanes: one per input queue, and the dispatcher that hands their batches to the runner.

Theory of operation.  Each queue the listener rules read is a *lane*: its
deliveries arrive on a queue of their own (``DeliveriesByQueue``), and it
has its own gather thread, batch sizing, held messages and batch being
gathered.  A lane's trouble stays in the lane: a message held for a backoff,
a batch that runs long, a batch whose failure is being isolated — each holds
back nothing of another lane.

The lanes share the runner (Spark's workers, the service's own) through
the :class:`Dispatcher`, on the service's thread.  It hands a lane's ready
batch to a runner thread when

- the lane has no batch running that is not *slow* (running less than
  ``SLOW_AFTER`` seconds), and fewer than ``MAX_WINDOW`` running at all;
- fewer than ``slots`` (``[engine] concurrent_batches``) batches of all
  lanes run that are not slow.

A batch that has run ``SLOW_AFTER`` seconds no longer counts: it keeps its
thread, and the runner serves the other lanes, and the next batch of its
own lane, meanwhile — so a hung record costs its own batch, not the
service.  When several lanes are ready, the one whose ``turn`` is lowest
goes first, and each dispatch moves a lane's turn on by ``1 / weight``:
weights are ``2 ** rank`` of the lanes' priorities (equal priorities share
alike; each step up gets twice the turns of the one below, as RabbitMQ's
queue priorities do), so a lower lane is slowed, never starved.

A lane whose priority is above that of every lane running may take one slot
more than ``slots``: a high lane never waits for a low lane's batch to end.
And the workers take chunks by priority: a lane is *outranked* while a
higher one has work (a batch running or gathering, or one dispatched in the
last :data:`ACTIVE_FOR` seconds), and then its batches go to the workers in
chunks that each end soon (``_execute.YIELD_WITHIN``), so that a higher
lane's chunk waits for a worker no longer than that; and it gathers batches
of at most :data:`OUTRANKED_BATCH` messages, so that the commit and the
publish of one of them end soon too (the stages the lanes share take a
higher lane's batches first, but finish the one they hold).
A lane is passed over while it is *paused*, while its rate limit's bucket
is empty (``_flow``), or while a queue its results go to holds more than its
``max_output_depth`` ready messages (back-pressure, as the link samples the
depths).

The dispatcher waits on a condition that every added chunk and every
finished batch signals; it wakes on a clock only for what is about time (a
batch that becomes ready by its age, a batch that becomes slow, a rate
limit's next token, an output queue's next sample).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

from listener_router._settings import ListenerRule, Settings
from listener_router.broker import Deliveries, Link
from listener_router.cluster import TopologyEvent, TopologyEventType, TopologyListener
from listener_router.pipeline._batch import Batch, BatchSizing, Gathering
from listener_router.pipeline._gather import GatherStage
from listener_router.pipeline._held import Held, Holds
from listener_router.pipeline._report import BatchReport, Observers
from listener_router.pipeline._sizing import Placement, default_sizing

__all__ = ["BACKED_UP_LOOK", "Dispatcher", "Lane", "LaneView", "MAX_WINDOW", "OUTRANKED_BATCH", "SLOW_AFTER", "TokenBucket",
           "WakeHeld", "lane_outputs", "make_lane"]

log = logging.getLogger(__name__)

SLOW_AFTER = 2.0          # seconds after which a running batch no longer counts against the slots
MAX_WINDOW = 4            # batches of one lane running at once at most (slow ones too)
IDLE_LOOK = 0.2           # seconds between the loop's own looks (stop, until, idle, refresh)
BACKED_UP_LOOK = 0.1      # seconds between looks at a backed-up lane's outputs (as sampled)
ACTIVE_FOR = 5.0          # seconds a lane counts as having work after its last batch went
OUTRANKED_BATCH = 1_000   # messages an outranked lane's batch holds at most (~0.1 s to publish)


def slow_after(batch: Batch) -> float:
    """Seconds after which a running batch is slow (no longer holds its lane back)."""
    return max(SLOW_AFTER, 2.0 * batch.expected)


class TokenBucket:
    """Records a lane may run: ``rate`` per second, at most a second's worth saved up.

    A batch takes its records at once (the bucket may go below nothing); the
    next waits until it is above nothing again, so the rate holds on average
    whatever the batches' sizes."""

    def __init__(self, rate: float):
        self.rate = rate
        self.tokens = rate
        self._at = time.monotonic()
        self._lock = threading.Lock()

    def _fill(self, now: float) -> None:
        self.tokens = min(self.rate, self.tokens + (now - self._at) * self.rate)
        self._at = now

    def wait(self) -> float:
        """Seconds until a batch may go (0: now)."""
        with self._lock:
            self._fill(time.monotonic())
            return 0.0 if self.tokens > 0 else -self.tokens / self.rate + 0.001

    def take(self, records: int) -> None:
        with self._lock:
            self._fill(time.monotonic())
            self.tokens -= records

    def set_rate(self, rate: float) -> None:
        with self._lock:
            self._fill(time.monotonic())
            self.rate = rate
            self.tokens = min(self.tokens, rate)


@dataclass(frozen=True)
class LaneView:
    """One lane (input queue) as it is now: its flow control and what it does."""

    queue: str
    paused: bool
    priority: int
    rate_limit: float | None        # records/s for the cluster
    share: float | None             # this member's share of it
    ordered_by: str | None
    backed_up: str | None           # the output queue over max_output_depth, if one is
    running: int                    # its batches running now
    batch_size: int                 # messages its batches take at most now
    waiting: int                    # messages ready for it in the broker (last sample)


@dataclass(eq=False)
class Lane:
    """One input queue's way into the pipeline (see the module doc)."""

    queue: str
    rules: Sequence[ListenerRule]
    deliveries: Deliveries
    held: Held
    sizing: BatchSizing
    gathering: Gathering
    placement: Placement
    gather: GatherStage | None = None
    link: Link | None = None
    priority: int = 0
    rate_limit: float | None = None          # records/s for the whole cluster
    bucket: TokenBucket | None = None        # this member's share of it
    outputs: tuple[str, ...] = ()            # queues its results are routed to
    max_output_depth: int | None = None
    paused: bool = False
    weight: float = 1.0
    turn: float = 0.0
    running: list[Batch] = field(default_factory=list)
    last_dispatched: float = -float("inf")
    own_cap: int | None = None               # messages a batch holds at most (its rate limit's)

    def fast(self, now: float) -> int:
        """Batches of this lane running that are not slow yet (``SLOW_AFTER`` seconds, or
        twice the run the sizing expected of it)."""
        return sum(1 for b in self.running if now - b.dispatched < slow_after(b))

    def view(self) -> LaneView:
        """The lane as the dashboard and the metrics show it."""
        return LaneView(self.queue, self.paused, self.priority, self.rate_limit,
                        self.bucket.rate if self.bucket is not None else None,
                        self.rules[0].ordered_by, self.backed_up(), len(self.running),
                        self.gathering.limit(),
                        self.link.waiting_by_queue.get(self.queue, 0) if self.link else 0)

    def backed_up(self) -> str | None:
        """The output queue that holds more than ``max_output_depth`` ready messages, if
        one does (as the link last sampled it)."""
        if self.max_output_depth is None or self.link is None:
            return None
        depths = self.link.waiting_by_queue
        return next((q for q in self.outputs if depths.get(q, 0) > self.max_output_depth),
                    None)

    def set_paused(self, paused: bool, reason: str | None = None) -> None:
        """Pause: take nothing new (consumers cancelled, what was taken but not run goes
        back to the queue); resume: consume again."""
        self.paused = paused
        if self.link is not None:
            (self.link.pause if paused else self.link.resume)(self.queue)
        if self.gather is not None:
            self.gather.set_paused(paused)
        log.warning("lane %s %s%s", self.queue, "paused" if paused else "resumed",
                    f": {reason}" if reason else "")


def make_lane(queue: str, rules: Sequence[ListenerRule], deliveries: Deliveries, held: Held,
              link: Link, *, sizing: BatchSizing | None, local_below: int | None,
              observers: Observers, outputs: Sequence[str] = ()) -> Lane:
    """The lane of one queue: its own sizing (``sizing`` when one is given for every lane;
    else adaptive, told about its own lane's batches), gathering, held messages, placement,
    and the flow control its rules ask for (their lane keys agree: ``Settings.problem``).
    Its gather stage is made once the stages it hands on to are."""
    own = sizing or default_sizing(rules)
    if sizing is None:
        observers.add(functools.partial(_own_report, queue, own))
    gathering = Gathering(own, lambda: link.waiting_by_queue.get(queue, 0) + deliveries.qsize())
    first = rules[0]
    lane = Lane(queue, rules, deliveries, held, own, gathering, Placement(own, local_below),
                link=link, priority=first.priority, rate_limit=first.rate_limit,
                outputs=tuple(outputs), max_output_depth=first.max_output_depth)
    if first.rate_limit is not None:
        lane.bucket = TokenBucket(first.rate_limit)
        gathering.cap = lane.own_cap = max(1, int(first.rate_limit))
    return lane


def lane_outputs(settings: Settings, rules: Sequence[ListenerRule]) -> list[str]:
    """The queues the results of these rules' workflows are routed to (by a rule's queue;
    a record's ``nextDestination`` is not known ahead)."""
    workflows = {rule.workflow for rule in rules}
    return list(dict.fromkeys(r.queue for r in settings.routers if r.queue and not r.exchange
                              and (r.workflow is None or r.workflow in workflows)))


def _own_report(queue: str, sizing: BatchSizing, report: BatchReport) -> None:
    if report.lane == queue:
        sizing.batch_finished(report)


class WakeHeld(TopologyListener):
    """When members left the view, their leases were released with it: messages held
    for records those members had locked are gathered again at once."""

    def __init__(self, held: Holds):
        self.held = held

    def handle_topology_event(self, event: TopologyEvent) -> None:
        if event.type is TopologyEventType.TOPOLOGY_CHANGED and event.old_view and event.new_view:
            before = {(m.name, m.joined_at) for m in event.old_view.members}
            if before - {(m.name, m.joined_at) for m in event.new_view.members}:
                self.held.wake()


class Dispatcher:
    """Hands the lanes' ready batches to ``execute`` on runner threads (see the module doc)."""

    def __init__(self, lanes: Sequence[Lane], execute: Callable[[Batch, Lane], None],
                 slots: int = 1):
        self.lanes = list(lanes)
        self.execute = execute
        self.slots = max(1, slots)
        self.cond = threading.Condition()
        self.futures: list[Future[None]] = []
        ranks = {p: i for i, p in enumerate(sorted({lane.priority for lane in self.lanes}))}
        for lane in self.lanes:
            lane.weight = 2.0 ** ranks[lane.priority]
            lane.gathering.on_added = self.wake

    def wake(self) -> None:
        """Something changed (a chunk added, a batch finished): look again (any thread)."""
        with self.cond:
            self.cond.notify_all()

    def running(self) -> int:
        return sum(len(lane.running) for lane in self.lanes)

    def outranked(self, lane: Lane) -> bool:
        """Whether a lane of higher priority has work (module doc)."""
        now = time.monotonic()
        return any(other.priority > lane.priority and not other.paused and (
            other.running or other.gathering.pending() or
            now - other.last_dispatched < ACTIVE_FOR) for other in self.lanes)

    def step(self, wait: float = IDLE_LOOK) -> int:
        """Dispatch what can go now; else wait (at most ``wait`` s) until something may
        change.  Returns how many batches were dispatched."""
        dispatched = 0
        while True:
            now = time.monotonic()
            batch, lane, again = self._next(now)
            if batch is None or lane is None:
                break
            self._dispatch(batch, lane, now)
            dispatched += 1
        if dispatched:
            return dispatched
        with self.cond:
            self.cond.wait(max(0.001, min(wait, again if again is not None else wait)))
        return 0

    def _next(self, now: float) -> tuple[Batch | None, Lane | None, float | None]:
        """The batch to run next and its lane; or, when none can go, seconds until one
        may (None: only an event can change that)."""
        fast = sum(lane.fast(now) for lane in self.lanes)
        again: float | None = None

        def soon(seconds: float) -> None:
            nonlocal again
            again = seconds if again is None else min(again, seconds)

        for running in (b for lane in self.lanes for b in lane.running):
            slow_in = slow_after(running) - (now - running.dispatched)
            if slow_in > 0:
                soon(slow_in)
        # A lane above every lane running now may take a slot more: a high lane never
        # waits for a low lane's batch to end.
        top = max((lane.priority for lane in self.lanes if lane.fast(now)), default=None)
        for lane in self.lanes:  # an outranked lane's next batches are small (module doc)
            cap = lane.own_cap
            if self.outranked(lane):
                cap = OUTRANKED_BATCH if cap is None else min(cap, OUTRANKED_BATCH)
            lane.gathering.cap = cap
        for lane in sorted(self.lanes, key=lambda lane: lane.turn):
            if lane.paused or lane.fast(now) or len(lane.running) >= MAX_WINDOW:
                continue
            if fast >= self.slots and not (top is not None and lane.priority > top
                                           and fast < self.slots + 1):
                continue
            if lane.bucket is not None and (wait := lane.bucket.wait()) > 0:
                soon(wait)
                continue
            if lane.backed_up() is not None:
                soon(BACKED_UP_LOOK)
                continue
            batch, ready_in = lane.gathering.take_ready()
            if batch is not None:
                return batch, lane, None
            if ready_in is not None:
                soon(ready_in)
        return None, None, again

    def _dispatch(self, batch: Batch, lane: Lane, now: float) -> None:
        batch.dispatched = lane.last_dispatched = now
        batch.expected = lane.sizing.expected(batch)
        batch.lane = batch.report.lane = lane.queue
        batch.priority = lane.priority
        if lane.bucket is not None:
            lane.bucket.take(sum(len(w.message.record_ids) for w in batch.works
                                 if w.message is not None))
        low = min(other.turn for other in self.lanes)
        lane.turn = max(lane.turn, low) + 1.0 / lane.weight
        with self.cond:
            lane.running.append(batch)
        future: Future[None] = Future()

        def run() -> None:
            try:
                self.execute(batch, lane)
                future.set_result(None)
            except BaseException as e:  # surfaced by collect() on the service's thread
                future.set_exception(e)
            finally:
                with self.cond:
                    lane.running.remove(batch)
                    self.cond.notify_all()

        # A daemon thread of its own: a batch hung in this process (a pipelet that never
        # returns) must not keep the process from exiting once it is abandoned.
        threading.Thread(target=run, name=f"chalk-run-{lane.queue}", daemon=True).start()
        self.futures.append(future)

    def collect(self) -> None:
        """Raise what a finished batch raised (``RunnerUnusable`` stops the service)."""
        finished = [f for f in self.futures if f.done()]
        if finished:
            self.futures = [f for f in self.futures if not f.done()]
            for future in finished:
                future.result()

    def finish(self, grace: float) -> list[Future[None]]:
        """Wait up to ``grace`` seconds for the running batches; the ones still running
        after it (a hung pipelet) are returned, abandoned."""
        deadline = time.monotonic() + grace
        for future in list(self.futures):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                future.result(timeout=left)
            except Exception:  # surfaced by collect() when the loop was still running
                log.debug("a batch ended with an error while stopping", exc_info=True)
        return [f for f in self.futures if not f.done()]
