"""The pure replay core (``workers/replay/``) held to spec 002 §6: the seed's conformance tests
1-7 (join sets that upstream names ``o:``/``g:`` are ``g:1`` here: decision 6 forbids empty
names, and one-off join sets only come from one-off calls) and the suggested extra tests.

No database: ``tests.support.replay_fakes.FakeStore`` stands in for the execution store
(versions fenced, children created with their requests, responses delivered per parent by
``seq``) and ``World`` makes children finish and delays fire on demand. The same scenarios
run against the real store in ``tests/workflows/test_replay_in_store_*.py``.

why: D33, D37, D39
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from executions.events import (
    Err,
    ExecutionFailure,
    JoinNext,
    JoinNextTooMany,
    JoinSetCreate,
    JoinSetRequest,
    Ok,
    Persist,
)
from executions.ids import ExecutionId
from tests.support.replay_fakes import (
    AWAIT_0,
    AWAIT_100,
    FN1,
    FN2,
    INTERRUPT,
    OK_EMPTY,
    STRATEGIES,
    T0,
    FakeLease,
    FakeStore,
    FakeWriter,
    Strategy,
    start_run,
    written,
)
from workers.replay import (
    AllProcessed,
    EventHistory,
    FunctionMismatch,
    ImportedFunctionCallError,
    InvalidJoinSetName,
    JoinSetConflict,
    NondeterminismDetected,
    NotFoundInProcessedResponses,
    StubConflict,
    WorkflowInterrupt,
)

# ---------------------------------------------------------------------------------------------
# Spec 002 §6: the seed's conformance tests
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("second", STRATEGIES, ids=str)
def test_regular_join_next_child_replays_without_writes_once_the_response_arrived(second):
    """§6 test 1: an await-next interrupts on the first run; after the child's response the
    next run replays all three calls from the history, writes nothing, and gets the value."""
    store = FakeStore()
    execution_id = store.top_level()
    run1 = start_run(store, execution_id, INTERRUPT)
    join_set = run1.history.create_join_set()
    child = run1.history.submit(join_set, FN1, [])
    assert str(child) == f"{execution_id}.g:1_1"
    with pytest.raises(WorkflowInterrupt):
        run1.history.await_next(join_set, FN1)
    store.finish(str(child), OK_EMPTY)

    run2 = start_run(store, execution_id, second)
    assert run2.history.create_join_set() == join_set
    assert run2.history.submit(join_set, FN1, []) == child
    assert run2.history.await_next(join_set, FN1) == (child, OK_EMPTY)
    run2.history.finalize()
    assert run2.writer.appends == []


@pytest.mark.parametrize("strategy", STRATEGIES, ids=str)
def test_start_async_respond_then_join_next(strategy):
    """§6 test 2: a run submits and ends; the response arrives; the next run replays the
    submission and a *new* await-next resolves from the loaded response. Q6: with Await{100}
    the first run's events stay in its unflushed buffer and are lost, so the second run writes
    them afresh, and still passes."""
    store = FakeStore()
    execution_id = store.top_level()
    run1 = start_run(store, execution_id, strategy)
    join_set = run1.history.create_join_set()
    child = run1.history.submit(join_set, FN1, [])
    store.respond(execution_id, str(join_set), child_execution_id=str(child), child_retval=Ok(1))

    run2 = start_run(store, execution_id, strategy)
    assert run2.history.create_join_set() == join_set
    assert run2.history.submit(join_set, FN1, []) == child
    assert run2.history.await_next(join_set, FN1) == (child, Ok(1))
    run2.history.finalize()
    if strategy.batch:
        assert run1.writer.appends == []
        assert [type(e) for e in written(run2)] == [JoinSetCreate, JoinSetRequest, JoinNext]
    else:
        assert [type(e) for e in written(run2)] == [JoinNext]


@pytest.mark.parametrize("in_order", [True, False], ids=["in_order", "out_of_order"])
def test_two_children_then_two_await_nexts_consume_responses_fifo(in_order):
    """§6 test 3: responses are consumed in arrival order within a join set; an await-next
    meeting another function's child consumes it and reports the mismatch."""
    store = FakeStore()
    execution_id = store.top_level()
    fn_a, fn_b = (FN1, FN2) if in_order else (FN2, FN1)
    run1 = start_run(store, execution_id)
    join_set = run1.history.create_join_set()
    a = run1.history.submit(join_set, fn_a, [])
    b = run1.history.submit(join_set, fn_b, [])
    assert (str(a), str(b)) == (f"{execution_id}.g:1_1", f"{execution_id}.g:1_2")
    with pytest.raises(WorkflowInterrupt):
        run1.history.await_next(join_set, fn_a)
    first, second = (a, b) if in_order else (b, a)
    store.finish(str(first), Ok(1))
    store.finish(str(second), Ok(2))

    run2 = start_run(store, execution_id)
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
    run2.history.finalize()


