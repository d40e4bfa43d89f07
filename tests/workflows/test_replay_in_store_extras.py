"""Spec 002 §6's suggested extra tests through the real store, plus what the store adds:
join-nexts on empty join sets, function mismatches, ids that follow the processed prefix,
closing (cancellation newest first, flushes before cancels), one transaction per batch of
writes, the Await wait woken only by a notification naming its execution, lease renewal at
a host call, stub conflicts and fatal stub errors.

Runs are driven host call by host call (``tests.support.workflow_runs.start_run``) on
PostgreSQL and SQLite; what is checked is what the database holds.

why: D39, D46, D60, D63, D67 (buffering and waking of runs against the store)
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import replace
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from executions import errors, store
from executions.events import (
    Created,
    Err,
    ExecutionFailure,
    Finished,
    HistoryEventRecord,
    JoinNext,
    JoinNextTooMany,
    JoinSetCreate,
    JoinSetRequest,
    Locked,
    Ok,
    Persist,
    Stub,
)
from executions.ids import ExecutionId
from executions.models import Delay, ExecutionState
from tests.support import workflows
from tests.support.helpers import DEPLOYMENT
from tests.support.workflow_runs import (
    AWAIT_0,
    AWAIT_100,
    FN1,
    FN2,
    INTERRUPT_100,
    OK_EMPTY,
    SAFETY,
    STRATEGIES,
    Run,
    Strategy,
    World,
    assert_versions_contiguous,
    children_of,
    events,
    finish_child,
    history_events,
    lock_when_due,
    new_driven,
    result,
    start_run,
)
from workers.registry import lookup
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
from workers.replay_adapters import StoreWaiter, StoreWriter

pytestmark = pytest.mark.django_db(transaction=True)


# ---------------------------------------------------------------------------------------------
# Spec 002 §6: the suggested extra tests, through the store
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", STRATEGIES, ids=str)
def test_join_next_on_an_empty_join_set_is_all_processed_without_blocking(strategy):
    """§2.5: with nothing submitted, join-next writes ``JoinNextTooMany``, raises
    ``AllProcessed`` and leaves the row locked (it never blocks); a replay raises it again
    from the history and writes nothing."""
    execution_id = new_driven()
    for run_number in (0, 1):
        run = start_run(execution_id, strategy)
        before = history_events(execution_id)
        join_set = run.history.create_join_set()
        with pytest.raises(AllProcessed):
            run.history.join_next(join_set)
        run.history.flush()
        assert store.get_state(execution_id).state == "locked"
        if run_number == 0:
            run.history.finalize()
            run.hand_back()
        else:
            assert history_events(execution_id) == before
    assert [type(e) for _, e in history_events(execution_id)] == [JoinSetCreate, JoinNextTooMany]
    run.end()
    assert_versions_contiguous(execution_id)


def test_await_next_after_every_response_was_awaited_is_all_processed():
    """§2.6: the TooMany test counts per join set; the recorded ``JoinNextTooMany`` keeps
    the requested function, and replays."""
    execution_id = new_driven()
    run = start_run(execution_id)
    join_set = run.history.create_join_set()
    child = run.history.submit(join_set, FN1, [2])
    with pytest.raises(WorkflowInterrupt):
        run.history.await_next(join_set, FN1)
    finish_child(str(child), Ok(4))
    for _run in (1, 2):
        run = start_run(execution_id)
        run.history.create_join_set()
        run.history.submit(join_set, FN1, [2])
        assert run.history.await_next(join_set, FN1) == (child, Ok(4))
        with pytest.raises(AllProcessed):
            run.history.await_next(join_set, FN2)
        run.history.finalize()
        if _run == 1:
            run.hand_back()
    run.end()
    assert history_events(execution_id)[-1][1] == JoinNextTooMany(join_set_id="g:1", requested_ffqn=FN2)
    assert_versions_contiguous(execution_id)


def test_await_next_meeting_a_delay_is_a_function_mismatch_without_function():
    """§2.6: a fired delay's response (``store.fire_delay``) is consumed by the await-next
    and reported with ``actual_ffqn`` None."""
    execution_id = new_driven()
    run1 = start_run(execution_id)
    join_set = run1.history.create_join_set()
    delay = run1.history.submit_delay(join_set, timedelta(hours=1))
    assert Delay.objects.filter(pk=str(delay)).exists()
    with pytest.raises(WorkflowInterrupt):
        run1.history.await_next(join_set, FN1)
    assert store.fire_delay(str(delay)) is store.DelayOutcome.DELIVERED
    assert not Delay.objects.filter(pk=str(delay)).exists()
    run2 = start_run(execution_id)
    run2.history.create_join_set()
    run2.history.submit_delay(join_set, timedelta(hours=1))
    with pytest.raises(FunctionMismatch) as mismatch:
        run2.history.await_next(join_set, FN1)
    assert (mismatch.value.actual_ffqn, mismatch.value.actual_id) == (None, delay)
    assert run2.history.open_join_sets() == {"g:1": []}
    run2.end()


def test_get_reads_only_consumed_children_and_checks_the_function():
    """§2.7: unknown or unconsumed children are not found (even with another function), a
    consumed one gives its stored value, another function is a mismatch, a top-level id is
    fatal."""
    execution_id = new_driven()
    run = start_run(execution_id, AWAIT_0)
    join_set = run.history.create_join_set()
    with pytest.raises(NotFoundInProcessedResponses):
        run.history.get(FN1, f"{execution_id}.g:1_1")
    child = run.history.submit(join_set, FN1, [3])
    with pytest.raises(NotFoundInProcessedResponses):
        run.history.get(FN2, child)
    finish_child(str(child), Err(3))
    assert run.history.join_next(join_set) == (child, False)
    assert run.history.get(FN1, child) == Err(3)
    with pytest.raises(FunctionMismatch) as mismatch:
        run.history.get(FN2, child)
    assert (mismatch.value.actual_ffqn, mismatch.value.actual_id) == (FN1, child)
    with pytest.raises(ImportedFunctionCallError):
        run.history.get(FN1, execution_id)


def test_ids_follow_the_processed_prefix_and_are_stored():
    """§1.2 with decision 2: delay and child indexes start at 1; one-off join sets share one
    counter (``o:1-fn1``, ``o:2-sleep``); the store holds exactly those children and timers."""
    execution_id = new_driven()
    run = start_run(execution_id)
    join_set = run.history.create_join_set()
    delays = [str(run.history.submit_delay(join_set, timedelta(hours=s))) for s in (1, 2)]
    assert delays == [f"Delay_{execution_id[2:]}.g:1_1", f"Delay_{execution_id[2:]}.g:1_2"]
    with pytest.raises(WorkflowInterrupt):
        run.history.call(FN1, [2])
    assert children_of(execution_id) == [f"{execution_id}.o:1-fn1_1"]
    finish_child(f"{execution_id}.o:1-fn1_1", Ok(4))
    run = start_run(execution_id)
    run.history.create_join_set()
    for s in (1, 2):
        run.history.submit_delay(join_set, timedelta(hours=s))
    assert run.history.call(FN1, [2]) == 4
    with pytest.raises(WorkflowInterrupt):
        run.history.sleep(timedelta(hours=3))
    sleep_delay = f"Delay_{execution_id[2:]}.o:2-sleep_1"
    assert sorted(Delay.objects.filter(execution_id=execution_id).values_list("delay_id", flat=True)) == sorted(
        [*delays, sleep_delay]
    )
    store.fire_delay(sleep_delay)
    run = start_run(execution_id)
    run.history.create_join_set()
    for s in (1, 2):
        run.history.submit_delay(join_set, timedelta(hours=s))
    run.history.call(FN1, [2])
    run.history.sleep(timedelta(hours=3))
    assert [str(run.history.create_join_set()) for _ in range(3)] == ["g:2", "g:3", "g:4"]
    with pytest.raises(WorkflowInterrupt):
        run.history.invoke("label", FN2, [1])
    assert children_of(execution_id) == [f"{execution_id}.o:1-fn1_1", f"{execution_id}.o:3-label_1"]
    assert_versions_contiguous(execution_id)


def test_named_join_set_conflict_and_invalid_names_record_nothing():
    """§2.2 with decision 6: ``[A-Za-z0-9_/-]+``; a conflict or a bad name is catchable and
    writes nothing; the generated counter does not move."""
    execution_id = new_driven()
    run = start_run(execution_id)
    assert str(run.history.create_join_set("batch_1/a-b")) == "n:batch_1/a-b"
    before = events(execution_id)
    with pytest.raises(JoinSetConflict):
        run.history.create_join_set("batch_1/a-b")
    for bad in ("", "a b", "a:b", "ä"):
        with pytest.raises(InvalidJoinSetName):
            run.history.create_join_set(bad)
    with pytest.raises(InvalidJoinSetName):
        run.history.invoke("bad label", FN1, [])
    assert events(execution_id) == before and children_of(execution_id) == []
    assert str(run.history.create_join_set()) == "g:1"
    run.end()
    assert [e.join_set_id for _, e in history_events(execution_id)] == ["n:batch_1/a-b", "g:1"]


def _tampered(records: list, position: int, **changes) -> list:
    record = records[position]
    event = record.event.event.model_copy(update=changes)
    return [*records[:position], replace(record, event=HistoryEventRecord(event=event)), *records[position + 1 :]]


def _history_over(run: Run, records: list) -> EventHistory:
    return EventHistory(
        run.execution_id,
        records,
        run.locked.responses or [],
        next_version=run.locked.next_version,
        writer=StoreWriter(run.locked, DEPLOYMENT),
        lease=run.lease,
    )


@pytest.mark.parametrize("change", ["value", "kind"])
def test_persisted_value_or_kind_mismatch_is_nondeterminism(change):
    """§2.13: the regenerated value and the kind with its bounds must equal the stored ones:
    new bounds in the code (kind), or a stored value that is not what the RNG draws (value,
    the loaded record altered)."""
    execution_id = new_driven()
    run1 = start_run(execution_id)
    assert run1.history.random_u64(0, 1000) < 1000
    run1.history.finalize()
    run1.hand_back()
    run2 = start_run(execution_id)
    if change == "kind":
        history = run2.history
        with pytest.raises(NondeterminismDetected, match=r"persist kind: history `RandomU64\(0, 999\)`"):
            history.random_u64(0, 100)
    else:
        history = _history_over(run2, _tampered(run2.locked.history, 0, value=[255] * 8))
        with pytest.raises(NondeterminismDetected, match="key does not match event stored at version 2"):
            history.random_u64(0, 1000)
    assert [type(e) for _, e in history_events(execution_id)] == [Persist]


def test_schedule_id_mismatch_is_nondeterminism():
    """§1.2: the scheduled id comes from the run's RNG; another id in the history mismatches."""
    execution_id = new_driven()
    run1 = start_run(execution_id)
    run1.history.schedule(FN1, [1])
    run1.history.finalize()
    run1.hand_back()
    run2 = start_run(execution_id)
    other = str(ExecutionId.generate())
    history = _history_over(run2, _tampered(run2.locked.history, 0, execution_id=other))
    with pytest.raises(NondeterminismDetected, match=r"key: Schedule\("):
        history.schedule(FN1, [1])


