"""The hot path's shortcuts keep the store's guarantees (decisions D45, D48).

A plain ``create`` on PostgreSQL is one message (one implicit transaction); a process hears
each of its own commits once; a waiting client takes a short result from its notification
and reads a long one back. Each test shows the behaviour a caller relies on, on PostgreSQL
and SQLite unless marked.
"""

from __future__ import annotations

import contextlib
import threading
import time
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection, transaction
from django.test import override_settings
from django.utils.timezone import now as timezone_now

from executions import conf, errors, notify, store
from executions.events import Finished, Ok, Unlocked
from executions.ids import ExecutionId
from executions.models import ExecutionEvent, ExecutionState
from tests.helpers import FFQN, create, lock

pytestmark = pytest.mark.django_db(transaction=True)
SERVED = "test:acts/basic.noop"  # a function of tests.components, which the broker serves


def finish(execution_id: str, value) -> None:
    locked = lock(execution_id)
    store.append(execution_id, None, Finished(retval=Ok(value)), fence=locked.fence)


def test_a_plain_create_is_idempotent_and_refuses_another_call_under_the_same_id():
    """Decision 13 holds on the one-message path: the same call again reports the existing
    execution; another call under the same id is a conflict and changes nothing."""
    assert not connection.in_atomic_block  # the path under test: no surrounding transaction
    execution_id = create(params=[1])
    again = store.create(
        store.CreateRequest(
            execution_id=execution_id,
            ffqn=FFQN,
            params=[1],
            component_id=store.get_created(execution_id).component_id,
            deployment_id=store.get_state(execution_id).deployment_id,
        )
    )
    assert again.already_existed
    with pytest.raises(errors.Conflict):
        create(params=[2], execution_id=execution_id)
    assert ExecutionEvent.objects.filter(execution_id=execution_id).count() == 1
    assert store.get_created(execution_id).params == [1]


def test_a_plain_create_wakes_a_listener_only_once_its_rows_are_visible():
    """The rows and the notification commit together: whoever is woken finds the new
    execution pending (a listener of this process is woken after the commit, not before)."""
    with notify.Listener([notify.PENDING]) as listener:
        execution_id = create()
        notes = listener.wait(5.0)
    assert any(FFQN in note.items for note in notes)
    assert ExecutionState.objects.get(pk=execution_id).state == "pending_at"


@pytest.mark.postgres_only
def test_a_commit_wakes_a_listener_of_its_own_process_once():
    """D45: a commit of this process wakes its listeners at commit; the server's echo of the
    same NOTIFY is not delivered a second time. A commit of another session still is."""
    with notify.Listener([notify.PENDING]) as listener:
        create()
        deadline = time.monotonic() + 1.0  # the echo, if delivered, arrives within this
        received = []
        while (left := deadline - time.monotonic()) > 0:
            received.extend(listener.wait(left))
        assert len(received) == 1

        import psycopg

        params = connection.get_connection_params()
        keys = ("dbname", "user", "password", "host", "port")
        with psycopg.connect(autocommit=True, **{k: params[k] for k in keys if params.get(k)}) as other:
            other.execute("SELECT pg_notify(%s, %s)", [notify.PENDING, "other:pkg/ifc.fn"])
        notes = listener.wait(5.0)
    assert [note.items for note in notes] == [("other:pkg/ifc.fn",)]


def _notify_from_another_session(channel: str, payload: str) -> None:
    import psycopg

    params = connection.get_connection_params()
    keys = ("dbname", "user", "password", "host", "port")
    with psycopg.connect(autocommit=True, **{k: params[k] for k in keys if params.get(k)}) as other:
        other.execute("SELECT pg_notify(%s, %s)", [channel, payload])


@pytest.mark.postgres_only
def test_a_process_listens_only_on_the_channels_asked_for_and_a_new_channel_misses_nothing():
    """D56: a process's LISTEN session covers the channels its listeners asked for, so a
    client waiting for results is not woken by every new pending execution. A listener
    for a channel not covered yet returns only once it is, and hears a commit made by
    another process right after it subscribed."""
    notify.stop_listening()  # a fresh session for this process
    with notify.Listener([notify.FINISHED]) as results:
        assert notify.listening_channels() == {notify.FINISHED}
        with notify.Listener([notify.PENDING]) as pending:
            assert notify.listening_channels() == {notify.FINISHED, notify.PENDING}
            _notify_from_another_session(notify.PENDING, "other:pkg/ifc.fn")
            assert {note.items for note in pending.wait(5.0)} == {("other:pkg/ifc.fn",)}
        # (while the session is replaced, a notification may come twice: harmless, D56)
        _notify_from_another_session(notify.FINISHED, "E_01KBZZZZZZZZZZZZZZZZZZZZZZ")
        assert {note.items for note in results.wait(5.0)} == {("E_01KBZZZZZZZZZZZZZZZZZZZZZZ",)}


@pytest.mark.parametrize("size", [10, 5000], ids=["short_result", "long_result"])
def test_a_waiting_client_gets_the_exact_result_whether_it_rides_the_notification_or_not(size):
    """D48: a short return value comes with the ``obelisk_finished`` notification, a long
    one (over 1,000 characters of JSON) is read back; the waiter returns the same either way,
    also for several executions finishing while it waits."""
    ids = [create() for _ in range(3)]
    values = {execution_id: {"n": index, "text": "é" * size} for index, execution_id in enumerate(ids)}

    def finish_later() -> None:
        time.sleep(0.2)
        for execution_id, value in values.items():
            finish(execution_id, value)
        connection.close()

    finisher = threading.Thread(target=finish_later)
    finisher.start()
    try:
        results = store.wait_for_finished(ids, timeout=30)
    finally:
        finisher.join()
    assert results == {execution_id: Ok(value) for execution_id, value in values.items()}


def test_finished_notifications_carry_only_short_results():
    """The notification item is the id, plus the value's JSON when it is short."""
    short = notify.finished_item("E_1", {"ok": [1, "a\tb\nc"]})
    assert "\n" not in short
    assert notify.parse_finished_item(short) == ("E_1", {"ok": [1, "a\tb\nc"]})
    long = notify.finished_item("E_1", {"ok": "x" * 2000})
    assert notify.parse_finished_item(long) == ("E_1", None)


def test_an_engine_setting_read_once_follows_a_change_of_the_setting_and_its_undoing():
    """``conf.get`` reads ``settings.OBELISK`` once (the hot path asks several times an
    execution), yet a change made by ``override_settings`` is seen at once, and so is its
    end."""
    default = conf.DEFAULTS["HAND_BACK_AFTER"]
    assert conf.get("HAND_BACK_AFTER") == default
    with override_settings(OBELISK={**settings.OBELISK, "HAND_BACK_AFTER": timedelta(seconds=7)}):
        assert conf.get("HAND_BACK_AFTER") == timedelta(seconds=7)
    assert conf.get("HAND_BACK_AFTER") == default


def test_waiting_for_an_unknown_execution_is_not_found_and_names_it():
    known = create()
    with pytest.raises(errors.NotFound, match="E_01"):
        store.wait_for_finished([known, "E_01JAAAAAAAAAAAAAAAAAAAAAAA"], timeout=1)


@pytest.mark.postgres_only
def test_a_worker_counted_as_lingering_delays_a_claim_task_but_never_strands_work():
    """The broker holds its claim task back while a worker lingers (that worker claims the
    new work itself). If that worker died while counted, the work is still handed out: the
    broker looks at the tables again and sends the claim task."""
    from workers import lingering
    from workers.broker import ExecutionBroker

    lingering.prepare_cluster()
    try:
        with lingering.lingering():  # a worker that will never claim anything
            broker = ExecutionBroker()
            broker.dequeue()  # subscribes; the tables hold nothing due yet
            create(SERVED)
            deadline = time.monotonic() + 30  # a safety limit, not a timing assertion
            tasks = None
            while tasks is None and time.monotonic() < deadline:
                tasks = broker.dequeue()
            assert tasks, "the claim task never went out"
    finally:
        lingering._count = None


def test_lingering_workers_woken_together_claim_once_and_still_take_what_comes_after():
    """D57: two workers of a cluster woken by the same notification: the first claims the
    execution, the second sees that a claim started after its wake-up took everything then
    due and makes no claim (no transaction). An execution created after that is claimed by
    the next worker woken for it; a full claim never counts as having taken everything."""
    from django.test.utils import CaptureQueriesContext

    from workers import lingering
    from workers.components import load_components
    from workers.executor import Executor
    from workers.testing import current_deployment_id

    lingering.prepare_cluster()
    try:
        first, second = (Executor(load_components(), current_deployment_id()) for _ in range(2))
        one = create(SERVED)
        woken_at = time.monotonic()  # both were told of it
        assert [e.execution_id for e in first._claim_activities(8, woken_at)] == [one]
        with CaptureQueriesContext(connection) as skipped:
            assert second._claim_activities(8, woken_at) == []
        assert skipped.captured_queries == []

        two = create(SERVED)
        assert [e.execution_id for e in second._claim_activities(8, time.monotonic())] == [two]

        three, four = create(SERVED), create(SERVED)
        woken_at = time.monotonic()
        assert len(first._claim_activities(1, woken_at)) == 1  # full: the other may be left
        assert len(second._claim_activities(8, woken_at)) == 1
        assert [store.get_state(e).state for e in (three, four)] == ["locked", "locked"]
    finally:
        lingering._count = lingering._claim_started = lingering._covered_since = None


