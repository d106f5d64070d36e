"""Every workflow example in README.md and docs/ runs, and every configuration example loads.

An example is a fenced ``xml`` block holding a whole ``<process>``; each one
must have an entry in ``EXAMPLES`` below (records in, what comes out), so a
new example without a test fails here.
"""

from __future__ import annotations

import re
import sqlite3
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from blackboard import Blackboard
from engine import LocalRunner, load_workflow
from listener_router import load_settings

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
_BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.S)
_NAME = re.compile(r'<process name="([^"]+)"')


def _blocks(kind: str) -> list[tuple[Path, str]]:
    return [(doc, m.group(2)) for doc in DOCS for m in _BLOCK.finditer(doc.read_text()) if m.group(1) == kind]


def _processes() -> dict[str, str]:
    found: dict[str, str] = {}
    for _, text in _blocks("xml"):
        if text.lstrip().startswith("<process"):
            name = _NAME.search(text)
            assert name is not None, text[:80]
            assert name.group(1) not in found, f"two examples named {name.group(1)}"
            found[name.group(1)] = text
    return found


def _settings(text: str) -> Any:
    """The settings a ``chalk.toml`` example gives."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "chalk.toml"
        path.write_text(text)
        return load_settings(path)


def _services() -> dict[str, str]:
    """Every ``[workflows.services]`` entry of the configuration examples."""
    services: dict[str, str] = {}
    for doc, text in _blocks("toml"):
        if doc.name == "plugins.md":
            continue
        services.update(_settings(text).services)
    return services


def _run(tmp_path: Path, name: str, batch: dict[str, dict[str, Any]],
         instances: list[list[str]] | None = None) -> tuple[list[Any], Blackboard]:
    path = tmp_path / f"{name}.bpel"
    path.write_text(_processes()[name])
    wf = load_workflow(path, services=_services())
    bb = Blackboard.local()
    for rid, attrs in batch.items():
        bb.create(rid)
        bb.set_attributes(rid, attrs)
    return LocalRunner().run(wf, bb, instances or [[rid] for rid in batch]), bb


def older_smila(tmp_path: Path) -> None:
    results, bb = _run(tmp_path, "OlderSmila", {"de": {"lang": ["en", "de"]}, "fr": {"lang": "fr"}})
    assert all(r.ok for r in results)
    assert bb.get_attributes("de") == {"lang": ["en", "de"], "tags": ["seen", "smila"], "region": ["DE", "EU"]}
    assert bb.get_attributes("fr") == {"lang": "fr", "tags": ["seen", "smila"]}


def greeting(tmp_path: Path) -> None:
    results, bb = _run(tmp_path, "Greeting", {"a": {"name": "Ada"}, "b": {"name": "Bob"}})
    assert all(r.ok for r in results)
    assert bb.get_attributes("a") == {"name": "Ada", "greeting": "Hello, Ada", "polite": "yes"}
    assert bb.get_attributes("b") == {"name": "Bob", "greeting": "Hello, Bob", "polite": "no"}


def first_pages(tmp_path: Path) -> None:
    results, bb = _run(tmp_path, "FirstPages", {"long": {"pages": 5}, "short": {"pages": 2}})
    assert all(r.ok for r in results)
    assert bb.get_attributes("long") == {"pages": 5, "read": "1 2 ", "note": "stopped before page 5"}
    assert bb.get_attributes("short") == {"pages": 2, "read": "1 2 "}
    # both in one message: each record's own range (finalCounterValue names $record)
    results, bb = _run(tmp_path, "FirstPages", {"long": {"pages": 5}, "short": {"pages": 2}}, [["long", "short"]])
    assert all(r.ok for r in results)
    assert bb.get_attributes("long") == {"pages": 5, "read": "1 2 ", "note": "stopped before page 5"}
    assert bb.get_attributes("short") == {"pages": 2, "read": "1 2 "}


def priority(tmp_path: Path) -> None:
    scores = {"r1": {"score": 0}, "r2": {"score": 3}, "r3": {"score": 9}}
    (result,), bb = _run(tmp_path, "Priority", scores, [["r1", "r2", "r3"]])
    assert result.ok and result.result_ids == ["r1", "r2", "r3"]
    assert [bb.get_attributes(r) for r in scores] == [
        {"score": 0, "priority": "low", "together": 3},
        {"score": 3, "priority": "medium", "together": 3},
        {"score": 9, "priority": "high", "together": 3}]


def fill(tmp_path: Path) -> None:
    widths = {"a": {"width": 1, "bar": ""}, "b": {"width": 3, "bar": ""}, "c": {"width": 2, "bar": ""}}
    (result,), bb = _run(tmp_path, "Fill", widths, [["a", "b", "c"]])
    assert result.ok
    assert [bb.get_attributes(r)["bar"] for r in widths] == ["#", "###", "##"]


def index_or_undo(tmp_path: Path) -> None:
    results, _ = _run(tmp_path, "IndexOrUndo", {"good": {"title": "Kept"}, "bad": {"body": "no title"}})
    assert [r.ok for r in results] == [True, False] and "noTitle" in results[1].error
    with sqlite3.connect(tmp_path / "indexes" / "docs.fts.sqlite") as conn:
        assert [row[0] for row in conn.execute("SELECT id FROM records")] == ["good"]


def welcome(tmp_path: Path) -> None:
    """The README's walk-through: its workflow with its pipelet, greet.py, next to it."""
    (pipelet,) = [text for doc, text in _blocks("python")
                  if doc.name == "README.md" and "class Greet(" in text]
    (tmp_path / "greet.py").write_text(pipelet)
    sys.path.insert(0, str(tmp_path))
    try:
        results, bb = _run(tmp_path, "Welcome", {"ada": {"name": "Ada", "lang": "en"},
                                                 "clara": {"name": "Clara", "lang": "de"},
                                                 "x": {"lang": "de"}})
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("greet", None)
    assert [r.ok for r in results] == [True, True, False]    # no name: that record's instance fails
    assert "'x'" in results[2].error
    assert bb.get_literal("ada", "greeting").value == "Hello, Ada"
    assert bb.get_literal("clara", "greeting").value == "Hallo, Clara"


EXAMPLES: dict[str, Callable[[Path], None]] = {
    "OlderSmila": older_smila,
    "Greeting": greeting,
    "FirstPages": first_pages,
    "IndexOrUndo": index_or_undo,
    "Priority": priority,
    "Fill": fill,
    "Welcome": welcome,
}


def test_every_workflow_example_has_a_test() -> None:
    assert sorted(_processes()) == sorted(EXAMPLES)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_workflow_example_runs(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    EXAMPLES[name](tmp_path)


def test_every_configuration_example_loads() -> None:
    # docs/plugins.md configures the plug-in it writes: test_plugins.py loads those blocks
    # with that plug-in installed.
    blocks = [(doc, text) for doc, text in _blocks("toml") if doc.name != "plugins.md"]
    assert blocks
    for doc, text in blocks:
        try:
            _settings(text)
        except Exception as e:
            pytest.fail(f"{doc.name}: a configuration example does not load: {e}")
