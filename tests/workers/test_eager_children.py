"""A workflow's children are dispatched eagerly to its own process's executor (D65, D66).

A child created locked by its parent's write is exactly what ``lock_pending`` makes of a
pending one; a write claims only due children of functions and components the claimer runs,
at most its limit; a refused write neither creates nor locks; the children run on the
workflow's own worker without a claim, with an unchanged result; children handed to an
executor that stopped claiming go back to any worker; a response to an awaiting workflow
wakes no broker.

why: D65, D66
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils.timezone import now as timezone_now

from executions import errors, notify, store
from executions.events import Ok, Unlocked
from executions.models import ExecutionState
from tests.support.helpers import FFQN, create, lock
from tests.support.hot_path import (
    SERVED,
    child_claim,
    children_of_one_write,
    claim_and_run_beside,
    finish,
)

pytestmark = pytest.mark.django_db(transaction=True)


def _comparable_state(execution_id: str) -> dict:
    row = ExecutionState.objects.filter(pk=execution_id).values().get()
    for name in ("execution_id", "created_at", "updated_at", "first_scheduled_at", "pending_expires_finished"):
        row.pop(name)
    return row


def _comparable_events(execution_id: str) -> list:
    from executions.events import event_to_json

    out = []
    for record in store.get(execution_id).events:
        body = event_to_json(record.event)
        for fields in body.values():
            for name in ("scheduled_at", "lock_expires_at", "params", "parent"):
                fields.pop(name, None)
        out.append((record.version, body))
    return out


def test_a_child_created_locked_is_exactly_what_lock_pending_makes_of_a_pending_one():
    """D65: a child created locked for the writer's own executor has the same row, the same
    log and the same ``LockedExecution`` as one created pending and then claimed with the
    same terms, executor and run; it is never announced as pending."""
    from tests.support.helpers import DEPLOYMENT, TERMS, create_workflow, lock

    parent = create_workflow()
    run = lock(parent)
    claim = child_claim()
    with notify.Listener([notify.PENDING]) as listener:
        (eager,), claimed = children_of_one_write(parent, run, 1, claim)
        assert not any(FFQN in note.items for note in listener.wait(0.2))
    run = store.LockedExecution(**{**run.__dict__, "next_version": store.get_state(parent).next_version})
    (pending,), none = children_of_one_write(parent, run, 1)
    assert none == []
    (claimed_later,) = store.lock_pending(
        {FFQN: TERMS}, limit=1, executor_id=claim.executor_id, run_id=claim.run_id, deployment_id=DEPLOYMENT
    )
    assert claimed_later.execution_id == pending
    assert _comparable_state(eager) == _comparable_state(pending)
    assert _comparable_events(eager) == _comparable_events(pending)
    (locked_eagerly,) = claimed
    for name in (
        "ffqn",
        "metadata",
        "component_type",
        "component_digest",
        "deployment_id",
        "next_version",
        "intermittent_event_count",
        "fence",
        "history",
        "responses",
    ):
        assert getattr(locked_eagerly, name) == getattr(claimed_later, name), name
    assert locked_eagerly.params == store.get_created(eager).params
    assert locked_eagerly.parent == store.get_created(eager).parent
    assert locked_eagerly.locked == store.get(eager).events[1].event


def test_a_write_claims_only_due_children_of_functions_and_components_the_claimer_runs_and_at_most_its_limit():
    """D65: a child scheduled for later, of another function, built from another component,
    or beyond the claim's limit is created pending (and announced when due), as usual."""
    from executions.events import ComponentId
    from executions.ids import content_digest
    from tests.support.helpers import TERMS, create_workflow, lock

    parent = create_workflow()
    run = lock(parent)
    children, claimed = children_of_one_write(parent, run, 3, child_claim(limit=2))
    assert [c.execution_id for c in claimed] == children[:2]
    assert [store.get_state(c).state for c in children] == ["locked", "locked", "pending_at"]

    def next_run():
        return store.LockedExecution(**{**run.__dict__, "next_version": store.get_state(parent).next_version})

    later = timezone_now() + timedelta(hours=1)
    scheduled, claimed = children_of_one_write(parent, next_run(), 1, child_claim(), scheduled_at=later)
    assert claimed == [] and store.get_state(scheduled[0]).state == "pending_at"
    other, claimed = children_of_one_write(parent, next_run(), 1, child_claim(**{"test:pkg/ifc.other": TERMS}))
    assert claimed == [] and store.get_state(other[0]).state == "pending_at"
    foreign = ComponentId(component_type="activity", name="elsewhere", component_digest=content_digest(b"other"))
    built_elsewhere, claimed = children_of_one_write(parent, next_run(), 1, child_claim(), component=foreign)
    assert claimed == [] and store.get_state(built_elsewhere[0]).state == "pending_at"


def test_a_refused_write_neither_creates_nor_locks_its_children():
    """D65: the children are created locked in the parent's transaction, so a write the
    store refuses (here: a run whose lock is gone) leaves no child, locked or not."""
    from tests.support.helpers import create_workflow, lock

    parent = create_workflow()
    stale = lock(parent)
    store.append(parent, None, Unlocked(unlocked_at=timezone_now(), reason="test"), fence=stale.fence)
    lock(parent)
    before = ExecutionState.objects.count()
    with pytest.raises(errors.LockLost):
        children_of_one_write(parent, stale, 2, child_claim())
    assert ExecutionState.objects.count() == before


