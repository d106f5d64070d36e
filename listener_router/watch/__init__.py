"""Watching a running service: Prometheus metrics and a read-only dashboard on one port.

``chalk run --http 127.0.0.1:9187`` (or ``[http] listen``) makes the
service start a :class:`Watch`: ``/metrics`` (``_metrics``: per batch from
each report, the rest read when scraped), the page at ``/`` (``_app``,
``_pages``: one panel per data function in ``_panels``; pictures from
``_svg``), and a sampler thread that asks the broker for queue depths and
keeps the last hour in memory (``_history``).  The only route that changes
anything replays dead letters and needs ``[http] token``.
"""

from listener_router.watch._history import BatchSummary, History, Sample, Sampler
from listener_router.watch._metrics import METRICS, Live, Metrics
from listener_router.watch._server import Watch
from listener_router.watch._svg import layered_svg, workflow_svg

__all__ = ["BatchSummary", "History", "Live", "METRICS", "Metrics", "Sample", "Sampler", "Watch",
           "layered_svg", "workflow_svg"]
