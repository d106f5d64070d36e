"""Headers Chalk writes are Chalk's, on a real service and RabbitMQ: ``x-chalk-*`` headers a
publisher sets are dropped on consume (its message gets every retry), and a message a
publisher puts into ``Q.dlq`` cannot pick the queue a replay goes to; what the service
signs with the cluster's key keeps counting."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from listener_router_helpers import write_test_workflows

from listener_router._signing import SIGNATURE_HEADER, HeaderSigner
from listener_router.broker import dlq_name
from listener_router.dead_letters import dead_letters, replay
from listener_router.jobs import JobLogTables
from listener_router.store import ServiceStore

pytestmark = [pytest.mark.slow]


def test_a_publisher_cannot_skip_the_retries_or_pick_the_replay_queue(
        make_settings, run_service, broker, declare, qname, tmp_path):
    workflows = write_test_workflows(tmp_path / "workflows")
    settings = replace(make_settings("Fragile", workflows_dir=workflows, max_retries=2,
                                     backoff_ms=(50,), batch_size=5), runner="local")
    queue, victim = settings.listeners[0].queue, qname("victim")
    declare(settings)
    broker.declare(victim)
    forged = {"x-chalk-attempts": 99, "x-chalk-queue": victim, "x-chalk-error": "fine",
              SIGNATURE_HEADER: "0" * 64}
    broker.publish(queue, json.dumps({"id": "f-1", "attributes": {"fail": True}}),
                   message_id="forged-1", headers=forged)
    # straight into the dead-letter queue, naming another queue to be replayed to
    broker.publish(dlq_name(queue), json.dumps({"id": "f-2"}), message_id="planted-1",
                   headers={"x-chalk-queue": victim, "x-chalk-error": "replay me",
                            "x-chalk-attempts": 1})
    stats = run_service(settings, until=lambda s: s["dead"] >= 1, idle_exit=60)

    # the forged attempts were dropped: the message had its three attempts
    assert stats["retrying"] == 2 and stats["dead"] == 1
    letters = {d.message_id: d for d in dead_letters(settings, [queue])}
    assert letters["forged-1"].attempts == 3
    assert "after 3 attempt(s)" in letters["forged-1"].error
    store = ServiceStore.connect(settings.blackboard_url)
    try:
        log = store.tables(JobLogTables)
        steps = [e.state for e in log.entries(queues=(queue,), message_id="forged-1")]
        assert steps.count("retrying") == 2
        # what the service wrote is signed with the cluster's key, and holds
        signer = HeaderSigner.of(store)
    finally:
        store.close()
    kept = letters["forged-1"].headers
    assert signer.holds(kept, "forged-1", letters["forged-1"].body)
    # the planted letter is kept, its words marked, its queue its dead-letter queue's
    planted = letters["planted-1"]
    assert planted.queue == queue and planted.attempts == 0
    assert planted.error.startswith("(not written by this cluster")
    assert replay(settings, [queue], "planted-1") == 1
    assert broker.depth(victim) == 0
    (props, _body), = broker.drain(queue)
    assert props.message_id == "planted-1"
    assert HeaderSigner.holds(signer, dict(props.headers), "planted-1", _body)


def test_a_signature_holds_for_its_message_only():
    signer, other = HeaderSigner(b"k" * 32), HeaderSigner(b"o" * 32)
    headers = signer.signed({"operation": "ADD", "x-chalk-attempts": 2}, "m-1", b"{}")
    assert signer.holds(headers, "m-1", b"{}")
    assert not signer.holds(headers, "m-2", b"{}")               # another message
    assert not signer.holds(headers, "m-1", b'{"id": "x"}')      # another body
    assert not other.holds(headers, "m-1", b"{}")                # another cluster
    assert not signer.holds({**headers, "x-chalk-attempts": 0}, "m-1", b"{}")
    assert signer.trusted({**headers, "x-chalk-attempts": 0}, "m-1", b"{}") == \
        {"operation": "ADD"}
    assert signer.trusted({"operation": "ADD"}, None, b"") == {"operation": "ADD"}
