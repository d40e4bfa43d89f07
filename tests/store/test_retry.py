"""Retries, back-off and lock expiry (spec 000 §10; decision 14 for cancelling locks).

Pure arithmetic of ``state_machine.retry_backoff`` / ``on_lock_expired`` / ``failure_event``
first, then the same rules through the store, read back from the log. All times are
explicit (``now=``), starting at ``helpers.T0``.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest

from executions import errors, state_machine, store
from executions.events import (
    Err,
    Finished,
    JoinSetCreate,
    RetryConfig,
    TemporarilyFailed,
    TemporarilyTimedOut,
    Unlocked,
)
from executions.ids import new_executor_id, new_run_id
from executions.models import ExecutionEvent
from executions.state_machine import MAX_BACKOFF, ExpiredLock, on_lock_expired, retry_backoff
from tests.support import helpers
from tests.support.helpers import ACTIVITY, DEPLOYMENT, FFQN, T0

pytestmark = pytest.mark.django_db

SECOND = timedelta(seconds=1)
LOCK_FOR = 10 * SECOND
RETRY_2 = RetryConfig(max_retries=2, retry_exp_backoff=SECOND)
TERMS_2 = store.LockTerms(ACTIVITY, RETRY_2, LOCK_FOR)
TEMPORARY = ("temporarily_failed", "temporarily_timed_out")


# ---------------------------------------------------------------------------------------
# retry_backoff: backoff * 2^(n-1) while n <= max_retries (spec 000 §10)
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("max_retries", [1, 2, 5, 12])
@pytest.mark.parametrize(
    "backoff", [SECOND, timedelta(milliseconds=250), timedelta(minutes=3)], ids=["1s", "250ms", "3min"]
)
def test_backoff_doubles_until_the_retries_are_spent(max_retries, backoff):
    for n in range(1, max_retries + 1):
        assert retry_backoff(n, max_retries, backoff) == backoff * 2 ** (n - 1), n
    assert retry_backoff(max_retries + 1, max_retries, backoff) is None
    assert retry_backoff(max_retries + 7, max_retries, backoff) is None


def test_no_retries_at_all():
    assert retry_backoff(1, 0, SECOND) is None


def test_zero_backoff_retries_at_once():
    assert retry_backoff(1, None, timedelta(0)) == timedelta(0)
    assert retry_backoff(50, None, timedelta(0)) == timedelta(0)


@pytest.mark.parametrize("n", [1, 2, 10, 24])
def test_unlimited_retries_keep_doubling(n):
    assert retry_backoff(n, None, SECOND) == SECOND * 2 ** (n - 1)


@pytest.mark.parametrize("n", [26, 1000, 2**32 - 1], ids=["first-above-a-year", "1000", "u32-max"])
def test_unlimited_retries_saturate_at_max_backoff(n):
    # 2^25 s is 388 days: the first wait above MAX_BACKOFF (365 days).
    assert retry_backoff(n, None, SECOND) == MAX_BACKOFF


@pytest.mark.parametrize(
    ("n", "backoff", "expected"),
    [
        (9, timedelta(days=1), timedelta(days=256)),
        (10, timedelta(days=1), MAX_BACKOFF),
        (1, timedelta(days=400), MAX_BACKOFF),
        (60, timedelta(milliseconds=1), MAX_BACKOFF),
        (60, timedelta(microseconds=1), MAX_BACKOFF),
    ],
    ids=["256-days", "512-days-saturates", "huge-first-backoff", "1ms-n60", "1us-n60"],
)
def test_backoff_saturates(n, backoff, expected):
    assert retry_backoff(n, 100, backoff) == expected


def test_backoff_never_decreases():
    waits = [retry_backoff(n, None, timedelta(milliseconds=3)) for n in range(1, 80)]
    assert waits == sorted(waits)
    assert waits[-1] == MAX_BACKOFF


# ---------------------------------------------------------------------------------------
# failure_event: what an executor appends after a failed attempt
# ---------------------------------------------------------------------------------------


def _failure(count: int, *, timed_out: bool = False, max_retries: int | None = 2):
    return state_machine.failure_event(
        intermittent_event_count=count, max_retries=max_retries, backoff=SECOND, now=T0,
        timed_out=timed_out, reason="boom", detail="trace", final=Finished(retval=Err("gave up")),
    )  # fmt: skip


def test_failure_event_retries_then_gives_the_final_result():
    assert _failure(0) == TemporarilyFailed(backoff_expires_at=T0 + SECOND, reason="boom", detail="trace")
    assert _failure(1) == TemporarilyFailed(backoff_expires_at=T0 + 2 * SECOND, reason="boom", detail="trace")
    assert _failure(2) == Finished(retval=Err("gave up"))
    assert _failure(1, timed_out=True) == TemporarilyTimedOut(backoff_expires_at=T0 + 2 * SECOND, reason="boom")
    assert _failure(2, timed_out=True) == Finished(retval=Err("gave up"))
    assert _failure(0, max_retries=0) == Finished(retval=Err("gave up"))


# ---------------------------------------------------------------------------------------
# on_lock_expired: the sweep's decision
# ---------------------------------------------------------------------------------------


def assert_worker_vanished(event, backoff_expires_at):
    """The sweep's timeout: retried at the back-off, and told apart from an attempt's own
    timeout by its reason (issue 11: a lock expires only when its worker vanished)."""
    assert isinstance(event, TemporarilyTimedOut), event
    assert event.backoff_expires_at == backoff_expires_at
    assert event.reason.startswith("lock expired: its worker stopped renewing it")


def expired(*, count=0, max_retries=2, backoff=SECOND, locked_at=1, next_version=2, lifecycle="active") -> ExpiredLock:
    return ExpiredLock(
        execution_id="E_01JAAAAAAAAAAAAAAAAAAAAAAA", locked_at_version=locked_at, next_version=next_version,
        intermittent_event_count=count, max_retries=max_retries, retry_exp_backoff=backoff,
        executor_id=new_executor_id(), run_id=new_run_id(), lifecycle=lifecycle,
    )  # fmt: skip


@pytest.mark.parametrize("count", [0, 1, 2, 3])
def test_expired_activity_with_retries_left_times_out_temporarily(count):
    event = on_lock_expired(expired(count=count, max_retries=4), T0)
    assert_worker_vanished(event, T0 + SECOND * 2**count)


@pytest.mark.parametrize(("count", "max_retries"), [(2, 2), (5, 2), (0, 0)])
def test_expired_activity_without_retries_left_finishes_timed_out(count, max_retries):
    event = on_lock_expired(expired(count=count, max_retries=max_retries), T0)
    assert isinstance(event, Finished) and event.retval.kind == "timed_out"


def test_expired_activity_that_made_progress_still_counts_a_failure():
    # "made progress" applies to workflows only (max_retries None).
    event = on_lock_expired(expired(count=0, max_retries=2, locked_at=1, next_version=4), T0)
    assert_worker_vanished(event, T0 + SECOND)


def test_expired_workflow_that_made_progress_is_unlocked():
    event = on_lock_expired(expired(count=3, max_retries=None, backoff=timedelta(0), locked_at=1, next_version=3), T0)
    assert event == Unlocked(unlocked_at=T0, reason="made progress")


def test_expired_workflow_without_progress_times_out_temporarily():
    event = on_lock_expired(expired(count=3, max_retries=None, backoff=SECOND, locked_at=4, next_version=5), T0)
    assert_worker_vanished(event, T0 + 8 * SECOND)


@pytest.mark.parametrize("max_retries", [None, 0, 2])
def test_expired_cancelling_lock_finishes_cancelled(max_retries):
    event = on_lock_expired(expired(max_retries=max_retries, next_version=7, lifecycle="cancelling"), T0)
    assert isinstance(event, Finished) and event.retval.kind == "cancelled"


def test_expired_cancelling_workflow_with_running_children_is_unlocked_not_finished():
    """Decision 14 / D26: a cancelling workflow ends only after its children."""
    lock = dataclasses.replace(expired(max_retries=None, next_version=7, lifecycle="cancelling"), children_running=True)
    event = on_lock_expired(lock, T0)
    assert isinstance(event, Unlocked) and "waiting for its children" in event.reason


# ---------------------------------------------------------------------------------------
# Through the store: the log and t_state agree with the rule
# ---------------------------------------------------------------------------------------


def temporary_events(execution_id: str) -> int:
    return ExecutionEvent.objects.filter(execution_id=execution_id, variant__in=TEMPORARY).count()


def lock_due(now):
    """What an executor polling at ``now`` locks."""
    return store.lock_pending(
        {FFQN: TERMS_2}, limit=10, executor_id=new_executor_id(), run_id=new_run_id(), deployment_id=DEPLOYMENT, now=now
    )


@pytest.mark.parametrize("timed_out", [False, True], ids=["failed", "timed-out"])
def test_activity_retries_with_exponential_backoff_then_finishes(timed_out):
    execution_id = helpers.create(now=T0)
    (locked,) = lock_due(T0)
    expected_waits = [SECOND, 2 * SECOND]  # backoff * 2^(n-1), n = 1, 2
    for attempt, wait in enumerate(expected_waits):
        count = store.get_state(execution_id).intermittent_event_count
        assert locked.intermittent_event_count == count == attempt
        assert locked.fence.lock_generation == attempt + 1  # every new lock is a new generation
        failed_at = locked.locked.lock_expires_at - 5 * SECOND
        event = _attempt_failed(execution_id, locked, count, failed_at, timed_out)
        assert event.backoff_expires_at == failed_at + wait
        logged = store.get_last_event(execution_id)
        assert (logged.event, logged.created_at) == (event, failed_at)

        row = store.get_state(execution_id)
        assert (row.state, row.pending_expires_finished) == ("pending_at", failed_at + wait)
        assert row.intermittent_event_count == temporary_events(execution_id) == attempt + 1
        # Picked up again exactly when the back-off expires, not a microsecond earlier.
        assert lock_due(event.backoff_expires_at - timedelta(microseconds=1)) == []
        (locked,) = lock_due(event.backoff_expires_at)

    assert locked.intermittent_event_count == 2
    final = _attempt_failed(execution_id, locked, 2, locked.locked.lock_expires_at - 5 * SECOND, timed_out)
    assert final == Finished(retval=Err("gave up"))
    row = store.get_state(execution_id)
    assert (row.state, row.intermittent_event_count, temporary_events(execution_id)) == ("finished", 2, 2)
    assert helpers.event_variants(execution_id) == ["created"] + ["locked", TEMPORARY[timed_out]] * 2 + [
        "locked",
        "finished",
    ]


def _attempt_failed(execution_id, locked, count, now, timed_out):
    event = state_machine.failure_event(
        intermittent_event_count=count, max_retries=RETRY_2.max_retries, backoff=RETRY_2.retry_exp_backoff,
        now=now, timed_out=timed_out, reason="boom", detail=None, final=Finished(retval=Err("gave up")),
    )  # fmt: skip
    store.append(execution_id, locked.next_version, event, fence=locked.fence, now=now)
    return event


def test_expired_activity_lock_retries_then_finishes_timed_out():
    execution_id = helpers.create(now=T0)
    now = T0
    for count, wait in [(0, SECOND), (1, 2 * SECOND)]:
        locked = helpers.lock(execution_id, now=now, terms=TERMS_2)
        expires = now + LOCK_FOR
        _assert_not_expired_yet(execution_id, expires)
        (timer,) = store.get_expired_timers(now=expires)[1]
        assert (timer.execution_id, timer.intermittent_event_count, timer.max_retries, timer.retry_exp_backoff) == (
            execution_id, count, 2, SECOND,
        )  # fmt: skip
        assert (timer.locked_at_version, timer.next_version) == (locked.next_version - 1, locked.next_version)

        event = store.expire_lock(execution_id, now=expires)
        assert_worker_vanished(event, expires + wait)
        logged = store.get_last_event(execution_id)
        assert (logged.version, logged.created_at, logged.event) == (locked.next_version, expires, event)
        row = store.get_state(execution_id)
        assert (row.state, row.pending_expires_finished) == ("pending_at", expires + wait)
        assert row.intermittent_event_count == temporary_events(execution_id) == count + 1
        assert row.lock_generation == locked.fence.lock_generation + 1  # the sweep revoked the lock
        with pytest.raises(errors.LockLost):
            store.append(execution_id, row.next_version, Finished(retval=Err("late")), fence=locked.fence, now=expires)
        now = expires + wait

    locked = helpers.lock(execution_id, now=now, terms=TERMS_2)
    event = store.expire_lock(execution_id, now=now + LOCK_FOR)
    assert isinstance(event, Finished) and event.retval.kind == "timed_out"
    assert store.get_last_event(execution_id).event == event
    assert store.get_finished_result(execution_id).kind == "timed_out"
    row = store.get_state(execution_id)
    assert (row.state, row.corresponding_version, row.intermittent_event_count) == ("finished", locked.next_version, 2)
    assert row.result_kind == '{"err":{"execution_failure":"timed_out"}}'


def _assert_not_expired_yet(execution_id, expires):
    before = helpers.db_snapshot()
    assert store.expire_lock(execution_id, now=expires - timedelta(microseconds=1)) is None
    assert store.get_expired_timers(now=expires - timedelta(microseconds=1))[1] == []
    assert helpers.db_snapshot() == before


def test_expired_workflow_lock_after_progress_is_unlocked_without_a_failure():
    execution_id = helpers.create_workflow(now=T0)
    locked = helpers.lock(execution_id, now=T0)
    store.append(
        execution_id,
        locked.next_version,
        helpers.history(JoinSetCreate(join_set_id="n:js")),
        fence=locked.fence,
        now=T0,
    )
    expires = T0 + LOCK_FOR
    event = store.expire_lock(execution_id, now=expires)
    assert event == Unlocked(unlocked_at=expires, reason="made progress")
    assert store.get_last_event(execution_id).event == event
    row = store.get_state(execution_id)
    assert (row.state, row.pending_expires_finished, row.intermittent_event_count) == ("pending_at", expires, 0)
    assert temporary_events(execution_id) == 0


def test_expired_workflow_lock_without_progress_times_out_temporarily():
    execution_id = helpers.create_workflow(now=T0)
    helpers.lock(execution_id, now=T0)  # unlimited retries, zero back-off
    expires = T0 + LOCK_FOR
    event = store.expire_lock(execution_id, now=expires)
    assert_worker_vanished(event, expires)
    row = store.get_state(execution_id)
    assert (row.state, row.pending_expires_finished, row.intermittent_event_count) == ("pending_at", expires, 1)
    assert helpers.event_variants(execution_id) == ["created", "locked", "temporarily_timed_out"]


def test_store_finishes_an_expired_cancelling_lock_as_cancelled():
    execution_id = helpers.create(now=T0)
    helpers.lock(execution_id, now=T0, terms=TERMS_2)
    store.cancel(execution_id, now=T0 + SECOND)
    event = store.expire_lock(execution_id, now=T0 + LOCK_FOR)
    assert isinstance(event, Finished) and event.retval.kind == "cancelled"
    assert store.get_finished_result(execution_id).kind == "cancelled"
    assert helpers.event_variants(execution_id) == ["created", "locked", "cancellation_requested", "finished"]
    assert store.get_state(execution_id).intermittent_event_count == 0


@pytest.mark.parametrize("situation", ["pending", "extended", "finished"])
def test_expire_lock_skips_rows_that_are_not_expired_locks(situation):
    execution_id = helpers.create(now=T0)
    if situation != "pending":
        locked = helpers.lock(execution_id, now=T0, terms=TERMS_2)
    if situation == "extended":
        event = locked.locked.model_copy(update={"lock_expires_at": T0 + 60 * SECOND})
        store.append(execution_id, locked.next_version, event, fence=locked.fence, now=T0 + SECOND)
    if situation == "finished":
        store.append(execution_id, locked.next_version, Finished(retval=Err(0)), fence=locked.fence, now=T0 + SECOND)
    before = helpers.db_snapshot()
    assert store.expire_lock(execution_id, now=T0 + LOCK_FOR) is None
    assert helpers.db_snapshot() == before


def test_executor_retry_after_sweep_is_fenced_by_the_version():
    """The holder's late TemporarilyFailed after the sweep timed it out is refused (§10: the
    sweep and the executor race on the same version; the loser gets an error)."""
    execution_id = helpers.create(now=T0)
    locked = helpers.lock(execution_id, now=T0, terms=TERMS_2)
    store.expire_lock(execution_id, now=T0 + LOCK_FOR)
    late = TemporarilyFailed(backoff_expires_at=T0 + 20 * SECOND, reason="late")
    before = helpers.db_snapshot()
    with pytest.raises((errors.LockLost, errors.VersionConflict)):
        store.append(execution_id, locked.next_version, late, fence=locked.fence, now=T0 + LOCK_FOR)
    assert helpers.db_snapshot() == before
    assert store.get_state(execution_id).intermittent_event_count == 1
