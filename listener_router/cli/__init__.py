"""The ``chalk`` command: ``run push process validate graph status jobs dlq demo subscribe
journal``.

``_main`` has the parser and the commands (each imports what it needs when
it runs, so ``chalk validate`` starts no Spark); ``_admin`` the operator
commands (status, jobs, dead letters); ``_demo`` the demo; ``_journal``
``chalk subscribe`` and ``chalk journal``.
"""

from listener_router.cli._main import build_parser, main

__all__ = ["build_parser", "main"]
