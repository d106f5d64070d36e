"""Listener/router: rules, the RabbitMQ consumer, batching, commit, routing, the CLI.

The public names are imported on first use, so that a process that needs
only one module (the broker I/O process runs ``listener_router._amqp``)
does not pay for the service's imports (Spark, SQLAlchemy, lxml).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from listener_router._config import (
        ConfigError,
        ListenerRule,
        RouterRule,
        Settings,
        load_settings,
    )
    from listener_router._messages import BadMessage, Incoming, outgoing_id, parse_message
    from listener_router._records import RecordFileError, push_records, read_records
    from listener_router._service import Service, Stats

_HOMES = {
    "ConfigError": "_config", "ListenerRule": "_config", "RouterRule": "_config",
    "Settings": "_config", "load_settings": "_config",
    "BadMessage": "_messages", "Incoming": "_messages", "outgoing_id": "_messages",
    "parse_message": "_messages",
    "RecordFileError": "_records", "push_records": "_records", "read_records": "_records",
    "Service": "_service", "Stats": "_service",
}

__all__ = [
    "BadMessage",
    "ConfigError",
    "Incoming",
    "ListenerRule",
    "RecordFileError",
    "RouterRule",
    "Service",
    "Settings",
    "Stats",
    "load_settings",
    "outgoing_id",
    "parse_message",
    "push_records",
    "read_records",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'listener_router' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"listener_router.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
