"""The journal seam: told about every settled message before it is acked.

The finish stage hands each group of settled messages (*committed*,
*duplicate*, *retrying*, *dead*) to the :class:`Journal` after their
outgoing messages, retry copies and dead letters are confirmed and before
the inputs are acked, so a journal that writes them down never misses one
(a crash before the ack redelivers the message; it is settled, and
journaled, again).  The base does nothing.  Failures are the journal's own:
:class:`Journals` logs them and the messages are acked all the same.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from listener_router.pipeline._report import BatchReport
from listener_router.pipeline._work import Work

__all__ = ["Journal", "Journals"]

log = logging.getLogger(__name__)


class Journal:
    """Settled messages, before their ack (see the module doc)."""

    def settled(self, works: Sequence[Work], report: BatchReport | None) -> None:
        """``works`` are settled (committed, duplicate, retrying or dead) and about to be acked;
        ``report`` is their batch's (None for a message settled outside a batch)."""


class Journals(Journal):
    """The registered journals, each shielded from the others' failures."""

    def __init__(self, journals: Iterable[Journal] = ()):
        self._journals = list(journals)

    def add(self, journal: Journal) -> None:
        self._journals.append(journal)

    def settled(self, works: Sequence[Work], report: BatchReport | None) -> None:
        for journal in self._journals:
            try:
                journal.settled(works, report)
            except Exception:  # a journal's bug never holds an ack
                log.exception("journal %s failed", type(journal).__name__)
