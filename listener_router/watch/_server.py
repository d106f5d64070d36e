"""The watch: metrics, history, the sampler and the web server of one service.

``Watch(service).start()`` (the service does this when ``[http] listen`` or
``chalk run --http`` is set) registers the metrics and the history as batch
observers, starts the sampler thread and serves the application with
uvicorn on a thread of its own (``chalk-http``).  The socket is bound here,
before the thread starts, so a bad or busy address fails ``chalk run`` at
once with a clear error.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import TYPE_CHECKING

import uvicorn

from listener_router._config import parse_listen
from listener_router._errors import ConfigError
from listener_router.watch._app import make_app
from listener_router.watch._history import History, Sampler
from listener_router.watch._metrics import Live, Metrics
from listener_router.watch._panels import known_queues

if TYPE_CHECKING:
    from listener_router._service import Service

__all__ = ["Watch"]

log = logging.getLogger(__name__)


class Watch:
    """Metrics and the dashboard of ``service`` (opened), served on ``listen``."""

    def __init__(self, service: Service, listen: str | None = None, *,
                 sample_every: float = 5.0):
        settings = service.settings
        self.service = service
        self.listen = listen or settings.http_listen or "127.0.0.1:9187"
        self.token = settings.http_token or None
        assert service.membership is not None and service.store is not None, "open() first"
        self.membership = service.membership
        self.store = service.store
        self.registry = service.registry
        self.node = service.node
        self.started = time.time()
        self.history = History()
        owner = self.node
        store = self.store
        self.sampler = Sampler(settings.broker_url,
                               lambda: [q for q, _role in known_queues(settings, self.history)],
                               self.history,
                               lambda: store.sql.lease_counts().get(owner, 0),
                               every=sample_every,
                               kept=lambda: store.dead_letters.counts(
                                   [rule.queue for rule in settings.listeners]))
        inflight = service.inflight
        self.metrics = Metrics(Live(
            is_leader=lambda: self.membership.is_leader,
            members=lambda: len(self.membership.live),
            workflows=lambda: [(wf.name, wf.version, wf.path)
                               for wf in map(self.registry.get, self.registry.names())],
            workflow_errors=lambda: len(self.registry.errors),
            batch_size=lambda: service.gathering.sizing.size,
            in_flight=lambda: len(inflight) if inflight is not None else 0,
            sample=self.sampler.latest,
            last_batch=lambda: self.history.last_batch))
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.address: tuple[str, int] | None = None

    def uptime(self) -> float:
        return time.time() - self.started

    @property
    def url(self) -> str:
        assert self.address is not None, "start() first"
        host, port = self.address
        return f"http://{'[' + host + ']' if ':' in host else host}:{port}/"

    def start(self) -> Watch:
        host, port = parse_listen(self.listen, "[http] listen")
        try:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
        except OSError as e:
            raise ConfigError(f"[http] listen: cannot listen on {self.listen}: {e}") from e
        self.address = sock.getsockname()[:2]
        self.service.observers.add(self.metrics)
        self.service.observers.add(self.history)
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
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.sampler.stop()
