"""The pure replay core's one-off calls (spec 002 §2.8-§2.10) and its decisions: one test per
decision-2 bug fix (upstream bugs fixed, not copied), decisions 3, 4, 9 and 16 (traps close
join sets, durable time and randomness, join-next-try, the nondeterminism report).

No database: ``tests.support.replay_fakes.FakeStore`` stands in for the execution store
(versions fenced, children created with their requests, responses delivered per parent by
``seq``) and ``World`` makes children finish and delays fire on demand. The same scenarios
run against the real store in ``tests/workflows/test_replay_in_store_*.py``.

why: D20, D33, D34, D35, D36
"""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest

from executions.events import (
    Err,
    JoinNext,
    JoinNextTry,
    JoinSetCreate,
    JoinSetRequest,
    Ok,
)
from tests.support.replay_fakes import (
    AWAIT_0,
    FN1,
    FN2,
    INTERRUPT,
    OK_EMPTY,
    T0,
    FakeStore,
    start_run,
)
from workers.replay import (
    AllProcessed,
    ChildFailed,
    ConstraintViolation,
    DelayCancelled,
    ImportedFunctionCallError,
    NondeterminismDetected,
    WorkflowError,
    WorkflowInterrupt,
    WorkflowSignal,
    WriteFailed,
)

# ---------------------------------------------------------------------------------------------
# One-off calls and their results (§2.8-§2.10)
# ---------------------------------------------------------------------------------------------


def test_direct_call_returns_the_value_or_raises_child_failed():
    """§2.8/§5.5: an ok value is returned; an error value or a failure is ``ChildFailed``,
    which workflow code may catch."""
    store = FakeStore()
    execution_id = store.top_level()
    run = start_run(store, execution_id, AWAIT_0, world=True)
    assert run.history.call(FN1, [4]) == 8
    with pytest.raises(ChildFailed) as failed:
        run.history.call(FN1, [3])
    assert failed.value.retval == Err(3)
    child, retval = run.history.invoke("label", FN2, [9])
    assert (str(child), retval) == (f"{execution_id}.o:3-label_1", Ok(9))
    run.history.finalize()
    assert [type(e) for _, e in store.history(execution_id)][:3] == [JoinSetCreate, JoinSetRequest, JoinNext]


def test_sleep_returns_the_recorded_expiry_and_reports_cancellation():
    """§2.10: a replay returns the first run's expiry although the clock moved; a cancelled
    delay raises ``DelayCancelled``."""
    store = FakeStore()
    execution_id = store.top_level()
    run1 = start_run(store, execution_id, clock=lambda: T0)
    with pytest.raises(WorkflowInterrupt):
        run1.history.sleep(timedelta(seconds=30))
    (delay_id,) = store.delays
    store.fire(delay_id)
    run2 = start_run(store, execution_id, clock=lambda: T0 + timedelta(days=1))
    assert run2.history.sleep(timedelta(seconds=30)) == T0 + timedelta(seconds=30)
    with pytest.raises(WorkflowInterrupt):
        run2.history.sleep(T0 + timedelta(hours=1))
    store.fire(f"Delay_{execution_id[2:]}.o:2-sleep_1", success=False)
    run3 = start_run(store, execution_id)
    run3.history.sleep(timedelta(seconds=30))
    with pytest.raises(DelayCancelled):
        run3.history.sleep(T0 + timedelta(hours=1))
    run3.history.finalize()


# ---------------------------------------------------------------------------------------------
# Decision 2: upstream bugs fixed, not copied
# ---------------------------------------------------------------------------------------------


def test_random_u64_excludes_its_exclusive_bound():
    """Q10 fixed: ``random_u64(min, max_exclusive)`` never returns ``max_exclusive``, records
    the inclusive bound it used, and an empty range records nothing."""
    store = FakeStore()
    execution_id = store.top_level()
    run = start_run(store, execution_id)
    assert {run.history.random_u64(0, 2) for _ in range(200)} == {0, 1}
    assert store.history(execution_id)[0][1].kind == {"type": "random_u64", "min": 0, "max_inclusive": 1}
    assert {run.history.random_u64_inclusive(7, 7) for _ in range(3)} == {7}
    with pytest.raises(ValueError):
        run.history.random_u64(5, 5)
    assert len(store.history(execution_id)) == 203


def test_random_string_length_stays_below_its_exclusive_bound():
    """Q10 fixed: ``random_string(min, max_exclusive)`` has ``min <= len < max_exclusive``."""
    store = FakeStore()
    execution_id = store.top_level()
    run = start_run(store, execution_id)
    lengths = {len(run.history.random_string(2, 5)) for _ in range(200)}
    assert lengths == {2, 3, 4}
    assert run.history.random_string(3, 4).isalnum()
    with pytest.raises(ValueError):
        run.history.random_string(3, 3)


