"""Message states and the transitions the service makes.

Theory of operation: a consumed message is *received*; once parsed and
matched it is *processing*.  It leaves processing in exactly one way:

- *committed*: its records, its inbox row and its outgoing messages (in its
  batch's outbox row) were written in one transaction; after the broker
  confirmed them it is *acked*.  A message a plug-in settled without a
  run (``_screen``) is committed so too, at once, with no record written
  (``Work.step`` names it: ``unchanged``).
- *duplicate*: its ID is already in the inbox; an outbox batch of its that was
  never confirmed sent is published again, then it is acked.
- *retrying*: its instance failed with attempts left; a copy with the attempt
  count raised waits in a delay queue; after the broker confirmed the copy the
  original is acked.
- *dead*: bad input, no rule, unknown workflow, or no attempts left; a copy
  with the reason goes to the dead-letter queue, then the original is acked.
- *deferred*: its records are locked by another owner, or the database or the
  broker failed; nothing was written; it is held unacked and gathered again
  after a backoff (or delivered again when the connection is gone);
- *cancelled*: an operator cancelled it (``chalk jobs cancel``), before it
  ran or before its commit; nothing of it is committed, then it is acked.

Nothing is acked before what it depends on is durable, so a crash at any
point leaves a message either redelivered or done.

Who moves a message: the gather stage out of *received* (and out of
*processing*, committing one a plug-in settled without a run); the commit stage
(and the execute stage, isolating a message that breaks the runner) out of
*processing*; the finish stage to *acked*, or to *deferred* when publishing
fails.
"""

from __future__ import annotations

from enum import Enum

__all__ = ["State", "TRANSITIONS", "check_transition"]


class State(str, Enum):
    RECEIVED = "received"
    PROCESSING = "processing"
    COMMITTED = "committed"
    DUPLICATE = "duplicate"
    RETRYING = "retrying"
    DEAD = "dead"
    DEFERRED = "deferred"
    CANCELLED = "cancelled"
    ACKED = "acked"


TRANSITIONS: dict[State, frozenset[State]] = {
    State.RECEIVED: frozenset({State.PROCESSING, State.DUPLICATE, State.DEAD, State.DEFERRED,
                               State.CANCELLED}),
    State.PROCESSING: frozenset({State.COMMITTED, State.RETRYING, State.DEAD, State.DEFERRED,
                                 State.CANCELLED}),
    State.COMMITTED: frozenset({State.ACKED, State.DEFERRED}),
    State.DUPLICATE: frozenset({State.ACKED, State.DEFERRED}),
    State.RETRYING: frozenset({State.ACKED, State.DEFERRED}),
    State.DEAD: frozenset({State.ACKED, State.DEFERRED}),
    State.CANCELLED: frozenset({State.ACKED, State.DEFERRED}),
    State.DEFERRED: frozenset(),
    State.ACKED: frozenset(),
}


def check_transition(old: State, new: State) -> State:
    if new not in TRANSITIONS[old]:
        raise RuntimeError(f"message state {old.value} cannot become {new.value}")
    return new
