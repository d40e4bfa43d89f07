"""Concurrency on PostgreSQL (spec 000 §13.2, README decision 11): real threads, each with
its own database connection, racing through the store. SQLite's single writer hides these
races, so every test here is PostgreSQL-only. Timeouts are safety limits, never assertions."""

import threading
import time
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection, transaction

from executions import errors, notify, store
from executions.events import (
    ChildExecutionRequest,
    Finished,
    JoinNext,
    JoinSetCreate,
    JoinSetRequest,
    Ok,
    RetryConfig,
)
from executions.ids import ExecutionId, JoinSetId, new_executor_id, new_run_id
from executions.models import ExecutionEvent, ExecutionState, JoinSetResponse
from executions.state_machine import State
from tests.support import helpers
from tests.support.helpers import ACTIVITY, DEPLOYMENT, FFQN, T0, TERMS

pytestmark = [pytest.mark.postgres_only, pytest.mark.django_db(transaction=True)]

SAFETY_TIMEOUT = 60  # seconds; only ever hit when something hangs


def run_threads(*targets, abort: threading.Event | None = None, timeout=SAFETY_TIMEOUT):
    """Run each callable in its own thread (own DB connection); return their results in order.

    Re-raises the first exception of any thread (and sets ``abort`` so the others can stop);
    fails if a thread hangs.
    """
    results = [None] * len(targets)
    failures = []

    def body(index, target):
        try:
            results[index] = target()
        except BaseException as error:  # noqa: BLE001 - re-raised in the test's thread
            failures.append(error)
            if abort is not None:
                abort.set()
        finally:
            connection.close()

    threads = [threading.Thread(target=body, args=(i, t), daemon=True) for i, t in enumerate(targets)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    if failures:
        raise failures[0]
    assert not any(thread.is_alive() for thread in threads), "a thread hung (deadlock or lost wake-up?)"
    return results


def lock_pending(limit, *, at, run_id=None, executor_id=None):
    return store.lock_pending(
        {FFQN: TERMS},
        limit=limit,
        executor_id=executor_id or new_executor_id(),
        run_id=run_id or new_run_id(),
        deployment_id=DEPLOYMENT,
        now=at,
    )


# ---------------------------------------------------------------------------------------
# a. Concurrent lock_pending: every execution locked exactly once
# ---------------------------------------------------------------------------------------


def test_concurrent_lock_pending_locks_every_execution_exactly_once():
    ids = {helpers.create(now=T0) for _ in range(400)}
    start = threading.Barrier(8)

    def claimer():
        run_id = new_run_id()
        claimed = []
        start.wait(SAFETY_TIMEOUT)
        while batch := lock_pending(7, at=T0, run_id=run_id):
            claimed.extend(locked.execution_id for locked in batch)
            assert all(locked.fence == store.Fence(run_id, 1) for locked in batch)
        return run_id, claimed

    per_thread = run_threads(*[claimer] * 8)

    claimed = [execution_id for _, batch in per_thread for execution_id in batch]
    assert len(claimed) == len(set(claimed)), "an execution was handed out twice"
    assert set(claimed) == ids
    locks = Counter(ExecutionEvent.objects.filter(variant="locked").values_list("execution_id", flat=True))
    assert set(locks.values()) == {1} and set(locks) == ids
    owner = dict(ExecutionState.objects.values_list("execution_id", "run_id"))
    for run_id, batch in per_thread:
        assert all(owner[execution_id] == run_id for execution_id in batch)
    assert set(ExecutionState.objects.values_list("state", "corresponding_version", "lock_generation")) == {
        (State.LOCKED, 1, 1)
    }


def test_lock_pending_skips_rows_locked_by_another_transaction():
    held = [helpers.create(now=T0) for _ in range(5)]  # the oldest: first in line
    free = {helpers.create(now=T0 + timedelta(seconds=1)) for _ in range(5)}
    rows_held, release = threading.Event(), threading.Event()

    def holder():
        with transaction.atomic():
            list(ExecutionState.objects.select_for_update().filter(pk__in=held).values_list("pk"))
            rows_held.set()
            release.wait(SAFETY_TIMEOUT)

    def claimer():
        assert rows_held.wait(SAFETY_TIMEOUT)
        try:
            return [locked.execution_id for locked in lock_pending(5, at=T0 + timedelta(seconds=2))]
        finally:
            release.set()  # if lock_pending waited for the held rows, it only gets here after the safety timeout

    release_timer = threading.Timer(SAFETY_TIMEOUT / 2, release.set)
    release_timer.start()
    try:
        _, claimed = run_threads(holder, claimer)
    finally:
        release_timer.cancel()
    assert set(claimed) == free, "lock_pending waited for, or took, rows another transaction holds"
    assert {locked.execution_id for locked in lock_pending(10, at=T0 + timedelta(seconds=2))} == set(held)


# ---------------------------------------------------------------------------------------
# b. The holder finishing while the sweep expires its lock: exactly one wins
# ---------------------------------------------------------------------------------------


def test_holder_and_sweep_racing_on_an_expired_lock_have_exactly_one_winner():
    no_retries = store.LockTerms(ACTIVITY, RetryConfig(max_retries=0), timedelta(seconds=10))
    for _ in range(40):
        helpers.create(now=T0)
    locks = {
        locked.execution_id: locked
        for locked in store.lock_pending(
            {FFQN: no_retries}, limit=100, executor_id=new_executor_id(), run_id=new_run_id(),
            deployment_id=DEPLOYMENT, now=T0,
        )
    }  # fmt: skip
    expired = T0 + timedelta(seconds=11)
    order = sorted(locks)
    pairs = 8
    barriers = {execution_id: threading.Barrier(2) for execution_id in order}

    def holder(share):
        outcomes = {}
        for execution_id in share:
            locked = locks[execution_id]
            barriers[execution_id].wait(SAFETY_TIMEOUT)
            try:
                store.append(
                    execution_id, locked.next_version, Finished(retval=Ok("holder")), fence=locked.fence, now=expired
                )
                outcomes[execution_id] = "wrote"
            except (errors.LockLost, errors.VersionConflict):
                outcomes[execution_id] = "lost"
        return outcomes

    def sweeper(share):
        outcomes = {}
        for execution_id in share:
            barriers[execution_id].wait(SAFETY_TIMEOUT)
            outcomes[execution_id] = store.expire_lock(execution_id, now=expired)
        return outcomes

    shares = [order[i::pairs] for i in range(pairs)]
    results = run_threads(*[lambda s=s: holder(s) for s in shares], *[lambda s=s: sweeper(s) for s in shares])
    held = {k: v for outcome in results[:pairs] for k, v in outcome.items()}
    swept = {k: v for outcome in results[pairs:] for k, v in outcome.items()}

    for execution_id in order:
        events = store.get(execution_id).events
        assert [type(record.event).__name__ for record in events] == ["Created", "Locked", "Finished"], execution_id
        if held[execution_id] == "wrote":
            assert swept[execution_id] is None, f"{execution_id}: both the holder and the sweep won"
            assert events[-1].event == Finished(retval=Ok("holder"))
        else:
            timed_out = swept[execution_id]
            assert isinstance(timed_out, Finished), f"{execution_id}: neither the holder nor the sweep won"
            assert timed_out.retval.kind == "timed_out" and timed_out.retval.reason.startswith("lock expired")
            assert events[-1].event == timed_out
        assert store.get_state(execution_id).state == State.FINISHED


# ---------------------------------------------------------------------------------------
# c. Spec 000 §13.2: children finishing while the parent joins; the parent is always woken
# ---------------------------------------------------------------------------------------

CHILDREN = 30


def spawn_children(parent: str, holder: store.LockedExecution, js: JoinSetId) -> tuple[list[str], int]:
    children = [str(ExecutionId.parse(parent).child(js, i)) for i in range(1, CHILDREN + 1)]
    events = [helpers.history(JoinSetCreate(join_set_id=str(js)))] + [
        helpers.history(
            JoinSetRequest(
                join_set_id=str(js),
                request=ChildExecutionRequest(child_execution_id=child, target_ffqn=FFQN, params=[i]),
            )
        )
        for i, child in enumerate(children)
    ]
    requests = [
        store.CreateRequest(
            execution_id=child,
            ffqn=FFQN,
            params=[i],
            component_id=ACTIVITY,
            deployment_id=DEPLOYMENT,
            parent=(parent, str(js)),
        )  # fmt: skip
        for i, child in enumerate(children)
    ]
    version = store.append_batch_create_new_execution(
        parent, holder.next_version, events, requests, fence=holder.fence, now=T0
    )
    return children, version


@pytest.mark.parametrize("round_", range(3))
def test_parent_joining_while_children_finish_is_always_woken(round_):
    parent = helpers.create_workflow(now=T0)
    holder = helpers.lock(parent, now=T0)
    js = JoinSetId("n", "fan")
    children, version = spawn_children(parent, holder, js)
    child_locks = lock_pending(CHILDREN, at=T0)
    assert len(child_locks) == CHILDREN
    finishers = 6
    start = threading.Barrier(finishers + 2)
    all_finished, abort = threading.Event(), threading.Event()
    finished_count = Counter()
    count_lock = threading.Lock()

    def finisher(share):
        start.wait(SAFETY_TIMEOUT)
        for locked in share:
            store.append(
                locked.execution_id, locked.next_version, Finished(retval=Ok(locked.params[0])),
                fence=locked.fence, now=T0,
            )  # fmt: skip
            with count_lock:
                finished_count["done"] += 1
                if finished_count["done"] == CHILDREN:
                    all_finished.set()

    def joiner():
        v = version
        start.wait(SAFETY_TIMEOUT)
        for n in range(1, CHILDREN + 1):
            join_next = JoinNext(join_set_id=str(js), run_expires_at=holder.locked.lock_expires_at)
            v = store.append(parent, v, helpers.history(join_next), fence=holder.fence, now=T0)
            while store.get_state(parent).state == State.BLOCKED_BY_JOIN_SET and not abort.is_set():
                if all_finished.is_set() and store.get_state(parent).state == State.BLOCKED_BY_JOIN_SET:
                    responses = JoinSetResponse.objects.filter(execution_id=parent).count()
                    raise AssertionError(f"join-next #{n} left blocked although all {responses} responses exist")
                all_finished.wait(0.001)
        return v

    def watermark_reader():
        """A reader following the `seq` cursor must never see a gap (it would skip a response)."""
        start.wait(SAFETY_TIMEOUT)
        seen, watermark = [], 0
        while watermark < CHILDREN and not abort.is_set():
            finished_before_read = all_finished.is_set()
            responses, _ = store.list_responses(parent, after_seq=watermark)
            for response in responses:
                assert response.seq == watermark + 1, f"seq {response.seq} visible before {watermark + 1}"
                watermark = response.seq
                seen.append(response.child_execution_id)
            assert not (finished_before_read and watermark < CHILDREN), "responses missing after all children finished"
            all_finished.wait(0.001)
        return seen

    shares = [child_locks[i::finishers] for i in range(finishers)]
    *_, final_version, seen = run_threads(
        *[lambda s=s: finisher(s) for s in shares], joiner, watermark_reader, abort=abort
    )

    assert sorted(seen) == sorted(children)
    responses = list(JoinSetResponse.objects.filter(execution_id=parent).order_by("seq"))
    assert [r.seq for r in responses] == list(range(1, CHILDREN + 1))
    assert {r.child_execution_id for r in responses} == set(children)
    join_nexts = ExecutionEvent.objects.filter(execution_id=parent, history_event_type="join_next")
    assert join_nexts.count() == join_nexts.filter(consumes_response=True).count() == len(responses)
    versions = list(
        ExecutionEvent.objects.filter(execution_id=parent).order_by("version").values_list("version", flat=True)
    )
    assert versions == list(range(final_version))
    assert store.get_state(parent).state == State.PENDING_AT
    # The holder's fence survived all of it.
    store.append(parent, final_version, Finished(retval=Ok(CHILDREN)), fence=holder.fence, now=T0)


# ---------------------------------------------------------------------------------------
# d. LISTEN/NOTIFY: delivered only after commit
# ---------------------------------------------------------------------------------------


def received_until(source, channel: str, item: str, *, wait: float) -> set[tuple[str, str]]:
    """Everything that arrives on ``source`` (a ``notify.Listener`` or a raw psycopg
    connection) until ``(channel, item)`` does or ``wait`` seconds pass. Items are execution
    ids or function names (a finished item's return value is dropped)."""
    got: set[tuple[str, str]] = set()
    deadline = time.monotonic() + wait
    while (left := deadline - time.monotonic()) > 0 and (channel, item) not in got:
        if isinstance(source, notify.Listener):
            arrived = [(n.channel, i) for n in source.wait(left) for i in n.items]
        else:
            notes = source.notifies(timeout=left, stop_after=1)
            arrived = [(n.channel, i) for n in notes for i in n.payload.split("\n")]
        got |= {(channel, notify.parse_finished_item(i)[0]) for channel, i in arrived}
    return got


@pytest.fixture
def listeners():
    """The engine's ``Listener`` and a plain LISTEN connection, as another process holds it
    (the latter sees only what PostgreSQL delivers, no in-process wake-ups)."""
    raw = helpers.another_session()
    raw.execute(f"LISTEN {notify.PENDING}")
    raw.execute(f"LISTEN {notify.FINISHED}")
    with notify.Listener([notify.PENDING, notify.FINISHED]) as listener:
        yield listener, raw
    raw.close()


def assert_announced_on_commit(listeners, channel: str, item: str, write) -> None:
    """``write()`` inside a transaction: nothing arrives before the commit, ``item`` after it."""
    with transaction.atomic():
        write()
        for source in listeners:
            assert (channel, item) not in received_until(source, channel, item, wait=0.3)
    for source in listeners:
        assert (channel, item) in received_until(source, channel, item, wait=SAFETY_TIMEOUT / 4)


# Only work due now is announced on obelisk_pending, so these tests run at the real time.


def test_notifications_arrive_only_after_commit(listeners):
    created = []
    assert_announced_on_commit(listeners, notify.PENDING, FFQN, lambda: created.append(helpers.create()))
    (execution_id,) = created
    locked = helpers.lock(execution_id)
    assert_announced_on_commit(
        listeners,
        notify.FINISHED,
        execution_id,
        lambda: store.append(execution_id, locked.next_version, Finished(retval=Ok(1)), fence=locked.fence),
    )


def test_rolled_back_writes_never_notify(listeners):
    class Abort(Exception):
        pass

    with pytest.raises(Abort), transaction.atomic():
        helpers.create()
        raise Abort
    assert not ExecutionState.objects.exists()
    # Notifications arrive in commit order: by the time a later write's arrives, one from the
    # rolled-back transaction would have arrived too.
    later = "test:pkg/ifc.later"
    helpers.create(later)
    for source in listeners:
        got = received_until(source, notify.PENDING, later, wait=SAFETY_TIMEOUT / 4)
        assert (notify.PENDING, later) in got
        assert (notify.PENDING, FFQN) not in got
