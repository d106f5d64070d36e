"""Each schedule with its last and next tick, as ``chalk schedules`` and the page show it."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from listener_router.schedules._selection import Selection
from listener_router.schedules._tables import Schedules, ScheduleState
from listener_router.schedules._ticks import Ticks, tick_label

if TYPE_CHECKING:
    from listener_router._settings import Settings
    from listener_router.schedules._settings import ScheduleRule
    from listener_router.store import ServiceStore

__all__ = ["ScheduleStatus", "schedule_status"]


@dataclass(frozen=True)
class ScheduleStatus:
    """One ``[[schedule]]``: what it publishes, its last tick (``state``) and its next."""

    rule: ScheduleRule
    when: str                    # the ticks, in words
    publishes: str               # the selection, in words
    state: ScheduleState | None  # its row: the last tick claimed (None: never ran)
    next: float | None           # the next tick (None: one is running)
    due: bool                    # the next tick is due now
    running: bool                # a tick was claimed and is not done

    @property
    def next_label(self) -> str | None:
        return None if self.next is None else tick_label(self.next)


def schedule_status(settings: Settings, store: ServiceStore,
                    now: float | None = None) -> list[ScheduleStatus]:
    """Each ``[[schedule]]`` of ``settings`` with its last and next tick."""
    now = time.time() if now is None else now
    states = store.tables(Schedules).all()
    out = []
    for rule in settings.section("schedule"):
        ticks = Ticks(rule)
        state = states.get(rule.name)
        running = state is not None and not state.done
        due = None if running else ticks.after(now if state is None else state.tick)
        out.append(ScheduleStatus(
            rule, ticks.describe(),
            f"{Selection(rule, store.sql).describe()}, {rule.batch_size} per message",
            state, due, due is not None and due <= now, running))
    return out
