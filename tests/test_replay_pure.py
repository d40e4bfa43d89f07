"""The pure replay core (``workers/replay/``) against an in-memory store.

No database: ``FakeStore`` below stands in for the execution store (versions fenced, children
created with their requests, responses delivered per parent by ``seq``), and ``World`` makes
children finish and delays fire on demand. The first part ports spec 002 §6's conformance
tests 1-7 (join sets that upstream names ``o:``/``g:`` are ``g:1`` here: decision 6 forbids
empty names, and one-off join sets only come from one-off calls); then the "suggested extra"
tests, one test per decision-2 bug fix and decisions 3, 4, 6, 9, 10, 16; then property tests:
a recorded run replays without writes and with identical results, and a changed call sequence
is reported as nondeterminism.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import event as note_case
from hypothesis import strategies as st

from executions import errors
from executions.events import (
    DelayRequest,
    Err,
    ExecutionFailure,
    JoinNext,
    JoinNextTooMany,
    JoinNextTry,
    JoinSetCreate,
    JoinSetRequest,
    Ok,
    Persist,
)
from executions.ids import DelayId, ExecutionId
from workers.replay import (
    AllProcessed,
    ChildFailed,
    ConstraintViolation,
    DelayCancelled,
    EventHistory,
    FunctionMismatch,
    ImportedFunctionCallError,
    InvalidJoinSetName,
    JoinSetConflict,
    NewExecution,
    NondeterminismDetected,
    NotFoundInProcessedResponses,
    Response,
    StubConflict,
    WorkflowError,
    WorkflowInterrupt,
    WorkflowSignal,
    WriteFailed,
)

FN1 = "namespace:pkg/ifc.fn1"
FN2 = "namespace:pkg/ifc.fn2"
OK_EMPTY = Ok(None)
T0 = datetime(2024, 5, 1, 10, 0, tzinfo=UTC)

# ---------------------------------------------------------------------------------------------
# The in-memory store, its ports, and runs
# ---------------------------------------------------------------------------------------------


@dataclass
class FakeExecution:
    ffqn: str
    params: list
    parent: tuple[str, str] | None
    component_type: str | None
    scheduled_by: str | None = None
    events: list[tuple[int, Any]] = field(default_factory=list)  # history events with versions
    next_version: int = 1  # version 0 is Created
    responses: list[Response] = field(default_factory=list)
    retval: Any = None


class FakeStore:
    """The store operations the replay core's ports need, in memory."""

    def __init__(self, clock=lambda: T0):
        self.clock = clock
        self.executions: dict[str, FakeExecution] = {}
        self.delays: dict[str, tuple[str, str, bool | None]] = {}  # id -> owner, join set, outcome
        self.order: list[str] = []  # children and delays in the order of their request events
        self.seq = 0

    def top_level(self, ffqn: str = FN1) -> str:
        execution_id = str(ExecutionId.generate())
        self.executions[execution_id] = FakeExecution(ffqn, [], None, "workflow")
        return execution_id

    def append(self, execution_id: str, version: int, events, creates) -> None:
        execution = self.executions[execution_id]
        if version != execution.next_version:
            raise errors.VersionConflict(execution.next_version, version)
        for create in creates:
            self._create(create)
        for event in events:
            execution.events.append((execution.next_version, event))
            execution.next_version += 1
            if isinstance(event, JoinSetRequest) and isinstance(event.request, DelayRequest):
                self.delays[event.request.delay_id] = (execution_id, event.join_set_id, None)
                self.order.append(event.request.delay_id)
            elif isinstance(event, JoinSetRequest):
                self.order.append(event.request.child_execution_id)

    def _create(self, create: NewExecution) -> None:
        self.executions[create.execution_id] = FakeExecution(
            create.ffqn, create.params, create.parent, create.component_type, create.scheduled_by
        )

    def respond(self, parent: str, join_set_id: str, **fields) -> None:
        self.seq += 1
        response = Response(self.seq, self.clock(), join_set_id, **fields)
        self.executions[parent].responses.append(response)

    def finish(self, execution_id: str, retval) -> bool:
        """Finish a child and deliver its response to the parent; False if already finished."""
        execution = self.executions[execution_id]
        if execution.retval is not None:
            return False
        execution.retval = retval
        execution.next_version += 1
        if execution.parent:
            parent, join_set_id = execution.parent
            self.respond(parent, join_set_id, child_execution_id=execution_id, child_retval=retval)
        return True

    def fire(self, delay_id: str, success: bool = True) -> bool:
        owner, join_set_id, outcome = self.delays[delay_id]
        if outcome is not None:
            return False
        self.delays[delay_id] = (owner, join_set_id, success)
        self.respond(owner, join_set_id, delay_id=delay_id, delay_success=success)
        return True

    def stub(self, ffqn: str, target: str, retval) -> bool:
        execution = self.executions.get(target)
        if execution is None:
            raise errors.NotFound(f"execution `{target}` not found")
        if execution.ffqn != ffqn:
            raise errors.ValidationFailed("ffqn mismatch")
        return self.finish(target, retval) or execution.retval == retval

    def outstanding(self, execution_id: str) -> list[str]:
        """Unfinished children and unfired delays of an execution, oldest first."""
        pending = []
        for item in self.order:
            if item in self.delays:
                owner, _, outcome = self.delays[item]
                if owner == execution_id and outcome is None:
                    pending.append(item)
            elif self.executions[item].parent[0] == execution_id and self.executions[item].retval is None:  # child
                pending.append(item)
        return pending

    def history(self, execution_id: str) -> list[tuple[int, Any]]:
        return list(self.executions[execution_id].events)

    def responses(self, execution_id: str) -> list[Response]:
        return list(self.executions[execution_id].responses)


