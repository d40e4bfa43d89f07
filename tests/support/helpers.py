"""Shared building blocks for the store tests: fixed components, and executions brought
into each state through the real store API (never by writing rows directly)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from executions import store
from executions.events import (
    ChildExecutionRequest,
    ComponentId,
    HistoryEventRecord,
    JoinNext,
    JoinSetCreate,
    JoinSetRequest,
    RetryConfig,
)
from executions.ids import ExecutionId, JoinSetId, content_digest, new_executor_id, new_run_id
from executions.models import AuditEntry, Delay, ExecutionEvent, ExecutionState, JoinSetResponse, LogEntry

ACTIVITY = ComponentId(
    component_type="activity", name="test_activities", component_digest=content_digest(b"activities")
)
WORKFLOW = ComponentId(component_type="workflow", name="test_workflows", component_digest=content_digest(b"workflows"))
DEPLOYMENT = "Dep_01JAAAAAAAAAAAAAAAAAAAAAAA"
FFQN = "test:pkg/ifc.fn"
WORKFLOW_FFQN = "test:pkg/workflow.run"
RETRY = RetryConfig(max_retries=3, retry_exp_backoff=timedelta(seconds=1))
TERMS = store.LockTerms(ACTIVITY, RETRY, timedelta(seconds=10))
WORKFLOW_TERMS = store.LockTerms(WORKFLOW, RetryConfig(max_retries=None), timedelta(seconds=10))
T0 = datetime(2030, 1, 1, 12, 0, 0, tzinfo=UTC)


def create(
    ffqn: str = FFQN,
    params: list | None = None,
    *,
    component: ComponentId | None = None,
    execution_id: str | None = None,
    now: datetime | None = None,
    **kwargs,
) -> str:
    """Create an execution of ``ffqn`` pinned to ``component``: by default the component of
    the registered function of that name (so a worker of this code runs it, D111), else the
    stand-in ``ACTIVITY``."""
    if component is None:
        from workers.components import load_components

        spec = load_components().get(ffqn)  # the test settings' component modules, imported once
        component = spec.component_id if spec is not None else ACTIVITY
    execution_id = execution_id or str(ExecutionId.generate())
    store.create(
        store.CreateRequest(
            execution_id=execution_id,
            ffqn=ffqn,
            params=params if params is not None else [],
            component_id=component,
            deployment_id=DEPLOYMENT,
            **kwargs,
        ),
        now=now,
    )
    return execution_id


def create_workflow(**kwargs) -> str:
    return create(WORKFLOW_FFQN, component=WORKFLOW, **kwargs)


def lock(
    execution_id: str,
    *,
    now: datetime | None = None,
    terms: store.LockTerms | None = None,
    run_id: str | None = None,
    executor_id: str | None = None,
) -> store.LockedExecution:
    state = store.get_state(execution_id)
    if terms is None:
        terms = WORKFLOW_TERMS if state.component_type == "workflow" else TERMS
    return store.lock_one(
        execution_id,
        state.next_version,
        terms,
        executor_id=executor_id or new_executor_id(),
        run_id=run_id or new_run_id(),
        deployment_id=DEPLOYMENT,
        now=now,
    )


def history(event) -> HistoryEventRecord:
    return HistoryEventRecord(event=event)


def start_child(
    parent: str,
    js: str,
    version: int,
    *,
    ffqn: str = FFQN,
    component: ComponentId = ACTIVITY,
    fence: store.Fence | None = None,
    now=None,
) -> tuple[str, int]:
    """``parent`` opens join set ``js`` and starts one child of ``ffqn`` in it (the store
    writes both events and creates the child). Returns ``(child id, next version)``."""
    child = str(ExecutionId.parse(parent).child(JoinSetId.parse(js), 1))
    request = ChildExecutionRequest(child_execution_id=child, target_ffqn=ffqn, params=[])
    version = store.append_batch_create_new_execution(
        parent,
        version,
        [history(JoinSetCreate(join_set_id=js)), history(JoinSetRequest(join_set_id=js, request=request))],
        [
            store.CreateRequest(
                execution_id=child,
                ffqn=ffqn,
                params=[],
                component_id=component,
                deployment_id=DEPLOYMENT,
                parent=(parent, js),
            )
        ],
        fence=fence,
        now=now,
    )
    return child, version


def block_on_child(
    execution_id: str, locked: store.LockedExecution, *, now=None, name: str = "js"
) -> tuple[str, str, int]:
    """A locked workflow submits one child activity in join set ``n:<name>`` and waits for it.

    Returns ``(join set id, child id, next version)``; the workflow ends up blocked.
    """
    js = JoinSetId("n", name)
    child, version = start_child(execution_id, str(js), locked.next_version, fence=locked.fence, now=now)
    run_expires_at = locked.locked.lock_expires_at
    version = store.append(
        execution_id,
        version,
        history(JoinNext(join_set_id=str(js), run_expires_at=run_expires_at)),
        fence=locked.fence,
        now=now,
    )
    return str(js), child, version


def db_snapshot() -> dict:
    """Every row of every execution table: equal snapshots mean nothing was written."""
    return {
        model.__name__: [tuple(sorted(row.items())) for row in model.objects.order_by("pk").values()]
        for model in (ExecutionState, ExecutionEvent, JoinSetResponse, Delay, LogEntry, AuditEntry)
    }


def event_variants(execution_id: str) -> list[str]:
    return list(
        ExecutionEvent.objects.filter(execution_id=execution_id).order_by("version").values_list("variant", flat=True)
    )


def deploy_components(modules=("tests.support.components",)) -> str:
    """Register and activate the deployment of ``modules``, as a worker does at start, so a
    process without the code (the CLI, the API) can submit their functions."""
    from deployments.registration import ensure_code_deployment
    from workers.components import load_components

    return ensure_code_deployment(load_components(list(modules)), activate=True)


def another_session():
    """A plain autocommit psycopg connection to the test database, as another process
    holds it: it sees only what PostgreSQL delivers (no in-process wake-ups, D45, D67).
    The caller closes it (``with another_session() as other:``)."""
    import psycopg
    from django.db import connection

    params = connection.get_connection_params()
    keys = ("dbname", "user", "password", "host", "port")
    return psycopg.connect(autocommit=True, **{key: params[key] for key in keys if params.get(key)})
