"""Publishing and acking: what the finisher thread does with settled messages.

A settled message needs one of: its outgoing messages published (committed,
or a duplicate whose outbox batch was never confirmed), a copy in a delay
queue (retrying) or in the dead-letter queue (dead), or nothing yet
(deferred: held unacked and tried again with a later batch).  The finisher
publishes with confirms, marks the outbox batches sent, and only then acks
the inputs; a failed publish holds them instead.  At most ``BACKLOG``
batches wait for the committer, and for the finisher, before the thread
that hands one on waits.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pika
import pika.exceptions
from sqlalchemy.exc import SQLAlchemyError

from blackboard import StorageError
from listener_router._amqp import BrokerUnavailable, Delivery, OutMessage, connection_parameters
from listener_router._messages import (
    ATTEMPTS_HEADER,
    ERROR_HEADER,
    QUEUE_HEADER,
    WORKFLOW_HEADER,
    derive_message_id,
)
from listener_router._outbox import Outbox
from listener_router._states import State
from listener_router._steps import Work
from listener_router._topology import declare_outputs, dlq_name, retry_name

__all__ = ["Publishing", "CONFIRM_TIMEOUT", "BACKLOG"]

log = logging.getLogger(__name__)

CONFIRM_TIMEOUT = 60.0
BACKLOG = 3               # batches that may wait for the committer, and for the finisher


class Publishing:
    """The finisher's steps, as methods of the service (which provides the attributes below)."""

    settings: Any
    stats: Any
    link: Any
    outbox: Outbox
    db_writes: Any
    _held: list[Delivery]
    _held_lock: threading.Lock
    _backoff: float
    _committing: list[Future[None]]
    _finisher: ThreadPoolExecutor
    _finishing: list[Future[None]]
    _futures_lock: threading.Lock
    _declared: set[str]

    def _publish_orphans(self, orphans: dict[str, list[OutMessage]]) -> None:
        assert self.link is not None
        messages = [m for batch in orphans.values() for m in batch]
        try:
            self._declare_targets(messages)
            self.link.publish(messages).result(timeout=CONFIRM_TIMEOUT)
            with self.db_writes:
                self.outbox.mark_sent(list(orphans))
        except Exception as e:  # the next maintenance round tries again
            log.warning("publishing orphaned outbox rows failed: %s", e)

    def _copy_headers(self, w: Work, **extra: Any) -> dict[str, Any]:
        headers = {k: v for k, v in w.delivery.headers.items() if k != ERROR_HEADER}
        headers.update(extra)
        return headers

    def _side_messages(self, w: Work) -> list[OutMessage]:
        if w.state is not State.RETRYING and w.state is not State.DEAD:
            return []
        d = w.delivery
        mid = w.message.message_id if w.message else (d.message_id or derive_message_id(d.body))
        attempts = (w.message.attempts if w.message else 0) + 1
        error = (w.error or "unknown error")[:4000]
        if w.state is State.RETRYING:
            assert w.rule is not None
            steps = len(w.rule.backoff_ms)
            key = retry_name(d.queue, min(attempts, steps)) if steps else d.queue
            return [OutMessage(routing_key=key, body=d.body, message_id=mid,
                               headers=self._copy_headers(w, **{ATTEMPTS_HEADER: attempts,
                                                                "x-chalk-last-error": error}))]
        return [OutMessage(routing_key=dlq_name(d.queue), body=d.body, message_id=mid,
                           headers=self._copy_headers(w, **{
                               ERROR_HEADER: error, WORKFLOW_HEADER: w.workflow or "",
                               ATTEMPTS_HEADER: attempts, QUEUE_HEADER: d.queue}))]

    def _finish(self, works: list[Work]) -> None:
        """Decide what each message needs, hold the deferred, hand the rest to the finisher."""
        done_states = (State.COMMITTED, State.DUPLICATE, State.RETRYING, State.DEAD)
        done = [w for w in works if w.state in done_states]
        for w in works:
            if w.state is State.DEAD:
                log.warning("dead-lettering %s: %s", w.delivery.message_id or "(no id)", w.error)
            elif w.state is State.RETRYING:
                log.info("retrying %s: %s", w.message.message_id if w.message else "?", w.error)
        routed = [m for w in done for m in w.outgoing]
        side = [m for w in done for m in self._side_messages(w)]
        deferred = [w for w in works if w.state is State.DEFERRED]
        if deferred:
            # Held here, unacked, and tried again with the next batch: rejecting
            # them would raise their delivery count towards the queue's limit.
            self.stats.add("deferred", len(deferred))
            self._hold(w.delivery for w in deferred)
            self._backoff = min(max(self._backoff * 2, 0.2), 30.0)
            log.info("holding %d message(s) for %.1f s: %s", len(deferred), self._backoff,
                     deferred[0].error)
        elif not self._held:
            self._backoff = 0.0
        if done:
            self._submit(lambda: self._publish_and_ack(done, routed, side))

    def _hold(self, deliveries: Iterable[Delivery]) -> None:
        with self._held_lock:
            self._held.extend(deliveries)

    def _submit(self, job: Callable[[], None]) -> None:
        """Run ``job`` on the finisher thread."""
        self._push(self._finisher, self._finishing, job)

    def _push(self, executor: ThreadPoolExecutor, futures: list[Future[None]],
              job: Callable[[], None]) -> None:
        """Run ``job`` on ``executor``; past ``BACKLOG`` jobs waiting there, wait for one."""
        with self._futures_lock:
            futures.append(executor.submit(job))
            futures[:] = [f for f in futures if not f.done()]
            oldest = futures[0] if len(futures) > BACKLOG else None
        if oldest is not None:
            oldest.result()

    def _declare_targets(self, messages: Sequence[OutMessage]) -> None:
        """Declare queues first named by a ``nextDestination`` annotation (finisher thread)."""
        new = {m.routing_key for m in messages if not m.exchange} - self._declared
        if not new:
            return
        connection = pika.BlockingConnection(connection_parameters(self.settings.broker_url))
        try:
            declare_outputs(connection, self.settings, sorted(new))
        finally:
            if connection.is_open:
                connection.close()
        self._declared |= new
        log.info("declared routing target(s) %s", ", ".join(sorted(new)))

    def drain(self) -> None:
        """Wait until every batch handed on is committed, published and acked."""
        for futures in (self._committing, self._finishing):
            while True:
                with self._futures_lock:
                    if not futures:
                        break
                    oldest = futures.pop(0)
                oldest.result()

    def _publish_and_ack(self, done: list[Work], routed: list[OutMessage],
                         side: list[OutMessage]) -> None:
        """On the finisher thread: publish with confirms, mark the outbox sent, ack.

        This overlaps with the next batch's workflow run.  A failed publish
        hands the inputs back to the stage (held, unacked); committed ones
        then take the inbox path and publish their outbox rows again.
        """
        assert self.link is not None
        started = time.perf_counter()
        try:
            if routed or side:
                try:
                    self._declare_targets(routed)
                    self.link.publish(routed + side).result(timeout=CONFIRM_TIMEOUT)
                except (BrokerUnavailable, TimeoutError, pika.exceptions.AMQPError, OSError) as e:
                    log.warning("publishing %d message(s) failed; their inputs are held and "
                                "tried again: %s", len(routed) + len(side), e)
                    for w in done:
                        w.to(State.DEFERRED, str(e))
                    self._hold(w.delivery for w in done)
                    self._backoff = min(max(self._backoff * 2, 0.5), 30.0)
                    return
                batches = sorted({w.batch for w in done if w.batch})
                try:
                    with self.db_writes:
                        self.outbox.mark_sent(batches)
                except (StorageError, SQLAlchemyError) as e:
                    log.warning("could not mark %d outbox batch(es) sent: %s", len(batches), e)
            for w in done:
                self.stats.add(w.state.value)
                w.to(State.ACKED)
            self.link.ack(w.delivery for w in done)
        except Exception:  # never let the finisher die silently
            log.exception("finishing a batch failed; its inputs are held and tried again")
            self._hold(w.delivery for w in done)
        finally:
            self.stats.add("publish_ms", int((time.perf_counter() - started) * 1000))
