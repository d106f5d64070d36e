"""SVG drawn on the server: the queue charts and the workflow diagrams.

The page loads nothing from elsewhere, so its pictures are inline SVG made
here.  A workflow diagram comes from Graphviz's ``dot`` when it is
installed (the install step installs it) and otherwise from a plain layered
layout of ``engine.workflow_graph`` (rows by longest path from the start,
loops drawn back up the side); both are cached per workflow version.
"""

from __future__ import annotations

import functools
import logging
import shutil
import subprocess
from collections.abc import Sequence
from html import escape

import networkx as nx

import engine

__all__ = ["line_chart", "workflow_svg", "layered_svg"]

log = logging.getLogger(__name__)


def _number(value: float) -> str:
    if value >= 100 or value == int(value):
        return f"{value:,.0f}"
    return f"{value:.2g}" if value < 1 else f"{value:.1f}"


def line_chart(series: Sequence[tuple[str, str, Sequence[tuple[float, float]]]], *,
               start: float, end: float, width: int = 320, height: int = 72,
               unit: str = "") -> str:
    """Lines over ``[start, end]`` (seconds): ``series`` is ``(name, colour, [(t, value)])``.

    One shared y axis from 0 to the largest value, labelled; a legend under it.
    """
    top = max((v for _n, _c, points in series for _t, v in points), default=0.0)
    scale = top if top > 0 else 1.0
    plot_h = height - 30
    span = max(end - start, 1e-9)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{width}" '
             f'height="{height}" viewBox="0 0 {width} {height}" role="img">',
             f'<rect x="0.5" y="0.5" width="{width - 1}" height="{plot_h}" fill="#fafafa" '
             f'stroke="#ccc"/>',
             f'<text x="4" y="12" class="axis">{escape(_number(top))}{escape(unit)}</text>',
             f'<text x="{width - 4}" y="{plot_h - 3}" class="axis" text-anchor="end">'
             f'{escape(_span(span))} ago → now</text>']
    x = 6
    for name, colour, points in series:
        if len(points) >= 2:
            coords = " ".join(
                f"{(t - start) / span * (width - 2) + 1:.1f},"
                f"{plot_h - v / scale * (plot_h - 16):.1f}" for t, v in points)
            parts.append(f'<polyline fill="none" stroke="{escape(colour)}" stroke-width="1.5" '
                         f'points="{coords}"><title>{escape(name)}</title></polyline>')
        elif points:
            t, v = points[0]
            parts.append(f'<circle cx="{(t - start) / span * (width - 2) + 1:.1f}" '
                         f'cy="{plot_h - v / scale * (plot_h - 16):.1f}" r="2" '
                         f'fill="{escape(colour)}"/>')
        parts.append(f'<rect x="{x}" y="{plot_h + 10}" width="10" height="10" '
                     f'fill="{escape(colour)}"/><text x="{x + 14}" y="{plot_h + 19}" '
                     f'class="legend">{escape(name)}</text>')
        x += 24 + 7 * len(name)
    parts.append("</svg>")
    return "".join(parts)


