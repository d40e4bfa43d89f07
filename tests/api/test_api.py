"""The REST API (``obelisk_api``) against the real URL conf, views and database.

Each test names the guarantee it holds: what a client gets (status, JSON body with a
stable ``code``), what it may do (401 without credentials, 403 without the permission),
and what a refused request leaves behind (nothing: the tables and the audit trail are
exactly as before).
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.middleware.csrf import _get_new_csrf_string
from django.test import Client
from django.utils import timezone

from executions import client as engine
from executions import store
from executions.events import Err, ExecutionFailure, Ok
from executions.ids import ExecutionId, new_run_id
from obelisk_api import tokens
from obelisk_api.models import ApiToken
from tests.support import helpers
from tests.support.api import (
    ADD,
    NOOP,
    VIEW,
    Api,
    api_for,
    assert_error,
    concrete,
    everything,
    finish,
    make_user,
    route_paths,
    submitted,
)

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def deployed():
    return helpers.deploy_components()


@pytest.fixture
def reader() -> Api:
    return api_for(make_user("reader", VIEW))


@pytest.fixture
def stranger() -> Api:
    return api_for(make_user("stranger"))


# ---------------------------------------------------------------------------------------
# Submit
# ---------------------------------------------------------------------------------------


def test_submit_is_201_then_200_for_the_same_call_and_409_for_another(api):
    execution_id = str(ExecutionId.generate())
    call = {"function": ADD, "arguments": [1, 2], "execution_id": execution_id}
    first = api.post("/executions", call)
    assert first.status_code == 201, first.content
    assert first.json() == {"execution_id": execution_id, "created": True, "retry_of": None}
    again = api.post("/executions", call)
    assert again.status_code == 200
    assert again.json()["created"] is False
    before = everything()
    other = api.post("/executions", {**call, "arguments": [2, 2]})
    assert_error(other, 409, "conflict")
    assert everything() == before


def test_submit_takes_arguments_by_name_a_schedule_and_paused(api):
    at = timezone.now() + timedelta(hours=1)
    response = api.post(
        "/executions", {"function": ADD, "arguments": {"a": 4, "b": 5}, "scheduled_at": at.isoformat(), "paused": True}
    )
    assert response.status_code == 201, response.content
    detail = api.get(f"/executions/{response.json()['execution_id']}").json()
    assert detail["params"] == [4, 5]
    assert detail["outcome"] == "paused"
    assert datetime.fromisoformat(detail["scheduled_at"]) == at.replace(microsecond=at.microsecond // 1000 * 1000)


def test_submit_is_audited_with_the_callers_username_via_api(api):
    execution_id = api.submit()
    (entry,) = api.get(f"/executions/{execution_id}/audit").json()["entries"]
    assert (entry["actor"], entry["via"], entry["action"]) == ("ada", "api", "submit")
    assert entry["detail"]["created"] is True


REFUSED_BODIES = {
    "malformed_json": (b'{"function": ', 400, "malformed_json"),
    "not_utf8": (b'{"function": "\xff"}', 400, "malformed_json"),
    "nul_character": (b'{"function": "test:acts/basic.add", "arguments": ["a\\u0000"]}', 400, "unsupported_value"),
    "lone_surrogate": (b'{"function": "test:acts/basic.add", "arguments": ["\\ud800"]}', 400, "unsupported_value"),
    "deep_nesting": (b'{"function": "x", "arguments": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400, None),
    "nesting_past_the_limit": (b'{"function": "x", "arguments": ' + b"[" * 70 + b"]" * 70 + b"}", 400, None),
    "huge_integer": (b'{"function": "test:acts/basic.add", "arguments": [1, ' + b"9" * 5000 + b"]}", 400, None),
    "nan": (b'{"function": "test:acts/basic.add", "arguments": [1, NaN]}', 400, "malformed_json"),
    "infinity_by_exponent": (b'{"function": "test:acts/basic.add", "arguments": [1, 1e400]}', 400, None),
    "not_an_object": (b"[1, 2]", 422, "validation_failed"),
    "empty_body": (b"", 422, "validation_failed"),
    "unknown_field": (b'{"function": "test:acts/basic.add", "arguments": [1, 2], "pasued": true}', 422, None),
    "paused_as_text": (b'{"function": "test:acts/basic.add", "arguments": [1, 2], "paused": "no"}', 422, None),
    "naive_schedule": (
        b'{"function": "test:acts/basic.add", "arguments": [1, 2], "scheduled_at": "2030-01-01T00:00:00"}',
        422,
        "validation_failed",
    ),
    "wrong_argument_type": (b'{"function": "test:acts/basic.add", "arguments": [1, "x"]}', 400, "validation_failed"),
    "too_few_arguments": (b'{"function": "test:acts/basic.add", "arguments": [1]}', 400, "validation_failed"),
    "unknown_function": (b'{"function": "test:acts/basic.nope", "arguments": []}', 404, "unknown_function"),
    "malformed_function": (b'{"function": "no colon", "arguments": []}', 400, None),
    "child_id": (
        b'{"function": "test:acts/basic.noop", "arguments": [], "execution_id": "E_01JAAAAAAAAAAAAAAAAAAAAAAA.n:js_1"}',
        400,
        "invalid_id",
    ),
    "huge_id": (
        b'{"function": "test:acts/basic.noop", "arguments": [], "execution_id": "E_' + b"A" * 100_000 + b'"}',
        400,
        "invalid_id",
    ),
}


@pytest.mark.parametrize("case", REFUSED_BODIES, ids=list(REFUSED_BODIES))
def test_a_rejected_submit_changes_nothing(api, case):
    raw, status, code = REFUSED_BODIES[case]
    before = everything()
    response = api.post("/executions", raw=raw)
    assert response.status_code == status, (case, response.status_code, response.content[:300])
    body = response.json()
    assert set(body) >= {"code", "message"} and body["message"], body
    if code:
        assert body["code"] == code, body
    assert "Traceback" not in response.content.decode()
    assert everything() == before


def test_a_body_larger_than_the_payload_limit_is_413_before_it_is_parsed(api, settings):
    settings.OBELISK = {**settings.OBELISK, "MAX_PAYLOAD_BYTES": 1000}
    before = everything()
    big = {"function": ADD, "arguments": [1, 2], "execution_id": None, "pad": "x" * 2000}
    assert_error(api.post("/executions", big), 413, "payload_too_large")
    # announced larger than it is: refused on Content-Length alone, before the body is read
    lying = api.post("/executions", {"function": ADD, "arguments": [1, 2]}, CONTENT_LENGTH="5000")
    assert_error(lying, 413, "payload_too_large")
    assert everything() == before


def test_validation_errors_keep_their_details(api):
    body = assert_error(api.post("/executions", {"function": ADD}), 422, "validation_failed")
    assert {"loc": ["body", "arguments"], "msg": "Field required", "type": "missing"} in body["details"]


# ---------------------------------------------------------------------------------------
# Reading one execution
# ---------------------------------------------------------------------------------------


def test_get_shows_state_outcome_result_timestamps_and_attempts(api):
    execution_id = api.submit(ADD, [1, 2])
    pending = api.get(f"/executions/{execution_id}").json()
    assert (pending["outcome"], pending["finished"], pending["result"], pending["attempts"]) == (
        "pending",
        False,
        None,
        0,
    )
    finish(execution_id, Ok(3))
    done = api.get(f"/executions/{execution_id}").json()
    assert done["outcome"] == "ok" and done["finished"] is True and done["state"] == "finished"
    assert done["result"] == {"ok": 3}
    assert done["attempts"] == 1
    assert done["ffqn"] == ADD and done["params"] == [1, 2]
    assert done["parent_id"] is None and done["children"] == []
    assert done["component_digest"].startswith("sha256:")
    assert done["deployment_id"].startswith("Dep_")
    assert datetime.fromisoformat(done["finished_at"]) >= datetime.fromisoformat(done["created_at"])
    assert {"updated_at", "scheduled_at", "first_scheduled_at", "version", "metadata", "retry_of"} <= set(done)


@pytest.mark.parametrize(
    ("retval", "outcome", "shape"),
    [
        (Err({"code": "x"}), "error", {"err": {"code": "x"}}),
        (
            ExecutionFailure("timed_out", "too slow"),
            "timed_out",
            {"execution_failure": {"kind": "timed_out", "reason": "too slow"}},
        ),
    ],
)
def test_results_keep_obelisks_shape(api, retval, outcome, shape):
    execution_id = submitted()
    finish(execution_id, retval)
    detail = api.get(f"/executions/{execution_id}").json()
    assert (detail["outcome"], detail["result"]) == (outcome, shape)


def test_a_parent_lists_its_children_and_a_child_names_its_parent(api):
    parent = helpers.create_workflow()
    _, child, _ = helpers.block_on_child(parent, helpers.lock(parent))
    assert api.get(f"/executions/{parent}").json()["children"] == [child]
    detail = api.get(f"/executions/{child}").json()
    assert detail["parent_id"] == parent and detail["is_top_level"] is False


def test_an_unknown_execution_is_404_and_a_malformed_id_400(api):
    assert_error(api.get(f"/executions/{ExecutionId.generate()}"), 404, "not_found")
    assert_error(api.get("/executions/E_nope"), 400, "invalid_id")
    assert_error(api.get("/executions/" + "E_" + "A" * 5000), 400, "invalid_id")


# ---------------------------------------------------------------------------------------
# Listing
# ---------------------------------------------------------------------------------------


def ids_of(response) -> list[str]:
    assert response.status_code == 200, response.content
    return [item["execution_id"] for item in response.json()["items"]]


def test_list_filters_by_function_outcome_status_and_creation_time(api):
    ok = submitted(ADD)
    # The API shows times to the millisecond: ``failed`` must be created in a later
    # millisecond than ``ok`` for "created after failed's time" to leave ``ok`` out (the
    # failure seen once on SQLite in CI: both in one millisecond).
    time.sleep(0.002)
    failed, pending = submitted(NOOP, []), submitted(ADD)
    finish(ok, Ok(3))
    finish(failed, ExecutionFailure("uncategorized", "boom"))
    assert set(ids_of(api.get("/executions", {"function": "test:acts/basic.a"}))) == {ok, pending}
    assert ids_of(api.get("/executions", {"outcome": "ok"})) == [ok]
    assert ids_of(api.get("/executions", {"outcome": "failed"})) == [failed]
    assert set(ids_of(api.get("/executions", {"outcome": ["ok", "pending"]}))) == {ok, pending}
    assert ids_of(api.get("/executions", {"status": "finished_failure"})) == [failed]
    created = datetime.fromisoformat(api.get(f"/executions/{failed}").json()["created_at"])
    after = ids_of(api.get("/executions", {"created_after": created.isoformat()}))
    stored = {e: api.get(f"/executions/{e}").json()["created_at"] for e in (ok, failed, pending)}
    assert failed in after and ok not in after, (created.isoformat(), stored)
    assert ok in ids_of(api.get("/executions", {"created_before": created.isoformat()}))


def test_list_shows_children_only_when_asked(api):
    parent = helpers.create_workflow()
    _, child, _ = helpers.block_on_child(parent, helpers.lock(parent))
    assert ids_of(api.get("/executions")) == [parent]
    assert set(ids_of(api.get("/executions", {"top_level_only": "false"}))) == {parent, child}
    assert ids_of(api.get("/executions", {"parent": parent})) == [child]


@pytest.mark.parametrize(
    ("params", "status", "code"),
    [
        ({"status": "bogus"}, 400, "validation_failed"),
        ({"outcome": "bogus"}, 400, "validation_failed"),
        ({"limit": 0}, 422, "validation_failed"),
        ({"limit": 1001}, 422, "validation_failed"),
        ({"older_than": "not a cursor"}, 400, "validation_failed"),
        ({"older_than": "x", "newer_than": "y"}, 400, "validation_failed"),
        ({"created_after": "2030-01-01T00:00:00"}, 400, "validation_failed"),
        ({"created_after": "yesterday"}, 422, "validation_failed"),
        ({"function": "a\x00b"}, 400, "unsupported_value"),
        ({"parent": "E_bad"}, 400, "invalid_id"),
    ],
)
def test_bad_list_filters_are_refused_with_a_code(api, params, status, code):
    assert_error(api.get("/executions", params), status, code)


def test_cursors_neither_repeat_nor_skip_rows_while_executions_are_created(api):
    """Keyset cursors on ``(created_at, id)``: executions created between page fetches are
    newer than every page already handed out, so walking older pages sees each old
    execution exactly once; ``prev_cursor`` leads back to the page before."""
    old = {helpers.create() for _ in range(23)}
    seen, pages, cursor = [], [], None
    while True:
        params = {"limit": 5, **({"older_than": cursor} if cursor else {})}
        page = api.get("/executions", params).json()
        pages.append(page)
        seen.extend(item["execution_id"] for item in page["items"])
        for _ in range(3):  # concurrent submitters
            helpers.create()
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert len(seen) == len(set(seen)), "a row was repeated"
    assert set(seen) == old, "a row was skipped (or a new one slipped into an old page)"
    assert len(pages) == 5 and pages[0]["prev_cursor"] is None
    back = api.get("/executions", {"limit": 5, "newer_than": pages[2]["prev_cursor"]}).json()
    assert [item["execution_id"] for item in back["items"]] == [item["execution_id"] for item in pages[1]["items"]]


# ---------------------------------------------------------------------------------------
# History, responses, logs
# ---------------------------------------------------------------------------------------


def test_history_pages_through_every_event_as_json(api):
    execution_id = submitted()
    engine.pause(execution_id)
    engine.resume(execution_id)
    first = api.get(f"/executions/{execution_id}/history", {"limit": 2}).json()
    assert [e["variant"] for e in first["events"]] == ["created", "paused"]
    assert first["events"][0]["data"]["params"] == [1, 2] and first["events"][1]["data"] is None
    assert (first["max_version"], first["next_from_version"]) == (2, 2)
    rest = api.get(f"/executions/{execution_id}/history", {"from_version": 2}).json()
    assert [e["variant"] for e in rest["events"]] == ["unpaused"] and rest["next_from_version"] is None
    assert_error(api.get(f"/executions/{ExecutionId.generate()}/history"), 404, "not_found")
    assert_error(api.get(f"/executions/{execution_id}/history", {"from_version": -1}), 422, "validation_failed")
    assert_error(api.get(f"/executions/{execution_id}/history", {"from_version": 10**30}), 422, "validation_failed")


def test_responses_show_a_childs_result_to_its_parent(api):
    parent = helpers.create_workflow()
    _, child, _ = helpers.block_on_child(parent, helpers.lock(parent))
    store.upsert_stub_response(child, Ok("child done"))
    page = api.get(f"/executions/{parent}/responses").json()
    (response,) = page["responses"]
    assert response["child_execution_id"] == child and response["child_result"] == {"ok": "child done"}
    assert page["max_seq"] == response["seq"] and page["next_after_seq"] is None
    assert api.get(f"/executions/{parent}/responses", {"after_seq": response["seq"]}).json()["responses"] == []
    assert_error(api.get(f"/executions/{ExecutionId.generate()}/responses"), 404, "not_found")


def test_logs_page_through_records_and_stream_bytes_as_text(api):
    execution_id = submitted()
    run_id, now = new_run_id(), timezone.now()
    store.append_logs(execution_id, run_id, entries=[(now, 3, "hello")], streams=[(now, 1, b"out \xff\n")])
    page = api.get(f"/executions/{execution_id}/logs", {"limit": 1}).json()
    (record,) = page["logs"]
    assert (record["level"], record["message"], record["run_id"]) == ("info", "hello", run_id)
    rest = api.get(f"/executions/{execution_id}/logs", {"after_id": page["next_after_id"]}).json()
    assert rest["logs"][0]["stream"] == "stdout" and rest["logs"][0]["text"] == "out \ufffd\n"
    assert_error(api.get(f"/executions/{ExecutionId.generate()}/logs"), 404, "not_found")


# ---------------------------------------------------------------------------------------
# Waiting
# ---------------------------------------------------------------------------------------


def test_wait_that_times_out_is_200_with_finished_false(api):
    execution_id = submitted()
    started = time.monotonic()
    response = api.get(f"/executions/{execution_id}/wait", {"timeout": 0.3})
    assert response.status_code == 200
    assert response.json() == {"execution_id": execution_id, "finished": False, "outcome": None, "result": None}
    assert time.monotonic() - started >= 0.3


def test_wait_refuses_unknown_executions_and_long_timeouts(api):
    assert_error(api.get(f"/executions/{ExecutionId.generate()}/wait", {"timeout": 0}), 404, "not_found")
    assert_error(api.get(f"/executions/{submitted()}/wait", {"timeout": 61}), 422, "validation_failed")
    assert_error(api.get(f"/executions/{submitted()}/wait", {"timeout": "nan"}), 422, "validation_failed")


@pytest.mark.django_db(transaction=True)
def test_wait_returns_when_a_worker_finishes_the_execution(operator):
    api = api_for(operator)
    execution_id = submitted()

    def worker() -> None:
        time.sleep(0.3)
        finish(execution_id, Ok(3))
        connection.close()

    thread = threading.Thread(target=worker)
    thread.start()
    try:
        started = time.monotonic()
        response = api.get(f"/executions/{execution_id}/wait", {"timeout": 30})
    finally:
        thread.join()
    assert response.json() == {"execution_id": execution_id, "finished": True, "outcome": "ok", "result": {"ok": 3}}
    assert time.monotonic() - started < 10


# ---------------------------------------------------------------------------------------
# Actions
# ---------------------------------------------------------------------------------------


def audit_actions(execution_id: str) -> list[tuple[str, str, str]]:
    return [(e.action, e.actor, e.via) for e in reversed(engine.audit_trail(execution_id))]


def test_pause_resume_and_cancel_are_audited(api):
    execution_id = submitted()
    paused = api.post(f"/executions/{execution_id}/pause")
    assert paused.status_code == 200 and paused.json()["next_version"] == 2
    assert api.get(f"/executions/{execution_id}").json()["outcome"] == "paused"
    assert api.post(f"/executions/{execution_id}/resume").json()["next_version"] == 3
    assert api.post(f"/executions/{execution_id}/cancel").json()["outcome"] == "cancellation_requested"
    assert audit_actions(execution_id) == [("pause", "ada", "api"), ("resume", "ada", "api"), ("cancel", "ada", "api")]


def test_a_submitting_request_hands_its_trace_to_the_execution(api):
    """The W3C ``traceparent`` of the request becomes the execution's, so the worker's span
    of each attempt joins the caller's trace; a malformed one is ignored, not an error."""
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    traced = api.post("/executions", {"function": ADD, "arguments": [1, 2]}, HTTP_TRACEPARENT=traceparent)
    assert traced.status_code == 201, traced.content
    assert engine.get(traced.json()["execution_id"]).metadata == {"traceparent": traceparent}
    junk = api.post("/executions", {"function": ADD, "arguments": [1, 2]}, HTTP_TRACEPARENT="00-nonsense")
    assert junk.status_code == 201 and engine.get(junk.json()["execution_id"]).metadata == {}


