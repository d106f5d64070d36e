"""Runs as ``chalk reprocess --list`` and the dashboard show them."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from listener_router.reprocess._selection import RunSelection
from listener_router.reprocess._tables import Runs
from listener_router.store import ServiceStore

__all__ = ["RunView", "run_views"]


@dataclass(frozen=True)
class RunView:
    """A run with what the service did of it: ``committed`` is how many of its messages
    the service committed (its inbox rows), ``done`` the share of the records to look at
    that were looked at (0 to 1)."""

    run: str
    state: str                 # running, interrupted, stopped, finished
    workflow: str
    queue: str
    selection: str             # described
    rate: float | None
    total: int
    looked: int
    published: int
    committed: int
    missing: int
    done: float
    started_at: float
    updated_at: float
    finished_at: float | None
    owner: str | None
    note: str | None

    def json(self) -> dict[str, Any]:
        return asdict(self)


def run_views(store: ServiceStore, limit: int = 20) -> list[RunView]:
    """The newest ``limit`` runs, newest first."""
    runs = store.tables(Runs)
    found = runs.recent(limit)
    committed = runs.committed(found)
    return [RunView(
        run=r.id, state=r.shown_state, workflow=r.workflow, queue=r.queue,
        selection=RunSelection.parse(r.selection).describe(), rate=r.rate, total=r.total,
        looked=r.looked, published=r.published, committed=committed.get(r.id, 0),
        missing=r.missing,
        done=1.0 if r.state == "finished" else min(r.looked / r.total, 1.0) if r.total else 0.0,
        started_at=r.started_at, updated_at=r.updated_at, finished_at=r.finished_at,
        owner=r.owner, note=r.note) for r in found]
