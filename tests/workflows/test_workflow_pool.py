"""The workflow pool and parked Interrupt runs, through the real store.

A pool thread keeps its connection for its next run and retires when idle (D73). An
Interrupt run that blocks parks in its worker and goes on there when that worker claims the
row next, or when a group commit of this process answers it (D77, D82); every way a parked
run can be overtaken (the row taken by another worker, a timeout, a dismissal, a database
error while it waits, D80) ends it quietly without failing the workflow or stranding its
row (D72).

why: D72, D73, D77, D80, D82
"""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import timedelta

import pytest
from django.utils import timezone

from executions import store
from executions.events import (
    Finished,
    JoinNext,
    Locked,
    Ok,
    Unlocked,
)
from executions.ids import new_executor_id, new_run_id
from tests.support import workflows
from tests.support.helpers import DEPLOYMENT
from tests.support.workflow_runs import (
    FN2,
    SAFETY,
    World,
    assert_versions_contiguous,
    children_of,
    complete,
    create_root,
    events,
    history_events,
    lock_when_due,
    result,
    run_root,
    terms,
)
from workers.registry import Function
from workers.workflow_pool import WorkflowPool

pytestmark = pytest.mark.django_db(transaction=True)


# ---------------------------------------------------------------------------------------------
# Whole workflows through ``run_workflow``: both strategies give the same results
# ---------------------------------------------------------------------------------------------


def test_a_workflow_thread_runs_the_next_run_on_the_same_connection_and_retires_when_idle():
    """D73: a pool thread that ended a run takes the next one (Django's connections are per
    thread, so the run has the first one's connection, kept open); told to retire, the
    idle threads are gone."""
    spec = workflows.where_it_ran
    pool = WorkflowPool(size=2, idle_seconds=SAFETY)
    first, second = create_root(spec, 1), create_root(spec, 2)
    for execution_id in (first, second):
        pool.start(lock_when_due(execution_id, spec), spec, DEPLOYMENT)
        pool.join(SAFETY)
    assert (result(first), result(second)) == (Ok(1), Ok(2))
    assert len(set(workflows.RAN_ON[-2:])) == 1
    pool.retire_idle(SAFETY)
    assert pool.free() == 2 and pool._threads == 0


def test_a_workflow_thread_whose_connection_fails_to_close_still_takes_the_next_run(monkeypatch):
    """After a run, the pool thread closes its connection if it broke. A failure there (a
    broken connection whose close fails too) must not end the thread: the pool counts it
    idle and promises it the next run, which would then wait in the queue forever."""
    from django.db import DatabaseError
    from django.db.backends.base.base import BaseDatabaseWrapper

    def failing_close(self):
        raise DatabaseError("server closed the connection unexpectedly")

    spec = workflows.where_it_ran
    pool = WorkflowPool(size=2, idle_seconds=SAFETY)
    first, second = create_root(spec, 1), create_root(spec, 2)
    monkeypatch.setattr(BaseDatabaseWrapper, "close_if_unusable_or_obsolete", failing_close)
    for execution_id in (first, second):
        pool.start(lock_when_due(execution_id, spec), spec, DEPLOYMENT)
        pool.join(SAFETY)
    assert (result(first), result(second)) == (Ok(1), Ok(2))
    pool.retire_idle(SAFETY)


def test_the_workflow_pool_runs_every_run_it_is_given_while_idle_threads_come_and_go():
    """D73: a run handed to the pool is always run, by an idle thread or a new one, while
    idle threads keep retiring (here they wait one millisecond for a run)."""
    spec = workflows.where_it_ran
    pool = WorkflowPool(size=64, idle_seconds=0.001)
    ids = [create_root(spec, i) for i in range(40)]
    for index, execution_id in enumerate(ids):
        pool.start(lock_when_due(execution_id, spec), spec, DEPLOYMENT)
        if index % 3 == 0:
            time.sleep(0.002)  # some threads go idle and retire meanwhile
    pool.join(SAFETY)
    assert [result(execution_id) for execution_id in ids] == [Ok(i) for i in range(40)]
    assert pool.free() == 64
    pool.retire_idle(SAFETY)


# ---------------------------------------------------------------------------------------------
# Parked Interrupt runs (D77)
# ---------------------------------------------------------------------------------------------

COUNTED = replace(workflows.counted_calls, blocking="interrupt")


