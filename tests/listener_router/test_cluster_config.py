"""Pure logic: the cluster's and the events' configuration ([node] heartbeat and
time-to-live, [events]) as read from the file and the environment (refused values:
test_config_and_messages.py)."""

from __future__ import annotations

from listener_router import load_settings
from listener_router.events import EventKind, Events, EventSettings


def test_heartbeat_ttl_and_events_default_to_five_thirty_and_all_off(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    settings = load_settings(env={})
    assert (settings.heartbeat_seconds, settings.ttl_seconds) == (5.0, 30.0)
    assert settings.events == EventSettings()
    assert settings.events.exchange == "chalk.events"
    assert settings.events.any is False
    events = Events(settings.events, "a")
    assert not any(events.enabled(kind) for kind in EventKind)


def test_node_and_events_are_read_from_the_file_and_the_environment(tmp_path):
    path = tmp_path / "chalk.toml"
    path.write_text("""
[node]
name = "m1"
heartbeat_seconds = 1
ttl_seconds = 5.5
[events]
exchange = "site.events"
committed = true
dead_lettered = true
""")
    settings = load_settings(path, env={})
    assert (settings.node, settings.heartbeat_seconds, settings.ttl_seconds) == ("m1", 1.0, 5.5)
    assert settings.events == EventSettings(exchange="site.events", committed=True,
                                            dead_lettered=True)
    overridden = load_settings(path, env={"CHALK_NODE_TTL_SECONDS": "10",
                                          "CHALK_EVENTS_DEAD_LETTERED": "false",
                                          "CHALK_EVENTS_TOPOLOGY": "true"})
    assert overridden.ttl_seconds == 10.0
    assert overridden.events == EventSettings(exchange="site.events", committed=True,
                                              topology=True)
    assert overridden.with_section("events", EventSettings()).events == EventSettings()
    assert settings.events.any is True
    events = Events(settings.events, settings.node)
    assert {kind for kind in EventKind if events.enabled(kind)} == {
        EventKind.COMMITTED, EventKind.DEAD_LETTERED}
    message = events.message(EventKind.COMMITTED, "W", {"record": "r1"}, key=("q", "m", "r1"))
    assert message is not None
    assert (message.exchange, message.routing_key) == ("site.events", "record.committed.W")
    assert message.headers == {"event.application": "m1", "event.topic": "record.committed"}
    assert events.message(EventKind.INVALIDATED, "W", {}, key=("x",)) is None
