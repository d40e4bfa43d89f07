"""Store defects found by the model-based test and by trying the engine from outside
(issue 11, item 9), each held by a test named after the guarantee.

- Values round-trip exactly on both databases (decision 15): PostgreSQL's JSONB rewrote
  ``1e16`` as an integer, ``-0.0`` as ``0.0`` and ``1e300`` as a 301-digit integer, so an
  identical idempotent create was refused as ``Conflict`` and code got other values.
- A NUL character is refused with a typed error before any write (it raised Django's
  untyped ``DataError`` on PostgreSQL and sank a whole group commit).
- ``create_many`` is all or nothing.
- The sweep never finishes a cancelling workflow whose children still run.
"""

import json

import pytest

from executions import errors, store
from executions.events import ChildExecutionRequest, Finished, JoinSetCreate, JoinSetRequest, Ok
from executions.ids import ExecutionId, JoinSetId
from tests.support import helpers
from tests.support.helpers import ACTIVITY, DEPLOYMENT, FFQN, T0, TERMS

pytestmark = pytest.mark.django_db

EXACT_VALUES = [
    pytest.param([1e16], id="1e16"),
    pytest.param([-0.0], id="negative-zero"),
    pytest.param([1e300], id="1e300"),
    pytest.param([12345678901234567890123], id="big-int"),
    pytest.param([0.1, 2.5e-308, {"k": [1.0, 1]}], id="floats-and-ints"),
    pytest.param(["\u2028 é 🎉"], id="unicode"),
]


def as_text(value) -> str:
    """JSON text that tells ``1e16`` from ``10000000000000000`` and ``-0.0`` from ``0.0``."""
    return json.dumps(value)


@pytest.mark.parametrize("params", EXACT_VALUES)
def test_params_read_back_exactly_as_written(params):
    execution_id = helpers.create(params=params, now=T0)
    assert as_text(store.get_created(execution_id).params) == as_text(params)
    (locked,) = store.lock_pending({FFQN: TERMS}, limit=1, executor_id="Exr_01JAAAAAAAAAAAAAAAAAAAAAAA",
                                   run_id="Run_01JAAAAAAAAAAAAAAAAAAAAAAA", deployment_id=DEPLOYMENT, now=T0)  # fmt: skip
    assert as_text(locked.params) == as_text(params)


@pytest.mark.parametrize("params", EXACT_VALUES)
def test_an_identical_resubmission_is_idempotent_not_a_conflict(params):
    execution_id = helpers.create(params=params, now=T0)
    outcome = store.create(
        store.CreateRequest(execution_id=execution_id, ffqn=FFQN, params=json.loads(json.dumps(params)),
                            component_id=ACTIVITY, deployment_id=DEPLOYMENT),
        now=T0,
    )  # fmt: skip
    assert outcome.already_existed


@pytest.mark.parametrize("value", [v.values[0][0] for v in EXACT_VALUES])
def test_results_read_back_exactly_as_written(value):
    execution_id = helpers.create(now=T0)
    locked = helpers.lock(execution_id, now=T0)
    store.append(execution_id, None, Finished(retval=Ok(value)), fence=locked.fence, now=T0)
    assert as_text(store.get_finished_result(execution_id).value) == as_text(value)


@pytest.mark.parametrize(
    "params",
    [["a\x00b"], [{"a\x00": 1}], [[["x\x00"]]], ["\udcff"]],
    ids=["nul-in-string", "nul-in-key", "nul-nested", "lone-surrogate"],
)
def test_unstorable_text_is_refused_with_a_typed_error_and_nothing_written(params):
    before = helpers.db_snapshot()
    with pytest.raises(errors.UnsupportedValue):
        helpers.create(params=params, now=T0)
    assert helpers.db_snapshot() == before


def test_a_deeply_nested_value_is_refused_not_a_recursion_error():
    value: list = []
    for _ in range(50_000):
        value = [value]
    before = helpers.db_snapshot()
    with pytest.raises(errors.UnsupportedValue, match="nested more than"):
        helpers.create(params=[value], now=T0)
    assert helpers.db_snapshot() == before


