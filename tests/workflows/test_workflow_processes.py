"""Workflows survive real worker processes (issue 12, "What it must show", items 2 and 3).

Real ``manage.py obelisk_worker`` clusters (subprocesses, ``tests/support/clusters.py``)
run the workflows and activities of ``tests/support/workflow_components.py`` against the test
database; the activities note every start in a marker file, the record of what actually
ran. Timeouts are safety limits only: no test asserts how long the engine took.

- A cluster killed with ``kill -9`` (every process of its group at once: a vanished host)
  in the middle of a workflow with 20 children and a durable sleep: a second cluster
  finishes it with the result of an undisturbed run, no child ran twice in one attempt, and
  the parent's log has every event exactly once (both blocking strategies).
- Spec 000 §13.2 at the workflow level (PostgreSQL): 50 children finishing at the same
  moment on two clusters while their parent appends join-nexts never leave the parent
  blocked: every one of 20 such workflows is woken and finishes.
- An Interrupt run consumes the responses it loaded itself, without another run taking
  the workflow over at each consumed response (spec 002 §4.1).
"""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path

import pytest

import tests.support.workflow_components as wfc
from executions import store
from executions.events import (
    ChildExecutionRequest,
    Created,
    DelayRequest,
    Finished,
    HistoryEventRecord,
    JoinNext,
    JoinSetCreate,
    JoinSetRequest,
    Locked,
    Ok,
    TemporarilyFailed,
    TemporarilyTimedOut,
)
from executions.models import ExecutionState
from tests.support.clusters import outcomes as wait_for_outcomes
from tests.support.clusters import process_alive, started_clusters, wait_until
from workers.testing import submit

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

MODULES = "tests.support.components,tests.support.workflow_components"
WAIT = 90  # seconds: safety limit for a workflow to finish


@pytest.fixture
def clusters(django_db_setup, request, tmp_path):
    """``start(workers)``: clusters of this test's own serving ``tests.support.workflow_components``
    (``started_clusters``)."""
    with started_clusters(
        request, tmp_path, default_workers=2, default_env={"OBELISK_COMPONENT_MODULES": MODULES}
    ) as start:
        yield start


def outcomes(execution_ids: list[str], timeout: float = WAIT) -> dict[str, object]:
    return wait_for_outcomes(execution_ids, timeout)


def outcome(execution_id: str, timeout: float = WAIT):
    return outcomes([execution_id], timeout)[execution_id]


def history(log: store.ExecutionLog) -> list:
    return [r.event.event for r in log.events if isinstance(r.event, HistoryEventRecord)]


def shape(events: list) -> list[tuple]:
    """Each history event as ``(type, request type, join set)``, join sets numbered by first
    appearance: what the workflow did, independent of generated names."""
    numbers: dict[str, int] = {}
    out = []
    for event in events:
        join_set = getattr(event, "join_set_id", None)
        number = numbers.setdefault(join_set, len(numbers)) if join_set is not None else None
        request = event.request.type if isinstance(event, JoinSetRequest) else None
        out.append((event.type, request, number))
    return out


def attempts_in_history(log: store.ExecutionLog) -> list[int]:
    """The attempt number each ``Locked`` event started (what ``current_activity().attempt``
    was for that run): one more than the retries counted before it."""
    attempts, failures = [], 0
    for record in log.events:
        if isinstance(record.event, (TemporarilyFailed, TemporarilyTimedOut)):
            failures += 1
        elif isinstance(record.event, Locked):
            attempts.append(failures + 1)
    return attempts


