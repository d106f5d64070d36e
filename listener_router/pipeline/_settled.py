"""The settled seam: told about every settled message before it is acked.

The finish stage hands each group of settled messages (*committed*,
*duplicate*, *retrying*, *dead*) to the :class:`SettledObserver` after their
outgoing messages, retry copies and dead letters are confirmed and before
the inputs are acked, so an observer that writes them down (the job log)
never misses one (a crash before the ack redelivers the message; it is
settled, and observed, again).  The base does nothing.  Failures are the
observer's own: :class:`SettledObservers` logs them and the messages are
acked all the same.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from listener_router.pipeline._report import BatchReport
from listener_router.pipeline._work import Work

__all__ = ["SettledObserver", "SettledObservers"]

log = logging.getLogger(__name__)


class SettledObserver:
    """Settled messages, before their ack (see the module doc)."""

    def settled(self, works: Sequence[Work], report: BatchReport | None) -> None:
        """``works`` are settled (committed, duplicate, retrying or dead) and about to be acked;
        ``report`` is their batch's (None for a message settled outside a batch)."""


class SettledObservers(SettledObserver):
    """The registered observers, each shielded from the others' failures."""

    def __init__(self, observers: Iterable[SettledObserver] = ()):
        self._observers = list(observers)

    def add(self, observer: SettledObserver) -> None:
        self._observers.append(observer)

    def settled(self, works: Sequence[Work], report: BatchReport | None) -> None:
        for observer in self._observers:
            try:
                observer.settled(works, report)
            except Exception:  # an observer's bug never holds an ack
                log.exception("settled observer %s failed", type(observer).__name__)
