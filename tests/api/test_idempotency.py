"""What "the same call" is under one ``execution_id`` (issue 36, item 14; D104).

A resubmission is the same call, answered with the existing execution (``created: false``,
HTTP 200), when its function is the same, its arguments are equal as a JSON Schema validator
compares JSON (``1`` = ``1.0``, ``-0.0`` = ``0.0``, objects in any key order, but ``true`` ≠
``1`` and ``"1"`` ≠ ``1``), and it asks for the same ``paused`` and ``scheduled_at`` as the
first. Anything else is a 409 ``conflict`` naming what differs, and writes nothing: a
different schedule or pause was silently dropped before.

Held through the REST API, the Python client (``executions.client``) and the store.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone
from hypothesis import given, settings
from jsonschema import Draft202012Validator

from executions import client as engine
from executions import errors, store
from executions.ids import ExecutionId
from executions.store.create import same_json
from tests.support import helpers
from tests.support.api import ADD, assert_error, everything
from tests.support.fuzz import json_values
from tests.support.helpers import ACTIVITY, DEPLOYMENT, FFQN, T0

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def deployed():
    return helpers.deploy_components()


def new_id() -> str:
    return str(ExecutionId.generate())


# Raw JSON texts: ``json.dumps`` would not keep ``-0.0`` and ``0.0`` apart in a test's eyes.
SAME_NUMBERS = [
    pytest.param(b"[1, 2]", b"[1.0, 2]", id="1-then-1.0"),
    pytest.param(b"[1.0, 2]", b"[1, 2]", id="1.0-then-1"),
    pytest.param(b"[-0.0, 0]", b"[0.0, 0]", id="-0.0-then-0.0"),
    pytest.param(b"[0, 0]", b"[-0.0, 0.0]", id="0-then--0.0"),
    pytest.param(b"[100, 2]", b"[1e2, 2]", id="100-then-1e2"),
    pytest.param(b"[10000000000000000, 2]", b"[1e16, 2]", id="10**16-then-1e16"),
]


def submit_raw(api, execution_id: str, arguments: bytes, **fields):
    extra = b"".join(b', "%s": %s' % (name.encode(), json.dumps(value).encode()) for name, value in fields.items())
    body = b'{"function": "%s", "arguments": %s, "execution_id": "%s"%s}' % (
        ADD.encode(), arguments, execution_id.encode(), extra
    )  # fmt: skip
    return api.post("/executions", raw=body)


@pytest.mark.parametrize(("first", "again"), SAME_NUMBERS)
def test_through_the_api_equal_numbers_spelled_differently_are_the_same_call(api, first, again):
    execution_id = new_id()
    assert submit_raw(api, execution_id, first).status_code == 201
    stored = json.dumps(api.get(f"/executions/{execution_id}").json()["params"])
    response = submit_raw(api, execution_id, again)
    assert response.status_code == 200, response.content
    assert response.json() == {"execution_id": execution_id, "created": False, "retry_of": None}
    assert json.dumps(api.get(f"/executions/{execution_id}").json()["params"]) == stored  # the first call's


@pytest.mark.parametrize(("first", "again"), SAME_NUMBERS)
def test_through_the_python_client_equal_numbers_spelled_differently_are_the_same_call(first, again):
    execution_id = new_id()
    assert engine.submit(ADD, json.loads(first), execution_id=execution_id).created
    assert not engine.submit(ADD, json.loads(again), execution_id=execution_id).created


def test_different_numbers_are_still_a_conflict_that_writes_nothing(api):
    execution_id = new_id()
    assert submit_raw(api, execution_id, b"[1, 2]").status_code == 201
    before = everything()
    body = assert_error(submit_raw(api, execution_id, b"[3, 2]"), 409, "conflict")
    assert "arguments" in body["message"]
    with pytest.raises(errors.Conflict, match="arguments"):
        engine.submit(ADD, [2, 2], execution_id=execution_id)
    assert everything() == before


# ---------------------------------------------------------------------------------------
# paused and scheduled_at are part of the call
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("paused", [True, False])
def test_a_resubmit_asking_for_another_paused_is_a_conflict_naming_paused(api, paused):
    execution_id = new_id()
    assert submit_raw(api, execution_id, b"[1, 2]", paused=paused).status_code == 201
    assert submit_raw(api, execution_id, b"[1, 2]", paused=paused).status_code == 200
    before = everything()
    body = assert_error(submit_raw(api, execution_id, b"[1, 2]", paused=not paused), 409, "conflict")
    assert "`paused`" in body["message"], body
    with pytest.raises(errors.Conflict, match="`paused`"):
        engine.submit(ADD, [1, 2], execution_id=execution_id, paused=not paused)
    assert everything() == before
    assert api.get(f"/executions/{execution_id}").json()["outcome"] == ("paused" if paused else "pending")


def test_a_pause_or_resume_after_the_submit_does_not_change_what_the_same_call_is(api):
    """The resubmission is compared with the first request, not with the state since."""
    paused_first, running_first = new_id(), new_id()
    assert submit_raw(api, paused_first, b"[1, 2]", paused=True).status_code == 201
    assert submit_raw(api, running_first, b"[1, 2]").status_code == 201
    engine.resume(paused_first)
    engine.pause(running_first)
    assert submit_raw(api, paused_first, b"[1, 2]", paused=True).status_code == 200
    assert submit_raw(api, running_first, b"[1, 2]").status_code == 200
    assert_error(submit_raw(api, paused_first, b"[1, 2]"), 409, "conflict")
    assert_error(submit_raw(api, running_first, b"[1, 2]", paused=True), 409, "conflict")


def test_a_resubmit_asking_for_another_schedule_is_a_conflict_naming_scheduled_at(api):
    execution_id = new_id()
    at = (timezone.now() + timedelta(hours=1)).replace(microsecond=123456)
    assert submit_raw(api, execution_id, b"[1, 2]", scheduled_at=at.isoformat()).status_code == 201
    # the same instant, in another zone's spelling, is the same schedule
    same = at.astimezone(timezone.get_fixed_timezone(-300)).isoformat()
    assert submit_raw(api, execution_id, b"[1, 2]", scheduled_at=same).status_code == 200
    assert not engine.submit(ADD, [1, 2], execution_id=execution_id, scheduled_at=at).created
    before = everything()
    later = (at + timedelta(minutes=5)).isoformat()
    for refused in (
        submit_raw(api, execution_id, b"[1, 2]", scheduled_at=later),
        submit_raw(api, execution_id, b"[1, 2]"),
    ):
        body = assert_error(refused, 409, "conflict")
        assert "`scheduled_at`" in body["message"], body
    with pytest.raises(errors.Conflict, match="`scheduled_at`"):
        engine.submit(ADD, [1, 2], execution_id=execution_id)
    assert everything() == before


def test_a_call_submitted_to_run_now_is_the_same_call_later_but_not_with_a_schedule(api):
    execution_id = new_id()
    assert submit_raw(api, execution_id, b"[1, 2]").status_code == 201
    assert submit_raw(api, execution_id, b"[1, 2]").status_code == 200  # another "now": the same call
    assert not engine.submit(ADD, [1, 2], execution_id=execution_id).created
    at = (timezone.now() + timedelta(hours=1)).isoformat()
    body = assert_error(submit_raw(api, execution_id, b"[1, 2]", scheduled_at=at), 409, "conflict")
    assert "`scheduled_at`" in body["message"], body


# ---------------------------------------------------------------------------------------
# The store: what "equal as JSON Schema compares" holds for any value
# ---------------------------------------------------------------------------------------

SAME_VALUES = [
    pytest.param([1], [1.0], id="int-float"),
    pytest.param([-0.0], [0], id="negative-zero"),
    pytest.param([{"a": 1, "b": [1, {"c": 2.0}]}], [{"b": [1.0, {"c": 2}], "a": 1.0}], id="key-order-and-nesting"),
    pytest.param([12345678901234567890123], [12345678901234567890123], id="big-int"),
]
OTHER_VALUES = [
    pytest.param([True], [1], id="true-is-not-1"),
    pytest.param([False], [0], id="false-is-not-0"),
    pytest.param([1], ["1"], id="number-is-not-text"),
    pytest.param([None], [0], id="null-is-not-0"),
    pytest.param([[1, 2]], [[2, 1]], id="arrays-are-ordered"),
    pytest.param([{"a": 1}], [{"a": 1, "b": None}], id="a-missing-key-is-not-null"),
    pytest.param([12345678901234567890123], [1.2345678901234568e22], id="big-int-is-not-its-nearest-float"),
    pytest.param([0.1], [0.10000000000000002], id="nearby-floats"),
]


def request_for(execution_id: str, params: list, **fields) -> store.CreateRequest:
    return store.CreateRequest(
        execution_id=execution_id, ffqn=FFQN, params=params, component_id=ACTIVITY, deployment_id=DEPLOYMENT, **fields
    )


@pytest.mark.parametrize(("first", "again"), SAME_VALUES)
def test_the_store_takes_values_equal_as_json_schema_compares_them_as_the_same_call(first, again):
    execution_id = helpers.create(params=first, now=T0)
    assert store.create(request_for(execution_id, again), now=T0 + timedelta(seconds=1)).already_existed
    (outcome,) = store.create_many([request_for(execution_id, again)], now=T0 + timedelta(seconds=2))
    assert outcome.already_existed


@pytest.mark.parametrize(("first", "again"), OTHER_VALUES)
def test_the_store_refuses_values_json_schema_tells_apart(first, again):
    execution_id = helpers.create(params=first, now=T0)
    before = everything()
    with pytest.raises(errors.Conflict, match="arguments"):
        store.create(request_for(execution_id, again), now=T0)
    with pytest.raises(errors.Conflict, match="arguments"):
        store.create_many([request_for(new_id(), [1]), request_for(execution_id, again)], now=T0)
    assert everything() == before


def test_create_many_compares_paused_and_scheduled_at_too():
    at = T0 + timedelta(hours=1)
    paused = helpers.create(params=[1], now=T0, paused=True)
    scheduled = helpers.create(params=[1], now=T0, scheduled_at=at)
    outcomes = store.create_many(
        [request_for(paused, [1], paused=True), request_for(scheduled, [1], scheduled_at=at)], now=T0
    )
    assert [outcome.already_existed for outcome in outcomes] == [True, True]
    with pytest.raises(errors.Conflict, match="`paused`"):
        store.create_many([request_for(paused, [1])], now=T0)
    with pytest.raises(errors.Conflict, match="`scheduled_at`"):
        store.create_many([request_for(scheduled, [1], scheduled_at=at + timedelta(seconds=1))], now=T0)


def respelled(value):
    """The same JSON value spelled otherwise: integral numbers as floats (when exact) and
    back, objects with their keys in reverse order."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return float(value) if abs(value) < 2**53 else value
    if isinstance(value, float):
        return int(value) if value.is_integer() and abs(value) < 2**53 else value
    if isinstance(value, list):
        return [respelled(item) for item in value]
    return {key: respelled(value[key]) for key in reversed(list(value))}


