"""Basic activities that change no record and no variable: ``throw``, ``rethrow``, ``exit``, ``empty``.

``throw`` faults every instance of the cohort with its fault name;
``rethrow`` (in a fault handler) faults it again with the fault being
handled; ``exit`` ends the instance at once, successfully (what ran so far
is kept); ``empty`` does nothing (``receive``/``reply`` run as it).
"""

from __future__ import annotations

from typing import Any

from engine._errors import WorkflowFault
from engine._instances import Instance, State
from engine._interpreter import Interpreter
from engine._specs import Exit, Rethrow, Throw, Workflow

__all__ = ["empty", "exit_", "rethrow", "throw"]


def throw(it: Interpreter, wf: Workflow, act: Throw, cohort: list[Instance]) -> None:
    for inst in cohort:
        inst.fail(WorkflowFault(act.fault_name, f"thrown at {wf.path}:{act.line}"))


def rethrow(it: Interpreter, wf: Workflow, act: Rethrow, cohort: list[Instance]) -> None:
    for inst in cohort:
        fault = inst.handling[-1] if inst.handling else WorkflowFault("rethrow", "nothing to rethrow")
        inst.fail(fault)


def exit_(it: Interpreter, wf: Workflow, act: Exit, cohort: list[Instance]) -> None:
    for inst in cohort:
        inst.state = State.EXITED


def empty(it: Interpreter, wf: Workflow, act: Any, cohort: list[Instance]) -> None:
    return None
