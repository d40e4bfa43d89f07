"""A ``ctx.call``'s child runs in the workflow's own thread, as a real child execution (D124).

An Await workflow's ``ctx.call`` of an activity its own worker serves creates the child
locked in the parent's write (with its ``Locked`` event and fence, D65) and runs it at once
in the workflow's thread, under a ``LocalWatchdog``; its result goes out in one statement
with the response to the parent (D81). The guarantees of a child execution hold: a
``kill -9`` between any two of the path's writes loses nothing and creates nothing twice,
a failed child is retried with back-off, a timeout and a cancellation interrupt it, a stale
holder cannot write, and a child that must run elsewhere takes the usual path.

Real worker clusters (``tests/support/clusters.py``) serving
``tests/support/local_components.py``, whose activities note where they ran in marker
files (``tests/support/local_gate.py``); timeouts are safety limits only. The routing and
the fence are checked in this process, against the real store, with a real ``Executor``.

why: D124, D125, D129
"""

from __future__ import annotations

import copy
import signal
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

import tests.support.local_components as lc
from executions import store
from executions.events import (
    ChildExecutionRequest,
    ExecutionFailure,
    Finished,
    JoinNext,
    JoinSetCreate,
    JoinSetRequest,
    Ok,
    TemporarilyFailed,
    Unlocked,
)
from executions.ids import ExecutionId, JoinSetId, new_executor_id, new_run_id
from executions.models import ExecutionEvent, ExecutionState
from tests.support.clusters import outcomes, started_clusters, wait_until
from tests.support.helpers import DEPLOYMENT, create_workflow, lock
from workers.executor import Executor
from workers.registry import lookup
from workers.replay.ports import NewExecution
from workers.replay_adapters import StoreWaiter, StoreWriter
from workers.testing import submit

pytestmark = pytest.mark.django_db(transaction=True)

WAIT = 90  # seconds: safety limit for a workflow to finish
STOP_LIMIT = 45  # seconds: safety limit for a killed cluster's processes to end
STEP = "test:local/acts.step"


@pytest.fixture
def clusters(django_db_setup, request, tmp_path):
    """``start(workers)``: clusters of this test's own serving ``tests.support.local_components``."""
    with started_clusters(
        request, tmp_path, default_workers=1, default_env={"OBELISK_COMPONENT_MODULES": lc.MODULES}
    ) as start:
        yield start


def marks(marker: Path) -> list[list[str]]:
    """The marker's lines, split: ``[what, execution id, attempt, pid, thread, index]`` or
    ``["after", index]``."""
    try:
        return [line.split() for line in marker.read_text().splitlines()]
    except FileNotFoundError:
        return []


def starts(marker: Path) -> Counter:
    """How many times each child started."""
    return Counter(line[1] for line in marks(marker) if line[0] == "start")


def children_of(parent: str) -> list[str]:
    return sorted(
        ExecutionState.objects.filter(execution_id__startswith=f"{parent}.").values_list("execution_id", flat=True)
    )


def variants(execution_id: str) -> list[str]:
    return [record.event.VARIANT for record in store.get(execution_id).events]


def assert_created_once(parent: str, count: int) -> list[str]:
    """``count`` children, each with one ``Created`` and one ``Finished``."""
    children = children_of(parent)
    assert len(children) == count, children
    for child in children:
        kinds = Counter(variants(child))
        assert kinds["created"] == 1 and kinds["finished"] == 1, (child, variants(child))
    return children


def kill_cluster(cluster) -> None:
    cluster.signal_group(signal.SIGKILL)
    cluster.wait_exit(STOP_LIMIT)


# ---------------------------------------------------------------------------------------
# The local path, end to end
# ---------------------------------------------------------------------------------------


