"""The REST API under generated input: whatever a client sends, the answer is never a 5xx,
every refusal is the API's JSON error (``{"code", "message"}``), and a refused request
writes nothing (every engine table keeps its row count, the execution tables and the
audit trail keep every row).

Two kinds of generator:

- schemathesis reads the OpenAPI document the API serves and generates requests for every
  operation, valid ones and invalid ones; its checks compare each answer with that
  document (status codes, content types, body schemas).
- plain Hypothesis aims at the submit and list endpoints with what a schema does not
  describe: arbitrary JSON arguments, hostile text (NUL, lone surrogates as JSON escapes,
  bidi marks), raw bodies that are not JSON or nest 100,000 deep, integers of 5,000
  digits, bodies past the payload limit, wrong content types, NUL in query strings.

Examples are derandomized and bounded, so a run is the same run in CI every time.
"""

from __future__ import annotations

import base64
import json
from datetime import datetime, timedelta, timezone
from urllib.parse import quote

import pytest
import schemathesis
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from executions import client as engine
from executions.events import ExecutionFailure, Ok
from executions.ids import ExecutionId
from executions.models import ExecutionState
from obelisk_api.api import api as ninja_api
from tests.support import helpers
from tests.support.api import ADD, finish, submitted
from tests.support.fuzz import (
    any_text,
    ascii_words,
    database_state,
    describe_difference,
    error_body,
    execution_ids,
    function_names,
    hostile_text,
    in_process_wsgi,
    json_values,
    storable_text,
    valid_execution_ids,
)

pytestmark = pytest.mark.django_db

GREET = "test:acts/basic.greet"
NOOP = "test:acts/basic.noop"

# One Hypothesis profile for every test here: stable in CI (derandomized, no example
# database), no deadline (a database call's time is not a property), and fixtures shared
# by the examples of one test (each example measures its own before/after).
FUZZ = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
)


@pytest.fixture(autouse=True)
def deployed():
    return helpers.deploy_components()


def assert_refusal_or_success(response, before) -> None:
    """The common property: no 5xx; a 4xx is the JSON error and wrote nothing."""
    status = response.status_code
    assert status < 500, (status, response.content[:500])
    if 400 <= status < 500:
        assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
        error_body(response.content)
        after = database_state()
        assert after == before, describe_difference(before, after)


# ---------------------------------------------------------------------------------------
# schemathesis: every operation of the served OpenAPI document
# ---------------------------------------------------------------------------------------


def documented_schema() -> dict:
    """The OpenAPI document as ``/api/openapi.json`` serves it (paths under ``/api/``)."""
    return json.loads(json.dumps(ninja_api.get_openapi_schema(path_prefix="/api/")))


SCHEMA = schemathesis.openapi.from_dict(documented_schema())
OPERATIONS = [result.ok() for result in SCHEMA.get_all_operations()]
CHECKS = [
    not_a_server_error,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
    status_code_conformance,
]


def has_input(operation) -> bool:
    """Whether anything of the request can be made invalid (health takes nothing)."""
    return any(
        len(parameters)
        for parameters in (operation.path_parameters, operation.query, operation.headers, operation.body)
    )


FUZZED = [
    pytest.param(operation.label, mode, id=f"{operation.label}-{mode.value}")
    for operation in OPERATIONS
    for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE)
    if mode is schemathesis.GenerationMode.POSITIVE or has_input(operation)
]


def test_the_fuzzed_schema_is_the_one_the_api_serves(api):
    """The generators below read ``documented_schema()``; it must be what a client gets."""
    served = api.request("GET", "/api/openapi.json")
    assert served.status_code == 200
    assert served.json() == documented_schema()
    assert {operation.path for operation in OPERATIONS} == set(documented_schema()["paths"])


def documented_statuses(method: str, path: str) -> set[int]:
    return {int(code) for code in documented_schema()["paths"][path][method]["responses"]}


