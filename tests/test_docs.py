"""Every example in the docs runs: the pipelet guide, the internals map and its picture, the
guide's configuration, the cluster page's topology listener and the events page's subscriber."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"


def code_blocks(path: Path, language: str) -> list[str]:
    """The fenced blocks of a Markdown file whose language is ``language`` ("" for none)."""
    return blocks_of(path.read_text(encoding="utf-8"), language)


def blocks_of(text: str, language: str) -> list[str]:
    """The fenced blocks of Markdown ``text`` whose language is ``language``."""
    blocks: list[str] = []
    current: list[str] | None = None
    kind = ""
    for line in text.splitlines(keepends=True):
        if line.startswith("```"):
            if current is None:
                current, kind = [], line[3:].strip()
            else:
                if kind == language:
                    blocks.append("".join(current))
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def block_with(path: Path, language: str, marker: str) -> str:
    (found,) = [b for b in code_blocks(path, language) if marker in b]
    return found


# -- docs/pipelets.md ----------------------------------------------------------------------
def test_the_pipelet_contract_block_is_python_that_runs() -> None:
    exec(compile(block_with(DOCS / "pipelets.md", "python", "class MyPipelet"), "contract", "exec"),
         {})


@pytest.fixture
def reading_time_project(tmp_path: Path) -> Path:
    """The guide's example pipelet and its test, written where the guide puts them."""
    guide = DOCS / "pipelets.md"
    (tmp_path / "mypipelets").mkdir()
    (tmp_path / "mypipelets" / "__init__.py").write_text("")
    (tmp_path / "mypipelets" / "reading.py").write_text(
        block_with(guide, "python", "class ReadingTime"))
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_reading.py").write_text(
        block_with(guide, "python", "def test_reading_time_rounds_up"))
    return tmp_path