def test_schedule_event_is_processed_at_once():
    """§6 test 4: a written non-blocking event is immediately processed, so the next call's
    key is matched against nothing (otherwise it would mismatch the Schedule)."""
    store = FakeStore()
    execution_id = store.top_level()
    run = start_run(store, execution_id)
    scheduled = run.history.schedule(FN1, [])
    run.history.create_join_set()
    run.history.finalize()
    assert scheduled.is_top_level and scheduled.ulid[:10] == ExecutionId.parse(execution_id).ulid[:10]
    assert store.executions[str(scheduled)].scheduled_by == execution_id
    assert store.executions[str(scheduled)].parent is None


def test_submit_stub_await_in_two_runs():
    """§6 test 5: a stub finishes the child and responds to the parent; the await-next then
    receives the response while waiting; the next run replays everything, stub included."""
    store = FakeStore()
    execution_id = store.top_level()
    for run_number in (0, 1):
        run = start_run(store, execution_id, AWAIT_0)
        join_set = run.history.create_join_set()
        child = run.history.submit(join_set, FN1, [], component_type="activity_stub")
        assert run.history.stub(FN1, child, OK_EMPTY) is None
        assert run.history.await_next(join_set, FN1) == (child, OK_EMPTY)
        run.history.finalize()
        if run_number == 1:
            assert run.writer.appends == [] and run.writer.stubs == []
    assert store.executions[str(child)].retval == OK_EMPTY


def test_stubbing_many_times_with_the_same_value_is_ok():
    """§6 test 6: a second stub with an equal value finds it equal: ok, also from another
    execution, and on replay."""
    store = FakeStore()
    a = store.top_level()
    for _ in (0, 1):
        run = start_run(store, a, AWAIT_0)
        join_set = run.history.create_join_set()
        child = run.history.submit(join_set, FN1, [], component_type="activity_stub")
        run.history.stub(FN1, child, OK_EMPTY)
        run.history.stub(FN1, child, OK_EMPTY)
        run.history.finalize()
    b = store.top_level()
    for _ in (0, 1):
        run = start_run(store, b, AWAIT_0)
        run.history.stub(FN1, child, OK_EMPTY)
        run.history.stub(FN1, child, OK_EMPTY)
        run.history.finalize()


@pytest.mark.parametrize("second", STRATEGIES, ids=str)
def test_trimmed_second_execution_is_nondeterminism(second):
    """§6 test 7: new code that does less than the recorded run leaves events unprocessed."""
    store = FakeStore()
    execution_id = store.top_level()
    run1 = start_run(store, execution_id)
    join_set = run1.history.create_join_set()
    child = run1.history.submit(join_set, FN1, [])
    with pytest.raises(WorkflowInterrupt):
        run1.history.await_next(join_set, FN1)
    store.finish(str(child), OK_EMPTY)

    run2 = start_run(store, execution_id, second)
    with pytest.raises(NondeterminismDetected) as error:
        run2.history.finalize()
    assert str(error.value) == "found unprocessed request stored at version 1: event: JoinSetCreate(g:1)"
    assert error.value.failure() == ExecutionFailure("nondeterminism_detected", None, str(error.value))
    assert run2.writer.appends == []


# ---------------------------------------------------------------------------------------------
# Spec 002 §6: the suggested extra tests
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", STRATEGIES, ids=str)
def test_join_next_on_an_empty_join_set_is_all_processed_without_blocking(strategy):
    """§2.5: with nothing submitted, join-next writes JoinNextTooMany and raises AllProcessed
    without waiting; a replay raises it again from the history."""
    store = FakeStore()
    execution_id = store.top_level()
    for _run in (0, 1):
        run = start_run(store, execution_id, strategy)
        join_set = run.history.create_join_set()
        with pytest.raises(AllProcessed):
            run.history.join_next(join_set)
        run.history.finalize()
        assert run.waiter is None or run.waiter.calls == 0
    assert [type(e) for _, e in store.history(execution_id)] == [JoinSetCreate, JoinNextTooMany]
    assert run.writer.appends == []


