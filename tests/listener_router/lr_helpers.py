"""Test helpers for the listener/router tests: a synchronous broker client, message decoding."""

from __future__ import annotations

import json
from typing import Any

import pika

from listener_router._amqp import connection_parameters


class Broker:
    """Small synchronous helpers over one BlockingConnection (tests only)."""

    def __init__(self, url: str):
        self.url = url
        self.created: list[str] = []

    def _channel(self) -> tuple[Any, Any]:
        conn = pika.BlockingConnection(connection_parameters(self.url))
        return conn, conn.channel()

    def depth(self, queue: str) -> int:
        conn, ch = self._channel()
        try:
            return ch.queue_declare(queue, passive=True).method.message_count
        finally:
            conn.close()

    def drain(self, queue: str) -> list[tuple[Any, bytes]]:
        """Take every message off ``queue``: [(properties, body)]."""
        conn, ch = self._channel()
        out = []
        try:
            while True:
                method, props, body = ch.basic_get(queue, auto_ack=True)
                if method is None:
                    return out
                out.append((props, body))
        finally:
            conn.close()

    def publish(self, queue: str, body: bytes | str, *, message_id: str | None = None,
                headers: dict[str, Any] | None = None) -> None:
        conn, ch = self._channel()
        try:
            ch.confirm_delivery()
            ch.basic_publish("", queue, body.encode() if isinstance(body, str) else body,
                             pika.BasicProperties(delivery_mode=2, message_id=message_id,
                                                  headers=headers))
        finally:
            conn.close()

    def delete(self, *queues: str) -> None:
        conn, ch = self._channel()
        try:
            for queue in queues:
                ch.queue_delete(queue)
        finally:
            conn.close()


def bodies(messages: list[tuple[Any, bytes]]) -> list[dict[str, Any]]:
    return [json.loads(body) for _props, body in messages]


def records_of(messages: list[tuple[Any, bytes]]) -> list[dict[str, Any]]:
    return [r for body in bodies(messages) for r in body["records"]]
