"""Conformance tests of the execution store against spec 000 and the decisions in
``../shared/spec/README.md`` (next to this repository).

Every test drives the store through its public API with explicit ``now=`` values (``T0`` lies
in the future, so wall-clock time never matters) and asserts what is read back from the
database. "Nothing written" is checked by comparing ``db_snapshot()`` before and after.
"""

from __future__ import annotations

import contextlib
import dataclasses
from datetime import timedelta

import pytest

from executions import errors, store
from executions.events import (
    ChildExecutionRequest,
    DelayRequest,
    Err,
    ExecutionFailure,
    Finished,
    JoinNext,
    JoinNextTry,
    JoinSetCreate,
    JoinSetRequest,
    Ok,
    Paused,
    Persist,
    RetryConfig,
    TemporarilyFailed,
    TemporarilyTimedOut,
    Unlocked,
    Unpaused,
)
from executions.ids import DelayId, ExecutionId, JoinSetId, new_executor_id, new_run_id
from executions.models import Delay, ExecutionEvent, ExecutionState
from tests.helpers import (
    ACTIVITY,
    DEPLOYMENT,
    FFQN,
    T0,
    TERMS,
    WORKFLOW_FFQN,
    WORKFLOW_TERMS,
    block_on_child,
    create,
    create_workflow,
    db_snapshot,
    event_variants,
    history,
    lock,
)

pytestmark = pytest.mark.django_db

NO_RETRY_TERMS = store.LockTerms(ACTIVITY, RetryConfig(max_retries=0), timedelta(seconds=10))


# ---------------------------------------------------------------------------------------
# Local helpers
# ---------------------------------------------------------------------------------------


def at(seconds: float):
    return T0 + timedelta(seconds=seconds)


def row(execution_id: str) -> ExecutionState:
    return store.get_state(execution_id)


@contextlib.contextmanager
def unchanged():
    """The block must leave every execution table exactly as it was."""
    before = db_snapshot()
    yield
    assert db_snapshot() == before


def assert_log_consistent() -> None:
    """Spec 000 §12.1-2: versions contiguous from 0 (``created`` first) and
    ``corresponding_version`` equal to the highest version, for every execution."""
    states = list(ExecutionState.objects.values_list("execution_id", "corresponding_version"))
    assert states
    for execution_id, corresponding_version in states:
        versions = list(
            ExecutionEvent.objects.filter(execution_id=execution_id)
            .order_by("version")
            .values_list("version", "variant")
        )
        assert [v for v, _ in versions] == list(range(corresponding_version + 1)), execution_id
        assert versions[0][1] == "created"


def persist():
    return history(Persist(value=[4, 2], kind={"type": "random_u64", "min": 0, "max_inclusive": 100}))


def finish(execution_id: str, retval=Ok(None), *, now) -> int:
    return store.append(execution_id, row(execution_id).next_version, Finished(retval=retval), now=now)


def lock_pending(now, functions=None) -> list[store.LockedExecution]:
    return store.lock_pending(
        functions or {FFQN: TERMS, WORKFLOW_FFQN: WORKFLOW_TERMS},
        limit=100,
        executor_id=new_executor_id(),
        run_id=new_run_id(),
        deployment_id=DEPLOYMENT,
        now=now,
    )


def submit_children(wf: str, js: str, count: int, *, now) -> list[str]:
    """The workflow opens join set ``js`` and submits ``count`` child activities to it."""
    join_set = JoinSetId.parse(js)
    children = [str(ExecutionId.parse(wf).child(join_set, i)) for i in range(1, count + 1)]
    events = [history(JoinSetCreate(join_set_id=js))] + [
        history(
            JoinSetRequest(
                join_set_id=js, request=ChildExecutionRequest(child_execution_id=c, target_ffqn=FFQN, params=[])
            )
        )
        for c in children
    ]
    requests = [child_request(wf, js, child) for child in children]
    store.append_batch_create_new_execution(wf, row(wf).next_version, events, requests, now=now)
    return children


def kid(parent: str, js: str, idx: int) -> str:
    return str(ExecutionId.parse(parent).child(JoinSetId.parse(js), idx))