def test_await_next_after_every_response_was_awaited_is_all_processed():
    """§2.6: the TooMany test counts per join set; the recorded TooMany keeps the function."""
    store = FakeStore()
    execution_id = store.top_level()
    for _run in (0, 1):
        run = start_run(store, execution_id, AWAIT_0, world=True)
        join_set = run.history.create_join_set()
        child = run.history.submit(join_set, FN1, [2])
        assert run.history.await_next(join_set, FN1) == (child, Ok(4))
        with pytest.raises(AllProcessed):
            run.history.await_next(join_set, FN2)
        run.history.finalize()
    assert store.history(execution_id)[-1][1] == JoinNextTooMany(join_set_id="g:1", requested_ffqn=FN2)
    assert run.writer.appends == []


def test_await_next_meeting_a_delay_is_a_function_mismatch_without_function():
    """§2.6: a delay's response is consumed and reported with ``actual_ffqn`` None."""
    store = FakeStore()
    execution_id = store.top_level()
    run = start_run(store, execution_id, AWAIT_0, world=True)
    join_set = run.history.create_join_set()
    delay = run.history.submit_delay(join_set, timedelta(seconds=1))
    with pytest.raises(FunctionMismatch) as mismatch:
        run.history.await_next(join_set, FN1)
    assert (mismatch.value.actual_ffqn, mismatch.value.actual_id) == (None, delay)
    assert run.history.open_join_sets() == {"g:1": []}
    run.history.finalize()


def test_get_reads_only_consumed_children_and_checks_the_function():
    """§2.7: unknown or unconsumed children are not found (even with another function: the
    order of the checks), a consumed one gives its value, another function is a mismatch."""
    store = FakeStore()
    execution_id = store.top_level()
    run = start_run(store, execution_id, AWAIT_0, world=True)
    join_set = run.history.create_join_set()
    with pytest.raises(NotFoundInProcessedResponses):
        run.history.get(FN1, f"{execution_id}.g:1_1")
    child = run.history.submit(join_set, FN1, [3])
    with pytest.raises(NotFoundInProcessedResponses):
        run.history.get(FN2, child)
    assert run.history.join_next(join_set) == (child, False)
    assert run.history.get(FN1, child) == Err(3)
    with pytest.raises(FunctionMismatch) as mismatch:
        run.history.get(FN2, child)
    assert (mismatch.value.actual_ffqn, mismatch.value.actual_id) == (FN1, child)
    with pytest.raises(ImportedFunctionCallError):
        run.history.get(FN1, execution_id)


def test_ids_follow_the_processed_prefix():
    """§1.2 with decision 2: delay and child indexes start at 1; one-off join sets share one
    counter: ``o:1-fn1``, ``o:2-sleep``; a derived execution's children nest its id."""
    store = FakeStore()
    execution_id = store.top_level()
    run = start_run(store, execution_id, AWAIT_0, world=True)
    join_set = run.history.create_join_set()
    assert [str(run.history.submit_delay(join_set, timedelta(seconds=s))) for s in (1, 2)] == [
        f"Delay_{execution_id[2:]}.g:1_1",
        f"Delay_{execution_id[2:]}.g:1_2",
    ]
    assert run.history.call(FN1, [2]) == 4
    run.history.sleep(timedelta(seconds=1))
    children = [i for i in store.order if i in store.executions]
    assert children == [f"{execution_id}.o:1-fn1_1"]
    assert f"Delay_{execution_id[2:]}.o:2-sleep_1" in store.delays
    assert [str(run.history.create_join_set()) for _ in range(11)] == [f"g:{n}" for n in range(2, 13)]

    derived = children[0]
    store.executions[derived].component_type = "workflow"
    nested = start_run(store, derived, AWAIT_0, world=True)
    assert nested.history.call(FN2, [5]) == 5
    assert f"{derived}.o:1-fn2_1" in store.executions


