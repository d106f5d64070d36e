"""Pipelet code for executors on other hosts: workflow-local modules travel as zip files.

A workflow names its pipelet classes by dotted path, and the engine makes the
workflow's directory and the working directory importable (the workflow's
``search_path``).  Python workers of a local master share the driver's file
system, so they import from there too; executors on other hosts do not have
those directories.  For a cluster master the runner zips the top-level
module or package of each pipelet class that was found in the search path
and is not part of an installed distribution (the worker hosts' environment
has those), and adds it with ``SparkContext.addPyFile``: Spark puts it on
the ``sys.path`` of every Python worker of the application.

A zip is named by its content's hash and added once.  Python workers keep the
modules they imported, so changed pipelet code takes a service restart, as on
a local master.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import logging
import os
import sys
import zipfile
from collections.abc import Iterator
from typing import Any

from engine._specs import Workflow

__all__ = ["local_modules", "ship_pipelet_code"]

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=1)
def _installed() -> frozenset[str]:
    """Top-level names that installed distributions provide."""
    return frozenset(importlib.metadata.packages_distributions())


def _workflows(workflow: Workflow) -> Iterator[Workflow]:
    yield workflow
    for _, sub in workflow.subworkflows:
        yield sub


def _locations(top: str) -> list[str]:
    """Where the driver imported top-level module ``top`` from: its file, or its package directories."""
    module = sys.modules.get(top)
    if module is None:
        return []
    paths = getattr(module, "__path__", None)
    if paths is not None:  # a package (a namespace package may have several portions)
        return [os.path.realpath(p) for p in paths]
    origin = getattr(module, "__file__", None)
    return [os.path.realpath(origin)] if origin else []


def local_modules(workflow: Workflow) -> dict[str, list[str]]:
    """Top-level modules of the workflow's pipelets (and its sub-workflows') that
    executors on another host would miss: top-level name -> the files or
    package directories in the search path that make it up.

    Only modules the driver has imported count (validation imports every
    pipelet class).
    """
    found: dict[str, list[str]] = {}
    installed = _installed()
    for wf in _workflows(workflow):
        dirs = {os.path.realpath(d) for d in wf.search_path if d}
        for spec in wf.pipelets():
            top = spec.pipelet_class.split(".", 1)[0]
            if top in found or top in installed:
                continue
            here = [loc for loc in _locations(top) if os.path.dirname(loc) in dirs]
            if here:
                found[top] = here
    return found


def _files(location: str) -> Iterator[tuple[str, str]]:
    """(path, name in the zip) of a module file or of everything in a package directory."""
    base = os.path.dirname(location)
    if os.path.isfile(location):
        yield location, os.path.relpath(location, base)
        return
    for root, dirs, names in os.walk(location):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
        # directory entries: zipimport finds namespace packages only through them
        yield root, os.path.relpath(root, base) + "/"
        for name in sorted(names):
            if not name.endswith((".pyc", ".pyo")) and not name.startswith("."):
                path = os.path.join(root, name)
                yield path, os.path.relpath(path, base)


def _zip(top: str, locations: list[str], directory: str) -> str:
    """Zip ``locations`` into ``directory``; the file name carries the content's hash."""
    entries = [entry for loc in locations for entry in _files(loc)]
    digest = hashlib.sha256()
    for path, name in entries:
        digest.update(name.encode() + b"\0")
        if not name.endswith("/"):
            with open(path, "rb") as f:
                digest.update(f.read())
    target = os.path.join(directory, f"chalk-{top}-{digest.hexdigest()[:16]}.zip")
    if not os.path.exists(target):
        os.makedirs(directory, exist_ok=True)
        partial = f"{target}.{os.getpid()}.part"
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as z:
            for path, name in entries:
                z.write(path, name)
        os.replace(partial, target)
    return target


def ship_pipelet_code(sc: Any, workflow: Workflow, shipped: set[str]) -> list[str]:
    """Add the workflow's local pipelet modules to ``sc`` (those not in ``shipped``,
    which gets the zip names added).  Returns the names of the zips added now.

    A module that cannot be zipped is logged and skipped: executors that share
    the driver's file system still import it from where it is.
    """
    from pyspark import SparkFiles

    added: list[str] = []
    modules = local_modules(workflow)
    if not modules:
        return added
    directory = os.path.join(SparkFiles.getRootDirectory(), "chalk-pipelets")
    for top, locations in sorted(modules.items()):
        try:
            path = _zip(top, locations, directory)
        except OSError as e:
            log.warning("cannot ship pipelet module %s of workflow %s to the executors: %s",
                        top, workflow.name, e, extra={"workflow": workflow.name})
            continue
        name = os.path.basename(path)
        if name in shipped:
            continue
        sc.addPyFile(path)
        shipped.add(name)
        added.append(name)
        log.info("shipped pipelet module %s (%s) of workflow %s to the executors as %s",
                 top, ", ".join(locations), workflow.name, name, extra={"workflow": workflow.name})
    return added