def child_result(ffqn: str, params: list) -> Any:
    """What the world's children return: fn1 doubles even numbers and fails on odd ones."""
    arg = params[0] if params else 0
    if ffqn == FN1:
        return Ok(arg * 2) if arg % 2 == 0 else Err(arg)
    return Ok(arg)


class World:
    """Makes the oldest outstanding child finish (``child_result``) or delay fire."""

    def __init__(self, store: FakeStore):
        self.store = store

    def step(self, execution_id: str) -> bool:
        pending = self.store.outstanding(execution_id)
        if not pending:
            return False
        item = pending[0]
        if item in self.store.delays:
            return self.store.fire(item)
        child = self.store.executions[item]
        return self.store.finish(item, child_result(child.ffqn, child.params))


class FakeWriter:
    def __init__(self, store: FakeStore, execution_id: str):
        self.store, self.execution_id = store, execution_id
        self.appends: list[tuple[int, list, list]] = []
        self.stubs: list[tuple[str, str, Any]] = []

    def append(self, version, events, creates) -> None:
        self.store.append(self.execution_id, version, events, creates)
        self.appends.append((version, list(events), list(creates)))

    def stub(self, ffqn, target, retval) -> bool:
        self.stubs.append((ffqn, str(target), retval))
        return self.store.stub(ffqn, str(target), retval)


class FakeWaiter:
    """Returns responses the run has not seen; if none, lets the world take one step (a
    response arriving while the run waits); nothing left to happen ends the wait."""

    holds_lock = True  # Await

    def __init__(self, store: FakeStore, execution_id: str, world: World | None):
        self.store, self.execution_id, self.world = store, execution_id, world
        self.calls = 0

    def wait_for_responses(self, after_seq: int) -> list[Response]:
        self.calls += 1
        new = [r for r in self.store.responses(self.execution_id) if r.seq > after_seq]
        if not new and self.world is not None and self.world.step(self.execution_id):
            new = [r for r in self.store.responses(self.execution_id) if r.seq > after_seq]
        return new


class FakeCanceller:
    def __init__(self, store: FakeStore):
        self.store = store
        self.calls: list[tuple[str, str]] = []

    def cancel_activity(self, child_id: ExecutionId) -> None:
        self.calls.append(("activity", str(child_id)))
        if str(child_id) in self.store.executions:
            self.store.finish(str(child_id), ExecutionFailure("cancelled", "cancelled by join set close"))

    def cancel_delay(self, delay_id: DelayId) -> None:
        self.calls.append(("delay", str(delay_id)))
        if str(delay_id) in self.store.delays:
            self.store.fire(str(delay_id), success=False)


class FakeLease:
    def __init__(self, lock_expires_at: datetime):
        self.lock_expires_at = lock_expires_at
        self.extension_checks = 0

    def extend_if_close(self) -> None:
        self.extension_checks += 1


