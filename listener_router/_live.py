"""What a plug-in may read of a running service: a typed, read-only view.

The dashboard, the metrics and any other plug-in that shows the service
read it here, never the :class:`~listener_router.Service` object: each
field is something the core keeps anyway (the values behind the callables
are read when called, cheaply, from any thread).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import engine
    from listener_router._settings import Settings
    from listener_router.cluster import Membership
    from listener_router.pipeline import LaneView, Stats
    from listener_router.store import ServiceStore

__all__ = ["LiveView"]


@dataclass(frozen=True)
class LiveView:
    """The running service as plug-ins see it.

    ``batch_size()`` is the messages the batch sizing lets a batch take now
    (the largest of the lanes'), ``lanes()`` each lane's state (paused, rate,
    back-pressure, batches running),
    ``in_flight()`` the record and message IDs held by batches in flight,
    ``snapshot()`` every plug-in's ``Plugin.snapshot`` merged (taken on the
    caller's thread: call it off the pipeline's).
    """

    node: str
    settings: Settings
    started: float                      # wall clock
    stats: Stats
    store: ServiceStore
    registry: engine.WorkflowRegistry
    membership: Membership
    batch_size: Callable[[], int]
    in_flight: Callable[[], int]
    snapshot: Callable[[], Mapping[str, Any]]
    lanes: Callable[[], list[LaneView]] = lambda: []
