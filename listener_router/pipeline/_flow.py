"""Flow control on the lanes: pause, rate limits, cancellations, as every member obeys them.

What operators set is kept in the store (``store/_flow.py``); a member reads
it when it starts and then every ``POLL`` seconds on a thread of its own
(``chalk-flow``), so a command takes effect on every member within about a
second and survives restarts:

- a **paused** lane finishes its batches in flight and takes nothing new:
  its consumers are cancelled, and what it had taken but not run goes back
  to the queue (``Lane`` and ``GatherStage`` do that);
- a lane's **rate limit** (records/s for the whole cluster) is shared among
  the live members that consume its queue: each runs a token bucket at its
  share (``_lanes.TokenBucket``), which the dispatcher asks before a batch;
- **cancellations** (``_cancelled``): a message cancelled before it runs
  is acked with a ``cancelled`` step and nothing committed; one in flight
  ends before its next pipelet call (the execute stage tells the runners)
  and is failed before its commit.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from listener_router._errors import StoreUnavailable
from listener_router.pipeline._cancelled import Cancelled
from listener_router.store import ServiceStore, unavailable

if TYPE_CHECKING:
    from listener_router.cluster import Membership
    from listener_router.pipeline._lanes import Lane

__all__ = ["POLL", "FlowWatch"]

log = logging.getLogger(__name__)

POLL = 1.0                # seconds between looks at what operators set


class FlowWatch:
    """Reads what operators set and applies it to the lanes (thread ``chalk-flow``)."""

    def __init__(self, store: ServiceStore, lanes: Sequence[Lane], cancelled: Cancelled,
                 membership: Callable[[], Membership | None], wake: Callable[[], None],
                 every: float = POLL):
        self.store = store
        self.lanes = {lane.queue: lane for lane in lanes}
        self.cancelled = cancelled
        self.membership = membership
        self.wake = wake
        self.every = every
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def paused_now(self) -> set[str]:
        """The lanes paused in the store (at start: their queues are not consumed)."""
        with unavailable():
            return self.store.lanes.paused() & set(self.lanes)

    def start(self) -> FlowWatch:
        self.look()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="chalk-flow", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.look()
            except StoreUnavailable as e:
                log.warning("could not read the lanes' state: %s", e)
            except Exception:  # never let the thread die
                log.exception("reading the lanes' state failed")

    def look(self) -> None:
        """Read the store once and apply what changed."""
        with unavailable():
            states = self.store.lanes.all()
            cancellations = self.store.cancellations.active()
        self.cancelled.update(cancellations)
        for queue, lane in self.lanes.items():
            state = states.get(queue)
            paused = state is not None and state.paused
            if paused != lane.paused:
                lane.set_paused(paused, state.reason if state is not None else None)
        self._share_rates()
        self.wake()

    def _share_rates(self) -> None:
        """Each rate-limited lane's share: its rate over the live members consuming it."""
        limited = [lane for lane in self.lanes.values() if lane.bucket is not None]
        if not limited:
            return
        membership = self.membership()
        members = membership.members() if membership is not None else []
        for lane in limited:
            consuming = [m for m in members
                         if lane.queue in (m.properties or {}).get("queues", ())]
            share = lane.rate_limit / max(1, len(consuming))  # type: ignore[operator]
            if lane.bucket is not None and abs(lane.bucket.rate - share) > 1e-9:
                lane.bucket.set_rate(share)
                log.info("lane %s: %.1f record(s)/s here (%g for the cluster, %d member(s))",
                         lane.queue, share, lane.rate_limit, max(1, len(consuming)))
