"""The graph of a workflow file as it is, errors and all (``chalk graph``).

:func:`draft_graph` draws what the file says even when it fails validation:
each error (``file:line: message``) is put on the activities that start on
its line (node attribute ``errors``); errors at no activity's line (a
``<variable>``, an element that was skipped) go to the graph attribute
``errors``.  :func:`~engine.to_dot` draws those activities red with their
errors as label and tooltip.  Only a file that cannot be parsed at all has
nothing to draw: that raises :class:`WorkflowDefinitionError`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import networkx as nx

from engine._errors import WorkflowDefinitionError
from engine._graph import workflow_graph
from engine._loader import load_unresolved, tables
from engine._tree import validate_tree

__all__ = ["draft_graph", "mark_errors"]

_ERROR = re.compile(r"^(?P<file>.*?):(?P<line>\d+): (?P<message>.*)$", re.DOTALL)
_NOT_ACTIVITIES = {"start", "end", "join"}


def mark_errors(graph: nx.DiGraph, errors: Iterable[str], path: str) -> None:
    """Put each of ``path``'s ``errors`` on the activity nodes of its line (see the module doc)."""
    by_line: dict[int, list[str]] = {}
    for node, data in graph.nodes(data=True):
        if data.get("kind") not in _NOT_ACTIVITIES and data.get("line"):
            by_line.setdefault(int(data["line"]), []).append(node)
    elsewhere: list[str] = list(graph.graph.get("errors", []))
    for error in errors:
        found = _ERROR.match(error)
        ours = found is not None and found["file"] == path
        nodes = by_line.get(int(found["line"]), []) if found and ours else []
        if not nodes:
            elsewhere.append(f"line {found['line']}: {found['message']}" if found and ours else error)
        for node in nodes:
            graph.nodes[node].setdefault("errors", []).append(found["message"] if found else error)
    graph.graph["errors"] = elsewhere


def draft_graph(path: str | os.PathLike[str], *, aliases: Mapping[str, str] | None = None,
                services: Mapping[str, str] | None = None) -> tuple[nx.DiGraph, list[str]]:
    """The control-flow graph of the file at ``path`` with its errors marked, and the errors
    (those ``chalk validate`` reports: sub-workflows resolve across the file's directory tree).

    Raises:
        WorkflowDefinitionError: the file has no activity tree to draw (not XML, no
            ``<process>``, unreadable).
    """
    p = str(Path(path))
    loaded = load_unresolved(p, tables(aliases, services))
    errors = validate_tree(p, aliases=aliases, services=services).errors
    if loaded.workflow is None:
        raise WorkflowDefinitionError(errors or loaded.errors)
    graph = workflow_graph(loaded.workflow)
    mark_errors(graph, errors, p)
    return graph, errors
