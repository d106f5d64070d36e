"""Events a subscriber announces on a topic exchange: ``journal.subscriber.blocked``.

Off unless a subscriber names an exchange (``events_exchange =
"chalk.events"``); the exchange is declared durable, of type topic, when
the agent connects.
"""

from __future__ import annotations

import socket
import time
from typing import Any

import orjson

from listener_router.broker import EVENT_TOPIC_HEADER, OutMessage

__all__ = ["BLOCKED", "EVENTS_EXCHANGE", "blocked_event", "declare_events"]

EVENTS_EXCHANGE = "chalk.events"
BLOCKED = "journal.subscriber.blocked"


def declare_events(channel: Any, exchange: str) -> None:
    """Declare the events exchange (durable, topic) on a pika BlockingChannel."""
    channel.exchange_declare(exchange, exchange_type="topic", durable=True)


def blocked_event(journal: str, subscriber: str, *, offset: int, seq: int | None, reason: str,
                  exchange: str = EVENTS_EXCHANGE) -> OutMessage:
    """The ``journal.subscriber.blocked`` event, as a message for a link's publish."""
    at = time.time()
    body = {"event": BLOCKED, "journal": journal, "subscriber": subscriber, "offset": offset,
            "seq": seq, "reason": reason, "at": at, "host": socket.gethostname()}
    return OutMessage(exchange=exchange, routing_key=BLOCKED, body=orjson.dumps(body),
                      headers={EVENT_TOPIC_HEADER: BLOCKED},
                      message_id=f"{BLOCKED}:{journal}:{subscriber}:{offset}:{at:.3f}")
