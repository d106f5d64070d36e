"""Incoming and outgoing messages: parsing, validation, deterministic IDs.

Body: ``{"records": [{"id": …, "attributes": {…}}, …]}`` or ``{"id": …}``.
A body that cannot be a unit of work is a :class:`BadMessage` — it goes to
the dead-letter queue at once with the reason; nothing else is affected.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from listener_router._errors import BadMessage

__all__ = ["BadMessage", "Incoming", "parse_message", "outgoing_id", "derive_message_id",
           "ATTEMPTS_HEADER", "ERROR_HEADER", "LAST_ERROR_HEADER", "WORKFLOW_HEADER",
           "QUEUE_HEADER"]

ATTEMPTS_HEADER = "x-chalk-attempts"
ERROR_HEADER = "x-chalk-error"            # why a dead letter died
LAST_ERROR_HEADER = "x-chalk-last-error"  # why a retry copy's last attempt failed
WORKFLOW_HEADER = "x-chalk-workflow"
QUEUE_HEADER = "x-chalk-queue"          # the queue a dead letter came from (for replay)
OPERATIONS = ("ADD", "DELETE", "UPDATE")


MAX_DEPTH = 32                        # nesting of sub-objects/lists in message attributes
_BAD_CHARS = re.compile(r"[\x00-\x1f\x7f]")


def _depth(value: Any, level: int = 0) -> int:
    if level > MAX_DEPTH:
        return level
    if isinstance(value, dict):
        return max((_depth(v, level + 1) for v in value.values()), default=level)
    if isinstance(value, list):
        return max((_depth(v, level + 1) for v in value), default=level)
    return level


@dataclass(slots=True)
class Incoming:
    """One consumed message, parsed: one workflow instance.

    ``record_ids`` (the IDs of ``records``, in order) and ``key`` (the in-flight
    and inbox key: queue and message ID) are made once; read them, never change them.
    """

    message_id: str
    queue: str
    records: list[dict[str, Any]]          # [{"id": str, "attributes": {...}}]
    operation: str
    headers: dict[str, Any]
    attempts: int
    tag: Any = None                        # the transport's delivery handle
    body: bytes = b""
    properties: dict[str, Any] = field(default_factory=dict)
    record_ids: list[str] = field(default_factory=list)
    key: tuple[str, str, str] = ("message", "", "")


def derive_message_id(body: bytes) -> str:
    """A message ID from the body, for publishers that send none."""
    return "sha256:" + hashlib.sha256(body).hexdigest()[:32]


def outgoing_id(input_id: str, target: str, record_id: str) -> str:
    """Deterministic outgoing message ID: the same input, target and record → the same ID."""
    digest = hashlib.sha256(f"{input_id}\x00{target}\x00{record_id}".encode()).hexdigest()
    return f"out:{digest[:40]}"


def _header_str(headers: Mapping[str, Any], key: str) -> str | None:
    value = headers.get(key)
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return None if value is None else str(value)


def parse_message(body: bytes, *, queue: str, message_id: str | None,
                  headers: Mapping[str, Any] | None, max_records: int = 1000,
                  max_body_bytes: int = 1 << 20, tag: Any = None,
                  properties: Mapping[str, Any] | None = None) -> Incoming:
    """Parse a delivery, or raise :class:`BadMessage` naming what is wrong."""
    headers = dict(headers) if headers else {}
    mid = message_id or derive_message_id(body)
    if len(body) > max_body_bytes:
        raise BadMessage(f"message {mid}: body of {len(body)} bytes exceeds the limit of "
                         f"{max_body_bytes} bytes")
    if _BAD_CHARS.search(mid):
        raise BadMessage(f"message {mid!r}: message ID holds control characters")
    try:
        data = orjson.loads(body)
    except (UnicodeDecodeError, orjson.JSONDecodeError) as e:
        raise BadMessage(f"message {mid}: body is not JSON ({e})") from None
    except RecursionError:
        raise BadMessage(f"message {mid}: body is nested too deeply") from None
    if isinstance(data, dict) and "records" in data:
        records = data["records"]
        if not isinstance(records, list):
            raise BadMessage(f"message {mid}: 'records' must be a list")
    elif isinstance(data, dict) and "id" in data:
        records = [data]
    else:
        raise BadMessage(f"message {mid}: body must be {{\"records\": [...]}} or "
                         f"{{\"id\": ...}}, got {type(data).__name__}")
    if not records:
        raise BadMessage(f"message {mid}: no records")
    if len(records) > max_records:
        raise BadMessage(f"message {mid}: {len(records)} records exceed the limit of "
                         f"{max_records} per message")
    parsed: list[dict[str, Any]] = []
    seen: set[str] = set()
    ids: list[str] = []
    for position, record in enumerate(records):
        if not isinstance(record, dict):
            raise BadMessage(f"message {mid}: record #{position} must be an object")
        rid = record.get("id")
        if not isinstance(rid, str) or not rid.strip() or len(rid) > 512 or _BAD_CHARS.search(rid):
            raise BadMessage(f"message {mid}: record #{position} has a bad id {rid!r} "
                             "(a non-empty string of at most 512 characters, no control "
                             "characters)")
        if rid in seen:
            raise BadMessage(f"message {mid}: record {rid!r} appears twice")
        seen.add(rid)
        ids.append(rid)
        attributes = record.get("attributes", {})
        if not isinstance(attributes, dict):
            raise BadMessage(f"message {mid}: record {rid!r}: 'attributes' must be an object")
        for v in attributes.values():
            if isinstance(v, (dict, list)):  # only nested ones can be too deep
                if _depth(attributes) > MAX_DEPTH:
                    raise BadMessage(f"message {mid}: record {rid!r}: attributes nested deeper "
                                     f"than {MAX_DEPTH} levels")
                break
        parsed.append({"id": rid, "attributes": attributes})
    if headers:
        operation = (_header_str(headers, "operation") or "ADD").upper()
        if operation not in OPERATIONS:
            raise BadMessage(f"message {mid}: unknown operation {operation!r}; use one of "
                             f"{', '.join(OPERATIONS)}")
        try:
            attempts = max(0, int(_header_str(headers, ATTEMPTS_HEADER) or 0))
        except ValueError:
            attempts = 0
    else:  # no headers: an ADD, delivered for the first time
        operation, attempts = "ADD", 0
    return Incoming(mid, queue, parsed, operation, headers, attempts, tag, body,
                    dict(properties) if properties else {}, ids, ("message", queue, mid))
