"""Cluster membership: heartbeats, a stable leader, topology changes.

Theory of operation: every service process upserts its row in
``chalk_nodes`` (name, start time, last heartbeat) every few seconds, from its
own thread, so a long Spark job does not make it look dead.  A member is live
while its heartbeat is younger than ``ttl``.  The leader is the live member
that started first: it stays leader for as long as it lives, and a new member
never takes over from a live one.  Each member logs the topology when the set
of live members changes.  The leader alone runs the leader tasks
(``_leader``): dropping expired record leases, publishing orphaned outbox
batches (committed, never confirmed sent), retention of old inbox/outbox
rows, and forgetting members long dead.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import socket
import tempfile
import threading
import time
from typing import Any

from listener_router._errors import StoreUnavailable
from listener_router.store import Member, Nodes, unavailable

__all__ = ["Membership", "claim_node_name"]

log = logging.getLogger(__name__)


class Membership:
    """This process's membership; ``start()`` runs the heartbeat thread."""

    def __init__(self, nodes: Nodes, name: str, *, interval: float = 5.0, ttl: float = 30.0):
        self.nodes = nodes
        self.name = name
        self.interval = interval
        self.ttl = ttl
        self.started_at = time.time()
        self._members: tuple[str, ...] = ()
        self._leader: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Membership:
        self.beat()
        self._thread = threading.Thread(target=self._run, name="chalk-heartbeat", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval + 5)
        try:
            with unavailable():
                self.nodes.leave(self.name)
        except StoreUnavailable as e:
            log.warning("could not leave the cluster cleanly (the row will expire): %s", e)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.beat()
            except StoreUnavailable as e:
                log.warning("heartbeat failed: %s", e)

    def beat(self) -> None:
        """Write our heartbeat, read the live members, log a topology change.

        Raises :class:`StoreUnavailable` when the database fails."""
        with unavailable():
            self.nodes.beat(self.name, self.started_at)
            live = self.members()
        names = tuple(m.name for m in live)
        leader = live[0].name if live else None
        if names != self._members or leader != self._leader:
            joined = sorted(set(names) - set(self._members))
            left = sorted(set(self._members) - set(names))
            log.info("topology: %d member(s) %s, leader %s%s%s", len(names), ", ".join(names),
                     leader, f"; joined {', '.join(joined)}" if joined else "",
                     f"; left {', '.join(left)}" if left else "")
            self._members, self._leader = names, leader

    def members(self) -> list[Member]:
        """Live members, the leader first (earliest start, then name)."""
        return self.nodes.live(self.ttl)

    @property
    def leader(self) -> str | None:
        return self._leader

    @property
    def live(self) -> tuple[str, ...]:
        """Names of the live members as of the last heartbeat, the leader first."""
        return self._members

    @property
    def is_leader(self) -> bool:
        """Whether this process leads the cluster (as of its last heartbeat)."""
        return self._leader == self.name

    def forget_dead(self, older_than: float = 3600.0) -> int:
        """Drop rows of members silent for longer than ``older_than`` seconds."""
        with unavailable():
            return self.nodes.forget(older_than)


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