def test_named_join_set_conflict_and_invalid_names_record_nothing():
    """§2.2 with decision 6: ``[A-Za-z0-9_/-]+``; a conflict or a bad name is catchable and
    writes nothing; the generated counter does not move."""
    store = FakeStore()
    execution_id = store.top_level()
    run = start_run(store, execution_id)
    assert str(run.history.create_join_set("batch_1/a-b")) == "n:batch_1/a-b"
    with pytest.raises(JoinSetConflict):
        run.history.create_join_set("batch_1/a-b")
    for bad in ("", "a b", "a:b", "ä"):
        with pytest.raises(InvalidJoinSetName):
            run.history.create_join_set(bad)
    with pytest.raises(InvalidJoinSetName):
        run.history.invoke("bad label", FN1, [])
    assert str(run.history.create_join_set()) == "g:1"
    assert [e.join_set_id for e in written(run)] == ["n:batch_1/a-b", "g:1"]
    assert run.history.poisoned is None


def _tampered(history: list[tuple[int, Any]], position: int, **changes) -> list[tuple[int, Any]]:
    version, event = history[position]
    return [*history[:position], (version, event.model_copy(update=changes)), *history[position + 1 :]]


def _replay_history(store: FakeStore, execution_id: str, history: list) -> EventHistory:
    return EventHistory(
        execution_id,
        history,
        store.responses(execution_id),
        next_version=store.executions[execution_id].next_version,
        writer=FakeWriter(store, execution_id),
    )


@pytest.mark.parametrize(
    "change",
    [{"value": [255] * 8}, {"kind": {"type": "random_u64", "min": 0, "max_inclusive": 99}}],
    ids=["value", "kind"],
)
def test_persisted_value_or_kind_mismatch_is_nondeterminism(change):
    """§2.13: the regenerated value and the kind with its bounds must equal the stored ones."""
    store = FakeStore()
    execution_id = store.top_level()
    run = start_run(store, execution_id)
    value = run.history.random_u64(0, 1000)
    assert value < 1000
    replay = _replay_history(store, execution_id, _tampered(store.history(execution_id), 0, **change))
    with pytest.raises(NondeterminismDetected, match="key does not match event stored at version 1"):
        replay.random_u64(0, 1000)


def test_schedule_id_mismatch_is_nondeterminism():
    """§1.2: the scheduled id comes from the run's RNG; another id in the history mismatches."""
    store = FakeStore()
    execution_id = store.top_level()
    start_run(store, execution_id).history.schedule(FN1, [1])
    other = str(ExecutionId.generate())
    replay = _replay_history(store, execution_id, _tampered(store.history(execution_id), 0, execution_id=other))
    with pytest.raises(NondeterminismDetected, match=r"key: Schedule\("):
        replay.schedule(FN1, [1])


def test_closing_cancels_activities_and_delays_newest_first_and_awaits_workflows():
    """§5.1/§5.2: finalize closes the most recently created join set first; within it the
    unawaited activities and delays are cancelled in reverse submission order, child workflows
    are not cancelled but awaited; one closing JoinNext per unawaited request."""
    store = FakeStore()
    execution_id = store.top_level()
    run = start_run(store, execution_id, AWAIT_0, world=True)
    first = run.history.create_join_set()
    a1 = run.history.submit(first, FN1, [2])
    second = run.history.create_join_set()
    a2 = run.history.submit(second, FN1, [4])
    d2 = run.history.submit_delay(second, timedelta(hours=1))
    w2 = run.history.submit(second, FN2, [7], component_type="workflow")
    run.history.create_join_set()  # empty: left alone
    run.history.finalize()

    assert run.canceller.calls == [("delay", str(d2)), ("activity", str(a2)), ("activity", str(a1))]
    assert store.executions[str(w2)].retval == Ok(7)
    assert store.executions[str(a2)].retval == ExecutionFailure("cancelled", "cancelled by join set close")
    closing = [(e.join_set_id, e.closing) for e in written(run) if isinstance(e, JoinNext)]
    assert closing == [(str(second), True)] * 3 + [(str(first), True)]
    assert run.history.open_join_sets() == {"g:3": []}