@pytest.mark.parametrize("target", ["missing", "other_function"])
def test_stub_validation_errors_are_fatal_not_retried(target):
    """Decision 2 (Q2): stubbing an execution that does not exist, or whose function is not
    the stubbed one, finishes the workflow (uncategorized) instead of retrying forever."""
    store = FakeStore()
    execution_id = store.top_level()
    run = start_run(store, execution_id, AWAIT_0)
    join_set = run.history.create_join_set()
    child = run.history.submit(join_set, FN1, [])
    stubbed = f"{execution_id}.g:1_9" if target == "missing" else str(child)
    with pytest.raises(ImportedFunctionCallError) as error:
        run.history.stub(FN2 if target == "other_function" else FN1, stubbed, OK_EMPTY)
    assert not isinstance(error.value, WriteFailed)
    assert error.value.failure().kind == "uncategorized"
    assert error.value.failure().reason.startswith("error calling imported function")
    with pytest.raises(ImportedFunctionCallError):
        run.history.finalize()


def test_submitting_to_a_closed_join_set_is_checked_before_writing():
    """Decision 2 (Q1): the open-join-set check runs first, so nothing is written or created."""
    store = FakeStore()
    execution_id = store.top_level()
    run = start_run(store, execution_id)
    join_set = run.history.create_join_set()
    run.history.close_join_set(join_set)
    appends = list(run.writer.appends)
    with pytest.raises(ConstraintViolation, match="not found in open join sets: `g:1`"):
        run.history.submit(join_set, FN1, [])
    assert run.writer.appends == appends
    assert len(store.executions) == 1
    assert run.history.poisoned is not None


@pytest.mark.parametrize("strategy", [INTERRUPT, AWAIT_0], ids=str)
def test_recorded_join_next_without_its_loaded_response_interrupts_or_waits(strategy, caplog):
    """Decision 2 (§3.3): upstream panics when a recorded JoinNext has no loaded response.
    Here it logs, then waits for the response (Await) or interrupts (Interrupt)."""
    store = FakeStore()
    execution_id = store.top_level()
    run1 = start_run(store, execution_id)
    join_set = run1.history.create_join_set()
    child = run1.history.submit(join_set, FN1, [])
    with pytest.raises(WorkflowInterrupt):
        run1.history.join_next(join_set)
    run2 = start_run(store, execution_id, strategy)  # loaded before the response arrives
    store.finish(str(child), OK_EMPTY)
    run2.history.create_join_set()
    run2.history.submit(join_set, FN1, [])
    with caplog.at_level(logging.WARNING, logger="workers.replay"):
        if strategy.waits:
            assert run2.history.join_next(join_set) == (child, True)
        else:
            with pytest.raises(WorkflowInterrupt):
                run2.history.join_next(join_set)
    assert "has no loaded response" in caplog.text
    assert run2.writer.appends == []


def test_finalize_keeps_the_first_fatal_error():
    """Decision 2 (Q4): after nondeterminism in the body, later calls and ``finalize`` raise
    that same error, not their own (the unprocessed leftovers, a close) and write nothing;
    unawaited activities are still cancelled."""
    store = FakeStore()
    execution_id = store.top_level()
    run1 = start_run(store, execution_id)
    join_set = run1.history.create_join_set()
    run1.history.submit(join_set, FN1, [1])
    run1.history.random_u64(0, 10)
    run2 = start_run(store, execution_id)
    run2.history.create_join_set()
    child = run2.history.submit(join_set, FN1, [1])
    with pytest.raises(NondeterminismDetected) as first:
        run2.history.submit(join_set, FN2, [1])
    with pytest.raises(NondeterminismDetected) as again:
        run2.history.close_join_set(join_set)
    with pytest.raises(NondeterminismDetected) as final:
        run2.history.finalize()
    assert again.value is first.value and final.value is first.value
    assert run2.canceller.calls == [("activity", str(child))]
    assert run2.writer.appends == []


def test_a_signal_cannot_be_caught_by_except_exception_and_poisons_later_calls():
    """§8.1: interrupts are ``BaseException``s; after one, every host call raises it again
    and nothing more is written, so code in ``finally`` cannot extend the history."""
    store = FakeStore()
    execution_id = store.top_level()
    run = start_run(store, execution_id)
    join_set = run.history.create_join_set()
    run.history.submit(join_set, FN1, [])
    with pytest.raises(WorkflowInterrupt):
        try:
            run.history.join_next(join_set)
        except Exception:  # noqa: BLE001 - what workflow code might write
            pytest.fail("a signal must not be an Exception")
    appends = list(run.writer.appends)
    with pytest.raises(WorkflowInterrupt):
        run.history.random_u64(0, 10)
    with pytest.raises(WorkflowInterrupt):
        run.history.finalize()
    assert run.writer.appends == appends
    assert not issubclass(WorkflowSignal, Exception) and issubclass(AllProcessed, WorkflowError)


