"""Draw the listener/router's map: docs/stages.dot and docs/stages.svg.

The graph is declared here (``graph()``: one node per stage or part, with
the module it lives in and the class that does the work; one edge per hand-
over, labelled with the value that crosses it) and drawn without Graphviz:
positions come from the ``ROW``/``COLUMN`` of each node, the SVG is written
by hand.  ``tests/test_docs.py`` checks that the committed files are what
this script draws and that every module and class it names exists, so the
picture cannot drift from the code.  Run after changing the pipeline:

    .venv/bin/python docs/stage_graph.py
"""

from __future__ import annotations

import sys
from html import escape
from pathlib import Path
from typing import Any

import networkx as nx

HERE = Path(__file__).resolve().parent

# name: (row, column, title, module, class or None)
NODES: dict[str, tuple[int, int, str, str, str | None]] = {
    "rabbitmq": (0, 0, "RabbitMQ", "", None),
    "link": (1, 0, "broker link (child process)", "listener_router/broker/_process.py",
             "ProcessLink"),
    "gather": (1, 1, "gather · a thread per lane", "listener_router/pipeline/_gather.py",
               "GatherStage"),
    "gathering": (1, 2, "lanes → dispatcher", "listener_router/pipeline/_lanes.py",
                  "Dispatcher"),
    "execute": (1, 3, "execute · a thread per batch", "listener_router/pipeline/_execute.py",
                "ExecuteStage"),
    "commit": (2, 3, "commit · thread chalk-commit", "listener_router/pipeline/_commit.py",
               "CommitStage"),
    "finish": (2, 1, "finish · thread chalk-finish", "listener_router/pipeline/_finish.py",
               "FinishStage"),
    "engine": (0, 3, "workflow runner (Spark / local)", "engine/_runner.py", "SparkRunner"),
    "store": (3, 2, "service tables: inbox, outbox, nodes", "listener_router/store/_store.py",
              "ServiceStore"),
    "blackboard": (0, 2, "blackboard: records, leases", "blackboard/_blackboard.py",
                   "Blackboard"),
    "leader": (2, 0, "leader tasks (cluster)", "listener_router/cluster/_leader.py",
               "LeaderTasks"),
    "observers": (3, 1, "plug-ins: batch_finished, settled", "listener_router/_plugin.py",
                  "Plugin"),
    "extensions": (3, 3, "plug-ins: in_commit", "listener_router/pipeline/_commit.py",
                   "Commit"),
}

# (from, to, label: the value that crosses)
EDGES: list[tuple[str, str, str]] = [
    ("rabbitmq", "link", "deliveries"),
    ("link", "gather", "Delivery"),
    ("gather", "blackboard", "load"),
    ("gather", "gathering", "Work → Group"),
    ("gathering", "execute", "Batch, Lane"),
    ("execute", "engine", "run"),
    ("execute", "commit", "Executed"),
    ("commit", "extensions", "Commit"),
    ("commit", "store", "records + inbox + outbox"),
    ("commit", "finish", "Finishing"),
    ("gather", "finish", "dead, duplicate"),
    ("finish", "link", "publish, ack"),
    ("finish", "observers", "BatchReport"),
    ("leader", "finish", "Orphans"),
    ("leader", "store", "leases, retention"),
]


def graph() -> nx.DiGraph:
    g = nx.DiGraph(name="listener_router")
    for name, (row, column, title, module, cls) in NODES.items():
        g.add_node(name, row=row, column=column, title=title, module=module, cls=cls)
    for u, v, label in EDGES:
        g.add_edge(u, v, label=label)
    return g


def _lines(data: dict[str, Any]) -> list[str]:
    lines = [str(data["title"])]
    if data["module"]:
        cls = f" ({data['cls']})" if data["cls"] else ""
        lines.append(f"{data['module']}{cls}")
    return lines


