"""``executions.client``: a process without the user's code submits, inspects and acts on
executions; calls are validated against the stored component metadata, and every action is
audited in its own transaction."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta

import pytest
from django.utils import timezone

from executions import catalog, client, errors, store
from executions.events import ExecutionFailure, Finished, Ok
from executions.ids import ExecutionId
from executions.models import AuditEntry
from tests.support import helpers
from tests.support.clusters import BASE_DIR, current_database_url

pytestmark = pytest.mark.django_db(transaction=True)

ADD = "test:acts/basic.add"
GREET = "test:acts/basic.greet"


@pytest.fixture(autouse=True)
def deployed():
    return helpers.deploy_components()


def finish(execution_id: str, retval) -> None:
    locked = helpers.lock(execution_id)
    store.append(
        execution_id,
        locked.next_version,
        Finished(retval=retval),
        fence=locked.fence,
    )


def test_a_process_without_the_code_submits_against_the_stored_schemas(deployed):
    """The CLI and the API import none of the user's modules: validation comes from
    ``t_component_metadata``. A subprocess with no component modules submits a valid call,
    is refused an invalid one, and never imports ``tests.support.components``."""
    script = (
        "import django, sys; django.setup()\n"
        "from executions import client, errors\n"
        f"print(client.submit({ADD!r}, [1, 2]).created)\n"
        "try:\n"
        f"    client.submit({ADD!r}, ['one', 2])\n"
        "except errors.ValidationFailed as e:\n"
        "    print('refused', e.code)\n"
        "print('tests.support.components' in sys.modules)\n"
    )
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="obelisk_site.settings", OBELISK_COMPONENT_MODULES="",
               DATABASE_URL=current_database_url())  # fmt: skip
    result = subprocess.run([sys.executable, "-c", script], cwd=BASE_DIR, env=env, capture_output=True, text=True,
                            timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:3] == ["True", "refused validation_failed", "False"]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["one", 2], "argument `a` is invalid"),
        ([1], "takes 2 argument(s), got 1"),
        ([1, 2, 3], "takes 2 argument(s), got 3"),
        ({"a": 1}, "missing argument `b`"),
        ({"a": 1, "b": 2, "c": 3}, "unknown argument(s) c"),
        ("1, 2", "must be a JSON array or object"),
        ([True, 2], "argument `a` is invalid"),
    ],
)
def test_a_call_that_does_not_match_the_stored_schema_is_refused_and_nothing_is_stored(arguments, message):
    before = helpers.db_snapshot()
    with pytest.raises(errors.ValidationFailed, match=message.replace("(", r"\(").replace(")", r"\)")):
        client.submit(ADD, arguments)
    assert helpers.db_snapshot() == before


def test_stored_defaults_fill_the_arguments_a_call_leaves_out():
    by_position = client.submit(GREET, ["Ada"]).execution_id
    by_name = client.submit(GREET, {"name": "Ada", "times": 2}).execution_id
    assert client.get(by_position).params == ["Ada", "Hello", 1]
    assert client.get(by_name).params == ["Ada", "Hello", 2]


def test_an_unknown_function_is_refused_by_name():
    with pytest.raises(catalog.UnknownFunction, match="unknown function `test:acts/basic.nope`"):
        client.submit("test:acts/basic.nope", [])


def test_the_same_id_with_the_same_call_is_idempotent_and_with_another_call_a_conflict():
    first = client.submit(ADD, [1, 2])
    again = client.submit(ADD, [1, 2], execution_id=first.execution_id)
    assert (first.created, again.created, again.execution_id) == (True, False, first.execution_id)
    before = helpers.db_snapshot()
    with pytest.raises(errors.Conflict):
        client.submit(ADD, [1, 3], execution_id=first.execution_id)
    assert helpers.db_snapshot() == before


def test_get_tells_the_call_the_result_the_attempts_and_the_tree():
    execution_id = client.submit(ADD, [1, 2]).execution_id
    detail = client.get(execution_id)
    assert (detail.params, detail.retval, detail.attempts, detail.parent_id, detail.children) == (
        [1, 2], None, 0, None, []
    )  # fmt: skip
    finish(execution_id, Ok(3))
    detail = client.get(execution_id)
    assert (detail.retval, detail.attempts, detail.state.outcome(timezone.now())) == (Ok(3), 1, "ok")
    assert detail.finished_at is not None
    assert client.wait(execution_id, timeout=5) == {"ok": 3}


def test_retry_submits_the_same_call_as_a_new_execution_linked_to_the_old_one():
    old = client.submit(ADD, [4, 5]).execution_id
    finish(old, ExecutionFailure("timed_out", "took too long"))
    new = client.retry(old, actor="ada", via="admin").execution_id
    assert new != old
    detail = client.get(new)
    assert (detail.params, detail.metadata, detail.state.ffqn) == ([4, 5], {"retry_of": old}, ADD)
    [entry] = client.audit_trail(old)
    assert (entry.actor, entry.via, entry.action, entry.detail) == ("ada", "admin", "retry", {"new_execution_id": new})


def test_only_a_finished_execution_can_be_retried():
    running = client.submit(ADD, [1, 1]).execution_id
    before = helpers.db_snapshot()
    with pytest.raises(errors.IllegalState, match="not finished"):
        client.retry(running, actor="ada", via="api")
    assert helpers.db_snapshot() == before


def test_an_action_and_its_audit_entry_commit_together_and_a_refused_action_leaves_neither():
    execution_id = client.submit(ADD, [1, 2]).execution_id
    client.pause(execution_id, actor="ada", via="cli")
    client.resume(execution_id, actor="bob", via="api")
    assert helpers.event_variants(execution_id)[-2:] == ["paused", "unpaused"]
    assert [(e.action, e.actor, e.via) for e in client.audit_trail(execution_id)] == [
        ("resume", "bob", "api"),
        ("pause", "ada", "cli"),
    ]
    finish(execution_id, Ok(3))
    before = helpers.db_snapshot()
    with pytest.raises(errors.AlreadyFinished):
        client.pause(execution_id, actor="ada", via="cli")
    assert helpers.db_snapshot() == before


def test_cancelling_a_finished_execution_changes_nothing_and_the_audit_says_so():
    execution_id = client.submit(ADD, [1, 2]).execution_id
    finish(execution_id, Ok(3))
    events = helpers.event_variants(execution_id)
    assert client.cancel(execution_id, actor="ada", via="admin") is store.CancelOutcome.ALREADY_FINISHED
    assert helpers.event_variants(execution_id) == events
    assert AuditEntry.objects.get(execution_id=execution_id).detail == {"outcome": "already_finished"}


def test_a_submit_by_a_person_is_audited_and_a_plain_python_submit_is_not():
    by_person = client.submit(ADD, [1, 2], actor="ada", via="api").execution_id
    by_code = client.submit(ADD, [1, 2]).execution_id
    assert [(e.action, e.detail) for e in client.audit_trail(by_person)] == [("submit", {"ffqn": ADD, "created": True})]
    assert client.audit_trail(by_code) == []


def test_listing_filters_by_outcome_parent_and_created_range():
    ok = client.submit(ADD, [1, 2]).execution_id
    failed = client.submit(ADD, [2, 2]).execution_id
    pending = client.submit(ADD, [3, 2]).execution_id
    finish(ok, Ok(3))
    finish(failed, ExecutionFailure("cancelled", "by test"))

    def ids(**filters):
        return {s.execution_id for s in client.list_executions(store.ExecutionFilter(**filters), limit=100).items}

    assert ids(outcomes=("ok",)) == {ok}
    assert ids(outcomes=("failed",)) == {failed}
    assert ids(outcomes=("cancelled", "pending")) == {failed, pending}
    assert ids(created_before=timezone.now() - timedelta(hours=1)) == set()
    assert ids(created_after=timezone.now() - timedelta(hours=1)) == {ok, failed, pending}
    with pytest.raises(errors.ValidationFailed, match="unknown outcome"):
        ids(outcomes=("great",))
    workflow = helpers.create_workflow()
    locked = helpers.lock(workflow)
    child, _ = helpers.start_child(workflow, "g:1", locked.next_version, fence=locked.fence)
    assert ids(parent_id=workflow) == {child}
    assert client.get(workflow).children == [child]
    assert client.get(child).parent_id == workflow


def test_run_now_makes_a_scheduled_execution_due_without_counting_a_failure():
    later = timezone.now() + timedelta(hours=1)
    execution_id = client.submit(ADD, [1, 2], scheduled_at=later).execution_id
    assert client.get(execution_id).state.outcome(timezone.now()) == "scheduled"
    client.run_now(execution_id, actor="ada", via="admin")
    state = client.get(execution_id).state
    assert state.outcome(timezone.now()) == "pending"
    assert (state.intermittent_event_count, state.first_scheduled_at) == (0, later)
    assert helpers.event_variants(execution_id) == ["created", "rescheduled"]
    assert [(e.action, e.actor) for e in client.audit_trail(execution_id)] == [("run_now", "ada")]
    helpers.lock(execution_id)  # due now: a worker can claim it


def test_run_now_of_a_running_or_finished_execution_is_refused_and_changes_nothing():
    running = client.submit(ADD, [1, 2]).execution_id
    helpers.lock(running)
    finished = client.submit(ADD, [2, 2]).execution_id
    finish(finished, Ok(4))
    before = helpers.db_snapshot()
    with pytest.raises(errors.IllegalState, match="only a pending, active execution"):
        client.run_now(running, actor="ada", via="api")
    with pytest.raises(errors.AlreadyFinished):
        client.run_now(finished, actor="ada", via="api")
    assert helpers.db_snapshot() == before


def test_a_submit_pinned_to_a_known_deployment_asks_the_catalogue_nothing(deployed):
    """Deployments are immutable, so once a process has read one, a submit pinned to it is
    only the store's create: no query more (it once cost a round trip per submit)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client.submit(ADD, [1, 2], deployment_id=deployed)  # the first reads the catalogue
    with CaptureQueriesContext(connection) as submitting:
        client.submit(ADD, [3, 4], deployment_id=deployed)
    function = catalog.find_function(ADD, deployed)
    request = store.CreateRequest(
        execution_id=str(ExecutionId.generate()),
        ffqn=ADD,
        params=[5, 6],
        component_id=function.component_id,
        deployment_id=deployed,
    )
    with CaptureQueriesContext(connection) as creating:
        store.create(request)
    assert len(submitting.captured_queries) == len(creating.captured_queries)
