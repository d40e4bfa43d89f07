"""Bad input: every refusal is a typed error (spec 000 §11) and leaves the database as it was."""

import json
from datetime import datetime, timedelta

import pytest
from django.conf import settings
from django.test import override_settings

from executions import errors, store
from executions.events import (
    ChildExecutionRequest,
    Created,
    DelayRequest,
    Err,
    Finished,
    JoinNext,
    JoinSetCreate,
    JoinSetRequest,
    Ok,
    TemporarilyFailed,
)
from executions.ids import DelayId, ExecutionId, JoinSetId, new_executor_id, new_run_id
from tests.support import helpers
from tests.support.helpers import ACTIVITY, DEPLOYMENT, FFQN, T0, TERMS

pytestmark = pytest.mark.django_db

ULID = "01JAAAAAAAAAAAAAAAAAAAAAAA"
LIMIT = 1000
SMALL_PAYLOADS = {**settings.OBELISK, "MAX_PAYLOAD_BYTES": LIMIT}


def refused(error_type, call, *, match=None):
    """``call()`` raises ``error_type`` (exactly that class) and writes nothing."""
    before = helpers.db_snapshot()
    with pytest.raises(errors.StoreError, match=match) as info:
        call()
    assert type(info.value) is error_type, f"{type(info.value).__name__}: {info.value}"
    assert helpers.db_snapshot() == before
    return info.value


@pytest.fixture
def world():
    """One execution in each state the tests write to: ids of a pending and a finished
    activity, and the ``LockedExecution`` (with its fence) of a locked activity and workflow."""
    pending = helpers.create(now=T0)
    locked_id = helpers.create(now=T0)
    locked = helpers.lock(locked_id, now=T0)
    finished = helpers.create(now=T0)
    done = helpers.lock(finished, now=T0)
    store.append(finished, done.next_version, Finished(retval=Ok(1)), fence=done.fence, now=T0)
    workflow = helpers.create_workflow(now=T0)
    workflow_lock = helpers.lock(workflow, now=T0)
    return {
        "pending": pending,
        "locked": locked,
        "finished": finished,
        "workflow": workflow_lock,
    }


def request(**overrides) -> store.CreateRequest:
    fields = dict(
        execution_id=str(ExecutionId.generate()), ffqn=FFQN, params=[], component_id=ACTIVITY, deployment_id=DEPLOYMENT
    )
    return store.CreateRequest(**{**fields, **overrides})


def child_of(workflow_id: str, name: str = "js", idx: int = 1) -> str:
    return str(ExecutionId.parse(workflow_id).child(JoinSetId("n", name), idx))


def child_request_event(workflow_id: str, child_id: str, *, name="js", params=None, ffqn=FFQN):
    return helpers.history(
        JoinSetRequest(
            join_set_id=f"n:{name}",
            request=ChildExecutionRequest(child_execution_id=child_id, target_ffqn=ffqn, params=params or []),
        )
    )


def delay_request_event(delay_id: str, name="js"):
    return helpers.history(
        JoinSetRequest(
            join_set_id=f"n:{name}", request=DelayRequest(delay_id=delay_id, expires_at=T0 + timedelta(seconds=5))
        )
    )


def append_locked(world, event):
    """The holder of the running workflow appends ``event`` with its fence."""
    workflow = world["workflow"]
    return store.append(workflow.execution_id, workflow.next_version, event, fence=workflow.fence, now=T0)


# ---------------------------------------------------------------------------------------
# Unknown executions
# ---------------------------------------------------------------------------------------

UNKNOWN = "E_" + ULID

ON_UNKNOWN = {
    "append": lambda: store.append(UNKNOWN, 1, Finished(retval=Ok(1)), now=T0),
    "append_batch": lambda: store.append_batch(UNKNOWN, 1, [Finished(retval=Ok(1))], now=T0),
    "get": lambda: store.get(UNKNOWN),
    "get_state": lambda: store.get_state(UNKNOWN),
    "list_events": lambda: store.list_events(UNKNOWN),
    "cancel": lambda: store.cancel(UNKNOWN, now=T0),
    "pause": lambda: store.pause_execution(UNKNOWN, now=T0),
    "unpause": lambda: store.unpause_execution(UNKNOWN, now=T0),
    "lock_one": lambda: store.lock_one(
        UNKNOWN, 1, TERMS, executor_id=new_executor_id(), run_id=new_run_id(), deployment_id=DEPLOYMENT, now=T0
    ),
    "delay_response": lambda: store.append_delay_response(f"Delay_{ULID}.n:js_1", True, now=T0),
}


