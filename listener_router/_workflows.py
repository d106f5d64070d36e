"""The workflows a service runs: a check at start, and the versions it tells the store."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import engine
from listener_router._errors import ConfigError, StoreUnavailable
from listener_router._settings import Settings
from listener_router.store import RunningVersion, ServiceStore, unavailable

__all__ = ["PublishedVersions", "check_workflows"]

log = logging.getLogger(__name__)


def check_workflows(settings: Settings, registry: engine.WorkflowRegistry) -> None:
    """Raise :class:`ConfigError` for a listener rule whose workflow is not loaded (a service
    started with it would dead-letter every message the rule takes)."""
    where = settings.source or "the default configuration"
    for rule in settings.listeners:
        if rule.workflow in registry:
            continue
        known = ", ".join(registry.names()) or "none"
        problems = registry.file_errors(rule.workflow)
        why = ("the file(s) defining it have errors:\n  " + "\n  ".join(problems) if problems
               else f"no file in {settings.workflows_dir} defines it; known workflows: {known}")
        raise ConfigError(f"{where}: listener rule {rule.name!r} names workflow "
                          f"{rule.workflow!r}, which cannot run: {why}")



class PublishedVersions:
    """The workflow versions this process last wrote to the store (``chalk status``)."""

    def __init__(self) -> None:
        self._written: tuple[Any, ...] | None = None

    def publish(self, store: ServiceStore, node: str, registry: engine.WorkflowRegistry) -> None:
        """Write them when they changed; a failure is logged and tried again next time."""
        versions = tuple(registry.versions())
        if versions == self._written:
            return
        try:
            with store.writes, unavailable():
                store.workflow_versions.publish(node, [
                    RunningVersion(node, v.name, v.version, v.path, v.loaded_at)
                    for v in versions])
            self._written = versions
        except StoreUnavailable as e:
            log.warning("could not record the running workflow versions: %s", e)

    def forget(self, store: ServiceStore, node: str) -> None:
        """A stopping process's rows go (a failure leaves them: they are ignored anyway)."""
        if self._written is not None:
            with contextlib.suppress(Exception):
                store.workflow_versions.forget(node)
