"""Lock fencing: spec 004 §5.1 and the tests of §5.6, in this engine's terms.

Lock rules come from spec 000 (README decision 12): the holder may extend its own lock until
the timer sweep (``store.expire_lock``) has handled the expiry, and nobody else can lock a
``locked`` execution before the sweep returned it to pending. From spec 004 come the
monotonic ``lock_generation`` and the fence check: a write carrying a fence
(``run_id``, ``lock_generation``) that is no longer the execution's current one fails with
``LockLost`` and writes nothing.
"""

from datetime import timedelta

import pytest

from executions import errors, store
from executions.events import (
    ChildExecutionRequest,
    ExecutionFailure,
    Finished,
    JoinSetCreate,
    JoinSetRequest,
    Ok,
    RetryConfig,
    TemporarilyFailed,
    Unlocked,
)
from executions.ids import ExecutionId, JoinSetId, new_executor_id, new_run_id
from executions.models import ExecutionEvent, JoinSetResponse
from executions.state_machine import State
from tests.support import helpers
from tests.support.helpers import DEPLOYMENT, FFQN, T0, TERMS

pytestmark = pytest.mark.django_db

# Every lock in this file lasts 10 s (helpers.TERMS / WORKFLOW_TERMS), taken at T0.
BEFORE_EXPIRY = T0 + timedelta(seconds=5)
AFTER_EXPIRY = T0 + timedelta(seconds=15)


def generation(execution_id: str) -> int:
    return store.get_state(execution_id).lock_generation


def sweep(execution_id: str, at=AFTER_EXPIRY):
    """The timer sweep handles the expired lock (and so revokes it)."""
    event = store.expire_lock(execution_id, now=at)
    assert event is not None, "the sweep did not handle an expired lock"
    return event


def lock_pending(at, *, terms=TERMS, ffqn=FFQN) -> list[store.LockedExecution]:
    return store.lock_pending(
        {ffqn: terms},
        limit=10,
        executor_id=new_executor_id(),
        run_id=new_run_id(),
        deployment_id=DEPLOYMENT,
        now=at,
    )


def locked_event_generations(execution_id: str) -> list[int]:
    return [
        json_value["locked"]["lock_generation"]
        for json_value in ExecutionEvent.objects.filter(execution_id=execution_id, variant="locked")
        .order_by("version")
        .values_list("json_value", flat=True)
    ]


# ---------------------------------------------------------------------------------------
# Acquiring: busy, re-entrant, after expiry
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("at", [BEFORE_EXPIRY, AFTER_EXPIRY], ids=["live_lock", "expired_not_swept"])
@pytest.mark.parametrize("who", ["other_executor_other_run", "same_executor_other_run", "other_executor_same_run"])
def test_nobody_else_can_lock_a_locked_execution(who, at):
    execution_id = helpers.create(now=T0)
    holder = helpers.lock(execution_id, now=T0)
    executor_id = holder.locked.executor_id if who.startswith("same_executor") else new_executor_id()
    run_id = holder.fence.run_id if who.endswith("same_run") else new_run_id()
    before = helpers.db_snapshot()

    with pytest.raises(errors.IllegalState, match="cannot lock, already locked"):
        helpers.lock(execution_id, now=at, executor_id=executor_id, run_id=run_id)
    assert lock_pending(at) == []

    assert helpers.db_snapshot() == before


@pytest.mark.parametrize("at", [BEFORE_EXPIRY, AFTER_EXPIRY], ids=["live_lock", "expired_not_swept"])
@pytest.mark.parametrize("how", ["extend_lock", "lock_one_same_run"])
def test_holder_extends_its_own_lock_and_keeps_the_generation(how, at):
    execution_id = helpers.create(now=T0)
    holder = helpers.lock(execution_id, now=T0)
    new_expiry = at + TERMS.lock_duration

    if how == "extend_lock":
        assert store.extend_lock(execution_id, holder.fence, new_expiry, now=at) == "active"
        version = holder.next_version  # a heartbeat: no event, the version stays (D27)
        expected_locked_events = 1
    else:
        again = helpers.lock(execution_id, now=at, executor_id=holder.locked.executor_id, run_id=holder.fence.run_id)
        assert again.fence == holder.fence
        assert again.locked.lock_expires_at == new_expiry
        version = again.next_version
        expected_locked_events = 2

    state = store.get_state(execution_id)
    assert (state.state, state.lock_generation, state.pending_expires_finished) == (
        State.LOCKED, holder.fence.lock_generation, new_expiry,
    )  # fmt: skip
    assert locked_event_generations(execution_id) == [holder.fence.lock_generation] * expected_locked_events
    # The extended lock is not expired at `at`, so the sweep leaves it alone ...
    assert store.expire_lock(execution_id, now=at) is None
    # ... and the holder's fence still writes.
    assert store.append(execution_id, version, Finished(retval=Ok(1)), fence=holder.fence, now=at) == version