def test_closing_cancels_activities_and_delays_newest_first_and_awaits_workflows():
    """§5.1/§5.2: finalize closes the most recently created join set first; within it the
    unawaited activities and delays are cancelled in reverse submission order (cancellation
    requested in the store, delays answered as cancelled), child workflows are not cancelled
    but awaited; one closing JoinNext per unawaited request."""
    execution_id = new_driven()
    run = start_run(execution_id)
    first = run.history.create_join_set()
    a1 = run.history.submit(first, FN1, [2])
    second = run.history.create_join_set()
    a2 = run.history.submit(second, FN1, [4])
    d2 = run.history.submit_delay(second, timedelta(hours=1))
    w2 = run.history.submit(second, workflows.child_workflow.ffqn, [7], component_type="workflow")
    run.history.create_join_set()  # empty: left alone
    with pytest.raises(WorkflowInterrupt):
        run.history.finalize()
    assert run.canceller.calls == [("delay", str(d2)), ("activity", str(a2))]
    assert store.get_state(str(a2)).lifecycle == "cancelling"
    assert store.get_state(str(w2)).lifecycle == "active"
    world = World(execution_id, actions={FN1: "hold"}, fire_delays=False)  # fn1 runs only if cancelled
    world.settle()  # the sweep and the workers do their part
    assert result(str(a2)).kind == "cancelled"
    assert result(str(w2)) == Ok(8)
    for _ in range(3):
        run = start_run(execution_id)
        run.history.create_join_set()
        run.history.submit(first, FN1, [2])
        run.history.create_join_set()
        run.history.submit(second, FN1, [4])
        run.history.submit_delay(second, timedelta(hours=1))
        run.history.submit(second, workflows.child_workflow.ffqn, [7], component_type="workflow")
        run.history.create_join_set()
        try:
            run.history.finalize()
            break
        except WorkflowInterrupt:
            world.settle()
    run.end()
    assert run.canceller.calls[-1] == ("activity", str(a1))
    assert result(str(a1)).kind == "cancelled"
    closing = [(e.join_set_id, e.closing) for _, e in history_events(execution_id) if isinstance(e, JoinNext)]
    assert closing == [(str(second), True)] * 3 + [(str(first), True)]
    responses = store.get(execution_id).responses
    assert [r.delay_success for r in responses if r.delay_id] == [False]
    assert len(responses) == 4
    assert_versions_contiguous(execution_id)


