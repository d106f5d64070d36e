"""Finding, configuring and caching pipelet objects.

Pipelet classes are named by dotted path.  The workflow's directory and the
working directory are importable (put on ``sys.path`` before importing).
Java class names from SMILA files map to Python pipelets through the alias
table (``DEFAULT_ALIASES`` plus the caller's).

Workers keep configured pipelets per ``(workflow version, activity id)`` for
the life of the Python worker process: configuration happens once per worker,
not once per batch.
"""

from __future__ import annotations

import importlib
import logging
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

from engine._specs import InvokePipelet, InvokeService, Workflow
from pipelets.aliases import SMILA_ALIASES, SMILA_SERVICES

__all__ = [
    "DEFAULT_ALIASES",
    "DEFAULT_SERVICES",
    "configured_pipelet",
    "configured_service",
    "ensure_importable",
    "instantiate",
    "resolve_class",
    "resolve_service_class",
    "classes_not_in_service",
]

log = logging.getLogger(__name__)

#: Java pipelet classes of SMILA -> the Python pipelet doing the same job: the
#: built-in library's table.  Entries whose target does not import are
#: reported as unknown pipelets at load time (with the Java name and the target).
DEFAULT_ALIASES: dict[str, str] = dict(SMILA_ALIASES)

#: Service names (SMILA's older ``invokeService``, and partner links of BPEL
#: ``invoke``) -> dotted Python paths: the built-in service table.
DEFAULT_SERVICES: dict[str, str] = dict(SMILA_SERVICES)

_cache: dict[tuple[str, int], Any] = {}
_cache_lock = threading.Lock()


def ensure_importable(paths: Iterable[str]) -> None:
    """Put ``paths`` on ``sys.path`` (once each, after the existing entries)."""
    for p in paths:
        if p and p not in sys.path:
            sys.path.append(p)


def _import(dotted: str) -> Any:
    module_name, _, cls_name = dotted.rpartition(".")
    if not module_name or not cls_name:
        raise ImportError(f"{dotted!r} is not a dotted path 'package.module.Class'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ImportError(f"cannot import module {module_name!r}: {e}") from e
    try:
        cls = getattr(module, cls_name)
    except AttributeError as e:
        raise ImportError(f"module {module_name!r} has no class {cls_name!r}") from e
    return cls


def resolve_class(dotted: str) -> type:
    """Import the pipelet class ``package.module.Class``; raise ``ImportError`` with a clear message."""
    cls = _import(dotted)
    if not isinstance(cls, type) or not callable(getattr(cls, "process", None)):
        raise ImportError(f"{dotted!r} is not a pipelet class (it needs a process(blackboard, ids) method)")
    return cls


def resolve_service_class(dotted: str) -> type:
    """Import a message service class (BPEL ``invoke``): it needs ``invoke(operation, parts)``."""
    cls = _import(dotted)
    if not isinstance(cls, type) or not callable(getattr(cls, "invoke", None)):
        raise ImportError(f"{dotted!r} is not a service class (it needs an invoke(operation, parts) method)")
    return cls


def instantiate(spec: InvokePipelet) -> Any:
    """A new pipelet object for ``spec``, configured; exceptions propagate."""
    cls = resolve_class(spec.pipelet_class)
    pipelet = cls()
    configure = getattr(pipelet, "configure", None)
    if configure is not None:
        configure(dict(spec.config))
    return pipelet


def _cached(workflow: Workflow, aid: int, make: Callable[[], Any]) -> Any:
    """The object cached for ``(workflow version, activity)`` in this process, made on first use."""
    key = (workflow.version, aid)
    made = _cache.get(key)
    if made is None:
        with _cache_lock:
            made = _cache.get(key)
            if made is None:
                ensure_importable(workflow.search_path)
                made = _cache[key] = make()
    return made


def _service(spec: InvokeService) -> Any:
    service = resolve_service_class(spec.service_class)()
    configure = getattr(service, "configure", None)
    if configure is not None:
        configure({})
    return service


def configured_service(workflow: Workflow, spec: InvokeService) -> Any:
    """The message service for ``spec`` in this process (made and configured on first use)."""
    return _cached(workflow, spec.aid, lambda: _service(spec))


def configured_pipelet(workflow: Workflow, spec: InvokePipelet) -> Any:
    """The configured pipelet for ``spec`` in this process (made on first use)."""

    def make() -> Any:
        log.debug("configuring pipelet %s for %s", spec.pipelet_class, workflow.name)
        return instantiate(spec)

    return _cached(workflow, spec.aid, make)


def classes_not_in_service(workflow: Workflow) -> list[str]:
    """The pipelet and service classes ``workflow`` calls (its sub-workflows too) that do
    not declare ``runs_in_service = True``, or do not import; none: a small batch of it may
    run in the service's own process (see ``pipelets.Pipelet.runs_in_service``)."""
    refusing: list[str] = []
    seen: set[str] = set()
    todo = [workflow]
    while todo:
        wf = todo.pop()
        if wf.name in seen:
            continue
        seen.add(wf.name)
        todo += [sub for _name, sub in wf.subworkflows]
        ensure_importable(wf.search_path)
        for activity in wf.activities():
            if isinstance(activity, InvokePipelet):
                dotted = activity.pipelet_class
            elif isinstance(activity, InvokeService):
                dotted = activity.service_class
            else:
                continue
            try:
                allowed = getattr(_import(dotted), "runs_in_service", False) is True
            except ImportError:
                allowed = False
            if not allowed and dotted not in refusing:
                refusing.append(dotted or "(unresolved)")
    return refusing
