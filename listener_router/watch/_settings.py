"""``[http]``: where the metrics and the dashboard are served, and the token of its controls."""

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
        "dead letters); unset: the controls are refused")
