"""Topology on PostgreSQL: advertised properties, the ordered view, the stable leader,
topology events, fencing of a leader that was frozen, and failover of a gone member.

The members here are Membership objects beating by hand (no heartbeat
thread), and a member's heartbeat is made to lapse by ageing its row, so every
step is deterministic; the service processes' version is test_failover.py.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
from sqlalchemy import update

from blackboard import Blackboard
from listener_router import NotLeader
from listener_router.broker import OutMessage
from listener_router.cluster import (
    ExpiredLeases,
    LeaderTasks,
    Membership,
    TopologyEvent,
    TopologyEventType,
    TopologyListener,
)
from listener_router.events import EventKind, Events, EventSettings, EventsPlugin, event_id
from listener_router.store import ClusterState, Outbox, ServiceStore
from listener_router.store._nodes import nodes

pytestmark = pytest.mark.postgres

T = TopologyEventType


class Recorder(TopologyListener):
    def __init__(self) -> None:
        self.events: list[TopologyEvent] = []
        self.seen = threading.Condition()

    def handle_topology_event(self, event: TopologyEvent) -> None:
        with self.seen:
            self.events.append(event)
            self.seen.notify_all()

    def wait(self, count: int) -> list[TopologyEventType]:
        with self.seen:
            assert self.seen.wait_for(lambda: len(self.events) >= count, timeout=10), self.events
            return [e.type for e in self.events]


class Broken(TopologyListener):
    def handle_topology_event(self, event: TopologyEvent) -> None:
        raise RuntimeError("listener bug")


def member(url: str, name: str, **kwargs) -> Membership:
    return Membership(ServiceStore.connect(url), name, interval=0.2, ttl=5.0, **kwargs)


def _events_of(m: Membership, settings: EventSettings) -> EventsPlugin:
    """The events plug-in, writing ``settings``' kinds for ``m`` (as the service installs it)."""
    plugin = EventsPlugin(settings)
    plugin.events = Events(settings, m.name)
    m.emitter = plugin.emit
    if plugin.view_established is not None:
        m.on_view.append(plugin.view_established)
    return plugin


def lapse(m: Membership) -> None:
    """Make ``m``'s heartbeat older than the time-to-live (as if frozen that long)."""
    with m.store.engine.begin() as conn:
        conn.execute(update(nodes).where(nodes.c.name == m.name)
                     .values(heartbeat_at=nodes.c.heartbeat_at - 60))


def test_members_advertise_properties_in_a_stable_ordered_view(pg_url):
    a = member(pg_url, "a", properties={"version": "1.0", "queues": ["in"],
                                        "workflows": ["Counting"]})
    b = member(pg_url, "b", properties={"version": "1.0", "queues": ["in", "other"],
                                        "workflows": ["Counting", "Fragile"]})
    c = member(pg_url, "c")
    for m in (a, b, c):
        m.beat()
    a.beat()          # the leader establishes the view of the three
    for m in (b, c):
        m.beat()
    view = c.view
    assert view is not None and view.names == ("a", "b", "c")
    assert view.leader == "a" and a.is_leader and not b.is_leader and not c.is_leader
    assert view.local.name == "c" and view.member("a").leader
    assert view.member("b").queues == ("in", "other") and view.member("b").version == "1.0"
    assert [m.name for m in view.with_capability(workflow="Fragile")] == ["b"]
    assert [m.name for m in view.with_capability(queue="in")] == ["a", "b"]
    assert all(m.host and m.pid for m in view.members)

    lapse(b)          # b goes; c moves up one place; the leader stays
    a.beat()
    c.beat()
    assert c.view.names == ("a", "c") and c.view.leader == "a"
    b.beat()          # b comes back: at the end, as a new member
    a.beat()
    b.beat()
    assert b.view.names == ("a", "c", "b") and a.view.epoch == b.view.epoch


