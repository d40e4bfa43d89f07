"""Signals and errors of the replay core (spec 002 §8.1, §3.8, §5.4).

Two families. A ``WorkflowSignal`` (a ``BaseException``) ends the run and poisons the
history: an interrupt, a failed write, or a fatal error that fails the execution. A
``WorkflowError`` is an outcome workflow code may catch: recorded in the history, or decided
from the processed prefix alone. Raised by ``workers.replay.history`` and the modules it uses;
mapped to outcomes by ``workers.workflow_runner``.

why: spec/README.md decision 2 (the first fatal error is kept), D98.
"""

from __future__ import annotations

from executions.events import ExecutionFailure, RetVal
from executions.ids import DelayId, ExecutionId


class WorkflowSignal(BaseException):
    """Ends the run. A ``BaseException``, so ``except Exception`` in workflow code cannot swallow
    it (§8.1). The first signal poisons the history: every later host call raises it again and
    writes nothing, and ``finalize`` reports it (decision 2: the first fatal error is kept)."""


class WorkflowInterrupt(WorkflowSignal):
    """No response yet and no (more) waiting: the database holds the ``JoinNext`` and a later
    response makes the execution pending again; the next run replays (§4.1). Retriable."""


class WriteFailed(WorkflowSignal):
    """A write (or lock extension) failed, e.g. the database is down or the lock was lost:
    retriable, the executor writes nothing (§3.8 ``DbError``)."""


class FatalWorkflowError(WorkflowSignal):
    """Finishes the execution permanently with ``failure()`` (§3.8, §5.4)."""

    kind = "uncategorized"

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def reason(self) -> str | None:
        return self.message

    def failure(self) -> ExecutionFailure:
        return ExecutionFailure(self.kind, self.reason(), None)


class NondeterminismDetected(FatalWorkflowError):
    """The code asked for something other than what the history holds (§3.7)."""

    kind = "nondeterminism_detected"

    def reason(self) -> str | None:
        return None

    def failure(self) -> ExecutionFailure:
        return ExecutionFailure(self.kind, None, self.message)


class ConstraintViolation(FatalWorkflowError):
    """Misuse of a join set, e.g. submitting to a closed one (§2.3)."""

    def reason(self) -> str:
        return f"constraint violation: {self.message}"


class ImportedFunctionCallError(FatalWorkflowError):
    """A host call that cannot be carried out, e.g. stubbing an execution that does not exist
    (decision 2: fatal, not retried forever) or a schedule time out of range (§5.4)."""

    def __init__(self, ffqn: str, message: str):
        super().__init__(message)
        self.ffqn = ffqn

    def reason(self) -> str:
        return f"error calling imported function {self.ffqn} : {self.message}"


class WorkflowError(Exception):
    """An outcome that workflow code may catch. Each is either recorded (a replay raises it
    again from the history) or decided from the processed prefix alone (nothing recorded)."""


class AllProcessed(WorkflowError):
    """Every request of the join set has been awaited (§2.5)."""

    def __init__(self, join_set_id: str):
        super().__init__(f"all requests of join set `{join_set_id}` have been processed")
        self.join_set_id = join_set_id


class FunctionMismatch(WorkflowError):
    """``await_next``/``get`` met another function's child, or a delay (``actual_ffqn`` None)."""

    def __init__(self, specified: str, actual_ffqn: str | None, actual_id: ExecutionId | DelayId):
        super().__init__(f"expected a response of {specified}, got {actual_ffqn or 'a delay'} (`{actual_id}`)")
        self.specified, self.actual_ffqn, self.actual_id = specified, actual_ffqn, actual_id


class JoinSetConflict(WorkflowError):
    """A named join set of that name already exists in this execution (§2.2, decision 6)."""


class InvalidJoinSetName(WorkflowError):
    """A join set name or one-off label outside ``[A-Za-z0-9_/-]+`` (decision 6)."""


class DelayCancelled(WorkflowError):
    """``sleep`` ended because its delay was cancelled (§2.10)."""

    def __init__(self, delay_id: DelayId):
        super().__init__(f"delay `{delay_id}` was cancelled")
        self.delay_id = delay_id


class StubConflict(WorkflowError):
    """The stubbed execution already finished with another value (§2.12)."""

    def __init__(self, target: ExecutionId):
        super().__init__(f"`{target}` already finished with a different value")
        self.target = target


class ChildFailed(WorkflowError):
    """A direct call's child returned an error value or failed (§2.8, §5.5)."""

    def __init__(self, child_id: ExecutionId, retval: RetVal):
        super().__init__(f"child `{child_id}` failed: {retval}")
        self.child_id, self.retval = child_id, retval


class NotFoundInProcessedResponses(WorkflowError):
    """``get`` of a child whose response has not been consumed yet (§2.7)."""

    def __init__(self, child_id: ExecutionId):
        super().__init__(f"`{child_id}` is not found in processed responses")
        self.child_id = child_id