@pytest.mark.parametrize(
    ("method", "path", "request_path", "body", "code"),
    [
        ("get", "/api/v1/executions", "/api/v1/executions?limit=0", None, "validation_failed"),
        ("post", "/api/v1/executions", "/api/v1/executions", b'{"function": "x"}', "validation_failed"),
        ("post", "/api/v1/executions", "/api/v1/executions", b" " * (1024 * 1024 + 1), "payload_too_large"),
        ("get", "/api/v1/deployments", "/api/v1/deployments?limit=x", None, "validation_failed"),
        (
            "get",
            "/api/v1/executions/{execution_id}/history",
            "/api/v1/executions/E_x/history?from_version=-1",
            None,
            "validation_failed",
        ),
    ],
    ids=["list-422", "submit-422", "submit-413", "deployments-422", "history-422"],
)
def test_every_4xx_status_the_api_answers_is_documented(api, method, path, request_path, body, code):
    """A client generated from the OpenAPI document knows the error statuses it lists;
    the API's own 422 (validation_failed) and 413 (payload_too_large) must be among them."""
    if body is None:
        response = api.client.get(request_path, **api.headers)
    else:
        response = api.client.generic("POST", request_path, body, content_type="application/json", **api.headers)
    assert error_body(response.content)["code"] == code
    documented = documented_statuses(method, path)
    assert response.status_code in documented, (
        f"{method.upper()} {request_path} answers {response.status_code} ({code}); documented: {sorted(documented)}"
    )


@pytest.fixture
def known(deployed) -> dict[str, list[str]]:
    """Existing executions in several states, so generated requests reach past the id check:
    pending, paused, finished ok, failed (retryable), a blocked workflow and its child
    (stubbable). Waiting uses finished ones only: a pending one would block a whole timeout."""
    pending, paused, ok, failed = submitted(), submitted(), submitted(), submitted()
    engine.pause(paused)
    finish(ok, Ok(3))
    finish(failed, ExecutionFailure("uncategorized", "boom"))
    parent = helpers.create_workflow()
    _, child, _ = helpers.block_on_child(parent, helpers.lock(parent))
    from executions import schedules

    schedules.create(schedules.ScheduleRequest("known", "test:acts/basic.add", [1, 2], interval_seconds=60))
    return {
        "execution_id": [pending, paused, ok, failed, parent, child],
        "finished": [ok, failed],
        "deployment_id": [deployed],
        "schedule_id": ["known"],
    }


def strategy_for(operation, mode, known: dict[str, list[str]]):
    """Generated cases, and (valid mode) the same with a path parameter that names an
    existing execution or deployment: a generated id is almost never one."""
    generated = operation.as_strategy(generation_mode=mode)
    names = {parameter.name for parameter in operation.path_parameters}
    if mode is not schemathesis.GenerationMode.POSITIVE or not names:
        return generated
    (name,) = names
    values = known["finished"] if operation.path.endswith("/wait") else known[name]
    existing = [operation.as_strategy(generation_mode=mode, path_parameters={name: value}) for value in values]
    return st.one_of(generated, *existing)


@pytest.mark.parametrize(("label", "mode"), FUZZED)
def test_every_operation_answers_as_documented_and_a_refusal_writes_nothing(label, mode, api, operator, known):
    """For each operation, valid and invalid requests: never a 5xx, status codes, content
    types and bodies as the document says, invalid input refused with a 4xx, and every 4xx
    a JSON error that left every table as it was."""
    operation = SCHEMA.find_operation_by_label(label)
    headers = {"Authorization": api.headers["HTTP_AUTHORIZATION"]}
    strategy = strategy_for(operation, mode, known)

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


# ---------------------------------------------------------------------------------------
# Submit: arbitrary calls
# ---------------------------------------------------------------------------------------

arguments = st.one_of(
    st.lists(json_values, max_size=4),
    st.dictionaries(any_text, json_values, max_size=4),
    json_values,
)
submit_bodies = st.fixed_dictionaries(
    {"function": function_names, "arguments": arguments},
    optional={
        "execution_id": st.one_of(st.none(), execution_ids),
        "paused": st.one_of(st.booleans(), json_values),
        "scheduled_at": st.one_of(
            st.datetimes(timezones=st.timezones()).map(datetime.isoformat),
            st.datetimes().map(datetime.isoformat),
            any_text,
        ),
        "metadata": json_values,
    },
)