def test_run_now_makes_a_scheduled_execution_due_and_refuses_a_running_one(api):
    later = (timezone.now() + timedelta(hours=1)).isoformat()
    created = api.post("/executions", {"function": ADD, "arguments": [1, 2], "scheduled_at": later})
    execution_id = created.json()["execution_id"]
    assert api.get(f"/executions/{execution_id}").json()["outcome"] == "scheduled"
    assert api.post(f"/executions/{execution_id}/run-now").status_code == 200
    assert api.get(f"/executions/{execution_id}").json()["outcome"] == "pending"
    assert audit_actions(execution_id)[-1] == ("run_now", "ada", "api")
    running = submitted()
    helpers.lock(running)
    before = everything()
    assert_error(api.post(f"/executions/{running}/run-now"), 409, "illegal_state")
    assert everything() == before


def test_actions_in_the_wrong_state_are_409_and_change_nothing(api):
    finished, paused = submitted(), submitted()
    finish(finished)
    engine.pause(paused)
    before = everything()
    assert_error(api.post(f"/executions/{finished}/pause"), 409, "already_finished")
    assert_error(api.post(f"/executions/{paused}/pause"), 409, "illegal_state")
    assert_error(api.post(f"/executions/{paused}/retry"), 409, "illegal_state")
    assert everything() == before


