"""``chalk process``: records from a file through the pipeline's own stages, with no broker.

Theory of operation.  A run takes its records in chunks of ``batch_size``.
Each record is one message (ID ``process:<run>:<record>``, queue
:data:`PROCESS_QUEUE`, no delivery to ack) and each chunk one batch, taken
through the service's stages on the calling thread; the next chunk starts
once one is settled:

- ``Loader``: the records loaded (leased; the leases are renewed while the
  chunk is in flight, as the service's are) and their attributes written;
- ``ExecuteStage``: the workflow run on the runner the settings ask for,
  bounded by ``batch_timeout``: a hung or crashing instance is isolated and
  fails with a reason naming its pipelet, and results known meanwhile are
  settled early;
- ``CommitStage``: the records and the plug-ins' ``in_commit`` rows in one
  transaction (the job log's ``processed`` rows);
- ``Settlement``, then :class:`_End` where the service has its finish
  stage: nothing is published or acked; the plug-ins' ``settled`` hooks see
  the chunk's messages (the job log writes the ``failed`` ones) and their
  ``batch_finished`` hooks its report.

What differs from a delivered message, and why:

- no inbox rows: a message ID is its run's, so an inbox would not make a
  second run over the same file a no-op; that run processes the records
  again, as ``chalk process`` always has;
- no routing: router rules do not apply (results go to ``--output``);
- no retries: a failed message is failed, with its instance's own reason
  (without the attempts note ``fail`` adds); a deferred one (its records
  held by another owner) is failed too, with its reason;
- the database out (the loader or the commit stage holds messages for it):
  the run stops with :class:`StoreUnavailable` once the chunk is settled,
  as ``chalk process`` always has (exit 2); there is no one to retry;
- a record named again in the file starts a new chunk (a batch never holds
  a record twice, as the service's in-flight keys ensure), and that
  message's ID counts the occurrence: ``process:<run>/2:<record>``.
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import engine
from blackboard import Blackboard, default_owner
from listener_router._errors import StoreUnavailable
from listener_router._messages import Incoming
from listener_router._plugin import Plugin, hooked
from listener_router._rules import Router
from listener_router._runners import close_runner, make_runner
from listener_router._settings import ListenerRule, Settings
from listener_router.broker import Delivery
from listener_router.pipeline import (
    Batch,
    Commit,
    CommitStage,
    ExecuteStage,
    Group,
    Holds,
    InFlight,
    Loader,
    Meter,
    Observers,
    Runner,
    Settled,
    Settlement,
    State,
    Stats,
    Work,
    attempts_note,
    hook_name,
)
from listener_router.store import ServiceStore, unavailable

__all__ = ["PROCESS_QUEUE", "Keep", "ProcessRun", "Processed", "process_message_id"]

log = logging.getLogger(__name__)

PROCESS_QUEUE = "(process)"      # the queue of a process run's messages (and its job-log rows)

# A chunk's seconds by stage as the job log keeps them for a process run: loading (with
# the attributes), the run, and the commit (with routing, which is nothing here).
_STAGES = (("load", ("load",)), ("run", ("run",)), ("commit", ("route", "commit")))

# The reasons the loader and the commit stage hold a message for while the database is out.
_OUTAGES = ("storage unavailable: ", "commit failed: ")

Keep = Callable[[Blackboard, list[str]], Any]   # (blackboard, result IDs) → kept for the caller


def process_message_id(run: str, record_id: str, occurrence: int = 1) -> str:
    """The message ID of the ``occurrence``-th appearance of a record in run ``run``."""
    if occurrence == 1:
        return f"process:{run}:{record_id}"
    return f"process:{run}/{occurrence}:{record_id}"


@dataclass(frozen=True, slots=True)
class Processed:
    """One record's outcome: committed (``ok``), or failed with ``error``.  ``kept`` is
    what ``keep`` returned for its results (committed records only)."""

    record_id: str
    message_id: str
    ok: bool
    error: str | None = None
    kept: Any = None


class _NothingWaits:
    def drain(self) -> None:
        """Nothing waits: what the end is handed is done when it returns."""


class _End:
    """Where a process run's settled messages go instead of the finish stage (module doc)."""

    def __init__(self, settled: Sequence[Settled], observers: Observers):
        self.input = _NothingWaits()
        self.settled = list(settled)
        self.observers = observers

    def finish(self, works: list[Work], batch: Batch | None) -> None:
        for w in works:
            if w.state is State.DEAD and w.error:   # no retries: no attempts note
                w.error = w.error.removesuffix(attempts_note(w.runs))
        report = batch.report if batch is not None else None
        for hook in self.settled:
            try:
                hook(works, report)
            except Exception:  # as in the finish stage: a plug-in's bug stops nothing
                log.exception("settled hook %s failed", hook_name(hook))

    def report_if_finished(self, batch: Batch) -> None:
        with batch.lock:
            if not batch.settled or batch.finishing:
                return
            batch.finishing = -1  # reported: never again
        report = batch.report
        with report.lock:
            seconds = report.seconds
            report.seconds = {stage: sum(seconds.get(s, 0.0) for s in parts)
                              for stage, parts in _STAGES}
        self.observers.notify(report)


