"""Batches, children and join sets (spec 000 §5.2 JoinNext, §6.4, §7.3, §12.9-13; decision 9):
batches are all or nothing, children are created with their parent link, a child's result
reaches its parent as a response in the same transaction, and the n-th join-next consumes
the n-th response of its join set by ``seq``.

Every test drives the store through its public API with explicit ``now=`` values (``T0`` lies
in the future, so wall-clock time never matters) and asserts what is read back from the
database; "nothing written" is ``db_snapshot()`` equal before and after. The spec is spec 000
and the decisions in ``../shared/spec/README.md`` (next to this repository).

why: D10, D20, D55, D64
"""

from __future__ import annotations

import pytest

from executions import errors, store
from executions.events import (
    ChildExecutionRequest,
    DelayRequest,
    Err,
    ExecutionFailure,
    JoinSetCreate,
    JoinSetRequest,
    Ok,
    Unlocked,
)
from executions.ids import DelayId, ExecutionId, JoinSetId
from executions.models import ExecutionEvent
from tests.support.conformance import (
    at,
    blocked_workflow,
    child_request,
    finish,
    join_next,
    join_next_try,
    kid,
    lock_pending,
    persist,
    row,
    submit_children,
    unchanged,
)
from tests.support.helpers import (
    DEPLOYMENT,
    FFQN,
    T0,
    WORKFLOW_TERMS,
    create,
    create_workflow,
    event_variants,
    history,
    lock,
)

pytestmark = pytest.mark.django_db


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
