"""The hot path's shortcuts keep the store's guarantees (decisions D45, D48).

A plain ``create`` on PostgreSQL is one message (one implicit transaction); a process hears
each of its own commits once; a waiting client takes a short result from its notification
and reads a long one back. Each test shows the behaviour a caller relies on, on PostgreSQL
and SQLite unless marked.
"""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection

from executions import errors, notify, store
from executions.events import Finished, Ok
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
    from workers.executor import ActivityExecutor
    from workers.registry import load_components
    from workers.submission import current_deployment_id

    lingering.prepare_cluster()
    try:
        first, second = (ActivityExecutor(load_components(), current_deployment_id()) for _ in range(2))
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
    from workers.executor import ActivityExecutor
    from workers.registry import load_components
    from workers.submission import current_deployment_id

    lingering.prepare_cluster()
    try:
        busy, woken = (ActivityExecutor(load_components(), current_deployment_id()) for _ in range(2))
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
    from workers.executor import ActivityExecutor
    from workers.registry import load_components
    from workers.submission import current_deployment_id

    lingering.prepare_cluster()
    try:
        woken = ActivityExecutor(load_components(), current_deployment_id())
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


def test_a_workflow_that_comes_due_while_activities_keep_the_worker_busy_starts_before_they_are_drained(tmp_path):
    """A worker whose claims of activities keep coming back full still starts a workflow
    announced meanwhile (after its current batch), instead of once the activity backlog is
    drained: an Interrupt workflow's next run, made due by a response, would otherwise wait
    behind every activity queued after it."""
    from tests import workflows
    from tests.helpers import WORKFLOW
    from workers.executor import ActivityExecutor
    from workers.registry import load_components
    from workers.submission import current_deployment_id

    executor = ActivityExecutor(
        {**load_components(), workflows.draws.ffqn: workflows.draws}, current_deployment_id(), max_batch=1
    )
    marker = str(tmp_path / "marker")
    backlog = [create("test:acts/slow.sleep", [0.1, marker]) for _ in range(6)]
    workflow_id: list[str] = []

    def submit_a_workflow_once_the_worker_is_busy():
        try:
            while not ExecutionState.objects.filter(pk=backlog[0], state="finished").exists():
                time.sleep(0.01)
            workflow_id.append(create(workflows.draws.ffqn, component=WORKFLOW))
        finally:
            connection.close()

    thread = threading.Thread(target=submit_a_workflow_once_the_worker_is_busy)
    thread.start()
    try:
        executor.claim_and_run(budget=30, linger=0)
    finally:
        thread.join()
        executor.workflows.join(30)

    def locked_at(execution_id: str):
        return next(r.created_at for r in store.get(execution_id).events if r.event.VARIANT == "locked")

    assert all(store.get_state(e).state == "finished" for e in backlog)
    assert locked_at(workflow_id[0]) < locked_at(backlog[-1])
    assert store.get_state(workflow_id[0]).state == "finished"