def _claim(spec: Function, known: dict[str, int] | None = None) -> store.LockedExecution:
    """The next due execution of ``spec``, claimed as an executor claims (``known``: what
    its pool's parked runs hold)."""
    deadline = time.monotonic() + SAFETY
    while True:
        claimed = store.lock_pending(
            {spec.ffqn: terms(spec)},
            limit=1,
            executor_id=new_executor_id(),
            run_id=new_run_id(),
            deployment_id=DEPLOYMENT,
            known=known,
        )
        if claimed:
            return claimed[0]
        assert time.monotonic() < deadline, f"no {spec.ffqn} became due"
        time.sleep(0.02)


def _parked_in(pool: WorkflowPool, execution_id: str) -> dict[str, int]:
    """The pool's parked versions, once ``execution_id``'s run is among them and its
    blocking write is in (the row is blocked on its join set)."""
    deadline = time.monotonic() + SAFETY
    while execution_id not in pool.parked_versions() or store.get_state(execution_id).state != "blocked_by_join_set":
        assert time.monotonic() < deadline, "the run never parked"
        time.sleep(0.01)
    return pool.parked_versions()


def _finish_children(execution_id: str) -> None:
    """Run the pending children of ``execution_id`` (its direct calls' activities)."""
    world = World(execution_id)
    while not world.step():
        time.sleep(0.01)


def _starts(execution_id: str) -> int:
    return workflows.STARTS.count(execution_id)


def _runs_to_its_end(pool: WorkflowPool, claimed: store.LockedExecution, value: int, *, starts: int) -> None:
    """``claimed``, started in ``pool``, finishes its workflow with ``value``, the function
    having started ``starts`` times in all, the log's versions contiguous."""
    pool.start(claimed, COUNTED, DEPLOYMENT)
    pool.join(SAFETY)
    assert result(claimed.execution_id) == Ok(value)
    assert _starts(claimed.execution_id) == starts
    assert_versions_contiguous(claimed.execution_id)
    pool.retire_idle(SAFETY)


def _through_an_executor(calls: int) -> str:
    """A ``COUNTED`` workflow of ``calls`` direct calls, run to its end by an executor's
    claim loop (its children, its runs), as a worker process runs it."""
    from workers.executor import Executor

    executor = Executor({COUNTED.ffqn: COUNTED, FN2: workflows.fn2}, DEPLOYMENT)
    execution_id = create_root(COUNTED, calls)
    deadline = time.monotonic() + SAFETY
    while not store.get_state(execution_id).is_finished:
        assert time.monotonic() < deadline, "the workflow did not finish"
        executor.claim_and_run(budget=0.3, linger=0.05)
    executor.workflows.join(SAFETY)
    executor.workflows.retire_idle(SAFETY)
    return execution_id


def test_an_interrupt_run_parked_in_its_worker_goes_on_where_it_was_when_that_worker_claims_it_next():
    """D77 through an executor, as a worker runs it: every call of an Interrupt workflow
    blocks and hands its row on; the run parks; the response makes the row pending; the
    executor's claim finds it where the run left it and hands the run its new lock. The
    function starts once, every call is a lock of its own, every step is logged once under
    the lock it ran under, and the log is what a run that replays writes."""
    execution_id = _through_an_executor(5)
    assert result(execution_id) == Ok(15)
    assert _starts(execution_id) == 1
    locks = [e for e in events(execution_id) if isinstance(e, Locked)]
    assert len({lock.run_id for lock in locks}) == 6  # the first run, then one per response
    assert len(children_of(execution_id)) == 5
    assert_versions_contiguous(execution_id)
    logs = [(log.message, log.run_id) for log in store.list_logs(execution_id) if log.message.startswith("step")]
    assert logs == [(f"step {i}", locks[i].run_id) for i in range(1, 6)]


