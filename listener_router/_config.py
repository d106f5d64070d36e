"""Settings: read once from ``chalk.toml`` and the environment, then frozen.

Every key is optional; the defaults run on one machine with no file at all
(SQLite file, Spark ``local[*]``, RabbitMQ on localhost).
"""

from __future__ import annotations

import os
import re
import sys
import zoneinfo
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from listener_router._errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["Settings", "ListenerRule", "RouterRule", "ScheduleRule", "ConfigError", "load_settings",
           "make_runner", "parse_every", "parse_listen", "with_schedule_listeners"]

DEFAULT_BROKER = "amqp://guest:guest@localhost:5672/%2F"


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
class ScheduleRule:
    """A scheduled job: at every tick, publish a selection of record IDs to a queue.

    The tick is ``cron`` (croniter syntax, in ``timezone``) or ``every``
    seconds (ticks at multiples of it since the epoch).  The selection is
    ``ids`` (a fixed list) or every stored record, narrowed by ``prefix``
    (of the ID), ``source`` and ``xpath`` (over the record, like a router
    condition).  Each message carries ``batch_size`` record IDs (one
    workflow instance).  ``catch_up``: what to do with ticks missed while no
    member lived: ``"one"`` runs the latest of them once, ``"none"`` skips them.
    """

    name: str
    cron: str | None = None
    every: float | None = None         # seconds
    timezone: str = "UTC"
    queue: str = ""                    # default: chalk.schedule.<name>
    workflow: str | None = None        # a listener rule takes the queue's messages to it
    batch_size: int = 1                # record IDs per message
    ids: tuple[str, ...] | None = None
    prefix: str | None = None
    source: str | None = None
    xpath: str | None = None
    catch_up: str = "one"
    operation: str = "ADD"


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
    retention_days: float = 7.0        # processed-message, sent-outbox and job-log history kept
    job_log: bool = True               # [jobs] log: every message's life and statistics persisted
    stats_interval: float = 60.0       # [jobs] stats_interval: seconds per statistics row
    schedules: tuple[ScheduleRule, ...] = ()
    http_listen: str | None = None     # [http] listen: "host:port" of metrics and dashboard (off: None)
    http_token: str | None = None      # [http] token: needed to replay dead letters from the page
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


_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_EVERY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")