def test_a_call_of_a_served_activity_runs_in_the_workflow_thread_once_per_attempt(clusters, tmp_path):
    """Each child runs once, in the workflow's thread of the same worker process, created
    locked (``Created``, ``Locked``, ``Finished``: no claim, no hand-back)."""
    marker = tmp_path / "steps.marks"
    clusters()
    parent, _ = submit("test:local/wf.steps", [str(marker), 3, {}])
    assert outcomes([parent], WAIT)[parent] == Ok(value=[lc.step_value(i) for i in range(3)])
    children = assert_created_once(parent, 3)
    for child in children:
        assert variants(child) == ["created", "locked", "finished"], variants(child)
    started = [line for line in marks(marker) if line[0] == "start"]
    assert len(started) == 3 and {line[1] for line in started} == set(children)
    assert all(line[4].startswith("workflow_") for line in started), started  # a pool thread, not the main one


def test_a_kill_while_the_local_child_runs_loses_nothing_and_creates_nothing_twice(clusters, tmp_path):
    """``kill -9`` after the parent's write created the child locked, while the child runs
    (nothing is written between the two): a second cluster finishes the workflow; the child's
    lock expired and it ran again (a new attempt), every child was created once."""
    marker, gate = tmp_path / "steps.marks", tmp_path / "gate"
    first = clusters()
    parent, _ = submit("test:local/wf.steps", [str(marker), 3, {"1": {"child": str(gate)}}])
    wait_until(
        lambda: any(line[0] == "start" and line[5] == "1" for line in marks(marker)), timeout=WAIT, what="child 1"
    )
    (held,) = [line[1] for line in marks(marker) if line[0] == "start" and line[5] == "1"]
    assert store.get_state(held).state == "locked"
    kill_cluster(first)
    clusters()
    assert outcomes([parent], WAIT)[parent] == Ok(value=[lc.step_value(i) for i in range(3)])
    children = assert_created_once(parent, 3)
    counts = starts(marker)
    assert counts[held] == 2 and all(counts[c] == 1 for c in children if c != held), counts
    assert variants(held).count("locked") == 2, variants(held)


def test_a_kill_after_the_local_childs_result_and_before_the_parent_goes_on_loses_nothing(clusters, tmp_path):
    """``kill -9`` after the child's result was written (with the response to the parent)
    and before the parent's next write: the child is not run again, its result is the one
    the parent goes on with after a restart, and every child was created once."""
    marker, gate = tmp_path / "steps.marks", tmp_path / "gate"
    first = clusters()
    parent, _ = submit("test:local/wf.steps", [str(marker), 3, {"0": {"after": str(gate)}}])
    wait_until(lambda: ["after", "0"] in marks(marker), timeout=WAIT, what="the workflow after call 0")
    (child,) = children_of(parent)
    assert store.get_state(child).state == "finished"
    assert len(store.responses_after(parent, 0)) == 1
    kill_cluster(first)
    gate.touch()
    clusters()
    assert outcomes([parent], WAIT)[parent] == Ok(value=[lc.step_value(i) for i in range(3)])
    children = assert_created_once(parent, 3)
    assert all(count == 1 for count in starts(marker).values()) and set(starts(marker)) == set(children)


def test_a_kill_after_the_parents_write_before_the_local_child_starts_loses_nothing(clusters, tmp_path):
    """``kill -9`` while the parent's write that creates the child locked is the last one:
    the child (held at its start) has written nothing; a second cluster reruns it once more."""
    marker, gate = tmp_path / "steps.marks", tmp_path / "gate"
    first = clusters()
    parent, _ = submit("test:local/wf.steps", [str(marker), 1, {"0": {"child": str(gate)}}])
    wait_until(lambda: starts(marker), timeout=WAIT, what="child 0")
    (child,) = children_of(parent)
    assert variants(child) == ["created", "locked"]
    kill_cluster(first)
    clusters()
    assert outcomes([parent], WAIT)[parent] == Ok(value=[lc.step_value(0)])
    assert_created_once(parent, 1)
    assert starts(marker)[child] == 2


