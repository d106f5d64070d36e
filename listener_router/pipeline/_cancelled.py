"""The cancellations in force, as a member matches messages against them (``chalk jobs cancel``).

A message cancelled before it runs is acked with a ``cancelled`` step and
nothing committed (the gather stage asks); one cancelled while it runs ends
before its next pipelet call where the runner can be told (the execute stage
listens: ``listen``), and is failed before its commit in any case (the
commit stage asks).  ``_flow`` keeps the set up to date from the store.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from listener_router._messages import Incoming
from listener_router.store import Cancellation

__all__ = ["Cancelled"]


class Cancelled:
    """The cancellations in force: message IDs, message-ID prefixes (a schedule's tick),
    records (until a time, or for the messages queued when it was made: ``queued``)."""

    def __init__(self) -> None:
        self.messages: dict[str, Cancellation] = {}
        self.prefixes: list[Cancellation] = []
        self.records: dict[str, Cancellation] = {}
        self.queued: dict[str, list[Cancellation]] = {}
        self._listeners: list[Callable[[], None]] = []

    def listen(self, heard: Callable[[], None]) -> None:
        """``heard()`` after each update that leaves cancellations in force."""
        self._listeners.append(heard)

    def update(self, cancellations: Sequence[Cancellation]) -> None:
        self.messages = {c.value: c for c in cancellations if c.kind == "message"}
        self.prefixes = [c for c in cancellations if c.kind == "prefix"]
        self.records = {c.value: c for c in cancellations if c.kind == "record"}
        queued: dict[str, list[Cancellation]] = {}
        for c in cancellations:
            if c.kind == "queued":
                queued.setdefault(c.value, []).append(c)
        self.queued = queued
        if self:
            for heard in self._listeners:
                heard()

    def __bool__(self) -> bool:
        return bool(self.messages or self.prefixes or self.records or self.queued)

    def reason(self, message: Incoming) -> str | None:
        """Why ``message`` is cancelled, or None when it is not."""
        mid = message.message_id
        found = self.messages.get(mid) or next(
            (c for c in self.prefixes if mid.startswith(c.value)), None)
        if found is None and self.records:
            now = time.time()
            found = next((c for rid in message.record_ids
                          if (c := self.records.get(rid)) is not None
                          and (c.until is None or c.until > now)), None)
        if found is None and self.queued:
            found = self._queued(message)
        if found is None:
            return None
        what = {"message": "the message", "prefix": f"messages {found.value}*",
                "record": f"messages naming record {found.value!r}",
                "queued": f"messages naming record {found.value!r} queued by then"}[found.kind]
        by = f" by {found.by}" if found.by else ""
        return f"cancelled{by} ({what}, {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(found.at))})"

    def _queued(self, message: Incoming) -> Cancellation | None:
        """A ``queued`` cancellation of one of ``message``'s records made after the message
        was published (its AMQP timestamp, in whole seconds: one published in the second
        the cancellation was made counts as queued then; one with no timestamp, from a
        publisher that sets none, counts as queued before any)."""
        stamp = message.properties.get("timestamp")
        published = stamp if isinstance(stamp, (int, float)) else None
        for rid in message.record_ids:
            for c in self.queued.get(rid, ()):
                if published is None or published <= int(c.at):
                    return c
        return None
