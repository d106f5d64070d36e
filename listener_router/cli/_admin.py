"""``chalk dlq``: dead letters listed, shown with their history, replayed, purged.

Dead letters come from the dead-letters feature (moved off the queues into
the store: looking redelivers nothing); the job log adds their records and
their message's history, and marks them replayed or purged.  A message ID
may be given by a unique start of it (``message_id_of``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from listener_router._settings import Settings
from listener_router.cli._show import Out, iso
from listener_router.dead_letters import DeadLetter, dead_letters, logged, purge, replay
from listener_router.store import ServiceStore

__all__ = ["dlq_list", "dlq_purge", "dlq_replay", "dlq_show", "letter_details", "letter_rows"]


def letter_rows(settings: Settings, queues: Sequence[str], limit: int | None = 50
                ) -> list[dict[str, Any]]:
    """The first ``limit`` dead letters of ``queues``, oldest first, as ``dlq list --json``
    prints them: queue, message ID, attempts, workflow, when it died, records, error."""
    letters = dead_letters(settings, queues, limit=limit)
    store = ServiceStore.connect(settings.blackboard_url)
    try:
        rows = []
        for letter in letters:
            records, history = logged(store, letter)
            died = [e.at for e in history if e.state == "dead"] or [letter.kept_at]
            rows.append({"queue": letter.queue, "message_id": letter.message_id,
                         "attempts": letter.attempts, "workflow": letter.workflow or None,
                         "died": iso(died[-1], "seconds"), "records": records,
                         "error": letter.error})
        return rows
    finally:
        store.close()


def dlq_list(settings: Settings, queues: Sequence[str], limit: int = 50,
             out: Out | None = None) -> int:
    """Print the first ``limit`` dead letters of ``queues`` with their records; returns how
    many there are."""
    out = out or Out()
    rows = letter_rows(settings, queues, limit)
    if out.json:
        for row in rows:
            out.record(row)
        return len(rows)
    out.table("dead letters", ["queue", "message", "attempts", "workflow", "died", "records",
                               "error"],
              [[r["queue"], r["message_id"], r["attempts"], r["workflow"] or "",
                (r["died"] or "")[:19], ", ".join(r["records"][:3])
                + (" …" if len(r["records"]) > 3 else ""), r["error"][:200]] for r in rows],
              right=("attempts",))
    return len(rows)


def _body(letter: DeadLetter) -> Any:
    try:
        return json.loads(letter.body)
    except ValueError:
        return letter.body.decode("utf-8", "replace")


def letter_details(store: ServiceStore, letter: DeadLetter) -> dict[str, Any]:
    """One dead letter in full, as ``dlq show`` prints it: with its records, its message's
    history in the job log (attempts numbered from 1), its headers and its body."""
    records, history = logged(store, letter)
    return {"queue": letter.queue, "message_id": letter.message_id, "error": letter.error,
            "attempts": letter.attempts, "workflow": letter.workflow or None,
            "records": records,
            "history": [{"at": iso(h.at), "state": h.state, "attempt": h.attempt,
                         "replays": h.round, "member": h.member, "reason": h.reason}
                        for h in history],
            "headers": letter.headers, "body": _body(letter)}


def dlq_show(settings: Settings, queues: Sequence[str], message_id: str | None,
             out: Out | None = None) -> int:
    """Print dead letters in full (``message_id``'s only, when given: the whole ID or a
    unique start of it); returns how many."""
    out = out or Out()
    letters = dead_letters(settings, queues, message_id=message_id)
    store = ServiceStore.connect(settings.blackboard_url)
    try:
        for letter in letters:
            details = letter_details(store, letter)
            if out.json:
                out.record(details)
            elif out.terminal:
                out.console.print_json(json.dumps(details, default=str, ensure_ascii=False))
            else:
                out.record(details, indent=2)
    finally:
        store.close()
    return len(letters)


def dlq_replay(settings: Settings, queues: Sequence[str], message_id: str | None = None) -> int:
    """Put dead letters back on their original queue, attempts reset, error dropped; the job
    log marks them replayed."""
    return replay(settings, queues, message_id)


def dlq_purge(settings: Settings, queues: Sequence[str]) -> int:
    """Drop the dead letters of ``queues``; the job log marks them purged. Returns how many."""
    return purge(settings, queues)
