"""Which workflow versions each service process runs (``chalk_workflow_versions``).

A running service writes its registry's versions here when it starts and
after every reload that changed one; ``chalk status`` reads them (another
process, so it cannot ask the registry).  One row per process and workflow;
a process's rows are replaced as a whole and removed when it stops.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Column, Float, String, Table, delete, select
from sqlalchemy.engine import Engine

from listener_router.store._schema import CORE

__all__ = ["RunningVersion", "WorkflowVersions", "workflow_versions"]

workflow_versions = Table(
    "chalk_workflow_versions", CORE.metadata,
    Column("node", String(255), primary_key=True),
    Column("name", String(255), primary_key=True),
    Column("version", String(64), nullable=False),
    Column("path", String(1024), nullable=False),
    Column("loaded_at", Float, nullable=False),
)


@dataclass(frozen=True)
class RunningVersion:
    """Workflow ``name`` at ``version`` (from ``path``) runs in process ``node`` since
    ``loaded_at`` (its last reload, epoch seconds)."""

    node: str
    name: str
    version: str
    path: str
    loaded_at: float


class WorkflowVersions:
    """Write a process's running versions; read everyone's."""

    def __init__(self, engine: Engine):
        self.engine = engine

    def publish(self, node: str, versions: Sequence[RunningVersion]) -> None:
        """Make ``versions`` the rows of ``node`` (those of other nodes untouched)."""
        with self.engine.begin() as conn:
            conn.execute(delete(workflow_versions).where(workflow_versions.c.node == node))
            if versions:
                conn.execute(workflow_versions.insert(), [
                    {"node": node, "name": v.name, "version": v.version, "path": v.path,
                     "loaded_at": v.loaded_at} for v in versions])

    def running(self, nodes: Sequence[str] | None = None) -> list[RunningVersion]:
        """The versions ``nodes`` run (every node's when None), by workflow then node."""
        query = select(workflow_versions).order_by(workflow_versions.c.name,
                                                   workflow_versions.c.node)
        if nodes is not None:
            query = query.where(workflow_versions.c.node.in_(list(nodes)))
        with self.engine.connect() as conn:
            rows = conn.execute(query).all()
        return [RunningVersion(r.node, r.name, r.version, r.path, r.loaded_at) for r in rows]

    def forget(self, node: str) -> None:
        """Drop ``node``'s rows (it stops)."""
        self.publish(node, ())