def read_marks(path: Path) -> list[tuple[str, int, int, int]]:
    """``(execution id, attempt, pid, index)`` per start noted by ``test:wfp/acts.work``."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    rows = []
    for line in text.splitlines():
        execution_id, attempt, pid, index = line.split()
        rows.append((execution_id, int(attempt), int(pid), int(index)))
    return rows


# ---------------------------------------------------------------------------------------
# kill -9 in the middle of a workflow
# ---------------------------------------------------------------------------------------

CHILDREN = 20
# 0.3 .. 1.0 s each, fixed so the workflow's arguments (and result) are known in advance.
SECONDS = [round(0.3 + 0.7 * ((i * 7) % CHILDREN) / (CHILDREN - 1), 2) for i in range(CHILDREN)]
KILL_AFTER_STARTS = 8  # children started when the cluster is killed


@pytest.mark.parametrize("workflow", ["test:wfp/wf.crash-await", "test:wfp/wf.crash-interrupt"])
def test_workflow_killed_mid_way_finishes_on_another_cluster_with_every_event_once(clusters, tmp_path, workflow):
    """A workflow's progress lives in its log, not in a worker: after the cluster running it
    (the workflow and its children) vanishes, another cluster finishes it as if nothing
    happened. Each child is created once, answers once and is consumed once; a child cut off
    by the kill is retried as a new attempt (never run twice as the same attempt), and the
    parent's versions have no gap and no duplicate."""
    marker = tmp_path / "work.marks"
    first = clusters(2)
    parent, _ = submit(workflow, [str(marker), SECONDS])

    wait_until(lambda: len(read_marks(marker)) >= KILL_AFTER_STARTS, timeout=WAIT, what="children to start")
    first.signal_group(signal.SIGKILL)
    first.process.wait(10)
    wait_until(lambda: not first.group_alive(), timeout=10, what="every process of the killed cluster to end")
    killed_pids = {pid for _, _, pid, _ in read_marks(marker)}
    assert not store.get_state(parent).is_finished, "the kill came too late to interrupt the workflow"

    second = clusters(2)
    result = outcome(parent)

    assert result == Ok(wfc.expected_crash_result(SECONDS))

    log = store.get(parent)
    # Versions: every number from 0 to the last, once, in order.
    assert [r.version for r in log.events] == list(range(len(log.events)))
    kinds = [r.event.VARIANT for r in log.events]
    assert kinds[0] == "created" and kinds.count("created") == 1
    assert kinds[-1] == "finished" and kinds.count("finished") == 1
    # The history is what one undisturbed run writes: nothing repeated, nothing missing.
    events = history(log)
    expected = (
        [("join_set_create", None, 0)]
        + [("join_set_request", "child_execution_request", 0)] * CHILDREN
        + [("join_next", None, 0)] * CHILDREN
        + [("join_set_create", None, 1), ("join_set_request", "delay_request", 1), ("join_next", None, 1)]
        + [("join_set_create", None, 2), ("join_set_request", "child_execution_request", 2), ("join_next", None, 2)]
    )
    assert shape(events) == expected
    assert len({e.join_set_id for e in events if isinstance(e, JoinSetCreate)}) == 3
    assert all(not e.closing for e in events if isinstance(e, JoinNext))

    # Each child: requested once, created once (and nothing else created under the parent),
    # exactly one response.
    children = [
        e.request.child_execution_id
        for e in events
        if isinstance(e, JoinSetRequest) and isinstance(e.request, ChildExecutionRequest)
    ]
    assert len(children) == CHILDREN + 1 and len(set(children)) == len(children)
    created_under_parent = set(
        ExecutionState.objects.filter(execution_id__startswith=f"{parent}.").values_list("execution_id", flat=True)
    )
    assert created_under_parent == set(children)
    child_responses = Counter(r.child_execution_id for r in log.responses if r.child_execution_id is not None)
    assert child_responses == Counter(set(children))
    delays = [
        e.request.delay_id for e in events if isinstance(e, JoinSetRequest) and isinstance(e.request, DelayRequest)
    ]
    assert Counter(r.delay_id for r in log.responses if r.delay_id is not None) == Counter(delays)
    assert len(log.responses) == CHILDREN + 2

    # Each child ran at most once per attempt, and its last attempt is the one that finished.
    marks = read_marks(marker)
    runs = Counter((execution_id, attempt) for execution_id, attempt, _, _ in marks)
    assert [key for key, count in runs.items() if count > 1] == []
    assert {execution_id for execution_id, *_ in marks} == set(children)
    retried = []
    for index, child in enumerate(children):
        child_log = store.get(child)
        assert [r.version for r in child_log.events] == list(range(len(child_log.events)))
        assert sum(isinstance(r.event, Created) for r in child_log.events) == 1
        assert sum(isinstance(r.event, Finished) for r in child_log.events) == 1
        assert child_log.events[-1].event.retval == Ok(wfc.child_value(index))
        locked_attempts = attempts_in_history(child_log)
        ran = sorted(attempt for execution_id, attempt, _, _ in marks if execution_id == child)
        assert set(ran) <= set(locked_attempts), (child, ran, locked_attempts)
        assert locked_attempts[-1] in ran, (child, ran, locked_attempts)  # the finishing run ran once
        assert {i for execution_id, _, _, i in marks if execution_id == child} == {index}
        if len(set(locked_attempts)) > 1:
            retried.append(child)
    # The kill cut off at least one running child: its dead run's lock expired and the
    # child was retried on the second cluster.
    assert retried, "no child was running when the cluster was killed"
    survivors = {pid for _, _, pid, _ in marks} - killed_pids
    assert survivors and all(second.is_member(pid) for pid in survivors if process_alive(pid))


