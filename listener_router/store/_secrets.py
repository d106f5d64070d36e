"""The cluster's secrets (``chalk_secrets``): random keys every member reads from the store.

A secret is made the first time any process asks for it (32 random bytes;
two processes asking at once agree on the first one written) and never
changes.  Whoever can read the database can read it: that is the cluster.
"""

from __future__ import annotations

import secrets
import threading
import time

from sqlalchemy import Column, Float, String, Table, select
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from listener_router.store._schema import CORE, reading

__all__ = ["Secrets", "secrets_table"]

secrets_table = Table(
    "chalk_secrets", CORE.metadata,
    Column("name", String(64), primary_key=True),
    Column("value", String(128), nullable=False),     # hex
    Column("made_at", Float, nullable=False),
)


class Secrets:
    """The cluster's secrets by name (see the module doc)."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._known: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def key(self, name: str) -> bytes:
        """The secret ``name``, made when no process made it yet."""
        with self._lock:
            found = self._known.get(name)
            if found is None:
                found = self._known[name] = bytes.fromhex(self._read_or_make(name))
            return found

    def _read(self, name: str) -> str | None:
        with reading(self.engine) as conn:
            value = conn.execute(select(secrets_table.c.value)
                                 .where(secrets_table.c.name == name)).scalar()
        return None if value is None else str(value)

    def _read_or_make(self, name: str) -> str:
        found = self._read(name)
        if found is not None:
            return found
        try:
            with self.engine.begin() as conn:
                conn.execute(secrets_table.insert().values(
                    name=name, value=secrets.token_hex(32), made_at=time.time()))
        except IntegrityError:  # another process made it first: theirs it is
            pass
        found = self._read(name)
        assert found is not None, f"secret {name!r} was neither found nor made"
        return found
