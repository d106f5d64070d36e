"""What is in flight: messages and records taken up by this service and not yet settled.

A message or record is *in flight* from the moment the gather stage takes it
up until it is settled (committed, failed or held) and its records have left
the blackboard.  A message or record in flight in an earlier batch makes the
gather stage wait: loading it now would read the version that batch is about
to replace, and the inbox would not yet show that batch's commit.  One
already in the batch being gathered is deferred to a later batch.  While
records are in flight (loaded ahead of their run, or waiting for their
commit) one thread renews their leases.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable, Iterable
from typing import Any

__all__ = ["InFlight"]

log = logging.getLogger(__name__)


class InFlight:
    """Messages and records taken up by this service and not yet settled (see module doc).

    Keys are record IDs (``str``) and message keys (``("message", queue, id)``);
    each is held by one batch.  ``renew(ids)`` extends the leases of records,
    called every ``interval`` seconds from a thread of its own.
    """

    def __init__(self, renew: Callable[[list[str]], Any], interval: float):
        self._renew = renew
        self._interval = interval
        self._held: dict[Hashable, object] = {}
        self._cond = threading.Condition()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> InFlight:
        self._thread = threading.Thread(target=self._keep, name="chalk-leases", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()

    def _keep(self) -> None:
        while not self._done.wait(self._interval):
            with self._cond:
                ids = [key for key in self._held if type(key) is str]
            if ids:
                try:
                    self._renew(ids)
                except Exception as e:  # the database is gone: leases lapse, commits say so
                    log.warning("lease renewal of %d record(s) failed: %s", len(ids), e)

    def holders(self, keys: Iterable[Hashable]) -> set[object]:
        held = self._held
        with self._cond:
            return {held[key] for key in keys if key in held}

    def held_by(self, keys: Iterable[Hashable], holder: object) -> set[Hashable]:
        """Those of ``keys`` that ``holder`` holds."""
        held = self._held
        with self._cond:
            return {key for key in keys if held.get(key) is holder}

    def reserve(self, keys: Iterable[Hashable], holder: object) -> None:
        with self._cond:
            for key in keys:
                self._held[key] = holder

    def release(self, keys: Iterable[Hashable]) -> None:
        with self._cond:
            pop = self._held.pop
            for key in keys:
                pop(key, None)
            self._cond.notify_all()

    def wait_free(self, keys: list[Hashable], besides: object, stop: threading.Event) -> bool:
        """Wait until no batch but ``besides`` holds any of ``keys``; False when stopped."""
        held = self._held
        with self._cond:
            while any(held.get(key, besides) is not besides for key in keys):
                if stop.is_set():
                    return False
                self._cond.wait(0.1)
        return True

    def __len__(self) -> int:
        with self._cond:
            return len(self._held)
