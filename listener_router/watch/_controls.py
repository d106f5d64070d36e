"""The page's controls: every route that changes anything, each behind ``[http] token``.

``POST /lanes/pause`` and ``/lanes/resume`` (a lane, on every member, as
``chalk queue pause|resume``), ``POST /cancel`` and ``/uncancel`` (message
IDs, a record for a while, a schedule's tick, as ``chalk jobs
cancel|uncancel``), ``POST /dlq/replay`` (``chalk dlq replay``).  Each reads
a small form, refuses it when no token is configured or the token differs
(compared in constant time, the refusal logged, wrong tries from one address
slowed down by the ``_guard`` throttle), does what the command does (the
same functions, in ``listener_router._control`` and the dead-letters
feature, on the service's store and link) off the event loop, and sends the
browser back to the page with a notice of what was done.  The notice's words
travel in the redirect's query string, signed with a key of this process:
the page shows no notice a link from elsewhere made up.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import parse_qs, urlencode

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from listener_router._control import cancel, parse_duration, set_paused
from listener_router._errors import ConfigError, StoreUnavailable
from listener_router.store import unavailable
from listener_router.watch import _panels
from listener_router.watch._guard import Throttle
from listener_router.watch._pages import render

if TYPE_CHECKING:
    from listener_router._live import LiveView
    from listener_router.broker import Link
    from listener_router.store import ServiceStore

__all__ = ["MAX_FORM_BYTES", "control_routes", "notice"]

log = logging.getLogger(__name__)

MAX_FORM_BYTES = 16 * 1024

# what a control did, as the page says it (the redirect carries only these words' keys)
# (``on``: the queue or what was cancelled; the job log's filters keep their own names)
_DONE = {
    "replayed": "replayed {n} dead letter(s) to {on}",
    "paused": "paused {on} (every member obeys within a second)",
    "resumed": "resumed {on} (every member obeys within a second)",
    "cancelled": "cancelled {n}: {on} (every member obeys within a second)",
    "withdrew": "withdrew {n} cancellation(s) of {on}",
}


def _signature(key: bytes, did: str, n: str, on: str) -> str:
    return hmac.new(key, f"{did}\x00{n}\x00{on}".encode(), hashlib.sha256).hexdigest()[:32]


def notice(params: Any, key: bytes) -> str:
    """The notice a redirect after a control asks the page to show ("" for none, and for
    one not signed with ``key``: a link from elsewhere cannot put words on the page)."""
    did = params.get("did", "")
    if did not in _DONE:
        return ""
    n, on = params.get("n") or "0", params.get("on") or "?"
    if not hmac.compare_digest(params.get("sig", ""), _signature(key, did, n, on)):
        return ""
    return _DONE[did].format(n=n, on=on)


def refused(message: str, status: int, back: str = "",
            headers: dict[str, str] | None = None) -> Response:
    return HTMLResponse(render("refused.html", message=message, back=back), status_code=status,
                        headers=headers)


def _done(section: str, key: bytes, **values: Any) -> Response:
    values = {k: str(v) for k, v in values.items() if v is not None}
    values["sig"] = _signature(key, values.get("did", ""), values.get("n") or "0",
                               values.get("on") or "?")
    return RedirectResponse("/?" + urlencode(values) + f"#{section}", status_code=303)


class Watch(Protocol):
    """What the controls use of the watch plug-in (``_server.Watch``)."""

    live: LiveView
    store: ServiceStore
    link: Link
    token: str | None
    throttle: Throttle
    notice_key: bytes


Handler = Callable[[dict[str, str], str], Awaitable[Response]]


def _guarded(watch: Watch, what: str, section: str, handler: Handler) -> Callable[
        [Request], Awaitable[Response]]:
    """``handler(form, by)`` once the form's token is the configured one."""

    async def route(request: Request) -> Response:
        length = request.headers.get("content-length")
        if length is None or not length.isdigit() or int(length) > MAX_FORM_BYTES:
            return refused("the form is missing or too large", 413, f"#{section}")
        form = {k: v[0] for k, v in parse_qs((await request.body())[:MAX_FORM_BYTES]
                                             .decode("utf-8", "replace")).items()}
        if watch.token is None:
            return refused(f"{what} is off: set [http] token in the service's configuration",
                           403, f"#{section}")
        client = request.client.host if request.client else "?"
        wait = watch.throttle.wait(client)
        if wait > 0:
            return refused(f"refused: too many wrong tokens from {client}; try again in "
                           f"{wait:.0f} s", 429, f"#{section}",
                           headers={"Retry-After": str(max(1, round(wait)))})
        if not hmac.compare_digest(form.get("token", "").encode(), watch.token.encode()):
            watch.throttle.failed(client)
            log.warning("dashboard: %s was refused (wrong token) from %s", what, client)
            return refused("refused: wrong token", 403, f"#{section}")
        watch.throttle.passed(client)
        try:
            return await handler(form, f"the dashboard ({client})")
        except (ConfigError, ValueError) as e:
            return refused(str(e), 400, f"#{section}")
        except StoreUnavailable as e:
            return refused(f"not done: {e}", 503, f"#{section}")
    return route