def test_actions_on_unknown_or_malformed_ids_are_404_and_400(api):
    unknown = str(ExecutionId.generate())
    for action in ("cancel", "pause", "resume", "retry"):
        assert_error(api.post(f"/executions/{unknown}/{action}"), 404, "not_found")
        assert_error(api.post(f"/executions/E_x/{action}"), 400, "invalid_id")


def test_retry_creates_a_new_execution_linked_to_the_old_one(api):
    old = api.submit(ADD, [1, 2])
    finish(old, ExecutionFailure("uncategorized", "boom"))
    response = api.post(f"/executions/{old}/retry")
    assert response.status_code == 201, response.content
    new = response.json()["execution_id"]
    assert response.json() == {"execution_id": new, "created": True, "retry_of": old}
    detail = api.get(f"/executions/{new}").json()
    assert detail["retry_of"] == old and detail["params"] == [1, 2] and detail["outcome"] == "pending"
    (entry,) = [e for e in engine.audit_trail(old) if e.action == "retry"]
    assert entry.detail["new_execution_id"] == new and entry.actor == "ada"


def test_stub_supplies_a_childs_result_once(api):
    parent = helpers.create_workflow()
    _, child, _ = helpers.block_on_child(parent, helpers.lock(parent))
    first = api.post(f"/executions/{child}/stub", {"value": {"n": 1}})
    assert first.json() == {"execution_id": child, "written": True}
    assert api.post(f"/executions/{child}/stub", {"value": {"n": 1}}).json()["written"] is False
    before = everything()
    assert_error(api.post(f"/executions/{child}/stub", {"value": 2, "error": True}), 409, "stub_conflict")
    assert_error(api.post(f"/executions/{parent}/stub", {"value": 1}), 400, "validation_failed")
    assert_error(api.post(f"/executions/{child}/stub", {"error": True}), 422, "validation_failed")
    assert_error(api.post(f"/executions/{child}/stub", raw=b'{"value": "\\u0000"}'), 400, "unsupported_value")
    assert everything() == before
    assert api.get(f"/executions/{child}").json()["result"] == {"ok": {"n": 1}}


