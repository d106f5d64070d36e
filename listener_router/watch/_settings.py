"""``[http]``: where the metrics and the dashboard are served, and who may use them."""

from __future__ import annotations

from dataclasses import dataclass

from listener_router._errors import ConfigError
from listener_router._keys import section, setting

__all__ = ["HttpSettings", "parse_listen"]


def parse_listen(listen: str, where: str = "listen") -> tuple[str, int]:
    """``"host:port"`` (``"[::1]:9187"`` for IPv6) as ``(host, port)``; port 0 picks a free one.

    Raises:
        ConfigError: not of that form (``where`` names the setting).
    """
    host, sep, port = listen.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"{where}: {listen!r} is not host:port (e.g. \"127.0.0.1:9187\")")
    return host, int(port)


@section("http", "Prometheus metrics (`/metrics`) and the dashboard of `chalk run` "
         "(`chalk run --http HOST:PORT` sets `listen` too).",
         flat={"http_listen": "listen", "http_token": "token"})
@dataclass(frozen=True)
class HttpSettings:
    """The ``[http]`` keys."""

    listen: str | None = setting(
        None, "`host:port` (`[::1]:9187` for IPv6; port 0: any free one) where metrics and the "
        "dashboard are served; unset: off", check=parse_listen)
    token: str | None = setting(
        None, "the token the dashboard's controls need (pause and resume a lane, cancel, replay "
        "dead letters; it opens reads too); at least 16 characters; unset: the controls are "
        "refused, and a `listen` beyond loopback does not start (unless `public`)")
    read_token: str | None = setting(
        None, "a token that opens the pages, panels, `/metrics` and dead letters' bodies but "
        "no control; set, every read needs it or `token` (a browser gets a login form); "
        "unset: reads need `token` when `listen` is beyond loopback, nothing on loopback")
    public: bool = setting(
        False, "`listen` beyond loopback with no token, or reads open to all there: the "
        "network in front guards the port (it is logged at WARNING)")
    allowed_hosts: tuple[str, ...] = setting(
        (), "names the console answers to besides `localhost`, `127.0.0.1`, `[::1]` and the "
        "listen host (this machine's names too when bound to every interface): the `Host` "
        "a browser or Prometheus uses, e.g. `chalk.example.org`; others get 400")