def child_request(parent: str, js: str, child: str, **kwargs) -> store.CreateRequest:
    fields = dict(
        execution_id=child, ffqn=FFQN, params=[], component_id=ACTIVITY, deployment_id=DEPLOYMENT, parent=(parent, js)
    )
    fields.update(kwargs)
    return store.CreateRequest(**fields)


def join_next(wf: str, js: str, *, run_expires_at, now) -> ExecutionState:
    store.append(wf, row(wf).next_version, history(JoinNext(join_set_id=js, run_expires_at=run_expires_at)), now=now)
    return row(wf)


def join_next_try(wf: str, js: str, outcome: str, *, now) -> int:
    return store.append(wf, row(wf).next_version, history(JoinNextTry(join_set_id=js, outcome=outcome)), now=now)


def blocked_workflow(now=T0) -> tuple[str, store.LockedExecution, str, str]:
    """A workflow locked at ``now`` (run expires at now+10 s), blocked on one child."""
    wf = create_workflow(now=now)
    locked = lock(wf, now=now)
    js, child, _ = block_on_child(wf, locked, now=now)
    return wf, locked, js, child


def request_delay(wf: str, js: str, *, expires_at, now, idx: int = 1, paused: bool = False) -> str:
    delay_id = str(DelayId(ExecutionId.parse(wf), JoinSetId.parse(js), idx))
    store.append_batch(
        wf,
        row(wf).next_version,
        [
            history(JoinSetCreate(join_set_id=js)),
            history(
                JoinSetRequest(
                    join_set_id=js, request=DelayRequest(delay_id=delay_id, expires_at=expires_at, paused=paused)
                )
            ),
        ],
        now=now,
    )
    return delay_id


def expired_delay_ids(now) -> set[str]:
    delays, _ = store.get_expired_timers(now=now)
    return {d.delay_id for d in delays}


def expired_lock_ids(now) -> set[str]:
    _, locks = store.get_expired_timers(now=now)
    return {lock.execution_id for lock in locks}


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


# ---------------------------------------------------------------------------------------
# append_batch and append_batch_create_new_execution (spec 000 §7.3)
# ---------------------------------------------------------------------------------------


def test_append_batch_appends_in_order():
    wf = create_workflow(now=T0)
    version = store.append_batch(
        wf, 1, [history(JoinSetCreate(join_set_id="n:a")), persist(), history(JoinSetCreate(join_set_id="n:b"))], now=T0
    )
    assert version == 4
    events = store.get(wf).events
    assert [e.version for e in events] == [0, 1, 2, 3]
    assert [getattr(e.event.event, "join_set_id", None) for e in events[1:]] == ["n:a", None, "n:b"]
    assert row(wf).corresponding_version == 3


@pytest.mark.parametrize(
    "bad, error",
    [
        (Unlocked(unlocked_at=T0, reason="not locked"), errors.UnlockedCannotBeAppended),
        (
            history(
                JoinSetRequest(
                    join_set_id="n:a",
                    # a delay of another execution
                    request=DelayRequest(
                        delay_id=str(DelayId(ExecutionId.generate(), JoinSetId("n", "a"), 1)), expires_at=T0
                    ),
                )
            ),
            errors.ValidationFailed,
        ),
        (history(JoinSetCreate(join_set_id="n:bad name")), errors.ValidationFailed),
    ],
)
def test_append_batch_is_all_or_nothing(bad, error):
    wf = create_workflow(now=T0)
    with unchanged(), pytest.raises(error):
        store.append_batch(
            wf, 1, [history(JoinSetCreate(join_set_id="n:a")), bad, history(JoinSetCreate(join_set_id="n:b"))], now=T0
        )


def test_append_batch_rejects_an_empty_batch():
    wf = create_workflow(now=T0)
    with unchanged(), pytest.raises(errors.ValidationFailed):
        store.append_batch(wf, 1, [], now=T0)


