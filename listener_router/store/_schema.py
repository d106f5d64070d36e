"""Tables in the service's database: each owner's :class:`Schema`, created and upgraded at once.

The core's tables (inbox, outbox, nodes, cluster, workflow versions) are
:data:`CORE`; a feature that keeps tables of its own makes a
:class:`Schema` of its own next to them, so its tables are defined in one
place and made only where the feature is used.  A schema's tables are
defined on :attr:`Schema.metadata`; when an earlier Chalk wrote another
layout, an upgrade step is registered with :meth:`Schema.upgrade`.
:meth:`Schema.create` makes what is missing and runs the upgrades in one
transaction; on PostgreSQL under an advisory lock, since several processes
may open a fresh database at once.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import fields
from typing import Any, TypeVar

from sqlalchemy import Connection, MetaData, text
from sqlalchemy.engine import Engine

__all__ = ["CORE", "Schema", "reading", "row_as"]

T = TypeVar("T")

_SCHEMA_LOCK = 7011932   # the blackboard's own tables use 7011931


class Schema:
    """One owner's tables: their metadata and upgrades (see the module doc)."""

    def __init__(self, name: str):
        self.name = name
        self.metadata = MetaData()
        self._upgrades: list[Callable[[Connection], None]] = []
        self._made: weakref.WeakSet[Engine] = weakref.WeakSet()
        self._lock = threading.Lock()

    def upgrade(self, step: Callable[[Connection], None]) -> Callable[[Connection], None]:
        """Register ``step(connection)`` to bring an earlier layout up to date (idempotent)."""
        self._upgrades.append(step)
        return step

    def create(self, engine: Engine) -> None:
        """Create the tables where absent and upgrade earlier layouts (once per engine)."""
        with self._lock:
            if engine in self._made:
                return
            with engine.begin() as conn:
                if engine.dialect.name == "postgresql":
                    conn.execute(text(f"SELECT pg_advisory_xact_lock({_SCHEMA_LOCK})"))
                self.metadata.create_all(conn)
                for step in self._upgrades:
                    step(conn)
            self._made.add(engine)


CORE = Schema("core")


def reading(engine: Engine) -> Connection:
    """A connection that only reads: on SQLite its transactions begin without taking the
    write lock (writers' ``BEGIN IMMEDIATE``), so reads never wait behind a commit."""
    return engine.connect().execution_options(chalk_readonly=True)


def row_as(cls: type[T], row: Any) -> T:
    """The dataclass ``cls`` from a row whose columns are named as its fields."""
    mapping = row._mapping
    return cls(**{f.name: mapping[f.name] for f in fields(cls)})  # type: ignore[arg-type]