@pytest.mark.parametrize("operation", ON_UNKNOWN)
def test_unknown_execution_is_not_found(world, operation):
    refused(errors.NotFound, ON_UNKNOWN[operation])


def test_append_many_reports_an_unknown_execution_per_item(world):
    pending = world["pending"]
    results = store.append_many(
        [
            store.AppendItem(UNKNOWN, 1, Finished(retval=Ok(1))),
            store.AppendItem(pending, 1, Finished(retval=Ok(2))),
        ],
        now=T0,
    )
    assert isinstance(results[0], errors.NotFound)
    assert results[1] == 1
    assert store.get_finished_result(pending) == Ok(2)


def test_child_of_an_unknown_parent_is_refused(world):
    child = child_of(UNKNOWN)
    refused(errors.NotFound, lambda: store.create(request(execution_id=child, parent=(UNKNOWN, "n:js")), now=T0))


# ---------------------------------------------------------------------------------------
# Malformed identifiers: InvalidId, a ValidationFailed
# ---------------------------------------------------------------------------------------

BAD_EXECUTION_IDS = [
    "",
    "E_",
    "E_" + ULID.lower(),
    "E_" + ULID[:-1],
    "X_" + ULID,
    "E_" + ULID + "\n",  # `$` matched before a final newline: the id was kept with it
    "E_" + ULID + ".n:js_0",  # child indexes start at 1
    "E_" + ULID + ".x:js_1",  # unknown join set kind
    "E_" + ULID + ".n:js",  # no index
    "E_" + ULID + ".n:bad name_1",
    42,
]
BAD_DELAY_IDS = ["", "Delay_", "Delay_" + ULID, f"Delay_{ULID}.n:js_0", f"Delay_{ULID}.q:js_1", "E_" + ULID + ".n:js_1"]
BAD_FUNCTIONS = [
    "",
    "fn",
    "ns:pkg.fn",
    "ns:pkg/ifc",
    "ns:pkg/ifc.1fn",
    "ns pkg/ifc.fn",
    "ns:pkg/ifc@.fn",
    "ns:pkg/ifc.fn\n",
]
BAD_RUN_IDS = ["", "Run_", "Run_" + ULID.lower(), "Exr_" + ULID, "run_" + ULID, "Run_" + ULID + "\n"]
BAD_EXECUTOR_IDS = ["", "Exr_", "Exr_" + ULID[:-1], "Run_" + ULID]
BAD_DEPLOYMENT_IDS = ["", "Dep_", "Dep_" + ULID + "X", "Exr_" + ULID]


def lock_pending(**overrides):
    arguments = dict(
        functions={FFQN: TERMS}, limit=5, executor_id=new_executor_id(), run_id=new_run_id(),
        deployment_id=DEPLOYMENT, now=T0,
    )  # fmt: skip
    arguments.update(overrides)
    return store.lock_pending(arguments.pop("functions"), **arguments)


WITH_EXECUTION_ID = {
    "create": lambda bad: store.create(request(execution_id=bad), now=T0),
    "append": lambda bad: store.append(bad, 1, Finished(retval=Ok(1)), now=T0),
    "get": lambda bad: store.get(bad),
    "list_events": lambda bad: store.list_events(bad),
    "cancel": lambda bad: store.cancel(bad, now=T0),
    "lock_one": lambda bad: store.lock_one(
        bad, 1, TERMS, executor_id=new_executor_id(), run_id=new_run_id(), deployment_id=DEPLOYMENT, now=T0
    ),
}


@pytest.mark.parametrize("bad", BAD_EXECUTION_IDS)
@pytest.mark.parametrize("operation", WITH_EXECUTION_ID)
def test_malformed_execution_id(world, operation, bad):
    refused(errors.InvalidId, lambda: WITH_EXECUTION_ID[operation](bad))


