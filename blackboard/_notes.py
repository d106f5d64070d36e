"""Notes: temporary values pipelets leave for later pipelets; never persisted.

Global notes live as long as the blackboard; record notes go with their
record (copied on ``split``, dropped on commit/invalidate); workflow-instance
notes live while a workflow instance runs (``bind_instance`` …
``clear_instance``) and are shared by its records and their fragments.
Values must be JSON (they cross processes): they are stored as a JSON copy.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from blackboard._errors import BlackboardError, ValueTypeError, where

if TYPE_CHECKING:
    from blackboard._entry import Entry as _Entry

__all__ = ["NotesMixin", "json_copy"]


def json_copy(value: Any, what: str) -> Any:
    """A JSON copy of ``value`` (tuples become lists); ValueTypeError when not JSON."""
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as e:
        raise ValueTypeError(f"{what}: value is not JSON-compatible ({e}); notes cross "
                             "processes and machines, so only JSON values are allowed") from e


class NotesMixin:
    """Note methods of :class:`Blackboard`."""

    _global_notes: dict[str, Any]
    _instance: dict[str, Any]
    _members: dict[Any, set[str]]        # instance key -> its record IDs
    _workflow_notes: dict[Any, dict[str, Any]]

    if TYPE_CHECKING:  # provided by Blackboard; declared for type checkers only
        def _entry(self, record_id: str) -> _Entry:
            ...

    # -- global ---------------------------------------------------------------
    def has_global_note(self, name: str) -> bool:
        return name in self._global_notes

    def get_global_note(self, name: str) -> Any:
        """The note's value; BlackboardError when there is none."""
        try:
            return self._global_notes[name]
        except KeyError:
            raise BlackboardError(f"no global note {name!r}") from None

    def set_global_note(self, name: str, value: Any) -> None:
        self._global_notes[name] = json_copy(value, f"global note {name!r}")

    def remove_global_note(self, name: str) -> None:
        self._global_notes.pop(name, None)

    def global_note_names(self) -> list[str]:
        return list(self._global_notes)

    # -- per record -------------------------------------------------------------
    def has_record_note(self, record_id: str, name: str) -> bool:
        return name in self._entry(record_id).notes

    def get_record_note(self, record_id: str, name: str) -> Any:
        notes = self._entry(record_id).notes
        if name not in notes:
            raise BlackboardError(f"{where(record_id)}: no record note {name!r}",
                                  record_id=record_id)
        return notes[name]

    def set_record_note(self, record_id: str, name: str, value: Any) -> None:
        entry = self._entry(record_id)
        entry.notes[name] = json_copy(value, f"{where(record_id)}: note {name!r}")

    def remove_record_note(self, record_id: str, name: str) -> None:
        self._entry(record_id).notes.pop(name, None)

    def record_note_names(self, record_id: str) -> list[str]:
        return list(self._entry(record_id).notes)

    # -- per workflow instance -------------------------------------------------
    def bind_instance(self, key: Any, ids: Iterable[str]) -> None:
        """Say which workflow instance the records belong to (fragments inherit it)."""
        ids = list(ids)
        for rid in ids:
            self._entry(rid)
        for rid in ids:
            self._bind(rid, key)

    def bind_instances(self, instances: Iterable[tuple[Any, Iterable[str]]]) -> None:
        """:meth:`bind_instance` for many ``(key, ids)`` at once (a worker's partition)."""
        pairs = [(key, list(ids)) for key, ids in instances]
        for _key, ids in pairs:
            for rid in ids:
                self._entry(rid)
        bound, members = self._instance, self._members
        for key, ids in pairs:
            for rid in ids:
                if rid in bound:
                    self._bind(rid, key)
                    continue
                bound[rid] = key
                found = members.get(key)
                if found is None:
                    members[key] = {rid}
                else:
                    found.add(rid)

    def _bind(self, record_id: str, key: Any) -> None:
        if record_id in self._instance:
            self._unbind(record_id)
        self._instance[record_id] = key
        members = self._members.get(key)
        if members is None:
            self._members[key] = {record_id}
        else:
            members.add(record_id)

    def _unbind(self, record_id: str) -> None:
        """Forget the record's instance; the instance's notes go with its last record."""
        key = self._instance.pop(record_id, None)
        if key is None:
            return
        members = self._members.get(key)
        if members is not None:
            members.discard(record_id)
            if members:
                return
            del self._members[key]
        self._workflow_notes.pop(key, None)

    def instance_of(self, record_id: str) -> Any:
        """The workflow instance key the record is bound to, or None."""
        return self._instance.get(record_id)

    def clear_instance(self, key: Any) -> None:
        """Forget a finished workflow instance and its notes."""
        self._workflow_notes.pop(key, None)
        for rid in self._members.pop(key, ()):
            if self._instance.get(rid) == key:
                del self._instance[rid]

    def _instance_key(self, record_id: str) -> Any:
        self._entry(record_id)
        if record_id not in self._instance:
            raise BlackboardError(f"{where(record_id)}: not bound to a workflow instance "
                                  "(workflow notes exist only while a workflow runs)",
                                  record_id=record_id)
        return self._instance[record_id]

    def has_workflow_note(self, record_id: str, name: str) -> bool:
        self._entry(record_id)
        key = self._instance.get(record_id)
        return key is not None and name in self._workflow_notes.get(key, {})

    def get_workflow_note(self, record_id: str, name: str) -> Any:
        notes = self._workflow_notes.get(self._instance_key(record_id), {})
        if name not in notes:
            raise BlackboardError(f"{where(record_id)}: no workflow note {name!r}",
                                  record_id=record_id)
        return notes[name]

    def set_workflow_note(self, record_id: str, name: str, value: Any) -> None:
        key = self._instance_key(record_id)
        self._workflow_notes.setdefault(key, {})[name] = json_copy(
            value, f"{where(record_id)}: workflow note {name!r}")

    def remove_workflow_note(self, record_id: str, name: str) -> None:
        self._workflow_notes.get(self._instance_key(record_id), {}).pop(name, None)