def test_a_workflows_children_run_on_its_own_worker_without_a_claim_and_its_result_is_unchanged():
    """D65, end to end in one process: a sequential workflow's child activities are locked by
    the write that creates them and run by the executor of the workflow's own process (their
    ``Locked`` event is written with their ``Created`` event, by that executor); the
    workflow's result is the one it computes without the shortcut."""
    from tests.support import workflows
    from workers.components import load_components
    from workers.executor import Executor
    from workers.testing import current_deployment_id

    components = {
        **load_components(),
        workflows.sequential_sum.ffqn: workflows.sequential_sum,
        workflows.fn2.ffqn: workflows.fn2,
    }
    executor = Executor(components, current_deployment_id())

    workflow_id = create(workflows.sequential_sum.ffqn, [5], component=workflows.sequential_sum.component_id)
    executor.claim_and_run(budget=30, linger=2)
    executor.workflows.join(30)
    assert store.get_finished_result(workflow_id) == Ok(15)
    children = ExecutionState.objects.filter(execution_id__startswith=workflow_id + ".")
    assert children.count() == 5
    for child in children:
        created, locked = store.get(child.execution_id).events[:2]
        assert locked.event.VARIANT == "locked" and locked.version == 1
        assert locked.created_at == created.created_at  # one transaction: the parent's write
        assert locked.event.executor_id == executor.executor_id
    assert executor.stats.finished >= 5


def test_children_handed_to_an_executor_that_stopped_claiming_are_handed_back_for_any_worker():
    """D65: an executor takes handed children only while it claims; afterwards ``hand_over``
    unlocks them at once (no retry used), so another worker claims them instead of waiting
    for their locks to expire."""
    from tests.support.helpers import DEPLOYMENT, TERMS, create_workflow, lock
    from workers.executor import Executor

    executor = Executor({}, DEPLOYMENT)
    executor.terms = {FFQN: TERMS}
    executor.claim_and_run(budget=0.1, linger=0)  # claims, then closes its window
    assert executor.child_claim([FFQN]) is None
    parent = create_workflow()
    children, claimed = children_of_one_write(parent, lock(parent), 2, child_claim())
    executor.hand_over(claimed)
    assert [store.get_state(c).state for c in children] == ["pending_at", "pending_at"]
    assert all(store.get(c).events[-1].event.VARIANT == "unlocked" for c in children)
    assert (
        len(
            store.lock_pending(
                {FFQN: TERMS},
                limit=5,
                executor_id=claimed[0].locked.executor_id,
                run_id=claimed[0].fence.run_id,
                deployment_id=DEPLOYMENT,
            )
        )
        == 2
    )


def test_a_response_to_an_awaiting_workflow_wakes_no_broker_and_leaves_it_due_at_its_runs_lock_expiry():
    """D66: a response to a workflow whose run awaits it in place wakes that run
    (``obelisk_response``) and nothing else: no ``obelisk_scheduled``, which woke every broker
    of every cluster to recompute its next wake-up. The row is due at the run's lock expiry,
    in case the run dies, and a broker's periodic look (``next_pending_at``) finds it."""
    from tests.support.helpers import WORKFLOW_FFQN, block_on_child, create_workflow

    parent = create_workflow()
    run = lock(parent)
    _, child, _ = block_on_child(parent, run)
    with notify.Listener([notify.SCHEDULED, notify.PENDING, notify.RESPONSE]) as listener:
        finish(child, 1)
        deadline, notes = time.monotonic() + 0.3, []
        while (left := deadline - time.monotonic()) > 0:
            notes.extend(listener.wait(left))
    assert any(n.channel == notify.RESPONSE and parent in n.items for n in notes)
    assert not any(n.channel == notify.SCHEDULED for n in notes)
    assert not any(n.channel == notify.PENDING and WORKFLOW_FFQN in n.items for n in notes)
    state = store.get_state(parent)
    assert state.state == "pending_at"
    assert state.pending_expires_finished == run.locked.lock_expires_at
    assert store.next_pending_at([WORKFLOW_FFQN]) == run.locked.lock_expires_at


def test_only_an_executor_not_running_activities_is_offered_a_workflows_children(tmp_path):
    """D65: children are created locked for the executor of the workflow's own process only
    while it is not running activities. One running an activity is offered none, and
    children handed to it after it started are given back at once: they would wait behind
    the run under way, where any other worker can take them when they are pending."""
    import os

    from tests.support.helpers import create_workflow
    from workers.components import load_components
    from workers.executor import Executor
    from workers.testing import current_deployment_id

    executor = Executor(load_components(), current_deployment_id(), max_batch=1)
    marker = str(tmp_path / "marker")
    slow = create("test:acts/slow.sleep", [0.5, marker])
    offers = {}

    def offer_while_busy_then_while_idle():
        while not os.path.exists(marker):  # the slow activity has started
            time.sleep(0.005)
        offers["busy"] = executor.child_claim([SERVED])
        parent = create_workflow()  # children a write locked just before it got busy
        children, claimed = children_of_one_write(parent, lock(parent), 2, child_claim())
        executor.hand_over(claimed)
        offers["handed while busy"] = [store.get(c).events[-1].event.VARIANT for c in children]
        while store.get_state(slow).state != "finished":
            time.sleep(0.01)
        time.sleep(0.2)  # the executor lingers, waiting for work
        offers["idle"] = executor.child_claim([SERVED])

    claim_and_run_beside(executor, offer_while_busy_then_while_idle, budget=10, linger=1.0)
    assert offers["busy"] is None
    assert offers["handed while busy"] == ["unlocked", "unlocked"]  # pending at once, for any worker
    assert offers["idle"] is not None and SERVED in offers["idle"].functions
