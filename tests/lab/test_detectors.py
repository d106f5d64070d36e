"""The fault tests' detectors fail on a planted error: one run of the chain on the lab in
which a thief takes a message off A (a record lost), a stray message names a record a
second time under a new message ID (a record doubled), and an intruder takes over a
lease a member holds (a record leased twice at once) — each detector names exactly its
planted record, and nothing else is found.  The lease audit's logic is also checked on
its own, with and without an overlap."""

from __future__ import annotations

import json
import time

import pytest
from _lab import Chain, broker_urls, double_leases
from sqlalchemy import text

from listener_router.broker import AmqpLink, OutMessage, connect, publish_confirmed

pytestmark = [pytest.mark.slow]


def test_the_lease_audit_finds_a_lease_taken_while_its_holder_still_held_it():
    clean = [("I", "r1", "c1", None, 10.0, None, 1.0),
             ("U", "r1", "c1", "c1", 20.0, 10.0, 5.0),     # renewed
             ("D", "r1", None, "c1", None, 20.0, 6.0),     # committed
             ("I", "r1", "c2", None, 30.0, None, 7.0),
             ("U", "r1", "c3", "c2", 40.0, 30.0, 31.0)]    # c2's lease had expired
    assert double_leases(clean) == []
    stolen = [("I", "r2", "c1", None, 10.0, None, 1.0),
              ("U", "r2", "c2", "c1", 20.0, 10.0, 4.0)]    # c1 held it until 10
    found = double_leases(stolen)
    assert len(found) == 1
    assert found[0].startswith("r2: taken by c2 at 4.000 while c1 held it until 10.000")


def test_each_detector_names_its_planted_error(lab, tmp_path):
    chain = Chain(lab, tmp_path, records=300, rate=60.0)
    planted: dict[str, str] = {}

    def plant() -> None:
        conn = connect(broker_urls())
        try:
            # A thief: one message of A taken and acknowledged, never processed.
            method, _props, body = conn.channel().basic_get(chain.a, auto_ack=True)
            assert method is not None
            planted["lost"] = json.loads(body)["records"][0]["id"]
        finally:
            conn.close()
        # A stray message: a record named again under a new message ID.
        planted["doubled"] = next(rid for rid in chain.ids if rid != planted["lost"])
        link = AmqpLink(broker_urls(), consume=()).start()
        try:
            publish_confirmed(link, [OutMessage(
                routing_key=chain.a, message_id="stray-1",
                body=json.dumps({"records": [{"id": planted["doubled"]}]}).encode())], timeout=30)
        finally:
            link.stop()

    try:
        chain.run(plant)
        lost, doubled = planted["lost"], planted["doubled"]
        # An intruder: a lease a member holds now, taken over for 3 s.
        def intrude() -> str | None:
            with chain.engine.begin() as db:
                return db.execute(text(
                    "UPDATE chalk_leases SET owner = 'intruder', "
                    "expires_at = extract(epoch from clock_timestamp()) + 3 "
                    "WHERE record_id = (SELECT record_id FROM chalk_leases WHERE owner <> "
                    "'intruder' AND expires_at > extract(epoch from clock_timestamp()) + 1 "
                    "LIMIT 1) RETURNING record_id")).scalar()
        leased = chain.wait(intrude, 60, "a lease held by a member, to take over")
        chain.wait(lambda: chain.done() >= chain.count, 180, "the records through the chain")
        time.sleep(2)   # the doubled record's second trip
        verdict = chain.finish()
    finally:
        chain.close()
    assert [line.split(":")[0] for line in verdict.lost] == [lost]
    assert [line.split(":")[0] for line in verdict.doubled] == [doubled]
    assert [line.split(":")[0] for line in verdict.double_leases] == [leased]
    assert "taken by intruder" in verdict.double_leases[0]
    assert verdict.stuck == []
