"""Listener/router: rules, the RabbitMQ consumer, batching, commit, routing, the CLI."""

from listener_router._config import ConfigError, ListenerRule, RouterRule, Settings, load_settings
from listener_router._messages import BadMessage, Incoming, outgoing_id, parse_message
from listener_router._records import RecordFileError, push_records, read_records
from listener_router._service import Service, Stats

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
