"""Pause, unpause, cancel, stub, upgrade (spec 000 §7.2, §7.3, §7.4; decision 14)."""

from __future__ import annotations

from datetime import datetime

from executions import errors, notify
from executions.events import (
    ACTIVITY_TYPES,
    CancellationRequested,
    ComponentUpgradeFinished,
    ExecutionFailure,
    Finished,
    Paused,
    Rescheduled,
    RetVal,
    Unlocked,
    Unpaused,
    canonical_json,
    result_kind_of,
    retval_to_json,
)
from executions.ids import (
    ExecutionId,
)
from executions.models import (
    ExecutionState,
)
from executions.state_machine import (
    Lifecycle,
    State,
)
from executions.store.append import append
from executions.store.common import canonical_id, has_unfinished_children, row_for_update, utc_now, write_transaction
from executions.store.datatypes import CancelOutcome, Fence
from executions.store.reads import get_event
from executions.store.transitions import append_in_tx


def pause_execution(execution_id: str, *, now: datetime | None = None) -> int:
    """Pause a pending or blocked execution. A running workflow is unlocked first (its run
    is fenced out); a running activity cannot be paused, only cancelled."""
    now = utc_now(now)
    execution_id = canonical_id(execution_id)
    with write_transaction():
        row = row_for_update(execution_id)
        if row.is_finished:
            raise errors.AlreadyFinished(f"execution `{execution_id}` is already finished")
        notes = notify.Notes()
        version = row.corresponding_version + 1
        if row.state == State.LOCKED and row.lifecycle == Lifecycle.ACTIVE:
            if row.component_type in ACTIVITY_TYPES:
                raise errors.IllegalState("cannot pause a running activity; cancel it instead")
            version = append_in_tx(row, version, Unlocked(unlocked_at=now, reason="paused"), now, None, notes)
        version = append_in_tx(row, version, Paused(), now, None, notes)
        notes.publish()
    return version


def unpause_execution(execution_id: str, *, now: datetime | None = None) -> int:
    now = utc_now(now)
    execution_id = canonical_id(execution_id)
    with write_transaction():
        row = row_for_update(execution_id)
        notes = notify.Notes()
        version = append_in_tx(row, row.next_version, Unpaused(), now, None, notes)
        notes.publish()
    return version


def cancel(execution_id: str, *, now: datetime | None = None) -> CancelOutcome:
    """Request cancellation (lifecycle ``cancelling``); the cancellation driver finishes it.

    Distinct outcomes (spec 004 §5.4 item 18): requested now, already cancelling, already
    finished as cancelled, already finished otherwise. A missing execution is ``NotFound``.
    """
    now = utc_now(now)
    execution_id = canonical_id(execution_id)
    with write_transaction():
        row = row_for_update(execution_id)
        if row.is_finished:
            cancelled = result_kind_of(ExecutionFailure("cancelled"))
            return CancelOutcome.ALREADY_CANCELLED if row.result_kind == cancelled else CancelOutcome.ALREADY_FINISHED
        if row.lifecycle == Lifecycle.CANCELLING:
            return CancelOutcome.ALREADY_CANCELLING
        notes = notify.Notes()
        append_in_tx(row, row.corresponding_version + 1, CancellationRequested(), now, None, notes)
        notes.publish()
    return CancelOutcome.REQUESTED


def reschedule(execution_id: str, at: datetime | None = None, *, now: datetime | None = None) -> int:
    """Make a pending execution due at ``at`` (now by default): an operator's "run now" of
    a scheduled execution or one waiting out a retry's back-off (decisions.md D54). Counts
    no failure and touches no lock; anything but a pending, active execution is
    ``IllegalState`` (``AlreadyFinished`` once finished). Returns the next version."""
    now = utc_now(now)
    at = now if at is None else utc_now(at)
    execution_id = canonical_id(execution_id)
    with write_transaction():
        row = row_for_update(execution_id)
        notes = notify.Notes()
        version = append_in_tx(row, row.next_version, Rescheduled(scheduled_at=at), now, None, notes)
        notes.publish()
    return version


def get_cancelling(*, limit: int = 100) -> list[tuple[str, str]]:
    """``(execution id, component type)`` of executions being cancelled, oldest first."""
    return list(
        ExecutionState.objects.filter(lifecycle=Lifecycle.CANCELLING)
        .order_by("created_at")
        .values_list("execution_id", "component_type")[:limit]
    )


