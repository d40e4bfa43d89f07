"""Workflow runs through the real store, built the way the executor builds them, for the
workflow tests (``tests/workflows/test_replay_in_store_*.py``, ``test_workflow_pool.py``,
``test_whole_workflows.py``, ``test_authoring_errors.py``).

The workflow execution is locked with the store (``store.lock_one``), then either a test
drives ``replay.EventHistory`` host call by host call with the real adapters of
``workers.replay_adapters`` (``start_run``, a ``Strategy`` per blocking strategy), or
``run_root`` runs a whole ``@workflow`` function of ``tests/support/workflows.py`` in a
thread as the workflow pool does. ``World`` finishes children, fires delays and delivers
stubs through the store between runs. No test here: only what the tests share.

why: D37, D39, D60 (the blocking strategies and buffering the tests run under)
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from django.db.models import Q
from django.utils import timezone

from executions import errors, store
from executions.events import (
    Created,
    Err,
    ExecutionFailure,
    Finished,
    HistoryEventRecord,
    Ok,
    Unlocked,
)
from executions.ids import ExecutionId, new_executor_id, new_run_id
from executions.models import Delay, ExecutionState
from tests.support import workflows
from tests.support.helpers import DEPLOYMENT
from tests.support.replay_fakes import AWAIT_0, AWAIT_100, INTERRUPT, INTERRUPT_100, STRATEGIES, Strategy  # noqa: F401
from workers.activity import ActivityError
from workers.registry import ArgumentError, Function, lookup
from workers.replay import EventHistory
from workers.replay_adapters import StoreCanceller, StoreLease, StoreWaiter, StoreWriter
from workers.workflow_runner import run_workflow

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
