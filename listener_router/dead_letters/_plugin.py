"""The dead-letters plug-in: its table, and how many letters wait (for the metrics and page).

Dead letters are written by the pipeline (``Q.dlq``, with the reason); this
feature owns what happens to them afterwards: moving them off the queue into
the store, listing, showing, replaying and purging (``_letters``, used by
``chalk dlq`` and the dashboard).  In a running service the plug-in gives
the leader its task of moving them into the store every few seconds
(:class:`~listener_router.dead_letters.Collector`, every ``[dead_letters]
move_every`` seconds: the page only reads the store), and reports, on the metrics snapshot, how many letters each input
queue has kept there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from listener_router._plugin import Host, Plugin
from listener_router.dead_letters._letters import Collector
from listener_router.dead_letters._settings import DeadLettersSettings
from listener_router.dead_letters._tables import SCHEMA, DeadLetters

if TYPE_CHECKING:
    from listener_router.cluster import LeaderTask
    from listener_router.store import Schema

__all__ = ["DeadLettersPlugin"]


class DeadLettersPlugin(Plugin):
    """Always built: dead letters exist wherever messages can fail."""

    name = "dead_letters"
    sections = (DeadLettersSettings,)

    def __init__(self) -> None:
        self.table: DeadLetters | None = None
        self.queues: list[str] = []
        self.collector: Collector | None = None

    def tables(self) -> list[Schema]:
        return [SCHEMA]

    def install(self, host: Host) -> None:
        self.table = host.store.tables(DeadLetters)
        self.queues = [rule.queue for rule in host.settings.listeners]
        every = host.settings.section("dead_letters").move_every
        if every > 0:
            self.collector = Collector(host.settings, host.store, self.queues, every=every)

    def leader_tasks(self) -> list[LeaderTask]:
        return [] if self.collector is None else [self.collector]

    def stop(self) -> None:
        if self.collector is not None:
            self.collector.close()

    def kept(self) -> dict[str, int]:
        """Dead letters moved into the store, by input queue (reads the database)."""
        assert self.table is not None, "install() first"
        return self.table.counts(self.queues)

    def snapshot(self) -> Mapping[str, Any]:
        return {"dead_letters_kept": self.kept()}
