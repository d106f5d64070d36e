"""The subscriber agent: read a journal from the stored offset, apply entries exactly once.

Theory of operation.  The agent consumes the journal's stream over AMQP
(an :class:`~listener_router.broker.AmqpLink` on its own I/O thread) from
its row's offset + 1 (or the row's start point), and at every reconnect
from the last offset it took in.  Deliveries become *items* in offset
order; the checks on the way in:

- an offset at or below the last one taken in is an old delivery (a
  reconnect replays from the chunk): dropped;
- an offset above the last one + 1 is a **gap**: offsets in between are no
  longer in the stream (retention removed them before this subscriber read
  them).  It is never passed over silently: with ``on_gap = "block"`` (the
  default) the subscriber blocks there, with ``"continue"`` the gap is
  recorded as an error and counted;
- with a start at a time, entries published before it are passed over.

Items are applied in batches of ``batch_size``: one transaction on the
subscriber's database holds the effects (what the callable writes with the
connection it is given, or the records a workflow committed on the
subscriber's blackboard) and the row's new offset and entry number
(``_offsets``).  An entry whose number is not above the last one applied is
a copy the relay published again after a crash: passed over, its offset
consumed.  So each entry's effects commit exactly once, whatever is killed
when.

A failing entry: the batch's savepoint is rolled back, the entries are
applied one by one to find it, the ones before it commit, and it is tried
again after ``backoff_ms``; after ``max_retries`` retries it goes to the
subscriber's error queue (a RabbitMQ queue, ``<stream>.errors.<id>``, with
the reason in ``x-chalk-error``; published with confirms, then the offset
moves past it in a transaction that also records it) and the subscriber
moves on — or, with ``on_error = "block"``, the subscriber stops at it,
says so in its status (and as a ``journal.subscriber.blocked`` event when
an events exchange is set) and waits for ``chalk journal skip`` or
``retry``; restarting the agent tries the entry again too.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import SQLAlchemyError

import engine as engine_pkg
from blackboard import BlackboardError, SqlStore, StorageError
from listener_router._errors import ConfigError, InfrastructureError
from listener_router._runners import close_runner, make_runner
from listener_router._settings import Settings
from listener_router.broker import AmqpLink, Delivery, OutMessage
from listener_router.journal import _offsets as offsets
from listener_router.journal._apply import (
    ApplyFn,
    SubscriberStats,
    _Item,
    commit_callable,
    commit_workflow,
    count,
    load_callable,
    to_apply,
)
from listener_router.journal._blocked import declare_events
from listener_router.journal._entries import AttachmentSource, Entry
from listener_router.journal._failures import Failures
from listener_router.journal._publish import declare_journal
from listener_router.journal._settings import SubscriberRule
from listener_router.journal._status import journal_rule, read_head, status_body, subscriber_rule

__all__ = ["ApplyFn", "Subscriber", "SubscriberStats", "load_callable", "subscriber_rule"]

_ = (load_callable, subscriber_rule)  # re-exported: ``chalk subscribe`` and tests name them here

log = logging.getLogger(__name__)

POLL_EVERY = 1.0          # seconds between looks at the row for operators' commands
STALL_AFTER = 30.0        # idle this long while the stream has more: consume again
CONFIRM_TIMEOUT = 30.0
OUTAGE_BACKOFF = (0.5, 1.0, 2.0, 5.0, 10.0)


class Subscriber:
    """One subscriber agent (see the module doc).

    ``apply(entries, connection)`` writes the effects of a batch of entries
    with ``connection`` (the transaction the offset is stored in) and
    raises to fail; or the rule names a workflow, which runs over the
    entries' records on a blackboard over the subscriber's store (records
    deleted for ``DELETE`` entries; attributes and attachments written
    before the workflow runs).  Use as a context manager, then :meth:`run`.
    """

    def __init__(self, settings: Settings, rule: SubscriberRule, *, apply: ApplyFn | None = None,
                 runner: Any = None, registry: Any = None):
        self.settings = settings
        self.rule = rule
        self.journal = journal_rule(settings, rule.journal)
        if apply is None and rule.apply:
            apply = load_callable(rule.apply)
        if apply is None and not rule.workflow:
            raise ConfigError(f"subscriber {rule.id!r}: give a callable (apply = "
                              "\"module:function\") or a workflow")
        if not rule.store:
            raise ConfigError(f"subscriber {rule.id!r}: 'store' (its database URL) is required")
        self.apply = apply
        self._runner = runner
        self.runner: Any = None
        self._registry = registry
        self.stats = SubscriberStats()
        self.owner = f"journal/{rule.journal}/{rule.id}"
        self.link: AmqpLink | None = None
        self.sql: SqlStore | None = None
        self.source: AttachmentSource | None = None
        self._stopping = threading.Event()
        self.pending: list[_Item] = []
        self.attempts: dict[int, int] = {}
        self.retry_at = 0.0
        self._outage = 0
        self.gap: tuple[int, int] | None = None
        self._last_delivery = time.monotonic()
        self.host = f"{socket.gethostname()}/{os.getpid()}"
        self.blocked_at: tuple[int, str] | None = None   # where and why, once blocked here
        self.failures = Failures(self)

    # -- opening and closing ---------------------------------------------------------
    def open(self) -> Subscriber:
        rule = self.rule
        try:
            self.sql = SqlStore(rule.store)
        except StorageError as e:
            raise InfrastructureError(f"subscriber {rule.id!r}: {e}") from e
        engine = self.sql.engine
        state = offsets.subscriber_state(engine, rule.journal, rule.id)
        if state is None:
            state = offsets.register(engine, rule.journal, rule.id, self._start_point())
            log.info("subscriber %s of journal %s: new, starting at %s", rule.id, rule.journal,
                     state.start)
        elif state.blocked:
            log.warning("subscriber %s was blocked at offset %s (%s): trying again",
                        rule.id, state.blocked_offset, state.blocked_reason)
            offsets.set_running(engine, rule.journal, rule.id)
            state = offsets.subscriber_state(engine, rule.journal, rule.id)
            assert state is not None
        self._sync(state)
        self.source = AttachmentSource(rule.source or self.settings.blackboard_url)
        if rule.workflow:
            registry = self._registry or engine_pkg.WorkflowRegistry(
                self.settings.workflows_dir, aliases=self.settings.aliases,
                services=self.settings.services)
            for problem in registry.errors:   # the registry reports none itself
                log.error("%s", problem)
            self.workflow = registry.get(rule.workflow)
            self.runner = self._runner or make_runner(self.settings)
        self.link = self._new_link()
        self.publish_status()
        return self

    def _start_point(self) -> str:
        """A new subscriber's start: ``last`` and ``next`` resolved against the stream now."""
        start = self.rule.start
        if start in ("last", "next"):
            head = read_head(self.settings.broker_url, self.journal.stream)
            start = "first" if head is None else \
                f"offset:{head.offset + (1 if start == 'next' else 0)}"
        return start

    def close(self) -> None:
        if self.link is not None:
            self.publish_status(wait=True, stopped=True)
            self.link.stop()
        if self.runner is not None and self._runner is None:
            close_runner(self.runner)   # the workers it made for itself
        if self.source is not None:
            self.source.close()
        if self.sql is not None:
            self.sql.dispose()

    def __enter__(self) -> Subscriber:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request_stop(self) -> None:
        """Stop after the batch being applied (``run`` returns)."""
        self._stopping.set()

    # -- the broker ----------------------------------------------------------------------
    def _new_link(self) -> AmqpLink:
        return AmqpLink(self.settings.broker_url, prefetch=self.rule.prefetch,
                        consume=[self.journal.stream], prepare=self._prepare,
                        consume_arguments=self._where).start(wait=None)

    def _prepare(self, connection: Any) -> None:
        channel = declare_journal(connection.channel(), self.journal)
        channel.queue_declare(self.journal.error_queue(self.rule.id), durable=True,
                              arguments={"x-queue-type": self.settings.queue_type})
        if self.rule.events_exchange:
            declare_events(channel, self.rule.events_exchange)

    def _where(self, _queue: str) -> dict[str, Any]:
        """Where to (re)start consuming: after the last offset taken in, else the start."""
        return offsets.consume_from(self.position, self.start)

    # -- state -----------------------------------------------------------------------------
    def _sync(self, state: offsets.SubscriberState) -> None:
        """Take the row as the truth: position, entry number, start, blocked or not."""
        self.state = state
        self.believed = state.position
        self.position = state.offset          # the last offset taken in (may run ahead)
        self.seq = state.seq
        self.start = state.start
        self.not_before = state.not_before
        self.entry_at = state.entry_at
        self.errors = state.errors
        self.blocked = state.blocked
        self.stats.blocked = state.blocked
        self.pending = []
        self.attempts = {}
        self.gap = None

    def resync(self, why: str) -> None:
        """Start over from the row: drop what was taken in, consume again from there."""
        assert self.sql is not None
        log.info("subscriber %s: starting over from its stored position: %s", self.rule.id, why)
        self.stats.resyncs += 1
        state = offsets.subscriber_state(self.sql.engine, self.rule.journal, self.rule.id)
        if state is None:
            raise ConfigError(f"subscriber {self.rule.id!r}: its row is gone from "
                              f"{self.rule.store}")
        if self.link is not None:
            self.link.stop()
        self._sync(state)
        self.link = self._new_link()
        self.publish_status()

    def _poll(self) -> None:
        """An operator's command (a new epoch) makes the agent start over."""
        assert self.sql is not None
        try:
            state = offsets.subscriber_state(self.sql.engine, self.rule.journal, self.rule.id)
        except (SQLAlchemyError, StorageError) as e:
            log.warning("subscriber %s: reading its row failed: %s", self.rule.id, e)
            return
        if state is not None and state.epoch != self.believed.epoch:
            self.resync(f"epoch {self.believed.epoch} -> {state.epoch} (a command)")

    # -- the loop ----------------------------------------------------------------------------
    def run(self, *, until: Callable[[SubscriberStats], bool] | None = None,
            idle_exit: float | None = None) -> SubscriberStats:
        """Apply entries until stopped, ``until(stats)`` is true, or idle for ``idle_exit`` s."""
        assert self.link is not None, "open() the subscriber first"
        next_status = next_poll = time.monotonic()
        while not self._stopping.is_set():
            now = time.monotonic()
            if now >= next_status:
                self.publish_status()
                next_status = now + self.rule.status_every
            if now >= next_poll:
                self._poll()
                next_poll = now + POLL_EVERY
            if until is not None and until(self.stats):
                break
            if self.blocked:
                self._stopping.wait(0.2)
                continue
            if self.pending and time.monotonic() >= self.retry_at:
                self._step()
                continue
            deliveries = self.link.deliveries.get_batch(self.rule.batch_size, 0.2)
            if deliveries:
                self._take_in(deliveries)
                self.stats.last_activity = self._last_delivery = time.monotonic()
            elif self.gap is not None and not self.pending:
                self.failures.block_at_gap()
            elif not self.pending and time.monotonic() - self._last_delivery > STALL_AFTER:
                self._check_stall()
            elif idle_exit is not None and not self.pending and \
                    time.monotonic() - self.stats.last_activity > idle_exit:
                break
        return self.stats

    def _check_stall(self) -> None:
        """Nothing arrived for a while: if the stream has entries after our position, consume
        again (a reader that attached while retention removed its segment can wait forever)."""
        self._last_delivery = time.monotonic()
        try:
            head = read_head(self.settings.broker_url, self.journal.stream)
        except InfrastructureError as e:
            log.debug("subscriber %s: reading the head failed: %s", self.rule.id, e)
            return
        position = -1 if self.position is None else self.position
        if head is not None and head.offset > position:
            self.resync(f"the stream has entries up to offset {head.offset} but none after "
                         f"{position} arrived for {STALL_AFTER:.0f} s")

    # -- taking deliveries in --------------------------------------------------------------
    def _take_in(self, deliveries: list[Delivery]) -> None:
        drop: list[Delivery] = []
        for d in deliveries:
            offset = int(d.headers.get("x-stream-offset", -1))
            position = self.position
            if self.gap is not None or offset < 0 or (position is not None and offset <= position):
                drop.append(d)  # before the position (a replay), or behind a gap we stop at
                continue
            expected = position + 1 if position is not None else offsets.start_offset(self.start)
            if expected is not None and offset < expected:
                drop.append(d)
                continue
            item = _Item(d, offset, body=d.body)
            if expected is not None and offset > expected:
                self.stats.gaps += 1
                log.error("subscriber %s: offsets %d..%d of %s are no longer in the stream "
                          "(retention removed them before this subscriber read them)",
                          self.rule.id, expected, offset - 1, self.journal.stream)
                if self.rule.on_gap == "block":
                    self.gap = (expected, offset)
                    drop.append(d)
                    continue
                item.gap = (expected, offset - 1)
            try:
                item.entry = Entry.parse(offset, d.body, self.source)
            except ValueError as e:
                item.problem = str(e)
            self.pending.append(item)
            self.position = offset
        if drop:
            self.link.ack(drop)  # type: ignore[union-attr]

    # -- applying ----------------------------------------------------------------------------
    def _step(self) -> None:
        """Apply the next batch of pending items (one transaction), then handle a failure."""
        first = self.pending[0]
        if first.gap is not None:
            self.failures.pass_gap(first)
            return
        batch = self._next_batch()
        try:
            done, failure = self._commit(batch)
        except offsets.PositionMoved as e:
            self.resync(str(e))
            return
        except (SQLAlchemyError, StorageError, InfrastructureError, BlackboardError) as e:
            delay = OUTAGE_BACKOFF[min(self._outage, len(OUTAGE_BACKOFF) - 1)]
            self._outage += 1
            log.warning("subscriber %s: applying %d entries failed, trying again in %.1f s: %s",
                        self.rule.id, len(batch), delay, e)
            self.retry_at = time.monotonic() + delay
            return
        self._outage = 0
        self._finished(batch[:done])
        if failure is not None:
            self.failures.failed(batch[done], failure)

    def _next_batch(self) -> list[_Item]:
        batch: list[_Item] = []
        ids: set[str] = set()
        for item in self.pending:
            if len(batch) >= self.rule.batch_size or item.gap is not None:
                break
            if self.rule.workflow and item.entry is not None:
                if item.entry.id in ids:
                    break  # one record once per workflow run
                ids.add(item.entry.id)
            batch.append(item)
        return batch

    def _commit(self, batch: list[_Item]) -> tuple[int, str | None]:
        """One transaction: the effects of the batch's entries up to the first failing one,
        and the row.  Returns how many items are done and the failure of the next."""
        apply, passed = to_apply(batch, self.seq, self.not_before)
        assert self.sql is not None

        def advance(conn: Connection, done: int) -> None:
            self._advance(conn, batch, done, passed)

        if self.apply is not None:
            done, failure = commit_callable(self.sql, self.apply, batch, apply, advance)
        else:
            done, failure = commit_workflow(self.sql, self.owner, self.runner, self.workflow,
                                            batch, apply, advance, self.rule.id)
        count(self.stats, batch, done, passed)
        return done, failure

    def _advance(self, conn: Connection, batch: list[_Item], done: int,
                 passed: dict[int, str]) -> None:
        if done == 0:
            return
        applied = [batch[i].entry for i in range(done) if i not in passed]
        seqs = [item.entry.seq for item in batch[:done] if item.entry is not None]
        entry_at = max((e.published_at for e in applied if e is not None), default=None)
        self._pending_position = offsets.advance(
            conn, self.rule.journal, self.rule.id, self.believed, offset=batch[done - 1].offset,
            seq=max(seqs, default=self.seq), entry_at=entry_at, applied=len(applied),
            passed_start=bool(applied))

    def _finished(self, items: list[_Item]) -> None:
        """The items are committed: move on, ack their deliveries."""
        if not items:
            return
        self.believed = self._pending_position
        self.seq = max([self.seq] + [i.entry.seq for i in items if i.entry is not None])
        applied = [i.entry for i in items if i.entry is not None]
        if applied:
            self.entry_at = max(e.published_at for e in applied)
        if self.not_before is not None and any(
                i.entry is not None and i.entry.published_at >= self.not_before for i in items):
            self.not_before = None
        del self.pending[:len(items)]
        for item in items:
            self.attempts.pop(item.offset, None)
        self.stats.batches += 1
        assert self.link is not None
        self.link.ack([i.delivery for i in items if i.delivery is not None])

    # -- status ------------------------------------------------------------------------------
    def publish_status(self, wait: bool = False, *, stopped: bool = False) -> None:
        """Tell the status stream where this subscriber is (``stopped``: its last word)."""
        link = self.link
        if link is None or not link.ready.is_set():
            return
        blocked: tuple[int | None, str | None] | None = self.blocked_at if self.blocked else None
        if self.blocked and blocked is None:
            blocked = (self.state.blocked_offset, self.state.blocked_reason)
        body = status_body(
            journal=self.rule.journal, subscriber=self.rule.id, offset=self.believed.offset,
            seq=self.seq, entry_at=self.entry_at,
            state="stopped" if stopped else "blocked" if self.blocked else "running",
            every=self.rule.status_every,
            blocked_offset=blocked[0] if blocked else None,
            blocked_reason=blocked[1] if blocked else None, errors=self.errors,
            applied=self.stats.applied, at=time.time(), host=self.host)
        message = OutMessage(routing_key=self.journal.status_stream, body=body,
                             message_id=f"status:{self.rule.id}:{time.time():.6f}")
        future = link.publish([message])
        if wait:
            try:
                future.result(timeout=5.0)
            except Exception as e:  # status is best effort
                log.debug("subscriber %s: status not confirmed: %s", self.rule.id, e)