def test_append_batch_create_new_execution_creates_children_with_parent_link():
    wf = create_workflow(now=T0)
    locked = lock(wf, now=T0)
    js = "n:kids"
    kids = [kid(wf, js, i) for i in (1, 2)]
    events = [history(JoinSetCreate(join_set_id=js))] + [
        history(
            JoinSetRequest(
                join_set_id=js, request=ChildExecutionRequest(child_execution_id=k, target_ffqn=FFQN, params=[i])
            )
        )
        for i, k in enumerate(kids)
    ]
    version = store.append_batch_create_new_execution(
        wf,
        locked.next_version,
        events,
        [child_request(wf, js, k, params=[i]) for i, k in enumerate(kids)],
        fence=locked.fence,
        now=at(1),
    )
    assert version == 5
    assert event_variants(wf) == ["created", "locked", "history_event", "history_event", "history_event"]
    for i, child in enumerate(kids):
        state = row(child)
        assert (state.state, state.lifecycle, state.is_top_level) == ("pending_at", "active", False)
        assert state.pending_expires_finished == at(1)
        created_row = ExecutionEvent.objects.get(execution_id=child, version=0)
        assert created_row.join_set_id == js
        created = store.get_created(child)
        assert (tuple(created.parent), created.params, created.ffqn) == ((wf, js), [i], FFQN)
    # a child-creating batch does not change the parent's lock
    assert row(wf).state == "locked"


@pytest.mark.parametrize(
    "case, error",
    [
        ("not_my_child", errors.ValidationFailed),
        ("parent_mismatch", errors.ValidationFailed),
        ("bad_ffqn", errors.ValidationFailed),
        ("duplicate_child", errors.Conflict),
        ("bad_parent_event", errors.UnlockedCannotBeAppended),
    ],
)
def test_append_batch_create_new_execution_with_an_invalid_child_writes_nothing(case, error):
    wf = create_workflow(now=T0)
    stranger = create_workflow(now=T0)
    (existing,) = submit_children(wf, "n:old", 1, now=T0)
    events = [persist()]
    bad = child_request(wf, "n:kids", kid(wf, "n:kids", 2))
    if case == "not_my_child":
        bad = child_request(stranger, "n:kids", kid(stranger, "n:kids", 1))
    elif case == "parent_mismatch":
        bad = child_request(wf, "n:other", kid(wf, "n:kids", 2))
    elif case == "bad_ffqn":
        bad = child_request(wf, "n:kids", kid(wf, "n:kids", 2), ffqn="not a function")
    elif case == "duplicate_child":
        bad = child_request(wf, "n:old", existing)
    elif case == "bad_parent_event":
        events.append(Unlocked(unlocked_at=T0, reason="not locked"))
    good = child_request(wf, "n:kids", kid(wf, "n:kids", 1))
    with unchanged(), pytest.raises(error):
        store.append_batch_create_new_execution(wf, row(wf).next_version, events, [good, bad], now=at(1))


# ---------------------------------------------------------------------------------------
# Child results delivered to the parent (spec 000 §6.4, §12.9-13)
# ---------------------------------------------------------------------------------------


def test_child_finished_delivers_a_response_with_its_retval_in_the_same_transaction():
    wf = create_workflow(now=T0)
    (child,) = submit_children(wf, "n:js", 1, now=T0)
    parent_version = row(wf).corresponding_version
    assert finish(child, Ok({"answer": 42}), now=at(2)) == 1
    responses, max_seq = store.list_responses(wf)
    assert max_seq == 1
    (response,) = responses
    assert (response.seq, response.join_set_id, response.child_execution_id, response.finished_version) == (
        1, "n:js", child, 1,
    )  # fmt: skip
    assert response.created_at == at(2)
    assert response.child_retval == Ok({"answer": 42})
    assert (response.delay_id, response.delay_success) == (None, None)
    assert store.get(wf).responses == responses
    # responses do not bump the parent's version (spec 000 §12.2)
    assert row(wf).corresponding_version == parent_version


def test_a_child_of_a_missing_parent_is_never_created():
    """A child whose result could never be delivered is refused up front (see also
    test_bad_input.test_child_of_an_unknown_parent_is_refused)."""
    parent = str(ExecutionId.generate())  # never created
    orphan = str(ExecutionId.parse(parent).child(JoinSetId("n", "js"), 1))
    with unchanged(), pytest.raises(errors.NotFound):
        create(execution_id=orphan, parent=(parent, "n:js"), now=T0)