def test_audit_of_an_unknown_execution_is_404(api):
    assert_error(api.get(f"/executions/{ExecutionId.generate()}/audit"), 404, "not_found")
    assert api.get(f"/executions/{submitted()}/audit").json()["entries"] == []


# ---------------------------------------------------------------------------------------
# Catalog and health
# ---------------------------------------------------------------------------------------


def test_functions_come_with_their_schemas(api, deployed):
    functions = {f["ffqn"]: f for f in api.get("/functions").json()}
    assert functions[ADD]["parameters"] == [
        {"name": "a", "schema": {"type": "integer"}},
        {"name": "b", "schema": {"type": "integer"}},
    ]
    assert functions[ADD]["deployment_id"] == deployed
    assert_error(api.get("/functions", {"deployment_id": "Dep_01JAAAAAAAAAAAAAAAAAAAAAAA"}), 404, "unknown_deployment")
    assert_error(api.get("/functions", {"deployment_id": "Dep_nope"}), 400, "invalid_id")


def test_deployments_list_and_detail(api, deployed):
    assert [d["deployment_id"] for d in api.get("/deployments").json()] == [deployed]
    detail = api.get(f"/deployments/{deployed}").json()
    assert detail["status"] == "active"
    assert "tests.support.components" in [component["name"] for component in detail["components"]]
    assert_error(api.get("/deployments/Dep_01JAAAAAAAAAAAAAAAAAAAAAAA"), 404, "unknown_deployment")
    assert_error(api.get("/deployments/Dep_nope"), 400, "invalid_id")


