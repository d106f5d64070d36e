"""Order per key, for a queue whose rules say ``ordered_by`` (``record`` or a header).

Two messages with the same key never run at once, and they run in the
order the queue delivered them:

- across members: the queue has a single active consumer (declared with
  ``x-single-active-consumer``), so one member takes its messages in order
  at a time;
- in a member: each message takes its key (``("order", queue, key)``) with
  its other keys for its batch; a message whose key is taken, *or has
  messages parked on it*, is parked behind them (``InFlight.take_or_park``
  with ``fifo``), and they come back in the order they were parked;
- across retries: a message that fails and waits for its retry keeps its
  keys, held by a :class:`RetryHold`, in memory and in the store
  (``chalk_ordered_keys``, written before it is acked); the later messages of
  its keys park behind it until its retry copy (the same message ID) takes
  the keys over and commits, or it is dead-lettered.  A member that starts,
  or becomes the active consumer, finds the holds in the store for the keys
  of the messages it gathers (:meth:`Ordered.restore`).
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

from sqlalchemy import Connection

from listener_router._errors import StoreUnavailable
from listener_router.pipeline._inflight import InFlight
from listener_router.pipeline._states import State
from listener_router.pipeline._work import Work, keys
from listener_router.store import OrderedKeys, ServiceStore, unavailable

__all__ = ["Ordered", "RetryHold"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetryHold:
    """What holds an ordered queue's keys while their message waits for its retry."""

    queue: str
    message_id: str


class Ordered:
    """The order of one queue's messages by key (see the module doc)."""

    def __init__(self, queue: str, by: str, store: ServiceStore, inflight: InFlight):
        self.queue = queue
        self.by = by
        self.store = store
        self.inflight = inflight

    def order_keys(self, w: Work) -> list[str]:
        """The message's keys: its record IDs (``by = "record"``) or its header's value."""
        m = w.received
        if m is None:
            return []
        if self.by == "record":
            return list(m.record_ids)
        value = m.headers.get(self.by)
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        return [] if value is None else [str(value)]

    def holds(self, w: Work) -> list[Hashable]:
        """The in-flight keys of the message's order keys."""
        return [("order", self.queue, k) for k in self.order_keys(w)]

    def keys(self, w: Work) -> list[Hashable]:
        """What the message takes for its batch: its order, its message key, its records
        (the order first: the messages of a key queue up on it, in order)."""
        return [*self.holds(w), *keys((w,))]

    def hold_of(self, w: Work) -> RetryHold | None:
        """The hold the message's own retry would have left (it takes the keys over)."""
        return RetryHold(self.queue, w.message.message_id) if w.message is not None else None

    def restore(self, works: Sequence[Work]) -> None:
        """Holds the store keeps for these messages' keys that this member does not know
        (a retry's, written by this member before a restart, or by another)."""
        wanted = [k for w in works for k in self.order_keys(w)]
        if not wanted:
            return
        try:
            with unavailable():
                holding = self.store.ordered_keys.holding(self.queue, wanted)
        except StoreUnavailable as e:
            log.warning("could not read the holds of queue %s's keys: %s", self.queue, e)
            return
        for key, message_id in holding.items():
            self.inflight.reserve_free([("order", self.queue, key)],
                                       RetryHold(self.queue, message_id))

    def keep(self, works: Sequence[Work], *, stored: bool) -> None:
        """These messages come again (retrying; or held, let go): their order keys stay
        held by their :class:`RetryHold` until they do, in the store too when ``stored``
        (a retry may come to another member)."""
        rows = [(w, self.order_keys(w)) for w in works if w.message is not None]
        if stored and rows:
            try:
                with self.store.writes, unavailable(), self.store.engine.begin() as conn:
                    for w, order in rows:
                        OrderedKeys.hold(conn, self.queue, order, w.message.message_id)  # type: ignore[union-attr]
            except StoreUnavailable as e:  # the order holds in this member until the retry
                log.warning("could not keep the order of %d retried message(s) in the store: "
                            "%s", len(rows), e)
        for w, _order in rows:
            self.inflight.reserve(self.holds(w), self.hold_of(w))

    def freed(self, conn: Connection, works: Iterable[Work]) -> None:
        """In a transaction: the holds of messages that will not be retried again
        (committed, dead-lettered, duplicates)."""
        done = [w.message.message_id for w in works
                if w.message is not None and w.message.attempts > 0]
        OrderedKeys.free(conn, self.queue, done)

    def settle(self, works: Sequence[Work]) -> None:
        """Free the store's holds of messages that ended without a commit (dead, duplicate,
        cancelled) in a transaction of their own."""
        ended = [w for w in works if w.state in (State.DEAD, State.DUPLICATE, State.CANCELLED)
                 and w.message is not None and w.message.attempts > 0]
        if not ended:
            return
        try:
            with self.store.writes, unavailable(), self.store.engine.begin() as conn:
                self.freed(conn, ended)
        except StoreUnavailable as e:
            log.warning("could not free the order holds of %d message(s): %s", len(ended), e)