def test_closing_flushes_buffered_submissions_before_cancelling_them():
    """§5.1 with §3.6: a close first writes the buffer (the children exist), so the
    cancellation reaches a child and a delay that were still buffered."""
    execution_id = new_driven()
    run = start_run(execution_id, AWAIT_100)
    join_set = run.history.create_join_set()
    child = run.history.submit(join_set, FN1, [2])
    delay = run.history.submit_delay(join_set, timedelta(hours=1))
    assert children_of(execution_id) == []
    helper = threading.Thread(
        target=_settle_until_finished,
        args=(World(execution_id, actions={FN1: "hold"}, fire_delays=False), str(child)),
        daemon=True,
    )
    helper.start()  # the sweep's part: finish the cancelled child while the close waits for it
    run.history.close_join_set(join_set)
    helper.join(SAFETY)
    assert result(str(child)).kind == "cancelled"
    assert run.history.get(FN1, child).kind == "cancelled"
    assert [(r.delay_id, r.delay_success) for r in store.get(execution_id).responses if r.delay_id] == [
        (str(delay), False)
    ]
    run.end()


def _settle_until_finished(world: World, execution_id: str) -> None:
    deadline = time.monotonic() + SAFETY
    try:
        while not ExecutionState.objects.filter(pk=execution_id, state="finished").exists():
            world.step()
            assert time.monotonic() < deadline
            time.sleep(0.02)
    finally:
        connection.close()


