"""``[[schedule]]``: scheduled jobs, and the listener rules their queues need."""

from __future__ import annotations

import re
import zoneinfo
from dataclasses import dataclass

from listener_router._errors import ConfigError
from listener_router._keys import section, setting
from listener_router._settings import ListenerRule, Settings

__all__ = ["ScheduleRule", "parse_every", "with_schedule_listeners"]

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


@section("schedule", "Scheduled jobs, run by the cluster's leader, each tick exactly once "
         "(a list; `chalk schedules` shows them with their last and next run).", array=True,
         empty="nothing runs on a schedule", attribute="schedules")
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


def with_schedule_listeners(listeners: tuple[ListenerRule, ...],
                            schedules: tuple[ScheduleRule, ...], where: str
                            ) -> tuple[ListenerRule, ...]:
    """The listener rules plus one per schedule whose queue has none (idempotent).

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


def configure_schedules(settings: Settings) -> Settings:
    """``settings`` with the schedules' names checked and their listener rules added."""
    schedules: tuple[ScheduleRule, ...] = settings.section("schedule")
    where = settings.source or "settings"
    names = [s.name for s in schedules]
    if len(set(names)) != len(names):
        raise ConfigError(f"{where}: two [[schedule]] entries share a name "
                          f"({', '.join(sorted(n for n in set(names) if names.count(n) > 1))})")
    listeners = with_schedule_listeners(settings.listeners, schedules, where)
    if listeners == settings.listeners:
        return settings
    return settings.with_overrides(listeners=listeners)
