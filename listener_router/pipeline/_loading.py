"""Records on a group's blackboard: loading them, writing the messages' attributes, letting go.

The gather stage loads; the execute stage loads again when it isolates a
failing message; every stage lets records go (invalidates them) when their
message leaves the batch.
"""

from __future__ import annotations

import logging
import time

from blackboard import Blackboard, BlackboardError, RecordLockedError
from listener_router._errors import StoreUnavailable
from listener_router.pipeline._report import BatchReport, Meter
from listener_router.pipeline._states import State
from listener_router.pipeline._work import Work, record_ids
from listener_router.store import ServiceStore, unavailable

__all__ = ["Loader"]

log = logging.getLogger(__name__)


class Loader:
    """Loads and lets go of a group's records (see module doc)."""

    def __init__(self, store: ServiceStore, meter: Meter):
        self.store = store
        self.meter = meter

    def load(self, bb: Blackboard, group: list[Work], report: BatchReport | None) -> list[Work]:
        """Load the group's records, all or nothing; messages whose records another
        owner holds are deferred and the rest loaded (until nothing is left)."""
        started = time.perf_counter()
        try:
            while group:
                ids = record_ids(group)
                try:
                    with self.store.writes, unavailable():
                        bb.load_many(ids)
                    return group
                except RecordLockedError as e:
                    locked = set(e.holders)
                    keep = []
                    for w in group:
                        if locked.intersection(w.message.record_ids):  # type: ignore[union-attr]
                            w.to(State.DEFERRED, str(e))
                        else:
                            keep.append(w)
                    group = keep
                except StoreUnavailable as e:
                    log.warning("loading %d record(s) failed, holding their messages: %s",
                                len(ids), e)
                    for w in group:
                        w.to(State.DEFERRED, f"storage unavailable: {e}")
                    return []
            return group
        finally:
            self.meter.time("load", time.perf_counter() - started, report)

    def apply(self, bb: Blackboard, w: Work) -> bool:
        """Write the message's attributes onto the loaded records; bad ones dead-letter it, and
        so does a record named without attributes that is not stored (unless the rule says
        ``create_missing``).  A DELETE of an absent record goes ahead: there is nothing to keep."""
        assert w.message is not None
        if w.message.operation == "DELETE":
            return True
        if w.rule is not None and not w.rule.create_missing:
            missing = [r["id"] for r in w.message.records if not r["attributes"] and bb.is_new(r["id"])]
            if missing:
                w.to(State.DEAD, f"message {w.message.message_id}: record {missing[0]!r} does not "
                     f"exist{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}; an ID-only "
                     f"message names a stored record (listener rule {w.rule.name!r} can create it: "
                     "create_missing = true)")
                self.invalidate(bb, w.message.record_ids)
                return False
        try:
            for record in w.message.records:
                if record["attributes"]:
                    bb.set_attributes(record["id"], record["attributes"])
            return True
        except (BlackboardError, RecursionError, ValueError, TypeError) as e:
            w.to(State.DEAD, f"message {w.message.message_id}: attributes not usable: {e}")
            self.invalidate(bb, w.message.record_ids)
            return False

    def invalidate(self, bb: Blackboard, ids: list[str]) -> None:
        """Invalidate, tolerating a database that is gone: the records leave the
        blackboard either way, and leases left behind are this node's, so its
        next load takes them over (or they lapse)."""
        try:
            with self.store.writes, unavailable():
                bb.invalidate_many(ids)
        except StoreUnavailable as e:
            log.warning("could not release %d lease(s), they will lapse: %s", len(ids), e)
