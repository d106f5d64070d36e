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
    assert settings.local_below is None  # unset: where the workflow's pipelets allow it
    assert settings.warm_workers is None  # unset: on for a local master
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
warm_workers = false
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
    assert settings.warm_workers is False


@pytest.mark.parametrize("text, message", [
    ("[blackboard]\nurl = 3\n", "[blackboard] url must be string, got 3"),
    ("[blackbord]\n", "unknown key(s) blackbord"),
    ("[engine]\nlocal_belo = 1\n", "[engine]: unknown key(s) local_belo; known: batch_timeout"),
    ("[[listener]]\nbatch_size = 0\n", "[[listener]] #1 batch_size must be 1 or more"),
    ("[[router]]\nattributes = ['a']\n", "give 'queue'"),
    ("[broker]\nqueue_type = 'stream'\n", "queue_type must be one of \"quorum\", \"classic\""),
    ("[engine]\ndataframe_forms = 'yes'\n", "dataframe_forms must be boolean"),
    ("[engine]\nwarm_workers = 1\n", "warm_workers must be boolean"),
    ("[engine]\nlocal_below = -1\n", "local_below must be 0 or more"),
    ("[spark]\nconf = 3\n", "[spark] conf must be a table"),
    ("[engine]\nlocal_below = 'often'\n", "local_below must be integer"),
    ("[[listener]]\nprefetch = 70000\n", "prefetch must be at most 65535"),
    ("not = toml = at all\n", "not valid TOML"),
    ("[node]\nheartbeat_seconds = 5\nttl_seconds = 5\n",
     "[node] ttl_seconds (5) must be more than heartbeat_seconds (5)"),
    ("[node]\nttl_seconds = 2\n", "ttl_seconds (2) must be more than heartbeat_seconds (5)"),
    ("[node]\nheartbeat_seconds = 0\n", "[node] heartbeat_seconds must be more than 0, got 0"),
    ("[node]\nheartbeat_seconds = '1s'\n", "[node] heartbeat_seconds must be number"),
    ("[node]\nheartbeat = 1\n", "unknown key(s) heartbeat"),
    ("[events]\ncommitted = 'yes'\n", "[events] committed must be boolean"),
    ("[events]\nrecord_committed = true\n", "unknown key(s) record_committed"),
    ("[events]\nexchange = 'amq.topic'\n", "must name a topic exchange of Chalk's own"),
    ("[events]\nexchange = ''\n", "must name a topic exchange of Chalk's own"),
    ("events = true\n", "[events] must be a table"),
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


def _other_value(kind, key, default):
    """A valid value of the setting's type that is not its default, as TOML text and as read."""
    import typing

    from listener_router._keys import _strip_none
    kind = _strip_none(kind)
    if key.name == "listen":
        return "127.0.0.1:9999", "127.0.0.1:9999"
    if key.section == "broker" and key.name == "url":   # checked: AMQP URLs only
        return "amqp://u@mq1/%2F, amqp://u@mq2/%2F", "amqp://u@mq1/%2F, amqp://u@mq2/%2F"
    if key.choices:
        value = next(c for c in key.choices if c != default)
        return value, value
    if kind is bool:
        return ("false" if default else "true"), not default
    if kind is int:  # None: unset (adaptive batch keys, local_below)
        return str((default or 0) + 7), (default or 0) + 7
    if kind is float:
        return str(default + 1.5), default + 1.5
    if kind is str:
        return "other-value", "other-value"
    if typing.get_origin(kind) is tuple:
        return '["7", "8"]' if typing.get_args(kind)[0] is str else "[7, 8]", \
            (("7", "8") if typing.get_args(kind)[0] is str else (7, 8))
    return '{ "spark.x" = 2, "b" = true }', {"spark.x": "2", "b": "true"}


def test_every_setting_can_be_set_from_the_environment():
    from listener_router import Settings
    from listener_router._keys import env_names, kind_of, rule_class
    from listener_router._settings import settings_keys

    defaults = Settings()
    for f, key in settings_keys():
        kind = kind_of(Settings, f.name)
        name = env_names(key)[0]
        if rule_class(kind) is not None:
            continue  # below
        text, expected = _other_value(kind, key, getattr(defaults, f.name))
        settings = load_settings(env={name: text})
        assert getattr(settings, f.name) == expected, name
    listeners = load_settings(env={"CHALK_LISTENER": '[{ queue = "q", workflow = "W" }, '
                                                      '{ name = "b", create_missing = true }]'})
    assert [(r.name, r.queue, r.workflow, r.create_missing) for r in listeners.listeners] == [
        ("listener1", "q", "W", False), ("b", "chalk.in", "Demo", True)]
    routers = load_settings(env={"CHALK_ROUTER": '[{ use_next_destination = true }]'})
    assert routers.routers[0].use_next_destination


def test_the_older_environment_names_still_work_and_env_wins_over_the_file(tmp_path):
    path = tmp_path / "chalk.toml"
    path.write_text('[node]\nname = "from-file"\n[engine]\nlocal_below = 3\n')
    older = {"CHALK_BLACKBOARD_URL": "sqlite:///o.db", "CHALK_BROKER_URL": "amqp://o/%2F",
             "CHALK_SPARK_MASTER": "local[1]", "CHALK_WORKFLOWS_DIR": "wf", "CHALK_NODE": "n1"}
    settings = load_settings(path, env={**older, "CHALK_ENGINE_LOCAL_BELOW": ""})
    assert (settings.blackboard_url, settings.broker_url, settings.spark_master,
            settings.workflows_dir, settings.node) == ("sqlite:///o.db", "amqp://o/%2F",
                                                      "local[1]", "wf", "n1")
    assert settings.local_below == 3  # an empty variable is unset


def test_a_bad_environment_value_names_the_variable():
    with pytest.raises(ConfigError) as caught:
        load_settings(env={"CHALK_ENGINE_LOCAL_BELOW": "many"})
    assert "CHALK_ENGINE_LOCAL_BELOW" in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        load_settings(env={"CHALK_BROKER_DELIVERY_LIMIT": "0"})
    assert "environment CHALK_BROKER_DELIVERY_LIMIT must be 1 or more" in str(caught.value)


def test_every_field_of_the_settings_is_declared_as_a_setting():
    import dataclasses

    from listener_router import Settings
    from listener_router._settings import settings_keys

    declared = {f.name for f, _key in settings_keys()}
    internal = {f.name for f in dataclasses.fields(Settings) if "internal" in f.metadata}
    assert declared | internal == {f.name for f in dataclasses.fields(Settings)}
    assert all(key.doc for _f, key in settings_keys())