@pytest.mark.postgres_only
def test_a_parked_runs_workflow_is_locked_for_it_by_the_group_commit_that_answers_it(monkeypatch):
    """D82 through an executor: the group commit of a child's result, in the process where
    the workflow's run is parked, locks the workflow for that run in its one statement, so
    the run goes on without a claim: the executor claims the workflow once (its first run),
    each later lock is written with the result that answered it (same statement, same
    time), the function starts once, and the log is what a run that replays writes."""
    claimed = []
    lock_pending = store.lock_pending

    def recording_claims(*args, **kwargs):
        locked = lock_pending(*args, **kwargs)
        claimed.extend(c.execution_id for c in locked)
        return locked

    monkeypatch.setattr(store, "lock_pending", recording_claims)
    execution_id = _through_an_executor(4)
    assert result(execution_id) == Ok(10)
    assert _starts(execution_id) == 1
    assert claimed.count(execution_id) == 1
    records = store.get(execution_id).events
    locks = [r for r in records if isinstance(r.event, Locked)]
    assert len({lock.event.run_id for lock in locks}) == 5
    finished_at = {store.get(child).events[-1].created_at for child in children_of(execution_id)}
    assert {lock.created_at for lock in locks[1:]} <= finished_at
    assert_versions_contiguous(execution_id)


@pytest.mark.postgres_only
@pytest.mark.parametrize("why", ["the run left its place", "the pool has no room"])
def test_a_lock_a_group_commit_took_for_a_parked_run_that_cannot_take_it_goes_back_for_a_claim(why):
    """D82: the run left its place (here: dismissed) after the executor read the parked
    runs, or the pool is full (a claim takes only what fits, so a parked run goes on only
    if it fits too). Nobody takes the lock the group commit took for it, so the executor
    hands it back (``Unlocked``, with its fence) instead of leaving it to expire; a claim
    then takes the workflow and a new run replays to the result."""
    from workers.executor import Executor

    executor = Executor({COUNTED.ffqn: COUNTED, FN2: workflows.fn2}, DEPLOYMENT)
    pool = executor.workflows
    pool.size = 1
    execution_id = create_root(COUNTED, 1)
    pool.start(lock_when_due(execution_id, COUNTED), COUNTED, DEPLOYMENT)
    _parked_in(pool, execution_id)
    parked = executor._parked_runs()
    if why == "the run left its place":
        pool.dismiss_parked(wait=SAFETY)
    else:  # an Await run waits in place for its child, holding the pool's one thread
        awaiting = create_root(workflows.counted_calls, 1)
        pool.start(lock_when_due(awaiting, workflows.counted_calls), workflows.counted_calls, DEPLOYMENT)
        deadline = time.monotonic() + SAFETY
        while not children_of(awaiting) or pool.free() > 0:
            assert time.monotonic() < deadline, "the Await run never waited"
            time.sleep(0.01)
    (child,) = children_of(execution_id)
    locked_child = lock_when_due(child, workflows.fn2)
    finished = store.AppendItem(child, None, Finished(retval=Ok(1)), locked_child.fence)
    assert store.append_many([finished], parked=parked) == [locked_child.next_version]
    assert set(parked.resumed) == {execution_id}
    assert store.get_state(execution_id).state == "locked"

    executor._resume_parked(parked)

    assert store.get_state(execution_id).state == "pending_at"
    assert isinstance(events(execution_id)[-1], Unlocked)
    if why == "the pool has no room":
        _finish_children(awaiting)
        pool.join(SAFETY)
        assert result(awaiting) == Ok(1)
    _runs_to_its_end(pool, _claim(COUNTED), 1, starts=2)


@pytest.mark.postgres_only
def test_a_parked_run_goes_on_when_its_group_commit_committed_and_the_rest_of_the_batch_failed(monkeypatch):
    """D82 (found by review): the one statement committed, resuming a parked run, and then
    the transaction for the batch's other items (a result whose lock moved on) failed with
    the database gone. The lock the statement took still reaches the parked run, instead of
    staying with nobody until it expires."""
    import importlib

    from workers import executor as executor_module
    from workers.executor import Executor

    append = importlib.import_module("executions.store.append")  # the module, not its ``append``
    executor = Executor({COUNTED.ffqn: COUNTED, FN2: workflows.fn2}, DEPLOYMENT)
    pool = executor.workflows
    execution_id = create_root(COUNTED, 1)
    pool.start(lock_when_due(execution_id, COUNTED), COUNTED, DEPLOYMENT)
    _parked_in(pool, execution_id)
    (child,) = children_of(execution_id)
    locked_child = lock_when_due(child, workflows.fn2)
    other = create_root(workflows.fn2, 1)
    lost = lock_when_due(other, workflows.fn2)
    store.append(other, None, Unlocked(unlocked_at=timezone.now(), reason="test"), fence=lost.fence)
    monkeypatch.setattr(executor_module, "RESULT_WRITE_PATIENCE", 0.0)
    monkeypatch.setattr(append, "_append_many_in_transaction", _lost_connection)

    executor._write(
        [
            store.AppendItem(child, None, Finished(retval=Ok(1)), locked_child.fence),
            store.AppendItem(other, None, Finished(retval=Ok(2)), lost.fence),
        ]
    )

    pool.join(SAFETY)
    assert result(execution_id) == Ok(1)
    assert _starts(execution_id) == 1
    pool.retire_idle(SAFETY)


