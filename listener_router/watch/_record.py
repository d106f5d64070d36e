"""The pages of one thing: a record (NiFi's provenance for one record) and a dead letter.

A record's page shows what the blackboard's database holds of it — its
attributes, their annotations and the record's own, its attachments by name
and size — and its whole history in the job log: every step of every
message that named it, across queues and workflows, with the workflow
version that ran it where the store still knows (a member writes the
versions it runs, with when it loaded each: a step taken after that load ran
that version; an earlier one an earlier version).  A dead letter's page
shows its headers, the first ``PREVIEW_BYTES`` of its body with its whole
size (the whole body is a download, behind the token), its records and its
message's history, as ``chalk dlq show`` does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from listener_router._settings import Settings
from listener_router.dead_letters import (
    PREVIEW_BYTES,
    READ_BYTES,
    dead_letters,
    logged,
    read_body,
)
from listener_router.delta import deletion_step
from listener_router.jobs import JobLogTables, LogEntry
from listener_router.store import ServiceStore

__all__ = ["HISTORY", "Attribute", "LetterView", "RecordView", "Step", "annotation_lines",
           "letter_view", "record_view", "text_of"]

HISTORY = 1000               # steps of a record's history shown at most


def text_of(value: Any) -> str:
    """A stored value (a literal, a typed literal, a sub-object) as one line of text."""
    if isinstance(value, dict) and "lit" in value:
        kind = value.get("dt") or value.get("type")
        return f"{value['lit']}" + (f" ({kind})" if kind else "")
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    return json.dumps(value) if isinstance(value, bool) else str(value)


def annotation_lines(annmap: dict[str, Any] | None) -> list[str]:
    """An annotation map as lines: ``name: value, value; key=value`` (nested ones in
    brackets after it)."""
    lines = []
    for name, items in (annmap or {}).items():
        for ann in items:
            parts = [", ".join(text_of(v) for v in ann.get("values") or [])]
            parts += [f"{k}={text_of(v)}" for k, v in (ann.get("named") or {}).items()]
            nested = annotation_lines(ann.get("ann"))
            text = "; ".join(p for p in parts if p)
            lines.append(f"{name}: {text}" + (f" [{'; '.join(nested)}]" if nested else ""))
    return lines


@dataclass(frozen=True)
class Attribute:
    name: str
    values: list[str]
    annotations: list[str]     # the attribute's own annotations, a line each


@dataclass(frozen=True)
class Step:
    """A job-log step of a message that named the record, with its workflow's version."""

    entry: LogEntry
    version: str               # "" when not known
    shown: str = ""            # the step as shown: its state, or deleted (crawl N)


@dataclass(frozen=True)
class RecordView:
    record_id: str
    found: bool
    version: int | None        # the stored row's version (changes counted)
    source: str | None
    parent: str | None
    attributes: list[Attribute]
    annotations: list[str]     # the record's own annotations, a line each
    attachments: list[tuple[str, int | None]]   # name and size in bytes
    history: list[Step]        # oldest first
    workflows: list[str]       # the workflows it went through, in order


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, indent=2, default=str) \
        if value else ""


def _versions(store: ServiceStore, entries: list[LogEntry]) -> list[Step]:
    running = {(v.node, v.name): v for v in store.workflow_versions.running()}
    steps = []
    for e in entries:
        known = running.get((e.member or "", e.workflow or ""))
        if known is None or not e.workflow:
            version = ""
        elif known.loaded_at <= (e.received_at or e.at):
            version = known.version[:12]
        else:
            version = "an earlier version"
        step, crawl = deletion_step(e.state, e.message_id)
        steps.append(Step(e, version, step + (f" (crawl {crawl})" if crawl is not None else "")))
    return steps


def record_view(store: ServiceStore, record_id: str) -> RecordView:
    """The record as stored (leased by nobody: only read) and its history."""
    found = store.sql.read([record_id]).get(record_id)
    entries = store.tables(JobLogTables).entries(record=record_id, limit=HISTORY)
    history = _versions(store, entries)
    workflows = list(dict.fromkeys(e.workflow for e in entries if e.workflow))
    if found is None:
        return RecordView(record_id, False, None, None, None, [], [], [], history, workflows)
    doc, version = found
    meta = doc.get("meta") or {}
    notes = meta.get("attr_ann") or {}
    attributes = [Attribute(name, [text_of(v) for v in values], annotation_lines(notes.get(name)))
                  for name, values in (meta.get("attrs") or {}).items()]
    attachments = [(name, store.sql.attachment_size(record_id, name))
                   for name in doc.get("attachments") or []]
    return RecordView(record_id, True, version, doc.get("source"), doc.get("parent"),
                      attributes, annotation_lines(meta.get("ann")), attachments, history,
                      workflows)


@dataclass(frozen=True)
class LetterView:
    queue: str
    message_id: str
    error: str
    attempts: int
    workflow: str
    headers: str               # JSON
    body: str                  # the body's JSON, indented, or its text (its start only)
    records: list[str]
    history: list[LogEntry]
    size: int = 0              # the whole body's bytes
    shown: int = 0             # of which the page shows the first
    body_note: str | None = None   # "unreadable body (…)" when it is not JSON


def _body_text(body: bytes, whole: bool) -> tuple[str, str | None]:
    """The body as the page shows it (its first ``PREVIEW_BYTES``): indented JSON when it
    was read whole and is readable, else its text, with why it could not be read as JSON."""
    if not whole:
        return body[:PREVIEW_BYTES].decode("utf-8", "replace"), None
    data, problem = read_body(body)
    if problem is not None:
        return body[:PREVIEW_BYTES].decode("utf-8", "replace"), f"unreadable body ({problem})"
    return json.dumps(data, ensure_ascii=False, indent=2)[:PREVIEW_BYTES], None


def letter_view(settings: Settings, store: ServiceStore, queue: str,
                message_id: str) -> LetterView | None:
    """One dead letter of ``queue`` (a whole message ID, or a unique start of one), read
    from the service's store (``READ_BYTES`` of its body at most; ``PREVIEW_BYTES`` shown).

    Raises:
        AmbiguousMessageId: ``message_id`` starts several dead letters' IDs.
    """
    if queue not in {rule.queue for rule in settings.listeners}:
        return None
    letters = dead_letters(settings, [queue], message_id=message_id, store=store,
                           body_bytes=READ_BYTES)
    if not letters:
        return None
    letter = letters[0]
    records, history = logged(store, letter)
    text, note = _body_text(letter.body, letter.whole)
    return LetterView(letter.queue, letter.message_id, letter.error, letter.attempts,
                      letter.workflow, _json(letter.headers) or "{}", text, records, history,
                      letter.body_size, min(len(letter.body), PREVIEW_BYTES), note)