def finish_cancelled(
    execution_id: str, *, fence: Fence | None = None, version: int | None = None, now: datetime | None = None
) -> bool:
    """The cancellation driver's write: ``Finished(cancelled)`` for a cancelling execution.

    Without a fence it acts only when no run holds a live lock (pending, blocked, or an
    expired lock); a running holder stops its run and calls this with its fence and version.
    Workflows are finished here only once they have no unfinished children. Returns whether
    it finished the execution.
    """
    now = utc_now(now)
    execution_id = canonical_id(execution_id)
    with write_transaction():
        row = row_for_update(execution_id)
        if row.lifecycle != Lifecycle.CANCELLING:
            return False
        if fence is None and row.state == State.LOCKED and row.pending_expires_finished > now:
            return False
        if fence is None and row.component_type == "workflow" and has_unfinished_children(execution_id):
            return False
        notes = notify.Notes()
        retval = ExecutionFailure("cancelled", "cancellation requested")
        append_in_tx(row, version or row.corresponding_version + 1, Finished(retval=retval), now, fence, notes)
        notes.publish()
    return True


def cancel_children(execution_id: str, *, now: datetime | None = None) -> int:
    """The cancellation driver's first step for a cancelling workflow (decision 14): request
    cancellation of every unfinished execution started in its join sets, at any depth. Each
    is then finished by the driver in turn (an activity at once, or by its run; a child
    workflow after its own children); the workflow itself finishes once all have. Returns
    how many were asked."""
    now = utc_now(now)
    execution_id = canonical_id(execution_id)
    descendants = list(
        ExecutionState.objects.filter(execution_id__startswith=execution_id + ".")
        .exclude(state=State.FINISHED)
        .exclude(lifecycle=Lifecycle.CANCELLING)
        .order_by("execution_id")
        .values_list("execution_id", flat=True)
    )
    asked = 0
    for descendant in descendants:
        if cancel(descendant, now=now) is CancelOutcome.REQUESTED:
            asked += 1
    return asked


def upsert_stub_response(execution_id: str, retval: RetVal, *, now: datetime | None = None) -> bool:
    """Finish a derived execution (normally an activity stub) with ``retval``; idempotent.

    Returns True when it wrote, False when the same value was already there; a different
    value is ``StubConflict``. The parent gets the response in the same transaction.
    """
    now = utc_now(now)
    child = ExecutionId.parse(execution_id)
    if child.is_top_level:
        raise errors.ValidationFailed("only a derived (child) execution can be stubbed")
    try:
        append(str(child), 1, Finished(retval=retval), now=now)
        return True
    except errors.AlreadyFinished:
        pass
    record = get_event(str(child), 1)
    if isinstance(record.event, Finished) and canonical_json(retval_to_json(record.event.retval)) == canonical_json(
        retval_to_json(retval)
    ):
        return False
    raise errors.StubConflict(f"`{child}` already finished with a different value")


def upgrade_execution_component(
    execution_id: str,
    *,
    old_digest: str,
    new_digest: str,
    deployment_id: str,
    version: int,
    force: bool = False,
    now: datetime | None = None,
) -> int:
    """Move an unfinished execution from the component ``old_digest`` to ``new_digest`` of
    ``deployment_id`` (spec 000 §7.4 ``upgrade_execution_component``): a
    ``ComponentUpgradeFinished`` success, written at ``version`` (the version the caller's
    dry run replayed; anything written since is a ``VersionConflict``, so a verdict is never
    applied to a history it did not see). A running execution is refused: its worker runs
    the old code until it lets go. Returns the next version. why: D111."""
    now = utc_now(now)
    execution_id = canonical_id(execution_id)
    with write_transaction():
        row = row_for_update(execution_id)
        if row.component_id_input_digest != old_digest:
            raise errors.NotFound(f"execution `{execution_id}` is not pinned to {old_digest}")
        if row.is_finished:
            raise errors.AlreadyFinished(f"execution `{execution_id}` is already finished")
        if row.state == State.LOCKED:
            raise errors.IllegalState(f"execution `{execution_id}` is running; upgrade it when it waits")
        reason = {"type": "manual", "force": force}
        event = ComponentUpgradeFinished(
            component_digest=new_digest, deployment_id=deployment_id, outcome={"type": "success", "reason": reason}
        )
        notes = notify.Notes()
        next_version = append_in_tx(row, version, event, now, None, notes)
        notes.publish()
    return next_version
