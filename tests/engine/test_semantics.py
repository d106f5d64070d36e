"""Activity semantics, run on the in-process runner (same interpreter as Spark)."""

from __future__ import annotations

from typing import Any

from engine_helpers import pipelet, records

from blackboard import Blackboard
from engine import InstanceResult, LocalRunner, Workflow


def run(wf: Workflow, batch: dict[str, dict[str, Any]], instances: list[list[str]] | None = None) -> tuple[list[InstanceResult], Blackboard]:
    bb = Blackboard.local()
    records(bb, batch)
    results = LocalRunner().run(wf, bb, instances or [[rid] for rid in batch])
    return results, bb


def trail(bb: Blackboard, rid: str) -> list[str]:
    return bb.get_attributes(rid).get("trail", []) if rid in bb else []


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def mark(value: str, name: str | None = None) -> str:
    return pipelet(name or f"mark_{value}", "Mark", value=value)


def test_if_elseif_else_route_each_instance(make_workflow: Any) -> None:
    wf = make_workflow(f"""
        <if>
          <condition>$record/Val[@key='n'] &lt; 10</condition>{mark('small')}
          <elseif><condition>$record/Val[@key='n'] &lt; 100</condition>{mark('medium')}</elseif>
          <else>{mark('large')}</else>
        </if>""")
    results, bb = run(wf, {"a": {"n": 5}, "b": {"n": 50}, "c": {"n": 500}})
    assert all(r.ok for r in results)
    assert [as_list(trail(bb, x)) for x in "abc"] == [["small"], ["medium"], ["large"]]


def test_smila_request_records_conditions_work(make_workflow: Any) -> None:
    wf = make_workflow(f"""
        <if><condition>starts-with($request.records/rec:Record[1]/rec:Val[@key="MimeType"],"text/")</condition>
        {mark('text')}</if>""")
    _, bb = run(wf, {"a": {"MimeType": "text/html"}, "b": {"MimeType": "image/png"}})
    assert trail(bb, "a") == "text" and trail(bb, "b") == []


def test_while_loops_over_a_changing_attribute(make_workflow: Any) -> None:
    wf = make_workflow(f"""
        <while><condition>not($record/Val[@key='counter']) or $record/Val[@key='counter'] &lt; $record/Val[@key='target']</condition>
          {pipelet('inc', 'Increment')}
        </while>""")
    _, bb = run(wf, {"a": {"target": 3}, "b": {"target": 1}, "c": {"target": 5}})
    assert [bb.get_attributes(x)["counter"] for x in "abc"] == [3, 1, 5]


def test_repeat_until_runs_the_body_at_least_once(make_workflow: Any) -> None:
    wf = make_workflow(f"""
        <repeatUntil>{pipelet('inc', 'Increment')}
          <condition>$record/Val[@key='counter'] &gt;= 2</condition>
        </repeatUntil>""")
    _, bb = run(wf, {"a": {}, "b": {"counter": 7}})
    assert bb.get_attributes("a")["counter"] == 2 and bb.get_attributes("b")["counter"] == 8


def test_for_each_runs_the_body_once_per_record_with_record_bound(make_workflow: Any) -> None:
    for parallel in ("no", "yes"):
        wf = make_workflow(f"""
            <forEach counterName="i" parallel="{parallel}">
              <scope><if><condition>$record/Val[@key='kind'] = 'x'</condition>{mark('x')}<else>{mark('other')}</else></if></scope>
            </forEach>""", name=f"ForEach{parallel}")
        results, bb = run(wf, {"a": {"kind": "x"}, "b": {"kind": "y"}, "c": {"kind": "x"}}, [["a", "b"], ["c"]])
        assert [r.result_ids for r in results] == [["a", "b"], ["c"]]
        assert (trail(bb, "a"), trail(bb, "b"), trail(bb, "c")) == ("x", "other", "x")


def test_flow_links_order_branches_and_join_conditions_decide(make_workflow: Any) -> None:
    wf = make_workflow(f"""
        <flow suppressJoinFailure="yes">
          <links><link name="toLast"/><link name="onlyBig"/></links>
          <sequence name="last">
            <targets><joinCondition>$toLast and $onlyBig</joinCondition>
              <target linkName="toLast"/><target linkName="onlyBig"/></targets>
            {mark('last')}
          </sequence>
          <sequence name="first">
            <sources><source linkName="toLast"/>
              <source linkName="onlyBig"><transitionCondition>$record/Val[@key='n'] &gt; 10</transitionCondition></source>
            </sources>
            {mark('first')}
          </sequence>
        </flow>""")
    results, bb = run(wf, {"big": {"n": 50}, "small": {"n": 1}})
    assert all(r.ok for r in results)
    assert trail(bb, "big") == ["first", "last"]
    assert trail(bb, "small") == "first"  # join false, suppressed: skipped


def test_dead_path_elimination_propagates_through_skipped_activities(make_workflow: Any) -> None:
    wf = make_workflow(f"""
        <flow suppressJoinFailure="yes">
          <links><link name="ab"/><link name="bc"/></links>
          <empty name="a"><sources><source linkName="ab"><transitionCondition>false()</transitionCondition></source></sources></empty>
          <sequence name="b"><targets><target linkName="ab"/></targets><sources><source linkName="bc"/></sources>{mark('b')}</sequence>
          <sequence name="c"><targets><target linkName="bc"/></targets>{mark('c')}</sequence>
          {mark('d')}
        </flow>""")
    results, bb = run(wf, {"r": {}})
    assert results[0].ok and trail(bb, "r") == "d"


