"""What runs in one partition: records in, interpreter over all instances, changes out.

This module is imported on Spark workers; it must not touch the driver's
blackboard or Spark.  Records travel as JSON, never pickle, in the
blackboard's packed form (``Blackboard.export_packed``): each record's
document as compact JSON bytes (a record loaded and not read: the text the
store gave, with the message's attributes as deferred writes in its
envelope, applied where the worker parses it), a small JSON list per record
(its envelope: ID, parent, mode, version, flags, deferred writes, notes),
and the attachment bytes apart (see :class:`Packed`).  Workers send back
only the records that changed: an input record that comes out as it went
in stays home.

``run_instances`` takes every instance of the partition, runs them together
on a partition-local blackboard, and reruns *tainted* instances (those in a
batched pipelet call that raised) from their original records, in halves,
until every instance has its own result.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import orjson

from blackboard import gc_paused
from engine._activities import run_workflow
from engine._instances import Instance, State
from engine._pipelets import configured_pipelet, configured_service
from engine._specs import Workflow

__all__ = [
    "InstanceInput",
    "InstanceOutput",
    "Packed",
    "blob_count",
    "freeze_worker_heap",
    "frozen_heap",
    "run_instances",
    "split_inputs",
    "split_packed",
]

log = logging.getLogger(__name__)


@dataclass
class Packed:
    """Records as they travel: one JSON document per record, their envelopes, blobs.

    The blackboard's packed form (``Blackboard.export_packed``): ``docs[i]``
    is record *i*'s document as compact JSON bytes (a loaded record not
    parsed: its stored text, the writes not applied yet in its envelope);
    ``env[i]`` its envelope, a short JSON-ready list (``blackboard``'s
    ``ENVELOPE`` names the fields), which travels in the chunk's ``meta``
    (one encode per chunk, not per instance); ``blobs`` the attachment bytes
    the envelopes name, in order.  Documents stay bytes until a pipelet
    reads them.  Treat a Packed as read-only: a rerun imports it again.
    """

    docs: list[bytes]
    env: list[list[Any]]
    blobs: list[bytes]


@dataclass
class InstanceInput:
    """One instance's records as they travel.

    Kept encoded so each (re)run decodes a pristine copy: the blackboard
    takes documents over without copying and pipelets change them in place.
    """

    index: int
    ids: list[str]
    packed: Packed


@dataclass
class InstanceOutput:
    index: int
    ok: bool
    error: str | None
    result_ids: list[str]
    record_ids: list[str]
    packed: Packed | None  # changed records; None when not ok or nothing changed
    not_run: bool = False  # it never began: no runner could run it (not its fault)
    # its run was not a plain one: it timed out or died, ran again alone after its attempt
    # failed as a whole, or went elsewhere when a runner did not start (its run's time
    # measures the fault, not what its pipelets cost)
    fault: bool = False
    # the runs this outcome took: 2 for an instance that failed again alone after the attempt
    # it shared failed as a whole (its lone rerun was a second try of it)
    runs: int = 1


def _dumps(value: Any) -> bytes:
    try:
        return orjson.dumps(value)
    except TypeError:  # non-str keys, integers past 64 bits: json's (slower) way
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


EMPTY = Packed([], [], [])
_ID, _DELETED, _OPS, _NOTES, _BLOBS = 0, 4, 5, 6, 7   # envelope fields (blackboard's ENVELOPE)


def blob_count(envs: list[list[Any]]) -> int:
    """How many attachment blobs the envelopes name."""
    return sum(len(env[_BLOBS]) for env in envs if env[_BLOBS])


def split_packed(docs: list[bytes], envs: list[list[Any]], blobs: list[bytes],
                 sizes: Iterable[int]) -> list[Packed]:
    """The records of one export in consecutive parts of ``sizes`` records each."""
    out: list[Packed] = []
    if not blobs:
        at = 0
        for size in sizes:
            if size == 1:  # one record an instance: the common case
                out.append(Packed([docs[at]], [envs[at]], []))
                at += 1
            else:
                out.append(Packed(docs[at:at + size], envs[at:at + size], []))
                at += size
        return out
    at = nb = 0
    for size in sizes:
        end = at + size
        mine = envs[at:end]
        count = blob_count(mine)
        out.append(Packed(docs[at:end], mine, blobs[nb:nb + count]))
        at, nb = end, nb + count
    return out


_freeze_lock = threading.Lock()
_freeze_depth = 0


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Keep the cyclic garbage collector out of a batch.

    A batch allocates hundreds of thousands of containers (documents, items,
    parsed JSON: no reference cycles) and drops them at its end; collections
    meanwhile would walk them -- and the driver's blackboard, Spark's and
    pyarrow's modules -- again and again.  Objects that existed before the
    batch are moved to the permanent generation (``gc.freeze``) and the
    collector is paused; afterwards both are undone, and whatever cycles the
    batch left are collected by the next automatic collection.  Nests and is
    shared between threads (the outermost use freezes and restores).  Where
    automatic collection is off already (a service: ``listener_router``'s
    ``tune_gc``), it does nothing.
    """
    global _freeze_depth, _gc_was_enabled
    with _freeze_lock:
        _freeze_depth += 1
        if _freeze_depth == 1:
            # Off already (a service collects on a schedule of its own): nothing to
            # keep out, and unfreezing would undo what its owner froze.
            _gc_was_enabled = gc.isenabled()
            if _gc_was_enabled:
                gc.disable()
                gc.freeze()
    try:
        yield
    finally:
        with _freeze_lock:
            _freeze_depth -= 1
            if _freeze_depth == 0 and _gc_was_enabled:
                gc.unfreeze()
                gc.enable()


