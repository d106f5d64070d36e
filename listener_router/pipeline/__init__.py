"""The pipeline: four stages a batch of messages goes through, each on its own thread.

Theory of operation.  While the execute stage runs batch k's workflows,
batch k+1 is gathered and loaded and batch k-1 is committed and published:

==========  ======================================  =====================  ==========
stage       does                                    thread                 input
==========  ======================================  =====================  ==========
gather      deliveries → parse, match, inbox,       ``chalk-stage``        the link's
            load records, write attributes,                                deliveries
            screen (``_screen``)
execute     run each workflow's group (Spark)       ``chalk-run`` (the     ``Gathering``
                                                    service's loop hands   (a ``Batch``)
                                                    it the batch)
commit      route, then records + inbox + outbox    ``chalk-commit``       ``StageInput``
            (+ plug-ins' rows) in one transaction                          (``Executed``)
finish      publish with confirms, mark sent, ack   ``chalk-finish``       ``StageInput``
                                                                           (``Finishing``)
==========  ======================================  =====================  ==========

The batch grows while the execute stage is busy, up to the batch size
(``BatchSizing``), so a slow run makes the next batch larger instead of
leaving messages waiting behind small batches; ``_sizing`` is the default
policy (the size from the backlog and the measured cost of a run, small
batches on the service's own workers where the workflow allows).  ``_states`` is the one
table of what may happen to a message; ``_inflight`` keeps batches in flight
from loading each other's records; ``_held`` keeps deferred messages until
they are gathered again; ``_retries`` decides retry or dead letter;
``_screen`` lets plug-ins settle messages (or some of their records)
without running them, once they are loaded; ``_settlement`` ends groups
and batches; ``_report`` counts; ``_stage_input`` is a stage's input and
thread.
"""

from listener_router.pipeline._batch import Batch, BatchSizing, Gathering, Group
from listener_router.pipeline._cancelled import Cancelled
from listener_router.pipeline._commit import (
    Commit,
    CommitExtension,
    CommitStage,
    Executed,
    InCommit,
)
from listener_router.pipeline._execute import ExecuteStage, Runner
from listener_router.pipeline._finish import (
    CONFIRM_TIMEOUT,
    Finish,
    Finishing,
    FinishStage,
    Orphans,
    Settled,
    SettleMessages,
)
from listener_router.pipeline._flow import POLL, FlowWatch
from listener_router.pipeline._gather import GatherStage
from listener_router.pipeline._held import Held, Holds
from listener_router.pipeline._inflight import InFlight
from listener_router.pipeline._lanes import (
    MAX_WINDOW,
    OUTRANKED_BATCH,
    SLOW_AFTER,
    Dispatcher,
    Lane,
    LaneView,
    TokenBucket,
    WakeHeld,
    lane_outputs,
    make_lane,
)
from listener_router.pipeline._loading import Loader
from listener_router.pipeline._ordered import Ordered, RetryHold
from listener_router.pipeline._report import (
    BatchObserver,
    BatchReport,
    Meter,
    Observers,
    Stats,
    WorkflowRun,
    hook_name,
)
from listener_router.pipeline._retries import attempts_note
from listener_router.pipeline._screen import Screen, ScreenHook, Screening
from listener_router.pipeline._settlement import Settlement
from listener_router.pipeline._sizing import (
    AdaptiveSizing,
    Placement,
    default_sizing,
    prefetch_by_queue,
    prefetch_for,
)
from listener_router.pipeline._stage_input import BACKLOG, StageInput
from listener_router.pipeline._states import TRANSITIONS, State, check_transition
from listener_router.pipeline._work import Work

__all__ = [
    "POLL",
    "lane_outputs",
    "TokenBucket",
    "RetryHold",
    "Ordered",
    "FlowWatch",
    "Cancelled",
    "BACKLOG",
    "CONFIRM_TIMEOUT",
    "TRANSITIONS",
    "AdaptiveSizing",
    "Batch",
    "BatchObserver",
    "BatchReport",
    "BatchSizing",
    "Commit",
    "CommitExtension",
    "CommitStage",
    "Dispatcher",
    "ExecuteStage",
    "Executed",
    "Finish",
    "FinishStage",
    "Finishing",
    "GatherStage",
    "Gathering",
    "Group",
    "Held",
    "Holds",
    "InFlight",
    "Lane",
    "LaneView",
    "MAX_WINDOW",
    "OUTRANKED_BATCH",
    "SLOW_AFTER",
    "InCommit",
    "Loader",
    "Meter",
    "Observers",
    "Orphans",
    "Placement",
    "Runner",
    "Screen",
    "ScreenHook",
    "Screening",
    "SettleMessages",
    "Settled",
    "Settlement",
    "StageInput",
    "State",
    "Stats",
    "WakeHeld",
    "Work",
    "WorkflowRun",
    "attempts_note",
    "check_transition",
    "hook_name",
    "default_sizing",
    "make_lane",
    "prefetch_by_queue",
    "prefetch_for",
]
