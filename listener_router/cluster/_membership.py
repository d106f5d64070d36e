"""Cluster membership: heartbeats, a stable leader with a fencing epoch, views, failover.

Theory of operation.  Every service process writes its row in
``chalk_nodes`` every ``interval`` seconds from a thread of its own (so a
long Spark job does not make it look dead): heartbeat, incarnation (random,
per process start) and the properties it advertises.  A member is *live*
while its heartbeat is younger than ``ttl``; one whose heartbeat lapsed and
that beats again (it was frozen or cut off) joins again at the end of the
order, as a new member does.

One shared row (``chalk_cluster``, ``store/_cluster.py``) names the leader
(name and incarnation), its *epoch* and the *established view*.  At each
heartbeat a member:

1. keeps leading if the row names it; otherwise, if the leader named there
   is not live and this member is the first live one in order, it takes over
   with a conditional update that raises the epoch (two members racing: one
   wins).  A live leader is never replaced: leadership is stable until the
   leader's heartbeat lapses;
2. as leader, when the live members differ from the established view, fails
   over the members that are gone (``_failover``: their record leases
   dropped, their unsent outbox batches published at once) and establishes
   the new view — one fenced transaction, with the ``topology.changed``
   event when that is on;
3. compares the established view with the one it knew and tells its
   listeners (``_views``): TOPOLOGY_INIT, TOPOLOGY_CHANGING,
   TOPOLOGY_CHANGED, PROPERTIES_CHANGED.

*Fencing.*  Leader work runs in :meth:`Membership.fenced`: a transaction
whose first statement confirms, by a conditional update of the shared row,
that this process still leads at its epoch.  A leader frozen past the
time-to-live (SIGSTOP, a long pause) wakes up believing it leads; its next
leader action updates nothing, is rolled back and raises
:class:`~listener_router.NotLeader`, and the process stops leading.  The
check and the action's writes commit together, and the confirm locks the
row, so a take-over cannot slip in between.  (A message the action
published after its commit cannot be recalled; it has a deterministic ID.)
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from sqlalchemy import Connection

from listener_router._errors import NotLeader, StoreUnavailable
from listener_router.broker import OutMessage
from listener_router.cluster._failover import FailedOver, Failover
from listener_router.cluster._views import (
    ClusterView,
    MemberDescription,
    TopologyEvent,
    TopologyEventType,
    TopologyListener,
    TopologyListeners,
    ViewChange,
)
from listener_router.store import (
    ClusterRow,
    ClusterState,
    Member,
    Outbox,
    ServiceStore,
    unavailable,
)

__all__ = ["Emit", "LeaderTransaction", "Membership", "OnView", "claim_node_name"]

log = logging.getLogger(__name__)

Publish = Callable[[dict[str, list[OutMessage]]], None]
OnView = Callable[["LeaderTransaction", ViewChange], None]


Emit = Callable[["LeaderTransaction", Any, "str | None", Mapping[str, Any], Sequence[str]], bool]


class LeaderTransaction:
    """One fenced transaction of leader work (``with membership.fenced() as tx``).

    Write rows with ``tx.connection``; ``tx.publish(message)`` adds a message
    to an outbox batch written in the transaction and published after it
    commits (nothing, if it rolls back); ``tx.emit(kind, subject, body, key)``
    adds an event the same way, when a plug-in gives the membership an
    ``emitter`` (the events plug-in does, for the kinds ``[events]`` turns on).
    """

    def __init__(self, connection: Connection, emitter: Emit | None = None):
        self.connection = connection
        self.added: list[OutMessage] = []
        self._emitter = emitter

    def publish(self, message: OutMessage) -> None:
        self.added.append(message)

    def emit(self, kind: Any, subject: str | None, body: Mapping[str, Any],
             key: Sequence[str]) -> bool:
        """Add an event to the transaction; False when no plug-in writes events, or its
        kind is off."""
        return self._emitter is not None and self._emitter(self, kind, subject, body, key)


class Membership:
    """This process's membership (see module doc); ``start()`` runs the heartbeat thread.

    ``properties`` are advertised to the other members (the service gives
    version, queues and workflows); ``listeners`` hear the topology events;
    ``publish`` takes outbox batches to publish (the service's finish stage;
    without it they wait for the orphan task); ``on_view`` are called in the
    leader's fenced transaction that establishes a new view (the
    ``topology.changed`` event is written there).
    """

    def __init__(self, store: ServiceStore, name: str, *, interval: float = 5.0,
                 ttl: float = 30.0, properties: Mapping[str, Any] | None = None,
                 listeners: Iterable[TopologyListener] = (), publish: Publish | None = None,
                 on_view: Iterable[OnView] = ()):
        self.store = store
        self.nodes = store.nodes
        self.cluster = store.cluster
        self.name = name
        self.interval = interval
        self.ttl = ttl
        self.incarnation = uuid.uuid4().hex
        self.started_at = time.time()
        self.listeners = TopologyListeners(listeners)
        self.publish = publish
        self.on_view = list(on_view)
        self.emitter: Emit | None = None     # set by the plug-in that writes events
        self.failover = Failover(store)
        self._properties: dict[str, Any] = dict(properties or {})
        self._epoch: int | None = None
        self._leader: str | None = None
        self._view: ClusterView | None = None
        self._changing = False
        self._beats = 0
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------
    def start(self) -> Membership:
        self.beat()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="chalk-heartbeat", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop beating, hand leadership on, leave the cluster (the others see it at once)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval + 5)
        epoch, self._epoch = self._epoch, None
        try:
            with unavailable():
                if epoch is not None:
                    self.cluster.resign(self.name, epoch)
                self.nodes.leave(self.name, self.incarnation)
        except StoreUnavailable as e:
            log.warning("could not leave the cluster cleanly (the row will expire): %s", e)
        self.listeners.stop()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.beat()
            except StoreUnavailable as e:
                log.warning("heartbeat failed: %s", e)
            except Exception:  # never let the heartbeat thread die
                log.exception("heartbeat failed")

    # -- what others see of us ---------------------------------------------------------
    def advertise(self, **properties: Any) -> None:
        """Set advertised properties (written at the next heartbeat; the others get
        PROPERTIES_CHANGED).  Values must be JSON: strings, numbers, lists."""
        with self._lock:
            self._properties.update(properties)

    @property
    def properties(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._properties)

    # -- the heartbeat -------------------------------------------------------------------
    def beat(self) -> None:
        """Heartbeat, leadership, the leader's settling of the view, local events.

        Raises :class:`StoreUnavailable` when the database fails."""
        with self._lock:
            with unavailable():
                joined = self.nodes.beat(self.name, self.started_at, incarnation=self.incarnation,
                                         ttl=self.ttl, properties=self._properties)
                rows = self.nodes.all()
                state = self.cluster.read()
            if joined and self._beats:
                log.warning("this member's heartbeat lapsed (more than %.1f s without one: "
                            "frozen or cut off); it joins the view again at the end", self.ttl)
            self._beats += 1
            now = time.time()
            live = [m for m in rows if m.live(now, self.ttl)]
            state = self._lead(live, state)
            if self._epoch is not None:
                try:
                    state = self._settle(rows, live, state)
                except NotLeader:
                    state = self.cluster.read()
            self._observe(rows, live, state)

    def _lead(self, live: list[Member], state: ClusterRow) -> ClusterRow:
        """Keep leading, take over from a leader that is gone, or follow."""
        if state.leader == self.name and state.leader_incarnation == self.incarnation:
            self._epoch = state.epoch
        else:
            if self._epoch is not None:
                log.warning("this process no longer leads the cluster (epoch %d is over; "
                            "leader %s)", self._epoch, state.leader)
            self._epoch = None
            leader_live = any(m.name == state.leader and m.incarnation == state.leader_incarnation
                              for m in live)
            first = live[0] if live else None
            if not leader_live and first is not None and first.name == self.name \
                    and first.incarnation == self.incarnation:
                with unavailable(), self.store.writes, self.store.engine.begin() as conn:
                    epoch = ClusterState.take_over(conn, self.name, self.incarnation, state.epoch)
                if epoch is not None:
                    self._epoch = epoch
                    log.info("%s leads the cluster from now on (epoch %d; leader before: %s)",
                             self.name, epoch, state.leader or "none")
                with unavailable():
                    state = self.cluster.read()
        self._leader = state.leader
        return state

    def _settle(self, rows: list[Member], live: list[Member], state: ClusterRow) -> ClusterRow:
        """As leader: fail over the members gone and establish the view of the live ones."""
        pairs = [(m.name, m.incarnation) for m in live]
        if tuple(pairs) == state.view_members:
            return state
        alive = set(pairs)
        gone = [name for name, incarnation in state.view_members
                if (name, incarnation) not in alive]
        failed = FailedOver()
        restarted = [name for name in gone if any(m.name == name for m in live)]
        with self.fenced() as tx:
            for name in gone:
                back = next((m for m in live if m.name == name), None)
                self.failover.run(tx.connection, name, back, failed)
            epoch = self._epoch
            seq = ClusterState.establish(tx.connection, self.name, epoch or 0, pairs)
            if seq is None:
                raise NotLeader(f"{self.name} could not establish the view: epoch {epoch} is over")
            if self.on_view:
                before = set(state.view_members)
                change = ViewChange(
                    state.cluster_id, seq, self.name, epoch or 0,
                    tuple(_advertised(m) for m in live),
                    tuple(n for n in gone if n not in restarted),
                    tuple(n for n, i in pairs if (n, i) not in before and n not in restarted),
                    tuple(restarted))
                for hook in self.on_view:
                    hook(tx, change)
        if failed.members:
            lapsed = {m.name for m in rows} - set(restarted)  # a clean leave deleted its row
            self._report(failed, restarted, lapsed)
            if failed.batches:
                self._hand_over(failed.batches)
        with unavailable():
            return self.cluster.read()

    @staticmethod
    def _report(failed: FailedOver, restarted: Sequence[str], lapsed: set[str]) -> None:
        """A failover is worth a warning when it released something a gone member held; a
        member that left (cleanly, or its heartbeat lapsed) or came back as a new incarnation
        (a restart), leaving nothing behind, is news."""
        if failed.leases or failed.batches:
            log.warning("failover of %s: %d record lease(s) released, %d unsent outbox "
                        "batch(es) to publish", ", ".join(failed.members), failed.leases,
                        len(failed.batches))
            return
        back = [n for n in failed.members if n in restarted]
        gone = [n for n in failed.members if n not in restarted]
        if back:
            log.info("%s restarted (a new incarnation; nothing of the earlier one was left to "
                     "release)", ", ".join(back))
        if gone:
            log.info("%s left the cluster%s", ", ".join(gone),
                     " (heartbeat lapsed; nothing was left to release)" if lapsed & set(gone)
                     else "")

    def _observe(self, rows: list[Member], live: list[Member], state: ClusterRow) -> None:
        """Compare the established view with the one this member knew; tell the listeners."""
        view = self._describe(rows, state)
        old = self._view
        if old is None:
            if view.local is not None:
                self._view = view
                self._log(None, view)
                self.listeners.notify(TopologyEvent(TopologyEventType.TOPOLOGY_INIT, None, view))
            return
        if view.seq != old.seq:
            if not self._changing:
                self.listeners.notify(TopologyEvent(TopologyEventType.TOPOLOGY_CHANGING, old, None))
            self._changing = False
            self._view = view
            self._log(old, view)
            self.listeners.notify(TopologyEvent(TopologyEventType.TOPOLOGY_CHANGED, old, view))
            return
        if not self._changing and {(m.name, m.incarnation) for m in live} != set(state.view_members):
            self._changing = True
            self.listeners.notify(TopologyEvent(TopologyEventType.TOPOLOGY_CHANGING, old, None))
        if view.members != old.members:
            self._view = view
            self.listeners.notify(TopologyEvent(TopologyEventType.PROPERTIES_CHANGED, old, view))

    def _describe(self, rows: list[Member], state: ClusterRow) -> ClusterView:
        found = {(m.name, m.incarnation): m for m in rows}
        members = []
        for name, incarnation in state.view_members:
            row = found.get((name, incarnation))
            local = name == self.name and incarnation == self.incarnation
            if row is None:
                members.append(MemberDescription(name, "", 0, 0.0, name == state.leader, local))
            else:
                members.append(MemberDescription(name, row.host, row.pid, row.joined_at,
                                                 name == state.leader, local, row.properties))
        return ClusterView(state.cluster_id, state.view_seq, state.leader, state.epoch,
                           tuple(members))

    @staticmethod
    def _log(old: ClusterView | None, new: ClusterView) -> None:
        joined = sorted(set(new.names) - set(old.names)) if old is not None else []
        left = sorted(set(old.names) - set(new.names)) if old is not None else []
        log.info("topology: %d member(s) %s, leader %s (epoch %d, view %d)%s%s",
                 len(new.members), ", ".join(new.names), new.leader, new.epoch, new.seq,
                 f"; joined {', '.join(joined)}" if joined else "",
                 f"; left {', '.join(left)}" if left else "")

    # -- fenced leader work ----------------------------------------------------------------
    @contextlib.contextmanager
    def fenced(self) -> Iterator[LeaderTransaction]:
        """A transaction that commits only while this process leads at its epoch.

        Its first statement confirms the epoch (a conditional update of the
        cluster row); when another member took over meanwhile, nothing in it
        is written and :class:`NotLeader` is raised, and this process stops
        leading.  Messages added with ``publish`` (and ``emit``) go to an outbox
        batch in the transaction and are published after the commit.
        Raises :class:`StoreUnavailable` when the database fails.
        """
        epoch = self._epoch
        if epoch is None:
            raise NotLeader(f"{self.name} does not lead the cluster (leader: {self._leader})")
        batch = None
        with self.store.writes:
            with unavailable(), self.store.engine.begin() as conn:
                if not ClusterState.confirm(conn, self.name, epoch):
                    self._lost(epoch)
                    raise NotLeader(f"{self.name} no longer leads the cluster: epoch {epoch} "
                                    "is over (another member took over)")
                tx = LeaderTransaction(conn, self.emitter)
                yield tx
                if tx.added:
                    batch = Outbox.write(conn, [], [(None, m) for m in tx.added],
                                         writer=self.name)
        if batch is not None:
            self._hand_over({batch: tx.added})

    def _lost(self, epoch: int) -> None:
        # No lock: this runs inside a transaction (and, on SQLite, under the
        # store's write lock), which the heartbeat may be waiting for.
        if self._epoch == epoch:
            self._epoch = None
            log.warning("leader work refused: epoch %d is over, this process no longer "
                        "leads the cluster", epoch)

    def _hand_over(self, batches: dict[str, list[OutMessage]]) -> None:
        if self.publish is not None:
            self.publish(batches)

    # -- reading ---------------------------------------------------------------------------
    def members(self) -> list[Member]:
        """Live members in view order (the earliest joined first)."""
        return self.nodes.live(self.ttl)

    @property
    def view(self) -> ClusterView | None:
        """The established view as this member last saw it (None before its first)."""
        return self._view

    @property
    def leader(self) -> str | None:
        return self._leader

    @property
    def epoch(self) -> int | None:
        """This process's fencing epoch while it leads (None: it does not)."""
        return self._epoch

    @property
    def live(self) -> tuple[str, ...]:
        """Names of the members of the established view as of the last heartbeat, the
        leader first."""
        view = self._view
        if view is None:
            return ()
        return tuple(sorted(view.names, key=lambda name: name != view.leader))

    @property
    def is_leader(self) -> bool:
        """Whether this process leads the cluster (as of its last heartbeat; leader work
        checks again, in its own transaction: :meth:`fenced`)."""
        return self._epoch is not None

    def forget_dead(self, older_than: float = 3600.0) -> int:
        """Drop rows of members silent for longer than ``older_than`` seconds (fenced)."""
        with self.fenced() as tx:
            return self.nodes.forget(older_than, tx.connection)


def _advertised(member: Member) -> dict[str, Any]:
    return {"name": member.name, "host": member.host, "pid": member.pid, **member.properties}


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