def test_a_failed_local_child_is_retried_with_back_off(clusters, tmp_path):
    """A local child that fails twice and then succeeds: two ``TemporarilyFailed`` with the
    back-off's due time, retried (by a claim, as any retry), and the workflow gets the value."""
    marker = tmp_path / "flaky.marks"
    clusters()
    parent, _ = submit("test:local/wf.calls", [str(marker), "test:local/acts.flaky", 0])
    assert outcomes([parent], WAIT)[parent] == Ok(value=lc.step_value(0))
    (child,) = assert_created_once(parent, 1)
    records = store.get(child).events
    failures = [r for r in records if isinstance(r.event, TemporarilyFailed)]
    assert len(failures) == 2, variants(child)
    for failure in failures:
        assert failure.event.backoff_expires_at > failure.created_at
    first_start = marks(marker)[0]
    assert first_start[4].startswith("workflow_"), first_start  # the first attempt ran locally
    assert starts(marker)[child] == 3


def test_a_local_child_that_runs_past_its_timeout_is_interrupted(clusters, tmp_path):
    """A local child running past its 1 s timeout is interrupted in the workflow's thread:
    finished as ``timed_out`` by its own run, the workflow gets the failure, the worker
    process goes on (no hard stop)."""
    marker = tmp_path / "stuck.marks"
    cluster = clusters()
    parent, _ = submit("test:local/wf.calls", [str(marker), "test:local/acts.stuck", 0])
    result = outcomes([parent], WAIT)[parent]
    assert isinstance(result, Ok) and "timed_out" in result.value, result
    (child,) = assert_created_once(parent, 1)
    finished = store.get(child).events[-1].event
    assert isinstance(finished.retval, ExecutionFailure) and finished.retval.kind == "timed_out"
    assert finished.retval.reason.startswith("timed out after"), finished.retval
    assert [line[0] for line in marks(marker)] == ["start"]  # interrupted: it never ended on its own
    assert "did not stop within" not in cluster.log()


def test_cancelling_the_parent_while_its_local_child_runs_cancels_both(clusters, tmp_path):
    """The parent is cancelled while its local child runs: the child's run is interrupted
    and finishes it as cancelled, and the workflow finishes as cancelled."""
    marker = tmp_path / "long.marks"
    cluster = clusters()
    parent, _ = submit("test:local/wf.calls", [str(marker), "test:local/acts.long", 0])
    wait_until(lambda: starts(marker), timeout=WAIT, what="the child to start")
    store.cancel(parent)
    result = outcomes([parent], WAIT)[parent]
    assert isinstance(result, ExecutionFailure) and result.kind == "cancelled", result
    (child,) = children_of(parent)
    retval = store.get(child).events[-1].event.retval
    assert isinstance(retval, ExecutionFailure) and retval.kind == "cancelled", retval
    assert [line[0] for line in marks(marker)] == ["start"]
    assert "did not stop within" not in cluster.log()


def test_cancelling_the_parent_while_its_second_local_child_runs_cancels_both(clusters, tmp_path):
    """As above, at the run's second call, when its first wait has read the lifecycle
    already: the wait that takes the cancelled child's response still sees the parent's
    cancellation first (heard on PostgreSQL, read at every wait on SQLite, D129)."""
    marker = tmp_path / "long.marks"
    clusters()
    parent, _ = submit("test:local/wf.step-then-call", [str(marker), "test:local/acts.long", 1])
    second_started = lambda: [line for line in marks(marker) if line[0] == "start" and line[-1] == "1"]  # noqa: E731
    wait_until(second_started, timeout=WAIT, what="the second child to start")
    store.cancel(parent)
    result = outcomes([parent], WAIT)[parent]
    assert isinstance(result, ExecutionFailure) and result.kind == "cancelled", result
    by_function = {store.get_created(child).ffqn: child for child in children_of(parent)}
    first, second = by_function[STEP], by_function["test:local/acts.long"]
    assert store.get_finished_results([first])[first] == Ok(value=lc.step_value(0))
    retval = store.get(second).events[-1].event.retval
    assert isinstance(retval, ExecutionFailure) and retval.kind == "cancelled", retval


