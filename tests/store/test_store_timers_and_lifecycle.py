"""Timers and an execution's lifecycle (spec 000 §7.2-§7.4, §10; decision 14): delays fire
once and unblock, expired locks are retried with back-off or unlocked, pause and unpause,
cancel and the cancellation driver, and stubs.

Every test drives the store through its public API with explicit ``now=`` values (``T0`` lies
in the future, so wall-clock time never matters) and asserts what is read back from the
database; "nothing written" is ``db_snapshot()`` equal before and after. The spec is spec 000
and the decisions in ``../shared/spec/README.md`` (next to this repository).

why: D8, D11, D12, D18, D30
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from executions import errors, store
from executions.events import (
    DelayRequest,
    Err,
    ExecutionFailure,
    Finished,
    JoinSetRequest,
    Ok,
    TemporarilyTimedOut,
    Unlocked,
)
from executions.ids import DelayId, ExecutionId, JoinSetId, new_run_id
from executions.models import Delay
from tests.support.conformance import (
    NO_RETRY_TERMS,
    at,
    blocked_workflow,
    expired_delay_ids,
    expired_lock_ids,
    finish,
    join_next,
    lock_pending,
    persist,
    request_delay,
    row,
    unchanged,
)
from tests.support.helpers import (
    T0,
    create,
    create_workflow,
    event_variants,
    history,
    lock,
)

pytestmark = pytest.mark.django_db


# ---------------------------------------------------------------------------------------
# Delays and expired timers (spec 000 §7.3 get_expired_timers, append_delay_response, §10)
# ---------------------------------------------------------------------------------------


def test_delay_request_inserts_a_timer_row():
    wf = create_workflow(now=T0)
    delay_id = request_delay(wf, "n:sleep", expires_at=at(60), now=T0)
    delay = Delay.objects.get(delay_id=delay_id)
    assert (delay.execution_id, delay.join_set_id, delay.expires_at, delay.is_paused) == (wf, "n:sleep", at(60), False)
    assert row(wf).corresponding_version == 2
    duplicate = history(
        JoinSetRequest(join_set_id="n:sleep", request=DelayRequest(delay_id=delay_id, expires_at=at(90)))
    )
    with unchanged(), pytest.raises(errors.Conflict):
        store.append(wf, 3, duplicate, now=at(1))


def test_expired_timers_return_due_unpaused_delays_only():
    wf = create_workflow(now=T0)
    due = request_delay(wf, "n:a", expires_at=at(60), now=T0)
    later = request_delay(wf, "n:b", expires_at=at(120), now=T0)
    created_paused = request_delay(wf, "n:c", expires_at=at(30), now=T0, paused=True)
    assert expired_delay_ids(at(59)) == set()
    assert expired_delay_ids(at(60)) == {due}
    assert expired_delay_ids(at(200)) == {due, later}
    (delay,), _ = store.get_expired_timers(now=at(60))
    assert (delay.execution_id, delay.join_set_id, delay.expires_at) == (wf, "n:a", at(60))
    store.pause_delay(due)
    assert Delay.objects.get(delay_id=due).is_paused
    assert expired_delay_ids(at(200)) == {later}
    store.pause_delay(due)  # pausing a paused delay is a no-op
    store.unpause_delay(due)
    store.unpause_delay(created_paused)
    assert expired_delay_ids(at(200)) == {due, later, created_paused}


def test_pause_or_unpause_of_an_unknown_delay_is_not_found():
    wf = create_workflow(now=T0)
    unknown = str(DelayId(ExecutionId.parse(wf), JoinSetId("n", "never"), 1))
    with unchanged():
        with pytest.raises(errors.NotFound):
            store.pause_delay(unknown)
        with pytest.raises(errors.NotFound):
            store.unpause_delay(unknown)


def test_fire_delay_delivers_response_deletes_timer_and_unblocks():
    wf = create_workflow(now=T0)
    delay_id = request_delay(wf, "n:sleep", expires_at=at(60), now=T0)
    blocked = join_next(wf, "n:sleep", run_expires_at=at(10), now=T0)
    assert blocked.state == "blocked_by_join_set"
    version = blocked.corresponding_version
    assert store.fire_delay(delay_id, now=at(61)) == store.DelayOutcome.DELIVERED
    (response,), max_seq = store.list_responses(wf)
    assert (response.seq, response.join_set_id, response.delay_id, response.delay_success) == (
        1,
        "n:sleep",
        delay_id,
        True,
    )
    assert (response.child_execution_id, response.created_at, max_seq) == (None, at(61), 1)
    assert not Delay.objects.filter(delay_id=delay_id).exists()
    assert expired_delay_ids(at(1000)) == set()
    state = row(wf)
    assert (state.state, state.pending_expires_finished, state.corresponding_version) == ("pending_at", at(61), version)
    with unchanged():
        assert store.fire_delay(delay_id, now=at(62)) == store.DelayOutcome.ALREADY_FIRED
        assert store.append_delay_response(delay_id, False, now=at(62)) == store.DelayOutcome.ALREADY_FIRED
        with pytest.raises(errors.NotFound):
            store.pause_delay(delay_id)


def test_cancelled_delay_then_fire_is_already_cancelled():
    wf = create_workflow(now=T0)
    delay_id = request_delay(wf, "n:sleep", expires_at=at(60), now=T0)
    assert store.append_delay_response(delay_id, False, now=at(5)) == store.DelayOutcome.DELIVERED
    (response,), _ = store.list_responses(wf)
    assert (response.delay_id, response.delay_success) == (delay_id, False)
    assert not Delay.objects.filter(delay_id=delay_id).exists()
    with unchanged():
        assert store.fire_delay(delay_id, now=at(60)) == store.DelayOutcome.ALREADY_CANCELLED


def test_expired_locks_are_listed_with_their_retry_terms():
    execution_id = create(now=T0)
    locked = lock(execution_id, now=T0)
    assert expired_lock_ids(at(9)) == set()
    _, (expired,) = store.get_expired_timers(now=at(10))
    assert expired.execution_id == execution_id
    assert (expired.locked_at_version, expired.next_version, expired.intermittent_event_count) == (1, 2, 0)
    assert (expired.max_retries, expired.retry_exp_backoff) == (3, timedelta(seconds=1))
    assert (expired.executor_id, expired.run_id) == (locked.locked.executor_id, locked.locked.run_id)


def test_expire_lock_before_expiry_does_nothing():
    execution_id = create(now=T0)
    lock(execution_id, now=T0)
    with unchanged():
        assert store.expire_lock(execution_id, now=at(9)) is None
    pending = create(now=T0)
    with unchanged():
        assert store.expire_lock(pending, now=at(100)) is None


def test_expire_lock_after_extension_does_nothing():
    execution_id = create(now=T0)
    locked = lock(execution_id, now=T0)
    store.extend_lock(execution_id, locked.fence, at(30), now=at(5))
    assert expired_lock_ids(at(15)) == set()
    with unchanged():
        assert store.expire_lock(execution_id, now=at(15)) is None
    assert store.expire_lock(execution_id, now=at(30)) is not None


def test_expired_activity_lock_is_retried_with_exponential_backoff_until_exhausted():
    execution_id = create(now=T0)
    now = T0
    for attempt, backoff in enumerate([1, 2, 4], start=1):
        locked = lock(execution_id, now=now)
        generation = row(execution_id).lock_generation
        now = now + timedelta(seconds=10)
        event = store.expire_lock(execution_id, now=now)
        assert isinstance(event, TemporarilyTimedOut)
        assert event.backoff_expires_at == now + timedelta(seconds=backoff)
        assert isinstance(store.get_last_event(execution_id).event, TemporarilyTimedOut)
        state = row(execution_id)
        assert (state.state, state.pending_expires_finished) == ("pending_at", now + timedelta(seconds=backoff))
        assert state.intermittent_event_count == attempt
        assert state.lock_generation == generation + 1
        with pytest.raises(errors.LockLost):
            store.append(execution_id, state.next_version, Finished(retval=Ok(1)), fence=locked.fence, now=now)
        now = now + timedelta(seconds=backoff)
    lock(execution_id, now=now)
    event = store.expire_lock(execution_id, now=now + timedelta(seconds=10))
    assert isinstance(event, Finished)
    assert isinstance(event.retval, ExecutionFailure) and event.retval.kind == "timed_out"
    state = row(execution_id)
    assert state.state == "finished"
    assert state.result_kind == '{"err":{"execution_failure":"timed_out"}}'
    assert store.get_finished_result(execution_id).kind == "timed_out"


def test_expired_child_lock_without_retries_finishes_it_and_responds_to_the_parent():
    wf, _, js, child = blocked_workflow(T0)
    lock(child, now=at(1), terms=NO_RETRY_TERMS)
    assert child in expired_lock_ids(at(11))
    event = store.expire_lock(child, now=at(11))
    assert isinstance(event, Finished) and event.retval.kind == "timed_out"
    assert event_variants(child) == ["created", "locked", "finished"]
    (response,), _ = store.list_responses(wf)
    assert (response.child_execution_id, response.finished_version, response.join_set_id) == (child, 2, js)
    assert isinstance(response.child_retval, ExecutionFailure) and response.child_retval.kind == "timed_out"
    state = row(wf)
    assert (state.state, state.pending_expires_finished) == ("pending_at", at(11))


def test_expired_workflow_lock_after_progress_is_unlocked_without_counting_a_failure():
    wf = create_workflow(now=T0)
    locked = lock(wf, now=T0)
    store.append(wf, locked.next_version, persist(), fence=locked.fence, now=at(1))
    event = store.expire_lock(wf, now=at(12))
    assert isinstance(event, Unlocked)
    assert (event.reason, event.unlocked_at) == ("made progress", at(12))
    state = row(wf)
    assert (state.state, state.pending_expires_finished, state.intermittent_event_count) == ("pending_at", at(12), 0)


def test_expired_workflow_lock_without_progress_is_a_timeout_retry():
    wf = create_workflow(now=T0)
    lock(wf, now=T0)
    event = store.expire_lock(wf, now=at(12))
    assert isinstance(event, TemporarilyTimedOut)
    state = row(wf)
    assert (state.state, state.pending_expires_finished, state.intermittent_event_count) == ("pending_at", at(12), 1)


# ---------------------------------------------------------------------------------------
# Pause and unpause (spec 000 §7.4 pause_execution / unpause_execution)
# ---------------------------------------------------------------------------------------


def test_pause_and_unpause_a_pending_execution():
    execution_id = create(now=T0)
    assert store.pause_execution(execution_id, now=at(1)) == 2
    state = row(execution_id)
    assert (state.state, state.lifecycle, state.corresponding_version) == ("pending_at", "paused", 1)
    assert event_variants(execution_id) == ["created", "paused"]
    with unchanged():
        assert lock_pending(at(100)) == []
        with pytest.raises(errors.IllegalState, match="paused"):
            lock(execution_id, now=at(100))
    assert store.unpause_execution(execution_id, now=at(2)) == 3
    state = row(execution_id)
    assert (state.state, state.lifecycle, state.pending_expires_finished) == ("pending_at", "active", T0)
    assert event_variants(execution_id) == ["created", "paused", "unpaused"]
    (locked,) = lock_pending(at(3))
    assert locked.execution_id == execution_id


def test_pause_a_blocked_execution():
    wf, _, js, _ = blocked_workflow(T0)
    store.pause_execution(wf, now=at(1))
    state = row(wf)
    assert (state.state, state.lifecycle, state.join_set_id, state.pending_expires_finished) == (
        "blocked_by_join_set", "paused", js, at(10),
    )  # fmt: skip
    assert event_variants(wf)[-1] == "paused"


def test_pausing_a_locked_activity_is_illegal_and_writes_nothing():
    execution_id = create(now=T0)
    lock(execution_id, now=T0)
    with unchanged(), pytest.raises(errors.IllegalState) as caught:
        store.pause_execution(execution_id, now=at(1))
    assert str(caught.value) == "cannot pause a running activity; cancel it instead"


def test_pausing_a_locked_workflow_unlocks_it_and_fences_the_run_out():
    wf = create_workflow(now=T0)
    locked = lock(wf, now=T0)
    generation = row(wf).lock_generation
    assert store.pause_execution(wf, now=at(2)) == 4
    assert event_variants(wf) == ["created", "locked", "unlocked", "paused"]
    unlocked = store.get_event(wf, 2).event
    assert (unlocked.reason, unlocked.unlocked_at) == ("paused", at(2))
    state = row(wf)
    assert (state.state, state.lifecycle, state.pending_expires_finished) == ("pending_at", "paused", at(2))
    assert state.lock_generation == generation + 1
    assert state.intermittent_event_count == 0
    with unchanged(), pytest.raises(errors.LockLost):
        store.append(wf, 4, persist(), fence=locked.fence, now=at(3))


def test_pausing_twice_is_illegal_and_writes_nothing():
    execution_id = create(now=T0)
    store.pause_execution(execution_id, now=at(1))
    with unchanged(), pytest.raises(errors.IllegalState, match="already paused"):
        store.pause_execution(execution_id, now=at(2))


def test_unpause_of_an_active_and_pause_of_a_finished_execution_are_rejected():
    execution_id = create(now=T0)
    with unchanged(), pytest.raises(errors.IllegalState, match="not paused"):
        store.unpause_execution(execution_id, now=at(1))
    finish(execution_id, Ok(), now=at(1))
    with unchanged():
        with pytest.raises(errors.AlreadyFinished):
            store.pause_execution(execution_id, now=at(2))
        with pytest.raises(errors.AlreadyFinished):
            store.unpause_execution(execution_id, now=at(2))


# ---------------------------------------------------------------------------------------
# Cancel and the cancellation driver (spec 000 §7.2, decision 14)
# ---------------------------------------------------------------------------------------


def test_cancel_requested_for_a_pending_execution():
    execution_id = create(now=T0)
    assert store.cancel(execution_id, now=at(1)) == store.CancelOutcome.REQUESTED
    assert event_variants(execution_id) == ["created", "cancellation_requested"]
    state = row(execution_id)
    assert (state.state, state.lifecycle, state.corresponding_version) == ("pending_at", "cancelling", 1)
    assert store.get_cancelling() == [(execution_id, "activity")]
    with unchanged():
        assert lock_pending(at(100)) == []
        assert store.cancel(execution_id, now=at(2)) == store.CancelOutcome.ALREADY_CANCELLING


def test_cancel_wins_over_pause():
    execution_id = create(now=T0)
    store.pause_execution(execution_id, now=at(1))
    assert store.cancel(execution_id, now=at(2)) == store.CancelOutcome.REQUESTED
    assert row(execution_id).lifecycle == "cancelling"
    with unchanged(), pytest.raises(errors.IllegalState, match="cancelling"):
        store.pause_execution(execution_id, now=at(3))


def test_cancel_of_finished_executions_and_unknown_ids():
    ok = create(now=T0)
    finish(ok, Ok(1), now=at(1))
    failed = create(now=T0)
    finish(failed, ExecutionFailure("timed_out"), now=at(1))
    cancelled = create(now=T0)
    store.cancel(cancelled, now=at(1))
    assert store.finish_cancelled(cancelled, now=at(2))
    with unchanged():
        assert store.cancel(ok, now=at(3)) == store.CancelOutcome.ALREADY_FINISHED
        assert store.cancel(failed, now=at(3)) == store.CancelOutcome.ALREADY_FINISHED
        assert store.cancel(cancelled, now=at(3)) == store.CancelOutcome.ALREADY_CANCELLED
        with pytest.raises(errors.NotFound):
            store.cancel(str(ExecutionId.generate()), now=at(3))


def test_finish_cancelled_finishes_a_cancelling_pending_activity():
    execution_id = create(now=T0)
    other = create(now=T0)
    store.cancel(execution_id, now=at(1))
    with unchanged():
        assert store.finish_cancelled(other, now=at(2)) is False  # not cancelling
    assert store.finish_cancelled(execution_id, now=at(2)) is True
    assert event_variants(execution_id) == ["created", "cancellation_requested", "finished"]
    state = row(execution_id)
    assert (state.state, state.lifecycle, state.pending_expires_finished) == ("finished", "active", at(2))
    assert state.result_kind == '{"err":{"execution_failure":"cancelled"}}'
    result = store.get_finished_result(execution_id)
    assert isinstance(result, ExecutionFailure) and result.kind == "cancelled"
    assert store.get_cancelling() == []


def test_finish_cancelled_leaves_a_live_lock_to_its_holder():
    execution_id = create(now=T0)
    locked = lock(execution_id, now=T0)
    assert store.cancel(execution_id, now=at(1)) == store.CancelOutcome.REQUESTED
    state = row(execution_id)
    assert (state.state, state.lifecycle) == ("locked", "cancelling")
    with unchanged():
        assert store.finish_cancelled(execution_id, now=at(2)) is False
        with pytest.raises(errors.LockLost):
            foreign = store.Fence(new_run_id(), locked.fence.lock_generation)
            store.finish_cancelled(execution_id, fence=foreign, version=state.next_version, now=at(2))
    assert store.finish_cancelled(execution_id, fence=locked.fence, version=state.next_version, now=at(3)) is True
    assert row(execution_id).state == "finished"
    assert store.get_finished_result(execution_id).kind == "cancelled"


def test_finish_cancelled_acts_once_the_lock_expired():
    execution_id = create(now=T0)
    lock(execution_id, now=T0)
    store.cancel(execution_id, now=at(1))
    assert store.finish_cancelled(execution_id, now=at(10)) is True
    state = row(execution_id)
    assert (state.state, state.executor_id, state.run_id) == ("finished", None, None)
    assert store.get_finished_result(execution_id).kind == "cancelled"


def test_get_cancelling_lists_cancelling_ids_oldest_first():
    ids = [create(now=at(i)) for i in range(4)]
    store.cancel(ids[2], now=at(10))
    store.cancel(ids[0], now=at(11))
    store.cancel(ids[3], now=at(12))
    assert [i for i, _ in store.get_cancelling()] == [ids[0], ids[2], ids[3]]
    assert [i for i, _ in store.get_cancelling(limit=2)] == [ids[0], ids[2]]


# ---------------------------------------------------------------------------------------
# Stubs (spec 000 §7.3 upsert_stub_response)
# ---------------------------------------------------------------------------------------


def test_upsert_stub_response_finishes_the_child_and_responds_to_the_parent():
    wf, _, js, child = blocked_workflow(T0)
    assert store.upsert_stub_response(child, Ok({"a": 1, "b": 2}), now=at(20)) is True
    assert event_variants(child) == ["created", "finished"]
    assert store.get_event(child, 1).event.retval == Ok({"a": 1, "b": 2})
    assert row(child).state == "finished"
    (response,), _ = store.list_responses(wf)
    assert (response.child_execution_id, response.finished_version, response.join_set_id) == (child, 1, js)
    assert response.child_retval == Ok({"a": 1, "b": 2})
    assert (row(wf).state, row(wf).pending_expires_finished) == ("pending_at", at(20))
    with unchanged():
        assert store.upsert_stub_response(child, Ok({"b": 2, "a": 1}), now=at(21)) is False
        with pytest.raises(errors.StubConflict):
            store.upsert_stub_response(child, Ok({"a": 1, "b": 3}), now=at(21))
        with pytest.raises(errors.StubConflict):
            store.upsert_stub_response(child, Err({"a": 1, "b": 2}), now=at(21))


def test_upsert_stub_response_on_a_top_level_execution_is_rejected():
    execution_id = create(now=T0)
    with unchanged(), pytest.raises(errors.ValidationFailed):
        store.upsert_stub_response(execution_id, Ok(1), now=at(1))
