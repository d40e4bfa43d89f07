"""The version fence, the log's invariants and create (spec 000 §6.1, §6.2 step 5,
§12.1-3; decision 13): a stale or future version is a version conflict that writes nothing,
versions are contiguous, and create is idempotent, paused or scheduled as asked.

Every test drives the store through its public API with explicit ``now=`` values (``T0`` lies
in the future, so wall-clock time never matters) and asserts what is read back from the
database; "nothing written" is ``db_snapshot()`` equal before and after. The spec is spec 000
and the decisions in ``../shared/spec/README.md`` (next to this repository).

why: D9, D19, D104
"""

from __future__ import annotations

import pytest

from executions import errors, store
from executions.events import (
    Finished,
    Ok,
    Paused,
    TemporarilyFailed,
    Unlocked,
    Unpaused,
)
from executions.ids import ExecutionId, new_executor_id, new_run_id
from executions.models import ExecutionEvent
from tests.support.conformance import (
    assert_log_consistent,
    at,
    blocked_workflow,
    finish,
    lock_pending,
    persist,
    request_delay,
    row,
    submit_children,
    unchanged,
)
from tests.support.helpers import (
    ACTIVITY,
    DEPLOYMENT,
    FFQN,
    T0,
    TERMS,
    create,
    create_workflow,
    event_variants,
    lock,
)

pytestmark = pytest.mark.django_db


# ---------------------------------------------------------------------------------------
# Version fence and log invariants (spec 000 §6.2 step 5, §12.1-3)
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("delta", [-2, -1, 1, 5])
def test_append_with_stale_or_future_version_is_version_conflict_and_writes_nothing(delta):
    execution_id = create(now=T0)
    store.append(execution_id, 1, persist(), now=T0)
    store.append(execution_id, 2, persist(), now=T0)
    requested = 3 + delta
    with unchanged(), pytest.raises(errors.VersionConflict) as caught:
        store.append(execution_id, requested, persist(), now=at(1))
    assert (caught.value.expected, caught.value.requested) == (3, requested)


@pytest.mark.parametrize("event", [Unlocked(unlocked_at=T0, reason="stale"), Unpaused()], ids=["unlocked", "unpaused"])
def test_stale_version_is_version_conflict_even_if_the_event_is_not_allowed_in_the_state(event):
    # spec 000 §6.2: the version check (step 5) comes before the event's own precondition (step 7)
    execution_id = create(now=T0)
    store.append(execution_id, 1, persist(), now=T0)
    with unchanged(), pytest.raises(errors.VersionConflict) as caught:
        store.append(execution_id, 1, event, now=at(1))
    assert (caught.value.expected, caught.value.requested) == (2, 1)


def test_append_batch_with_wrong_version_is_version_conflict_and_writes_nothing():
    execution_id = create(now=T0)
    with unchanged(), pytest.raises(errors.VersionConflict) as caught:
        store.append_batch(execution_id, 2, [persist(), persist()], now=T0)
    assert (caught.value.expected, caught.value.requested) == (1, 2)


def test_lock_with_stale_version_is_version_conflict_and_writes_nothing():
    execution_id = create(now=T0)
    store.append(execution_id, 1, persist(), now=T0)
    with unchanged(), pytest.raises(errors.VersionConflict) as caught:
        store.lock_one(
            execution_id, 1, TERMS, executor_id=new_executor_id(), run_id=new_run_id(), deployment_id=DEPLOYMENT, now=T0
        )
    assert (caught.value.expected, caught.value.requested) == (2, 1)


def test_versions_are_contiguous_and_each_append_returns_the_next_one():
    execution_id = create(now=T0)
    locked = lock(execution_id, now=T0)
    assert locked.next_version == 2
    assert store.append(execution_id, 2, persist(), fence=locked.fence, now=T0) == 3
    assert store.append_batch(execution_id, 3, [persist(), persist()], fence=locked.fence, now=T0) == 5
    assert list(ExecutionEvent.objects.filter(execution_id=execution_id).values_list("version", flat=True)) == [
        0, 1, 2, 3, 4,
    ]  # fmt: skip
    assert row(execution_id).corresponding_version == 4
    assert row(execution_id).next_version == 5