def test_response_seq_is_per_parent_contiguous_from_1_in_finishing_order():
    wf = create_workflow(now=T0)
    other = create_workflow(now=T0)
    kids = submit_children(wf, "n:a", 3, now=T0)
    (other_kid,) = submit_children(other, "n:a", 1, now=T0)
    finish(kids[1], Ok("second"), now=at(1))
    finish(other_kid, Err("x"), now=at(2))
    finish(kids[2], Err("third"), now=at(3))
    finish(kids[0], ExecutionFailure("uncategorized", "boom"), now=at(4))
    responses, max_seq = store.list_responses(wf)
    assert max_seq == 3
    assert [(r.seq, r.child_execution_id, r.child_retval) for r in responses] == [
        (1, kids[1], Ok("second")),
        (2, kids[2], Err("third")),
        (3, kids[0], ExecutionFailure("uncategorized", "boom")),
    ]
    ((other_response,), other_max) = store.list_responses(other)
    assert (other_response.seq, other_max, other_response.child_retval) == (1, 1, Err("x"))


@pytest.mark.parametrize("finish_after, expected_pending_after", [(3, 10), (25, 25)])
def test_blocked_parent_becomes_pending_at_max_of_run_expiry_and_response_time(finish_after, expected_pending_after):
    wf, locked, js, child = blocked_workflow(T0)
    state = row(wf)
    assert (state.state, state.join_set_id, state.pending_expires_finished) == ("blocked_by_join_set", js, at(10))
    assert (state.executor_id, state.run_id) == (locked.locked.executor_id, locked.locked.run_id)
    version = state.corresponding_version
    finish(child, Ok(1), now=at(finish_after))
    state = row(wf)
    assert (state.state, state.lifecycle) == ("pending_at", "active")
    assert state.pending_expires_finished == at(expected_pending_after)
    assert (state.join_set_id, state.join_set_closing) == (None, None)
    assert state.corresponding_version == version
    # the run that kept the workflow warm may lock it again before that time (same executor and run)
    again = store.lock_one(
        wf,
        state.next_version,
        WORKFLOW_TERMS,
        executor_id=locked.locked.executor_id,
        run_id=locked.locked.run_id,
        deployment_id=DEPLOYMENT,
        now=at(finish_after),
    )
    assert [r.child_execution_id for r in again.responses] == [child]


def test_response_for_another_join_set_does_not_unblock():
    wf = create_workflow(now=T0)
    (a_kid,) = submit_children(wf, "n:a", 1, now=T0)
    (b_kid,) = submit_children(wf, "n:b", 1, now=T0)
    join_next(wf, "n:a", run_expires_at=at(10), now=T0)
    finish(b_kid, Ok("b"), now=at(1))
    state = row(wf)
    assert (state.state, state.join_set_id, state.pending_expires_finished) == ("blocked_by_join_set", "n:a", at(10))
    assert [r.child_execution_id for r in store.list_responses(wf)[0]] == [b_kid]
    finish(a_kid, Ok("a"), now=at(2))
    state = row(wf)
    assert (state.state, state.pending_expires_finished) == ("pending_at", at(10))


def test_cancelling_blocked_parent_stays_blocked_when_a_response_arrives():
    wf, _, js, child = blocked_workflow(T0)
    assert store.cancel(wf, now=at(1)) == store.CancelOutcome.REQUESTED
    finish(child, Ok(1), now=at(2))
    state = row(wf)
    assert (state.state, state.lifecycle, state.join_set_id) == ("blocked_by_join_set", "cancelling", js)
    assert [r.child_execution_id for r in store.list_responses(wf)[0]] == [child]


def test_paused_blocked_parent_becomes_paused_pending_when_the_response_arrives():
    wf, _, js, child = blocked_workflow(T0)
    store.pause_execution(wf, now=at(1))
    assert (row(wf).state, row(wf).lifecycle) == ("blocked_by_join_set", "paused")
    finish(child, Ok(1), now=at(20))
    state = row(wf)
    assert (state.state, state.lifecycle, state.pending_expires_finished) == ("pending_at", "paused", at(20))
    with unchanged():
        assert lock_pending(at(100)) == []
    store.unpause_execution(wf, now=at(30))
    (locked,) = lock_pending(at(30))
    assert locked.execution_id == wf


# ---------------------------------------------------------------------------------------
# Join-set response ordering (spec 000 §5.2 JoinNext, decision 9)
# ---------------------------------------------------------------------------------------


