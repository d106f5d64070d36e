"""A run of the interpreter leaves no reference cycles: refcounting frees it, its blackboard
and every record on it (a service runs with the cyclic collector off most of the time).

The workflow here uses every kind of activity the interpreter runs (the test checks that it
still does when the table grows), on instances that complete, exit, catch a fault, or fail
with a fault raised deep in the interpreter.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine_helpers import BPEL_HEADER, pipelet, records
from test_smila_syntax import _hello_file

from blackboard import Blackboard
from blackboard._blackboard import Blackboard as BlackboardClass
from engine import LocalRunner, Workflow, WorkflowRegistry
from engine._activities import RUNNERS
from engine._instances import Completed, Instance, ScopeFrame
from engine._interpreter import Interpreter
from engine._specs import walk
from engine._variables import Frame

RUNNING_STATE = (BlackboardClass, Interpreter, Instance, ScopeFrame, Completed, Frame)


def mark(value: str) -> str:
    return pipelet(f"mark_{value}", "Mark", value=value)


def when(kind: str, activity: str) -> str:
    return f"<if><condition>$record/Val[@key='kind'] = '{kind}'</condition>{activity}</if>"


EVERYTHING = f"""
  <variables>
    <variable name="note" type="xsd:string" xmlns:xsd="http://www.w3.org/2001/XMLSchema">
      <from><literal>start</literal></from>
    </variable>
    <variable name="missing" type="xsd:string" xmlns:xsd="http://www.w3.org/2001/XMLSchema"/>
  </variables>
  <sequence>
    <flow>
      <links><link name="first"/></links>
      <sequence><sources><source linkName="first"/></sources>{mark("flow")}</sequence>
      <sequence><targets><target linkName="first"/></targets><empty/></sequence>
    </flow>
    <scope name="outer">
      <faultHandlers>
        <catch faultName="boom"><sequence><compensate/>{mark("caught")}</sequence></catch>
      </faultHandlers>
      <sequence>
        <scope name="inner"><compensationHandler>{mark("undone")}</compensationHandler>{mark("inner")}</scope>
        {when("throw", '<throw faultName="boom"/>')}
      </sequence>
    </scope>
    <scope>
      <faultHandlers><catchAll><rethrow/></catchAll></faultHandlers>
      {when("rethrow", '<throw faultName="again"/>')}
    </scope>
    <while><condition>not($record/Val[@key='counter']) or $record/Val[@key='counter'] &lt; 2</condition>
      {pipelet("inc", "Increment")}</while>
    <repeatUntil>{pipelet("inc_again", "Increment")}
      <condition>$record/Val[@key='counter'] &gt;= 3</condition></repeatUntil>
    <forEach counterName="i" parallel="yes">
      <startCounterValue>1</startCounterValue><finalCounterValue>2</finalCounterValue>
      <scope>{mark("counted")}</scope>
    </forEach>
    <forEach counterName="j" parallel="no"><scope>{mark("each")}</scope></forEach>
    <proc:invokeWorkflow workflow="Hello"/>
    {when("missing", '<assign><copy><from variable="missing"/><to variable="note"/></copy></assign>')}
    {when("exit", "<exit/>")}
    {mark("end")}
  </sequence>
"""

BATCH = {rid: {"kind": rid, "name": rid} for rid in ("plain", "throw", "rethrow", "missing", "exit")} | {
    "pair-1": {"kind": "pair", "name": "one"}, "pair-2": {"kind": "pair", "name": "two"}}
INSTANCES = [["plain"], ["throw"], ["rethrow"], ["missing"], ["exit"], ["pair-1", "pair-2"]]


def everything(tmp_path: Path) -> Workflow:
    """The workflow above, its sub-workflow the hello-world pipeline (variables, a web service)."""
    _hello_file(tmp_path)
    (tmp_path / "everything.xml").write_text(BPEL_HEADER.format(name="Everything") + EVERYTHING + "</process>")
    return WorkflowRegistry(tmp_path, services={"Greeter": "tests.engine._pipelets.Greeter"}).get("Everything")


def garbage_of(run: Callable[[], Any]) -> list[Any]:
    """The objects of the running state that only the cyclic collector would free after ``run()``."""
    gc.collect()
    gc.disable()
    try:
        gc.set_debug(gc.DEBUG_SAVEALL)
        run()
        gc.collect()
        return [o for o in gc.garbage if isinstance(o, RUNNING_STATE)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


def run_batch(wf: Workflow) -> list[Any]:
    bb = Blackboard.local()
    records(bb, BATCH)
    return LocalRunner().run(wf, bb, INSTANCES)


def test_the_workflow_here_uses_every_kind_of_activity(tmp_path: Path) -> None:
    wf = everything(tmp_path)
    used = {type(a) for a in walk(wf.body)} | {type(a) for a in walk(wf.subworkflow("Hello").body)}
    assert set(RUNNERS) - used == set()


def test_every_kind_of_activity_runs_without_leaving_reference_cycles(tmp_path: Path) -> None:
    wf = everything(tmp_path)
    results = run_batch(wf)  # what a first run sets up (pipelets, caches) stays
    assert [r.ok for r in results] == [True, True, False, False, True, True]
    assert "uninitializedVariable" in (results[3].error or "") and "again" in (results[2].error or "")
    assert garbage_of(lambda: run_batch(wf)) == []


def test_an_instance_that_failed_keeps_its_fault_but_not_the_frames_it_was_raised_in(tmp_path: Path) -> None:
    wf = everything(tmp_path)
    run_batch(wf)

    def missing_only() -> None:
        bb = Blackboard.local()
        records(bb, {"missing": BATCH["missing"]})
        (result,) = LocalRunner().run(wf, bb, [["missing"]])
        assert result.error is not None and "$missing has no value yet" in result.error

    assert garbage_of(missing_only) == []
