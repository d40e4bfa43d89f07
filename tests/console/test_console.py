"""The operator console (Django admin) without a browser: its pages render what the store
holds, and its actions go through the client and the store, audited as the admin user via
``admin``; a user without the act permission changes nothing. Plus the pure time-travel
computation (``executions.timetravel``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.admin.utils import quote
from django.urls import reverse

from executions import display, store, timetravel
from executions.events import (
    ChildExecutionRequest,
    ComponentId,
    Created,
    Finished,
    HistoryEventRecord,
    JoinNext,
    JoinSetCreate,
    JoinSetRequest,
    Locked,
    Ok,
)
from executions.models import AuditEntry
from tests.support import browser as support
from tests.support import helpers

T0 = datetime(2030, 1, 1, 12, 0, 0, tzinfo=UTC)


def at(ms: int) -> datetime:
    return T0 + timedelta(milliseconds=ms)


# ---------------------------------------------------------------------------------------
# Pure: time travel and display helpers
# ---------------------------------------------------------------------------------------


def _workflow_log():
    component = ComponentId(component_type="workflow", name="wf", component_digest="sha256:" + "0" * 64)
    child = "E_01JAAAAAAAAAAAAAAAAAAAAAAA.n:js_1"
    locked = dict(
        component_id=component,
        executor_id="Exr_1",
        run_id="Run_1",
        lock_expires_at=at(10_000),
        retry_config={},
        deployment_id="D",
    )
    events = [
        store.EventRecord(
            0,
            at(0),
            Created(ffqn="wf:pkg/ifc.run", params=[], scheduled_at=at(0), component_id=component, deployment_id="D"),
        ),
        store.EventRecord(1, at(10), Locked(**locked)),
        store.EventRecord(2, at(20), HistoryEventRecord(event=JoinSetCreate(join_set_id="n:js"))),
        store.EventRecord(
            3,
            at(30),
            HistoryEventRecord(
                event=JoinSetRequest(
                    join_set_id="n:js",
                    request=ChildExecutionRequest(child_execution_id=child, target_ffqn="a:b/c.d", params=[]),
                )
            ),
        ),
        store.EventRecord(4, at(40), HistoryEventRecord(event=JoinNext(join_set_id="n:js", run_expires_at=at(10_000)))),
        store.EventRecord(5, at(60), Locked(**locked)),
        store.EventRecord(6, at(70), Finished(retval=Ok("done"))),
    ]
    responses = [
        store.Response(seq=1, created_at=at(50), join_set_id="n:js", child_execution_id=child, child_retval=Ok(1))
    ]
    return events, responses, child


def test_as_of_shows_what_was_requested_and_arrived_by_each_version():
    events, responses, child = _workflow_log()

    before_request = timetravel.as_of(events, responses, 2)
    assert before_request.status == "running"
    assert before_request.requests == [] and before_request.responses == []
    assert [r.version for r in before_request.events] == [0, 1, 2]

    requested = timetravel.as_of(events, responses, 3)
    assert [(r.id, r.kind, r.requested_version, r.response) for r in requested.requests] == [(child, "child", 3, None)]

    waiting = timetravel.as_of(events, responses, 4)
    assert waiting.status == "blocked"
    assert waiting.responses == [] and waiting.requests[0].response is None

    resumed = timetravel.as_of(events, responses, 5)
    assert resumed.status == "running"
    assert [r.seq for r in resumed.responses] == [1]
    assert resumed.requests[0].response.child_retval == Ok(1)
    assert not resumed.is_last

    present = timetravel.as_of(events, responses, 6)
    assert present.status == "ok" and present.is_last and present.at == at(70)

    with pytest.raises(ValueError):
        timetravel.as_of(events, responses, 7)


def test_as_of_a_join_answered_before_it_was_written_is_pending():
    events, responses, _ = _workflow_log()
    early = [
        store.Response(seq=1, created_at=at(35), join_set_id="n:js", child_execution_id=responses[0].child_execution_id)
    ]
    assert timetravel.as_of(events, early, 4).status == "pending"


def test_display_times_and_durations():
    assert display.exact_time(at(123)) == "2030-01-01 12:00:00.123"
    assert display.format_duration(timedelta(milliseconds=850)) == "850 ms"
    assert display.format_duration(timedelta(seconds=4.214)) == "4.21 s"
    assert display.format_duration(timedelta(seconds=182)) == "3 min 02 s"
    assert display.format_duration(timedelta(hours=2, minutes=5)) == "2 h 05 min"
    assert display.format_duration(None) == "—"
    assert "obelisk-uncategorized" in display.outcome_badge("uncategorized")


# ---------------------------------------------------------------------------------------
# The console through Django's test client
# ---------------------------------------------------------------------------------------

pytestmark_db = pytest.mark.django_db

LIST = "admin:obelisk_executions_executionstate_changelist"


def page_url(execution_id: str) -> str:
    """The id as it is (D90); ``quote(execution_id)``, the admin's escaping, still works."""
    return reverse("admin:obelisk_executions_executionstate_change", args=[execution_id])