@pytest.mark.parametrize("bad", BAD_EXECUTION_IDS[:-1])
def test_malformed_ids_inside_events_and_requests(world, bad):
    refused(errors.InvalidId, lambda: store.create(request(scheduled_by=bad), now=T0))
    refused(errors.InvalidId, lambda: append_locked(world, child_request_event(world["workflow"].execution_id, bad)))


@pytest.mark.parametrize("bad", BAD_DELAY_IDS)
def test_malformed_delay_id(world, bad):
    refused(errors.InvalidId, lambda: append_locked(world, delay_request_event(bad)))
    refused(errors.InvalidId, lambda: store.append_delay_response(bad, True, now=T0))
    refused(errors.InvalidId, lambda: store.pause_delay(bad))


@pytest.mark.parametrize("bad", ["js", "x:js", "n:", "n:bad name", "n:a.b", ":js"])
def test_malformed_join_set_id(world, bad):
    refused(errors.InvalidId, lambda: append_locked(world, helpers.history(JoinSetCreate(join_set_id=bad))))
    refused(
        errors.InvalidId,
        lambda: append_locked(
            world, helpers.history(JoinNext(join_set_id=bad, run_expires_at=T0 + timedelta(seconds=5)))
        ),
    )


@pytest.mark.parametrize("bad", BAD_FUNCTIONS)
def test_malformed_function_name(world, bad):
    refused(errors.InvalidId, lambda: store.create(request(ffqn=bad), now=T0))
    workflow_id = world["workflow"].execution_id
    refused(
        errors.InvalidId,
        lambda: append_locked(world, child_request_event(workflow_id, child_of(workflow_id), ffqn=bad)),
    )


@pytest.mark.parametrize("bad", ["fn", "ns:pkg/ifc"])
def test_malformed_function_name_in_lock_pending(world, bad):
    refused(errors.InvalidId, lambda: lock_pending(functions={bad: TERMS}))


@pytest.mark.parametrize(
    "argument, bad",
    [("run_id", bad) for bad in BAD_RUN_IDS]
    + [("executor_id", bad) for bad in BAD_EXECUTOR_IDS]
    + [("deployment_id", bad) for bad in BAD_DEPLOYMENT_IDS],
)
def test_malformed_run_executor_and_deployment_ids(world, argument, bad):
    refused(errors.InvalidId, lambda: lock_pending(**{argument: bad}))
    pending = world["pending"]
    arguments = dict(executor_id=new_executor_id(), run_id=new_run_id(), deployment_id=DEPLOYMENT, now=T0)
    refused(errors.InvalidId, lambda: store.lock_one(pending, 1, TERMS, **{**arguments, argument: bad}))
    if argument == "deployment_id":
        refused(errors.InvalidId, lambda: store.create(request(deployment_id=bad), now=T0))


def test_invalid_id_is_a_validation_failure():
    assert issubclass(errors.InvalidId, errors.ValidationFailed)
    assert issubclass(errors.PayloadTooLarge, errors.ValidationFailed)


# ---------------------------------------------------------------------------------------
# Versions and finished executions
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("offset", [-2, -1, 1, 5], ids=["stale2", "stale1", "future1", "future5"])
def test_wrong_version_is_a_version_conflict(world, offset):
    locked = world["locked"]
    expected = locked.next_version
    requested = expected + offset
    calls = [
        lambda: store.append(locked.execution_id, requested, Finished(retval=Ok(1)), fence=locked.fence, now=T0),
        lambda: store.append_batch(
            locked.execution_id, requested, [Finished(retval=Ok(1))], fence=locked.fence, now=T0
        ),
    ]
    for call in calls:
        error = refused(errors.VersionConflict, call)
        assert (error.expected, error.requested) == (expected, requested)

    pending = world["pending"]
    arguments = dict(executor_id=new_executor_id(), run_id=new_run_id(), deployment_id=DEPLOYMENT, now=T0)
    error = refused(errors.VersionConflict, lambda: store.lock_one(pending, 1 + offset, TERMS, **arguments))
    assert (error.expected, error.requested) == (1, 1 + offset)
    (result,) = store.append_many(
        [store.AppendItem(locked.execution_id, requested, Finished(retval=Ok(1)), locked.fence)], now=T0
    )
    assert isinstance(result, errors.VersionConflict)
    assert (result.expected, result.requested) == (expected, requested)


