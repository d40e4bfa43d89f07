"""One run of a locked workflow execution: from the start of its function to its end.

``run_workflow`` builds the run's ``replay.EventHistory`` on the store's ports
(``workers.replay_adapters``; an Interrupt run in a pool parks, ``workers.workflow_parking``),
calls the function with its ``WorkflowContext``, finalizes (closes the open join sets,
checks that nothing recorded was left unreplayed) and appends ``Finished`` with the run's
fence. A trap, an error value, a fatal host call are the workflow's outcome; an interrupt
or a lost lock ends the run without one (the next run replays). The run executes in a
thread of the worker process (``workers.workflow_pool``), so one process keeps many
awaiting workflows without starving activities.

why: D34, D37, D60, D72, D73, D77, D80, D98, D124
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable

from django.db import connection

from executions import errors, store
from executions.events import Err, Event, ExecutionFailure, Finished, Ok
from executions.outage import close_if_unusable_or_obsolete
from workers import determinism, heartbeat, telemetry
from workers.activity import ActivityError
from workers.capture import capturing
from workers.registry import ArgumentError, Function
from workers.replay import EventHistory, FatalWorkflowError, WorkflowInterrupt, WorkflowSignal, WriteFailed
from workers.replay_adapters import (
    ChildRunner,
    StoreCanceller,
    StoreLease,
    StoreWaiter,
    StoreWriter,
    release_if_locked,
)
from workers.workflow import WorkflowContext
from workers.workflow_parking import ParkedWait, ParkingLot

logger = logging.getLogger("obelisk.workflow")

BATCH_SIZE = 100  # buffered non-blocking events per transaction, under both strategies (§3.6, D60)


def run_workflow(
    locked: store.LockedExecution,
    spec: Function,
    deployment_id: str,
    children: ChildRunner | None = None,
    *,
    keep_connection: bool = False,
    pool: ParkingLot | None = None,
) -> None:
    """One run of a workflow, from the start of the function to its end or interruption.
    The thread's database connection is closed afterwards, unless ``keep_connection`` (the
    pool's threads keep it for their next run; a broken one is closed all the same).
    ``pool``: the workflow pool the run is in, where an Interrupt run may park (D77)."""
    try:
        with heartbeat.running(), telemetry.workflow_run(locked):
            _run(locked, spec, deployment_id, children, pool)
    except Exception:
        logger.exception("workflow run of %s failed; its lock expires and it runs again", locked.execution_id)
    finally:
        if keep_connection:
            close_if_unusable_or_obsolete()  # never raises: the pool counts on this thread
        else:
            connection.close()


def _run(
    locked: store.LockedExecution,
    spec: Function,
    deployment_id: str,
    children: ChildRunner | None,
    pool: ParkingLot | None,
) -> None:
    locked = store.with_history(locked)  # claimed for a parked run that gave up meanwhile
    lease = StoreLease(locked, spec)
    # An Await run may run a ``ctx.call``'s child in this thread (D124); an Interrupt run
    # ends at the call's join-next, and its children are dispatched as before (D65, D82).
    writer = StoreWriter(locked, deployment_id, children, local=spec.blocking == "await")
    waiter: StoreWaiter | ParkedWait | None = None
    if spec.blocking == "await":
        waiter = StoreWaiter(locked.execution_id, lease, first_run=locked.next_version == 2 and not locked.history)
        writer.lifecycle_seen = waiter.lifecycle_seen
    elif pool is not None:
        waiter = ParkedWait(pool, writer, lease)
    history = EventHistory(
        locked.execution_id,
        locked.history or [],
        locked.responses or [],
        next_version=locked.next_version,
        writer=writer,
        waiter=waiter,
        canceller=StoreCanceller(),
        lease=lease,
        batch_size=BATCH_SIZE,
    )
    lease.history = history
    ctx = WorkflowContext(history, locked.execution_id)
    try:
        with capturing(locked.execution_id, lambda: writer.locked.fence.run_id, lambda: history.is_replaying) as log:
            if isinstance(waiter, ParkedWait):
                waiter.history, waiter.log = history, log
            outcome = _call(spec, ctx, locked)
            _finish(writer, history, outcome, holding=lambda: waiter is not None and waiter.holding)
    finally:
        if waiter is not None:
            waiter.close()


def _finish(writer: StoreWriter, history: EventHistory, outcome: Event | None, *, holding: Callable[[], bool]) -> None:
    """Finalize (close the open join sets, check the replay was complete), then append the
    outcome with the run's fence (the current one: a parked run may have gone on under a
    new lock, D77).

    An interrupt ends the run at a join-next that was written. Under Interrupt that write
    handed the row on (blocked, or pending now), so the run leaves it alone: a transaction
    on the row here would make a claimer woken by that write skip it (``SKIP LOCKED``) and
    the workflow wait for the next poll (D72). A run cut short while ``holding`` its lock
    (an Await run when the worker stops), as it tells when the interrupt comes (closing the
    join sets may block and hand the row on), hands back what its lock still holds."""
    try:
        history.finalize()
    except WorkflowInterrupt:
        if holding():
            release_if_locked(writer.locked, "interrupted while locked")
        return
    except WriteFailed as failed:
        locked = writer.locked
        if isinstance(failed.__cause__, errors.LockLost):
            logger.info("%s: this run was superseded (%s)", locked.execution_id, failed.__cause__)
        else:
            logger.warning("%s: %s; its lock expires and it runs again", locked.execution_id, failed)
        return
    except FatalWorkflowError as fatal:
        outcome = Finished(retval=fatal.failure())
    if outcome is None:  # the function was interrupted, and finalize had nothing to add
        return
    locked = writer.locked
    try:
        _append_outcome(locked, outcome)
    except errors.LockLost as lost:  # another run holds it now (a stop, an expired lock)
        logger.info("%s: this run was superseded (%s)", locked.execution_id, lost)
        return
    except errors.ValidationFailed as refused:  # an unstorable result fails this execution only
        failure = ExecutionFailure("uncategorized", f"result rejected: {refused}")
        outcome = Finished(retval=failure)
        _append_outcome(locked, outcome)
    if telemetry.ENABLED and isinstance(outcome, Finished):
        telemetry.workflow_finished(locked, outcome)


def _append_outcome(locked: store.LockedExecution, outcome: Event) -> None:
    """Append the run's outcome with its fence. A ``Finished`` is a run's result, as an
    activity's: on PostgreSQL one statement with its notification (and a child's response
    to its parent), where a transaction took four round trips (D70, D81, D127)."""
    [result] = store.append_many([store.AppendItem(locked.execution_id, None, outcome, locked.fence)])
    if isinstance(result, errors.StoreError):
        raise result


def _call(spec: Function, ctx: WorkflowContext, locked: store.LockedExecution) -> Event | None:
    """The function's own outcome; None when a workflow signal ended it (``finalize`` then
    re-raises that signal)."""
    try:
        args = spec.decode_arguments(locked.params)
    except ArgumentError as error:
        return Finished(retval=ExecutionFailure("uncategorized", f"parameters do not match: {error}"))
    try:
        with determinism.guarding():
            value = spec.fn(ctx, *args)
        return Finished(retval=Ok(spec.encode_result(value)))
    except WorkflowSignal:
        return None
    except ActivityError as error:  # a returned error value
        return Finished(retval=Err(error.value))
    except ArgumentError as error:
        return Finished(retval=ExecutionFailure("uncategorized", str(error)))
    except Exception as error:  # a trap: the join sets are closed all the same (decision 3)
        reason = f"workflow trap: {type(error).__name__}: {error}"
        return Finished(retval=ExecutionFailure("uncategorized", reason, "".join(traceback.format_exception(error))))
