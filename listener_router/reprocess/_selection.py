"""A run's selection: what the user asked for, kept with the run as canonical JSON.

The walk itself is the schedules' (:class:`~listener_router.schedules.Selection`);
this module says what to walk and keeps it so that a resumed run walks the
same thing.  ``--ids-from FILE`` is kept as the file's absolute path and the
SHA-256 of the IDs read from it: the cursor is a position in that list, so a
run resumed after the file changed would skip or repeat records, and is
refused instead.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from blackboard import SqlStore
from listener_router._errors import ConfigError, RecordFileError
from listener_router.schedules import RecordFilter, Selection

__all__ = ["RunSelection", "read_ids"]


def read_ids(path: str | Path) -> tuple[tuple[str, ...], int]:
    """The record IDs of ``path`` in order, each once, and how many repeats were dropped.

    A line is one record ID (surrounding blanks stripped), or a JSON object with an
    ``"id"`` (the JSON Lines record files ``chalk push`` reads); blank lines are skipped.
    """
    path = Path(path)
    try:
        handle = path.open(encoding="utf-8")
    except OSError as e:
        raise RecordFileError(f"{path}: cannot read: {e.strerror}") from e
    found: dict[str, None] = {}
    lines = 0
    with handle:
        for number, line in enumerate(handle, start=1):
            text = line.strip()
            if not text:
                continue
            lines += 1
            if text.startswith("{"):
                try:
                    rid = json.loads(text).get("id")
                except (ValueError, AttributeError):
                    rid = None
                if not isinstance(rid, str) or not rid:
                    raise RecordFileError(f"{path}:{number}: a line that starts with '{{' must "
                                          "be a JSON object with a non-empty string \"id\"")
                text = rid
            found.setdefault(text, None)
    return tuple(found), lines - len(found)


def _digest(ids: tuple[str, ...]) -> str:
    return hashlib.sha256("\n".join(ids).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class RunSelection:
    """What a run walks: the stored records narrowed by ``prefix``, ``source`` and
    ``xpath``, or the IDs listed in ``ids_from`` (whose content hash is ``ids_sha256``)."""

    prefix: str | None = None
    source: str | None = None
    xpath: str | None = None
    ids_from: str | None = None
    ids_sha256: str | None = None

    @classmethod
    def asked(cls, *, prefix: str | None = None, source: str | None = None,
              xpath: str | None = None, ids_from: str | None = None
              ) -> tuple[RunSelection, tuple[str, ...] | None, int]:
        """The selection of the command's options, the listed IDs (``ids_from``) and the
        repeated IDs dropped from the file."""
        if ids_from is None:
            return cls(prefix or None, source or None, xpath or None), None, 0
        if prefix or source or xpath:
            raise ConfigError("--ids-from lists the records; leave out --prefix, --source "
                              "and --xpath")
        ids, repeats = read_ids(ids_from)
        where = str(Path(ids_from).resolve())
        return cls(ids_from=where, ids_sha256=_digest(ids)), ids, repeats

    def text(self) -> str:
        """Canonical JSON: equal selections, equal text (a run is found by it)."""
        return json.dumps({k: v for k, v in asdict(self).items() if v is not None},
                          sort_keys=True, separators=(",", ":"))

    @classmethod
    def parse(cls, text: str) -> RunSelection:
        return cls(**json.loads(text))

    def listed(self) -> tuple[str, ...] | None:
        """The listed IDs again (a resumed run), refused when the file changed."""
        if self.ids_from is None:
            return None
        ids, _repeats = read_ids(self.ids_from)
        if _digest(ids) != self.ids_sha256:
            raise ConfigError(f"{self.ids_from} lists other IDs than when the run started; "
                              "the run's cursor is a position in that list, so it cannot go "
                              "on (start a new run with --new)")
        return ids

    def walk(self, sql: SqlStore, ids: tuple[str, ...] | None, page: int) -> Selection:
        """The schedules' walk over this selection (``ids``: the listed IDs, read once)."""
        criteria = RecordFilter(ids=ids, prefix=self.prefix, source=self.source,
                                xpath=self.xpath)
        return Selection(criteria, sql, page, where="chalk reprocess --xpath",
                         stored_only=True)

    def describe(self) -> str:
        if self.ids_from is not None:
            return f"IDs listed in {self.ids_from}"
        parts = [f"prefix {self.prefix!r}" if self.prefix else "",
                 f"source {self.source!r}" if self.source else "",
                 f"xpath {self.xpath}" if self.xpath else ""]
        return ", ".join(p for p in parts if p) or "all records"
