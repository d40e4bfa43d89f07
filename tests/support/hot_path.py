"""What the hot-path tests share (``tests/workers/test_notifications.py``,
``test_waking_workers.py``, ``test_one_message_writes.py``, ``test_eager_children.py``,
``test_prepared_statements.py``): finishing an execution through the store, a row and a log
as stored (to compare a one-message write with its transaction), running an executor's
claim beside another thread, and a workflow run's write that submits children and claims
them (``children_of_one_write`` with a ``child_claim``).

Everything goes through the real store on the test database; nothing here writes rows.

why: D48 (hot-path reads and one-message writes must write what the transactions write)
"""

from __future__ import annotations

import threading

from django.db import connection

from executions import store
from executions.events import Finished, Ok
from executions.models import ExecutionState
from tests.support.helpers import FFQN, lock

SERVED = "test:acts/basic.noop"  # a function of tests.support.components, which the broker serves


def finish(execution_id: str, value) -> None:
    locked = lock(execution_id)
    store.append(execution_id, None, Finished(retval=Ok(value)), fence=locked.fence)


def row_of(execution_id: str) -> dict:
    return {**ExecutionState.objects.filter(pk=execution_id).values().get(), "execution_id": None}


def log_of(execution_id: str, *, from_version: int = 1) -> list[tuple]:
    """The log as stored, JSON as text; by default from version 1, the ``Created`` event
    left out."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT version, created_at, json_value::text, variant, join_set_id, history_event_type,"
            " consumes_response FROM t_execution_log WHERE execution_id = %s AND version >= %s ORDER BY version",
            [execution_id, from_version],
        )
        return cursor.fetchall()


def claim_and_run_beside(executor, side, **options) -> None:
    """``executor.claim_and_run(**options)`` while ``side`` runs in a thread of its own (with
    its own connection, closed at its end); then the runs of workflows it started end."""

    def run_side():
        try:
            side()
        finally:
            connection.close()

    thread = threading.Thread(target=run_side)
    thread.start()
    try:
        executor.claim_and_run(**options)
    finally:
        thread.join()
        executor.workflows.join(30)


def children_of_one_write(parent: str, locked, count: int, claim=None, *, ffqn=FFQN, component=None, **request):
    """``parent``'s run opens a join set and submits ``count`` children of ``ffqn`` in one
    write, with ``claim``: the children's ids and what the write claimed."""
    from executions.events import ChildExecutionRequest, JoinSetCreate, JoinSetRequest
    from executions.ids import ExecutionId, JoinSetId
    from tests.support.helpers import ACTIVITY, DEPLOYMENT, history

    js = JoinSetId("n", f"eager{locked.next_version}")
    children = [str(ExecutionId.parse(parent).child(js, i + 1)) for i in range(count)]
    events = [history(JoinSetCreate(join_set_id=str(js)))] + [
        history(
            JoinSetRequest(
                join_set_id=str(js), request=ChildExecutionRequest(child_execution_id=c, target_ffqn=ffqn, params=[i])
            )
        )
        for i, c in enumerate(children)
    ]
    requests = [
        store.CreateRequest(
            execution_id=c,
            ffqn=ffqn,
            params=[i],
            component_id=component or ACTIVITY,
            deployment_id=DEPLOYMENT,
            parent=(parent, str(js)),
            **request,
        )
        for i, c in enumerate(children)
    ]
    _, claimed = store.append_and_claim_children(
        parent, locked.next_version, events, requests, fence=locked.fence, claim=claim
    )
    return children, claimed


def child_claim(limit: int = 10, **terms) -> store.ChildClaim:
    from executions.ids import new_executor_id, new_run_id
    from tests.support.helpers import DEPLOYMENT, TERMS

    return store.ChildClaim(terms or {FFQN: TERMS}, limit, new_executor_id(), new_run_id(), DEPLOYMENT)