def test_closing_flushes_buffered_submissions_before_cancelling_them():
    """§5.1 with §3.6: a close first writes the buffer, so the cancellation reaches a child
    that was still buffered (upstream cancels before the flush and misses it)."""
    store = FakeStore()
    execution_id = store.top_level()
    run = start_run(store, execution_id, AWAIT_100, world=True)
    join_set = run.history.create_join_set()
    child = run.history.submit(join_set, FN1, [2])
    delay = run.history.submit_delay(join_set, timedelta(seconds=1))
    run.history.close_join_set(join_set)
    assert store.executions[str(child)].retval.kind == "cancelled"
    assert store.delays[str(delay)][2] is False
    assert run.history.get(FN1, child).kind == "cancelled"


def test_replay_of_a_close_after_an_interrupt_cancels_again_and_consumes():
    """§5.1 step 4: under Interrupt the cancellations' responses are not loaded, so the first
    closing JoinNext interrupts; the next run replays the close, redoes the (idempotent,
    unrecorded) cancellation and consumes the response without writing."""
    store = FakeStore()
    execution_id = store.top_level()
    run1 = start_run(store, execution_id)
    join_set = run1.history.create_join_set()
    child = run1.history.submit(join_set, FN1, [])
    with pytest.raises(WorkflowInterrupt):
        run1.history.close_join_set(join_set)
    run2 = start_run(store, execution_id)
    run2.history.create_join_set()
    run2.history.submit(join_set, FN1, [])
    run2.history.close_join_set(join_set)
    assert run2.history.get(FN1, child) == ExecutionFailure("cancelled", "cancelled by join set close")
    run2.history.finalize()
    assert run2.canceller.calls == [("activity", str(child))]
    assert run2.writer.appends == []


@pytest.mark.parametrize("waits", [True, False], ids=["Await{3}", "Interrupt{3}"])
def test_batching_flushes_at_n_and_before_a_blocking_write(waits):
    """§3.6: with a batch of 3 three non-blocking events go in one write at their optimistic
    versions; a blocking call first flushes the buffer, then writes its own event. Under
    Interrupt as under Await (D60); the join-next then interrupts instead of waiting."""
    store = FakeStore()
    execution_id = store.top_level()
    run = start_run(store, execution_id, Strategy(waits, 3), world=waits)
    join_set = run.history.create_join_set()
    run.history.submit(join_set, FN1, [2])
    run.history.random_u64(0, 10)
    assert [(v, len(e), len(c)) for v, e, c in run.writer.appends] == [(1, 3, 1)]
    run.history.submit_delay(join_set, timedelta(seconds=1))
    run.history.now()
    assert len(run.writer.appends) == 1
    if waits:
        run.history.join_next(join_set)
    else:
        with pytest.raises(WorkflowInterrupt):
            run.history.join_next(join_set)
    assert [(v, [type(x) for x in e]) for v, e, _ in run.writer.appends[1:]] == [
        (4, [JoinSetRequest, Persist]),
        (6, [JoinNext]),
    ]
    assert run.history.next_version == 7


def test_the_lease_is_offered_an_extension_at_every_host_call():
    """Decision 5 and §3.2 step 1: each host call, replayed ones included, first lets the
    lease extend the lock; extending writes no event (lead's contract 6). Under Await the
    JoinNext keeps the run warm with ``run_expires_at`` = the lock's expiry (§4.2)."""
    store = FakeStore()
    execution_id = store.top_level()
    expiry = T0 + timedelta(minutes=5)
    for _ in (0, 1):
        lease = FakeLease(expiry)
        run = start_run(store, execution_id, AWAIT_0, world=True, lease=lease)
        join_set = run.history.create_join_set()
        run.history.submit(join_set, FN1, [2])
        run.history.join_next(join_set)
        run.history.finalize()
        assert lease.extension_checks == 4
    assert store.history(execution_id)[2][1].run_expires_at == expiry


def test_stub_with_a_different_value_is_a_conflict_also_on_replay():
    """§2.12: the second value conflicts; the Stub event records the conflict and a replay
    raises it again without touching the target."""
    store = FakeStore()
    execution_id = store.top_level()
    for _run in (0, 1):
        run = start_run(store, execution_id, AWAIT_0, world=True)
        join_set = run.history.create_join_set()
        child = run.history.submit(join_set, FN1, [], component_type="activity_stub")
        run.history.stub(FN1, child, Ok(1))
        with pytest.raises(StubConflict):
            run.history.stub(FN1, child, Ok(2))
        run.history.finalize()
    assert store.history(execution_id)[3][1].result == {"Err": "conflict"}
    assert run.writer.stubs == []
