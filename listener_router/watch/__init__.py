"""Watching a running service: Prometheus metrics and a dashboard on one port.

A plug-in (:class:`Watch`, ``_server``) built when ``[http] listen`` or
``chalk run --http 127.0.0.1:9187`` is set: ``/metrics`` (``_metrics``: per
batch from each report, the rest read when scraped), the page at ``/``
(``_app``, ``_pages``: one panel per data function in ``_panels``; pictures
from ``_svg``), and a sampler thread that asks the broker for queue depths
and keeps the last hour in memory (``_history``).  The operator's panels
(``_console``, ``_joblog``, ``_record``, ``_events``) show lanes, schedules,
subscribers, events, a record, a dead letter; the routes that change
anything (``_controls``: pause, resume, cancel, replay) need ``[http]
token``.  Names are imported on first use (the web stack only when the
dashboard is on).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from listener_router._lazy import lazy_names

if TYPE_CHECKING:
    from listener_router.watch._history import BatchSummary, History, Sample, Sampler
    from listener_router.watch._metrics import METRICS, Live, Metrics
    from listener_router.watch._server import Watch
    from listener_router.watch._settings import HttpSettings, parse_listen
    from listener_router.watch._svg import layered_svg, workflow_svg

_HOMES = {
    "BatchSummary": "_history", "History": "_history", "Sample": "_history",
    "Sampler": "_history", "METRICS": "_metrics", "Live": "_metrics", "Metrics": "_metrics",
    "Watch": "_server", "HttpSettings": "_settings", "parse_listen": "_settings",
    "layered_svg": "_svg", "workflow_svg": "_svg",
}

__all__ = [
    "METRICS",
    "BatchSummary",
    "History",
    "HttpSettings",
    "Live",
    "Metrics",
    "Sample",
    "Sampler",
    "Watch",
    "layered_svg",
    "parse_listen",
    "workflow_svg",
]

__getattr__, __dir__ = lazy_names(__name__, _HOMES, __all__, globals())