_gc_was_enabled = True


def _notes_key(notes: Any) -> bytes | None:
    return _dumps(notes) if notes else None


def _unchanged(docs: list[bytes], envs: list[list[Any]]) -> Any:
    """``keep(doc, env)``: False for an input record (one of ``docs``/``envs``) that comes
    out as it went in (the same text, the same deferred writes, flags and notes)."""
    position = {env[_ID]: i for i, env in enumerate(envs)}

    def keep(doc: bytes, env: list[Any]) -> bool:
        at = position.get(env[_ID])
        if at is None or env[_DELETED] or env[_BLOBS]:
            return True
        before = envs[at]
        if doc != docs[at] or before[_DELETED] \
                or _notes_key(env[_NOTES]) != _notes_key(before[_NOTES]):
            return True
        out, ops = env[_OPS], before[_OPS]
        if not out and not ops:
            return False
        return not (out and ops) or _dumps(out) != _dumps(ops)

    return keep


def _run_group(workflow: Workflow, group: list[InstanceInput]) -> tuple[list[InstanceOutput], list[list[InstanceInput]]]:
    """Run ``group`` together; return finished outputs and groups to rerun.

    The group's records come onto one partition-local blackboard in one import, and
    what changed leaves it in one export for the records that came in (attachments
    changed here) and one for those made here (all), split per instance afterwards.
    """
    from blackboard import Blackboard

    bb = Blackboard.local()
    docs: list[bytes] = []
    envs: list[list[Any]] = []
    blobs: list[bytes] = []
    for inp in group:
        p = inp.packed
        docs += p.docs
        envs += p.env
        blobs += p.blobs
    bb.import_packed(docs, envs, blobs, changed=False)
    bb.bind_instances([(inp.index, inp.ids) for inp in group])
    instances = [Instance(key=inp.index, ids=list(inp.ids)) for inp in group]
    run_workflow(bb, workflow, instances, configured_pipelet, configured_service)

    members: dict[Any, list[str]] = {}
    instance_of = bb.instance_of
    for rid in bb.ids():
        found = members.get(key := instance_of(rid))
        if found is None:
            members[key] = [rid]
        else:
            found.append(rid)
    changed = set(bb.changed_ids())
    outputs: list[InstanceOutput] = []
    tainted: list[InstanceInput] = []
    sent_old: list[str] = []                 # the records each instance sends back,
    sent_new: list[str] = []                 # in instance order
    shares: list[tuple[int, int, int]] = []  # (output, old ones, new ones)
    for inp, inst in zip(group, instances, strict=True):
        if inst.state is State.TAINTED:
            tainted.append(inp)
            continue
        record_ids = members.get(inp.index) or list(inp.ids)
        if inst.ok:
            if len(record_ids) == 1:  # one record an instance: the common case
                mine = record_ids if record_ids[0] in changed else []
            else:
                mine = [rid for rid in record_ids if rid in changed]
            if mine:
                inputs = inp.ids if len(inp.ids) < 8 else set(inp.ids)
                new = [rid for rid in mine if rid not in inputs and bb.is_new(rid)]
                old = [rid for rid in mine if rid not in new] if new else mine
                sent_old += old
                sent_new += new
                shares.append((len(outputs), len(old), len(new)))
            outputs.append(InstanceOutput(inp.index, True, None, list(inst.ids), record_ids, None))
        else:
            fault = inst.fault
            error = str(fault) if fault is not None else f"instance ended as {inst.state.value}"
            outputs.append(InstanceOutput(inp.index, False, error, [], list(inp.ids), None))
    if shares:
        _answer(bb, outputs, shares, sent_old, sent_new, _unchanged(docs, envs))
    reruns: list[list[InstanceInput]] = []
    if tainted:
        if len(tainted) == 1:
            reruns.append(tainted)
        else:
            half = len(tainted) // 2
            reruns.extend([tainted[:half], tainted[half:]])
    return outputs, reruns


