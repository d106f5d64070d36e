"""The lab itself, and the broker cluster as Chalk sees it.

- Each host has its address and name; ``cut`` stops the traffic between two hosts
  (both directions) and nothing else, ``heal`` brings it back; ``delay`` makes a round
  trip to the broker 200 ms longer.
- The queues Chalk declares on the cluster (an input's dead-letter and retry queues
  too) are quorum queues with a replica on each of the three nodes; a journal's stream
  is replicated on the three as well.
"""

from __future__ import annotations

import subprocess
import time

import pytest
from _lab import LAB_SH, MQ, addr, broker_urls

from listener_router import ListenerRule, Settings
from listener_router.broker import connect, declare_all, dlq_name, retry_name
from listener_router.journal import JournalRule

pytestmark = [pytest.mark.slow]


def _reaches(host: str, peer: str, port: int) -> bool:
    """Whether a TCP connection from ``host`` to ``peer``:``port`` opens (or is refused:
    the peer answered) within 2 s."""
    done = subprocess.run(["bash", str(LAB_SH), "exec", host, "timeout", "2", "bash", "-c",
                           f"exec 3<>/dev/tcp/{addr(peer)}/{port}"],
                          capture_output=True, text=True)
    return done.returncode == 0 or "refused" in done.stderr


def test_each_host_has_its_name_and_address_and_a_cut_parts_two_hosts_only(lab):
    name = subprocess.run(["bash", str(LAB_SH), "exec", "c1", "hostname"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert name == "c1"
    assert _reaches("c1", "db", 5432) and _reaches("c1", "mq2", 5672)
    lab.cut("c1", "db")
    try:
        assert not _reaches("c1", "db", 5432)
        assert not _reaches("db", "c1", 22)      # both directions
        assert _reaches("c1", "mq2", 5672)       # nothing else
        assert _reaches("c2", "db", 5432)
    finally:
        lab.heal("c1")
    assert _reaches("c1", "db", 5432)


def test_a_delay_makes_each_round_trip_to_the_broker_longer_and_heal_ends_it(lab):
    script = ("import pika, time\n"
              f"c = pika.BlockingConnection(pika.URLParameters('amqp://guest:guest@{addr('mq1')}"
              ":5672/%2F'))\n"
              "ch = c.channel()\n"
              "t = time.monotonic()\n"
              "for _ in range(5): ch.queue_declare('lab.rtt', passive=False)\n"
              "print((time.monotonic() - t) / 5)\n"
              "ch.queue_delete('lab.rtt')\n"
              "c.close()\n")

    def round_trip() -> float:
        import sys
        out = subprocess.run(["bash", str(LAB_SH), "exec", "c3", sys.executable, "-c", script],
                             capture_output=True, text=True, check=True, timeout=60).stdout
        return float(out.strip())

    lab.delay("c3", "mq", ms=200)
    try:
        slow = round_trip()
    finally:
        lab.heal("c3")
    fast = round_trip()
    assert slow >= 0.2 > fast * 4, (slow, fast)


def test_the_queues_chalk_declares_are_quorum_queues_on_all_three_nodes(lab):
    tag = f"lab.q{int(time.time() * 1000) % 10**8}"
    settings = Settings(broker_url=broker_urls(), listeners=(
        ListenerRule(name="in", queue=f"{tag}.in", workflow="W", backoff_ms=(100, 200)),),
        routers=())
    conn = connect(settings.broker_url)
    try:
        declare_all(conn, settings)
        journal = JournalRule(name=tag, stream=f"{tag}.journal")
        conn.channel().queue_declare(journal.stream, durable=True,
                                     arguments=journal.stream_arguments())
    finally:
        conn.close()
    names = [f"{tag}.in", dlq_name(f"{tag}.in"), retry_name(f"{tag}.in", 1),
             retry_name(f"{tag}.in", 2), journal.stream]
    rows = {r["name"]: r for r in lab.queues("type", "members", "online")}
    for name in names:
        assert name in rows, f"{name} not declared"
        assert rows[name]["type"] == ("stream" if name == journal.stream else "quorum"), rows[name]
        assert sorted(rows[name]["members"]) == [f"rabbit@{h}" for h in MQ], rows[name]
