"""Who may read and change what the console serves.

Theory of operation.  Three guards stand in front of every route, outermost
first (``make_app`` stacks them):

- :class:`SecurityHeaders` puts on every response, refusals too, the
  headers that keep the page from being framed, sniffed or leaking its
  address (``X-Frame-Options``, a ``Content-Security-Policy`` whose
  ``script-src`` lists the hashes of the page's inline scripts and nothing
  else, ``nosniff``, ``Referrer-Policy``, ``Cache-Control: no-store``);
- Starlette's ``TrustedHostMiddleware`` answers 400 to a ``Host`` not on the
  allow-list (:func:`host_names`: the listen host, ``localhost``,
  ``127.0.0.1``, ``[::1]``, this machine's names when bound to every
  interface, and ``[http] allowed_hosts``), so a DNS-rebinding page cannot
  read a console on loopback;
- :class:`ReadGuard` asks for a token on reads when :class:`Access` says
  reads are locked: ``Authorization: Bearer <token>`` (``read_token`` or
  ``token``).  A page opened in a browser without one gets the login form
  (``login.html``); its script keeps the token in ``sessionStorage`` (this
  tab only, as the controls do) and fetches the page again with the header.
  ``/metrics`` needs no token from loopback, and takes the bearer token from
  anywhere else; ``/healthz`` is open; a dead letter's whole body always
  needs a token.

Wrong tokens, on reads and on the controls (``_controls``), are counted per
client address by :class:`Throttle`: after a few, each next try waits twice
as long as the one before.  :func:`check_tokens` refuses, at start, a token
shorter than ``MIN_TOKEN`` characters or one the docs show as an example
(``EXAMPLE_TOKENS``; a test keeps that list in step with the docs), and a
console bound beyond loopback with no token at all unless ``public = true``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from listener_router._errors import ConfigError

__all__ = ["EXAMPLE_TOKENS", "MAKE_ONE", "MIN_TOKEN", "Access", "ReadGuard", "SecurityHeaders",
           "Throttle", "bearer", "check_tokens", "content_security_policy",
           "host_names", "is_loopback", "is_wildcard"]

MIN_TOKEN = 16
MAKE_ONE = "python -c 'import secrets; print(secrets.token_urlsafe(24))'"
# every token the docs show in an example: a copied configuration must not work
EXAMPLE_TOKENS = frozenset({
    "change-me", "changeme", "secret", "token", "operator-token",
    "paste-a-token-made-by-secrets-here", "another-token-for-reading-only",
})


def is_wildcard(host: str) -> bool:
    return host in ("", "0.0.0.0", "::", "*")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a listen host or a client's address) is this machine only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_tokens(*, listen_host: str, token: str | None, read_token: str | None,
                 public: bool) -> None:
    """Refuse a console that strangers could use (see the module doc).

    Raises:
        ConfigError: naming the key and what to do.
    """
    for key, value in (("token", token), ("read_token", read_token)):
        if value is None:
            continue
        if value in EXAMPLE_TOKENS or value.lower() in EXAMPLE_TOKENS:
            raise ConfigError(f"[http] {key} is an example from the docs: anyone who read them "
                              f"knows it; make one with {MAKE_ONE}")
        if len(value) < MIN_TOKEN:
            raise ConfigError(f"[http] {key} has {len(value)} characters; use at least "
                              f"{MIN_TOKEN} (make one with {MAKE_ONE})")
    if not is_loopback(listen_host) and token is None and read_token is None and not public:
        raise ConfigError(
            f"[http] listen is {listen_host!r}, beyond this machine, and no [http] token is "
            "set: anyone who reaches the port could read every record and dead letter. Set "
            f"[http] token (env CHALK_HTTP_TOKEN; make one with {MAKE_ONE}), listen on "
            "127.0.0.1, or say public = true in [http] if the network in front guards it")


@dataclass(frozen=True)
class Access:
    """Which tokens open what (see the module doc)."""

    token: str | None              # the controls'; opens reads too
    read_token: str | None         # reads only
    reads_locked: bool             # reads need one of the two

    @classmethod
    def of(cls, *, listen_host: str, token: str | None, read_token: str | None,
           public: bool) -> Access:
        locked = read_token is not None or (not is_loopback(listen_host) and not public
                                            and token is not None)
        return cls(token, read_token, locked)

    def reads_with(self, given: str | None) -> bool:
        """Whether ``given`` opens reads."""
        return given is not None and any(
            hmac.compare_digest(given.encode(), t.encode())
            for t in (self.token, self.read_token) if t is not None)

    @property
    def any_token(self) -> bool:
        return self.token is not None or self.read_token is not None


class Throttle:
    """Wrong tokens per client address: ``free`` of them cost nothing, then each next try
    waits twice as long as the last (from ``first`` seconds up to ``most``); a right token
    clears the address.  At most ``keep`` addresses are remembered (the oldest go)."""

    def __init__(self, *, free: int = 3, first: float = 1.0, most: float = 300.0,
                 keep: int = 10_000):
        self.free, self.first, self.most, self.keep = free, first, most, keep
        self._failures: OrderedDict[str, tuple[int, float]] = OrderedDict()
        self._lock = threading.Lock()

    def wait(self, client: str) -> float:
        """Seconds before ``client`` may try a token again (0: now)."""
        with self._lock:
            found = self._failures.get(client)
        return 0.0 if found is None else max(0.0, found[1] - time.monotonic())

    def failed(self, client: str) -> None:
        with self._lock:
            count = self._failures.pop(client, (0, 0.0))[0] + 1
            over = count - self.free
            delay = 0.0 if over <= 0 else min(self.most, self.first * 2 ** (over - 1))
            self._failures[client] = (count, time.monotonic() + delay)
            while len(self._failures) > self.keep:
                self._failures.popitem(last=False)

    def passed(self, client: str) -> None:
        with self._lock:
            self._failures.pop(client, None)


def bearer(headers: Headers) -> str | None:
    """The token of an ``Authorization: Bearer …`` header, or None."""
    value = headers.get("authorization", "")
    scheme, _, token = value.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def host_names(listen_host: str, extra: Iterable[str] = ()) -> list[str]:
    """The ``Host`` names the console answers to (see the module doc)."""
    hosts = {"localhost", "127.0.0.1", "[::1]"}
    if is_wildcard(listen_host):
        names = {socket.gethostname(), socket.getfqdn()}
        for name in list(names):
            try:
                names |= {str(info[4][0]) for info in socket.getaddrinfo(name, None)}
            except OSError:
                pass
        hosts |= {f"[{n}]" if ":" in n else n for n in names if n}
    else:
        hosts.add(f"[{listen_host}]" if ":" in listen_host else listen_host)
    hosts |= {h.strip() for h in extra if h.strip()}
    return sorted(h.lower() for h in hosts)


def _hash(script: str) -> str:
    digest = hashlib.sha256(script.encode()).digest()
    return f"'sha256-{base64.b64encode(digest).decode()}'"


def content_security_policy(scripts: Iterable[str]) -> str:
    """The policy every response carries: only the page's own inline ``scripts`` run, it
    talks to its own origin only and no other site may frame it."""
    return ("default-src 'none'; script-src " + " ".join(_hash(s) for s in scripts)
            + "; style-src 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; "
            "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")


class SecurityHeaders:
    """Adds the security headers to every response (pure ASGI: streaming untouched)."""

    def __init__(self, app: ASGIApp, policy: str):
        self.app = app
        self.headers = [
            (b"content-security-policy", policy.encode()),
            (b"x-frame-options", b"DENY"),
            (b"x-content-type-options", b"nosniff"),
            (b"referrer-policy", b"no-referrer"),
            (b"cross-origin-opener-policy", b"same-origin"),
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", [])
                           if k.lower() not in {h for h, _ in self.headers}]
                if not any(k.lower() == b"cache-control" for k, _ in headers):
                    headers.append((b"cache-control", b"no-store"))
                message["headers"] = headers + self.headers
            await send(message)

        await self.app(scope, receive, with_headers)


# routes every reader may open; the whole-body download needs a token whatever reads need
OPEN = frozenset({"/healthz"})
ALWAYS_TOKEN = ("/dead-letter/body",)
HTML_ROUTES = ("/", "/record/", "/dead-letter")


def client_of(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else "?"


class ReadGuard:
    """Reads behind the token when :class:`Access` says so (see the module doc);
    ``login`` renders the form a browser gets instead of a locked page."""

    def __init__(self, app: ASGIApp, access: Access, throttle: Throttle, login: Any):
        self.app = app
        self.access = access
        self.throttle = throttle
        self.login = login

    def _needs(self, path: str, client: str) -> bool:
        if path in OPEN:
            return False
        if path.startswith(ALWAYS_TOKEN):
            return True
        if path == "/metrics" and is_loopback(client):
            return False
        return self.access.reads_locked

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        path, client = scope["path"], client_of(scope)
        if not self._needs(path, client):
            await self.app(scope, receive, send)
            return
        refusal = self.refusal(path, client, bearer(Headers(scope=scope)))
        await (refusal or self.app)(scope, receive, send)

    def refusal(self, path: str, client: str, given: str | None) -> Response | None:
        """None when ``given`` opens ``path`` for ``client``; else the answer."""
        if not self.access.any_token:
            return PlainTextResponse("off: set [http] token in the service's configuration",
                                     status_code=403)
        wait = self.throttle.wait(client)
        if given is not None and wait > 0:
            return PlainTextResponse(f"too many wrong tokens from {client}: try again in "
                                     f"{wait:.0f} s", status_code=429,
                                     headers={"Retry-After": str(max(1, round(wait)))})
        if self.access.reads_with(given):
            self.throttle.passed(client)
            return None
        if given is not None:
            self.throttle.failed(client)
        page = path == "/" or path.startswith(HTML_ROUTES[1:]) and not path.startswith(
            ALWAYS_TOKEN)
        challenge = {"WWW-Authenticate": 'Bearer realm="chalk"'}
        if page and given is None:
            return self.login(challenge)
        return PlainTextResponse("wrong token" if given else "this needs the token "
                                 "(Authorization: Bearer …)", status_code=401, headers=challenge)
