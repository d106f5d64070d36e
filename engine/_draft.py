"""The graph of a workflow file as it is, errors and all (``chalk graph``).

:func:`draft_graph` draws what the file says even when it fails validation:
each error (``file:line: message``) is put on the activities that start on
its line (node attribute ``errors``), or else on the innermost activity
around the element of that line: an error reported at an ``<if>``'s
``<condition>``, an ``<assign>``'s ``<to>`` or a pipelet's
``<configuration>`` marks that ``<if>``, ``<assign>`` or pipelet.  Errors in
no activity (a ``<variable>`` of the process) go to the graph attribute
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
from lxml import etree

from engine._errors import WorkflowDefinitionError
from engine._graph import workflow_graph
from engine._loader import load_unresolved, tables
from engine._tree import validate_tree

__all__ = ["draft_graph", "mark_errors"]

_ERROR = re.compile(r"^(?P<file>.*?):(?P<line>\d+): (?P<message>.*)$", re.DOTALL)
_NOT_ACTIVITIES = {"start", "end", "join"}


def _around(path: str) -> dict[int, list[int]]:
    """For each line where an element starts, the lines where the elements around the first
    of them start, innermost first (empty when the file is no XML)."""
    try:
        root = etree.parse(path, etree.XMLParser(resolve_entities=False, no_network=True,
                                                 load_dtd=False)).getroot()
    except (OSError, etree.XMLSyntaxError):
        return {}
    found: dict[int, list[int]] = {}
    for element in root.iter():
        if element.sourceline and element.sourceline not in found:
            found[element.sourceline] = [a.sourceline for a in element.iterancestors()
                                         if a.sourceline]
    return found


def mark_errors(graph: nx.DiGraph, errors: Iterable[str], path: str) -> None:
    """Put each of ``path``'s ``errors`` on the activity nodes of its line, or of the innermost
    activity around it (see the module doc)."""
    by_line: dict[int, list[str]] = {}
    for node, data in graph.nodes(data=True):
        if data.get("kind") not in _NOT_ACTIVITIES and data.get("line"):
            by_line.setdefault(int(data["line"]), []).append(node)
    elsewhere: list[str] = list(graph.graph.get("errors", []))
    around: dict[int, list[int]] | None = None
    for error in errors:
        found = _ERROR.match(error)
        ours = found is not None and found["file"] == path
        nodes = by_line.get(int(found["line"]), []) if found and ours else []
        if found and ours and not nodes:
            around = _around(path) if around is None else around
            nodes = next((by_line[line] for line in around.get(int(found["line"]), ())
                          if line in by_line), [])
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
