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
    "Compensate",
    "Condition",
    "CopySpec",
    "Empty",
    "Exit",
    "Flow",
    "ForEach",
    "If",
    "InvokePipelet",
    "InvokeService",
    "InvokeWorkflow",
    "LinkSource",
    "RepeatUntil",
    "Rethrow",
    "Scope",
    "Sequence",
    "Throw",
    "Variable",
    "While",
    "Workflow",
]


@dataclass(frozen=True, slots=True)
class Condition:
    """An XPath 1.0 expression over the workflow object, with its source line.

    ``variables`` names the BPEL variables (and ``forEach`` counters) in scope
    where the expression stands: the static check binds them, so a reference
    to anything else is reported as undefined.
    """

    expression: str
    line: int
    namespaces: tuple[tuple[str, str], ...] = ()
    variables: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Variable:
    """A BPEL ``<variable>`` declared on a process or scope.

    ``kind`` is ``"records"`` for SMILA's ``proc:ProcessorMessage`` variables
    (they all stand for the instance's records), ``"message"`` for another
    WSDL message (a value per part), ``"element"`` for an element variable and
    ``"simple"`` for an XML Schema simple type (a text value).  ``init`` is an
    inline ``<from>`` (a copy source, see :class:`CopySpec`).
    """

    name: str
    kind: str
    line: int
    init: tuple[str, Any] | None = None


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
    """BPEL ``forEach``: ``body`` once per counter value, or once per record.

    With ``start``/``final`` (``startCounterValue``/``finalCounterValue``) the
    body runs over the instance's records for each counter value from start to
    final, the counter bound as ``$<counter_name>``.  Without them it runs once
    per record of the instance (``$record`` is that record; the counter is the
    record's position, from 1).  ``branches`` is the ``completionCondition``:
    the loop ends once that many branches completed (successfully only, with
    ``successful_only``).
    """

    body: Activity | None = None
    parallel: bool = False
    counter_name: str | None = None
    start: Condition | None = None
    final: Condition | None = None
    branches: Condition | None = None
    successful_only: bool = False
    kind = "forEach"

    @property
    def counted(self) -> bool:
        return self.start is not None

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
    """A scope: its body, fault handlers, variables, compensation and termination handlers.

    ``compensation``/``termination`` are the handlers' activities (None: the
    default handler, which compensates the scope's completed inner scopes).
    """

    body: Activity | None = None
    handlers: tuple[Catch, ...] = ()
    variables: tuple[Variable, ...] = ()
    compensation: Activity | None = None
    termination: Activity | None = None
    kind = "scope"

    def children(self) -> tuple[Activity, ...]:
        own = (self.body,) if self.body is not None else ()
        extra = tuple(a for a in (self.compensation, self.termination) if a is not None)
        return own + tuple(h.activity for h in self.handlers) + extra


@dataclass(frozen=True, slots=True)
class Compensate(Activity):
    """``compensate`` (every completed inner scope) or ``compensateScope target=``.

    Allowed only in a fault, compensation or termination handler; it undoes
    the completed scopes directly inside the scope the handler belongs to, in
    the reverse order of their completion.
    """

    target: str | None = None
    kind = "compensate"

    def label(self) -> str:
        return f"<compensateScope {self.target!r}>" if self.target else "<compensate>"


@dataclass(frozen=True, slots=True)
class CopySpec:
    """One ``<copy>``: where the value comes from and where it goes.

    ``source`` is one of ``("literal", text)``, ``("expression", Condition)``,
    ``("attribute", path)``, ``("annotation", (path or "", name))``,
    ``("xml", serialized element)`` (an element ``<literal>``),
    ``("variable", (name, part, query))``; ``target`` one of
    ``("attribute", path)``, ``("annotation", (path or "", name))``,
    ``("variable", (name, part, query))`` (``<to>$hi.parameters/arg0</to>``
    becomes part ``parameters`` of ``hi`` with the query ``arg0``),
    ``("records", None)`` (SMILA's
    ``proc:ProcessorMessage`` variables: the instance's records),
    ``("record_attribute", (n, key))`` -- attribute ``key`` of the instance's
    n-th record (1-based), SMILA's ``$request.records/rec:Record[n]/rec:Val[@key=...]``
    or ``.../rec:A[@n=...]/rec:L/rec:V``; n is 0 for ``$record/Val[@key=...]``:
    each record's own -- or ``("record_annotation", (n, name))``
    (``.../rec:An[@n=...]``); for those the source is evaluated over all the
    instance's records, ``$record`` the one written.  ``query`` is a :class:`Condition` (``<query>``)
    or None.  A copy between two records variables (``$request`` to
    ``$result`` in SMILA's echo pipelines) does nothing: both are the records.
    """

    source: tuple[str, Any]
    target: tuple[str, Any]
    line: int
    keep_name: bool = False  # keepSrcElementName="yes"


@dataclass(frozen=True, slots=True)
class Assign(Activity):
    copies: tuple[CopySpec, ...] = ()
    kind = "assign"


@dataclass(frozen=True, slots=True)
class InvokePipelet(Activity):
    """Call ``pipelet_class`` (a dotted path, aliases resolved) with ``config``.

    ``requested`` is the class (or, for SMILA's older ``invokeService``, the
    service name) as the file wrote it, before the alias tables;
    ``service`` is True for ``invokeService``.
    """

    pipelet_class: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    requested: str = ""
    service: bool = False
    kind = "invokePipelet"

    def label(self) -> str:
        tag = "invokeService" if self.service else "invokePipelet"
        return f"<{tag} {self.name or self.requested or self.pipelet_class!r}>"


@dataclass(frozen=True, slots=True)
class InvokeService(Activity):
    """BPEL ``invoke`` of a partner service (not a pipeline): a message service.

    ``service_class`` (from the service table, by partner link name) gets the
    input variable's parts and returns the output variable's parts.
    """

    partner_link: str = ""
    operation: str = ""
    input_variable: str | None = None
    output_variable: str | None = None
    service_class: str = ""
    kind = "invoke"

    def label(self) -> str:
        return f"<invoke {self.name or self.partner_link!r}>"


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
    ``variables`` are the process's ``<variables>``.
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
    variables: tuple[Variable, ...] = ()

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
