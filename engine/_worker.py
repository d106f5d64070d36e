"""What runs in one partition: records in, interpreter over all instances, changes out.

This module is imported on Spark workers; it must not touch the driver's
blackboard or Spark.  Records travel as JSON (transport items without their
attachment bytes) plus a list of binary blobs, never pickle.

``run_instances`` takes every instance of the partition, runs them together
on a partition-local blackboard, and reruns *tainted* instances (those in a
batched pipelet call that raised) from their original records, in halves,
until every instance has its own result.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from engine._interpreter import Instance, Interpreter, State
from engine._pipelets import configured_pipelet
from engine._specs import Workflow

__all__ = ["InstanceInput", "InstanceOutput", "decode_items", "encode_items", "run_instances"]

log = logging.getLogger(__name__)


@dataclass
class InstanceInput:
    """One instance's records as they travel: JSON text plus attachment blobs.

    Kept encoded so each (re)run decodes a pristine copy: the blackboard
    takes documents over without copying and pipelets change them in place.
    """

    index: int
    ids: list[str]
    payload: str
    blobs: list[bytes]


@dataclass
class InstanceOutput:
    index: int
    ok: bool
    error: str | None
    result_ids: list[str]
    record_ids: list[str]
    items: list[dict[str, Any]]  # changed records (transport items), empty when not ok


def encode_items(items: list[dict[str, Any]]) -> tuple[str, list[bytes]]:
    """Transport items -> (JSON text, attachment blobs); the JSON names blobs by index."""
    blobs: list[bytes] = []
    plain = []
    for item in items:
        atts = item.get("attachments") or {}
        refs = {}
        for name, data in atts.items():
            refs[name] = len(blobs)
            blobs.append(bytes(data))
        out = {k: v for k, v in item.items() if k != "attachments"}
        out["attachments"] = refs
        plain.append(out)
    return json.dumps(plain, separators=(",", ":"), ensure_ascii=False), blobs


def decode_items(text: str, blobs: list[bytes] | None) -> list[dict[str, Any]]:
    """Inverse of :func:`encode_items`."""
    items = json.loads(text)
    blobs = blobs or []
    for item in items:
        item["attachments"] = {name: blobs[i] for name, i in (item.get("attachments") or {}).items()}
    return items


def _run_group(workflow: Workflow, group: list[InstanceInput]) -> tuple[list[InstanceOutput], list[list[InstanceInput]]]:
    """Run ``group`` together; return finished outputs and groups to rerun."""
    from blackboard import Blackboard

    bb = Blackboard.local()
    for inp in group:
        bb.import_records(decode_items(inp.payload, inp.blobs), changed=False)
    for inp in group:
        bb.bind_instance(inp.index, inp.ids)
    instances = [Instance(key=inp.index, ids=list(inp.ids)) for inp in group]
    Interpreter(bb, workflow, configured_pipelet).run(instances)

    members: dict[Any, list[str]] = {}
    for rid in bb.ids():
        members.setdefault(bb.instance_of(rid), []).append(rid)
    changed = set(bb.changed_ids())
    outputs: list[InstanceOutput] = []
    tainted: list[InstanceInput] = []
    for inp, inst in zip(group, instances, strict=True):
        if inst.state is State.TAINTED:
            tainted.append(inp)
            continue
        record_ids = members.get(inp.index, list(inp.ids))
        if inst.ok:
            mine = [rid for rid in record_ids if rid in changed]
            new = [rid for rid in mine if bb.is_new(rid) and rid not in inp.ids]
            old = [rid for rid in mine if rid not in set(new)]
            items = bb.export_records(old, attachments="changed") + bb.export_records(new, attachments="all")
            outputs.append(InstanceOutput(inp.index, True, None, list(inst.ids), record_ids, items))
        else:
            fault = inst.fault
            error = str(fault) if fault is not None else f"instance ended as {inst.state.value}"
            outputs.append(InstanceOutput(inp.index, False, error, [], list(inp.ids), []))
    reruns: list[list[InstanceInput]] = []
    if tainted:
        if len(tainted) == 1:
            reruns.append(tainted)
        else:
            half = len(tainted) // 2
            reruns.extend([tainted[:half], tainted[half:]])
    return outputs, reruns


def run_instances(workflow: Workflow, inputs: list[InstanceInput]) -> list[InstanceOutput]:
    """Run every instance of one partition; outputs in input order."""
    started = time.perf_counter()
    pending = [inputs] if inputs else []
    done: dict[int, InstanceOutput] = {}
    rounds = 0
    while pending:
        group = pending.pop()
        rounds += 1
        outputs, reruns = _run_group(workflow, group)
        for out in outputs:
            done[out.index] = out
        pending.extend(reruns)
    log.debug(
        "ran %d instance(s) of %s in %.3fs (%d round(s))",
        len(inputs), workflow.name, time.perf_counter() - started, rounds, extra={"workflow": workflow.name},
    )
    return [done[inp.index] for inp in inputs]


# -- Arrow side (Spark workers) -------------------------------------------------------

INPUT_FIELDS = ("idx", "ids", "payload", "blobs")
OUTPUT_FIELDS = ("idx", "ok", "error", "result_ids", "record_ids", "payload", "blobs")


def output_schema() -> Any:
    import pyarrow as pa

    return pa.schema([
        ("idx", pa.int64()),
        ("ok", pa.bool_()),
        ("error", pa.string()),
        ("result_ids", pa.list_(pa.string())),
        ("record_ids", pa.list_(pa.string())),
        ("payload", pa.large_string()),
        ("blobs", pa.list_(pa.large_binary())),
    ])


def arrow_partition(workflow: Workflow, batches: Iterator[Any]) -> Iterator[Any]:
    """``mapInArrow`` function body: all instances of the partition, one output batch."""
    import pyarrow as pa

    inputs: list[InstanceInput] = []
    for batch in batches:
        cols = batch.to_pydict()
        for idx, ids, payload, blobs in zip(cols["idx"], cols["ids"], cols["payload"], cols["blobs"], strict=True):
            inputs.append(InstanceInput(int(idx), list(ids), payload, list(blobs or [])))
    if not inputs:
        return
    outputs = run_instances(workflow, inputs)
    columns: dict[str, list[Any]] = {name: [] for name in OUTPUT_FIELDS}
    for out in outputs:
        payload, blobs = encode_items(out.items)
        columns["idx"].append(out.index)
        columns["ok"].append(out.ok)
        columns["error"].append(out.error)
        columns["result_ids"].append(out.result_ids)
        columns["record_ids"].append(out.record_ids)
        columns["payload"].append(payload)
        columns["blobs"].append(blobs)
    yield pa.RecordBatch.from_pydict(columns, schema=output_schema())