def _answer(bb: Any, outputs: list[InstanceOutput], shares: list[tuple[int, int, int]],
            old: list[str], new: list[str], keep: Any) -> None:
    """Export what the instances send back and give each output its part: the records that
    came in (those that changed, with the attachments changed here), then the records made
    here (with all their attachments)."""
    docs, envs, blobs = bb.export_packed(old, attachments="changed")
    kept = [keep(doc, env) for doc, env in zip(docs, envs, strict=True)]
    parts = split_packed(docs, envs, blobs, [n for _, n, _ in shares])
    flags = iter(kept)
    made = None
    if new:
        docs, envs, blobs = bb.export_packed(new, attachments="all")
        made = iter(split_packed(docs, envs, blobs, [n for _, _, n in shares]))
    for (position, count, _), part in zip(shares, parts, strict=True):
        mine = [next(flags)] if count == 1 else [next(flags) for _ in range(count)]
        if not all(mine):
            part = Packed([d for d, k in zip(part.docs, mine, strict=True) if k],
                          [e for e, k in zip(part.env, mine, strict=True) if k], part.blobs)
        if made is not None:
            more = next(made)
            if more.docs:
                part = Packed(part.docs + more.docs, part.env + more.env,
                              part.blobs + more.blobs)
        if part.docs:
            outputs[position].packed = part


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


# -- Chunks: what a Spark job moves ------------------------------------------------
#
# Theory of operation.  A batch travels as a few *chunks*, one per Spark
# partition (one per core), not one element per instance: the JVM's cost is
# per element and per byte.  The job is an RDD job (``parallelize`` ->
# ``mapPartitions`` -> ``collect``): the JVM hands each chunk to a Python
# worker as the bytes it got and brings the answer back the same way, with
# no schema, no conversion to rows and no query plan.  Measured on a warm
# ``local[2]`` session, the smallest such job took 22-34 ms against 72 ms
# for the same chunks as a DataFrame through ``mapInArrow``, and the JVM
# spent a third of the CPU per record.  A chunk is a tuple
#
#   meta  JSON: per instance [index, ids, envelopes, doc lengths, blob count]
#         (outputs: [index, ok, error, result_ids, record_ids, envelopes or null,
#         doc lengths or null, blob count]); one encode for the whole chunk
#   codec "zstd" or "" (the data block's compression)
#   size  the data block's size uncompressed
#   data  every instance's documents' JSON, back to back, as one block;
#         compressed (zstd, level 1: ~6x on text, ~3 ms/MB) unless small or
#         ``compress=False``
#   blobs attachment bytes, in instance order (never compressed, never copied)
#
# PySpark pickles the tuple: its byte strings are copied, never encoded.
# The records are still JSON; nothing of theirs is pickled.

_CHUNK_BYTES = 64 << 20  # keep a chunk well under the JVM's 2 GB array limit

Chunk = tuple[bytes, str, int, bytes, list[bytes]]


