"""The service: consume → load → run workflow → commit (+inbox, +outbox) → publish → ack.

See ``_states`` for the life of one message and ``_pipeline`` for the
threads: the stage thread gathers and loads the next batch while the
calling thread runs the workflows of this one, and the committer and the
finisher commit, publish and ack the one before (``_steps`` has the steps,
``_publishing`` the finisher's part).  The broker connection lives in a
child process (``_amqp_process``; or on a thread of its own, ``_amqp``), so
a long Spark job never starves the connection's heartbeats and pika's frame
work does not compete with the pipeline for the interpreter lock.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

import engine
from blackboard import Blackboard, StorageError
from listener_router._amqp import (
    AmqpLink,
    Delivery,
)
from listener_router._amqp_process import ProcessLink
from listener_router._cluster import Membership, claim_node_name
from listener_router._config import Settings, make_runner
from listener_router._outbox import Outbox
from listener_router._pipeline import Batch, Gathering, Group, InFlight, tune_gc
from listener_router._publishing import Publishing
from listener_router._rules import ListenerRules, Router
from listener_router._states import State
from listener_router._steps import RunnerUnusable, Steps, Work, message_key
from listener_router._topology import declare_all

__all__ = ["Service", "Stats", "RunnerUnusable"]

log = logging.getLogger(__name__)

REFRESH_EVERY = 2.0
MAINTAIN_EVERY = 30.0     # leader maintenance period, seconds
ORPHAN_AGE = 120.0        # an unsent outbox batch this old has lost its inputs' redelivery
CHUNK_LINGER = 0.02       # seconds the stage waits to gather more than one delivery


_STATS_LOCK = threading.Lock()


@dataclass
class Stats:
    counts: Counter[str] = field(default_factory=Counter)
    started: float = field(default_factory=time.monotonic)
    last_activity: float = field(default_factory=time.monotonic)

    def add(self, key: str, n: int = 1) -> None:
        with _STATS_LOCK:
            self.counts[key] += n

    def __getitem__(self, key: str) -> int:
        return self.counts[key]


def _keys(works: Iterable[Work]) -> list[Any]:
    """In-flight keys of messages that were taken up (the message and its records)."""
    keys: list[Any] = []
    append, extend = keys.append, keys.extend
    for w in works:
        message = w.message
        if message is not None:
            append(message.key)
            extend(message.record_ids)
    return keys


class Service(Publishing, Steps):
    """One Chalk service process (see module doc)."""

    def __init__(self, settings: Settings, *, spark: Any = None, runner: Any = None,
                 registry: Any = None):
        self.settings = settings
        self.stats = Stats()
        self._spark = spark
        self._runner = runner
        self._registry = registry
        self._stopping = threading.Event()
        self._signals = 0
        self.link: AmqpLink | ProcessLink | None = None
        self.bb: Blackboard | None = None
        self._held: list[Delivery] = []
        self._held_lock = threading.Lock()
        self._backoff = 0.0
        self._committer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="chalk-commit")
        self._finisher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="chalk-finish")
        self._committing: list[Future[None]] = []
        self._finishing: list[Future[None]] = []
        self._futures_lock = threading.Lock()
        self._stage_stop = threading.Event()
        self._stage_thread: threading.Thread | None = None
        self.inflight: InFlight | None = None

    # -- opening and closing ---------------------------------------------------------
    def open(self) -> Service:
        s = self.settings
        self.node = s.node or claim_node_name(s.blackboard_url)
        self.listeners = ListenerRules(s.listeners)
        self.router = Router(s.routers)
        self.bb = Blackboard.connect(s.blackboard_url, owner=self.node,
                                     lease_seconds=s.lease_seconds)
        store = self.bb.store
        assert store is not None
        self.outbox = Outbox(store.engine)
        self.registry = self._registry or engine.WorkflowRegistry(s.workflows_dir,
                                                                  aliases=s.aliases, services=s.services)
        for problem in self.registry.errors:
            log.error("%s", problem)
        if self._runner is None:
            self._runner = make_runner(s, self._spark)
        self.runner = self._runner
        if s.local_below and not isinstance(self.runner, engine.LocalRunner):
            self.local_runner = engine.LocalRunner()
        # More than one batch may run at once (Spark jobs from several threads;
        # the in-flight registry keeps their records and messages apart).  On
        # two cores a second Spark job only competes with the first (measured:
        # same throughput, later results), so the default is one.
        self.concurrent_batches = max(1, s.concurrent_batches)
        self._runners = ThreadPoolExecutor(max_workers=self.concurrent_batches,
                                           thread_name_prefix="chalk-run")
        if hasattr(self.runner, "warm_up"):
            log.info("Spark workers warmed up in %.1f s", self.runner.warm_up())
        if store.dialect == "sqlite":
            self.db_writes = threading.Lock()
        node, lease, writes = self.node, s.lease_seconds, self.db_writes

        def renew(ids: list[str]) -> None:
            with writes:
                store.renew(ids, node, lease)
        self.inflight = InFlight(renew, lease / 3).start()
        self.gathering = Gathering(max(rule.batch_size for rule in s.listeners),
                                   max(rule.max_wait_ms for rule in s.listeners) / 1000.0)
        prefetch = max(rule.prefetch for rule in s.listeners)
        link_class = ProcessLink if s.broker_process else AmqpLink
        self.link = link_class(s.broker_url, prefetch=prefetch, consume=self.listeners.consumers(),
                               prepare=functools.partial(declare_all, settings=s)).start()
        self.membership = Membership(store.engine, self.node).start()
        self._last_maintenance = time.monotonic()
        self._declared: set[str] = set(self.listeners.queues)
        self._declared |= {r.queue for r in s.routers if r.queue and not r.exchange}
        self._last_refresh = time.monotonic()
        log.info("service %s up: queues %s, workflows %s", self.node,
                 ", ".join(self.listeners.queues), ", ".join(self.registry.names()))
        return self

    def close(self) -> None:
        try:
            self.drain()
        finally:
            runners = getattr(self, "_runners", None)
            if runners is not None:
                runners.shutdown(wait=True)
            self._committer.shutdown(wait=True)
            self._finisher.shutdown(wait=True)
            if self.inflight is not None:
                self.inflight.stop()
            membership = getattr(self, "membership", None)
            if membership is not None:
                membership.stop()
        if self.link is not None:
            self.link.stop()
        if self.bb is not None:
            self.bb.close()

    def __enter__(self) -> Service:
        return self.open()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the loop ------------------------------------------------------------------
    def request_stop(self) -> None:
        """Stop consuming; the current batch is finished, then ``run`` returns."""
        self._stopping.set()
        if self.link is not None:
            self.link.stop_consuming()

    def install_signal_handlers(self) -> None:
        def handler(signum: int, _frame: Any) -> None:
            self._signals += 1
            if self._signals > 1:
                log.warning("second signal: exiting now (unacked messages will be redelivered)")
                os._exit(128 + signum)
            log.info("signal %d: finishing the current batch, then stopping", signum)
            self.request_stop()
        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def run(self, *, until: Callable[[Stats], bool] | None = None,
            idle_exit: float | None = None) -> Stats:
        """Process batches until stopped, ``until(stats)`` is true, or idle for ``idle_exit`` s.

        The batch being run is finished (committed, published, acked); the
        one gathered behind it is let go unacked (its records released), to
        be delivered again.
        """
        assert self.link is not None
        tune_gc()
        self._start_stage()
        running: list[Future[None]] = []
        try:
            while not self._stopping.is_set():
                for future in [f for f in running if f.done()]:
                    running.remove(future)
                    future.result()  # a runner that cannot go on (RunnerUnusable) stops us
                if len(running) < self.concurrent_batches:
                    waited = time.perf_counter()
                    batch = self.gathering.take(0.2)
                    if batch is not None:
                        self.stats.add("wait_ms", int((time.perf_counter() - waited) * 1000))
                        running.append(self._runners.submit(self._execute, batch))
                        self.stats.last_activity = time.monotonic()
                else:
                    wait(running, timeout=0.2, return_when=FIRST_COMPLETED)
                    self.stats.last_activity = time.monotonic()
                if until is not None and until(self.stats):
                    break
                if idle_exit is not None and not running and \
                        time.monotonic() - self.stats.last_activity > idle_exit:
                    break
                if time.monotonic() - self._last_refresh > REFRESH_EVERY:
                    self._last_refresh = time.monotonic()
                    for problem in self.registry.refresh():
                        log.error("%s", problem)
                if time.monotonic() - self._last_maintenance > MAINTAIN_EVERY:
                    self._last_maintenance = time.monotonic()
                    if self.membership.is_leader:
                        self.maintain()
        finally:
            try:
                for future in running:  # the batches being run are finished
                    future.result()
            finally:
                self._stop_stage()
                self.drain()
        return self.stats

    def maintain(self) -> dict[str, int]:
        """Leader maintenance: expired leases, orphaned outbox rows, retention."""
        assert self.bb is not None and self.bb.store is not None
        done: dict[str, int] = {}
        try:
            done["expired_leases"] = self.bb.store.purge_expired_leases()
            orphans = self.outbox.unsent(older_than=time.time() - ORPHAN_AGE)
            done["orphans"] = sum(len(messages) for messages in orphans.values())
            if orphans:
                log.warning("publishing %d orphaned outbox message(s) of %d batch(es)",
                            done["orphans"], len(orphans))
                self._submit(lambda: self._publish_orphans(orphans))
            done["retention"] = self.outbox.purge(self.settings.retention_days * 86400.0)
            done["forgotten_members"] = self.membership.forget_dead()
        except (StorageError, SQLAlchemyError) as e:
            log.warning("maintenance failed, trying again later: %s", e)
        return done

    # -- the stage thread: gather, parse, inbox, load ------------------------------------
    def _start_stage(self) -> None:
        self._stage_stop.clear()
        self._stage_thread = threading.Thread(target=self._stage_loop, name="chalk-stage",
                                              daemon=True)
        self._stage_thread.start()

    def _stop_stage(self) -> None:
        """Stop the stage; the batch it was gathering is let go (records released, unacked)."""
        self._stage_stop.set()
        if self._stage_thread is not None:
            self._stage_thread.join()
            self._stage_thread = None
        with self.gathering.lock:
            batch, self.gathering.batch = self.gathering.batch, None
        if batch is not None:
            for group in batch.groups.values():
                self._let_go(group)

    def _let_go(self, group: Group) -> None:
        """Release a group that will not run: its records leave, its messages wait unacked
        (held, for a later ``run`` on this connection; or redelivered after it)."""
        leftover = group.bb.ids()
        if leftover:
            self._invalidate(group.bb, leftover)
        assert self.inflight is not None
        self.inflight.release(_keys(group.works))
        with self._held_lock:
            self._held[:0] = [w.delivery for w in group.works]
        group.works = []

    def _stopped(self) -> bool:
        return self._stage_stop.is_set() or self._stopping.is_set()

    def _stage_loop(self) -> None:
        while not self._stopped():
            if not self.gathering.wait_for_room(self._stage_stop):
                return
            with self.gathering.lock:
                room = self.gathering.room()
            deliveries = self._gather(room)
            if not deliveries:
                continue
            try:
                self._stage(deliveries)
            except Exception:  # never let the stage die: the messages wait unacked
                log.exception("preparing %d message(s) failed; they are held and tried again",
                              len(deliveries))
                self._hold(deliveries)

    def _gather(self, room: int) -> list[Delivery]:
        """Held deliveries first (after the backoff), then fresh ones, up to ``room``."""
        assert self.link is not None
        chunk: list[Delivery] = []
        if self._held:
            if self._stage_stop.wait(self._backoff) or self._stopping.is_set():
                return []
            with self._held_lock:
                held, self._held = self._held, []
            if not self.link.ready.is_set():
                # The connection is gone: its deliveries come back on the new one.
                return []
            live = [d for d in held if d.generation == self.link.generation]
            chunk = live[:room]
            with self._held_lock:
                self._held[:0] = live[room:]
        if len(chunk) < room:
            linger = min(CHUNK_LINGER, self.gathering.max_wait)
            chunk += self.link.deliveries.get_batch(room - len(chunk),
                                                    timeout=0 if chunk else 0.1, linger=linger)
        return chunk

    def _stage(self, deliveries: list[Delivery]) -> None:
        """Parse a chunk and add it to the batch being gathered (see ``_pipeline``)."""
        assert self.link is not None and self.inflight is not None
        started = time.perf_counter()
        generation = self.link.generation
        works = [self._receive(d) for d in deliveries if d.generation == generation]
        self.stats.add("received", len(works))
        self.stats.add("receive_ms", int((time.perf_counter() - started) * 1000))
        if not works:
            return
        self.stats.last_activity = time.monotonic()
        keys = _keys(w for w in works if w.state is State.RECEIVED)
        gathering = self.gathering
        while True:
            with gathering.lock:
                gathered = gathering.batch
                if not (self.inflight.holders(keys) - {gathered}):
                    self._add(gathering.current(), works)
                    gathering.added()
                    break
            # An earlier batch still holds some of these messages or records: wait
            # for its commit (the inbox and the stored versions are not final yet).
            if not self.inflight.wait_free(keys, gathered, self._stage_stop):
                self._hold(w.delivery for w in works)
                return
        self.stats.add("stage_ms", int((time.perf_counter() - started) * 1000))

    def _add(self, batch: Batch, works: list[Work]) -> None:
        """Inbox check, load and attributes for a chunk; the caller holds the gathering lock."""
        assert self.inflight is not None and self.bb is not None
        inflight = self.inflight
        live = [w for w in works if w.state is State.RECEIVED]
        # What this batch already holds, or an earlier message of this chunk took.
        taken: set[Any] = inflight.held_by(_keys(live), batch)
        fresh: list[Work] = []
        for w in live:
            key = message_key(w.message)  # type: ignore[arg-type]
            if key in taken:
                w.to(State.DEFERRED, "message delivered twice in one batch")
            else:
                taken.add(key)
                fresh.append(w)
        started = time.perf_counter()
        self._check_inbox(fresh)
        self.stats.add("inbox_ms", int((time.perf_counter() - started) * 1000))
        groups: dict[str, list[Work]] = {}
        for w in fresh:
            if w.state is not State.RECEIVED:
                continue
            assert w.message is not None and w.rule is not None
            ids = w.message.record_ids
            if not taken.isdisjoint(ids):
                w.to(State.DEFERRED, "record also in an earlier message of this batch")
                continue
            taken.update(ids)
            w.to(State.PROCESSING)
            w.workflow = w.rule.workflow
            groups.setdefault(w.rule.workflow, []).append(w)
        reserved = [w for ws in groups.values() for w in ws]
        inflight.reserve(_keys(reserved), batch)
        for name, group_works in groups.items():
            group = batch.groups.get(name)
            if group is None:
                group = batch.groups[name] = Group(name, Blackboard(
                    self.bb.store, owner=self.node, lease_seconds=self.settings.lease_seconds),
                    batch=batch)
            loaded = self._load(group.bb, group_works)
            group.works += [w for w in loaded if self._apply_message(group.bb, w)]
        inflight.release(_keys(w for w in reserved if w.state is not State.PROCESSING))
        batch.works += works
        finished = [w for w in works if w.state is not State.PROCESSING]
        with batch.lock:
            batch.outcome.update(w.state.value for w in finished)
        self._finish(finished)

    # -- the runner thread ---------------------------------------------------------------
    def _execute(self, batch: Batch) -> None:
        """Run each workflow's group of the batch; the committer settles them."""
        groups = [g for g in batch.groups.values() if g.works]
        batch.pending = len(groups) + 1
        try:
            for position, group in enumerate(groups):
                try:
                    results = self._run_workflow(group.name, group.bb, group.works)
                except BaseException:
                    for rest in groups[position:]:
                        self._let_go(rest)
                        self._batch_part_done(batch)
                    raise
                if results is None:  # isolated and settled on this thread
                    self._group_done(group)
                else:
                    self._submit_commit(group, results)
        finally:
            self._batch_part_done(batch)

    def _submit_commit(self, group: Group, results: list[Any]) -> None:
        def settle() -> None:
            try:
                self._settle(group.name, group.bb, group.works, results)
            except Exception:  # never let the committer die silently
                log.exception("settling %d message(s) failed; they are held and tried again",
                              len(group.works))
            finally:
                self._group_done(group)
        self._push(self._committer, self._committing, settle)

    def _group_done(self, group: Group) -> None:
        """The group is settled: its records leave, its messages go to the finisher."""
        leftover = group.bb.ids()
        if leftover:
            self._invalidate(group.bb, leftover)
        for w in group.works:
            if w.state is State.PROCESSING:  # an unexpected failure settling it
                w.to(State.DEFERRED, "internal error while settling the batch")
        assert self.inflight is not None
        self.inflight.release(_keys(group.works))
        if group.batch is not None:
            with group.batch.lock:
                group.batch.outcome.update(w.state.value for w in group.works)
        self._finish(group.works)
        if group.batch is not None:
            self._batch_part_done(group.batch)

    def _batch_part_done(self, batch: Batch) -> None:
        with batch.lock:
            batch.pending -= 1
            if batch.pending:
                return
        outcome = batch.outcome
        elapsed = time.perf_counter() - batch.started
        log.info("batch of %d message(s) in %.2f s: %s", len(batch.works), elapsed,
                 ", ".join(f"{n} {state}" for state, n in sorted(outcome.items())))
        self.stats.add("batches")
        self.stats.add("batch_ms", int(elapsed * 1000))
        # Groups point back at their batch: drop that cycle so the batch's messages
        # are freed now, by reference counting, not by a garbage-collector pass.
        batch.groups.clear()