def test_lock_renewal_appends_no_event_and_keeps_the_version():
    """Issue 11 defect 8: renewing a lock every few seconds must not grow the history."""
    execution_id = helpers.create(now=T0)
    holder = helpers.lock(execution_id, now=T0)
    for seconds in range(1, 50):
        store.extend_lock(
            execution_id, holder.fence, T0 + timedelta(seconds=seconds + 10), now=T0 + timedelta(seconds=seconds)
        )
    state = store.get_state(execution_id)
    assert helpers.event_variants(execution_id) == ["created", "locked"]
    assert (state.corresponding_version, state.pending_expires_finished) == (1, T0 + timedelta(seconds=59))


def test_a_renewal_never_moves_the_lock_expiry_backwards():
    execution_id = helpers.create(now=T0)
    holder = helpers.lock(execution_id, now=T0)  # expires at T0 + 10 s
    store.extend_lock(execution_id, holder.fence, T0 + timedelta(seconds=3), now=T0 + timedelta(seconds=1))
    assert store.get_state(execution_id).pending_expires_finished == T0 + timedelta(seconds=10)


def test_renewing_the_lock_of_a_cancelling_execution_tells_the_holder():
    """Issue 11 defect 5: a renewal racing a cancel request is not a lost lock; the holder
    learns the execution is cancelling and finishes it as cancelled itself."""
    execution_id = helpers.create(now=T0)
    holder = helpers.lock(execution_id, now=T0)
    store.cancel(execution_id, now=BEFORE_EXPIRY)
    assert store.extend_lock(execution_id, holder.fence, AFTER_EXPIRY, now=BEFORE_EXPIRY) == "cancelling"
    failure = ExecutionFailure("cancelled", "cancellation requested while running")
    store.append(execution_id, None, Finished(retval=failure), fence=holder.fence, now=BEFORE_EXPIRY)
    assert store.get_finished_result(execution_id) == failure


def test_extending_with_an_expiry_in_the_past_is_refused():
    execution_id = helpers.create(now=T0)
    holder = helpers.lock(execution_id, now=T0)
    before = helpers.db_snapshot()
    with pytest.raises(errors.ValidationFailed, match="invalid expiry date"):
        store.extend_lock(execution_id, holder.fence, BEFORE_EXPIRY, now=BEFORE_EXPIRY)
    assert helpers.db_snapshot() == before


def test_a_due_row_relocked_by_its_last_holder_gets_a_new_generation():
    """Issue 11 defect 9: spec 000 §6.3 (a due row gets a new lock) and spec 004 §5.1.1
    (the generation goes up for every acquisition, even by the same run after its lock
    lapsed). Locked, then the run's own back-off, then the same run locks it when due."""
    execution_id = helpers.create(now=T0)
    holder = helpers.lock(execution_id, now=T0)
    failed = TemporarilyFailed(backoff_expires_at=T0 + timedelta(seconds=2), reason="flaky")
    store.append(execution_id, None, failed, fence=holder.fence, now=T0 + timedelta(seconds=1))
    again = helpers.lock(
        execution_id, now=T0 + timedelta(seconds=3), executor_id=holder.locked.executor_id, run_id=holder.fence.run_id
    )
    assert again.fence.lock_generation == holder.fence.lock_generation + 1
    assert store.get_state(execution_id).lock_generation == holder.fence.lock_generation + 1
    with pytest.raises(errors.LockLost):  # the old fence is no longer the lock
        store.append(execution_id, None, Finished(retval=Ok(1)), fence=holder.fence, now=T0 + timedelta(seconds=3))


