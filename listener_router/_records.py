"""Record files (JSON Lines) and pushing records to a queue."""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from blackboard import Blackboard
from listener_router._errors import ConfigError, RecordFileError
from listener_router._messages import OPERATIONS
from listener_router._settings import ListenerRule, Settings
from listener_router.broker import AmqpLink, OutMessage, declare_input

__all__ = ["RecordFileError", "read_records", "push_records", "chunked"]


def read_records(path: str | Path) -> Iterator[dict[str, Any]]:
    """Yield ``{"id", "attributes"}`` from a JSON Lines file; blank lines are skipped."""
    path = Path(path)
    try:
        handle = path.open(encoding="utf-8")
    except OSError as e:
        raise RecordFileError(f"{path}: cannot read: {e.strerror}") from e
    with handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as e:
                raise RecordFileError(f"{path}:{number}: not JSON: {e.msg}") from None
            if not isinstance(data, dict) or not isinstance(data.get("id"), str) or not data["id"]:
                raise RecordFileError(f"{path}:{number}: expected {{\"id\": \"…\", "
                                      "\"attributes\": {…}} with a non-empty string id")
            attributes = data.get("attributes", {})
            if not isinstance(attributes, dict):
                raise RecordFileError(f"{path}:{number}: 'attributes' must be an object")
            yield {"id": data["id"], "attributes": attributes}


def chunked(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


# Called inside each transaction that stores records, with their IDs.
StoreHook = Callable[[Any, Sequence[str]], None]


def _call(hook: StoreHook, ids: Sequence[str], conn: Any) -> None:
    hook(conn, ids)


def store_records(bb: Blackboard, records: Sequence[dict[str, Any]], chunk: int = 1000, *,
                  source: str | None = None, hook: StoreHook | None = None) -> None:
    """Write records to the store (attributes given replace those of the stored record;
    ``source``: they belong to it).  ``hook(connection, ids)`` runs in each chunk's
    transaction."""
    for part in chunked(records, chunk):
        ids = [r["id"] for r in part]
        bb.load_many(ids)
        try:
            for record in part:
                bb.set_attributes(record["id"], record["attributes"])
                if source is not None:
                    bb.set_source(record["id"], source)
            bb.commit_many(ids, hook=None if hook is None else functools.partial(_call, hook, ids))
        except BaseException:
            bb.invalidate_many(ids)
            raise


def push_records(settings: Settings, queue: str, records: Sequence[dict[str, Any]], *,
                 store: bool = True, operation: str = "ADD", per_message: int = 1,
                 progress: Any = None, source: str | None = None,
                 hook: StoreHook | None = None,
                 published: Callable[[str, Sequence[str]], None] | None = None) -> int:
    """Store the records (unless ``store`` is false) and publish their IDs to ``queue``.

    Each message carries ``per_message`` record IDs and a fresh message ID.
    Publishing waits for the broker's confirms.  Returns the number of messages.
    ``source``: the stored records belong to it.  ``hook(connection, ids)`` runs in each
    transaction that stores records (not storing: in one of its own, before publishing).
    ``published(message_id, record_ids)`` is called for each message once confirmed.
    """
    if operation not in OPERATIONS:
        raise ConfigError(f"unknown operation {operation!r}; the service accepts "
                          f"{', '.join(OPERATIONS)}")
    ids = list(dict.fromkeys(r["id"] for r in records))
    if len(ids) != len(records):
        raise RecordFileError("the same record ID appears more than once in the input")
    if store or hook is not None:
        with Blackboard.connect(settings.blackboard_url) as bb:
            if store:
                store_records(bb, records, source=source, hook=hook)
            elif hook is not None:
                bb.commit_many([], hook=functools.partial(_call, hook, ids))
    rule = next((r for r in settings.listeners if r.queue == queue), ListenerRule(name="push", queue=queue))

    def prepare(conn: Any) -> None:
        declare_input(conn, queue, settings, rule.backoff_ms, single_active=bool(rule.ordered_by))

    link = AmqpLink(settings.broker_url, consume=(), prepare=prepare).start()
    sent = 0
    try:
        for part in chunked(ids, 1000 * per_message):
            messages = [
                OutMessage(routing_key=queue, message_id=f"push:{uuid.uuid4().hex}",
                           headers={"operation": operation},
                           body=json.dumps({"records": [{"id": i} for i in group]}).encode())
                for group in chunked(part, per_message)]
            link.publish(messages).result(timeout=120)
            sent += len(messages)
            if published is not None:
                for message, group in zip(messages, chunked(part, per_message), strict=True):
                    published(message.message_id, list(group))
            if progress is not None:
                progress(len(part))
    finally:
        link.stop()
    return sent
