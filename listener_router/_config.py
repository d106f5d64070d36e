"""Settings: read once from ``chalk.toml`` and the environment, then frozen.

Every key is optional; the defaults run on one machine with no file at all
(SQLite file, Spark ``local[*]``, RabbitMQ on localhost).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from listener_router._errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["Settings", "ListenerRule", "RouterRule", "EventSettings", "ConfigError",
           "load_settings", "make_runner"]

DEFAULT_BROKER = "amqp://guest:guest@localhost:5672/%2F"
EVENTS_EXCHANGE = "chalk.events"


@dataclass(frozen=True)
class ListenerRule:
    """Which messages go to which workflow, and how they are batched and retried."""

    name: str
    queue: str = "chalk.in"
    workflow: str = "Demo"
    condition: str | None = None
    batch_size: int = 500
    max_wait_ms: int = 200
    prefetch: int = 2000
    consumers: int = 1                 # consumers on the queue (one channel, shared prefetch)
    max_retries: int = 3
    backoff_ms: tuple[int, ...] = (1000, 5000, 30000)
    max_records: int = 1000            # records per message
    max_body_bytes: int = 1 << 20


@dataclass(frozen=True)
class RouterRule:
    """Where a result record goes after a successful workflow (first match wins)."""

    queue: str | None = None
    exchange: str = ""
    routing_key: str | None = None
    condition: str | None = None       # XPath over the record; None: always
    use_next_destination: bool = False  # route by the record's nextDestination annotation
    attributes: tuple[str, ...] = ()
    workflow: str | None = None        # only for results of this workflow


@dataclass(frozen=True)
class EventSettings:
    """``[events]``: which distributed events the service writes (each kind off by default)."""

    exchange: str = EVENTS_EXCHANGE    # a topic exchange
    committed: bool = False            # record.committed.<workflow>, one per committed record
    invalidated: bool = False          # record.invalidated.<workflow>, one per record of a failed instance
    dead_lettered: bool = False        # message.dead_lettered.<queue>, one per dead letter
    topology: bool = False             # topology.changed, one per established cluster view
    job_finished: bool = False         # job.finished.<schedule>, from scheduled jobs

    @property
    def any(self) -> bool:
        """Whether any kind is on (the exchange is declared then)."""
        return any(getattr(self, kind) for kind in _EVENT_KINDS)


_EVENT_KINDS = ("committed", "invalidated", "dead_lettered", "topology", "job_finished")


@dataclass(frozen=True)
class Settings:
    blackboard_url: str = "sqlite:///chalk.db"
    lease_seconds: float = 60.0
    broker_url: str = DEFAULT_BROKER
    queue_type: str = "quorum"
    delivery_limit: int = 20
    broker_process: bool = True        # the broker connection in a child process of its own
    spark_master: str = "local[*]"
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    workflows_dir: str = "workflows"
    aliases: Mapping[str, str] = field(default_factory=dict)
    services: Mapping[str, str] = field(default_factory=dict)  # [workflows.services]: service name -> class
    runner: str = "spark"              # or "local"
    batch_timeout: float = 300.0
    isolation_budget: float = 900.0    # seconds a batch may spend isolating a failing instance
    concurrent_batches: int = 1        # batches whose workflows run at once (Spark: try 2 on >2 cores)
    dataframe_forms: bool = True       # Spark runs pipelets' DataFrame forms where a workflow allows
    local_below: int = 0               # batches of fewer records run in the service's process (0: none)
    listeners: tuple[ListenerRule, ...] = (ListenerRule(name="default"),)
    routers: tuple[RouterRule, ...] = (RouterRule(queue="chalk.out"),)
    node: str | None = None            # lease owner / cluster member name
    retention_days: float = 7.0        # processed-message and sent-outbox history kept
    heartbeat_seconds: float = 5.0     # between a member's heartbeats
    ttl_seconds: float = 30.0          # a member silent this long is gone (failover)
    events: EventSettings = field(default_factory=EventSettings)
    source: str | None = None          # the file the settings came from

    def with_overrides(self, **changes: Any) -> Settings:
        return replace(self, **{k: v for k, v in changes.items() if v is not None})


def _take(table: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str,
          default: Any) -> Any:
    if key not in table:
        return default
    value = table[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise ConfigError(f"{where}: {key!r} must be {names}, got {value!r}")
    return value


def _check_keys(table: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; "
                          f"known: {', '.join(sorted(allowed))}")


def _listener(table: Mapping[str, Any], where: str, position: int) -> ListenerRule:
    _check_keys(table, set(ListenerRule.__dataclass_fields__), where)
    base = ListenerRule(name=f"listener{position}")
    values: dict[str, Any] = {}
    for key in ("name", "queue", "workflow", "condition"):
        values[key] = _take(table, key, str, where, getattr(base, key))
    for key in ("batch_size", "max_wait_ms", "prefetch", "consumers", "max_retries",
                "max_records", "max_body_bytes"):
        values[key] = _take(table, key, int, where, getattr(base, key))
        if values[key] < (0 if key in ("max_retries", "max_wait_ms") else 1):
            raise ConfigError(f"{where}: {key!r} must be positive, got {values[key]}")
    backoff = _take(table, "backoff_ms", (list, int), where, list(base.backoff_ms))
    values["backoff_ms"] = tuple(backoff if isinstance(backoff, list) else [backoff])
    return ListenerRule(**values)


def _router(table: Mapping[str, Any], where: str) -> RouterRule:
    _check_keys(table, set(RouterRule.__dataclass_fields__), where)
    values: dict[str, Any] = {}
    for key in ("queue", "exchange", "routing_key", "condition", "workflow"):
        values[key] = _take(table, key, str, where, getattr(RouterRule(), key))
    values["use_next_destination"] = _take(table, "use_next_destination", bool, where, False)
    values["attributes"] = tuple(_take(table, "attributes", list, where, []))
    rule = RouterRule(**values)
    if not rule.use_next_destination and rule.queue is None and rule.routing_key is None:
        raise ConfigError(f"{where}: give 'queue', 'exchange'+'routing_key' or "
                          "'use_next_destination = true'")
    return rule


def _heartbeat(node: Mapping[str, Any], where: str, defaults: Settings) -> tuple[float, float]:
    """``heartbeat_seconds`` and ``ttl_seconds``: positive, the time-to-live above the interval."""
    heartbeat = float(_take(node, "heartbeat_seconds", (int, float), where,
                            defaults.heartbeat_seconds))
    ttl = float(_take(node, "ttl_seconds", (int, float), where, defaults.ttl_seconds))
    if heartbeat <= 0 or ttl <= 0:
        raise ConfigError(f"{where}: heartbeat_seconds and ttl_seconds must be positive, "
                          f"got {heartbeat:g} and {ttl:g}")
    if ttl <= heartbeat:
        raise ConfigError(f"{where}: ttl_seconds ({ttl:g}) must be more than heartbeat_seconds "
                          f"({heartbeat:g}); three heartbeats or more is safe")
    return heartbeat, ttl


def _events(table: Any, where: str) -> EventSettings:
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where}: must be a table, got {table!r}")
    _check_keys(table, {"exchange", *_EVENT_KINDS}, where)
    defaults = EventSettings()
    exchange = _take(table, "exchange", str, where, defaults.exchange)
    if not exchange or exchange.startswith("amq."):
        raise ConfigError(f"{where}: 'exchange' must name a topic exchange of Chalk's own, "
                          f"got {exchange!r}")
    return EventSettings(exchange=exchange, **{
        kind: _take(table, kind, bool, where, getattr(defaults, kind)) for kind in _EVENT_KINDS})


def load_settings(path: str | os.PathLike[str] | None = None,
                  env: Mapping[str, str] | None = None) -> Settings:
    """Read ``path`` (default ``chalk.toml`` when present) and the CHALK_* environment."""
    env = os.environ if env is None else env
    data: dict[str, Any] = {}
    source = None
    candidate = Path(path) if path is not None else Path("chalk.toml")
    if path is not None and not candidate.is_file():
        raise ConfigError(f"{candidate}: no such configuration file")
    if candidate.is_file():
        source = str(candidate)
        try:
            data = tomllib.loads(candidate.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise ConfigError(f"{candidate}: not valid TOML: {e}") from e
    where = source or "defaults"
    _check_keys(data, {"blackboard", "broker", "spark", "workflows", "listener", "router",
                       "engine", "node", "events"}, where)
    bb = data.get("blackboard", {})
    broker = data.get("broker", {})
    spark = data.get("spark", {})
    wf = data.get("workflows", {})
    engine = data.get("engine", {})
    node = data.get("node", {})
    _check_keys(bb, {"url", "lease_seconds"}, f"{where} [blackboard]")
    _check_keys(broker, {"url", "queue_type", "delivery_limit", "process"}, f"{where} [broker]")
    _check_keys(spark, {"master", "conf"}, f"{where} [spark]")
    _check_keys(wf, {"dir", "aliases", "services"}, f"{where} [workflows]")
    _check_keys(engine, {"runner", "batch_timeout", "isolation_budget", "concurrent_batches",
                         "dataframe_forms", "local_below"},
                f"{where} [engine]")
    _check_keys(node, {"name", "retention_days", "heartbeat_seconds", "ttl_seconds"},
                f"{where} [node]")
    defaults = Settings()
    listeners = tuple(_listener(t, f"{where} [[listener]] #{i + 1}", i + 1)
                      for i, t in enumerate(data.get("listener", [])))
    routers = tuple(_router(t, f"{where} [[router]] #{i + 1}")
                    for i, t in enumerate(data.get("router", [])))
    queue_type = _take(broker, "queue_type", str, f"{where} [broker]", defaults.queue_type)
    if queue_type not in ("quorum", "classic"):
        raise ConfigError(f"{where} [broker]: queue_type must be 'quorum' or 'classic'")
    concurrent = _take(engine, "concurrent_batches", int, f"{where} [engine]",
                       defaults.concurrent_batches)
    if concurrent < 1:
        raise ConfigError(f"{where} [engine]: concurrent_batches must be 1 or more, "
                          f"got {concurrent}")
    local_below = _take(engine, "local_below", int, f"{where} [engine]", defaults.local_below)
    if local_below < 0:
        raise ConfigError(f"{where} [engine]: local_below must be 0 or more, got {local_below}")
    heartbeat, ttl = _heartbeat(node, f"{where} [node]", defaults)
    events = _events(data.get("events", {}), f"{where} [events]")
    runner = _take(engine, "runner", str, f"{where} [engine]", defaults.runner)
    if runner not in ("spark", "local"):
        raise ConfigError(f"{where} [engine]: runner must be 'spark' or 'local'")
    settings = Settings(
        blackboard_url=env.get("CHALK_BLACKBOARD_URL")
        or _take(bb, "url", str, f"{where} [blackboard]", defaults.blackboard_url),
        lease_seconds=float(_take(bb, "lease_seconds", (int, float), f"{where} [blackboard]",
                                  defaults.lease_seconds)),
        broker_url=env.get("CHALK_BROKER_URL")
        or _take(broker, "url", str, f"{where} [broker]", defaults.broker_url),
        queue_type=queue_type,
        delivery_limit=_take(broker, "delivery_limit", int, f"{where} [broker]",
                             defaults.delivery_limit),
        broker_process=_take(broker, "process", bool, f"{where} [broker]",
                             defaults.broker_process),
        spark_master=env.get("CHALK_SPARK_MASTER")
        or _take(spark, "master", str, f"{where} [spark]", defaults.spark_master),
        spark_conf={str(k): str(v) for k, v in
                    _take(spark, "conf", dict, f"{where} [spark]", {}).items()},
        workflows_dir=env.get("CHALK_WORKFLOWS_DIR")
        or _take(wf, "dir", str, f"{where} [workflows]", defaults.workflows_dir),
        aliases=dict(_take(wf, "aliases", dict, f"{where} [workflows]", {})),
        services=dict(_take(wf, "services", dict, f"{where} [workflows]", {})),
        runner=runner,
        batch_timeout=float(_take(engine, "batch_timeout", (int, float), f"{where} [engine]",
                                  defaults.batch_timeout)),
        isolation_budget=float(_take(engine, "isolation_budget", (int, float),
                                     f"{where} [engine]", defaults.isolation_budget)),
        concurrent_batches=concurrent,
        dataframe_forms=_take(engine, "dataframe_forms", bool, f"{where} [engine]",
                              defaults.dataframe_forms),
        local_below=local_below,
        listeners=listeners or defaults.listeners,
        routers=routers or defaults.routers,
        node=env.get("CHALK_NODE") or _take(node, "name", str, f"{where} [node]", None),
        retention_days=float(_take(node, "retention_days", (int, float), f"{where} [node]",
                                   defaults.retention_days)),
        heartbeat_seconds=heartbeat,
        ttl_seconds=ttl,
        events=events,
        source=source,
    )
    return settings


def make_runner(settings: Settings, spark: Any = None) -> Any:
    """The workflow runner ``settings`` ask for: ``LocalRunner``, or ``SparkRunner`` on
    ``spark`` (a session made from the settings when None)."""
    import engine

    if settings.runner == "local":
        return engine.LocalRunner()
    if spark is None:
        spark = engine.spark_session(settings.spark_master, dict(settings.spark_conf))
    return engine.SparkRunner(spark,
                              batch_timeout=settings.batch_timeout,
                              isolation_budget=settings.isolation_budget,
                              frames=settings.dataframe_forms)