def test_a_doorbell_rung_in_another_process_wakes_a_waiting_executor_and_says_what_came():
    """D88: the cluster's pusher rings, a worker process waits: the wait returns for the
    ring (while the ringing process still lives, so not for its timeout), says which kind
    of work was announced, and takes it, so the next look finds nothing new."""
    import multiprocessing

    from workers.doorbell import Announcements, Doorbell

    doorbell = Doorbell()
    announcements = Announcements(doorbell)
    rung = multiprocessing.get_context("fork").Event()

    def pusher():
        doorbell.ring(activities=True, workflows=False)
        rung.set()
        time.sleep(60)  # a safety limit: the waiter must return before this ends

    process = multiprocessing.get_context("fork").Process(target=pusher, daemon=True)
    process.start()
    try:
        assert rung.wait(30)
        assert announcements.wait(120) == (True, False)
        assert process.is_alive()  # woken by the ring, not by the end of the wait
        assert announcements.peek() == (False, False)
        doorbell.ring(activities=False, workflows=True)
        assert announcements.take(workflows=False) == (False, False)  # workflows left unseen
        assert announcements.peek() == (False, True)
    finally:
        process.kill()
        process.join()


def test_a_worker_killed_while_it_waits_on_the_doorbell_never_blocks_the_ring_or_the_others():
    """D88: a worker process may be killed at any moment, also while it waits for work. The
    pusher's next ring must neither block on it nor fail to wake the live workers (a
    ``multiprocessing.Condition`` waits in ``notify`` for every sleeper to wake, and a
    dead one never does: the ring, and then the whole cluster, hung)."""
    import multiprocessing
    import os
    import signal

    from workers.doorbell import Announcements, Doorbell

    doorbell = Doorbell(slots=2)
    context = multiprocessing.get_context("fork")
    waiting = context.Event()

    def doomed_worker():
        announcements = Announcements(doorbell)
        waiting.set()
        announcements.wait(600)

    doomed = context.Process(target=doomed_worker, daemon=True)
    doomed.start()
    assert waiting.wait(30)
    time.sleep(0.2)  # let it enter the wait (a kill before it would test less, not fail)
    os.kill(doomed.pid, signal.SIGKILL)
    doomed.join(30)

    survivor = Announcements(doorbell)
    woken = []
    listener = threading.Thread(target=lambda: woken.append(survivor.wait(120)), daemon=True)
    listener.start()
    ringer = threading.Thread(target=doorbell.ring, args=(True, False), daemon=True)
    ringer.start()
    ringer.join(30)  # a safety limit
    assert not ringer.is_alive(), "the ring blocked on the killed worker"
    listener.join(60)  # a safety limit, below the wait's own timeout
    assert woken == [(True, False)]


def test_a_nudge_just_before_an_executor_waits_is_not_lost():
    """D88, D65: children handed over from a workflow run's thread wake the executor's wait
    even when the nudge comes before the wait begins; it reports nothing announced."""
    from workers.doorbell import Announcements, Doorbell

    announcements = Announcements(Doorbell())
    announcements.nudge()
    expired = threading.Event()
    timer = threading.Timer(60, expired.set)  # a safety limit, far above any wake-up
    timer.start()
    try:
        assert announcements.wait(120) == (False, False)
        assert not expired.is_set(), "the wait ended with its timeout: the nudge was lost"
    finally:
        timer.cancel()


def _as_if_another_worker_runs_a_batch_until(until: float) -> None:
    """The shared values as another worker process sets them when it starts a short batch
    (``lingering.batch_started``), without counting this process as that worker."""
    from workers import lingering

    with lingering._busy.get_lock():
        lingering._busy.value += 1
    lingering._busy_until.value = until


def _forget_cluster() -> None:
    from workers import lingering

    lingering._count = lingering._claim_started = lingering._covered_since = None
    lingering._busy = lingering._busy_until = None
    lingering._busy_here = False


def test_a_worker_woken_while_another_finishes_a_short_batch_leaves_the_new_work_to_it():
    """D58: a worker woken for new work while another worker of the cluster finishes a
    short batch makes no claim: the busy worker, told of the same work, claims everything
    then due right after its batch, in one transaction."""
    from django.test.utils import CaptureQueriesContext

    from workers import lingering
    from workers.components import load_components
    from workers.executor import Executor
    from workers.testing import current_deployment_id

    lingering.prepare_cluster()
    try:
        busy, woken = (Executor(load_components(), current_deployment_id()) for _ in range(2))
        one = create(SERVED)
        woken_at = time.monotonic()  # both were told of it; one of them is still busy
        _as_if_another_worker_runs_a_batch_until(time.monotonic() + 30)  # a generous bound
        claimed_by_busy = []

        def finish_batch_then_claim():
            try:
                time.sleep(0.05)  # the rest of its batch
                # Its claim. (Threads share the cluster's counters, so this one is not seen
                # as the busy worker it stands for; asked for no wake-up, it claims at once.)
                claimed_by_busy.extend(e.execution_id for e in busy._claim_activities(8))
                with lingering._busy.get_lock():
                    lingering._busy.value -= 1  # ``idle``, as that worker's claim does
            finally:
                connection.close()

        thread = threading.Thread(target=finish_batch_then_claim)
        thread.start()
        with CaptureQueriesContext(connection) as deferred:
            assert woken._claim_activities(8, woken_at) == []
        thread.join()
        assert deferred.captured_queries == []
        assert claimed_by_busy == [one]
    finally:
        _forget_cluster()


def test_a_busy_worker_that_does_not_claim_holds_new_work_back_only_until_its_batch_was_due_to_end():
    """D58: the wait for a busy worker is bounded by its batch's expected end; a worker that
    died in its batch, or runs long, strands nothing: the woken worker then claims."""
    from workers import lingering
    from workers.components import load_components
    from workers.executor import Executor
    from workers.testing import current_deployment_id

    lingering.prepare_cluster()
    try:
        woken = Executor(load_components(), current_deployment_id())
        one = create(SERVED)
        woken_at = time.monotonic()
        _as_if_another_worker_runs_a_batch_until(time.monotonic() + 0.05)  # and never claims
        assert [e.execution_id for e in woken._claim_activities(8, woken_at)] == [one]
    finally:
        _forget_cluster()


def test_only_a_batch_expected_to_be_short_holds_new_work_back():
    """D58: a worker whose previous batch took longer than ``BUSY_DEFER`` (or that has none
    yet) sets no time to wait for it; one whose batches are short does."""
    from workers import lingering

    lingering.prepare_cluster()
    try:
        lingering.batch_started(float("inf"))  # its first batch: nothing known
        assert lingering._busy.value == 1 and lingering._busy_until.value == 0.0
        lingering.batch_started(lingering.BUSY_DEFER * 10)
        assert lingering._busy.value == 1 and lingering._busy_until.value == 0.0
        lingering.batch_started(0.002)
        assert lingering._busy_until.value > time.monotonic()
        with lingering.claiming(8):  # its next claim starts: it no longer counts as busy
            assert lingering._busy.value == 0
    finally:
        _forget_cluster()


def _locked_by(execution_id: str) -> str:
    """The run id of an execution's latest ``Locked`` event: one claim, one run id."""
    return [r.event.run_id for r in store.get(execution_id).events if r.event.VARIANT == "locked"][-1]


@pytest.mark.postgres_only
def test_work_announced_while_a_batch_runs_is_claimed_together_with_what_follows_within_the_window(tmp_path):
    """D86: an execution announced while the worker runs a batch streams in regardless of
    its results, so the worker waits ``CLAIM_COALESCE`` before its next claim, and that
    one claim also takes what was submitted meanwhile."""
    import os

    from workers.components import load_components
    from workers.executor import Executor
    from workers.testing import current_deployment_id

    # Batches sized for 10 s of work: after the 0.3 s activity the next claim may take many.
    executor = Executor(load_components(), current_deployment_id(), target_batch_seconds=10)
    marker = str(tmp_path / "marker")
    submitted = {}

    def submit_during_then_right_after_the_batch():
        while not os.path.exists(marker):  # the slow activity has started
            time.sleep(0.005)
        submitted["during"] = create(SERVED)
        while store.get_state(slow).state != "finished":
            time.sleep(0.005)
        submitted["after"] = create(SERVED)
        store.wait_for_finished(list(submitted.values()), timeout=30)  # a safety limit

    with override_settings(OBELISK={**settings.OBELISK, "CLAIM_COALESCE": timedelta(seconds=2)}):
        slow = create("test:acts/slow.sleep", [0.3, marker])
        _claim_and_run_beside(executor, submit_during_then_right_after_the_batch, budget=30, linger=1.0)
    assert executor.stats.coalesced == 1
    assert _locked_by(submitted["during"]) == _locked_by(submitted["after"])


def test_a_caller_that_waits_for_each_result_before_the_next_submission_is_not_held_by_the_window():
    """D86: a submission made after the previous result was written is not a stream: the
    worker claims it at once, however long ``CLAIM_COALESCE`` is."""
    from workers.components import load_components
    from workers.executor import Executor
    from workers.testing import current_deployment_id

    executor = Executor(load_components(), current_deployment_id())
    finished = []
    # The first submission waits for the executor's first claim, which it makes as it
    # starts, before it listens: a commit racing that claim is taken by it, and its
    # notification, arriving afterwards, reads as new work (the race D86 leaves open).
    claimed_once = threading.Event()
    claim = executor._claim_activities

    def claim_then_tell(*args, **kwargs):
        try:
            return claim(*args, **kwargs)
        finally:
            claimed_once.set()

    executor._claim_activities = claim_then_tell

    def submit_each_after_the_previous_result():
        assert claimed_once.wait(30)  # a safety limit
        for _ in range(3):
            execution_id = create(SERVED)
            # 20 s is a safety limit far below the window: a held claim would exceed it.
            finished.append(store.wait_for_finished([execution_id], timeout=20))

    with override_settings(OBELISK={**settings.OBELISK, "CLAIM_COALESCE": timedelta(seconds=60)}):
        _claim_and_run_beside(executor, submit_each_after_the_previous_result, budget=60, linger=1.0)
    assert len(finished) == 3
    assert executor.stats.coalesced == 0


