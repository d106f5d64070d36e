"""Following events live: a temporary queue bound to the events exchange (``chalk events``).

The queue is exclusive and auto-deleted: it exists while the follower is
connected, so only events published meanwhile are seen (events are not
stored; a subscriber that must not miss any binds a durable queue of its
own, and drops copies by message ID).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pika
import pika.exceptions

from listener_router._errors import BrokerUnavailable
from listener_router._urls import shown_url
from listener_router.broker import broker_reason, node_parameters
from listener_router.events._kinds import APPLICATION_HEADER

__all__ = ["ReceivedEvent", "declare_exchange", "follow"]


@dataclass(frozen=True)
class ReceivedEvent:
    """One event as a subscriber gets it."""

    routing_key: str
    message_id: str
    application: str
    body: dict[str, Any]

    def line(self) -> str:
        """One line for a terminal: time, routing key, member, the event's own fields."""
        when = time.strftime("%H:%M:%S", time.localtime(self.body.get("time", time.time())))
        fields = " ".join(f"{k}={v}" for k, v in self.body.items()
                          if k not in ("event", "application", "time"))
        return f"{when} {self.routing_key} [{self.application}] {fields}"

    def json(self) -> str:
        return json.dumps({"routing_key": self.routing_key, "message_id": self.message_id,
                           "application": self.application, "body": self.body},
                          ensure_ascii=False, sort_keys=True)


def declare_exchange(channel: Any, exchange: str) -> None:
    """The events exchange: a durable topic exchange (declaring it again is harmless)."""
    channel.exchange_declare(exchange, exchange_type="topic", durable=True)


def _decode(method: Any, properties: Any, body: bytes) -> ReceivedEvent:
    headers = properties.headers or {}
    application = headers.get(APPLICATION_HEADER, "")
    if isinstance(application, bytes):
        application = application.decode("utf-8", "replace")
    try:
        content = json.loads(body)
    except ValueError:
        content = {"raw": body.decode("utf-8", "replace")}
    if not isinstance(content, dict):
        content = {"value": content}
    return ReceivedEvent(method.routing_key, properties.message_id or "", str(application),
                         content)


def follow(broker_url: str, exchange: str, patterns: Sequence[str],
           on_event: Callable[[ReceivedEvent], None], *, count: int | None = None,
           ready: Callable[[], None] | None = None,
           stop: Callable[[], bool] | None = None) -> int:
    """Bind a temporary queue to ``exchange`` with each pattern and hand each event to
    ``on_event`` until ``count`` events were seen (None: until interrupted), or until
    ``stop()`` says so (asked at least twice a second).

    ``ready()`` is called once the queue is bound.  Returns how many events
    were seen.  Raises :class:`~listener_router.BrokerUnavailable` when the
    broker cannot be reached or the connection is lost.
    """
    seen = 0
    try:
        connection = pika.BlockingConnection(node_parameters(broker_url))
    except (pika.exceptions.AMQPError, OSError) as e:
        raise BrokerUnavailable(f"cannot reach the broker at {shown_url(broker_url)}: "
                                f"{broker_reason(e, broker_url)}") from e
    try:
        channel = connection.channel()
        declare_exchange(channel, exchange)
        queue = channel.queue_declare("", exclusive=True, auto_delete=True).method.queue
        for pattern in patterns:
            channel.queue_bind(queue, exchange, routing_key=pattern)
        if ready is not None:
            ready()
        quiet = 0.5 if stop is not None else None
        for method, properties, body in channel.consume(queue, auto_ack=True,
                                                        inactivity_timeout=quiet):
            if stop is not None and stop():
                break
            if method is None:   # nothing for half a second: ask stop() again
                continue
            on_event(_decode(method, properties, body))
            seen += 1
            if count is not None and seen >= count:
                break
    except (pika.exceptions.AMQPError, OSError) as e:
        raise BrokerUnavailable(f"following {exchange} failed: {e}") from e
    finally:
        if connection.is_open:
            connection.close()
    return seen
