"""The commit stage: route the results, then records + inbox + outbox in one transaction.

For each message of a group whose workflow ran: a failed instance's records
are invalidated and the message fails (retrying or dead, ``_retries``), or,
when no runner could begin it (``not_run``: its workers did not start), is
deferred (held and tried again, no attempt counted); a successful one is routed (its outgoing messages computed, deletions marked)
and committed.  The commit is one transaction: the records, an inbox row per
message, one outbox row with the group's outgoing messages, and whatever the
plug-ins' ``in_commit`` hooks write (:class:`Commit` is what they see).  Then the group goes to
the finish stage (``_settlement``).

A commit that fails for the infrastructure (the database, a lease another
owner took, a plug-in's hook) defers the messages: held and tried again.  One
refused for the data is narrowed down by committing halves (the results stay
on the blackboard after a refused commit: nothing runs again) until the
message that causes it stands alone; that one fails.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from sqlalchemy import Connection

from blackboard import Blackboard
from engine import InstanceResult
from listener_router._errors import ChalkServiceError, ExtensionFailed, InfrastructureError
from listener_router._rules import Router
from listener_router.broker import OutMessage
from listener_router.pipeline._batch import Group
from listener_router.pipeline._cancelled import Cancelled
from listener_router.pipeline._loading import Loader
from listener_router.pipeline._ordered import Ordered
from listener_router.pipeline._report import BatchReport, Meter, hook_name
from listener_router.pipeline._retries import fail
from listener_router.pipeline._settlement import Settlement
from listener_router.pipeline._stage_input import StageInput
from listener_router.pipeline._states import State
from listener_router.pipeline._work import Work
from listener_router.store import InboxLog, Outbox, ServiceStore, commit_failure

__all__ = ["Commit", "CommitExtension", "CommitStage", "Executed", "InCommit"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Executed:
    """A group whose workflow ran, with one result per message (the commit stage's input)."""

    group: Group
    results: list[InstanceResult]


@dataclass(eq=False)
class Commit:
    """One commit transaction of a batch, as a :class:`CommitExtension` sees it.

    A transaction commits one workflow's group of the batch (a part of it
    while a refused commit is narrowed down).  ``committed`` are the messages
    whose records, inbox rows and outgoing messages it writes; they are still
    *processing* inside it and become *committed* when it commits.
    ``failed`` are the group's messages that failed instead (*retrying* or
    *dead*; their records were invalidated), reported with the first
    transaction of the group that commits.  A message a plug-in settled
    whole without a run (``Plugin.screen``) is committed with ``step`` set
    (``unchanged``), an empty result and no record written; one with some
    records settled so names only those that ran (``Work.whole``: all of
    them).  ``blackboard`` still holds the
    committed records as written (read them; ``changed_ids()``,
    ``is_deleted(id)``): they leave it when the transaction commits.
    """

    workflow: str
    connection: Connection                   # the transaction's: write rows with it
    committed: list[Work]
    failed: list[Work]
    committed_ids: list[str]                 # records written
    invalidated_ids: list[str]               # records of ``failed``, dropped
    outgoing: list[tuple[str, OutMessage]]   # (source message ID, routed message)
    report: BatchReport | None = None        # the batch's report so far (timings, counts)
    blackboard: Blackboard | None = None     # the group's: the records, still on it (read only)
    added: list[OutMessage] = field(default_factory=list)
    results: list[InstanceResult] = field(default_factory=list)  # one per ``committed``
    # The job log's entries of ``committed``, one each in order: written on their inbox
    # rows (the job log sets it; at most one plug-in may).
    inbox_log: InboxLog | None = None

    def publish(self, message: OutMessage) -> None:
        """Add ``message`` to this transaction's outbox batch.

        It is published, with confirms, with the batch's routed messages, to
        ``message.exchange`` (default exchange: a queue) and
        ``message.routing_key``, and again whole if the batch was not
        confirmed sent.  Give it a deterministic ``message_id`` (receivers
        drop copies by ID).  Nothing is published when the transaction
        rolls back.
        """
        self.added.append(message)


InCommit = Callable[[Commit], None]   # a plug-in's ``in_commit`` hook


class CommitExtension:
    """Rows and messages of its own in a batch's commit transaction; the base does nothing
    (``Service(extensions=[...])``; a plug-in overrides ``Plugin.in_commit`` instead).

    :meth:`in_transaction` runs inside the transaction, before the inbox and
    outbox rows are written; what it writes with ``commit.connection`` and
    adds with ``commit.publish`` commits with the batch's records or not at
    all.  If it raises, the transaction rolls back and the batch's messages
    are held and tried again (:class:`~listener_router.ExtensionFailed`).
    """

    def in_transaction(self, commit: Commit) -> None:
        """Write this extension's part of ``commit`` (see the class doc)."""


class CommitStage:
    """Route and commit (see module doc); ``input`` is the stage's input.

    ``inbox=False``: no inbox rows (``chalk process``: its messages come from no broker
    and never come again)."""

    def __init__(self, *, router: Router, store: ServiceStore, loader: Loader,
                 settlement: Settlement, meter: Meter, in_commit: Iterable[InCommit] = (),
                 orders: dict[str, Ordered] | None = None, cancelled: Cancelled | None = None,
                 inbox: bool = True):
        self.inbox = inbox
        self.router = router
        self.store = store
        self.loader = loader
        self.settlement = settlement
        self.meter = meter
        self.in_commit: list[InCommit] = list(in_commit)
        self.orders = orders or {}
        self.cancelled = cancelled
        self.input: StageInput[Executed] = StageInput("chalk-commit", self._handle)

    def _handle(self, executed: Executed) -> None:
        group = executed.group
        try:
            self.settle(group, group.works, executed.results)
        except Exception:  # never let the committer die silently
            log.exception("settling %d message(s) failed; they are held and tried again",
                          len(group.works))
        finally:
            self.settlement.group_done(group)

    def settle(self, group: Group, works: list[Work], results: Sequence[InstanceResult]) -> None:
        """Route the successful instances and commit them; fail the others."""
        name, bb = group.name, group.bb
        report = group.batch.report if group.batch is not None else None
        started = time.perf_counter()
        committing: list[tuple[Work, InstanceResult]] = []
        failed: list[Work] = []
        invalidated: list[str] = []
        cancelled = self.cancelled
        for w, result in zip(works, results, strict=True):
            why = cancelled.reason(w.message) if cancelled and w.message is not None else None
            if why is not None:  # cancelled while it ran: nothing of it is committed
                self.loader.invalidate(bb, result.record_ids)
                invalidated += result.record_ids
                w.to(State.CANCELLED, why)
                failed.append(w)
            elif result.ok and self._route(name, bb, w, result):
                committing.append((w, result))
            else:
                self.loader.invalidate(bb, result.record_ids)
                invalidated += result.record_ids
                if w.state is State.PROCESSING and result.not_run:
                    # no runner could begin it: held and tried again, no attempt counted
                    w.to(State.DEFERRED, result.error or "not run")
                    continue
                if w.state is State.PROCESSING:
                    fail(w, result.error or "workflow failed", result.runs)
                failed.append(w)
        self.meter.time("route", time.perf_counter() - started, report)
        if report is not None:
            report.count_records(name, "invalidated", len(invalidated))
        if committing:
            self._commit(group, committing, failed, invalidated)

    def _route(self, name: str, bb: Blackboard, w: Work, result: InstanceResult) -> bool:
        """Mark deletions and compute the outgoing messages; a failure fails the message."""
        assert w.message is not None
        try:
            if w.message.operation == "DELETE":
                for rid in result.record_ids:
                    bb.delete(rid)
            w.outgoing = [*w.unrun_outgoing,
                          *self.router.route(bb, name, w.message, result.result_ids)]
            return True
        except Exception as e:  # a router condition or attribute that cannot be rendered
            fail(w, f"routing failed: {type(e).__name__}: {e}")
            return False

    def commit_unrun(self, group: Group, works: list[Work]) -> None:
        """Commit messages a plug-in settled whole without a run (``_screen``): their inbox
        rows (status: their step), their records' routed messages (``unrun_outgoing``) and
        the plug-ins' rows in one transaction, as :meth:`settle` commits a run's; no record
        is written.  On the calling thread (the gather stage's, owning the group's
        blackboard)."""
        for w in works:
            w.outgoing = list(w.unrun_outgoing)
        self._commit(group, [(w, InstanceResult(i, True, None)) for i, w in enumerate(works)],
                     [], [])

    def _commit(self, group: Group, committing: list[tuple[Work, InstanceResult]],
                failed: list[Work], invalidated: list[str]) -> None:
        """Records, inbox, outbox and the plug-ins' writes in one transaction (module doc)."""
        name, bb = group.name, group.bb
        report = group.batch.report if group.batch is not None else None
        commit_ids = [rid for _w, result in committing for rid in result.record_ids]
        processed = [(w.message.message_id, w.message.queue)  # type: ignore[union-attr]
                     for w, _ in committing] if self.inbox else []
        steps = [w.step or "committed" for w, _ in committing] \
            if any(w.step for w, _ in committing) else None
        outgoing = [(w.message.message_id, m) for w, _ in committing for m in w.outgoing]  # type: ignore[union-attr]
        added: list[OutMessage] = []
        batches: list[str | None] = []

        def in_transaction(conn: Connection) -> None:
            messages: list[tuple[str | None, OutMessage]] = list(outgoing)
            if self.orders:  # a retry committed: its queue's order holds go with it
                for w, _ in committing:
                    ordered = self.orders.get(w.delivery.queue)
                    if ordered is not None:
                        ordered.freed(conn, [w])
            logged = None
            if self.in_commit:
                commit = Commit(name, conn, [w for w, _ in committing], failed, commit_ids,
                                invalidated, outgoing, report, bb,
                                results=[result for _, result in committing])
                self._extend(commit)
                added.extend(commit.added)
                messages += [(None, m) for m in commit.added]
                logged = commit.inbox_log
            batches.append(Outbox.write(conn, processed, messages, writer=bb.owner,
                                        logged=logged, status=steps))

        started = time.perf_counter()
        try:
            with self.store.writes:
                try:
                    bb.commit_many(commit_ids, hook=in_transaction)
                except ChalkServiceError:
                    raise
                except Exception as e:
                    raise commit_failure(e) from e
        except ChalkServiceError as e:
            self.meter.time("commit", time.perf_counter() - started, report)
            works = [w for w, _ in committing]
            if isinstance(e, InfrastructureError):
                self.loader.invalidate(bb, commit_ids)
                log.warning("workflow %s: commit of %d message(s) failed, holding them: %s",
                            name, len(works), e)
                for w in works:
                    w.outgoing = []
                    w.to(State.DEFERRED, f"commit failed: {e}")
                return
            log.warning("workflow %s: commit of %d message(s) refused: %s", name, len(works),
                        e.__cause__ or e)
            if len(committing) == 1:
                self.loader.invalidate(bb, commit_ids)
                works[0].outgoing = []
                fail(works[0], f"commit refused: {e}")
                return
            half = len(committing) // 2
            self._commit(group, committing[:half], failed, invalidated)
            self._commit(group, committing[half:], [], [])
            return
        self.meter.time("commit", time.perf_counter() - started, report)
        if added:
            committing[0][0].outgoing += added
        for w, _ in committing:
            w.to(State.COMMITTED)
            if w.outgoing:
                w.batch = batches[-1]
        self.meter.stats.add("records_committed", len(commit_ids))
        if report is not None:
            report.count_records(name, "committed", len(commit_ids))
            for step, n in Counter(s for w, _ in committing for s in w.unrun.values()).items():
                report.count_records(name, step, n)   # settled without a run (``_screen``)

    def _extend(self, commit: Commit) -> None:
        for hook in self.in_commit:
            try:
                hook(commit)
            except Exception as e:
                name = hook_name(hook)
                log.exception("commit hook %s failed; the batch is rolled back and held", name)
                raise ExtensionFailed(f"commit hook {name} failed: {type(e).__name__}: {e}") from e