@pytest.mark.parametrize(
    "event",
    [
        Finished(retval=Ok(2)),
        Finished(retval=Err("again")),
        TemporarilyFailed(backoff_expires_at=T0, reason="late"),
        helpers.history(JoinSetCreate(join_set_id="n:late")),
    ],
    ids=["finished", "finished_err", "temporarily_failed", "history_event"],
)
def test_appending_to_a_finished_execution_is_already_finished(world, event):
    finished = world["finished"]
    next_version = store.get_state(finished).next_version
    for version in (next_version, next_version + 1):
        refused(errors.AlreadyFinished, lambda v=version: store.append(finished, v, event, now=T0))
    refused(errors.AlreadyFinished, lambda: store.append_batch(finished, next_version, [event], now=T0))


def test_locking_or_pausing_a_finished_execution_is_refused(world):
    finished = world["finished"]
    refused(errors.IllegalState, lambda: helpers.lock(finished, now=T0), match="already finished")
    refused(errors.AlreadyFinished, lambda: store.pause_execution(finished, now=T0))
    assert store.cancel(finished, now=T0) == store.CancelOutcome.ALREADY_FINISHED


# ---------------------------------------------------------------------------------------
# Payloads
# ---------------------------------------------------------------------------------------


def json_bytes(value) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


def test_payload_limit_is_inclusive(world):
    fits = ["x" * (LIMIT - 4)]  # `["xx…x"]`
    too_big = ["x" * (LIMIT - 3)]
    assert (json_bytes(fits), json_bytes(too_big)) == (LIMIT, LIMIT + 1)
    with override_settings(OBELISK=SMALL_PAYLOADS):
        error = refused(errors.PayloadTooLarge, lambda: store.create(request(params=too_big), now=T0))
        assert (error.size, error.limit) == (LIMIT + 1, LIMIT)
        execution_id = helpers.create(params=fits, now=T0)
    assert store.get_created(execution_id).params == fits


