"""Spec 002 §6's conformance tests (the seed's tests 1-7) through the real store, on
PostgreSQL and SQLite: each scenario of ``tests/workflows/test_replay_conformance.py`` (the
pure core against fakes) runs here with the store adapters of ``workers.replay_adapters``.

Runs are driven host call by host call (``tests.support.workflow_runs.start_run``) under
every blocking strategy; between runs children finish and stubs arrive through the store
(``World``). The tests assert what the database holds: contiguous versions, which history
events a run wrote (a replay writes none), results and nondeterminism failures.

why: D33, D37 (spec 002 §6 ported, Await the default)
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection

from executions import store
from executions.events import (
    Created,
    ExecutionFailure,
    Finished,
    JoinNext,
    JoinSetCreate,
    JoinSetRequest,
    Ok,
    Schedule,
    Stub,
)
from executions.ids import ExecutionId
from executions.models import ExecutionState
from tests.support.workflow_runs import (
    AWAIT_0,
    FN1,
    FN2,
    INTERRUPT,
    OK_EMPTY,
    SAFETY,
    STRATEGIES,
    World,
    assert_versions_contiguous,
    children_of,
    events,
    finish_child,
    history_events,
    new_driven,
    result,
    start_run,
)
from workers.replay import (
    FunctionMismatch,
    NondeterminismDetected,
    WorkflowInterrupt,
)

pytestmark = pytest.mark.django_db(transaction=True)


# ---------------------------------------------------------------------------------------------
# Spec 002 §6: the seed's conformance tests, through the store
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("second", STRATEGIES, ids=str)
def test_regular_join_next_child_replays_without_writes_once_the_response_arrived(second):
    """§6 test 1: an await-next interrupts the first run and leaves the row blocked; the
    child's ``Finished`` delivers the response and makes the row pending; the next run
    replays the three calls from the stored history, writes no history event, and gets the
    value."""
    execution_id = new_driven()
    run1 = start_run(execution_id, INTERRUPT)
    join_set = run1.history.create_join_set()
    child = run1.history.submit(join_set, FN1, [])
    assert str(child) == f"{execution_id}.g:1_1"
    with pytest.raises(WorkflowInterrupt):
        run1.history.await_next(join_set, FN1)
    assert store.get_state(execution_id).state == "blocked_by_join_set"
    finish_child(str(child), OK_EMPTY)
    assert store.get_state(execution_id).state == "pending_at"
    recorded = history_events(execution_id)

    run2 = start_run(execution_id, second)
    assert run2.history.create_join_set() == join_set
    assert run2.history.submit(join_set, FN1, []) == child
    assert run2.history.await_next(join_set, FN1) == (child, OK_EMPTY)
    run2.end("done")
    assert history_events(execution_id) == recorded
    assert [type(e) for _, e in recorded] == [JoinSetCreate, JoinSetRequest, JoinNext]
    assert children_of(execution_id) == [str(child)]
    assert result(execution_id) == Ok("done")
    assert_versions_contiguous(execution_id)


@pytest.mark.parametrize("strategy", STRATEGIES, ids=str)
def test_start_async_respond_then_join_next(strategy):
    """§6 test 2: a run submits and stops (handed back); the child finishes; the next run
    replays the submission and a *new* await-next resolves from the loaded response. Q6:
    with Await{100} the first run's events were still in its buffer, so the database holds
    nothing of it (no event, no child); the next run writes them afresh and waits in place
    while the child runs. Interrupt{100} (D60) writes them with its join-next and interrupts;
    a third run replays them and gets the child's value."""
    execution_id = new_driven()
    run1 = start_run(execution_id, strategy)
    join_set = run1.history.create_join_set()
    child = str(run1.history.submit(join_set, FN1, [2]))
    run1.hand_back()
    if strategy.batch:
        assert history_events(execution_id) == [] and children_of(execution_id) == []
    else:
        assert [type(e) for _, e in history_events(execution_id)] == [JoinSetCreate, JoinSetRequest]
        finish_child(child, Ok(1))
    recorded = history_events(execution_id)

    run2 = start_run(execution_id, strategy)
    assert run2.history.create_join_set() == join_set
    assert str(run2.history.submit(join_set, FN1, [2])) == child
    if strategy.batch and not strategy.waits:
        with pytest.raises(WorkflowInterrupt):
            run2.history.await_next(join_set, FN1)
        assert [type(e) for _, e in history_events(execution_id)] == [JoinSetCreate, JoinSetRequest, JoinNext]
        assert store.get_state(execution_id).state == "blocked_by_join_set"
        finish_child(child, Ok(1))
        run2 = start_run(execution_id, strategy)
        assert run2.history.create_join_set() == join_set
        assert str(run2.history.submit(join_set, FN1, [2])) == child
        assert run2.history.await_next(join_set, FN1) == (ExecutionId.parse(child), Ok(1))
    elif strategy.batch:
        world = World(execution_id)
        waiting = threading.Thread(target=lambda: (_await_child(world, child), connection.close()), daemon=True)
        waiting.start()
        assert run2.history.await_next(join_set, FN1) == (ExecutionId.parse(child), Ok(4))
        waiting.join(SAFETY)
    else:
        assert run2.history.await_next(join_set, FN1) == (ExecutionId.parse(child), Ok(1))
    run2.end()
    written = history_events(execution_id)[len(recorded) :]
    if strategy.batch:
        assert [type(e) for _, e in written] == [JoinSetCreate, JoinSetRequest, JoinNext]
    else:
        assert history_events(execution_id)[: len(recorded)] == recorded
        assert [type(e) for _, e in written] == [JoinNext]
    assert children_of(execution_id) == [child]
    assert_versions_contiguous(execution_id)


