"""Settings: the frozen object every part of the service is given.

Every key is optional; the defaults run on one machine with no file at all
(SQLite file, Spark ``local[*]``, RabbitMQ on localhost).  The core's keys
are the fields of :class:`Settings`, each declared with
:func:`~listener_router._keys.setting`; each feature's keys are a section of
its own, declared next to the feature (:func:`~listener_router._keys.section`)
and found through its plug-in (``_entry_points``), kept in
:attr:`Settings.features`.  Everything else follows from those declarations:
reading the file and the ``CHALK_<SECTION>_<KEY>`` environment overrides
(``_loader``), and docs/configuration.md (``_reference``).
"""

from __future__ import annotations

import dataclasses
import functools
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from listener_router._entry_points import plugin_classes
from listener_router._errors import ConfigError
from listener_router._keys import (
    Key,
    RuleKeys,
    Section,
    key_of,
    kind_of,
    rule_class,
    rule_keys_of,
    section_of,
    setting,
)

__all__ = ["CORE_SECTIONS", "DEFAULT_BROKER", "LANE_KEYS", "ListenerRule", "RouterRule", "Settings",
           "broker_urls",
           "configured", "default_features", "feature_sections", "rule_extras", "rules_of",
           "settings_keys"]

DEFAULT_BROKER = "amqp://guest:guest@localhost:5672/%2F"

# A comma (or semicolon) separates nodes only where the next URL begins: one inside a
# URL's query (``ssl_options={'ca_certs':…,'server_hostname':…}``) stays in that URL.
_URL_SEPARATOR = re.compile(r"\s*[,;]\s*(?=amqps?://)", re.IGNORECASE)


def broker_urls(url: str) -> list[str]:
    """The node URLs ``[broker] url`` names, in the order to try them (one for one node)."""
    return [u for u in (u.strip(" \t\n,;") for u in _URL_SEPARATOR.split(url)) if u]


def _broker_url(raw: Any, where: str) -> str:
    """``[broker] url``: one AMQP URL, several in one string (commas), or a list of them."""
    if isinstance(raw, list):
        if not raw or not all(isinstance(u, str) for u in raw):
            raise ConfigError(f"{where} must be an AMQP URL or a list of them (the nodes of one "
                              f"cluster), got {raw!r}")
        raw = ", ".join(raw)
    return raw


_broker_url.accepts = "list of strings"  # type: ignore[attr-defined]  # the reference's words


def _broker_url_check(value: str, where: str) -> None:
    nodes = broker_urls(value)
    if not nodes:
        raise ConfigError(f"{where} names no broker: give an AMQP URL, "
                          "e.g. amqp://guest:guest@localhost:5672/%2F")
    for node in nodes:
        # a comma before the query is a node that is not a URL ("amqp://mq1/%2F, mq2:5672")
        pieces = [p for p in re.split(r"\s*[,;]\s*", node.partition("?")[0]) if p]
        for piece in pieces if len(pieces) > 1 else (node,):
            parts = urllib.parse.urlsplit(piece)
            if parts.scheme not in ("amqp", "amqps") or not parts.hostname:
                raise ConfigError(f"{where}: {piece!r} is not an AMQP URL (amqp://user:password@"
                                  "host:port/vhost); several nodes are separated by commas")

