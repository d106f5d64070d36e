"""When a schedule ticks: cron expressions (croniter) or a fixed period.

Ticks are instants (epoch seconds) that every member computes alike: a cron
expression's in its time zone, or the multiples of ``every`` seconds since
the epoch, so ``every = "30s"`` ticks at :00 and :30 of each minute on
every member, whenever it started.
"""

from __future__ import annotations

import datetime as dt
import math
import zoneinfo

from croniter import croniter

from listener_router.schedules._settings import ScheduleRule

__all__ = ["Ticks", "tick_label"]


class Ticks:
    """A schedule's ticks: :meth:`after`, :meth:`before`, :meth:`between`."""

    def __init__(self, rule: ScheduleRule):
        self.rule = rule
        self.every = rule.every
        self.zone = zoneinfo.ZoneInfo(rule.timezone)

    def _cron(self, t: float) -> croniter:
        assert self.rule.cron is not None
        return croniter(self.rule.cron, dt.datetime.fromtimestamp(t, self.zone))

    def after(self, t: float) -> float:
        """The first tick later than ``t``."""
        if self.every is not None:
            return (math.floor(t / self.every) + 1) * self.every
        return float(self._cron(t).get_next(float))

    def before(self, t: float) -> float:
        """The last tick earlier than ``t``."""
        if self.every is not None:
            return (math.ceil(t / self.every) - 1) * self.every
        return float(self._cron(t).get_prev(float))

    def at_or_before(self, t: float) -> float:
        """The last tick at ``t`` or earlier."""
        last = self.before(t)
        following = self.after(last)
        return following if following <= t else last

    def between(self, start: float, end: float, cap: int = 100_000) -> int:
        """How many ticks lie in ``(start, end]`` (counted up to ``cap``)."""
        if end <= start:
            return 0
        if self.every is not None:
            return int(math.floor(end / self.every) - math.floor(start / self.every))
        count, t = 0, start
        while count < cap:
            t = self.after(t)
            if t > end:
                break
            count += 1
        return count

    def describe(self) -> str:
        if self.every is not None:
            return f"every {self.every:g} s"
        zone = "" if self.rule.timezone == "UTC" else f" ({self.rule.timezone})"
        return f"cron {self.rule.cron}{zone}"


def tick_label(t: float) -> str:
    """A tick as ISO 8601 UTC text (seconds, or milliseconds when it has a fraction)."""
    when = dt.datetime.fromtimestamp(t, dt.timezone.utc)
    spec = "seconds" if float(t).is_integer() else "milliseconds"
    return when.isoformat(timespec=spec).replace("+00:00", "Z")