def test_the_holder_keeping_a_run_warm_before_it_is_due_keeps_the_generation():
    """Spec 000 §10: a holder re-locking its row before it is due continues its lock."""
    execution_id = helpers.create(now=T0)
    holder = helpers.lock(execution_id, now=T0)
    failed = TemporarilyFailed(backoff_expires_at=T0 + timedelta(seconds=5), reason="flaky")
    store.append(execution_id, None, failed, fence=holder.fence, now=T0 + timedelta(seconds=1))
    again = helpers.lock(
        execution_id, now=T0 + timedelta(seconds=2), executor_id=holder.locked.executor_id, run_id=holder.fence.run_id
    )
    assert again.fence == holder.fence


@pytest.mark.parametrize("relock", ["lock_one", "lock_pending"])
def test_lock_after_the_sweep_handled_the_expiry_gets_a_new_generation(relock):
    execution_id = helpers.create(now=T0)
    holder = helpers.lock(execution_id, now=T0)
    sweep(execution_id)  # TemporarilyTimedOut, pending again after a 1 s back-off
    after_sweep = store.get_state(execution_id)
    assert after_sweep.state == State.PENDING_AT
    assert after_sweep.lock_generation > holder.fence.lock_generation  # the sweep revoked the lock

    at = AFTER_EXPIRY + timedelta(seconds=1)
    if relock == "lock_one":
        new = helpers.lock(execution_id, now=at)
    else:
        (new,) = lock_pending(at)

    assert new.fence.lock_generation == after_sweep.lock_generation + 1
    assert generation(execution_id) == new.fence.lock_generation
    assert locked_event_generations(execution_id) == [holder.fence.lock_generation, new.fence.lock_generation]


def test_same_run_relocking_after_the_sweep_does_not_revive_its_old_fence():
    execution_id = helpers.create(now=T0)
    holder = helpers.lock(execution_id, now=T0)
    sweep(execution_id)
    at = AFTER_EXPIRY + timedelta(seconds=1)
    again = helpers.lock(execution_id, now=at, executor_id=holder.locked.executor_id, run_id=holder.fence.run_id)

    assert again.fence.lock_generation > holder.fence.lock_generation
    before = helpers.db_snapshot()
    with pytest.raises(errors.LockLost):
        store.append(execution_id, again.next_version, Finished(retval=Ok("old")), fence=holder.fence, now=at)
    assert helpers.db_snapshot() == before
    store.append(execution_id, again.next_version, Finished(retval=Ok("new")), fence=again.fence, now=at)
    assert store.get_finished_result(execution_id) == Ok("new")


def test_every_new_lock_increments_the_generation():
    execution_id = helpers.create(now=T0)
    fences = []

    first = helpers.lock(execution_id, now=T0)
    fences.append(first.fence)
    store.append(execution_id, first.next_version, Unlocked(unlocked_at=T0, reason="yield"), fence=first.fence, now=T0)

    (second,) = lock_pending(T0)
    fences.append(second.fence)
    retry_at = T0 + timedelta(seconds=1)
    store.append(
        execution_id, second.next_version,
        TemporarilyFailed(backoff_expires_at=retry_at, reason="flaky"), fence=second.fence, now=T0,
    )  # fmt: skip

    third = helpers.lock(execution_id, now=retry_at)
    fences.append(third.fence)

    generations = [fence.lock_generation for fence in fences]
    assert generations == [1, 2, 3]
    assert len({fence.run_id for fence in fences}) == 3
    assert locked_event_generations(execution_id) == generations
    assert generation(execution_id) == 3


def test_generation_survives_unlocking_and_finishing():
    execution_id = helpers.create(now=T0)
    first = helpers.lock(execution_id, now=T0)
    store.append(execution_id, first.next_version, Unlocked(unlocked_at=T0, reason="yield"), fence=first.fence, now=T0)
    state = store.get_state(execution_id)
    assert (state.state, state.lock_generation) == (State.PENDING_AT, first.fence.lock_generation)

    second = helpers.lock(execution_id, now=T0)
    store.append(execution_id, second.next_version, Finished(retval=Ok(None)), fence=second.fence, now=T0)
    state = store.get_state(execution_id)
    assert state.state == State.FINISHED
    assert state.run_id is None
    assert state.lock_generation == second.fence.lock_generation == first.fence.lock_generation + 1


