"""The end of a group's life in a batch, and of the batch.

A group (one workflow's messages of a batch) ends in one of two ways:

- *settled* (:meth:`Settlement.group_done`): its workflow ran and its
  messages were committed, failed or deferred; its records leave the
  blackboard, its in-flight keys are released, its messages go to the finish
  stage;
- *let go* (:meth:`Settlement.let_go`): it will not run (the service stops,
  or the runner broke); its records leave, its messages are held unacked.

A batch is settled when its run and each of its groups are
(:meth:`Settlement.part_done`): that is the "batch of N message(s)" log line.
"""

from __future__ import annotations

import logging
import time

from listener_router.pipeline._batch import Batch, Group
from listener_router.pipeline._finish import Finish
from listener_router.pipeline._held import Holds
from listener_router.pipeline._inflight import InFlight
from listener_router.pipeline._loading import Loader
from listener_router.pipeline._ordered import Ordered
from listener_router.pipeline._report import Meter
from listener_router.pipeline._states import State
from listener_router.pipeline._work import Work, keys

__all__ = ["Settlement"]

log = logging.getLogger(__name__)


class Settlement:
    """Ends groups and batches (see module doc)."""

    def __init__(self, *, loader: Loader, inflight: InFlight, held: Holds, finish: Finish,
                 meter: Meter, orders: dict[str, Ordered] | None = None):
        self.loader = loader
        self.inflight = inflight
        self.held = held
        self.finish = finish
        self.meter = meter
        self.orders = orders or {}

    def group_done(self, group: Group) -> None:
        """The group is settled: its records leave, its messages go to the finish stage."""
        leftover = group.bb.ids()
        if leftover:
            self.loader.invalidate(group.bb, leftover)
        self.works_done(group.works, group.batch)

    def works_done(self, works: list[Work], batch: Batch | None) -> None:
        """Settled messages (their records have left the blackboard) go to the finish stage:
        a group's, or a part of one settled early while the rest still runs."""
        for w in works:
            if w.state is State.PROCESSING:  # an unexpected failure settling it
                w.to(State.DEFERRED, "internal error while settling the batch")
        if batch is not None:
            report = batch.report
            with report.lock:
                report.outcome.update((w.delivery.queue, w.label) for w in works)
        # On the finish stage's input before a duplicate of these messages can be gathered (that
        # needs the keys released): the duplicate then finds their outbox batch sent.
        kept = self._keep_order(works)   # in the store before anything is acked
        self.finish.finish(works, batch)
        self._release(works, kept)
        if batch is not None:
            self.part_done(batch)

    def let_go(self, group: Group) -> None:
        """Release a group that will not run: its records leave, its messages wait unacked
        (held, for a later ``run`` on this connection; or redelivered after it)."""
        leftover = group.bb.ids()
        if leftover:
            self.loader.invalidate(group.bb, leftover)
        self._release(group.works, self._keep_order(group.works))
        self.held.hold_first([w.delivery for w in group.works])
        group.works = []

    def _keep_order(self, works: list[Work]) -> set[int]:
        """In an ordered queue, a message that will come again (retrying, deferred, let go)
        keeps its order keys until it does, the store's holds of those that ended are
        freed (``_ordered``); returns the kept messages (``id``)."""
        kept: set[int] = set()
        if not self.orders:  # no ordered queue: nothing to keep (no pass over the messages)
            return kept
        for queue, some in _by_queue(works).items():
            ordered = self.orders.get(queue)
            if ordered is None:
                continue
            ordered.settle(some)
            again = [w for w in some if w.state is not State.COMMITTED and w.state not in _ENDED]
            ordered.keep([w for w in again if w.state is State.RETRYING], stored=True)
            ordered.keep([w for w in again if w.state is not State.RETRYING], stored=False)
            kept.update(id(w) for w in again)
        return kept

    def _release(self, works: list[Work], kept: set[int]) -> None:
        """Release the messages' keys, and the order keys of those not kept."""
        released = keys(works)
        if self.orders:
            for queue, some in _by_queue(works).items():
                ordered = self.orders.get(queue)
                if ordered is not None:
                    released += [k for w in some if id(w) not in kept for k in ordered.holds(w)]
        self.inflight.release(released)

    def part_done(self, batch: Batch) -> None:
        """One part of the batch (its run, or a group) is settled; the last one logs it."""
        with batch.lock:
            batch.pending -= 1
            if batch.pending:
                return
            batch.settled = True
        report = batch.report
        elapsed = time.perf_counter() - batch.started
        report.messages = len(batch.works)
        log.info("batch of %d message(s) in %.2f s: %s", len(batch.works), elapsed,
                 ", ".join(f"{n} {state}" for state, n in sorted(report.states().items())))
        self.meter.stats.add("batches")
        self.meter.time("batch", elapsed, report)
        # Groups point back at their batch: drop that cycle so the batch's messages
        # are freed now, by reference counting, not by a garbage-collector pass.
        batch.groups.clear()
        self.finish.report_if_finished(batch)


_ENDED = (State.DEAD, State.DUPLICATE, State.CANCELLED)


def _by_queue(works: list[Work]) -> dict[str, list[Work]]:
    out: dict[str, list[Work]] = {}
    for w in works:
        out.setdefault(w.delivery.queue, []).append(w)
    return out
