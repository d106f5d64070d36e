"""``chalk graph`` draws a workflow that fails validation, its faulty activities marked,
as SVG, PNG or DOT by the output's extension — with Graphviz's real ``dot``."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from lxml import etree

from engine import WorkflowDefinitionError, draft_graph, to_dot
from listener_router.cli import main

REPO = Path(__file__).resolve().parents[2]
INVALID = REPO / "tests" / "workflows" / "invalid"
SVG = "{http://www.w3.org/2000/svg}"
XLINK = "{http://www.w3.org/1999/xlink}"


@pytest.fixture
def dot() -> str:
    found = shutil.which("dot")
    if found is None:
        if os.environ.get("CHALK_TEST_REQUIRE_SERVICES"):
            pytest.fail("Graphviz's dot is missing: scripts/install.sh installs graphviz")
        pytest.skip("Graphviz's dot is not installed (scripts/install.sh installs it)")
    return found


def _svg_nodes(path: Path) -> dict[str, etree._Element]:
    tree = etree.parse(str(path))
    return {g.findtext(f"{SVG}title"): g for g in tree.iter(f"{SVG}g") if g.get("class") == "node"}


def _red(group: etree._Element) -> bool:
    return any(el.get("stroke") == "red" for el in group.iter(f"{SVG}polygon", f"{SVG}ellipse",
                                                               f"{SVG}path"))


def test_a_workflow_with_an_error_is_drawn_with_the_faulty_activity_red(tmp_path, capsys, dot):
    source = INVALID / "unknown_pipelet.xml"
    out = tmp_path / "bad.svg"
    assert main(["graph", str(source), "-o", str(out)]) == 1     # drawn, and not valid
    captured = capsys.readouterr()
    assert "1 error(s) marked" in captured.out
    assert f"{source}:5: <invokePipelet 'missing'>: unknown pipelet class" in captured.err
    nodes = _svg_nodes(out)
    assert {"start", "end", "a1", "a2"} <= set(nodes)
    faulty, fine = nodes["a2"], nodes["a1"]
    assert _red(faulty) and not _red(fine)
    tooltips = [a.get(f"{XLINK}title") for a in faulty.iter(f"{SVG}a")]
    assert any("unknown pipelet class 'nosuch.module.Thing'" in (t or "") for t in tooltips)
    assert "unknown pipelet class" in "".join(faulty.itertext())


def test_an_error_inside_an_activity_marks_that_activity(tmp_path, capsys, dot):
    # the condition's error is reported at the <condition> line, one below its <if>
    out = tmp_path / "if.svg"
    assert main(["graph", str(INVALID / "bad_xpath.xml"), "-o", str(out)]) == 1
    assert ":5: <if>: condition is not valid XPath" in capsys.readouterr().err
    nodes = _svg_nodes(out)
    assert "errors" not in nodes                     # no "errors at no activity" box
    (faulty,) = [name for name, group in nodes.items() if _red(group)]
    assert "condition is not valid XPath" in "".join(nodes[faulty].itertext())
    graph, _errors = draft_graph(INVALID / "bad_xpath.xml")
    assert graph.nodes[faulty]["kind"] == "if"
    # an element a sequence does not know marks the sequence it is in
    graph, _errors = draft_graph(INVALID / "unknown_element.xml")
    (marked,) = [d for _, d in graph.nodes(data=True) if d.get("errors")]
    assert marked["kind"] == "sequence" and "unknown element <sequense>" in marked["errors"][0]


def test_an_error_at_no_activity_gets_a_note(tmp_path, dot):
    source = tmp_path / "variables.xml"
    source.write_text(
        '<process name="V" xmlns="http://docs.oasis-open.org/wsbpel/2.0/process/executable">\n'
        '  <variables>\n'
        '    <variable name="x" type="xsd:string" xmlns:xsd="http://www.w3.org/2001/XMLSchema"/>\n'
        '    <variable name="x" type="xsd:string" xmlns:xsd="http://www.w3.org/2001/XMLSchema"/>\n'
        '  </variables>\n'
        '  <sequence><empty/></sequence>\n'
        '</process>\n')
    out = tmp_path / "variables.svg"
    assert main(["graph", str(source), "-o", str(out)]) == 1
    note = _svg_nodes(out)["errors"]
    assert _red(note) and "line 4: variable 'x' is declared twice" in "".join(note.itertext())


def test_png_and_dot_by_the_extension(tmp_path, dot):
    source = INVALID / "unknown_service.xml"
    assert main(["graph", str(source), "-o", str(tmp_path / "g.png")]) == 1
    assert (tmp_path / "g.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert main(["graph", str(source), "-o", str(tmp_path / "g.dot")]) == 1
    assert main(["graph", str(REPO / "workflows" / "demo.xml"), "-o", str(tmp_path / "ok.dot")]) == 0
    graph, errors = draft_graph(source)
    assert errors and (tmp_path / "g.dot").read_text() == to_dot(graph)
    assert "color=red" in to_dot(graph)
    valid, none = draft_graph(REPO / "workflows" / "demo.xml")
    assert none == [] and "red" not in to_dot(valid)


def test_a_file_that_is_not_a_workflow_still_names_file_and_line(tmp_path, capsys):
    with pytest.raises(WorkflowDefinitionError):
        draft_graph(INVALID / "malformed.xml")
    assert main(["graph", str(INVALID / "malformed.xml"), "-o", str(tmp_path / "m.svg")]) == 2
    assert f"{INVALID / 'malformed.xml'}:5: malformed XML" in capsys.readouterr().err
    assert not (tmp_path / "m.svg").exists()


def test_errors_are_those_chalk_validate_reports(tmp_path, capsys):
    process = ('<process name="%s" xmlns="http://docs.oasis-open.org/wsbpel/2.0/process/executable" '
               'xmlns:proc="http://www.eclipse.org/smila/processor">%s</process>')
    (tmp_path / "top.xml").write_text(process % ("Top", '<proc:invokeWorkflow workflow="Deep"/>'))
    (tmp_path / "deep.xml").write_text(process % ("Deep", "<empty/>"))
    graph, errors = draft_graph(tmp_path / "top.xml")   # Deep is found beside it
    assert errors == [] and "red" not in to_dot(graph)
    (tmp_path / "deep.xml").unlink()
    graph, errors = draft_graph(tmp_path / "top.xml")
    assert main(["validate", str(tmp_path / "top.xml")]) == 1
    assert capsys.readouterr().out.splitlines() == errors
    (faulty,) = [d for _, d in graph.nodes(data=True) if d.get("errors")]
    assert faulty["kind"] == "invokeWorkflow" and "unknown sub-workflow" in faulty["errors"][0]
