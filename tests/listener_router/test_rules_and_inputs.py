"""Listener rules, router rules, bad input, the inbox and the dead-letter queue."""

from __future__ import annotations

import json

import pytest
from listener_router_helpers import records_of, stored_attributes, write_test_workflows

from blackboard import Blackboard
from listener_router import ListenerRule, RouterRule, push_records
from listener_router.broker import dlq_name
from listener_router.cli._admin import dlq_replay

pytestmark = [pytest.mark.broker, pytest.mark.spark]


@pytest.fixture
def test_workflows(tmp_path):
    return write_test_workflows(tmp_path / "workflows")


def test_listener_conditions_pick_the_rule_and_delete_removes_records(
        make_settings, qname, run_service, broker, test_workflows):
    queue = qname("in")
    rules = (ListenerRule(name="deletes", queue=queue, workflow="Counting",
                          condition="$operation = 'DELETE'", max_wait_ms=50),
             ListenerRule(name="adds", queue=queue, workflow="Counting",
                          condition="$operation = 'ADD'", max_wait_ms=50))
    settings = make_settings(rules=rules, workflows_dir=test_workflows, routers=())
    push_records(settings, queue, [{"id": f"d{i}", "attributes": {}} for i in range(6)])
    run_service(settings, until=lambda s: s["committed"] >= 6)
    push_records(settings, queue, [{"id": f"d{i}", "attributes": {}} for i in range(3)],
                 store=False, operation="DELETE")
    broker.publish(queue, json.dumps({"id": "d5"}), message_id="upd-1",
                   headers={"operation": "UPDATE"})
    broker.publish(queue, json.dumps({"id": "d5"}), message_id="ctl-1",
                   headers={"operation": "ADD", "note": "bell\x07"})  # XML cannot carry it
    stats = run_service(settings, until=lambda s: s["committed"] + s["dead"] >= 5)

    assert (stats["committed"], stats["dead"]) == (4, 1)
    after = stored_attributes(settings.blackboard_url, [f"d{i}" for i in range(6)], ["count"])
    assert after == {"d0": None, "d1": None, "d2": None, "d3": {"count": 1}, "d4": {"count": 1},
                     "d5": {"count": 2}}
    (props, _body), = broker.drain(dlq_name(queue))
    assert props.message_id == "upd-1"
    assert "no listener rule" in props.headers["x-chalk-error"]


def test_router_rules_by_condition_annotation_and_exchange(make_settings, qname, run_service,
                                                           broker, test_workflows):
    dest_a, dest_b, big, rest = qname("dest-a"), qname("dest-b"), qname("big"), qname("rest")
    # rule 1's condition is checked before the annotation: rb (n = 2) falls through
    routers = (RouterRule(use_next_destination=True, attributes=("n",),
                          condition="$record/Val[@key='n'] < 2"),
               RouterRule(queue=big, condition="$record/Val[@key='n'] > 100"),
               RouterRule(exchange="amq.direct", routing_key=rest))
    settings = make_settings("Routed", workflows_dir=test_workflows, routers=routers)
    broker.bind(rest, "amq.direct", rest)  # dest_a and dest_b exist nowhere yet
    data = [{"id": "ra", "attributes": {"dest": dest_a, "n": 1}},
            {"id": "rb", "attributes": {"dest": dest_b, "n": 2}},
            {"id": "big", "attributes": {"n": 500}},
            {"id": "small", "attributes": {"n": 5}}]
    push_records(settings, settings.listeners[0].queue, data)
    run_service(settings, until=lambda s: s["committed"] >= 4)

    assert records_of(broker.drain(dest_a)) == [{"id": "ra", "attributes": {"n": 1}}]
    assert records_of(broker.drain(big)) == [{"id": "big"}]
    assert sorted(r["id"] for r in records_of(broker.drain(rest))) == ["rb", "small"]


BAD_BODIES = {
    "not-json": b"{not json",
    "wrong-shape": b"[1, 2, 3]",
    "no-records": b'{"records": []}',
    "bad-id": b'{"records": [{"id": 17}]}',
    "too-many": json.dumps({"records": [{"id": f"x{i}"} for i in range(20)]}).encode(),
    "oversized": json.dumps({"id": "big", "attributes": {"blob": "x" * 5000}}).encode(),
}