def test_health_is_open_and_counts_the_backlog_of_due_executions():
    submitted()
    engine.submit(ADD, [1, 2], scheduled_at=timezone.now() + timedelta(hours=1))
    store.record_heartbeat(
        "cluster-1", hostname="h", pid=1, started_at=timezone.now(), processes=2, running=0,
        functions=[ADD], deployment_id="Dep_x",
    )  # fmt: skip
    response = Client().get("/api/v1/health")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "database": True, "backlog": 1, "clusters_alive": 1, "clusters_known": 1}
    assert sum(store.backlog().values()) == 1


@pytest.mark.django_db(transaction=True)
def test_health_is_503_with_a_json_body_when_the_database_is_unreachable():
    """A real unreachable database: the connection is pointed at a port (PostgreSQL) or a
    path (SQLite) where none is, then put back."""
    settings_dict = connection.settings_dict
    saved = dict(settings_dict)
    connection.close()
    if connection.vendor == "postgresql":
        settings_dict.update(HOST="127.0.0.1", PORT="1")
    else:
        settings_dict["NAME"] = "/nonexistent-directory/obelisk.sqlite3"
    try:
        response = Client().get("/api/v1/health")
    finally:
        connection.close()
        settings_dict.clear()
        settings_dict.update(saved)
    assert_error(response, 503, "database_unavailable")