def test_replay_of_a_close_after_an_interrupt_cancels_again_and_consumes():
    """§5.1 step 4: under Interrupt the cancellation's response is not loaded, so the first
    closing JoinNext interrupts; the next run replays the close, redoes the (idempotent,
    unrecorded) cancellation, consumes the response, and writes nothing."""
    execution_id = new_driven()
    run1 = start_run(execution_id)
    join_set = run1.history.create_join_set()
    child = run1.history.submit(join_set, FN1, [])
    with pytest.raises(WorkflowInterrupt):
        run1.history.close_join_set(join_set)
    World(execution_id).settle()
    recorded = history_events(execution_id)
    run2 = start_run(execution_id)
    run2.history.create_join_set()
    run2.history.submit(join_set, FN1, [])
    run2.history.close_join_set(join_set)
    assert run2.history.get(FN1, child) == ExecutionFailure("cancelled", "cancellation requested")
    run2.history.finalize()
    assert run2.canceller.calls == [("activity", str(child))]
    assert history_events(execution_id) == recorded
    assert [type(e) for e in events(str(child))].count(Finished) == 1
    run2.end()
    assert_versions_contiguous(execution_id)


def test_interrupt_writes_a_join_sets_submissions_and_join_nexts_in_one_transaction_each():
    """D60: under the worker's Interrupt (a buffer of 100) a run that submits three children
    writes them, with their creation, in one transaction, which its first join-next (a
    blocking write) flushes before it writes itself; the next run, holding the three responses, replays and writes its two further join-nexts with its
    result, not one transaction per event as upstream's Interrupt does."""
    execution_id = new_driven()
    run1 = start_run(execution_id, INTERRUPT_100)
    join_set = run1.history.create_join_set()
    children = [run1.history.submit(join_set, FN1, [i]) for i in range(3)]
    assert history_events(execution_id) == [] and children_of(execution_id) == []
    with pytest.raises(WorkflowInterrupt):
        run1.history.await_next(join_set, FN1)
    records = [r for r in store.get(execution_id).events if isinstance(r.event, HistoryEventRecord)]
    assert [type(r.event.event) for r in records] == [JoinSetCreate, *[JoinSetRequest] * 3, JoinNext]
    assert len({r.created_at for r in records[:4]}) == 1
    assert sorted(children_of(execution_id)) == sorted(str(c) for c in children)
    assert store.get_state(execution_id).state == "blocked_by_join_set"
    for index, child in enumerate(children):
        finish_child(str(child), Ok(index))

    run2 = start_run(execution_id, INTERRUPT_100)
    assert run2.history.create_join_set() == join_set
    assert [run2.history.submit(join_set, FN1, [i]) for i in range(3)] == children
    assert [run2.history.await_next(join_set, FN1) for _ in children] == [(c, Ok(i)) for i, c in enumerate(children)]
    assert len(history_events(execution_id)) == 5  # the two new join-nexts are still buffered
    run2.end("done")
    records = [r for r in store.get(execution_id).events if isinstance(r.event, HistoryEventRecord)]
    assert [type(r.event.event) for r in records[5:]] == [JoinNext, JoinNext]
    assert records[5].created_at == records[6].created_at
    assert result(execution_id) == Ok("done")
    assert_versions_contiguous(execution_id)


