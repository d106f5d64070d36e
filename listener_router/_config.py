"""Settings: read once from ``chalk.toml`` and the environment, then frozen.

Every key is optional; the defaults run on one machine with no file at all
(SQLite file, Spark ``local[*]``, RabbitMQ on localhost).  Each field is
declared with :func:`~listener_router._setting.setting` — section, key, type,
check and one line of doc — and everything else follows from those
declarations: reading the file, the ``CHALK_<SECTION>_<KEY>`` environment
overrides, unknown-key errors, and docs/configuration.md
(``_config_doc``).  A new key is a new field; a new section needs a line in
:data:`SECTIONS` too.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
import zoneinfo
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from listener_router._errors import ConfigError
from listener_router._setting import (
    Key,
    check_value,
    env_names,
    key_of,
    kind_of,
    parse_env,
    rule_class,
    setting,
)
from listener_router.journal import JournalRule, SubscriberRule, check_journals

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["Settings", "ListenerRule", "RouterRule", "ScheduleRule", "EventSettings",
           "ConfigError", "SECTIONS", "load_settings", "make_runner", "parse_every", "parse_listen",
           "settings_keys", "with_schedule_listeners"]

DEFAULT_BROKER = "amqp://guest:guest@localhost:5672/%2F"
EVENTS_EXCHANGE = "chalk.events"

# One line on each section, for docs/configuration.md (keys document themselves).
SECTIONS = {
    "blackboard": "Where records, and the service's own tables, are stored.",
    "broker": "The RabbitMQ server and the queues Chalk declares on it.",
    "spark": "The Spark cluster workflows run on.",
    "workflows": "Where workflow files are, and what their class and service names mean.",
    "engine": "How batches of workflow instances run.",
    "node": "This service process as a member of a cluster: its name, its heartbeat, how "
            "long a silent member counts as alive.",
    "events": "Distributed events on a topic exchange (`chalk events --follow` prints them); "
              "each kind is off until switched on here.",
    "listener": "Which messages go to which workflow, batched and retried how "
                "(a list: the first rule whose queue and condition match takes a message).",
    "router": "Where each result record of a successful workflow goes "
              "(a list: the first matching rule per record; no match, no message).",
    "journal": "Committed records on a RabbitMQ stream, for subscribers (a list; "
               "docs/journal.md).",
    "subscriber": "Agents that read a journal and apply its entries exactly once (a list; "
                  "`chalk subscribe --subscriber ID` runs one).",
    "jobs": "The job log: every message's life and statistics per queue and workflow, kept "
            "in the database (`chalk jobs`, `chalk status`, `chalk dlq`).",
    "schedule": "Scheduled jobs, run by the cluster's leader, each tick exactly once "
                "(a list; `chalk schedules` shows them with their last and next run).",
    "http": "Prometheus metrics (`/metrics`) and the read-only dashboard of `chalk run` "
            "(`chalk run --http HOST:PORT` sets `listen` too).",
}


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


def _check_timezone(value: str, where: str) -> None:
    try:
        zoneinfo.ZoneInfo(value)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError) as e:
        raise ConfigError(f"{where}: unknown timezone {value!r}") from e


def _check_cron(value: str, where: str) -> None:
    from croniter import croniter
    if not croniter.is_valid(value):
        raise ConfigError(f"{where}: cron {value!r} is not a valid cron expression")


def _prefetch_check(value: int, where: str) -> None:
    if value > 65535:
        raise ConfigError(f"{where} must be at most 65535 (AMQP's limit), got {value}")


@dataclass(frozen=True)
class ListenerRule:
    """Which messages go to which workflow, and how they are batched and retried."""

    name: str = setting(doc="the rule's name in logs and errors")
    queue: str = setting("chalk.in", "the input queue")
    workflow: str = setting("Demo", "the workflow (`<process name=…>`) its messages run")
    condition: str | None = setting(
        None, "XPath over the message (headers are variables: `$operation = 'ADD'`); "
        "absent: every message of the queue")
    batch_size: int | None = setting(
        None, "at most this many messages per batch (one Spark job); unset: adaptive, as large "
        "as the backlog and the measured cost of a Spark job call for (README, \"Sizing "
        "batches\")", minimum=1)
    max_wait_ms: int | None = setting(
        None, "how long a batch waits to fill while more messages wait; unset: 1000",
        minimum=0)
    prefetch: int | None = setting(
        None, "unacked messages the broker hands over; unset: room for four batches of the "
        "largest size (one gathering, one running, two committing), at most 65535",
        minimum=1, check=_prefetch_check)
    consumers: int = setting(1, "consumers on the queue (one channel, shared prefetch)",
                             minimum=1)
    max_retries: int = setting(3, "retries of a failed message before it is dead-lettered",
                               minimum=0)
    backoff_ms: tuple[int, ...] = setting((1000, 5000, 30000),
                                          "delay before retry 1, 2, 3… (the last one repeats)",
                                          minimum=0)
    max_records: int = setting(1000, "record IDs per message", minimum=1)
    max_body_bytes: int = setting(1 << 20, "largest message body accepted", minimum=1)
    create_missing: bool = setting(
        False, "a message naming a record with no attributes when no such record is stored "
        "creates it (false: the message is dead-lettered, 'record … does not exist')")


@dataclass(frozen=True)
class RouterRule:
    """Where a result record goes after a successful workflow (first match wins)."""

    queue: str | None = setting(None, "the output queue (declared like an input queue)")
    exchange: str = setting("", "publish to this exchange instead, with routing_key")
    routing_key: str | None = setting(None, "routing key on the exchange")
    condition: str | None = setting(None, "XPath over the result record "
                                    "(`$record/Val[@key='lang'] = 'de'`); absent: always")
    use_next_destination: bool = setting(
        False, "route by the record's `nextDestination` annotation (no annotation: the next "
        "rule is tried)")
    attributes: tuple[str, ...] = setting((), "attributes copied into the outgoing message")
    workflow: str | None = setting(None, "only for results of this workflow")

    def problem(self) -> str | None:
        if not self.use_next_destination and self.queue is None and self.routing_key is None:
            return "give 'queue', 'exchange'+'routing_key' or 'use_next_destination = true'"
        return None


def _events_exchange(exchange: str, where: str) -> None:
    if not exchange or exchange.startswith("amq."):
        raise ConfigError(f"{where} must name a topic exchange of Chalk's own, got {exchange!r}")


@dataclass(frozen=True)
class EventSettings:
    """The ``[events]`` keys as one value: which distributed events the service writes."""

    exchange: str = EVENTS_EXCHANGE    # a topic exchange
    committed: bool = False            # record.committed.<workflow>, one per committed record
    invalidated: bool = False          # record.invalidated.<workflow>, one per failed record
    dead_lettered: bool = False        # message.dead_lettered.<queue>, one per dead letter
    topology: bool = False             # topology.changed, one per established cluster view
    job_finished: bool = False         # job.finished.<schedule>, from scheduled jobs

    @property
    def any(self) -> bool:
        """Whether any kind is on (the exchange is declared then)."""
        return any(getattr(self, kind) for kind in _EVENT_KINDS)


_EVENT_KINDS = ("committed", "invalidated", "dead_lettered", "topology", "job_finished")


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

    name: str = setting(doc="the schedule's name; its last run is kept under it")
    cron: str | None = setting(None, "when it ticks, as a cron expression (`*/5 * * * *`; "
                               "croniter syntax); or give `every`", check=_check_cron)
    every: float | None = setting(None, "or: ticks at multiples of this period since the epoch, "
                                  "`\"30s\"`, `\"5m\"`, `\"1h\"`, `\"2d\"` or seconds; at least 1 s",
                                  parse=parse_every)
    timezone: str = setting("UTC", "the time zone `cron` is read in", check=_check_timezone)
    queue: str = setting("", "where its messages go; default `chalk.schedule.<name>`, which gets "
                         "a listener rule for `workflow`")
    workflow: str | None = setting(None, "the workflow its messages run (on a queue the rules "
                                   "already read, one of them must run it)")
    batch_size: int = setting(1, "record IDs per message (one workflow instance)", minimum=1)
    ids: tuple[str, ...] | None = setting(None, "a fixed list of record IDs (leave out prefix, "
                                          "source and xpath)")
    prefix: str | None = setting(None, "stored records whose ID starts with this")
    source: str | None = setting(None, "stored records of this source")
    xpath: str | None = setting(None, "stored records for which this XPath holds "
                                "(`$record/Val[@key='lang'] = 'de'`); none of ids, prefix, "
                                "source, xpath: every stored record")
    catch_up: str = setting("one", "ticks missed while no member ran: `one` runs the latest of "
                            "them, `none` skips them", choices=("one", "none"))
    operation: str = setting("ADD", "the messages' `operation` header",
                             choices=("ADD", "UPDATE", "DELETE"))

    def __post_init__(self) -> None:
        if not self.queue:
            object.__setattr__(self, "queue", f"chalk.schedule.{self.name}")

    def problem(self) -> str | None:
        if (self.cron is None) == (self.every is None):
            return "give either 'cron' (like \"*/5 * * * *\") or 'every' (like \"30s\")"
        filters = [k for k in ("prefix", "source", "xpath") if getattr(self, k) is not None]
        if self.ids is not None and filters:
            return f"'ids' is a fixed list; leave out {', '.join(filters)}"
        if self.ids is not None and not all(self.ids):
            return "'ids' must be a list of record IDs (non-empty strings)"
        return None


@dataclass(frozen=True)
class Settings:
    """Every setting, read once (:func:`load_settings`); see docs/configuration.md."""

    blackboard_url: str = setting(
        "sqlite:///chalk.db", "any SQLAlchemy URL; PostgreSQL (several processes): "
        "`postgresql+psycopg://user@host/db`", section="blackboard", key="url")
    lease_seconds: float = setting(
        60.0, "record locks lapse this long after their holder stopped renewing them (a crash)",
        section="blackboard", minimum=0, positive=True)
    broker_url: str = setting(DEFAULT_BROKER, "the RabbitMQ server, an AMQP URL",
                              section="broker", key="url")
    queue_type: str = setting("quorum", "type of the queues Chalk declares",
                              section="broker", choices=("quorum", "classic"))
    delivery_limit: int = setting(
        20, "quorum queues: deliveries after which the broker dead-letters a message "
        "(a service process that dies on it every time)", section="broker", minimum=1)
    broker_process: bool = setting(
        True, "the broker connection runs in a child process of its own (false: a thread)",
        section="broker", key="process")
    spark_master: str = setting("local[*]", "`local[*]`, `spark://host:7077`, `yarn`, "
                                "`k8s://…`", section="spark", key="master")
    spark_conf: Mapping[str, str] = setting(
        default_factory=dict, doc="any `spark.*` option, passed to the SparkSession",
        section="spark", key="conf")
    workflows_dir: str = setting("workflows", "the workflow files; re-read when they change "
                                 "(pipelet code is not: restart for that)",
                                 section="workflows", key="dir")
    aliases: Mapping[str, str] = setting(
        default_factory=dict, doc="pipelet class name (e.g. a Java SMILA class) → dotted "
        "Python path", section="workflows")
    services: Mapping[str, str] = setting(
        default_factory=dict, doc="service name (SMILA 0.9 `invokeService`, a BPEL invoke's "
        "partner link) → dotted Python path", section="workflows")
    runner: str = setting("spark", "`local`: in the service's process, same semantics "
                          "(debugging)", section="engine", choices=("spark", "local"))
    batch_timeout: float = setting(300.0, "seconds; a partition past it is treated as hung",
                                   section="engine", minimum=0, positive=True)
    isolation_budget: float = setting(
        900.0, "seconds a batch may spend isolating failing instances (the rest then retry; "
        "stay below RabbitMQ's consumer_timeout)", section="engine", minimum=0)
    concurrent_batches: int = setting(
        1, "batches whose workflows run at once; 2 may help Spark on more than 2 cores",
        section="engine", minimum=1)
    dataframe_forms: bool = setting(
        True, "run pipelets' DataFrame forms in the JVM where a workflow allows",
        section="engine")
    warm_workers: bool | None = setting(
        None, "interpreter batches run on Spark tasks that stay up between batches (no "
        "job's fixed cost per batch; pipelets still run in Spark's Python workers); unset: "
        "on for a local master (on a cluster the executors must reach the driver on a port "
        "of its own)", section="engine")
    local_below: int | None = setting(
        None, "batches of fewer records run in the service's process, not as a Spark job, "
        "whatever the pipelets declare (0: never); unset: small batches do where every "
        "pipelet of the workflow declares `runs_in_service`", section="engine", minimum=0)
    listeners: tuple[ListenerRule, ...] = setting(
        (ListenerRule(name="default"),), "one rule, `default`: every message of `chalk.in` "
        "runs the workflow `Demo`", section="listener")
    routers: tuple[RouterRule, ...] = setting(
        (RouterRule(queue="chalk.out"),), "one rule: every result record goes to `chalk.out`",
        section="router")
    node: str | None = setting(
        None, "this process's name as lease owner and cluster member (default: host/slot, "
        "stable across restarts)", section="node", key="name", env=("CHALK_NODE",))
    retention_days: float = setting(7.0, "days of processed-message, sent-outbox and job-log "
                                    "history kept", section="node", minimum=0, positive=True)
    heartbeat_seconds: float = setting(5.0, "seconds between this member's heartbeats",
                                       section="node", minimum=0, positive=True)
    ttl_seconds: float = setting(
        30.0, "a member silent this long is gone: its record leases are released and its "
        "unsent outbox published at once, a new leader takes over; more than "
        "`heartbeat_seconds` (3x or more)", section="node", minimum=0, positive=True)
    events_exchange: str = setting(EVENTS_EXCHANGE, "the topic exchange events go to",
                                   section="events", key="exchange", check=_events_exchange)
    events_committed: bool = setting(False, "`record.committed.<workflow>`: one per committed "
                                     "record", section="events", key="committed")
    events_invalidated: bool = setting(
        False, "`record.invalidated.<workflow>`: one per record of a failed instance "
        "(retried or dead)", section="events", key="invalidated")
    events_dead_lettered: bool = setting(False, "`message.dead_lettered.<queue>`: one per dead "
                                         "letter", section="events", key="dead_lettered")
    events_topology: bool = setting(False, "`topology.changed`: one per cluster view the "
                                    "leader establishes", section="events", key="topology")
    events_job_finished: bool = setting(False, "`job.finished.<schedule>`: one per scheduled "
                                        "job run", section="events", key="job_finished")
    job_log: bool = setting(True, "keep the job log: every message's steps and statistics "
                            "(false: `chalk jobs` and the statistics stay empty)",
                            section="jobs", key="log")
    stats_interval: float = setting(60.0, "seconds per statistics row (rates and p50/p99 "
                                    "sum the rows)", section="jobs", minimum=1)
    schedules: tuple[ScheduleRule, ...] = setting((), "nothing runs on a schedule",
                                                  section="schedule")
    http_listen: str | None = setting(
        None, "`host:port` (`[::1]:9187` for IPv6; port 0: any free one) where metrics and the "
        "dashboard are served; unset: off", section="http", key="listen", check=parse_listen)
    http_token: str | None = setting(
        None, "the token the dashboard asks for before it replays dead letters; unset: "
        "replay from the page is refused", section="http", key="token")
    journals: tuple[JournalRule, ...] = setting(
        (), "none: no journal is written", section="journal")
    subscribers: tuple[SubscriberRule, ...] = setting(
        (), "none", section="subscriber")
    source: str | None = field(default=None, metadata={"internal": "the file read"})

    def with_overrides(self, **changes: Any) -> Settings:
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    @property
    def events(self) -> EventSettings:
        """The ``[events]`` keys as one value."""
        return EventSettings(self.events_exchange, **{
            kind: getattr(self, f"events_{kind}") for kind in _EVENT_KINDS})

    def with_events(self, events: EventSettings) -> Settings:
        """These settings with ``events`` as the ``[events]`` keys."""
        return replace(self, events_exchange=events.exchange, **{
            f"events_{kind}": getattr(events, kind) for kind in _EVENT_KINDS})

    def problem(self) -> str | None:
        """What is wrong with keys that are right one by one, or None."""
        if self.ttl_seconds <= self.heartbeat_seconds:
            return (f"[node] ttl_seconds ({self.ttl_seconds:g}) must be more than "
                    f"heartbeat_seconds ({self.heartbeat_seconds:g}); three heartbeats or more "
                    "is safe")
        return None


def settings_keys() -> list[tuple[dataclasses.Field[Any], Key]]:
    """Every field of :class:`Settings` that is a setting, with its key, in definition order."""
    out = []
    for f in dataclasses.fields(Settings):
        key = key_of(f)
        if key is not None:
            out.append((f, replace(key, name=key.name or (None if _rules(f) else f.name))))
        elif "internal" not in f.metadata:
            raise TypeError(f"Settings.{f.name} is neither a setting (setting(...)) nor "
                            "internal (field(metadata={'internal': why}))")
    return out


def _rules(f: dataclasses.Field[Any]) -> type | None:
    return rule_class(kind_of(Settings, f.name))


def _check_keys(table: Mapping[str, Any], allowed: Iterable[str], where: str) -> None:
    unknown = sorted(set(table) - set(allowed))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; "
                          f"known: {', '.join(sorted(allowed))}")


def _rule(cls: type, table: Any, where: str, section: str, position: int) -> Any:
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a table, got {table!r}")
    fields = [f for f in dataclasses.fields(cls) if key_of(f) is not None]
    _check_keys(table, [f.name for f in fields], where)
    values: dict[str, Any] = {}
    for f in fields:
        if f.name in table:
            key = key_of(f)
            assert key is not None
            values[f.name] = check_value(kind_of(cls, f.name), key, table[f.name],
                                         f"{where} {f.name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            values[f.name] = f"{section}{position}"  # the name: listener1, listener2, …
    rule = cls(**values)
    problem = getattr(rule, "problem", lambda: None)()
    if problem:
        raise ConfigError(f"{where}: {problem}")
    return rule


def _from_env(env: Mapping[str, str], key: Key) -> tuple[str, str] | None:
    for name in env_names(key):
        if env.get(name):
            return name, env[name]
    return None


def load_settings(path: str | os.PathLike[str] | None = None,
                  env: Mapping[str, str] | None = None) -> Settings:
    """Read ``path`` (default ``chalk.toml`` when present), then ``CHALK_<SECTION>_<KEY>``
    from ``env`` (default ``os.environ``), which wins over the file."""
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
    keys = settings_keys()
    sections: dict[str, list[str]] = {}
    for _f, key in keys:
        assert key.section is not None
        sections.setdefault(key.section, []).extend([key.name] if key.name else [])
    _check_keys(data, sections, where)
    values: dict[str, Any] = {}
    for f, key in keys:
        section = key.section
        assert section is not None
        rules = _rules(f)
        found = _from_env(env, key)
        if rules is not None:
            if found is not None:
                tables, at = parse_env(list, found[0], found[1]), f"environment {found[0]}"
            else:
                tables, at = data.get(section, []), f"{where} [[{section}]]"
            if not isinstance(tables, list):
                raise ConfigError(f"{at} must be a list of tables ([[{section}]])")
            if tables:
                values[f.name] = tuple(_rule(rules, t, f"{at} #{i + 1}", section, i + 1)
                                       for i, t in enumerate(tables))
            continue
        table = data.get(section, {})
        if not isinstance(table, dict):
            raise ConfigError(f"{where}: [{section}] must be a table")
        _check_keys(table, sections[section], f"{where} [{section}]")
        kind = kind_of(Settings, f.name)
        assert key.name is not None
        if found is not None:
            values[f.name] = check_value(kind, key, parse_env(kind, *found),
                                         f"environment {found[0]}")
        elif key.name in table:
            values[f.name] = check_value(kind, key, table[key.name],
                                         f"{where} [{section}] {key.name}")
    settings = Settings(**values, source=source)
    names = [s.name for s in settings.schedules]
    if len(set(names)) != len(names):
        raise ConfigError(f"{where}: two [[schedule]] entries share a name "
                          f"({', '.join(sorted(n for n in set(names) if names.count(n) > 1))})")
    problem = settings.problem()
    if problem:
        raise ConfigError(f"{where}: {problem}")
    check_journals(settings.journals, settings.subscribers, where)
    return replace(settings, listeners=with_schedule_listeners(
        settings.listeners, settings.schedules, where))


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
                              frames=settings.dataframe_forms,
                              warm=settings.warm_workers)
