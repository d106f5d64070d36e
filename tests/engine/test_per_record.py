"""Per-record decisions: a message's records each take their own way, and the message stays one.

Run on the in-process runner (the interpreter a Spark partition runs).
Each instance here is one message with several records.
"""

from __future__ import annotations

from typing import Any

import pytest
from engine_helpers import pipelet, records, snapshot

from blackboard import Blackboard
from engine import InstanceResult, LocalRunner, SparkRunner, Workflow
from engine._instances import Splits


def run(wf: Workflow, batch: dict[str, dict[str, Any]], instances: list[list[str]] | None = None
        ) -> tuple[list[InstanceResult], Blackboard]:
    """Run ``batch`` as one message (or as ``instances``)."""
    bb = Blackboard.local()
    records(bb, batch)
    return LocalRunner().run(wf, bb, instances or [list(batch)]), bb


def attr(bb: Blackboard, rid: str, name: str = "trail") -> Any:
    return bb.get_attributes(rid).get(name)


def mark(value: str, attribute: str = "trail") -> str:
    return pipelet(f"mark_{value}_{attribute}".replace("-", "_"), "Mark", value=value, attribute=attribute)


def order(attribute: str = "order", name: str | None = None) -> str:
    return pipelet(name or f"order_{attribute}", "Order", attribute=attribute)


SCORES = {"r1": {"score": 0}, "r2": {"score": 3}, "r3": {"score": 9}}

THREE_WAYS = f"""
    <sequence>
      <if>
        <condition>$record/Val[@key='score'] &gt; 5</condition>
        <sequence>{mark('high', 'priority')}{order(name='high')}</sequence>
        <elseif>
          <condition>$record/Val[@key='score'] &gt; 2</condition>
          <sequence>{mark('medium', 'priority')}{order(name='medium')}</sequence>
        </elseif>
        <else><sequence>{mark('low', 'priority')}{order(name='low')}</sequence></else>
      </if>
      {order(name='after')}
    </sequence>"""