def test_a_result_with_a_nul_is_refused_for_that_execution_only():
    """One refused result in a group commit does not sink its batchmates (item 4)."""
    ids = [helpers.create(now=T0) for _ in range(3)]
    locks = [helpers.lock(execution_id, now=T0) for execution_id in ids]
    values = ["fine", "a\x00b", "also fine"]
    items = [
        store.AppendItem(locked.execution_id, None, Finished(retval=Ok(value)), locked.fence)
        for locked, value in zip(locks, values, strict=True)
    ]
    results = store.append_many(items, now=T0)
    assert isinstance(results[1], errors.UnsupportedValue)
    assert [store.get_finished_result(i) for i in (ids[0], ids[2])] == [Ok("fine"), Ok("also fine")]
    assert store.get_state(ids[1]).state == "locked"


def test_nul_in_a_failure_reason_is_escaped_not_refused():
    execution_id = helpers.create(now=T0)
    locked = helpers.lock(execution_id, now=T0)
    failed = store.AttemptFailed(
        "ValueError: a\x00b", Finished(retval=Ok(None)), detail="Traceback\x00 \udcff", timed_out=False
    )
    store.append(execution_id, None, failed, fence=locked.fence, now=T0)
    event = store.get_last_event(execution_id).event
    assert event.reason == "ValueError: a\\x00b"
    assert "\x00" not in event.detail and "\\udcff" in event.detail


def test_create_many_is_all_or_nothing():
    existing = helpers.create(params=[1], now=T0)
    fresh = str(ExecutionId.generate())

    def request(execution_id, params):
        return store.CreateRequest(
            execution_id=execution_id, ffqn=FFQN, params=params, component_id=ACTIVITY, deployment_id=DEPLOYMENT
        )

    before = helpers.db_snapshot()
    with pytest.raises(errors.Conflict):
        store.create_many([request(fresh, [1]), request(existing, [2])], now=T0)
    assert helpers.db_snapshot() == before  # the fresh one was not created either

    outcomes = store.create_many([request(fresh, [1]), request(existing, [1])], now=T0)
    assert [o.already_existed for o in outcomes] == [False, True]
    assert store.get_state(fresh).state == "pending_at"


def test_the_sweep_never_finishes_a_cancelling_workflow_whose_children_run():
    """Locked workflow submits a child, is cancelled, its lock expires: the sweep must not
    finish it (decision 14: a cancelled workflow ends after its children)."""
    workflow = helpers.create_workflow(now=T0)
    locked = helpers.lock(workflow, now=T0)
    js = JoinSetId("n", "kids")
    child = str(ExecutionId.parse(workflow).child(js, 1))
    store.append_batch_create_new_execution(
        workflow,
        None,
        [
            helpers.history(JoinSetCreate(join_set_id=str(js))),
            helpers.history(
                JoinSetRequest(
                    join_set_id=str(js),
                    request=ChildExecutionRequest(child_execution_id=child, target_ffqn=FFQN, params=[]),
                )
            ),
        ],
        [
            store.CreateRequest(
                execution_id=child, ffqn=FFQN, params=[], component_id=ACTIVITY, deployment_id=DEPLOYMENT,
                parent=(workflow, str(js)),
            )
        ],
        fence=locked.fence,
        now=T0,
    )  # fmt: skip
    store.cancel(workflow, now=T0)
    after_expiry = locked.locked.lock_expires_at
    store.expire_lock(workflow, now=after_expiry)
    state = store.get_state(workflow)
    assert (state.state, state.lifecycle) == ("pending_at", "cancelling")
    assert not store.finish_cancelled(workflow, now=after_expiry)  # the child still runs

    child_lock = helpers.lock(child, now=after_expiry)
    store.append(child, None, Finished(retval=Ok(1)), fence=child_lock.fence, now=after_expiry)
    assert store.finish_cancelled(workflow, now=after_expiry)
    assert store.get_finished_result(workflow).kind == "cancelled"