@pytest.mark.postgres_only
def test_the_notification_of_work_a_claim_already_took_does_not_read_as_a_stream():
    """D86: a claim takes every execution announced before it starts, so it discards
    those announcements. Left in the listener, they read as work that arrived during the
    batch, and the next claim waited for the window with nothing to wait for."""
    from workers.components import load_components
    from workers.executor import Executor
    from workers.testing import current_deployment_id

    executor = Executor(load_components(), current_deployment_id())
    with override_settings(OBELISK={**settings.OBELISK, "CLAIM_COALESCE": timedelta(seconds=10)}):
        executor.claim_and_run(budget=0.2, linger=0.1)  # it listens from here on
        taken = create(SERVED)
        deadline = time.monotonic() + 30  # a safety limit
        while not executor._announcements.peek()[0] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert executor._announcements.peek()[0], "the notification never arrived"
        executor.claim_and_run(budget=5, linger=0.2)  # its first claim takes ``taken``
    assert store.get_state(taken).state == "finished"
    assert executor.stats.coalesced == 0


def test_a_busy_worker_waiting_for_more_of_a_stream_holds_new_work_back_only_until_its_claim():
    """D86 with D58: a busy worker that waits ``CLAIM_COALESCE`` before its next claim
    counts as finishing until then, so a worker woken meanwhile leaves the work to that
    claim; once its claim starts it no longer holds anything back. A worker that is not
    busy holds nothing back by waiting."""
    from workers import lingering

    lingering.prepare_cluster()
    try:
        lingering.claims_within(30)  # not busy: nothing to extend
        assert lingering._busy_until.value == 0.0
        lingering.batch_started(lingering.BUSY_DEFER * 10)  # a long batch holds nothing back
        assert lingering._busy_until.value == 0.0
        lingering.claims_within(30)
        assert lingering._busy_until.value > time.monotonic() + 29
        with lingering.claiming(8):
            assert lingering._busy.value == 0
    finally:
        _forget_cluster()


@pytest.mark.parametrize("children", [3, 30])
def test_a_write_of_many_join_nexts_reads_its_join_sets_responses_once_and_takes_them_in_order(children):
    """A workflow that collects a wide join set appends its join-nexts in one write; each
    takes the next response (spec 000 §5.2), one beyond the responses blocks, and the
    responses are read once for the whole write, not once per join-next."""
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from executions.events import ChildExecutionRequest, JoinNext, JoinSetCreate, JoinSetRequest
    from executions.ids import ExecutionId, JoinSetId
    from executions.state_machine import State
    from tests.helpers import ACTIVITY, DEPLOYMENT, create_workflow, history

    workflow = create_workflow()
    locked = lock(workflow)
    js = str(JoinSetId("n", "wide"))
    ids = [str(ExecutionId.parse(workflow).child(JoinSetId.parse(js), i)) for i in range(1, children + 1)]
    requests = [ChildExecutionRequest(child_execution_id=c, target_ffqn=FFQN, params=[]) for c in ids]
    version = store.append_batch_create_new_execution(
        workflow,
        locked.next_version,
        [history(JoinSetCreate(join_set_id=js))]
        + [history(JoinSetRequest(join_set_id=js, request=r)) for r in requests],
        [store.CreateRequest(c, FFQN, [], ACTIVITY, DEPLOYMENT, parent=(workflow, js)) for c in ids],
        fence=locked.fence,
    )
    for child in reversed(ids):  # responses arrive in another order than submitted
        finish(child, child)
    due = timezone.now()  # each found response makes the workflow pending from then on
    join_nexts = [history(JoinNext(join_set_id=js, run_expires_at=due)) for _ in range(children + 1)]

    with CaptureQueriesContext(connection) as writing:
        store.append_batch(workflow, version, join_nexts[:children], fence=locked.fence)
    reads = [q["sql"] for q in writing.captured_queries if "FROM t_join_set_response" in q["sql"]]
    assert len(reads) == 1, reads
    assert store.get_state(workflow).state == State.PENDING_AT  # every join-next found its response

    locked = lock(workflow)
    store.append_batch(workflow, locked.next_version, join_nexts[children:], fence=locked.fence)
    assert store.get_state(workflow).state == State.BLOCKED_BY_JOIN_SET  # none left to take


def _wide_join_set(children: int) -> tuple[str, list[str], list[str]]:
    """A locked workflow that started ``children`` activities in one join set, in one
    write; returns the workflow, the children and the SQL that write sent."""
    from django.test.utils import CaptureQueriesContext

    from executions.events import ChildExecutionRequest, JoinSetCreate, JoinSetRequest
    from executions.ids import ExecutionId, JoinSetId
    from tests.helpers import ACTIVITY, DEPLOYMENT, create_workflow, history

    workflow = create_workflow()
    locked = lock(workflow)
    js = str(JoinSetId("n", "wide"))
    ids = [str(ExecutionId.parse(workflow).child(JoinSetId.parse(js), i)) for i in range(1, children + 1)]
    events = [history(JoinSetCreate(join_set_id=js))] + [
        history(
            JoinSetRequest(
                join_set_id=js, request=ChildExecutionRequest(child_execution_id=c, target_ffqn=FFQN, params=[])
            )
        )
        for c in ids
    ]
    creates = [store.CreateRequest(c, FFQN, [], ACTIVITY, DEPLOYMENT, parent=(workflow, js)) for c in ids]
    with CaptureQueriesContext(connection) as writing:
        store.append_batch_create_new_execution(workflow, locked.next_version, events, creates, fence=locked.fence)
    return workflow, ids, [q["sql"] for q in writing.captured_queries]


def test_a_write_that_creates_a_join_set_and_waits_on_it_reads_no_responses():
    """A direct call (``ctx.call``) is one write: the join set's creation, the child's
    request and the join-next that waits for it. A response answers a child or a delay of a
    write already committed, so a join set this very write creates has none: its join-next
    blocks without reading ``t_join_set_response`` (one query less per call)."""
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from executions.events import ChildExecutionRequest, JoinNext, JoinSetCreate, JoinSetRequest
    from executions.ids import ExecutionId, JoinSetId
    from executions.state_machine import State
    from tests.helpers import ACTIVITY, DEPLOYMENT, create_workflow, history

    workflow = create_workflow()
    locked = lock(workflow)
    js = str(JoinSetId("o", "call"))
    child = str(ExecutionId.parse(workflow).child(JoinSetId.parse(js), 1))
    request = ChildExecutionRequest(child_execution_id=child, target_ffqn=FFQN, params=[])
    with CaptureQueriesContext(connection) as writing:
        store.append_batch_create_new_execution(
            workflow,
            locked.next_version,
            [
                history(JoinSetCreate(join_set_id=js)),
                history(JoinSetRequest(join_set_id=js, request=request)),
                history(JoinNext(join_set_id=js, run_expires_at=timezone.now())),
            ],
            [store.CreateRequest(child, FFQN, [], ACTIVITY, DEPLOYMENT, parent=(workflow, js))],
            fence=locked.fence,
        )
    assert not [q["sql"] for q in writing.captured_queries if "FROM t_join_set_response" in q["sql"]]
    assert store.get_state(workflow).state == State.BLOCKED_BY_JOIN_SET
    finish(child, 7)
    assert store.get_state(workflow).state == State.PENDING_AT  # the response still wakes it


@pytest.mark.postgres_only
def test_a_wide_join_set_is_created_and_answered_with_a_statement_per_table_not_per_child():
    """A workflow's write that starts 40 children inserts their rows with one statement per
    table; a group commit that finishes them inserts their 40 responses with one statement,
    each parent's responses taking consecutive seqs in the order of the batch."""
    from django.test.utils import CaptureQueriesContext

    from executions.models import JoinSetResponse

    workflow, ids, sent = _wide_join_set(40)
    assert sum(sql.count('INSERT INTO "t_state"') for sql in sent) == 1
    assert sum(sql.count('INSERT INTO "t_execution_log"') for sql in sent) == 2  # its events; the children's
    assert ExecutionState.objects.filter(pk__in=ids, state="pending_at").count() == 40

    finishing = list(reversed(ids))
    items = [store.AppendItem(c, None, Finished(retval=Ok(c)), lock(c).fence) for c in finishing]
    with CaptureQueriesContext(connection) as answering:
        assert all(isinstance(r, int) for r in store.append_many(items))
    assert sum(q["sql"].count("INSERT INTO t_join_set_response") for q in answering.captured_queries) == 1
    stored = list(
        JoinSetResponse.objects.filter(execution_id=workflow).order_by("seq").values_list("seq", "child_execution_id")
    )
    assert stored == list(enumerate(finishing, start=1))


def _finishing_items(children: list[str]) -> list[store.AppendItem]:
    """What an executor's group commit appends for ``children``: each one's result, with the
    fence of the lock it ran under."""
    return [store.AppendItem(c, None, Finished(retval=Ok(c)), lock(c).fence) for c in children]


def test_a_group_commit_locks_its_executions_and_the_parents_they_answer_in_one_query():
    """D68: a group commit's transaction that finishes children locks their rows and their
    parent's row with one query (before, a second round trip locked the parents once the
    batch was applied), and every response reaches the parent. (On PostgreSQL outside a
    transaction the whole group commit is one statement, D81.)"""
    from django.db import transaction
    from django.test.utils import CaptureQueriesContext

    from executions.models import JoinSetResponse

    workflow, children, _ = _wide_join_set(3)
    items = _finishing_items(children)
    with CaptureQueriesContext(connection) as answering, transaction.atomic():
        assert all(isinstance(r, int) for r in store.append_many(items))
    loads = [q["sql"] for q in answering.captured_queries if "FROM t_state WHERE" in q["sql"]]
    assert len(loads) == 1, loads
    assert JoinSetResponse.objects.filter(execution_id=workflow).count() == 3