def test_finished_returns_its_own_version_and_later_appends_are_already_finished():
    execution_id = create(now=T0)
    assert store.append(execution_id, 1, Finished(retval=Ok(1)), now=T0) == 1
    state = row(execution_id)
    assert (state.corresponding_version, state.next_version) == (1, 1)
    for version in (1, 2):
        with unchanged(), pytest.raises(errors.AlreadyFinished):
            store.append(execution_id, version, persist(), now=at(1))
    with unchanged(), pytest.raises(errors.IllegalState, match="already finished"):
        lock(execution_id, now=at(1))


def test_corresponding_version_equals_max_log_version_after_every_operation():
    # create, idempotent create, paused create
    activity = create(now=T0)
    assert_log_consistent()
    create(now=T0, execution_id=activity)
    paused = create(now=T0, paused=True)
    assert_log_consistent()
    # lock_pending, extend_lock, a retry
    (locked,) = lock_pending(at(1), {FFQN: TERMS})
    assert locked.execution_id == activity
    assert_log_consistent()
    store.extend_lock(activity, locked.fence, at(30), now=at(2))
    version = locked.next_version
    assert_log_consistent()
    store.append(
        activity, version, TemporarilyFailed(backoff_expires_at=at(3), reason="boom"), fence=locked.fence, now=at(2)
    )
    assert_log_consistent()
    store.unpause_execution(paused, now=at(2))
    assert_log_consistent()
    # a workflow: children, blocking, a response, a delay, pause of a running workflow
    wf, _, _, child = blocked_workflow(at(3))
    assert_log_consistent()
    finish(child, Ok(7), now=at(4))
    assert_log_consistent()
    lock(wf, now=at(13))
    delay_id = request_delay(wf, "n:timer", expires_at=at(20), now=at(13))
    assert_log_consistent()
    store.pause_execution(wf, now=at(14))
    assert_log_consistent()
    assert store.fire_delay(delay_id, now=at(20)) == store.DelayOutcome.DELIVERED
    assert_log_consistent()
    # cancel and the cancellation driver
    cancelled = create(now=T0)
    store.cancel(cancelled, now=at(5))
    assert_log_consistent()
    assert store.finish_cancelled(cancelled, now=at(5))
    assert_log_consistent()
    # expiry of a lock
    expiring = create(now=T0)
    lock(expiring, now=at(5))
    assert store.expire_lock(expiring, now=at(15)) is not None
    assert_log_consistent()
    # a stub and a group append
    stub_parent = create_workflow(now=T0)
    (stub,) = submit_children(stub_parent, "n:stubs", 1, now=at(5))
    assert store.upsert_stub_response(stub, Ok("stubbed"), now=at(6))
    assert_log_consistent()
    stale = create(now=T0)
    results = store.append_many(
        [
            store.AppendItem(stub_parent, row(stub_parent).next_version, persist()),
            store.AppendItem(stale, 7, persist()),
            store.AppendItem(paused, row(paused).next_version, persist()),
        ],
        now=at(7),
    )
    assert isinstance(results[0], int) and isinstance(results[2], int)
    assert isinstance(results[1], errors.VersionConflict)
    assert event_variants(stale) == ["created"]
    assert_log_consistent()


# ---------------------------------------------------------------------------------------
# Create: idempotence (decision 13), paused, scheduled (spec 000 §6.1)
# ---------------------------------------------------------------------------------------


