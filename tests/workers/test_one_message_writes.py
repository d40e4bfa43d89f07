"""One-message writes make exactly what their transactions make (decisions D48, D55,
D68-D70, D74, D78, D81, D82).

A write of many join-nexts reads its join set's responses once and takes them in order; a
write that creates its join set reads none; a wide join set is created and answered with a
statement per table, not per child; a group commit locks its executions and the parents
they answer in one query, children before parents; claims of activities and of workflows
and group commits of results in one message write what the transaction writes, refuse
what the state table refuses, and hand back what they locked when their reads fail.

why: D55, D68, D69, D70, D74, D78, D81, D82
"""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
from django.db import connection
from django.utils.timezone import now as timezone_now

from executions import errors, notify, store
from executions.events import Finished, Ok, Unlocked
from executions.models import ExecutionState
from tests.support.helpers import FFQN, another_session, create, lock
from tests.support.hot_path import (
    children_of_one_write,
    finish,
    log_of,
    row_of,
)

pytestmark = pytest.mark.django_db(transaction=True)


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
    from tests.support.helpers import ACTIVITY, DEPLOYMENT, create_workflow, history

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
    from tests.support.helpers import ACTIVITY, DEPLOYMENT, create_workflow, history

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
    from tests.support.helpers import ACTIVITY, DEPLOYMENT, create_workflow, history

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
    from tests.support.helpers import DEPLOYMENT, TERMS

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
    assert row_of(first) == row_of(second)
    assert log_of(first) == log_of(second)
    assert {**in_one_message.__dict__, "execution_id": None} == {**in_a_transaction.__dict__, "execution_id": None}


def _workflow_with_a_history_and_a_response() -> str:
    """A pending workflow whose run submitted two children, one of them finished (its
    response waits in the table), and then handed the row back."""
    from tests.support.helpers import create_workflow

    workflow = create_workflow()
    locked = lock(workflow)
    children, _ = children_of_one_write(workflow, locked, 2)
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
    from tests.support.helpers import DEPLOYMENT, WORKFLOW_FFQN, WORKFLOW_TERMS

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
    from tests.support.helpers import DEPLOYMENT, WORKFLOW_FFQN, WORKFLOW_TERMS

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
    assert row_of(first) == row_of(second)
    assert log_of(first)[-1] == log_of(second)[-1]
    assert heard[first] == heard[second] == retval_to_json(Ok(value))
    assert store.get_finished_result(first) == Ok(value)


def test_the_one_message_group_commit_finishes_only_rows_the_state_table_lets_finish():
    """D70, D127: the statement finishes only rows not yet finished whose lock is the
    run's (its fence, as ``check_fence`` wants: an Await workflow's row may be pending or
    blocked under it), and for every such state and lifecycle the state machine's table
    says ``finished`` → finished; a finished row goes through the transaction, which asks
    the table (and refuses)."""
    from executions.state_machine import Effect, Lifecycle, State, decide
    from executions.store.append import _finish_sql
    from executions.store.transitions import finish_fields

    sql = _finish_sql(tuple(finish_fields(Finished(retval=Ok(1)), timezone_now())))
    assert f"s.state <> '{State.FINISHED.value}' AND s.run_id = v.fence_run_id" in sql
    for state in set(State) - {State.FINISHED}:
        for lifecycle in Lifecycle:
            assert decide(Finished.VARIANT, state, lifecycle) is Effect.FINISH, (state, lifecycle)


@pytest.mark.postgres_only
def test_an_await_workflow_answered_under_its_lock_finishes_in_one_statement_as_the_transaction_would():
    """D127: a workflow run that waits holding its lock (Await) sees its row go pending
    when its child's result answers it; its ``Finished``, with the run's fence, is still
    one statement, and makes the row, the event and the notification the transaction
    makes of a twin (inside ``atomic``)."""
    from django.db import transaction
    from django.test.utils import CaptureQueriesContext

    from executions.state_machine import State
    from tests.support.helpers import block_on_child, create_workflow

    at = timezone_now()
    twins, fences = [create_workflow(now=at), create_workflow(now=at)], {}
    for workflow in twins:
        locked = lock(workflow, now=at)
        _, child, _ = block_on_child(workflow, locked, now=at)
        assert store.append_many(
            [store.AppendItem(child, None, Finished(retval=Ok(1)), lock(child, now=at).fence)], now=at
        ) == [2]
        assert store.get_state(workflow).state == State.PENDING_AT.value  # answered, its run still holds it
        fences[workflow] = locked.fence
    first, second = twins
    finished_at = timezone_now()

    with notify.Listener([notify.FINISHED]) as listener:
        with CaptureQueriesContext(connection) as finishing:
            in_one_message = store.append_many(
                [store.AppendItem(first, None, Finished(retval=Ok("done")), fences[first])], now=finished_at
            )
        assert len(finishing.captured_queries) == 1
        with transaction.atomic():
            in_a_transaction = store.append_many(
                [store.AppendItem(second, None, Finished(retval=Ok("done")), fences[second])], now=finished_at
            )
        heard = _finished_items(listener, {first, second})

    assert in_one_message == in_a_transaction
    assert row_of(first) == row_of(second)
    assert log_of(first)[-1] == log_of(second)[-1]
    assert heard[first] == heard[second]
    assert store.get_finished_result(first) == Ok("done")


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