def test_listeners_hear_init_changing_changed_and_properties_changed(pg_url, caplog):
    caplog.set_level("INFO", logger="listener_router.cluster")
    heard, broken = Recorder(), Broken()
    a = member(pg_url, "a", listeners=[broken, heard])
    a.beat()
    assert heard.wait(1) == [T.TOPOLOGY_INIT]
    assert heard.events[0].new_view.names == ("a",) and heard.events[0].old_view is None
    b = member(pg_url, "b")
    b.beat()          # joined: live members differ from the view until the leader settles
    a.beat()
    assert heard.wait(3) == [T.TOPOLOGY_INIT, T.TOPOLOGY_CHANGING, T.TOPOLOGY_CHANGED]
    changed = heard.events[2]
    assert changed.old_view.names == ("a",) and changed.new_view.names == ("a", "b")
    assert changed.new_view.seq == changed.old_view.seq + 1

    b.advertise(workflows=["Counting"])
    b.beat()
    a.beat()
    assert heard.wait(4)[3] is T.PROPERTIES_CHANGED
    assert heard.events[3].new_view.member("b").workflows == ("Counting",)
    a.listeners.stop()
    assert "topology listener Broken failed on TOPOLOGY_INIT" in caplog.text
    assert "topology: 2 member(s) a, b, leader a" in caplog.text


def test_a_leader_frozen_past_the_ttl_is_refused_leader_work_and_rejoins_at_the_end(pg_url):
    a, b = member(pg_url, "a"), member(pg_url, "b")
    a.beat()
    b.beat()
    a.beat()
    assert a.is_leader and a.epoch == 1
    store = ServiceStore.connect(pg_url)
    expired = Blackboard(store.sql, owner="someone", lease_seconds=0.01)
    expired.load_many(["r1"])  # a lease that lapsed: the leader's ExpiredLeases would drop it
    time.sleep(0.05)
    tasks = LeaderTasks(a, [ExpiredLeases(store)])

    lapse(a)          # a is frozen past the time-to-live: b takes over
    b.beat()
    assert b.is_leader and b.epoch == 2
    assert a.is_leader  # a has not run since: it still believes it leads
    with pytest.raises(NotLeader), a.fenced() as tx:
        tx.connection.execute(update(nodes).values(pid=0))  # never runs
    assert not a.is_leader
    assert tasks.run_all() == {}  # refused, not done
    assert store.sql.lease_holders(["r1"])  # the lapsed lease is still there
    assert all(m.pid for m in store.nodes.all())

    a.beat()          # a wakes: it joins again, at the end, as a follower
    b.beat()
    a.beat()
    assert a.view.names == ("b", "a") and a.view.leader == "b" and not a.is_leader
    assert LeaderTasks(b, [ExpiredLeases(store)]).run_all() == {"expired_leases": 1}


def test_a_take_over_waits_for_the_leader_action_in_progress(pg_url):
    """The confirm locks the cluster row: the check and the action commit together."""
    a, b = member(pg_url, "a"), member(pg_url, "b")
    a.beat()
    b.beat()
    inside, release = threading.Event(), threading.Event()

    def leader_action() -> None:
        with a.fenced():
            inside.set()
            release.wait(10)

    action = threading.Thread(target=leader_action)
    action.start()
    assert inside.wait(10)
    took: list[int | None] = []
    lapse(a)
    take = threading.Thread(target=lambda: took.append(_take_over(b)))
    take.start()
    take.join(1.0)
    assert take.is_alive() and not took  # blocked behind the action's transaction
    release.set()
    action.join(10)
    take.join(10)
    assert took == [2]


def _take_over(m: Membership) -> int | None:
    with m.store.engine.begin() as conn:
        return ClusterState.take_over(conn, m.name, m.incarnation, 1)


def test_two_members_that_saw_the_leader_gone_cannot_both_take_over(pg_url):
    store = ServiceStore.connect(pg_url)
    with store.engine.begin() as conn:
        first = ClusterState.take_over(conn, "x", "1", 0)
    with store.engine.begin() as conn:
        second = ClusterState.take_over(conn, "y", "2", 0)
    assert (first, second) == (1, None)
    assert store.cluster.read().leader == "x"


