"""The control-flow graph: networkx shape, dot text, svg/png only with graphviz."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import VALID_DIR

from engine import EngineError, load_workflow, render_graph, to_dot, workflow_graph


def test_graph_has_a_node_per_activity_with_kinds_lines_and_branch_edges() -> None:
    wf = load_workflow(VALID_DIR / "mixed.xml")
    g = workflow_graph(wf)
    kinds = {d["kind"] for _, d in g.nodes(data=True)}
    assert {"start", "end", "sequence", "if", "invokePipelet"} <= kinds
    assert sum(1 for _, d in g.nodes(data=True) if d["kind"] == "invokePipelet") == 5
    assert {d["kind"] for _, _, d in g.edges(data=True)} >= {"next", "true", "false"}
    import networkx as nx

    assert nx.has_path(g, "start", "end")
    lines = {d["name"]: d["line"] for _, d in g.nodes(data=True) if d["name"]}
    assert lines["upper"] == 9


def test_links_appear_as_link_edges(make_workflow: Any) -> None:
    wf = make_workflow("""<flow><links><link name="l"/></links>
        <empty name="a"><sources><source linkName="l"/></sources></empty>
        <empty name="b"><targets><target linkName="l"/></targets></empty></flow>""")
    g = workflow_graph(wf)
    assert [d["label"] for _, _, d in g.edges(data=True) if d["kind"] == "link"] == ["l"]


def test_dot_output_lists_every_node_and_edge(tmp_path: Path) -> None:
    g = workflow_graph(load_workflow(VALID_DIR / "mixed.xml"))
    text = to_dot(g)
    assert text.startswith('digraph "Mixed" {') and text.count("->") == g.number_of_edges()
    out = tmp_path / "g.dot"
    render_graph(g, out)
    assert out.read_text() == text


def test_svg_needs_graphviz_and_says_so(tmp_path: Path) -> None:
    g = workflow_graph(load_workflow(VALID_DIR / "mixed.xml"))
    if shutil.which("dot"):
        render_graph(g, tmp_path / "g.svg")
        assert (tmp_path / "g.svg").read_text().lstrip().startswith("<")
        return
    with pytest.raises(EngineError) as info:
        render_graph(g, tmp_path / "g.svg")
    assert "Graphviz" in str(info.value) and ".dot" in str(info.value)