def test_nth_join_next_consumes_nth_response_by_seq_not_by_submission_or_time():
    wf = create_workflow(now=T0)
    first, second = submit_children(wf, "n:js", 2, now=T0)
    # submitted first, second; responses arrive second (seq 1, at 8 s) then first (seq 2, at 5 s)
    finish(second, Ok(2), now=at(8))
    finish(first, Ok(1), now=at(5))
    assert [r.child_execution_id for r in store.list_responses(wf)[0]] == [second, first]
    # run_expires_at = T0, so the pending time reveals which response each join-next took
    state = join_next(wf, "n:js", run_expires_at=T0, now=at(10))
    assert (state.state, state.pending_expires_finished) == ("pending_at", at(8))
    state = join_next(wf, "n:js", run_expires_at=T0, now=at(10))
    assert (state.state, state.pending_expires_finished) == ("pending_at", at(5))
    state = join_next(wf, "n:js", run_expires_at=at(20), now=at(10))
    assert (state.state, state.join_set_id, state.pending_expires_finished) == ("blocked_by_join_set", "n:js", at(20))


def test_join_next_counts_responses_per_join_set():
    wf = create_workflow(now=T0)
    a1, a2 = submit_children(wf, "n:a", 2, now=T0)
    (b1,) = submit_children(wf, "n:b", 1, now=T0)
    finish(a1, Ok(), now=at(3))  # seq 1
    finish(b1, Ok(), now=at(4))  # seq 2
    finish(a2, Ok(), now=at(6))  # seq 3
    assert join_next(wf, "n:a", run_expires_at=T0, now=at(7)).pending_expires_finished == at(3)
    assert join_next(wf, "n:a", run_expires_at=T0, now=at(7)).pending_expires_finished == at(6)
    assert join_next(wf, "n:b", run_expires_at=T0, now=at(7)).pending_expires_finished == at(4)
    assert join_next(wf, "n:b", run_expires_at=T0, now=at(7)).state == "blocked_by_join_set"


def test_join_next_waits_for_a_later_response_when_responses_arrive_after_blocking():
    wf = create_workflow(now=T0)
    first, second = submit_children(wf, "n:js", 2, now=T0)
    finish(first, Ok(), now=at(1))
    assert join_next(wf, "n:js", run_expires_at=T0, now=at(2)).pending_expires_finished == at(1)
    assert join_next(wf, "n:js", run_expires_at=at(3), now=at(2)).state == "blocked_by_join_set"
    finish(second, Ok(), now=at(9))
    state = row(wf)
    assert (state.state, state.pending_expires_finished) == ("pending_at", at(9))


def test_join_next_try_found_consumes_a_response():
    wf = create_workflow(now=T0)
    first, second = submit_children(wf, "n:js", 2, now=T0)
    finish(first, Ok(), now=at(3))
    finish(second, Ok(), now=at(6))
    join_next_try(wf, "n:js", "found", now=at(7))
    event_row = ExecutionEvent.objects.get(execution_id=wf, version=row(wf).corresponding_version)
    assert event_row.join_set_id == "n:js"  # decision 9: the log row records its join set
    assert row(wf).state == "pending_at"
    # the JoinNext after it is the second consuming join-next: it takes the second response
    state = join_next(wf, "n:js", run_expires_at=T0, now=at(7))
    assert (state.state, state.pending_expires_finished) == ("pending_at", at(6))


def test_join_next_try_found_without_an_unconsumed_response_is_rejected():
    wf = create_workflow(now=T0)
    first, _ = submit_children(wf, "n:js", 2, now=T0)
    with unchanged(), pytest.raises(errors.ValidationFailed):
        join_next_try(wf, "n:js", "found", now=at(1))
    finish(first, Ok(), now=at(3))
    join_next(wf, "n:js", run_expires_at=T0, now=at(4))  # consumes the only response
    with unchanged(), pytest.raises(errors.ValidationFailed):
        join_next_try(wf, "n:js", "found", now=at(5))


