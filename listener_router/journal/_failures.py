"""What a subscriber does when an entry fails: retry, the error queue, or block; and gaps.

A failing entry is tried again after the rule's backoff, up to
``max_retries`` times; then it goes to the subscriber's error queue (with
confirms, then the offset moves past it in a transaction that records it),
or with ``on_error = "block"`` the subscriber stops at it until an operator
skips or retries it.  A gap retention left (offsets no longer in the
stream) blocks the subscriber, or with ``on_gap = "continue"`` is recorded
as an error and passed.
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

from sqlalchemy.exc import SQLAlchemyError

from blackboard import SqlStore, StorageError
from listener_router._errors import BrokerUnavailable
from listener_router._messages import ATTEMPTS_HEADER, ERROR_HEADER
from listener_router.broker import AmqpLink, OutMessage, publish_confirmed
from listener_router.journal import _offsets as offsets
from listener_router.journal._apply import SubscriberStats, _Item
from listener_router.journal._blocked import blocked_event
from listener_router.journal._settings import JournalRule, SubscriberRule

__all__ = ["Failures"]

log = logging.getLogger("listener_router.journal._subscriber")

CONFIRM_TIMEOUT = 30.0


class Agent(Protocol):
    """What failure handling reads and moves of a subscriber (``_subscriber.Subscriber``)."""

    rule: SubscriberRule
    journal: JournalRule
    sql: SqlStore | None
    link: AmqpLink | None
    stats: SubscriberStats
    believed: offsets.Position
    seq: int
    errors: int
    blocked: bool
    blocked_at: tuple[int, str] | None
    gap: tuple[int, int] | None
    pending: list[_Item]
    attempts: dict[int, int]
    retry_at: float

    def resync(self, why: str) -> None: ...

    def publish_status(self, wait: bool = False) -> None: ...


class Failures:
    """The failure handling of one subscriber (``sub``), whose state it moves on."""

    def __init__(self, sub: Agent):
        self.sub = sub

    def failed(self, item: _Item, error: str) -> None:
        sub = self.sub
        attempts = sub.attempts.get(item.offset, 0) + 1
        sub.attempts[item.offset] = attempts
        sub.stats.failures += 1
        what = item.entry.describe() if item.entry is not None else f"offset {item.offset}"
        retries = 0 if item.problem is not None else sub.rule.max_retries
        if attempts <= retries:
            delays = sub.rule.backoff_ms or (1000,)
            delay = delays[min(attempts - 1, len(delays) - 1)] / 1000.0
            log.warning("subscriber %s: %s failed (attempt %d of %d), again in %.1f s: %s",
                        sub.rule.id, what, attempts, retries + 1, delay, error)
            sub.retry_at = time.monotonic() + delay
            return
        reason = offsets.given_up(error, attempts)
        if sub.rule.on_error == "block":
            self.block(item, reason)
        else:
            self.to_error_queue(item, reason, attempts)

    def to_error_queue(self, item: _Item, reason: str, attempts: int) -> None:
        """Publish the entry to the error queue (confirmed), then move past it."""
        sub = self.sub
        assert sub.sql is not None and sub.link is not None
        entry = item.entry
        key = entry.key if entry is not None else f"{sub.rule.journal}:offset:{item.offset}"
        message = OutMessage(
            routing_key=sub.journal.error_queue(sub.rule.id), body=item.body,
            message_id=f"{key}:{sub.rule.id}",
            headers={ERROR_HEADER: reason[:2000], ATTEMPTS_HEADER: attempts,
                     "x-chalk-offset": item.offset, "x-chalk-journal": sub.rule.journal,
                     "x-chalk-subscriber": sub.rule.id})
        try:
            publish_confirmed(sub.link, [message], CONFIRM_TIMEOUT)
            with sub.sql.engine.begin() as conn:
                position = offsets.record_error(
                    conn, sub.rule.journal, sub.rule.id, sub.believed, offset=item.offset,
                    seq=entry.seq if entry is not None else None,
                    record_id=entry.id if entry is not None else None, reason=reason,
                    attempts=attempts, entry=item.body.decode("utf-8", "replace"))
        except offsets.PositionMoved as e:
            sub.resync(str(e))
            return
        except (BrokerUnavailable, SQLAlchemyError, StorageError) as e:
            log.warning("subscriber %s: sending offset %d to the error queue failed, trying "
                        "again: %s", sub.rule.id, item.offset, e)
            sub.retry_at = time.monotonic() + 1.0
            sub.attempts[item.offset] -= 1
            return
        log.error("subscriber %s: %s went to the error queue %s: %s", sub.rule.id,
                  entry.describe() if entry is not None else f"offset {item.offset}",
                  sub.journal.error_queue(sub.rule.id), reason)
        sub.believed = position
        if entry is not None:
            sub.seq = max(sub.seq, entry.seq)
        sub.errors += 1
        sub.stats.errors += 1
        del sub.pending[0]
        sub.attempts.pop(item.offset, None)
        sub.link.ack([item.delivery] if item.delivery is not None else [])

    def block(self, item: _Item, reason: str) -> None:
        entry = item.entry
        self.set_blocked("entry", item.offset, entry.seq if entry is not None else None, reason,
                         item.body.decode("utf-8", "replace"))

    def block_at_gap(self) -> None:
        sub = self.sub
        assert sub.gap is not None
        expected, found = sub.gap
        reason = (f"gap: offsets {expected}..{found - 1} of {sub.journal.stream} are no longer "
                  "in the stream (retention removed them before this subscriber read them); "
                  "'chalk journal skip' accepts the gap, 'chalk journal rewind' starts over")
        self.set_blocked("gap", found, None, reason, None)

    def set_blocked(self, kind: str, offset: int, seq: int | None, reason: str,
                     entry: str | None) -> None:
        sub = self.sub
        assert sub.sql is not None
        try:
            with sub.sql.engine.begin() as conn:
                offsets.block(conn, sub.rule.journal, sub.rule.id, sub.believed, kind=kind,
                              offset=offset, seq=seq, reason=reason, entry=entry)
        except offsets.PositionMoved as e:
            sub.resync(str(e))
            return
        except (SQLAlchemyError, StorageError) as e:
            log.warning("subscriber %s: recording the block failed, trying again: %s",
                        sub.rule.id, e)
            sub.retry_at = time.monotonic() + 1.0
            return
        log.error("subscriber %s of journal %s is blocked at offset %d: %s ('chalk journal skip' "
                  "or 'retry' unblocks it)", sub.rule.id, sub.rule.journal, offset, reason)
        sub.blocked = sub.stats.blocked = True
        sub.blocked_at = (offset, reason)
        sub.publish_status()
        if sub.rule.events_exchange and sub.link is not None:
            event = blocked_event(sub.rule.journal, sub.rule.id, offset=offset, seq=seq,
                                  reason=reason, exchange=sub.rule.events_exchange)
            sub.link.publish([event])

    def pass_gap(self, item: _Item) -> None:
        """``on_gap = "continue"``: record the gap as an error, then go on."""
        sub = self.sub
        assert sub.sql is not None and item.gap is not None
        low, high = item.gap
        reason = (f"gap: offsets {low}..{high} of {sub.journal.stream} were removed by "
                  "retention before this subscriber read them")
        try:
            with sub.sql.engine.begin() as conn:
                sub.believed = offsets.record_error(
                    conn, sub.rule.journal, sub.rule.id, sub.believed, offset=high,
                    seq=None, record_id=None, reason=reason, attempts=0, entry=None)
        except offsets.PositionMoved as e:
            sub.resync(str(e))
            return
        except (SQLAlchemyError, StorageError) as e:
            log.warning("subscriber %s: recording a gap failed, trying again: %s", sub.rule.id, e)
            sub.retry_at = time.monotonic() + 1.0
            return
        sub.errors += 1
        item.gap = None