# ---------------------------------------------------------------------------------------
# Authentication and permissions
# ---------------------------------------------------------------------------------------


def test_no_credentials_is_401_and_no_permission_403(reader, stranger):
    execution_id = submitted()
    assert_error(Api().get(f"/executions/{execution_id}"), 401, "unauthenticated")
    assert_error(Api("not-a-token").get(f"/executions/{execution_id}"), 401, "unauthenticated")
    assert_error(stranger.get(f"/executions/{execution_id}"), 403, "forbidden")
    assert reader.get(f"/executions/{execution_id}").status_code == 200
    before = everything()
    assert_error(reader.post(f"/executions/{execution_id}/cancel"), 403, "forbidden")
    assert_error(reader.post("/executions", {"function": ADD, "arguments": [1, 2]}), 403, "forbidden")
    assert everything() == before


def test_a_revoked_token_or_an_inactive_user_no_longer_authenticates(operator):
    issued = tokens.issue(operator.username, "ci")
    api = Api(issued.token)
    assert api.get("/executions").status_code == 200
    assert ApiToken.objects.get(pk=issued.record.pk).last_used_at is not None
    tokens.revoke(issued.record.prefix)
    assert_error(api.get("/executions"), 401, "unauthenticated")
    other = Api(tokens.issue(operator.username).token)
    operator.is_active = False
    operator.save()
    assert_error(other.get("/executions"), 401, "unauthenticated")


