"""The pure replay core of workflows (spec 002 §1-§5, with the decisions of spec/README.md).

A workflow function runs again from the start on every run. Each host call it makes (create a
join set, submit a child, wait for the next response, sleep, draw a random number ...) becomes
one or more *deterministic keys* (§1.7). While recorded history events remain unprocessed, the
next key must match the next recorded event (§3.4): the call then returns the recorded outcome
and writes nothing; a mismatch is nondeterminism (§3.7). Once the history is exhausted the call
writes new events through a ``Writer`` (buffered per §3.6) and, if it blocks, resolves from the
responses known so far, waits through a ``Waiter`` for more, or interrupts the run (§3.5, §4).

This package imports no Django and no store (only ``executions.events``/``ids``/``errors``):
the executor supplies a ``Writer``, a ``Waiter`` (Await; none means Interrupt), a
``Canceller`` and a ``Lease``. A blocking call waits *inside* the call through the
``Waiter`` (§4.2's loop) rather than raising to its caller to be retried: a retried call
would have to skip the keys it already processed (the one-off call's first two), and a
half-done close would have to resume its drain. Read it top to bottom next to spec 002 §3:

1. ``signals``: signals and errors (§8.1, §3.8); 2. ``keys``: ``ScheduleAt`` (§1.3), the
keys (§1.7), recorded events as they read in messages (§1.3); 3. ``responses``: responses
(§1.4), what a consumed one resolves to, ``ResponseQueue`` (§1.6); 4. ``ports``; 5.
``write_buffer`` (§3.6); 6. ``index``: ids and counters (§1.2, §1.5, §1.6); 7.
``randomness`` (decision 4); 8. ``cursor``: the processed-prefix cursor, the matching table
(§3.4) and one call (§3.2-§3.5); 9. ``history``: ``EventHistory``, every host call (§2),
closing and ``finalize`` (§5).

why: D46, D60, D77, D98.
"""

from workers.replay.history import EventHistory
from workers.replay.ports import NewExecution
from workers.replay.responses import Response
from workers.replay.signals import (
    AllProcessed,
    ChildFailed,
    ConstraintViolation,
    DelayCancelled,
    FatalWorkflowError,
    FunctionMismatch,
    ImportedFunctionCallError,
    InvalidJoinSetName,
    JoinSetConflict,
    NondeterminismDetected,
    NotFoundInProcessedResponses,
    StubConflict,
    WorkflowError,
    WorkflowInterrupt,
    WorkflowSignal,
    WriteFailed,
)

__all__ = [
    "AllProcessed",
    "ChildFailed",
    "ConstraintViolation",
    "DelayCancelled",
    "EventHistory",
    "FatalWorkflowError",
    "FunctionMismatch",
    "ImportedFunctionCallError",
    "InvalidJoinSetName",
    "JoinSetConflict",
    "NewExecution",
    "NondeterminismDetected",
    "NotFoundInProcessedResponses",
    "Response",
    "StubConflict",
    "WorkflowError",
    "WorkflowInterrupt",
    "WorkflowSignal",
    "WriteFailed",
]
