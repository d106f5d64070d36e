"""Dead letters: moved off ``Q.dlq`` into the store, listed, shown, replayed, purged.

- ``_tables``: the table (``chalk_dead_letters``);
- ``_letters``: :func:`dead_letters` (move, then read), :func:`logged` (a
  letter's history from the job log), :func:`replay`, :func:`purge` — what
  ``chalk dlq`` and the dashboard call;
- ``_plugin``: :class:`DeadLettersPlugin`, the counts on the metrics snapshot.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from listener_router._lazy import lazy_names

if TYPE_CHECKING:
    from listener_router.dead_letters._letters import (
        MAX_DEPTH,
        PREVIEW_BYTES,
        READ_BYTES,
        AmbiguousMessageId,
        Collector,
        body_records,
        collect,
        dead_letters,
        logged,
        message_id_of,
        purge,
        read_body,
        record_ids,
        replay,
    )
    from listener_router.dead_letters._plugin import DeadLettersPlugin
    from listener_router.dead_letters._tables import DeadLetter, DeadLetters

_HOMES = {
    "AmbiguousMessageId": "_letters", "message_id_of": "_letters", "record_ids": "_letters",
    "MAX_DEPTH": "_letters", "PREVIEW_BYTES": "_letters", "READ_BYTES": "_letters", "Collector": "_letters",
    "body_records": "_letters", "read_body": "_letters",
    "collect": "_letters", "dead_letters": "_letters", "logged": "_letters",
    "purge": "_letters", "replay": "_letters", "DeadLettersPlugin": "_plugin",
    "DeadLetter": "_tables", "DeadLetters": "_tables",
}

__all__ = [
    "MAX_DEPTH",
    "PREVIEW_BYTES",
    "READ_BYTES",
    "AmbiguousMessageId",
    "Collector",
    "DeadLetter",
    "DeadLetters",
    "DeadLettersPlugin",
    "body_records",
    "collect",
    "dead_letters",
    "logged",
    "message_id_of",
    "purge",
    "read_body",
    "record_ids",
    "replay",
]

__getattr__, __dir__ = lazy_names(__name__, _HOMES, __all__, globals())