@FUZZ
@given(body=submit_bodies, ascii_only=st.booleans())
@example(body={"function": ADD, "arguments": [2**63, -(2**63) - 1]}, ascii_only=True)
@example(body={"function": ADD, "arguments": {"a": 1, "b": 2, "\x00": 3}}, ascii_only=False)
@example(
    body={"function": ADD, "arguments": [1, 2], "execution_id": "E_01JAAAAAAAAAAAAAAAAAAAAAAA\x00"}, ascii_only=True
)
def test_any_submit_is_answered_without_a_server_error_and_a_refusal_writes_nothing(api, body, ascii_only):
    """Arbitrary JSON arguments, function names, execution ids, schedules and extra fields,
    sent as ASCII-escaped or raw UTF-8 JSON: a 2xx created at most one execution, a 4xx
    is the JSON error and wrote nothing."""
    before = database_state()
    states = ExecutionState.objects.count()
    response = api.post("/executions", raw=json.dumps(body, ensure_ascii=ascii_only).encode())
    assert_refusal_or_success(response, before)
    if response.status_code == 201:
        assert ExecutionState.objects.count() == states + 1
        assert response.json()["created"] is True
    elif response.status_code == 200:
        assert ExecutionState.objects.count() == states
        assert response.json()["created"] is False


# ---------------------------------------------------------------------------------------
# Submit: valid calls are stored canonically, once
# ---------------------------------------------------------------------------------------

big_ints = st.one_of(st.integers(), st.integers(min_value=-(10**40), max_value=10**40))
add_calls = st.tuples(big_ints, big_ints).flatmap(
    lambda ab: st.sampled_from(
        [
            (ADD, list(ab), list(ab)),
            (ADD, {"a": ab[0], "b": ab[1]}, list(ab)),
            (ADD, {"b": ab[1], "a": ab[0]}, list(ab)),
        ]
    )
)
greet_calls = st.builds(
    lambda name, greeting, times, by_name: (
        GREET,
        (
            {"name": name, **({} if greeting is None else {"greeting": greeting})}
            if by_name
            else [name, *([] if greeting is None else [greeting])]
        ),
        [name, "Hello" if greeting is None else greeting, 1],
    ),
    storable_text,
    st.one_of(st.none(), storable_text),
    st.just(1),
    st.booleans(),
)
valid_calls = st.one_of(add_calls, greet_calls, st.just((NOOP, [], [])), st.just((NOOP, {}, [])))


def other_call(function: str, canonical: list) -> list | None:
    """A different valid call of the same function (None for one without parameters)."""
    if function == ADD:
        return [canonical[0] + 1, canonical[1]]
    if function == GREET:
        return [canonical[0] + "!", canonical[1], canonical[2]]
    return None


@FUZZ
@given(call=valid_calls, with_id=st.booleans())
def test_a_valid_call_is_stored_once_as_its_canonical_arguments_and_resubmitting_is_idempotent(api, call, with_id):
    """A valid call (positional or by name, defaults omitted) creates exactly one execution
    whose stored params are the positional arguments with defaults filled in. Under an
    execution id, the same call again (even spelled positionally) is 200 with that
    execution and no new one; a different call under that id is 409 and writes nothing."""
    function, arguments, canonical = call
    # A fresh id per example: reusing one across examples would test conflicts by accident.
    execution_id = str(ExecutionId.generate()) if with_id else None
    body = {"function": function, "arguments": arguments, **({"execution_id": execution_id} if with_id else {})}
    states = ExecutionState.objects.count()
    response = api.post("/executions", body)
    assert response.status_code == 201, response.content[:500]
    created = response.json()["execution_id"]
    assert execution_id in (None, created)
    assert ExecutionState.objects.count() == states + 1
    assert engine.get(created).params == canonical
    assert api.get(f"/executions/{created}").json()["params"] == canonical
    if not with_id:
        return
    for again in (body, {**body, "arguments": canonical}):
        before = database_state()[0]
        repeated = api.post("/executions", again)
        assert repeated.status_code == 200, repeated.content[:500]
        assert repeated.json()["execution_id"] == created and repeated.json()["created"] is False
        assert {k: v for k, v in database_state()[0].items() if k != "t_audit"} == {
            k: v for k, v in before.items() if k != "t_audit"
        }
    different = other_call(function, canonical)
    if different is not None:
        before = database_state()
        conflict = api.post("/executions", {**body, "arguments": different})
        assert conflict.status_code == 409, conflict.content[:500]
        assert error_body(conflict.content)["code"] == "conflict"
        assert database_state() == before


