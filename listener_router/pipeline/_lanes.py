"""Lanes: one per input queue, and the dispatcher that hands their batches to the runner.

Theory of operation.  Each queue the listener rules read is a *lane*: its
deliveries arrive on a queue of their own (``DeliveriesByQueue``), and it
has its own gather thread, batch sizing, held messages and batch being
gathered.  A lane's trouble stays in the lane: a message held for a backoff,
a batch that runs long, a batch whose failure is being isolated — each holds
back nothing of another lane.

The lanes share the runner (Spark's workers, the service's process) through
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

The dispatcher waits on a condition that every added chunk and every
finished batch signals; it wakes on a clock only for what is about time (a
batch that becomes ready by its age, a batch that becomes slow).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

from listener_router._settings import ListenerRule
from listener_router.broker import Deliveries, Link
from listener_router.cluster import TopologyEvent, TopologyEventType, TopologyListener
from listener_router.pipeline._batch import Batch, BatchSizing, Gathering
from listener_router.pipeline._gather import GatherStage
from listener_router.pipeline._held import Held, Holds
from listener_router.pipeline._report import BatchReport, Observers
from listener_router.pipeline._sizing import Placement, default_sizing

__all__ = ["Dispatcher", "Lane", "MAX_WINDOW", "SLOW_AFTER", "WakeHeld", "make_lane"]

log = logging.getLogger(__name__)

SLOW_AFTER = 2.0          # seconds after which a running batch no longer counts against the slots
MAX_WINDOW = 4            # batches of one lane running at once at most (slow ones too)
IDLE_LOOK = 0.2           # seconds between the loop's own looks (stop, until, idle, refresh)


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
    priority: int = 0
    weight: float = 1.0
    turn: float = 0.0
    running: list[Batch] = field(default_factory=list)

    def fast(self, now: float) -> int:
        """Batches of this lane running that are not slow yet."""
        return sum(1 for b in self.running if now - b.dispatched < SLOW_AFTER)


def make_lane(queue: str, rules: Sequence[ListenerRule], deliveries: Deliveries, held: Held,
              link: Link, *, sizing: BatchSizing | None, local_below: int | None,
              observers: Observers) -> Lane:
    """The lane of one queue: its own sizing (``sizing`` when one is given for every lane;
    else adaptive, told about its own lane's batches), gathering, held messages, placement.
    Its gather stage is made once the stages it hands on to are."""
    own = sizing or default_sizing(rules)
    if sizing is None:
        observers.add(functools.partial(_own_report, queue, own))
    gathering = Gathering(own, lambda: link.waiting_by_queue.get(queue, 0) + deliveries.qsize())
    return Lane(queue, rules, deliveries, held, own, gathering, Placement(own, local_below))


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
        for running in (b for lane in self.lanes for b in lane.running):
            slow_in = SLOW_AFTER - (now - running.dispatched)
            if slow_in > 0:
                again = slow_in if again is None else min(again, slow_in)
        if fast >= self.slots:
            return None, None, again
        for lane in sorted(self.lanes, key=lambda lane: lane.turn):
            if lane.fast(now) or len(lane.running) >= MAX_WINDOW:
                continue
            batch, ready_in = lane.gathering.take_ready()
            if batch is not None:
                return batch, lane, None
            if ready_in is not None:
                again = ready_in if again is None else min(again, ready_in)
        return None, None, again

    def _dispatch(self, batch: Batch, lane: Lane, now: float) -> None:
        batch.dispatched = now
        batch.lane = batch.report.lane = lane.queue
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
