"""What operators set on the lanes, from anywhere: pause, resume, list, cancel.

``chalk queue`` and ``chalk jobs cancel`` call these, and so does the
dashboard (behind its token); both sit above the core, so the functions
live here.  Each writes to the store (``store/_flow.py``): every member of
the cluster reads it within about a second and obeys, also after a restart.
"""

from __future__ import annotations

import getpass
import socket
from collections.abc import Sequence
from typing import Any

from listener_router._errors import ConfigError
from listener_router._settings import LANE_KEYS, Settings
from listener_router.store import ServiceStore, unavailable

__all__ = ["cancel", "input_queues", "lane_rows", "parse_duration", "queue_list", "set_paused",
           "who", "withdraw_all"]

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def who() -> str:
    """``user@host``: who a command acts as."""
    return f"{getpass.getuser()}@{socket.gethostname()}"


def parse_duration(text: str, where: str) -> float:
    """Seconds, or a number and s, m, h or d (``2h``); ``where`` names the option.

    Raises:
        ConfigError: not of that form.
    """
    text = text.strip()
    try:
        return float(text[:-1]) * _UNITS[text[-1]] if text[-1] in _UNITS else float(text)
    except (ValueError, IndexError, KeyError):
        raise ConfigError(f"{where} {text!r}: give seconds or a number and s, m, h or d "
                          "(e.g. 2h)") from None


def input_queues(settings: Settings) -> list[str]:
    """The queues the listener rules read (the lanes), in the configuration's order."""
    return list(dict.fromkeys(rule.queue for rule in settings.listeners))


def _connected(settings: Settings, store: ServiceStore | None) -> tuple[ServiceStore, bool]:
    if store is not None:
        return store, False
    return ServiceStore.connect(settings.blackboard_url), True


def set_paused(settings: Settings, queue: str, paused: bool, *, reason: str | None = None,
               by: str | None = None, store: ServiceStore | None = None) -> None:
    """Pause or resume ``queue``'s lane on every member (persisted).

    Raises:
        ConfigError: ``queue`` is not one the listener rules read.
        StoreUnavailable: the store could not be written.
    """
    known = input_queues(settings)
    if queue not in known:
        raise ConfigError(f"{queue!r} is not a queue of the listener rules (known: "
                          f"{', '.join(known) or 'none'})")
    store, mine = _connected(settings, store)
    try:
        with store.writes, unavailable():
            store.lanes.put(queue, paused, by=by or who(), reason=reason or None)
    finally:
        if mine:
            store.close()


def lane_rows(settings: Settings, store: ServiceStore) -> list[dict[str, Any]]:
    """Each lane: its queue, its flow settings, paused or not (by whom, when, why), as the
    store says (what every member obeys)."""
    states = store.lanes.all()
    out = []
    for queue in input_queues(settings):
        rule = next(r for r in settings.listeners if r.queue == queue)
        state = states.get(queue)
        row: dict[str, Any] = {"queue": queue, "paused": bool(state and state.paused)}
        row.update({key: getattr(rule, key) for key in LANE_KEYS})
        if state is not None:
            row.update({"changed_at": state.changed_at, "changed_by": state.changed_by,
                        "reason": state.reason})
        out.append(row)
    return out


def queue_list(settings: Settings) -> list[dict[str, Any]]:
    """:func:`lane_rows` on a connection of its own."""
    store = ServiceStore.connect(settings.blackboard_url)
    try:
        return lane_rows(settings, store)
    finally:
        store.close()


def cancel(settings: Settings, *, messages: Sequence[str] = (), records: Sequence[str] = (),
           schedule: str | None = None, tick: str | None = None, until: float | None = None,
           lasting: bool = False, undo: bool = False, by: str | None = None,
           store: ServiceStore | None = None) -> int:
    """Cancel (or, ``undo``, withdraw the cancellation of) messages by ID, the messages
    naming records, or a schedule's tick; returns how many entries.

    A record's cancellation holds for the messages naming it that are queued now (published
    up to now); ``lasting`` (or an ``until``) also for those published later, until
    ``until`` or until withdrawn.

    Raises:
        ConfigError: nothing to cancel, or a schedule without its tick (or the reverse).
        StoreUnavailable: the store could not be written.
    """
    if (schedule is None) != (tick is None):
        raise ConfigError("give --schedule and --tick together (the tick as chalk schedules or "
                          "chalk jobs shows it, e.g. 2026-11-27T17:00:00Z)")
    if not (messages or records or schedule):
        raise ConfigError("say what to cancel: message IDs, --record ID or --schedule NAME "
                          "--tick TICK")
    prefix = f"schedule:{schedule}:{tick}:" if schedule is not None else None
    store, mine = _connected(settings, store)
    try:
        with store.writes, unavailable():
            return _cancel(store, messages, records, prefix, until, lasting or until is not None,
                           undo, by)
    finally:
        if mine:
            store.close()


def _cancel(store: ServiceStore, messages: Sequence[str], records: Sequence[str],
            prefix: str | None, until: float | None, lasting: bool, undo: bool,
            by: str | None) -> int:
    table = store.cancellations
    if undo:
        return (table.withdraw("message", list(messages))
                + table.withdraw("record", list(records))
                + table.withdraw("queued", list(records))
                + (table.withdraw("prefix", [prefix]) if prefix else 0))
    by = by or who()
    return (table.add("message", messages, by=by)
            + (table.add("record", records, by=by, until=until) if lasting
               else table.add("queued", records, by=by))
            + (table.add("prefix", [prefix], by=by) if prefix else 0))


def withdraw_all(settings: Settings, store: ServiceStore | None = None) -> int:
    """Withdraw every cancellation in force; returns how many."""
    store, mine = _connected(settings, store)
    try:
        with store.writes, unavailable():
            table = store.cancellations
            return sum(table.withdraw(kind, [c.value for c in found])
                       for kind in ("message", "prefix", "record", "queued")
                       if (found := [c for c in table.active() if c.kind == kind]))
    finally:
        if mine:
            store.close()