@pytest.fixture
def split_count(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many Splits the interpreter made (none when every record decides the same)."""
    made = [0]
    original = Splits.__init__

    def counting(self: Splits) -> None:
        made[0] += 1
        original(self)

    monkeypatch.setattr(Splits, "__init__", counting)
    return made


# -- if / elseif / else ----------------------------------------------------------------------
def test_each_record_of_a_message_takes_its_own_branch_and_they_rejoin_in_order(
        make_workflow: Any, split_count: list[int]) -> None:
    (result,), bb = run(make_workflow(THREE_WAYS), SCORES)
    assert result.ok and result.result_ids == ["r1", "r2", "r3"]
    assert [attr(bb, r, "priority") for r in ("r1", "r2", "r3")] == ["low", "medium", "high"]
    # each branch's pipelet got only its records; the one after the if got all, in order
    assert [attr(bb, r, "order") for r in ("r1", "r2", "r3")] == [
        ["r1", "r1 r2 r3"], ["r2", "r1 r2 r3"], ["r3", "r1 r2 r3"]]
    assert split_count == [1]


def test_records_that_agree_and_one_record_messages_make_no_parts(
        make_workflow: Any, split_count: list[int]) -> None:
    wf = make_workflow(THREE_WAYS)
    results, bb = run(wf, {"a": {"score": 9}, "b": {"score": 7}, "c": {"score": 1}}, [["a", "b"], ["c"]])
    assert all(r.ok for r in results)
    assert attr(bb, "a", "order") == ["a b", "a b c"] and attr(bb, "c", "order") == ["c", "a b c"]
    assert split_count == [0]


def test_records_of_several_messages_share_each_branch_call(make_workflow: Any) -> None:
    wf = make_workflow(THREE_WAYS)
    batch = {"a1": {"score": 9}, "a2": {"score": 0}, "b1": {"score": 8}, "b2": {"score": 1}}
    results, bb = run(wf, batch, [["a1", "a2"], ["b1", "b2"]])
    assert [r.result_ids for r in results] == [["a1", "a2"], ["b1", "b2"]]
    assert attr(bb, "a1", "order") == ["a1 b1", "a1 a2 b1 b2"]
    assert attr(bb, "b2", "order") == ["a2 b2", "a1 a2 b1 b2"]


def test_records_without_an_else_skip_the_if_and_come_back(make_workflow: Any) -> None:
    wf = make_workflow(f"""
        <sequence>
          <if><condition>$record/Val[@key='score'] &gt; 2</condition>{mark('big')}</if>
          {order()}
        </sequence>""")
    (result,), bb = run(wf, SCORES)
    assert result.ok and [attr(bb, r) for r in ("r1", "r2", "r3")] == [None, "big", "big"]
    assert attr(bb, "r1", "order") == "r1 r2 r3"


def test_nested_decisions_split_a_part_again(make_workflow: Any) -> None:
    wf = make_workflow(f"""
        <sequence>
          <if><condition>$record/Val[@key='score'] &gt; 2</condition>
            <if><condition>$record/Val[@key='score'] &gt; 5</condition>{mark('high')}
              <else>{mark('medium')}</else></if>
            <else>{mark('low')}</else>
          </if>
          {order()}
        </sequence>""")
    (result,), bb = run(wf, SCORES)
    assert [attr(bb, r) for r in ("r1", "r2", "r3")] == ["low", "medium", "high"]
    assert attr(bb, "r2", "order") == "r1 r2 r3"


def test_records_a_branch_adds_come_back_after_the_record_they_came_from(make_workflow: Any) -> None:
    wf = make_workflow(f"""
        <sequence>
          <if><condition>$record/Val[@key='score'] = 3</condition>{pipelet('split', 'SplitInTwo')}</if>
          {order()}
        </sequence>""")
    (result,), bb = run(wf, SCORES)
    assert result.ok and result.result_ids == ["r1", "r2#a", "r2#b", "r3"]
    assert attr(bb, "r3", "order") == "r1 r2#a r2#b r3"


# -- the bulk forms --------------------------------------------------------------------------
def test_records_and_smila_record_1_are_decided_once_for_the_message(make_workflow: Any,
                                                                      split_count: list[int]) -> None:
    anyone = make_workflow(f"""
        <if><condition>$records/Val[@key='score'] &gt; 5</condition>{mark('some-high')}
          <else>{mark('none-high')}</else></if>""", name="Any")
    first = make_workflow(f"""
        <if><condition>$request.records/rec:Record[1]/rec:Val[@key='score'] &gt; 5</condition>{mark('first-high')}
          <else>{mark('first-low')}</else></if>""", name="First")
    counted = make_workflow(f"""
        <if><condition>count($records) &gt; 2</condition>{mark('bulk')}<else>{mark('small')}</else></if>""",
                            name="Counted")
    _, bb = run(anyone, SCORES)
    assert {attr(bb, r) for r in SCORES} == {"some-high"}
    _, bb = run(first, SCORES)
    assert {attr(bb, r) for r in SCORES} == {"first-low"}
    _, bb = run(counted, SCORES)
    assert {attr(bb, r) for r in SCORES} == {"bulk"}
    assert split_count == [0]


def test_a_mixed_condition_is_per_record_with_records_meaning_all_of_them(make_workflow: Any) -> None:
    wf = make_workflow(f"""
        <if><condition>$record/Val[@key='score'] &gt; 2 and count($records) &gt; 2</condition>{mark('yes')}
          <else>{mark('no')}</else></if>""")
    _, bb = run(wf, SCORES)
    assert [attr(bb, r) for r in ("r1", "r2", "r3")] == ["no", "yes", "yes"]
    _, bb = run(wf, {"r2": {"score": 3}, "r3": {"score": 9}})
    assert [attr(bb, r) for r in ("r2", "r3")] == ["no", "no"]
    above_mean = make_workflow(f"""
        <if><condition>$record/Val[@key='score'] &gt; sum($records/Val[@key='score']) div count($records)</condition>
          {mark('above')}</if>""", name="Mean")
    _, bb = run(above_mean, SCORES)
    assert [attr(bb, r) for r in ("r1", "r2", "r3")] == [None, None, "above"]


def test_bpel_variables_stay_one_per_message(make_workflow: Any) -> None:
    wf = make_workflow("""
        <variables><variable name="seen" type="xsd:string"/></variables>
        <sequence>
          <assign><copy><from>'start'</from><to variable="seen"/></copy></assign>
          <if><condition>$record/Val[@key='score'] &gt; 2</condition>
            <assign><copy><from>concat($seen, '+big')</from><to variable="seen"/></copy></assign>
            <else><assign><copy><from>concat($seen, '+small')</from><to variable="seen"/></copy></assign></else>
          </if>
          <assign><copy><from>$seen</from><to attribute="seen"/></copy></assign>
        </sequence>""")
    (result,), bb = run(wf, SCORES)
    assert result.ok, result.error
    # one variable for the message: each branch ran once, in document order
    assert {attr(bb, r, "seen") for r in SCORES} == {"start+big+small"}


# -- loops -----------------------------------------------------------------------------------
def test_a_record_leaves_a_while_when_its_own_condition_turns_false(make_workflow: Any) -> None:
    wf = make_workflow(f"""
        <sequence>
          <while><condition>not($record/Val[@key='counter']) or $record/Val[@key='counter'] &lt; $record/Val[@key='target']</condition>
            <sequence>{pipelet('inc', 'Increment')}{order('in')}</sequence>
          </while>
          {order('after')}
        </sequence>""")
    (result,), bb = run(wf, {"a": {"target": 3}, "b": {"target": 1}, "c": {"target": 2}})
    assert result.ok and result.result_ids == ["a", "b", "c"]
    assert [attr(bb, r, "counter") for r in "abc"] == [3, 1, 2]
    assert attr(bb, "a", "in") == ["a b c", "a c", "a"]
    assert attr(bb, "a", "after") == "a b c"


def test_repeat_until_keeps_the_records_whose_condition_is_not_yet_met(make_workflow: Any) -> None:
    wf = make_workflow(f"""
        <repeatUntil><sequence>{pipelet('inc', 'Increment')}{order('in')}</sequence>
          <condition>$record/Val[@key='counter'] &gt;= 2</condition>
        </repeatUntil>""")
    (result,), bb = run(wf, {"a": {}, "b": {"counter": 7}})
    assert result.ok and [attr(bb, r, "counter") for r in "ab"] == [2, 8]
    assert attr(bb, "a", "in") == ["a b", "a"]


def test_a_counted_for_each_runs_each_records_own_range(make_workflow: Any) -> None:
    wf = make_workflow(f"""
        <sequence>
          <forEach counterName="i" parallel="no">
            <startCounterValue>1</startCounterValue>
            <finalCounterValue>$record/Val[@key='pages']</finalCounterValue>
            <scope><sequence>
              <assign><copy><from>concat($record/Val[@key='read'], $i)</from><to attribute="read"/></copy></assign>
              {order('in')}
            </sequence></scope>
          </forEach>
          {order('after')}
        </sequence>""")
    (result,), bb = run(wf, {"a": {"pages": 2, "read": ""}, "b": {"pages": 3, "read": ""},
                             "c": {"pages": 0, "read": ""}})
    assert result.ok, result.error
    assert [attr(bb, r, "read") for r in "abc"] == ["12", "123", ""]
    assert attr(bb, "b", "in") == ["a b", "a b", "b"]  # one call per iteration for both ranges
    assert attr(bb, "c", "after") == "a b c"


# -- faults, exit, taint ---------------------------------------------------------------------
def test_a_fault_on_one_branch_fails_the_whole_message(make_workflow: Any) -> None:
    wf = make_workflow(f"""
        <sequence>
          <if><condition>$record/Val[@key='score'] &gt; 5</condition><throw faultName="tooHigh"/>
            <else>{mark('low')}</else></if>
          {mark('after')}
        </sequence>""")
    (result,), bb = run(wf, SCORES)
    assert not result.ok and result.error.startswith("tooHigh")
    assert result.record_ids == ["r1", "r2", "r3"]
    assert [attr(bb, r) for r in SCORES] == [None, None, None]  # nothing of it is kept


def test_a_fault_handler_around_the_if_handles_the_message_once(make_workflow: Any) -> None:
    wf = make_workflow(f"""
        <scope>
          <faultHandlers><catchAll>{order('handled')}</catchAll></faultHandlers>
          <if><condition>$record/Val[@key='score'] &gt; 5</condition><throw faultName="tooHigh"/>
            <else>{mark('low')}</else></if>
        </scope>""")
    (result,), bb = run(wf, SCORES)
    assert result.ok and [attr(bb, r, "handled") for r in SCORES] == ["r1 r2 r3"] * 3
    # the else branch comes after the faulted one: its records never ran it
    assert [attr(bb, r) for r in SCORES] == [None, None, None]


def test_a_fault_handler_inside_a_branch_handles_only_its_records(make_workflow: Any) -> None:
    wf = make_workflow(f"""
        <sequence>
          <if><condition>$record/Val[@key='score'] &gt; 5</condition>
            <scope><faultHandlers><catchAll>{order('caught')}</catchAll></faultHandlers>
              <throw faultName="tooHigh"/></scope>
            <else>{mark('low')}</else></if>
          {order('after')}
        </sequence>""")
    (result,), bb = run(wf, SCORES)
    assert result.ok
    assert attr(bb, "r3", "caught") == "r3" and attr(bb, "r1", "caught") is None
    assert [attr(bb, r) for r in ("r1", "r2", "r3")] == ["low", "low", None]
    assert attr(bb, "r3", "after") == "r1 r2 r3"


def test_exit_on_one_branch_ends_the_message_with_what_ran(make_workflow: Any) -> None:
    wf = make_workflow(f"""
        <sequence>
          {mark('before')}
          <if><condition>$record/Val[@key='score'] &gt; 5</condition><exit/>
            <else>{mark('low')}</else></if>
          {mark('after')}
        </sequence>""")
    (result,), bb = run(wf, SCORES)
    assert result.ok and result.result_ids == ["r1", "r2", "r3"]
    assert [attr(bb, r) for r in SCORES] == ["before"] * 3


def test_compensation_undoes_each_branchs_scope_on_its_own_records(make_workflow: Any) -> None:
    def scope(name: str) -> str:
        return f'<scope name="{name}"><compensationHandler>{mark("undo-" + name)}</compensationHandler>{mark("do-" + name)}</scope>'

    wf = make_workflow(f"""
        <scope>
          <faultHandlers><catchAll><compensate/></catchAll></faultHandlers>
          <sequence>
            <if><condition>$record/Val[@key='score'] &gt; 5</condition>{scope('a')}<else>{scope('b')}</else></if>
            <throw faultName="late"/>
          </sequence>
        </scope>""")
    (result,), bb = run(wf, SCORES)
    assert result.ok
    assert attr(bb, "r1") == ["do-b", "undo-b"] and attr(bb, "r3") == ["do-a", "undo-a"]


def test_a_batched_call_that_raises_reruns_a_split_message_as_a_whole(make_workflow: Any) -> None:
    wf = make_workflow(f"""
        <sequence>
          <if><condition>$record/Val[@key='score'] &gt; 5</condition>{pipelet('fails', 'FailWhen', named='false')}
            <else>{mark('low')}</else></if>
          {order()}
        </sequence>""")
    batch = {"a1": {"score": 9}, "a2": {"score": 0}, "b1": {"score": 9, "fail": 1}}
    results, bb = run(wf, batch, [["a1", "a2"], ["b1"]])
    assert results[0].ok and not results[1].ok
    assert attr(bb, "a1") == "failwhen" and attr(bb, "a2") == "low"
    assert attr(bb, "a1", "order") == "a1 a2"  # rerun alone, once, whole


@pytest.mark.timeout(60)
def test_a_call_of_one_messages_parts_that_raises_fails_the_message_instead_of_rerunning_it(
        make_workflow: Any) -> None:
    """Parts (and a parallel forEach's branches) of one message in one call: rerun alone, they would
    be in one call again, so the message fails at once."""
    counted = make_workflow(f"""
        <forEach counterName="i" parallel="no">
          <startCounterValue>1</startCounterValue>
          <finalCounterValue>$record/Val[@key='pages']</finalCounterValue>
          <scope>{pipelet('fails', 'FailWhen', named='false')}</scope>
        </forEach>""", name="Counted")
    parallel = make_workflow(f"""
        <forEach counterName="i" parallel="yes"><scope>{pipelet('fails', 'FailWhen', named='false')}</scope>
        </forEach>""", name="Parallel")
    for wf in (counted, parallel):
        (result,), _ = run(wf, {"a": {"pages": 1}, "b": {"pages": 2, "fail": 1}})
        assert not result.ok and "RuntimeError" in (result.error or ""), wf.name


def test_a_condition_that_fails_for_one_record_fails_the_message(make_workflow: Any) -> None:
    wf = make_workflow(f"""
        <variables><variable name="limit" type="xsd:int"/></variables>
        <if><condition>$record/Val[@key='score'] &gt; 5 and $limit &gt; 1</condition>{mark('x')}</if>""")
    (result,), _ = run(wf, SCORES)
    assert not result.ok and "uninitializedVariable" in (result.error or "")


# -- links -----------------------------------------------------------------------------------
LINKED = f"""
    <flow suppressJoinFailure="{{suppress}}">
      <links><link name="big"/></links>
      <sequence name="first">
        <sources><source linkName="big"><transitionCondition>$record/Val[@key='score'] &gt; 2</transitionCondition></source></sources>
        {order('first')}
      </sequence>
      <sequence name="then"><targets><target linkName="big"/></targets>{order('then')}</sequence>
    </flow>"""


def test_a_link_holds_for_the_records_whose_transition_condition_holds(make_workflow: Any) -> None:
    (result,), bb = run(make_workflow(LINKED.format(suppress="yes")), SCORES)
    assert result.ok and result.result_ids == ["r1", "r2", "r3"]
    assert [attr(bb, r, "then") for r in ("r1", "r2", "r3")] == [None, "r2 r3", "r2 r3"]


def test_a_join_that_fails_for_some_records_without_suppression_fails_the_message(make_workflow: Any) -> None:
    (result,), _ = run(make_workflow(LINKED.format(suppress="no")), SCORES)
    assert not result.ok and "joinFailure" in (result.error or "")


def test_a_link_set_by_some_records_inside_a_branch_holds_for_them_after_it(make_workflow: Any) -> None:
    wf = make_workflow(f"""
        <flow suppressJoinFailure="yes">
          <links><link name="l"/></links>
          <if><condition>$record/Val[@key='score'] &gt; 5</condition>
            <empty><sources><source linkName="l"/></sources></empty></if>
          <sequence><targets><target linkName="l"/></targets>{order('then')}</sequence>
        </flow>""")
    (result,), bb = run(wf, SCORES)
    assert result.ok and [attr(bb, r, "then") for r in ("r1", "r2", "r3")] == [None, None, "r3"]


# -- copies ----------------------------------------------------------------------------------
def test_copies_to_record_targets_read_the_record_they_write(make_workflow: Any) -> None:
    wf = make_workflow("""
        <assign>
          <copy><from>concat('s', $record/Val[@key='score'])</from><to>$record/Val[@key='own']</to></copy>
          <copy><from>count($records)</from><to attribute="of"/></copy>
          <copy><from>$record/Val[@key='score'] * 2</from>
                <to>$request.records/rec:Record[2]/rec:Val[@key="double"]</to></copy>
          <copy><from>$request.records/rec:Record[1]/rec:Val[@key='score']</from><to attribute="first"/></copy>
        </assign>""")
    (result,), bb = run(wf, SCORES)
    assert result.ok, result.error
    assert [attr(bb, r, "own") for r in ("r1", "r2", "r3")] == ["s0", "s3", "s9"]
    assert [attr(bb, r, "of") for r in ("r1", "r2", "r3")] == [3, 3, 3]
    assert [attr(bb, r, "double") for r in ("r1", "r2", "r3")] == [None, 6, None]
    assert [attr(bb, r, "first") for r in ("r1", "r2", "r3")] == ["0", "0", "0"]


def test_a_one_record_message_runs_as_before(make_workflow: Any, split_count: list[int]) -> None:
    wf = make_workflow(THREE_WAYS)
    results, bb = run(wf, SCORES, [["r1"], ["r2"], ["r3"]])
    assert all(r.ok for r in results)
    assert [attr(bb, r, "priority") for r in ("r1", "r2", "r3")] == ["low", "medium", "high"]
    assert split_count == [0]


@pytest.mark.spark
def test_spark_runs_split_messages_as_the_local_runner_does(spark: Any, make_workflow: Any) -> None:
    wf = make_workflow(f"""
        <sequence>
          <if><condition>$record/Val[@key='score'] &gt; 5</condition>
            <sequence>{mark('high')}{pipelet('fails', 'FailWhen', named='false')}</sequence>
            <elseif><condition>$record/Val[@key='score'] &gt; 2</condition>{pipelet('split', 'SplitInTwo')}</elseif>
            <else>{mark('low')}</else></if>
          <while><condition>string-length($record/Val[@key='bar']) &lt; $record/Val[@key='score']</condition>
            <assign><copy><from>concat($record/Val[@key='bar'], '#')</from><to attribute="bar"/></copy></assign>
          </while>
          {order()}
        </sequence>""")
    batch = {"a1": {"score": 9, "bar": ""}, "a2": {"score": 3, "bar": ""}, "a3": {"score": 0, "bar": ""},
             "b1": {"score": 7, "bar": "", "fail": 1}, "b2": {"score": 1, "bar": ""},
             "c1": {"score": 4, "bar": ""}}
    instances = [["a1", "a2", "a3"], ["b1", "b2"], ["c1"]]
    outcomes = []
    for runner in (LocalRunner(), SparkRunner(spark, batch_timeout=120)):
        bb = Blackboard.local()
        records(bb, batch)
        results = runner.run(wf, bb, instances)
        outcomes.append(([(r.ok, r.result_ids, r.record_ids) for r in results], snapshot(bb)))
    assert outcomes[0] == outcomes[1]
    results, after = outcomes[1]
    assert [ok for ok, _, _ in results] == [True, False, True]
    assert results[0][1] == ["a1", "a2#a", "a2#b", "a3"]
    assert after["a1"]["bar"] == "#########" and after["a2#b"]["bar"] == "###"
    assert after["a3"]["order"] == "a1 a2#a a2#b a3"  # rerun alone after b1's call raised