@dataclass(frozen=True)
class Strategy:
    """Interrupt (no waiter) or Await, each with a write batch size (§3.6, §4, D60)."""

    waits: bool
    batch: int = 0

    def __str__(self) -> str:
        return f"{'Await' if self.waits else 'Interrupt'}{{{self.batch}}}"


INTERRUPT = Strategy(False)  # upstream's Interrupt: every event written at once
INTERRUPT_100 = Strategy(False, 100)  # the worker's Interrupt: buffered like Await (D60)
AWAIT_0 = Strategy(True, 0)
AWAIT_100 = Strategy(True, 100)
STRATEGIES = [INTERRUPT, INTERRUPT_100, AWAIT_0, AWAIT_100]


@dataclass
class Run:
    history: EventHistory
    writer: FakeWriter
    waiter: FakeWaiter | None
    canceller: FakeCanceller
    lease: FakeLease | None


def start_run(
    store: FakeStore, execution_id: str, strategy: Strategy = INTERRUPT, *, world: bool = False, lease=None, clock=None
) -> Run:
    """One run: the execution's recorded history and responses, as the executor loads them."""
    writer = FakeWriter(store, execution_id)
    waiter = FakeWaiter(store, execution_id, World(store) if world else None) if strategy.waits else None
    canceller = FakeCanceller(store)
    history = EventHistory(
        execution_id,
        store.history(execution_id),
        store.responses(execution_id),
        next_version=store.executions[execution_id].next_version,
        writer=writer,
        clock=clock or store.clock,
        waiter=waiter,
        canceller=canceller,
        lease=lease,
        batch_size=strategy.batch,
    )
    return Run(history, writer, waiter, canceller, lease)


def written(run: Run) -> list[Any]:
    return [event for _, events, _ in run.writer.appends for event in events]


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


# ---------------------------------------------------------------------------------------------
# Properties: replay determinism (hypothesis)
# ---------------------------------------------------------------------------------------------

# A program is a list of operations; ``j``/``k`` index the join sets created and the children
# submitted so far; an operation on one that does not exist (or is closed) is skipped, so every
# program runs. ``fn1`` children are activities, ``fn2`` children workflows.
FUNCTIONS = [FN1, FN2]
_index = st.sampled_from([0, 0, 0, 1, 1, 2])
OPERATIONS = st.one_of(
    st.tuples(st.just("create")),
    st.tuples(st.just("named"), st.sampled_from(["a", "b_1", "c/d"])),
    st.tuples(st.just("submit"), _index, st.integers(0, 1), st.integers(0, 9)),
    st.tuples(st.just("delay"), _index, st.integers(1, 5)),
    st.tuples(st.just("join_next"), _index),
    st.tuples(st.just("await_next"), _index, st.integers(0, 1)),
    st.tuples(st.just("try"), _index),
    st.tuples(st.just("get"), st.integers(0, 1), _index),
    st.tuples(st.just("close"), _index),
    st.tuples(st.just("u64"), st.integers(0, 5), st.integers(0, 5)),
    st.tuples(st.just("string"), st.integers(0, 3), st.integers(0, 3)),
    st.tuples(st.just("now")),
    st.tuples(st.just("call"), st.integers(0, 1), st.integers(0, 9)),
    st.tuples(st.just("sleep"), st.integers(1, 5)),
    st.tuples(st.just("schedule"), st.integers(0, 1), st.integers(0, 9)),
    st.tuples(st.just("stub"), _index, st.integers(0, 2)),
)
PROGRAMS = st.lists(OPERATIONS, max_size=20).map(lambda program: [("create",), *program])