def test_a_failed_write_is_retriable_and_poisons_the_run():
    """§3.8 DbError: a write that fails is ``WriteFailed`` (retriable), not a fatal error."""
    store = FakeStore()
    execution_id = store.top_level()
    run = start_run(store, execution_id)
    store.executions[execution_id].next_version = 9  # someone else wrote: the version fence fails
    with pytest.raises(WriteFailed, match="version conflict"):
        run.history.create_join_set()
    with pytest.raises(WriteFailed):
        run.history.finalize()


# ---------------------------------------------------------------------------------------------
# Decisions 3, 4, 9, 16 and the nondeterminism report
# ---------------------------------------------------------------------------------------------


def test_a_trap_closes_join_sets_like_a_normal_end():
    """Decision 3: after workflow code raised, ``finalize`` still cancels unawaited
    activities and waits for child workflows."""
    store = FakeStore()
    execution_id = store.top_level()
    run = start_run(store, execution_id, AWAIT_0, world=True)

    def workflow() -> None:
        join_set = run.history.create_join_set()
        run.history.submit(join_set, FN1, [2])
        run.history.submit(join_set, FN2, [3], component_type="workflow")
        raise RuntimeError("bug in the workflow")

    with pytest.raises(RuntimeError):
        workflow()
    run.history.finalize()
    assert [kind for kind, _ in run.canceller.calls] == ["activity"]
    assert store.executions[f"{execution_id}.g:1_2"].retval == Ok(3)


def test_now_is_durable_across_runs():
    """Decision 4: ``now()`` records the first run's clock and replays it."""
    store = FakeStore()
    execution_id = store.top_level()
    first = start_run(store, execution_id, clock=lambda: T0).history.now()
    later = start_run(store, execution_id, clock=lambda: T0 + timedelta(hours=3))
    assert first == T0 and later.history.now() == T0
    assert later.history.now() == T0 + timedelta(hours=3)


def test_random_values_replay_identically_and_depend_on_the_execution():
    """Decision 4: the RNG is seeded from the execution id, so a replay draws the same values
    (and matches them against the records), and another execution draws others."""
    store = FakeStore()
    execution_id = store.top_level()
    run1 = start_run(store, execution_id)
    values = [run1.history.random_u64(0, 2**64 - 1), run1.history.random_string(5, 20)]
    run2 = start_run(store, execution_id)
    assert [run2.history.random_u64(0, 2**64 - 1), run2.history.random_string(5, 20)] == values
    assert run2.writer.appends == []
    other = start_run(store, store.top_level())
    assert other.history.random_u64(0, 2**64 - 1) != values[0]


def test_join_next_try_consumes_like_join_next_and_replays_its_outcome():
    """Decision 9: a found ``JoinNextTry`` consumes the response (the next join-next gets the
    second one); a pending one replays as pending although the response arrived since."""
    store = FakeStore()
    execution_id = store.top_level()
    run1 = start_run(store, execution_id)
    join_set = run1.history.create_join_set()
    a = run1.history.submit(join_set, FN1, [2])
    b = run1.history.submit(join_set, FN1, [4])
    assert run1.history.try_join_next(join_set) is None
    store.finish(str(a), Ok(4))
    store.finish(str(b), Ok(8))
    run2 = start_run(store, execution_id)
    run2.history.create_join_set()
    run2.history.submit(join_set, FN1, [2])
    run2.history.submit(join_set, FN1, [4])
    assert run2.history.try_join_next(join_set) is None  # recorded as pending
    assert run2.history.try_join_next(join_set) == (a, True)
    assert run2.history.join_next(join_set) == (b, True)
    with pytest.raises(AllProcessed):
        run2.history.try_join_next(join_set)
    run2.history.finalize()
    outcomes = [e.outcome for _, e in store.history(execution_id) if isinstance(e, JoinNextTry)]
    assert outcomes == ["pending", "found", "all_processed"]
    run3 = start_run(store, execution_id)
    run3.history.create_join_set()
    run3.history.submit(join_set, FN1, [2])
    run3.history.submit(join_set, FN1, [4])
    assert [run3.history.try_join_next(join_set), run3.history.try_join_next(join_set)] == [None, (a, True)]
    assert run3.history.join_next(join_set) == (b, True)
    with pytest.raises(AllProcessed):
        run3.history.try_join_next(join_set)
    run3.history.finalize()
    assert run3.writer.appends == []