def test_tokens_are_stored_as_hashes_only(operator):
    issued = tokens.issue(operator.username)
    record = ApiToken.objects.get(pk=issued.record.pk)
    assert issued.token not in {record.token_hash, record.prefix, record.name}
    assert record.token_hash == tokens.digest(issued.token) and record.prefix == issued.token[:8]


def test_a_session_reads_and_acts_with_a_csrf_token_only(operator):
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    session = Api(client=client)
    assert session.get("/executions").status_code == 200
    before = everything()
    body = {"function": ADD, "arguments": [1, 2]}
    assert_error(session.post("/executions", body), 403, "csrf_failed")
    assert everything() == before
    secret = _get_new_csrf_string()
    client.cookies["csrftoken"] = secret
    assert session.post("/executions", body, HTTP_X_CSRFTOKEN=secret).status_code == 201


def test_anonymous_unsafe_requests_are_401_not_a_csrf_error():
    assert_error(Api(client=Client(enforce_csrf_checks=True)).post("/executions", {}), 401, "unauthenticated")


def test_every_route_needs_credentials_and_the_permission_except_health(stranger, deployed):
    """Walks the URL conf itself, so a route added later without auth fails here."""
    values = {"execution_id": submitted(), "deployment_id": deployed, "schedule_id": "nightly"}
    anonymous = Api()
    checked = 0
    for route in route_paths():
        path = concrete(route, values)
        for method in ("GET", "POST"):
            if route in ("docs", "openapi.json", ""):
                response = anonymous.request(method, path)
                assert response.status_code in (302, 405), (method, path, response.status_code)
                continue
            response = anonymous.request(method, path)
            if route == "v1/health":
                assert response.status_code in (200, 405), (method, path)
                continue
            assert response.status_code in (401, 405), (method, path, response.status_code)
            if response.status_code == 401:
                checked += 1
                assert_error(response, 401, "unauthenticated")
                assert_error(stranger.request(method, path), 403, "forbidden")
    assert checked == 28  # 12 reads, 16 actions: a route lost from the URL conf shows here too


