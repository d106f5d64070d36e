"""The scheduler: the leader's task that runs each schedule's ticks, exactly once each.

Theory of operation.  The leader flag alone cannot promise "exactly once":
a leader that stalls past its heartbeat, or two processes that both
believe they lead, would both run a tick.  So every step of a tick is a
compare-and-set on the schedule's row (``_tables``), made in
the transaction that writes the step's messages to the outbox:

1. *claim*: the row's tick moves from the last one to the next one (its
   ``step`` must be the one read); nothing is published yet;
2. *pages*: the selection is walked a page at a time from the row's
   cursor; each page's messages go into one outbox batch in the
   transaction that moves the cursor (same ``step`` check); the last page
   marks the tick done and carries the ``job.finished`` events;
3. after each commit the batch is handed to the finish stage, which
   publishes it with confirms and marks it sent.

A process whose ``step`` is stale changes nothing and writes nothing, so a
tick is never run twice, and a tick claimed by a process that died is
continued from its cursor by the next leader, so none is lost.  Pages
keep each step short (the service's loop runs this task) and let a
selection of millions of records stream.  Message IDs are
``schedule:<name>:<tick>:<n>`` (``n`` counts the tick's messages), so a
batch published twice (the leader died before marking it sent, and its
successor publishes the unsent scheduled batches it finds) is dropped by
the receivers' inbox.

Missed ticks.  Ticks due since the last one that fall after the earliest
start of a live member are run, each one, in order: some member lived
then, and the ticks were missed only while leadership moved.  Earlier ones
were missed while no member lived: ``catch_up = "one"`` runs the latest of
them, ``"none"`` skips them (counted in the row's ``skipped``).  A new
schedule starts from now.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import orjson
from sqlalchemy import Connection

from listener_router.broker import OutMessage
from listener_router.cluster import LeaderTask, Membership
from listener_router.schedules._finished import job_finished_events
from listener_router.schedules._selection import Selection
from listener_router.schedules._settings import ScheduleRule
from listener_router.schedules._tables import Schedules, ScheduleState
from listener_router.schedules._ticks import Ticks, tick_label
from listener_router.store import Outbox, ServiceStore, unavailable

if TYPE_CHECKING:
    from listener_router.events import Events

__all__ = ["Scheduler", "SCHEDULE_PREFIX", "scheduled_messages"]

log = logging.getLogger(__name__)

SCHEDULE_PREFIX = "schedule:"
_BUDGET = 0.2             # seconds one run may spend writing pages (the service's loop waits)
_AWAY = 5.0               # a pause in runs this long means this process did not lead meanwhile

Publish = Callable[[dict[str, list[OutMessage]]], None]


def scheduled_messages(rule: ScheduleRule, tick: float, first: int, ids: Sequence[str]
                       ) -> list[OutMessage]:
    """The messages of a page: ``batch_size`` record IDs each, numbered from ``first``."""
    label = tick_label(tick)
    headers = {"operation": rule.operation, "schedule": rule.name, "tick": label}
    size = rule.batch_size
    return [OutMessage(routing_key=rule.queue,
                       body=orjson.dumps({"records": [{"id": rid} for rid in ids[i:i + size]]}),
                       message_id=f"{SCHEDULE_PREFIX}{rule.name}:{label}:{first + n}",
                       headers=dict(headers))
            for n, i in enumerate(range(0, len(ids), size))]


class _Stale(Exception):
    """Another process changed the schedule's row first: roll back, read it again."""


