"""Queues the service declares: inputs, their dead-letter and retry queues, outputs.

For an input queue ``Q``:

- ``Q`` — durable (quorum by default) with a delivery limit; a message the
  broker delivered too often (a service crashing on it) dead-letters to ``Q.dlq``;
- ``Q.dlq`` — dead letters, with the reason in ``x-chalk-error``;
- ``Q.retry.N`` — classic delay queues, one per backoff step: messages wait
  their TTL there and dead-letter back into ``Q``.

Each is bounded by bytes (``x-max-length-bytes``: ``[broker]
max_dead_letter_bytes`` for ``Q.dlq``, ``max_queue_bytes`` for the others)
with ``x-overflow = reject-publish``: a full queue refuses what is
published to it (a nack: the publisher keeps the message) instead of
dropping its oldest.

Exchanges the plug-ins publish to (the events' topic exchange when any kind
of event is on: ``Plugin.exchanges``) are declared with them.  Output queues
are declared like inputs (a downstream Chalk service consumes them), so two
services agree on a queue's arguments whichever declares it first.  A queue that already exists with other arguments (made by someone
else) is used as it is, with a warning.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

import pika
import pika.exceptions

from listener_router._entry_points import plugin_classes
from listener_router._errors import BrokerUnavailable
from listener_router._settings import ListenerRule, RouterRule, Settings
from listener_router.broker._connection import broker_reason, connect

__all__ = ["dlq_name", "retry_name", "declare_input", "declare_all", "declare_outputs",
           "declare_new_outputs", "plugin_exchanges"]

log = logging.getLogger(__name__)


def dlq_name(queue: str) -> str:
    return f"{queue}.dlq"


def retry_name(queue: str, step: int) -> str:
    return f"{queue}.retry.{step}"


class _Declarer:
    """Declares on one connection, reopening the channel after a refused declare."""

    def __init__(self, connection: pika.BlockingConnection):
        self.connection = connection
        self.channel = connection.channel()

    def queue(self, name: str, arguments: dict[str, Any]) -> None:
        try:
            self.channel.queue_declare(name, durable=True, arguments=arguments)
        except pika.exceptions.ChannelClosedByBroker as e:
            if e.reply_code != 406:
                raise
            self.channel = self.connection.channel()
            self.channel.queue_declare(name, passive=True)
            log.warning("queue %s exists with other arguments than Chalk's (%s); using it as "
                        "it is", name, e.reply_text)

    def exchange(self, name: str, kind: str = "direct") -> None:
        """Use an existing exchange; declare a durable one of ``kind`` when there is none."""
        try:
            self.channel.exchange_declare(name, passive=True)
        except pika.exceptions.ChannelClosedByBroker as e:
            if e.reply_code != 404:
                raise
            self.channel = self.connection.channel()
            self.channel.exchange_declare(name, exchange_type=kind, durable=True)
            log.info("declared exchange %s (durable, %s)", name, kind)

    def close(self) -> None:
        if self.channel.is_open:
            self.channel.close()


def _bounded(max_bytes: int) -> dict[str, Any]:
    """The arguments that bound a queue by bytes, refusing (not dropping) past the bound."""
    if not max_bytes:
        return {}
    return {"x-max-length-bytes": int(max_bytes), "x-overflow": "reject-publish"}


def declare_input(declarer: _Declarer | Any, queue: str, settings: Settings,
                  backoff_ms: Iterable[int] = (), *, single_active: bool = False) -> None:
    """Declare ``queue`` with its dead-letter and retry queues; ``single_active``: one
    consumer of all takes its messages at a time (an ordered queue's)."""
    if not isinstance(declarer, _Declarer):  # a BlockingConnection
        declarer = _Declarer(declarer)
    kind = {"x-queue-type": settings.queue_type}
    args: dict[str, Any] = dict(kind, **{"x-dead-letter-exchange": "",
                                         "x-dead-letter-routing-key": dlq_name(queue)},
                                **_bounded(settings.max_queue_bytes))
    if single_active:
        args["x-single-active-consumer"] = True
    if settings.queue_type == "quorum":
        args["x-delivery-limit"] = settings.delivery_limit
        # a message the broker dead-letters must arrive in Q.dlq even across restarts
        args["x-dead-letter-strategy"] = "at-least-once"
        args["x-overflow"] = "reject-publish"
    declarer.queue(queue, args)
    declarer.queue(dlq_name(queue), dict(kind, **_bounded(settings.max_dead_letter_bytes)))
    for step, delay in enumerate(backoff_ms, start=1):
        declarer.queue(retry_name(queue, step), {
            "x-queue-type": settings.queue_type, "x-message-ttl": int(delay),
            "x-dead-letter-exchange": "", "x-dead-letter-routing-key": queue,
            **_bounded(settings.max_queue_bytes),
            **({"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"}
               if settings.queue_type == "quorum" else {})})


def plugin_exchanges(settings: Settings) -> list[tuple[str, str]]:
    """``(name, type)`` of each exchange the plug-ins turned on in ``settings`` publish to."""
    found: list[tuple[str, str]] = []
    for cls in plugin_classes():
        found += cls.exchanges(settings)  # type: ignore[attr-defined]
    return found


def declare_all(connection: pika.BlockingConnection, settings: Settings,
                listeners: Iterable[ListenerRule] | None = None,
                routers: Iterable[RouterRule] | None = None,
                exchanges: Sequence[tuple[str, str]] | None = None) -> None:
    """Declare the inputs (their dead-letter and retry queues too), the outputs and the
    exchanges of the plug-ins (``exchanges``: :func:`plugin_exchanges` when None)."""
    declarer = _Declarer(connection)
    inputs = list(settings.listeners if listeners is None else listeners)
    for rule in inputs:
        declare_input(declarer, rule.queue, settings, rule.backoff_ms,
                      single_active=bool(rule.ordered_by))
    names = {rule.queue for rule in inputs}
    for router in settings.routers if routers is None else routers:
        if router.exchange and not router.exchange.startswith("amq."):
            declarer.exchange(router.exchange)
        if router.queue and router.queue not in names and not router.exchange:
            declare_input(declarer, router.queue, settings)
            names.add(router.queue)
    for name, kind in plugin_exchanges(settings) if exchanges is None else exchanges:
        declarer.exchange(name, kind)
    declarer.close()


def declare_outputs(connection: pika.BlockingConnection, settings: Settings,
                    queues: Iterable[str]) -> None:
    """Declare queues a workflow routes to by ``nextDestination`` (like inputs)."""
    declarer = _Declarer(connection)
    for queue in queues:
        declare_input(declarer, queue, settings)
    declarer.close()


def declare_new_outputs(settings: Settings, queues: Sequence[str]) -> None:
    """Declare output queues on a connection of their own (queues first named by a
    record's ``nextDestination``).  Raises :class:`BrokerUnavailable` when that fails."""
    try:
        connection = connect(settings.broker_url)
        try:
            declare_outputs(connection, settings, queues)
        finally:
            if connection.is_open:
                connection.close()
    except (pika.exceptions.AMQPError, OSError) as e:
        raise BrokerUnavailable(f"declaring queue(s) {', '.join(queues)} failed: "
                                f"{broker_reason(e, settings.broker_url)}") from e
