"""The web application (Starlette): the page, its panels, one record, one dead letter,
``/metrics``, and the controls.

Routes: ``GET /`` the page (its query string filters and pages the job log:
``record``, ``state``, ``queue``, ``workflow``, ``since``, ``before``; and
picks the statistics' window, ``stats``), ``GET /panel/<name>`` one panel's
HTML (what the page's script refreshes, with the same query string),
``GET /record/<id>`` a record's page, ``GET /dead-letter?queue=Q&message=ID``
a dead letter's (its body's start), ``GET /dead-letter/body?queue=Q&message=ID``
its whole body (a download, behind the token), ``GET /metrics`` Prometheus'
text format, ``GET /healthz``, and the controls (``_controls``): the only
routes that change anything, each a POST that needs the ``[http] token`` of
the configuration.  Who may read what, the Host allow-list and the security
headers are ``_guard``'s, stacked around the routes here.  A query string
that is malformed or ambiguous (a key given twice) is answered 400 with the
reason.  Handlers are plain functions: Starlette runs them on its thread
pool, so a slow broker or database never blocks the event loop.  Nothing
here opens a database engine or a broker connection: the pages read the
service's store and replay on its link.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response
from starlette.routing import Route

from listener_router._errors import InfrastructureError
from listener_router.dead_letters import AmbiguousMessageId, dead_letters
from listener_router.watch import _console, _panels
from listener_router.watch._controls import control_routes, notice
from listener_router.watch._events import EventStream
from listener_router.watch._guard import (
    Access,
    ReadGuard,
    SecurityHeaders,
    Throttle,
    content_security_policy,
)
from listener_router.watch._joblog import SINCE, STATES, JobQuery, job_page
from listener_router.watch._pages import LATER, PANELS, SCRIPTS, render
from listener_router.watch._record import letter_view, record_view
from listener_router.watch._reprocess import reprocess_runs

if TYPE_CHECKING:
    import engine
    from listener_router._live import LiveView
    from listener_router.broker import Link
    from listener_router.cluster import Membership
    from listener_router.store import ServiceStore
    from listener_router.watch._history import History, Sampler
    from listener_router.watch._metrics import Metrics

__all__ = ["BadQuery", "make_app", "panel_html", "query"]


class Watch(Protocol):
    """What the application reads of the watch plug-in (``_server.Watch``)."""

    live: LiveView
    history: History
    sampler: Sampler
    metrics: Metrics
    membership: Membership
    registry: engine.WorkflowRegistry
    store: ServiceStore
    link: Link
    node: str
    token: str | None
    access: Access
    throttle: Throttle
    allowed_hosts: list[str]
    notice_key: bytes
    events: EventStream | None          # None: no kind of event is on

    def uptime(self) -> float: ...


Params = Mapping[str, str]
SHOWN_EVENTS = 20            # the newest events the panel lists
MAX_VALUE = 512              # characters of a query value read


class BadQuery(ValueError):
    """A query string the page cannot take as it is (answered 400 with this text)."""


def query(request: Request) -> dict[str, str]:
    """The query string as one value a key, each cut to ``MAX_VALUE`` characters.

    Raises:
        BadQuery: a key given twice with different values (which one was meant?).
    """
    found: dict[str, str] = {}
    for key, value in request.query_params.multi_items():
        value = value[:MAX_VALUE]
        if key in found and found[key] != value:
            raise BadQuery(f"{key!r} is given more than once ({found[key]!r}, {value!r}); "
                           "give it once")
        found[key] = value
    return found


def _topology(watch: Watch, _params: Params) -> str:
    topo = _panels.topology(watch.membership)
    columns = list(dict.fromkeys(k for m in topo.members for k in m))
    counts = [(k, watch.live.stats[k]) for k in ("batches", "received", "committed",
                                                   "duplicate", "retrying", "dead")]
    return render("topology.html", t=topo, columns=columns, counts=counts,
                  uptime=watch.uptime())


def _queues(watch: Watch, _params: Params) -> str:
    latest = watch.sampler.latest()
    return render("queues.html",
                  rows=_panels.queues(watch.live.settings, watch.history, watch.sampler),
                  every=watch.sampler.every, broker_up=latest is None or latest.broker_up)


def _lanes(watch: Watch, _params: Params) -> str:
    return render("lanes.html", rows=_console.lanes(watch.live, watch.store,
                                                    watch.sampler.latest()))


def _stats(watch: Watch, params: Params) -> str:
    window = params.get("stats", "1h")
    window = window if window in _console.WINDOWS else "1h"
    settings = watch.live.settings
    return render("stats.html", rows=_console.statistics(settings, watch.store, window),
                  window=window, windows=list(_console.WINDOWS),
                  interval=_console.stats_interval(settings))


def _batches(watch: Watch, _params: Params) -> str:
    return render("batches.html", batches=_panels.recent_batches(watch.history))


def _jobs(watch: Watch, params: Params) -> str:
    return render("jobs.html", p=job_page(watch.store, JobQuery.of(params)))


def _cancellations(watch: Watch, _params: Params) -> str:
    return render("cancellations.html", rows=_console.cancellations(watch.store))


def _dead_letters(watch: Watch, _params: Params) -> str:
    error = ""
    letters: list[_panels.DeadLetter] = []
    try:
        letters = _panels.dead_letters(watch.live.settings, watch.store)
    except Exception as e:  # the database is down: say so on the page
        error = f"dead letters unavailable: {type(e).__name__}: {e}"
    return render("dead_letters.html", letters=letters, error=error,
                  queues=sorted({d.queue for d in letters}), token_set=watch.token is not None)


def _schedules(watch: Watch, _params: Params) -> str:
    return render("schedules.html", rows=_console.schedules(watch.live.settings, watch.store))


def _journal(watch: Watch, _params: Params) -> str:
    return render("journal.html", journals=_console.journals(watch.live.settings))


def _events(watch: Watch, _params: Params) -> str:
    stream = watch.events
    if stream is None:
        return render("events.html", on=False)
    return render("events.html", on=True, events=stream.look()[:SHOWN_EVENTS],
                  exchange=stream.exchange,
                  keep=stream.keep, error=stream.error)


def _reprocess(watch: Watch, _params: Params) -> str:
    return render("reprocess.html", p=reprocess_runs(watch.store))


def _workflows(watch: Watch, _params: Params) -> str:
    views, orphans = _panels.workflows(watch.registry)
    return render("workflows.html", views=views, orphans=orphans)


PANEL_HTML: dict[str, Callable[[Watch, Params], str]] = {
    "topology": _topology, "lanes": _lanes, "queues": _queues, "stats": _stats,
    "batches": _batches, "jobs": _jobs, "cancellations": _cancellations,
    "dead_letters": _dead_letters, "schedules": _schedules, "journal": _journal,
    "events": _events, "workflows": _workflows, "reprocess": _reprocess,
}
assert set(PANEL_HTML) == set(PANELS)


def panel_html(watch: Watch, name: str, params: Params | None = None) -> str:
    """One panel's HTML, from that panel's data function (``params``: the page's query)."""
    return PANEL_HTML[name](watch, params or {})


def _letter_of(watch: Watch, values: Params) -> tuple[str, str]:
    """``queue`` and ``message`` of a dead letter's query string.

    Raises:
        BadQuery: one is missing, or the queue is no input queue of this service.
    """
    queue, message = values.get("queue", "").strip(), values.get("message", "").strip()
    if not queue or not message:
        raise BadQuery("say which dead letter: ?queue=QUEUE&message=MESSAGE-ID")
    if queue not in {rule.queue for rule in watch.live.settings.listeners}:
        raise BadQuery(f"{queue!r} is not an input queue of this service")
    return queue, message


def make_app(watch: Watch) -> Starlette:
    """The application serving ``watch``'s service, behind its guards (``_guard``)."""
    params = query

    def page(request: Request) -> Response:
        values = params(request)
        panels = {name: panel_html(watch, name, values) for name in PANELS if name not in LATER}
        settings = watch.live.settings
        return HTMLResponse(render(
            "page.html", node=watch.node, panels=panels, every=PANELS, later=LATER,
            notice=notice(values, watch.notice_key), jq=JobQuery.of(values), states=STATES,
            since=SINCE,
            queues=list(dict.fromkeys(r.queue for r in settings.listeners)),
            workflows=watch.registry.names()))

    def panel(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in PANELS:
            return PlainTextResponse(f"no panel {name!r}", status_code=404)
        return HTMLResponse(panel_html(watch, name, params(request)),
                            headers={"Cache-Control": "no-store"})

    def record(request: Request) -> Response:
        view = record_view(watch.store, request.path_params["record_id"][:512])
        return HTMLResponse(render("record.html", r=view), status_code=200 if view.found
                            or view.history else 404)

    def dead_letter(request: Request) -> Response:
        queue, message = _letter_of(watch, params(request))
        try:
            view = letter_view(watch.live.settings, watch.store, queue, message)
        except AmbiguousMessageId as e:
            raise BadQuery(str(e)) from None
        if view is None:
            return HTMLResponse(render("refused.html", message="no such dead letter (replayed "
                                       "or purged already?)", back="#dead-letters"),
                                status_code=404)
        return HTMLResponse(render("letter.html", d=view))

    def dead_letter_body(request: Request) -> Response:
        queue, message = _letter_of(watch, params(request))
        try:
            found = dead_letters(watch.live.settings, [queue], message_id=message,
                                 store=watch.store)
        except AmbiguousMessageId as e:
            raise BadQuery(str(e)) from None
        if not found:
            return PlainTextResponse("no such dead letter (replayed or purged already?)",
                                     status_code=404)
        name = "".join(c if c.isalnum() or c in "-._" else "_" for c in found[0].message_id)
        return Response(found[0].body, media_type="application/octet-stream", headers={
            "Content-Disposition": f'attachment; filename="{name[:100]}.body"'})

    def bad_query(_request: Request, error: Exception) -> Response:
        return HTMLResponse(render("refused.html", message=str(error), back=""),
                            status_code=400)

    def unavailable(_request: Request, error: Exception) -> Response:
        return HTMLResponse(render("refused.html", message=f"unavailable: {error}", back=""),
                            status_code=503)

    def metrics(_request: Request) -> Response:
        return Response(watch.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    def healthz(_request: Request) -> Response:
        return PlainTextResponse("ok")

    def login(headers: dict[str, str]) -> Response:
        return HTMLResponse(render("login.html"), status_code=401, headers=headers)

    routes: list[Any] = [
        Route("/", page), Route("/panel/{name}", panel), Route("/metrics", metrics),
        Route("/healthz", healthz), Route("/record/{record_id:path}", record),
        Route("/dead-letter", dead_letter), Route("/dead-letter/body", dead_letter_body),
        *control_routes(watch)]
    return Starlette(routes=routes, exception_handlers={
        BadQuery: bad_query, InfrastructureError: unavailable}, middleware=[
        Middleware(SecurityHeaders, policy=content_security_policy(SCRIPTS)),
        Middleware(TrustedHostMiddleware, allowed_hosts=watch.allowed_hosts,
                   www_redirect=False),
        Middleware(ReadGuard, access=watch.access, throttle=watch.throttle, login=login)])
