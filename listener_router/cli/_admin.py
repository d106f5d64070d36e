"""``chalk dlq``: dead letters listed, shown with their history, replayed, purged.

Dead letters come from the dead-letters feature (moved off the queues into
the store: looking redelivers nothing); the job log adds their records and
their message's history, and marks them replayed or purged.  A message ID
may be given by a unique start of it (``message_id_of``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from listener_router._errors import ConfigError
from listener_router._settings import Settings
from listener_router.cli._show import Out, iso
from listener_router.dead_letters import (
    DeadLetter,
    dead_letters,
    logged,
    purge,
    read_body,
    replay,
)
from listener_router.store import ServiceStore

__all__ = ["cmd_dlq", "dlq_list", "dlq_purge", "dlq_replay", "dlq_show", "letter_details",
           "letter_rows"]


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
    if out.listing(rows, empty="no dead letters"):
        return len(rows)
    out.table(f"dead letters, oldest first: {len(rows)}",
              ["queue", "message", "attempts", "workflow", "died", "records", "error"],
              [[r["queue"], r["message_id"], r["attempts"], r["workflow"] or "",
                (r["died"] or "")[:19].replace("T", " "), ", ".join(r["records"][:3])
                + (" …" if len(r["records"]) > 3 else ""), r["error"][:200]] for r in rows],
              right=("attempts",))
    return len(rows)


def _body(letter: DeadLetter) -> tuple[Any, str | None]:
    """The body as JSON, or its text and why it is not read as JSON (each letter on its
    own: one that cannot be read never stops the others being shown)."""
    data, problem = read_body(letter.body)
    if problem is None:
        return data, None
    return letter.body.decode("utf-8", "replace"), f"unreadable body ({problem})"


def letter_details(store: ServiceStore, letter: DeadLetter) -> dict[str, Any]:
    """One dead letter in full, as ``dlq show`` prints it: with its records, its message's
    history in the job log (attempts numbered from 1), its headers and its body."""
    records, history = logged(store, letter)
    body, problem = _body(letter)
    return {"queue": letter.queue, "message_id": letter.message_id, "error": letter.error,
            "attempts": letter.attempts, "workflow": letter.workflow or None,
            "records": records,
            "history": [{"at": iso(h.at), "state": h.state, "attempt": h.attempt,
                         "replays": h.round, "member": h.member, "reason": h.reason}
                        for h in history],
            "headers": letter.headers, "body": body,
            **({"body_error": problem} if problem else {})}


def _show_text(details: dict[str, Any], out: Out) -> None:
    """A dead letter as text: what happened, its history as a table, headers, body."""
    out.text(f"dead letter {details['message_id']} of {details['queue']}")
    out.text(f"error: {details['error']}")
    out.text(f"attempts: {details['attempts']}; workflow: {details['workflow'] or '-'}; "
             f"records: {', '.join(details['records']) or '-'}")
    if details["history"]:
        out.table("history", ["when", "step", "attempt", "replays", "member", "reason"],
                  [[(h["at"] or "")[:23].replace("T", " "), h["state"], h["attempt"],
                    h["replays"], h["member"] or "", h["reason"] or ""]
                   for h in details["history"]], right=("attempt", "replays"))
    else:
        out.text("history: not in the job log")
    out.text("headers:")
    for key, value in sorted(details["headers"].items()):
        out.text(f"  {key}: {value}")
    body = details["body"]
    if details.get("body_error"):
        out.text(details["body_error"])
    out.text("body: " + (body if isinstance(body, str)
                         else json.dumps(body, ensure_ascii=False)))


def dlq_show(settings: Settings, queues: Sequence[str], message_id: str | None,
             out: Out | None = None) -> int:
    """Print dead letters in full (``message_id``'s only, when given: the whole ID or a
    unique start of it); returns how many."""
    out = out or Out()
    letters = dead_letters(settings, queues, message_id=message_id)
    store = ServiceStore.connect(settings.blackboard_url)
    try:
        shown = [letter_details(store, letter) for letter in letters]
    finally:
        store.close()
    if not out.listing(shown):
        for n, details in enumerate(shown):
            if n:
                out.text("")
            _show_text(details, out)
    return len(letters)


def dlq_replay(settings: Settings, queues: Sequence[str], message_id: str | None = None) -> int:
    """Put dead letters back on their original queue, attempts reset, error dropped; the job
    log marks them replayed."""
    return replay(settings, queues, message_id)


def dlq_purge(settings: Settings, queues: Sequence[str], message_id: str | None = None) -> int:
    """Drop the dead letters of ``queues`` (one, with ``message_id``); the job log marks them
    purged.  Returns how many."""
    return purge(settings, queues, message_id)


def _confirmed(question: str) -> bool:
    """A yes on the terminal (only ``y`` or ``yes`` counts)."""
    try:
        answer = input(f"{question} [y/N] ")
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")


def _all_agreed(settings: Settings, queues: Sequence[str], args: argparse.Namespace,
                where: str) -> bool:
    """Whether ``chalk dlq replay|purge`` may act on every dead letter of ``queues``: it
    was given ``--all``, and ``--yes`` or a yes on the terminal.

    Raises:
        ConfigError: no ``--all``, or no ``--yes`` where nobody can be asked.
    """
    verb = args.action
    count = len(dead_letters(settings, queues))
    if not args.all:
        raise ConfigError(f"chalk dlq {verb}: give a message ID (chalk dlq list shows them), "
                          f"or --all for every dead letter of {where} ({count} now)")
    if args.yes or count == 0:
        return True
    if not sys.stdin.isatty():
        raise ConfigError(f"chalk dlq {verb} --all: {count} dead letter(s) of {where}; give "
                          "--yes to go ahead without being asked (no terminal to ask on)")
    return _confirmed(f"{verb} all {count} dead letter(s) of {where}?")


def cmd_dlq(settings: Settings, args: argparse.Namespace) -> int:
    """``chalk dlq list|show|replay|purge``."""
    queues = [args.queue] if args.queue else list(dict.fromkeys(
        r.queue for r in settings.listeners))
    where = ", ".join(f"{q}.dlq" for q in queues)
    out = Out.of(args)
    if args.action == "list":
        dlq_list(settings, queues, limit=args.limit, out=out)
        return 0
    if args.action == "show":
        if not dlq_show(settings, queues, args.message_id, out=out) and not out.json:
            what = f"with message ID {args.message_id!r}" if args.message_id else "at all"
            print(f"no dead letter {what} (looked in {where})", file=sys.stderr)
            return 1
        return 0
    if args.message_id is not None and args.all:
        raise ConfigError(f"chalk dlq {args.action}: a message ID or --all, not both")
    if args.message_id is None and not _all_agreed(settings, queues, args, where):
        print(f"{args.action}: nothing done", file=sys.stderr)
        return 1
    act = dlq_replay if args.action == "replay" else dlq_purge
    n = act(settings, queues, args.message_id)
    if args.message_id is not None and n == 0:
        print(f"no dead letter with message ID {args.message_id!r} (looked in {where})",
              file=sys.stderr)
        return 1
    print(f"{'replayed' if args.action == 'replay' else 'purged'} {n} dead letter(s)")
    return 0
