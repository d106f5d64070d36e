"""Queues the service declares: inputs, their dead-letter and retry queues, outputs.

For an input queue ``Q``:

- ``Q`` — durable (quorum by default) with a delivery limit; a message the
  broker delivered too often (a service crashing on it) dead-letters to ``Q.dlq``;
- ``Q.dlq`` — dead letters, with the reason in ``x-chalk-error``;
- ``Q.retry.N`` — classic delay queues, one per backoff step: messages wait
  their TTL there and dead-letter back into ``Q``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pika

from listener_router._config import ListenerRule, RouterRule, Settings

__all__ = ["dlq_name", "retry_name", "declare_input", "declare_output", "declare_all"]


def dlq_name(queue: str) -> str:
    return f"{queue}.dlq"


def retry_name(queue: str, step: int) -> str:
    return f"{queue}.retry.{step}"


def _kind(settings: Settings) -> dict[str, Any]:
    return {"x-queue-type": settings.queue_type}


def declare_input(channel: Any, queue: str, settings: Settings,
                  backoff_ms: Iterable[int] = ()) -> None:
    args = dict(_kind(settings))
    args.update({"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq_name(queue)})
    if settings.queue_type == "quorum":
        args["x-delivery-limit"] = settings.delivery_limit
    channel.queue_declare(queue, durable=True, arguments=args)
    channel.queue_declare(dlq_name(queue), durable=True, arguments=_kind(settings))
    for step, delay in enumerate(backoff_ms, start=1):
        channel.queue_declare(retry_name(queue, step), durable=True, arguments={
            "x-queue-type": "classic", "x-message-ttl": int(delay),
            "x-dead-letter-exchange": "", "x-dead-letter-routing-key": queue})


def declare_output(channel: Any, rule: RouterRule, settings: Settings) -> None:
    if rule.queue:
        channel.queue_declare(rule.queue, durable=True, arguments=_kind(settings))


def declare_all(connection: pika.BlockingConnection, settings: Settings,
                listeners: Iterable[ListenerRule] | None = None,
                routers: Iterable[RouterRule] | None = None) -> None:
    channel = connection.channel()
    for rule in settings.listeners if listeners is None else listeners:
        declare_input(channel, rule.queue, settings, rule.backoff_ms)
    for router in settings.routers if routers is None else routers:
        declare_output(channel, router, settings)
    channel.close()