def test_the_docs_need_a_staff_session_or_a_token(api, operator):
    assert Client().get("/api/docs").status_code == 302
    assert Client().get("/api/openapi.json").status_code == 302
    schema = api.request("GET", "/api/openapi.json").json()
    assert "/api/v1/executions/{execution_id}/wait" in schema["paths"]
    operator.is_staff = True
    operator.save()
    staff = Client()
    staff.force_login(operator)
    assert staff.get("/api/docs").status_code == 200


def test_unknown_routes_and_methods_answer_in_json(api):
    assert_error(api.get("/nope"), 404, "not_found")
    response = api.request("DELETE", "/api/v1/executions")
    assert_error(response, 405, "method_not_allowed")
    assert "POST" in response["Allow"]


# ---------------------------------------------------------------------------------------
# The obelisk_token command
# ---------------------------------------------------------------------------------------


def test_a_token_whose_random_text_starts_with_a_dash_is_drawn_again_so_its_prefix_can_be_revoked(
    operator, capsys, monkeypatch
):
    """One token in 64 drawn by ``token_urlsafe`` starts with ``-``; its prefix then read as
    an option to ``obelisk_token revoke`` (a CI run failed so). Such a draw is drawn again."""
    draws = iter(["-" + "a" * 42, "b" * 43])
    monkeypatch.setattr(tokens.secrets, "token_urlsafe", lambda n: next(draws))
    call_command("obelisk_token", "create", "ada")
    token = capsys.readouterr().out.strip()
    assert token == "b" * 43
    call_command("obelisk_token", "revoke", token[: tokens.PREFIX_CHARS])
    assert ApiToken.objects.get(prefix=token[: tokens.PREFIX_CHARS]).revoked_at is not None


def test_the_token_command_creates_lists_and_revokes(operator, capsys):
    call_command("obelisk_token", "create", "ada", "--name", "ci")
    token = capsys.readouterr().out.strip()
    assert Api(token).get("/executions").status_code == 200
    call_command("obelisk_token", "list", "ada")
    listing = capsys.readouterr().out
    assert token[:8] in listing and "ci" in listing and token not in listing
    call_command("obelisk_token", "revoke", token[:8])
    assert "revoked" in capsys.readouterr().out
    assert Api(token).get("/executions").status_code == 401


def test_an_empty_parent_filter_is_refused_not_read_as_no_filter(api):
    """``?parent=`` names no execution; answering every execution would be a wrong answer
    to a malformed request (schemathesis found it)."""
    assert_error(api.get("/executions?parent="), 400, "invalid_id")


def test_a_single_valued_query_parameter_given_twice_is_refused(api):
    """``?created_after=false&created_after=0.0``: Django keeps the last value; the API
    says the request is malformed instead (schemathesis found it)."""
    assert_error(api.get("/executions?created_after=false&created_after=0.0"), 422, "validation_failed")
    assert api.get("/executions?status=pending&status=finished").status_code == 200  # a list takes many