@pytest.mark.postgres_only
@pytest.mark.parametrize("in_one_statement", [True, False], ids=["one statement", "transaction"])
def test_a_group_commit_locks_children_before_their_parents_as_every_other_writer_does(in_one_statement):
    """D68: the one query locks the batch's own rows first, then the parents (id order alone
    would put a parent first), and so does the one statement of D81. A writer that holds a
    child and then wants the parent, as a single append of a child's result does, is waited
    for instead of deadlocked."""
    from django.db import transaction

    workflow, children, _ = _wide_join_set(2)
    items = _finishing_items(children)

    def child_then_parent(cursor, held):
        cursor.execute("SELECT 1 FROM t_state WHERE execution_id = %s FOR UPDATE", [children[0]])
        held.set()
        time.sleep(0.5)  # the group commit is waiting for the child meanwhile
        cursor.execute("SELECT 1 FROM t_state WHERE execution_id = %s FOR UPDATE", [workflow])

    with _a_transaction_beside(child_then_parent):  # a deadlock would abort one of the two
        with contextlib.nullcontext() if in_one_statement else transaction.atomic():
            results = store.append_many(items)
    assert all(isinstance(r, int) for r in results)


@pytest.mark.postgres_only
def test_a_claim_of_activities_in_one_message_makes_what_the_claims_transaction_makes():
    """D69: outside a transaction, ``lock_pending`` of activities is one statement sent as
    its own transaction. It makes the same row, the same ``Locked`` event (byte for byte)
    and the same ``LockedExecution`` as the claim's transaction (inside ``atomic``) makes
    of a twin execution, with the same terms, executor, run and time."""
    from django.db import transaction
    from django.test.utils import CaptureQueriesContext

    from executions.ids import new_executor_id, new_run_id
    from tests.helpers import DEPLOYMENT, TERMS

    at, executor_id, run_id = timezone_now(), new_executor_id(), new_run_id()

    def claim() -> list[store.LockedExecution]:
        return store.lock_pending(
            {FFQN: TERMS}, limit=5, executor_id=executor_id, run_id=run_id, deployment_id=DEPLOYMENT, now=at
        )

    first = create(FFQN, [1], now=at)
    with CaptureQueriesContext(connection) as claiming:
        (in_one_message,) = claim()
    assert len(claiming.captured_queries) == 1
    second = create(FFQN, [1], now=at)
    with transaction.atomic():
        (in_a_transaction,) = claim()

    assert (in_one_message.execution_id, in_a_transaction.execution_id) == (first, second)
    assert _row_of(first) == _row_of(second)
    assert _log_of(first) == _log_of(second)
    assert {**in_one_message.__dict__, "execution_id": None} == {**in_a_transaction.__dict__, "execution_id": None}


def _workflow_with_a_history_and_a_response() -> str:
    """A pending workflow whose run submitted two children, one of them finished (its
    response waits in the table), and then handed the row back."""
    from tests.helpers import create_workflow

    workflow = create_workflow()
    locked = lock(workflow)
    children, _ = _children_of_one_write(workflow, locked, 2)
    child = lock(children[0])
    store.append(children[0], None, Finished(retval=Ok(1)), fence=child.fence)
    store.append(workflow, None, Unlocked(unlocked_at=timezone_now(), reason="test"), fence=locked.fence)
    return workflow


@pytest.mark.postgres_only
def test_a_claim_of_workflows_in_one_message_reads_their_history_and_responses_unless_held_already():
    """D78: a claim of workflows is one statement too; the history and responses of what
    it locked are then read under the new locks, two queries, and are the ones the store
    holds. A workflow whose history a parked run holds (``known``, D77) at the version it
    is claimed at is not read at all."""
    from django.test.utils import CaptureQueriesContext

    from executions.events import HistoryEventRecord
    from executions.ids import new_executor_id, new_run_id
    from tests.helpers import DEPLOYMENT, WORKFLOW_FFQN, WORKFLOW_TERMS

    def claim(**known) -> store.LockedExecution:
        (claimed,) = store.lock_pending(
            {WORKFLOW_FFQN: WORKFLOW_TERMS},
            limit=1,
            executor_id=new_executor_id(),
            run_id=new_run_id(),
            deployment_id=DEPLOYMENT,
            **known,
        )
        return claimed

    read, held = _workflow_with_a_history_and_a_response(), _workflow_with_a_history_and_a_response()
    with CaptureQueriesContext(connection) as claiming:
        claimed = claim()
    assert claimed.execution_id == read
    assert len(claiming.captured_queries) == 3
    log = store.get(read)
    assert claimed.history == [record for record in log.events if isinstance(record.event, HistoryEventRecord)]
    assert len(claimed.history) == 3
    assert claimed.responses == log.responses and len(claimed.responses) == 1
    assert claimed.next_version == log.next_version

    version = store.get_state(held).corresponding_version
    with CaptureQueriesContext(connection) as claiming:
        claimed = claim(known={held: version})
    assert claimed.execution_id == held
    assert len(claiming.captured_queries) == 1
    assert (claimed.history, claimed.responses) == (None, None)
    assert claimed.next_version == version + 2


@pytest.mark.postgres_only
def test_a_claim_of_workflows_whose_reads_fail_hands_what_it_locked_back(monkeypatch):
    """D78: the claim's statement commits before the history is read. If that read fails
    (the connection is lost), the workflows it locked go back at once (``Unlocked``, the
    claim's fence), instead of staying locked by nobody until their locks expire."""
    from django.db import OperationalError

    from executions.ids import new_executor_id, new_run_id
    from executions.store import locking
    from tests.helpers import DEPLOYMENT, WORKFLOW_FFQN, WORKFLOW_TERMS

    def lost(*args, **kwargs):
        raise OperationalError("server closed the connection unexpectedly")

    workflow = _workflow_with_a_history_and_a_response()
    monkeypatch.setattr(locking, "_histories", lost)
    with pytest.raises(OperationalError):
        store.lock_pending(
            {WORKFLOW_FFQN: WORKFLOW_TERMS},
            limit=1,
            executor_id=new_executor_id(),
            run_id=new_run_id(),
            deployment_id=DEPLOYMENT,
        )
    state = store.get_state(workflow)
    assert state.state == "pending_at"
    kinds = [record.event.VARIANT for record in store.get(workflow).events[-2:]]
    assert kinds == ["locked", "unlocked"]


@pytest.mark.postgres_only
def test_a_group_commit_of_top_level_results_in_one_message_writes_what_the_transaction_writes():
    """D70: outside a transaction, a group commit of top-level results is one statement
    sent as its own transaction. It returns the same version and makes the same row, the
    same ``Finished`` event (byte for byte) and the same ``obelisk_finished`` item as the
    group commit's transaction (inside ``atomic``) makes of a twin execution."""
    from django.db import transaction
    from django.test.utils import CaptureQueriesContext

    from executions.events import retval_to_json

    at = timezone_now()
    value = {"text": "é\u2028", "numbers": [1, 2.5, -0.0, 1e16]}
    first, second = create(FFQN, [1], now=at), create(FFQN, [1], now=at)
    items = {c: store.AppendItem(c, None, Finished(retval=Ok(value)), lock(c, now=at).fence) for c in (first, second)}
    finished_at = timezone_now()

    with notify.Listener([notify.FINISHED]) as listener:
        with CaptureQueriesContext(connection) as finishing:
            in_one_message = store.append_many([items[first]], now=finished_at)
        assert len(finishing.captured_queries) == 1
        with transaction.atomic():
            in_a_transaction = store.append_many([items[second]], now=finished_at)
        heard = _finished_items(listener, {first, second})

    assert in_one_message == in_a_transaction == [2]
    assert _row_of(first) == _row_of(second)
    assert _log_of(first)[-1] == _log_of(second)[-1]
    assert heard[first] == heard[second] == retval_to_json(Ok(value))
    assert store.get_finished_result(first) == Ok(value)


def test_the_one_message_group_commit_finishes_only_rows_the_state_table_lets_finish():
    """D70: the statement finishes only ``locked`` rows (of any lifecycle a locked row can
    have), and for those the state machine's table says ``finished`` → finished; every other
    row goes through the transaction, which asks the table."""
    from executions.state_machine import Effect, Lifecycle, State, decide
    from executions.store.append import _finish_sql
    from executions.store.transitions import finish_fields

    assert f"s.state = '{State.LOCKED.value}'" in _finish_sql(
        tuple(finish_fields(Finished(retval=Ok(1)), timezone_now()))
    )
    for lifecycle in (Lifecycle.ACTIVE, Lifecycle.CANCELLING):
        assert decide(Finished.VARIANT, State.LOCKED, lifecycle) is Effect.FINISH


def test_a_result_whose_lock_moved_on_is_refused_while_the_rest_of_its_group_commit_is_written():
    """D70: a result whose run no longer holds the lock is not written by the one
    statement; the group commit's transaction then refuses it (``LockLost``), and the
    other results of the batch are written."""
    from executions.events import Unlocked

    kept, lost = create(), create()
    items = [store.AppendItem(c, None, Finished(retval=Ok(c)), lock(c).fence) for c in (kept, lost)]
    store.append(lost, None, Unlocked(unlocked_at=timezone_now(), reason="test"), fence=items[1].fence)
    taken_over = lock(lost)

    results = store.append_many(items)

    assert results[0] == 2 and isinstance(results[1], errors.LockLost)
    assert store.get_finished_result(kept) == Ok(kept)
    state = store.get_state(lost)
    assert (state.state, state.run_id) == ("locked", taken_over.fence.run_id)