def _codec() -> Any:
    import pyarrow as pa

    return pa.Codec("zstd", compression_level=1) if pa.Codec.is_available("zstd") else None


def _pack_block(data: bytes, compress: bool = True) -> tuple[str, int, bytes]:
    codec = _codec() if compress else None
    if codec is None or len(data) < 4096:
        return "", len(data), data
    return "zstd", len(data), codec.compress(data, asbytes=True)


def _unpack_block(codec: str, size: int, data: bytes) -> bytes:
    if not codec:
        return data
    import pyarrow as pa

    return pa.Codec(codec).decompress(data, decompressed_size=size, asbytes=True)


def _chunk(heads: list[list[Any]], parts: list[bytes], blobs: list[bytes], compress: bool = True) -> Chunk:
    codec, size, data = _pack_block(b"".join(parts), compress)
    return (_dumps(heads), codec, size, data, blobs)


def _split(items: list[Any], size: Any, parts: int) -> list[list[Any]]:
    """``items`` in about ``parts`` consecutive chunks, none over ``_CHUNK_BYTES``."""
    sizes = [size(i) for i in items]
    total = sum(sizes)
    target = max(1, min(_CHUNK_BYTES, -(-total // max(1, parts))))
    if total <= target:
        return [items]
    chunks: list[list[Any]] = [[]]
    filled = 0
    for item, weight in zip(items, sizes, strict=True):
        if chunks[-1] and filled >= target:
            chunks.append([])
            filled = 0
        chunks[-1].append(item)
        filled += weight
    return chunks


def _packed_size(p: Packed | None) -> int:
    if p is None:
        return 64
    docs = p.docs
    size = 64 + 96 * len(docs) + (len(docs[0]) if len(docs) == 1 else sum(map(len, docs)))
    return size + sum(map(len, p.blobs)) if p.blobs else size


def split_inputs(inputs: list[InstanceInput], parts: int) -> list[list[InstanceInput]]:
    """Instance inputs in about ``parts`` consecutive groups of about the same size."""
    return _split(inputs, lambda i: _packed_size(i.packed), parts)


def inputs_to_chunks(inputs: list[InstanceInput], parts: int, compress: bool = True) -> list[Chunk]:
    """Instance inputs -> about ``parts`` chunks (the driver's side).

    ``compress=False`` leaves the data block as it is (workers answer in
    kind); the runner compresses, as the JVM's copies cost more than zstd.
    """
    chunks = []
    for group in split_inputs(inputs, parts):
        heads: list[list[Any]] = []
        data: list[bytes] = []
        blobs: list[bytes] = []
        for inp in group:
            p = inp.packed
            docs = p.docs
            heads.append([inp.index, inp.ids, p.env, _lengths(docs), len(p.blobs)])
            data += docs
            if p.blobs:
                blobs += p.blobs
        chunks.append(_chunk(heads, data, blobs, compress))
    return chunks


def _lengths(docs: list[bytes]) -> list[int]:
    return [len(docs[0])] if len(docs) == 1 else list(map(len, docs))


def _slices(data: bytes, lengths: list[int], at: int) -> tuple[list[bytes], int]:
    if len(lengths) == 1:  # one record an instance: the common case
        end = at + lengths[0]
        return [data[at:end]], end
    out = []
    for n in lengths:
        out.append(data[at:at + n])
        at += n
    return out, at


def _read_chunks(chunks: Iterable[Chunk]) -> Iterator[tuple[list[Any], bytes, list[bytes]]]:
    for meta, codec, size, data, blobs in chunks:
        yield orjson.loads(meta), _unpack_block(codec, size, data), blobs or []


def inputs_from_chunks(chunks: Iterable[Chunk]) -> list[InstanceInput]:
    """Chunks -> instance inputs (the worker's side)."""
    inputs: list[InstanceInput] = []
    for heads, data, blobs in _read_chunks(chunks):
        at = nb = 0
        for idx, ids, env, lengths, nblobs in heads:
            docs, at = _slices(data, lengths, at)
            mine = blobs[nb:nb + nblobs] if nblobs else []
            inputs.append(InstanceInput(idx, ids, Packed(docs, env, mine)))
            nb += nblobs
    return inputs


def outputs_to_chunk(outputs: list[InstanceOutput], compress: bool = True) -> Chunk:
    """Instance outputs -> one chunk (the worker's side)."""
    heads: list[list[Any]] = []
    data: list[bytes] = []
    blobs: list[bytes] = []
    for out in outputs:
        p = out.packed
        if p is None:
            heads.append([out.index, out.ok, out.error, out.result_ids, out.record_ids,
                          None, None, 0])
            continue
        heads.append([out.index, out.ok, out.error, out.result_ids, out.record_ids,
                      p.env, _lengths(p.docs), len(p.blobs)])
        data += p.docs
        if p.blobs:
            blobs += p.blobs
    return _chunk(heads, data, blobs, compress)


def outputs_from_chunks(chunks: Iterable[Chunk]) -> list[InstanceOutput]:
    """The collected chunks -> instance outputs (the driver's side)."""
    outputs = []
    for heads, data, blobs in _read_chunks(chunks):
        at = nb = 0
        for idx, ok, error, result_ids, record_ids, env, lengths, nblobs in heads:
            packed = None
            if env is not None:
                docs, at = _slices(data, lengths, at)
                packed = Packed(docs, env, blobs[nb:nb + nblobs] if nblobs else [])
                nb += nblobs
            outputs.append(InstanceOutput(idx, bool(ok), error, result_ids or [], record_ids or [], packed))
    return outputs


def chunk_partition(workflow: Workflow, chunks: Iterable[Chunk], compress: bool = True) -> Iterator[Chunk]:
    """``mapPartitions`` function body: all instances of the partition, one output chunk.

    ``compress``: whether to compress the answer (as the driver did the input).
    """
    freeze_worker_heap()
    # the cyclic collector off while the chunk runs: its records, blackboard and
    # interpreter make no cycles and die together (~3 µs a record of the bench's three
    # pipelets); the worker's frozen heap stays frozen
    with gc_paused():
        inputs = inputs_from_chunks(chunks)
        if not inputs:
            return
        with working_directory(workflow.workdir):
            outputs = run_instances(workflow, inputs)
        chunk = outputs_to_chunk(outputs, compress)
        del inputs, outputs
    yield chunk


@contextmanager
def working_directory(path: str) -> Iterator[None]:
    """Run the block in ``path`` when it exists here and is not the current directory.

    A Python worker of a local master starts in the driver's working
    directory; one of a standalone (or YARN, Kubernetes) executor starts in
    the executor's scratch directory (``work/app-…/<n>``).  Pipelets resolve
    relative file names (``xslFile``) against the working directory, as
    validation on the driver did: without this, a workflow that validated
    fails every record on a cluster.  A PySpark worker runs one task at a
    time, so changing its directory for the task touches nobody else.

    Spark puts the files shipped with the job (``addPyFile``: the workflow's
    pipelet modules) on ``sys.path`` relative to the executor's directory
    (``./chalk-….zip``); those entries are made absolute first, or imports
    in the task would look for them in ``path``.
    """
    try:
        here = os.getcwd()
    except OSError:  # the scratch directory is gone
        here = None
    if not path or path == here or here is None or not os.path.isdir(path):
        yield
        return
    absolute = [p if os.path.isabs(p) else os.path.normpath(os.path.join(here, p)) for p in sys.path]
    sys.path[:] = list(dict.fromkeys(absolute))
    os.chdir(path)
    try:
        yield
    finally:
        try:
            os.chdir(here)
        except OSError:
            pass


_worker_heap_frozen = False


def freeze_worker_heap() -> None:
    """Once per Python worker: move what is alive now (modules, Spark's and our own) out of the GC's sight.

    A reused PySpark worker runs a full ``gc.collect()`` after every task;
    over the modules of pyspark, pyarrow and lxml that costs ~60 ms of CPU
    per task per worker (measured: most of a small job's worker CPU).  Frozen
    objects are skipped by every collection; they are still freed by
    reference counting.  Only the first task's leftovers are frozen with
    them (a few objects, once); later tasks' objects stay collectable.
    """
    global _worker_heap_frozen
    if not _worker_heap_frozen:
        _worker_heap_frozen = True
        gc.collect()
        gc.freeze()