def _await_child(world: World, child: str) -> None:
    """The world, in another thread: runs the child as soon as it exists."""
    deadline = time.monotonic() + SAFETY
    while not (ExecutionState.objects.filter(pk=child, state="finished").exists()):
        world.step()
        assert time.monotonic() < deadline
        time.sleep(0.02)


@pytest.mark.parametrize("in_order", [True, False], ids=["in_order", "out_of_order"])
def test_two_children_then_two_await_nexts_consume_responses_fifo(in_order):
    """§6 test 3: responses are consumed in the order the store delivered them (``seq``)
    within a join set; an await-next meeting another function's child consumes it and
    reports the mismatch."""
    execution_id = new_driven()
    fn_a, fn_b = (FN1, FN2) if in_order else (FN2, FN1)
    run1 = start_run(execution_id)
    join_set = run1.history.create_join_set()
    a = run1.history.submit(join_set, fn_a, [])
    b = run1.history.submit(join_set, fn_b, [])
    assert (str(a), str(b)) == (f"{execution_id}.g:1_1", f"{execution_id}.g:1_2")
    with pytest.raises(WorkflowInterrupt):
        run1.history.await_next(join_set, fn_a)
    first, second = (a, b) if in_order else (b, a)
    finish_child(str(first), Ok(1))
    finish_child(str(second), Ok(2))

    run2 = start_run(execution_id)
    run2.history.create_join_set()
    run2.history.submit(join_set, fn_a, [])
    run2.history.submit(join_set, fn_b, [])
    if in_order:
        assert run2.history.await_next(join_set, fn_a) == (a, Ok(1))
        assert run2.history.await_next(join_set, FN2) == (b, Ok(2))
    else:
        with pytest.raises(FunctionMismatch) as mismatch:
            run2.history.await_next(join_set, fn_a)
        assert (mismatch.value.specified, mismatch.value.actual_ffqn, mismatch.value.actual_id) == (FN2, FN1, b)
    run2.end()
    assert sorted(children_of(execution_id)) == sorted([str(a), str(b)])
    assert_versions_contiguous(execution_id)


def test_schedule_event_is_processed_at_once():
    """§6 test 4: a written non-blocking event is processed at once (the next call's key is
    not matched against it); the scheduled execution is a new top-level execution with no
    parent, scheduled by this one."""
    execution_id = new_driven()
    run = start_run(execution_id)
    scheduled = run.history.schedule(FN1, [2], timedelta(hours=1))
    run.history.create_join_set()
    run.end()
    assert scheduled.is_top_level and scheduled.ulid[:10] == ExecutionId.parse(execution_id).ulid[:10]
    created = store.get_created(str(scheduled))
    assert (created.ffqn, created.params, created.parent, created.scheduled_by) == (FN1, [2], None, execution_id)
    assert store.get_state(str(scheduled)).state == "pending_at"
    assert [type(e) for _, e in history_events(execution_id)] == [Schedule, JoinSetCreate]
    assert_versions_contiguous(execution_id)


