"""The API as an HTTP client meets it (issue 36, item 13): every answer under ``/api/`` is
the API's JSON error or a route's JSON, whatever the path, method or framing.

- A malformed deployment id (a NUL, which PostgreSQL cannot compare) is 400 ``invalid_id``,
  never a 500.
- An unknown path under ``/api/``, a POST to one (no HTML CSRF page), or one with a newline
  is a JSON 404.
- HEAD answers like GET without a body on every GET route (load balancers send HEAD).
- A chunked body (``Transfer-Encoding: chunked``, no ``Content-Length``) is read where the
  server hands it over whole (gunicorn sets ``wsgi.input_terminated``), under the same size
  limit, and refused with 411 where it cannot be read (never read as empty).

The framing and the raw request lines go through a real server over a socket (pytest-django's
``live_server``, Django's threaded WSGI server, and gunicorn when installed).
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from django.db import connection
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from executions import client as engine
from executions import errors
from executions.ids import (
    DEPLOYMENT_ID_PATTERN,
    EXECUTION_ID_PATTERN,
    TOP_LEVEL_ID_PATTERN,
    ExecutionId,
    parse_deployment_id,
)
from obelisk_api.api import api as ninja_api
from tests.support import helpers
from tests.support.api import ADD, Api, api_for, assert_error, everything, finish, make_user, submitted
from tests.support.clusters import current_database_url

pytestmark = pytest.mark.django_db
BASE_DIR = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def deployed():
    return helpers.deploy_components()


# ---------------------------------------------------------------------------------------
# Malformed deployment ids
# ---------------------------------------------------------------------------------------

MALFORMED_DEPLOYMENT_IDS = ["", "\x00", "Dep_\x00", "x\x00", "Dep_nope", "dep_01JAAAAAAAAAAAAAAAAAAAAAAA"]


@pytest.mark.parametrize("bad", MALFORMED_DEPLOYMENT_IDS)
def test_a_malformed_deployment_id_is_400_invalid_id_on_every_route(api, bad):
    assert_error(api.get("/functions", {"deployment_id": bad}), 400, "invalid_id")
    by_path = api.get("/deployments/" + bad.replace("\x00", "%00"))
    if bad:
        assert_error(by_path, 400, "invalid_id")
    else:  # `/deployments/` is no route
        assert_error(by_path, 404, "not_found")


def test_a_well_formed_unknown_deployment_id_is_404(api):
    unknown = "Dep_01JAAAAAAAAAAAAAAAAAAAAAAA"
    assert_error(api.get("/functions", {"deployment_id": unknown}), 404, "unknown_deployment")
    assert_error(api.get(f"/deployments/{unknown}"), 404, "unknown_deployment")


@pytest.mark.parametrize("bad", MALFORMED_DEPLOYMENT_IDS)
def test_the_python_client_refuses_a_malformed_deployment_id_with_invalid_id(bad):
    before = everything()
    with pytest.raises(errors.InvalidId):
        engine.submit(ADD, [1, 2], deployment_id=bad)
    assert everything() == before


# ---------------------------------------------------------------------------------------
# Unknown paths and methods: JSON, never Django's HTML pages
# ---------------------------------------------------------------------------------------

UNKNOWN_PATHS = ["/api/v1/nope", "/api/nope", "/api/v1/x%0Ay", "/api/x%0A", "/api/v1/executions%0A", "/api/v2/"]


@pytest.mark.parametrize("path", UNKNOWN_PATHS)
@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "DELETE"])
def test_an_unknown_api_path_is_a_json_404_for_every_method_even_with_csrf_checks(path, method, operator):
    session = Client(enforce_csrf_checks=True)
    session.force_login(operator)  # a session's unsafe request is where Django's CSRF page came from
    for client in (Client(enforce_csrf_checks=True), session):
        response = client.generic(method, path)
        assert_error(response, 404, "not_found")


def test_a_session_post_to_the_api_root_without_a_csrf_token_is_a_json_error(operator):
    session = Client(enforce_csrf_checks=True)
    session.force_login(operator)
    response = session.post("/api/")
    assert response.status_code in (403, 405), response.status_code
    assert response["Content-Type"].startswith("application/json"), response.content[:200]
    assert response.json()["code"] in ("csrf_failed", "method_not_allowed")


def test_an_error_django_answers_before_any_view_is_json_under_the_api_and_html_elsewhere():
    """A request for a host not in ``ALLOWED_HOSTS`` is refused by Django's middleware with
    its 400 page, before any URL is resolved (``JsonErrorsMiddleware``)."""
    refused = Client(HTTP_HOST="not-allowed.example").get("/api/v1/health")
    assert_error(refused, 400, "bad_request")
    outside = Client(HTTP_HOST="not-allowed.example").get("/admin/")
    assert outside.status_code == 400 and outside["Content-Type"].startswith("text/html")


# ---------------------------------------------------------------------------------------
# HEAD
# ---------------------------------------------------------------------------------------


def get_routes(values: dict) -> list[str]:
    """Every path of the API's URL conf that answers GET, parameters filled in."""
    from tests.support.api import concrete, route_paths

    paths = [concrete(route, values) for route in route_paths() if route not in ("", "docs")]
    return [
        path
        for path in paths
        if not path.endswith(
            (
                "/cancel",
                "/pause",
                "/resume",
                "/retry",
                "/run-now",
                "/stub",
                "/activate",
                "/upgrade",
                "/trigger",
                "/backfill",
            )
        )
    ]


