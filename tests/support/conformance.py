"""What the store's conformance tests (``tests/store/test_store_*.py`` by spec section)
share: reading a row, checking that nothing was written (``unchanged``) and that the log
agrees with the state table, and executions brought through the store into the shapes the
sections need (children submitted, join-nexts, blocked workflows, delays, expired timers).

Everything goes through the store's public API with explicit ``now=`` values; no row is
written directly.

why: D9, D12 (order of checks and retries decided in the store, which the tests observe)
"""

from __future__ import annotations

import contextlib
from datetime import timedelta

from executions import store
from executions.events import (
    ChildExecutionRequest,
    DelayRequest,
    Finished,
    JoinNext,
    JoinNextTry,
    JoinSetCreate,
    JoinSetRequest,
    Ok,
    Persist,
    RetryConfig,
)
from executions.ids import DelayId, ExecutionId, JoinSetId, new_executor_id, new_run_id
from executions.models import ExecutionEvent, ExecutionState
from tests.support.helpers import (
    ACTIVITY,
    DEPLOYMENT,
    FFQN,
    T0,
    TERMS,
    WORKFLOW_FFQN,
    WORKFLOW_TERMS,
    block_on_child,
    create_workflow,
    db_snapshot,
    history,
    lock,
)

NO_RETRY_TERMS = store.LockTerms(ACTIVITY, RetryConfig(max_retries=0), timedelta(seconds=10))


# ---------------------------------------------------------------------------------------
# Local helpers
# ---------------------------------------------------------------------------------------


def at(seconds: float):
    return T0 + timedelta(seconds=seconds)


def row(execution_id: str) -> ExecutionState:
    return store.get_state(execution_id)


@contextlib.contextmanager
def unchanged():
    """The block must leave every execution table exactly as it was."""
    before = db_snapshot()
    yield
    assert db_snapshot() == before


def assert_log_consistent() -> None:
    """Spec 000 §12.1-2: versions contiguous from 0 (``created`` first) and
    ``corresponding_version`` equal to the highest version, for every execution."""
    states = list(ExecutionState.objects.values_list("execution_id", "corresponding_version"))
    assert states
    for execution_id, corresponding_version in states:
        versions = list(
            ExecutionEvent.objects.filter(execution_id=execution_id)
            .order_by("version")
            .values_list("version", "variant")
        )
        assert [v for v, _ in versions] == list(range(corresponding_version + 1)), execution_id
        assert versions[0][1] == "created"


def persist():
    return history(Persist(value=[4, 2], kind={"type": "random_u64", "min": 0, "max_inclusive": 100}))


def finish(execution_id: str, retval=Ok(None), *, now) -> int:
    return store.append(execution_id, row(execution_id).next_version, Finished(retval=retval), now=now)


def lock_pending(now, functions=None) -> list[store.LockedExecution]:
    return store.lock_pending(
        functions or {FFQN: TERMS, WORKFLOW_FFQN: WORKFLOW_TERMS},
        limit=100,
        executor_id=new_executor_id(),
        run_id=new_run_id(),
        deployment_id=DEPLOYMENT,
        now=now,
    )


def submit_children(wf: str, js: str, count: int, *, now) -> list[str]:
    """The workflow opens join set ``js`` and submits ``count`` child activities to it."""
    join_set = JoinSetId.parse(js)
    children = [str(ExecutionId.parse(wf).child(join_set, i)) for i in range(1, count + 1)]
    events = [history(JoinSetCreate(join_set_id=js))] + [
        history(
            JoinSetRequest(
                join_set_id=js, request=ChildExecutionRequest(child_execution_id=c, target_ffqn=FFQN, params=[])
            )
        )
        for c in children
    ]
    requests = [child_request(wf, js, child) for child in children]
    store.append_batch_create_new_execution(wf, row(wf).next_version, events, requests, now=now)
    return children


def kid(parent: str, js: str, idx: int) -> str:
    return str(ExecutionId.parse(parent).child(JoinSetId.parse(js), idx))


def child_request(parent: str, js: str, child: str, **kwargs) -> store.CreateRequest:
    fields = dict(
        execution_id=child, ffqn=FFQN, params=[], component_id=ACTIVITY, deployment_id=DEPLOYMENT, parent=(parent, js)
    )
    fields.update(kwargs)
    return store.CreateRequest(**fields)


def join_next(wf: str, js: str, *, run_expires_at, now) -> ExecutionState:
    store.append(wf, row(wf).next_version, history(JoinNext(join_set_id=js, run_expires_at=run_expires_at)), now=now)
    return row(wf)


def join_next_try(wf: str, js: str, outcome: str, *, now) -> int:
    return store.append(wf, row(wf).next_version, history(JoinNextTry(join_set_id=js, outcome=outcome)), now=now)


def blocked_workflow(now=T0) -> tuple[str, store.LockedExecution, str, str]:
    """A workflow locked at ``now`` (run expires at now+10 s), blocked on one child."""
    wf = create_workflow(now=now)
    locked = lock(wf, now=now)
    js, child, _ = block_on_child(wf, locked, now=now)
    return wf, locked, js, child


def request_delay(wf: str, js: str, *, expires_at, now, idx: int = 1, paused: bool = False) -> str:
    delay_id = str(DelayId(ExecutionId.parse(wf), JoinSetId.parse(js), idx))
    store.append_batch(
        wf,
        row(wf).next_version,
        [
            history(JoinSetCreate(join_set_id=js)),
            history(
                JoinSetRequest(
                    join_set_id=js, request=DelayRequest(delay_id=delay_id, expires_at=expires_at, paused=paused)
                )
            ),
        ],
        now=now,
    )
    return delay_id


def expired_delay_ids(now) -> set[str]:
    delays, _ = store.get_expired_timers(now=now)
    return {d.delay_id for d in delays}


def expired_lock_ids(now) -> set[str]:
    _, locks = store.get_expired_timers(now=now)
    return {lock.execution_id for lock in locks}
