"""The cluster as a member sees it, and the topology events it sends to listeners.

A :class:`ClusterView` is the view the leader established: its members in a
stable order (the earliest joined first; a member that joins, or joins again
after its heartbeat lapsed, goes to the end), the leader, the fencing epoch,
and what each member advertises (:class:`MemberDescription`: host, pid,
version, its listener queues and workflows — its capabilities — and any
further properties).

A member tells its in-process :class:`TopologyListener` objects:

================== ============================================================
TOPOLOGY_INIT      the first view that holds this member (``new_view``)
TOPOLOGY_CHANGING  the live members differ from the established view: a member
                   joined or its heartbeat lapsed; the leader is settling it
                   (``old_view``)
TOPOLOGY_CHANGED   the leader established a new view (``old_view``, ``new_view``);
                   always after a TOPOLOGY_CHANGING
PROPERTIES_CHANGED same members, some advertised properties changed
================== ============================================================

Listeners are called one event at a time, in order, on a thread of their own
(``chalk-topology``), never on the heartbeat's: a slow listener cannot make
its member look dead.  One that raises is logged and the others still hear.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

__all__ = ["ClusterView", "MemberDescription", "TopologyEvent", "TopologyEventType", "ViewChange",
           "TopologyListener", "TopologyListeners"]

log = logging.getLogger(__name__)


class TopologyEventType(str, Enum):
    TOPOLOGY_INIT = "TOPOLOGY_INIT"
    TOPOLOGY_CHANGING = "TOPOLOGY_CHANGING"
    TOPOLOGY_CHANGED = "TOPOLOGY_CHANGED"
    PROPERTIES_CHANGED = "PROPERTIES_CHANGED"


@dataclass(frozen=True)
class MemberDescription:
    """One member of a view: who it is and what it advertises."""

    name: str
    host: str
    pid: int
    joined_at: float
    leader: bool
    local: bool                                  # this process
    properties: Mapping[str, Any] = field(default_factory=dict)

    @property
    def version(self) -> str:
        return str(self.properties.get("version", ""))

    @property
    def queues(self) -> tuple[str, ...]:
        """The queues it listens to."""
        return tuple(self.properties.get("queues", ()))

    @property
    def workflows(self) -> tuple[str, ...]:
        """The workflows it can run."""
        return tuple(self.properties.get("workflows", ()))


@dataclass(frozen=True)
class ClusterView:
    """A view the leader established (see the module doc)."""

    cluster_id: str
    seq: int                                     # raised with every established view
    leader: str | None
    epoch: int                                   # the leader's fencing epoch
    members: tuple[MemberDescription, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.members)

    @property
    def local(self) -> MemberDescription | None:
        """This process, when it is in the view."""
        return next((m for m in self.members if m.local), None)

    def member(self, name: str) -> MemberDescription | None:
        return next((m for m in self.members if m.name == name), None)

    def with_capability(self, *, queue: str | None = None,
                        workflow: str | None = None) -> tuple[MemberDescription, ...]:
        """The members that listen to ``queue`` and/or can run ``workflow``, in view order."""
        return tuple(m for m in self.members
                     if (queue is None or queue in m.queues)
                     and (workflow is None or workflow in m.workflows))


@dataclass(frozen=True)
class ViewChange:
    """A view the leader establishes, as written in its fenced transaction: who leads at
    which epoch, the live members (their advertised rows), who left and who joined.

    A member that came back under its name as a new incarnation (a restart) is in
    ``restarted``, and neither in ``left`` nor in ``joined``.
    """

    cluster_id: str
    seq: int
    leader: str
    epoch: int
    members: tuple[dict[str, Any], ...]
    left: tuple[str, ...]
    joined: tuple[str, ...]
    restarted: tuple[str, ...] = ()


@dataclass(frozen=True)
class TopologyEvent:
    type: TopologyEventType
    old_view: ClusterView | None
    new_view: ClusterView | None


class TopologyListener:
    """Told about topology changes; the base does nothing (override what you need)."""

    def handle_topology_event(self, event: TopologyEvent) -> None:
        """Called for each event, in order, on the ``chalk-topology`` thread."""


class TopologyListeners:
    """The registered listeners, called from a thread of their own (see the module doc)."""

    def __init__(self, listeners: Iterable[TopologyListener] = ()):
        self._listeners: list[TopologyListener] = list(listeners)
        self._queue: queue.SimpleQueue[TopologyEvent | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def add(self, listener: TopologyListener) -> None:
        with self._lock:
            self._listeners.append(listener)

    def notify(self, event: TopologyEvent) -> None:
        """Queue ``event`` for the listeners (returns at once)."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="chalk-topology",
                                                daemon=True)
                self._thread.start()
        self._queue.put(event)

    def stop(self, timeout: float = 5.0) -> None:
        """Deliver what is queued, then end the thread."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join(timeout)

    def _run(self) -> None:
        while True:
            event = self._queue.get()
            if event is None:
                return
            with self._lock:
                listeners = list(self._listeners)
            for listener in listeners:
                try:
                    listener.handle_topology_event(event)
                except Exception:  # a listener's bug never stops the service
                    log.exception("topology listener %s failed on %s", type(listener).__name__,
                                  event.type.value)
