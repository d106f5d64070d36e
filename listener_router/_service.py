"""The service: consume → load → run workflow → commit (+inbox, +outbox) → publish → ack.

See ``_states`` for the life of one message.  One batch is processed at a
time on the calling thread; the broker connection lives on its own thread
(``_amqp``), so a long Spark job never starves the connection's heartbeats.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import queue
import signal
import socket
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pika
import pika.exceptions
from sqlalchemy.exc import InterfaceError, OperationalError, SQLAlchemyError
from sqlalchemy.exc import TimeoutError as SqlTimeoutError

import engine
from blackboard import (
    Blackboard,
    BlackboardError,
    RecordLockedError,
    StaleRecordError,
    StorageError,
)
from listener_router._amqp import (
    AmqpLink,
    BrokerUnavailable,
    Delivery,
    OutMessage,
    connection_parameters,
)
from listener_router._cluster import Membership
from listener_router._config import ListenerRule, Settings
from listener_router._messages import (
    ATTEMPTS_HEADER,
    ERROR_HEADER,
    QUEUE_HEADER,
    WORKFLOW_HEADER,
    BadMessage,
    Incoming,
    derive_message_id,
    parse_message,
)
from listener_router._outbox import Outbox
from listener_router._rules import ListenerRules, Router
from listener_router._states import State, check_transition
from listener_router._topology import declare_all, declare_outputs, dlq_name, retry_name

__all__ = ["Service", "Stats", "RunnerUnusable", "claim_node_name"]

log = logging.getLogger(__name__)

CONFIRM_TIMEOUT = 60.0
REFRESH_EVERY = 2.0
MAINTAIN_EVERY = 30.0     # leader maintenance period, seconds
ORPHAN_AGE = 120.0        # an unsent outbox row this old has lost its input's redelivery


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


@dataclass
class _Work:
    delivery: Delivery
    state: State = State.RECEIVED
    message: Incoming | None = None
    rule: ListenerRule | None = None
    error: str | None = None
    workflow: str | None = None
    outgoing: list[OutMessage] = field(default_factory=list)

    def to(self, state: State, error: str | None = None) -> None:
        self.state = check_transition(self.state, state)
        if error is not None:
            self.error = error


class RunnerUnusable(RuntimeError):
    """The workflow runner cannot run anything any more (e.g. the SparkContext died)."""


def _is_outage(error: BaseException) -> bool:
    """A failure of the infrastructure (retry later), not of the data (isolate)."""
    if isinstance(error, (StaleRecordError, RecordLockedError)):
        return True
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, (OperationalError, InterfaceError, SqlTimeoutError, OSError)):
            return True
        cause = cause.__cause__ or cause.__context__
    return isinstance(error, StorageError) and error.__cause__ is None


_held_locks: list[Any] = []


def claim_node_name(blackboard_url: str) -> str:
    """A node name stable across restarts on this host and unique among live processes.

    Slot N is claimed with an exclusive ``flock`` that the kernel drops when
    the process dies, so a service restarted after ``kill -9`` takes the same
    name again and can take over its own unexpired leases at once, while two
    live services on one host never share a name.
    """
    digest = hashlib.sha256(blackboard_url.encode()).hexdigest()[:12]
    folder = os.path.join(tempfile.gettempdir(), "chalk-nodes")
    os.makedirs(folder, exist_ok=True)
    for slot in range(1024):
        handle = open(os.path.join(folder, f"{digest}-{slot}.lock"), "a+")  # noqa: SIM115
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            continue
        _held_locks.append(handle)
        return f"{socket.gethostname()}/{slot}"
    raise RuntimeError("no free node slot (1024 services on this host?)")


class Service:
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
        self.link: AmqpLink | None = None
        self.bb: Blackboard | None = None
        self._held: list[Delivery] = []
        self._held_lock = threading.Lock()
        self._backoff = 0.0
        self._finisher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="chalk-finish")
        self._finishing: list[Future[None]] = []

    # -- opening and closing ---------------------------------------------------------
    def open(self) -> Service:
        s = self.settings
        self.node = s.node or claim_node_name(s.blackboard_url)
        self.listeners = ListenerRules(s.listeners)
        self.router = Router(s.routers)
        self.bb = Blackboard.connect(s.blackboard_url, owner=self.node,
                                     lease_seconds=s.lease_seconds)
        assert self.bb.store is not None
        self.outbox = Outbox(self.bb.store.engine)
        self.registry = self._registry or engine.WorkflowRegistry(s.workflows_dir,
                                                                  aliases=s.aliases)
        for problem in self.registry.errors:
            log.error("%s", problem)
        if self._runner is None:
            if s.runner == "local":
                self._runner = engine.LocalRunner()
            else:
                spark = self._spark or engine.spark_session(s.spark_master, s.spark_conf)
                self._runner = engine.SparkRunner(spark, batch_timeout=s.batch_timeout,
                                                  isolation_budget=s.isolation_budget)
        self.runner = self._runner
        if hasattr(self.runner, "warm_up"):
            log.info("Spark workers warmed up in %.1f s", self.runner.warm_up())
        prefetch = max(rule.prefetch for rule in s.listeners)
        self.link = AmqpLink(s.broker_url, prefetch=prefetch, consume=self.listeners.consumers(),
                             prepare=lambda conn: declare_all(conn, s)).start()
        self.membership = Membership(self.bb.store.engine, self.node).start()
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
            self._finisher.shutdown(wait=True)
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
        """Process batches until stopped, ``until(stats)`` is true, or idle for ``idle_exit`` s."""
        assert self.link is not None
        while not self._stopping.is_set():
            batch = self._gather()
            if batch:
                self.process(batch)
                self.stats.last_activity = time.monotonic()
            if until is not None and until(self.stats):
                break
            if idle_exit is not None and time.monotonic() - self.stats.last_activity > idle_exit:
                break
            if time.monotonic() - self._last_refresh > REFRESH_EVERY:
                self._last_refresh = time.monotonic()
                for problem in self.registry.refresh():
                    log.error("%s", problem)
            if time.monotonic() - self._last_maintenance > MAINTAIN_EVERY:
                self._last_maintenance = time.monotonic()
                if self.membership.is_leader:
                    self.maintain()
        self.drain()
        return self.stats

    def maintain(self) -> dict[str, int]:
        """Leader maintenance: expired leases, orphaned outbox rows, retention."""
        assert self.bb is not None and self.bb.store is not None
        done: dict[str, int] = {}
        try:
            done["expired_leases"] = self.bb.store.purge_expired_leases()
            orphans = self.outbox.unsent(older_than=time.time() - ORPHAN_AGE)
            done["orphans"] = len(orphans)
            if orphans:
                log.warning("publishing %d orphaned outbox message(s)", len(orphans))
                self._submit(lambda: self._publish_orphans(orphans))
            done["retention"] = self.outbox.purge(self.settings.retention_days * 86400.0)
            done["forgotten_members"] = self.membership.forget_dead()
        except (StorageError, SQLAlchemyError) as e:
            log.warning("maintenance failed, trying again later: %s", e)
        return done

    def _publish_orphans(self, orphans: list[OutMessage]) -> None:
        assert self.link is not None
        try:
            self._declare_targets(orphans)
            self.link.publish(orphans).result(timeout=CONFIRM_TIMEOUT)
            self.outbox.mark_sent([m.message_id for m in orphans])
        except Exception as e:  # the next maintenance round tries again
            log.warning("publishing orphaned outbox rows failed: %s", e)

    def _gather(self) -> list[Delivery]:
        """Held deliveries first, then fresh ones, up to the batch size or the wait."""
        assert self.link is not None
        size = max(rule.batch_size for rule in self.settings.listeners)
        wait = max(rule.max_wait_ms for rule in self.settings.listeners) / 1000.0
        batch: list[Delivery] = []
        if self._held:
            if self._stopping.wait(self._backoff):
                return []
            with self._held_lock:
                held, self._held = self._held, []
            if not self.link.ready.is_set():
                # The connection is gone: its deliveries come back on the new one.
                return []
            batch = [d for d in held if d.generation == self.link.generation][:size]
            with self._held_lock:
                self._held[:0] = [d for d in held if d.generation == self.link.generation][size:]
        if not batch:
            try:
                batch = [self.link.deliveries.get(timeout=0.2)]
            except queue.Empty:
                return []
        deadline = time.monotonic() + wait
        while len(batch) < size:
            remaining = deadline - time.monotonic()
            try:
                batch.append(self.link.deliveries.get(timeout=max(remaining, 0))
                             if remaining > 0 else self.link.deliveries.get_nowait())
            except queue.Empty:
                break
        return batch

    # -- one batch -----------------------------------------------------------------
    def process(self, deliveries: Sequence[Delivery]) -> None:
        assert self.link is not None
        t_batch = time.perf_counter()
        generation = self.link.generation
        works = [self._receive(d) for d in deliveries if d.generation == generation]
        self.stats.add("received", len(works))
        live = [w for w in works if w.state is State.RECEIVED]
        self._check_inbox(live)
        groups: dict[str, list[_Work]] = {}
        taken: set[str] = set()
        for w in live:
            if w.state is not State.RECEIVED:
                continue
            assert w.message is not None and w.rule is not None
            ids = set(w.message.record_ids)
            if ids & taken:  # the same record twice in one batch: next batch
                w.to(State.DEFERRED, "record also in an earlier message of this batch")
                continue
            taken |= ids
            w.to(State.PROCESSING)
            w.workflow = w.rule.workflow
            groups.setdefault(w.rule.workflow, []).append(w)
        for name, group in groups.items():
            self._run_group(name, group)
        outcome = Counter(w.state.value for w in works)
        self._finish(works)
        log.info("batch of %d message(s) in %.2f s: %s", len(works), time.perf_counter() - t_batch,
                 ", ".join(f"{n} {state}" for state, n in sorted(outcome.items())))
        self.stats.add("batch_ms", int((time.perf_counter() - t_batch) * 1000))

    def _receive(self, d: Delivery) -> _Work:
        w = _Work(d)
        rules = self.listeners.for_queue(d.queue)
        limits = rules[0] if rules else ListenerRule(name="none")
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

    def _check_inbox(self, live: list[_Work]) -> None:
        by_queue: dict[str, list[str]] = {}
        for w in live:
            if w.message is not None:
                by_queue.setdefault(w.message.queue, []).append(w.message.message_id)
        if not by_queue:
            return
        try:
            seen = {(q, mid) for q, ids in by_queue.items() for mid in self.outbox.seen(q, ids)}
            unsent = self.outbox.unsent(sorted({mid for _q, mid in seen})) if seen else []
        except (StorageError, SQLAlchemyError) as e:
            log.warning("inbox check failed, holding %d message(s): %s", len(live), e)
            for w in live:
                w.to(State.DEFERRED, str(e))
            return
        by_source: dict[str, list[OutMessage]] = {}
        for m in unsent:
            by_source.setdefault(str(m.headers.get("x-chalk-source")), []).append(m)
        first: set[tuple[str, str]] = set()
        for w in live:
            assert w.message is not None
            key = (w.message.queue, w.message.message_id)
            if key in seen:
                w.to(State.DUPLICATE)
                w.outgoing = by_source.pop(w.message.message_id, [])
            elif key in first:
                w.to(State.DEFERRED, "message delivered twice in one batch")
            else:
                first.add(key)

    @contextmanager
    def _leases_kept(self, ids: list[str]) -> Iterator[None]:
        """Renew the leases of ``ids`` while a long workflow runs."""
        assert self.bb is not None and self.bb.store is not None
        store, owner, lease = self.bb.store, self.bb.owner, self.bb.lease_seconds
        done = threading.Event()

        def keep() -> None:
            while not done.wait(lease / 3):
                try:
                    store.renew(ids, owner, lease)
                except StorageError as e:
                    log.warning("lease renewal failed: %s", e)
        thread = threading.Thread(target=keep, name="chalk-leases", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()

    def _run_group(self, name: str, group: list[_Work]) -> None:
        """Load, run, route and commit one workflow's messages of a batch.

        A failure that is not an outage (the runner raising on the driver, a
        commit refused for the data, a router condition that cannot be
        evaluated) is isolated by halving the group until the message that
        causes it stands alone; that one fails (retry, then dead letter) and
        the others go on.  An outage (database gone, lease lost) defers the
        group: held unacked and tried again.
        """
        assert self.bb is not None
        bb = self.bb
        workflow = self.registry.get(name)
        t_load = time.perf_counter()
        group = self._load(group)
        self.stats.add("load_ms", int((time.perf_counter() - t_load) * 1000))
        if not group:
            return
        all_ids = [rid for w in group for rid in w.message.record_ids]  # type: ignore[union-attr]
        try:
            runnable = [w for w in group if self._apply_message(w)]
            if not runnable:
                return
            t_run = time.perf_counter()
            try:
                with self._leases_kept(all_ids):
                    results = self.runner.run(workflow, bb,
                                              [w.message.record_ids for w in runnable])  # type: ignore[union-attr]
                self.stats.add("run_ms", int((time.perf_counter() - t_run) * 1000))
            except Exception as e:  # the runner failed on the driver: nothing is known done
                self._check_runner(e)
                log.warning("workflow %s: the runner failed on %d message(s): %s", name,
                            len(runnable), e)
                self._isolate(name, runnable, all_ids, f"runner failed: {type(e).__name__}: {e}")
                return
            committing: list[tuple[_Work, Any]] = []
            for w, result in zip(runnable, results, strict=True):
                assert w.message is not None
                if result.ok and self._route(name, w, result):
                    committing.append((w, result))
                else:
                    self._invalidate(result.record_ids)
                    if w.state is State.PROCESSING:
                        self._failed(w, result.error or "workflow failed")
            if committing:
                self._commit(name, committing, all_ids)
        finally:
            # A group leaves nothing behind: whatever is still on the blackboard
            # (its records after a failure, fragments of failed instances) goes.
            leftover = bb.ids()
            if leftover:
                self._invalidate(leftover)

    def _apply_message(self, w: _Work) -> bool:
        """Write the message's attributes onto the loaded records; bad ones dead-letter it."""
        assert self.bb is not None and w.message is not None
        try:
            for record in w.message.records:
                if w.message.operation != "DELETE" and record["attributes"]:
                    self.bb.set_attributes(record["id"], record["attributes"])
            return True
        except (BlackboardError, RecursionError, ValueError, TypeError) as e:
            w.to(State.DEAD, f"message {w.message.message_id}: attributes not usable: {e}")
            self._invalidate(w.message.record_ids)
            return False

    def _route(self, name: str, w: _Work, result: Any) -> bool:
        """Mark deletions and compute the outgoing messages; a failure fails the message."""
        assert self.bb is not None and w.message is not None
        try:
            if w.message.operation == "DELETE":
                for rid in result.record_ids:
                    self.bb.delete(rid)
            w.outgoing = self.router.route(self.bb, name, w.message, result.result_ids)
            return True
        except Exception as e:  # a router condition or attribute that cannot be rendered
            self._failed(w, f"routing failed: {type(e).__name__}: {e}")
            return False

    def _commit(self, name: str, committing: list[tuple[_Work, Any]], all_ids: list[str]) -> None:
        assert self.bb is not None
        commit_ids = [rid for _w, result in committing for rid in result.record_ids]
        processed = [(w.message.message_id, w.message.queue) for w, _ in committing]  # type: ignore[union-attr]
        outgoing = [(w.message.message_id, m) for w, _ in committing for m in w.outgoing]  # type: ignore[union-attr]
        t_commit = time.perf_counter()
        try:
            self.bb.commit_many(commit_ids, hook=lambda conn: Outbox.write(conn, processed, outgoing))
        except Exception as e:
            self._invalidate(commit_ids)
            works = [w for w, _ in committing]
            for w in works:
                w.outgoing = []
            if _is_outage(e):
                log.warning("workflow %s: commit of %d message(s) failed, holding them: %s",
                            name, len(works), e)
                for w in works:
                    w.to(State.DEFERRED, f"commit failed: {e}")
            else:
                log.warning("workflow %s: commit of %d message(s) refused: %s", name, len(works), e)
                self._isolate(name, works, all_ids, f"commit refused: {type(e).__name__}: {e}")
            return
        for w, _ in committing:
            w.to(State.COMMITTED)
        self.stats.add("records_committed", len(commit_ids))
        self.stats.add("commit_ms", int((time.perf_counter() - t_commit) * 1000))

    def _isolate(self, name: str, works: list[_Work], loaded: list[str], error: str) -> None:
        """Fail a lone message; split a larger group in halves and run each again."""
        self._invalidate(loaded)
        if len(works) == 1:
            self._failed(works[0], error)
            return
        half = len(works) // 2
        for part in (works[:half], works[half:]):
            self._run_group(name, part)

    def _check_runner(self, error: Exception) -> None:
        healthy = getattr(self.runner, "healthy", None)
        if healthy is not None and not healthy():
            log.critical("the workflow runner is no longer usable (%s); stopping so that a "
                         "supervisor can restart the service", error)
            raise RunnerUnusable(str(error)) from error

    def _invalidate(self, ids: Sequence[str]) -> None:
        """Invalidate, tolerating a database that is gone: the records leave the
        blackboard either way, and leases left behind are this node's, so its
        next load takes them over (or they lapse)."""
        assert self.bb is not None
        try:
            self.bb.invalidate_many(ids)
        except (StorageError, SQLAlchemyError) as e:
            log.warning("could not release %d lease(s), they will lapse: %s", len(ids), e)

    def _load(self, group: list[_Work]) -> list[_Work]:
        """Load the group's records, all or nothing; messages whose records another
        owner holds are deferred and the rest loaded (until nothing is left)."""
        assert self.bb is not None
        while group:
            ids = [rid for w in group for rid in w.message.record_ids]  # type: ignore[union-attr]
            try:
                self.bb.load_many(ids)
                return group
            except RecordLockedError as e:
                locked = set(e.holders)
                keep = []
                for w in group:
                    if locked & set(w.message.record_ids):  # type: ignore[union-attr]
                        w.to(State.DEFERRED, str(e))
                    else:
                        keep.append(w)
                group = keep
            except (StorageError, SQLAlchemyError) as e:
                log.warning("loading %d record(s) failed, holding their messages: %s", len(ids), e)
                for w in group:
                    w.to(State.DEFERRED, f"storage unavailable: {e}")
                return []
        return group

    def _failed(self, w: _Work, error: str) -> None:
        assert w.message is not None and w.rule is not None
        if w.message.attempts < w.rule.max_retries:
            w.to(State.RETRYING, error)
        else:
            w.to(State.DEAD, f"{error} (after {w.message.attempts + 1} attempt(s))")

    # -- publishing and acking -------------------------------------------------------
    def _copy_headers(self, w: _Work, **extra: Any) -> dict[str, Any]:
        headers = {k: v for k, v in w.delivery.headers.items() if k != ERROR_HEADER}
        headers.update(extra)
        return headers

    def _side_messages(self, w: _Work) -> list[OutMessage]:
        d = w.delivery
        mid = w.message.message_id if w.message else (d.message_id or derive_message_id(d.body))
        attempts = (w.message.attempts if w.message else 0) + 1
        error = (w.error or "unknown error")[:4000]
        if w.state is State.RETRYING:
            assert w.rule is not None
            steps = len(w.rule.backoff_ms)
            key = retry_name(d.queue, min(attempts, steps)) if steps else d.queue
            return [OutMessage(routing_key=key, body=d.body, message_id=mid,
                               headers=self._copy_headers(w, **{ATTEMPTS_HEADER: attempts,
                                                                "x-chalk-last-error": error}))]
        if w.state is State.DEAD:
            return [OutMessage(routing_key=dlq_name(d.queue), body=d.body, message_id=mid,
                               headers=self._copy_headers(w, **{
                                   ERROR_HEADER: error, WORKFLOW_HEADER: w.workflow or "",
                                   ATTEMPTS_HEADER: attempts, QUEUE_HEADER: d.queue}))]
        return []

    def _finish(self, works: list[_Work]) -> None:
        """Decide what each message needs, hold the deferred, hand the rest to the finisher."""
        done_states = (State.COMMITTED, State.DUPLICATE, State.RETRYING, State.DEAD)
        done = [w for w in works if w.state in done_states]
        for w in works:
            if w.state is State.DEAD:
                log.warning("dead-lettering %s: %s", w.delivery.message_id or "(no id)", w.error)
            elif w.state is State.RETRYING:
                log.info("retrying %s: %s", w.message.message_id if w.message else "?", w.error)
        routed = [m for w in done for m in w.outgoing]
        side = [m for w in done for m in self._side_messages(w)]
        deferred = [w for w in works if w.state is State.DEFERRED]
        if deferred:
            # Held here, unacked, and tried again with the next batch: rejecting
            # them would raise their delivery count towards the queue's limit.
            self.stats.add("deferred", len(deferred))
            self._hold(w.delivery for w in deferred)
            self._backoff = min(max(self._backoff * 2, 0.2), 30.0)
            log.info("holding %d message(s) for %.1f s: %s", len(deferred), self._backoff,
                     deferred[0].error)
        elif not self._held:
            self._backoff = 0.0
        self.stats.add("batches")
        if done:
            self._submit(lambda: self._publish_and_ack(done, routed, side))

    def _hold(self, deliveries: Iterable[Delivery]) -> None:
        with self._held_lock:
            self._held.extend(deliveries)

    def _submit(self, job: Callable[[], None]) -> None:
        """Run ``job`` on the finisher thread; at most two batches wait there."""
        while len(self._finishing) >= 2:
            self._finishing.pop(0).result()
        self._finishing.append(self._finisher.submit(job))

    def _declare_targets(self, messages: Sequence[OutMessage]) -> None:
        """Declare queues first named by a ``nextDestination`` annotation (finisher thread)."""
        new = {m.routing_key for m in messages if not m.exchange} - self._declared
        if not new:
            return
        connection = pika.BlockingConnection(connection_parameters(self.settings.broker_url))
        try:
            declare_outputs(connection, self.settings, sorted(new))
        finally:
            if connection.is_open:
                connection.close()
        self._declared |= new
        log.info("declared routing target(s) %s", ", ".join(sorted(new)))

    def drain(self) -> None:
        """Wait until every finished batch is published and acked."""
        while self._finishing:
            self._finishing.pop(0).result()

    def _publish_and_ack(self, done: list[_Work], routed: list[OutMessage],
                         side: list[OutMessage]) -> None:
        """On the finisher thread: publish with confirms, mark the outbox sent, ack.

        This overlaps with the next batch's workflow run.  A failed publish
        hands the inputs back to the main loop (held, unacked); committed ones
        then take the inbox path and publish their outbox rows again.
        """
        assert self.link is not None
        started = time.perf_counter()
        try:
            if routed or side:
                try:
                    self._declare_targets(routed)
                    self.link.publish(routed + side).result(timeout=CONFIRM_TIMEOUT)
                except (BrokerUnavailable, TimeoutError, pika.exceptions.AMQPError, OSError) as e:
                    log.warning("publishing %d message(s) failed; their inputs are held and "
                                "tried again: %s", len(routed) + len(side), e)
                    for w in done:
                        w.to(State.DEFERRED, str(e))
                    self._hold(w.delivery for w in done)
                    self._backoff = min(max(self._backoff * 2, 0.5), 30.0)
                    return
                try:
                    self.outbox.mark_sent([m.message_id for m in routed])
                except (StorageError, SQLAlchemyError) as e:
                    log.warning("could not mark %d outbox row(s) sent: %s", len(routed), e)
            for w in done:
                self.stats.add(w.state.value)
                w.to(State.ACKED)
            self.link.ack(w.delivery for w in done)
        except Exception:  # never let the finisher die silently
            log.exception("finishing a batch failed; its inputs are held and tried again")
            self._hold(w.delivery for w in done)
        finally:
            self.stats.add("publish_ms", int((time.perf_counter() - started) * 1000))