def test_oversized_payloads_are_refused(world):
    big = "é" * (LIMIT // 2 + 5)  # fewer characters than the limit, but 2 bytes each in UTF-8
    workflow_id = world["workflow"].execution_id
    child = child_of(workflow_id)
    locked = world["locked"]
    calls = {
        "create params": lambda: store.create(request(params=[big]), now=T0),
        "finished ok": lambda: store.append(
            locked.execution_id, locked.next_version, Finished(retval=Ok(big)), fence=locked.fence, now=T0
        ),
        "finished err": lambda: store.append(
            locked.execution_id, locked.next_version, Finished(retval=Err({"why": big})), fence=locked.fence, now=T0
        ),
        "child request params": lambda: append_locked(world, child_request_event(workflow_id, child, params=[big])),
        "child create params": lambda: store.append_batch_create_new_execution(
            workflow_id,
            world["workflow"].next_version,
            [helpers.history(JoinSetCreate(join_set_id="n:js")), child_request_event(workflow_id, child)],
            [request(execution_id=child, params=[big], parent=(workflow_id, "n:js"))],
            fence=world["workflow"].fence,
            now=T0,
        ),
    }
    with override_settings(OBELISK=SMALL_PAYLOADS):
        for what, call in calls.items():
            error = refused(errors.PayloadTooLarge, call)
            assert error.limit == LIMIT, what
            assert error.size > LIMIT, what
        (result,) = store.append_many(
            [store.AppendItem(locked.execution_id, locked.next_version, Finished(retval=Ok(big)), locked.fence)], now=T0
        )
        assert isinstance(result, errors.PayloadTooLarge)
    assert store.get_state(locked.execution_id).state == "locked"


def _not_json():
    return [
        pytest.param(object(), id="object"),
        pytest.param(b"bytes", id="bytes"),
        pytest.param({1, 2}, id="set"),
        pytest.param(float("nan"), id="nan"),
        pytest.param(float("inf"), id="infinity"),
    ]


@pytest.mark.parametrize("value", _not_json())
def test_non_json_params_are_refused(world, value):
    refused(errors.UnsupportedValue, lambda: store.create(request(params=[value]), now=T0))


@pytest.mark.parametrize("value", _not_json())
def test_non_json_return_value_is_refused(world, value):
    locked = world["locked"]
    refused(
        errors.UnsupportedValue,
        lambda: store.append(
            locked.execution_id, locked.next_version, Finished(retval=Ok(value)), fence=locked.fence, now=T0
        ),
    )


@pytest.mark.parametrize("params", [{"a": 1}, "[1]", (1, 2), None, 7], ids=["dict", "str", "tuple", "none", "int"])
def test_params_must_be_a_list(world, params):
    refused(
        errors.ValidationFailed,
        lambda: store.create(request(params=params), now=T0),
        match="params must be a JSON array",
    )


def test_metadata_must_map_strings_to_strings(world):
    refused(errors.ValidationFailed, lambda: store.create(request(metadata={"k": 1}), now=T0))


# ---------------------------------------------------------------------------------------
# Times
# ---------------------------------------------------------------------------------------

NAIVE = datetime(2030, 1, 1, 12, 0, 0)

NAIVE_CALLS = {
    "create now": lambda w: store.create(request(), now=NAIVE),
    "create scheduled_at": lambda w: store.create(request(scheduled_at=NAIVE), now=T0),
    "append now": lambda w: store.append(w["pending"], 1, Finished(retval=Ok(1)), now=NAIVE),
    "append_batch now": lambda w: store.append_batch(w["pending"], 1, [Finished(retval=Ok(1))], now=NAIVE),
    "append_many now": lambda w: store.append_many(
        [store.AppendItem(w["pending"], 1, Finished(retval=Ok(1)))], now=NAIVE
    ),
    "lock_pending now": lambda w: lock_pending(now=NAIVE),
    "lock_one now": lambda w: helpers.lock(w["pending"], now=NAIVE),
    "expire_lock now": lambda w: store.expire_lock(w["locked"].execution_id, now=NAIVE),
    "cancel now": lambda w: store.cancel(w["pending"], now=NAIVE),
    "extend_lock expiry": lambda w: store.extend_lock(
        w["locked"].execution_id, w["locked"].fence, NAIVE + timedelta(seconds=30), now=T0
    ),
}


@pytest.mark.parametrize(
    "call",
    [name for name in NAIVE_CALLS],
)
def test_naive_datetimes_are_refused(world, call):
    refused(errors.ValidationFailed, lambda: NAIVE_CALLS[call](world), match="timezone-aware")


def test_naive_datetimes_in_events_are_refused_when_the_event_is_built():
    with pytest.raises(ValueError, match="timezone-aware"):
        TemporarilyFailed(backoff_expires_at=NAIVE, reason="x")
    with pytest.raises(ValueError, match="timezone-aware"):
        JoinNext(join_set_id="n:js", run_expires_at=NAIVE)


# ---------------------------------------------------------------------------------------
# Children and delays that belong to someone else
# ---------------------------------------------------------------------------------------


def test_child_id_must_match_its_parent_and_join_set(world):
    workflow_id = world["workflow"].execution_id
    other = world["pending"]
    child = child_of(workflow_id)
    mismatches = {
        "no parent": dict(execution_id=child),
        "other parent": dict(execution_id=child, parent=(other, "n:js")),
        "other join set": dict(execution_id=child, parent=(workflow_id, "n:other")),
        "top-level with parent": dict(parent=(workflow_id, "n:js")),
    }
    for overrides in mismatches.values():
        refused(errors.ValidationFailed, lambda o=overrides: store.create(request(**o), now=T0))


def test_child_request_must_name_a_child_of_this_execution_and_join_set(world):
    workflow_id = world["workflow"].execution_id
    for child in (
        child_of(world["pending"]),  # someone else's child
        child_of(workflow_id, name="other"),  # another join set
        "E_" + ExecutionId.generate().ulid,  # a top-level id
    ):
        refused(errors.ValidationFailed, lambda c=child: append_locked(world, child_request_event(workflow_id, c)))


def test_created_children_must_belong_to_the_appending_execution(world):
    workflow = world["workflow"]
    other = world["pending"]
    foreign_child = child_of(other)
    refused(
        errors.ValidationFailed,
        lambda: store.append_batch_create_new_execution(
            workflow.execution_id,
            workflow.next_version,
            [helpers.history(JoinSetCreate(join_set_id="n:js"))],
            [request(execution_id=foreign_child, parent=(other, "n:js"))],
            fence=workflow.fence,
            now=T0,
        ),
    )
    refused(
        errors.ValidationFailed,
        lambda: store.append_batch_create_new_execution(
            workflow.execution_id,
            workflow.next_version,
            [helpers.history(JoinSetCreate(join_set_id="n:js"))],
            [request(scheduled_by=other)],
            fence=workflow.fence,
            now=T0,
        ),
    )


def test_delay_must_belong_to_this_execution_and_join_set(world):
    workflow_id = world["workflow"].execution_id
    for owner, name in ((world["pending"], "js"), (workflow_id, "other")):
        delay = str(DelayId(ExecutionId.parse(owner), JoinSetId("n", name), 1))
        refused(errors.ValidationFailed, lambda d=delay: append_locked(world, delay_request_event(d)))


def test_created_cannot_be_appended(world):
    created = Created(ffqn=FFQN, params=[], scheduled_at=T0, component_id=ACTIVITY, deployment_id=DEPLOYMENT)
    refused(errors.ValidationFailed, lambda: store.append(world["pending"], 1, created, now=T0), match="use `create`")


def test_empty_batches_are_refused(world):
    workflow = world["workflow"]
    refused(
        errors.ValidationFailed,
        lambda: store.append_batch(workflow.execution_id, workflow.next_version, [], fence=workflow.fence, now=T0),
    )
    refused(
        errors.ValidationFailed,
        lambda: store.append_batch_create_new_execution(
            workflow.execution_id, workflow.next_version, [], [request(scheduled_by=workflow.execution_id)],
            fence=workflow.fence, now=T0,
        ),
    )  # fmt: skip


def test_a_join_set_created_twice_is_refused(world):
    """A join set is created once per execution (its id names its children and delays, and
    its join-nexts count its responses): a second ``JoinSetCreate`` of it, in a later write
    or in the same one, is a conflict, and the write leaves nothing behind."""
    workflow = world["workflow"]

    def create(*names):
        events = [helpers.history(JoinSetCreate(join_set_id=name)) for name in names]
        return store.append_batch(workflow.execution_id, None, events, fence=workflow.fence, now=T0)

    create("n:js")
    refused(errors.Conflict, lambda: create("n:js"))
    refused(errors.Conflict, lambda: create("n:other", "n:other"))
    create("n:other")


def test_append_many_takes_each_execution_once(world):
    pending = world["pending"]
    item = store.AppendItem(pending, 1, Finished(retval=Ok(1)))
    refused(errors.ValidationFailed, lambda: store.append_many([item, item], now=T0))


# ---------------------------------------------------------------------------------------
# Long error details are cut, not refused
# ---------------------------------------------------------------------------------------


def test_long_traceback_is_truncated_not_refused(world):
    locked = world["locked"]
    traceback = "Traceback (most recent call last):\n" + "  File 'x.py', line 1, in f\n" * 400 + "ValueError: boom"
    reason = "r" * 300
    with override_settings(OBELISK={**SMALL_PAYLOADS, "MAX_ERROR_DETAIL_CHARS": 100}):
        store.append(
            locked.execution_id,
            locked.next_version,
            TemporarilyFailed(backoff_expires_at=T0 + timedelta(seconds=1), reason=reason, detail=traceback),
            fence=locked.fence,
            now=T0,
        )
    stored = store.get_last_event(locked.execution_id).event
    assert isinstance(stored, TemporarilyFailed)
    assert stored.detail == "…" + traceback[-100:]  # the end of a traceback says what failed
    assert stored.detail.endswith("ValueError: boom")
    assert stored.reason == "r" * 100 + "…"
    assert store.get_state(locked.execution_id).intermittent_event_count == 1


def test_error_detail_at_the_limit_is_kept_whole(world):
    locked = world["locked"]
    detail = "d" * 100
    with override_settings(OBELISK={**settings.OBELISK, "MAX_ERROR_DETAIL_CHARS": 100}):
        store.append(
            locked.execution_id,
            locked.next_version,
            TemporarilyFailed(backoff_expires_at=T0, reason="x" * 100, detail=detail),
            fence=locked.fence,
            now=T0,
        )
    stored = store.get_last_event(locked.execution_id).event
    assert (stored.reason, stored.detail) == ("x" * 100, detail)