@pytest.mark.parametrize("change", ["function", "params"])
def test_scheduling_another_function_or_params_is_nondeterminism(change):
    """Decision 16: the Schedule key holds the function and its parameters."""
    store = FakeStore()
    execution_id = store.top_level()
    start_run(store, execution_id).history.schedule(FN1, [1])
    run2 = start_run(store, execution_id)
    with pytest.raises(NondeterminismDetected, match=r"\(differs\)"):
        run2.history.schedule(FN2 if change == "function" else FN1, [1] if change == "function" else [2])


def test_nondeterminism_shows_the_history_and_the_code_side_by_side():
    """§3.7 extended: the message keeps upstream's first line and adds, field by field, what
    the history holds and what the code asked for, marking the differences."""
    store = FakeStore()
    execution_id = store.top_level()
    run1 = start_run(store, execution_id)
    join_set = run1.history.create_join_set()
    run1.history.submit(join_set, FN1, [1, {"a": 2}])
    run2 = start_run(store, execution_id)
    run2.history.create_join_set()
    with pytest.raises(NondeterminismDetected) as error:
        run2.history.submit(join_set, FN2, [1, {"a": 3}])
    message = str(error.value)
    child = f"{execution_id}.g:1_1"
    assert message.startswith(
        "key does not match event stored at version 2: "
        f'key: ChildExecutionRequest({child}, {FN2}, params: [1,{{"a":3}}]), '
        f'event: JoinSetRequest(ChildExecutionRequest({child}, {FN1}, params: [1,{{"a":2}}]))'
    )
    assert "position: event 2 of 2 in the history, version 2" in message
    assert f"function: history `{FN1}`, code `{FN2}`  (differs)" in message
    assert 'arguments: history `[1,{"a":2}]`, code `[1,{"a":3}]`  (differs)' in message
    assert "join set: history `g:1`, code `g:1`\n" in message


@pytest.mark.parametrize("case", ["await_next_function", "stub_value", "join_next_after_await_next_too_many"])
def test_replaying_another_function_or_value_is_nondeterminism(case):
    """§3.4: an await-next for one function does not replay one for another; a stub of
    another value does not replay the recorded stub (its hash); a join-next does not replay
    an await-next's TooMany (``requested_ffqn`` Some vs None)."""
    store = FakeStore()
    execution_id = store.top_level()
    run1 = start_run(store, execution_id, AWAIT_0, world=True)
    join_set = run1.history.create_join_set()
    if case == "join_next_after_await_next_too_many":
        with pytest.raises(AllProcessed):
            run1.history.await_next(join_set, FN1)
    else:
        child = run1.history.submit(join_set, FN1, [2], component_type="activity_stub")
        run1.history.stub(FN1, child, Ok(1)) if case == "stub_value" else run1.history.await_next(join_set, FN1)
    run2 = start_run(store, execution_id)
    run2.history.create_join_set()
    with pytest.raises(NondeterminismDetected):
        if case == "join_next_after_await_next_too_many":
            run2.history.join_next(join_set)
        elif case == "stub_value":
            run2.history.submit(join_set, FN1, [2], component_type="activity_stub")
            run2.history.stub(FN1, child, Ok(2))
        else:
            run2.history.submit(join_set, FN1, [2], component_type="activity_stub")
            run2.history.await_next(join_set, FN2)


def test_a_call_of_another_kind_is_nondeterminism():
    """§3.4: any pair outside the table mismatches, e.g. join-next where await-next was
    recorded (Some/None ``requested_ffqn``) or a sleep where a direct call was."""
    store = FakeStore()
    execution_id = store.top_level()
    run1 = start_run(store, execution_id, AWAIT_0, world=True)
    join_set = run1.history.create_join_set()
    run1.history.submit(join_set, FN1, [2])
    run1.history.await_next(join_set, FN1)
    run1.history.call(FN1, [2])
    run2 = start_run(store, execution_id)
    run2.history.create_join_set()
    run2.history.submit(join_set, FN1, [2])
    with pytest.raises(NondeterminismDetected, match=r"key: JoinNext\(g:1\), event: JoinNext\(g:1\)"):
        run2.history.join_next(join_set)
    run3 = start_run(store, execution_id)
    run3.history.create_join_set()
    run3.history.submit(join_set, FN1, [2])
    run3.history.await_next(join_set, FN1)
    with pytest.raises(NondeterminismDetected, match=r"key: CreateJoinSet\(o:1-sleep\)"):
        run3.history.sleep(timedelta(seconds=1))
    other = store.top_level()
    run4 = start_run(store, other, AWAIT_0, world=True)
    run4.history.submit(run4.history.create_join_set(), FN1, [2])
    run4.history.join_next(join_set)
    run5 = start_run(store, other)
    run5.history.submit(run5.history.create_join_set(), FN1, [2])
    with pytest.raises(NondeterminismDetected, match=r"key: JoinNext\(g:1 closing\), event: JoinNext\(g:1\)"):
        run5.history.close_join_set(join_set)