def act_url(execution_id: str, action: str) -> str:
    return reverse("admin:obelisk_executions_executionstate_act", args=[execution_id, action])


@pytest.fixture
def scenario(db):
    return support.make_scenario()


@pytest.fixture
def admin_client(client, db):
    support.make_admin()
    client.login(username="admin", password=support.ADMIN_PASSWORD)
    return client


def audits(execution_id: str) -> list[tuple[str, str, str]]:
    return list(
        AuditEntry.objects.filter(execution_id=execution_id).order_by("id").values_list("actor", "via", "action")
    )


@pytestmark_db
def test_list_shows_outcomes_and_filters_failed_and_searches_error_text(admin_client, scenario):
    body = admin_client.get(reverse(LIST)).content.decode()
    for outcome in ("uncategorized", "ok", "error", "running", "pending", "paused"):
        assert f"obelisk-badge obelisk-{outcome}" in body
    assert "ValueError: this never works" in body  # the reason column
    assert "E42" in body

    failed = admin_client.get(reverse(LIST), {"outcome": "failed"}).content.decode()
    assert scenario.failed in failed and scenario.ok not in failed and scenario.running not in failed

    found = admin_client.get(reverse(LIST), {"q": "never works"}).content.decode()
    assert scenario.failed in found and scenario.ok not in found

    by_id = admin_client.get(reverse(LIST), {"q": scenario.ok[-10:]}).content.decode()
    assert scenario.ok in by_id and scenario.failed not in by_id


@pytestmark_db
def test_execution_page_shows_error_traceback_timings_and_only_applicable_actions(admin_client, scenario):
    body = admin_client.get(page_url(scenario.failed)).content.decode()
    assert 'id="obelisk-traceback"' in body and "ValueError: this never works" in body
    assert "raise ValueError" in body
    assert "attempts" in body and "queued" in body
    assert 'id="obelisk-action-retry"' in body
    assert 'id="obelisk-action-cancel"' not in body  # finished: cancel is not offered
    assert "obelisk-internal" in body

    running = admin_client.get(page_url(scenario.running)).content.decode()
    assert 'id="obelisk-action-cancel"' in running and 'id="obelisk-action-retry"' not in running

    # Asking for cancel on a finished execution does not even show the confirmation.
    response = admin_client.get(act_url(scenario.ok, "cancel"))
    assert response.status_code == 302
    assert store.get_state(scenario.ok).is_finished


@pytestmark_db
def test_cancel_pause_resume_go_through_the_store_and_are_audited(admin_client, scenario):
    confirm = admin_client.get(act_url(scenario.running, "cancel"))
    assert confirm.status_code == 200 and b"Yes, cancel" in confirm.content
    assert helpers.event_variants(scenario.running)[-1] == "locked"  # the GET changed nothing

    response = admin_client.post(act_url(scenario.running, "cancel"), {"post": "yes"})
    assert response.status_code == 302
    assert helpers.event_variants(scenario.running)[-1] == "cancellation_requested"
    assert audits(scenario.running) == [("admin", "admin", "cancel")]

    admin_client.post(act_url(scenario.pending, "pause"), {"post": "yes"})
    admin_client.post(act_url(scenario.pending, "resume"), {"post": "yes"})
    assert helpers.event_variants(scenario.pending)[-2:] == ["paused", "unpaused"]
    assert audits(scenario.pending) == [("admin", "admin", "pause"), ("admin", "admin", "resume")]


@pytestmark_db
def test_retry_creates_a_linked_execution(admin_client, scenario):
    response = admin_client.post(act_url(scenario.failed, "retry"), {"post": "yes"})
    assert response.status_code == 302
    entry = AuditEntry.objects.get(execution_id=scenario.failed, action="retry")
    assert (entry.actor, entry.via) == ("admin", "admin")
    new_id = entry.detail["new_execution_id"]
    assert response["Location"] == page_url(new_id)
    assert store.get_created(new_id).metadata["retry_of"] == scenario.failed

    new_page = admin_client.get(page_url(new_id)).content.decode()
    assert 'id="obelisk-retry-of"' in new_page and scenario.failed in new_page
    old_page = admin_client.get(page_url(scenario.failed)).content.decode()
    assert "obelisk-retried-as" in old_page and new_id in old_page