def test_generation_survives_a_sweep_that_finishes_the_execution():
    no_retries = store.LockTerms(helpers.ACTIVITY, RetryConfig(max_retries=0), timedelta(seconds=10))
    execution_id = helpers.create(now=T0)
    holder = helpers.lock(execution_id, now=T0, terms=no_retries)
    event = sweep(execution_id)
    assert isinstance(event, Finished) and event.retval.kind == "timed_out"
    assert event.retval.reason.startswith("lock expired: its worker stopped renewing it")
    assert event.retval.reason.endswith("retries are exhausted")
    state = store.get_state(execution_id)
    assert state.state == State.FINISHED
    assert state.lock_generation == holder.fence.lock_generation + 1  # revoked, never reset


# ---------------------------------------------------------------------------------------
# Stale fences: LockLost and nothing written
# ---------------------------------------------------------------------------------------


def _swept(workflow_id, holder):
    sweep(workflow_id)


def _swept_and_relocked(workflow_id, holder):
    sweep(workflow_id)
    helpers.lock(workflow_id, now=AFTER_EXPIRY)


def _paused(workflow_id, holder):
    store.pause_execution(workflow_id, now=BEFORE_EXPIRY)  # unlocks the running workflow first


STALE_BECAUSE = {"swept": _swept, "swept_and_relocked": _swept_and_relocked, "paused": _paused}


def _child_request(workflow_id: str) -> tuple[list, store.CreateRequest]:
    """The events and the create request of a workflow submitting one child activity."""
    js = JoinSetId("n", "late")
    child = str(ExecutionId.parse(workflow_id).child(js, 1))
    events = [
        helpers.history(JoinSetCreate(join_set_id=str(js))),
        helpers.history(
            JoinSetRequest(
                join_set_id=str(js),
                request=ChildExecutionRequest(child_execution_id=child, target_ffqn=FFQN, params=[]),
            )
        ),
    ]
    request = store.CreateRequest(
        execution_id=child, ffqn=FFQN, params=[], component_id=helpers.ACTIVITY,
        deployment_id=DEPLOYMENT, parent=(workflow_id, str(js)),
    )  # fmt: skip
    return events, request


def _append_finished(workflow_id, version, fence):
    store.append(workflow_id, version, Finished(retval=Ok("late")), fence=fence, now=AFTER_EXPIRY)


def _append_unlocked(workflow_id, version, fence):
    store.append(
        workflow_id, version, Unlocked(unlocked_at=AFTER_EXPIRY, reason="release"), fence=fence, now=AFTER_EXPIRY
    )


def _append_batch(workflow_id, version, fence):
    events, _ = _child_request(workflow_id)
    store.append_batch(workflow_id, version, [*events, Finished(retval=Ok("late"))], fence=fence, now=AFTER_EXPIRY)


def _append_batch_create_new_execution(workflow_id, version, fence):
    events, child = _child_request(workflow_id)
    store.append_batch_create_new_execution(workflow_id, version, events, [child], fence=fence, now=AFTER_EXPIRY)


def _append_many(workflow_id, version, fence):
    item = store.AppendItem(workflow_id, version, Finished(retval=Ok("late")), fence=fence)
    (result,) = store.append_many([item], now=AFTER_EXPIRY)
    if isinstance(result, Exception):
        raise result


def _extend_lock(workflow_id, version, fence):
    store.extend_lock(workflow_id, fence, AFTER_EXPIRY + timedelta(seconds=10), now=AFTER_EXPIRY)


STALE_WRITES = {
    "append_finished": _append_finished,
    "append_unlocked": _append_unlocked,
    "append_batch": _append_batch,
    "append_batch_create_new_execution": _append_batch_create_new_execution,
    "append_many": _append_many,
    "extend_lock": _extend_lock,
}