def test_head_answers_like_get_without_a_body_on_every_get_route(api, deployed):
    pending, finished = submitted(), submitted()
    finish(finished)  # a wait on it returns at once
    from executions import schedules

    schedules.create(schedules.ScheduleRequest("nightly", "test:acts/basic.add", [1, 2], cron="0 2 * * *"))
    values = {"execution_id": finished, "deployment_id": deployed, "schedule_id": "nightly"}
    checked = 0
    for path in get_routes(values):
        got = api.request("GET", path)
        head = api.request("HEAD", path)
        assert head.status_code == got.status_code == 200, (path, head.status_code, got.status_code)
        assert head["Content-Type"] == got["Content-Type"], path
        assert head.content == b"", path
        checked += 1
    assert checked == 15  # 13 reads, /health and /openapi.json
    assert api.request("HEAD", f"/api/v1/executions/{pending}").status_code == 200


def test_head_keeps_the_gets_authentication_and_errors(deployed):
    stranger = api_for(make_user("stranger"))
    assert Api().request("HEAD", "/api/v1/executions").status_code == 401
    assert stranger.request("HEAD", "/api/v1/executions").status_code == 403
    assert Client().head("/api/v1/health").status_code == 200


def test_a_method_not_allowed_lists_head_with_get(api):
    response = api.request("DELETE", "/api/v1/health")
    assert_error(response, 405, "method_not_allowed")
    assert {"GET", "HEAD"} <= {m.strip() for m in response["Allow"].split(",")}


# ---------------------------------------------------------------------------------------
# Through a real server: raw request lines, HEAD and chunked bodies
# ---------------------------------------------------------------------------------------


