"""The service: wiring and lifecycle (open, run, signals, close).

One message's way: ``pipeline/_gather.py`` (parse, inbox, load) →
``pipeline/_execute.py`` (the workflow) → ``pipeline/_commit.py`` (route;
records + inbox + outbox in one transaction) → ``pipeline/_finish.py``
(publish with confirms, ack).  The broker connection lives in
``broker/`` (in a child process by default), the service's tables in
``store/``, membership and the leader's tasks in ``cluster/``.  This module
makes those objects, hands each its collaborators, and runs the loop that
takes gathered batches to the execute stage.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import engine
from blackboard import SqlStore
from listener_router._config import Settings, make_runner, with_schedule_listeners
from listener_router._errors import ConfigError, StoreUnavailable
from listener_router._gc import Collector, service_gc
from listener_router._rules import ListenerRules, Router
from listener_router.broker import AmqpLink, Link, ProcessLink, declare_all
from listener_router.cluster import (
    ExpiredLeases,
    ForgetDeadMembers,
    LeaderTask,
    LeaderTasks,
    Membership,
    OrphanedOutbox,
    Retention,
    TopologyEvent,
    TopologyEventType,
    TopologyListener,
    claim_node_name,
)
from listener_router.events import CommittedEvents, EventKind, Events, FailureEvents
from listener_router.jobs import JobLog, Scheduler
from listener_router.pipeline import (
    BatchObserver,
    BatchSizing,
    CommitExtension,
    CommitStage,
    ExecuteStage,
    FinishStage,
    Gathering,
    GatherStage,
    Held,
    InFlight,
    Loader,
    Meter,
    Observers,
    Placement,
    Runner,
    SettledObservers,
    SettleExtension,
    Settlement,
    Stats,
    default_sizing,
    prefetch_for,
)
from listener_router.store import RunningVersion, ServiceStore, unavailable

__all__ = ["Service"]

if TYPE_CHECKING:  # imported when used: a service without them does not load them
    from listener_router.journal import JournalPublisher
    from listener_router.watch import Watch

log = logging.getLogger(__name__)

REFRESH_EVERY = 2.0       # seconds between looks at the workflow files


def check_workflows(settings: Settings, registry: engine.WorkflowRegistry) -> None:
    """Raise :class:`ConfigError` for a listener rule whose workflow is not loaded (a service
    started with it would dead-letter every message the rule takes)."""
    where = settings.source or "the default configuration"
    for rule in settings.listeners:
        if rule.workflow in registry:
            continue
        known = ", ".join(registry.names()) or "none"
        problems = registry.file_errors(rule.workflow)
        why = ("the file(s) defining it have errors:\n  " + "\n  ".join(problems) if problems
               else f"no file in {settings.workflows_dir} defines it; known workflows: {known}")
        raise ConfigError(f"{where}: listener rule {rule.name!r} names workflow "
                          f"{rule.workflow!r}, which cannot run: {why}")


class Service:
    """One Chalk service process (see module doc).

    ``observers`` get each finished batch's report; ``extensions`` write in
    each commit transaction; ``leader_tasks`` run besides the maintenance
    while this process leads; ``topology_listeners`` hear the cluster's
    topology events; ``sizing`` replaces the default batch policy
    (``pipeline/_sizing.py``; it is an observer too).  See ``docs/internals.md``.
    """

    def __init__(self, settings: Settings, *, spark: Any = None, runner: Runner | None = None,
                 registry: engine.WorkflowRegistry | None = None,
                 observers: Iterable[BatchObserver] = (),
                 extensions: Iterable[CommitExtension] = (),
                 leader_tasks: Iterable[LeaderTask] = (),
                 topology_listeners: Iterable[TopologyListener] = (),
                 sizing: BatchSizing | None = None):
        # a schedule with a workflow and a queue of its own needs a listener rule for it
        self.settings = settings = replace(settings, listeners=with_schedule_listeners(
            settings.listeners, settings.schedules, settings.source or "settings"))
        self.stats = Stats()
        self._spark = spark
        self._runner = runner
        self._registry = registry
        self.observers = Observers(observers)
        self.extensions: list[CommitExtension] = list(extensions)
        self.leader_tasks: list[LeaderTask] = list(leader_tasks)
        self.topology_listeners: list[TopologyListener] = list(topology_listeners)
        self.events: Events | None = None
        self._sizing = sizing
        self._stopping = threading.Event()
        self._signals = 0
        self.link: Link | None = None
        self.store: ServiceStore | None = None
        self.inflight: InFlight | None = None
        self.membership: Membership | None = None
        self._runners: ThreadPoolExecutor | None = None
        self._commit: CommitStage | None = None
        self._finish: FinishStage | None = None
        self.journal: JournalPublisher | None = None   # with [[journal]] rules
        self.joblog: JobLog | None = None
        self.watch: Watch | None = None    # when [http] listen is set
        self.collector: Collector | None = None   # while run() runs

    # -- opening and closing ---------------------------------------------------------
    def open(self) -> Service:
        s = self.settings
        node = self.node = s.node or claim_node_name(s.blackboard_url)
        self.listeners = ListenerRules(s.listeners)
        router = Router(s.routers)
        registry = self.registry = self._registry or engine.WorkflowRegistry(
            s.workflows_dir, aliases=s.aliases, services=s.services)
        for problem in registry.errors:
            log.error("%s", problem)
        check_workflows(s, registry)
        store = self.store = ServiceStore(SqlStore(s.blackboard_url))
        runner: Runner = self._runner or make_runner(s, self._spark)
        self.runner = runner
        local_runner = None
        if s.local_below != 0 and not isinstance(runner, engine.LocalRunner):
            local_runner = engine.LocalRunner()
        # More than one batch may run at once (Spark jobs from several threads;
        # the in-flight registry keeps their records and messages apart).  On
        # two cores a second Spark job only competes with the first (measured:
        # same throughput, later results), so the default is one.
        self.concurrent_batches = max(1, s.concurrent_batches)
        self._runners = ThreadPoolExecutor(max_workers=self.concurrent_batches,
                                           thread_name_prefix="chalk-run")
        warm_up = getattr(runner, "warm_up", None)
        if warm_up is not None:
            log.info("Spark workers warmed up in %.1f s", warm_up())
        lease = s.lease_seconds
        self.inflight = InFlight(functools.partial(store.renew_leases, owner=node,
                                                   lease_seconds=lease), lease / 3).start()
        sizing = self.sizing = self._sizing or default_sizing(s.listeners)
        self.observers.add(sizing)
        link_class = ProcessLink if s.broker_process else AmqpLink
        link = self.link = link_class(s.broker_url, prefetch=prefetch_for(s.listeners),
                                      consume=self.listeners.consumers(),
                                      prepare=functools.partial(declare_all, settings=s)).start()
        deliveries = link.deliveries
        self.gathering = Gathering(sizing, lambda: link.waiting + deliveries.qsize())
        if s.journals:
            from listener_router.journal import publisher_for
            journal = self.journal = publisher_for(s, store, node)
            if journal is not None:
                self.extensions.append(journal.writer)
                journal.start(link)
        events = self.events = Events(s.events, node)
        extensions = list(self.extensions)
        if events.enabled(EventKind.COMMITTED):
            extensions.append(CommittedEvents(events))
        settle: list[SettleExtension] = []
        if events.enabled(EventKind.INVALIDATED) or events.enabled(EventKind.DEAD_LETTERED):
            settle.append(FailureEvents(events))

        meter, held = Meter(self.stats), Held()
        loader = Loader(store, meter)
        settled = SettledObservers()
        if s.job_log:
            joblog = self.joblog = JobLog(store, node, interval=s.stats_interval)
            extensions.append(joblog)
            settled.add(joblog)
            self.observers.add(joblog)
        finish = self._finish = FinishStage(link=link, settings=s, store=store, held=held,
                                            meter=meter, stats=self.stats,
                                            observers=self.observers, extensions=settle,
                                            writer=node, settled=settled)
        self.membership = Membership(
            store, node, interval=s.heartbeat_seconds, ttl=s.ttl_seconds,
            properties={"version": _version(), "queues": list(self.listeners.queues),
                        "workflows": registry.names()},
            listeners=[*self.topology_listeners, _WakeHeld(held)],
            publish=finish.publish_orphans, events=events).start()
        self._published_versions: tuple[Any, ...] | None = None
        self.publish_versions()
        settlement = Settlement(loader=loader, inflight=self.inflight, held=held, finish=finish,
                                meter=meter)
        commit = self._commit = CommitStage(router=router, store=store, loader=loader,
                                            settlement=settlement, meter=meter,
                                            extensions=extensions)
        self._execute = ExecuteStage(registry=registry, runner=runner, local_runner=local_runner,
                                     placement=Placement(sizing, s.local_below),
                                     batch_timeout=s.batch_timeout,
                                     loader=loader, commit=commit, settlement=settlement,
                                     meter=meter)
        self._gather = GatherStage(link=link, listeners=self.listeners, registry=registry,
                                   store=store, loader=loader, inflight=self.inflight, held=held,
                                   gathering=self.gathering, finish=finish,
                                   settlement=settlement, meter=meter, owner=node,
                                   lease_seconds=lease, stopping=self._stopping)
        self.leader = LeaderTasks(self.membership, [
            ExpiredLeases(store), OrphanedOutbox(store, finish.publish_orphans),
            Retention(store, s.retention_days), ForgetDeadMembers(self.membership),
            *self.leader_tasks])
        if s.schedules:
            self.leader.add(Scheduler(store, s.schedules, self.membership, finish.publish_orphans,
                                      member=node, events=events))
        self._last_refresh = time.monotonic()
        if s.http_listen:  # metrics and the dashboard (their imports only when asked for)
            from listener_router.watch import Watch
            self.watch = Watch(self).start()
        log.info("service %s up: queues %s, workflows %s", node,
                 ", ".join(self.listeners.queues), ", ".join(registry.names()))
        return self

    def close(self) -> None:
        try:
            self.drain()
        finally:
            if self.watch is not None:
                try:
                    self.watch.stop()
                except Exception:  # never keeps the rest from closing
                    log.exception("stopping the metrics and dashboard failed")
            if self._runners is not None:
                self._runners.shutdown(wait=True)
            if self.membership is not None:
                # Before the lanes close: until its heartbeat stops, this process may
                # take over leadership and hand the view's event to the finish lane.
                self.membership.stop()
            for stage in (self._commit, self._finish):
                if stage is not None:
                    stage.lane.close()
            if self.joblog is not None:
                self.joblog.close()
            if self.inflight is not None:
                self.inflight.stop()
            if self.journal is not None:
                self.journal.stop()  # what was committed goes out first
        if self.link is not None:
            self.link.stop()
        if self.store is not None:
            if getattr(self, "_published_versions", None) is not None:
                with contextlib.suppress(Exception):  # a stopped process's rows are ignored anyway
                    self.store.workflow_versions.forget(self.node)
            self.store.close()

    def __enter__(self) -> Service:
        return self.open()

    def __exit__(self, *exc: object) -> None:
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
        with service_gc():
            return self._run(until, idle_exit)

    def _run(self, until: Callable[[Stats], bool] | None, idle_exit: float | None) -> Stats:
        runners = self._runners
        assert runners is not None, "open() the service first"
        self._gather.start()
        running: list[Future[None]] = []
        stats = self.stats
        collector = self.collector = Collector()
        try:
            while not self._stopping.is_set():
                collector.tick()
                for future in [f for f in running if f.done()]:
                    running.remove(future)
                    future.result()  # a runner that cannot go on (RunnerUnusable) stops us
                if len(running) < self.concurrent_batches:
                    waited = time.perf_counter()
                    batch = self.gathering.take(0.2)
                    if batch is not None:
                        seconds = time.perf_counter() - waited
                        stats.add("wait_ms", int(seconds * 1000))
                        batch.report.add_seconds("wait", seconds)
                        running.append(runners.submit(self._execute.execute, batch))
                        stats.last_activity = time.monotonic()
                else:
                    wait(running, timeout=0.2, return_when=FIRST_COMPLETED)
                    stats.last_activity = time.monotonic()
                if until is not None and until(stats):
                    break
                if idle_exit is not None and not running and \
                        time.monotonic() - stats.last_activity > idle_exit:
                    break
                if time.monotonic() - self._last_refresh > REFRESH_EVERY:
                    self._last_refresh = time.monotonic()
                    for problem in self.registry.refresh():
                        log.error("%s", problem)
                    self.publish_versions()
                    if self.membership is not None:
                        self.membership.advertise(workflows=self.registry.names())
                self.leader.tick()
        finally:
            try:
                for future in running:  # the batches being run are finished
                    future.result()
            finally:
                self._gather.stop()
                self.drain()
        return stats

    def publish_versions(self) -> None:
        """Write the workflow versions this process runs to the store when they changed
        (``chalk status`` shows them); a failure is logged and tried again next time."""
        assert self.store is not None
        versions = tuple(self.registry.versions())
        if versions == self._published_versions:
            return
        try:
            with self.store.writes, unavailable():
                self.store.workflow_versions.publish(self.node, [
                    RunningVersion(self.node, v.name, v.version, v.path, v.loaded_at)
                    for v in versions])
            self._published_versions = versions
        except StoreUnavailable as e:
            log.warning("could not record the running workflow versions: %s", e)

    def maintain(self) -> dict[str, int]:
        """Run every leader task now (leader or not): what each did, by name."""
        return self.leader.run_all()

    def drain(self) -> None:
        """Wait until every batch handed on is committed, published and acked."""
        for stage in (self._commit, self._finish):
            if stage is not None:
                stage.lane.drain()


class _WakeHeld(TopologyListener):
    """When members left the view, their leases were released with it: messages held
    for records those members had locked are gathered again at once."""

    def __init__(self, held: Held):
        self.held = held

    def handle_topology_event(self, event: TopologyEvent) -> None:
        if event.type is TopologyEventType.TOPOLOGY_CHANGED and event.old_view and event.new_view:
            before = {(m.name, m.joined_at) for m in event.old_view.members}
            if before - {(m.name, m.joined_at) for m in event.new_view.members}:
                self.held.wake()


def _version() -> str:
    try:
        return importlib.metadata.version("chalk")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
