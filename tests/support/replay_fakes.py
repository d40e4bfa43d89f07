"""The in-memory store, its ports and runs for the tests of the pure replay core
(``tests/workflows/test_replay_conformance.py``, ``test_replay_decisions.py``,
``test_replay_properties.py``).

``FakeStore`` stands in for the execution store (versions fenced, children created with
their requests, responses delivered per parent by ``seq``); ``FakeWriter``, ``FakeWaiter``,
``FakeCanceller`` and ``FakeLease`` are the ports of ``workers.replay.ports`` over it;
``World`` finishes children and fires delays on demand; ``start_run`` builds an
``EventHistory`` under one blocking ``Strategy``. No database, no Django.

why: D33 (spec 002 §6's tests ported against fakes of the host)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from executions import errors
from executions.events import (
    DelayRequest,
    Err,
    ExecutionFailure,
    JoinSetRequest,
    Ok,
)
from executions.ids import DelayId, ExecutionId
from workers.replay import (
    EventHistory,
    NewExecution,
    Response,
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