@FUZZ
@given(name=hostile_text, greeting=st.one_of(st.none(), hostile_text))
def test_text_arguments_are_stored_exactly_or_refused_when_they_hold_a_nul(api, name, greeting):
    """Text reaches the database as it was sent (unicode, quotes, backslashes, bidi marks),
    except a NUL, which neither database can hold the same way: 400 unsupported_value."""
    arguments = [name] if greeting is None else [name, greeting]
    before = database_state()
    response = api.post("/executions", {"function": GREET, "arguments": arguments})
    assert_refusal_or_success(response, before)
    if any("\x00" in text for text in arguments):
        assert response.status_code == 400 and response.json()["code"] == "unsupported_value", response.content
    else:
        assert response.status_code == 201, response.content
        stored = engine.get(response.json()["execution_id"]).params
        assert stored == [name, "Hello" if greeting is None else greeting, 1]


# ---------------------------------------------------------------------------------------
# Submit: raw bodies a JSON encoder would never produce
# ---------------------------------------------------------------------------------------

BAD_ESCAPES = [r"\ud800", r"\udfff", r"\udbff", r"\u0000", r"\ud800\u0041", r"x\u0000y"]


@FUZZ
@given(
    escape=st.sampled_from(BAD_ESCAPES),
    where=st.sampled_from(["function", "argument", "nested", "key", "execution_id"]),
    function=st.sampled_from([ADD, GREET]),
)
def test_a_lone_surrogate_or_nul_escape_anywhere_in_the_body_is_refused(api, escape, where, function):
    """``"\\ud800"`` and ``"\\u0000"`` as JSON escapes (the only way to send them): wherever
    they are, the request is a 4xx JSON error and nothing is written."""
    text = f'"a{escape}"'
    parts = {
        "function": f'{{"function": {text}, "arguments": []}}',
        "argument": f'{{"function": "{function}", "arguments": [{text}, 2]}}',
        "nested": f'{{"function": "{function}", "arguments": [[{{"k": [{text}]}}], 2]}}',
        "key": f'{{"function": "{function}", "arguments": {{{text}: 1}}}}',
        "execution_id": f'{{"function": "{function}", "arguments": [1, 2], "execution_id": {text}}}',
    }
    before = database_state()
    response = api.post("/executions", raw=parts[where].encode())
    assert 400 <= response.status_code < 500, (response.status_code, response.content[:300])
    assert_refusal_or_success(response, before)


@FUZZ
@given(
    depth=st.sampled_from([65, 66, 1_000, 100_000]),
    opener=st.sampled_from(["[", '{"a":']),
    where=st.sampled_from(["arguments", "body", "function", "execution_id"]),
)
def test_deep_nesting_is_a_4xx_not_a_recursion_error(api, depth, opener, where):
    """Nesting past MAX_JSON_DEPTH, up to 100,000 levels, in any field or as the body."""
    closer = "]" if opener == "[" else "}"
    nested = opener * depth + "1" + closer * depth
    bodies = {
        "arguments": f'{{"function": "{ADD}", "arguments": {nested}}}',
        "body": nested,
        "function": f'{{"function": {nested}, "arguments": [1, 2]}}',
        "execution_id": f'{{"function": "{ADD}", "arguments": [1, 2], "execution_id": {nested}}}',
    }
    before = database_state()
    response = api.post("/executions", raw=bodies[where].encode())
    assert 400 <= response.status_code < 500, (response.status_code, response.content[:300])
    assert_refusal_or_success(response, before)


@FUZZ
@given(
    digits=st.sampled_from([4299, 4300, 4301, 5000]),
    shape=st.sampled_from(["int", "negative", "fraction", "exponent", "tiny", "huge_exponent"]),
    where=st.sampled_from(["argument", "paused", "execution_id", "nested"]),
)
def test_numbers_with_thousands_of_digits_never_cause_a_server_error(api, digits, shape, where):
    """Integers past Python's 4,300-digit conversion limit, long fractions, exponents that
    overflow to infinity or underflow to zero, in an argument and elsewhere. A number that
    was accepted is stored as the number it is."""
    number = {
        "int": "9" * digits,
        "negative": "-" + "9" * digits,
        "fraction": "1." + "0" * digits,
        "exponent": "1" + "0" * digits + ".0",
        "tiny": "1e-" + "9" * min(digits, 400),
        "huge_exponent": "1e" + "9" * min(digits, 400),
    }[shape]
    bodies = {
        "argument": f'{{"function": "{ADD}", "arguments": [1, {number}]}}',
        "paused": f'{{"function": "{ADD}", "arguments": [1, 2], "paused": {number}}}',
        "execution_id": f'{{"function": "{ADD}", "arguments": [1, 2], "execution_id": {number}}}',
        "nested": f'{{"function": "{ADD}", "arguments": [1, [{number}]]}}',
    }
    before = database_state()
    response = api.post("/executions", raw=bodies[where].encode())
    assert_refusal_or_success(response, before)
    if response.status_code == 201:
        assert engine.get(response.json()["execution_id"]).params == [1, json.loads(number)]