@pytest.mark.parametrize("write", STALE_WRITES)
@pytest.mark.parametrize("stale_because", STALE_BECAUSE)
def test_write_with_a_stale_fence_is_lock_lost_and_writes_nothing(stale_because, write):
    workflow_id = helpers.create_workflow(now=T0)
    holder = helpers.lock(workflow_id, now=T0)
    STALE_BECAUSE[stale_because](workflow_id, holder)
    current_version = store.get_state(workflow_id).next_version  # the late writer even knows the version
    before = helpers.db_snapshot()

    with pytest.raises(errors.LockLost):
        STALE_WRITES[write](workflow_id, current_version, holder.fence)

    assert helpers.db_snapshot() == before  # no event, no state change, no child created


def test_a_forged_generation_is_lock_lost():
    execution_id = helpers.create(now=T0)
    holder = helpers.lock(execution_id, now=T0)
    before = helpers.db_snapshot()
    for forged in (holder.fence.lock_generation - 1, holder.fence.lock_generation + 1):
        with pytest.raises(errors.LockLost):
            store.append(
                execution_id, holder.next_version, Finished(retval=Ok(0)),
                fence=store.Fence(holder.fence.run_id, forged), now=T0,
            )  # fmt: skip
    assert helpers.db_snapshot() == before


def test_stale_child_result_never_reaches_the_parent():
    parent = helpers.create_workflow(now=T0)
    parent_lock = helpers.lock(parent, now=T0)
    _, child, _ = helpers.block_on_child(parent, parent_lock, now=T0)
    old = helpers.lock(child, now=T0)
    sweep(child)
    before = helpers.db_snapshot()

    with pytest.raises(errors.LockLost):
        store.append(
            child, store.get_state(child).next_version, Finished(retval=Ok("late")), fence=old.fence, now=AFTER_EXPIRY
        )

    assert helpers.db_snapshot() == before
    assert store.get_state(parent).state == State.BLOCKED_BY_JOIN_SET
    assert not JoinSetResponse.objects.filter(execution_id=parent).exists()

    # The new holder's result does reach the parent and wakes it.
    at = AFTER_EXPIRY + timedelta(seconds=1)
    new = helpers.lock(child, now=at)
    store.append(child, new.next_version, Finished(retval=Ok("fresh")), fence=new.fence, now=at)
    (response,) = store.get(parent).responses
    assert (response.child_execution_id, response.child_retval) == (child, Ok("fresh"))
    assert store.get_state(parent).state == State.PENDING_AT


def test_append_many_item_with_a_stale_fence_fails_alone():
    stale_parent, live_parent = helpers.create_workflow(now=T0), helpers.create_workflow(now=T0)
    _, stale_child, _ = helpers.block_on_child(stale_parent, helpers.lock(stale_parent, now=T0), now=T0)
    _, live_child, _ = helpers.block_on_child(live_parent, helpers.lock(live_parent, now=T0), now=T0)
    old = helpers.lock(stale_child, now=T0)
    sweep(stale_child)
    live = helpers.lock(live_child, now=AFTER_EXPIRY)
    stale_events = helpers.event_variants(stale_child)

    results = store.append_many(
        [
            store.AppendItem(stale_child, store.get_state(stale_child).next_version, Finished(retval=Ok(1)), old.fence),
            store.AppendItem(live_child, live.next_version, Finished(retval=Ok(2)), live.fence),
        ],
        now=AFTER_EXPIRY,
    )

    assert isinstance(results[0], errors.LockLost)
    assert results[1] == live.next_version
    assert helpers.event_variants(stale_child) == stale_events
    assert store.get_state(stale_child).state == State.PENDING_AT
    assert store.get_state(stale_parent).state == State.BLOCKED_BY_JOIN_SET
    assert not JoinSetResponse.objects.filter(execution_id=stale_parent).exists()
    assert store.get_finished_result(live_child) == Ok(2)
    assert [r.child_execution_id for r in store.get(live_parent).responses] == [live_child]
    assert store.get_state(live_parent).state == State.PENDING_AT


# ---------------------------------------------------------------------------------------
# The fence is the writer's own lock, not the row's live state (spec 004 §5 "two corrections")
# ---------------------------------------------------------------------------------------


def _finish_child(child: str, at) -> None:
    child_lock = helpers.lock(child, now=at)
    store.append(child, child_lock.next_version, Finished(retval=Ok("child")), fence=child_lock.fence, now=at)