@pytest.mark.postgres_only
def test_an_await_wait_reads_the_responses_only_when_a_notification_names_its_execution():
    """D63: the run's first wait reads the responses (one may have come before the waiter
    listened); a later wait reads them only once told of one for this execution: a
    response to another workflow costs it no query, and one to its own exactly one."""
    from django.test.utils import CaptureQueriesContext

    execution_id, other_id = new_driven(), new_driven()
    run, other = start_run(execution_id, AWAIT_0), start_run(other_id, AWAIT_0)
    ours, theirs = ([r.history.submit(r.history.create_join_set(), FN1, [i]) for i in (1, 2)] for r in (run, other))
    waiter = StoreWaiter(execution_id, run.lease)
    try:
        finish_child(str(ours[0]), Ok(1))
        assert [r.child_execution_id for r in waiter.wait_for_responses(0)] == [str(ours[0])]

        def respond_to_the_other_then_to_this_one():
            try:
                time.sleep(0.2)
                finish_child(str(theirs[0]), Ok(1))
                time.sleep(0.2)
                finish_child(str(ours[1]), Ok(2))
            finally:
                connection.close()

        thread = threading.Thread(target=respond_to_the_other_then_to_this_one)
        with CaptureQueriesContext(connection) as queries:
            thread.start()
            arrived = waiter.wait_for_responses(1)
        thread.join()
        assert [r.child_execution_id for r in arrived] == [str(ours[1])]
        assert len([q for q in queries.captured_queries if "t_join_set_response" in q["sql"]]) == 1
    finally:
        waiter.close()
        run.hand_back()
        other.hand_back()