class ProcessRun:
    """One ``chalk process`` run of ``workflow`` over records (see the module doc).

    ``plugins`` take part through their ``in_commit``, ``settled`` and
    ``batch_finished`` hooks (started here, stopped by :meth:`close`; none
    publishes: there is no broker).  ``keep(blackboard, result_ids)`` is
    called inside each commit for each committed record (its result records
    are on the blackboard then; they leave it when the transaction commits),
    and what it returns is the outcome's ``kept``.  ``runner``: the settings'
    (Spark, or this process) when None.
    """

    def __init__(self, settings: Settings, workflow: str, *, store: ServiceStore,
                 registry: engine.WorkflowRegistry | None = None, runner: Runner | None = None,
                 plugins: Sequence[Plugin] = (), keep: Keep | None = None):
        self.settings = settings
        self.workflow = workflow
        self.store = store
        self.registry = registry or engine.WorkflowRegistry(
            settings.workflows_dir, aliases=settings.aliases, services=settings.services)
        self.run_id = uuid.uuid4().hex[:12]
        self.rule = ListenerRule(name="process", queue=PROCESS_QUEUE, workflow=workflow,
                                 max_retries=0, create_missing=True)
        self.plugins = list(plugins)
        self.keep = keep
        self._kept: dict[str, Any] = {}
        self.stats = Stats()
        meter = Meter(self.stats)
        owner, lease = default_owner(), settings.lease_seconds
        self.bb = store.blackboard(owner, lease)
        self.loader = Loader(store, meter)
        self.inflight = InFlight(functools.partial(store.renew_leases, owner=owner,
                                                   lease_seconds=lease), lease / 3)
        self.end = _End(hooked(self.plugins, "settled"),
                        Observers(hooked(self.plugins, "batch_finished")))
        settlement = Settlement(loader=self.loader, inflight=self.inflight,
                                held=Holds([PROCESS_QUEUE]), finish=self.end, meter=meter)
        in_commit = hooked(self.plugins, "in_commit") + ([self._keep] if keep else [])
        self.commit = CommitStage(router=Router([]), store=store, loader=self.loader,
                                  settlement=settlement, meter=meter, in_commit=in_commit,
                                  inbox=False)
        self._made = runner is None   # its workers stop with it
        self.runner = runner or make_runner(settings)
        self.execute = ExecuteStage(
            registry=self.registry, runner=self.runner, local_runner=None,
            placement=None, batch_timeout=settings.batch_timeout, loader=self.loader,
            commit=self.commit, settlement=settlement, meter=meter)
        self._started: list[Plugin] = []
        self._open()

    # -- the lifecycle ---------------------------------------------------------------------
    def _open(self) -> None:
        try:
            for plugin in self.plugins:
                for schema in plugin.tables():
                    with unavailable():
                        schema.create(self.store.engine)
            self.inflight.start()
            for plugin in self.plugins:
                plugin.start()
                self._started.append(plugin)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Stop what started, in reverse (a failing stop is logged and the rest still stop)."""
        made: list[Callable[[], None]] = \
            [functools.partial(close_runner, self.runner)] if self._made else []
        stops: list[Callable[[], None]] = [self.commit.input.close, self.inflight.stop]
        for stop in (*stops,
                     *(p.stop for p in reversed(self._started)), self.bb.close, *made):
            try:
                stop()
            except Exception:
                log.exception("stopping %s failed", getattr(stop, "__self__", stop))
        self._started = []

    def __enter__(self) -> ProcessRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- running ---------------------------------------------------------------------------
    def chunks(self, records: Iterable[dict[str, Any]], size: int
               ) -> Iterator[list[Processed]]:
        """Run ``records`` (``{"id", "attributes"}``) through, ``size`` at a time; yields
        each chunk's outcomes, in the records' order, once the chunk is settled."""
        occurrences: dict[str, int] = {}
        chunk: list[tuple[dict[str, Any], int]] = []
        ids: set[str] = set()
        for record in records:
            rid = record["id"]
            if len(chunk) >= size or rid in ids:
                yield self._run(chunk)
                chunk, ids = [], set()
            n = occurrences[rid] = occurrences.get(rid, 0) + 1
            chunk.append((record, n))
            ids.add(rid)
        if chunk:
            yield self._run(chunk)

    def _work(self, record: dict[str, Any], occurrence: int) -> Work:
        rid = record["id"]
        mid = process_message_id(self.run_id, rid, occurrence)
        message = Incoming(mid, PROCESS_QUEUE, [record], "ADD", {}, 0, record_ids=[rid],
                           key=("message", PROCESS_QUEUE, mid))
        w = Work(Delivery(0, 0, PROCESS_QUEUE, b"", mid, {}, False), message=message,
                 rule=self.rule, workflow=self.workflow, loaded=True)
        w.to(State.PROCESSING)
        return w

    def _run(self, chunk: list[tuple[dict[str, Any], int]]) -> list[Processed]:
        """One chunk as one batch: load and write attributes, then execute, commit, settle."""
        works = [self._work(record, n) for record, n in chunk]
        batch = Batch(works=works, lane=PROCESS_QUEUE)
        report = batch.report
        bb = self.bb
        group = batch.groups[self.workflow] = Group(self.workflow, bb, batch=batch)
        self.inflight.reserve(_keys(works), batch)
        loaded = self.loader.load(bb, works, report)
        started = time.perf_counter()
        group.works = [w for w in loaded if self.loader.apply(bb, w)]
        report.add_seconds("load", time.perf_counter() - started)
        ended = [w for w in works if w.state is not State.PROCESSING]
        if ended:  # as the gather stage does with the messages it settles itself
            self.inflight.release(_keys(ended))
            with report.lock:
                report.outcome.update((PROCESS_QUEUE, w.label) for w in ended)
            self.end.finish(ended, batch)
        try:
            self.execute.execute(batch)
        finally:
            self.commit.input.drain()
            kept, self._kept = self._kept, {}
            leftover = bb.ids()
            if leftover:
                self.loader.invalidate(bb, leftover)
        for w in works:
            if w.state is State.DEFERRED and w.error and w.error.startswith(_OUTAGES):
                raise StoreUnavailable(w.error)
        out: list[Processed] = []
        for w in works:
            m = w.message
            assert m is not None
            ok = w.state is State.COMMITTED
            out.append(Processed(m.record_ids[0], m.message_id, ok, None if ok else w.error,
                                 kept.get(m.message_id) if ok else None))
        return out

    def _keep(self, commit: Commit) -> None:
        """In each commit transaction: what the caller keeps of each committed record."""
        keep, bb = self.keep, commit.blackboard
        assert keep is not None and bb is not None
        for w, result in zip(commit.committed, commit.results, strict=True):
            self._kept[w.message.message_id] = keep(bb, result.result_ids)  # type: ignore[union-attr]


def _keys(works: Iterable[Work]) -> list[Any]:
    """The in-flight keys of process messages: each message's and its records'."""
    return [k for w in works if w.message is not None
            for k in (w.message.key, *w.message.record_ids)]
