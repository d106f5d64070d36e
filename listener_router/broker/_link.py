"""RabbitMQ through pika: a SelectConnection on its own thread.

pika is not thread-safe, and a BlockingConnection answers heartbeats only
while its thread is inside pika — a long Spark job would drop it.  So the
connection lives on one I/O thread; the service hands it acks, rejects and
publishes with ``add_callback_threadsafe`` and gets deliveries from a queue.

Publishing uses publisher confirms asynchronously: a batch of messages is
published at once and its :class:`~concurrent.futures.Future` resolves when
the broker has confirmed every one (or fails on a nack or a lost connection).

Delivery tags belong to one channel; after a reconnect, tags from the old
channel are void (the broker redelivers those messages), so acks carry the
channel generation and stale ones are dropped.

``max_inflight_bytes`` (each queue's, or one for all) bounds the bodies
delivered and not yet acked or rejected (``_bytes``): a queue's consumers
are made with the prefetch that fits its bound at the size of its bodies,
and a queue past its bound, or sent a body larger than its consumers were
made for, stops being consumed until what it holds falls to half the bound.
Deliveries that were on the wire when a consumer was cancelled are taken
like any other (pika would reject them back to the queue, raising a quorum
queue's delivery count), so a flood of large messages costs memory up to
the bound, not up to the prefetch.

A URL naming several nodes of a cluster (``_connection.broker_urls``): the
link connects to one; when that connection ends or a node does not answer,
it tries the next at once, and backs off only after a round of all of them
failed.  Quorum and stream queues are reachable through any node, so a
consumer carries on wherever it lands.

:attr:`AmqpLink.waiting` is how many messages are ready in the broker for
the consumed queues (``_depth``): the batch sizing reads it to tell a
backlog from a light load.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

import pika
import pika.exceptions
from pika.spec import Basic

from listener_router._errors import BrokerUnavailable
from listener_router.broker._bytes import ByteBudget
from listener_router.broker._connection import broker_reason, node_parameters
from listener_router.broker._depth import DepthProbe
from listener_router.broker._memory import map_large_bodies
from listener_router.broker._values import (
    EVENT_TOPIC_HEADER,
    Deliveries,
    Delivery,
    OutMessage,
    coalesce_output,
    properties_of,
)

__all__ = ["AmqpLink"]

log = logging.getLogger(__name__)


class _Batch:
    __slots__ = ("future", "remaining")

    def __init__(self, future: Future[int], remaining: int):
        self.future = future
        self.remaining = remaining


class AmqpLink(DepthProbe):
    """One broker connection on an I/O thread: consume, ack, publish with confirms.

    ``prefetch`` is every consumer's, or each queue's (a mapping).  ``prepare`` (called on
    the I/O thread before each (re)connect, with a
    BlockingConnection) declares the topology.  ``consume`` names the queues
    to consume; deliveries arrive on :attr:`deliveries`.
    ``consume_arguments(queue)``, when given, is asked for each queue's
    ``basic.consume`` arguments at every (re)connect, after :attr:`generation`
    has moved on (a stream's ``x-stream-offset``: where to resume).

    A batch of publishes is written with few system calls (:func:`coalesce_output`);
    ``coalesce = False`` writes each frame on its own, as pika does.
    """

    coalesce = True

    def __init__(self, url: str, *, prefetch: int | Mapping[str, int] = 1000,
                 consume: Sequence[str] = (),
                 prepare: Callable[[pika.BlockingConnection], None] | None = None,
                 reconnect_max_delay: float = 10.0, first_generation: int = 0,
                 consume_arguments: Callable[[str], dict[str, Any]] | None = None,
                 deliveries: Deliveries | None = None, paused: Iterable[str] = (),
                 depth_of: Sequence[str] = (),
                 max_inflight_bytes: int | Mapping[str, int] | None = None):
        self.url = url
        self.budget = ByteBudget(max_inflight_bytes) if max_inflight_bytes else None
        self.prefetch = prefetch        # for every consumer, or by queue
        self.queues = list(consume)
        self.paused: set[str] = set(paused)   # queues not consumed until resumed
        self.depth_of = [q for q in dict.fromkeys(depth_of) if q not in self.queues]
        self.prepare = prepare
        self.consume_arguments = consume_arguments
        self.reconnect_max_delay = reconnect_max_delay
        self._nodes = node_parameters(url)
        self._node = 0                  # the node to try next (index into _nodes)
        self.deliveries = Deliveries() if deliveries is None else deliveries
        self.ready = threading.Event()
        self._wake = threading.Event()
        self.generation = first_generation
        self.last_error: str | None = None
        self.returned = 0
        self.waiting = 0
        self.waiting_by_queue: dict[str, int] = {}
        self._depths: dict[str, int] = {}
        self._probe_ch: Any = None
        self._probing = 0
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._conn: pika.SelectConnection | None = None
        self._consume_ch: Any = None
        self._publish_ch: Any = None
        self._consumer_tags: dict[str, list[str]] = {}
        self._unacked: set[int] = set()
        self._seq = 0
        self._pending: dict[int, _Batch] = {}

    # -- lifecycle (any thread) ---------------------------------------------------
    def start(self, wait: float | None = 30.0) -> AmqpLink:
        map_large_bodies()   # the deliveries' bodies are held in this process until settled
        self._thread = threading.Thread(target=self._run, name="chalk-amqp", daemon=True)
        self._thread.start()
        if wait is not None and not self.ready.wait(wait):
            raise BrokerUnavailable(f"broker {self._safe_url()} not reachable within {wait:.0f} s"
                                    + (f": {self.last_error}" if self.last_error else ""))
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping = True
        self._wake.set()
        conn = self._conn
        if conn is not None:
            try:
                conn.ioloop.add_callback_threadsafe(self._close)
            except Exception:  # the loop is already gone
                pass
        if self._thread is not None:
            self._thread.join(timeout)

    def _safe_url(self) -> str:
        params = self._nodes[self._node % len(self._nodes)]
        return f"{params.host}:{params.port}"

    def _call(self, fn: Callable[[], None]) -> bool:
        conn = self._conn
        if conn is None or not self.ready.is_set():
            return False
        try:
            conn.ioloop.add_callback_threadsafe(fn)
            return True
        except Exception as e:  # closed between the check and the call
            log.debug("broker call dropped: %s", e)
            return False

    def publish(self, messages: Sequence[OutMessage]) -> Future[int]:
        """Publish persistently; the future resolves (to the count) when all are confirmed."""
        future: Future[int] = Future()
        if not messages:
            future.set_result(0)
            return future
        if not self._call(lambda: self._publish(list(messages), future)):
            future.set_exception(BrokerUnavailable("not connected to the broker"))
        return future

    def ack(self, deliveries: Iterable[Delivery]) -> None:
        self.ack_tags([(d.generation, d.tag) for d in deliveries])

    def ack_tags(self, tags: list[tuple[int, int]]) -> None:
        """Ack by ``(generation, delivery tag)``; tags of an earlier connection are dropped."""
        if tags:
            self._call(lambda: self._ack(tags))

    def reject(self, deliveries: Iterable[Delivery], *, requeue: bool) -> None:
        self.reject_tags([(d.generation, d.tag) for d in deliveries], requeue=requeue)

    def reject_tags(self, tags: list[tuple[int, int]], *, requeue: bool) -> None:
        if tags:
            self._call(lambda: self._reject(tags, requeue))

    def stop_consuming(self) -> None:
        self._call(self._cancel)

    def pause(self, queue: str) -> None:
        """Stop consuming ``queue`` (its unacked deliveries stay the caller's to settle)."""
        self._call(lambda: self._pause(queue))

    def resume(self, queue: str) -> None:
        """Consume ``queue`` again."""
        self._call(lambda: self._resume(queue))

    # -- I/O thread -------------------------------------------------------------
    def _run(self) -> None:
        delay = 0.5
        failed = 0   # attempts in a row that never got as far as consuming
        while not self._stopping:
            generation_before = self.generation
            params = self._nodes[self._node % len(self._nodes)]
            try:
                if self.prepare is not None:
                    blocking = pika.BlockingConnection(params)
                    try:
                        self.prepare(blocking)
                    finally:
                        if blocking.is_open:
                            blocking.close()
                self._conn = pika.SelectConnection(
                    params, on_open_callback=self._on_open,
                    on_open_error_callback=self._on_open_error,
                    on_close_callback=self._on_closed)
                self._conn.ioloop.start()
            except pika.exceptions.AMQPChannelError as e:
                self.last_error = f"topology refused by the broker: {e}"
                log.error("broker %s: %s", self._safe_url(), self.last_error)
            except (pika.exceptions.AMQPError, OSError) as e:
                self.last_error = broker_reason(e, self.url)
                log.warning("broker %s unavailable: %s", self._safe_url(), self.last_error)
            self.ready.clear()
            self._fail_pending(BrokerUnavailable(f"connection to the broker lost: {self.last_error}"))
            self._state_changed(False)
            if self._stopping:
                break
            self._node += 1   # the next node of a cluster (the same one when there is one)
            if self.generation != generation_before:
                failed, delay = 0, 0.5   # we were connected: start the backoff afresh
            else:
                failed += 1
                if failed % len(self._nodes):
                    continue   # a node of this round not tried yet: at once
            self._wake.wait(delay)
            delay = min(delay * 2, self.reconnect_max_delay)

    def _on_open(self, conn: pika.SelectConnection) -> None:
        conn.channel(on_open_callback=self._on_consume_channel)

    def _on_open_error(self, conn: Any, error: Exception) -> None:
        self.last_error = f"cannot connect: {broker_reason(error, self.url)}"
        conn.ioloop.stop()

    def _on_closed(self, conn: Any, reason: Exception) -> None:
        if not self._stopping:
            self.last_error = f"connection closed: {broker_reason(reason, self.url)}"
            log.warning("broker %s: %s", self._safe_url(), self.last_error)
        self.ready.clear()
        conn.ioloop.stop()

    def _on_consume_channel(self, channel: Any) -> None:
        self._consume_ch = channel
        channel.add_on_close_callback(self._on_channel_closed)
        first = self.prefetch if isinstance(self.prefetch, int) else \
            max(self.prefetch.values(), default=1000)
        channel.basic_qos(prefetch_count=first, callback=lambda _f: self._open_publisher())

    def _open_publisher(self) -> None:
        assert self._conn is not None
        self._conn.channel(on_open_callback=self._on_publish_channel)

    def _on_publish_channel(self, channel: Any) -> None:
        self._publish_ch = channel
        channel.add_on_close_callback(self._on_channel_closed)
        self._seq = 0
        self._pending.clear()
        channel.add_on_return_callback(self._on_return)
        channel.confirm_delivery(ack_nack_callback=self._on_confirm,
                                 callback=lambda _f: self._start_consuming())

    def _start_consuming(self) -> None:
        self.generation += 1
        self._unacked.clear()
        if self.budget is not None:
            self.budget.reset()
        self._consumer_tags = {}
        for name in dict.fromkeys(self.queues):
            if name not in self.paused:
                self._consume(name)
        self.last_error = None
        self.ready.set()
        self._state_changed(True)
        consumed = [q for q in dict.fromkeys(self.queues) if q not in self.paused]
        log.info("connected to broker %s, consuming %s%s", self._safe_url(),
                 ", ".join(consumed) or "nothing",
                 f" (paused: {', '.join(sorted(self.paused))})" if self.paused else "")
        if self.queues or self.depth_of:
            self._probe(self.generation)

    def _consume(self, name: str) -> None:
        """Start this queue's consumers (as many as it is listed in ``queues``)."""
        generation = self.generation
        deliver = self._deliver
        budget = self.budget

        def on_message(ch: Any, method: Any, props: Any, body: bytes) -> None:
            self._unacked.add(method.delivery_tag)
            if budget is not None and budget.delivered(method.delivery_tag, name, len(body)):
                self._cancel_queue(name)
            deliver(generation, method.delivery_tag, name, body, props.message_id,
                    dict(props.headers or {}), bool(method.redelivered),
                    {"content_type": props.content_type, "timestamp": props.timestamp,
                     "routing_key": method.routing_key, "exchange": method.exchange})

        tags = self._consumer_tags.setdefault(name, [])
        if budget is not None:   # what fits the queue's bound, for the consumers made next
            self._consume_ch.basic_qos(prefetch_count=budget.prefetch(
                name, self._configured(name), self.queues.count(name)))
        elif not isinstance(self.prefetch, int):  # this queue's, for the consumers made next
            self._consume_ch.basic_qos(prefetch_count=self.prefetch.get(name, 1000))
        for _ in range(self.queues.count(name)):
            arguments = self.consume_arguments(name) if self.consume_arguments else None
            tags.append(self._consume_ch.basic_consume(name, on_message, arguments=arguments))

    def _pause(self, queue: str) -> None:
        self.paused.add(queue)
        ch = self._consume_ch
        for tag in self._consumer_tags.pop(queue, []):
            if ch is not None and ch.is_open:
                ch.basic_cancel(tag)

    def _resume(self, queue: str) -> None:
        self.paused.discard(queue)
        ch = self._consume_ch
        if queue in self.queues and queue not in self._consumer_tags and ch is not None \
                and ch.is_open and self.ready.is_set() \
                and (self.budget is None or queue not in self.budget.stopped):
            self._consume(queue)

    # -- bytes in flight (I/O thread; see _bytes) -------------------------------------------
    def _configured(self, queue: str) -> int:
        return self.prefetch if isinstance(self.prefetch, int) else self.prefetch.get(queue, 1000)

    def _cancel_queue(self, queue: str) -> None:
        """Stop consuming ``queue``; what was on the wire for it still comes to its handler
        (pika would reject it back to the queue)."""
        ch = self._consume_ch
        for consumer in self._consumer_tags.pop(queue, []):
            if ch is not None and ch.is_open:
                ch.basic_cancel(consumer, callback=lambda _frame: None)
                getattr(ch, "_cancelled", set()).discard(consumer)

    def _settled(self, tags: Iterable[int]) -> None:
        assert self.budget is not None
        counts = {q: self.queues.count(q) for q in self.queues}
        configured = {q: self._configured(q) for q in counts}
        for queue in self.budget.settled(tags, configured, counts):
            if queue not in self.paused:
                self._cancel_queue(queue)   # consumed again with the prefetch that fits now
                self._resume(queue)

    def _deliver(self, *fields: Any) -> None:
        """A delivery arrived (I/O thread): the fields of a :class:`Delivery`."""
        self.deliveries.put(Delivery(*fields))

    def _state_changed(self, up: bool) -> None:
        """The link became ready (consuming) or lost its connection (I/O thread)."""

    def _on_channel_closed(self, channel: Any, reason: Exception) -> None:
        if self._stopping or getattr(reason, "reply_code", None) == 200:
            return  # the connection closing takes its channels along: not the cause
        self.last_error = f"channel closed: {reason}"
        log.warning("broker %s: %s", self._safe_url(), self.last_error)
        conn = self._conn
        if conn is not None and conn.is_open:
            conn.close()

    def _publish(self, messages: list[OutMessage], future: Future[int]) -> None:
        ch = self._publish_ch
        if ch is None or not ch.is_open:
            future.set_exception(BrokerUnavailable("publish channel not open"))
            return
        batch = _Batch(future, len(messages))
        try:
            for message in messages:
                ch.basic_publish(message.exchange, message.routing_key, message.body,
                                 properties_of(message), mandatory=True)
                self._seq += 1
                self._pending[self._seq] = batch
        except Exception as e:  # channel died mid-batch
            if not future.done():
                future.set_exception(BrokerUnavailable(f"publish failed: {e}"))
        if self.coalesce:
            coalesce_output(self._conn)

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        ok = isinstance(method, Basic.Ack)
        pending = self._pending
        if method.multiple:  # sequence numbers enter in order: the confirmed ones lead
            tags = []
            for t in pending:
                if t > method.delivery_tag:
                    break
                tags.append(t)
        else:
            tags = [method.delivery_tag]
        for tag in tags:
            batch = pending.pop(tag, None)
            if batch is None or batch.future.done():
                continue
            if not ok:
                batch.future.set_exception(BrokerUnavailable("the broker refused a message (nack)"))
                continue
            batch.remaining -= 1
            if batch.remaining == 0:
                batch.future.set_result(1)

    def _on_return(self, _channel: Any, method: Any, props: Any, _body: bytes) -> None:
        # The broker could route the message nowhere (an exchange without a
        # matching binding); it still confirms it.  An event nobody listens
        # to is normal (a topic exchange without subscribers); anything else
        # is a message lost, so say that loudly.
        if EVENT_TOPIC_HEADER in (props.headers or {}):
            log.debug("event %s (%s) had no subscriber bound", props.message_id,
                      method.routing_key)
            return
        self.returned += 1
        log.error("message %s to exchange %r routing key %r was returned unroutable: %s",
                  props.message_id, method.exchange, method.routing_key, method.reply_text)

    def _ack(self, tags: list[tuple[int, int]]) -> None:
        live = sorted(t for g, t in tags if g == self.generation and t in self._unacked)
        if not live or self._consume_ch is None or not self._consume_ch.is_open:
            return
        top = live[-1]
        below = sum(1 for t in self._unacked if t <= top)
        if below == len(live):
            self._consume_ch.basic_ack(top, multiple=True)
        else:
            for tag in live:
                self._consume_ch.basic_ack(tag)
        self._unacked.difference_update(live)
        if self.budget is not None:
            self._settled(live)

    def _reject(self, tags: list[tuple[int, int]], requeue: bool) -> None:
        if self._consume_ch is None or not self._consume_ch.is_open:
            return
        for generation, tag in tags:
            if generation == self.generation and tag in self._unacked:
                self._consume_ch.basic_nack(tag, requeue=requeue)
                self._unacked.discard(tag)
                if self.budget is not None:
                    self._settled([tag])

    def _cancel(self) -> None:
        for tags in self._consumer_tags.values():
            for tag in tags:
                if self._consume_ch is not None and self._consume_ch.is_open:
                    self._consume_ch.basic_cancel(tag)
        self._consumer_tags = {}

    def _close(self) -> None:
        if self._conn is not None and (self._conn.is_open or self._conn.is_opening):
            self._conn.close()
        elif self._conn is not None:
            self._conn.ioloop.stop()

    def _fail_pending(self, error: Exception) -> None:
        for batch in list(self._pending.values()):
            if not batch.future.done():
                batch.future.set_exception(error)
        self._pending.clear()