def _blocked_parent_with_a_locked_child(strategy: str, at, run_id: str, executor_id: str):
    """A workflow (locked by ``run_id`` at ``at``) that started one child in a join set and
    waits for it as ``strategy`` does: Interrupt with its run ended (blocked, due as soon as
    a response comes), Await with its run waiting in place (due at its lock's expiry).
    Returns the workflow, and the child's result as its run's group commit appends it."""
    from executions.events import JoinNext
    from tests.helpers import create_workflow, history, start_child

    workflow = create_workflow(now=at)
    locked = lock(workflow, now=at, run_id=run_id, executor_id=executor_id)
    child, version = start_child(workflow, "n:wait", locked.next_version, fence=locked.fence, now=at)
    expires = at if strategy == "interrupt" else locked.locked.lock_expires_at
    join_next = history(JoinNext(join_set_id="n:wait", run_expires_at=expires))
    store.append(workflow, version, join_next, fence=locked.fence, now=at)
    fence = lock(child, now=at, run_id=run_id, executor_id=executor_id).fence
    return workflow, store.AppendItem(child, None, Finished(retval=Ok({"n": [1, 2.5]})), fence)


@pytest.mark.postgres_only
@pytest.mark.parametrize("strategy", ["interrupt", "await"])
def test_a_group_commit_of_childrens_results_in_one_message_writes_what_the_transaction_writes(strategy):
    """D81: outside a transaction, a group commit of children's results is one statement,
    as one of top-level results is (D70). It returns the same version and makes the same
    child row and ``Finished`` event (byte for byte), the same response (seq, time, join
    set, version, value), the same parent row (due now under Interrupt, at its lock's expiry
    under Await), the same notifications, and hands this process's listeners the same
    response (D67), as the group commit's transaction makes of a twin family."""
    import dataclasses

    from django.db import transaction
    from django.test.utils import CaptureQueriesContext

    from executions.ids import new_executor_id, new_run_id

    at, run_id, executor_id = timezone_now(), new_run_id(), new_executor_id()
    first, first_item = _blocked_parent_with_a_locked_child(strategy, at, run_id, executor_id)
    second, second_item = _blocked_parent_with_a_locked_child(strategy, at, run_id, executor_id)
    finished_at = timezone_now()

    with notify.Listener([notify.RESPONSE, notify.PENDING]) as listener:
        with CaptureQueriesContext(connection) as finishing:
            in_one_message = store.append_many([first_item], now=finished_at)
        assert len(finishing.captured_queries) == 1
        heard = {first: _heard(listener, first)}
        with transaction.atomic():
            in_a_transaction = store.append_many([second_item], now=finished_at)
        heard[second] = _heard(listener, second)

    assert in_one_message == in_a_transaction == [2]
    assert _row_of(first_item.execution_id) == _row_of(second_item.execution_id)
    assert _log_of(first_item.execution_id)[-1] == _log_of(second_item.execution_id)[-1]
    assert _row_of(first) == _row_of(second)
    assert store.get_state(first).state == "pending_at"

    def seen(parent: str, responses) -> list:
        return [dataclasses.replace(r, child_execution_id=None) for r in responses]

    (response,) = store.get(first).responses
    assert (response.seq, response.child_execution_id, response.finished_version) == (1, first_item.execution_id, 2)
    assert seen(first, store.get(first).responses) == seen(second, store.get(second).responses)
    assert seen(first, heard[first]["values"]) == seen(second, heard[second]["values"])
    assert seen(first, heard[first]["values"]) == seen(first, store.get(first).responses)
    assert heard[first]["pending"] == heard[second]["pending"] == (strategy == "interrupt")


@pytest.mark.postgres_only
def test_a_group_commit_locks_a_parked_runs_workflow_as_its_claim_would():
    """D82: a child's result that answers a workflow whose run is parked in the writer's
    process (``ParkedRuns``, at the version its run wrote last) locks that workflow for the
    writer in the same statement. The row, the whole log (its ``Locked`` event byte for
    byte) and the lock are what the group commit and then a claim of the pending workflow
    make of a twin; the responses the run needs come back with it. A workflow whose row
    moved on since its run parked goes pending, for a claim, as without ``parked``."""
    from django.test.utils import CaptureQueriesContext

    from executions.ids import new_executor_id, new_run_id
    from tests.helpers import DEPLOYMENT, WORKFLOW_FFQN, WORKFLOW_TERMS

    at, run_id, executor_id = timezone_now(), new_run_id(), new_executor_id()
    first, first_item = _blocked_parent_with_a_locked_child("interrupt", at, run_id, executor_id)
    second, second_item = _blocked_parent_with_a_locked_child("interrupt", at, run_id, executor_id)
    moved, moved_item = _blocked_parent_with_a_locked_child("interrupt", at, run_id, executor_id)
    version = store.get_state(first).corresponding_version
    finished_at, claimer, claim_run = timezone_now(), new_executor_id(), new_run_id()
    parked = store.ParkedRuns(
        {first: (version, WORKFLOW_TERMS), moved: (version - 1, WORKFLOW_TERMS)}, claimer, claim_run, DEPLOYMENT
    )

    with CaptureQueriesContext(connection) as finishing:
        assert store.append_many([first_item, moved_item], now=finished_at, parked=parked) == [2, 2]
    assert len(finishing.captured_queries) == 1
    assert store.append_many([second_item], now=finished_at) == [2]
    assert store.get_state(second).state == store.get_state(moved).state == "pending_at"
    claimed = store.lock_pending(
        {WORKFLOW_FFQN: WORKFLOW_TERMS},
        limit=5,
        executor_id=claimer,
        run_id=claim_run,
        deployment_id=DEPLOYMENT,
        now=finished_at,
        known={second: version, moved: version},
    )
    assert sorted(c.execution_id for c in claimed) == sorted([second, moved])
    (twin,) = [c for c in claimed if c.execution_id == second]

    assert set(parked.resumed) == {first}
    locked, locked_version, responses = parked.resumed[first]
    assert (locked, locked_version) == (twin.locked, twin.next_version - 1)
    assert _row_of(first) == _row_of(second)
    assert _log_of(first, from_version=version + 1) == _log_of(second, from_version=version + 1)
    assert [variant for _, _, _, variant, *_ in _log_of(first, from_version=version + 1)] == ["locked"]
    assert responses == store.get(first).responses and len(responses) == 1


def _heard(listener, parent: str) -> dict:
    """What a commit of this process announced: the responses its listeners were handed
    for ``parent`` with the ``obelisk_response`` notification (D67), and whether the
    workflows' function was announced on ``obelisk_pending``. Delivered at the commit, so
    everything is there once the notifications stop coming."""
    from tests.helpers import WORKFLOW_FFQN

    heard = {"values": [], "pending": False}
    while notes := listener.wait(0.2):
        for note in notes:
            if parent in note.items:
                heard["values"] += [r for p, r in note.responses if p == parent]
            heard["pending"] |= note.channel == notify.PENDING and WORKFLOW_FFQN in note.items
    return heard


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_a_response_given_while_the_one_statement_waits_for_the_parent_sends_the_batch_to_the_transaction():
    """D81: the statement reads a parent's last response seq in its snapshot, taken before
    it waited for the parent's lock. Another group commit that answered the same parent and
    committed meanwhile took that seq: the statement fails on the per-parent seq key and
    writes nothing, and the transaction, which reads the responses afresh under the lock,
    writes the batch. Both responses are there, in commit order, and nothing fails."""
    from django.test.utils import CaptureQueriesContext

    workflow, children, _ = _wide_join_set(2)
    first, second = _finishing_items(children)

    def answer_first_and_commit_once_the_statement_waits(cursor, holding):
        assert isinstance(store.append_many([first])[0], int)  # holds the parent's row
        holding.set()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND datname = current_database() AND pid <> pg_backend_pid()"
            )
            if cursor.fetchone()[0]:
                break
            time.sleep(0.01)

    with _a_transaction_beside(answer_first_and_commit_once_the_statement_waits):
        with CaptureQueriesContext(connection) as sent:
            (result,) = store.append_many([second])
    assert result == 2
    assert len(sent.captured_queries) > 1  # the statement, then the transaction
    responses = [(r.seq, r.child_execution_id) for r in store.get(workflow).responses]
    assert responses == [(1, first.execution_id), (2, second.execution_id)]
    assert store.get_state(second.execution_id).state == "finished"


@contextlib.contextmanager
def _a_transaction_beside(body):
    """``body(cursor, holding)`` in a transaction of another thread, on that thread's own
    connection; the block runs once ``body`` has set ``holding`` (or has failed). On
    leaving, the thread is joined, and it must not have failed (a deadlock, an error)."""
    from django.db import connection as this_threads
    from django.db import transaction

    holding, failures = threading.Event(), []

    def run():
        try:
            with transaction.atomic(), this_threads.cursor() as cursor:
                body(cursor, holding)
        except Exception as error:
            failures.append(error)
        finally:
            holding.set()
            this_threads.close()

    thread = threading.Thread(target=run)
    thread.start()
    assert holding.wait(10)
    yield
    thread.join(10)
    assert failures == []


def _finished_items(listener, wanted: set[str]) -> dict:
    """The values announced on ``obelisk_finished`` for ``wanted``, waiting up to 5 s."""
    heard, deadline = {}, time.monotonic() + 5
    while set(heard) != wanted and time.monotonic() < deadline:
        for note in listener.wait(0.2):
            for item in note.items:
                execution_id, value = notify.parse_finished_item(item)
                if execution_id in wanted:
                    heard[execution_id] = value
    return heard


def _row_of(execution_id: str) -> dict:
    return {**ExecutionState.objects.filter(pk=execution_id).values().get(), "execution_id": None}


