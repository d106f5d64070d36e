"""What runs each activity: the table (the parser's ``PARSERS`` table's twin), and a whole run.

Each entry is a plain function ``step(interpreter, workflow, activity,
cohort)`` from the module of its idea; :class:`~engine._interpreter.Interpreter`
is given the table and looks each activity's function up in it.
:func:`run_workflow` runs a workflow from the top for a cohort of instances.
"""

from __future__ import annotations

from typing import Any

from engine import _assign, _basic, _compensation, _invoke, _loops, _structured
from engine._instances import Instance, State
from engine._interpreter import Interpreter, PipeletFactory, ServiceFactory, Step
from engine._specs import (
    Activity,
    Assign,
    Compensate,
    Empty,
    Exit,
    Flow,
    ForEach,
    If,
    InvokePipelet,
    InvokeService,
    InvokeWorkflow,
    RepeatUntil,
    Rethrow,
    Scope,
    Sequence,
    Throw,
    While,
    Workflow,
)

__all__ = ["RUNNERS", "run_workflow"]

RUNNERS: dict[type[Activity], Step] = {
    Sequence: _structured.sequence,
    Flow: _structured.flow,
    If: _structured.if_,
    Scope: _structured.scope,
    While: _loops.while_,
    RepeatUntil: _loops.repeat_until,
    ForEach: _loops.for_each,
    Throw: _basic.throw,
    Rethrow: _basic.rethrow,
    Exit: _basic.exit_,
    Empty: _basic.empty,
    Assign: _assign.assign,
    InvokePipelet: _invoke.invoke_pipelet,
    InvokeService: _invoke.invoke_service,
    InvokeWorkflow: _invoke.invoke_workflow,
    Compensate: _compensation.compensate,
}


def run_workflow(blackboard: Any, workflow: Workflow, instances: list[Instance], pipelet_for: PipeletFactory,
                 service_for: ServiceFactory | None = None) -> list[Instance]:
    """Run ``workflow`` for ``instances`` (records on ``blackboard``); on return none is RUNNING.

    ``pipelet_for``/``service_for`` make the configured pipelet or service of
    an activity (see ``engine._pipelets``).
    """
    it = Interpreter(blackboard, workflow, pipelet_for, service_for, steps=RUNNERS)
    _structured.process(it, workflow, instances)
    for inst in instances:
        if inst.running:
            inst.state = State.COMPLETED
    return instances