@pytestmark_db
def test_run_now_is_offered_only_for_a_scheduled_execution_and_makes_it_due(admin_client, scenario):
    from django.utils import timezone

    from executions import client as engine

    later = timezone.now() + timedelta(hours=2)
    scheduled = engine.submit("test:acts/basic.add", [1, 2], scheduled_at=later).execution_id
    assert 'id="obelisk-action-run_now"' in admin_client.get(page_url(scheduled)).content.decode()
    assert 'id="obelisk-action-run_now"' not in admin_client.get(page_url(scenario.pending)).content.decode()
    response = admin_client.post(act_url(scheduled, "run_now"), {"post": "yes"})
    assert response.status_code == 302
    assert helpers.event_variants(scheduled)[-1] == "rescheduled"
    assert store.get_state(scheduled).pending_expires_finished <= timezone.now()
    assert audits(scheduled) == [("admin", "admin", "run_now")]


@pytestmark_db
def test_a_stale_action_shows_the_stores_answer_not_an_error(admin_client, scenario):
    # The execution finished between showing the button and confirming.
    response = admin_client.post(act_url(scenario.ok, "cancel"), {"post": "yes"}, follow=True)
    assert response.status_code == 200
    assert "already finished" in response.content.decode()
    response = admin_client.post(act_url(scenario.ok, "pause"), {"post": "yes"}, follow=True)
    assert response.status_code == 200
    assert "Pause failed" in response.content.decode()
    assert store.get_state(scenario.ok).is_finished


@pytestmark_db
def test_without_the_act_permission_nothing_changes(client, scenario):
    support.make_viewer()
    client.login(username="viewer", password="viewer")
    page = client.get(page_url(scenario.running))
    assert page.status_code == 200 and b"obelisk-action-" not in page.content
    before = helpers.db_snapshot()
    audit_count = AuditEntry.objects.count()
    for execution_id, action in [
        (scenario.running, "cancel"),
        (scenario.pending, "pause"),
        (scenario.paused, "resume"),
        (scenario.failed, "retry"),
    ]:
        assert client.get(act_url(execution_id, action)).status_code == 403
        assert client.post(act_url(execution_id, action), {"post": "yes"}).status_code == 403
    bulk = client.post(
        reverse(LIST), {"action": "cancel_selected", "_selected_action": [scenario.running], "post": "yes"}
    )
    assert bulk.status_code in (200, 302)
    assert helpers.db_snapshot() == before
    assert AuditEntry.objects.count() == audit_count


@pytestmark_db
def test_bulk_cancel_asks_first_then_goes_through_the_client(admin_client, scenario):
    data = {"action": "cancel_selected", "_selected_action": [scenario.running, scenario.pending]}
    confirm = admin_client.post(reverse(LIST), data)
    assert confirm.status_code == 200 and b"Yes, cancel" in confirm.content
    assert audits(scenario.running) == []
    admin_client.post(reverse(LIST), {**data, "post": "yes"})
    assert audits(scenario.running) == [("admin", "admin", "cancel")]
    assert helpers.event_variants(scenario.pending)[-1] == "cancellation_requested"


@pytestmark_db
def test_workflow_page_shows_children_and_time_travels(admin_client, scenario):
    body = admin_client.get(page_url(scenario.workflow)).content.decode()
    assert 'id="obelisk-tree"' in body and page_url(scenario.child) in body

    versions = helpers.event_variants(scenario.workflow)
    request_version = next(i for i, v in enumerate(versions) if v == "history_event") + 1  # JoinSetRequest
    old = admin_client.get(page_url(scenario.workflow), {"as_of": request_version}).content.decode()
    assert 'id="obelisk-time-travel"' in old
    assert 'id="obelisk-requests"' in old and scenario.child in old
    assert "obelisk-action-" not in old  # no acting on the past
    child_page = admin_client.get(page_url(scenario.child)).content.decode()
    assert 'id="obelisk-parent"' in child_page

    bad = admin_client.get(page_url(scenario.workflow), {"as_of": "999"})
    assert bad.status_code == 200


