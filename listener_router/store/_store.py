"""The service's own tables behind one object, and where database errors join the family.

:class:`ServiceStore` sits in the blackboard's database (one SQLAlchemy
engine, taken from the blackboard's public :class:`~blackboard.SqlStore`):
``outbox`` (inbox and outbox, written in the commit transaction),
``nodes`` (cluster heartbeats and advertised properties), ``cluster``
(leader, fencing epoch, established view), ``workflow_versions`` (what
each process runs) and ``secrets`` (the cluster's keys) are the core's; a feature's tables are reached with
:meth:`ServiceStore.tables` (``store.tables(JobLogTables)``), made the first
time they are asked for.  It also hands out the blackboards the pipeline
loads records on, and renews and purges record leases through the
blackboard's own calls.

Database errors become members of the service's error family here, at the
boundary: :func:`unavailable` for reads and writes outside a commit (any
failure is an outage: hold and retry), :func:`commit_failure` for a failed
commit transaction (an outage or a lease conflict: retry later; anything
else: the data's fault, which the commit stage narrows down).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from sqlalchemy.engine import Engine
from sqlalchemy.exc import InterfaceError, OperationalError, SQLAlchemyError
from sqlalchemy.exc import TimeoutError as SqlTimeoutError

from blackboard import Blackboard, RecordLockedError, SqlStore, StorageError
from listener_router._errors import (
    ChalkServiceError,
    CommitRefused,
    RecordsBusy,
    StoreUnavailable,
)
from listener_router.store._cluster import ClusterState
from listener_router.store._flow import Cancellations, LaneStates, OrderedKeys, Pushed
from listener_router.store._nodes import Nodes
from listener_router.store._outbox import Outbox
from listener_router.store._schema import CORE
from listener_router.store._secrets import Secrets
from listener_router.store._versions import WorkflowVersions

__all__ = ["ServiceStore", "commit_failure", "unavailable"]

T = TypeVar("T")

_OUTAGES = (OperationalError, InterfaceError, SqlTimeoutError, OSError)


class ServiceStore:
    """Inbox, outbox, nodes, cluster and workflow versions in the blackboard's database,
    and the features' tables on demand (see the module doc).

    Opening it creates (or upgrades) the tables.  ``writes`` is held around
    every write transaction of this process: SQLite has one writer, and
    threads that find its lock taken poll for it with sleeps of up to 100 ms
    (the busy handler), so the pipeline's writers (gather, commit, finish)
    queue here instead and each starts the moment the one before ends.
    PostgreSQL gets a no-op.
    """

    def __init__(self, sql: SqlStore):
        self.sql = sql
        CORE.create(sql.engine)
        self.outbox = Outbox(sql.engine)
        self.nodes = Nodes(sql.engine)
        self.cluster = ClusterState(sql.engine)
        self.workflow_versions = WorkflowVersions(sql.engine)
        self.lanes = LaneStates(sql.engine)
        self.cancellations = Cancellations(sql.engine)
        self.pushed = Pushed(sql.engine)
        self.ordered_keys = OrderedKeys(sql.engine)
        self.secrets = Secrets(sql.engine)
        self._tables: dict[Any, Any] = {}
        self._tables_lock = threading.Lock()
        self.writes: contextlib.AbstractContextManager[object] = (
            threading.Lock() if sql.dialect == "sqlite" else contextlib.nullcontext())

    @classmethod
    def connect(cls, url: str) -> ServiceStore:
        """A store over the database at ``url`` (the blackboard's tables are made too)."""
        with unavailable():
            return cls(SqlStore(url))

    @property
    def engine(self) -> Engine:
        """The database's engine (for the service's own tables; tests write rows with it)."""
        return self.sql.engine

    def tables(self, kind: Callable[[Engine], T]) -> T:
        """The feature's tables ``kind(engine)`` on this database (made, or upgraded, the
        first time; one object per kind).  Ask outside a write transaction: on SQLite,
        making the tables waits for the database's one writer."""
        with self._tables_lock:
            found = self._tables.get(kind)
            if found is None:
                with unavailable():
                    found = self._tables[kind] = kind(self.sql.engine)
            return found

    def blackboard(self, owner: str, lease_seconds: float) -> Blackboard:
        """A blackboard on this database whose leases are ``owner``'s."""
        return Blackboard(self.sql, owner=owner, lease_seconds=lease_seconds)

    def renew_leases(self, ids: Sequence[str], owner: str, lease_seconds: float) -> int:
        with self.writes, unavailable():
            return self.sql.renew(ids, owner, lease_seconds)

    def purge_expired_leases(self) -> int:
        with self.writes, unavailable():
            return self.sql.purge_expired_leases()

    def close(self) -> None:
        self.sql.dispose()


@contextlib.contextmanager
def unavailable() -> Iterator[None]:
    """Database failures inside become :class:`StoreUnavailable` (the cause kept)."""
    try:
        yield
    except (StorageError, SQLAlchemyError) as e:
        raise StoreUnavailable(str(e)) from e


def _is_outage(error: BaseException) -> bool:
    """Whether a database failure is the infrastructure's (the blackboard wraps the
    driver's errors, so look through the causes)."""
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, _OUTAGES):
            return True
        cause = cause.__cause__ or cause.__context__
    return isinstance(error, StorageError) and error.__cause__ is None


def commit_failure(error: Exception) -> ChalkServiceError:
    """What a failed commit transaction means, as a member of the family.

    Lease conflicts (:class:`RecordsBusy`) and outages
    (:class:`StoreUnavailable`) are retried later; anything else the
    transaction raised is :class:`CommitRefused`, the data's fault.  The
    family's own errors (a commit extension's) come back unchanged.  Raise
    the answer ``from error``.
    """
    if isinstance(error, ChalkServiceError):
        return error
    if isinstance(error, RecordLockedError):  # StaleRecordError too
        return RecordsBusy(str(error))
    if _is_outage(error):
        return StoreUnavailable(str(error))
    return CommitRefused(f"{type(error).__name__}: {error}")