valid_body = json.dumps({"function": ADD, "arguments": [1, 2]}).encode()


@FUZZ
@given(
    raw=st.one_of(
        st.binary(max_size=200),
        st.integers(min_value=0, max_value=len(valid_body) - 1).map(lambda n: valid_body[:n]),
        st.integers(min_value=0, max_value=len(valid_body) - 1).map(
            lambda n: valid_body[:n] + b"\xff" + valid_body[n:]
        ),
        st.sampled_from(
            [
                b"",
                b"null",
                b"true",
                b"1",
                b'"x"',
                b"[]",
                b"{}",
                b"NaN",
                b"{'function': 'x'}",
                b'{"function": "test:acts/basic.add", "arguments": [1, 2],}',
                b'{"function": "test:acts/basic.add", "function": 1, "arguments": [1, 2]}',
                b'{"function": "test:acts/basic.add", "arguments": [1, Infinity]}',
                b'{"function": "test:acts/basic.add", "arguments": [1, -Infinity]}',
                b"\xef\xbb\xbf" + valid_body,
                valid_body.decode().encode("utf-16"),
                valid_body + b"\x00",
                valid_body + b" garbage",
            ]
        ),
    )
)
def test_a_malformed_body_is_a_4xx_json_error_and_writes_nothing(api, raw):
    """Random bytes, every truncation of a valid body, invalid UTF-8 spliced in, JSON
    extensions Python accepts (NaN, Infinity), a BOM, UTF-16, duplicated keys, trailing
    bytes: never a 5xx, and only a well-formed call may be accepted."""
    before = database_state()
    response = api.post("/executions", raw=raw)
    assert_refusal_or_success(response, before)
    if response.status_code < 300:
        # What was accepted must have been one JSON object naming the function (the
        # duplicated key keeps its last value, which is not text: that one is refused).
        assert json.loads(raw)["function"] == ADD, raw


@FUZZ
@given(
    content_type=st.one_of(
        st.sampled_from(
            [
                "text/plain",
                "application/x-www-form-urlencoded",
                "multipart/form-data; boundary=xyz",
                "multipart/form-data",
                "application/xml",
                "application/json; charset=latin-1",
                "application/json; charset=utf-16",
                "application/json; charset=nonsense",
                "application/merge-patch+json",
                "",
                "*/*",
            ]
        ),
        ascii_words.map(lambda word: f"application/{word}"),
    ),
    body=st.sampled_from(
        [
            valid_body,
            b"function=test%3Aacts%2Fbasic.add&arguments=1&arguments=2",
            b'--xyz\r\nContent-Disposition: form-data; name="function"\r\n\r\ntest:acts/basic.add\r\n--xyz--\r\n',
            b"<submit><function>test:acts/basic.add</function></submit>",
        ]
    ),
)
def test_a_wrong_content_type_is_never_a_server_error(api, content_type, body):
    """The body is read as JSON whatever the ``Content-Type`` says; what is not JSON is a
    4xx JSON error that writes nothing, a form or multipart body included."""
    before = database_state()
    # `generic` sends the bytes as they are (`post` would re-encode them to the charset)
    response = api.client.generic("POST", "/api/v1/executions", body, content_type=content_type, **api.headers)
    assert_refusal_or_success(response, before)
    if response.status_code < 300:
        assert body == valid_body, (content_type, body)


