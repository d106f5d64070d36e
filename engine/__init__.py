"""Engine: workflow XML -> validated model, the interpreter, the Spark runner.

``load_workflow`` / ``WorkflowRegistry`` load and validate BPEL-shaped
workflow files; ``SparkRunner`` runs a batch of instances on Spark (warm
workers, or a job of its own), ``ProcessRunner`` on worker processes the
runner supervises itself, ``LocalRunner`` in the caller's thread (tests,
embedding; ``classes_not_in_service`` says what keeps a workflow's small
batches off the service's workers).  ``validate_tree`` (a
:class:`ValidationReport`: errors, workflows found, unknown classes grouped
for ``--summary``), ``validate_path``, ``workflow_graph``, ``to_dot`` and
``render_graph`` serve the ``chalk validate`` and ``chalk graph`` commands
(``draft_graph``: a file with errors drawn too, the faulty activities marked).
"""

from engine._conditions import CompiledCondition, compile_condition
from engine._draft import draft_graph
from engine._errors import (
    EngineError,
    RunnerError,
    UnknownWorkflowError,
    WorkflowDefinitionError,
    WorkflowFault,
)
from engine._graph import render_graph, to_dot, workflow_graph
from engine._loader import WorkflowRegistry, WorkflowVersion, load_workflow
from engine._pipelets import DEFAULT_ALIASES, DEFAULT_SERVICES, classes_not_in_service
from engine._pipelets import instantiate as instantiate_pipelet
from engine._progress import PipeletCall, broke_its_run
from engine._runner import InstanceResult, LocalRunner, ProcessRunner, SparkRunner
from engine._session import spark_session
from engine._specs import Workflow
from engine._tree import FileReport, UnknownGroup, ValidationReport, validate_path, validate_tree
from engine._validate import Unknown

__all__ = [
    "CompiledCondition",
    "DEFAULT_ALIASES",
    "DEFAULT_SERVICES",
    "EngineError",
    "FileReport",
    "InstanceResult",
    "PipeletCall",
    "LocalRunner",
    "ProcessRunner",
    "RunnerError",
    "SparkRunner",
    "Unknown",
    "UnknownGroup",
    "UnknownWorkflowError",
    "ValidationReport",
    "Workflow",
    "WorkflowDefinitionError",
    "WorkflowFault",
    "WorkflowRegistry",
    "WorkflowVersion",
    "broke_its_run",
    "classes_not_in_service",
    "compile_condition",
    "draft_graph",
    "instantiate_pipelet",
    "load_workflow",
    "render_graph",
    "spark_session",
    "to_dot",
    "validate_path",
    "validate_tree",
    "workflow_graph",
]