def test_a_parked_run_whose_row_another_worker_took_on_unwinds_and_the_claim_reads_the_history():
    """Another worker ran the workflow on while the run was parked here. This worker's
    claim, told of the parked run's version, finds the row past it: it reads the history,
    the parked run unwinds writing nothing, and the claimed run replays to the result."""
    pool = WorkflowPool(size=2, idle_seconds=SAFETY)
    execution_id = create_root(COUNTED, 2)
    pool.start(lock_when_due(execution_id, COUNTED), COUNTED, DEPLOYMENT)
    stale = _parked_in(pool, execution_id)
    _finish_children(execution_id)
    run_root(execution_id, COUNTED)  # another worker's run: it replays, writes, blocks again
    _finish_children(execution_id)
    claimed = _claim(COUNTED, stale)
    assert claimed.history is not None and len(claimed.history) > 0
    _runs_to_its_end(pool, claimed, 3, starts=3)


def test_a_run_parked_past_its_timeout_unwinds_and_a_claim_made_for_it_still_runs(settings):
    """The parked run gives up after ``PARKED_RUN_TIMEOUT``, writing nothing; a claim made
    while it still counted (no history read) then finds no run to hand the lock to: the
    pool reads the history and the new run replays to the same result."""
    settings.OBELISK = {"PARKED_RUN_TIMEOUT": timedelta(milliseconds=300)}
    pool = WorkflowPool(size=2, idle_seconds=SAFETY)
    execution_id = create_root(COUNTED, 1)
    pool.start(lock_when_due(execution_id, COUNTED), COUNTED, DEPLOYMENT)
    parked = _parked_in(pool, execution_id)
    version = store.get_state(execution_id).corresponding_version
    deadline = time.monotonic() + SAFETY
    while pool.parked_versions():
        assert time.monotonic() < deadline, "the parked run never gave up"
        time.sleep(0.02)
    assert store.get_state(execution_id).corresponding_version == version  # it wrote nothing
    _finish_children(execution_id)
    claimed = _claim(COUNTED, parked)
    assert claimed.history is None  # the claim took the parked run's word for it
    _runs_to_its_end(pool, claimed, 1, starts=2)


def test_a_parked_run_is_not_counted_as_running_in_its_clusters_load():
    """The cluster's load (``heartbeat.running``, the dashboard's running count) counts a
    workflow run while its thread runs; a parked run holds no lock and runs nothing."""
    from workers import heartbeat

    heartbeat.prepare_cluster()
    try:
        pool = WorkflowPool(size=2, idle_seconds=SAFETY)
        execution_id = create_root(COUNTED, 1)
        pool.start(lock_when_due(execution_id, COUNTED), COUNTED, DEPLOYMENT)
        parked = _parked_in(pool, execution_id)
        deadline = time.monotonic() + SAFETY
        while heartbeat.running_now() != 0:
            assert time.monotonic() < deadline, "a parked run is counted as running"
            time.sleep(0.02)
        _finish_children(execution_id)
        _runs_to_its_end(pool, _claim(COUNTED, parked), 1, starts=1)
        assert heartbeat.running_now() == 0
    finally:
        heartbeat._running = None


def test_parked_runs_unwind_when_dismissed_and_a_full_pool_parks_no_more():
    """At most ``size`` runs park; the others unwind at once. ``dismiss_parked`` (a
    stopping worker) sends every parked run away; none of them writes anything."""
    pool = WorkflowPool(size=1, idle_seconds=SAFETY)
    first, second = create_root(COUNTED, 1), create_root(COUNTED, 1)
    pool.start(lock_when_due(first, COUNTED), COUNTED, DEPLOYMENT)
    _parked_in(pool, first)
    pool.start(lock_when_due(second, COUNTED), COUNTED, DEPLOYMENT)
    pool.join(SAFETY)  # the second run ended: no room to park
    assert set(pool.parked_versions()) == {first}
    versions = [store.get_state(e).corresponding_version for e in (first, second)]
    pool.dismiss_parked()
    pool.join(SAFETY)
    assert pool.parked_versions() == {} and pool.free() == 1
    assert [store.get_state(e).corresponding_version for e in (first, second)] == versions
    assert [store.get_state(e).state for e in (first, second)] == ["blocked_by_join_set"] * 2
    pool.retire_idle(SAFETY)