def _blocked_parent_with_a_locked_child(
    strategy: str, at, run_id: str, executor_id: str, child_executor_id: str | None = None
):
    """A workflow (locked by ``run_id`` at ``at``) that started one child in a join set and
    waits for it as ``strategy`` does: Interrupt with its run ended (blocked, due as soon as
    a response comes), Await with its run waiting in place (due at its lock's expiry).
    Returns the workflow, and the child's result as its run's group commit appends it; the
    child is locked by the workflow's executor, or by ``child_executor_id``."""
    from executions.events import JoinNext
    from tests.support.helpers import create_workflow, history, start_child

    workflow = create_workflow(now=at)
    locked = lock(workflow, now=at, run_id=run_id, executor_id=executor_id)
    child, version = start_child(workflow, "n:wait", locked.next_version, fence=locked.fence, now=at)
    expires = at if strategy == "interrupt" else locked.locked.lock_expires_at
    join_next = history(JoinNext(join_set_id="n:wait", run_expires_at=expires))
    store.append(workflow, version, join_next, fence=locked.fence, now=at)
    fence = lock(child, now=at, run_id=run_id, executor_id=child_executor_id or executor_id).fence
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
    assert row_of(first_item.execution_id) == row_of(second_item.execution_id)
    assert log_of(first_item.execution_id)[-1] == log_of(second_item.execution_id)[-1]
    assert row_of(first) == row_of(second)
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
    from tests.support.helpers import DEPLOYMENT, WORKFLOW_FFQN, WORKFLOW_TERMS

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
    assert row_of(first) == row_of(second)
    assert log_of(first, from_version=version + 1) == log_of(second, from_version=version + 1)
    assert [variant for _, _, _, variant, *_ in log_of(first, from_version=version + 1)] == ["locked"]
    assert responses == store.get(first).responses and len(responses) == 1


def _heard(listener, parent: str) -> dict:
    """What a commit of this process announced: the responses its listeners were handed
    for ``parent`` with the ``obelisk_response`` notification (D67), and whether the
    workflows' function was announced on ``obelisk_pending``. Delivered at the commit, so
    everything is there once the notifications stop coming."""
    from tests.support.helpers import WORKFLOW_FFQN

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


def _responses_heard_by_another_session(write) -> set[str]:
    """The parents ``write()`` announced on ``obelisk_response`` to a session of another
    process (a raw connection, not this process's hub, which is handed its own commits'
    notifications at commit whatever the server is sent)."""
    with another_session() as other:
        other.execute(f"LISTEN {notify.RESPONSE}")
        write()
        return {parent for note in other.notifies(timeout=1.0) for parent in note.payload.split("\n")}


@pytest.mark.postgres_only
@pytest.mark.parametrize("parent_held_by", ["the child's executor", "another executor"])
def test_a_childs_result_is_announced_to_other_processes_only_when_its_parent_is_held_elsewhere(parent_held_by):
    """D133: ``obelisk_response`` wakes the run that awaits its workflow in place, and only
    the executor that holds the workflow runs one. A child's result written by that
    executor (a local child, D124, or one it claimed) reaches that run through its own
    process's listeners at commit (D67), so the server is not sent it: no other session
    wakes to read a notification meant for nobody. A parent held by another executor is
    announced as before, and this process's listeners are handed the response either way."""
    from executions.ids import new_executor_id, new_run_id

    at, child_executor = timezone_now(), new_executor_id()
    parent_executor = child_executor if parent_held_by == "the child's executor" else new_executor_id()
    workflow, item = _blocked_parent_with_a_locked_child("await", at, new_run_id(), parent_executor, child_executor)

    with notify.Listener([notify.RESPONSE]) as listener:
        heard = _responses_heard_by_another_session(lambda: store.append_many([item], now=timezone_now()))
        handed = _heard(listener, workflow)["values"]

    assert heard == ({workflow} if parent_held_by == "another executor" else set())
    assert handed == store.get(workflow).responses and len(handed) == 1
