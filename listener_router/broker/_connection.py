"""Connections to the broker: its nodes, why a connection failed in words.

A broker URL names one node or several: ``amqp://…@mq1/%2F, amqp://…@mq2/%2F``
(commas or semicolons between them; a TOML list in ``chalk.toml``), the nodes
of one RabbitMQ cluster.  :func:`node_parameters` gives the parameters of each
node, tried in turn (pika's ``BlockingConnection`` takes the list as it is;
the service's link goes round them itself); :func:`connect` opens a blocking
connection to the first node that answers.

pika's ``AMQPConnectionError`` often prints as nothing at all (its cause is
nested in its arguments), which made "broker unavailable: AMQPConnectionError: "
the whole story.  :func:`broker_reason` digs the cause out; :func:`connect`
raises :class:`BrokerUnavailable` naming the nodes and that reason.
"""

from __future__ import annotations

import socket
import urllib.parse
from typing import Any

import pika
import pika.exceptions
from pika.adapters.utils.connection_workflow import AMQPConnectorException

from listener_router._errors import BrokerUnavailable
from listener_router._settings import broker_urls

__all__ = ["broker_reason", "broker_urls", "connect", "connection_parameters", "node_parameters",
           "where"]

def connection_parameters(url: str, *, heartbeat: int = 30) -> pika.URLParameters:
    """The parameters every connection of Chalk's uses to one node: ``url``, a heartbeat
    (``heartbeat`` seconds unless the URL says ``?heartbeat=N``), short timeouts.

    Raises ValueError for a URL naming several nodes (:func:`node_parameters` is for those).
    """
    urls = broker_urls(url)
    if len(urls) != 1:
        raise ValueError(f"{where(url)}: {len(urls)} broker nodes where one was expected "
                         "(node_parameters gives one set of parameters a node)")
    params = pika.URLParameters(urls[0])
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(urls[0]).query)
    if "heartbeat" not in query:
        params.heartbeat = heartbeat
    params.blocked_connection_timeout = 60
    params.connection_attempts = 1
    if "socket_timeout" not in query:
        params.socket_timeout = 5
    return params


def node_parameters(url: str, *, heartbeat: int = 30) -> list[pika.URLParameters]:
    """:func:`connection_parameters` of each node ``url`` names, in order."""
    return [connection_parameters(u, heartbeat=heartbeat) for u in broker_urls(url)]


def where(url: str) -> str:
    """``host:port`` of each node of a broker URL, comma-separated (no user, no password)."""
    return ", ".join(f"{p.host}:{p.port}" for p in map(pika.URLParameters, broker_urls(url)))


def _causes(e: BaseException) -> list[Any]:
    """``e`` and what it wraps: pika nests the socket error in its arguments."""
    out: list[Any] = []
    todo: list[Any] = [e]
    while todo and len(out) < 20:
        item = todo.pop(0)
        out.append(item)
        if isinstance(item, BaseException):
            todo += list(getattr(item, "exceptions", None) or ())  # a workflow's attempts
            inner = getattr(item, "exception", None)  # a connector phase's error
            if isinstance(inner, BaseException):
                todo.append(inner)
            todo += [a for a in item.args if isinstance(a, (BaseException, str))]
            if item.__cause__ is not None:
                todo.append(item.__cause__)
    return out


def broker_reason(e: BaseException, url: str | None = None) -> str:
    """What went wrong connecting to the broker, e.g. ``connection refused`` (never empty)."""
    user = pika.URLParameters(broker_urls(url)[0]).credentials.username if url else None
    causes = _causes(e)
    texts = " ".join(str(c) for c in causes) + " " + " ".join(type(c).__name__ for c in causes)
    if any(isinstance(c, pika.exceptions.ProbableAuthenticationError) for c in causes) \
            or "ACCESS_REFUSED" in texts:
        return (f"login refused{f' for user {user!r}' if user else ''} (check the user and "
                "password in the broker URL)")
    if any(isinstance(c, pika.exceptions.ProbableAccessDeniedError) for c in causes) \
            or "NOT_ALLOWED" in texts:
        return "access to the virtual host refused (check the vhost in the broker URL)"
    if any(isinstance(c, ConnectionRefusedError) for c in causes) or "Connection refused" in texts:
        return "connection refused (nothing listens there: is RabbitMQ running?)"
    if any(isinstance(c, socket.gaierror) for c in causes):
        return "host name not found"
    if any(isinstance(c, TimeoutError) for c in causes) or "timed out" in texts.lower() \
            or "timeout" in texts.lower():
        return "timed out (no answer: a firewall, a wrong host, or a broker too busy to answer)"
    if any(isinstance(c, pika.exceptions.StreamLostError) for c in causes):
        return f"connection lost: {next(str(c) for c in causes if str(c))}"
    for c in causes:
        text = str(c)
        if text:
            return text if isinstance(c, str) else f"{type(c).__name__}: {text}"
    return f"{type(e).__name__} (pika gave no reason)"


def connect(url: str, params: pika.ConnectionParameters | None = None) -> pika.BlockingConnection:
    """A blocking connection to the first node of ``url`` that answers (each tried in
    turn); :class:`BrokerUnavailable` saying why when none does."""
    try:
        return pika.BlockingConnection(params or node_parameters(url))
    except (pika.exceptions.AMQPError, AMQPConnectorException, OSError) as e:
        raise BrokerUnavailable(f"cannot connect to the broker at {where(url)}: "
                                f"{broker_reason(e, url)}") from e