def _recorded_appends(monkeypatch) -> list[str]:
    """From now on, the kind of every event ``store.append`` is asked to write."""
    appended = []
    append = store.append

    def recording_append(execution_id, version, event, **options):
        appended.append(type(event).__name__)
        return append(execution_id, version, event, **options)

    monkeypatch.setattr(store, "append", recording_append)
    return appended


def _lost_connection(*args, **kwargs):
    from django.db import OperationalError

    raise OperationalError("server closed the connection unexpectedly")


def test_a_database_error_while_a_run_waits_ends_the_run_and_never_fails_the_workflow(monkeypatch):
    """An Await run reads its responses from the database while it waits. When that read
    fails (the connection is lost), the run ends as a lost worker's run does, and a later
    run finishes the workflow. The error never reaches the workflow's own code, where it
    would be a trap and fail the workflow for good."""
    spec = workflows.counted_calls
    execution_id = create_root(spec, 1)
    monkeypatch.setattr(store, "responses_after", _lost_connection)
    run_root(execution_id, spec, None, blocking="await")
    assert not store.get_state(execution_id).is_finished
    monkeypatch.undo()
    world = World(execution_id)
    world.settle()  # the child runs; its response makes the workflow pending
    complete(execution_id, spec, world, blocking="await")
    assert result(execution_id) == Ok(1)


def test_a_database_error_as_a_parked_run_resumes_hands_its_new_lock_back(monkeypatch):
    """A parked run handed a new lock reads its responses. When that read fails, the run
    hands the lock back and ends, writing nothing else; a later run finishes the workflow.
    The error never reaches the workflow's own code."""
    pool = WorkflowPool(size=2, idle_seconds=SAFETY)
    execution_id = create_root(COUNTED, 1)
    pool.start(lock_when_due(execution_id, COUNTED), COUNTED, DEPLOYMENT)
    parked = _parked_in(pool, execution_id)
    _finish_children(execution_id)
    monkeypatch.setattr(store, "responses_after", _lost_connection)
    pool.start(_claim(COUNTED, parked), COUNTED, DEPLOYMENT)
    pool.join(SAFETY)
    monkeypatch.undo()
    state = store.get_state(execution_id)
    assert not state.is_finished and state.state == "pending_at"  # handed back at once
    assert isinstance(events(execution_id)[-1], Unlocked)
    complete(execution_id, COUNTED, World(execution_id))
    assert result(execution_id) == Ok(1)
    pool.retire_idle(SAFETY)


def test_a_parked_run_that_can_neither_read_its_responses_nor_hand_its_lock_back_still_ends_quietly(monkeypatch):
    """The connection is gone: the responses cannot be read, and the hand-back cannot be
    written either. The run still ends as a lost worker's (its new lock expires and the
    sweep makes it pending), and the error never reaches the workflow's own code."""
    spec = replace(workflows.catches_everything, blocking="interrupt")
    pool = WorkflowPool(size=2, idle_seconds=SAFETY)
    execution_id = create_root(spec, 1)
    pool.start(lock_when_due(execution_id, spec), spec, DEPLOYMENT)
    parked = _parked_in(pool, execution_id)
    _finish_children(execution_id)
    append = store.append

    def no_hand_back(execution_id, version, event, **options):
        if isinstance(event, Unlocked):
            _lost_connection()
        return append(execution_id, version, event, **options)

    monkeypatch.setattr(store, "responses_after", _lost_connection)
    monkeypatch.setattr(store, "append", no_hand_back)
    pool.start(_claim(spec, parked), spec, DEPLOYMENT)
    pool.join(SAFETY)
    monkeypatch.undo()
    assert not any(caught.startswith(execution_id) for caught in workflows.CAUGHT)
    assert store.get_state(execution_id).state == "locked"  # by the lock nobody could hand back
    deadline = time.monotonic() + SAFETY
    while store.get_state(execution_id).pending_expires_finished > timezone.now():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    store.expire_lock(execution_id)  # the sweep
    complete(execution_id, spec, World(execution_id))
    assert result(execution_id) == Ok(1)
    pool.retire_idle(SAFETY)