def test_a_false_join_without_suppression_is_a_join_failure(make_workflow: Any) -> None:
    wf = make_workflow(f"""
        <flow>
          <links><link name="l"/></links>
          <empty><sources><source linkName="l"><transitionCondition>false()</transitionCondition></source></sources></empty>
          <sequence><targets><target linkName="l"/></targets>{mark('never')}</sequence>
        </flow>""")
    results, bb = run(wf, {"r": {}})
    assert not results[0].ok and "joinFailure" in (results[0].error or "")


def test_faults_in_nested_scopes_are_caught_by_the_nearest_matching_handler(make_workflow: Any) -> None:
    wf = make_workflow(f"""
        <sequence>
          <scope name="outer">
            <faultHandlers>
              <catch faultName="inner">{mark('outer-caught-inner')}</catch>
              <catchAll>{mark('outer-catchall')}</catchAll>
            </faultHandlers>
            <sequence>
              <scope name="inner">
                <faultHandlers>
                  <catch faultName="other">{mark('wrong')}</catch>
                  <catch faultName="inner"><sequence>{mark('inner-caught')}<rethrow/></sequence></catch>
                </faultHandlers>
                <sequence>
                  <if><condition>$record/Val[@key='boom']</condition><throw faultName="inner"/></if>
                  {mark('inner-done')}
                </sequence>
              </scope>
              {mark('after-inner')}
            </sequence>
          </scope>
          {mark('end')}
        </sequence>""")
    results, bb = run(wf, {"ok": {}, "boom": {"boom": "yes"}})
    assert all(r.ok for r in results)
    assert trail(bb, "ok") == ["inner-done", "after-inner", "end"]
    assert trail(bb, "boom") == ["inner-caught", "outer-caught-inner", "end"]


def test_pipelet_errors_are_catchable_as_pipeletError(make_workflow: Any) -> None:
    wf = make_workflow(f"""
        <scope>
          <faultHandlers><catch faultName="pipeletError">{mark('recovered')}</catch></faultHandlers>
          {pipelet('fail', 'FailWhen')}
        </scope>""")
    results, bb = run(wf, {"good": {}, "bad": {"fail": True}, "good2": {}})
    assert all(r.ok for r in results)
    assert trail(bb, "good") == "failwhen" and trail(bb, "bad") == "recovered"


def test_an_uncaught_throw_fails_the_instance_and_exit_ends_it_successfully(make_workflow: Any) -> None:
    wf = make_workflow(f"""
        <sequence>
          {mark('start')}
          <if><condition>$record/Val[@key='stop'] = 'exit'</condition><exit/>
            <elseif><condition>$record/Val[@key='stop'] = 'throw'</condition><throw faultName="bad"/></elseif></if>
          {mark('end')}
        </sequence>""")
    results, bb = run(wf, {"e": {"stop": "exit"}, "t": {"stop": "throw"}, "n": {}})
    assert [r.ok for r in results] == [True, False, True]
    assert trail(bb, "e") == "start" and trail(bb, "n") == ["start", "end"]
    assert results[1].error and results[1].error.startswith("bad: thrown at")
    assert "trail" not in bb.get_attributes("t")  # failed: nothing imported


def test_assign_copies_values_literals_expressions_and_annotations(make_workflow: Any) -> None:
    wf = make_workflow("""
        <assign>
          <copy><from attribute="title"/><to attribute="headline"/></copy>
          <copy><from><literal>fixed</literal></from><to attribute="kind"/></copy>
          <copy><from>concat('Hello ', $record/Val[@key='title'])</from><to attribute="greeting"/></copy>
          <copy><from><literal>chalk.out</literal></from><to annotation="nextDestination"/></copy>
          <copy><from>$request</from><to>$result</to></copy>
        </assign>""")
    results, bb = run(wf, {"r": {"title": "World"}})
    assert results[0].ok
    attrs = bb.get_attributes("r")
    assert (attrs["headline"], attrs["kind"], attrs["greeting"]) == ("World", "fixed", "Hello World")
    ann = bb.get_annotation("r", None, "nextDestination")
    assert ann is not None and ann.values == ("chalk.out",)


def test_invoke_workflow_runs_the_sub_workflow_on_the_same_records(tmp_path: Any) -> None:
    from engine_helpers import BPEL_HEADER

    from engine import WorkflowRegistry

    (tmp_path / "child.xml").write_text(BPEL_HEADER.format(name="Child") + mark("child") + "</process>")
    (tmp_path / "parent.xml").write_text(
        BPEL_HEADER.format(name="Parent") + "<sequence>" + mark("before")
        + '<proc:invokeWorkflow workflow="Child"/>' + mark("after") + "</sequence></process>"
    )
    wf = WorkflowRegistry(tmp_path).get("Parent")
    results, bb = run(wf, {"r": {}})
    assert results[0].ok and trail(bb, "r") == ["before", "child", "after"]


def test_pipelets_are_called_once_per_activity_for_the_whole_batch(make_workflow: Any) -> None:
    import tests.engine._pipelets as tp

    calls: list[int] = []
    original = tp.Mark.process

    def counting(self: Any, blackboard: Any, ids: list[str]) -> list[str]:
        calls.append(len(ids))
        return original(self, blackboard, ids)

    tp.Mark.process = counting  # type: ignore[method-assign]
    try:
        wf = make_workflow(f"""<sequence>{mark('one')}
            <if><condition>$record/Val[@key='n'] &gt; 1</condition>{mark('two')}</if></sequence>""")
        run(wf, {f"r{i}": {"n": i} for i in range(6)})
    finally:
        tp.Mark.process = original  # type: ignore[method-assign]
    assert calls == [6, 4]
