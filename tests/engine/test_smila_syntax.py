"""SMILA's older workflow syntax, one construct per test, each run on records.

The files are written here (SMILA 0.9's forms: ``invokeService`` with
``setAnnotations``, ``PipeletConfiguration``, the ``rec:A``/``rec:L``/``rec:V``
record form, BPEL variables); the last test runs them together on Spark and
on the local runner and compares.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from engine_helpers import records, snapshot
from test_semantics import run, trail

from blackboard import Blackboard
from engine import LocalRunner, SparkRunner, WorkflowDefinitionError, compile_condition

MARK = "tests.engine._pipelets.Mark"


def service(name: str, annotations: str, invoke_name: str = "svc") -> str:
    return (f'<extensionActivity><proc:invokeService name="{invoke_name}"><proc:service name="{name}"/>'
            f'<proc:variables input="request" output="request"/>'
            f'<proc:setAnnotations>{annotations}</proc:setAnnotations></proc:invokeService></extensionActivity>')


def test_invoke_service_resolves_through_the_service_table_with_set_annotations_as_configuration(
        make_workflow: Any) -> None:
    wf = make_workflow(service("MarkerService", '<rec:An n="value"><rec:V>from-service</rec:V></rec:An>'
                                                '<rec:An n="attribute"><rec:V>seen</rec:V></rec:An>'),
                       services={"MarkerService": MARK})
    results, bb = run(wf, {"a": {}, "b": {}})
    assert all(r.ok for r in results)
    assert bb.get_attributes("a") == bb.get_attributes("b") == {"seen": "from-service"}


def test_set_annotations_with_named_values_become_a_map(make_workflow: Any) -> None:
    annotations = ('<rec:An n="_indexing"><rec:V n="indexName">docs</rec:V>'
                   '<rec:V n="executionMode">ADD</rec:V></rec:An>')
    wf = make_workflow(service("IndexService", annotations),
                       services={"IndexService": "tests.engine._pipelets.RecordIndex"})
    _, bb = run(wf, {"a": {}})
    assert bb.get_attributes("a") == {"indexed": "docs:ADD"}


@pytest.mark.spark
def test_set_annotations_with_anonymous_and_named_values_become_an_annotation(make_workflow: Any,
                                                                            spark: Any) -> None:
    from blackboard import Annotation

    wf = make_workflow("""
        <extensionActivity><proc:invokePipelet name="any">
          <proc:pipelet class="tests.engine._pipelets.StandIn"/>
          <proc:setAnnotations>
            <rec:An n="settings"><rec:V>a</rec:V><rec:V n="b">c</rec:V>
              <rec:An n="inner"><rec:V>d</rec:V></rec:An></rec:An>
            <rec:An n="plain"><rec:V n="e">f</rec:V><rec:An n="mixed"><rec:V>g</rec:V><rec:V n="h">i</rec:V></rec:An>
            </rec:An>
          </proc:setAnnotations>
        </proc:invokePipelet></extensionActivity>""")
    settings = Annotation(["a"], {"b": "c"}, {"inner": [Annotation(["d"])]})
    (invoke,) = wf.pipelets()
    assert invoke.config == {"settings": settings, "plain": {"e": "f", "mixed": Annotation(["g"], {"h": "i"})}}
    wf = make_workflow("""
        <extensionActivity><proc:invokePipelet name="set">
          <proc:pipelet class="org.eclipse.smila.processing.bpel.pipelet.SimpleTestPipelet"/>
          <proc:setAnnotations><rec:An n="settings"><rec:V>a</rec:V><rec:V n="b">c</rec:V>
            <rec:An n="inner"><rec:V>d</rec:V></rec:An></rec:An></proc:setAnnotations>
        </proc:invokePipelet></extensionActivity>""", name="Runs")
    for runner in (LocalRunner(), SparkRunner(spark)):  # the configuration travels to Spark's workers
        bb = Blackboard.local()
        records(bb, {"r": {"x": 1}, "s": {}})
        assert all(r.ok for r in runner.run(wf, bb, [["r"], ["s"]]))
        assert [bb.get_annotation(rid, None, "settings") for rid in ("r", "s")] == [settings, settings]
        assert bb.get_attributes("r") == {"x": 1}


def test_an_unmapped_service_is_reported_with_where_to_map_it(make_workflow: Any) -> None:
    with pytest.raises(WorkflowDefinitionError) as info:
        make_workflow(service("NoSuchService", ""))
    assert "unknown service 'NoSuchService'" in str(info.value)
    assert "[workflows.services]" in str(info.value)


def test_pipelet_configuration_properties_with_several_values_make_lists(make_workflow: Any) -> None:
    wf = make_workflow("""
        <extensionActivity><proc:invokePipelet name="set">
          <proc:pipelet class="pipelets.values.SetAttributes"/>
          <proc:PipeletConfiguration>
            <proc:Property name="single"><proc:Value>one</proc:Value></proc:Property>
            <proc:Property name="several"><proc:Value>a</proc:Value><proc:Value>b</proc:Value></proc:Property>
            <proc:Property name="count" type="java.lang.Integer"><proc:Value>3</proc:Value></proc:Property>
            <proc:Property name="listOfOne" multiValued="true"><proc:Value>x</proc:Value></proc:Property>
          </proc:PipeletConfiguration>
        </proc:invokePipelet></extensionActivity>""")
    results, bb = run(wf, {"r": {}})
    assert results[0].ok
    assert bb.get_attributes("r") == {"single": "one", "several": ["a", "b"], "count": 3, "listOfOne": "x"}
    assert [lit.value for lit in bb.get_literals("r", "listOfOne")] == ["x"]


def test_a_sequence_holding_only_an_invoke_service_and_an_if_around_one(make_workflow: Any) -> None:
    call = service("MarkerService", '<rec:An n="value"><rec:V>called</rec:V></rec:An>')
    wf = make_workflow(f"""
        <sequence>
          <sequence>{call}</sequence>
          <if><condition>$request.records/rec:Record[1]/rec:A[@n="kind"]/rec:L/rec:V = "x"</condition>
            {call.replace('name="svc"', 'name="again"')}</if>
        </sequence>""", services={"MarkerService": MARK})
    results, bb = run(wf, {"x": {"kind": "x"}, "y": {"kind": "y"}})
    assert all(r.ok for r in results)
    assert (trail(bb, "x"), trail(bb, "y")) == (["called", "called"], "called")


def test_older_record_form_in_conditions_sees_every_value_annotations_and_sub_objects(make_workflow: Any) -> None:
    def mark(value: str) -> str:
        return (f'<extensionActivity><proc:invokePipelet name="m{value}"><proc:pipelet class="{MARK}"/>'
                f'<proc:configuration><proc:param name="value">{value}</proc:param></proc:configuration>'
                "</proc:invokePipelet></extensionActivity>")

    r = "$request.records/rec:Record[1]"
    wf = make_workflow(f"""
        <sequence>
          <if><condition>{r}/rec:A[@n="tags"]/rec:L/rec:V = "b"</condition>{mark('has-b')}</if>
          <if><condition>{r}/rec:A[@n="author"]/rec:O/rec:A[@n="name"]/rec:L/rec:V = "Ann"</condition>{mark('by-ann')}</if>
          <if><condition>{r}/rec:An[@n="source"]/rec:V[@n="run"] = "7"</condition>{mark('run-7')}</if>
          <if><condition>not({r}/rec:A[@n="MimeType"]/rec:L)</condition>{mark('no-mime')}</if>
        </sequence>""")
    bb = Blackboard.local()
    records(bb, {"p": {"tags": ["a", "b"], "author": {"name": "Ann"}}, "q": {"tags": "a", "MimeType": "x/y"}})
    from blackboard import Annotation

    bb.set_annotation("p", None, "source", Annotation(named={"run": 7}))
    results = LocalRunner().run(wf, bb, [["p"], ["q"]])
    assert all(r.ok for r in results)
    assert trail(bb, "p") == ["has-b", "by-ann", "run-7", "no-mime"]
    assert trail(bb, "q") == []


def test_copies_read_and_write_records_in_the_older_form(make_workflow: Any) -> None:
    r = "$request.records/rec:Record[1]"
    wf = make_workflow(f"""
        <assign>
          <copy><from>concat('Hi ', {r}/rec:A[@n="name"]/rec:L/rec:V)</from>
                <to>{r}/rec:A[@n="greeting"]/rec:L/rec:V</to></copy>
          <copy><from>{r}/rec:A[@n="tags"]/rec:L/rec:V</from><to>{r}/rec:A[@n="copied"]</to></copy>
          <copy><from><literal>chalk.out</literal></from><to>{r}/rec:An[@n="nextDestination"]/rec:V</to></copy>
        </assign>""")
    results, bb = run(wf, {"r": {"name": "Bo", "tags": ["a", "b"]}})
    assert results[0].ok
    attrs = bb.get_attributes("r")
    assert (attrs["greeting"], attrs["copied"]) == ("Hi Bo", ["a", "b"])
    assert bb.get_annotation("r", None, "nextDestination").values == ("chalk.out",)


def test_router_conditions_take_the_older_form_with_the_rec_prefix() -> None:
    bb = Blackboard.local()
    records(bb, {"hit": {"lang": ["en", "de"]}, "miss": {"lang": "en"}})
    condition = compile_condition('$request.records/rec:Record[1]/rec:A[@n="lang"]/rec:L/rec:V = "de"')
    assert [condition.test([bb.document(rid)]) for rid in ("hit", "miss")] == [True, False]
    newer = compile_condition('$request.records/rec:Record[1]/rec:Val[@key="lang"] = "en"')
    assert [newer.test([bb.document(rid)]) for rid in ("hit", "miss")] == [False, True]  # a list is a Seq


HELLO = """
    <variables>
      <variable name="hi" messageType="hw:sayHi" xmlns:hw="urn:hello"/>
      <variable name="response" messageType="hw:sayHiResponse" xmlns:hw="urn:hello"/>
      <variable name="greeted" type="xsd:string" xmlns:xsd="http://www.w3.org/2001/XMLSchema">
        <from><literal>no</literal></from>
      </variable>
    </variables>
    <sequence>
      <assign>
        <copy><from><literal><hw:sayHi xmlns:hw="urn:hello"><arg0 xmlns=""/></hw:sayHi></literal></from>
              <to variable="hi" part="parameters"/></copy>
        <copy><from>$request.records/rec:Record[1]/rec:Val[@key="name"]</from><to>$hi.parameters/arg0</to></copy>
      </assign>
      <invoke name="sayHi" partnerLink="Greeter" operation="sayHi" inputVariable="hi" outputVariable="response"/>
      <assign>
        <copy><from>$response.parameters/return</from>
              <to>$request.records/rec:Record[1]/rec:Val[@key="greeting"]/text()</to></copy>
        <copy><from><literal>yes</literal></from><to variable="greeted"/></copy>
      </assign>
      <if><condition>$greeted = 'yes' and $hi.parameters/arg0 = 'World'</condition>
        <assign><copy><from variable="response" part="parameters"><query>return</query></from>
                      <to attribute="checked"/></copy></assign></if>
    </sequence>"""


def _hello_file(tmp_path: Path) -> Path:
    header = ('<process name="Hello" xmlns="http://docs.oasis-open.org/wsbpel/2.0/process/executable" '
              'xmlns:proc="http://www.eclipse.org/smila/processor" xmlns:rec="http://www.eclipse.org/smila/record">'
              '<partnerLinks><partnerLink name="Greeter" partnerLinkType="hw:GreeterLink" partnerRole="service" '
              'xmlns:hw="urn:hello"/></partnerLinks>')
    path = tmp_path / "hello.bpel"
    path.write_text(header + HELLO + "</process>")
    return path


def test_variables_take_copies_from_records_go_to_a_service_and_back_and_steer_conditions(tmp_path: Path) -> None:
    from engine import load_workflow

    wf = load_workflow(_hello_file(tmp_path), services={"Greeter": "tests.engine._pipelets.Greeter"})
    bb = Blackboard.local()
    records(bb, {"w": {"name": "World"}, "x": {"name": "Xu"}})
    results = LocalRunner().run(wf, bb, [["w"], ["x"]])
    assert all(r.ok for r in results), results
    assert bb.get_attributes("w") == {"name": "World", "greeting": "Hello World", "checked": "Hello World"}
    assert bb.get_attributes("x") == {"name": "Xu", "greeting": "Hello Xu"}


def test_reading_a_variable_before_it_is_assigned_is_an_uninitialized_variable_fault(make_workflow: Any) -> None:
    wf = make_workflow("""
        <variables><variable name="v" type="xsd:string" xmlns:xsd="http://www.w3.org/2001/XMLSchema"/></variables>
        <assign><copy><from variable="v"/><to attribute="x"/></copy></assign>""")
    results, _ = run(wf, {"r": {}})
    assert not results[0].ok and results[0].error.startswith("uninitializedVariable")


def test_a_copy_into_a_path_that_selects_nothing_is_a_selection_failure(make_workflow: Any) -> None:
    wf = make_workflow("""
        <variables><variable name="v" element="x:doc" xmlns:x="urn:x"/></variables>
        <assign>
          <copy><from><literal><doc><a/></doc></literal></from><to variable="v"/></copy>
          <copy><from><literal>text</literal></from><to>$v/missing</to></copy>
        </assign>""")
    results, _ = run(wf, {"r": {}})
    assert not results[0].ok and results[0].error.startswith("selectionFailure")


def test_undeclared_variables_are_reported_with_the_declared_ones(make_workflow: Any) -> None:
    with pytest.raises(WorkflowDefinitionError) as info:
        make_workflow("<assign><copy><from><literal>x</literal></from><to variable='nope'/></copy></assign>")
    assert "variable='nope'" in str(info.value) and "declared: $request, $result" in str(info.value)


@pytest.mark.spark
def test_the_older_syntax_runs_the_same_on_spark(spark: Any, tmp_path: Path) -> None:
    from engine import load_workflow

    wf = load_workflow(_hello_file(tmp_path), services={"Greeter": "tests.engine._pipelets.Greeter"})
    header = ('<process name="Old" xmlns="http://docs.oasis-open.org/wsbpel/2.0/process/executable" '
              'xmlns:proc="http://www.eclipse.org/smila/processor" xmlns:rec="http://www.eclipse.org/smila/record">')
    (tmp_path / "old.bpel").write_text(header + f"""
        <scope>
          <faultHandlers><catchAll><compensate/></catchAll></faultHandlers>
          <sequence>
            <forEach counterName="i" parallel="yes">
              <startCounterValue>1</startCounterValue>
              <finalCounterValue>count($request.records/rec:Record[1]/rec:A[@n="tags"]/rec:L/rec:V)</finalCounterValue>
              <scope name="each">
                <compensationHandler><assign><copy><from>concat($request.records/rec:Record[1]/rec:Val[@key="log"], ' undo', $i)</from><to attribute="log"/></copy></assign></compensationHandler>
                <sequence>
                  <assign><copy><from>concat($request.records/rec:Record[1]/rec:Val[@key="log"], ' do', $i)</from><to attribute="log"/></copy></assign>
                  {service("MarkerService", '<rec:An n="value"><rec:V>svc</rec:V></rec:An>')}
                </sequence>
              </scope>
            </forEach>
            <if><condition>$request.records/rec:Record[1]/rec:A[@n="fail"]/rec:L/rec:V = "yes"</condition>
              <throw faultName="asked"/></if>
          </sequence>
        </scope></process>""")
    old = load_workflow(tmp_path / "old.bpel", services={"MarkerService": MARK})
    batch = {"a": {"name": "Ann", "tags": ["x", "y"], "log": "-"},
             "b": {"name": "Bo", "tags": ["z"], "log": "-", "fail": "yes"}}
    outcomes = []
    for runner in (LocalRunner(), SparkRunner(spark)):
        bb = Blackboard.local()
        records(bb, batch)
        assert all(r.ok for r in runner.run(wf, bb, [["a"], ["b"]]))
        assert all(r.ok for r in runner.run(old, bb, [["a"], ["b"]]))
        outcomes.append(snapshot(bb))
    assert outcomes[0] == outcomes[1]
    after = outcomes[1]
    assert after["a"]["greeting"] == "Hello Ann" and after["a"]["log"] == "- do1 do2"
    assert after["b"]["log"] == "- do1 undo1" and after["b"]["trail"] == "svc"
    assert after["a"]["trail"] == ["svc", "svc"]