@pytest.mark.postgres_only
def test_a_response_a_group_commit_of_this_process_makes_reaches_the_waiting_run_as_the_table_holds_it_unread():
    """D67: a child's result written by this process's executor (a group commit) comes to
    the run awaiting it in the same process with the commit's notification: no read of the
    responses, and exactly what the table holds (seq, time, result as stored). A response
    committed without its value (here: a single append) is still read from the table."""
    from django.test.utils import CaptureQueriesContext

    execution_id = new_driven()
    run = start_run(execution_id, AWAIT_0)
    children = [run.history.submit(run.history.create_join_set(), FN1, [i]) for i in (1, 2, 3)]
    waiter = StoreWaiter(execution_id, run.lease)

    def in_a_group_commit(child_id: str, retval) -> None:
        locked = lock_when_due(child_id, lookup(FN1))
        (result,) = store.append_many([store.AppendItem(child_id, None, Finished(retval=retval), locked.fence)])
        assert not isinstance(result, errors.StoreError)

    def responses_read(queries) -> int:
        return len([q for q in queries.captured_queries if "FROM t_join_set_response" in q["sql"]])

    # One responding thread, whose session stays open as a worker's does: the server's echo
    # of its notifications is then never heard as another process's.
    requests: queue.Queue = queue.Queue()

    def responder():
        try:
            while (respond := requests.get()) is not None:
                time.sleep(0.2)
                respond()
        finally:
            connection.close()

    thread = threading.Thread(target=responder)
    thread.start()

    def wait_while(respond, after_seq: int):
        with CaptureQueriesContext(connection) as queries:
            requests.put(respond)
            arrived = waiter.wait_for_responses(after_seq)
        return arrived, responses_read(queries)

    try:
        finish_child(str(children[0]), Ok(1))
        assert [r.seq for r in waiter.wait_for_responses(0)] == [1]  # the first wait reads
        value = Ok({"b": [1.5, 1e16, -0.0], "a": "\u00e9"})
        arrived, reads = wait_while(lambda: in_a_group_commit(str(children[1]), value), 1)
        assert reads == 0
        assert arrived == store.responses_after(execution_id, 1)
        assert arrived[0].child_retval == value
        arrived, reads = wait_while(lambda: finish_child(str(children[2]), Ok(3)), 2)
        assert reads == 1 and [r.seq for r in arrived] == [3]
    finally:
        requests.put(None)
        thread.join()
        waiter.close()
        run.hand_back()


def test_batching_flushes_at_n_and_before_a_blocking_write_each_in_one_transaction():
    """§3.6: with Await{3} three non-blocking events are written together (one transaction:
    one timestamp) with the child they create; a blocking call first flushes the buffer,
    then writes its own event."""
    execution_id = new_driven()
    run = start_run(execution_id, Strategy(True, 3))
    join_set = run.history.create_join_set()
    child = run.history.submit(join_set, FN1, [2])
    assert history_events(execution_id) == [] and children_of(execution_id) == []
    run.history.random_u64(0, 10)
    records = [r for r in store.get(execution_id).events if isinstance(r.event, HistoryEventRecord)]
    assert [(r.version, type(r.event.event)) for r in records] == [
        (2, JoinSetCreate),
        (3, JoinSetRequest),
        (4, Persist),
    ]
    assert len({r.created_at for r in records}) == 1
    assert children_of(execution_id) == [str(child)]
    run.history.submit_delay(join_set, timedelta(hours=1))
    run.history.now()
    assert len(history_events(execution_id)) == 3
    finish_child(str(child), Ok(4))
    assert run.history.join_next(join_set) == (child, True)
    records = [r for r in store.get(execution_id).events if isinstance(r.event, HistoryEventRecord)]
    assert [(r.version, type(r.event.event)) for r in records[3:]] == [(5, JoinSetRequest), (6, Persist), (7, JoinNext)]
    assert records[3].created_at == records[4].created_at
    assert run.history.next_version == 8
    run.end()
    assert_versions_contiguous(execution_id)


