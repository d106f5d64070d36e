"""The ``chalk`` command: ``run push process validate graph status jobs schedules dlq demo``.

``_main`` has the parser and the commands (each imports what it needs when
it runs, so ``chalk validate`` starts no Spark); ``_admin`` the operator
commands (status, dead letters); ``_jobs`` the job log's (jobs, schedules,
statistics, dead letters read from the log); ``_demo`` the demo.  The dashboard
browses and replays dead letters with the same two functions the ``dlq``
command uses (``peek``, ``dlq_replay``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from listener_router.cli._main import build_parser, main

if TYPE_CHECKING:
    from listener_router.cli._admin import dlq_replay, peek

__all__ = ["build_parser", "dlq_replay", "main", "peek"]


def __getattr__(name: str) -> Any:  # the admin functions load pika and the store: on first use
    if name in ("dlq_replay", "peek"):
        from listener_router.cli import _admin
        return getattr(_admin, name)
    raise AttributeError(f"module 'listener_router.cli' has no attribute {name!r}")
