"""The ``chalk`` command: ``run push process validate graph status jobs schedules dlq events
demo subscribe journal reprocess``.

``_main`` has the parser and the commands (each imports what it needs when
it runs, so ``chalk validate`` starts no Spark); ``_status`` ``chalk
status``; ``_admin`` the dead letters (``chalk dlq``); ``_jobs`` the job
log's (jobs, schedules); ``_show`` how they print (a table on a terminal,
plain columns in a pipe, JSON with ``--json``); ``_demo`` the demo;
``_journal`` ``chalk subscribe`` and ``chalk journal``; ``_reprocess``
``chalk reprocess``.  The dashboard
browses and replays dead letters with the same functions the ``dlq`` command
uses (``listener_router.dead_letters``: ``dead_letters`` moves them off
``Q.dlq`` into the store and reads them there, never redelivering one;
``replay``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from listener_router.cli._main import build_parser, main

if TYPE_CHECKING:
    from listener_router.cli._admin import dlq_replay
    from listener_router.dead_letters import dead_letters

__all__ = ["build_parser", "dead_letters", "dlq_replay", "main"]


def __getattr__(name: str) -> Any:  # the admin functions load pika and the store: on first use
    if name == "dlq_replay":
        from listener_router.cli import _admin
        return _admin.dlq_replay
    if name == "dead_letters":
        from listener_router import dead_letters
        return dead_letters.dead_letters
    raise AttributeError(f"module 'listener_router.cli' has no attribute {name!r}")
