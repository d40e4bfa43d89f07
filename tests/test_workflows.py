"""Workflows through the real store, on PostgreSQL and SQLite (issue 12, items 1, 4 and 5).

``tests/test_replay_pure.py`` holds the replay core to spec 002 against in-memory fakes; here
the same scenarios run against the execution store. Runs are built the way the executor
builds them, in this process and without worker processes: the workflow execution is locked
with the store (``store.lock_one``), then either

- a test drives ``replay.EventHistory`` host call by host call, with the real adapters of
  ``workers.workflow_runner`` (``StoreWriter``, ``StoreWaiter``, ``StoreCanceller``,
  ``StoreLease``): the ports of spec 002 §6's conformance tests (``start_run``); or
- ``run_workflow`` runs a whole ``@workflow`` function (``tests/workflows.py``) with its
  ``WorkflowContext``, in a thread as the workflow pool does (``run_root``).

Between runs, children are finished, delays fired and stubs delivered through the store
(``World``: lock the child, append ``Finished`` with its fence; ``store.fire_delay``;
``store.finish_cancelled``), and the next run starts by locking again. The tests assert what
the database holds: contiguous versions, which history events a run wrote (a replay writes
none), children created once, results and failures.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
import types
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.db.models import Q
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
    Schedule,
    Stub,
    Unlocked,
)
from executions.ids import ExecutionId, new_executor_id, new_run_id
from executions.models import Delay, ExecutionState
from tests import workflows
from tests.helpers import DEPLOYMENT
from workers import registry
from workers.activity import ActivityError
from workers.registry import ArgumentError, Function, lookup
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
from workers.workflow_runner import (
    StoreCanceller,
    StoreLease,
    StoreWaiter,
    StoreWriter,
    WorkflowPool,
    run_workflow,
)

pytestmark = pytest.mark.django_db(transaction=True)

FN1 = workflows.fn1.ffqn
FN2 = workflows.fn2.ffqn
OK_EMPTY = Ok(None)
SAFETY = 30.0  # seconds: a safety limit on waiting, never an assertion about timing


# ---------------------------------------------------------------------------------------------
# Executions, locks and what the database holds
# ---------------------------------------------------------------------------------------------


def terms(spec: Function) -> store.LockTerms:
    return store.LockTerms(spec.component_id, spec.retry_config, spec.lock_duration)


def create_root(spec: Function, *args: Any) -> str:
    execution_id = str(ExecutionId.generate())
    store.create(
        store.CreateRequest(
            execution_id=execution_id,
            ffqn=spec.ffqn,
            params=spec.encode_arguments(list(args)),
            component_id=spec.component_id,
            deployment_id=DEPLOYMENT,
        )
    )
    return execution_id


def lock_when_due(execution_id: str, spec: Function) -> store.LockedExecution:
    """Lock the execution as an executor would: once it is pending and due (an Await run
    leaves it pending at its lock's expiry: the run stays warm)."""
    deadline = time.monotonic() + SAFETY
    while True:
        state = store.get_state(execution_id)
        if state.state == "pending_at" and state.pending_expires_finished <= timezone.now():
            return store.lock_one(
                execution_id,
                state.next_version,
                terms(spec),
                executor_id=new_executor_id(),
                run_id=new_run_id(),
                deployment_id=DEPLOYMENT,
            )
        assert state.state != "finished", f"{execution_id} is finished"
        assert time.monotonic() < deadline, f"{execution_id} never became due: {state.state}"
        time.sleep(0.02)


def events(execution_id: str) -> list:
    return [record.event for record in store.get(execution_id).events]


def history_events(execution_id: str) -> list[tuple[int, Any]]:
    """``(version, history event)`` of the execution's log."""
    return [
        (record.version, record.event.event)
        for record in store.get(execution_id).events
        if isinstance(record.event, HistoryEventRecord)
    ]


def assert_versions_contiguous(execution_id: str) -> None:
    log = store.get(execution_id)
    versions = [record.version for record in log.events]
    assert versions == list(range(len(versions)))
    assert isinstance(log.events[0].event, Created)
    expected_next = versions[-1] if log.state.is_finished else versions[-1] + 1
    assert log.state.next_version == expected_next


def children_of(execution_id: str) -> list[str]:
    """Every execution created in the join sets of ``execution_id`` (any depth)."""
    return list(
        ExecutionState.objects.filter(execution_id__startswith=execution_id + ".")
        .order_by("execution_id")
        .values_list("execution_id", flat=True)
    )


def result(execution_id: str):
    return store.get_finished_result(execution_id)


def finish_child(child_id: str, retval) -> None:
    """Lock the child and append its ``Finished`` with the lock's fence (the response reaches
    the parent in the same transaction)."""
    spec = lookup(store.get_created(child_id).ffqn)
    locked = lock_when_due(child_id, spec)
    store.append(child_id, None, Finished(retval=retval), fence=locked.fence)


def run_activity(spec: Function, locked: store.LockedExecution):
    """The outcome of one attempt, as ``workers.activity_runner.run_activity`` reports it."""
    try:
        value = spec.fn(*spec.decode_arguments(locked.params))
        return Finished(retval=Ok(spec.encode_result(value)))
    except ActivityError as error:
        return Finished(retval=Err(error.value))
    except ArgumentError as error:
        return Finished(retval=ExecutionFailure("uncategorized", str(error)))
    except Exception as error:
        reason = f"{type(error).__name__}: {error}"
        return store.AttemptFailed(reason, Finished(retval=ExecutionFailure("uncategorized", reason)))


class World:
    """Everything but the root workflow's runs, in this process: runs due activities of the
    root's tree (locked and finished with their fence, as the executor does), runs child
    workflows (``run_workflow`` in a thread, as the workflow pool does), fires due delays and
    finishes cancelled executions (as the sweep does). Some activities get a special fate
    (``actions``): ``hold`` (never run), ``time_out`` (the attempt times out), ``cancel``."""

    DEFAULT_ACTIONS = {
        "test:wf/acts.hang": "hold",
        "test:wf/acts.hang-timeout": "time_out",
        "test:wf/acts.hang-cancel": "cancel",
    }

    def __init__(self, root: str, *, actions: dict[str, str] | None = None, fire_delays: bool = True):
        self.root = root
        self.actions = self.DEFAULT_ACTIONS | (actions or {})
        self.fire_delays = fire_delays
        self.threads: list[threading.Thread] = []
        self.activity_runs: list[str] = []

    def step(self) -> bool:
        progress = False
        now = timezone.now()
        rows = list(ExecutionState.objects.filter(execution_id__startswith=self.root + ".").exclude(state="finished"))
        for row in rows:
            if row.lifecycle == "cancelling":
                if row.component_type == "workflow":
                    store.cancel_children(row.execution_id)
                progress |= store.finish_cancelled(row.execution_id)
                continue
            if row.state != "pending_at" or row.lifecycle != "active" or row.pending_expires_finished > now:
                continue
            spec = lookup(row.ffqn)
            action = self.actions.get(row.ffqn, "run")
            if action == "hold":
                continue
            progress = True
            if action == "cancel":
                store.cancel(row.execution_id)
                continue
            try:
                locked = lock_when_due(row.execution_id, spec)
            except errors.IllegalState:  # cancelled meanwhile: the next step finishes it
                continue
            if spec.kind == "workflow":
                thread = threading.Thread(target=run_workflow, args=(locked, spec, DEPLOYMENT), daemon=True)
                self.threads.append(thread)
                thread.start()
                continue
            if action == "time_out":
                reason = "timed out after 1 s"
                outcome = store.AttemptFailed(
                    reason, Finished(retval=ExecutionFailure("timed_out", reason)), timed_out=True
                )
            else:
                outcome = run_activity(spec, locked)
                self.activity_runs.append(row.execution_id)
            store.append(row.execution_id, None, outcome, fence=locked.fence)
        if self.fire_delays:
            tree = Q(execution_id=self.root) | Q(execution__execution_id__startswith=self.root + ".")
            for delay_id in Delay.objects.filter(tree, expires_at__lte=now).values_list("delay_id", flat=True):
                store.fire_delay(delay_id)
                progress = True
        return progress

    def settle(self) -> None:
        """Step until nothing more happens: no child workflow run going on, nothing of the
        tree left to run now or soon (a row kept warm until its lock's expiry, a delay due
        within seconds)."""
        deadline = time.monotonic() + SAFETY
        while True:
            progress = self.step()
            self.threads = [thread for thread in self.threads if thread.is_alive()]
            if not progress and not self.threads and not self._due_soon():
                return
            assert time.monotonic() < deadline, "the world did not settle"
            time.sleep(0.02)

    def _due_soon(self) -> bool:
        soon = timezone.now() + timedelta(seconds=5)
        held = [ffqn for ffqn, action in self.actions.items() if action == "hold"]
        rows = ExecutionState.objects.filter(
            execution_id__startswith=self.root + ".", state="pending_at", pending_expires_finished__lte=soon
        ).exclude(ffqn__in=held)
        tree = Q(execution_id=self.root) | Q(execution__execution_id__startswith=self.root + ".")
        delays = Delay.objects.filter(tree, expires_at__lte=soon) if self.fire_delays else Delay.objects.none()
        return rows.exists() or delays.exists()


def run_root(
    execution_id: str, spec: Function, world: World | None = None, *, blocking: str | None = None
) -> store.LockedExecution:
    """One run of the root workflow: lock it, then ``run_workflow`` in a thread (as the
    workflow pool does) while ``world`` serves its children (None: nobody answers during the
    run, e.g. under Interrupt, where the run ends at its first wait)."""
    spec = replace(spec, blocking=blocking) if blocking else spec
    locked = lock_when_due(execution_id, spec)
    thread = threading.Thread(target=run_workflow, args=(locked, spec, DEPLOYMENT), daemon=True)
    thread.start()
    deadline = time.monotonic() + SAFETY
    while thread.is_alive():
        if world is not None:
            world.step()
        thread.join(0.02)
        assert time.monotonic() < deadline, "the run did not end"
    return locked


def complete(execution_id: str, spec: Function, world: World, *, blocking: str | None = None) -> int:
    """Run the root until it is finished, the world answering between (and during) runs.
    Returns the number of runs."""
    for runs in range(1, 40):
        run_root(execution_id, spec, world, blocking=blocking)
        if store.get_state(execution_id).is_finished:
            world.settle()
            return runs
        world.settle()
    raise AssertionError(f"{execution_id} did not finish")


# ---------------------------------------------------------------------------------------------
# Runs driven host call by host call (the ports of spec 002 §6)
# ---------------------------------------------------------------------------------------------


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


class RecordingCanceller(StoreCanceller):
    """The real canceller; it also notes the order of its calls."""

    def __init__(self):
        self.calls: list[tuple[str, str]] = []

    def cancel_activity(self, child_id) -> None:
        self.calls.append(("activity", str(child_id)))
        super().cancel_activity(child_id)

    def cancel_delay(self, delay_id) -> None:
        self.calls.append(("delay", str(delay_id)))
        super().cancel_delay(delay_id)


@dataclass
class Run:
    locked: store.LockedExecution
    history: EventHistory
    lease: StoreLease
    canceller: RecordingCanceller

    @property
    def execution_id(self) -> str:
        return self.locked.execution_id

    def end(self, value: Any = None) -> None:
        """The end of the function: ``finalize``, then ``Finished`` with the run's fence."""
        self.history.finalize()
        store.append(self.execution_id, None, Finished(retval=Ok(value)), fence=self.locked.fence)

    def hand_back(self) -> None:
        """The run stops while the row is still locked (``_release_if_locked``)."""
        unlocked = Unlocked(unlocked_at=timezone.now(), reason="test: run stopped")
        store.append(self.execution_id, None, unlocked, fence=self.locked.fence)


def start_run(execution_id: str, strategy: Strategy = INTERRUPT, *, lock_duration: timedelta | None = None) -> Run:
    """Lock the execution and build the run's ``EventHistory`` exactly as
    ``workflow_runner._run`` does (with the strategy's waiter and batch size)."""
    spec = workflows.driven
    if lock_duration is not None:
        spec = replace(spec, lock_duration=lock_duration)
    locked = lock_when_due(execution_id, spec)
    lease = StoreLease(locked, spec)
    canceller = RecordingCanceller()
    history = EventHistory(
        execution_id,
        locked.history or [],
        locked.responses or [],
        next_version=locked.next_version,
        writer=StoreWriter(locked, DEPLOYMENT),
        waiter=StoreWaiter(execution_id, lease) if strategy.waits else None,
        canceller=canceller,
        lease=lease,
        batch_size=strategy.batch,
    )
    lease.history = history
    return Run(locked, history, lease, canceller)


def new_driven() -> str:
    return create_root(workflows.driven)


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


# ---------------------------------------------------------------------------------------------
# Whole workflows through ``run_workflow``: both strategies give the same results
# ---------------------------------------------------------------------------------------------


def test_a_workflow_thread_runs_the_next_run_on_the_same_connection_and_retires_when_idle():
    """D73: a pool thread that ended a run takes the next one (Django's connections are per
    thread, so the run has the first one's connection, kept open); told to retire, the
    idle threads are gone."""
    spec = workflows.where_it_ran
    pool = WorkflowPool(size=2, idle_seconds=SAFETY)
    first, second = create_root(spec, 1), create_root(spec, 2)
    for execution_id in (first, second):
        pool.start(lock_when_due(execution_id, spec), spec, DEPLOYMENT)
        pool.join(SAFETY)
    assert (result(first), result(second)) == (Ok(1), Ok(2))
    assert len(set(workflows.RAN_ON[-2:])) == 1
    pool.retire_idle(SAFETY)
    assert pool.free() == 2 and pool._threads == 0


def test_a_workflow_thread_whose_connection_fails_to_close_still_takes_the_next_run(monkeypatch):
    """After a run, the pool thread closes its connection if it broke. A failure there (a
    broken connection whose close fails too) must not end the thread: the pool counts it
    idle and promises it the next run, which would then wait in the queue forever."""
    from django.db import DatabaseError
    from django.db.backends.base.base import BaseDatabaseWrapper

    def failing_close(self):
        raise DatabaseError("server closed the connection unexpectedly")

    spec = workflows.where_it_ran
    pool = WorkflowPool(size=2, idle_seconds=SAFETY)
    first, second = create_root(spec, 1), create_root(spec, 2)
    monkeypatch.setattr(BaseDatabaseWrapper, "close_if_unusable_or_obsolete", failing_close)
    for execution_id in (first, second):
        pool.start(lock_when_due(execution_id, spec), spec, DEPLOYMENT)
        pool.join(SAFETY)
    assert (result(first), result(second)) == (Ok(1), Ok(2))
    pool.retire_idle(SAFETY)


def test_the_workflow_pool_runs_every_run_it_is_given_while_idle_threads_come_and_go():
    """D73: a run handed to the pool is always run, by an idle thread or a new one, while
    idle threads keep retiring (here they wait one millisecond for a run)."""
    spec = workflows.where_it_ran
    pool = WorkflowPool(size=64, idle_seconds=0.001)
    ids = [create_root(spec, i) for i in range(40)]
    for index, execution_id in enumerate(ids):
        pool.start(lock_when_due(execution_id, spec), spec, DEPLOYMENT)
        if index % 3 == 0:
            time.sleep(0.002)  # some threads go idle and retire meanwhile
    pool.join(SAFETY)
    assert [result(execution_id) for execution_id in ids] == [Ok(i) for i in range(40)]
    assert pool.free() == 64
    pool.retire_idle(SAFETY)


# ---------------------------------------------------------------------------------------------
# Parked Interrupt runs (D77)
# ---------------------------------------------------------------------------------------------

COUNTED = replace(workflows.counted_calls, blocking="interrupt")


def _claim(spec: Function, known: dict[str, int] | None = None) -> store.LockedExecution:
    """The next due execution of ``spec``, claimed as an executor claims (``known``: what
    its pool's parked runs hold)."""
    deadline = time.monotonic() + SAFETY
    while True:
        claimed = store.lock_pending(
            {spec.ffqn: terms(spec)},
            limit=1,
            executor_id=new_executor_id(),
            run_id=new_run_id(),
            deployment_id=DEPLOYMENT,
            known=known,
        )
        if claimed:
            return claimed[0]
        assert time.monotonic() < deadline, f"no {spec.ffqn} became due"
        time.sleep(0.02)


def _parked_in(pool: WorkflowPool, execution_id: str) -> dict[str, int]:
    """The pool's parked versions, once ``execution_id``'s run is among them and its
    blocking write is in (the row is blocked on its join set)."""
    deadline = time.monotonic() + SAFETY
    while execution_id not in pool.parked_versions() or store.get_state(execution_id).state != "blocked_by_join_set":
        assert time.monotonic() < deadline, "the run never parked"
        time.sleep(0.01)
    return pool.parked_versions()


def _finish_children(execution_id: str) -> None:
    """Run the pending children of ``execution_id`` (its direct calls' activities)."""
    world = World(execution_id)
    while not world.step():
        time.sleep(0.01)


def _starts(execution_id: str) -> int:
    return workflows.STARTS.count(execution_id)


def _runs_to_its_end(pool: WorkflowPool, claimed: store.LockedExecution, value: int, *, starts: int) -> None:
    """``claimed``, started in ``pool``, finishes its workflow with ``value``, the function
    having started ``starts`` times in all, the log's versions contiguous."""
    pool.start(claimed, COUNTED, DEPLOYMENT)
    pool.join(SAFETY)
    assert result(claimed.execution_id) == Ok(value)
    assert _starts(claimed.execution_id) == starts
    assert_versions_contiguous(claimed.execution_id)
    pool.retire_idle(SAFETY)


def _through_an_executor(calls: int) -> str:
    """A ``COUNTED`` workflow of ``calls`` direct calls, run to its end by an executor's
    claim loop (its children, its runs), as a worker process runs it."""
    from workers.executor import Executor

    executor = Executor({COUNTED.ffqn: COUNTED, FN2: workflows.fn2}, DEPLOYMENT)
    execution_id = create_root(COUNTED, calls)
    deadline = time.monotonic() + SAFETY
    while not store.get_state(execution_id).is_finished:
        assert time.monotonic() < deadline, "the workflow did not finish"
        executor.claim_and_run(budget=0.3, linger=0.05)
    executor.workflows.join(SAFETY)
    executor.workflows.retire_idle(SAFETY)
    return execution_id


def test_an_interrupt_run_parked_in_its_worker_goes_on_where_it_was_when_that_worker_claims_it_next():
    """D77 through an executor, as a worker runs it: every call of an Interrupt workflow
    blocks and hands its row on; the run parks; the response makes the row pending; the
    executor's claim finds it where the run left it and hands the run its new lock. The
    function starts once, every call is a lock of its own, every step is logged once under
    the lock it ran under, and the log is what a run that replays writes."""
    execution_id = _through_an_executor(5)
    assert result(execution_id) == Ok(15)
    assert _starts(execution_id) == 1
    locks = [e for e in events(execution_id) if isinstance(e, Locked)]
    assert len({lock.run_id for lock in locks}) == 6  # the first run, then one per response
    assert len(children_of(execution_id)) == 5
    assert_versions_contiguous(execution_id)
    logs = [(log.message, log.run_id) for log in store.list_logs(execution_id) if log.message.startswith("step")]
    assert logs == [(f"step {i}", locks[i].run_id) for i in range(1, 6)]


@pytest.mark.postgres_only
def test_a_parked_runs_workflow_is_locked_for_it_by_the_group_commit_that_answers_it(monkeypatch):
    """D82 through an executor: the group commit of a child's result, in the process where
    the workflow's run is parked, locks the workflow for that run in its one statement, so
    the run goes on without a claim: the executor claims the workflow once (its first run),
    each later lock is written with the result that answered it (same statement, same
    time), the function starts once, and the log is what a run that replays writes."""
    claimed = []
    lock_pending = store.lock_pending

    def recording_claims(*args, **kwargs):
        locked = lock_pending(*args, **kwargs)
        claimed.extend(c.execution_id for c in locked)
        return locked

    monkeypatch.setattr(store, "lock_pending", recording_claims)
    execution_id = _through_an_executor(4)
    assert result(execution_id) == Ok(10)
    assert _starts(execution_id) == 1
    assert claimed.count(execution_id) == 1
    records = store.get(execution_id).events
    locks = [r for r in records if isinstance(r.event, Locked)]
    assert len({lock.event.run_id for lock in locks}) == 5
    finished_at = {store.get(child).events[-1].created_at for child in children_of(execution_id)}
    assert {lock.created_at for lock in locks[1:]} <= finished_at
    assert_versions_contiguous(execution_id)


@pytest.mark.postgres_only
@pytest.mark.parametrize("why", ["the run left its place", "the pool has no room"])
def test_a_lock_a_group_commit_took_for_a_parked_run_that_cannot_take_it_goes_back_for_a_claim(why):
    """D82: the run left its place (here: dismissed) after the executor read the parked
    runs, or the pool is full (a claim takes only what fits, so a parked run goes on only
    if it fits too). Nobody takes the lock the group commit took for it, so the executor
    hands it back (``Unlocked``, with its fence) instead of leaving it to expire; a claim
    then takes the workflow and a new run replays to the result."""
    from workers.executor import Executor

    executor = Executor({COUNTED.ffqn: COUNTED, FN2: workflows.fn2}, DEPLOYMENT)
    pool = executor.workflows
    pool.size = 1
    execution_id = create_root(COUNTED, 1)
    pool.start(lock_when_due(execution_id, COUNTED), COUNTED, DEPLOYMENT)
    _parked_in(pool, execution_id)
    parked = executor._parked_runs()
    if why == "the run left its place":
        pool.dismiss_parked(wait=SAFETY)
    else:  # an Await run waits in place for its child, holding the pool's one thread
        awaiting = create_root(workflows.counted_calls, 1)
        pool.start(lock_when_due(awaiting, workflows.counted_calls), workflows.counted_calls, DEPLOYMENT)
        deadline = time.monotonic() + SAFETY
        while not children_of(awaiting) or pool.free() > 0:
            assert time.monotonic() < deadline, "the Await run never waited"
            time.sleep(0.01)
    (child,) = children_of(execution_id)
    locked_child = lock_when_due(child, workflows.fn2)
    finished = store.AppendItem(child, None, Finished(retval=Ok(1)), locked_child.fence)
    assert store.append_many([finished], parked=parked) == [locked_child.next_version]
    assert set(parked.resumed) == {execution_id}
    assert store.get_state(execution_id).state == "locked"

    executor._resume_parked(parked)

    assert store.get_state(execution_id).state == "pending_at"
    assert isinstance(events(execution_id)[-1], Unlocked)
    if why == "the pool has no room":
        _finish_children(awaiting)
        pool.join(SAFETY)
        assert result(awaiting) == Ok(1)
    _runs_to_its_end(pool, _claim(COUNTED), 1, starts=2)


@pytest.mark.postgres_only
def test_a_parked_run_goes_on_when_its_group_commit_committed_and_the_rest_of_the_batch_failed(monkeypatch):
    """D82 (found by review): the one statement committed, resuming a parked run, and then
    the transaction for the batch's other items (a result whose lock moved on) failed with
    the database gone. The lock the statement took still reaches the parked run, instead of
    staying with nobody until it expires."""
    import importlib

    from workers import executor as executor_module
    from workers.executor import Executor

    append = importlib.import_module("executions.store.append")  # the module, not its ``append``
    executor = Executor({COUNTED.ffqn: COUNTED, FN2: workflows.fn2}, DEPLOYMENT)
    pool = executor.workflows
    execution_id = create_root(COUNTED, 1)
    pool.start(lock_when_due(execution_id, COUNTED), COUNTED, DEPLOYMENT)
    _parked_in(pool, execution_id)
    (child,) = children_of(execution_id)
    locked_child = lock_when_due(child, workflows.fn2)
    other = create_root(workflows.fn2, 1)
    lost = lock_when_due(other, workflows.fn2)
    store.append(other, None, Unlocked(unlocked_at=timezone.now(), reason="test"), fence=lost.fence)
    monkeypatch.setattr(executor_module, "RESULT_WRITE_PATIENCE", 0.0)
    monkeypatch.setattr(append, "_append_many_in_transaction", _lost_connection)

    executor._write(
        [
            store.AppendItem(child, None, Finished(retval=Ok(1)), locked_child.fence),
            store.AppendItem(other, None, Finished(retval=Ok(2)), lost.fence),
        ]
    )

    pool.join(SAFETY)
    assert result(execution_id) == Ok(1)
    assert _starts(execution_id) == 1
    pool.retire_idle(SAFETY)


def test_a_parked_run_whose_row_another_worker_took_on_unwinds_and_the_claim_reads_the_history():
    """Another worker ran the workflow on while the run was parked here. This worker's
    claim, told of the parked run's version, finds the row past it: it reads the history,
    the parked run unwinds writing nothing, and the claimed run replays to the result."""
    pool = WorkflowPool(size=2, idle_seconds=SAFETY)
    execution_id = create_root(COUNTED, 2)
    pool.start(lock_when_due(execution_id, COUNTED), COUNTED, DEPLOYMENT)
    stale = _parked_in(pool, execution_id)
    _finish_children(execution_id)
    run_root(execution_id, COUNTED)  # another worker's run: it replays, writes, blocks again
    _finish_children(execution_id)
    claimed = _claim(COUNTED, stale)
    assert claimed.history is not None and len(claimed.history) > 0
    _runs_to_its_end(pool, claimed, 3, starts=3)


def test_a_run_parked_past_its_timeout_unwinds_and_a_claim_made_for_it_still_runs(settings):
    """The parked run gives up after ``PARKED_RUN_TIMEOUT``, writing nothing; a claim made
    while it still counted (no history read) then finds no run to hand the lock to: the
    pool reads the history and the new run replays to the same result."""
    settings.OBELISK = {"PARKED_RUN_TIMEOUT": timedelta(milliseconds=300)}
    pool = WorkflowPool(size=2, idle_seconds=SAFETY)
    execution_id = create_root(COUNTED, 1)
    pool.start(lock_when_due(execution_id, COUNTED), COUNTED, DEPLOYMENT)
    parked = _parked_in(pool, execution_id)
    version = store.get_state(execution_id).corresponding_version
    deadline = time.monotonic() + SAFETY
    while pool.parked_versions():
        assert time.monotonic() < deadline, "the parked run never gave up"
        time.sleep(0.02)
    assert store.get_state(execution_id).corresponding_version == version  # it wrote nothing
    _finish_children(execution_id)
    claimed = _claim(COUNTED, parked)
    assert claimed.history is None  # the claim took the parked run's word for it
    _runs_to_its_end(pool, claimed, 1, starts=2)


def test_a_parked_run_is_not_counted_as_running_in_its_clusters_load():
    """The cluster's load (``heartbeat.running``, the dashboard's running count) counts a
    workflow run while its thread runs; a parked run holds no lock and runs nothing."""
    from workers import heartbeat

    heartbeat.prepare_cluster()
    try:
        pool = WorkflowPool(size=2, idle_seconds=SAFETY)
        execution_id = create_root(COUNTED, 1)
        pool.start(lock_when_due(execution_id, COUNTED), COUNTED, DEPLOYMENT)
        parked = _parked_in(pool, execution_id)
        deadline = time.monotonic() + SAFETY
        while heartbeat.running_now() != 0:
            assert time.monotonic() < deadline, "a parked run is counted as running"
            time.sleep(0.02)
        _finish_children(execution_id)
        _runs_to_its_end(pool, _claim(COUNTED, parked), 1, starts=1)
        assert heartbeat.running_now() == 0
    finally:
        heartbeat._running = None


def test_parked_runs_unwind_when_dismissed_and_a_full_pool_parks_no_more():
    """At most ``size`` runs park; the others unwind at once. ``dismiss_parked`` (a
    stopping worker) sends every parked run away; none of them writes anything."""
    pool = WorkflowPool(size=1, idle_seconds=SAFETY)
    first, second = create_root(COUNTED, 1), create_root(COUNTED, 1)
    pool.start(lock_when_due(first, COUNTED), COUNTED, DEPLOYMENT)
    _parked_in(pool, first)
    pool.start(lock_when_due(second, COUNTED), COUNTED, DEPLOYMENT)
    pool.join(SAFETY)  # the second run ended: no room to park
    assert set(pool.parked_versions()) == {first}
    versions = [store.get_state(e).corresponding_version for e in (first, second)]
    pool.dismiss_parked()
    pool.join(SAFETY)
    assert pool.parked_versions() == {} and pool.free() == 1
    assert [store.get_state(e).corresponding_version for e in (first, second)] == versions
    assert [store.get_state(e).state for e in (first, second)] == ["blocked_by_join_set"] * 2
    pool.retire_idle(SAFETY)


def _recorded_appends(monkeypatch) -> list[str]:
    """From now on, the kind of every event ``store.append`` is asked to write."""
    appended = []
    append = store.append

    def recording_append(execution_id, version, event, **options):
        appended.append(type(event).__name__)
        return append(execution_id, version, event, **options)

    monkeypatch.setattr(store, "append", recording_append)
    return appended


def _lost_connection(*args, **kwargs):
    from django.db import OperationalError

    raise OperationalError("server closed the connection unexpectedly")


def test_a_database_error_while_a_run_waits_ends_the_run_and_never_fails_the_workflow(monkeypatch):
    """An Await run reads its responses from the database while it waits. When that read
    fails (the connection is lost), the run ends as a lost worker's run does, and a later
    run finishes the workflow. The error never reaches the workflow's own code, where it
    would be a trap and fail the workflow for good."""
    spec = workflows.counted_calls
    execution_id = create_root(spec, 1)
    monkeypatch.setattr(store, "responses_after", _lost_connection)
    run_root(execution_id, spec, None, blocking="await")
    assert not store.get_state(execution_id).is_finished
    monkeypatch.undo()
    world = World(execution_id)
    world.settle()  # the child runs; its response makes the workflow pending
    complete(execution_id, spec, world, blocking="await")
    assert result(execution_id) == Ok(1)


def test_a_database_error_as_a_parked_run_resumes_hands_its_new_lock_back(monkeypatch):
    """A parked run handed a new lock reads its responses. When that read fails, the run
    hands the lock back and ends, writing nothing else; a later run finishes the workflow.
    The error never reaches the workflow's own code."""
    pool = WorkflowPool(size=2, idle_seconds=SAFETY)
    execution_id = create_root(COUNTED, 1)
    pool.start(lock_when_due(execution_id, COUNTED), COUNTED, DEPLOYMENT)
    parked = _parked_in(pool, execution_id)
    _finish_children(execution_id)
    monkeypatch.setattr(store, "responses_after", _lost_connection)
    pool.start(_claim(COUNTED, parked), COUNTED, DEPLOYMENT)
    pool.join(SAFETY)
    monkeypatch.undo()
    state = store.get_state(execution_id)
    assert not state.is_finished and state.state == "pending_at"  # handed back at once
    assert isinstance(events(execution_id)[-1], Unlocked)
    complete(execution_id, COUNTED, World(execution_id))
    assert result(execution_id) == Ok(1)
    pool.retire_idle(SAFETY)


def test_a_parked_run_that_can_neither_read_its_responses_nor_hand_its_lock_back_still_ends_quietly(monkeypatch):
    """The connection is gone: the responses cannot be read, and the hand-back cannot be
    written either. The run still ends as a lost worker's (its new lock expires and the
    sweep makes it pending), and the error never reaches the workflow's own code."""
    spec = replace(workflows.catches_everything, blocking="interrupt")
    pool = WorkflowPool(size=2, idle_seconds=SAFETY)
    execution_id = create_root(spec, 1)
    pool.start(lock_when_due(execution_id, spec), spec, DEPLOYMENT)
    parked = _parked_in(pool, execution_id)
    _finish_children(execution_id)
    append = store.append

    def no_hand_back(execution_id, version, event, **options):
        if isinstance(event, Unlocked):
            _lost_connection()
        return append(execution_id, version, event, **options)

    monkeypatch.setattr(store, "responses_after", _lost_connection)
    monkeypatch.setattr(store, "append", no_hand_back)
    pool.start(_claim(spec, parked), spec, DEPLOYMENT)
    pool.join(SAFETY)
    monkeypatch.undo()
    assert not any(caught.startswith(execution_id) for caught in workflows.CAUGHT)
    assert store.get_state(execution_id).state == "locked"  # by the lock nobody could hand back
    deadline = time.monotonic() + SAFETY
    while store.get_state(execution_id).pending_expires_finished > timezone.now():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    store.expire_lock(execution_id)  # the sweep
    complete(execution_id, spec, World(execution_id))
    assert result(execution_id) == Ok(1)
    pool.retire_idle(SAFETY)


def test_a_run_resumed_in_place_that_blocks_again_while_closing_leaves_the_handed_on_row_alone(monkeypatch, settings):
    """D72 for a parked run: a run that went on under a new lock, returned, and blocked
    again closing its join sets (a child workflow to await) has handed its row on with that
    closing join-next. When its park then times out, it must not try to hand the row back
    as if it still held it: a transaction on the row there makes the claim the response
    wakes skip it."""
    settings.OBELISK = {"PARKED_RUN_TIMEOUT": timedelta(milliseconds=300)}
    spec = replace(workflows.leaves_a_child, blocking="interrupt")
    pool = WorkflowPool(size=2, idle_seconds=SAFETY)
    execution_id = create_root(spec, 2)
    pool.start(lock_when_due(execution_id, spec), spec, DEPLOYMENT)
    parked = _parked_in(pool, execution_id)
    world = World(execution_id, actions={workflows.child_workflow.ffqn: "hold"})
    while not world.step():
        time.sleep(0.01)
    appended = _recorded_appends(monkeypatch)
    pool.start(_claim(spec, parked), spec, DEPLOYMENT)
    deadline = time.monotonic() + SAFETY
    while pool.parked_versions() or store.get_state(execution_id).state != "blocked_by_join_set":
        assert time.monotonic() < deadline, "the run never blocked on closing its join set"
        time.sleep(0.02)
    pool.join(SAFETY)
    assert "Unlocked" not in appended
    assert [e.closing for _, e in history_events(execution_id) if isinstance(e, JoinNext)][-1] is True
    pool.retire_idle(SAFETY)


def test_a_place_to_park_is_reserved_only_before_a_write_that_hands_the_row_on(monkeypatch):
    """D77: a join-next whose response the run holds keeps the row locked; a place reserved
    for it would be reported to claims and could be handed a lock while the run goes on.
    Only the join-nexts that block reserve one."""
    reserved = []
    expect = WorkflowPool.expect

    def recording_expect(self, locked, version, previous, terms):
        reserved.append(version)
        return expect(self, locked, version, previous, terms)

    monkeypatch.setattr(WorkflowPool, "expect", recording_expect)
    spec = replace(workflows.two_children, blocking="interrupt")
    pool = WorkflowPool(size=2, idle_seconds=SAFETY)
    execution_id = create_root(spec, 1)
    pool.start(lock_when_due(execution_id, spec), spec, DEPLOYMENT)
    parked = _parked_in(pool, execution_id)
    world = World(execution_id)
    while store.list_responses(execution_id)[1] < 2:  # both children finished
        world.step()
        time.sleep(0.01)
    pool.start(_claim(spec, parked), spec, DEPLOYMENT)
    pool.join(SAFETY)
    assert result(execution_id) == Ok(3)
    join_nexts = [(v, e) for v, e in history_events(execution_id) if isinstance(e, JoinNext)]
    blocking = [v for v, e in join_nexts if e.run_expires_at <= store.get(execution_id).events[v].created_at]
    assert reserved == blocking and len(join_nexts) == 2 and len(blocking) == 1
    pool.retire_idle(SAFETY)


def test_an_interrupted_run_leaves_its_row_to_the_next_claim_once_its_blocking_write_is_in(monkeypatch):
    """An Interrupt run ends at a join-next with no response in hand. The write of that
    join-next hands the row on: blocked, or pending at once when a response came in
    meanwhile (announced on ``obelisk_pending``). The run's end then writes nothing more to
    the row. It used to try an ``Unlocked`` (bound to fail: the row is no longer locked),
    whose transaction held the row for a moment; a claimer woken by the join-next's
    notification skipped it there (``SKIP LOCKED``) and the workflow waited for the next
    poll, about half a second."""
    spec = workflows.fan_out
    execution_id = create_root(spec, [1, 2, 3])
    appended = _recorded_appends(monkeypatch)
    run_root(execution_id, spec, None, blocking="interrupt")
    assert store.get_state(execution_id).state == "blocked_by_join_set"
    assert "Unlocked" not in appended


@pytest.mark.parametrize("blocking", ["interrupt", "await"])
def test_a_workflow_completes_with_each_child_created_once_and_replays_write_nothing(blocking):
    """Decision 10: Interrupt (a new run after every wait, each replaying the history) and
    Await (waiting in place) give the same result; every child is created once, every
    history event written once (each later run's history starts with the earlier one's),
    versions stay contiguous."""
    spec = workflows.fan_out
    execution_id = create_root(spec, [1, 2, 3])
    world = World(execution_id)
    snapshots = []
    for _ in range(40):
        run_root(execution_id, spec, world, blocking=blocking)
        snapshots.append(history_events(execution_id))
        if store.get_state(execution_id).is_finished:
            break
        world.settle()
    for earlier, later in zip(snapshots, snapshots[1:], strict=False):
        assert later[: len(earlier)] == earlier
    value = result(execution_id).value
    assert value["values"] == [1, 2, 3] and value["doubled"] == 12
    assert len(children_of(execution_id)) == 4
    assert sorted(world.activity_runs) == children_of(execution_id)
    kinds = [type(e).__name__ for _, e in history_events(execution_id)]
    assert kinds.count("JoinSetRequest") == 5  # three children, the sleep, the direct call
    if blocking == "interrupt":
        assert len(snapshots) > 2
    assert_versions_contiguous(execution_id)


@pytest.mark.parametrize("blocking", ["interrupt", "await"])
def test_random_values_uuid_and_now_are_identical_on_replay(blocking):
    """Decision 4: ``ctx.random_u64``, ``ctx.random_string``, ``ctx.uuid`` and ``ctx.now``
    are recorded on the first run; every run (a replay under Interrupt) computes the same
    values, and the result holds them."""
    workflows.DRAWS.clear()
    spec = workflows.draws
    execution_id = create_root(spec)
    runs = complete(execution_id, spec, World(execution_id), blocking=blocking)
    value = result(execution_id).value
    first = {k: value[k] for k in ("u64", "string", "uuid", "now")}
    assert all({k: d[k] for k in first} == first for d in workflows.DRAWS)
    assert len(workflows.DRAWS) == runs + 1
    persisted = [e for _, e in history_events(execution_id) if isinstance(e, Persist)]
    assert [p.kind["type"] for p in persisted] == ["random_u64", "random_string", "random_u64", "random_u64", "now"] + [
        "random_u64"
    ]
    assert int.from_bytes(bytes(persisted[0].value), "big") == value["u64"]
    assert bytes(persisted[1].value).decode() == value["string"]
    assert bytes(persisted[4].value).decode() == value["now"]
    assert value["uuid"][14] == "4"
    other = create_root(spec)
    complete(other, spec, World(other), blocking=blocking)
    assert result(other).value["u64"] != value["u64"]


@pytest.mark.parametrize("blocking", ["interrupt", "await"])
@pytest.mark.parametrize("use_with", [False, True], ids=["finalize", "with_block"])
def test_a_trap_closes_its_join_sets(blocking, use_with):
    """Decision 3: workflow code that raises still closes its join sets (at the end of its
    ``with`` block, or in ``finalize``): the unawaited activity is cancelled, the delay
    answered as cancelled, the child workflow awaited (and not cancelled); then the
    execution finishes with the trap."""
    spec = workflows.trap
    execution_id = create_root(spec, use_with)
    world = World(execution_id)
    complete(execution_id, spec, world, blocking=blocking)
    failure = result(execution_id)
    assert failure.kind == "uncategorized"
    assert failure.reason == "workflow trap: RuntimeError: bug in the workflow"
    assert "RuntimeError: bug in the workflow" in failure.detail
    hang, child = children_of(execution_id)[0], children_of(execution_id)[1]
    assert result(hang).kind == "cancelled"
    assert result(child) == Ok(5)
    assert store.get_state(child).lifecycle == "active"
    closing = [e for _, e in history_events(execution_id) if isinstance(e, JoinNext) and e.closing]
    assert len(closing) == (2 if use_with else 3)
    delays = [r.delay_success for r in store.get(execution_id).responses if r.delay_id]
    assert delays == ([] if use_with else [False])
    assert_versions_contiguous(execution_id)


@pytest.mark.parametrize("blocking", ["interrupt", "await"])
def test_child_errors_reach_the_parent_as_child_failed_with_typed_retvals(blocking):
    """§5.5: an error value, a crash, a timeout, a cancellation and a child workflow's trap
    each reach the parent as ``ChildFailed`` whose ``retval`` is the ``Err`` or the
    ``ExecutionFailure`` of that kind (not a crash of the parent); ``invoke`` returns it,
    ``join_next`` reports it as not ok, ``get`` reads it; an ok value is decoded with the
    child's return type."""
    spec = workflows.child_outcomes
    execution_id = create_root(spec)
    complete(execution_id, spec, World(execution_id), blocking=blocking)
    value = result(execution_id).value
    child = {label: item[-1] for label, item in value.items() if isinstance(item, list) and len(item) == 3}
    assert value["error_value"] == ["Err", {"code": "E42"}, child["error_value"]]
    assert value["crashed"][:2] == ["ExecutionFailure", "uncategorized"]
    assert value["timed_out"][:2] == ["ExecutionFailure", "timed_out"]
    assert value["cancelled"][:2] == ["ExecutionFailure", "cancelled"]
    assert value["child_workflow_trap"][:2] == ["ExecutionFailure", "uncategorized"]
    assert value["invoked"] == ["Err", {"code": "E7"}]
    assert value["typed_ok"] == ["tuple", [3, "3"]]
    assert value["join_next"][1] is False and value["get"] == ["Err", 3]
    assert result(child["timed_out"]).kind == "timed_out"
    assert result(child["child_workflow_trap"]).reason == "workflow trap: ValueError: child trap 5"
    assert_versions_contiguous(execution_id)


# ---------------------------------------------------------------------------------------------
# Item 4: code changed between runs is reported as nondeterminism, side by side
# ---------------------------------------------------------------------------------------------


def _record_with_version_a(case: str, monkeypatch, runs: int = 1) -> str:
    monkeypatch.setattr(workflows, "CODE_VERSION", "A")
    spec = workflows.changing
    execution_id = create_root(spec, case)
    world = World(execution_id)
    for _ in range(runs):
        run_root(execution_id, spec)
        assert store.get_state(execution_id).state == "blocked_by_join_set"
        world.settle()
    return execution_id


def _replay_with_version_b(execution_id: str, monkeypatch) -> ExecutionFailure:
    monkeypatch.setattr(workflows, "CODE_VERSION", "B")
    recorded = history_events(execution_id)
    run_root(execution_id, workflows.changing)
    assert history_events(execution_id) == recorded  # nothing written but the failure
    assert isinstance(events(execution_id)[-1], Finished)
    assert_versions_contiguous(execution_id)
    failure = result(execution_id)
    assert failure.kind == "nondeterminism_detected" and failure.reason is None
    return failure


NONDETERMINISM_CASES = {
    # case: (runs under version A, lines the detail must hold, with {E} the execution id)
    "call_order": (
        1,
        [
            "key does not match event stored at version 3: key: ChildExecutionRequest({E}.g:1_1, test:wf/acts.fn2, "
            "params: [3]), event: JoinSetRequest(ChildExecutionRequest({E}.g:1_1, test:wf/acts.fn1, params: [2]))",
            "  position: event 2 of 4 in the history, version 3",
            "  join set: history `g:1`, code `g:1`",
            "  id: history `{E}.g:1_1`, code `{E}.g:1_1`",
            "  function: history `test:wf/acts.fn1`, code `test:wf/acts.fn2`  (differs)",
            "  arguments: history `[2]`, code `[3]`  (differs)",
        ],
    ),
    "arguments": (
        1,
        [
            "key does not match event stored at version 3: key: ChildExecutionRequest({E}.o:1-fn1_1, "
            "test:wf/acts.fn1, params: [4]), event: JoinSetRequest(ChildExecutionRequest({E}.o:1-fn1_1, "
            "test:wf/acts.fn1, params: [2]))",
            "  position: event 2 of 3 in the history, version 3",
            "  function: history `test:wf/acts.fn1`, code `test:wf/acts.fn1`",
            "  arguments: history `[2]`, code `[4]`  (differs)",
        ],
    ),
    "removed_call": (
        1,
        [
            "key does not match event stored at version 2: key: CreateJoinSet(o:1-fn1), event: Persist",
            "  position: event 1 of 4 in the history, version 2",
            "  join set: history `—`, code `o:1-fn1`  (differs)",
            "  persist kind: history `Now`, code `—`  (differs)",
        ],
    ),
    "removed_trailing_call": (2, ["found unprocessed request stored at version 6: event: JoinSetCreate(o:2-fn2)"]),
    "added_call_before": (
        1,
        [
            "key does not match event stored at version 2: key: Persist(RandomU64(0, 9)), "
            "event: JoinSetCreate(o:1-fn1)",
            "  position: event 1 of 3 in the history, version 2",
            "  persist kind: history `—`, code `RandomU64(0, 9)`  (differs)",
            "  join set: history `o:1-fn1`, code `—`  (differs)",
        ],
    ),
    "join_set_name": (
        1,
        [
            "key does not match event stored at version 2: key: CreateJoinSet(n:beta), event: JoinSetCreate(n:alpha)",
            "  position: event 1 of 3 in the history, version 2",
            "  join set: history `n:alpha`, code `n:beta`  (differs)",
        ],
    ),
    "await_function": (
        1,
        [
            "key does not match event stored at version 4: key: JoinNextChild(g:1, AwaitNext, test:wf/acts.fn2), "
            "event: JoinNext(g:1)",
            "  position: event 3 of 3 in the history, version 4",
            "  function: history `test:wf/acts.fn1`, code `test:wf/acts.fn2`  (differs)",
        ],
    ),
    "sleep_duration": (
        1,
        [
            "key does not match event stored at version 3: key: DelayRequest(Delay_{U}.o:1-sleep_1, "
            "In(0:00:02)), event: JoinSetRequest(DelayRequest(Delay_{U}.o:1-sleep_1, expires_at: ",
            "  schedule at: history `In(0:00:01)`, code `In(0:00:02)`  (differs)",
        ],
    ),
    "scheduled_function": (
        1,
        [
            "  function: history `test:wf/acts.fn1`, code `test:wf/acts.fn2`  (differs)",
            "  arguments: history `[2]`, code `[2]`",
            "  position: event 1 of 4 in the history, version 2",
        ],
    ),
}


@pytest.mark.parametrize("case", list(NONDETERMINISM_CASES))
def test_changed_code_finishes_with_nondeterminism_showing_history_and_code_side_by_side(case, monkeypatch):
    """Item 4 (§3.7): the workflow's code changed between runs (another call order, other
    arguments, a removed call, a call added before the recorded ones, another join set,
    another awaited function, another delay, another scheduled function). The next run
    replays with the new code and finishes the execution with ``execution_failure
    nondeterminism_detected``, writing no history event; the failure's detail shows what the
    history holds next to what the code asked for: function, arguments, join set, position
    and version."""
    runs, expected = NONDETERMINISM_CASES[case]
    execution_id = _record_with_version_a(case, monkeypatch, runs)
    failure = _replay_with_version_b(execution_id, monkeypatch)
    detail = failure.detail
    for line in expected:
        line = line.replace("{E}", execution_id).replace("{U}", execution_id[2:])
        assert line in detail, f"{line!r} not in\n{detail}"


def test_changed_code_in_a_child_reaches_the_parent_as_a_nondeterminism_failure(monkeypatch):
    """§3.7 step 4: a derived execution that fails with nondeterminism responds to its parent
    like any failure: the parent sees ``ChildFailed`` with that kind (here: the workflow
    ``changing`` as a child, its code changed while it waited)."""
    monkeypatch.setattr(workflows, "CODE_VERSION", "A")
    spec = workflows.driven
    parent = create_root(spec)
    run = start_run(parent)
    join_set = run.history.create_join_set()
    child = str(run.history.submit(join_set, workflows.changing.ffqn, ["arguments"], component_type="workflow"))
    with pytest.raises(WorkflowInterrupt):
        run.history.join_next(join_set)
    world = World(parent, actions={workflows.changing.ffqn: "hold"})  # the test runs the child
    run_root(child, workflows.changing)  # records version A, waits for its activity
    world.settle()
    monkeypatch.setattr(workflows, "CODE_VERSION", "B")
    run_root(child, workflows.changing)
    assert result(child).kind == "nondeterminism_detected"
    run = start_run(parent)
    run.history.create_join_set()
    run.history.submit(join_set, workflows.changing.ffqn, ["arguments"], component_type="workflow")
    assert run.history.join_next(join_set) == (ExecutionId.parse(child), False)
    assert run.history.get(workflows.changing.ffqn, child).kind == "nondeterminism_detected"
    run.end()


# ---------------------------------------------------------------------------------------------
# Item 5: the determinism guard
# ---------------------------------------------------------------------------------------------

FORBIDDEN = {
    "time.time": ("time.time()", "ctx.now()"),
    "time.monotonic": ("time.monotonic()", "ctx.now()"),
    "random.random": ("random.random()", "ctx.random_u64(...) or ctx.random_string(...)"),
    "random.randint": ("random.randint()", "ctx.random_u64(...) or ctx.random_string(...)"),
    "uuid.uuid4": ("uuid.uuid4()", "ctx.uuid()"),
    "datetime.now": ("datetime.now()", "ctx.now()"),
    "os.urandom": ("os.urandom()", "ctx.random_u64(...) or ctx.random_string(...)"),
    "secrets.token_hex": ("secrets.token_hex()", "ctx.random_u64(...) or ctx.random_string(...)"),
    "time.sleep": ("time.sleep()", "ctx.sleep(timedelta(...))"),
    "from random import randint": ("random.randint()", "ctx.random_u64(...) or ctx.random_string(...)"),
    "from uuid import uuid4": ("uuid.uuid4()", "ctx.uuid()"),
    "import datetime as dt": ("datetime.now()", "ctx.now()"),
    "dt.date.today": ("date.today()", "ctx.now().date()"),
}


@pytest.mark.parametrize("blocking", ["interrupt", "await"])
@pytest.mark.parametrize("what", list(FORBIDDEN))
def test_non_deterministic_calls_in_a_workflow_fail_it_naming_the_ctx_call(what, blocking):
    """Item 5 (§8.2): a workflow that calls the clock, the random module, ``uuid4`` or
    ``os.urandom`` (names imported into its module, ``from datetime import datetime``
    included) finishes failed (never retried), and the failure names the ``ctx`` call to
    use instead; it fails the same way when the call comes in a replaying run."""
    spec = workflows.forbidden
    execution_id = create_root(spec, what)
    complete(execution_id, spec, World(execution_id), blocking=blocking)
    failure = result(execution_id)
    name, instead = FORBIDDEN[what]
    assert failure.kind == "uncategorized"
    assert failure.reason == (
        f"workflow trap: DeterminismError: `{name}` is not deterministic and cannot be used in a workflow "
        f"(it would differ on replay); use `{instead}`"
    )
    assert [type(e) for e in events(execution_id)].count(Finished) == 1


@pytest.mark.parametrize("blocking", ["interrupt", "await"])
def test_the_same_calls_work_in_an_activity_of_a_workflow_module(blocking):
    """Item 5: the guard is per thread and only while workflow code runs: an activity of the
    same (guarded) module calls ``time.time()``, ``random.random()``, ``uuid.uuid4()``,
    ``datetime.now()`` and ``os.urandom()`` freely, also while a workflow runs (Await: the
    workflow waits in its thread while the activity runs in this one)."""
    spec = workflows.calls_impure_activity
    execution_id = create_root(spec)
    complete(execution_id, spec, World(execution_id), blocking=blocking)
    value = result(execution_id).value
    assert set(value) == {"time", "random", "uuid", "now", "urandom"}
    assert value["time"] > 0 and 0 <= value["random"] < 1 and len(value["urandom"]) == 8
    direct = workflows.impure_values()
    assert direct["uuid"] != value["uuid"]


# ---------------------------------------------------------------------------------------------
# Decision 9 and fatal errors with unawaited children, through the store
# ---------------------------------------------------------------------------------------------


def test_join_next_try_that_found_a_response_counts_in_the_store_too():
    """Decision 9: a ``JoinNextTry`` that found a response consumes it in memory and in the
    database: the following join-next waits for the *second* response, so with only one
    delivered the store blocks the row (it does not resolve it with the first); a replay
    gives the recorded outcomes."""
    execution_id = new_driven()
    run1 = start_run(execution_id)
    join_set = run1.history.create_join_set()
    a = run1.history.submit(join_set, FN1, [2])
    b = run1.history.submit(join_set, FN1, [4])
    assert run1.history.try_join_next(join_set) is None
    finish_child(str(a), Ok(4))
    run1.hand_back()
    run2 = start_run(execution_id)
    run2.history.create_join_set()
    run2.history.submit(join_set, FN1, [2])
    run2.history.submit(join_set, FN1, [4])
    assert run2.history.try_join_next(join_set) is None  # recorded as pending
    assert run2.history.try_join_next(join_set) == (a, True)
    with pytest.raises(WorkflowInterrupt):
        run2.history.join_next(join_set)
    assert store.get_state(execution_id).state == "blocked_by_join_set"
    finish_child(str(b), Ok(8))
    assert store.get_state(execution_id).state == "pending_at"
    recorded = history_events(execution_id)
    run3 = start_run(execution_id)
    run3.history.create_join_set()
    run3.history.submit(join_set, FN1, [2])
    run3.history.submit(join_set, FN1, [4])
    assert [run3.history.try_join_next(join_set), run3.history.try_join_next(join_set)] == [None, (a, True)]
    assert run3.history.join_next(join_set) == (b, True)
    run3.end()
    assert history_events(execution_id) == recorded
    assert_versions_contiguous(execution_id)


def test_nondeterminism_still_cancels_unawaited_activities_and_their_responses_are_stored(monkeypatch):
    """Decision 2 (Q4) through the store: after nondeterminism the run still cancels the
    unawaited activities (no closing join-nexts: the history is inconsistent) and finishes
    the workflow; the cancelled child then finishes and its response is delivered to the
    finished parent without error, so nothing is left cancelling."""
    monkeypatch.setattr(workflows, "CODE_VERSION", "A")
    spec = workflows.changing
    monkeypatch.setitem(
        workflows.PLANS,
        "unawaited",
        {
            "A": [("join_set", None), ("submit_hang",), ("call", "fn1", 2)],
            "B": [("join_set", None), ("submit_hang",), ("call", "fn1", 4)],
        },
    )
    execution_id = create_root(spec, "unawaited")
    world = World(execution_id)
    run_root(execution_id, spec)
    world.settle()
    monkeypatch.setattr(workflows, "CODE_VERSION", "B")
    run_root(execution_id, spec)
    assert result(execution_id).kind == "nondeterminism_detected"
    hang = f"{execution_id}.g:1_1"
    assert store.get_state(hang).lifecycle == "cancelling"
    world.settle()
    assert result(hang).kind == "cancelled"
    assert [r.child_execution_id for r in store.get(execution_id).responses] == [f"{execution_id}.o:1-fn1_1", hang]
    assert_versions_contiguous(execution_id)


def test_ctx_now_is_a_datetime_in_a_module_that_imports_datetime():
    """The guard must not change what ``datetime`` *is* for workflow code: after
    ``from datetime import datetime`` in a workflow module, ``isinstance(ctx.now(),
    datetime)`` holds, as it does everywhere else."""
    spec = workflows.now_is_a_datetime
    execution_id = create_root(spec)
    complete(execution_id, spec, World(execution_id))
    assert result(execution_id) == Ok([True, True, "datetime"])


GUARDED_MODULE_SOURCE = """
from datetime import date, datetime
from workers import activity, workflow

@workflow(name="test:wf/annotated.first")
def first(ctx) -> None:
    return None

@workflow(name="test:wf/annotated.second")
def second(ctx, when: datetime, day: date) -> str:
    return when.isoformat() + day.isoformat()

@activity(name="test:wf/annotated.act")
def act(when: datetime) -> datetime:
    return when
"""


def test_datetime_annotations_register_in_a_workflow_module():
    """The guard must not break the typed signatures of a workflow module: a workflow or an
    activity declared after the module's first ``@workflow`` may take and return
    ``datetime`` / ``date`` (the registry builds their pydantic types from the annotations,
    which then name the guarded stand-ins)."""
    module = types.ModuleType("tests_wf_annotated")
    module.__file__ = __file__
    sys.modules[module.__name__] = module
    try:
        exec(compile(GUARDED_MODULE_SOURCE, "<tests_wf_annotated>", "exec", dont_inherit=True), module.__dict__)
        second = module.second
        assert second.encode_arguments(["2024-05-01T10:00:00Z", "2024-05-01"]) == [
            "2024-05-01T10:00:00Z",
            "2024-05-01",
        ]
        assert module.act.encode_result(datetime.fromisoformat("2024-05-01T10:00:00+00:00")) == "2024-05-01T10:00:00Z"
    finally:
        sys.modules.pop(module.__name__, None)
        for spec in list(registry._FUNCTIONS.values()):  # later tests register what exists
            if spec.fn.__module__ == module.__name__:
                del registry._FUNCTIONS[spec.ffqn]


def test_an_await_wait_nobody_answers_ends_at_the_deadline_without_extending_the_lock():
    """Decision 5: an Await wait ends at the lock's deadline minus the leeway; the run
    interrupts, the row stays blocked with ``run_expires_at`` = the lock's (unextended)
    expiry; the response makes it pending at that expiry, and the next run replays."""
    execution_id = new_driven()
    run1 = start_run(execution_id, AWAIT_0, lock_duration=timedelta(seconds=1))
    expiry = run1.locked.locked.lock_expires_at
    join_set = run1.history.create_join_set()
    child = run1.history.submit(join_set, FN1, [2])
    with pytest.raises(WorkflowInterrupt):
        run1.history.join_next(join_set)
    state = store.get_state(execution_id)
    assert (state.state, state.join_set_id, state.pending_expires_finished) == ("blocked_by_join_set", "g:1", expiry)
    assert history_events(execution_id)[-1][1].run_expires_at == expiry
    finish_child(str(child), Ok(4))
    assert store.get_state(execution_id).pending_expires_finished == expiry
    recorded = history_events(execution_id)
    run2 = start_run(execution_id, AWAIT_0)
    run2.history.create_join_set()
    run2.history.submit(join_set, FN1, [2])
    assert run2.history.join_next(join_set) == (child, True)
    run2.end()
    assert history_events(execution_id) == recorded
    assert_versions_contiguous(execution_id)


# ---------------------------------------------------------------------------------------------
# Logs and backtraces (issue 12 item 5, spec 002 §2.15)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("blocking", ["interrupt", "await"])
def test_runs_capture_their_logs_and_a_replay_marks_what_it_logs_again(blocking):
    """What a workflow logs is stored per run with its level, and a replaying run does not
    log it again as new (§2.15); a blocking call's stack is stored as a backtrace of the
    workflow's own frames. (Activities' capture: tests/test_workers.py.)"""
    spec = workflows.talkative
    execution_id = create_root(spec, 7)
    complete(execution_id, spec, World(execution_id), blocking=blocking)
    assert result(execution_id) == Ok(7)

    lines = [(e.run_id, e.level, e.message) for e in store.list_logs(execution_id)]
    first_run = lines[0][0]
    assert (first_run, "info", "calling chatty with 7") in lines
    assert any(level == "info" and message == "chatty returned 7" for _, level, message in lines)
    # Interrupt: the second run replays the first line; a replay does not log it again as
    # new (ctx.log demotes it to DEBUG, below what the obelisk loggers let through).
    at_least_info = [message for _, level, message in lines if level in ("info", "warn", "error")]
    assert at_least_info.count("calling chatty with 7") == 1, lines

    backtraces = store.list_backtraces(execution_id)
    assert backtraces, "the blocking call's stack was not stored"
    frames = backtraces[0][2]
    assert frames[-1]["function"] == "talkative" and "ctx.call" in frames[-1]["code"], frames  # innermost last
    assert not any("/workers/" in frame["file"] for frame in frames)
    source = {frame["file"]: Path(frame["file"]).read_text().splitlines() for frame in frames}
    assert all(source[frame["file"]][frame["line"] - 1].strip() == frame["code"] for frame in frames), frames
