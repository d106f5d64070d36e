"""The watch plug-in: metrics, history, the sampler and the web server of one service.

Built when ``[http] listen`` (or ``chalk run --http``) is set.  Installed, it
reads the service through its typed live view (``LiveView``), its store and
link, and the dead-letters plug-in; its ``batch_finished`` hook feeds the
metrics and the history; started, it runs the sampler thread and serves the
application with uvicorn on a thread of its own (``chalk-http``).  Built, it
refuses tokens strangers could guess and a port beyond loopback that
nothing guards (``_guard.check_tokens``: ``chalk run`` stops before it
connects to anything); started, it warns whenever the port is reachable
from other machines.  With any kind of
event on, the page's events panel follows ``[events] exchange`` while it is
looked at (``_events``).  The socket is bound
at start, before the thread starts, so a bad or busy address fails ``chalk
run`` at once with a clear error.
"""

from __future__ import annotations

import logging
import secrets
import socket
import threading
import time
from typing import TYPE_CHECKING, Any

from listener_router._errors import ConfigError
from listener_router._plugin import Host, Plugin, plugin_classes
from listener_router.watch._guard import (
    Access,
    Throttle,
    check_tokens,
    host_names,
    is_loopback,
)
from listener_router.watch._settings import HttpSettings, parse_listen

if TYPE_CHECKING:  # the web stack is imported when the plug-in is installed, not before
    from listener_router._settings import Settings
    from listener_router.pipeline import BatchReport
    from listener_router.watch._events import EventStream

__all__ = ["Watch"]

log = logging.getLogger(__name__)


class Watch(Plugin):
    """Metrics and the dashboard of a running service, served on ``listen``."""

    name = "watch"
    requires = ("dead_letters",)
    after = ("jobs",)
    sections = (HttpSettings,)

    @classmethod
    def build(cls, settings: Settings) -> Watch | None:
        http: HttpSettings = settings.section("http")
        return cls(http.listen, http.token, read_token=http.read_token, public=http.public,
                   allowed_hosts=http.allowed_hosts) if http.listen else None

    def __init__(self, listen: str | None = None, token: str | None = None, *,
                 read_token: str | None = None, public: bool = False,
                 allowed_hosts: tuple[str, ...] = (), sample_every: float = 5.0):
        self.listen = listen or "127.0.0.1:9187"
        self.token = token or None
        self.read_token = read_token or None
        self.public = public
        host, _port = parse_listen(self.listen, "[http] listen")
        check_tokens(listen_host=host, token=self.token, read_token=self.read_token,
                     public=public)
        self.access = Access.of(listen_host=host, token=self.token, read_token=self.read_token,
                                public=public)
        self.allowed_hosts = host_names(host, allowed_hosts)
        self.throttle = Throttle()
        self.notice_key = secrets.token_bytes(16)
        self.sample_every = sample_every
        self.started = time.time()
        self._server: Any = None   # uvicorn.Server
        self._thread: threading.Thread | None = None
        self.address: tuple[str, int] | None = None
        self.events: EventStream | None = None

    def install(self, host: Host) -> None:
        from listener_router.watch._history import History, Sampler
        from listener_router.watch._metrics import Live, Metrics
        from listener_router.watch._panels import known_queues

        live = self.live = host.live
        settings = live.settings
        # messages to the plug-ins' exchanges are events, not routed messages
        side = {name for cls in plugin_classes() for name, _kind in cls.exchanges(settings)}  # type: ignore[attr-defined]
        self.history = History(side_exchanges=side)
        self.membership = live.membership
        self.store = live.store
        self.link = host.link
        self.registry = live.registry
        self.node = live.node
        self.started = live.started
        dead = host.plugin("dead_letters")
        owner, store = self.node, self.store
        self.sampler = Sampler(settings.broker_url,
                               lambda: [q for q, _role in known_queues(settings, self.history)],
                               self.history,
                               lambda: store.sql.lease_counts().get(owner, 0),
                               every=self.sample_every,
                               kept=getattr(dead, "kept", None))
        events = _events_settings(settings)
        if events is not None and events.any:
            from listener_router.watch._events import EventStream

            self.events = EventStream(settings.broker_url, events.exchange)
        self.metrics = Metrics(Live(
            is_leader=lambda: self.membership.is_leader,
            members=lambda: len(self.membership.live),
            workflows=lambda: [(wf.name, wf.version, wf.path)
                               for wf in map(self.registry.get, self.registry.names())],
            workflow_errors=lambda: len(self.registry.errors),
            batch_size=live.batch_size,
            in_flight=live.in_flight,
            sample=self.sampler.latest,
            last_batch=lambda: self.history.last_batch), side_exchanges=side)

    def batch_finished(self, report: BatchReport) -> None:
        self.metrics.batch_finished(report)
        self.history.batch_finished(report)

    def uptime(self) -> float:
        return time.time() - self.started

    @property
    def url(self) -> str:
        assert self.address is not None, "start() first"
        host, port = self.address
        return f"http://{'[' + host + ']' if ':' in host else host}:{port}/"

    def start(self) -> None:
        import uvicorn

        from listener_router.watch._app import make_app

        host, port = parse_listen(self.listen, "[http] listen")
        try:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
        except OSError as e:
            raise ConfigError(f"[http] listen: cannot listen on {self.listen}: {e}") from e
        self.address = sock.getsockname()[:2]
        self.sampler.start()
        config = uvicorn.Config(make_app(self), log_config=None, access_log=False,
                                lifespan="off", log_level="warning")
        server = self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]},
                                        name="chalk-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not server.started and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        if not server.started:
            self.stop()
            raise ConfigError(f"[http] listen: the web server did not start on {self.listen}")
        log.info("metrics and dashboard on %s (metrics at %smetrics)", self.url, self.url)
        if not is_loopback(host):
            if self.access.reads_locked:
                log.warning("the dashboard on %s is reachable from other machines: its pages "
                            "and metrics need the token, its controls [http] token; the token "
                            "travels in clear text unless TLS is put in front (docs/security.md)",
                            self.url)
            else:
                log.warning("the dashboard on %s is reachable from other machines and serves "
                            "its pages and metrics to anyone who reaches it (public = true)%s",
                            self.url, "" if self.token else "; its controls are off")

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        sampler = getattr(self, "sampler", None)
        if sampler is not None:
            sampler.stop()
        if self.events is not None:
            self.events.stop()


def _events_settings(settings: Settings) -> Any:
    """``[events]``, when the events plug-in is installed (the page follows them)."""
    try:
        return settings.section("events")
    except KeyError:
        return None