def test_an_interrupt_workflows_call_takes_the_usual_path(clusters, tmp_path):
    """Under Interrupt a call's join-next ends the run: its child is not run locally but
    dispatched as before (eagerly or pending), in the executor's main thread."""
    marker = tmp_path / "interrupt.marks"
    clusters()
    parent, _ = submit("test:local/wf.steps-interrupt", [str(marker), 2])
    assert outcomes([parent], WAIT)[parent] == Ok(value=[lc.step_value(i) for i in range(2)])
    assert_created_once(parent, 2)
    assert all(line[4] == "MainThread" for line in marks(marker) if line[0] == "start"), marks(marker)


# ---------------------------------------------------------------------------------------
# Routing and the fence, in this process, against the real store
# ---------------------------------------------------------------------------------------


class _Runner:
    """The executor as a run sees it, with a hook before a local child runs."""

    def __init__(self, executor: Executor, before_local=None):
        self.executor = executor
        self.before_local = before_local
        self.handed: list = []

    def child_claim(self, ffqns):
        return self.executor.child_claim(ffqns)

    def hand_over(self, locked):
        self.handed.extend(locked)
        self.executor._give_back(locked, "test")

    def local_claim(self, ffqn):
        return self.executor.local_claim(ffqn)

    def run_local(self, claim, locked):
        if locked is not None and self.before_local is not None:
            locked = self.before_local(locked)
        return self.executor.run_local(claim, locked)


def _executor(*ffqns: str) -> Executor:
    executor = Executor({ffqn: lookup(ffqn) for ffqn in ffqns}, DEPLOYMENT)
    executor._accept_children(True)  # eager dispatch takes what is not run locally
    return executor


def _call(runner, ffqn: str = STEP, params=None) -> tuple[str, str]:
    """A ``ctx.call``'s write by a locked workflow through ``StoreWriter``: the parent and
    the child's id."""
    parent = create_workflow()
    return parent, _write_call(StoreWriter(lock(parent), DEPLOYMENT, runner, local=True), ffqn, params)


def _write_call(writer: StoreWriter, ffqn: str = STEP, params=None) -> str:
    """The write of a ``ctx.call`` (its join set, request and join-next) by ``writer``'s
    locked run; the child's id."""
    run, parent = writer.locked, writer.locked.execution_id
    join_set = JoinSetId.parse("o:1-step")
    child = str(ExecutionId.parse(parent).child(join_set, 1))
    params = params if params is not None else ["/dev/null", 0, ""]
    request = ChildExecutionRequest(child_execution_id=child, target_ffqn=ffqn, params=params)
    events = [
        JoinSetCreate(join_set_id=str(join_set)),
        JoinSetRequest(join_set_id=str(join_set), request=request),
        JoinNext(join_set_id=str(join_set), run_expires_at=timezone.now() + timedelta(seconds=30), requested_ffqn=ffqn),
    ]
    new = NewExecution(child, ffqn, params, timezone.now(), (parent, str(join_set)), None, "activity")
    writer.append(run.next_version, events, [new])
    return child


def test_a_served_call_runs_locally_and_answers_its_parent_in_the_same_write(tmp_path):
    """Through ``StoreWriter`` and a real ``Executor``: the child is created locked, run, and
    its result and the parent's response are written before the write returns; the slot
    is free again."""
    executor = _executor(STEP)
    runner = _Runner(executor)
    parent, child = _call(runner, params=[str(tmp_path / "m"), 4, ""])
    assert variants(child) == ["created", "locked", "finished"]
    assert store.get_finished_results([child])[child] == Ok(value=lc.step_value(4))
    assert [r.child_execution_id for r in store.responses_after(parent, 0)] == [child]
    assert runner.handed == [] and executor.local.free_slots() == executor.workflows.size