def _log_of(execution_id: str, *, from_version: int = 1) -> list[tuple]:
    """The log as stored, JSON as text; by default from version 1, the ``Created`` event
    left out."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT version, created_at, json_value::text, variant, join_set_id, history_event_type,"
            " consumes_response FROM t_execution_log WHERE execution_id = %s AND version >= %s ORDER BY version",
            [execution_id, from_version],
        )
        return cursor.fetchall()


def _claim_and_run_beside(executor, side, **options) -> None:
    """``executor.claim_and_run(**options)`` while ``side`` runs in a thread of its own (with
    its own connection, closed at its end); then the runs of workflows it started end."""

    def run_side():
        try:
            side()
        finally:
            connection.close()

    thread = threading.Thread(target=run_side)
    thread.start()
    try:
        executor.claim_and_run(**options)
    finally:
        thread.join()
        executor.workflows.join(30)


def test_a_workflow_that_comes_due_while_activities_keep_the_worker_busy_starts_before_they_are_drained(tmp_path):
    """A worker whose claims of activities keep coming back full still starts a workflow
    announced meanwhile (after its current batch), instead of once the activity backlog is
    drained: an Interrupt workflow's next run, made due by a response, would otherwise wait
    behind every activity queued after it."""
    from tests import workflows
    from tests.helpers import WORKFLOW
    from workers.components import load_components
    from workers.executor import Executor
    from workers.testing import current_deployment_id

    executor = Executor(
        {**load_components(), workflows.draws.ffqn: workflows.draws}, current_deployment_id(), max_batch=1
    )
    marker = str(tmp_path / "marker")
    backlog = [create("test:acts/slow.sleep", [0.1, marker]) for _ in range(6)]
    workflow_id: list[str] = []

    def submit_a_workflow_once_the_worker_is_busy():
        while not ExecutionState.objects.filter(pk=backlog[0], state="finished").exists():
            time.sleep(0.01)
        workflow_id.append(create(workflows.draws.ffqn, component=WORKFLOW))

    _claim_and_run_beside(executor, submit_a_workflow_once_the_worker_is_busy, budget=30, linger=0)

    def locked_at(execution_id: str):
        return next(r.created_at for r in store.get(execution_id).events if r.event.VARIANT == "locked")

    assert all(store.get_state(e).state == "finished" for e in backlog)
    assert locked_at(workflow_id[0]) < locked_at(backlog[-1])
    assert store.get_state(workflow_id[0]).state == "finished"


def _children_of_one_write(parent: str, locked, count: int, claim=None, *, ffqn=FFQN, component=None, **request):
    """``parent``'s run opens a join set and submits ``count`` children of ``ffqn`` in one
    write, with ``claim``: the children's ids and what the write claimed."""
    from executions.events import ChildExecutionRequest, JoinSetCreate, JoinSetRequest
    from executions.ids import ExecutionId, JoinSetId
    from tests.helpers import ACTIVITY, DEPLOYMENT, history

    js = JoinSetId("n", f"eager{locked.next_version}")
    children = [str(ExecutionId.parse(parent).child(js, i + 1)) for i in range(count)]
    events = [history(JoinSetCreate(join_set_id=str(js)))] + [
        history(
            JoinSetRequest(
                join_set_id=str(js), request=ChildExecutionRequest(child_execution_id=c, target_ffqn=ffqn, params=[i])
            )
        )
        for i, c in enumerate(children)
    ]
    requests = [
        store.CreateRequest(
            execution_id=c,
            ffqn=ffqn,
            params=[i],
            component_id=component or ACTIVITY,
            deployment_id=DEPLOYMENT,
            parent=(parent, str(js)),
            **request,
        )
        for i, c in enumerate(children)
    ]
    _, claimed = store.append_and_claim_children(
        parent, locked.next_version, events, requests, fence=locked.fence, claim=claim
    )
    return children, claimed


def _claim(limit: int = 10, **terms) -> store.ChildClaim:
    from executions.ids import new_executor_id, new_run_id
    from tests.helpers import DEPLOYMENT, TERMS

    return store.ChildClaim(terms or {FFQN: TERMS}, limit, new_executor_id(), new_run_id(), DEPLOYMENT)


def _comparable_state(execution_id: str) -> dict:
    row = ExecutionState.objects.filter(pk=execution_id).values().get()
    for name in ("execution_id", "created_at", "updated_at", "first_scheduled_at", "pending_expires_finished"):
        row.pop(name)
    return row


def _comparable_events(execution_id: str) -> list:
    from executions.events import event_to_json

    out = []
    for record in store.get(execution_id).events:
        body = event_to_json(record.event)
        for fields in body.values():
            for name in ("scheduled_at", "lock_expires_at", "params", "parent"):
                fields.pop(name, None)
        out.append((record.version, body))
    return out


def test_a_child_created_locked_is_exactly_what_lock_pending_makes_of_a_pending_one():
    """D65: a child created locked for the writer's own executor has the same row, the same
    log and the same ``LockedExecution`` as one created pending and then claimed with the
    same terms, executor and run; it is never announced as pending."""
    from tests.helpers import DEPLOYMENT, TERMS, create_workflow, lock

    parent = create_workflow()
    run = lock(parent)
    claim = _claim()
    with notify.Listener([notify.PENDING]) as listener:
        (eager,), claimed = _children_of_one_write(parent, run, 1, claim)
        assert not any(FFQN in note.items for note in listener.wait(0.2))
    run = store.LockedExecution(**{**run.__dict__, "next_version": store.get_state(parent).next_version})
    (pending,), none = _children_of_one_write(parent, run, 1)
    assert none == []
    (claimed_later,) = store.lock_pending(
        {FFQN: TERMS}, limit=1, executor_id=claim.executor_id, run_id=claim.run_id, deployment_id=DEPLOYMENT
    )
    assert claimed_later.execution_id == pending
    assert _comparable_state(eager) == _comparable_state(pending)
    assert _comparable_events(eager) == _comparable_events(pending)
    (locked_eagerly,) = claimed
    for name in (
        "ffqn",
        "metadata",
        "component_type",
        "component_digest",
        "deployment_id",
        "next_version",
        "intermittent_event_count",
        "fence",
        "history",
        "responses",
    ):
        assert getattr(locked_eagerly, name) == getattr(claimed_later, name), name
    assert locked_eagerly.params == store.get_created(eager).params
    assert locked_eagerly.parent == store.get_created(eager).parent
    assert locked_eagerly.locked == store.get(eager).events[1].event


def test_a_write_claims_only_due_children_of_functions_and_components_the_claimer_runs_and_at_most_its_limit():
    """D65: a child scheduled for later, of another function, built from another component,
    or beyond the claim's limit is created pending (and announced when due), as usual."""
    from executions.events import ComponentId
    from executions.ids import content_digest
    from tests.helpers import TERMS, create_workflow, lock

    parent = create_workflow()
    run = lock(parent)
    children, claimed = _children_of_one_write(parent, run, 3, _claim(limit=2))
    assert [c.execution_id for c in claimed] == children[:2]
    assert [store.get_state(c).state for c in children] == ["locked", "locked", "pending_at"]

    def next_run():
        return store.LockedExecution(**{**run.__dict__, "next_version": store.get_state(parent).next_version})

    later = timezone_now() + timedelta(hours=1)
    scheduled, claimed = _children_of_one_write(parent, next_run(), 1, _claim(), scheduled_at=later)
    assert claimed == [] and store.get_state(scheduled[0]).state == "pending_at"
    other, claimed = _children_of_one_write(parent, next_run(), 1, _claim(**{"test:pkg/ifc.other": TERMS}))
    assert claimed == [] and store.get_state(other[0]).state == "pending_at"
    foreign = ComponentId(component_type="activity", name="elsewhere", component_digest=content_digest(b"other"))
    built_elsewhere, claimed = _children_of_one_write(parent, next_run(), 1, _claim(), component=foreign)
    assert claimed == [] and store.get_state(built_elsewhere[0]).state == "pending_at"


def test_a_refused_write_neither_creates_nor_locks_its_children():
    """D65: the children are created locked in the parent's transaction, so a write the
    store refuses (here: a run whose lock is gone) leaves no child, locked or not."""
    from tests.helpers import create_workflow, lock

    parent = create_workflow()
    stale = lock(parent)
    store.append(parent, None, Unlocked(unlocked_at=timezone_now(), reason="test"), fence=stale.fence)
    lock(parent)
    before = ExecutionState.objects.count()
    with pytest.raises(errors.LockLost):
        _children_of_one_write(parent, stale, 2, _claim())
    assert ExecutionState.objects.count() == before


def test_a_workflows_children_run_on_its_own_worker_without_a_claim_and_its_result_is_unchanged():
    """D65, end to end in one process: a sequential workflow's child activities are locked by
    the write that creates them and run by the executor of the workflow's own process (their
    ``Locked`` event is written with their ``Created`` event, by that executor); the
    workflow's result is the one it computes without the shortcut."""
    from tests import workflows
    from tests.helpers import WORKFLOW
    from workers.components import load_components
    from workers.executor import Executor
    from workers.testing import current_deployment_id

    components = {
        **load_components(),
        workflows.sequential_sum.ffqn: workflows.sequential_sum,
        workflows.fn2.ffqn: workflows.fn2,
    }
    executor = Executor(components, current_deployment_id())

    workflow_id = create(workflows.sequential_sum.ffqn, [5], component=WORKFLOW)
    executor.claim_and_run(budget=30, linger=2)
    executor.workflows.join(30)
    assert store.get_finished_result(workflow_id) == Ok(15)
    children = ExecutionState.objects.filter(execution_id__startswith=workflow_id + ".")
    assert children.count() == 5
    for child in children:
        created, locked = store.get(child.execution_id).events[:2]
        assert locked.event.VARIANT == "locked" and locked.version == 1
        assert locked.created_at == created.created_at  # one transaction: the parent's write
        assert locked.event.executor_id == executor.executor_id
    assert executor.stats.finished >= 5


