"""The control-flow graph of a workflow (networkx), and its output as dot/svg/png.

Nodes are ``"start"``, ``"end"`` and one node per activity (``"a<aid>"``);
structured activities that join branches (``if``, ``flow``, ``scope``) add an
``"a<aid>.end"`` node.  Edge ``kind`` is ``"next"`` (normal completion),
``"true"``/``"false"`` (branch or loop decisions), ``"fault"`` (into a
handler), ``"compensate"``/``"terminate"`` (into a scope's compensation or
termination handler), ``"exit"`` and ``"link"`` (a BPEL link; ordering, not
reachability).  Activities that cannot be reached from ``"start"`` along
non-link edges are unreachable; the validator reports them.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess

import networkx as nx

from engine._errors import EngineError
from engine._specs import (
    Activity,
    Exit,
    Flow,
    ForEach,
    If,
    InvokePipelet,
    InvokeService,
    InvokeWorkflow,
    RepeatUntil,
    Rethrow,
    Scope,
    Sequence,
    Throw,
    While,
    Workflow,
    walk,
)

__all__ = ["activity_graph", "render_graph", "to_dot", "unreachable", "workflow_graph"]

log = logging.getLogger(__name__)


def _node(a: Activity) -> str:
    return f"a{a.aid}"


class _Builder:
    def __init__(self) -> None:
        self.g = nx.DiGraph()

    def add(self, a: Activity) -> str:
        n = _node(a)
        label = a.kind + (f"\n{a.name}" if a.name else "")
        if isinstance(a, InvokePipelet):
            label = f"{a.name or 'invokePipelet'}\n{a.pipelet_class}"
        elif isinstance(a, InvokeWorkflow):
            label = f"invokeWorkflow\n{a.workflow}"
        elif isinstance(a, InvokeService):
            label = f"invoke\n{a.partner_link}.{a.operation}"
        self.g.add_node(n, kind=a.kind, label=label, line=a.line, name=a.name or "")
        return n

    def edge(self, u: str, v: str, kind: str = "next", label: str = "") -> None:
        self.g.add_edge(u, v, kind=kind, label=label)

    def build(self, a: Activity) -> tuple[str, list[str]]:
        """Add ``a``; return its entry node and the nodes that continue normally."""
        n = self.add(a)
        if isinstance(a, Sequence):
            exits = [n]
            for child in a.body:
                entry, child_exits = self.build(child)
                for e in exits:
                    self.edge(e, entry)
                exits = child_exits
            return n, exits
        if isinstance(a, Flow):
            end = f"{n}.end"
            self.g.add_node(end, kind="join", label="flow end", line=a.line, name="")
            for child in a.body:
                entry, child_exits = self.build(child)
                self.edge(n, entry)
                for e in child_exits:
                    self.edge(e, end)
            return n, [end]
        if isinstance(a, If):
            end = f"{n}.end"
            self.g.add_node(end, kind="join", label="if end", line=a.line, name="")
            for i, (cond, child) in enumerate(a.branches):
                entry, child_exits = self.build(child)
                self.edge(n, entry, "true", cond.expression.strip() if i == 0 else "elseif " + cond.expression.strip())
                for e in child_exits:
                    self.edge(e, end)
            if a.otherwise is not None:
                entry, child_exits = self.build(a.otherwise)
                self.edge(n, entry, "false", "else")
                for e in child_exits:
                    self.edge(e, end)
            else:
                self.edge(n, end, "false", "else")
            return n, [end]
        if isinstance(a, (While, ForEach)):
            if a.body is not None:
                entry, child_exits = self.build(a.body)
                self.edge(n, entry, "true")
                for e in child_exits:
                    self.edge(e, n, "next", "loop")
            return n, [n]
        if isinstance(a, RepeatUntil):
            if a.body is None:
                return n, [n]
            entry, child_exits = self.build(a.body)
            self.edge(n, entry)
            for e in child_exits:
                self.edge(e, n, "false", "repeat")
            return n, list(child_exits)
        if isinstance(a, Scope):
            end = f"{n}.end"
            self.g.add_node(end, kind="join", label="scope end", line=a.line, name="")
            if a.body is not None:
                entry, child_exits = self.build(a.body)
                self.edge(n, entry)
                for e in child_exits:
                    self.edge(e, end)
            for h in a.handlers:
                entry, child_exits = self.build(h.activity)
                self.edge(n, entry, "fault", h.fault_name or "catchAll")
                for e in child_exits:
                    self.edge(e, end)
            for kind, handler in (("compensate", a.compensation), ("terminate", a.termination)):
                if handler is not None:
                    # a handler runs later (or instead); it continues nowhere in this graph
                    entry, _ = self.build(handler)
                    self.edge(n, entry, kind, kind)
            return n, [end]
        if isinstance(a, Exit):
            self.edge(n, "end", "exit")
            return n, []
        if isinstance(a, (Throw, Rethrow)):
            return n, []
        return n, [n]


def activity_graph(body: Activity) -> nx.DiGraph:
    """The control-flow graph of an activity tree (see the module docstring)."""
    b = _Builder()
    b.g.add_node("start", kind="start", label="start", line=0, name="")
    b.g.add_node("end", kind="end", label="end", line=0, name="")
    entry, exits = b.build(body)
    b.edge("start", entry)
    for e in exits:
        b.edge(e, "end")
    sources: dict[str, str] = {}
    targets: dict[str, str] = {}
    for a in walk(body):
        for s in a.sources:
            sources[s.link] = _node(a)
        for t in a.targets:
            targets[t] = _node(a)
    for link, src in sources.items():
        if link in targets:
            b.edge(src, targets[link], "link", link)
    return b.g


def workflow_graph(workflow: Workflow) -> nx.DiGraph:
    """The control-flow graph of ``workflow`` (graph attribute ``name``)."""
    g = activity_graph(workflow.body)
    g.graph["name"] = workflow.name
    g.graph["path"] = workflow.path
    return g


def unreachable(body: Activity) -> list[Activity]:
    """Activities no normal control path reaches (after ``exit``/``throw`` in a sequence)."""
    g = activity_graph(body)
    flow_only = nx.DiGraph((u, v) for u, v, k in g.edges(data="kind") if k != "link")
    flow_only.add_nodes_from(g.nodes)
    reached = nx.descendants(flow_only, "start") | {"start"}
    return [a for a in walk(body) if _node(a) not in reached]


_STYLE = {
    "next": "",
    "true": ', color="darkgreen"',
    "false": ', color="firebrick"',
    "fault": ', color="orange", style=bold',
    "compensate": ', color="purple", style=dashed',
    "terminate": ', color="gray40", style=dashed',
    "exit": ", style=dotted",
    "link": ', style=dashed, color="blue"',
}
_SHAPE = {"start": "circle", "end": "doublecircle", "join": "point", "if": "diamond", "while": "diamond",
          "repeatUntil": "diamond", "forEach": "diamond", "invokePipelet": "box"}


def _quote(s: object) -> str:
    return '"' + str(s).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _short(text: str, width: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[:width - 1] + "…"


def to_dot(graph: nx.DiGraph) -> str:
    """The graph in Graphviz dot syntax (no graphviz needed); activities with ``errors``
    (see ``engine._draft``) are drawn red with the error."""
    lines = [f"digraph {_quote(graph.graph.get('name', 'workflow'))} {{", "  rankdir=TB;", "  node [fontname=Helvetica];"]
    for n, data in graph.nodes(data=True):
        shape = _SHAPE.get(data.get("kind", ""), "box")
        label = data.get("label", n)
        line = data.get("line")
        if line and data.get("kind") not in {"join", "start", "end"}:
            label = f"{label}\n(line {line})"
        errors = data.get("errors")
        if errors:  # a faulty activity (engine._draft): red, the error shown and as tooltip
            more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
            label = f"{label}\n{_short(errors[0])}{more}"
            lines.append(f"  {_quote(n)} [label={_quote(label)}, shape={shape}, color=red, "
                         f"fontcolor=red, penwidth=2, tooltip={_quote(chr(10).join(errors))}];")
            continue
        lines.append(f"  {_quote(n)} [label={_quote(label)}, shape={shape}];")
    elsewhere = graph.graph.get("errors")
    if elsewhere:
        text = "errors at no activity:\n" + "\n".join(_short(e, 90) for e in elsewhere)
        lines.append(f"  \"errors\" [label={_quote(text)}, shape=note, color=red, fontcolor=red, "
                     f"tooltip={_quote(chr(10).join(elsewhere))}];")
    for u, v, data in graph.edges(data=True):
        label = data.get("label") or ""
        extra = _STYLE.get(data.get("kind", "next"), "")
        lab = f"label={_quote(label)}" if label else 'label=""'
        lines.append(f"  {_quote(u)} -> {_quote(v)} [{lab}{extra}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def render_graph(graph: nx.DiGraph, output: str | os.PathLike[str], fmt: str | None = None) -> None:
    """Write ``graph`` to ``output`` as dot, svg or png (format from the suffix).

    svg and png need Graphviz's ``dot`` program; without it this raises
    :class:`EngineError` saying so (write ``.dot`` instead).
    """
    out = os.fspath(output)
    fmt = (fmt or os.path.splitext(out)[1].lstrip(".") or "dot").lower()
    text = to_dot(graph)
    if fmt in {"dot", "gv"}:
        with open(out, "w", encoding="utf-8") as f:
            f.write(text)
        return
    if fmt not in {"svg", "png", "pdf"}:
        raise EngineError(f"unknown graph format {fmt!r}; use .dot, .svg or .png")
    dot = shutil.which("dot")
    if dot is None:
        raise EngineError(
            f"writing {fmt} needs Graphviz's 'dot' program, which is not installed "
            "(apt-get install graphviz); or write a .dot file instead"
        )
    try:
        subprocess.run([dot, f"-T{fmt}", "-o", out], input=text.encode(), check=True, capture_output=True, timeout=60)
    except subprocess.CalledProcessError as e:
        raise EngineError(f"graphviz failed: {e.stderr.decode(errors='replace').strip()}") from e
