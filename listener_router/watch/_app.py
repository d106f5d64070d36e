"""The web application (Starlette): the page, its panels, ``/metrics``, and the one POST.

Routes: ``GET /`` the page (``?record=ID`` searches the job log),
``GET /panel/<name>`` one panel's HTML (what the page's script refreshes),
``GET /metrics`` Prometheus' text format, ``GET /healthz``, and
``POST /dlq/replay`` — the only route that changes anything: it needs the
``[http] token`` of the configuration (compared in constant time) and is
refused when no token is configured.  Handlers are plain functions: Starlette
runs them on its thread pool, so a slow broker or database never blocks the
event loop.
"""

from __future__ import annotations

import hmac
import json
import logging
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import parse_qs, urlencode

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from listener_router.watch import _panels
from listener_router.watch._pages import PANELS, render
from listener_router.watch._reprocess import reprocess_runs

if TYPE_CHECKING:
    import engine
    from listener_router._live import LiveView
    from listener_router.cluster import Membership
    from listener_router.store import ServiceStore
    from listener_router.watch._history import History, Sampler
    from listener_router.watch._metrics import Metrics

__all__ = ["make_app", "MAX_FORM_BYTES"]

log = logging.getLogger(__name__)

MAX_FORM_BYTES = 16 * 1024


class Watch(Protocol):
    """What the application reads of the watch plug-in (``_server.Watch``)."""

    live: LiveView
    history: History
    sampler: Sampler
    metrics: Metrics
    membership: Membership
    registry: engine.WorkflowRegistry
    store: ServiceStore
    node: str
    token: str | None

    def uptime(self) -> float: ...


def _record(request: Request) -> str:
    return request.query_params.get("record", "").strip()[:512]


def panel_html(watch: Watch, name: str, record: str = "") -> str:
    """One panel's HTML, from that panel's data function."""
    live = watch.live
    if name == "topology":
        topo = _panels.topology(watch.membership)
        columns = list(dict.fromkeys(k for m in topo.members for k in m))
        counts = [(k, live.stats[k]) for k in ("batches", "received", "committed",
                                                  "duplicate", "retrying", "dead")]
        return render("topology.html", t=topo, columns=columns, counts=counts,
                      uptime=watch.uptime())
    if name == "queues":
        latest = watch.sampler.latest()
        return render("queues.html",
                      rows=_panels.queues(live.settings, watch.history, watch.sampler),
                      every=watch.sampler.every, broker_up=latest is None or latest.broker_up)
    if name == "batches":
        return render("batches.html", batches=_panels.recent_batches(watch.history))
    if name == "jobs":
        return render("jobs.html", record=record, jobs=_panels.job_log(watch.store, record))
    if name == "dead_letters":
        error = ""
        letters: list[_panels.DeadLetter] = []
        try:
            letters = _panels.dead_letters(live.settings)
        except Exception as e:  # the broker is down: say so on the page
            error = f"dead letters unavailable: {type(e).__name__}: {e}"
        return render("dead_letters.html", letters=letters, error=error,
                      queues=sorted({d.queue for d in letters}),
                      token_set=watch.token is not None)
    if name == "workflows":
        views, orphans = _panels.workflows(watch.registry)
        return render("workflows.html", views=views, orphans=orphans)
    if name == "reprocess":
        return render("reprocess.html", p=reprocess_runs(watch.store))
    raise KeyError(name)


def make_app(watch: Watch) -> Starlette:
    """The application serving ``watch``'s service."""

    def page(request: Request) -> Response:
        record = _record(request)
        notice = ""
        if "replayed" in request.query_params:
            notice = (f"replayed {request.query_params['replayed']} dead letter(s) to "
                      f"{request.query_params.get('queue', '?')}")
        panels = {name: panel_html(watch, name, record) for name in PANELS}
        return HTMLResponse(render("page.html", node=watch.node, panels=panels, every=PANELS,
                                   record=record, notice=notice))

    def panel(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in PANELS:
            return PlainTextResponse(f"no panel {name!r}", status_code=404)
        return HTMLResponse(panel_html(watch, name, _record(request)),
                            headers={"Cache-Control": "no-store"})

    def metrics(_request: Request) -> Response:
        return Response(watch.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    def healthz(_request: Request) -> Response:
        return PlainTextResponse("ok")

    def refused(message: str, status: int) -> Response:
        return HTMLResponse(render("refused.html", message=message), status_code=status)

    async def replay(request: Request) -> Response:
        length = request.headers.get("content-length")
        if length is None or not length.isdigit() or int(length) > MAX_FORM_BYTES:
            return refused("the form is missing or too large", 413)
        form = parse_qs((await request.body())[:MAX_FORM_BYTES].decode("utf-8", "replace"))
        given = (form.get("token") or [""])[0]
        if watch.token is None:
            return refused("replay is off: set [http] token in the service's configuration", 403)
        if not hmac.compare_digest(given.encode(), watch.token.encode()):
            log.warning("dashboard: a replay was refused (wrong token) from %s",
                        request.client.host if request.client else "?")
            return refused("refused: wrong token", 403)
        try:
            target = json.loads((form.get("target") or [""])[0])
            queue, message_id = str(target[0]), str(target[1])
        except (ValueError, IndexError, TypeError, KeyError):
            return refused("say which dead letter to replay", 400)
        from starlette.concurrency import run_in_threadpool
        try:
            n = await run_in_threadpool(_panels.replay, watch.live.settings, queue, message_id)
        except ValueError as e:
            return refused(str(e), 400)
        log.info("dashboard: replayed %d dead letter(s) of %s%s", n, queue,
                 f" (message {message_id})" if message_id else "")
        return RedirectResponse("/?" + urlencode({"replayed": n, "queue": queue})
                                + "#dead-letters", status_code=303)

    routes: list[Any] = [
        Route("/", page), Route("/panel/{name}", panel), Route("/metrics", metrics),
        Route("/healthz", healthz), Route("/dlq/replay", replay, methods=["POST"])]
    return Starlette(routes=routes)