def test_children_handed_to_an_executor_that_stopped_claiming_are_handed_back_for_any_worker():
    """D65: an executor takes handed children only while it claims; afterwards ``hand_over``
    unlocks them at once (no retry used), so another worker claims them instead of waiting
    for their locks to expire."""
    from tests.helpers import DEPLOYMENT, TERMS, create_workflow, lock
    from workers.executor import Executor

    executor = Executor({}, DEPLOYMENT)
    executor.terms = {FFQN: TERMS}
    executor.claim_and_run(budget=0.1, linger=0)  # claims, then closes its window
    assert executor.child_claim([FFQN]) is None
    parent = create_workflow()
    children, claimed = _children_of_one_write(parent, lock(parent), 2, _claim())
    executor.hand_over(claimed)
    assert [store.get_state(c).state for c in children] == ["pending_at", "pending_at"]
    assert all(store.get(c).events[-1].event.VARIANT == "unlocked" for c in children)
    assert (
        len(
            store.lock_pending(
                {FFQN: TERMS},
                limit=5,
                executor_id=claimed[0].locked.executor_id,
                run_id=claimed[0].fence.run_id,
                deployment_id=DEPLOYMENT,
            )
        )
        == 2
    )


def test_a_response_to_an_awaiting_workflow_wakes_no_broker_and_leaves_it_due_at_its_runs_lock_expiry():
    """D66: a response to a workflow whose run awaits it in place wakes that run
    (``obelisk_response``) and nothing else: no ``obelisk_scheduled``, which woke every broker
    of every cluster to recompute its next wake-up. The row is due at the run's lock expiry,
    in case the run dies, and a broker's periodic look (``next_pending_at``) finds it."""
    from tests.helpers import WORKFLOW_FFQN, block_on_child, create_workflow

    parent = create_workflow()
    run = lock(parent)
    _, child, _ = block_on_child(parent, run)
    with notify.Listener([notify.SCHEDULED, notify.PENDING, notify.RESPONSE]) as listener:
        finish(child, 1)
        deadline, notes = time.monotonic() + 0.3, []
        while (left := deadline - time.monotonic()) > 0:
            notes.extend(listener.wait(left))
    assert any(n.channel == notify.RESPONSE and parent in n.items for n in notes)
    assert not any(n.channel == notify.SCHEDULED for n in notes)
    assert not any(n.channel == notify.PENDING and WORKFLOW_FFQN in n.items for n in notes)
    state = store.get_state(parent)
    assert state.state == "pending_at"
    assert state.pending_expires_finished == run.locked.lock_expires_at
    assert store.next_pending_at([WORKFLOW_FFQN]) == run.locked.lock_expires_at


def test_only_an_executor_not_running_activities_is_offered_a_workflows_children(tmp_path):
    """D65: children are created locked for the executor of the workflow's own process only
    while it is not running activities. One running an activity is offered none, and
    children handed to it after it started are given back at once: they would wait behind
    the run under way, where any other worker can take them when they are pending."""
    import os

    from tests.helpers import create_workflow
    from workers.components import load_components
    from workers.executor import Executor
    from workers.testing import current_deployment_id

    executor = Executor(load_components(), current_deployment_id(), max_batch=1)
    marker = str(tmp_path / "marker")
    slow = create("test:acts/slow.sleep", [0.5, marker])
    offers = {}

    def offer_while_busy_then_while_idle():
        while not os.path.exists(marker):  # the slow activity has started
            time.sleep(0.005)
        offers["busy"] = executor.child_claim([SERVED])
        parent = create_workflow()  # children a write locked just before it got busy
        children, claimed = _children_of_one_write(parent, lock(parent), 2, _claim())
        executor.hand_over(claimed)
        offers["handed while busy"] = [store.get(c).events[-1].event.VARIANT for c in children]
        while store.get_state(slow).state != "finished":
            time.sleep(0.01)
        time.sleep(0.2)  # the executor lingers, waiting for work
        offers["idle"] = executor.child_claim([SERVED])

    _claim_and_run_beside(executor, offer_while_busy_then_while_idle, budget=10, linger=1.0)
    assert offers["busy"] is None
    assert offers["handed while busy"] == ["unlocked", "unlocked"]  # pending at once, for any worker
    assert offers["idle"] is not None and SERVED in offers["idle"].functions


@pytest.mark.postgres_only
def test_a_plain_create_in_one_prepared_statement_makes_what_the_creates_transaction_makes():
    """D71: outside a transaction, a plain create is ONE statement (its writes are CTEs),
    which the connection prepares once it has run it a few times. It makes the same row,
    the same event and the same notification as the create's transaction (inside
    ``atomic``) makes of a twin execution."""
    from django.db import transaction

    at = timezone_now()
    for _ in range(6):  # psycopg prepares a statement the fifth time a connection runs it
        create(FFQN, [1], now=at)
    with notify.Listener([notify.PENDING]) as listener, _statements_sent() as creating:
        in_one_statement = create(FFQN, [1], now=at)
        assert any(FFQN in note.items for note in listener.wait(5.0))
    (sql,) = creating
    assert sql.lstrip().startswith("WITH") and "; " not in sql
    assert _prepared_statement_count(sql) == 1
    with transaction.atomic():
        in_a_transaction = create(FFQN, [1], now=at)
    assert _row_of(in_one_statement) == _row_of(in_a_transaction)
    assert _log_of(in_one_statement, from_version=0) == _log_of(in_a_transaction, from_version=0)


@pytest.mark.postgres_only
def test_the_claims_and_results_a_worker_repeats_are_prepared_statements():
    """D71: the statements a worker runs for every batch (its claim of activities and its
    group commit of their results) are prepared on its connection after a few batches,
    so the server no longer parses and plans them."""
    from executions.ids import new_executor_id, new_run_id
    from tests.helpers import DEPLOYMENT, TERMS

    for _ in range(6):
        create(FFQN, [1])
        with _statements_sent() as running:
            (locked,) = store.lock_pending(
                {FFQN: TERMS}, limit=5, executor_id=new_executor_id(), run_id=new_run_id(), deployment_id=DEPLOYMENT
            )
            store.append_many([store.AppendItem(locked.execution_id, None, Finished(retval=Ok(1)), locked.fence)])
    claim, result = running
    assert _prepared_statement_count(claim) == 1
    assert _prepared_statement_count(result) == 1


@pytest.mark.postgres_only
@pytest.mark.parametrize("statements_after", [0, 1, 1000])
def test_a_batch_of_statements_in_a_transaction_that_fails_on_one_changes_nothing(statements_after, caplog):
    """D71: a transaction's statements go in one pipeline; when one of them fails (here a
    duplicate id), the caller gets Django's ``IntegrityError``, none of the batch's writes
    nor the rest of the transaction is kept, and nothing is logged (psycopg warns when a
    pipeline ends while an error of its own is on its way: a CLI printed that warning)."""
    from django.db import IntegrityError, transaction

    from executions.sql import Statements

    existing = create(FFQN, [1])
    before = ExecutionState.objects.count()
    with pytest.raises(IntegrityError), transaction.atomic():
        ExecutionState.store_objects.filter(pk=existing).update(ffqn="changed/in.tx")
        statements = Statements()
        statements.update(ExecutionState, [existing], {"max_retries": 7})
        statements.add(
            f"INSERT INTO {ExecutionState._meta.db_table} SELECT * FROM {ExecutionState._meta.db_table} "
            "WHERE execution_id = %s",
            [existing],
        )
        for _ in range(statements_after):
            statements.update(ExecutionState, [existing], {"max_retries": 8})
        statements.run()
    row = ExecutionState.objects.get(pk=existing)
    assert (row.ffqn, row.max_retries) == (FFQN, None)
    assert ExecutionState.objects.count() == before
    assert not [record for record in caplog.records if record.name.startswith("psycopg")]


@contextlib.contextmanager
def _statements_sent():
    """The text of each statement this connection sends meanwhile, as the store wrote it."""
    sent = []

    def record(execute, sql, params, many, context):
        sent.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        yield sent


def _prepared_statement_count(sql: str) -> int:
    """How many prepared statements of this connection have the text ``sql`` (psycopg
    sends ``%s`` as ``$n``)."""
    import re

    counter = iter(range(1, 10_000))
    text = re.sub(r"%s", lambda _: f"${next(counter)}", sql)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements WHERE statement = %s", [text])
        return cursor.fetchone()[0]


@pytest.mark.postgres_only
def test_a_claims_prepared_statement_finds_due_work_through_the_partial_index_of_pending_rows():
    """D71: a prepared statement runs a generic plan, and a generic plan cannot use a
    partial index whose predicate is a parameter. The claim's constant predicates (state
    pending, lifecycle active) are therefore part of its text: its generic plan reads the
    partial index of pending rows (``t_state_pending_ffqn``), never an index of every row of
    the function, which would read every finished execution at each claim. The table is
    analyzed as such a worker finds it: thousands of finished executions of the function and
    a few due (statistics of a near-empty table let either index look as cheap)."""
    from executions.store.locking import _due_candidates_sql

    _analyzed_table(finished=3000, due=3)
    plan = _generic_plan(*_due_candidates_sql([FFQN], timezone_now(), 5))
    assert "t_state_pending_ffqn" in plan, plan


def _analyzed_table(*, finished: int, due: int = 0, locked: int = 0) -> list[store.LockedExecution]:
    """``finished`` executions of ``FFQN`` run to their end, ``due`` ones pending and
    ``locked`` ones locked, all through the store; then ``t_state`` analyzed, so that the
    planner's statistics describe them. Returns the locked executions."""
    from executions.ids import new_executor_id, new_run_id
    from tests.helpers import ACTIVITY, DEPLOYMENT, TERMS

    now = timezone_now()

    def requests(count: int) -> list[store.CreateRequest]:
        return [
            store.CreateRequest(
                execution_id=str(ExecutionId.generate()),
                ffqn=FFQN,
                params=[n],
                component_id=ACTIVITY,
                deployment_id=DEPLOYMENT,
            )
            for n in range(count)
        ]

    store.create_many(requests(finished), now=now)
    claimed = store.lock_pending(
        {FFQN: TERMS},
        limit=finished,
        executor_id=new_executor_id(),
        run_id=new_run_id(),
        deployment_id=DEPLOYMENT,
        now=now,
    )
    store.append_many([store.AppendItem(c.execution_id, None, Finished(retval=Ok(1)), c.fence) for c in claimed])
    unfinished = requests(due + locked)
    store.create_many(unfinished, now=now)
    held = [lock(r.execution_id, now=now) for r in unfinished[due:]]
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE t_state")
    return held


