"""The delta plug-in: unchanged records are not run again; a crawl's DELETEs spare what it saw.

Built when a listener rule sets ``delta = "hash"``.  Two hooks:

- ``screen`` (on the gather stage's thread, the records loaded and the
  messages' attributes written): for a message through a delta rule (not a
  DELETE), each record's content hash (``_hash``) is compared with the
  hashes at its last commit through the workflow (``chalk_delta_hashes``:
  as it came, and as its run wrote it); an equal one is settled without a
  run, ``unchanged``, routed or not as the rule says (a record new to the
  store is never unchanged).  A crawl's DELETE message (``chalk delta
  finish``, header ``x-chalk-delta-crawl``) whose record was seen in that
  crawl or a later one is settled ``unchanged`` too: the record stays.  And
  the records of delta messages are marked seen in their source's newest
  crawl (*on receipt*: before they run, so one that fails and waits for its
  retry still counts as seen).
- ``in_commit`` (in the commit transaction): the hashes of the records that
  ran, as they came and as committed; a deleted record's hashes and marks
  go; a crawl's DELETEs counted as deleted or kept.  So the hashes move
  exactly with the records: a kill -9 before the commit leaves the old
  hashes and the message delivered again, after it the new ones and the
  inbox row.

A database error while screening raises: the messages are held and tried
again (never run as though they were changed, nor deleted as unseen).
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING

from listener_router._plugin import Host, Plugin
from listener_router.delta._hash import content_hash
from listener_router.delta._settings import STEP, DeltaKeys
from listener_router.delta._tables import SCHEMA, Crawls, DeltaTables
from listener_router.pipeline import Commit, Screen, Work
from listener_router.store import Schema, ServiceStore, reading, unavailable

if TYPE_CHECKING:
    from listener_router._settings import Settings

__all__ = ["CRAWL_HEADER", "SOURCE_HEADER", "DeltaPlugin", "crawl_of"]

CRAWL_HEADER = "x-chalk-delta-crawl"     # a crawl's DELETE message: the crawl's number
SOURCE_HEADER = "x-chalk-delta-source"   # and its source


def crawl_of(work: Work) -> tuple[int, str] | None:
    """``(crawl, source)`` of a crawl's DELETE message, else None."""
    m = work.message
    if m is None or m.operation != "DELETE":
        return None
    crawl, source = m.headers.get(CRAWL_HEADER), m.headers.get(SOURCE_HEADER)
    if isinstance(source, bytes):
        source = source.decode("utf-8", "replace")
    try:
        return (int(crawl), str(source)) if crawl is not None and source is not None else None
    except (TypeError, ValueError):
        return None


def _keys(work: Work) -> DeltaKeys:
    assert work.rule is not None
    found: DeltaKeys = work.rule.extra("delta")
    return found


class DeltaPlugin(Plugin):
    """Delta processing in a running service (see the module doc)."""

    name = "delta"
    rule_keys = (DeltaKeys,)

    @classmethod
    def build(cls, settings: Settings) -> DeltaPlugin | None:
        on = any(rule.extra("delta").on for rule in settings.listeners)
        return cls() if on else None

    def __init__(self) -> None:
        self.store: ServiceStore | None = None
        self._lock = threading.Lock()
        # what screening found, for the commit: the records that run, with their hash as
        # they came; and the crawl of a crawl's DELETE message
        self._hashes: weakref.WeakKeyDictionary[Work, dict[str, str]] = \
            weakref.WeakKeyDictionary()

    def tables(self) -> list[Schema]:
        return [SCHEMA]

    def install(self, host: Host) -> None:
        self.store = host.store

    # -- before the run --------------------------------------------------------------------
    def screen(self, screen: Screen) -> None:
        hashed = [w for w in screen.works
                  if w.message is not None and w.message.operation != "DELETE" and _keys(w).on]
        deletes = [(w, found) for w in screen.works if (found := crawl_of(w)) is not None]
        if not hashed and not deletes:
            return
        assert self.store is not None
        bb = screen.blackboard
        stored_ids = [r for w in hashed for r in w.message.record_ids  # type: ignore[union-attr]
                      if not bb.is_new(r)]
        sources = [(source, r) for w in hashed for r in w.message.record_ids  # type: ignore[union-attr]
                   if (source := bb.get_source(r)) is not None]
        asked = [(source, r) for w, (_crawl, source) in deletes
                 for r in w.message.record_ids]  # type: ignore[union-attr]
        with unavailable():
            with reading(self.store.engine) as conn:
                stored = DeltaTables.hashes(conn, screen.workflow, stored_ids) \
                    if stored_ids else {}
                marks = DeltaTables.marks(conn, asked) if asked else {}
            if sources:  # seen on receipt, in the source's newest crawl
                with self.store.writes, self.store.engine.begin() as conn:
                    DeltaTables.mark_newest(conn, sources)
        for w, (crawl, source) in deletes:
            kept = [r for r in w.message.record_ids  # type: ignore[union-attr]
                    if marks.get((source, r), -1) >= crawl]
            if kept:
                screen.settle(w, kept, step=STEP)
        for w in hashed:
            keys = _keys(w)
            content = keys.content
            changed: dict[str, str] = {}
            unchanged: list[str] = []
            for rid in w.message.record_ids:  # type: ignore[union-attr]
                now = content_hash(bb, rid, content)
                if now in stored.get(rid, ()):
                    unchanged.append(rid)
                else:
                    changed[rid] = now
            if unchanged:
                screen.settle(w, unchanged, step=STEP, route=keys.delta_unchanged == "route")
            with self._lock:
                self._hashes[w] = changed

    # -- in the commit transaction ---------------------------------------------------------
    def in_commit(self, commit: Commit) -> None:
        bb = commit.blackboard
        assert bb is not None
        deleted = [rid for rid in commit.committed_ids if bb.is_deleted(rid)]
        gone = set(deleted)
        rows: list[tuple[str, str, str, str | None]] = []
        for w in commit.committed:
            with self._lock:
                came = self._hashes.get(w)
            if came and w.step is None:
                content = _keys(w).content
                rows += [(commit.workflow, rid, h, content_hash(bb, rid, content))
                         for rid, h in came.items() if rid not in gone and rid in bb]
            found = crawl_of(w)
            if found is not None:
                m = w.message
                assert m is not None
                Crawls.count(commit.connection, found[0], kept=len(w.unrun),
                             deleted=0 if w.step is not None else
                             sum(1 for r in m.record_ids if r in gone))
        conn = commit.connection
        DeltaTables.put_hashes(conn, rows)
        if deleted:
            DeltaTables.forget(conn, deleted)