def test_a_call_that_must_run_elsewhere_takes_the_usual_path():
    """Not run locally, as before D124: a function this executor does not serve (created
    pending), a workflow, a full set of local slots (dispatched eagerly), an executor
    that is not claiming (created pending)."""
    executor = _executor(STEP, "test:local/wf.steps")
    runner = _Runner(executor)
    _, child = _call(runner, ffqn="test:local/acts.flaky", params=["/dev/null", 0])
    assert store.get_state(child).state == "pending_at"

    held = [executor.local_claim(STEP) for _ in range(executor.workflows.size)]
    assert all(held) and executor.local_claim(STEP) is None
    _, child = _call(runner)
    assert [c.execution_id for c in runner.handed] == [child]  # eager dispatch, given back by the test runner
    for claim in held:
        executor.run_local(claim, None)
    assert executor.local.free_slots() == executor.workflows.size

    assert executor.local_claim("test:local/wf.steps") is None

    executor._accept_children(False)
    assert executor.local_claim(STEP) is None
    _, child = _call(runner)
    assert store.get_state(child).state == "pending_at"


def test_a_stale_holder_of_a_local_child_cannot_write_its_result(tmp_path):
    """The local child's lock is taken over before its run writes (handed back and claimed
    by another executor: a new lock generation): the run's result is refused, the new
    holder's lock stands, the parent gets no response."""
    executor = _executor(STEP)
    taken = {}

    def take_over(locked):
        store.append(locked.execution_id, None, Unlocked(unlocked_at=timezone.now(), reason="test"), fence=locked.fence)
        (taken["lock"],) = store.lock_pending(
            {STEP: executor.terms[STEP]},
            limit=1,
            executor_id=new_executor_id(),
            run_id=new_run_id(),
            deployment_id=DEPLOYMENT,
        )
        return locked

    parent, child = _call(_Runner(executor, take_over), params=[str(tmp_path / "m"), 1, ""])
    state = store.get_state(child)
    assert state.state == "locked" and "finished" not in variants(child), variants(child)
    assert store.get_state(child).next_version == taken["lock"].next_version
    assert store.responses_after(parent, 0) == []
    assert executor.stats.lost == 1
    assert isinstance(store.get(child).events[-1].event, type(taken["lock"].locked))
    assert not isinstance(store.get(child).events[-1].event, Finished)


# ---------------------------------------------------------------------------------------
# The parent's write as one statement (D126)
# ---------------------------------------------------------------------------------------


def _calls(writer, parent: str, count: int, marker: Path, start: int = 1) -> list[str]:
    """``count`` sequential calls of ``step`` by ``writer``'s run, as ``ctx.call`` writes them:
    each call's events at the run's next version; the children's ids."""
    children = []
    for n in range(start, start + count):
        join_set = JoinSetId.parse(f"o:{n}-step")
        child = str(ExecutionId.parse(parent).child(join_set, 1))
        params = [str(marker), n, ""]
        request = ChildExecutionRequest(child_execution_id=child, target_ffqn=STEP, params=params)
        expires = timezone.now() + timedelta(seconds=30)
        events = [
            JoinSetCreate(join_set_id=str(join_set)),
            JoinSetRequest(join_set_id=str(join_set), request=request),
            JoinNext(join_set_id=str(join_set), run_expires_at=expires, requested_ffqn=STEP),
        ]
        new = NewExecution(child, STEP, params, timezone.now(), (parent, str(join_set)), None, "activity")
        writer.append(store.get_state(parent).next_version, events, [new])
        children.append(child)
    return children


def _comparable_log(execution_id: str) -> list[tuple]:
    rows = ExecutionEvent.objects.filter(execution_id=execution_id).order_by("version")
    return [(r.version, r.variant, r.join_set_id, r.history_event_type, r.consumes_response) for r in rows]


def _comparable_row(execution_id: str) -> dict:
    row = ExecutionState.objects.filter(pk=execution_id).values().get()
    for name in (
        "execution_id",
        "created_at",
        "updated_at",
        "first_scheduled_at",
        "pending_expires_finished",
        "run_id",
        "executor_id",
    ):
        row.pop(name)
    return row


