"""Per-record decisions in a running service: messages of several records over RabbitMQ and Spark.

The issue this answers: a schedule sent ``r-00001..3`` in one message, the ``<if>`` was
decided by ``r-00001`` alone, and ``r-00003`` was stored with ``priority = 'low'`` where its
own score said ``high``.  Now each record takes its own branch, the message is still one
(one job-log entry, committed as a whole), and router conditions send each record where
its own values say.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from listener_router_helpers import records_of, stored_attributes, write_config

from blackboard import Blackboard
from listener_router import load_settings
from listener_router.broker import dlq_name
from listener_router.cli import main
from listener_router.jobs import JobLogTables
from listener_router.store import ServiceStore

pytestmark = [pytest.mark.broker, pytest.mark.spark]

PIPELETS = '''
from pipelets import Pipelet


class Seen(Pipelet):
    """Appends to ``attribute`` the IDs its call got (which records came, in which order)."""

    parameters = frozenset({"attribute"})

    def process(self, blackboard, ids):
        for rid in ids:
            blackboard.add_literal(rid, self.config["attribute"], " ".join(ids))
        return ids
'''


def _seen(name: str, attribute: str) -> str:
    return (f'<extensionActivity><proc:invokePipelet name="{name}">'
            f'<proc:pipelet class="decisions_pipelets.Seen"/>'
            f'<proc:configuration><proc:param name="attribute">{attribute}</proc:param>'
            f'</proc:configuration></proc:invokePipelet></extensionActivity>')


def _set(value: str) -> str:
    return f"<assign><copy><from>'{value}'</from><to attribute=\"priority\"/></copy></assign>"


PRIORITIZE = f"""<?xml version="1.0"?>
<process name="Prioritize" xmlns="http://docs.oasis-open.org/wsbpel/2.0/process/executable"
         xmlns:proc="http://www.eclipse.org/smila/processor">
  <sequence>
    <if>
      <condition>$record/Val[@key='score'] &gt; 5</condition>
      <sequence>{_set('high')}{_seen('onHigh', 'branch')}</sequence>
      <elseif>
        <condition>$record/Val[@key='score'] &gt; 2</condition>
        <sequence>{_set('medium')}{_seen('onMedium', 'branch')}</sequence>
      </elseif>
      <else><sequence>{_set('low')}{_seen('onLow', 'branch')}</sequence></else>
    </if>
    <if>
      <condition>$record/Val[@key='score'] = 0</condition>
      {_seen('onZero', 'zero')}
    </if>
    <while>
      <condition>string-length($record/Val[@key='bar']) &lt; $record/Val[@key='score']</condition>
      <sequence>
        <assign><copy><from>concat($record/Val[@key='bar'], '#')</from><to attribute="bar"/></copy></assign>
        {_seen('lap', 'laps')}
      </sequence>
    </while>
    {_seen('after', 'after')}
  </sequence>