@pytestmark_db
def test_deployment_pages_are_read_only_and_readable(admin_client, scenario):
    from executions.models import ComponentMetadata, Deployment

    deployment = Deployment.objects.get(status="active")
    listing = admin_client.get(reverse("admin:obelisk_deployments_deployment_changelist")).content.decode()
    assert reverse("admin:obelisk_deployments_deployment_add") not in listing and "object (" not in listing
    detail = admin_client.get(
        reverse("admin:obelisk_deployments_deployment_change", args=[deployment.pk])
    ).content.decode()
    assert "test:acts/basic.add" in detail and "integer" in detail  # a function and a parameter schema
    assert "DeploymentComponent object" not in detail
    assert f"?deployment={deployment.pk}" in detail
    assert 'name="_save"' not in detail and "deletelink" not in detail
    assert admin_client.get(reverse("admin:obelisk_deployments_deployment_add")).status_code == 403
    assert (
        admin_client.get(reverse("admin:obelisk_deployments_deployment_delete", args=[deployment.pk])).status_code
        == 403
    )
    component = ComponentMetadata.objects.first()
    page = admin_client.get(
        reverse("admin:obelisk_deployments_componentmetadata_change", args=[component.pk])
    ).content.decode()
    assert f"?component={component.pk}" in page and "deletelink" not in page
    filtered = admin_client.get(reverse(LIST), {"deployment": deployment.pk}).content.decode()
    assert scenario.ok in filtered and scenario.workflow not in filtered  # the workflow is another deployment's


@pytestmark_db
def test_find_by_result_text_escapes_wildcards(scenario):
    assert store.find_by_result_text("NEVER WORKS") == [scenario.failed]
    assert store.find_by_result_text("%") == []
    assert scenario.error_value in store.find_by_result_text("E42")


def test_a_persisted_value_reads_as_what_the_workflow_saw_and_each_history_event_has_a_title():
    from executions.events import Persist

    now = Persist(value=list(b"2030-01-01T12:00:00.123456+00:00"), kind={"type": "now"})
    assert display.persisted_text(now) == "now = 2030-01-01 12:00:00.123 UTC"
    number = Persist(value=list((42).to_bytes(8, "big")), kind={"type": "random_u64", "min": 0, "max_inclusive": 99})
    assert display.persisted_text(number) == "random number = 42"
    assert (
        display.persisted_text(Persist(value=list(b"abc"), kind={"type": "random_string"})) == 'random string = "abc"'
    )
    assert display.event_title(HistoryEventRecord(event=now)) == "Time read (ctx.now)"
    titles = [display.event_title(record.event) for record in _workflow_log()[0]]
    assert titles == [
        "Created",
        "Locked (run started)",
        "Join set opened",
        "Child started",
        "Waiting for a response",
        "Locked (run started)",
        "Finished",
    ]


@pytestmark_db
def test_escaped_links_and_bad_ids_still_answer_without_an_error(admin_client, scenario):
    escaped = reverse("admin:obelisk_executions_executionstate_change", args=[quote(scenario.child)])
    assert "_5F" in escaped
    body = admin_client.get(escaped).content.decode()
    assert f'<h1 style="word-break:break-all">{scenario.child}</h1>' in body
    for bad in ("E_nope", "E_01JAAAAAAAAAAAAAAAAAAAAAAA", "%00", "x" * 2000):
        response = admin_client.get(f"/admin/obelisk_executions/executionstate/{bad}/change/")
        assert response.status_code == 302, bad


@pytestmark_db
def test_bulk_retry_asks_first_then_retries_each_through_the_client(admin_client, scenario):
    data = {"action": "retry_selected", "_selected_action": [scenario.failed, scenario.running]}
    confirm = admin_client.post(reverse(LIST), data)
    assert confirm.status_code == 200 and b"Yes, retry" in confirm.content
    assert audits(scenario.failed) == []
    response = admin_client.post(reverse(LIST), {**data, "post": "yes"}, follow=True)
    assert audits(scenario.failed) == [("admin", "admin", "retry")]
    assert audits(scenario.running) == []  # unfinished: the store refused, the page says why
    text = response.content.decode()
    assert "Retry 1 execution(s)" in text and scenario.running in text


@pytestmark_db
def test_the_audit_page_is_for_whoever_may_view_executions_and_filters_by_actor_and_time(client, scenario):
    from executions import client as execution_client

    execution_client.pause(scenario.pending, actor="bob", via="api")
    execution_client.resume(scenario.pending, actor="carol", via="cli")
    support.make_viewer()
    client.login(username="viewer", password="viewer")
    url = reverse("admin:obelisk_executions_auditentry_changelist")

    def rows(**query) -> str:
        return client.get(url, query).content.decode().split('id="result_list"')[1].split("</table>")[0]

    bob = rows(actor="bob", when="today")
    assert scenario.pending in bob and "pause" in bob and "carol" not in bob and "resume" not in bob
    assert rows(when="1h", via="cli").count('class="field-actor"') == 1
    assert client.post(url, {"action": "delete_selected"}).status_code in (200, 302, 403)
    assert client.get(reverse("admin:obelisk_executions_auditentry_add")).status_code == 403