# ---------------------------------------------------------------------------------------
# Spec 000 §13.2 at the workflow level
# ---------------------------------------------------------------------------------------

BURST = 50  # children per workflow, released at the same moment
WORKFLOWS = 20
GROUP = 10  # workflows in flight at once (2 groups: the test stays under ~2 minutes)
RELEASE_AFTER_MS = 1000  # time for the children to be claimed before they are released


@pytest.mark.postgres_only
def test_parent_is_always_woken_by_children_finishing_at_once(clusters):
    """Spec 000 §13.2: a child's response and its parent's join-next may commit at the same
    moment; the parent's row lock orders them, so either the join-next sees the response or
    the response sees the blocked parent and unblocks it. The workflow uses the Interrupt
    strategy: a run that finds no response ends, and only the store's wake-up starts the
    next one, so one lost wake-up leaves the parent ``blocked_by_join_set`` for good. Two
    clusters finish 50 children in one burst, 20 times over."""
    first = clusters(2, wait=False)
    second = clusters(2, wait=False)
    first.wait_ready()
    second.wait_ready()

    results = {}
    for _ in range(WORKFLOWS // GROUP):
        parents = [submit("test:wfp/wf.burst", [BURST, RELEASE_AFTER_MS])[0] for _ in range(GROUP)]
        results.update(outcomes(parents, timeout=WAIT))

    expected = sum(range(BURST))
    stuck = {parent: value for parent, value in results.items() if value != Ok(expected)}
    assert stuck == {}, f"{len(stuck)} of {WORKFLOWS} parents not finished with {expected}: {stuck}"
    executors = set()
    for parent in results:
        log = store.get(parent)
        assert len(log.responses) == BURST
        consumed = [e for e in history(log) if isinstance(e, JoinNext)]
        assert len(consumed) == BURST
        for response in log.responses:
            child = store.get(response.child_execution_id)
            executors.update(r.event.executor_id for r in child.events if isinstance(r.event, Locked))
    # The responses came from several worker processes (the race needs concurrent writers).
    assert len(executors) >= 2, executors


# ---------------------------------------------------------------------------------------
# Interrupt: responses already loaded are consumed by the run that loaded them
# ---------------------------------------------------------------------------------------

READY_CHILDREN = 10


def test_interrupt_run_consumes_its_loaded_responses_without_being_taken_over(clusters, tmp_path):
    """Spec 002 §4.1: an Interrupt run that finds a join-next's response among the responses
    it loaded continues in the same run. Here every child has finished while the parent
    sleeps, so the run after the sleep has all ten responses loaded and needs no other run:
    two runs in all (one to the sleep, one to the end). Appending a join-next whose response
    exists must not hand the row to another executor while its run goes on; otherwise every
    consumed response starts a new run that fences the previous one out (one run, and one
    full replay, per response)."""
    marker = tmp_path / "work.marks"
    clusters(2)
    parent, _ = submit("test:wfp/wf.ready-interrupt", [str(marker), READY_CHILDREN])

    assert outcome(parent) == Ok(sum(wfc.child_value(i) for i in range(READY_CHILDREN)))
    log = store.get(parent)
    children_finished = max(
        store.get(r.child_execution_id).events[-1].created_at for r in log.responses if r.child_execution_id
    )
    delay = next(r for r in log.responses if r.delay_id is not None)
    assert children_finished < delay.created_at, "a child finished after the sleep: the premise does not hold"
    runs = {r.event.run_id for r in log.events if isinstance(r.event, Locked)}
    assert len(runs) == 2, [
        (r.version, r.event.VARIANT, getattr(r.event, "run_id", ""))
        for r in log.events
        if r.event.VARIANT != "history_event"
    ]
