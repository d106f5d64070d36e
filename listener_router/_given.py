"""The seams of earlier versions, as a plug-in: what ``Service(observers=…, extensions=…,
leader_tasks=…, topology_listeners=…)`` is given still plugs in through the one seam."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from listener_router._plugin import Plugin
from listener_router.cluster import LeaderTask, TopologyEvent, TopologyListener
from listener_router.pipeline import BatchObserver, Commit, CommitExtension

__all__ = ["GivenSeams", "HookListener"]

log = logging.getLogger(__name__)


class GivenSeams(Plugin):
    """The seams of earlier versions, given to :class:`Service` directly, as one plug-in."""

    name = "given"

    def __init__(self, observers: Sequence[BatchObserver], extensions: Sequence[CommitExtension],
                 tasks: Sequence[LeaderTask], listeners: Sequence[TopologyListener]):
        self.observers = observers
        self.extensions = extensions
        self.tasks = tasks
        self.listeners = listeners
        if not observers:
            self.batch_finished = None  # type: ignore[assignment]
        if not extensions:
            self.in_commit = None  # type: ignore[assignment]
        if not listeners:
            self.topology_event = None  # type: ignore[assignment]

    def any(self) -> bool:
        return bool(self.observers or self.extensions or self.tasks or self.listeners)

    def in_commit(self, commit: Commit) -> None:
        for extension in self.extensions:
            extension.in_transaction(commit)

    def batch_finished(self, report: Any) -> None:
        for observer in self.observers:
            try:
                observer.batch_finished(report)
            except Exception:  # an observer's bug never stops the service or the others
                log.exception("batch observer %s failed", type(observer).__name__)

    def leader_tasks(self) -> Sequence[LeaderTask]:
        return self.tasks

    def topology_event(self, event: TopologyEvent) -> None:
        for listener in self.listeners:
            try:
                listener.handle_topology_event(event)
            except Exception:
                log.exception("topology listener %s failed", type(listener).__name__)


class HookListener(TopologyListener):
    """A plug-in's ``topology_event`` hook as a topology listener."""

    def __init__(self, hook: Callable[[TopologyEvent], None]):
        self.hook = hook

    def handle_topology_event(self, event: TopologyEvent) -> None:
        self.hook(event)
