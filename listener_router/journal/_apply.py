"""Applying a batch of a journal's entries: one transaction, the effects and the offset.

The subscriber (``_subscriber``) decides *when*; this module does *how*:
which items of a batch are applied (:func:`to_apply`: copies and entries
before a time start are passed over), and the transaction itself — a
callable's effects (:func:`commit_callable`, isolating a failing entry in
savepoints) or the records a workflow commits on a blackboard over the
subscriber's store (:func:`commit_workflow`) — with the subscriber's row
advanced in it (``advance(connection, done)``).
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection

import engine as engine_pkg
from blackboard import Blackboard, BlackboardError, SqlStore
from listener_router._errors import ConfigError
from listener_router.broker import Delivery
from listener_router.journal._entries import AttachmentUnavailable, Entry

__all__ = ["ApplyFn", "SubscriberStats", "commit_callable", "commit_workflow", "count",
           "load_callable", "to_apply"]

log = logging.getLogger(__name__)

ApplyFn = Callable[[list[Entry], Connection], None]
Advance = Callable[[Connection, int], None]   # advance(connection, items done)


@dataclass
class SubscriberStats:
    """What an agent did since it started."""

    applied: int = 0          # entries applied (their effects committed)
    copies: int = 0           # copies of entries already applied, passed over
    passed: int = 0           # entries before a time start, passed over
    failures: int = 0         # failed attempts
    errors: int = 0           # entries sent to the error queue
    gaps: int = 0             # gaps found
    batches: int = 0
    resyncs: int = 0          # starts over from the row (commands, another agent)
    blocked: bool = False
    last_activity: float = field(default_factory=time.monotonic)


@dataclass(slots=True)
class _Item:
    """One delivery of the stream, as the subscriber takes it in."""

    delivery: Delivery | None
    offset: int
    entry: Entry | None = None
    problem: str | None = None        # not an entry (cannot be parsed)
    gap: tuple[int, int] | None = None  # offsets missing before this item (on_gap continue)
    body: bytes = b""


def load_callable(spec: str) -> ApplyFn:
    """``module:function`` → the function (the working directory is importable)."""
    module_name, _, name = spec.partition(":")
    if not module_name or not name:
        raise ConfigError(f"apply {spec!r}: give it as module:function")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(f"apply {spec!r}: cannot import {module_name!r}: {e}") from e
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ConfigError(f"apply {spec!r}: {module_name} has no function {name!r}")
    return fn


def describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def to_apply(batch: list[_Item], seq: int, not_before: float | None
             ) -> tuple[list[tuple[int, _Item]], dict[int, str]]:
    """Which items to apply (index, item), and which are passed over (index: why): copies of
    entries numbered ``seq`` or below, entries published before ``not_before``."""
    apply: list[tuple[int, _Item]] = []
    passed: dict[int, str] = {}
    for i, item in enumerate(batch):
        entry = item.entry
        if entry is not None and entry.seq <= seq:
            passed[i] = "copy"
        elif entry is not None and not_before is not None and entry.published_at < not_before:
            passed[i] = "before"
        else:
            apply.append((i, item))
            if entry is not None:
                seq = entry.seq
                not_before = None
    return apply, passed


def commit_callable(sql: SqlStore, fn: ApplyFn, batch: list[_Item],
                    apply: list[tuple[int, _Item]], advance: Advance) -> tuple[int, str | None]:
    """``fn``'s effects and the row in one transaction; how many items are done, and why the
    next one failed (None: all done)."""
    failure: tuple[int, str] | None = None
    with sql.engine.begin() as conn:
        entries = [item for _, item in apply]
        failing = _isolate(conn, fn, entries)
        if failing is not None:
            at, error = failing
            failure = (apply[at][0], error)
        done = failure[0] if failure is not None else len(batch)
        advance(conn, done)
    return done, failure[1] if failure is not None else None


def _isolate(conn: Connection, fn: ApplyFn, items: list[_Item]) -> tuple[int, str] | None:
    """Apply in one savepoint; on failure one by one: the first failing (index, why)."""
    bad = next((i for i, item in enumerate(items) if item.problem is not None), None)
    good = items if bad is None else items[:bad]
    if good:
        try:
            with conn.begin_nested():
                fn([item.entry for item in good], conn)  # type: ignore[misc]
        except Exception as e:
            if len(good) == 1:
                return 0, describe(e)
            for i, item in enumerate(good):
                try:
                    with conn.begin_nested():
                        fn([item.entry], conn)  # type: ignore[list-item]
                except Exception as e_one:
                    return i, describe(e_one)
    return None if bad is None else (bad, items[bad].problem or "not an entry")


def commit_workflow(sql: SqlStore, owner: str, runner: Any, workflow: engine_pkg.Workflow,
                    batch: list[_Item], apply: list[tuple[int, _Item]], advance: Advance,
                    subscriber: str) -> tuple[int, str | None]:
    """The records ``workflow`` commits over the entries' records, and the row, in one
    transaction; how many items are done, and why the next one failed (None: all done)."""
    bb = Blackboard(sql, owner=owner, lease_seconds=600.0)
    failure: tuple[int, str] | None = None
    try:
        entries = [(i, item.entry) for i, item in apply if item.entry is not None]
        bb.load_many([e.id for _, e in entries])
        ready: list[tuple[int, Entry]] = []
        for i, item in apply:
            if item.entry is None:
                failure = (i, item.problem or "not an entry")
                break
            try:
                put(bb, item.entry, subscriber)
            except (BlackboardError, AttachmentUnavailable, KeyError, ValueError) as e:
                failure = (i, describe(e))
                break
            ready.append((i, item.entry))
        runs = [(i, e) for i, e in ready if e.op != "DELETE"]
        ids_of: dict[int, list[str]] = {i: [e.id] for i, e in ready}
        if runs:
            results = runner.run(workflow, bb, [[e.id] for _, e in runs])
            for result in results:
                i = runs[result.index][0]
                if result.ok:
                    ids_of[i] = list(dict.fromkeys([runs[result.index][1].id,
                                                    *result.record_ids]))
                elif failure is None or i < failure[0]:
                    failure = (i, result.error or "the workflow failed")
        done = failure[0] if failure is not None else len(batch)
        commit = [rid for i, ids in ids_of.items() if i < done for rid in ids]
        bb.invalidate_many([rid for rid in bb.ids() if rid not in set(commit)])
        bb.commit_many(commit, hook=lambda conn: advance(conn, done))
    except BaseException:
        bb.invalidate_many(bb.ids())
        raise
    return done, failure[1] if failure is not None else None


def put(bb: Blackboard, entry: Entry, subscriber: str) -> None:
    """Write an entry onto the subscriber's blackboard (before its workflow runs)."""
    if entry.op == "DELETE":
        bb.delete(entry.id)
        return
    if entry.attributes:
        bb.set_attributes(entry.id, entry.attributes)
    for name in entry.attachments:
        try:
            with entry.open_attachment(name) as stream:
                bb.set_attachment_from_stream(entry.id, name, stream)
        except AttachmentUnavailable as e:
            if not e.superseded:
                raise
            log.info("subscriber %s: %s; a later entry carries it", subscriber, e)


def count(stats: SubscriberStats, batch: list[_Item], done: int, passed: dict[int, str]
          ) -> None:
    """Count the done items as applied, copies or passed over."""
    for i in range(done):
        why = passed.get(i)
        if why == "copy":
            stats.copies += 1
        elif why == "before":
            stats.passed += 1
        else:
            stats.applied += 1
