"""The service's tables: one ``MetaData``, created and upgraded in one place.

Each table module defines its tables on :data:`metadata` and, when an
earlier Chalk wrote another layout, registers an upgrade with
:func:`upgrade`.  :func:`create_schema` makes what is missing and runs the
upgrades, in one transaction; on PostgreSQL under an advisory lock, since
several processes may open a fresh database at once.  A new table (the job
log, say) is a new module here plus one line in ``_store``.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import Connection, MetaData, text
from sqlalchemy.engine import Engine

__all__ = ["metadata", "upgrade", "create_schema"]

metadata = MetaData()

_UPGRADES: list[Callable[[Connection], None]] = []

_SCHEMA_LOCK = 7011932   # the blackboard's own tables use 7011931


def upgrade(step: Callable[[Connection], None]) -> Callable[[Connection], None]:
    """Register ``step(connection)`` to bring an earlier layout up to date (idempotent)."""
    _UPGRADES.append(step)
    return step


def create_schema(engine: Engine) -> None:
    """Create the service's tables where absent and upgrade earlier layouts."""
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.execute(text(f"SELECT pg_advisory_xact_lock({_SCHEMA_LOCK})"))
        metadata.create_all(conn)
        for step in _UPGRADES:
            step(conn)