def test_join_nexts_whose_responses_are_in_hand_are_buffered_and_a_crash_before_the_flush_loses_nothing():
    """D46: under Await with a buffer, a join-next whose response the run already holds
    cannot block, so it waits in the buffer instead of costing a transaction. A run that
    ends before the flush loses those join-nexts; the next run writes them again and
    consumes the same responses, in the same order."""
    execution_id = new_driven()
    run1 = start_run(execution_id)
    join_set = run1.history.create_join_set()
    children = [run1.history.submit(join_set, FN1, []) for _ in range(3)]
    with pytest.raises(WorkflowInterrupt):
        run1.history.await_next(join_set, FN1)
    for value, child in enumerate(children, start=1):
        finish_child(str(child), Ok(value))

    def replay_submissions(run: Run) -> None:
        run.history.create_join_set()
        for _ in children:
            run.history.submit(join_set, FN1, [])

    run2 = start_run(execution_id, AWAIT_100)
    replay_submissions(run2)
    assert run2.history.await_next(join_set, FN1) == (children[0], Ok(1))  # recorded by run 1
    written = len(history_events(execution_id))
    assert run2.history.await_next(join_set, FN1) == (children[1], Ok(2))
    assert run2.history.await_next(join_set, FN1) == (children[2], Ok(3))
    assert len(history_events(execution_id)) == written, "a join-next with its response in hand was written at once"
    run2.hand_back()  # the run ends without a flush: its buffered join-nexts are lost

    run3 = start_run(execution_id, AWAIT_100)
    replay_submissions(run3)
    got = [run3.history.await_next(join_set, FN1) for _ in children]
    assert got == [(child, Ok(value)) for value, child in enumerate(children, start=1)]
    run3.end()
    join_nexts = [event for _, event in history_events(execution_id) if isinstance(event, JoinNext)]
    assert len(join_nexts) == 3
    assert sorted(children_of(execution_id)) == sorted(str(child) for child in children)
    assert_versions_contiguous(execution_id)


def test_a_lease_close_to_expiry_is_renewed_at_a_host_call():
    """Decision 5, §4.3: a host call that finds the lock close to expiry renews it. While the
    row is locked the renewal is a heartbeat in ``t_state`` (no event, D27); when a resolved
    Await wait left the row pending, the same run locks it again with a ``Locked`` event at
    the next version, and later writes follow it."""
    execution_id = new_driven()
    lock = timedelta(seconds=1.5)
    run = start_run(execution_id, AWAIT_0, lock_duration=lock)
    join_set = run.history.create_join_set()
    first_expiry = store.get_state(execution_id).pending_expires_finished
    _sleep_until_close_to_expiry(run)
    child = run.history.submit(join_set, FN1, [2])
    state = store.get_state(execution_id)
    assert state.state == "locked" and state.pending_expires_finished > first_expiry
    assert [type(e) for e in events(execution_id)].count(Locked) == 1
    finish_child(str(child), Ok(4))
    assert run.history.join_next(join_set) == (child, True)
    assert store.get_state(execution_id).state == "pending_at"  # kept warm until the lock's expiry
    _sleep_until_close_to_expiry(run)
    run.history.create_join_set()
    log = events(execution_id)
    assert [type(e) for e in log[-2:]] == [Locked, HistoryEventRecord]
    assert log[-2].run_id == run.locked.fence.run_id
    assert store.get_state(execution_id).state == "locked"
    run.history.flush()
    store.append(execution_id, None, Finished(retval=OK_EMPTY), fence=_current_fence(execution_id))
    assert_versions_contiguous(execution_id)


