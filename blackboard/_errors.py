"""The blackboard's error family.

Every message names the record ID and, where there is one, the path, so that
a log line alone says which record and which value went wrong.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = [
    "BlackboardError",
    "RecordNotFoundError",
    "PathError",
    "ValueTypeError",
    "RecordLockedError",
    "StaleRecordError",
    "StorageError",
]


def where(record_id: str | None, path: object = None) -> str:
    """``record 'x' path 'a/b'`` — the place an error is about."""
    text = f"record {record_id!r}" if record_id is not None else "blackboard"
    if path is not None and str(path) != "":
        text += f" path {str(path)!r}"
    return text


class BlackboardError(Exception):
    """Base of every error the blackboard raises (bad ID, path, type, state)."""

    def __init__(self, message: str, *, record_id: str | None = None, path: object = None):
        super().__init__(message)
        self.record_id = record_id
        self.path = path


class RecordNotFoundError(BlackboardError):
    """The record is not on this blackboard (load or create it first)."""


class PathError(BlackboardError):
    """The path is malformed or does not address a value of the right kind."""


class ValueTypeError(BlackboardError, TypeError):
    """A value of the wrong type: not a literal type, not an Annotation, not JSON."""


class RecordLockedError(BlackboardError):
    """Another owner holds the lease on one or more records.

    ``holders`` maps each locked record ID to the owner holding it.
    """

    def __init__(self, holders: dict[str, str], *, message: str | None = None):
        ids = sorted(holders)
        shown = ", ".join(f"{i!r} (held by {holders[i]!r})" for i in ids[:5])
        more = f" and {len(ids) - 5} more" if len(ids) > 5 else ""
        super().__init__(
            message or f"record(s) locked by another owner: {shown}{more}",
            record_id=ids[0] if ids else None,
        )
        self.holders = dict(holders)

    @property
    def ids(self) -> list[str]:
        return sorted(self.holders)


class StaleRecordError(RecordLockedError):
    """A commit lost its lease or found newer data in storage; nothing was written.

    ``holders`` maps each refused record ID to why: the owner now holding it,
    or a note on the versions found.
    """


class StorageError(BlackboardError):
    """The storage failed (database unavailable, connection lost); retry later."""


def ids_text(ids: Iterable[str], limit: int = 5) -> str:
    ids = list(ids)
    shown = ", ".join(repr(i) for i in ids[:limit])
    return shown + (f" and {len(ids) - limit} more" if len(ids) > limit else "")
