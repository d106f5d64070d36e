"""Listener/router: rules, the RabbitMQ link, batching, commit, routing, the cluster, the CLI.

Where things live (see ``docs/internals.md`` for one message's way through them):

- ``broker/``   — everything that talks AMQP: the link (a thread, or a child
  process), the queues Chalk declares, starting a local RabbitMQ;
- ``pipeline/`` — the stages a batch goes through: gather → execute →
  commit → finish, the message life table, retries and dead letters;
- ``store/``    — the service's own tables (inbox, outbox, nodes);
- ``cluster/``  — membership, the fenced leader, views and topology events,
  failover, the leader's periodic tasks;
- ``events/``   — distributed events on the ``chalk.events`` topic exchange;
- ``cli/``      — the ``chalk`` command;
- ``_service``  — :class:`Service`: wiring and lifecycle;
- ``_config``, ``_messages``, ``_rules``, ``_records``, ``_errors`` —
  settings, message format, listener/router rules, record files, errors.

The public names are imported on first use, so that a process that needs
only one module (the broker I/O process runs ``listener_router.broker``)
does not pay for the service's imports (Spark, SQLAlchemy, lxml).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from listener_router._lazy import lazy_names

if TYPE_CHECKING:
    from listener_router._config import (
        ListenerRule,
        RouterRule,
        Settings,
        load_settings,
    )
    from listener_router._errors import (
        BadMessage,
        BrokerUnavailable,
        ChalkServiceError,
        CommitRefused,
        ConfigError,
        ExtensionFailed,
        InfrastructureError,
        NotLeader,
        RecordFileError,
        RecordsBusy,
        RunnerUnusable,
        StoreUnavailable,
        UserError,
    )
    from listener_router._messages import Incoming, outgoing_id, parse_message
    from listener_router._records import push_records, read_records
    from listener_router._service import Service
    from listener_router.cluster import (
        ClusterView,
        LeaderTask,
        TopologyEvent,
        TopologyEventType,
        TopologyListener,
    )
    from listener_router.events import EventKind, Events
    from listener_router.pipeline import (
        AdaptiveSizing,
        BatchObserver,
        BatchReport,
        BatchSizing,
        Commit,
        CommitExtension,
        Stats,
        WorkflowRun,
    )

_HOMES = {
    "ListenerRule": "_config", "RouterRule": "_config", "Settings": "_config",
    "load_settings": "_config",
    "BadMessage": "_errors", "BrokerUnavailable": "_errors", "ChalkServiceError": "_errors",
    "CommitRefused": "_errors", "ConfigError": "_errors", "ExtensionFailed": "_errors",
    "InfrastructureError": "_errors", "NotLeader": "_errors", "RecordFileError": "_errors",
    "RecordsBusy": "_errors",
    "RunnerUnusable": "_errors", "StoreUnavailable": "_errors", "UserError": "_errors",
    "Incoming": "_messages", "outgoing_id": "_messages", "parse_message": "_messages",
    "push_records": "_records", "read_records": "_records",
    "Service": "_service",
    "ClusterView": "cluster", "LeaderTask": "cluster", "TopologyEvent": "cluster",
    "TopologyEventType": "cluster", "TopologyListener": "cluster",
    "EventKind": "events", "Events": "events",
    "AdaptiveSizing": "pipeline", "BatchObserver": "pipeline", "BatchReport": "pipeline",
    "BatchSizing": "pipeline",
    "Commit": "pipeline", "CommitExtension": "pipeline", "Stats": "pipeline",
    "WorkflowRun": "pipeline",
}

__all__ = [
    "AdaptiveSizing",
    "BadMessage",
    "BatchObserver",
    "BatchReport",
    "BatchSizing",
    "BrokerUnavailable",
    "ChalkServiceError",
    "ClusterView",
    "Commit",
    "CommitExtension",
    "CommitRefused",
    "ConfigError",
    "EventKind",
    "Events",
    "ExtensionFailed",
    "Incoming",
    "InfrastructureError",
    "LeaderTask",
    "ListenerRule",
    "NotLeader",
    "RecordFileError",
    "RecordsBusy",
    "RouterRule",
    "RunnerUnusable",
    "Service",
    "Settings",
    "Stats",
    "StoreUnavailable",
    "TopologyEvent",
    "TopologyEventType",
    "TopologyListener",
    "UserError",
    "WorkflowRun",
    "load_settings",
    "outgoing_id",
    "parse_message",
    "push_records",
    "read_records",
]


__getattr__, __dir__ = lazy_names(__name__, _HOMES, __all__, globals())