</process>
"""


@pytest.fixture
def decisions(tmp_path: Path, broker_url: str, sqlite_url: str, qname) -> dict[str, object]:
    """chalk.toml: Prioritize on ``in``, three router rules by priority, a schedule of r-00001..3."""
    folder = tmp_path / "workflows"
    folder.mkdir()
    (folder / "decisions_pipelets.py").write_text(PIPELETS)
    (folder / "prioritize.xml").write_text(PRIORITIZE)
    queues = {name: qname(name) for name in ("in", "high", "medium", "low", "tick")}
    routers = [{"queue": queues["high"], "condition": "$record/Val[@key='priority'] = 'high'",
                "attributes": ["priority"]},
               {"queue": queues["medium"], "condition": "$record/Val[@key='priority'] = 'medium'",
                "attributes": ["priority"]},
               {"queue": queues["low"], "attributes": ["priority"]}]
    config = write_config(tmp_path / "chalk.toml", db=sqlite_url, broker=broker_url, workflows=folder,
                          listeners=[{"name": "main", "queue": queues["in"], "workflow": "Prioritize",
                                      "max_wait_ms": 100}],
                          routers=routers)
    return {"config": config, "queues": queues, "url": sqlite_url}


def _job_log(url: str, queue: str) -> list:
    store = ServiceStore.connect(url)
    try:
        return store.tables(JobLogTables).entries(states=("committed",), queues=(queue,), limit=100)
    finally:
        store.close()


def test_a_pushed_three_record_message_decides_each_record_and_routes_each_by_its_own_value(
        decisions, run_service, broker, tmp_path: Path) -> None:
    """``chalk push --per-message 3``: one message, three branches of the if/elseif/else, a while each
    record leaves on its own, one commit, and each record routed to the queue of its priority."""
    config, queues = decisions["config"], decisions["queues"]
    data = tmp_path / "records.jsonl"
    scores = {"r-00001": 0, "r-00002": 3, "r-00003": 9}
    data.write_text("".join(json.dumps({"id": rid, "attributes": {"score": score, "bar": ""}}) + "\n"
                            for rid, score in scores.items()))
    assert main(["push", str(data), "--queue", queues["in"], "--per-message", "3",
                 "--config", str(config)]) == 0
    settings = load_settings(config)
    stats = run_service(settings, until=lambda s: s["committed"] >= 1)
    assert stats["committed"] == 1 and stats["dead"] == 0

    ids = list(scores)
    stored = stored_attributes(decisions["url"], ids)
    assert [stored[r]["priority"] for r in ids] == ["low", "medium", "high"]
    # each branch's pipelet got only its record; the records came back together, in order
    assert [stored[r]["branch"] for r in ids] == ["r-00001", "r-00002", "r-00003"]
    assert stored["r-00001"]["zero"] == "r-00001" and "zero" not in stored["r-00003"]
    assert [stored[r]["bar"] for r in ids] == ["", "###", "#########"]
    assert stored["r-00003"]["laps"][:4] == ["r-00002 r-00003"] * 3 + ["r-00003"]
    assert {stored[r]["after"] for r in ids} == {"r-00001 r-00002 r-00003"}

    (entry,) = _job_log(decisions["url"], queues["in"])
    assert entry.records == 3 and entry.outgoing == 3
    for priority, rid in (("low", "r-00001"), ("medium", "r-00002"), ("high", "r-00003")):
        routed = records_of(broker.drain(queues[priority]))
        assert routed == [{"id": rid, "attributes": {"priority": priority}}], priority
    assert broker.depth(dlq_name(queues["in"])) == 0


def test_a_fault_on_one_records_branch_fails_the_whole_message(decisions, run_service, broker,
                                                               tmp_path: Path) -> None:
    config, queues = decisions["config"], decisions["queues"]
    workflows = Path(load_settings(config).workflows_dir)
    (workflows / "prioritize.xml").write_text(PRIORITIZE.replace(
        f"<sequence>{_set('high')}{_seen('onHigh', 'branch')}</sequence>",
        '<throw faultName="tooHigh"/>'))
    text = config.read_text().replace('max_wait_ms = 100', 'max_wait_ms = 100\nmax_retries = 0')
    config.write_text(text)
    data = tmp_path / "records.jsonl"
    data.write_text("".join(json.dumps({"id": rid, "attributes": {"score": score, "bar": ""}}) + "\n"
                            for rid, score in (("f-1", 0), ("f-2", 9))))
    assert main(["push", str(data), "--queue", queues["in"], "--per-message", "2",
                 "--config", str(config)]) == 0
    stats = run_service(load_settings(config), until=lambda s: s["dead"] >= 1)
    assert stats["committed"] == 0 and stats["dead"] == 1
    (dead,) = broker.drain(dlq_name(queues["in"]))
    assert "tooHigh" in dead[0].headers["x-chalk-error"]
    assert [r["id"] for r in records_of([dead])] == ["f-1", "f-2"]
    stored = stored_attributes(decisions["url"], ["f-1", "f-2"])
    assert "priority" not in stored["f-1"]  # its low branch ran, but the message is one: nothing kept
    for priority in ("high", "medium", "low"):
        assert broker.depth(queues[priority]) == 0


def test_a_schedule_sending_three_ids_in_one_message_gives_r_00003_its_own_branch(
        decisions, run_service) -> None:
    """The issue's reproduction: a schedule with ``batch_size = 3`` over stored r-00001..3."""
    config, queues = decisions["config"], decisions["queues"]
    config.write_text(config.read_text() + f"""
[[schedule]]
name = "three"
every = "1s"
queue = "{queues['tick']}"
workflow = "Prioritize"
ids = ["r-00001", "r-00002", "r-00003"]
batch_size = 3
""")
    settings = load_settings(config)
    url = decisions["url"]
    with Blackboard.connect(url) as bb:  # stored records, as a schedule selects them
        for rid, score in (("r-00001", 0), ("r-00002", 3), ("r-00003", 9)):
            bb.load(rid)
            bb.set_attributes(rid, {"score": score, "bar": ""})
            bb.commit(rid)
    run_service(settings, until=lambda s: s["committed"] >= 1)
    ticked = _job_log(url, queues["tick"])
    assert ticked and all(e.records == 3 for e in ticked)
    stored = stored_attributes(url, ["r-00001", "r-00002", "r-00003"])
    assert [stored[r]["priority"] for r in ("r-00001", "r-00002", "r-00003")] == ["low", "medium", "high"]