class Interpreter:
    """Runs a program against one ``EventHistory`` and records what every operation returned
    (catchable errors included) and how many events it processed."""

    def __init__(self, history: EventHistory):
        self.history = history
        self.join_sets: list[Any] = []
        self.closed: set[str] = set()
        self.children: list[tuple[Any, str]] = []
        self.results: list[Any] = []
        self.processed: list[int] = []

    def run(self, program: list[tuple]) -> list[Any]:
        for operation in program:
            before = self.history.position
            try:
                self.results.append(self.apply(*operation))
            except WorkflowError as error:
                self.results.append((type(error).__name__, str(error)))
            self.processed.append(self.history.position - before)
        self.history.finalize()
        return self.results

    def _open(self, j: int):
        if j < len(self.join_sets) and str(self.join_sets[j]) not in self.closed:
            return self.join_sets[j]
        return None

    def apply(self, name: str, *args) -> Any:  # noqa: C901 - one branch per operation
        h = self.history
        if name in ("create", "named"):
            join_set = h.create_join_set(*args)
            self.join_sets.append(join_set)
            return str(join_set)
        if name in ("u64", "string"):
            low, width = args
            return h.random_u64(low, low + width + 1) if name == "u64" else h.random_string(low, low + width + 1)
        if name == "now":
            return h.now().isoformat()
        if name == "call":
            return h.call(FUNCTIONS[args[0]], [args[1]], component_type=("activity", "workflow")[args[0]])
        if name == "sleep":
            return h.sleep(timedelta(seconds=args[0])).isoformat()
        if name == "schedule":
            return str(h.schedule(FUNCTIONS[args[0]], [args[1]]))
        if name in ("get", "stub"):
            k = args[0] if name == "stub" else args[1]
            if k >= len(self.children):
                return "skipped"
            child, ffqn = self.children[k]
            if name == "stub":
                return h.stub(ffqn, child, Ok(args[1]))
            return h.get(FUNCTIONS[args[0]], child)
        join_set = self._open(args[0])
        if join_set is None:
            return "skipped"
        if name == "submit":
            ffqn = FUNCTIONS[args[1]]
            child = h.submit(join_set, ffqn, [args[2]], component_type=("activity", "workflow")[args[1]])
            self.children.append((child, ffqn))
            return str(child)
        if name == "delay":
            return str(h.submit_delay(join_set, timedelta(seconds=args[1])))
        if name == "join_next":
            response_id, ok = h.join_next(join_set)
            return str(response_id), ok
        if name == "await_next":
            child, retval = h.await_next(join_set, FUNCTIONS[args[1]])
            return str(child), retval
        if name == "try":
            found = h.try_join_next(join_set)
            return found and (str(found[0]), found[1])
        assert name == "close"
        self.closed.add(str(join_set))
        return h.close_join_set(join_set)


def record_with_await(program, batch: int = 0, execution_id: str | None = None) -> tuple[FakeStore, str, Interpreter]:
    """The first run under Await, the world answering whenever the workflow waits."""
    store = FakeStore()
    execution_id = execution_id or store.top_level()
    store.executions.setdefault(execution_id, FakeExecution(FN1, [], None, "workflow"))
    interpreter = Interpreter(start_run(store, execution_id, Strategy(True, batch), world=True).history)
    interpreter.run(program)
    return store, execution_id, interpreter


def record_with_interrupts(program, execution_id: str, batch: int = 0) -> tuple[FakeStore, Interpreter]:
    """Interrupt strategy: run until the program completes; after each interrupt deliver the
    responses already produced, or else let the world take one step, and run again."""
    store = FakeStore()
    store.executions[execution_id] = FakeExecution(FN1, [], None, "workflow")
    for _ in range(200):
        known = len(store.responses(execution_id))
        interpreter = Interpreter(start_run(store, execution_id, Strategy(False, batch)).history)
        try:
            interpreter.run(program)
            return store, interpreter
        except WorkflowInterrupt:
            if len(store.responses(execution_id)) == known:
                assert World(store).step(execution_id), "interrupted with nothing left to wait for"
    raise AssertionError("the program did not complete")


def replay(store: FakeStore, execution_id: str, program) -> tuple[Run, Interpreter]:
    run = start_run(store, execution_id, INTERRUPT)
    interpreter = Interpreter(run.history)
    interpreter.run(program)
    return run, interpreter


def trace(store: FakeStore, execution_id: str) -> list[dict]:
    """The recorded history without the one field that depends on the strategy."""
    return [event.model_dump(mode="json", exclude={"run_expires_at"}) for _, event in store.history(execution_id)]


PROPERTY_SETTINGS = settings(
    max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)


@PROPERTY_SETTINGS
@given(program=PROGRAMS, batch=st.sampled_from([0, 1, 3, 100]))
def test_a_recorded_run_replays_without_writes_and_with_identical_results(program, batch):
    """§7 inv. 1-2: replaying a completed run against its history writes nothing, creates
    nothing, and every operation returns what it returned the first time."""
    store, execution_id, first = record_with_await(program, batch)
    events_before = store.history(execution_id)
    run, again = replay(store, execution_id, program)
    assert again.results == first.results
    assert run.writer.appends == [] and run.writer.stubs == []
    assert store.history(execution_id) == events_before


