"""Partitions and lost machines, on the lab: each test pushes 5,000 records through a
2-stage chain (A → One → B → Two → C) run by three members on c1..c3 (heartbeat 1 s,
time-to-live 5 s), the same rules on each, PostgreSQL on db and the RabbitMQ cluster
on mq1..mq3, and does one thing to the machines while the records flow — or, with the
fault switched off, nothing, the same way.  Every test then holds the same goals:

- lost 0, doubled 0, stuck 0 (``_lab.Chain.verdict``);
- no record leased by two members at once (the lease audit);
- leader epochs strictly increasing;
- every member back in the established view within ``ttl_seconds`` + 10 s of the heal;

and reports the time to recover and the dip in throughput (records reaching C per
second, in 5-s windows, against the 8 s before the fault) to ``$CHALK_LAB_FIGURES``
(JSON lines; default: the session's temporary folder), where docs/cluster.md's table
comes from.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _lab import MEMBERS, SPARK_CONF, TTL, Chain, Lab, epochs_strictly_increase, report
from sqlalchemy import text

pytestmark = [pytest.mark.slow, pytest.mark.chaos]

START_AT = 800          # records through the chain before the fault
CUT_SECONDS = 30.0


def run(lab: Lab, tmp_path: Path, name: str, fault: bool,
        inject: Callable[[Chain], dict[str, Any]], *, before: Callable[[Chain], None] | None = None,
        **chain_options: Any) -> tuple[Chain, dict[str, Any]]:
    """One run: start, wait until START_AT records are through, ``inject`` the fault
    (when on; it returns what it saw and ends with the heal), finish, hold the goals."""
    chain = Chain(lab, tmp_path, **chain_options)
    try:
        if before is not None:
            before(chain)
        chain.run()
        chain.wait(lambda: chain.done() >= START_AT, 180, f"{START_AT} records through")
        fault_at = chain.mark("fault")
        seen = inject(chain) if fault else {}
        heal_at = chain.mark("heal")
        chain.wait_done(timeout=300)
        chain.wait(lambda: chain.view_back_after(heal_at) is not None, TTL + 15,
                   "every member back in the view after the heal")
        verdict = chain.finish()
        figures = chain.figures(fault_at, heal_at)
        view_back = chain.view_back_after(heal_at)
        epochs = chain.epochs()
        figures.update(seen, view_back_after=view_back, epochs=epochs,
                       fault_seconds=round(heal_at - fault_at, 1))
        report(name, {"fault": fault, **figures}, tmp_path)
        assert verdict.problems() == {}, f"{verdict.problems()}\n{chain.logs_tail()}"
        assert epochs_strictly_increase(epochs), epochs
        assert view_back is not None and view_back <= TTL + 10, \
            f"the view held every member again only {view_back} s after the heal"
        return chain, figures
    finally:
        chain.close()


FAULT = pytest.mark.parametrize("fault", [True, False], ids=["fault", "no-fault"])


@FAULT
def test_killing_the_node_that_leads_the_input_queue_then_the_next_loses_nothing(
        lab, tmp_path, fault):
    def inject(chain: Chain) -> dict[str, Any]:
        killed = []
        for _ in range(2):   # one at a time: the cluster keeps its majority
            leader = lab.leader_of(chain.a)
            lab.kill(leader)
            killed.append(leader)
            time.sleep(5)
            lab.start(leader)
            lab.wait_queue_members(chain.a, 3)
        return {"killed": killed}

    _chain, figures = run(lab, tmp_path, "kill the input queue's leader node, twice", fault,
                          inject, rate=80.0)
    if fault:
        assert len(figures["killed"]) == 2


@FAULT
def test_a_member_cut_off_from_postgresql_while_it_holds_leases_loses_nothing(
        lab, tmp_path, fault):
    def inject(chain: Chain) -> dict[str, Any]:
        with chain.engine.connect() as conn:
            held = dict(conn.execute(text(
                "SELECT owner, count(*) FROM chalk_leases GROUP BY owner")).all())
        member = max(MEMBERS, key=lambda m: held.get(m, 0))
        lab.cut(member, "db")
        time.sleep(CUT_SECONDS)
        lab.heal(member)
        return {"member": member, "leases_held": held.get(member, 0)}

    _chain, figures = run(lab, tmp_path, "cut a member from PostgreSQL 30 s", fault, inject)
    if fault:
        assert figures["leases_held"] > 0, "the member cut off held no lease"


@FAULT
def test_a_member_cut_off_from_every_broker_node_loses_nothing(lab, tmp_path, fault):
    def inject(chain: Chain) -> dict[str, Any]:
        lab.cut("c2", "mq")
        time.sleep(CUT_SECONDS)
        lab.heal("c2")
        return {"member": "c2"}

    run(lab, tmp_path, "cut a member from every broker node 30 s", fault, inject)


@FAULT
def test_the_leader_cut_off_from_the_other_members_keeps_leading(lab, tmp_path, fault):
    """Heartbeats go through the database: members that all reach it see each other alive
    whatever the network between them says.  The leader stays, the epoch stays, the view
    stays, and the work goes on."""
    def inject(chain: Chain) -> dict[str, Any]:
        leader, epoch, view = chain._row()
        assert leader in MEMBERS
        lab.cut(leader, *[m for m in MEMBERS if m != leader])
        time.sleep(CUT_SECONDS)
        during = chain._row()
        lab.heal(leader)
        assert (during[0], during[1]) == (leader, epoch), "the leader or its epoch changed"
        assert set(during[2]) == set(view) == set(MEMBERS), "the view changed"
        return {"member": leader, "epoch": epoch}

    _chain, figures = run(lab, tmp_path, "cut the leader from the other members 30 s", fault,
                          inject)
    if fault:
        assert [e for _leader, e in figures["epochs"]] == [figures["epoch"]]


@FAULT
def test_killing_a_spark_worker_host_mid_batch_reruns_its_tasks_elsewhere(lab, tmp_path, fault):
    def inject(chain: Chain) -> dict[str, Any]:
        lab.kill("w2")   # the worker, its executors and their Python workers: the host is gone
        time.sleep(10)
        lab.start("w2")
        return {"host": "w2"}

    run(lab, tmp_path, "kill -9 a Spark worker host mid-batch", fault, inject,
        spark={"conf": dict(SPARK_CONF)}, rate=100.0)


@FAULT
def test_delay_and_loss_between_the_members_and_the_broker_lose_nothing(lab, tmp_path, fault):
    def relay(chain: Chain) -> None:   # the members' broker connections go through the relay
        for member in MEMBERS:
            lab.delay(member, "mq", ms=0)

    def inject(chain: Chain) -> dict[str, Any]:
        for member in MEMBERS:
            lab.delay(member, "mq", ms=200, loss=5)
        time.sleep(60)
        lab.heal(*MEMBERS)
        return {"delay_ms": 200, "loss_percent": 5}

    try:
        run(lab, tmp_path, "200 ms delay, 5 % loss, members to broker, 60 s", fault, inject,
            before=relay)
    finally:
        lab.heal(*MEMBERS)
