"""The schedules plug-in: the scheduler as a leader task, and the listener rules it derives.

Built when there is any ``[[schedule]]``.  ``configure`` gives a schedule
with a workflow and a queue of its own a listener rule (docs/configuration.md,
``[[schedule]]``); the scheduler (``_scheduler``) runs as a leader task and
hands the outbox batches it writes to the service's finish stage; with the
events plug-in built, each finished tick writes ``job.finished.<schedule>``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from listener_router._plugin import Host, Plugin
from listener_router.schedules._scheduler import Scheduler
from listener_router.schedules._settings import ScheduleRule, configure_schedules
from listener_router.schedules._tables import SCHEMA

if TYPE_CHECKING:
    from listener_router._settings import Settings
    from listener_router.cluster import LeaderTask
    from listener_router.store import Schema

__all__ = ["SchedulesPlugin"]


class SchedulesPlugin(Plugin):
    """Runs the ``[[schedule]]`` entries while this member leads."""

    name = "schedules"
    after = ("events",)
    sections = (ScheduleRule,)

    @classmethod
    def configure(cls, settings: Settings) -> Settings:
        return configure_schedules(settings)

    @classmethod
    def build(cls, settings: Settings) -> SchedulesPlugin | None:
        rules: tuple[ScheduleRule, ...] = settings.section("schedule")
        return cls(rules) if rules else None

    def __init__(self, rules: tuple[ScheduleRule, ...]):
        self.rules = rules
        self.scheduler: Scheduler | None = None

    def tables(self) -> list[Schema]:
        return [SCHEMA]

    def install(self, host: Host) -> None:
        events = host.plugin("events")
        self.scheduler = Scheduler(host.store, self.rules, host.membership, host.publish,
                                   member=host.node,
                                   events=getattr(events, "events", None))

    def leader_tasks(self) -> list[LeaderTask]:
        assert self.scheduler is not None, "install() first"
        return [self.scheduler]
