"""The data behind each panel of the page: one function per panel.

Each reads what the service already keeps (membership, the registry, the
store, the watch's history and samples) or what the ``chalk`` command
reads (dead letters, through the dead-letters feature), so a panel changes
source by changing one function: the topology shows every field the
cluster's member rows have.  The operator's panels are in ``_console``, the
job log's in ``_joblog``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from listener_router._settings import Settings
from listener_router.broker import Link, dlq_name, retry_name
from listener_router.dead_letters import READ_BYTES, body_records
from listener_router.dead_letters import dead_letters as stored_dead_letters
from listener_router.dead_letters import replay as replay_letters
from listener_router.store import ServiceStore
from listener_router.watch._history import HOUR, BatchSummary, History, Sample, Sampler
from listener_router.watch._svg import line_chart, workflow_svg

if TYPE_CHECKING:
    import engine
    from listener_router.cluster import Membership

__all__ = ["DeadLetter", "QueueRow", "Topology", "WorkflowView", "dead_letters", "known_queues",
           "queues", "recent_batches", "replay", "topology", "workflows"]

RATE_WINDOW = 60.0  # seconds the rates in the queue table are taken over


# -- topology ------------------------------------------------------------------------
@dataclass(frozen=True)
class Topology:
    node: str
    leader: str | None
    is_leader: bool
    members: list[dict[str, Any]]     # every field of each live member's row


def topology(membership: Membership) -> Topology:
    """This node, the leader and the live members (each with all the fields the store has)."""
    members = [dataclasses.asdict(m) if dataclasses.is_dataclass(m) else dict(vars(m))
               for m in membership.members()]
    leader = members[0]["name"] if members else membership.leader
    return Topology(membership.name, leader, leader == membership.name, members)


# -- queues --------------------------------------------------------------------------
@dataclass(frozen=True)
class QueueRow:
    name: str
    role: str                  # input, dead letters, retry N, output
    depth: int | None
    consumers: int | None
    in_rate: float | None      # messages/s taken from it by this process (last minute)
    out_rate: float | None     # messages/s routed to it by this process
    chart: str                 # SVG: rates and depth over the last hour
    under: str | None = None   # a dead-letter or retry queue: its input queue (folded under it)
    waiting: int = 0           # an input queue: its dead letters (in .dlq and kept), the latest


def known_queues(settings: Settings, history: History) -> list[tuple[str, str]]:
    """Every queue the service uses, with its role: inputs and their dead-letter and retry
    queues, outputs (configured, and those routed to by ``nextDestination``)."""
    found: dict[str, str] = {}
    for rule in settings.listeners:
        found.setdefault(rule.queue, "input")
        found.setdefault(dlq_name(rule.queue), "dead letters")
        for step in range(1, len(rule.backoff_ms) + 1):
            found.setdefault(retry_name(rule.queue, step), f"retry {step}")
    for router in settings.routers:
        if router.queue and not router.exchange:
            found.setdefault(router.queue, "output")
    _taken, sent = history.totals()
    for target in sorted(sent):
        if "/" not in target:
            found.setdefault(target, "output")
    return list(found.items())


def _rate(samples: Sequence[Sample], now: Sample | None, queue: str, sent: bool) -> float | None:
    if now is None:
        return None
    since = [s for s in samples if now.at - s.at <= RATE_WINDOW and s is not now]
    if not since:
        return None
    first = since[0]
    counts = (lambda s: s.sent.get(queue, 0)) if sent else (lambda s: s.taken.get(queue, 0))
    return (counts(now) - counts(first)) / max(now.at - first.at, 1e-9)


def queues(settings: Settings, history: History, sampler: Sampler) -> list[QueueRow]:
    """Each queue: depth, consumers, rates over the last minute, a chart of the last hour."""
    samples = sampler.window(HOUR)
    latest = samples[-1] if samples else None
    end = time.time()
    start = min(samples[0].at, end - 60) if samples else end - 60
    under: dict[str, str] = {}
    for rule in settings.listeners:
        under.setdefault(dlq_name(rule.queue), rule.queue)
        for step in range(1, len(rule.backoff_ms) + 1):
            under.setdefault(retry_name(rule.queue, step), rule.queue)
    rows = []
    for queue, role in known_queues(settings, history):
        taken, sent, depth = [], [], []
        for earlier, later in zip(samples, samples[1:], strict=False):
            dt = max(later.at - earlier.at, 1e-9)
            taken.append((later.at, (later.taken.get(queue, 0) - earlier.taken.get(queue, 0)) / dt))
            sent.append((later.at, (later.sent.get(queue, 0) - earlier.sent.get(queue, 0)) / dt))
        for s in samples:
            if s.depth.get(queue) is not None:
                depth.append((s.at, float(s.depth[queue] or 0)))
        series = [("depth", "#999", depth)]
        if any(v for _t, v in taken) or role == "input":
            series.append(("in/s", "#1f6fd1", taken))
        if any(v for _t, v in sent) or role == "output":
            series.append(("out/s", "#2a9d3a", sent))
        rows.append(QueueRow(
            name=queue, role=role,
            depth=latest.depth.get(queue) if latest else None,
            consumers=latest.consumers.get(queue) if latest else None,
            in_rate=_rate(samples, latest, queue, sent=False),
            out_rate=_rate(samples, latest, queue, sent=True),
            chart=line_chart(series, start=start, end=end), under=under.get(queue),
            waiting=_waiting(latest, queue) if role == "input" else 0))
    return rows


def _waiting(sample: Sample | None, queue: str) -> int:
    """Dead letters of input ``queue`` at the sample: in its .dlq and kept in the store."""
    if sample is None:
        return 0
    return (sample.depth.get(dlq_name(queue)) or 0) + (sample.kept or {}).get(queue, 0)


# -- batches -------------------------------------------------------------------------
def recent_batches(history: History, limit: int = 20) -> list[BatchSummary]:
    """The last finished batches, newest first."""
    return history.batches()[:limit]


# -- dead letters --------------------------------------------------------------------
@dataclass(frozen=True)
class DeadLetter:
    queue: str                 # the input queue it was dead-lettered from
    message_id: str
    attempts: str
    workflow: str
    error: str
    records: tuple[str, ...]
    body_note: str | None = None   # why its records are not listed ("unreadable body (…)")


def dead_letters(settings: Settings, store: ServiceStore, limit: int = 50) -> list[DeadLetter]:
    """Dead letters of every input queue, as the service's store keeps them (its leader
    moves them off ``Q.dlq``); each body (up to ``READ_BYTES`` of it) is read on its own,
    so one that cannot be read says why in its row and the others are listed as usual."""
    queues = list(dict.fromkeys(rule.queue for rule in settings.listeners))
    rows = []
    for d in stored_dead_letters(settings, queues, limit=limit, store=store,
                                 body_bytes=READ_BYTES):
        records, note = body_records(d)
        rows.append(DeadLetter(d.queue, d.message_id, str(d.attempts), d.workflow, d.error,
                               tuple(records), note))
    return rows


def replay(settings: Settings, queue: str, message_id: str | None, store: ServiceStore,
           link: Link) -> int:
    """Put one dead letter (or all of ``queue``'s) back on its queue: ``chalk dlq replay``,
    with the service's store and link."""
    if queue not in {rule.queue for rule in settings.listeners}:
        raise ValueError(f"{queue!r} is not an input queue of this service")
    return replay_letters(settings, [queue], message_id=message_id or None, by="the dashboard",
                          store=store, link=link)


# -- workflows -----------------------------------------------------------------------
@dataclass(frozen=True)
class WorkflowView:
    name: str
    version: str
    path: str
    errors: list[str]          # of its file now: the version shown is the last good one
    svg: str


def workflows(registry: engine.WorkflowRegistry) -> tuple[list[WorkflowView], list[str]]:
    """Each running workflow (its last good version, drawn), and the errors of files that
    give no workflow."""
    errors = registry.errors
    views = []
    shown: set[str] = set()
    for name in registry.names():
        wf = registry.get(name)
        mine = [e for e in errors if e.startswith(f"{wf.path}:")]
        shown.update(mine)
        views.append(WorkflowView(name, wf.version, wf.path, mine, workflow_svg(wf)))
    return views, [e for e in errors if e not in shown]
