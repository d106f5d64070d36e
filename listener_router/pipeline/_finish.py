"""The finish stage: publish with confirms, mark the outbox sent, ack.

A settled message needs one of: its outgoing messages published (committed,
or a duplicate whose outbox batch was never confirmed), a copy in a delay
queue (retrying) or in the dead-letter queue (dead), or nothing yet
(deferred: held unacked and gathered again later).  :meth:`FinishStage.finish`
decides and hands a :class:`Finishing` to the stage's input; there the
messages are published with confirms, the outbox batches marked sent, and
only then the inputs acked.  A failed publish holds them instead; committed
ones then take the inbox path and publish their outbox batch again.

Plug-ins (``Plugin.settle_messages``) may add messages of their own for the
settled messages (events about failures and dead letters): written to the
outbox in a transaction of their own before anything is published, then
published and marked sent with the rest.  Nothing is written or published
for them when no plug-in does.

Before the ack, the settled messages go to the plug-ins' ``settled`` hooks
(the job log writes down the ones no commit transaction did): after their
outgoing messages, retry copies and dead letters are confirmed, so one that
writes them down never misses one (a crash before the ack redelivers the
message; it is settled, and observed, again).  A hook's failure is its own:
it is logged and the messages are acked all the same.
The leader's orphaned outbox batches (:class:`Orphans`) are published on the
same input.  When the last job of a batch is done, its report goes to the
observers.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from listener_router._errors import BrokerUnavailable, InfrastructureError
from listener_router._settings import Settings
from listener_router._signing import HeaderSigner
from listener_router.broker import Link, OutMessage, declare_new_outputs, publish_confirmed
from listener_router.pipeline._batch import Batch
from listener_router.pipeline._held import Holds
from listener_router.pipeline._report import BatchReport, Meter, Observers, Stats, hook_name
from listener_router.pipeline._retries import side_messages
from listener_router.pipeline._stage_input import StageInput
from listener_router.pipeline._states import State
from listener_router.pipeline._work import Work
from listener_router.store import Outbox, ServiceStore, unavailable

__all__ = ["CONFIRM_TIMEOUT", "Finish", "FinishStage", "Finishing", "Orphans", "SettleMessages",
           "Settled"]

log = logging.getLogger(__name__)

CONFIRM_TIMEOUT = 60.0

_DONE = (State.COMMITTED, State.DUPLICATE, State.RETRYING, State.DEAD, State.CANCELLED)


@dataclass(slots=True)
class Finishing:
    """Settled messages of a batch and what to publish for them."""

    batch: Batch | None
    done: list[Work]               # committed, duplicate, retrying, dead
    routed: list[OutMessage]       # their outgoing messages (outbox batches)
    side: list[OutMessage]         # retry copies and dead letters


@dataclass(slots=True)
class Orphans:
    """Outbox batches committed long ago and never confirmed sent (the leader found them)."""

    batches: dict[str, list[OutMessage]]


# Plug-ins' hooks (``Plugin.settle_messages``, ``Plugin.settled``).
SettleMessages = Callable[[Sequence[Work]], list[OutMessage]]
Settled = Callable[[Sequence[Work], "BatchReport | None"], None]


class _Drains(Protocol):
    def drain(self) -> None: ...


class Finish(Protocol):
    """Where a group's settled messages go (``_settlement``): :class:`FinishStage`, or an
    end with no broker (``chalk process``, ``listener_router._offline``).  ``input.drain()``
    waits until what it was handed is done."""

    @property
    def input(self) -> _Drains: ...

    def finish(self, works: list[Work], batch: Batch | None) -> None: ...

    def report_if_finished(self, batch: Batch) -> None: ...


class FinishStage:
    """Publish, mark sent, ack (see module doc); ``input`` is the stage's input."""

    def __init__(self, *, link: Link, settings: Settings, store: ServiceStore, held: Holds,
                 meter: Meter, stats: Stats, observers: Observers,
                 settle_messages: Iterable[SettleMessages] = (), writer: str | None = None,
                 settled: Iterable[Settled] = (), signer: HeaderSigner | None = None):
        self.settle_messages = list(settle_messages)
        self.signer = signer    # retry copies and dead letters carry x-chalk-* headers: signed
        self.writer = writer
        self.link = link
        self.settings = settings
        self.store = store
        self.held = held
        self.meter = meter
        self.stats = stats
        self.observers = observers
        self.settled = list(settled)
        # Queues known to exist: the inputs and the configured outputs.  Others (named
        # by a record's nextDestination) are declared before the first publish to them.
        self.declared: set[str] = {rule.queue for rule in settings.listeners}
        self.declared |= {r.queue for r in settings.routers if r.queue and not r.exchange}
        self.input: StageInput[Finishing | Orphans] = StageInput("chalk-finish", self._handle)

    # -- handing on (any pipeline thread) ------------------------------------------------
    def finish(self, works: list[Work], batch: Batch | None) -> None:
        """Decide what each message needs, hold the deferred, hand the rest to the stage's thread."""
        done = [w for w in works if w.state in _DONE]
        for w in works:
            if w.state is State.DEAD:
                log.warning("dead-lettering %s: %s", w.delivery.message_id or "(no id)", w.error)
            elif w.state is State.RETRYING:
                log.info("retrying %s: %s", w.message.message_id if w.message else "?", w.error)
        routed = [m for w in done for m in w.outgoing]
        side = [m for w in done for m in side_messages(w)]
        if self.signer is not None:
            side = [self.signer.sign(m) for m in side]
        deferred = [w for w in works if w.state is State.DEFERRED]
        if deferred:
            self.stats.add("deferred", len(deferred))
            # Held here, unacked, and gathered again later: rejecting them would raise
            # their delivery count towards the queue's limit.  (Parked ones wait for the
            # batch that holds their records, ``_inflight``, not for a backoff.)
            held = [w.delivery for w in deferred if not w.parked]
            if held:
                backoff = self.held.defer(held)
                log.info("holding %d message(s) for %.1f s: %s", len(held), backoff,
                         next(w for w in deferred if not w.parked).error)
        else:
            self.held.settled(w.delivery.queue for w in works)
        if done:
            if batch is not None:
                with batch.lock:
                    batch.finishing += 1
            self.input.put(Finishing(batch, done, routed, side),
                           batch.priority if batch is not None else 0)

    def publish_orphans(self, orphans: dict[str, list[OutMessage]]) -> None:
        self.input.put(Orphans(orphans))

    def report_if_finished(self, batch: Batch) -> None:
        """Hand the batch's report to the observers once it is settled and finished."""
        with batch.lock:
            if not batch.settled or batch.finishing:
                return
            batch.finishing = -1  # reported: never again
        self.observers.notify(batch.report)

    # -- the stage's thread -----------------------------------------------------------------
    def _handle(self, job: Finishing | Orphans) -> None:
        if isinstance(job, Orphans):
            self._publish_orphans(job.batches)
            return
        try:
            self._publish_and_ack(job)
        finally:
            batch = job.batch
            if batch is not None:
                with batch.lock:
                    batch.finishing -= 1
                self.report_if_finished(batch)

    def _publish_and_ack(self, job: Finishing) -> None:
        """Publish with confirms, mark the outbox sent, ack (this overlaps with the next
        batch's run).  A failed publish hands the inputs back to the gather stage (held,
        unacked); committed ones then take the inbox path and publish their outbox again."""
        done, routed, side = job.done, job.routed, job.side
        report = job.batch.report if job.batch is not None else None
        started = time.perf_counter()
        try:
            if any(w.state is State.DUPLICATE and w.outgoing for w in done):
                routed = self._still_unsent(done)
            extra: list[OutMessage] = []
            extra_batch = None
            if self.settle_messages:
                try:
                    extra, extra_batch = self._extension_messages(done)
                except InfrastructureError as e:
                    log.warning("writing %d settled message(s)' own messages failed; they are "
                                "held and tried again: %s", len(done), e)
                    self._hold(done, str(e))
                    return
            if routed or side or extra:
                try:
                    self._declare_targets(routed)
                    publish_confirmed(self.link, routed + side + extra, CONFIRM_TIMEOUT)
                except BrokerUnavailable as e:
                    log.warning("publishing %d message(s) failed; their inputs are held and "
                                "tried again: %s", len(routed) + len(side) + len(extra), e)
                    self._hold(done, str(e))
                    return
                if report is not None:
                    report.published += len(routed) + len(side) + len(extra)
                    report.count_sent(m.routing_key if not m.exchange
                                      else f"{m.exchange}/{m.routing_key}" for m in routed)
                batches = sorted({w.batch for w in done if w.batch}
                                 | ({extra_batch} if extra_batch else set()))
                try:
                    with self.store.writes, unavailable():
                        self.store.outbox.mark_sent(batches)
                except InfrastructureError as e:
                    log.warning("could not mark %d outbox batch(es) sent: %s", len(batches), e)
            for state, n in Counter(w.label for w in done).items():
                self.stats.add(state, n)
            for hook in self.settled:
                try:
                    hook(done, report)
                except Exception:  # a plug-in's bug never holds an ack
                    log.exception("settled hook %s failed", hook_name(hook))
            for w in done:
                w.to(State.ACKED)
            self.link.ack(w.delivery for w in done)
        except Exception:  # never let the finisher die silently
            log.exception("finishing a batch failed; its inputs are held and tried again")
            self.held.hold([w.delivery for w in done])
        finally:
            self.meter.time("publish", time.perf_counter() - started, report)

    def _hold(self, done: list[Work], error: str) -> None:
        for w in done:
            w.to(State.DEFERRED, error)
        self.held.publish_failed([w.delivery for w in done])

    def _extension_messages(self, done: list[Work]) -> tuple[list[OutMessage], str | None]:
        """The plug-ins' messages for ``done``, written to an outbox batch."""
        extra: list[OutMessage] = []
        for hook in self.settle_messages:
            try:
                extra += hook(done)
            except Exception:  # a plug-in's bug: logged, never the batch's end
                log.exception("settle hook %s failed; going on without its messages",
                              hook_name(hook))
        if not extra:
            return [], None
        with self.store.writes, unavailable(), self.store.engine.begin() as conn:
            batch = Outbox.write(conn, [], [(None, m) for m in extra], writer=self.writer)
        return extra, batch

    def _still_unsent(self, done: list[Work]) -> list[OutMessage]:
        """The outgoing messages of ``done``, less those of duplicates whose outbox batch was
        marked sent after their inbox check (the original's publish ran ahead on this stage).
        Asked of the database: if it cannot say, they are published again (receivers dedupe)."""
        again = {w.batch for w in done if w.state is State.DUPLICATE and w.batch}
        try:
            with unavailable():
                unsent = set(self.store.outbox.unsent(again))
        except InfrastructureError:
            unsent = again
        for w in done:
            if w.state is State.DUPLICATE and w.batch and w.batch not in unsent:
                w.outgoing, w.batch = [], None
        return [m for w in done for m in w.outgoing]

    def _publish_orphans(self, orphans: dict[str, list[OutMessage]]) -> None:
        messages = [m for batch in orphans.values() for m in batch]
        try:
            self._declare_targets(messages)
            publish_confirmed(self.link, messages, CONFIRM_TIMEOUT)
            with self.store.writes, unavailable():
                self.store.outbox.mark_sent(list(orphans))
        except Exception as e:  # the next maintenance round tries again
            log.warning("publishing orphaned outbox rows failed: %s", e)

    def _declare_targets(self, messages: list[OutMessage]) -> None:
        """Declare queues first named by a ``nextDestination`` annotation."""
        new = {m.routing_key for m in messages if not m.exchange} - self.declared
        if not new:
            return
        declare_new_outputs(self.settings, sorted(new))
        self.declared |= new
        log.info("declared routing target(s) %s", ", ".join(sorted(new)))