def raw_request(url: str, method: str, path: str, headers: dict | None = None, body: bytes | None = None):
    """One request over a socket, exactly as given (``http.client`` leaves the path alone);
    ``body`` as an iterable of chunks is sent chunked."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        connection.putrequest(method, path, skip_accept_encoding=True)
        for name, value in (headers or {}).items():
            connection.putheader(name, value)
        connection.endheaders()
        if body is not None:
            connection.send(body)
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def chunked(data: bytes, size: int = 7) -> bytes:
    pieces = [data[i : i + size] for i in range(0, len(data), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces) + b"0\r\n\r\n"


def submit_chunked(url: str, token: str, body: bytes):
    headers = {
        "Authorization": f"Bearer {token}",
        "Content-Type": "application/json",
        "Transfer-Encoding": "chunked",
        "Connection": "close",
    }
    return raw_request(url, "POST", "/api/v1/executions", headers, chunked(body))


@pytest.mark.django_db(transaction=True)
def test_a_real_server_answers_json_for_unknown_paths_a_newline_and_an_unknown_post(live_server):
    for method, path in [("GET", "/api/v1/x%0Ay"), ("GET", "/api/x%0A"), ("POST", "/api/v1/nope"), ("POST", "/api/n")]:
        status, headers, content = raw_request(live_server.url, method, path, {"Content-Length": "0"})
        assert status == 404, (method, path, status, content[:200])
        assert headers["Content-Type"].startswith("application/json"), (method, path, content[:200])
        assert json.loads(content)["code"] == "not_found"


@pytest.mark.django_db(transaction=True)
def test_a_real_server_answers_head_on_health_without_a_body(live_server):
    get_status, get_headers, get_content = raw_request(live_server.url, "GET", "/api/v1/health")
    status, headers, content = raw_request(live_server.url, "HEAD", "/api/v1/health")
    assert (status, get_status) == (200, 200)
    assert content == b""
    assert headers["Content-Type"] == get_headers["Content-Type"] == "application/json; charset=utf-8"
    assert json.loads(get_content)["status"] == "ok"


@pytest.mark.django_db(transaction=True)
def test_a_chunked_body_that_the_server_cannot_hand_over_is_411_not_read_as_empty(live_server, operator):
    """Django's own server passes a chunked body on undecoded, without ``Content-Length``:
    the API refuses it as such instead of validating an empty body (422)."""
    token = api_for(operator).headers["HTTP_AUTHORIZATION"].split()[1]
    before = everything()
    status, headers, content = submit_chunked(
        live_server.url, token, json.dumps({"function": ADD, "arguments": [1, 2]}).encode()
    )
    assert status == 411, (status, content[:300])
    assert headers["Content-Type"].startswith("application/json")
    assert json.loads(content)["code"] == "length_required"
    assert everything() == before


def test_a_terminated_chunked_body_is_read_and_held_to_the_payload_limit(api, settings):
    """What gunicorn hands over for a chunked body: no ``Content-Length``, the decoded body
    as ``wsgi.input``, and ``wsgi.input_terminated`` (the PEP 3333 extension) set."""
    import io

    def chunked_post(data: bytes):
        environ = {"CONTENT_LENGTH": "", "HTTP_TRANSFER_ENCODING": "chunked", "wsgi.input_terminated": True}
        environ["wsgi.input"] = io.BytesIO(data)
        return api.post("/executions", raw=b"", **environ)

    response = chunked_post(json.dumps({"function": ADD, "arguments": [1, 2]}).encode())
    assert response.status_code == 201, response.content
    settings.OBELISK = {**settings.OBELISK, "MAX_PAYLOAD_BYTES": 1000}
    before = everything()
    big = json.dumps({"function": ADD, "arguments": [1, 2], "pad": "x" * 5000}).encode()
    assert_error(chunked_post(big), 413, "payload_too_large")
    assert everything() == before


# ---------------------------------------------------------------------------------------
# Behind gunicorn
# ---------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def gunicorn_server(tmp_path):
    if importlib.util.find_spec("gunicorn") is None:
        pytest.skip("gunicorn is not installed (requirements.txt pins it)")
    port = free_port()
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="obelisk_site.settings",
        OBELISK_COMPONENT_MODULES="tests.support.components",
        DATABASE_URL=current_database_url(),
        PYTHONUNBUFFERED="1",
    )
    log = open(tmp_path / "gunicorn.log", "wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "--bind", f"127.0.0.1:{port}", "--workers", "1", "obelisk_site.wsgi"],
        cwd=BASE_DIR,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if raw_request(url, "GET", "/api/v1/health")[0] in (200, 503):
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    pytest.fail((tmp_path / "gunicorn.log").read_text()[-3000:])
                time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=20)
        log.close()


@pytest.mark.django_db(transaction=True)
def test_behind_gunicorn_a_chunked_submit_is_read_and_head_answers(gunicorn_server, operator):
    token = api_for(operator).headers["HTTP_AUTHORIZATION"].split()[1]
    status, _, content = submit_chunked(
        gunicorn_server, token, json.dumps({"function": ADD, "arguments": [1, 2]}).encode()
    )
    assert status == 201, content[:300]
    execution_id = json.loads(content)["execution_id"]
    assert Api(token).get(f"/executions/{execution_id}").json()["params"] == [1, 2]
    before = everything()
    too_big = json.dumps({"function": ADD, "arguments": [1, 2], "pad": "x" * (1024 * 1024 + 1)}).encode()
    status, _, content = submit_chunked(gunicorn_server, token, too_big)
    assert (status, json.loads(content)["code"]) == (413, "payload_too_large")
    assert everything() == before
    status, headers, content = raw_request(gunicorn_server, "HEAD", "/api/v1/health")
    assert (status, content) == (200, b"") and headers["Content-Type"].startswith("application/json")


# ---------------------------------------------------------------------------------------
# The OpenAPI document: the statuses each route answers, the ids' patterns
# ---------------------------------------------------------------------------------------

SIGNED_IN = {401, 403, 503}  # no or bad credentials, no permission, the database unreachable
POSTED = {400, 411, 413}  # a POST's framing: Content-Length, a chunked body, the size limit
BY_ID = {400, 404}  # the id in the path malformed (`invalid_id`) or unknown
DOCUMENTED = {
    ("get", "/api/v1/schedules"): {200} | SIGNED_IN,
    ("post", "/api/v1/schedules"): {201, 409, 422} | POSTED | SIGNED_IN,
    ("get", "/api/v1/schedules/{schedule_id}"): {200} | BY_ID | SIGNED_IN,
    ("put", "/api/v1/schedules/{schedule_id}"): {200, 422} | BY_ID | POSTED | SIGNED_IN,
    ("delete", "/api/v1/schedules/{schedule_id}"): {204} | BY_ID | SIGNED_IN,
    ("post", "/api/v1/schedules/{schedule_id}/pause"): {200, 422} | BY_ID | POSTED | SIGNED_IN,
    ("post", "/api/v1/schedules/{schedule_id}/resume"): {200} | BY_ID | POSTED | SIGNED_IN,
    ("post", "/api/v1/schedules/{schedule_id}/trigger"): {201} | BY_ID | POSTED | SIGNED_IN,
    ("post", "/api/v1/schedules/{schedule_id}/backfill"): {200, 422} | BY_ID | POSTED | SIGNED_IN,
    ("get", "/api/v1/executions"): {200, 400, 422} | SIGNED_IN,
    ("post", "/api/v1/executions"): {200, 201, 404, 409, 422} | POSTED | SIGNED_IN,
    ("get", "/api/v1/executions/{execution_id}"): {200} | BY_ID | SIGNED_IN,
    ("get", "/api/v1/executions/{execution_id}/history"): {200, 422} | BY_ID | SIGNED_IN,
    ("get", "/api/v1/executions/{execution_id}/export"): {200} | BY_ID | SIGNED_IN,
    ("get", "/api/v1/executions/{execution_id}/responses"): {200, 422} | BY_ID | SIGNED_IN,
    ("get", "/api/v1/executions/{execution_id}/logs"): {200, 422} | BY_ID | SIGNED_IN,
    ("get", "/api/v1/executions/{execution_id}/wait"): {200, 422, 429} | BY_ID | SIGNED_IN,
    ("get", "/api/v1/executions/{execution_id}/audit"): {200, 422} | BY_ID | SIGNED_IN,
    ("post", "/api/v1/executions/{execution_id}/cancel"): {200} | BY_ID | POSTED | SIGNED_IN,
    ("post", "/api/v1/executions/{execution_id}/pause"): {200, 409} | BY_ID | POSTED | SIGNED_IN,
    ("post", "/api/v1/executions/{execution_id}/resume"): {200, 409} | BY_ID | POSTED | SIGNED_IN,
    ("post", "/api/v1/executions/{execution_id}/retry"): {201, 409} | BY_ID | POSTED | SIGNED_IN,
    ("post", "/api/v1/executions/{execution_id}/run-now"): {200, 409} | BY_ID | POSTED | SIGNED_IN,
    ("post", "/api/v1/executions/{execution_id}/stub"): {200, 409, 422} | BY_ID | POSTED | SIGNED_IN,
    ("get", "/api/v1/functions"): {200, 400, 404} | SIGNED_IN,
    ("get", "/api/v1/deployments"): {200, 422} | SIGNED_IN,
    ("get", "/api/v1/deployments/{deployment_id}"): {200} | BY_ID | SIGNED_IN,
    ("post", "/api/v1/deployments"): {200, 201, 422} | POSTED | SIGNED_IN,
    ("post", "/api/v1/deployments/{deployment_id}/activate"): {200} | BY_ID | POSTED | SIGNED_IN,
    ("post", "/api/v1/deployments/{deployment_id}/upgrade"): {200, 409, 422} | BY_ID | POSTED | SIGNED_IN,
    ("get", "/api/v1/health"): {200, 503},
}


def served_schema() -> dict:
    return ninja_api.get_openapi_schema(path_prefix="/api/")


def test_each_operation_documents_the_statuses_it_answers_and_no_others():
    """Not every 4xx on every route: a generated client reads these to know what to handle.
    Each status here is answered by a test (this file, tests/api/test_api.py, test_api_fuzz.py)."""
    documented = {
        (method, path): {int(code) for code in operation["responses"]}
        for path, operations in served_schema()["paths"].items()
        for method, operation in operations.items()
    }
    assert documented == DOCUMENTED


@pytest.mark.django_db(transaction=True)
def test_a_read_route_is_503_with_a_json_body_when_the_database_is_unreachable(operator):
    token = api_for(operator).headers["HTTP_AUTHORIZATION"]
    settings_dict = connection.settings_dict
    saved = dict(settings_dict)
    connection.close()
    if connection.vendor == "postgresql":
        settings_dict.update(HOST="127.0.0.1", PORT="1")
    else:
        settings_dict["NAME"] = "/nonexistent-directory/obelisk.sqlite3"
    try:
        responses = [
            Client().get(path, HTTP_AUTHORIZATION=token) for path in ("/api/v1/executions", "/api/v1/functions")
        ]
    finally:
        connection.close()
        settings_dict.clear()
        settings_dict.update(saved)
    for response in responses:
        assert_error(response, 503, "database_unavailable")


def ecma(pattern: str) -> str:
    """JSON Schema's ``$`` (ECMA-262, no multiline) is the end of the text; Python's also
    matches before a final newline."""
    assert pattern.startswith("^") and pattern.endswith("$")
    return pattern[:-1] + r"\Z"


def parses(parser, text: str) -> bool:
    try:
        parser(text)
    except errors.InvalidId:
        return False
    return True


def pattern_of(schema: dict) -> str | None:
    """The ``pattern`` of a string schema, or of its string branch when it may be null."""
    branches = schema.get("anyOf", [schema])
    return next((branch["pattern"] for branch in branches if "pattern" in branch), None)


def test_every_id_in_the_document_carries_its_pattern():
    schema = served_schema()
    expected = {
        "execution_id": EXECUTION_ID_PATTERN,
        "parent": EXECUTION_ID_PATTERN,
        "deployment_id": DEPLOYMENT_ID_PATTERN,
    }
    seen = set()
    for operations in schema["paths"].values():
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                if parameter["name"] in expected:
                    seen.add(parameter["name"])
                    assert pattern_of(parameter["schema"]) == expected[parameter["name"]], parameter
    assert seen == set(expected)
    components = schema["components"]["schemas"]
    assert pattern_of(components["SubmitIn"]["properties"]["execution_id"]) == TOP_LEVEL_ID_PATTERN
    assert pattern_of(components["ExecutionSummary"]["properties"]["execution_id"]) == EXECUTION_ID_PATTERN
    assert pattern_of(components["ExecutionOut"]["properties"]["parent_id"]) == EXECUTION_ID_PATTERN
    assert pattern_of(components["DeploymentOut"]["properties"]["deployment_id"]) == DEPLOYMENT_ID_PATTERN


ID_SAMPLES = [
    "E_01JAAAAAAAAAAAAAAAAAAAAAAA",
    "E_01JAAAAAAAAAAAAAAAAAAAAAAA.n:js_1",
    "E_01JAAAAAAAAAAAAAAAAAAAAAAA.o:a_b/c-d_12.g:x_3",
    "E_01JAAAAAAAAAAAAAAAAAAAAAAA.n:js_0",
    "E_01JAAAAAAAAAAAAAAAAAAAAAAA.n:js_01",
    "E_01JAAAAAAAAAAAAAAAAAAAAAAA.x:js_1",
    "E_01JAAAAAAAAAAAAAAAAAAAAAAA.n:_1",
    "E_01JAAAAAAAAAAAAAAAAAAAAAAA.n:js",
    "E_81JAAAAAAAAAAAAAAAAAAAAAAA",
    "E_01JAAAAAAAAAAAAAAAAAAAAAAA\n",
    "E_01jaaaaaaaaaaaaaaaaaaaaaaa",
    "E_nope",
    "Dep_01JAAAAAAAAAAAAAAAAAAAAAAA",
]


@pytest.mark.parametrize("text", ID_SAMPLES)
def test_the_id_patterns_accept_exactly_what_the_parsers_accept(text):
    assert bool(re.search(ecma(EXECUTION_ID_PATTERN), text)) == parses(ExecutionId.parse, text)
    top_level = parses(ExecutionId.parse, text) and ExecutionId.parse(text).is_top_level
    assert bool(re.search(ecma(TOP_LEVEL_ID_PATTERN), text)) == top_level
    assert bool(re.search(ecma(DEPLOYMENT_ID_PATTERN), text)) == parses(parse_deployment_id, text)


@settings(max_examples=200, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.from_regex(ecma(EXECUTION_ID_PATTERN)))
def test_every_text_the_execution_id_pattern_describes_parses(text):
    assert str(ExecutionId.parse(text)) == text
