"""A broker setting that names the nodes of a cluster: read from the file (a list) and the
environment (commas), refused when a node is no AMQP URL, and tried in turn by every
connection — the link and ``connect`` carry on with the next node when one does not answer.
(Nodes of a real cluster dying and being cut off: tests/lab/.)"""

from __future__ import annotations

import socket

import pytest

from listener_router import ConfigError, load_settings
from listener_router.broker import AmqpLink, broker_urls, connect, node_parameters, where


def _closed_port() -> int:
    """A port on loopback nobody listens on (connecting is refused at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_broker_url_takes_a_list_of_nodes_in_the_file_and_commas_in_the_environment(tmp_path):
    path = tmp_path / "chalk.toml"
    path.write_text('[broker]\nurl = ["amqp://u:p@mq1:5672/%2F", "amqp://u:p@mq2/%2F",\n'
                    '       "amqp://u:p@mq3:5673/%2F?heartbeat=5"]\n')
    settings = load_settings(path, env={})
    assert broker_urls(settings.broker_url) == [
        "amqp://u:p@mq1:5672/%2F", "amqp://u:p@mq2/%2F", "amqp://u:p@mq3:5673/%2F?heartbeat=5"]
    assert where(settings.broker_url) == "mq1:5672, mq2:5672, mq3:5673"
    params = node_parameters(settings.broker_url)
    assert [(p.host, p.port, p.heartbeat) for p in params] == [
        ("mq1", 5672, 30), ("mq2", 5672, 30), ("mq3", 5673, 5)]   # the URL's heartbeat wins
    env = load_settings(path, env={"CHALK_BROKER_URL": "amqp://a@x/%2F, amqp://a@y/%2F"})
    assert broker_urls(env.broker_url) == ["amqp://a@x/%2F", "amqp://a@y/%2F"]
    one = load_settings(env={"CHALK_BROKER_URL": "amqp://a@x/%2F"})
    assert broker_urls(one.broker_url) == ["amqp://a@x/%2F"]


def test_a_comma_inside_a_node_s_query_does_not_split_it():
    tls = ("amqps://u:p@mq1:5671/%2F?ssl_options={'ca_certs':'/etc/ca.pem',"
           "'server_hostname':'mq1.example.org'}")
    settings = load_settings(env={"CHALK_BROKER_URL": f"{tls}, amqp://u:p@mq2/%2F"})
    assert broker_urls(settings.broker_url) == [tls, "amqp://u:p@mq2/%2F"]


@pytest.mark.parametrize("value, says", [
    ('["amqp://u@mq1/%2F", "mq2:5672"]', "'mq2:5672' is not an AMQP URL"),
    ('[]', "must be an AMQP URL or a list of them"),
    ('["amqp://u@mq1/%2F", 5672]', "must be an AMQP URL or a list of them"),
    ('" , "', "names no broker"),
    ('"amqp://u@mq1/%2F, mq2:5672"', "'mq2:5672' is not an AMQP URL"),
])
def test_a_broker_list_with_a_node_that_is_no_amqp_url_is_refused_with_its_line(
        tmp_path, value, says):
    path = tmp_path / "chalk.toml"
    path.write_text(f"[broker]\nurl = {value}\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(path, env={})
    assert "chalk.toml:2" in str(caught.value)
    assert says in str(caught.value)


def test_connect_and_the_link_go_on_to_the_next_node_when_the_first_refuses(broker_url, broker,
                                                                            qname):
    dead = f"amqp://guest:guest@127.0.0.1:{_closed_port()}/%2F"
    nodes = f"{dead}, {broker_url}"
    conn = connect(nodes)
    try:
        assert conn.is_open
    finally:
        conn.close()
    queue = qname("nodes")
    broker.declare(queue)
    link = AmqpLink(nodes, consume=[queue]).start(wait=30)
    try:
        broker.publish(queue, b'{"id": "r1"}', message_id="m1")
        delivery = link.deliveries.get(timeout=10)
        assert delivery.message_id == "m1"
        link.ack([delivery])
        assert link._safe_url() == where(broker_url)   # the live node, not the first listed
    finally:
        link.stop()
    assert broker.depth(queue) == 0


def test_no_node_answering_names_every_node_tried():
    nodes = ", ".join(f"amqp://guest:guest@127.0.0.1:{_closed_port()}/%2F" for _ in range(2))
    with pytest.raises(ConnectionError) as caught:
        connect(nodes)
    assert where(nodes) in str(caught.value)
    assert "connection refused" in str(caught.value)