def test_a_run_resumed_in_place_that_blocks_again_while_closing_leaves_the_handed_on_row_alone(monkeypatch, settings):
    """D72 for a parked run: a run that went on under a new lock, returned, and blocked
    again closing its join sets (a child workflow to await) has handed its row on with that
    closing join-next. When its park then times out, it must not try to hand the row back
    as if it still held it: a transaction on the row there makes the claim the response
    wakes skip it."""
    settings.OBELISK = {"PARKED_RUN_TIMEOUT": timedelta(milliseconds=300)}
    spec = replace(workflows.leaves_a_child, blocking="interrupt")
    pool = WorkflowPool(size=2, idle_seconds=SAFETY)
    execution_id = create_root(spec, 2)
    pool.start(lock_when_due(execution_id, spec), spec, DEPLOYMENT)
    parked = _parked_in(pool, execution_id)
    world = World(execution_id, actions={workflows.child_workflow.ffqn: "hold"})
    while not world.step():
        time.sleep(0.01)
    appended = _recorded_appends(monkeypatch)
    pool.start(_claim(spec, parked), spec, DEPLOYMENT)
    deadline = time.monotonic() + SAFETY
    while pool.parked_versions() or store.get_state(execution_id).state != "blocked_by_join_set":
        assert time.monotonic() < deadline, "the run never blocked on closing its join set"
        time.sleep(0.02)
    pool.join(SAFETY)
    assert "Unlocked" not in appended
    assert [e.closing for _, e in history_events(execution_id) if isinstance(e, JoinNext)][-1] is True
    pool.retire_idle(SAFETY)


def test_a_place_to_park_is_reserved_only_before_a_write_that_hands_the_row_on(monkeypatch):
    """D77: a join-next whose response the run holds keeps the row locked; a place reserved
    for it would be reported to claims and could be handed a lock while the run goes on.
    Only the join-nexts that block reserve one."""
    reserved = []
    expect = WorkflowPool.expect

    def recording_expect(self, locked, version, previous, terms):
        reserved.append(version)
        return expect(self, locked, version, previous, terms)

    monkeypatch.setattr(WorkflowPool, "expect", recording_expect)
    spec = replace(workflows.two_children, blocking="interrupt")
    pool = WorkflowPool(size=2, idle_seconds=SAFETY)
    execution_id = create_root(spec, 1)
    pool.start(lock_when_due(execution_id, spec), spec, DEPLOYMENT)
    parked = _parked_in(pool, execution_id)
    world = World(execution_id)
    while store.list_responses(execution_id)[1] < 2:  # both children finished
        world.step()
        time.sleep(0.01)
    pool.start(_claim(spec, parked), spec, DEPLOYMENT)
    pool.join(SAFETY)
    assert result(execution_id) == Ok(3)
    join_nexts = [(v, e) for v, e in history_events(execution_id) if isinstance(e, JoinNext)]
    blocking = [v for v, e in join_nexts if e.run_expires_at <= store.get(execution_id).events[v].created_at]
    assert reserved == blocking and len(join_nexts) == 2 and len(blocking) == 1
    pool.retire_idle(SAFETY)


def test_an_interrupted_run_leaves_its_row_to_the_next_claim_once_its_blocking_write_is_in(monkeypatch):
    """An Interrupt run ends at a join-next with no response in hand. The write of that
    join-next hands the row on: blocked, or pending at once when a response came in
    meanwhile (announced on ``obelisk_pending``). The run's end then writes nothing more to
    the row. It used to try an ``Unlocked`` (bound to fail: the row is no longer locked),
    whose transaction held the row for a moment; a claimer woken by the join-next's
    notification skipped it there (``SKIP LOCKED``) and the workflow waited for the next
    poll, about half a second."""
    spec = workflows.fan_out
    execution_id = create_root(spec, [1, 2, 3])
    appended = _recorded_appends(monkeypatch)
    run_root(execution_id, spec, None, blocking="interrupt")
    assert store.get_state(execution_id).state == "blocked_by_join_set"
    assert "Unlocked" not in appended
