"""A stage's input: a queue of typed values and the one thread that handles them.

Values are handled one at a time, highest ``priority`` first and in the order
they were put within a priority (the lanes' priorities: the commit and the
publish of a high lane's batch do not wait behind the low lane's batches
queued before it, only behind the one being handled).
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Generic, TypeVar

__all__ = ["BACKLOG", "StageInput"]

BACKLOG = 3               # values that may wait for a stage before the one handing on waits

T = TypeVar("T")


class StageInput(Generic[T]):
    """Values of one type, handled by ``handle`` on a thread of the stage's own (module doc).

    Past ``backlog`` values of the same or a higher priority waiting,
    :meth:`put` waits for the oldest of them to be done: a slow stage slows
    the one before it instead of piling up work, and a lower lane's work
    never holds back the hand-on of a higher one's.  ``handle`` should not
    raise (an exception would surface in the thread that next waits for its
    value).
    """

    def __init__(self, name: str, handle: Callable[[T], None], backlog: int = BACKLOG):
        self.name = name
        self._handle = handle
        self._backlog = backlog
        self._heap: list[tuple[int, int, T, Future[None]]] = []
        self._open: list[tuple[int, int, Future[None]]] = []  # put, not done: (priority, n, …)
        self._count = itertools.count()
        self._cond = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name=f"{name}_0", daemon=True)
        self._thread.start()

    def put(self, value: T, priority: int = 0) -> None:
        future: Future[None] = Future()
        with self._cond:
            if self._closing:
                raise RuntimeError(f"{self.name}: put after close")
            n = next(self._count)
            heapq.heappush(self._heap, (-priority, n, value, future))
            self._open = [o for o in self._open if not o[2].done()]
            self._open.append((priority, n, future))
            ahead = [f for p, _n, f in self._open if p >= priority]
            oldest = ahead[0] if len(ahead) > self._backlog else None
            self._cond.notify()
        if oldest is not None:
            oldest.result()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap and not self._closing:
                    self._cond.wait()
                if not self._heap:
                    return
                _p, _n, value, future = heapq.heappop(self._heap)
            if not future.set_running_or_notify_cancel():
                continue
            try:
                self._handle(value)
            except BaseException as e:
                future.set_exception(e)
            else:
                future.set_result(None)

    def drain(self) -> None:
        """Wait until every value put so far is handled."""
        with self._cond:
            futures = [f for _p, _n, f in self._open]
        for future in futures:
            future.result()

    def close(self) -> None:
        """Handle what was put, then end the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join()
