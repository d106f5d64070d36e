"""Membership, the stable leader, and the leader's maintenance."""

from __future__ import annotations

import json
import time

import pytest
from listener_router_helpers import records_of
from sqlalchemy import create_engine, select, update

from listener_router import Service
from listener_router.broker import OutMessage
from listener_router.cluster import Membership
from listener_router.store import Outbox, ServiceStore
from listener_router.store._nodes import nodes
from listener_router.store._outbox import outbox


@pytest.mark.postgres
def test_the_first_live_member_leads_until_it_goes(pg_url, caplog):
    caplog.set_level("INFO", logger="listener_router.cluster._membership")
    first = Membership(ServiceStore.connect(pg_url), "node-a", interval=0.2, ttl=2.0).start()
    time.sleep(0.05)
    second = Membership(ServiceStore.connect(pg_url), "node-b", interval=0.2,
                        ttl=2.0).start()
    time.sleep(0.5)
    first.beat()
    assert [m.name for m in second.members()] == ["node-a", "node-b"]
    assert first.is_leader and not second.is_leader
    assert second.leader == "node-a"

    first._stop.set()  # node-a stops beating (as if killed): its heartbeat ages out
    first._thread.join()
    time.sleep(2.5)
    second.beat()
    assert second.is_leader
    assert "left node-a" in caplog.text
    second.stop()
    with create_engine(pg_url).connect() as conn:
        assert conn.execute(select(nodes.c.name)).scalars().all() == ["node-a"]  # b left cleanly


@pytest.mark.broker
def test_leader_maintenance_publishes_orphaned_outbox_rows(make_settings, spark, broker):
    settings = make_settings()
    out = settings.routers[0].queue
    with Service(settings, spark=spark) as service:
        engine = service.store.engine
        with engine.begin() as conn:
            Outbox.write(conn, [("lost-input", "q")], [("lost-input", OutMessage(
                routing_key=out, message_id="orphan-1", headers={"x-chalk-source": "lost-input"},
                body=json.dumps({"records": [{"id": "r1"}]}).encode()))])
            conn.execute(update(outbox).values(created_at=time.time() - 3600))
        assert service.membership.is_leader
        done = service.maintain()
        service.drain()
        with engine.connect() as conn:
            sent = conn.execute(select(outbox.c.sent_at)).scalar()
    assert done["orphans"] == 1
    assert sent is not None
    (props, body), = broker.drain(out)
    assert props.message_id == "orphan-1"
    assert records_of([(props, body)]) == [{"id": "r1"}]


@pytest.mark.broker
def test_a_closing_service_leaves_the_cluster_before_its_lanes_close(make_settings, spark):
    # Until its heartbeat stops, a closing member may take over leadership and hand the
    # view's event (an outbox batch) to the finish lane: a closed lane would leave it unsent.
    with Service(make_settings(), spark=spark) as service:
        beating_at_close = []
        for stage in (service._commit.input, service._finish.input):
            def close(stage=stage, close=stage.close):
                beating_at_close.append(service.membership._thread.is_alive())
                close()
            stage.close = close
    assert beating_at_close == [False, False]