def test_join_next_try_pending_consumes_nothing():
    wf = create_workflow(now=T0)
    first, second = submit_children(wf, "n:js", 2, now=T0)
    join_next_try(wf, "n:js", "pending", now=at(1))
    finish(first, Ok(), now=at(3))
    join_next_try(wf, "n:js", "pending", now=at(4))
    state = join_next(wf, "n:js", run_expires_at=T0, now=at(5))
    assert (state.state, state.pending_expires_finished) == ("pending_at", at(3))
    join_next_try(wf, "n:js", "pending", now=at(6))
    assert join_next(wf, "n:js", run_expires_at=at(7), now=at(6)).state == "blocked_by_join_set"
    finish(second, Ok(), now=at(9))
    assert (row(wf).state, row(wf).pending_expires_finished) == ("pending_at", at(9))


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


# ---------------------------------------------------------------------------------------
# Listing executions (spec 000 §7.4 list_executions, with keyset cursors)
# ---------------------------------------------------------------------------------------


def _walk(direction: str, limit: int, cursor: str | None = None) -> list[store.Page]:
    """Follow ``older_cursor`` (or ``newer_cursor``) from the page at ``cursor`` to the end."""
    key = "older_than" if direction == "older" else "newer_than"
    pages = [store.list_executions(limit=limit, **({key: cursor} if cursor else {}))]
    while (cursor := pages[-1].older_cursor if direction == "older" else pages[-1].newer_cursor) is not None:
        pages.append(store.list_executions(limit=limit, **{key: cursor}))
        assert len(pages) <= 30
    return pages


def _ids(pages: list[store.Page]) -> list[str]:
    return [r.execution_id for page in pages for r in page.items]