def parse_every(value: str | int | float, where: str) -> float:
    """``"30s"``, ``"5m"``, ``"1h"``, ``"2d"``, ``"500ms"`` or a number of seconds; at least 1 s."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        found = _EVERY.match(str(value))
        if found is None:
            raise ConfigError(f"{where}: 'every' must be a number of seconds or like \"30s\", "
                              f"\"5m\", \"1h\", \"2d\"; got {value!r}")
        seconds = float(found.group(1)) * _UNITS[found.group(2)]
    if seconds < 1.0:
        raise ConfigError(f"{where}: 'every' must be at least 1 second, got {value!r}")
    return seconds


def _schedule(table: Mapping[str, Any], where: str) -> ScheduleRule:
    _check_keys(table, set(ScheduleRule.__dataclass_fields__), where)
    name = _take(table, "name", str, where, None)
    if not name:
        raise ConfigError(f"{where}: a schedule needs a 'name'")
    where = f"{where} ({name!r})"
    cron = _take(table, "cron", str, where, None)
    every = table.get("every")
    if (cron is None) == (every is None):
        raise ConfigError(f"{where}: give either 'cron' (like \"*/5 * * * *\") or 'every' "
                          "(like \"30s\")")
    if cron is not None:
        from croniter import croniter
        if not croniter.is_valid(cron):
            raise ConfigError(f"{where}: cron {cron!r} is not a valid cron expression")
    timezone = _take(table, "timezone", str, where, "UTC")
    try:
        zoneinfo.ZoneInfo(timezone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError) as e:
        raise ConfigError(f"{where}: unknown timezone {timezone!r}") from e
    ids = _take(table, "ids", list, where, None)
    if ids is not None and not all(isinstance(i, str) and i for i in ids):
        raise ConfigError(f"{where}: 'ids' must be a list of record IDs (strings)")
    filters = [k for k in ("prefix", "source", "xpath") if k in table]
    if ids is not None and filters:
        raise ConfigError(f"{where}: 'ids' is a fixed list; leave out {', '.join(filters)}")
    batch_size = _take(table, "batch_size", int, where, 1)
    if batch_size < 1:
        raise ConfigError(f"{where}: 'batch_size' must be positive, got {batch_size}")
    catch_up = _take(table, "catch_up", str, where, "one")
    if catch_up not in ("one", "none"):
        raise ConfigError(f"{where}: catch_up must be 'one' or 'none', got {catch_up!r}")
    operation = _take(table, "operation", str, where, "ADD").upper()
    if operation not in ("ADD", "UPDATE", "DELETE"):
        raise ConfigError(f"{where}: operation must be ADD, UPDATE or DELETE")
    return ScheduleRule(
        name=name, cron=cron, every=None if every is None else parse_every(every, where),
        timezone=timezone, queue=_take(table, "queue", str, where, "") or f"chalk.schedule.{name}",
        workflow=_take(table, "workflow", str, where, None), batch_size=batch_size,
        ids=None if ids is None else tuple(ids), prefix=_take(table, "prefix", str, where, None),
        source=_take(table, "source", str, where, None),
        xpath=_take(table, "xpath", str, where, None), catch_up=catch_up, operation=operation)


def with_schedule_listeners(listeners: tuple[ListenerRule, ...],
                            schedules: tuple[ScheduleRule, ...], where: str
                            ) -> tuple[ListenerRule, ...]:
    """The listener rules plus one per schedule whose queue has none (see the README).

    A schedule with a ``workflow`` on a queue no listener rule reads gets a
    rule of its own (with the condition ``$schedule = 'NAME'`` when several
    schedules share the queue).  On a queue the rules already read, one of
    them must name the workflow.
    """
    taken = {rule.queue for rule in listeners}
    added: list[ListenerRule] = []
    for schedule in schedules:
        if schedule.workflow is None:
            continue
        if schedule.queue in taken:
            if not any(r.workflow == schedule.workflow for r in listeners
                       if r.queue == schedule.queue):
                raise ConfigError(
                    f"{where} [[schedule]] {schedule.name!r}: no listener rule on queue "
                    f"{schedule.queue!r} runs workflow {schedule.workflow!r}; add one, or leave "
                    "out 'queue' to give the schedule a queue of its own")
            continue
        sharing = [s for s in schedules if s.queue == schedule.queue and s.workflow]
        added.append(ListenerRule(
            name=f"schedule.{schedule.name}", queue=schedule.queue, workflow=schedule.workflow,
            condition=f"$schedule = '{schedule.name}'" if len(sharing) > 1 else None))
    return listeners + tuple(added)


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
                       "engine", "node", "jobs", "schedule", "http"}, where)
    bb = data.get("blackboard", {})
    broker = data.get("broker", {})
    spark = data.get("spark", {})
    wf = data.get("workflows", {})
    engine = data.get("engine", {})
    node = data.get("node", {})
    jobs = data.get("jobs", {})
    _check_keys(jobs, {"log", "stats_interval"}, f"{where} [jobs]")
    http = data.get("http", {})
    _check_keys(http, {"listen", "token"}, f"{where} [http]")
    _check_keys(bb, {"url", "lease_seconds"}, f"{where} [blackboard]")
    _check_keys(broker, {"url", "queue_type", "delivery_limit", "process"}, f"{where} [broker]")
    _check_keys(spark, {"master", "conf"}, f"{where} [spark]")
    _check_keys(wf, {"dir", "aliases", "services"}, f"{where} [workflows]")
    _check_keys(engine, {"runner", "batch_timeout", "isolation_budget", "concurrent_batches",
                         "dataframe_forms", "local_below"},
                f"{where} [engine]")
    _check_keys(node, {"name", "retention_days"}, f"{where} [node]")
    defaults = Settings()
    listeners = tuple(_listener(t, f"{where} [[listener]] #{i + 1}", i + 1)
                      for i, t in enumerate(data.get("listener", [])))
    routers = tuple(_router(t, f"{where} [[router]] #{i + 1}")
                    for i, t in enumerate(data.get("router", [])))
    schedules = tuple(_schedule(t, f"{where} [[schedule]] #{i + 1}")
                      for i, t in enumerate(data.get("schedule", [])))
    names = [s.name for s in schedules]
    if len(set(names)) != len(names):
        raise ConfigError(f"{where}: two [[schedule]] entries share a name "
                          f"({', '.join(sorted(n for n in set(names) if names.count(n) > 1))})")
    stats_interval = float(_take(jobs, "stats_interval", (int, float), f"{where} [jobs]",
                                 defaults.stats_interval))
    if stats_interval < 1:
        raise ConfigError(f"{where} [jobs]: stats_interval must be at least 1 second")
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
    runner = _take(engine, "runner", str, f"{where} [engine]", defaults.runner)
    if runner not in ("spark", "local"):
        raise ConfigError(f"{where} [engine]: runner must be 'spark' or 'local'")
    http_listen = env.get("CHALK_HTTP_LISTEN") or _take(http, "listen", str, f"{where} [http]", None)
    if http_listen is not None:
        parse_listen(http_listen, f"{where} [http] listen")
    http_token = env.get("CHALK_HTTP_TOKEN") or _take(http, "token", str, f"{where} [http]", None)
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
        listeners=with_schedule_listeners(listeners or defaults.listeners, schedules, where),
        routers=routers or defaults.routers,
        node=env.get("CHALK_NODE") or _take(node, "name", str, f"{where} [node]", None),
        retention_days=float(_take(node, "retention_days", (int, float), f"{where} [node]",
                                   defaults.retention_days)),
        job_log=_take(jobs, "log", bool, f"{where} [jobs]", defaults.job_log),
        stats_interval=stats_interval,
        schedules=schedules,
        http_listen=http_listen,
        http_token=http_token or None,
        source=source,
    )
    return settings


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