def _span(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"


@functools.lru_cache(maxsize=256)
def _drawn(name: str, version: str, dot_text: str) -> str | None:
    dot = shutil.which("dot")
    if dot is None:
        return None
    try:
        done = subprocess.run([dot, "-Tsvg"], input=dot_text.encode(), capture_output=True,
                              timeout=30, check=True)
    except (subprocess.SubprocessError, OSError) as e:
        log.warning("graphviz could not draw workflow %s (%s): %s", name, version[:12], e)
        return None
    text = done.stdout.decode("utf-8", "replace")
    return text[text.find("<svg"):] if "<svg" in text else None


_LAYERED: dict[tuple[str, str], str] = {}


def workflow_svg(workflow: engine.Workflow, *, graphviz: bool = True) -> str:
    """The workflow's control-flow graph as inline SVG (Graphviz when installed)."""
    graph = engine.workflow_graph(workflow)
    if graphviz:
        drawn = _drawn(workflow.name, workflow.version, engine.to_dot(graph))
        if drawn is not None:
            return drawn
    key = (workflow.name, workflow.version)
    if key not in _LAYERED:
        if len(_LAYERED) > 256:
            _LAYERED.clear()
        _LAYERED[key] = layered_svg(graph)
    return _LAYERED[key]


_BOX_W, _BOX_H, _GAP_X, _GAP_Y = 170, 40, 24, 34
_EDGE_COLOURS = {"true": "darkgreen", "false": "firebrick", "fault": "orange",
                 "compensate": "purple", "terminate": "gray", "link": "blue"}


def _back_edges(graph: nx.DiGraph) -> set[tuple[str, str]]:
    """Edges that close a loop, found by a depth-first walk from ``start``."""
    back: set[tuple[str, str]] = set()
    state: dict[str, int] = {}
    roots = ["start"] + [n for n in graph if n != "start"]
    for root in roots:
        if root in state:
            continue
        stack = [(root, iter(graph.successors(root)))]
        state[root] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                state[node] = 2
                stack.pop()
            elif state.get(child) == 1:
                back.add((node, child))
            elif child not in state:
                state[child] = 1
                stack.append((child, iter(graph.successors(child))))
    return back


def layered_svg(graph: nx.DiGraph) -> str:
    """Draw a workflow graph without Graphviz: a row per longest-path rank from the start."""
    back = _back_edges(graph)
    dag = nx.DiGraph([(u, v) for u, v in graph.edges if (u, v) not in back])
    dag.add_nodes_from(graph)
    rank: dict[str, int] = {}
    for node in nx.topological_sort(dag):
        rank[node] = max((rank[p] + 1 for p in dag.predecessors(node)), default=0)
    rows: dict[int, list[str]] = {}
    for node in graph:  # insertion order: the workflow's own order
        rows.setdefault(rank[node], []).append(node)
    widest = max(len(r) for r in rows.values())
    width = widest * (_BOX_W + _GAP_X) + _GAP_X + 60
    height = len(rows) * (_BOX_H + _GAP_Y) + _GAP_Y
    pos: dict[str, tuple[float, float]] = {}
    for r, nodes in rows.items():
        offset = (width - 60 - len(nodes) * (_BOX_W + _GAP_X) + _GAP_X) / 2
        for i, node in enumerate(nodes):
            pos[node] = (offset + i * (_BOX_W + _GAP_X) + _BOX_W / 2,
                         _GAP_Y + r * (_BOX_H + _GAP_Y) + _BOX_H / 2)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="workflow" width="{width:.0f}" '
             f'height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}">',
             '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
             'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
             'fill="#555"/></marker></defs>']
    for u, v, data in graph.edges(data=True):
        (x1, y1), (x2, y2) = pos[u], pos[v]
        colour = _EDGE_COLOURS.get(data.get("kind", "next"), "#555")
        dash = ' stroke-dasharray="4 3"' if data.get("kind") in ("link", "compensate",
                                                                 "terminate", "exit") else ""
        if (u, v) in back:  # up the right-hand side
            side = max(x1, x2) + _BOX_W / 2 + 20
            path = f"M{x1 + _BOX_W / 2:.0f},{y1:.0f} C{side:.0f},{y1:.0f} {side:.0f},{y2:.0f} " \
                   f"{x2 + _BOX_W / 2:.0f},{y2:.0f}"
        else:
            path = f"M{x1:.0f},{y1 + _BOX_H / 2:.0f} L{x2:.0f},{y2 - _BOX_H / 2:.0f}"
        parts.append(f'<path d="{path}" fill="none" stroke="{colour}"{dash} '
                     f'marker-end="url(#arrow)"/>')
        label = data.get("label") or ""
        if label:
            parts.append(f'<text x="{(x1 + x2) / 2 + 4:.0f}" y="{(y1 + y2) / 2:.0f}" '
                         f'class="edge" fill="{colour}">{escape(label[:40])}</text>')
    for node, data in graph.nodes(data=True):
        x, y = pos[node]
        kind = data.get("kind", "")
        lines = str(data.get("label", node)).split("\n")
        if kind in ("start", "end", "join"):
            radius = 5 if kind == "join" else 14
            parts.append(f'<circle cx="{x:.0f}" cy="{y:.0f}" r="{radius}" fill="#fff" '
                         f'stroke="#333"><title>{escape(lines[0])}</title></circle>')
            if kind != "join":
                parts.append(f'<text x="{x + 18:.0f}" y="{y + 4:.0f}" class="node">'
                             f'{escape(lines[0])}</text>')
            continue
        parts.append(f'<rect x="{x - _BOX_W / 2:.0f}" y="{y - _BOX_H / 2:.0f}" '
                     f'width="{_BOX_W}" height="{_BOX_H}" rx="6" fill="#eef3fb" stroke="#345">'
                     f'<title>line {data.get("line", "?")}</title></rect>')
        for i, text in enumerate(lines[:2]):
            parts.append(f'<text x="{x:.0f}" y="{y - 4 + i * 14:.0f}" text-anchor="middle" '
                         f'class="node">{escape(text[:28])}</text>')
    parts.append("</svg>")
    return "".join(parts)
