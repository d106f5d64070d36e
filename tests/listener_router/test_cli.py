"""The ``chalk`` command: validate, process, push errors, dlq — run through ``main``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from listener_router._signing import HeaderSigner
from listener_router.cli import main
from listener_router.store import ServiceStore

REPO = Path(__file__).resolve().parents[2]
INVALID = REPO / "tests" / "workflows" / "invalid"


def test_validate_passes_a_good_file(capsys):
    assert main(["validate", str(REPO / "workflows" / "demo.xml")]) == 0
    assert "valid" in capsys.readouterr().out


def test_validate_lists_every_error_with_file_and_line(capsys):
    assert main(["validate", str(INVALID)]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) >= len(list(INVALID.glob("*.xml")))
    for line in lines:
        file, number = line.split(":")[:2]
        assert file.endswith(".xml") and number.isdigit(), line


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_process_runs_a_workflow_over_a_file_without_a_broker(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    source = write_jsonl(tmp_path / "in.jsonl", [
        {"id": f"p{i}", "attributes": {"text": f"  Hello   WORLD {i} "}} for i in range(20)])
    code = main(["process", "--workflow", "Demo", "--input", str(source), "--output", "out.jsonl",
                 "--workflows", str(REPO / "workflows"), "--local"])
    assert code == 0
    assert "20 succeeded, 0 failed" in capsys.readouterr().out
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert {r["id"] for r in out} == {f"p{i}" for i in range(20)}
    assert out[0]["attributes"]["text"] == "hello world 0"
    assert out[0]["attributes"]["words"] == 3
    assert (tmp_path / "chalk.db").exists()  # committed to the configured store


@pytest.mark.spark
def test_process_on_spark_gives_the_same_records(tmp_path, spark, monkeypatch):
    monkeypatch.chdir(tmp_path)
    records = [{"id": f"s{i}", "attributes": {"text": f" A  b C {i}"}} for i in range(30)]
    source = write_jsonl(tmp_path / "in.jsonl", records)
    assert main(["process", "--workflow", "Demo", "--input", str(source), "--output", "spark.jsonl",
                 "--workflows", str(REPO / "workflows")]) == 0
    assert main(["process", "--workflow", "Demo", "--input", str(source), "--output", "local.jsonl",
                 "--workflows", str(REPO / "workflows"), "--local",
                 "--blackboard", f"sqlite:///{tmp_path / 'other.db'}"]) == 0
    assert (tmp_path / "spark.jsonl").read_text() == (tmp_path / "local.jsonl").read_text()


def test_a_bad_record_file_names_the_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    source = tmp_path / "in.jsonl"
    source.write_text('{"id": "a"}\n{"id": 5}\n')
    code = main(["process", "--workflow", "Demo", "--input", str(source), "--local",
                 "--workflows", str(REPO / "workflows")])
    assert code == 2
    assert f"{source}:2:" in capsys.readouterr().err


def test_an_unknown_workflow_names_the_known_ones(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    source = write_jsonl(tmp_path / "in.jsonl", [{"id": "a"}])
    code = main(["process", "--workflow", "Nope", "--input", str(source), "--local",
                 "--workflows", str(REPO / "workflows")])
    assert code == 2
    err = capsys.readouterr().err
    assert "Nope" in err and "Demo" in err


@pytest.mark.broker
def test_dlq_list_show_and_purge(tmp_path, capsys, monkeypatch, broker, declare, make_settings):
    settings = make_settings()
    queue = settings.listeners[0].queue
    declare(settings)
    store = ServiceStore.connect(settings.blackboard_url)
    try:   # as the service dead-letters: its x-chalk- headers signed with the cluster's key
        headers = HeaderSigner.of(store).signed({"x-chalk-error": "it broke",
                                                 "x-chalk-attempts": 4}, "dead-1", b'{"id": "x"}')
    finally:
        store.close()
    broker.publish(f"{queue}.dlq", b'{"id": "x"}', message_id="dead-1", headers=headers)
    config = tmp_path / "chalk.toml"
    config.write_text(f'[blackboard]\nurl = "{settings.blackboard_url}"\n'
                      f'[broker]\nurl = "{settings.broker_url}"\n[[listener]]\nname = "t"\n'
                      f'queue = "{queue}"\n')
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["dlq", "list", "--config", str(config)]) == 0
    listed = capsys.readouterr().out
    assert "dead-1" in listed and "it broke" in listed
    assert main(["dlq", "show", "dead-1", "--config", str(config)]) == 0
    shown = capsys.readouterr().out
    assert 'body: {"id": "x"}' in shown and "error: it broke" in shown
    # list and show moved it off Q.dlq into the store (browsing redelivers nothing) and keep it
    assert broker.depth(f"{queue}.dlq") == 0
    assert main(["dlq", "list", "--config", str(config)]) == 0
    assert "dead-1" in capsys.readouterr().out
    assert main(["dlq", "purge", "--all", "--yes", "--config", str(config)]) == 0
    assert "purged 1" in capsys.readouterr().out
    assert main(["dlq", "list", "--config", str(config)]) == 0
    assert "dead-1" not in capsys.readouterr().out


def _process(name: str, body: str) -> str:
    return ('<process name="%s" xmlns="http://docs.oasis-open.org/wsbpel/2.0/process/executable" '
            'xmlns:proc="http://www.eclipse.org/smila/processor" xmlns:rec="http://www.eclipse.org/smila/record">'
            '%s</process>' % (name, body))


def _java(cls: str) -> str:
    return (f'<extensionActivity><proc:invokePipelet name="j"><proc:pipelet class="{cls}"/>'
            "</proc:invokePipelet></extensionActivity>")


def test_validate_walks_the_tree_and_lists_the_workflows_it_found(tmp_path, capsys):
    (tmp_path / "sub" / "deeper").mkdir(parents=True)
    (tmp_path / "top.bpel").write_text(_process("Top", '<proc:invokeWorkflow workflow="Deep"/>'))
    (tmp_path / "sub" / "deeper" / "deep.xml").write_text(_process("Deep", "<empty/>"))
    assert main(["validate", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [f"{tmp_path}: valid: 2 workflow(s)", "  Top  top.bpel", "  Deep  sub/deeper/deep.xml"]


def test_validate_prints_each_error_once_and_not_in_the_log(tmp_path, capsys):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "bad.bpel").write_text(_process("Bad", "<bogus/>"))
    (tmp_path / "uses.bpel").write_text(_process("Uses", '<proc:invokeWorkflow workflow="Bad"/>'))
    assert main(["validate", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert len(lines) == len(set(lines)) == 2
    assert lines[0].startswith(f"{tmp_path / 'uses.bpel'}:1: <invokeWorkflow 'Bad'>: the sub-workflow has errors")
    assert lines[1].startswith(f"{tmp_path / 'a' / 'bad.bpel'}:1: unknown element <bogus>")
    assert "unknown element" not in captured.err


def test_validate_summary_is_the_migration_to_do_list(tmp_path, capsys):
    body = "<sequence>" + _java("com.acme.Indexer") + _java("com.acme.Indexer") + "</sequence>"
    (tmp_path / "w.bpel").write_text(_process("W", body))
    (tmp_path / "v.bpel").write_text(_process("V", "<sequence><bogus/></sequence>"))
    assert main(["validate", "--summary", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "unknown pipelet class 'com.acme.Indexer'" not in out  # grouped below instead
    assert "unknown element <bogus>" in out
    assert "1 unknown pipelet class(es) and service(s), 2 use(s) in 1 file(s)" in out
    assert "    2  pipelet  com.acme.Indexer" in out and "w.bpel:1" in out


def test_workflows_services_in_the_configuration_map_invoke_service(tmp_path, capsys):
    body = ('<extensionActivity><proc:invokeService name="s"><proc:service name="Marker"/>'
            '<proc:setAnnotations><rec:An n="value"><rec:V>x</rec:V></rec:An></proc:setAnnotations>'
            "</proc:invokeService></extensionActivity>")
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "svc.bpel").write_text(_process("Svc", body))
    assert main(["validate", str(tmp_path / "flows")]) == 1
    assert "unknown service 'Marker'" in capsys.readouterr().out
    config = tmp_path / "chalk.toml"
    config.write_text('[workflows.services]\nMarker = "tests.engine._pipelets.Mark"\n')
    assert main(["validate", "--config", str(config), str(tmp_path / "flows")]) == 0
