"""Parsed workflow definitions: frozen, picklable, free of running state.

The parser builds these; the interpreter reads them and keeps everything that
changes while an instance runs in its own objects.  Specs cross to Spark
workers by pickle, so they hold plain data only (XPath expressions as text;
each process compiles them once, see ``_conditions``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Activity",
    "Assign",
    "Catch",
    "Condition",
    "CopySpec",
    "Empty",
    "Exit",
    "Flow",
    "ForEach",
    "If",
    "InvokePipelet",
    "InvokeWorkflow",
    "LinkSource",
    "RepeatUntil",
    "Rethrow",
    "Scope",
    "Sequence",
    "Throw",
    "While",
    "Workflow",
]


@dataclass(frozen=True, slots=True)
class Condition:
    """An XPath 1.0 expression over the workflow object, with its source line."""

    expression: str
    line: int
    namespaces: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class LinkSource:
    """``<source linkName=...>`` with an optional ``transitionCondition``."""

    link: str
    condition: Condition | None
    line: int


@dataclass(frozen=True, slots=True)
class Activity:
    """What every activity has: where it is, its name and its link ends.

    ``aid`` numbers activities in document order, unique within a workflow
    (pipelet objects are cached per ``(workflow version, aid)`` on workers).
    """

    aid: int
    line: int
    name: str | None
    targets: tuple[str, ...] = ()
    sources: tuple[LinkSource, ...] = ()
    join_condition: Condition | None = None
    suppress_join_failure: bool = False

    kind = "activity"

    def children(self) -> tuple[Activity, ...]:
        """Directly nested activities, in document order."""
        return ()

    def label(self) -> str:
        return f"<{self.kind}{' ' + repr(self.name) if self.name else ''}>"


@dataclass(frozen=True, slots=True)
class Empty(Activity):
    kind = "empty"


@dataclass(frozen=True, slots=True)
class Exit(Activity):
    kind = "exit"


@dataclass(frozen=True, slots=True)
class Throw(Activity):
    fault_name: str = "fault"
    kind = "throw"


@dataclass(frozen=True, slots=True)
class Rethrow(Activity):
    kind = "rethrow"


@dataclass(frozen=True, slots=True)
class Sequence(Activity):
    body: tuple[Activity, ...] = ()
    kind = "sequence"

    def children(self) -> tuple[Activity, ...]:
        return self.body


@dataclass(frozen=True, slots=True)
class Flow(Activity):
    """Parallel branches; ``order`` is the run order respecting links."""

    body: tuple[Activity, ...] = ()
    links: tuple[str, ...] = ()
    order: tuple[int, ...] = ()
    kind = "flow"

    def children(self) -> tuple[Activity, ...]:
        return self.body


@dataclass(frozen=True, slots=True)
class If(Activity):
    """``if``/``elseif`` branches as (condition, activity); ``otherwise`` is ``else``."""

    branches: tuple[tuple[Condition, Activity], ...] = ()
    otherwise: Activity | None = None
    kind = "if"

    def children(self) -> tuple[Activity, ...]:
        acts = tuple(a for _, a in self.branches)
        return acts + ((self.otherwise,) if self.otherwise is not None else ())


@dataclass(frozen=True, slots=True)
class While(Activity):
    condition: Condition | None = None
    body: Activity | None = None
    kind = "while"

    def children(self) -> tuple[Activity, ...]:
        return (self.body,) if self.body is not None else ()


@dataclass(frozen=True, slots=True)
class RepeatUntil(Activity):
    condition: Condition | None = None
    body: Activity | None = None
    kind = "repeatUntil"

    def children(self) -> tuple[Activity, ...]:
        return (self.body,) if self.body is not None else ()


@dataclass(frozen=True, slots=True)
class ForEach(Activity):
    """Runs ``body`` once per record of the instance (``$record`` is that record)."""

    body: Activity | None = None
    parallel: bool = False
    counter_name: str | None = None
    kind = "forEach"

    def children(self) -> tuple[Activity, ...]:
        return (self.body,) if self.body is not None else ()


@dataclass(frozen=True, slots=True)
class Catch:
    """``<catch faultName=...>`` (``fault_name is None`` for ``catchAll``)."""

    fault_name: str | None
    activity: Activity
    line: int


@dataclass(frozen=True, slots=True)
class Scope(Activity):
    body: Activity | None = None
    handlers: tuple[Catch, ...] = ()
    kind = "scope"

    def children(self) -> tuple[Activity, ...]:
        own = (self.body,) if self.body is not None else ()
        return own + tuple(h.activity for h in self.handlers)


@dataclass(frozen=True, slots=True)
class CopySpec:
    """One ``<copy>``: where the value comes from and where it goes.

    ``source`` is one of ``("literal", text)``, ``("expression", Condition)``,
    ``("attribute", path)``, ``("annotation", (path or "", name))``,
    ``("variable", name)``; ``target`` one of ``("attribute", path)``,
    ``("annotation", (path or "", name))``, ``("variable", name)``, or
    ``("record_attribute", (n, key))`` -- attribute ``key`` of the instance's
    n-th record (1-based), SMILA's ``$request.records/rec:Record[n]/rec:Val[@key=...]``;
    then the source is evaluated once over all the instance's records.
    A copy between BPEL variables (``$request`` to ``$result`` in SMILA's echo
    pipelines) carries no meaning here and does nothing.
    """

    source: tuple[str, Any]
    target: tuple[str, Any]
    line: int


@dataclass(frozen=True, slots=True)
class Assign(Activity):
    copies: tuple[CopySpec, ...] = ()
    kind = "assign"


@dataclass(frozen=True, slots=True)
class InvokePipelet(Activity):
    """Call ``pipelet_class`` (a dotted path, aliases resolved) with ``config``."""

    pipelet_class: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    kind = "invokePipelet"

    def label(self) -> str:
        return f"<invokePipelet {self.name or self.pipelet_class!r}>"


@dataclass(frozen=True, slots=True)
class InvokeWorkflow(Activity):
    workflow: str = ""
    kind = "invokeWorkflow"


def walk(activity: Activity) -> Iterator[Activity]:
    """``activity`` and every activity nested in it, in document order."""
    yield activity
    for child in activity.children():
        yield from walk(child)


@dataclass(frozen=True, slots=True)
class Workflow:
    """A loaded, validated workflow.

    ``version`` is a hash of the file's text: a batch always runs on one
    version, and workers cache configured pipelets per version.
    ``subworkflows`` holds every workflow reachable through ``invokeWorkflow``
    (transitively), so a worker needs nothing but this object.
    ``search_path`` lists directories to put on ``sys.path`` before importing
    pipelet classes (the workflow directory and the working directory).
    ``workdir`` is the working directory the workflow was loaded in: Spark
    workers run its instances there (when it exists on their host), so a
    pipelet's relative file paths mean what they meant when it was validated.
    """

    name: str
    path: str
    body: Activity
    version: str
    search_path: tuple[str, ...] = ()
    workdir: str = ""
    subworkflows: tuple[tuple[str, Workflow], ...] = ()
    invoked: tuple[tuple[str, int], ...] = ()

    def activities(self) -> Iterator[Activity]:
        """Every activity of this workflow (not of its sub-workflows)."""
        return walk(self.body)

    def pipelets(self) -> Iterator[InvokePipelet]:
        return (a for a in self.activities() if isinstance(a, InvokePipelet))

    def subworkflow(self, name: str) -> Workflow:
        for key, wf in self.subworkflows:
            if key == name:
                return wf
        raise KeyError(name)

    def __repr__(self) -> str:
        return f"Workflow({self.name!r}, {self.path!r}, version={self.version[:12]})"