# One line on each of the core's sections, for docs/configuration.md (keys document
# themselves; a feature's section says its own).
CORE_SECTIONS = {
    "blackboard": "Where records, and the service's own tables, are stored.",
    "broker": "The RabbitMQ server and the queues Chalk declares on it.",
    "spark": "The Spark cluster workflows run on.",
    "workflows": "Where workflow files are, and what their class and service names mean.",
    "engine": "How batches of workflow instances run.",
    "node": "This service process as a member of a cluster: its name, its heartbeat, how "
            "long a silent member counts as alive.",
    "listener": "Which messages go to which workflow, batched and retried how "
                "(a list: the first rule whose queue and condition match takes a message).",
    "router": "Where each result record of a successful workflow goes "
              "(a list: the first matching rule per record; no match, no message).",
}


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
        "as the backlog and the measured cost of a Spark job call for (docs/performance.md, "
        "\"Sizing batches\")", minimum=1)
    max_wait_ms: int | None = setting(
        None, "how long a batch waits to fill while more messages wait; unset: 1000",
        minimum=0)
    prefetch: int | None = setting(
        None, "unacked messages the broker hands over; unset: room for four batches of the "
        "largest size (one gathering, one running, two committing), at most 65535",
        minimum=1, check=_prefetch_check)
    consumers: int = setting(1, "consumers on the queue (one channel, shared prefetch)",
                             minimum=1)
    max_retries: int = setting(3, "retries of a failed message before it is dead-lettered "
                               "(it runs at most max_retries + 1 times: a rerun alone, after "
                               "a run it shared hung or died, is one)", minimum=0)
    backoff_ms: tuple[int, ...] = setting((1000, 5000, 30000),
                                          "delay before retry 1, 2, 3… (the last one repeats)",
                                          minimum=0)
    max_records: int = setting(1000, "record IDs per message", minimum=1)
    max_body_bytes: int = setting(1 << 20, "largest message body accepted", minimum=1)
    max_inflight_bytes: int = setting(
        256 << 20, "bytes of the queue's message bodies the service holds at most, taken and "
        "not yet settled: past it the queue is not consumed until half of it is settled "
        "(memory stays bounded whatever the prefetch)", minimum=1)
    create_missing: bool = setting(
        False, "a message naming a record with no attributes when no such record is stored "
        "creates it (false: the message is dead-lettered, 'record … does not exist')")
    priority: int = setting(
        0, "when lanes (queues) compete for the runner, a higher one goes first: each step up "
        "gets twice the turns of the one below, so a lower lane is slowed, never starved")
    rate_limit: float | None = setting(
        None, "records per second the queue's messages are run at, at most, by the whole "
        "cluster (each member takes its share); unset: no limit", minimum=0, positive=True)
    ordered_by: str | None = setting(
        None, "`record`, or a message header's name: two messages with the same key never run "
        "at once and run in the order the queue delivered them, also across retries and "
        "members (the queue gets a single active consumer); unset: no order")
    max_output_depth: int | None = setting(
        None, "the queue's lane takes no new batch while a queue its results are routed to "
        "holds more ready messages than this (back-pressure); unset: no limit", minimum=1)
    extras: tuple[tuple[str, Any], ...] = field(
        default=(), metadata={"internal": "the keys plug-ins add to the rule, by their name "
                                          "(extra())"})

    @property
    def ordered_by_record(self) -> bool:
        return self.ordered_by == "record"

    def extra(self, name: str) -> Any:
        """The keys the plug-in's :func:`~listener_router._keys.rule_keys` class ``name`` adds
        to this rule (a value of that class; its defaults when the rule sets none of them).

        Raises:
            KeyError: no installed plug-in adds keys under ``name`` to listener rules.
        """
        for key, value in self.extras:
            if key == name:
                return value
        return _default_extra("listener", name)

    def __getattr__(self, name: str) -> Any:
        # A plug-in's key by its own name: ``rule.sample_every`` for ``rule.extra("sample").sample_every``.
        if name.startswith("__") or name == "extras":
            raise AttributeError(name)
        for keys in rule_extras("listener"):
            if name in _names(keys.cls):
                return getattr(self.extra(keys.name), name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


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


def rule_extras(rules: str) -> list[RuleKeys]:
    """The keys plug-ins add to each rule of the core's ``[[rules]]`` list, in plug-in order."""
    found: list[RuleKeys] = []
    for cls in plugin_classes():
        found += [keys for k in getattr(cls, "rule_keys", ())
                  if (keys := rule_keys_of(k)).rules == rules]
    return found


@functools.cache
def _default_extra(rules: str, name: str) -> Any:
    for keys in rule_extras(rules):
        if keys.name == name:
            return keys.cls()
    raise KeyError(f"no plug-in adds keys named {name!r} to [[{rules}]] rules (known: "
                   f"{', '.join(k.name for k in rule_extras(rules)) or 'none'})")


_RULE_FIELDS = frozenset(f.name for f in dataclasses.fields(ListenerRule))
def _names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


_rule_init = ListenerRule.__init__


def _listener_init(self: ListenerRule, *args: Any, **values: Any) -> None:
    """The dataclass's ``__init__``, also taking a plug-in's rule keys by their own names
    (``ListenerRule(queue="in", sample_every=10)``; ``dataclasses.replace`` too)."""
    flat = {name: values.pop(name) for name in [n for n in values if n not in _RULE_FIELDS]}
    _rule_init(self, *args, **values)
    if not flat:
        return
    extras = dict(self.extras)
    for name, value in flat.items():
        owner = next((k for k in rule_extras("listener")
                      if name in _names(k.cls)), None)
        if owner is None:
            raise TypeError(f"ListenerRule() got an unexpected keyword argument {name!r}")
        extras[owner.name] = replace(extras.get(owner.name) or owner.cls(), **{name: value})
    object.__setattr__(self, "extras", tuple(sorted(extras.items())))


ListenerRule.__init__ = _listener_init  # type: ignore[method-assign]


def feature_sections() -> list[Section]:
    """The sections of every plug-in, in plug-in order."""
    found: list[Section] = []
    for cls in plugin_classes():
        found += [section_of(s) for s in cls.sections]  # type: ignore[attr-defined]
    return found


def default_features() -> dict[str, Any]:
    return {s.name: s.default() for s in feature_sections()}


@dataclass(frozen=True)
class Settings:
    """Every setting, read once (:func:`load_settings`); see docs/configuration.md.

    The core's keys are fields; a feature's section is :meth:`section`
    (``settings.section("jobs").log``).
    """

    blackboard_url: str = setting(
        "sqlite:///chalk.db", "any SQLAlchemy URL; PostgreSQL (several processes): "
        "`postgresql+psycopg://user@host/db`", section="blackboard", key="url")
    lease_seconds: float = setting(
        60.0, "record locks lapse this long after their holder stopped renewing them (a crash)",
        section="blackboard", minimum=0, positive=True)
    broker_url: str = setting(
        DEFAULT_BROKER, "the RabbitMQ server, an AMQP URL; a cluster's nodes: a list of URLs "
        "(in the environment: separated by commas), tried in turn when one does not answer",
        section="broker", key="url", parse=_broker_url, check=_broker_url_check)
    queue_type: str = setting("quorum", "type of the queues Chalk declares",
                              section="broker", choices=("quorum", "classic"))
    delivery_limit: int = setting(
        20, "quorum queues: deliveries after which the broker dead-letters a message "
        "(a service process that dies on it every time)", section="broker", minimum=1)
    max_queue_bytes: int = setting(
        4 << 30, "bytes an input, output or retry queue holds at most; past it the broker "
        "refuses new messages (publishers get a nack, nothing is dropped); 0: no bound",
        section="broker", minimum=0)
    max_dead_letter_bytes: int = setting(
        1 << 30, "bytes a dead-letter queue (`Q.dlq`) holds at most; past it the broker "
        "refuses new dead letters (the service holds the message and tries again; quorum "
        "queues keep a message the broker dead-letters until there is room); 0: no bound",
        section="broker", minimum=0)
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
    runner: str = setting("spark", "`local`: no Spark; every batch on the service's own "
                          "supervised worker processes (`service_workers`), same semantics",
                          section="engine", choices=("spark", "local"))
    service_workers: int | None = setting(
        None, "worker processes the service supervises for runs outside Spark (`runner = "
        "\"local\"`, small batches, and batches while Spark's warm workers cannot start); "
        "unset: the cores for `runner = \"local\"`, else at most 2", section="engine",
        minimum=1)
    batch_timeout: float = setting(30.0, "seconds a workflow run may take; past it the run is "
                                   "treated as hung and its messages rerun one by one",
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
        "on (on a cluster the executors must reach the driver on a port of its own, "
        "`spark.chalk.workers.port`; where they cannot, batches run as jobs of their own)",
        section="engine")
    local_below: int | None = setting(
        None, "batches of fewer records run on the service's own workers, not on Spark, "
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
    features: Mapping[str, Any] = field(
        default_factory=default_features, compare=True,
        metadata={"internal": "each feature's section, by name (section())"})
    source: str | None = field(default=None, metadata={"internal": "the file read"})

    # -- a feature's section -----------------------------------------------------------------
    def section(self, name: str) -> Any:
        """The value of feature section ``name``: its dataclass, or a tuple of rules for a
        ``[[name]]`` list.

        Raises:
            KeyError: no installed plug-in declares that section.
        """
        try:
            return self.features[name]
        except KeyError:
            raise KeyError(f"no plug-in declares the settings section [{name}] (known: "
                           f"{', '.join(sorted(self.features)) or 'none'})") from None

    def with_section(self, name: str, value: Any) -> Settings:
        """These settings with feature section ``name`` replaced by ``value``."""
        self.section(name)
        return replace(self, features={**self.features, name: value})

    def __getattr__(self, name: str) -> Any:
        # Names of earlier, flat settings: ``settings.schedules``, ``settings.job_log``.
        if name.startswith("__") or name in ("features", "source"):
            raise AttributeError(name)
        found = _flat_name(name)
        if found is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        sec, key = found
        value = self.features.get(sec.name, sec.default())
        return value if key is None else getattr(value, key)

    def with_overrides(self, **changes: Any) -> Settings:
        """These settings with ``changes`` (None values are ignored): core fields by name,
        a feature's keys by their flat names (``job_log=False``, ``schedules=(…)``)."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    def problem(self) -> str | None:
        """What is wrong with core keys that are right one by one, or None."""
        if self.ttl_seconds <= self.heartbeat_seconds:
            return (f"[node] ttl_seconds ({self.ttl_seconds:g}) must be more than "
                    f"heartbeat_seconds ({self.heartbeat_seconds:g}); three heartbeats or more "
                    "is safe")
        for queue in dict.fromkeys(r.queue for r in self.listeners):
            rules = [r for r in self.listeners if r.queue == queue]
            for key in LANE_KEYS:
                values = {getattr(r, key) for r in rules}
                if len(values) > 1:
                    return (f"[[listener]] rules on queue {queue!r} give {key} "
                            f"{' and '.join(map(repr, sorted(values, key=repr)))}: it is the "
                            "queue's (its lane's), one value for all of its rules")
        return None


# A listener rule's keys that are its queue's (its lane's): every rule on a queue gives the same.
LANE_KEYS = ("priority", "rate_limit", "ordered_by", "max_output_depth", "max_inflight_bytes")

_FIELDS = frozenset(f.name for f in dataclasses.fields(Settings))
_dataclass_init = Settings.__init__


def _init(self: Settings, **values: Any) -> None:
    """The dataclass's ``__init__``, also taking a feature's keys by their flat names
    (``Settings(journals=(…), job_log=False)``; ``dataclasses.replace`` too)."""
    flat = {name: values.pop(name) for name in [n for n in values if n not in _FIELDS]}
    _dataclass_init(self, **values)
    if not flat:
        return
    features = dict(self.features)
    for name, value in flat.items():
        found = _flat_name(name)
        if found is None:
            raise TypeError(f"Settings() got an unexpected keyword argument {name!r}")
        sec, key = found
        features[sec.name] = value if key is None else replace(
            features.get(sec.name, sec.default()), **{key: value})
    object.__setattr__(self, "features", features)


Settings.__init__ = _init  # type: ignore[method-assign, assignment]


def _flat_name(name: str) -> tuple[Section, str | None] | None:
    """The section (and field; None: the whole section) an older flat name stands for."""
    for sec in feature_sections():
        if name == sec.attribute:
            return sec, None
        if name in sec.flat:
            return sec, sec.flat[name]
    return None


def settings_keys() -> list[tuple[dataclasses.Field[Any], Key]]:
    """Every core field of :class:`Settings` that is a setting, with its key, in order."""
    out = []
    for f in dataclasses.fields(Settings):
        key = key_of(f)
        if key is not None:
            out.append((f, replace(key, name=key.name or (None if rules_of(f) else f.name))))
        elif "internal" not in f.metadata:
            raise TypeError(f"Settings.{f.name} is neither a setting (setting(...)) nor "
                            "internal (field(metadata={'internal': why}))")
    return out


def rules_of(f: dataclasses.Field[Any]) -> type | None:
    return rule_class(kind_of(Settings, f.name))


def configured(settings: Settings) -> Settings:
    """``settings`` with what each plug-in derives from its sections (``Plugin.configure``:
    a schedule's queue gets a listener rule); idempotent."""
    for cls in plugin_classes():
        settings = cls.configure(settings)  # type: ignore[attr-defined]
    return settings
