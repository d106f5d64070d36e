"""The gather stage of one lane: deliveries → parsed messages → inbox check → records loaded.

On a thread of its own (``chalk-gather-<queue>``) it takes its lane's
deliveries in small chunks (held ones whose backoff has passed first, then
fresh ones: a held message never holds back the others), parses each and
matches its listener rule (bad input and messages no rule or workflow takes
are *dead* at once), checks the inbox (messages already committed are
*duplicates*), and loads the records of the rest onto the blackboards of the
lane's batch being gathered, one blackboard per workflow, with the
messages' attributes written there.  Messages settled here go to the finish
stage at once.

A message that names a message or record in flight in any batch (this
lane's earlier one, another lane's, or the one being gathered), or one that
an earlier parked message waits for, is parked (``_inflight``) and comes back
to the front of the lane the moment it may go; the messages behind it are
gathered meanwhile.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Hashable

import engine
from listener_router._errors import BadMessage, StoreUnavailable
from listener_router._messages import parse_message
from listener_router._rules import ListenerRules
from listener_router._settings import ListenerRule
from listener_router._signing import HeaderSigner
from listener_router.broker import Deliveries, Delivery, Link
from listener_router.pipeline._batch import Batch, Gathering, Group
from listener_router.pipeline._cancelled import Cancelled
from listener_router.pipeline._finish import FinishStage
from listener_router.pipeline._held import Held
from listener_router.pipeline._inflight import InFlight
from listener_router.pipeline._loading import Loader
from listener_router.pipeline._ordered import Ordered
from listener_router.pipeline._report import Meter
from listener_router.pipeline._screen import Screening
from listener_router.pipeline._settlement import Settlement
from listener_router.pipeline._states import State
from listener_router.pipeline._work import Work, keys
from listener_router.store import ServiceStore, unavailable

__all__ = ["CHUNK_LINGER", "GatherStage"]

log = logging.getLogger(__name__)

CHUNK_LINGER = 0.02       # seconds the stage waits to gather more than one delivery

_NO_RULE = ListenerRule(name="none")


class GatherStage:
    """Fills its lane's batch being gathered (see module doc); :meth:`start` runs its thread."""

    def __init__(self, *, link: Link, deliveries: Deliveries, listeners: ListenerRules,
                 registry: engine.WorkflowRegistry, store: ServiceStore, loader: Loader,
                 inflight: InFlight, held: Held, gathering: Gathering, finish: FinishStage,
                 settlement: Settlement, meter: Meter, owner: str, lease_seconds: float,
                 stopping: threading.Event, name: str = "chalk-gather",
                 cancelled: Cancelled | None = None, ordered: Ordered | None = None,
                 screening: Screening | None = None, signer: HeaderSigner | None = None):
        self.link = link
        self.deliveries = deliveries
        self.name = name
        self.listeners = listeners
        self.registry = registry
        self.store = store
        self.loader = loader
        self.inflight = inflight
        self.held = held
        self.gathering = gathering
        self.finish = finish
        self.settlement = settlement
        self.meter = meter
        self.stats = meter.stats
        self.owner = owner
        self.lease_seconds = lease_seconds
        self._service_stopping = stopping
        self.cancelled = cancelled
        self.ordered = ordered
        self.screening = screening
        self.signer = signer    # x-chalk-* headers not signed by the cluster are dropped
        self._stop = threading.Event()
        self._paused = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the thread ----------------------------------------------------------------------
    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def wake(self, deliveries: list[Delivery]) -> None:
        """Deliveries parked on a key that was released: gathered next (any thread)."""
        self.deliveries.put_front(deliveries)

    def stop(self) -> None:
        """Stop; the batch being gathered is let go (records released, messages unacked)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self.gathering.lock:
            batch, self.gathering.batch = self.gathering.batch, None
        if batch is not None:
            for group in batch.groups.values():
                self.settlement.let_go(group)

    def set_paused(self, paused: bool) -> None:
        """Paused, the lane takes nothing: what it took but did not run goes back to the
        queue (any thread; the gather thread does it)."""
        (self._paused.set if paused else self._paused.clear)()

    def _stopped(self) -> bool:
        return self._stop.is_set() or self._service_stopping.is_set()

    def _loop(self) -> None:
        while not self._stopped():
            if self._paused.is_set():
                self._give_back()
                self._stop.wait(0.2)
                continue
            if not self.gathering.wait_for_room(self._stop):
                return
            with self.gathering.lock:
                room = self.gathering.room()
            deliveries = self._take(room)
            if not deliveries:
                continue
            try:
                self._stage(deliveries)
            except Exception:  # never let the stage die: the messages wait unacked
                log.exception("preparing %d message(s) failed; they are held and tried again",
                              len(deliveries))
                self.held.hold(deliveries)

    def _give_back(self) -> None:
        """The lane is paused: the batch being gathered is let go, and every delivery the
        lane holds goes back to the queue (a reject with requeue: for a quorum queue it
        counts as a delivery)."""
        with self.gathering.lock:
            batch, self.gathering.batch = self.gathering.batch, None
        if batch is not None:
            for group in batch.groups.values():
                self.settlement.let_go(group)
        back = self.held.take()
        while True:
            more = self.deliveries.get_batch(1000, timeout=0)
            if not more:
                break
            back += more
        self.inflight.drop(back)
        live = [d for d in back if d.generation == self.link.generation]
        if live:
            self.link.reject(live, requeue=True)
            log.info("lane %s paused: %d message(s) it had taken went back to the queue",
                     live[0].queue, len(live))

    def _take(self, room: int) -> list[Delivery]:
        """Held deliveries whose backoff has passed, then fresh ones, up to ``room``."""
        link = self.link
        chunk: list[Delivery] = []
        if self.held:
            if not link.ready.is_set():
                # The connection is gone: its deliveries come back on the new one.
                self.inflight.drop(self.held.take())
                return []
            taken = self.held.take_due(room)
            chunk = [d for d in taken if d.generation == link.generation]
            if len(chunk) < len(taken):
                self.inflight.drop([d for d in taken if d.generation != link.generation])
        if len(chunk) < room:
            linger = min(CHUNK_LINGER, self.gathering.sizing.max_wait)
            due = self.held.next_due() if self.held else None
            wait = 0 if chunk else min(0.1, due if due is not None else 0.1)
            chunk += self.deliveries.get_batch(room - len(chunk), timeout=wait, linger=linger)
        return chunk

    # -- a chunk -------------------------------------------------------------------------
    def _stage(self, deliveries: list[Delivery]) -> None:
        """Parse a chunk and add it to the batch being gathered."""
        started = time.perf_counter()
        generation = self.link.generation
        stale = [d for d in deliveries if d.generation != generation]
        if stale:  # their connection is gone: they come again on the new one
            self.inflight.drop(stale)
        works = [self._receive(d) for d in deliveries if d.generation == generation]
        self.stats.add("received", len(works))
        received = time.perf_counter() - started
        self.meter.time("receive", received)
        if not works:
            return
        self.stats.last_activity = time.monotonic()
        gathering = self.gathering
        with gathering.lock:
            batch = gathering.current()
            self._add(batch, works)
            gathering.added()
        report = batch.report
        report.add_seconds("receive", received)
        self.meter.time("stage", time.perf_counter() - started, report)

    def _receive(self, d: Delivery) -> Work:
        w = Work(d)
        rules = self.listeners.for_queue(d.queue)
        limits = rules[0] if rules else _NO_RULE
        if self.signer is not None and d.headers:
            d.headers = self.signer.trusted(d.headers, d.message_id, d.body)
        try:
            w.message = parse_message(d.body, queue=d.queue, message_id=d.message_id,
                                      headers=d.headers, max_records=limits.max_records,
                                      max_body_bytes=limits.max_body_bytes, tag=d,
                                      properties=d.properties)
        except BadMessage as e:
            w.to(State.DEAD, str(e))
            return w
        w.rule = self.listeners.match(w.message)
        cancelled = self.cancelled.reason(w.message) if self.cancelled else None
        if cancelled is not None:
            w.to(State.CANCELLED, cancelled)
        elif w.rule is None:
            w.to(State.DEAD, f"message {w.message.message_id}: no listener rule for queue "
                 f"{d.queue!r} matches (operation {w.message.operation})")
        elif w.rule.workflow not in self.registry:
            w.workflow = w.rule.workflow
            w.to(State.DEAD, f"message {w.message.message_id}: listener rule "
                 f"{w.rule.name!r} names unknown workflow {w.rule.workflow!r}; known: "
                 f"{', '.join(self.registry.names()) or 'none'}")
        return w

    def _add(self, batch: Batch, works: list[Work]) -> None:
        """Inbox check, load and attributes for a chunk; the caller holds the gathering lock."""
        inflight = self.inflight
        report = batch.report
        fresh: list[Work] = []
        ordered = self.ordered
        if ordered is not None:
            ordered.restore([w for w in works if w.state is State.RECEIVED])
        # Settled before it could take its keys (cancelled, no rule): out of any line it was in
        inflight.drop([w.delivery for w in works if w.state is not State.RECEIVED])
        live = [w for w in works if w.state is State.RECEIVED]
        # Each one's message and records (and its order key), taken for this batch; or parked
        # in their lines until the batches holding them, and the messages before it, are done.
        wanted: list[tuple[list[Hashable], Delivery, object]]
        if ordered is None:
            wanted = [(keys((w,)), w.delivery, None) for w in live]
        else:
            wanted = [(ordered.keys(w), w.delivery, ordered.hold_of(w)) for w in live]
        taken = inflight.take_or_park_each(wanted, batch, self.wake)
        for w, took in zip(live, taken, strict=True):
            if took:
                fresh.append(w)
            else:
                w.parked = True
                w.to(State.DEFERRED, "waiting for a batch in flight that holds its message "
                     "or records")
        started = time.perf_counter()
        self._check_inbox(fresh)
        self.meter.time("inbox", time.perf_counter() - started, report)
        groups: dict[str, list[Work]] = {}
        for w in fresh:
            if w.state is not State.RECEIVED:
                continue
            assert w.message is not None and w.rule is not None
            w.to(State.PROCESSING)
            w.workflow = w.rule.workflow
            w.loaded = True
            groups.setdefault(w.rule.workflow, []).append(w)
        for name, group_works in groups.items():
            group = batch.groups.get(name)
            if group is None:
                group = batch.groups[name] = Group(
                    name, self.store.blackboard(self.owner, self.lease_seconds), batch=batch)
            loaded = self.loader.load(group.bb, group_works, report)
            runnable = [w for w in loaded if self.loader.apply(group.bb, w)]
            if self.screening is not None:  # plug-ins may settle some without a run
                runnable = self.screening.screen(group, runnable)
            group.works += runnable
        # Parked messages are not the batch's: they take no room, and are counted when
        # they are gathered again.
        parked = [w for w in works if w.parked]
        if parked:
            self.stats.add("parked", len(parked))
            works = [w for w in works if not w.parked]
        batch.works += works
        finished = [w for w in works if w.state is not State.PROCESSING]
        with report.lock:
            report.outcome.update((w.delivery.queue, w.label) for w in finished)
        ended = [w for w in fresh if w.state is not State.PROCESSING]
        released = keys(ended)
        if ordered is not None:  # a commit here frees its order keys, as the commit stage's
            released += [k for w in ended if w.state is State.COMMITTED
                         for k in ordered.holds(w)]
        # On the finish stage's input before their keys are released: a copy of one that
        # committed here (settled without a run) then finds its outbox batch sent.
        self.finish.finish(finished, batch)
        inflight.release(released)

    def _check_inbox(self, live: list[Work]) -> None:
        """Messages already committed become duplicates; an outbox batch of theirs
        never confirmed sent goes with the first of them, to be published again."""
        by_queue: dict[str, list[str]] = {}
        for w in live:
            if w.message is not None:
                by_queue.setdefault(w.message.queue, []).append(w.message.message_id)
        if not by_queue:
            return
        outbox = self.store.outbox
        try:
            with unavailable():
                seen = {(q, mid): batch for q, ids in by_queue.items()
                        for mid, batch in outbox.seen(q, ids).items()}
                unsent = outbox.unsent({b for b in seen.values() if b}) if seen else {}
        except StoreUnavailable as e:
            log.warning("inbox check failed, holding %d message(s): %s", len(live), e)
            for w in live:
                w.to(State.DEFERRED, str(e))
            return
        if not seen:
            return
        for w in live:
            assert w.message is not None
            key = (w.message.queue, w.message.message_id)
            if key in seen:
                w.to(State.DUPLICATE)
                batch = seen[key]
                if batch in unsent:
                    w.outgoing, w.batch = unsent.pop(batch), batch