@FUZZ
@given(excess=st.integers(min_value=1, max_value=5000), filler=st.sampled_from(["x", "é", "\\u00e9", " "]))
def test_a_body_past_the_payload_limit_is_413_and_writes_nothing(api, settings, excess, filler):
    """Bodies past MAX_PAYLOAD_BYTES (lowered to keep examples small), padded inside an
    argument or with whitespace: 413 ``payload_too_large``, before anything is stored."""
    limit = 2000
    settings.OBELISK = {**settings.OBELISK, "MAX_PAYLOAD_BYTES": limit}
    head = f'{{"function": "{GREET}", "arguments": ["'.encode()
    tail = b'"]}'
    room = limit + excess - len(head) - len(tail)
    pad = (filler * room).encode()[:room]
    if filler == " ":
        raw = f'{{"function": "{GREET}", "arguments": ["x"]}}'.encode()
        raw += b" " * (limit + excess - len(raw))
    else:
        raw = head + pad.decode(errors="ignore").encode() + tail
        raw += b" " * (limit + excess - len(raw))
    assert len(raw) == limit + excess
    before = database_state()
    response = api.post("/executions", raw=raw)
    assert response.status_code == 413, (response.status_code, response.content[:300])
    assert error_body(response.content)["code"] == "payload_too_large"
    assert database_state() == before


def test_a_body_past_the_default_payload_limit_is_413_and_writes_nothing(api):
    """The shipped limit (MAX_PAYLOAD_BYTES, 1 MiB by default), one byte over."""
    from executions import conf

    limit = conf.get("MAX_PAYLOAD_BYTES")
    raw = json.dumps({"function": GREET, "arguments": ["x" * limit]}).encode()
    before = database_state()
    response = api.post("/executions", raw=raw)
    assert response.status_code == 413, (response.status_code, response.content[:300])
    assert error_body(response.content)["code"] == "payload_too_large"
    assert database_state() == before


# ---------------------------------------------------------------------------------------
# List
# ---------------------------------------------------------------------------------------

aware_datetimes = st.datetimes(
    min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.timezones()
) | st.datetimes(timezones=st.just(timezone(timedelta(hours=14))) | st.just(timezone(timedelta(hours=-14))))
cursors = st.one_of(
    hostile_text,
    st.builds(
        lambda at, execution_id: base64.urlsafe_b64encode(f"{at.isoformat()}|{execution_id}".encode())
        .decode()
        .rstrip("="),
        aware_datetimes | st.datetimes(),
        st.one_of(valid_execution_ids, storable_text),
    ),
    st.binary(max_size=40).map(lambda raw: base64.urlsafe_b64encode(raw).decode()),
)
datetime_texts = st.one_of(
    aware_datetimes.map(datetime.isoformat), st.datetimes().map(datetime.isoformat), hostile_text
)
STATUSES = ["pending", "scheduled", "locked", "blocked", "paused", "cancelling", "finished", "finished_ok"]
OUTCOMES = ["ok", "error", "failed", "timed_out", "pending", "running", "paused"]
list_params = st.fixed_dictionaries(
    {},
    optional={
        "function": hostile_text,
        "status": st.lists(st.one_of(st.sampled_from(STATUSES), hostile_text), max_size=3),
        "outcome": st.lists(st.one_of(st.sampled_from(OUTCOMES), hostile_text), max_size=3),
        "top_level_only": st.one_of(st.sampled_from(["true", "false", "1", "0"]), hostile_text),
        "parent": execution_ids,
        "created_after": datetime_texts,
        "created_before": datetime_texts,
        "older_than": cursors,
        "newer_than": cursors,
        "limit": st.one_of(st.integers(min_value=-5, max_value=1005), st.integers(), hostile_text),
    },
)


@pytest.fixture
def some_executions(api):
    """A few executions for the filters to find: a finished one, a pending one, a child."""
    ok = api.submit(ADD, [1, 2])
    finish(ok, Ok(3))
    api.submit(GREET, ["ü\u202e"])
    parent = helpers.create_workflow()
    helpers.block_on_child(parent, helpers.lock(parent))