@PROPERTY_SETTINGS
@given(program=PROGRAMS, batch=st.sampled_from([0, 1, 3, 100]))
def test_interrupt_and_await_give_the_same_results(program, batch):
    """Decision 10: a workflow run under Interrupt (re-run after every wait) and under Await
    (waiting in the same run) sees the same values and records the same history, whether
    each buffers its writes or not (D60)."""
    store, execution_id, awaited = record_with_await(program, batch)
    for interrupt_batch in (0, batch):
        interrupted_store, interrupted = record_with_interrupts(program, execution_id, interrupt_batch)
        assert interrupted.results == awaited.results
        assert trace(interrupted_store, execution_id) == trace(store, execution_id)


def _recorded_positions(interpreter: Interpreter) -> list[int]:
    return [i for i, count in enumerate(interpreter.processed) if count > 0]


def _changed_arguments(operation: tuple) -> tuple | None:
    """The operation with a value-level argument changed (not which join set it uses)."""
    name, *args = operation
    if name in ("submit", "call", "schedule"):
        return (name, *args[:-1], args[-1] + 1)
    if name in ("delay", "sleep", "u64", "string", "stub"):
        return (name, *args[:-1], args[-1] + 1)
    if name == "await_next":
        return (name, args[0], 1 - args[1])
    if name == "named":
        return (name, args[0] + "x")
    return None


@PROPERTY_SETTINGS
@given(program=PROGRAMS, data=st.data())
def test_a_changed_call_sequence_is_nondeterminism(program, data):
    """§3.4/§3.7: replay a recorded history with the program changed (a recorded call removed,
    its arguments changed, two different recorded calls swapped, or a call inserted before a
    recorded one). The oracle is the changed program's own fresh recording: when the recorded
    history is not a prefix of it, the replay reports nondeterminism (at a call or in
    ``finalize``); when it is (the change had no effect on what is recorded), it does not."""
    store, execution_id, first = record_with_await(program)
    positions = _recorded_positions(first)
    mutations = ["remove", "insert"]
    changeable = [i for i in positions if _changed_arguments(program[i])]
    swappable = [i for i in positions if i + 1 in positions and program[i] != program[i + 1]]
    mutations += ["change"] * bool(changeable) + ["swap"] * bool(swappable)
    if not positions:
        return
    mutation = data.draw(st.sampled_from(mutations), label="mutation")
    mutated = list(program)
    if mutation == "remove":
        del mutated[data.draw(st.sampled_from(positions), label="position")]
    elif mutation == "insert":
        i = data.draw(st.sampled_from(positions), label="position")
        first_event = store.history(execution_id)[sum(first.processed[:i])][1]
        mutated.insert(i, ("create",) if isinstance(first_event, Persist) else ("now",))
    elif mutation == "change":
        i = data.draw(st.sampled_from(changeable), label="position")
        mutated[i] = _changed_arguments(program[i])
    else:
        i = data.draw(st.sampled_from(swappable), label="position")
        mutated[i], mutated[i + 1] = mutated[i + 1], mutated[i]
    recorded = trace(store, execution_id)
    fresh_store, _, _ = record_with_await(mutated, execution_id=execution_id)
    if trace(fresh_store, execution_id)[: len(recorded)] != recorded:
        note_case("history differs")
        with pytest.raises(NondeterminismDetected):
            replay(store, execution_id, mutated)
    else:
        note_case("history is a prefix")
        try:
            replay(store, execution_id, mutated)
        except WorkflowInterrupt:
            pass  # the changed program goes on past the history and waits: not nondeterminism


@PROPERTY_SETTINGS
@given(program=PROGRAMS, extra=PROGRAMS)
def test_calls_added_after_the_recorded_ones_extend_the_history(program, extra):
    """§7 inv. 1: code that makes more calls after the recorded ones is not nondeterminism:
    the recorded prefix replays and only the new calls write."""
    store, execution_id, first = record_with_await(program)
    recorded = store.history(execution_id)
    assume(len(recorded) == sum(first.processed))  # finalize closed nothing: the calls were the last events
    run = start_run(store, execution_id, AWAIT_0, world=True)
    interpreter = Interpreter(run.history)
    interpreter.run(program + extra)
    assert interpreter.results[: len(program)] == first.results
    assert store.history(execution_id)[: len(recorded)] == recorded
    assert all(version > len(recorded) for version, _, _ in run.writer.appends)