def test_the_leader_fails_over_a_gone_member_at_once(pg_url):
    published: list[dict[str, list[OutMessage]]] = []
    a = member(pg_url, "a", publish=published.append)
    b, c = member(pg_url, "b"), member(pg_url, "c")
    for m in (a, b, c, a):
        m.beat()
    store = ServiceStore.connect(pg_url)
    Blackboard(store.sql, owner="b", lease_seconds=600).load_many(["rb1", "rb2"])
    Blackboard(store.sql, owner="c", lease_seconds=600).load_many(["rc1"])
    message = OutMessage(routing_key="q", body=b"{}", message_id="m-of-b")
    with store.engine.begin() as conn:
        Outbox.write(conn, [("in-1", "q")], [("in-1", message)], writer="b")
        Outbox.write(conn, [("in-2", "q")], [("in-2", message)], writer="c")

    lapse(b)
    a.beat()
    assert a.view.names == ("a", "c")
    assert set(store.sql.lease_holders(["rb1", "rb2", "rc1"])) == {"rc1"}  # c's stay
    (batches,) = published
    (messages,) = batches.values()
    assert [m.message_id for m in messages] == ["m-of-b"]


def test_the_leader_writes_topology_changed_with_a_deterministic_id(pg_url):
    published: list[dict[str, list[OutMessage]]] = []
    a = member(pg_url, "a", publish=published.append)
    _events_of(a, EventSettings(topology=True))
    a.beat()
    b = member(pg_url, "b", properties={"queues": ["in"]})
    b.beat()
    a.beat()
    events = [m for batch in published for ms in batch.values() for m in ms]
    assert [e.routing_key for e in events] == ["topology.changed", "topology.changed"]
    last = events[-1]
    body = json.loads(last.body)
    assert body["seq"] == 2 and body["leader"] == "a" and body["joined"] == ["b"]
    assert [m["name"] for m in body["members"]] == ["a", "b"]
    assert body["members"][1]["queues"] == ["in"]
    assert last.headers["event.application"] == "a" and last.exchange == "chalk.events"
    assert last.message_id == event_id(EventKind.TOPOLOGY_CHANGED, body["cluster_id"], "2")


def test_a_member_restarted_under_its_name_is_reported_as_restarted(pg_url, caplog):
    caplog.set_level("INFO", logger="listener_router.cluster._membership")
    published: list[dict[str, list[OutMessage]]] = []
    sent = ServiceStore.connect(pg_url).outbox

    def publish(batches: dict[str, list[OutMessage]]) -> None:   # as the finish stage does
        published.append(batches)
        sent.mark_sent(list(batches))

    a = member(pg_url, "a", publish=publish)
    _events_of(a, EventSettings(topology=True))
    b = member(pg_url, "b")
    for m in (a, b, a):
        m.beat()
    b.stop()                                 # a clean stop, then the same name again
    b_again = member(pg_url, "b")
    b_again.beat()
    a.beat()
    b_again.stop()
    a.stop()                                 # the leader too: it comes back alone
    a_again = member(pg_url, "a", publish=publish)
    _events_of(a_again, EventSettings(topology=True))
    a_again.beat()
    bodies = [json.loads(m.body) for batch in published for ms in batch.values() for m in ms]
    assert [(e["left"], e["joined"], e["restarted"]) for e in bodies[-2:]] == [
        ([], [], ["b"]), (["b"], [], ["a"])]
    assert not [r for r in caplog.records if r.levelname == "WARNING"], caplog.text
    assert "b restarted (a new incarnation; nothing of the earlier one was left" in caplog.text
    assert "failover of" not in caplog.text


def test_the_scheduled_job_example_emits_job_finished_only_while_leading(pg_url):
    from test_docs import DOCS, block_with

    namespace: dict = {}
    exec(compile(block_with(DOCS / "internals.md", "python", "class Nightly"), "nightly", "exec"),
         namespace)
    published: list[dict[str, list[OutMessage]]] = []
    a = member(pg_url, "a", publish=published.append)
    _events_of(a, EventSettings(job_finished=True))
    b = member(pg_url, "b")
    a.beat()
    b.beat()
    a.beat()
    assert LeaderTasks(a, [namespace["Nightly"]()]).run_all() == {"nightly": 1}
    (event,) = [m for batch in published for ms in batch.values() for m in ms
                if m.routing_key.startswith("job.")]
    body = json.loads(event.body)
    assert event.routing_key == "job.finished.nightly" and body["outcome"] == "ok"
    assert event.message_id == event_id(EventKind.JOB_FINISHED, "nightly", body["day"])

    lapse(a)          # frozen past the ttl: b takes over; a's job is refused, nothing sent
    b.beat()
    published.clear()
    assert LeaderTasks(a, [namespace["Nightly"]()]).run_all() == {}
    assert published == []
