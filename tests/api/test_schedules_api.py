"""The schedules' routes: create, read (next five fire times, last ticks), change, pause,
resume, trigger, backfill and delete, through the real URL conf and database; who may do
what; every refusal a 4xx JSON error naming the field that wrote nothing; and the routes
under schemathesis (never a 5xx, answers as documented)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
import schemathesis
from hypothesis import given, settings
from hypothesis import strategies as st

from executions import schedules, store
from executions.models import AuditEntry, ExecutionState, Schedule
from tests.api.test_api_fuzz import CHECKS, FUZZ, SCHEMA
from tests.support import helpers
from tests.support.api import ADD, VIEW, Api, api_for, assert_error, make_user
from tests.support.fuzz import database_state, describe_difference, error_body, in_process_wsgi

pytestmark = pytest.mark.django_db

NIGHTLY = {
    "schedule_id": "nightly",
    "function": ADD,
    "arguments": [1, 2],
    "cron": "30 2 * * *",
    "timezone": "Europe/Prague",
}


@pytest.fixture(autouse=True)
def deployed():
    return helpers.deploy_components()


def create(api, **fields):
    response = api.post("/schedules", {**NIGHTLY, **fields})
    assert response.status_code == 201, response.content[:500]
    return response.json()


def audit_of(schedule_id: str) -> list[tuple[str, str, str]]:
    return list(
        AuditEntry.objects.filter(execution_id=f"schedule:{schedule_id}")
        .order_by("id")
        .values_list("action", "actor", "via")
    )


def put(api, schedule_id: str, body: dict):
    return api.client.put(
        f"/api/v1/schedules/{schedule_id}", json.dumps(body), content_type="application/json", **api.headers
    )


def delete(api, schedule_id: str):
    return api.client.delete(f"/api/v1/schedules/{schedule_id}", **api.headers)


# -- creating ------------------------------------------------------------------------------


def test_create_answers_201_with_the_next_five_fire_times_and_is_audited_as_the_caller(api):
    created = create(api)
    assert created["schedule_id"] == "nightly" and created["function"] == ADD and created["paused"] is False
    times = [datetime.fromisoformat(t) for t in created["next_fire_times"]]
    assert len(times) == 5 and times == sorted(times)
    assert all(t.astimezone(schedules.store.spec_of(Schedule.objects.get())._zone).hour == 2 for t in times)
    assert audit_of("nightly") == [("schedule_create", "ada", "api")]


def test_creating_an_existing_id_is_a_409_json_error_and_changes_nothing(api):
    create(api)
    before = database_state()
    assert_error(api.post("/schedules", {**NIGHTLY, "cron": "* * * * *"}), 409, "conflict")
    assert database_state() == before
    assert Schedule.objects.get().cron == "30 2 * * *"


BAD_INPUT = {
    "cron": ({"cron": "61 * * * *"}, "cron"),
    "cron-fields": ({"cron": "* * *"}, "cron"),
    "timezone": ({"timezone": "Mars/Olympus_Mons"}, "timezone"),
    "interval-zero": ({"cron": "", "interval_seconds": 0}, "interval_seconds"),
    "interval-negative": ({"cron": "", "interval_seconds": -5}, "interval_seconds"),
    "no-spec": ({"cron": ""}, "cron"),
    "target": ({"function": "test:acts/basic.no_such_function"}, "ffqn"),
    "arguments": ({"arguments": ["one", "two", "three"]}, "arguments"),
    "schedule-id": ({"schedule_id": "night ly"}, "schedule_id"),
    "start-year-1": ({"start_at": "0001-01-01T00:00:00+14:00"}, "start_at"),
    "end-before-start": ({"start_at": "2030-01-02T00:00:00Z", "end_at": "2030-01-01T00:00:00Z"}, "end_at"),
}


@pytest.mark.parametrize("case", BAD_INPUT, ids=list(BAD_INPUT))
def test_an_invalid_schedule_is_a_400_naming_the_field_and_nothing_is_created(api, case):
    fields, field = BAD_INPUT[case]
    before = database_state()
    body = assert_error(api.post("/schedules", {**NIGHTLY, **fields}), 400, "invalid_schedule")
    assert body["field"] == field and body["message"].startswith(f"{field}: ")
    assert database_state() == before
    assert not Schedule.objects.exists()


def test_an_unknown_overlap_policy_or_field_is_a_422_naming_it(api):
    body = assert_error(api.post("/schedules", {**NIGHTLY, "overlap": "sometimes"}), 422, "validation_failed")
    assert body["message"].startswith("body.overlap")
    body = assert_error(api.post("/schedules", {**NIGHTLY, "crn": "* * * * *"}), 422, "validation_failed")
    assert "crn" in body["message"]
    assert not Schedule.objects.exists()


# -- reading -------------------------------------------------------------------------------


def test_the_list_shows_every_schedule_with_its_next_five_fire_times(api):
    create(api)
    create(api, schedule_id="often", cron="", interval_seconds=10)
    items = api.get("/schedules").json()["items"]
    assert [item["schedule_id"] for item in items] == ["nightly", "often"]
    often = [datetime.fromisoformat(t) for t in items[1]["next_fire_times"]]
    assert [b - a for a, b in zip(often, often[1:], strict=False)] == [timedelta(seconds=10)] * 4


def test_a_schedule_shows_its_last_ticks_with_their_actions_and_execution_ids(api):
    create(api, schedule_id="often", cron="", interval_seconds=1, catchup_window_seconds=5)
    triggered = api.post("/schedules/often/trigger").json()["execution_id"]
    schedules.fire_due(now=datetime.now(UTC) + timedelta(seconds=2))  # the running trigger: skip
    detail = api.get("/schedules/often").json()
    ticks = detail["ticks"]
    assert [t["action"] for t in ticks][-1] == "started"
    assert ticks[-1]["execution_id"] == triggered and ticks[-1]["manual"] == "trigger"
    assert {t["action"] for t in ticks[:-1]} <= {"skipped", "missed"} and ticks[:-1]
    assert all(t["execution_id"] is None for t in ticks[:-1])
    assert detail["running_execution_id"] == triggered


def test_an_unknown_schedule_is_404_and_a_malformed_id_400(api):
    assert_error(api.get("/schedules/nope"), 404, "not_found")
    assert_error(api.get("/schedules/a%00b"), 400, "invalid_schedule")
    assert_error(api.post("/schedules/a%00b/pause"), 400, "invalid_schedule")


# -- changing ------------------------------------------------------------------------------


def test_put_replaces_the_spec_and_says_whether_anything_changed(api):
    create(api)
    body = {key: value for key, value in NIGHTLY.items() if key != "schedule_id"}
    response = put(api, "nightly", {**body, "cron": "0 3 * * *"})
    assert response.status_code == 200, response.content
    assert response.json()["outcome"] == "changed" and Schedule.objects.get().cron == "0 3 * * *"
    assert put(api, "nightly", {**body, "cron": "0 3 * * *"}).json()["outcome"] == "unchanged"
    assert_error(put(api, "nightly", {**body, "timezone": "Nowhere/Land"}), 400, "invalid_schedule")
    assert Schedule.objects.get().timezone == "Europe/Prague"
    assert_error(put(api, "other", body), 404, "not_found")
    assert [a for a, _, _ in audit_of("nightly")] == ["schedule_create", "schedule_update", "schedule_update"]


def test_pause_stops_the_fire_times_with_the_reason_and_resume_brings_them_back(api):
    create(api)
    paused = api.post("/schedules/nightly/pause", {"reason": "maintenance"})
    assert paused.status_code == 200, paused.content
    assert paused.json()["paused"] is True and paused.json()["pause_reason"] == "maintenance"
    assert paused.json()["next_fire_times"] == []
    resumed = api.post("/schedules/nightly/resume").json()
    assert resumed["paused"] is False and len(resumed["next_fire_times"]) == 5
    assert api.post("/schedules/nightly/pause").json()["pause_reason"] == "paused by an operator"
    assert [a for a, _, _ in audit_of("nightly")] == [
        "schedule_create",
        "schedule_pause",
        "schedule_resume",
        "schedule_pause",
    ]


def test_trigger_starts_one_execution_now_with_the_schedule_in_its_metadata(api):
    create(api, paused=True)
    response = api.post("/schedules/nightly/trigger")
    assert response.status_code == 201, response.content
    execution_id = response.json()["execution_id"]
    assert store.get_created(execution_id).metadata["obelisk.schedule"] == "nightly"
    assert audit_of("nightly")[-1] == ("schedule_trigger", "ada", "api")


def test_backfill_creates_each_missing_tick_once(api):
    create(api, cron="", interval_seconds=3600, start_at="2026-01-01T00:00:00Z")
    window = {"start": "2026-01-01T00:00:00Z", "end": "2026-01-01T05:00:00Z"}
    first = api.post("/schedules/nightly/backfill", window)
    assert first.status_code == 200, first.content
    executions = {t["execution_id"] for t in first.json()["ticks"]}
    assert len(executions) == 6 and ExecutionState.objects.count() == 6
    again = api.post("/schedules/nightly/backfill", window)
    assert {t["execution_id"] for t in again.json()["ticks"]} == executions
    assert ExecutionState.objects.count() == 6
    assert_error(
        api.post("/schedules/nightly/backfill", {"start": window["end"], "end": window["start"]}),
        400,
        "validation_failed",
    )


def test_delete_removes_the_schedule_and_an_unknown_one_is_404_writing_nothing(api):
    create(api)
    response = delete(api, "nightly")
    assert response.status_code == 204, response.content
    assert not Schedule.objects.exists()
    before = database_state()
    assert_error(delete(api, "nightly"), 404, "not_found")
    assert database_state() == before
    assert [a for a, _, _ in audit_of("nightly")] == ["schedule_create", "schedule_delete"]


# -- who may -------------------------------------------------------------------------------


def test_reading_needs_the_view_permission_and_acting_the_act_permission(api):
    create(api)
    viewer = api_for(make_user("vera", VIEW))
    assert viewer.get("/schedules").status_code == 200
    assert viewer.get("/schedules/nightly").status_code == 200
    before = database_state()
    assert_error(viewer.post("/schedules", {**NIGHTLY, "schedule_id": "x"}), 403, "forbidden")
    for action in ("pause", "resume", "trigger"):
        assert_error(viewer.post(f"/schedules/nightly/{action}"), 403, "forbidden")
    assert_error(delete(viewer, "nightly"), 403, "forbidden")
    assert database_state() == before
    assert_error(Api().get("/schedules"), 401, "unauthenticated")


# -- schemathesis over the schedules' operations ------------------------------------------

SCHEDULE_OPERATIONS = [op.ok() for op in SCHEMA.get_all_operations() if op.ok().path.startswith("/api/v1/schedules")]


def test_every_schedule_route_is_in_the_served_document():
    assert {(op.method.upper(), op.path) for op in SCHEDULE_OPERATIONS} == {
        ("GET", "/api/v1/schedules"),
        ("POST", "/api/v1/schedules"),
        ("GET", "/api/v1/schedules/{schedule_id}"),
        ("PUT", "/api/v1/schedules/{schedule_id}"),
        ("DELETE", "/api/v1/schedules/{schedule_id}"),
        ("POST", "/api/v1/schedules/{schedule_id}/pause"),
        ("POST", "/api/v1/schedules/{schedule_id}/resume"),
        ("POST", "/api/v1/schedules/{schedule_id}/trigger"),
        ("POST", "/api/v1/schedules/{schedule_id}/backfill"),
    }


valid_bodies = st.fixed_dictionaries(
    {"schedule_id": st.sampled_from(["a", "b.c", "d:e-f_g"]), "function": st.just(ADD), "arguments": st.just([1, 2])},
    optional={
        "cron": st.sampled_from(["* * * * *", "0 2 * * *", "*/5 * * * * 30", "61 * * * *", "", "L * * * *"]),
        "interval_seconds": st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.integers(-5, 10**6)),
        "timezone": st.sampled_from(["UTC", "Europe/Prague", "Mars/Base", "", "../etc"]),
        "jitter_seconds": st.floats(allow_nan=False, allow_infinity=False),
        "catchup_window_seconds": st.floats(allow_nan=False, allow_infinity=False),
        "overlap": st.sampled_from(["skip", "buffer_one", "buffer_all", "allow_all", "cancel_other"]),
        "start_at": st.datetimes(timezones=st.timezones()).map(datetime.isoformat),
        "end_at": st.datetimes(timezones=st.timezones()).map(datetime.isoformat),
        "paused": st.booleans(),
    },
)


@FUZZ
@given(body=valid_bodies)
def test_any_create_near_the_edges_is_201_or_a_refusal_that_wrote_nothing(api, body):
    """Specs near the edges (year 1 and 9999, any zone and offset, huge or negative
    numbers): a created schedule is readable with its fire times; a refusal (400
    ``invalid_schedule``, or 422 for a time offset of seconds) is JSON and wrote nothing."""
    Schedule.store_objects.all().delete()
    before = database_state()
    response = api.post("/schedules", body)
    assert response.status_code in (201, 400, 422), (response.status_code, response.content[:500])
    if response.status_code != 201:
        assert error_body(response.content)["code"] in ("invalid_schedule", "validation_failed")
        after = database_state()
        assert after == before, describe_difference(before, after)
        return
    assert api.get("/schedules").status_code == 200
    assert api.get(f"/schedules/{body['schedule_id']}").status_code == 200


@pytest.fixture
def known_schedule(api) -> str:
    schedules.create(schedules.ScheduleRequest("known", ADD, [1, 2], interval_seconds=60))
    return "known"


@pytest.mark.parametrize(
    ("label", "mode"),
    [
        pytest.param(op.label, mode, id=f"{op.label}-{mode.value}")
        for op in SCHEDULE_OPERATIONS
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE)
    ],
)
def test_every_schedule_operation_answers_as_documented_and_a_refusal_writes_nothing(label, mode, api, known_schedule):
    operation = SCHEMA.find_operation_by_label(label)
    headers = {"Authorization": api.headers["HTTP_AUTHORIZATION"]}
    strategy = operation.as_strategy(generation_mode=mode)
    if operation.path_parameters and mode is schemathesis.GenerationMode.POSITIVE:
        strategy = st.one_of(
            strategy,
            operation.as_strategy(generation_mode=mode, path_parameters={"schedule_id": known_schedule}),
        )

    with in_process_wsgi() as app:

        @settings(FUZZ, max_examples=30)
        @given(case=strategy)
        def check(case):
            before = database_state()
            response = case.call(app=app, headers=headers)
            if 400 <= response.status_code < 500:
                error_body(response.content)
                after = database_state()
                assert after == before, describe_difference(before, after)
            case.validate_response(response, checks=CHECKS, headers=headers)

        check()