def test_bad_input_is_dead_lettered_with_its_reason_and_the_rest_commits(
        make_settings, run_service, broker):
    settings = make_settings(max_records=10, max_body_bytes=4000)
    queue = settings.listeners[0].queue
    push_records(settings, queue, [{"id": "good", "attributes": {"text": "Fine  Text"}}])
    for name, body in BAD_BODIES.items():
        broker.publish(queue, body, message_id=name)
    stats = run_service(settings, until=lambda s: s["committed"] + s["dead"] >= 7)

    assert (stats["committed"], stats["dead"]) == (1, len(BAD_BODIES))
    dead = {props.message_id: props.headers["x-chalk-error"]
            for props, _ in broker.drain(dlq_name(queue))}
    assert set(dead) == set(BAD_BODIES)
    assert "not JSON" in dead["not-json"]
    assert "must be" in dead["wrong-shape"]
    assert "no records" in dead["no-records"]
    assert "bad id" in dead["bad-id"]
    assert "exceed the limit of 10" in dead["too-many"]
    assert "exceeds the limit of 4000 bytes" in dead["oversized"]
    assert stored_attributes(settings.blackboard_url, ["good"], ["text", "words"]) == {
        "good": {"text": "fine text", "words": 2}}


def test_a_message_delivered_twice_is_applied_once(make_settings, run_service, broker,
                                                   test_workflows):
    settings = make_settings("Counting", workflows_dir=test_workflows)
    queue, out = settings.listeners[0].queue, settings.routers[0].queue
    push_records(settings, queue, [{"id": "once", "attributes": {}}], store=True)
    body = json.dumps({"id": "once"})
    broker.publish(queue, body, message_id="same-id")  # delivered twice in one batch
    run_service(settings, until=lambda s: s["committed"] >= 2)
    broker.publish(queue, body, message_id="same-id")  # and once more later
    stats = run_service(settings, until=lambda s: s["duplicate"] >= 1)

    assert stats["duplicate"] == 1
    assert stored_attributes(settings.blackboard_url, ["once"], ["count"]) == {"once": {"count": 2}}  # push + same-id
    sources = sorted(props.headers["x-chalk-source"] for props, _ in broker.drain(out))
    assert len(sources) == 2 and "same-id" in sources


def test_dead_letters_replay_onto_their_queue_after_the_cause_is_fixed(
        make_settings, run_service, broker, test_workflows):
    settings = make_settings("Fragile", workflows_dir=test_workflows, max_retries=0)
    queue = settings.listeners[0].queue
    push_records(settings, queue, [{"id": "p1", "attributes": {"fail": True}}])
    run_service(settings, until=lambda s: s["dead"] >= 1)
    assert broker.depth(dlq_name(queue)) == 1
    with Blackboard.connect(settings.blackboard_url) as bb:  # fix the cause
        bb.load("p1")
        bb.set_literal("p1", "fail", False)
        bb.commit("p1")

    assert dlq_replay(settings, [queue]) == 1
    stats = run_service(settings, until=lambda s: s["committed"] >= 1)

    assert stats["committed"] == 1
    assert broker.depth(dlq_name(queue)) == 0
    assert stored_attributes(settings.blackboard_url, ["p1"], ["count"]) == {"p1": {"count": 1}}


class PoisonedRunner:
    """The real in-process runner, except that it raises on the driver for record 'poison'."""

    def __init__(self):
        import engine
        self.inner = engine.LocalRunner()
        self.calls = 0

    def run(self, workflow, blackboard, instances):
        self.calls += 1
        if any("poison" in ids for ids in instances):
            raise RecursionError("cannot encode record 'poison'")
        return self.inner.run(workflow, blackboard, instances)


def test_a_message_that_breaks_the_runner_is_isolated_and_the_rest_commit(
        make_settings, run_service, broker, test_workflows):
    settings = make_settings("Counting", workflows_dir=test_workflows, max_retries=1,
                             backoff_ms=(50,), batch_size=64, max_wait_ms=300)
    queue = settings.listeners[0].queue
    data = [{"id": f"g{i:02d}", "attributes": {}} for i in range(40)]
    data.insert(17, {"id": "poison", "attributes": {}})
    push_records(settings, queue, data)
    runner = PoisonedRunner()
    stats = run_service(settings, runner=runner,
                        until=lambda s: s["committed"] + s["dead"] >= len(data))

    assert (stats["committed"], stats["dead"], stats["retrying"]) == (40, 1, 1)
    assert runner.calls > 2  # the batch was halved until the poison stood alone
    (props, _), = broker.drain(dlq_name(queue))
    assert "runner failed: RecursionError" in props.headers["x-chalk-error"]
    counts = stored_attributes(settings.blackboard_url, [r["id"] for r in data], ["count"])
    assert counts.pop("poison") == {}
    assert all(v == {"count": 1} for v in counts.values())
