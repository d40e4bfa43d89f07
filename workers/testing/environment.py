"""``run_workflow``: a workflow run to its end in the test's own process, on the real store.

No worker process: the runtime's own pieces run here, one after another, on the test's
database connection. A round claims the due workflows (``store.lock_pending``) and runs
each with ``workflow_runner.run_workflow``, claims the due activities and runs them with
the executor's ``run_batch`` (the same watchdog-less path, group commit and retry rule),
then sweeps (``sweeper.sweep``: delays, cancellations). When a round does nothing, the
virtual clock (``workers.testing.clock``) jumps to the next timer: a delay's expiry, a
scheduled or retried execution's time. It ends when the workflow has finished and nothing
else is due, or fails with what is stuck.

Every workflow runs as ``blocking="interrupt"`` here: a run that would wait ends, and the
next one replays once the response is in (under Await the run would wait in place for a
response only this same thread can produce). Results are the same either way (README,
"Writing workflows"); the histories differ only in the join-nexts' ``run_expires_at``.
why: D120, D121, D122
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connection, connections

from executions import store
from executions.events import Err, ExecutionFailure, Ok, RetVal, retval_to_json
from executions.ids import new_run_id
from executions.state_machine import State
from workers import registry, sweeper, workflow_runner
from workers.executor import Executor
from workers.registry import Function
from workers.testing import deployment, replaying
from workers.testing.clock import VirtualClock
from workers.testing.stubs import Call, Stubs, UnusedStubs

MAX_ROUNDS = 10_000  # a workflow that keeps making work (a loop of retries) stops here


class Stuck(RuntimeError):
    """The workflow cannot finish: nothing is due now or later (it waits for something no
    one will do), or it kept making work past ``MAX_ROUNDS``."""


@dataclass
class WorkflowRun:
    """What ``run_workflow`` returns: the result, the tree, the histories and the calls."""

    execution_id: str
    retval: RetVal
    tree: list[tuple[store.ExecutionSnapshot, RetVal | None]]
    histories: dict[str, list[store.EventRecord]]
    stubs: Stubs
    started_at: datetime
    finished_at: datetime
    rounds: int = 0
    unused_stubs: list[str] = field(default_factory=list)

    @property
    def result(self) -> dict:
        """``{"ok": value}``, ``{"err": value}`` or ``{"execution_failure": {...}}``."""
        return retval_to_json(self.retval)

    @property
    def value(self) -> Any:
        """The workflow's return value; an ``AssertionError`` showing the result otherwise."""
        if not isinstance(self.retval, Ok):
            raise AssertionError(f"{self.execution_id} did not return a value: {self.result}")
        return self.retval.value

    @property
    def ok(self) -> bool:
        return isinstance(self.retval, Ok)

    @property
    def error(self) -> Any:
        return self.retval.value if isinstance(self.retval, Err) else None

    @property
    def failure(self) -> ExecutionFailure | None:
        return self.retval if isinstance(self.retval, ExecutionFailure) else None

    @property
    def calls(self) -> list[Call]:
        return self.stubs.calls

    def calls_of(self, fn: Any) -> list[Call]:
        """The attempts of one activity (the function or its name), in order."""
        return self.stubs.of(fn)

    def history(self, execution_id: str | None = None) -> list[store.EventRecord]:
        """The log of the root, or of one execution of the tree."""
        return self.histories[execution_id or self.execution_id]

    def events(self, execution_id: str | None = None) -> list[str]:
        """The log's event kinds (``HistoryEventRecord`` as its inner kind), for assertions."""
        return [_kind(record.event) for record in self.history(execution_id)]

    def children(self, execution_id: str | None = None) -> list[tuple[store.ExecutionSnapshot, RetVal | None]]:
        parent = execution_id or self.execution_id
        return [(row, retval) for row, retval in self.tree if row.execution_id.rpartition(".")[0] == parent]

    @property
    def elapsed(self):
        """Virtual time from the submission to the end."""
        return self.finished_at - self.started_at


def run_workflow(
    fn: Function | str,
    *args: Any,
    activities: Mapping[Any, Any] | None = None,
    now: datetime | None = None,
    replay_check: bool = False,
    execution_id: str | None = None,
) -> WorkflowRun:
    """Submit ``fn(*args)`` and run it, its children and their timers to the end, in this
    process, on virtual time starting at ``now`` (default: the wall clock). ``activities``:
    stubs by function (``workers.testing.stubs``). ``replay_check``: after every run of
    every workflow, replay its recorded history against the code (``replaying.check``).
    Unused stubs are reported (``UnusedStubs`` from the ``obelisk_env`` fixture; a
    warning otherwise)."""
    spec = _workflow(fn)
    stubs = Stubs.parse(activities)
    clock = VirtualClock(now)
    with clock.installed(), _in_the_test_transaction():
        root, _ = deployment.submit(spec.ffqn, list(args), execution_id=execution_id)
        driver = _Driver(stubs, clock, replay_check)
        rounds = driver.run_until_finished(root)
        tree = store.get_tree(root)
        histories = {row.execution_id: store.get(row.execution_id).events for row, _ in tree}
        run = WorkflowRun(root, tree[0][1], tree, histories, stubs, clock.start, clock.now(), rounds)
    run.unused_stubs = stubs.unused()
    if run.unused_stubs:
        warnings.warn(UnusedStubWarning(_unused_message(run.unused_stubs)), stacklevel=2)
    return run


