"""Dead letters: browsing them redelivers nothing, so a delivery limit never drops one."""

from __future__ import annotations

import pika
import pytest

from listener_router.broker import dlq_name
from listener_router.cli import main

pytestmark = pytest.mark.broker


def _config(tmp_path, settings):
    config = tmp_path / "chalk.toml"
    config.write_text(f'[blackboard]\nurl = "{settings.blackboard_url}"\n'
                      f'[broker]\nurl = "{settings.broker_url}"\n'
                      f'[[listener]]\nname = "t"\nqueue = "{settings.listeners[0].queue}"\n')
    return config


def test_browsing_dead_letters_never_raises_their_delivery_count(tmp_path, capsys, monkeypatch,
                                                                 broker, declare, make_settings):
    settings = make_settings()
    queue = settings.listeners[0].queue
    # A dead-letter queue with a delivery limit of 2 (set by a policy, say): a message it
    # gives back three times is gone.
    conn = pika.BlockingConnection(pika.URLParameters(settings.broker_url))
    conn.channel().queue_declare(dlq_name(queue), durable=True, arguments={
        "x-queue-type": "quorum", "x-delivery-limit": 2})
    conn.close()
    declare(settings)
    broker.publish(dlq_name(queue), b'{"id": "x"}', message_id="dead-1",
                   headers={"x-chalk-error": "it broke", "x-chalk-attempts": 4,
                            "x-chalk-queue": queue, "operation": "UPDATE"})
    config = _config(tmp_path, settings)
    monkeypatch.setenv("COLUMNS", "200")

    for _ in range(4):
        assert main(["dlq", "list", "--config", str(config)]) == 0
        listed = capsys.readouterr().out
        assert "dead-1" in listed and "it broke" in listed
        assert main(["dlq", "show", "dead-1", "--config", str(config)]) == 0
        assert '"x"' in capsys.readouterr().out

    assert main(["dlq", "replay", "--config", str(config)]) == 2        # all of them: --all
    assert "--all" in capsys.readouterr().err
    assert main(["dlq", "replay", "--all", "--config", str(config)]) == 2   # no tty to ask
    assert "--yes" in capsys.readouterr().err
    assert main(["dlq", "replay", "--all", "--yes", "--config", str(config)]) == 0
    assert "replayed 1" in capsys.readouterr().out
    (props, body), = broker.drain(queue)
    assert (props.message_id, body) == ("dead-1", b'{"id": "x"}')
    headers = dict(props.headers)
    # the input queue (quorum) counts afresh: 0 on this first delivery; no reason, no attempts;
    # the replay is counted (the job log tells the attempts after it from those before)
    assert headers.pop("x-delivery-count", 0) == 0
    assert len(headers.pop("x-chalk-signature")) == 64     # the cluster's: it is Chalk's count
    assert headers == {"operation": "UPDATE", "x-chalk-replays": 1}
    assert main(["dlq", "list", "--config", str(config)]) == 0
    assert "dead-1" not in capsys.readouterr().out


def test_dlq_show_of_an_unknown_id_says_so_and_exits_1(tmp_path, capsys, declare, make_settings):
    settings = make_settings()
    declare(settings)
    code = main(["dlq", "show", "no-such-id", "--config", str(_config(tmp_path, settings))])
    assert code == 1
    err = capsys.readouterr().err
    assert "no dead letter with message ID 'no-such-id'" in err
    assert dlq_name(settings.listeners[0].queue) in err


def test_a_body_nested_200000_deep_leaves_dlq_list_and_show_working(
        tmp_path, capsys, monkeypatch, broker, declare, make_settings):
    settings = make_settings()
    queue = settings.listeners[0].queue
    declare(settings)
    broker.publish(dlq_name(queue), b"[" * 200_000, message_id="nested-1",
                   headers={"x-chalk-error": "body is not JSON"})
    broker.publish(dlq_name(queue), b'{"id": "fine"}', message_id="fine-1",
                   headers={"x-chalk-error": "it broke"})
    config = _config(tmp_path, settings)
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["dlq", "list", "--config", str(config)]) == 0
    listed = capsys.readouterr().out
    assert "nested-1" in listed and "fine-1" in listed
    assert main(["dlq", "show", "--config", str(config)]) == 0
    shown = capsys.readouterr().out
    assert "unreadable body (nested too deeply" in shown and '"fine"' in shown


def test_a_short_message_id_is_matched_literally_not_as_a_pattern(sqlite_url):
    from listener_router.dead_letters import DeadLetter, DeadLetters, message_id_of
    from listener_router.store import ServiceStore

    store = ServiceStore.connect(sqlite_url)
    try:
        table = store.tables(DeadLetters)
        table.keep([DeadLetter("q", mid, "e", 1, "", {}, b"{}") for mid in ("a_1", "ab1", "a%2")])
        assert message_id_of(table, ["q"], "a_") == "a_1"       # _ is no wildcard
        assert message_id_of(table, ["q"], "a%") == "a%2"       # nor is %
        assert message_id_of(table, ["q"], "x' OR '1'='1") == "x' OR '1'='1"   # no such
    finally:
        store.close()