def test_submit_stub_await_in_two_runs():
    """§6 test 5: a stub finishes the child at version 1 and responds to the parent in one
    transaction; the await-next (Await) gets that response; a second run (the lock lost,
    locked again) replays everything, stub included, and writes nothing."""
    execution_id = new_driven()
    for run_number in (0, 1):
        run = start_run(execution_id, AWAIT_0, lock_duration=timedelta(seconds=1))
        before = history_events(execution_id)
        join_set = run.history.create_join_set()
        child = run.history.submit(join_set, FN1, [])
        assert run.history.stub(FN1, child, OK_EMPTY) is None
        assert run.history.await_next(join_set, FN1) == (child, OK_EMPTY)
        run.history.finalize()
        if run_number == 1:
            assert history_events(execution_id) == before
    assert [type(e) for e in events(str(child))] == [Created, Finished]
    assert result(str(child)) == OK_EMPTY
    assert [type(e) for _, e in history_events(execution_id)] == [JoinSetCreate, JoinSetRequest, Stub, JoinNext]
    run.end()
    assert_versions_contiguous(execution_id)


def test_stubbing_many_times_with_the_same_value_is_ok():
    """§6 test 6: a second stub with an equal value finds the child's ``Finished`` equal: ok,
    also from another execution, and on replay."""
    a = new_driven()
    for run_number in (0, 1):
        run = start_run(a, AWAIT_0, lock_duration=timedelta(seconds=1))
        join_set = run.history.create_join_set()
        child = run.history.submit(join_set, FN1, [])
        run.history.stub(FN1, child, OK_EMPTY)
        run.history.stub(FN1, child, OK_EMPTY)
        run.history.finalize()
        if run_number == 1:
            run.end()
    stubs = [e for _, e in history_events(a) if isinstance(e, Stub)]
    assert [s.result for s in stubs] == [{"Ok": None}, {"Ok": None}]
    b = new_driven()
    for run_number in (0, 1):
        run = start_run(b, AWAIT_0)
        run.history.stub(FN1, child, OK_EMPTY)
        run.history.stub(FN1, child, OK_EMPTY)
        run.history.finalize()
        if run_number == 0:
            run.hand_back()
    run.end()
    assert [e.result for _, e in history_events(b)] == [{"Ok": None}, {"Ok": None}]
    assert [type(e) for e in events(str(child))] == [Created, Finished]
    assert_versions_contiguous(a)
    assert_versions_contiguous(b)


@pytest.mark.parametrize("second", STRATEGIES, ids=str)
def test_trimmed_second_execution_is_nondeterminism(second):
    """§6 test 7: new code that does less than the recorded run leaves events unprocessed;
    ``finalize`` reports it and nothing is written; the run finishes the execution with the
    nondeterminism failure."""
    execution_id = new_driven()
    run1 = start_run(execution_id)
    join_set = run1.history.create_join_set()
    child = run1.history.submit(join_set, FN1, [])
    with pytest.raises(WorkflowInterrupt):
        run1.history.await_next(join_set, FN1)
    finish_child(str(child), OK_EMPTY)
    recorded = history_events(execution_id)

    run2 = start_run(execution_id, second)
    with pytest.raises(NondeterminismDetected) as error:
        run2.history.finalize()
    assert str(error.value) == "found unprocessed request stored at version 2: event: JoinSetCreate(g:1)"
    assert history_events(execution_id) == recorded
    store.append(execution_id, None, Finished(retval=error.value.failure()), fence=run2.locked.fence)
    assert result(execution_id) == ExecutionFailure("nondeterminism_detected", None, str(error.value))
    assert store.get_state(execution_id).result_kind == '{"err":{"execution_failure":"nondeterminism_detected"}}'