class Scheduler(LeaderTask):
    """Runs the configured schedules while this process leads (see the module doc)."""

    name = "schedules"
    every = 0.25

    def __init__(self, store: ServiceStore, rules: Sequence[ScheduleRule], membership: Membership,
                 publish: Publish, *, member: str, budget: float = _BUDGET,
                 selections: dict[str, Selection] | None = None, events: Events | None = None):
        self.events = events
        self.store = store
        self.tables = store.tables(Schedules)
        self.rules = list(rules)
        self.membership = membership
        self.publish = publish
        self.member = member
        self.budget = budget
        self.ticks = {rule.name: Ticks(rule) for rule in self.rules}
        self.selections = selections or {rule.name: Selection(rule, store.sql)
                                         for rule in self.rules}
        self._last_run = 0.0

    def run(self) -> int:
        """Do what is due within the time budget; returns the messages written."""
        now = time.monotonic()
        if now - self._last_run > _AWAY:
            self.publish_unsent()  # a leader before us may have died before publishing
        self._last_run = now
        deadline = now + self.budget
        written = 0
        for rule in self.rules:
            while time.monotonic() < deadline:
                done = self.step(rule)
                if done is None:
                    break
                written += done
        return written

    def publish_unsent(self) -> int:
        """Hand every unsent outbox batch of scheduled messages to the publisher."""
        with unavailable():
            unsent = self.store.outbox.unsent()
        mine = {batch: messages for batch, messages in unsent.items()
                if messages and messages[0].message_id.startswith(SCHEDULE_PREFIX)}
        if mine:
            log.info("publishing %d unsent outbox batch(es) of scheduled messages", len(mine))
            self.publish(mine)
        return sum(len(m) for m in mine.values())

    # -- one step -----------------------------------------------------------------------
    def step(self, rule: ScheduleRule, now: float | None = None) -> int | None:
        """One step of ``rule``: start its row, claim or skip a tick, or write a page.

        Returns the messages written (0 for a step that wrote none), or None when
        nothing is due."""
        now = time.time() if now is None else now
        with unavailable():
            state = self.tables.read(rule.name)
        ticks = self.ticks[rule.name]
        if state is None:
            self._write(lambda conn: self.tables.create(
                conn, rule.name, ticks.at_or_before(now), self.member))
            return 0
        if not state.done:
            return self._page(rule, state)
        due = ticks.after(state.tick)
        if due > now:
            return None
        lived = self._first_live_start()
        if due < lived:  # missed while no member lived
            last = ticks.before(lived)
            missed = ticks.between(state.tick, last)
            if rule.catch_up == "one":
                log.info("schedule %s: %d tick(s) missed while no member lived; running the "
                         "latest, %s", rule.name, missed, tick_label(last))
                return self._claim(rule, state, last, skipped=missed - 1)
            log.info("schedule %s: skipping %d tick(s) missed while no member lived "
                     "(catch_up = none)", rule.name, missed)
            self._write(lambda conn: self._checked(
                self.tables.skip(conn, state, last, missed, self.member)))
            return 0
        return self._claim(rule, state, due)

    def _first_live_start(self) -> float:
        """When the earliest-started live member started (this process counts)."""
        membership = self.membership
        assert membership is not None
        with unavailable():
            members = membership.members()
        starts = [m.started_at for m in members]
        starts.append(membership.started_at)
        return min(starts)

    def _claim(self, rule: ScheduleRule, state: ScheduleState, tick: float,
               skipped: int = 0) -> int:
        if self._write(lambda conn: self._checked(self.tables.claim(
                conn, state, tick, self.member, skipped=skipped))):
            log.debug("schedule %s: claimed tick %s", rule.name, tick_label(tick))
        return 0

    def _page(self, rule: ScheduleRule, state: ScheduleState) -> int:
        ids, cursor, over = self.selections[rule.name].page(state.cursor)
        messages = scheduled_messages(rule, state.tick, state.messages, ids)
        sent = state.messages + len(messages)   # the tick's messages so far (events aside)
        # the job.finished event goes out with the last page but is none of the tick's messages
        events = job_finished_events(self.events, rule, state.tick, sent,
                                     state.records + len(ids), self.member) if over else []
        batches: list[str | None] = []

        def page(conn: Connection) -> None:
            self._checked(self.tables.advance(
                conn, state, cursor, len(messages), len(ids), over, self.member))
            batches.append(Outbox.write(conn, (), [(None, m) for m in messages + events]))
        if not self._write(page):
            return 0
        batch = batches[0]
        if batch is not None:
            self.publish({batch: messages + events})
        if over:
            log.info("schedule %s: tick %s done: %d message(s), %d record(s)", rule.name,
                     tick_label(state.tick), sent, state.records + len(ids))
        return len(messages)

    @staticmethod
    def _checked(changed: bool) -> None:
        if not changed:
            raise _Stale()

    def _write(self, work: Callable[[Connection], object]) -> bool:
        """Run ``work`` in one write transaction; False when the row had changed (nothing
        written)."""
        try:
            with self.store.writes, unavailable(), self.store.engine.begin() as conn:
                work(conn)
        except _Stale:
            log.info("schedule row changed by another process; reading it again")
            return False
        return True
