"""The usual mistakes: a misspelt workflow, a message for a record that does not exist,
the same body published twice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from listener_router_helpers import (
    records_of,
    stored_attributes,
    write_config,
    write_test_workflows,
)

from listener_router import ListenerRule, Service, push_records
from listener_router.broker import dlq_name
from listener_router.cli import main
from listener_router.jobs import JobLogTables
from listener_router.store import ServiceStore

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.broker
def test_run_refuses_a_rule_naming_an_unknown_workflow(tmp_path, capsys, broker_url, qname,
                                                       sqlite_url):
    workflows = write_test_workflows(tmp_path / "workflows")
    config = write_config(tmp_path / "chalk.toml", db=sqlite_url, broker=broker_url,
                          workflows=workflows, engine={"runner": "local"},
                          listeners=[{"name": "adds", "queue": qname("in"),
                                      "workflow": "Countin"}], routers=[])

    code = main(["run", "--config", str(config), "--idle-exit", "1"])

    err = capsys.readouterr().err
    assert code == 2, err
    assert "'adds'" in err and str(config) in err and "'Countin'" in err
    assert "Counting, Crashing, Fragile, Hanging, Routed, Slow" in err


def test_run_names_the_file_and_line_of_every_bad_condition(tmp_path, capsys, sqlite_url):
    workflows = write_test_workflows(tmp_path / "workflows")
    config = write_config(tmp_path / "chalk.toml", db=sqlite_url, broker="amqp://nowhere:1/",
                          workflows=workflows, engine={"runner": "local"},
                          listeners=[{"name": "adds", "queue": "q.in", "workflow": "Counting",
                                      "condition": "$operation = "}],
                          routers=[{"queue": "q.ok"},
                                   {"queue": "q.de", "condition": "$record/Val[@key='lang' = 'de'"}])
    lines = config.read_text().splitlines()
    listener = next(n for n, line in enumerate(lines, 1) if line.startswith("condition") and
                    "$operation" in line)
    router = next(n for n, line in enumerate(lines, 1) if "Val[@key" in line)

    code = main(["run", "--config", str(config), "--idle-exit", "1"])

    err = capsys.readouterr().err
    assert code == 2, err
    assert "2 problems" in err      # both at once, before anything starts (the broker is none)
    assert f"{config}:{listener}: [[listener]] 'adds': condition '$operation = ' is not valid" in err
    assert f"{config}:{router}: [[router]] #2: condition" in err


def test_a_workflow_gone_while_running_dead_letters_its_messages(make_settings, broker, spark,
                                                                  tmp_path, declare):
    workflows = write_test_workflows(tmp_path / "workflows")
    settings = make_settings("Counting", workflows_dir=workflows)
    queue = settings.listeners[0].queue
    declare(settings)
    with Service(settings, spark=spark) as service:
        (workflows / "counting.xml").unlink()
        service.registry.refresh()
        broker.publish(queue, b'{"id": "a", "attributes": {"x": 1}}', message_id="m1")
        stats = service.run(until=lambda s: s["dead"] >= 1, idle_exit=30)

    assert stats["dead"] == 1
    (props, _), = broker.drain(dlq_name(queue))
    assert "unknown workflow 'Counting'" in props.headers["x-chalk-error"]


def test_an_id_only_message_for_a_missing_record_is_dead_lettered(make_settings, run_service,
                                                                  broker, tmp_path, declare):
    workflows = write_test_workflows(tmp_path / "workflows")
    settings = make_settings("Counting", workflows_dir=workflows)
    queue, out = settings.listeners[0].queue, settings.routers[0].queue
    declare(settings)
    push_records(settings, queue, [{"id": "there", "attributes": {"text": "x"}}])
    broker.publish(queue, json.dumps({"records": [{"id": "there"}, {"id": "nowhere"}]}),
                   message_id="both")
    broker.publish(queue, json.dumps({"id": "ghost"}), message_id="ghost")
    # attributes in the message make the record: that is not an ID-only message
    broker.publish(queue, json.dumps({"id": "made", "attributes": {"text": "y"}}),
                   message_id="made")
    stats = run_service(settings, until=lambda s: s["committed"] + s["dead"] >= 4)

    assert (stats["committed"], stats["dead"]) == (2, 2)
    dead = {p.message_id: p.headers["x-chalk-error"] for p, _ in broker.drain(dlq_name(queue))}
    assert "record 'nowhere' does not exist" in dead["both"]
    assert "record 'ghost' does not exist" in dead["ghost"]
    assert "create_missing" in dead["ghost"]
    assert stored_attributes(settings.blackboard_url, ["there", "nowhere", "ghost", "made"],
                             ["count"]) == {"there": {"count": 1}, "nowhere": None,
                                            "ghost": None, "made": {"count": 1}}
    assert sorted(r["id"] for r in records_of(broker.drain(out))) == ["made", "there"]
    store = ServiceStore.connect(settings.blackboard_url)   # the job log has them, with why
    logged = {e.message_id: e.reason for e in store.tables(JobLogTables).entries(states=("dead",))}
    store.close()
    assert "record 'ghost' does not exist" in logged["ghost"] and "both" in logged


def test_create_missing_makes_the_record_of_an_id_only_message(make_settings, run_service,
                                                               tmp_path, declare, broker):
    workflows = write_test_workflows(tmp_path / "workflows")
    settings = make_settings("Counting", workflows_dir=workflows, create_missing=True)
    queue = settings.listeners[0].queue
    declare(settings)
    broker.publish(queue, json.dumps({"id": "fresh"}), message_id="fresh")
    stats = run_service(settings, until=lambda s: s["committed"] >= 1)

    assert stats["committed"] == 1
    assert stored_attributes(settings.blackboard_url, ["fresh"], ["count"]) == {
        "fresh": {"count": 1}}


def test_create_missing_is_a_listener_key(tmp_path):
    from listener_router import load_settings

    config = tmp_path / "chalk.toml"
    config.write_text('[[listener]]\nname = "a"\ncreate_missing = true\n')
    (rule,) = load_settings(config, env={}).listeners
    assert rule == ListenerRule(name="a", create_missing=True)


def test_the_same_body_twice_publishes_its_result_once(make_settings, run_service, broker,
                                                       tmp_path, declare):
    """No message_id: both copies get the ID derived from the body.  The second copy is a
    duplicate of a committed message whose outgoing message was confirmed sent."""
    workflows = write_test_workflows(tmp_path / "workflows")
    settings = make_settings("Counting", workflows_dir=workflows)
    queue, out = settings.listeners[0].queue, settings.routers[0].queue
    declare(settings)
    push_records(settings, queue, [{"id": "twice", "attributes": {}}])
    body = json.dumps({"id": "twice", "attributes": {"text": "same"}})
    broker.publish(queue, body)
    broker.publish(queue, body)
    stats = run_service(settings, until=lambda s: s["committed"] >= 2 and s["duplicate"] >= 1)

    assert (stats["committed"], stats["duplicate"]) == (2, 1)
    routed = broker.drain(out)
    sources = sorted(p.headers["x-chalk-source"] for p, _ in routed)
    assert len(sources) == 2 and sources[0] != sources[1], sources  # push + the body, once
    assert stored_attributes(settings.blackboard_url, ["twice"], ["count"]) == {
        "twice": {"count": 2}}
