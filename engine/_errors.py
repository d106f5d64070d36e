"""Errors of the engine, split by whose fault they are.

* :class:`WorkflowDefinitionError` -- the workflow author's: the file does not
  parse, names an unknown pipelet, has cyclic links, ...  Every message names
  ``file:line``.
* :class:`UnknownWorkflowError` -- the caller asked for a workflow nobody
  defined.
* :class:`WorkflowFault` -- a BPEL fault raised while an instance runs
  (``throw``, a failing pipelet as ``pipeletError``); catchable in a ``scope``,
  uncaught it fails that instance only.
* :class:`RunnerError` -- the runner itself could not run a batch (not an
  instance's fault).
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = [
    "EngineError",
    "RunnerError",
    "UnknownWorkflowError",
    "WorkflowDefinitionError",
    "WorkflowFault",
]


class EngineError(Exception):
    """Base of every error the engine raises."""


class WorkflowDefinitionError(EngineError):
    """A workflow file is not valid.

    ``errors`` holds one ``"file:line: message"`` string per problem; ``str()``
    joins them with newlines.
    """

    def __init__(self, errors: Iterable[str]) -> None:
        self.errors: list[str] = list(errors)
        super().__init__("\n".join(self.errors))


class UnknownWorkflowError(EngineError, KeyError):
    """No workflow of that name is loaded."""

    def __init__(self, name: str, known: Iterable[str]) -> None:
        self.name = name
        self.known = sorted(known)
        super().__init__(name)

    def __str__(self) -> str:
        known = ", ".join(self.known) or "none"
        return f"unknown workflow {self.name!r}; known workflows: {known}"


class WorkflowFault(EngineError):
    """A BPEL fault in a running instance.

    ``name`` is the fault name a ``<catch faultName=...>`` matches
    (``pipeletError`` for a pipelet that raised, ``joinFailure`` for a join
    condition that failed without ``suppressJoinFailure``).
    """

    def __init__(self, name: str, message: str) -> None:
        self.name = name
        self.message = message
        super().__init__(f"{name}: {message}")


class RunnerError(EngineError):
    """The runner could not execute a batch at all (infrastructure, not an instance)."""
