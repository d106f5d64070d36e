"""The reference pages run: docs/blackboard.md, conditions.md, routing.md, operations.md and
workflow-reference.md.  Every example is executed or evaluated by the real code, and each
page's lists are checked against the code they describe, so the pages cannot drift."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"


def blocks(page: str, language: str) -> list[str]:
    """The fenced blocks of ``docs/page`` in ``language``, in order."""
    text = (DOCS / page).read_text(encoding="utf-8")
    return [m.group(1) for m in re.finditer(r"^```" + language + r"\n(.*?)^```", text, re.S | re.M)]


def run_python(page: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Run the page's Python blocks top to bottom in one namespace, in ``tmp_path``."""
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {}
    found = blocks(page, "python")
    assert found, page
    for number, block in enumerate(found, 1):
        exec(compile(block, f"{page} python block {number}", "exec"), namespace)
    return namespace


def table_rows(page: str, columns: int) -> list[list[str]]:
    """Rows of the page's Markdown tables with ``columns`` cells (``\\|`` kept as ``|``)."""
    rows = []
    for line in (DOCS / page).read_text(encoding="utf-8").splitlines():
        if not line.startswith("| ") or set(line) <= set("|- "):
            continue
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) == columns:
            rows.append(cells)
    return rows


def code(cell: str) -> str:
    match = re.fullmatch(r"`(.*)`", cell)
    assert match, cell
    return match.group(1)


# -- docs/blackboard.md ----------------------------------------------------------------------
def test_the_blackboard_page_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    namespace = run_python("blackboard.md", tmp_path, monkeypatch)
    assert (tmp_path / "chalk-example.db").is_file()
    assert namespace["bb"].store is not None


def test_the_blackboard_page_names_every_public_method_and_name() -> None:
    import blackboard
    from blackboard import Blackboard

    text = (DOCS / "blackboard.md").read_text(encoding="utf-8")
    methods = [n for n, m in inspect.getmembers(Blackboard) if not n.startswith("_") and callable(m)]
    assert len(methods) > 60
    missing = [n for n in methods if not re.search(r"\b" + n + r"\b", text)]
    assert missing == [], f"docs/blackboard.md does not describe {missing}"
    missing = [n for n in blackboard.__all__ if not re.search(r"\b" + n + r"\b", text)]
    assert missing == [], f"docs/blackboard.md does not name {missing}"


def test_the_annotation_targets_table_matches_the_blackboard() -> None:
    """``None`` annotates the record, ``"a[-1]"`` the attribute, ``"a"`` the sub-object."""
    from blackboard import Annotation, Blackboard

    bb = Blackboard.local()
    bb.create("r")
    bb.set_literal("r", "a", "x")
    bb.add_object("r", "a")
    for path in (None, "a[-1]", "a"):
        bb.set_annotation("r", path, "where", Annotation([str(path)]))
    meta = bb.document("r")["meta"]
    assert meta["ann"]["where"] == [{"values": ["None"]}]
    assert meta["attr_ann"]["a"]["where"] == [{"values": ["a[-1]"]}]
    assert meta["attrs"]["a"][1]["obj"]["ann"]["where"] == [{"values": ["a"]}]
    shown = {r[0].split()[0]: r[1] for r in table_rows("blackboard.md", 2)}
    assert shown["`None`"] == "the record itself"
    assert shown['`"a[-1]"`'].startswith("the attribute `a`")
    assert shown['`"a"`,'].startswith("the sub-object")


# -- docs/conditions.md ----------------------------------------------------------------------
def _condition_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    namespace = run_python("conditions.md", tmp_path, monkeypatch)
    return namespace["bb"].document("doc-1")


def _normal(xml: str) -> str:
    from lxml import etree

    parsed = etree.fromstring(xml.encode(), etree.XMLParser(remove_blank_text=True))
    return etree.tostring(parsed).decode()


def test_the_record_xml_on_the_conditions_page_is_what_the_engine_renders(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from lxml import etree

    from engine._conditions import render_records

    document = _condition_record(tmp_path, monkeypatch)
    newer, older = blocks("conditions.md", "xml")
    assert _normal(newer) == etree.tostring(render_records([document])).decode()
    assert _normal(older) == etree.tostring(render_records([document], new=False, old=True)).decode()


def test_every_condition_on_the_conditions_page_gives_the_result_shown(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import engine

    document = _condition_record(tmp_path, monkeypatch)
    rows = [r for r in table_rows("conditions.md", 2) if r[1] in ("true", "false")]
    assert len(rows) >= 20
    wrong = [(code(expr), shown) for expr, shown in rows
             if engine.compile_condition(code(expr)).test([document]) != (shown == "true")]
    assert wrong == []


def test_a_condition_from_the_conditions_page_steers_a_workflow(tmp_path: Path) -> None:
    """The same expression in a workflow's ``<if>`` (the interpreter, not just the compiler)."""
    from blackboard import Blackboard
    from engine import LocalRunner, load_workflow

    path = tmp_path / "tagged.xml"
    path.write_text(
        '<process name="Tagged" xmlns="http://docs.oasis-open.org/wsbpel/2.0/process/executable">'
        "<if><condition>$record/Seq[@key='tags']/Val = 'ai'</condition>"
        "<assign><copy><from>'yes'</from><to attribute=\"ai\"/></copy></assign>"
        "<else><assign><copy><from>'no'</from><to attribute=\"ai\"/></copy></assign></else></if>"
        "</process>")
    bb = Blackboard.local()
    bb.create("multi")
    bb.set_attributes("multi", {"tags": ["news", "ai"]})
    bb.create("single")
    bb.set_attributes("single", {"tags": "ai"})
    results = LocalRunner().run(load_workflow(path), bb, [["multi"], ["single"]])
    assert all(r.ok for r in results)
    # a single value is a Val, not a Seq: the page's union form is the one that finds both
    assert bb.get_attributes("multi")["ai"] == "yes" and bb.get_attributes("single")["ai"] == "no"
