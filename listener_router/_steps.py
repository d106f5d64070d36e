"""The steps a message goes through: parse, inbox, load, run, route, commit.

Each step works on a list of :class:`Work` (one per delivery) and a
blackboard, and moves messages between the states of ``_states``.  Which
thread runs which step is the service's business (``_pipeline``): the stage
thread parses, checks the inbox and loads; the runner thread runs; the
committer routes and commits.  A blackboard is only ever used by one of them
at a time.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.exc import InterfaceError, OperationalError, SQLAlchemyError
from sqlalchemy.exc import TimeoutError as SqlTimeoutError

from blackboard import (
    Blackboard,
    BlackboardError,
    RecordLockedError,
    StaleRecordError,
    StorageError,
)
from listener_router._amqp import Delivery, OutMessage
from listener_router._config import ListenerRule
from listener_router._messages import BadMessage, Incoming, parse_message
from listener_router._outbox import Outbox
from listener_router._states import State, check_transition

__all__ = ["Work", "Steps", "RunnerUnusable", "is_outage", "message_key"]

log = logging.getLogger(__name__)

_NO_RULE = ListenerRule(name="none")
HANG_EXIT = 75  # EX_TEMPFAIL: a batch run in this process hung (see _hang_watch)


@dataclass(eq=False)
class Work:
    """One delivery on its way through the service."""

    delivery: Delivery
    state: State = State.RECEIVED
    message: Incoming | None = None
    rule: ListenerRule | None = None
    error: str | None = None
    workflow: str | None = None
    outgoing: list[OutMessage] = field(default_factory=list)
    batch: str | None = None           # the outbox batch ``outgoing`` is in, once committed

    def to(self, state: State, error: str | None = None) -> None:
        self.state = check_transition(self.state, state)
        if error is not None:
            self.error = error


class RunnerUnusable(RuntimeError):
    """The workflow runner cannot run anything any more (e.g. the SparkContext died)."""


def is_outage(error: BaseException) -> bool:
    """A failure of the infrastructure (retry later), not of the data (isolate)."""
    if isinstance(error, (StaleRecordError, RecordLockedError)):
        return True
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, (OperationalError, InterfaceError, SqlTimeoutError, OSError)):
            return True
        cause = cause.__cause__ or cause.__context__
    return isinstance(error, StorageError) and error.__cause__ is None


def message_key(message: Incoming) -> tuple[str, str, str]:
    """The in-flight key of a message (the inbox's key: queue and message ID)."""
    return message.key


@contextlib.contextmanager
def _hang_watch(seconds: float, workflow: str, messages: int) -> Iterator[None]:
    """Exit the process when a batch run here takes longer than ``seconds``.

    A thread cannot be stopped, so a pipelet that hangs in this process would
    hold the service for good.  Exiting (code 75, "try again") leaves its
    messages unacked: the broker redelivers them, and redelivered messages run
    on Spark, which cancels the hang and isolates the message.  Nothing that
    was not committed has been acked.
    """
    def expire() -> None:
        log.critical("workflow %s: a batch of %d message(s) ran in this process for over %.0f s "
                     "(batch_timeout); a pipelet hangs. Exiting so that the broker redelivers "
                     "the batch, to run on Spark, which isolates the hang", workflow, messages,
                     seconds)
        logging.shutdown()
        os._exit(HANG_EXIT)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def record_ids(works: list[Work]) -> list[str]:
    return [rid for w in works for rid in w.message.record_ids]  # type: ignore[union-attr]


class Steps:
    """The steps, as methods of the service (which provides the attributes below)."""

    settings: Any
    stats: Any
    listeners: Any
    router: Any
    registry: Any
    runner: Any
    local_runner: Any = None           # runs batches under ``local_below`` records (or None)
    outbox: Outbox
    # Held around every write transaction of this process.  SQLite has one
    # writer; threads that find its lock taken poll for it with sleeps of up to
    # 100 ms (the busy handler), so this process's writers (stage, committer,
    # finisher) queue here instead and each starts the moment the one before
    # ends.  PostgreSQL gets a no-op.
    db_writes: Any = contextlib.nullcontext()

    # -- receiving -------------------------------------------------------------------
    def _receive(self, d: Delivery) -> Work:
        w = Work(d)
        rules = self.listeners.for_queue(d.queue)
        limits = rules[0] if rules else _NO_RULE
        try:
            w.message = parse_message(d.body, queue=d.queue, message_id=d.message_id,
                                      headers=d.headers, max_records=limits.max_records,
                                      max_body_bytes=limits.max_body_bytes, tag=d,
                                      properties=d.properties)
        except BadMessage as e:
            w.to(State.DEAD, str(e))
            return w
        w.rule = self.listeners.match(w.message)
        if w.rule is None:
            w.to(State.DEAD, f"message {w.message.message_id}: no listener rule for queue "
                 f"{d.queue!r} matches (operation {w.message.operation})")
        elif w.rule.workflow not in self.registry:
            w.workflow = w.rule.workflow
            w.to(State.DEAD, f"message {w.message.message_id}: listener rule "
                 f"{w.rule.name!r} names unknown workflow {w.rule.workflow!r}; known: "
                 f"{', '.join(self.registry.names()) or 'none'}")
        return w

    def _check_inbox(self, live: list[Work]) -> None:
        """Messages already committed become duplicates; an outbox batch of theirs
        never confirmed sent goes with the first of them, to be published again."""
        by_queue: dict[str, list[str]] = {}
        for w in live:
            if w.message is not None:
                by_queue.setdefault(w.message.queue, []).append(w.message.message_id)
        if not by_queue:
            return
        try:
            seen = {(q, mid): batch for q, ids in by_queue.items()
                    for mid, batch in self.outbox.seen(q, ids).items()}
            unsent = self.outbox.unsent({b for b in seen.values() if b}) if seen else {}
        except (StorageError, SQLAlchemyError) as e:
            log.warning("inbox check failed, holding %d message(s): %s", len(live), e)
            for w in live:
                w.to(State.DEFERRED, str(e))
            return
        if not seen:
            return
        for w in live:
            assert w.message is not None
            key = (w.message.queue, w.message.message_id)
            if key in seen:
                w.to(State.DUPLICATE)
                batch = seen[key]
                if batch in unsent:
                    w.outgoing, w.batch = unsent.pop(batch), batch

    # -- loading ---------------------------------------------------------------------
    def _load(self, bb: Blackboard, group: list[Work]) -> list[Work]:
        """Load the group's records, all or nothing; messages whose records another
        owner holds are deferred and the rest loaded (until nothing is left)."""
        started = time.perf_counter()
        try:
            while group:
                ids = record_ids(group)
                try:
                    with self.db_writes:
                        bb.load_many(ids)
                    return group
                except RecordLockedError as e:
                    locked = set(e.holders)
                    keep = []
                    for w in group:
                        if locked.intersection(w.message.record_ids):  # type: ignore[union-attr]
                            w.to(State.DEFERRED, str(e))
                        else:
                            keep.append(w)
                    group = keep
                except (StorageError, SQLAlchemyError) as e:
                    log.warning("loading %d record(s) failed, holding their messages: %s",
                                len(ids), e)
                    for w in group:
                        w.to(State.DEFERRED, f"storage unavailable: {e}")
                    return []
            return group
        finally:
            self.stats.add("load_ms", int((time.perf_counter() - started) * 1000))

    def _apply_message(self, bb: Blackboard, w: Work) -> bool:
        """Write the message's attributes onto the loaded records; bad ones dead-letter it."""
        assert w.message is not None
        if w.message.operation == "DELETE":
            return True
        try:
            for record in w.message.records:
                if record["attributes"]:
                    bb.set_attributes(record["id"], record["attributes"])
            return True
        except (BlackboardError, RecursionError, ValueError, TypeError) as e:
            w.to(State.DEAD, f"message {w.message.message_id}: attributes not usable: {e}")
            self._invalidate(bb, w.message.record_ids)
            return False

    # -- running -----------------------------------------------------------------------
    def _run_workflow(self, name: str, bb: Blackboard, works: list[Work]) -> list[Any] | None:
        """Run ``works`` on ``bb``; None when the runner failed (and the works were isolated)."""
        workflow = self.registry.get(name)
        instances = [w.message.record_ids for w in works]  # type: ignore[union-attr]
        started = time.perf_counter()
        try:
            if self._runs_here(works, instances):
                with _hang_watch(self.settings.batch_timeout, name, len(works)):
                    results = self.local_runner.run(workflow, bb, instances)
                self.stats.add("local_batches")
            else:
                results = self.runner.run(workflow, bb, instances)
        except Exception as e:  # the runner failed on the driver: nothing is known done
            self._check_runner(e)
            log.warning("workflow %s: the runner failed on %d message(s): %s", name,
                        len(works), e)
            self._isolate(name, bb, works, f"runner failed: {type(e).__name__}: {e}")
            return None
        finally:
            self.stats.add("run_ms", int((time.perf_counter() - started) * 1000))
        return list(results)

    def _runs_here(self, works: list[Work], instances: list[list[str]]) -> bool:
        """A small batch runs in this process (``local_below``), saving a Spark job's fixed
        cost; not if a message of it came again: it may be what crashed a process before,
        and Spark isolates such a message where this process cannot."""
        if self.local_runner is None or any(w.delivery.redelivered for w in works):
            return False
        return sum(len(ids) for ids in instances) < self.settings.local_below

    def _isolate(self, name: str, bb: Blackboard, works: list[Work], error: str) -> None:
        """Fail a lone message; split a larger group in halves and run each again.

        Synchronous (load, run, route, commit) on the calling thread, which
        must be the runner's; everything on ``bb`` belongs to ``works``.
        """
        self._invalidate(bb, bb.ids())
        if len(works) == 1:
            self._failed(works[0], error)
            return
        half = len(works) // 2
        for part in (works[:half], works[half:]):
            self._run_again(name, bb, part)

    def _run_again(self, name: str, bb: Blackboard, works: list[Work]) -> None:
        try:
            loaded = self._load(bb, works)
            runnable = [w for w in loaded if self._apply_message(bb, w)]
            if not runnable:
                return
            results = self._run_workflow(name, bb, runnable)
            if results is not None:
                self._settle(name, bb, runnable, results)
        finally:
            leftover = bb.ids()
            if leftover:
                self._invalidate(bb, leftover)

    def _check_runner(self, error: Exception) -> None:
        healthy = getattr(self.runner, "healthy", None)
        if healthy is not None and not healthy():
            log.critical("the workflow runner is no longer usable (%s); stopping so that a "
                         "supervisor can restart the service", error)
            raise RunnerUnusable(str(error)) from error

    # -- routing and committing -------------------------------------------------------------
    def _settle(self, name: str, bb: Blackboard, works: list[Work], results: list[Any]) -> None:
        """Route the successful instances and commit them; fail the others."""
        started = time.perf_counter()
        committing: list[tuple[Work, Any]] = []
        for w, result in zip(works, results, strict=True):
            if result.ok and self._route(name, bb, w, result):
                committing.append((w, result))
            else:
                self._invalidate(bb, result.record_ids)
                if w.state is State.PROCESSING:
                    self._failed(w, result.error or "workflow failed")
        self.stats.add("route_ms", int((time.perf_counter() - started) * 1000))
        if committing:
            self._commit(name, bb, committing)

    def _route(self, name: str, bb: Blackboard, w: Work, result: Any) -> bool:
        """Mark deletions and compute the outgoing messages; a failure fails the message."""
        assert w.message is not None
        try:
            if w.message.operation == "DELETE":
                for rid in result.record_ids:
                    bb.delete(rid)
            w.outgoing = self.router.route(bb, name, w.message, result.result_ids)
            return True
        except Exception as e:  # a router condition or attribute that cannot be rendered
            self._failed(w, f"routing failed: {type(e).__name__}: {e}")
            return False

    def _commit(self, name: str, bb: Blackboard, committing: list[tuple[Work, Any]]) -> None:
        """Records, inbox and outbox in one transaction.

        An outage defers the messages (held, tried again).  A commit refused
        for the data is narrowed down by committing halves (the results stay
        on the blackboard after a refused commit: nothing needs to run again)
        until the message that causes it stands alone; that one fails.
        """
        commit_ids = [rid for _w, result in committing for rid in result.record_ids]
        processed = [(w.message.message_id, w.message.queue) for w, _ in committing]  # type: ignore[union-attr]
        outgoing = [(w.message.message_id, m) for w, _ in committing for m in w.outgoing]  # type: ignore[union-attr]
        started = time.perf_counter()
        batches: list[str | None] = []
        try:
            with self.db_writes:
                bb.commit_many(commit_ids, hook=lambda conn: batches.append(
                    Outbox.write(conn, processed, outgoing)))
        except Exception as e:
            self.stats.add("commit_ms", int((time.perf_counter() - started) * 1000))
            works = [w for w, _ in committing]
            if is_outage(e):
                self._invalidate(bb, commit_ids)
                log.warning("workflow %s: commit of %d message(s) failed, holding them: %s",
                            name, len(works), e)
                for w in works:
                    w.outgoing = []
                    w.to(State.DEFERRED, f"commit failed: {e}")
                return
            log.warning("workflow %s: commit of %d message(s) refused: %s", name, len(works), e)
            if len(committing) == 1:
                self._invalidate(bb, commit_ids)
                works[0].outgoing = []
                self._failed(works[0], f"commit refused: {type(e).__name__}: {e}")
                return
            half = len(committing) // 2
            for part in (committing[:half], committing[half:]):
                self._commit(name, bb, part)
            return
        self.stats.add("commit_ms", int((time.perf_counter() - started) * 1000))
        for w, _ in committing:
            w.to(State.COMMITTED)
            if w.outgoing:
                w.batch = batches[-1]
        self.stats.add("records_committed", len(commit_ids))

    # -- failing ---------------------------------------------------------------------
    def _failed(self, w: Work, error: str) -> None:
        assert w.message is not None and w.rule is not None
        if w.message.attempts < w.rule.max_retries:
            w.to(State.RETRYING, error)
        else:
            w.to(State.DEAD, f"{error} (after {w.message.attempts + 1} attempt(s))")

    def _invalidate(self, bb: Blackboard, ids: list[str]) -> None:
        """Invalidate, tolerating a database that is gone: the records leave the
        blackboard either way, and leases left behind are this node's, so its
        next load takes them over (or they lapse)."""
        try:
            with self.db_writes:
                bb.invalidate_many(ids)
        except (StorageError, SQLAlchemyError) as e:
            log.warning("could not release %d lease(s), they will lapse: %s", len(ids), e)
