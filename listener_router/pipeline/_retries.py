"""Retries and dead letters: what becomes of a message that failed.

A failed message (its workflow instance failed, routing or committing it was
refused, its attributes were not usable) is *retrying* while its attempts
(``x-chalk-attempts``) are below the rule's ``max_retries``, else *dead*.
The finish stage publishes, for a retrying message, a copy with the attempt
count raised to the delay queue of the next backoff step (``Q.retry.N``,
which dead-letters back into ``Q`` after its TTL), and for a dead one a copy
with the reason to ``Q.dlq``; then it acks the original.  A message whose
workflow instance ran again alone, after the run it shared with others timed
out or died, and failed again, counts both runs as attempts: a record runs at
most ``max_retries + 1`` times, however it is found.
"""

from __future__ import annotations

from typing import Any

from listener_router._messages import (
    ATTEMPTS_HEADER,
    ERROR_HEADER,
    LAST_ERROR_HEADER,
    QUEUE_HEADER,
    WORKFLOW_HEADER,
    derive_message_id,
)
from listener_router.broker import OutMessage, dlq_name, retry_name
from listener_router.pipeline._states import State
from listener_router.pipeline._work import Work

__all__ = ["attempts_note", "fail", "side_messages"]


def attempts_note(attempts: int) -> str:
    """What a dead message's reason ends with: how many attempts it had."""
    return f" (after {attempts} attempt(s))"


def fail(w: Work, error: str, runs: int = 1) -> None:
    """``w`` failed with ``error``: retrying while attempts are left, else dead.

    ``runs``: the attempts this failure took (2 when its workflow instance was
    rerun alone after the run it shared timed out or died, and failed again).
    """
    assert w.message is not None and w.rule is not None
    w.runs = runs
    if w.message.attempts + runs - 1 < w.rule.max_retries:
        w.to(State.RETRYING, error)
    else:
        w.to(State.DEAD, error + attempts_note(w.message.attempts + runs))


def _copy_headers(w: Work, **extra: Any) -> dict[str, Any]:
    headers = {k: v for k, v in w.delivery.headers.items() if k != ERROR_HEADER}
    headers.update(extra)
    return headers


def side_messages(w: Work) -> list[OutMessage]:
    """The retry copy of a retrying message, the dead letter of a dead one; else nothing."""
    if w.state is not State.RETRYING and w.state is not State.DEAD:
        return []
    d = w.delivery
    mid = w.message.message_id if w.message else (d.message_id or derive_message_id(d.body))
    attempts = (w.message.attempts if w.message else 0) + w.runs
    error = (w.error or "unknown error")[:4000]
    if w.state is State.RETRYING:
        assert w.rule is not None
        steps = len(w.rule.backoff_ms)
        key = retry_name(d.queue, min(attempts, steps)) if steps else d.queue
        return [OutMessage(routing_key=key, body=d.body, message_id=mid,
                           headers=_copy_headers(w, **{ATTEMPTS_HEADER: attempts,
                                                       LAST_ERROR_HEADER: error}),
                           timestamp=d.properties.get("timestamp"))]
    return [OutMessage(routing_key=dlq_name(d.queue), body=d.body, message_id=mid,
                       headers=_copy_headers(w, **{
                           ERROR_HEADER: error, WORKFLOW_HEADER: w.workflow or "",
                           ATTEMPTS_HEADER: attempts, QUEUE_HEADER: d.queue}),
                       timestamp=d.properties.get("timestamp"))]