def schema_equal(a, b) -> bool:
    """The oracle: a JSON Schema validator's own ``const``."""
    return Draft202012Validator({"const": a}).is_valid(b)


@settings(max_examples=300, derandomize=True, database=None, deadline=None)
@given(a=json_values, b=json_values)
def test_same_json_is_the_equality_of_json_schema(a, b):
    assert same_json(a, b) == schema_equal(a, b)
    assert same_json(a, respelled(a)) and schema_equal(a, respelled(a))
    assert same_json(respelled(a), b) == schema_equal(a, b)


def test_what_the_first_request_asked_is_recorded_not_inferred_from_the_events_after_it():
    """Found by the model test: an operator's pause at the very instant of the creation read
    as "submitted paused", so a resubmission of the same call was refused. The ``Created``
    event records ``paused`` (D104), so what came after it cannot change what was asked."""
    execution_id = new_id()
    assert not store.create(request_for(execution_id, [1, 2]), now=T0).already_existed
    store.pause_execution(execution_id, now=T0)  # the same instant as the creation
    assert store.create(request_for(execution_id, [1, 2]), now=T0).already_existed
    with pytest.raises(errors.Conflict, match="`paused`"):
        store.create(request_for(execution_id, [1, 2], paused=True), now=T0)


def test_a_schedule_at_the_creation_instant_is_the_same_call_as_none():
    """No ``scheduled_at`` asks for the first request's creation instant, so naming that
    instant is the same call, either way round (D104)."""
    at_once, named = new_id(), new_id()
    store.create(request_for(at_once, [1, 2]), now=T0)
    assert store.create(request_for(at_once, [1, 2], scheduled_at=T0), now=T0 + timedelta(seconds=1)).already_existed
    store.create(request_for(named, [1, 2], scheduled_at=T0), now=T0)
    assert store.create(request_for(named, [1, 2]), now=T0 + timedelta(seconds=1)).already_existed
    with pytest.raises(errors.Conflict, match="`scheduled_at`"):
        store.create(request_for(named, [1, 2], scheduled_at=T0 + timedelta(seconds=1)), now=T0)