def cursor_of(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


@FUZZ
@given(params=list_params)
@example(params={"older_than": cursor_of("2030-01-01T00:00:00+00:00|\x00")})
@example(params={"function": "a\x00b", "parent": "E_\x00", "status": ["\x00"], "outcome": ["ok\x00"]})
@example(params={"limit": str(2**63), "top_level_only": "\x00"})
def test_any_list_query_is_answered_without_a_server_error_and_writes_nothing(api, some_executions, params):
    """Arbitrary filters, NUL characters (``%00``), unknown statuses, naive and extreme
    datetimes (year 1 and 9999 at ±14:00), forged cursors: 200 with a page, or a 4xx JSON
    error; listing writes nothing either way."""
    before = database_state()
    response = api.get("/executions", params)
    assert_refusal_or_success(response, before)
    assert database_state() == before
    if response.status_code == 200:
        page = response.json()
        assert isinstance(page["items"], list) and set(page) == {"items", "next_cursor", "prev_cursor"}


@FUZZ
@given(
    query=st.lists(
        st.tuples(
            st.sampled_from(["function", "status", "outcome", "parent", "older_than", "limit", "top_level_only"]),
            st.binary(max_size=12),
        ),
        max_size=4,
    )
)
def test_a_raw_query_string_with_any_bytes_is_never_a_server_error(api, some_executions, query):
    """Percent-encoded bytes that are not UTF-8 (``%ff``), NUL (``%00``), and everything in
    between, straight into the query string."""
    raw = "&".join(f"{name}={quote(value, safe='')}" for name, value in query)
    before = database_state()
    response = api.client.get(f"/api/v1/executions?{raw}", **api.headers)
    assert_refusal_or_success(response, before)
    assert database_state() == before


@FUZZ
@given(function=st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=10))
def test_a_nul_in_the_function_filter_is_refused_and_any_other_prefix_filters(api, some_executions, function):
    """``function`` is a prefix of the name; a NUL (``%00``) is 400 unsupported_value, any
    other text filters (LIKE wildcards ``%`` and ``_`` included, matched literally)."""
    response = api.get("/executions", {"function": function, "top_level_only": "false"})
    if "\x00" in function:
        assert response.status_code == 400, response.content
        assert error_body(response.content)["code"] == "unsupported_value"
        return
    assert response.status_code == 200, response.content
    found = {item["ffqn"] for item in response.json()["items"]}
    assert all(ffqn.startswith(function) for ffqn in found), (function, found)


YEAR_1_AHEAD = "0001-01-01T00:00:00+14:00"  # before 0001-01-01 in UTC
YEAR_9999_BEHIND = "9999-12-31T23:59:59-14:00"  # after 9999-12-31 in UTC
EDGE_OF_TIME = {
    "submit-scheduled-year-1": ("post", {"function": ADD, "arguments": [1, 2], "scheduled_at": YEAR_1_AHEAD}),
    "submit-scheduled-year-9999": ("post", {"function": ADD, "arguments": [1, 2], "scheduled_at": YEAR_9999_BEHIND}),
    "list-created-after-year-1": ("get", {"created_after": YEAR_1_AHEAD}),
    "list-created-before-year-9999": ("get", {"created_before": YEAR_9999_BEHIND}),
    "list-cursor-year-1": ("get", {"older_than": cursor_of(f"{YEAR_1_AHEAD}|E_01JAAAAAAAAAAAAAAAAAAAAAAA")}),
    "list-cursor-year-9999": ("get", {"newer_than": cursor_of(f"{YEAR_9999_BEHIND}|E_01JAAAAAAAAAAAAAAAAAAAAAAA")}),
}


@pytest.mark.parametrize("case", EDGE_OF_TIME, ids=list(EDGE_OF_TIME))
def test_an_aware_datetime_outside_years_1_to_9999_in_utc_is_refused_not_a_server_error(api, case):
    """Python's datetime holds years 1 to 9999 and a UTC offset: year 1 at +14:00 is valid
    input that cannot be converted to UTC (OverflowError), so it must be refused (or
    handled), not answered with a 500, and an execution accepted with it must be readable."""
    method, payload = EDGE_OF_TIME[case]
    before = database_state()
    response = api.post("/executions", payload) if method == "post" else api.get("/executions", payload)
    if response.status_code >= 300:
        after = database_state()
        assert after == before, describe_difference(before, after)
    assert_refusal_or_success(response, before)
    if response.status_code == 201:
        detail = api.get(f"/executions/{response.json()['execution_id']}")
        assert detail.status_code == 200, (detail.status_code, detail.content[:300])
        assert api.get("/executions").status_code == 200


def test_list_pages_reach_every_execution_with_the_cursors_it_hands_out(api, some_executions):
    """The cursors the API hands out are accepted back (the generated ones above are
    mostly refused, so this pins the accepting side)."""
    seen, cursor = [], None
    while True:
        page = api.get(
            "/executions", {"limit": 1, "top_level_only": "false", **({"older_than": cursor} if cursor else {})}
        )
        assert page.status_code == 200, page.content
        seen += [item["execution_id"] for item in page.json()["items"]]
        cursor = page.json()["next_cursor"]
        if cursor is None:
            break
    assert len(seen) == len(set(seen)) == ExecutionState.objects.count()
