"""The service: its parts in start order, the plug-ins, the loop, signals.

One message's way: ``pipeline/_gather.py`` (parse, inbox, load) →
``pipeline/_execute.py`` (the workflow) → ``pipeline/_commit.py`` (route;
records + inbox + outbox in one transaction) → ``pipeline/_finish.py``
(publish with confirms, ack).  The broker connection lives in ``broker/``
(in a child process by default), the core's tables in ``store/``,
membership and the leader's tasks in ``cluster/``.  Features are plug-ins
(``_plugin``), found through their entry points and built when their
settings turn them on; this module knows none of them.

Start order is data (:meth:`Service._parts`), each part with the reason of
its place; :meth:`Service.close` stops the started parts in reverse order,
and a part whose stop fails is logged while the rest still stop.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, cast

import engine
from blackboard import SqlStore
from listener_router import pipeline
from listener_router._entry_points import plugin_classes
from listener_router._gc import Collector, service_gc
from listener_router._given import GivenSeams, HookListener
from listener_router._live import LiveView
from listener_router._plugin import Host, Plugin, hooked, ordered
from listener_router._rules import ListenerRules, Router
from listener_router._runners import close_runner, make_runner
from listener_router._settings import Settings, configured
from listener_router._signing import HeaderSigner
from listener_router._workflows import PublishedVersions, check_workflows
from listener_router.broker import (
    AmqpLink,
    DeliveriesByQueue,
    Link,
    ProcessLink,
    declare_all,
    plugin_exchanges,
)
from listener_router.cluster import (
    ExpiredLeases,
    ForgetDeadMembers,
    LeaderTask,
    LeaderTasks,
    Membership,
    OrphanedOutbox,
    Retention,
    TopologyListener,
    claim_node_name,
)
from listener_router.pipeline import (
    Batch,
    BatchObserver,
    BatchSizing,
    CommitExtension,
    Runner,
    Stats,
)
from listener_router.store import ServiceStore, unavailable

__all__ = ["Service", "check_workflows"]

_ = check_workflows  # re-exported: it was here

log = logging.getLogger(__name__)

REFRESH_EVERY = 2.0       # seconds between looks at the workflow files
STOP_GRACE = 60.0         # seconds a stopping service waits for its running batches, at most


@dataclass(frozen=True)
class _Part:
    """A piece of the running service: started in order, stopped in reverse."""

    name: str
    start: Callable[[], object]
    stop: Callable[[], object] | None = None


class Service:
    """One Chalk service process (see module doc).

    ``plugins`` are added to those the settings turn on.  ``observers``,
    ``extensions``, ``leader_tasks`` and ``topology_listeners`` are the
    seams of earlier versions (a plug-in's ``batch_finished``, ``in_commit``,
    ``leader_tasks`` and ``topology_event`` hooks); ``sizing`` replaces the
    default batch policy (``pipeline/_sizing.py``).  See ``docs/internals.md``.
    """

    def __init__(self, settings: Settings, *, spark: Any = None, runner: Runner | None = None,
                 registry: engine.WorkflowRegistry | None = None,
                 plugins: Iterable[Plugin] = (),
                 observers: Iterable[BatchObserver] = (),
                 extensions: Iterable[CommitExtension] = (),
                 leader_tasks: Iterable[LeaderTask] = (),
                 topology_listeners: Iterable[TopologyListener] = (),
                 sizing: BatchSizing | None = None):
        self.settings = settings = configured(settings)
        self.stats = Stats()
        self._spark = spark
        self._runner = runner
        self._registry = registry
        given = GivenSeams(list(observers), list(extensions), list(leader_tasks),
                       list(topology_listeners))
        self._given_plugins = [*([given] if given.any() else []), *plugins]
        self.plugins: list[Plugin] = []
        self.observers = pipeline.Observers()
        self._sizing = sizing
        self._stopping = threading.Event()
        self._signals = 0
        self._started: list[_Part] = []
        self.link: Link | None = None
        self.store: ServiceStore | None = None
        self.signer: HeaderSigner | None = None
        self.inflight: pipeline.InFlight | None = None
        self.membership: Membership | None = None
        self.abandoned = 0                 # batches left running when run() returned
        self.flow: pipeline.FlowWatch | None = None
        self._commit: pipeline.CommitStage | None = None
        self._finish: pipeline.FinishStage | None = None
        self._versions = PublishedVersions()
        self.collector: Collector | None = None   # while run() runs

    # -- the parts, in start order ---------------------------------------------------------
    def _parts(self) -> Iterator[_Part]:
        """What :meth:`open` starts, in order; :meth:`close` stops them in reverse."""
        yield _Part("store", self._open_store, self._close_store)
        yield _Part("plug-ins built", self._build_plugins)   # and their tables made
        yield _Part("workflows", self._load_workflows)
        yield _Part("runner", self._open_runner, self._close_runner)
        yield _Part("in-flight leases", self._open_inflight,
                    lambda: self.inflight.stop() if self.inflight else None)
        yield _Part("broker link", self._open_link,
                    lambda: self.link.stop() if self.link else None)
        yield _Part("finish stage", self._open_finish,
                    lambda: self._finish.input.close() if self._finish else None)
        yield _Part("commit stage", self._open_commit,
                    lambda: self._commit.input.close() if self._commit else None)
        yield _Part("workflow versions", self.publish_versions, self._forget_versions)
        yield _Part("plug-ins installed", self._install_plugins)
        # After the stages, so that it stops before them: until its heartbeat stops this
        # process may take over leadership and hand the view's event to the finish stage.
        yield _Part("membership", self._start_membership,
                    lambda: self.membership.stop() if self.membership else None)
        yield _Part("flow control", self._watch_flow,
                    lambda: self.flow.stop() if self.flow else None)
        for plugin in self.plugins:  # built above, in ``requires`` order
            yield _Part(f"plug-in {plugin.name}", plugin.start, plugin.stop)

    def open(self) -> Service:
        """Start every part in order; on a failure, stop what started and raise."""
        self._started = []
        try:
            for part in self._parts():
                part.start()
                self._started.append(part)
        except BaseException:
            self._stop_parts()
            raise
        log.info("service %s up: queues %s, workflows %s, plug-ins %s", self.node,
                 ", ".join(self.listeners.queues), ", ".join(self.registry.names()),
                 ", ".join(p.name for p in self.plugins) or "none")
        return self

    def close(self) -> None:
        try:
            self.drain()
        finally:
            self._stop_parts()

    def _stop_parts(self) -> None:
        while self._started:
            part = self._started.pop()
            if part.stop is None:
                continue
            try:
                part.stop()
            except Exception:  # one failing part never keeps the rest from stopping
                log.exception("stopping %s failed", part.name)

    def __enter__(self) -> Service:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def plugin(self, name: str) -> Plugin | None:
        """The built plug-in of that name, or None."""
        return next((p for p in self.plugins if p.name == name), None)

    # -- each part -------------------------------------------------------------------------
    def _open_store(self) -> None:
        s = self.settings
        self.node = s.node or claim_node_name(s.blackboard_url)
        self.store = ServiceStore(SqlStore(s.blackboard_url))
        self.signer = HeaderSigner.of(self.store)   # the cluster's: x-chalk-* headers

    def _close_store(self) -> None:
        if self.store is not None:
            self.store.close()

    def _build_plugins(self) -> None:
        s = self.settings
        classes = cast("tuple[type[Plugin], ...]", plugin_classes())
        built = [p for cls in classes if (p := cls.build(s)) is not None]
        self.plugins = ordered([*self._given_plugins, *built])
        assert self.store is not None
        for plugin in self.plugins:
            for schema in plugin.tables():
                with unavailable():
                    schema.create(self.store.engine)

    def _load_workflows(self) -> None:
        s = self.settings
        self.listeners = ListenerRules(s.listeners)
        registry = self.registry = self._registry or engine.WorkflowRegistry(
            s.workflows_dir, aliases=s.aliases, services=s.services)
        for problem in registry.errors:
            log.error("%s", problem)
        check_workflows(s, registry)

    def _open_runner(self) -> None:
        s = self.settings
        runner: Runner = self._runner or make_runner(s, self._spark)
        self.runner = runner
        # Small batches run on the service's own workers (a Spark runner's fallback home):
        # not where the main runner is those workers already, nor where they are turned off.
        self.local_runner = None
        service = getattr(runner, "service", None)
        if s.local_below != 0 and isinstance(service, engine.ProcessRunner):
            self.local_runner = service
        warm_up = getattr(runner, "warm_up", None)
        if warm_up is not None:
            log.info("Spark workers warmed up in %.1f s", warm_up())

    def _close_runner(self) -> None:
        """The service's own workers stop (Spark's warm workers are the SparkContext's)."""
        if self._runner is None:
            close_runner(self.runner)

    def _open_inflight(self) -> None:
        assert self.store is not None
        lease = self.settings.lease_seconds
        self.inflight = pipeline.InFlight(functools.partial(self.store.renew_leases, owner=self.node,
                                                   lease_seconds=lease), lease / 3).start()

    def _open_link(self) -> None:
        s = self.settings
        assert self.store is not None
        queues = self.listeners.queues
        self.held = pipeline.Holds(queues)
        deliveries = DeliveriesByQueue(queues)
        outputs = {q: pipeline.lane_outputs(s, self.listeners.for_queue(q)) for q in queues}
        with unavailable():  # a paused lane's queue is not consumed from the start
            paused = self.store.lanes.paused() & set(queues)
        link_class = ProcessLink if s.broker_process else AmqpLink
        link = self.link = link_class(
            s.broker_url, prefetch=pipeline.prefetch_by_queue(s.listeners),
            consume=self.listeners.consumers(),
            prepare=functools.partial(declare_all, settings=s, exchanges=plugin_exchanges(s)),
            deliveries=deliveries, paused=paused,
            depth_of=[o for q in queues for o in outputs[q]
                      if self.listeners.for_queue(q)[0].max_output_depth],
            max_inflight_bytes={q: self.listeners.for_queue(q)[0].max_inflight_bytes
                                for q in queues}).start()
        self.lanes = [pipeline.make_lane(queue, self.listeners.for_queue(queue),
                                deliveries.by_queue[queue], self.held.of(queue), link,
                                sizing=self._sizing, local_below=s.local_below,
                                observers=self.observers, outputs=outputs[queue])
                      for queue in queues]
        for lane in self.lanes:
            lane.paused = lane.queue in paused
        self.cancelled = pipeline.Cancelled()

    def _open_finish(self) -> None:
        assert self.store is not None and self.link is not None
        if self._sizing is not None:
            self.observers.add(self._sizing)
        for hook in hooked(self.plugins, "batch_finished"):
            self.observers.add(hook)
        self.meter = pipeline.Meter(self.stats)
        self.loader = pipeline.Loader(self.store, self.meter)
        self._finish = pipeline.FinishStage(
            link=self.link, settings=self.settings, store=self.store, held=self.held,
            meter=self.meter, stats=self.stats, observers=self.observers,
            settle_messages=hooked(self.plugins, "settle_messages"), writer=self.node,
            settled=hooked(self.plugins, "settled"), signer=self.signer)

    def _open_commit(self) -> None:
        s = self.settings
        assert self.store is not None and self.inflight is not None and self._finish is not None
        orders = {lane.queue: pipeline.Ordered(lane.queue, rule.ordered_by, self.store, self.inflight)
                  for lane in self.lanes if (rule := lane.rules[0]).ordered_by}
        settlement = pipeline.Settlement(loader=self.loader, inflight=self.inflight, held=self.held,
                                finish=self._finish, meter=self.meter, orders=orders)
        commit = self._commit = pipeline.CommitStage(router=Router(s.routers), store=self.store,
                                            loader=self.loader, settlement=settlement,
                                            meter=self.meter,
                                            in_commit=hooked(self.plugins, "in_commit"),
                                            orders=orders, cancelled=self.cancelled)
        screens = hooked(self.plugins, "screen")
        screening = pipeline.Screening(screens, commit=commit, loader=self.loader,
                                       meter=self.meter) if screens else None
        self._execute = pipeline.ExecuteStage(registry=self.registry, runner=self.runner,
                                     local_runner=self.local_runner, placement=None,
                                     batch_timeout=s.batch_timeout, loader=self.loader,
                                     commit=commit, settlement=settlement, meter=self.meter,
                                     cancelled=self.cancelled)
        for lane in self.lanes:
            lane.gather = pipeline.GatherStage(
                link=self.link, deliveries=lane.deliveries,  # type: ignore[arg-type]
                listeners=self.listeners, registry=self.registry, store=self.store,
                loader=self.loader, inflight=self.inflight, held=lane.held,
                gathering=lane.gathering, finish=self._finish, settlement=settlement,
                meter=self.meter, owner=self.node, lease_seconds=s.lease_seconds,
                stopping=self._stopping, name=f"chalk-gather-{lane.queue}",
                cancelled=self.cancelled, ordered=orders.get(lane.queue), screening=screening,
                signer=self.signer)
            lane.gather.set_paused(lane.paused)
        self.dispatcher = pipeline.Dispatcher(self.lanes, self._run_batch, slots=s.concurrent_batches)
        assert self.store is not None
        self.membership = Membership(
            self.store, self.node, interval=s.heartbeat_seconds, ttl=s.ttl_seconds,
            properties={"version": _version(), "queues": list(self.listeners.queues),
                        "workflows": self.registry.names()},
            listeners=[pipeline.WakeHeld(self.held),
                       *(HookListener(h) for h in hooked(self.plugins, "topology_event"))],
            publish=self._finish.publish_orphans,
            on_view=hooked(self.plugins, "view_established"))

    def _install_plugins(self) -> None:
        assert self.store is not None and self.link is not None
        assert self.membership is not None and self._finish is not None
        inflight, lanes = self.inflight, self.lanes
        self.live = LiveView(
            node=self.node, settings=self.settings, started=time.time(), stats=self.stats,
            store=self.store, registry=self.registry, membership=self.membership,
            batch_size=lambda: max(lane.sizing.size for lane in lanes),
            in_flight=lambda: len(inflight) if inflight is not None else 0,
            snapshot=self.snapshot, lanes=lambda: [lane.view() for lane in lanes])
        host = Host(settings=self.settings, node=self.node, store=self.store, link=self.link,
                    registry=self.registry, membership=self.membership, stats=self.stats,
                    live=self.live, publish=self._finish.publish_orphans,
                    plugins={p.name: p for p in self.plugins})
        for plugin in self.plugins:
            plugin.install(host)
        s, store = self.settings, self.store
        self.leader = LeaderTasks(self.membership, [
            ExpiredLeases(store), OrphanedOutbox(store, self._finish.publish_orphans),
            Retention(store, s.retention_days), ForgetDeadMembers(self.membership),
            *(task for plugin in self.plugins for task in plugin.leader_tasks())])
        self._last_refresh = time.monotonic()

    def _start_membership(self) -> None:
        assert self.membership is not None
        self.membership.start()

    def _watch_flow(self) -> None:
        """What operators set on the lanes (paused, cancelled, rates), read now and then
        every second (``pipeline/_flow.py``)."""
        assert self.store is not None
        self.flow = pipeline.FlowWatch(self.store, self.lanes, self.cancelled, lambda: self.membership,
                              self.dispatcher.wake).start()

    def _forget_versions(self) -> None:
        if self.store is not None:
            self._versions.forget(self.store, self.node)

    # -- what plug-ins read ----------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """Every plug-in's ``snapshot`` merged (a failing one is logged and left out)."""
        merged: dict[str, Any] = {}
        for hook in hooked(self.plugins, "snapshot"):
            try:
                merged.update(hook())
            except Exception:
                log.exception("snapshot of plug-in %s failed", getattr(hook, "__self__", hook))
        return merged

    # -- the loop ------------------------------------------------------------------------
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

        The batches being run are finished (committed, published, acked)
        within :attr:`stop_grace` seconds — one that runs on past it (a
        pipelet that hangs in this process) is abandoned, its messages
        delivered again; the ones gathered behind them are let go unacked
        (their records released), to be delivered again.
        """
        with service_gc():
            return self._run(until, idle_exit)

    def _run(self, until: Callable[[Stats], bool] | None, idle_exit: float | None) -> Stats:
        dispatcher = self.dispatcher
        for lane in self.lanes:
            assert lane.gather is not None, "open() the service first"
            lane.gather.start()
        self.leader.start()
        stats = self.stats
        collector = self.collector = Collector()
        try:
            while not self._stopping.is_set():
                collector.tick()
                dispatcher.collect()  # a runner that cannot go on (RunnerUnusable) stops us
                if dispatcher.step() or dispatcher.running():
                    stats.last_activity = time.monotonic()
                if until is not None and until(stats):
                    break
                if idle_exit is not None and not dispatcher.running() and \
                        time.monotonic() - stats.last_activity > idle_exit:
                    break
                if time.monotonic() - self._last_refresh > REFRESH_EVERY:
                    self._refresh()
        finally:
            try:
                self.leader.stop()
                left = dispatcher.finish(self.stop_grace)
                if left:
                    log.warning("%d batch(es) still running after %.0f s (a pipelet that "
                                "hangs?): abandoned; their messages are delivered again",
                                len(left), self.stop_grace)
                    self.abandoned = len(left)
            finally:
                for lane in self.lanes:
                    if lane.gather is not None:
                        lane.gather.stop()
                self.drain()
        return stats

    def _refresh(self) -> None:
        """Reload changed workflow files, and say so to the store and the cluster."""
        self._last_refresh = time.monotonic()
        for problem in self.registry.refresh():
            log.error("%s", problem)
        self.publish_versions()
        if self.membership is not None:
            self.membership.advertise(workflows=self.registry.names())

    def _run_batch(self, batch: Batch, lane: pipeline.Lane) -> None:
        self._execute.execute(batch, lane.placement, priority=lane.priority,
                              outranked=self.dispatcher.outranked(lane))

    def publish_versions(self) -> None:
        """Write the workflow versions this process runs to the store when they changed
        (``chalk status`` shows them); a failure is logged and tried again next time."""
        assert self.store is not None
        self._versions.publish(self.store, self.node, self.registry)

    def maintain(self) -> dict[str, int]:
        """Run every leader task now (leader or not): what each did, by name."""
        return self.leader.run_all()

    @property
    def stop_grace(self) -> float:
        """Seconds a stopping service waits for the batches running: a batch past its
        ``batch_timeout`` is being isolated or hangs in this process."""
        return min(self.settings.batch_timeout, STOP_GRACE)

    def drain(self) -> None:
        """Wait until every batch handed on is committed, published and acked."""
        for stage in (self._commit, self._finish):
            if stage is not None:
                stage.input.drain()


def _version() -> str:
    try:
        return importlib.metadata.version("chalk")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"

