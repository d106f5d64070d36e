"""BPEL semantics added for real SMILA files: forEach counters and completion conditions,
compensation (reverse order of completion), termination handlers; on the local runner
(the interpreter Spark runs in its partitions; see test_smila_syntax for a Spark run)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from engine_helpers import pipelet
from test_semantics import as_list, mark, run, trail

from engine import WorkflowDefinitionError


def undo(value: str) -> str:
    return mark(f"undo-{value}", f"undo_{value}")


def scope(name: str, do: str) -> str:
    return f'<scope name="{name}"><compensationHandler>{mark("undo-" + name)}</compensationHandler>{mark(do)}</scope>'


# -- forEach with counters -----------------------------------------------------------

def test_counted_for_each_runs_from_start_to_final_with_the_counter_bound(make_workflow: Any) -> None:
    wf = make_workflow("""
        <forEach counterName="i" parallel="no">
          <startCounterValue>2</startCounterValue>
          <finalCounterValue>$request.records/rec:Record[1]/rec:Val[@key='n']</finalCounterValue>
          <scope><sequence><assign><copy><from>concat('step ', $i)</from><to attribute="step"/></copy></assign>""" + mark("x") + """</sequence></scope>
        </forEach>""")
    results, bb = run(wf, {"a": {"n": 4}, "b": {"n": 1}, "c": {"n": 2}})
    assert all(r.ok for r in results)
    assert as_list(trail(bb, "a")) == ["x", "x", "x"] and bb.get_attributes("a")["step"] == "step 4"
    assert trail(bb, "b") == [] and "step" not in bb.get_attributes("b")  # start > final: no iteration
    assert trail(bb, "c") == "x" and bb.get_attributes("c")["step"] == "step 2"


def test_iteration_k_of_every_instance_is_one_batched_call(make_workflow: Any) -> None:
    wf = make_workflow(f"""
        <forEach counterName="i" parallel="yes">
          <startCounterValue>1</startCounterValue>
          <finalCounterValue>$record/Val[@key='n']</finalCounterValue>
          <scope>{pipelet('size', 'BatchSize')}</scope>
        </forEach>""")
    results, bb = run(wf, {"a": {"n": 2}, "b": {"n": 3}, "c": {"n": 1}})
    assert all(r.ok for r in results)
    # iteration 1: a, b, c together; 2: a, b; 3: b alone
    assert [as_list(bb.get_attributes(x)["batch"]) for x in "abc"] == [[3, 2], [3, 2, 1], [3]]


def test_counter_values_that_are_not_unsigned_integers_fault_the_instance(make_workflow: Any) -> None:
    wf = make_workflow("""
        <forEach counterName="i" parallel="no">
          <startCounterValue>1</startCounterValue>
          <finalCounterValue>$record/Val[@key='n']</finalCounterValue>
          <scope><empty/></scope>
        </forEach>""")
    results, _ = run(wf, {"ok": {"n": 2}, "text": {"n": "many"}, "neg": {"n": -1}, "half": {"n": "2.5"}})
    assert [r.ok for r in results] == [True, False, False, False]
    assert all("invalidExpressionValue" in r.error for r in results[1:])


def test_completion_condition_stops_a_sequential_for_each_after_n_branches(make_workflow: Any) -> None:
    wf = make_workflow("""
        <forEach counterName="i" parallel="no">
          <startCounterValue>1</startCounterValue><finalCounterValue>5</finalCounterValue>
          <completionCondition><branches>2</branches></completionCondition>
          <scope>
            <terminationHandler>""" + mark("terminated") + """</terminationHandler>
            <assign><copy><from>$i</from><to attribute="last"/></copy></assign>
          </scope>
        </forEach>""")
    results, bb = run(wf, {"r": {}})
    assert results[0].ok
    assert bb.get_attributes("r")["last"] == "2"
    assert trail(bb, "r") == []  # sequential: branches 3-5 never started, nothing to terminate


def test_parallel_completion_terminates_the_branches_still_running(make_workflow: Any) -> None:
    wf = make_workflow("""
        <forEach counterName="i" parallel="yes">
          <startCounterValue>1</startCounterValue><finalCounterValue>5</finalCounterValue>
          <completionCondition><branches>2</branches></completionCondition>
          <scope>
            <terminationHandler>
              <assign><copy><from>concat('terminated ', $i)</from><to attribute="note"/></copy></assign>
            </terminationHandler>""" + mark("ran") + """
          </scope>
        </forEach>""")
    results, bb = run(wf, {"r": {}})
    assert results[0].ok
    assert trail(bb, "r") == ["ran", "ran"]
    # branches 3, 4, 5 were running (parallel) and were terminated, in order
    assert bb.get_attributes("r")["note"] == "terminated 5"


def test_successful_branches_only_does_not_count_branches_whose_fault_was_handled(make_workflow: Any) -> None:
    body = """
          <scope>
            <faultHandlers><catchAll>""" + mark("handled") + """</catchAll></faultHandlers>
            <if><condition>$i mod 2 = 1</condition><throw faultName="odd"/><else>""" + mark("even") + """</else></if>
          </scope>"""
    for only, expected in (("yes", ["handled", "even", "handled", "even"]), ("no", ["handled", "even"])):
        wf = make_workflow(f"""
            <forEach counterName="i" parallel="no">
              <startCounterValue>1</startCounterValue><finalCounterValue>6</finalCounterValue>
              <completionCondition><branches successfulBranchesOnly="{only}">2</branches></completionCondition>
              {body}
            </forEach>""", name=f"Only{only}")
        results, bb = run(wf, {"r": {}})
        assert results[0].ok and trail(bb, "r") == expected, only


def test_more_branches_than_iterations_is_an_invalid_branch_condition(make_workflow: Any) -> None:
    wf = make_workflow("""
        <forEach counterName="i" parallel="no">
          <startCounterValue>1</startCounterValue><finalCounterValue>2</finalCounterValue>
          <completionCondition><branches>3</branches></completionCondition>
          <scope><empty/></scope>
        </forEach>""")
    results, _ = run(wf, {"r": {}})
    assert not results[0].ok and "invalidBranchCondition" in results[0].error


def test_zero_branches_completes_the_for_each_at_once(make_workflow: Any) -> None:
    wf = make_workflow(f"""
        <forEach counterName="i" parallel="no">
          <startCounterValue>1</startCounterValue><finalCounterValue>3</finalCounterValue>
          <completionCondition><branches>0</branches></completionCondition>
          <scope>{mark('x')}</scope>
        </forEach>""")
    results, bb = run(wf, {"r": {}})
    assert results[0].ok and trail(bb, "r") == []


def test_completion_condition_over_records_leaves_the_rest_unchanged(make_workflow: Any) -> None:
    wf = make_workflow(f"""
        <forEach counterName="pos" parallel="no">
          <completionCondition><branches>2</branches></completionCondition>
          <scope><sequence>{mark('seen')}<assign><copy><from>$pos</from><to attribute="pos"/></copy></assign></sequence></scope>
        </forEach>""")
    results, bb = run(wf, {"a": {}, "b": {}, "c": {}}, [["a", "b", "c"]])
    assert results[0].ok and results[0].result_ids == ["a", "b", "c"]
    assert [bb.get_attributes(x).get("pos") for x in "abc"] == ["1", "2", None]
    assert trail(bb, "c") == []


def journal(path: Path, **params: str) -> str:
    return pipelet("journal", "Journal", path=str(path), **params)


def test_a_fault_in_a_parallel_branch_terminates_the_branches_not_run(make_workflow: Any, tmp_path: Path) -> None:
    log = tmp_path / "journal"
    for parallel, expected in (("yes", ["ran 1", "terminated 3", "terminated 4"]), ("no", ["ran 1"])):
        log.write_text("")
        wf = make_workflow(f"""
            <forEach counterName="i" parallel="{parallel}">
              <startCounterValue>1</startCounterValue><finalCounterValue>4</finalCounterValue>
              <scope>
                <terminationHandler><sequence>
                  <assign><copy><from>concat('terminated ', $i)</from><to attribute="note"/></copy></assign>
                  {journal(log, attribute='note')}
                </sequence></terminationHandler>
                <sequence>
                  <if><condition>$i = 2</condition><throw faultName="two"/></if>
                  <assign><copy><from>concat('ran ', $i)</from><to attribute="note"/></copy></assign>
                  {journal(log, attribute='note')}
                </sequence>
              </scope>
            </forEach>""", name=f"Fault{parallel}")
        results, _ = run(wf, {"r": {}})
        assert not results[0].ok and "two" in results[0].error
        assert log.read_text().splitlines() == expected, parallel


# -- compensation ---------------------------------------------------------------------

def test_compensation_runs_in_reverse_order_of_completion(make_workflow: Any) -> None:
    wf = make_workflow(f"""
        <scope name="all">
          <faultHandlers><catchAll><sequence><compensate/>{mark('handled')}</sequence></catchAll></faultHandlers>
          <sequence>
            {scope('first', 'do-first')}
            <flow>
              {scope('second', 'do-second')}
              {scope('third', 'do-third')}
            </flow>
            <throw faultName="later"/>
          </sequence>
        </scope>""")
    results, bb = run(wf, {"r": {}})
    assert results[0].ok
    assert trail(bb, "r") == ["do-first", "do-second", "do-third", "undo-third", "undo-second", "undo-first",
                              "handled"]


def test_every_completed_iteration_is_compensated_newest_first(make_workflow: Any) -> None:
    wf = make_workflow("""
        <scope>
          <faultHandlers><catchAll><compensate/></catchAll></faultHandlers>
          <sequence>
            <forEach counterName="i" parallel="no">
              <startCounterValue>1</startCounterValue><finalCounterValue>3</finalCounterValue>
              <scope name="step">
                <compensationHandler><assign><copy><from>concat($request.records/rec:Record[1]/rec:Val[@key='log'], ' undo', $i)</from><to attribute="log"/></copy></assign></compensationHandler>
                <assign><copy><from>concat($request.records/rec:Record[1]/rec:Val[@key='log'], ' do', $i)</from><to attribute="log"/></copy></assign>
              </scope>
            </forEach>
            <throw faultName="stop"/>
          </sequence>
        </scope>""")
    results, bb = run(wf, {"r": {"log": "start"}})
    assert results[0].ok
    assert bb.get_attributes("r")["log"] == "start do1 do2 do3 undo3 undo2 undo1"


def test_compensate_scope_undoes_only_the_named_scope(make_workflow: Any) -> None:
    wf = make_workflow(f"""
        <scope>
          <faultHandlers><catchAll><compensateScope target="second"/></catchAll></faultHandlers>
          <sequence>{scope('first', 'do-first')}{scope('second', 'do-second')}<throw faultName="x"/></sequence>
        </scope>""")
    _, bb = run(wf, {"r": {}})
    assert trail(bb, "r") == ["do-first", "do-second", "undo-second"]


def test_a_scope_is_compensated_once(make_workflow: Any) -> None:
    wf = make_workflow(f"""
        <scope>
          <faultHandlers><catchAll><sequence><compensate/><compensate/></sequence></catchAll></faultHandlers>
          <sequence>{scope('only', 'do')}<throw faultName="x"/></sequence>
        </scope>""")
    _, bb = run(wf, {"r": {}})
    assert trail(bb, "r") == ["do", "undo-only"]


def test_default_compensation_handler_compensates_inner_scopes(make_workflow: Any) -> None:
    wf = make_workflow(f"""
        <scope>
          <faultHandlers><catchAll><compensate/></catchAll></faultHandlers>
          <sequence>
            <scope name="outer"><sequence>{scope('a', 'do-a')}{scope('b', 'do-b')}</sequence></scope>
            <throw faultName="x"/>
          </sequence>
        </scope>""")
    _, bb = run(wf, {"r": {}})
    assert trail(bb, "r") == ["do-a", "do-b", "undo-b", "undo-a"]


def test_uncaught_faults_compensate_completed_scopes_before_the_instance_fails(make_workflow: Any,
                                                                               tmp_path: Path) -> None:
    index = tmp_path / "idx"
    add = (f'<extensionActivity><proc:invokePipelet name="index"><proc:pipelet class="pipelets.index.FullTextIndex"/>'
           f'<proc:configuration><proc:param name="indexname">docs</proc:param>'
           f'<proc:param name="directory">{index}</proc:param></proc:configuration></proc:invokePipelet></extensionActivity>')
    remove = add.replace('name="index"', 'name="unindex"').replace(
        "</proc:configuration>", '<proc:param name="executionMode">DELETE</proc:param></proc:configuration>')
    wf = make_workflow(f"""
        <sequence>
          <scope name="indexing"><compensationHandler>{remove}</compensationHandler>{add}</scope>
          <if><condition>$record/Val[@key='bad']</condition><throw faultName="rejected"/></if>
        </sequence>""")
    results, _ = run(wf, {"good": {"text": "alpha"}, "bad": {"text": "beta", "bad": True}})
    assert [r.ok for r in results] == [True, False]
    import sqlite3

    with sqlite3.connect(index / "docs.fts.sqlite") as conn:
        assert [row[0] for row in conn.execute("SELECT id FROM records")] == ["good"]


def test_compensation_runs_on_the_records_the_scope_completed_with(make_workflow: Any) -> None:
    wf = make_workflow(f"""
        <scope>
          <faultHandlers><catchAll><compensate/></catchAll></faultHandlers>
          <sequence>
            <forEach parallel="yes"><scope name="each"><compensationHandler>{mark('undone')}</compensationHandler>{mark('done')}</scope></forEach>
            {mark('after')}
            <throw faultName="x"/>
          </sequence>
        </scope>""")
    results, bb = run(wf, {"a": {}, "b": {}}, [["a", "b"]])
    assert results[0].ok
    assert trail(bb, "a") == trail(bb, "b") == ["done", "after", "undone"]


def test_a_fault_in_a_compensation_handler_replaces_the_fault(make_workflow: Any) -> None:
    wf = make_workflow(f"""
        <sequence>
          <scope name="s"><compensationHandler><throw faultName="undoFailed"/></compensationHandler>{mark('x')}</scope>
          <throw faultName="first"/>
        </sequence>""")
    results, _ = run(wf, {"r": {}})
    assert not results[0].ok and results[0].error.startswith("undoFailed")


def test_a_scope_whose_fault_handler_ran_is_not_compensated(make_workflow: Any) -> None:
    wf = make_workflow(f"""
        <scope>
          <faultHandlers><catchAll><compensate/></catchAll></faultHandlers>
          <sequence>
            <scope name="failed">
              <faultHandlers><catchAll>{mark('caught')}</catchAll></faultHandlers>
              <compensationHandler>{mark('undo-failed')}</compensationHandler>
              <throw faultName="inner"/>
            </scope>
            <throw faultName="outer"/>
          </sequence>
        </scope>""")
    _, bb = run(wf, {"r": {}})
    assert trail(bb, "r") == "caught"


# -- termination ----------------------------------------------------------------------

def test_a_fault_in_a_flow_terminates_the_branches_that_had_not_run(make_workflow: Any) -> None:
    wf = make_workflow(f"""
        <scope>
          <faultHandlers><catchAll>{mark('caught')}</catchAll></faultHandlers>
          <flow>
            <links><link name="l"/></links>
            <sequence>{mark('one')}<throw faultName="boom"/></sequence>
            <scope><terminationHandler>{mark('terminated-two')}</terminationHandler>{mark('two')}</scope>
            <sequence>
              <scope><terminationHandler>{mark('terminated-inner')}</terminationHandler>{mark('three')}</scope>
            </sequence>
            <scope><targets><target linkName="l"/></targets>
              <terminationHandler>{mark('terminated-waiting')}</terminationHandler>{mark('four')}</scope>
            <empty><sources><source linkName="l"/></sources></empty>
          </flow>
        </scope>""")
    results, bb = run(wf, {"r": {}})
    assert results[0].ok
    # the waiting branch had not started (its link was not set): nothing to terminate
    assert trail(bb, "r") == ["one", "terminated-two", "terminated-inner", "caught"]


def test_faults_in_a_termination_handler_are_not_propagated(make_workflow: Any) -> None:
    wf = make_workflow(f"""
        <scope>
          <faultHandlers><catch faultName="boom">{mark('caught-boom')}</catch>
            <catchAll>{mark('caught-other')}</catchAll></faultHandlers>
          <flow>
            <throw faultName="boom"/>
            <scope><terminationHandler><throw faultName="fromHandler"/></terminationHandler><empty/></scope>
          </flow>
        </scope>""")
    results, bb = run(wf, {"r": {}})
    assert results[0].ok and trail(bb, "r") == "caught-boom"


def test_exit_ends_without_termination_handlers(make_workflow: Any) -> None:
    wf = make_workflow(f"""
        <flow>
          <exit/>
          <scope><terminationHandler>{mark('terminated')}</terminationHandler>{mark('never')}</scope>
        </flow>""")
    results, bb = run(wf, {"r": {}})
    assert results[0].ok and trail(bb, "r") == []


# -- what is refused -----------------------------------------------------------------

@pytest.mark.parametrize("body, message", [
    ("<scope><eventHandlers/><empty/></scope>", "<eventHandlers> is not supported: a Chalk workflow instance"),
    ("<sequence><compensate/></sequence>", "<compensate> is only allowed in a <faultHandlers>"),
    ("<scope><faultHandlers><catchAll><compensateScope target='nope'/></catchAll></faultHandlers><empty/></scope>",
     "no scope named 'nope' directly inside"),
    ("<forEach parallel='yes'><completionCondition><branches>1</branches></completionCondition><empty/></forEach>",
     "its branches (one per record) run as one batched call"),
])
def test_unsupported_or_misplaced_constructs_are_refused_with_the_reason(make_workflow: Any, body: str,
                                                                          message: str) -> None:
    with pytest.raises(WorkflowDefinitionError) as info:
        make_workflow(body)
    assert message in str(info.value)