def _generic_plan(sql: str, params: list) -> str:
    """The plan PostgreSQL gives ``sql`` as the prepared statement a worker runs over and
    over: a generic plan, made without the parameters' values."""
    import re

    from executions.sql import client_side_cursor

    numbered = iter(range(1, 100))
    statement = re.sub("%s", lambda _: f"${next(numbered)}", sql)
    with client_side_cursor() as cursor:  # the values go into EXECUTE's text
        cursor.execute(f"PREPARE plan_probe AS {statement}")
        try:
            cursor.execute("SET plan_cache_mode = force_generic_plan")
            cursor.execute(f"EXPLAIN EXECUTE plan_probe({', '.join(['%s'] * len(params))})", params)
            return "\n".join(row[0] for row in cursor.fetchall())
        finally:
            cursor.execute("RESET plan_cache_mode")
            cursor.execute("DEALLOCATE plan_probe")


@pytest.mark.postgres_only
def test_a_group_commit_of_results_finds_its_rows_by_id_however_many_executions_are_locked():
    """The one-message group commit of results (D70) locks its rows through the primary
    key. Its fence test (state ``locked``) must not let the planner read them through the
    partial index of every locked row: that reads each execution locked anywhere (and each
    dead entry a bitmap scan never prunes) at every result, a cost that grows with the
    number of executions locked, awaiting workflows included. Its generic plan never reads
    ``t_state_locked_expiry``, not even where that index looks cheapest: thousands of rows,
    a few of them locked when the table was analyzed."""
    from executions.events import compact_json
    from executions.store.append import _FINISH_FIELDS, _finish_sql, _finished_rows

    locked = _analyzed_table(finished=3000, locked=3)
    now = timezone_now()
    ids = [locked[0].execution_id]
    rows, _, _ = _finished_rows(ids, [store.AppendItem(ids[0], None, Finished(retval=Ok(1)), locked[0].fence)], now)
    at = connection.ops.adapt_datetimefield_value(now)
    plan = _generic_plan(_finish_sql(_FINISH_FIELDS), [compact_json(rows), ids, at, at, notify.FINISHED])
    assert "t_state_locked_expiry" not in plan, plan


@pytest.mark.postgres_only
def test_a_claim_and_a_group_commit_read_rows_by_key_in_plans_made_while_the_tables_were_small():
    """D87: a worker's connection keeps the generic plan its claim and its group commit got
    when they were first prepared, until the tables are analyzed again. In a new
    deployment that is while the tables hold a few dozen executions, and on a server
    without autovacuum it is for good. Such a plan must still find each row by its key:
    one that reads the whole log, or the whole state table, at every claim or result
    costs more with every execution ever run (measured: 4,700 rows read per result, and
    ten times the server's work per claim, after 20,000 executions). The tables are
    shadowed here by never-analyzed copies of a few dozen executions, as a worker finds
    them in its first seconds."""
    from executions.events import compact_json
    from executions.ids import new_executor_id, new_run_id
    from executions.store.append import _FINISH_FIELDS, _finish_sql, _finished_rows
    from executions.store.claim import lock_document, new_lock
    from executions.store.locking import _claim_sql, _due_candidates_sql
    from tests.helpers import DEPLOYMENT, TERMS

    held = [lock(create(FFQN, [n])) for n in range(40)]
    now = timezone_now()
    at = connection.ops.adapt_datetimefield_value(now)
    locked = new_lock(TERMS, new_executor_id(), new_run_id(), DEPLOYMENT, now)
    names, document = lock_document(TERMS, locked)
    candidates, params = _due_candidates_sql([FFQN], now, 8)
    ids = [held[0].execution_id]
    rows, _, _ = _finished_rows(ids, [store.AppendItem(ids[0], None, Finished(retval=Ok(1)), held[0].fence)], now)
    with _never_analyzed_copies("t_state", "t_execution_log"):
        claim = _generic_plan(
            _claim_sql(candidates, names), [*params, compact_json([{"ffqn": FFQN, **document}]), at, at]
        )
        result = _generic_plan(_finish_sql(_FINISH_FIELDS), [compact_json(rows), ids, at, at, notify.FINISHED])
    assert "Seq Scan" not in claim, claim
    assert "Seq Scan" not in result, result


@pytest.mark.postgres_only
def test_the_reads_a_workflow_run_and_a_waiting_client_repeat_find_rows_by_key_in_plans_made_while_small():
    """D87, for the reads repeated at every workflow step and every wake-up of a waiting
    client: a run's history, its join sets' responses with their children's results, and
    the results of the executions a client waits for. Planned against never-analyzed copies
    of tables with a few dozen executions, as such a connection first prepares them, none
    reads a whole table (each did: the log, the responses and the state table)."""
    from executions.events import HistoryEventRecord
    from executions.sql import rows_by_key
    from executions.store import reads

    ids = [lock(create(FFQN, [n])).execution_id for n in range(40)][:3]
    history, history_params = rows_by_key("t_execution_log", "l", "execution_id", ids, "l.variant = %s")
    responses, responses_params = rows_by_key("t_join_set_response", "r", "execution_id", ids, "r.seq > %s")
    progress, progress_params = rows_by_key("t_state", "s", "execution_id", ids)
    with _never_analyzed_copies("t_state", "t_execution_log", "t_join_set_response"):
        plans = [
            _generic_plan(
                f"SELECT {reads._EVENT_COLUMNS_L} FROM {history} ORDER BY l.execution_id, l.version",
                [*history_params, HistoryEventRecord.VARIANT],
            ),
            _generic_plan(
                reads._RESPONSES_SQL.format(columns=reads._RESPONSE_COLUMNS, source=responses), [*responses_params, 0]
            ),
            _generic_plan(reads._PROGRESS_SQL.format(source=progress), progress_params),
        ]
    for plan in plans:
        assert "Seq Scan" not in plan, plan


@contextlib.contextmanager
def _never_analyzed_copies(*tables: str):
    """Temporary copies of ``tables``, with their rows, indexes and constraints, which
    shadow them in this session (``pg_temp`` comes first in the search path). The
    planner has no statistics of a new table: it sizes it by its pages, at least ten."""
    with connection.cursor() as cursor:
        for table in tables:
            cursor.execute(f"CREATE TEMPORARY TABLE {table} (LIKE public.{table} INCLUDING ALL)")
            cursor.execute(f"INSERT INTO pg_temp.{table} SELECT * FROM public.{table}")
        try:
            yield
        finally:
            for table in tables:
                cursor.execute(f"DROP TABLE pg_temp.{table}")


def _foreign_keys_to_state(table: str) -> set[str]:
    """The columns of ``table`` that the database checks against ``t_state``."""
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute(f"PRAGMA foreign_key_list({table})")
            return {row[3] for row in cursor.fetchall() if row[2] == "t_state"}
        cursor.execute(
            "SELECT a.attname FROM pg_constraint c JOIN pg_attribute a"
            " ON a.attrelid = c.conrelid AND a.attnum = ANY (c.conkey)"
            " WHERE c.contype = 'f' AND c.conrelid = %s::regclass AND c.confrelid = 't_state'::regclass",
            [table],
        )
        return {row[0] for row in cursor.fetchall()}


def test_the_store_alone_keeps_the_log_and_responses_free_of_orphans_without_a_foreign_key_check():
    """D75: the two append-only tables every call writes carry no foreign key check (it cost
    an extra lookup of the state row per inserted row, at commit); the other per-execution
    tables keep theirs. An event or a result for an execution that does not exist is still
    refused by the store and leaves no row."""
    assert _foreign_keys_to_state("t_execution_log") == set()
    assert _foreign_keys_to_state("t_join_set_response") == set()
    assert _foreign_keys_to_state("t_delay") == {"execution_id"}

    missing = create()
    ExecutionEvent.store_objects.filter(execution_id=missing).delete()
    ExecutionState.store_objects.filter(execution_id=missing).delete()
    with pytest.raises(errors.NotFound):
        store.append(missing, 1, Unlocked(backoff_expires_at=timezone_now(), reason="gone"))
    fence = store.Fence(run_id="Run_01M91XDCDBC8N68QNF40XAJFF4", lock_generation=1)
    [refused] = store.append_many([store.AppendItem(missing, None, Finished(retval=Ok(1)), fence=fence)])
    assert isinstance(refused, errors.NotFound)
    assert not ExecutionEvent.objects.filter(execution_id=missing).exists()


@pytest.mark.postgres_only
@pytest.mark.parametrize("prefix", ["a:pkg/ifc.rare", "a:pkg/"])
def test_listing_by_function_prefix_is_answered_by_the_function_index_not_a_scan_of_every_execution(prefix):
    """``ffqn_prefix`` (the REST API's and the CLI's filter) is a ``LIKE 'prefix%'``. A
    btree under the server's collation cannot answer it (only under ``C``), so on a big
    table the listing read every execution; ``t_state_ffqn_created`` is built with
    ``varchar_pattern_ops`` on the function, which serves the prefix and an exact function
    alike (D84). Sequential scans are priced out so that the plan shows whether the index
    can answer at all, whatever the table's size."""
    from executions.store.listing import filter_executions

    query = filter_executions(store.ExecutionFilter(ffqn_prefix=prefix)).order_by("-created_at", "-execution_id")
    sql, params = query[:21].query.sql_with_params()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN " + sql, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "t_state_ffqn_created" in plan, plan
    assert "~>=~" in plan, plan  # the prefix bounds the index scan
