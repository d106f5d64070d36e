"""Listener/router: the core (one message's way and the cluster it runs in), its plug-ins, the CLI.

Where things live (see ``docs/internals.md`` for one message's way through them).

The core, which imports no feature:

- ``broker/``   — everything that talks AMQP: the link (a thread, or a child
  process), the queues Chalk declares, starting a local RabbitMQ;
- ``pipeline/`` — the stages a batch goes through: gather → execute →
  commit → finish, the message life table, retries and dead letters;
- ``store/``    — the core's tables (inbox, outbox, nodes, cluster, versions);
- ``cluster/``  — membership, the fenced leader, views and topology events,
  failover, the leader's periodic tasks;
- ``_service``  — :class:`Service`: its parts in start order, the plug-ins, the loop;
- ``_plugin``, ``_entry_points``, ``_live`` — the one seam features plug
  into, where they are found, and the typed view of a running service;
- ``_settings``, ``_keys``, ``_loader``, ``_reference`` — the settings, how
  a key is declared, reading them, docs/configuration.md;
- ``_messages``, ``_rules``, ``_records``, ``_errors``, ``_runners`` —
  message format, listener/router rules, record files, errors, runners.

The features, each a plug-in (``pyproject.toml``'s ``chalk.plugins``) with
its settings and tables: ``events/``, ``jobs/`` (the job log),
``schedules/``, ``journal/``, ``dead_letters/``, ``watch/`` (metrics and
the dashboard).  On top: ``cli/``, the ``chalk`` command, and this module,
the package's public names.

The public names are imported on first use, so that a process that needs
only one module (the broker I/O process runs ``listener_router.broker``)
does not pay for the service's imports (Spark, SQLAlchemy, lxml).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from listener_router._lazy import lazy_names

if TYPE_CHECKING:
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
    from listener_router._keys import section, setting
    from listener_router._live import LiveView
    from listener_router._loader import load_settings
    from listener_router._messages import Incoming, outgoing_id, parse_message
    from listener_router._plugin import Host, Plugin
    from listener_router._records import push_records, read_records
    from listener_router._reference import configuration_reference
    from listener_router._service import Service
    from listener_router._settings import ListenerRule, RouterRule, Settings
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
        LaneView,
        Stats,
        WorkflowRun,
    )
    from listener_router.store import Schema

_HOMES = {
    "ListenerRule": "_settings", "RouterRule": "_settings", "Settings": "_settings",
    "load_settings": "_loader", "Host": "_plugin", "Plugin": "_plugin", "LiveView": "_live", "LaneView": "pipeline",
    "configuration_reference": "_reference", "section": "_keys", "setting": "_keys",
    "Schema": "store",
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
    "Host",
    "Incoming",
    "InfrastructureError",
    "LeaderTask",
    "LaneView",
    "ListenerRule",
    "LiveView",
    "NotLeader",
    "Plugin",
    "RecordFileError",
    "RecordsBusy",
    "RouterRule",
    "RunnerUnusable",
    "Schema",
    "Service",
    "Settings",
    "Stats",
    "StoreUnavailable",
    "TopologyEvent",
    "TopologyEventType",
    "TopologyListener",
    "UserError",
    "WorkflowRun",
    "configuration_reference",
    "load_settings",
    "outgoing_id",
    "parse_message",
    "push_records",
    "read_records",
    "section",
    "setting",
]


__getattr__, __dir__ = lazy_names(__name__, _HOMES, __all__, globals())