def test_holder_keeps_writing_with_its_fence_while_blocked_and_after_the_response():
    parent = helpers.create_workflow(now=T0)
    holder = helpers.lock(parent, now=T0)
    run_expires_at = holder.locked.lock_expires_at
    _, child, version = helpers.block_on_child(parent, holder, now=T0)
    assert store.get_state(parent).state == State.BLOCKED_BY_JOIN_SET

    # Blocked: the run (awaiting in memory) still writes under its own fence.
    version = store.append(
        parent, version, helpers.history(JoinSetCreate(join_set_id="n:meanwhile")),
        fence=holder.fence, now=T0 + timedelta(seconds=1),
    )  # fmt: skip

    _finish_child(child, T0 + timedelta(seconds=2))
    state = store.get_state(parent)
    assert (state.state, state.pending_expires_finished) == (State.PENDING_AT, run_expires_at)

    # Pending until the run's expiry: nobody else may lock it yet ...
    at = T0 + timedelta(seconds=3)
    before = helpers.db_snapshot()
    with pytest.raises(errors.ValidationFailed, match="not yet pending"):
        helpers.lock(parent, now=at)
    assert lock_pending(at, terms=helpers.WORKFLOW_TERMS, ffqn=helpers.WORKFLOW_FFQN) == []
    assert helpers.db_snapshot() == before

    # ... while the holder extends its lock under the same generation and finishes.
    again = helpers.lock(parent, now=at, executor_id=holder.locked.executor_id, run_id=holder.fence.run_id)
    assert again.next_version == version + 1
    assert again.fence == holder.fence
    store.append(parent, again.next_version, Finished(retval=Ok("done")), fence=holder.fence, now=at)
    assert store.get_finished_result(parent) == Ok("done")
    assert generation(parent) == holder.fence.lock_generation


def test_holder_is_fenced_out_once_another_run_locks_after_the_run_expiry():
    parent = helpers.create_workflow(now=T0)
    holder = helpers.lock(parent, now=T0)
    _, child, _ = helpers.block_on_child(parent, holder, now=T0)
    _finish_child(child, T0 + timedelta(seconds=1))

    at = holder.locked.lock_expires_at
    (new,) = lock_pending(at, terms=helpers.WORKFLOW_TERMS, ffqn=helpers.WORKFLOW_FFQN)
    assert new.fence.lock_generation == holder.fence.lock_generation + 1
    before = helpers.db_snapshot()

    with pytest.raises(errors.LockLost):
        store.append(parent, new.next_version, Finished(retval=Ok("old run")), fence=holder.fence, now=at)
    with pytest.raises(errors.IllegalState, match="already locked"):
        helpers.lock(parent, now=at, executor_id=holder.locked.executor_id, run_id=holder.fence.run_id)
    assert helpers.db_snapshot() == before

    store.append(parent, new.next_version, Finished(retval=Ok("new run")), fence=new.fence, now=at)
    assert store.get_finished_result(parent) == Ok("new run")


def test_a_run_appends_at_the_next_version_with_its_fence_alone():
    """A cancellation request bumps the version but leaves the lock with the run, so the
    run's own result (version None, fenced) still lands."""
    execution_id = helpers.create(now=T0)
    locked = helpers.lock(execution_id, now=T0)
    assert store.cancel(execution_id, now=T0) is store.CancelOutcome.REQUESTED
    with pytest.raises(errors.VersionConflict):
        store.append(execution_id, locked.next_version, Finished(retval=Ok(1)), fence=locked.fence, now=T0)
    assert store.append(execution_id, None, Finished(retval=Ok(1)), fence=locked.fence, now=T0) == 3
    assert store.get_finished_result(execution_id) == Ok(1)


def test_no_version_needs_a_current_fence():
    execution_id = helpers.create(now=T0)
    locked = helpers.lock(execution_id, now=T0)
    before = helpers.db_snapshot()
    with pytest.raises(errors.ValidationFailed, match="fence"):
        store.append(execution_id, None, Finished(retval=Ok(1)), now=T0)
    store.expire_lock(execution_id, now=T0 + timedelta(hours=1))
    after_sweep = helpers.db_snapshot()
    assert after_sweep != before
    with pytest.raises(errors.LockLost):
        store.append(execution_id, None, Finished(retval=Ok(1)), fence=locked.fence, now=T0)
    assert helpers.db_snapshot() == after_sweep