def test_a_local_calls_next_write_is_one_statement_that_writes_what_the_transaction_writes(tmp_path):
    """A local call's parent write (its three events, its row, the child created locked)
    is one statement: from a run's second call on, checked against the row its last write
    left (D126); the first, against the row read just before, unlocked (D127). It leaves
    the parent and the child as the transaction leaves them (compared with a run whose
    writes all take it, inside ``atomic``)."""
    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext

    if connection.vendor != "postgresql":
        pytest.skip("one statement on PostgreSQL only; SQLite keeps the transaction")
    executor = _executor(STEP)
    marker = tmp_path / "m"
    one, many = create_workflow(), create_workflow()
    fast = StoreWriter(lock(one), DEPLOYMENT, _Runner(executor), local=True)
    slow = StoreWriter(lock(many), DEPLOYMENT, _Runner(executor), local=True)
    with CaptureQueriesContext(connection) as first_call:
        _calls(fast, one, 1, marker)
    with transaction.atomic():
        _calls(slow, many, 1, marker)
    assert fast._expected is not None
    with CaptureQueriesContext(connection) as queries:
        (child,) = _calls(fast, one, 1, marker, start=2)
    reads = []
    for captured in (first_call, queries):
        statements = [q["sql"].lstrip() for q in captured.captured_queries]
        writes = [sql for sql in statements if "t_execution_log" in sql and "INSERT" in sql]
        assert writes[0].startswith("WITH g AS"), writes  # the parent's write: one statement
        assert [sql for sql in statements if sql.startswith("SELECT") and "FOR UPDATE" in sql] == []
        before = statements[: statements.index(writes[0])]
        reads.append(len([sql for sql in before if sql.startswith("SELECT") and "FROM t_state WHERE" in sql]))
    assert reads[0] == reads[1] + 1, reads  # the first call reads the row (beside _calls' own read)
    slow._expected = None
    with transaction.atomic():  # the transaction
        (other,) = _calls(slow, many, 1, marker, start=2)
    assert _comparable_log(one) == _comparable_log(many)
    assert _comparable_row(one) == _comparable_row(many)
    assert _comparable_log(child) == _comparable_log(other)
    assert store.get_finished_results([child])[child] == Ok(value=lc.step_value(2))
    assert [r.child_execution_id for r in store.responses_after(one, 0)][-1] == child


def test_a_row_found_otherwise_than_expected_takes_the_transaction(tmp_path):
    """The row changed since the run's last write in a way it did not predict (here its
    version: a cancellation request): the one statement writes nothing, and the transaction
    writes the call, or refuses it as it always did."""
    executor = _executor(STEP)
    marker = tmp_path / "m"
    parent = create_workflow()
    writer = StoreWriter(lock(parent), DEPLOYMENT, _Runner(executor), local=True)
    _calls(writer, parent, 1, marker)
    expected = writer._expected
    writer._expected = copy.copy(expected)
    writer._expected.pending_expires_finished = expected.pending_expires_finished - timedelta(seconds=1)
    (child,) = _calls(writer, parent, 1, marker, start=2)
    assert store.get_finished_results([child])[child] == Ok(value=lc.step_value(2))
    assert [(kind, js, consumes) for _, kind, js, _, consumes in _comparable_log(parent)[-3:]] == [
        ("history_event", "o:2-step", False),
        ("history_event", "o:2-step", False),
        ("history_event", "o:2-step", True),
    ], _comparable_log(parent)
    assert len(children_of(parent)) == 2 and all(Counter(variants(c))["created"] == 1 for c in children_of(parent))


class _Lease:
    """The lease as a waiter sees it: a deadline a few seconds away (the lock's own renewal
    is not what these tests are about)."""

    def deadline(self) -> float:
        return time.monotonic() + 3


def _waiting_run(executor: Executor) -> tuple[StoreWriter, StoreWaiter]:
    """A locked Await run's writer and waiter, wired as ``workflow_runner`` wires them: the
    waiter subscribed before the run's first write."""
    parent = create_workflow()
    writer = StoreWriter(lock(parent), DEPLOYMENT, _Runner(executor), local=True)
    waiter = StoreWaiter(parent, _Lease())
    writer.lifecycle_seen = waiter.lifecycle_seen
    return writer, waiter


