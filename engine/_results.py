"""What the runners share: a batch's instances exported for a run, and their outcomes
brought back onto the driver's blackboard.

The records travel as copies (packed: JSON and blobs) whether the
run is on Spark or in this process, so a run never touches the driver's
blackboard: only :func:`apply_outputs` does, on the caller's thread, for the
instances that ended.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from engine._worker import InstanceInput, InstanceOutput, split_packed

__all__ = ["InstanceResult", "apply_outputs", "failed", "inputs_for", "not_run"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class InstanceResult:
    """How one workflow instance ended.

    ``index`` is the instance's position in the ``instances`` argument of
    ``run``; ``result_ids`` the records the workflow returned (for routing);
    ``record_ids`` every record of the instance on the driver's blackboard:
    for an OK instance its inputs and the fragments it made (all imported),
    for a failed one its inputs (to invalidate).  ``not_run``: a failed instance
    that never began (no runner could run it: not its fault, and not an attempt).
    ``fault``: its run was not a plain one (it timed out or died, was rerun alone
    while its batch was isolated, or did not start where it was sent): the run's
    time says nothing of what its pipelets cost.  ``runs``: how many times a failed
    instance ran in this batch (2: its attempt failed as a whole, timed out or died, and so
    did its rerun alone); the message counts each as an attempt.
    """

    index: int
    ok: bool
    error: str | None
    result_ids: list[str] = field(default_factory=list)
    record_ids: list[str] = field(default_factory=list)
    not_run: bool = False
    fault: bool = False
    runs: int = 1


def inputs_for(blackboard: Any, instances: list[tuple[int, list[str]]]) -> list[InstanceInput]:
    """Export ``(index, record IDs)`` instances for the interpreter (copies of the records)."""
    unique = [(index, list(dict.fromkeys(ids))) for index, ids in instances]
    docs, envs, blobs = blackboard.export_packed(  # one call for the batch
        [rid for _, ids in unique for rid in ids], attachments="all")
    parts = split_packed(docs, envs, blobs, [len(ids) for _, ids in unique])
    return [InstanceInput(index, ids, packed)
            for (index, ids), packed in zip(unique, parts, strict=True)]


def failed(row: InstanceInput, reason: str) -> InstanceOutput:
    """The outcome of an instance that did not run to its end."""
    return InstanceOutput(row.index, False, reason, [], list(row.ids), None, fault=True)


def not_run(row: InstanceInput, reason: str) -> InstanceOutput:
    """The outcome of an instance no runner could begin (``reason`` says which did not start)."""
    return InstanceOutput(row.index, False, reason, [], list(row.ids), None, not_run=True,
                          fault=True)


def apply_outputs(blackboard: Any, outputs: Sequence[InstanceOutput]) -> list[InstanceResult]:
    """Import the changes of the instances that succeeded; a result per output, in order."""
    results = []
    docs: list[bytes] = []
    envs: list[list[Any]] = []
    blobs: list[bytes] = []
    for out in outputs:
        p = out.packed
        if out.ok and p is not None and p.docs:
            docs += p.docs
            envs += p.env
            blobs += p.blobs
        results.append(InstanceResult(out.index, out.ok, out.error, list(out.result_ids),
                                      list(out.record_ids), out.not_run, out.fault, out.runs))
    if docs:
        blackboard.import_packed(docs, envs, blobs, changed=True)
    failures = sum(1 for r in results if not r.ok)
    if failures:
        log.info("%d of %d instance(s) failed", failures, len(results))
    return results
