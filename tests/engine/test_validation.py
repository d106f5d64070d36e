"""Static checks: every invalid fixture fails with its file:line; valid ones load."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from engine_helpers import BPEL_HEADER, INVALID_DIR, VALID_DIR

from engine import (
    UnknownWorkflowError,
    WorkflowDefinitionError,
    WorkflowRegistry,
    load_workflow,
    validate_path,
)

_EXPECT = re.compile(r"<!-- expect (\d+): (.*?) -->")


def _expectation(path: Path) -> tuple[int, str]:
    m = _EXPECT.search(path.read_text())
    assert m, f"{path} needs an '<!-- expect LINE: message -->' comment"
    return int(m.group(1)), m.group(2)


@pytest.mark.parametrize("path", sorted(INVALID_DIR.glob("*.xml")), ids=lambda p: p.stem)
def test_invalid_workflow_names_file_and_line(path: Path) -> None:
    line, fragment = _expectation(path)
    with pytest.raises(WorkflowDefinitionError) as info:
        load_workflow(path)
    errors = info.value.errors
    assert any(e.startswith(f"{path}:{line}: ") and fragment in e for e in errors), errors
    assert str(info.value) == "\n".join(errors)


def test_validate_path_reports_every_invalid_file_and_no_valid_one() -> None:
    errors = validate_path(INVALID_DIR)
    files = {e.split(":", 1)[0] for e in errors}
    assert files == {str(p) for p in INVALID_DIR.glob("*.xml")}
    assert validate_path(VALID_DIR) == []


def test_every_valid_fixture_loads() -> None:
    registry = WorkflowRegistry(VALID_DIR)
    assert registry.errors == []
    assert "Mixed" in registry.names()


def _write(path: Path, name: str, body: str) -> None:
    path.write_text(BPEL_HEADER.format(name=name) + body + "</process>")


def test_registry_keeps_the_last_good_version_when_a_file_breaks(tmp_path: Path) -> None:
    f = tmp_path / "w.xml"
    _write(f, "W", "<sequence><empty name='v1'/></sequence>")
    registry = WorkflowRegistry(tmp_path)
    v1 = registry.get("W")
    time.sleep(0.01)
    _write(f, "W", "<sequence><bogus/></sequence>")
    errors = registry.refresh()
    assert errors and errors[0].startswith(f"{f}:1: unknown element <bogus>")
    assert registry.get("W") == v1
    assert registry.errors == errors
    _write(f, "W", "<sequence><empty name='v2'/><empty name='more'/></sequence>")
    assert registry.refresh() == []
    assert registry.get("W").version != v1.version
    assert registry.errors == []


def test_registry_names_known_workflows_for_an_unknown_name(tmp_path: Path) -> None:
    _write(tmp_path / "a.bpel", "Alpha", "<empty/>")
    registry = WorkflowRegistry(tmp_path)
    with pytest.raises(UnknownWorkflowError) as info:
        registry.get("Beta")
    assert "'Beta'" in str(info.value) and "Alpha" in str(info.value)
    assert isinstance(info.value, KeyError)


def test_registry_reports_sub_workflow_recursion_at_the_invoking_lines(tmp_path: Path) -> None:
    (tmp_path / "a.xml").write_text(
        BPEL_HEADER.format(name="A") + '\n<sequence>\n<proc:invokeWorkflow workflow="B"/>\n</sequence></process>'
    )
    (tmp_path / "b.xml").write_text(
        BPEL_HEADER.format(name="B") + '\n\n<proc:invokeWorkflow workflow="A"/>\n</process>'
    )
    (tmp_path / "c.xml").write_text(BPEL_HEADER.format(name="C") + '<proc:invokeWorkflow workflow="A"/></process>')
    registry = WorkflowRegistry(tmp_path)
    errors = registry.errors
    assert any(e.startswith(f"{tmp_path / 'a.xml'}:3: ") and "recursion A -> B -> A" in e for e in errors), errors
    assert any(e.startswith(f"{tmp_path / 'b.xml'}:3: ") and "recursion" in e for e in errors), errors
    assert any(e.startswith(f"{tmp_path / 'c.xml'}:1: ") and "not valid" in e for e in errors), errors
    assert registry.names() == []


def test_sub_workflows_are_attached_for_workers(tmp_path: Path) -> None:
    _write(tmp_path / "child.xml", "Child", "<empty/>")
    _write(tmp_path / "parent.xml", "Parent", '<proc:invokeWorkflow workflow="Child"/>')
    registry = WorkflowRegistry(tmp_path)
    assert registry.get("Parent").subworkflow("Child") == registry.get("Child")
    alone = load_workflow(tmp_path / "parent.xml", known_workflows={"Child": registry.get("Child")})
    assert alone.subworkflow("Child").name == "Child"


def test_line_numbers_come_from_the_file(tmp_path: Path) -> None:
    wf = load_workflow(VALID_DIR / "mixed.xml")
    lines = {a.name: a.line for a in wf.activities() if a.name}
    assert lines["upper"] == 9 and lines["bySize"] == 14