def _rows_read_by_the_wait_after_a_call(executor: Executor, marker: Path, index: int, *, told: bool) -> int:
    """One local call by a waiting run, then its wait, which must return the child's
    response: how many reads of ``t_state`` that wait made. ``told``: the writer hands the
    lifecycle its write saw to the waiter, as ``workflow_runner`` wires it."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    writer, waiter = _waiting_run(executor)
    if not told:
        writer.lifecycle_seen = None
    try:
        child = _write_call(writer, params=[str(marker), index, ""])
        with CaptureQueriesContext(connection) as queries:
            responses = waiter.wait_for_responses(0)
    finally:
        waiter.close()
    assert [r.child_execution_id for r in responses] == [child]
    statements = [q["sql"].lstrip() for q in queries.captured_queries]
    return len([sql for sql in statements if sql.startswith("SELECT") and "FROM t_state" in sql])


def test_a_local_write_that_saw_the_run_active_spares_the_first_wait_its_lifecycle_read(tmp_path):
    """The call's write found the row active under its lock, after the waiter subscribed, so
    the wait that takes the local child's response reads no row (D129); a waiter not told so
    reads the lifecycle first, as every run's first wait did before. Not on SQLite, which
    has no notifications to hear a later cancellation by: there the wait reads it."""
    from executions import notify

    executor = _executor(STEP)
    marker = tmp_path / "m"
    told = _rows_read_by_the_wait_after_a_call(executor, marker, 3, told=True)
    assert told == (0 if notify.is_postgres() else 1)
    assert _rows_read_by_the_wait_after_a_call(executor, marker, 4, told=False) == 1


def test_a_cancellation_after_the_local_write_still_ends_the_wait(tmp_path):
    """Sparing the read loses no cancellation: one requested after the call's write is
    announced to the subscribed waiter, which then reads the lifecycle and gives the run
    up (the cancellation driver takes over), even with the child's response in hand."""
    from executions import notify

    if not notify.is_postgres():
        pytest.skip("SQLite has no notifications: a waiter polls the lifecycle at its timed wake-ups")
    executor = _executor(STEP)
    writer, waiter = _waiting_run(executor)
    try:
        _write_call(writer, params=[str(tmp_path / "m"), 5, ""])
        store.cancel(writer.locked.execution_id)
        assert wait_until(lambda: waiter.wait_for_responses(0) == [], timeout=10)
    finally:
        waiter.close()
    assert store.get_state(writer.locked.execution_id).lifecycle == "cancelling"


def test_a_local_calls_long_statements_are_parsed_once_per_shape(tmp_path, monkeypatch):
    """The local call's write (D126) and the child's result with its response (D70) are
    statements longer than psycopg caches by default (4,096 bytes or 50 parameters), so
    each execute parsed them again. With the store's limits (D130), a run's later calls
    parse nothing outside psycopg's cache: the parser it calls for a statement too long to
    cache is counted, and never called."""
    from django.db import connection
    from psycopg import _queries

    if connection.vendor != "postgresql":
        pytest.skip("psycopg's cache of parsed statements: PostgreSQL only")
    executor = _executor(STEP)
    marker = tmp_path / "m"
    parent = create_workflow()
    writer = StoreWriter(lock(parent), DEPLOYMENT, _Runner(executor), local=True)
    _calls(writer, parent, 2, marker)  # every shape sent once
    uncached, parse = [], _queries._query2pg_nocache
    monkeypatch.setattr(_queries, "_query2pg_nocache", lambda query, *rest: uncached.append(query) or parse(query, *rest))
    before = _queries._query2pg.cache_info()
    children = _calls(writer, parent, 2, marker, start=3)
    assert [len(query) for query in uncached] == []
    assert _queries._query2pg.cache_info().hits > before.hits
    assert store.get_finished_results(children) == {child: Ok(value=lc.step_value(n)) for n, child in enumerate(children, 3)}
