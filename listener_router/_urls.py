"""The one way the service prints a URL: never with a password in it.

:func:`shown_url` serves every URL the service names in a log line, an
error, a deferral reason, the page or ``chalk status``: a broker URL as
its host and port (the broker link's :func:`~listener_router.broker.where`),
a database URL as SQLAlchemy renders it with the password hidden
(:func:`blackboard.safe_url`).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from blackboard import safe_url
from listener_router.broker import where

__all__ = ["shown_url"]

_AMQP = ("amqp", "amqps")


def shown_url(url: str) -> str:
    """``url`` as it may be printed: ``amqp://host:port`` for a broker, the database URL with
    ``***`` for its password, and nothing of a string that is no URL at all."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme in _AMQP:
        try:
            return f"{scheme}://{where(url)}"
        except Exception:  # pika cannot read it (its TLS options name a missing file, say)
            return f"{scheme}://{_host_port(url, 5671 if scheme == 'amqps' else 5672)}"
    return safe_url(url)


def _host_port(url: str, default: int) -> str:
    try:
        parts = urlsplit(url)
        return f"{parts.hostname or 'localhost'}:{parts.port or default}"
    except ValueError:   # not even that: print none of it
        return "(unreadable URL)"