def to_dot(g: nx.DiGraph) -> str:
    out = ["digraph listener_router {", "  rankdir=LR;", "  node [shape=box, fontname=Helvetica];"]
    for name, data in g.nodes(data=True):
        label = "\\n".join(_lines(data)).replace('"', '\\"')
        out.append(f'  {name} [label="{label}"];')
    for u, v, data in g.edges(data=True):
        out.append(f'  {u} -> {v} [label="{data["label"]}"];')
    out.append("}")
    return "\n".join(out) + "\n"


W, H, GAP_X, GAP_Y, MARGIN = 290, 46, 60, 70, 20


def _box(data: dict[str, Any]) -> tuple[float, float]:
    """Top-left corner of a node's box."""
    return MARGIN + data["column"] * (W + GAP_X), MARGIN + data["row"] * (H + GAP_Y)


def _anchor(g: nx.DiGraph, u: str, v: str) -> tuple[float, float, float, float]:
    """Where an edge leaves ``u``'s box and meets ``v``'s (box sides facing each other)."""
    (ux, uy), (vx, vy) = _box(g.nodes[u]), _box(g.nodes[v])
    if uy == vy:  # same row: side to side
        if ux < vx:
            return ux + W, uy + H / 2, vx, vy + H / 2
        return ux, uy + H / 2, vx + W, vy + H / 2
    if ux == vx:  # same column: top to bottom
        if uy < vy:
            return ux + W / 2, uy + H, vx + W / 2, vy
        return ux + W / 2, uy, vx + W / 2, vy + H
    x1 = ux + W * (0.75 if vx > ux else 0.25)
    x2 = vx + W * (0.25 if vx > ux else 0.75)
    return (x1, uy + H, x2, vy) if vy > uy else (x1, uy, x2, vy + H)


def to_svg(g: nx.DiGraph) -> str:
    rows = 1 + max(int(d["row"]) for _n, d in g.nodes(data=True))
    columns = 1 + max(int(d["column"]) for _n, d in g.nodes(data=True))
    width = 2 * MARGIN + columns * W + (columns - 1) * GAP_X
    height = 2 * MARGIN + rows * H + (rows - 1) * GAP_Y
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="Helvetica, Arial, sans-serif" font-size="12">',
           '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
           'markerHeight="7" orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z"/>'
           '</marker></defs>',
           f'<rect width="{width}" height="{height}" fill="white"/>']
    for name, data in g.nodes(data=True):
        x, y = _box(data)
        stage = data["cls"] in ("GatherStage", "ExecuteStage", "CommitStage", "FinishStage")
        fill = "#e8f0fe" if stage else "#f6f6f6"
        out.append(f'<rect x="{x}" y="{y}" width="{W}" height="{H}" rx="6" fill="{fill}" '
                   f'stroke="#333"><title>{escape(name)}</title></rect>')
        for i, line in enumerate(_lines(data)):
            weight = ' font-weight="bold"' if i == 0 else ' font-size="10" fill="#444"'
            out.append(f'<text x="{x + W / 2}" y="{y + 18 + i * 16}" text-anchor="middle"'
                       f'{weight}>{escape(line)}</text>')
    for u, v, data in g.edges(data=True):
        x1, y1, x2, y2 = _anchor(g, u, v)
        out.append(f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="#333" '
                   f'marker-end="url(#arrow)"/>')
        mx, my = (x1 + x2) / 2, (y1 + y2) / 2
        out.append(f'<text x="{mx}" y="{my - 4}" text-anchor="middle" font-size="11" '
                   f'fill="#a33" stroke="white" stroke-width="3" paint-order="stroke">'
                   f'{escape(data["label"])}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main() -> int:
    g = graph()
    (HERE / "stages.dot").write_text(to_dot(g), encoding="utf-8")
    (HERE / "stages.svg").write_text(to_svg(g), encoding="utf-8")
    print(f"wrote {HERE / 'stages.dot'} and {HERE / 'stages.svg'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