def test_a_lease_renewal_that_locks_the_row_again_reads_none_of_the_history():
    """D131: the run already holds its history, so locking its row again at a renewal reads
    none of it (nor its responses, nor its ``Created``): a long workflow's renewal every
    two thirds of its lock read the whole log, a cost growing with every step. The lease
    takes the new lock's expiry from the write, and the row agrees."""
    execution_id = new_driven()
    run = start_run(execution_id, AWAIT_0, lock_duration=timedelta(seconds=1.5))
    join_set = run.history.create_join_set()
    for value in range(3):  # a history to read, and the row left pending by the last response
        child = run.history.submit(join_set, FN1, [value])
        finish_child(str(child), Ok(value))
        assert run.history.join_next(join_set) == (child, True)
    assert store.get_state(execution_id).state == "pending_at"
    _sleep_until_close_to_expiry(run)
    with CaptureQueriesContext(connection) as renewing:
        run.lease.extend_if_close()
    reads = [q["sql"] for q in renewing.captured_queries if q["sql"].lstrip().upper().startswith(("SELECT", "WITH"))]
    assert not [sql for sql in reads if "t_execution_log" in sql or "t_join_set_response" in sql], reads
    state = store.get_state(execution_id)
    assert state.state == "locked" and state.pending_expires_finished == run.lease.lock_expires_at
    assert type(events(execution_id)[-1]) is Locked
    run.history.flush()
    store.append(execution_id, None, Finished(retval=OK_EMPTY), fence=_current_fence(execution_id))
    assert_versions_contiguous(execution_id)


def _sleep_until_close_to_expiry(run: Run) -> None:
    remaining = (run.lease.lock_expires_at - timezone.now()).total_seconds()
    time.sleep(max(0.0, remaining - run.lease.spec.lock_duration.total_seconds() / 3 + 0.05))


def _current_fence(execution_id: str) -> store.Fence:
    state = store.get_state(execution_id)
    return store.Fence(state.run_id, state.lock_generation)


def test_stub_with_a_different_value_is_a_conflict_also_on_replay():
    """§2.12: the second value conflicts; the ``Stub`` event records the conflict; a replay
    raises it again without touching the target, whose ``Finished`` holds the first value."""
    execution_id = new_driven()
    for _run_number in (0, 1):
        run = start_run(execution_id, AWAIT_0, lock_duration=timedelta(seconds=1))
        join_set = run.history.create_join_set()
        child = run.history.submit(join_set, FN1, [])
        run.history.stub(FN1, child, Ok(1))
        with pytest.raises(StubConflict):
            run.history.stub(FN1, child, Ok(2))
        run.history.finalize()
    run.end()
    stubs = [e for _, e in history_events(execution_id) if isinstance(e, Stub)]
    assert [s.result for s in stubs] == [{"Ok": None}, {"Err": "conflict"}]
    assert result(str(child)) == Ok(1)
    assert [type(e) for e in events(str(child))] == [Created, Finished]


@pytest.mark.parametrize("target", ["missing", "other_function", "top_level"])
def test_stub_validation_errors_are_fatal_not_retried(target):
    """Decision 2 (Q2): stubbing an execution that does not exist, or of another function,
    finishes the workflow (uncategorized) instead of retrying forever."""
    execution_id = new_driven()
    run = start_run(execution_id, AWAIT_0)
    join_set = run.history.create_join_set()
    child = run.history.submit(join_set, FN1, [])
    stubbed = {"missing": f"{execution_id}.g:1_9", "other_function": str(child), "top_level": execution_id}[target]
    with pytest.raises(ImportedFunctionCallError) as error:
        run.history.stub(FN2 if target == "other_function" else FN1, stubbed, OK_EMPTY)
    assert error.value.failure().reason.startswith("error calling imported function")
    assert store.get_state(str(child)).state == "pending_at"
    with pytest.raises(ImportedFunctionCallError):
        run.history.finalize()