class UnusedStubWarning(UserWarning):
    pass


def unused_stubs_error(runs: list[WorkflowRun]) -> UnusedStubs | None:
    """The ``obelisk_env`` fixture's report at the end of a test."""
    unused = sorted({ffqn for run in runs for ffqn in run.unused_stubs})
    return UnusedStubs(_unused_message(unused)) if unused else None


def _unused_message(unused: list[str]) -> str:
    return f"stubbed but never called: {', '.join(unused)} (remove the stub, or test the path that calls it)"


def _workflow(fn: Function | str) -> Function:
    spec = registry.lookup(fn) if isinstance(fn, str) else fn
    if not isinstance(spec, Function):
        raise TypeError(f"run_workflow needs an @workflow function or its registered name, got {fn!r}")
    if spec.kind != "workflow":
        raise TypeError(f"run_workflow runs workflows; `{spec.ffqn}` is an {spec.kind} (call it directly)")
    return spec


@contextlib.contextmanager
def _in_the_test_transaction() -> Iterator[None]:
    """A test wrapped in a transaction (pytest-django's ``db``, ``TestCase``) keeps its
    connection: a workflow run ends by closing the connection if it is unusable, which the
    wrapping transaction's turned-off autocommit would make it look. Inside, the store's
    transactions are savepoints of the test's, rolled back with it. why: D120"""
    if not connection.in_atomic_block:
        yield
        return
    wrapper = connections[DEFAULT_DB_ALIAS]
    wrapper.close_if_unusable_or_obsolete = lambda: None
    try:
        yield
    finally:
        del wrapper.close_if_unusable_or_obsolete


def _kind(event) -> str:
    inner = getattr(event, "event", None)
    return type(inner).__name__ if inner is not None else type(event).__name__


class _Driver:
    """The rounds of one ``run_workflow``: the executor's pieces on a virtual clock."""

    def __init__(self, stubs: Stubs, clock: VirtualClock, replay_check: bool):
        self.clock = clock
        self.stubs = stubs
        self.replay_check = replay_check
        self.deployment_id = deployment.current_deployment_id()
        served = registry.registered()
        functions = {ffqn: spec if spec.kind == "workflow" else stubs.stand_in(spec) for ffqn, spec in served.items()}
        self.workflows = {ffqn: dataclasses.replace(spec, blocking="interrupt") for ffqn, spec in served.items()}
        self.executor = Executor(functions, self.deployment_id)

    def run_until_finished(self, root: str) -> int:
        """Rounds until the root has finished and nothing else is due, now or later (a
        scheduled execution it made runs too). Returns how many rounds it took."""
        for rounds in range(1, MAX_ROUNDS + 1):
            if self._round():
                continue
            due = self._next_due()
            finished = store.get_state(root).is_finished
            if due is None or (finished and due <= self.clock.now()):
                if finished:
                    return rounds
                state = store.get_state(root)
                raise Stuck(
                    f"{root} cannot finish: it is {state.state} and nothing is due now or later "
                    "(it waits for something this test never does)"
                )
            if due <= self.clock.now():
                raise Stuck(
                    f"{root}: work is due at {due.isoformat()} but nothing here runs it (is its function registered?)"
                )
            self.clock.advance_to(due)
        raise Stuck(f"{root} still makes work after {MAX_ROUNDS} rounds (a loop of retries or of new children?)")

    def _round(self) -> bool:
        now = self.clock.now()
        ran = 0
        for locked in self._claim(self.executor.workflow_terms, now):
            workflow_runner.run_workflow(locked, self.workflows[locked.ffqn], self.deployment_id, keep_connection=True)
            ran += 1
            self._check_run_ended(locked)
            if self.replay_check:
                replaying.check(self.workflows[locked.ffqn], locked.execution_id)
        batch = self._claim(self.executor.terms, now)
        if batch:
            self.executor.run_batch(batch)
            ran += len(batch)
        if self.stubs.problems:
            raise Stuck(self.stubs.problems[0])
        return bool(ran or sweeper.sweep(now))

    def _check_run_ended(self, locked: store.LockedExecution) -> None:
        """A run ends by finishing, or by a wait that hands the row on; one that left its
        lock held failed in the engine (the runner logged why, as a worker's would): under
        a worker the lock would expire and the run repeat, here it is said at once."""
        state = store.get_state(locked.execution_id)
        if state.state == State.LOCKED and state.run_id == locked.fence.run_id:
            raise Stuck(
                f"the run of {locked.execution_id} ended without finishing or waiting, its lock held: "
                "it failed in the engine (see the log of `obelisk.workflow`)"
            )

    def _claim(self, terms: dict[str, store.LockTerms], now: datetime) -> list[store.LockedExecution]:
        if not terms:
            return []
        return store.lock_pending(
            terms,
            limit=100,
            executor_id=self.executor.executor_id,
            run_id=new_run_id(),
            deployment_id=self.deployment_id,
            now=now,
        )

    def _next_due(self) -> datetime | None:
        times = [store.next_timer_at(), store.next_pending_at(list(self.executor.functions))]
        times = [t for t in times if t is not None]
        return min(times) if times else None
