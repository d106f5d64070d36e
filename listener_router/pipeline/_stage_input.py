"""A stage's input: a queue of typed values and the one thread that handles them in order."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

__all__ = ["BACKLOG", "StageInput"]

BACKLOG = 3               # values that may wait for a stage before the one handing on waits

T = TypeVar("T")


class StageInput(Generic[T]):
    """Values of one type, handled by ``handle`` in order on a thread of the stage's own.

    Past ``backlog`` values waiting, :meth:`put` waits for the oldest to be
    done: a slow stage slows the one before it instead of piling up work.
    ``handle`` should not raise (an exception would surface in the thread
    that next waits for its value).
    """

    def __init__(self, name: str, handle: Callable[[T], None], backlog: int = BACKLOG):
        self.name = name
        self._handle = handle
        self._backlog = backlog
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._futures: list[Future[None]] = []
        self._lock = threading.Lock()

    def put(self, value: T) -> None:
        with self._lock:
            futures = self._futures
            futures.append(self._executor.submit(self._handle, value))
            futures[:] = [f for f in futures if not f.done()]
            oldest = futures[0] if len(futures) > self._backlog else None
        if oldest is not None:
            oldest.result()

    def drain(self) -> None:
        """Wait until every value put so far is handled."""
        while True:
            with self._lock:
                if not self._futures:
                    return
                oldest = self._futures.pop(0)
            oldest.result()

    def close(self) -> None:
        """Handle what was put, then end the thread."""
        self._executor.shutdown(wait=True)
