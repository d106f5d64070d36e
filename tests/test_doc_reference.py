"""The reference pages run: docs/blackboard.md, conditions.md, routing.md, operations.md and
workflow-reference.md.  Every example is executed or evaluated by the real code, and each
page's lists are checked against the code they describe, so the pages cannot drift."""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator
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
    # and the method names in its tables are the Blackboard's, with the parameters shown
    for row in table_rows("blackboard.md", 2):
        for name, params in re.findall(r"`(?:Blackboard\.)?([a-z_]+)\(([^)`]*)\)`", row[0]):
            if name == "len":
                continue
            assert name in methods, f"docs/blackboard.md names Blackboard.{name}, which does not exist"
            signature = inspect.signature(getattr(Blackboard, name)).parameters
            for param in re.findall(r"([a-z_]+)(?:=[^,]*)?", params):
                assert param in signature or param in ("id", "ids", "anns", "ann", "type"), \
                    (name, param)


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
    newer, older = [b for b in blocks("conditions.md", "xml") if b.startswith("<records>")]
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


def test_the_per_record_table_on_the_conditions_page_decides_as_shown(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each condition is decided per record or once, as the table's second column says, with the
    answers shown for the page's three records."""
    import engine

    bb = run_python("conditions.md", tmp_path, monkeypatch)["bb"]
    message = [bb.document(rid) for rid in ("r1", "r2", "r3")]
    rows = [r for r in table_rows("conditions.md", 3) if r[1] in ("per record", "once")]
    assert len(rows) >= 6 and {r[1] for r in rows} == {"per record", "once"}
    for expression, decided, shown in rows:
        condition = engine.compile_condition(code(expression))
        assert condition.per_record == (decided == "per record"), expression
        answers = [a == "true" for a in re.findall(r"true|false", shown)]
        if condition.per_record:
            assert condition.test_each(message) == answers, expression
        else:
            assert condition.test(message) == answers[0] and len(answers) == 1, expression


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


# -- docs/routing.md -------------------------------------------------------------------------
def _routing_settings(tmp_path: Path) -> Any:
    from listener_router import load_settings

    config = tmp_path / "chalk.toml"
    config.write_text("\n".join(blocks("routing.md", "toml")))
    return load_settings(config, env={})


def test_the_listener_rules_on_the_routing_page_pick_the_rule_shown(tmp_path: Path) -> None:
    import json

    from listener_router import parse_message
    from listener_router._rules import ListenerRules

    rules = ListenerRules(_routing_settings(tmp_path).listeners)
    rows = [r for r in table_rows("routing.md", 2) if r[0].startswith("`{")]
    assert len(rows) == 5
    for headers, rule in rows:
        message = parse_message(b'{"id": "doc-1"}', queue="docs.in", message_id="m-1",
                                headers=json.loads(code(headers)))
        matched = rules.match(message)
        assert matched is not None and matched.name == code(rule), (headers, matched)


def _triage(tmp_path: Path) -> Any:
    """The page's workflow fragment as the whole of the Triage workflow."""
    from engine import load_workflow

    (fragment,) = blocks("routing.md", "xml")
    path = tmp_path / "triage.xml"
    path.write_text('<process name="Triage" xmlns="http://docs.oasis-open.org/wsbpel/2.0/process/'
                    'executable" xmlns:rec="http://www.eclipse.org/smila/record">\n'
                    + fragment + "</process>\n")
    return load_workflow(path)


def _route(tmp_path: Path, workflow: str, record: dict[str, Any]) -> list[Any]:
    from blackboard import Blackboard
    from engine import LocalRunner
    from listener_router import parse_message
    from listener_router._rules import Router

    bb = Blackboard.local()
    bb.create(record["id"])
    bb.set_attributes(record["id"], record["attributes"])
    result_ids = [record["id"]]
    if workflow == "Triage":
        (result,) = LocalRunner().run(_triage(tmp_path), bb, [[record["id"]]])
        assert result.ok, result.error
        result_ids = result.result_ids
    message = parse_message(b'{"id": "x"}', queue="docs.in", message_id="m-1", headers={})
    return Router(_routing_settings(tmp_path).routers).route(bb, workflow, message, result_ids)


def test_the_router_rules_on_the_routing_page_send_each_record_where_shown(tmp_path: Path) -> None:
    import json

    rows = [r for r in table_rows("routing.md", 3) if r[0].startswith("`{")]
    assert len(rows) == 4
    for record, workflow, shown in rows:
        out = _route(tmp_path, workflow, json.loads(code(record)))
        if shown == "nothing":
            assert out == [], record
            continue
        (message,) = out
        target = re.match(r"`([^`]+)`(?: key `([^`]+)`)?", shown)
        assert target is not None, shown
        if target.group(2):
            assert (message.exchange, message.routing_key) == target.groups(), record
        else:
            assert (message.exchange, message.routing_key) == ("", target.group(1)), record


def test_the_outgoing_message_on_the_routing_page_is_what_the_router_sends(tmp_path: Path) -> None:
    import json

    import orjson

    from listener_router import outgoing_id

    (shown,) = [json.loads(b) for b in blocks("routing.md", "json")]
    (message,) = _route(tmp_path, "Triage", shown["body"]["records"][0])
    assert orjson.loads(message.body) == shown["body"]
    assert message.headers == shown["headers"]
    assert message.message_id == outgoing_id("m-1", "/chalk.german", "a")


def test_next_destination_forms_on_the_routing_page(tmp_path: Path) -> None:
    """First anonymous value, else named ``queue``; empty or elsewhere: falls through."""
    from blackboard import Annotation, Blackboard
    from listener_router import RouterRule, parse_message
    from listener_router._rules import Router

    router = Router([RouterRule(use_next_destination=True), RouterRule(queue="fallback")])
    message = parse_message(b'{"id": "x"}', queue="q", message_id="m", headers={})
    cases: list[tuple[Any, Annotation, str]] = [
        (None, Annotation(["first", "second"]), "first"),
        (None, Annotation(named={"queue": "named"}), "named"),
        (None, Annotation(), "fallback"),
        ("a[-1]", Annotation(["on-attribute"]), "fallback"),
    ]
    for path, annotation, expected in cases:
        bb = Blackboard.local()
        bb.create("r")
        bb.set_literal("r", "a", "x")
        bb.set_annotation("r", path, "nextDestination", annotation)
        (out,) = router.route(bb, "W", message, ["r"])
        assert out.routing_key == expected, (path, annotation)


def test_the_pipelet_on_the_routing_page_sets_next_destination() -> None:
    from blackboard import Blackboard
    from listener_router import RouterRule, parse_message
    from listener_router._rules import Router

    namespace: dict[str, Any] = {}
    exec(compile(blocks("routing.md", "python")[0], "routing.md python block", "exec"), namespace)
    bb = Blackboard.local()
    for rid, words in (("long", 5000), ("short", 10)):
        bb.create(rid)
        bb.set_literal(rid, "words", words)
    assert namespace["ReviewLongOnes"]().process(bb, ["long", "short"]) == ["long", "short"]
    router = Router([RouterRule(use_next_destination=True), RouterRule(queue="chalk.out")])
    message = parse_message(b'{"id": "x"}', queue="q", message_id="m", headers={})
    out = router.route(bb, "W", message, ["long", "short"])
    assert [m.routing_key for m in out] == ["chalk.review", "chalk.out"]


# -- docs/operations.md ----------------------------------------------------------------------
def test_the_reload_example_on_the_operations_page_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Workflow files reload hot; pipelet code does not (the page's claim, on the real registry)."""
    import sys

    monkeypatch.setattr(sys, "path", list(sys.path))
    try:
        namespace = run_python("operations.md", tmp_path, monkeypatch)
    finally:
        sys.modules.pop("stamp", None)
    assert namespace["stamp"]() == "code v1: two"


def _chalk(*args: str, cwd: Path) -> Any:
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "listener_router", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def test_the_exit_codes_on_the_operations_page(tmp_path: Path) -> None:
    codes = {r[0] for r in table_rows("operations.md", 2) if r[0][:1].isdigit()}
    assert codes == {"0", "2", "130, 143"}
    good = tmp_path / "good.xml"
    good.write_text('<process name="Good" xmlns="http://docs.oasis-open.org/wsbpel/2.0/process/'
                    'executable"><empty/></process>')
    bad = tmp_path / "bad.xml"
    bad.write_text('<process name="Bad" xmlns="http://docs.oasis-open.org/wsbpel/2.0/process/'
                   'executable"><sequence/></process>')
    assert _chalk("validate", str(good), cwd=tmp_path).returncode == 0
    assert _chalk("validate", str(bad), cwd=tmp_path).returncode == 1
    done = _chalk("run", "--config", "missing.toml", cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.startswith("chalk run: "), done.stderr


def test_the_signals_on_the_operations_page(tmp_path: Path) -> None:
    """First SIGTERM/SIGINT asks the service to stop; a second exits with 128 + signal."""
    import signal
    import subprocess
    import sys

    text = (DOCS / "operations.md").read_text(encoding="utf-8")
    assert "143 for `SIGTERM`, 130 for `SIGINT`" in text
    script = (
        "import os, signal, sys\n"
        "from listener_router import Service, Settings\n"
        "service = Service(Settings())\n"
        "service.install_signal_handlers()\n"
        "os.kill(os.getpid(), signal.SIG{name})\n"
        "assert service._stopping.is_set()\n"
        "print('stopping', flush=True)\n"
        "os.kill(os.getpid(), signal.SIG{name})\n"
        "print('still here', flush=True)\n")
    for name, number in (("TERM", signal.SIGTERM), ("INT", signal.SIGINT)):
        done = subprocess.run([sys.executable, "-c", script.format(name=name)], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 128 + number, done.stderr
        assert done.stdout == "stopping\n", done.stdout


# -- docs/workflow-reference.md --------------------------------------------------------------
_WRAP = ('<process name="Example" xmlns="http://docs.oasis-open.org/wsbpel/2.0/process/executable"'
         ' xmlns:proc="http://www.eclipse.org/smila/processor"'
         ' xmlns:rec="http://www.eclipse.org/smila/record"'
         ' xmlns:xsd="http://www.w3.org/2001/XMLSchema">\n{}\n</process>\n')
_OUTCOME = re.compile(r"^\*\*In\*\* `(\{[^\n]*\})` \*\*→ (out|fault|error)\*\* `([^\n]*)`$", re.M)


def _reference_examples() -> list[tuple[str, str, str, str, str]]:
    """(heading, xml, records in, kind, expected) for each example, in page order."""
    text = (DOCS / "workflow-reference.md").read_text(encoding="utf-8")
    examples = []
    heading = ""
    pending: str | None = None
    for m in re.finditer(r"^### ([^\n]+)$|^```xml\n(.*?)^```|" + _OUTCOME.pattern, text, re.S | re.M):
        if m.group(1):
            heading = m.group(1)
        elif m.group(2) is not None:
            assert pending is None, f"{heading}: an example without its In/out line"
            pending = m.group(2)
        else:
            assert pending is not None, f"{heading}: an In/out line without an example"
            examples.append((heading, pending, m.group(3), m.group(4), m.group(5)))
            pending = None
    assert pending is None, f"{heading}: an example without its In/out line"
    return examples


def _every_element() -> set[str]:
    """The elements the workflow parser knows (its activity table, scope and process parts)."""
    from engine import _parse_core, _parser

    return (set(_parser.PARSERS) | _parse_core._DECLARATIONS | _parse_core._SCOPE_PARTS
            | _parse_core._STANDARD) - {"correlationSets", "messageExchanges"}


def test_the_workflow_reference_has_an_example_for_every_element() -> None:
    headings = " ".join(h for h, *_ in _reference_examples())
    named = set(re.findall(r"`(?:proc:)?(\w+)`", headings))
    missing = sorted(_every_element() - named)
    assert missing == [], f"docs/workflow-reference.md has no example for {missing}"


@pytest.fixture
def reference_services(tmp_path: Path,
                       monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """The page's message service, importable, and its ``[workflows.services]``."""
    from listener_router import load_settings

    (tmp_path / "docservices.py").write_text("\n".join(blocks("workflow-reference.md", "python")))
    monkeypatch.syspath_prepend(str(tmp_path))
    config = tmp_path / "chalk.toml"
    config.write_text("\n".join(blocks("workflow-reference.md", "toml")))
    yield dict(load_settings(config, env={}).services)
    import sys

    sys.modules.pop("docservices", None)


@pytest.mark.parametrize("number", range(len(_reference_examples())))
def test_each_workflow_reference_example_does_what_the_page_says(
        number: int, tmp_path: Path, reference_services: dict[str, str]) -> None:
    import json

    from blackboard import Blackboard
    from engine import LocalRunner, WorkflowRegistry

    heading, xml, records, kind, expected = _reference_examples()[number]
    helper = _reference_examples()[0][1]
    folder = tmp_path / "workflows"
    folder.mkdir()
    (folder / "quiet.xml").write_text(helper)
    if not xml.lstrip().startswith("<?xml"):
        (folder / "example.xml").write_text(_WRAP.format(xml))
    registry = WorkflowRegistry(folder, services=reference_services)
    if kind == "error":
        assert any(expected in e for e in registry.errors), (heading, registry.errors)
        return
    assert registry.errors == [], (heading, registry.errors)
    name = re.search(r'<process name="(\w+)"', xml)
    workflow = registry.get(name.group(1) if name else "Example")
    bb = Blackboard.local()
    given = json.loads(records)
    for rid, attributes in given.items():
        bb.create(rid)
        bb.set_attributes(rid, attributes)
    (result,) = LocalRunner().run(workflow, bb, [list(given)])
    if kind == "fault":
        assert not result.ok and (result.error or "").startswith(expected), (heading, result.error)
        return
    assert result.ok, (heading, result.error)
    assert {rid: bb.get_attributes(rid) for rid in bb.ids()} == json.loads(expected), heading


# -- links -----------------------------------------------------------------------------------
def _without_code(page: Path) -> str:
    return re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.S | re.M)


def _anchors(page: Path) -> set[str]:
    """The anchors of a page's headings, as GitHub (and mkdocs, for these headings) makes them."""
    found = set()
    for heading in re.findall(r"^#+ (.*)$", _without_code(page), re.M):
        words = re.sub(r"[^\w\- ]", "", heading.replace("`", "").lower())
        found.add(words.replace(" ", "-"))
    return found


def test_the_docs_link_only_to_files_in_the_repo() -> None:
    """Every relative link of README.md and docs/**/*.md resolves inside the repository, and
    every anchor the README links to is on its page (the site's build checks the pages' own
    anchors: tests/test_docs_site.py)."""
    pages = [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]
    bad = []
    for page in pages:
        for target, anchor in re.findall(r"\]\(([^)#\s]+)(?:#([^)]*))?\)", _without_code(page)):
            if re.match(r"[a-z]+://", target):
                continue
            resolved = (page.parent / target).resolve()
            if not resolved.is_relative_to(REPO) or not resolved.exists():
                bad.append(f"{page.name}: {target}")
            elif anchor and page.name == "README.md" and anchor not in _anchors(resolved):
                bad.append(f"{page.name}: {target}#{anchor}")
    assert bad == []


def test_the_readme_and_the_docs_index_list_every_page() -> None:
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    assert {p for p in pages if f"(docs/{p})" not in readme} == set()
    assert {p for p in pages - {"index.md"} if f"]({p})" not in index} == set()