@pytest.mark.parametrize("limit", [1, 4, 7, 25, 30])
def test_list_executions_pages_visit_every_row_exactly_once_in_both_directions(limit):
    # groups of three with identical created_at; times alternate whole and fractional seconds
    created = [(at(i // 3 * 0.5), create(now=at(i // 3 * 0.5))) for i in range(25)]
    expected = [eid for _, eid in sorted(created, reverse=True)]  # newest first, ties by id descending
    older = _walk("older", limit)
    assert _ids(older) == expected
    assert [len(page.items) for page in older[:-1]] == [limit] * (len(older) - 1)
    assert older[0].newer_cursor is None
    if len(older) == 1:
        return
    # walking back from the oldest page visits every other row once, each page newest first
    newer = _walk("newer", limit, older[-1].newer_cursor)
    assert _ids(list(reversed(newer))) + _ids(older[-1:]) == expected


def test_list_executions_newer_cursor_returns_the_previous_page():
    for i in range(10):
        create(now=at(i // 2))
    first = store.list_executions(limit=4)
    assert first.newer_cursor is None and first.older_cursor is not None
    second = store.list_executions(limit=4, older_than=first.older_cursor)
    back = store.list_executions(limit=4, newer_than=second.newer_cursor)
    assert [r.execution_id for r in back.items] == [r.execution_id for r in first.items]
    assert back.newer_cursor is None


def _listed(filters: store.ExecutionFilter, now=None) -> set[str]:
    return {r.execution_id for r in store.list_executions(filters, limit=1000, now=now).items}


def test_list_executions_status_filters():
    pending = create(now=T0)
    scheduled = create(now=T0, scheduled_at=at(1000))
    locked = create(now=T0)
    lock(locked, now=T0)
    blocked, _, _, child = blocked_workflow(T0)
    paused = create(now=T0, paused=True)
    cancelling = create(now=T0)
    store.cancel(cancelling, now=at(1))
    finished_ok = create(now=T0)
    finish(finished_ok, Ok(1), now=at(1))
    finished_error = create(now=T0)
    finish(finished_error, Err("no"), now=at(1))
    finished_failure = create(now=T0)
    finish(finished_failure, ExecutionFailure("uncategorized"), now=at(1))
    now = at(100)
    expected = {
        "pending": {pending},
        "scheduled": {scheduled},
        "locked": {locked},
        "blocked": {blocked},
        "paused": {paused},
        "cancelling": {cancelling},
        "finished": {finished_ok, finished_error, finished_failure},
        "finished_ok": {finished_ok},
        "finished_error": {finished_error},
        "finished_failure": {finished_failure},
    }
    assert set(expected) == set(store.STATUS_FILTERS)
    for status, ids in expected.items():
        assert _listed(store.ExecutionFilter(statuses=(status,)), now) == ids, status
    assert _listed(store.ExecutionFilter(statuses=("paused", "cancelling", "finished_ok")), now) == {
        paused, cancelling, finished_ok,
    }  # fmt: skip
    everything = set().union(*expected.values())
    assert _listed(store.ExecutionFilter(), now) == everything
    assert _listed(store.ExecutionFilter(hide_finished=True), now) == everything - expected["finished"]
    assert _listed(store.ExecutionFilter(show_derived=True), now) == everything | {child}
    assert _listed(store.ExecutionFilter(show_derived=True, statuses=("pending",)), now) == {pending, child}
    # "pending" and "scheduled" depend on the `now` of the query
    assert _listed(store.ExecutionFilter(statuses=("pending",)), at(1000)) == {pending, scheduled}


def test_list_executions_prefix_filters():
    ids = {ffqn: create(ffqn, now=T0) for ffqn in ("a:pkg/ifc.fn", "a:pkg/ifc.other", "a:pkg2/ifc.fn", "b:pkg/ifc.fn")}
    assert _listed(store.ExecutionFilter(ffqn_prefix="a:pkg/")) == {ids["a:pkg/ifc.fn"], ids["a:pkg/ifc.other"]}
    assert _listed(store.ExecutionFilter(ffqn_prefix="a:pkg/ifc.fn")) == {ids["a:pkg/ifc.fn"]}
    assert _listed(store.ExecutionFilter(ffqn_prefix="a:")) == set(ids.values()) - {ids["b:pkg/ifc.fn"]}
    family = [create(execution_id=f"E_01ARZ3NDEKTSV4RRFFQ69G5FA{c}", now=T0) for c in "ABC"]
    stranger = create(execution_id="E_01BRZ3NDEKTSV4RRFFQ69G5FAV", now=T0)
    assert _listed(store.ExecutionFilter(execution_id_prefix="E_01ARZ")) == set(family)
    assert _listed(store.ExecutionFilter(execution_id_prefix=stranger)) == {stranger}
    (kid,) = submit_children(family[0], "n:js", 1, now=T0)
    assert _listed(store.ExecutionFilter(execution_id_prefix=family[0])) == {family[0]}
    assert _listed(store.ExecutionFilter(execution_id_prefix=family[0], show_derived=True)) == {family[0], kid}
    assert _listed(store.ExecutionFilter(execution_id_prefix=kid, show_derived=True)) == {kid}


@pytest.mark.parametrize(
    "kwargs",
    [
        {"older_than": "not-a-cursor"},
        {"newer_than": "%%%"},
        {"older_than": "eWVzdGVyZGF5fEVfMQ"},  # base64 of "yesterday|E_1"
        {"filters": store.ExecutionFilter(statuses=("running",))},
        {"filters": store.ExecutionFilter(statuses=("pending", "nope"))},
    ],
)
def test_list_executions_rejects_invalid_cursors_and_statuses(kwargs):
    create(now=T0)
    with pytest.raises(errors.ValidationFailed):
        store.list_executions(**kwargs)


# ---------------------------------------------------------------------------------------
# Listing events and responses (spec 000 §7.4 list_execution_events, list_responses)
# ---------------------------------------------------------------------------------------


def test_list_events_pages_and_max_version():
    execution_id = create(now=T0)
    store.append_batch(execution_id, 1, [persist() for _ in range(6)], now=at(1))
    all_events = store.get(execution_id).events
    assert [e.version for e in all_events] == list(range(7))
    seen = []
    from_version = 0
    while True:
        events, max_version = store.list_events(execution_id, from_version=from_version, limit=3)
        assert max_version == 6
        if not events:
            break
        assert len(events) <= 3
        seen.extend(events)
        from_version = events[-1].version + 1
    assert seen == all_events
    assert store.list_events(execution_id, from_version=6, limit=3) == ([all_events[6]], 6)
    assert store.list_events(execution_id, from_version=7) == ([], 6)


def test_list_events_of_an_unknown_execution_is_not_found():
    with pytest.raises(errors.NotFound):
        store.list_events(str(ExecutionId.generate()))


def test_list_responses_pages_and_max_seq():
    wf = create_workflow(now=T0)
    assert store.list_responses(wf) == ([], 0)
    kids = submit_children(wf, "n:js", 5, now=T0)
    for i, kid in enumerate(kids):
        finish(kid, Ok(i), now=at(i))
    all_responses, max_seq = store.list_responses(wf, limit=None)
    assert [r.seq for r in all_responses] == [1, 2, 3, 4, 5] and max_seq == 5
    assert [r.child_retval for r in all_responses] == [Ok(i) for i in range(5)]
    pages, after = [], 0
    while True:
        page, max_seq = store.list_responses(wf, after_seq=after, limit=2)
        assert max_seq == 5
        if not page:
            break
        pages.append([r.seq for r in page])
        after = page[-1].seq
    assert pages == [[1, 2], [3, 4], [5]]
    assert store.list_responses(wf, after_seq=3, limit=100)[0] == all_responses[3:]


# ---------------------------------------------------------------------------------------
# Reads (spec 000 §7.3 get, get_execution_event, get_last_execution_event, wait_for_finished_result)
# ---------------------------------------------------------------------------------------


def test_get_returns_events_responses_and_state_consistently():
    wf, locked, js, child = blocked_workflow(T0)
    finish(child, Ok("done"), now=at(4))
    log = store.get(wf)
    state = row(wf)
    assert log.state == store.ExecutionSnapshot.of(state)
    # A read hands out a frozen value, not a model a caller could save around the store.
    assert not hasattr(log.state, "save")
    with pytest.raises(dataclasses.FrozenInstanceError):
        log.state.state = "finished"
    assert (log.state.state, log.state.pending_expires_finished) == ("pending_at", at(10))
    assert log.next_version == state.next_version == 5
    assert [e.version for e in log.events] == list(range(5))
    assert [type(e.event).__name__ for e in log.events] == [
        "Created", "Locked", "HistoryEventRecord", "HistoryEventRecord", "HistoryEventRecord",
    ]  # fmt: skip
    assert log.events == store.list_events(wf)[0]
    assert log.responses == store.list_responses(wf)[0]
    assert [r.child_retval for r in log.responses] == [Ok("done")]
    assert log.events[1].event.run_id == locked.locked.run_id
    with pytest.raises(errors.NotFound):
        store.get(str(ExecutionId.generate()))


def test_get_event_and_get_last_event():
    execution_id = create(now=T0)
    store.append(execution_id, 1, persist(), now=at(1))
    store.append(execution_id, 2, Finished(retval=Err("bad")), now=at(2))
    created = store.get_event(execution_id, 0)
    assert (created.version, created.created_at, created.event.ffqn) == (0, T0, FFQN)
    middle = store.get_event(execution_id, 1)
    assert (middle.version, middle.created_at, middle.event.event.value) == (1, at(1), [4, 2])
    last = store.get_last_event(execution_id)
    assert last == store.get_event(execution_id, 2)
    assert (last.version, last.created_at, last.event.retval) == (2, at(2), Err("bad"))
    with pytest.raises(errors.NotFound):
        store.get_event(execution_id, 3)
    with pytest.raises(errors.NotFound):
        store.get_last_event(str(ExecutionId.generate()))


def test_get_finished_result_is_none_until_finished():
    execution_id = create(now=T0)
    assert store.get_finished_result(execution_id) is None
    locked = lock(execution_id, now=T0)
    assert store.get_finished_result(execution_id) is None
    store.append(execution_id, locked.next_version, Finished(retval=Ok([1, 2])), fence=locked.fence, now=at(1))
    assert store.get_finished_result(execution_id) == Ok([1, 2])
    with pytest.raises(errors.NotFound):
        store.get_finished_result(str(ExecutionId.generate()))


def test_wait_for_finished_result_times_out_or_returns_the_value():
    running = create(now=T0)
    with pytest.raises(errors.Timeout):
        store.wait_for_finished_result(running, timeout=0.2)
    done = create(now=T0)
    finish(done, Err({"code": 7}), now=at(1))
    assert store.wait_for_finished_result(done, timeout=0.2) == Err({"code": 7})
    with pytest.raises(errors.NotFound):
        store.wait_for_finished_result(str(ExecutionId.generate()), timeout=0.2)
