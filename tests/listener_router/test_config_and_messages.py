"""Pure logic: configuration loading and message parsing (no broker, no Spark)."""

from __future__ import annotations

import json

import pytest

from listener_router import BadMessage, ConfigError, load_settings, outgoing_id, parse_message
from listener_router.pipeline import State, check_transition


def test_defaults_work_with_no_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    settings = load_settings(env={})
    assert settings.blackboard_url == "sqlite:///chalk.db"
    assert settings.spark_master == "local[*]"
    assert [r.queue for r in settings.listeners] == ["chalk.in"]
    assert [r.queue for r in settings.routers] == ["chalk.out"]
    assert settings.source is None
    assert settings.dataframe_forms is True
    assert settings.local_below is None  # "auto": where the workflow's pipelets allow it
    (rule,) = settings.listeners
    assert (rule.batch_size, rule.max_wait_ms, rule.prefetch) == (None, None, None)  # adaptive


def test_file_and_environment_are_read(tmp_path):
    path = tmp_path / "chalk.toml"
    path.write_text("""
[blackboard]
url = "sqlite:///x.db"
[spark]
master = "local[2]"
[spark.conf]
"spark.sql.shuffle.partitions" = 2
[engine]
dataframe_forms = false
local_below = 200
[[listener]]
name = "add"
queue = "in"
condition = "$operation = 'ADD'"
workflow = "W"
backoff_ms = [10, 20]
[[router]]
queue = "out"
attributes = ["a"]
""")
    settings = load_settings(path, env={"CHALK_BROKER_URL": "amqp://h/%2F"})
    assert settings.blackboard_url == "sqlite:///x.db"
    assert settings.broker_url == "amqp://h/%2F"
    assert settings.spark_conf == {"spark.sql.shuffle.partitions": "2"}
    (rule,) = settings.listeners
    assert (rule.name, rule.queue, rule.workflow, rule.backoff_ms) == ("add", "in", "W", (10, 20))
    assert settings.routers[0].attributes == ("a",)
    assert settings.dataframe_forms is False
    assert settings.local_below == 200


@pytest.mark.parametrize("text, message", [
    ("[blackboard]\nurl = 3\n", "'url' must be str"),
    ("[blackbord]\n", "unknown key(s) blackbord"),
    ("[[listener]]\nbatch_size = 0\n", "'batch_size' must be positive"),
    ("[[router]]\nattributes = ['a']\n", "give 'queue'"),
    ("[broker]\nqueue_type = 'stream'\n", "queue_type must be"),
    ("[engine]\ndataframe_forms = 'yes'\n", "'dataframe_forms' must be bool"),
    ("[engine]\nlocal_below = -1\n", "local_below must be \"auto\" or a number of records"),
    ("[engine]\nlocal_below = 'often'\n", "local_below must be \"auto\" or a number of records"),
    ("not = toml = at all\n", "not valid TOML"),
])
def test_bad_configuration_names_file_and_key(tmp_path, text, message):
    path = tmp_path / "chalk.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_settings(path, env={})
    assert str(path) in str(caught.value)
    assert message in str(caught.value)


def test_a_missing_config_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError) as caught:
        load_settings(tmp_path / "nope.toml", env={})
    assert "no such configuration file" in str(caught.value)


def test_messages_parse_both_body_forms():
    one = parse_message(b'{"id": "a", "attributes": {"t": 1}}', queue="q", message_id="m",
                        headers={"operation": b"delete"})
    assert (one.records, one.operation, one.attempts) == ([{"id": "a", "attributes": {"t": 1}}],
                                                          "DELETE", 0)
    many = parse_message(json.dumps({"records": [{"id": "a"}, {"id": "b"}]}).encode(), queue="q",
                         message_id=None, headers={"x-chalk-attempts": 2})
    assert many.record_ids == ["a", "b"]
    assert many.attempts == 2
    assert many.message_id.startswith("sha256:")  # derived from the body when absent


@pytest.mark.parametrize("body, reason", [
    (b"\xff\xfe", "not JSON"),
    (b'"text"', "body must be"),
    (b'{"records": {}}', "'records' must be a list"),
    (b'{"records": [{"id": "a"}, {"id": "a"}]}', "appears twice"),
    (b'{"records": [{"id": ""}]}', "bad id"),
    (b'{"records": [{"id": "a", "attributes": []}]}', "'attributes' must be an object"),
    (b"[" * 100_000, "not JSON"),
    (b'{"id": "a\\u0000b"}', "control characters"),
    (('{"id": "a", "attributes": ' + '{"x": ' * 40 + "1" + "}" * 41).encode(), "nested deeper"),
])
def test_bad_messages_say_what_is_wrong(body, reason):
    with pytest.raises(BadMessage) as caught:
        parse_message(body, queue="q", message_id="m-1", headers={})
    assert "message m-1" in str(caught.value)
    assert reason in str(caught.value)


def test_outgoing_ids_are_deterministic():
    assert outgoing_id("in-1", "/out", "r") == outgoing_id("in-1", "/out", "r")
    assert outgoing_id("in-1", "/out", "r") != outgoing_id("in-2", "/out", "r")
    assert outgoing_id("in-1", "/out", "r") != outgoing_id("in-1", "/other", "r")


def test_message_states_move_only_along_the_table():
    assert check_transition(State.RECEIVED, State.PROCESSING) is State.PROCESSING
    with pytest.raises(RuntimeError):
        check_transition(State.ACKED, State.PROCESSING)
    with pytest.raises(RuntimeError):
        check_transition(State.RECEIVED, State.COMMITTED)