def test_the_example_pipelet_passes_its_own_test(reading_time_project: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/test_reading.py"], cwd=reading_time_project,
                          capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": f"{reading_time_project}:{REPO}", "PATH": "/usr/bin"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "5 passed" in done.stdout


def test_the_example_workflow_snippet_loads_with_the_example_pipelet(
        reading_time_project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import engine
    from blackboard import Blackboard

    snippet = block_with(DOCS / "pipelets.md", "xml", "mypipelets.reading.ReadingTime")
    workflow = reading_time_project / "reading.xml"
    workflow.write_text(
        '<process name="Reading" xmlns="http://docs.oasis-open.org/wsbpel/2.0/process/executable"'
        ' xmlns:proc="http://www.eclipse.org/smila/processor">\n<sequence>\n'
        + snippet + "</sequence>\n</process>\n")
    monkeypatch.syspath_prepend(str(reading_time_project))
    loaded = engine.load_workflow(workflow)
    bb = Blackboard.local()
    bb.create("doc")
    bb.set_literal("doc", "body", "word " * 500)
    (result,) = engine.LocalRunner().run(loaded, bb, [["doc"]])
    assert result.ok, result.error
    assert bb.get_literal("doc", "readingMinutes").value == 2


def _frame_form_pipelet() -> type:
    """A pipelet whose DataFrame form is the guide's snippet."""
    snippet = block_with(DOCS / "pipelets.md", "python", "def frame_io")
    imports, _, methods = snippet.partition("\n\n")
    source = (imports + "\nfrom pipelets import Pipelet\n\n\nclass Shout(Pipelet):\n"
              "    attribute = 'text'\n\n" + textwrap.indent(textwrap.dedent(methods), "    "))
    namespace: dict[str, Any] = {}
    exec(compile(source, "frame-form", "exec"), namespace)
    return namespace["Shout"]


def test_the_dataframe_form_snippet_says_what_it_touches() -> None:
    from pipelets.frames import STRING

    io = _frame_form_pipelet()().frame_io()
    assert (io.reads, io.writes) == (("text",), (("shout", STRING),))


def test_the_dataframe_form_snippet_transforms_a_frame(spark: Any) -> None:
    frame = spark.createDataFrame([("r1", "hello")], "_record_id string, text string")
    (row,) = _frame_form_pipelet()().transform(frame).collect()
    assert row["shout"] == "HELLO"


# -- docs/internals.md -----------------------------------------------------------------------
def _stage_graph() -> Any:
    spec = importlib.util.spec_from_file_location("stage_graph", DOCS / "stage_graph.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_stage_map_on_disk_is_what_the_script_draws() -> None:
    drawn = _stage_graph()
    g = drawn.graph()
    assert (DOCS / "stages.dot").read_text(encoding="utf-8") == drawn.to_dot(g), \
        "docs/stages.dot is stale: run .venv/bin/python docs/stage_graph.py"
    assert (DOCS / "stages.svg").read_text(encoding="utf-8") == drawn.to_svg(g), \
        "docs/stages.svg is stale: run .venv/bin/python docs/stage_graph.py"
    assert "stages.svg" in (DOCS / "internals.md").read_text(encoding="utf-8")


def test_every_module_and_class_on_the_stage_map_exists() -> None:
    g = _stage_graph().graph()
    for _name, data in g.nodes(data=True):
        if not data["module"]:
            continue
        path = REPO / data["module"]
        assert path.is_file(), data["module"]
        dotted = data["module"].removesuffix(".py").replace("/", ".")
        assert hasattr(importlib.import_module(dotted), data["cls"]), (dotted, data["cls"])


def test_every_file_in_the_internals_tree_exists_and_every_module_is_in_it() -> None:
    text = (DOCS / "internals.md").read_text(encoding="utf-8")
    tree = next(b for b in code_blocks(DOCS / "internals.md", "") if b.startswith("listener_router/"))
    listed: set[str] = set()
    folder = ""
    for line in tree.splitlines()[1:]:
        name = line.split()[0]
        if name.endswith("/"):
            folder = name
        elif name.endswith(".py"):
            listed.add((folder if line.startswith("    ") else "") + name)
    root = REPO / "listener_router"
    actual = {str(p.relative_to(root)) for p in root.rglob("*.py")
              if "__pycache__" not in p.parts and (p.name != "__init__.py" or p.parent == root)}
    assert listed == actual
    assert "One message's way" in text


def test_the_seams_example_in_internals_runs() -> None:
    from listener_router import BatchObserver, BatchReport, CommitExtension, LeaderTask

    namespace: dict[str, Any] = {}
    exec(compile(block_with(DOCS / "internals.md", "python", "class Timings"), "seams", "exec"),
         namespace)
    timings = namespace["Timings"]()
    assert isinstance(timings, BatchObserver)
    timings.batch_finished(BatchReport(seconds={"run": 0.25}))
    assert timings.runs == [0.25]
    assert isinstance(namespace["Events"](), CommitExtension)
    hello = namespace["Hello"]()
    assert isinstance(hello, LeaderTask) and hello.run() == 0


# -- docs/guide.md ---------------------------------------------------------------------------
def test_the_guide_configuration_with_every_section_is_accepted(tmp_path: Path) -> None:
    from listener_router import load_settings

    config = tmp_path / "chalk.toml"
    config.write_text(block_with(DOCS / "guide.md", "toml", "[[listener]]"))
    settings = load_settings(config, env={})
    assert [r.name for r in settings.listeners] == ["add"]
    assert settings.local_below is None and settings.broker_process is True
    rule = settings.listeners[0]
    assert (rule.batch_size, rule.max_wait_ms, rule.prefetch) == (None, None, None)  # adaptive
    assert [(s.name, s.prefix, s.catch_up) for s in settings.schedules] == [("nightly", "doc-", "one")]
    assert (settings.heartbeat_seconds, settings.ttl_seconds) == (5.0, 30.0)
    assert settings.events.exchange == "chalk.events" and not settings.events.any


# -- docs/cluster.md -------------------------------------------------------------------------
def test_the_cluster_page_topology_listener_maps_queues_to_members() -> None:
    from listener_router import ClusterView, TopologyEvent, TopologyEventType, TopologyListener
    from listener_router.cluster import MemberDescription

    namespace: dict[str, Any] = {}
    exec(compile(block_with(DOCS / "cluster.md", "python", "class QueueMap"), "queue-map", "exec"),
         namespace)
    listener = namespace["QueueMap"]()
    assert isinstance(listener, TopologyListener)
    members = tuple(MemberDescription(name, "host", 1, float(i), i == 0, i == 0,
                                      {"queues": queues, "workflows": ["W"]})
                    for i, (name, queues) in enumerate([("a", ["in"]), ("b", ["in", "other"])]))
    view = ClusterView("c1", 2, "a", 1, members)
    listener.handle_topology_event(TopologyEvent(TopologyEventType.TOPOLOGY_CHANGING, view, None))
    assert listener.members_of == {}
    listener.handle_topology_event(TopologyEvent(TopologyEventType.TOPOLOGY_CHANGED, None, view))
    assert listener.members_of == {"in": ["a", "b"], "other": ["b"]}


# -- docs/events.md --------------------------------------------------------------------------
def test_the_events_page_subscriber_binds_to_chalk_events_and_drops_copies(
        broker_url: str, amqp_queues: Any) -> None:
    import pika

    namespace: dict[str, Any] = {}
    exec(compile(block_with(DOCS / "events.md", "python", "def subscribe"), "subscriber", "exec"),
         namespace)
    queue = amqp_queues("billing.events")
    connection, channel = namespace["subscribe"](broker_url, queue)
    try:
        channel.confirm_delivery()
        event = json.dumps({"event": "record.committed", "record": "doc-1"}).encode()
        props = pika.BasicProperties(message_id="evt:1", headers={"event.application": "h/0"})
        for key in ("record.committed.Docs", "record.committed.Docs", "record.invalidated.Docs"):
            channel.basic_publish("chalk.events", key, event, props)
        handled = []
        while True:
            method, properties, body = channel.basic_get(queue, auto_ack=True)
            if method is None:
                break
            handled.append(namespace["handle"](properties, body))
    finally:
        connection.close()
    assert handled == [True, False]  # the copy dropped by ID; the other kind not bound


# -- docs/configuration.md -------------------------------------------------------------------
def test_the_configuration_reference_is_what_the_settings_declare() -> None:
    from listener_router import configuration_reference

    assert (DOCS / "configuration.md").read_text(encoding="utf-8") == configuration_reference(), \
        "docs/configuration.md is stale: run .venv/bin/python docs/config_doc.py"


def test_the_reference_lists_every_key_and_environment_name() -> None:
    from listener_router._keys import env_names
    from listener_router._settings import settings_keys

    text = (DOCS / "configuration.md").read_text(encoding="utf-8")
    for _f, key in settings_keys():
        assert f"`{env_names(key)[0]}`" in text
        assert (f"| `{key.name}` |" if key.name else f"## [[{key.section}]]") in text


def test_the_reference_file_of_defaults_is_the_defaults(tmp_path: Path) -> None:
    import dataclasses

    from listener_router import Settings, load_settings

    config = tmp_path / "chalk.toml"
    config.write_text(block_with(DOCS / "configuration.md", "toml", "[blackboard]"))
    assert dataclasses.replace(load_settings(config, env={}), source=None) == Settings()
