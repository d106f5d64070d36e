"""The job log as far as the inbox and outbox tell it (read-only).

The inbox has a row per committed message (queue, ID, when, its outbox
batch); the outbox batch holds the messages it routed, whose bodies name
the records.  So a processed message's records are the ones it routed, and
a search by record ID finds the messages that routed that record: a record
that was processed but routed nowhere is not found here.  (A job log that
stores every message's records replaces this module.)
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import orjson
from sqlalchemy import Connection, select
from sqlalchemy.engine import Engine

from listener_router.store._outbox import inbox, outbox

__all__ = ["Job", "JobLog"]

_SCAN = 500  # outbox batches a record search reads at most (newest first)


@dataclass(frozen=True)
class Job:
    """One processed message."""

    message_id: str
    queue: str
    status: str
    processed_at: float
    records: tuple[str, ...]     # the records it routed
    targets: tuple[str, ...]     # where it routed them (queues, or exchange/key)


def _routed(messages_json: str) -> dict[str, tuple[list[str], list[str]]]:
    """Source message ID → (record IDs, targets) of one outbox batch's messages."""
    found: dict[str, tuple[list[str], list[str]]] = defaultdict(lambda: ([], []))
    for _mid, source, exchange, key, body, _headers, _ctype in orjson.loads(messages_json):
        try:
            records = [str(r["id"]) for r in orjson.loads(body).get("records", ())]
        except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError):
            records = []
        ids, targets = found[source]
        ids += records
        target = f"{exchange}/{key}" if exchange else key
        if target not in targets:
            targets.append(target)
    return found


class JobLog:
    """Processed messages, newest first, with the records they routed (see module doc)."""

    def __init__(self, engine: Engine):
        self.engine = engine

    def recent(self, limit: int = 50, record_id: str | None = None) -> list[Job]:
        """The last ``limit`` processed messages; with ``record_id``, those that routed it."""
        with self.engine.connect() as conn:
            if record_id is None:
                rows = conn.execute(select(inbox).order_by(inbox.c.processed_at.desc())
                                    .limit(limit)).all()
                batches = self._batches(conn, sorted({r.batch for r in rows if r.batch}))
            else:
                pattern = "%" + record_id.replace("\\", "\\\\").replace("%", "\\%") \
                    .replace("_", "\\_") + "%"
                scanned = conn.execute(
                    select(outbox.c.id, outbox.c.messages)
                    .where(outbox.c.messages.like(pattern, escape="\\"))
                    .order_by(outbox.c.created_at.desc()).limit(_SCAN)).all()
                batches = {b.id: _routed(b.messages) for b in scanned}
                sources = sorted({source for routed in batches.values()
                                  for source, (ids, _t) in routed.items() if record_id in ids})
                rows = []
                for start in range(0, len(sources), 1000):
                    rows += conn.execute(select(inbox).where(
                        inbox.c.message_id.in_(sources[start:start + 1000]))).all()
                rows = sorted((r for r in rows if r.batch in batches),
                              key=lambda r: r.processed_at, reverse=True)[:limit]
        jobs = []
        for r in rows:
            ids, targets = batches.get(r.batch, {}).get(r.message_id, ([], [])) \
                if r.batch else ([], [])
            jobs.append(Job(r.message_id, r.queue, r.status, r.processed_at, tuple(ids),
                            tuple(targets)))
        return jobs

    @staticmethod
    def _batches(conn: Connection, ids: Sequence[str]
                 ) -> dict[str, dict[str, tuple[list[str], list[str]]]]:
        found = {}
        for start in range(0, len(ids), 1000):
            for b in conn.execute(select(outbox.c.id, outbox.c.messages)
                                  .where(outbox.c.id.in_(ids[start:start + 1000]))):
                found[b.id] = _routed(b.messages)
        return found