def _withdraw_prefix(watch: Watch, prefix: str) -> int:
    store = watch.store
    with store.writes, unavailable():
        return store.cancellations.withdraw("prefix", [prefix])


def control_routes(watch: Watch) -> list[Route]:
    """The POST routes of ``watch``'s page."""
    settings = watch.live.settings

    async def replay(form: dict[str, str], by: str) -> Response:
        try:
            target = json.loads(form.get("target", ""))
            queue, message_id = str(target[0]), str(target[1])
        except (ValueError, IndexError, TypeError, KeyError):
            raise ValueError("say which dead letter to replay") from None
        n = await run_in_threadpool(_panels.replay, settings, queue, message_id, watch.store,
                                    watch.link)
        log.info("dashboard: replayed %d dead letter(s) of %s%s (%s)", n, queue,
                 f" (message {message_id})" if message_id else "", by)
        return _done("dead-letters", watch.notice_key, did="replayed", n=n, on=queue)

    def pausing(paused: bool) -> Handler:
        async def handle(form: dict[str, str], by: str) -> Response:
            queue = form.get("queue", "")
            await run_in_threadpool(lambda: set_paused(
                settings, queue, paused, reason=form.get("reason", "")[:500] or None, by=by,
                store=watch.store))
            log.warning("dashboard: %s %s (%s)", "paused" if paused else "resumed", queue, by)
            return _done("lanes", watch.notice_key, did="paused" if paused else "resumed", on=queue)
        return handle

    def cancelling(undo: bool) -> Handler:
        async def handle(form: dict[str, str], by: str) -> Response:
            if undo:
                kind, value = form.get("kind", ""), form.get("value", "")
                if kind not in ("message", "record", "prefix") or not value:
                    raise ValueError("say which cancellation to withdraw")
                if kind == "prefix":   # a schedule's tick: withdraw exactly that prefix
                    n = await run_in_threadpool(_withdraw_prefix, watch, value)
                else:
                    n = await run_in_threadpool(lambda: cancel(
                        settings, undo=True, store=watch.store,
                        messages=[value] if kind == "message" else [],
                        records=[value] if kind == "record" else []))
                return _done("cancel", watch.notice_key, did="withdrew", n=n, on=value)
            messages = form.get("messages", "").replace(",", " ").split()
            record = form.get("record", "").strip()
            schedule, tick = form.get("schedule", "").strip(), form.get("tick", "").strip()
            until = (time.time() + parse_duration(form["for"], "for")
                     if form.get("for", "").strip() and record else None)
            n = await run_in_threadpool(lambda: cancel(
                settings, messages=messages, records=[record] if record else [],
                schedule=schedule or None, tick=tick or None, until=until, by=by,
                store=watch.store))
            what = ", ".join([*messages, *([f"record {record}"] if record else []),
                              *([f"{schedule} tick {tick}"] if schedule else [])])
            log.warning("dashboard: cancelled %s (%s)", what, by)
            return _done("cancel", watch.notice_key, did="cancelled", n=n, on=what[:200])
        return handle

    return [
        Route("/dlq/replay", _guarded(watch, "replay", "dead-letters", replay), methods=["POST"]),
        Route("/lanes/pause", _guarded(watch, "pausing a lane", "lanes", pausing(True)),
              methods=["POST"]),
        Route("/lanes/resume", _guarded(watch, "resuming a lane", "lanes", pausing(False)),
              methods=["POST"]),
        Route("/cancel", _guarded(watch, "cancelling", "cancel", cancelling(False)),
              methods=["POST"]),
        Route("/uncancel", _guarded(watch, "withdrawing a cancellation", "cancel",
                                    cancelling(True)), methods=["POST"]),
    ]