def test_create_writes_created_at_version_0_and_a_pending_row():
    execution_id = create(params=[1, {"a": "b"}], now=T0)
    state = row(execution_id)
    assert (state.state, state.lifecycle, state.corresponding_version) == ("pending_at", "active", 0)
    assert state.pending_expires_finished == T0 == state.first_scheduled_at == state.created_at
    assert state.is_top_level
    created = store.get_event(execution_id, 0).event
    assert (created.ffqn, created.params, created.parent) == (FFQN, [1, {"a": "b"}], None)
    assert event_variants(execution_id) == ["created"]


def test_create_same_id_function_and_params_is_idempotent():
    execution_id = create(params=[{"a": 1, "b": [1, 2]}, "x"], now=T0)
    with unchanged():
        outcome = store.create(
            store.CreateRequest(
                execution_id=execution_id,
                ffqn=FFQN,
                params=[{"b": [1, 2], "a": 1}, "x"],  # same JSON, other key order
                component_id=ACTIVITY,
                deployment_id=DEPLOYMENT,
            ),
            now=at(5),
        )
    assert outcome == store.CreateOutcome(next_version=1, already_existed=True)
    fresh = store.create(
        store.CreateRequest(
            execution_id=str(ExecutionId.generate()),
            ffqn=FFQN,
            params=[],
            component_id=ACTIVITY,
            deployment_id=DEPLOYMENT,
        ),
        now=T0,
    )
    assert fresh == store.CreateOutcome(next_version=1, already_existed=False)


def test_idempotent_create_reports_the_existing_next_version():
    execution_id = create(now=T0)
    lock(execution_id, now=T0)
    with unchanged():
        again = store.create(
            store.CreateRequest(
                execution_id=execution_id, ffqn=FFQN, params=[], component_id=ACTIVITY, deployment_id=DEPLOYMENT
            ),
            now=at(1),
        )
    assert again == store.CreateOutcome(next_version=2, already_existed=True)


@pytest.mark.parametrize(
    "ffqn, params",
    [
        (FFQN, [1, 3]),
        (FFQN, [1]),
        (FFQN, [1, 2, None]),
        (FFQN, [{"a": 1}, 2]),
        ("test:pkg/ifc.other", [1, 2]),
        ("test:pkg2/ifc.fn", [1, 2]),
    ],
)
def test_create_same_id_with_other_function_or_params_is_conflict(ffqn, params):
    execution_id = create(params=[1, 2], now=T0)
    with unchanged(), pytest.raises(errors.Conflict):
        store.create(
            store.CreateRequest(
                execution_id=execution_id, ffqn=ffqn, params=params, component_id=ACTIVITY, deployment_id=DEPLOYMENT
            ),
            now=at(1),
        )


def test_create_paused_writes_paused_at_version_1():
    outcome_id = str(ExecutionId.generate())
    outcome = store.create(
        store.CreateRequest(
            execution_id=outcome_id, ffqn=FFQN, params=[], component_id=ACTIVITY, deployment_id=DEPLOYMENT, paused=True
        ),
        now=T0,
    )
    assert outcome == store.CreateOutcome(next_version=2, already_existed=False)
    assert event_variants(outcome_id) == ["created", "paused"]
    assert isinstance(store.get_event(outcome_id, 1).event, Paused)
    state = row(outcome_id)
    assert (state.state, state.lifecycle, state.corresponding_version) == ("pending_at", "paused", 1)
    with unchanged():
        assert lock_pending(at(100)) == []


def test_create_scheduled_in_the_future_is_not_lockable_before_its_time():
    execution_id = create(now=T0, scheduled_at=at(60.25))
    state = row(execution_id)
    assert (state.state, state.pending_expires_finished, state.first_scheduled_at) == (
        "pending_at",
        at(60.25),
        at(60.25),
    )
    assert state.created_at == T0
    with unchanged():
        assert lock_pending(at(59)) == []
        assert lock_pending(at(60)) == []
    with unchanged(), pytest.raises(errors.ValidationFailed, match="not yet pending"):
        lock(execution_id, now=at(60.2))
    (locked,) = lock_pending(at(60.25))
    assert locked.execution_id == execution_id
    assert row(execution_id).state == "locked"
