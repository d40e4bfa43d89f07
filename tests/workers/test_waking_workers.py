"""How workers learn that work is due, and claim it once (decisions D44, D57, D58, D61,
D86, D88, D89).

Lingering workers woken together claim once and still take what comes after; the doorbell
rung in another process wakes a waiting executor and says what came, and a worker killed
while it waits never blocks the ring; a nudge just before a wait is not lost; a worker
woken while another finishes a short batch leaves the new work to it, and a busy worker
holds new work back only until its batch was due to end; work announced during a batch is
claimed together within the coalescing window; a workflow due while activities keep the
worker busy starts before they are drained.

why: D57, D58, D61, D86, D88, D89
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings

from executions import store
from executions.models import ExecutionState
from tests.support.helpers import create
from tests.support.hot_path import (
    SERVED,
    claim_and_run_beside,
)

pytestmark = pytest.mark.django_db(transaction=True)


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
        claim_and_run_beside(executor, submit_during_then_right_after_the_batch, budget=30, linger=1.0)
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
        claim_and_run_beside(executor, submit_each_after_the_previous_result, budget=60, linger=1.0)
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


def test_a_workflow_that_comes_due_while_activities_keep_the_worker_busy_starts_before_they_are_drained(tmp_path):
    """A worker whose claims of activities keep coming back full still starts a workflow
    announced meanwhile (after its current batch), instead of once the activity backlog is
    drained: an Interrupt workflow's next run, made due by a response, would otherwise wait
    behind every activity queued after it."""
    from tests.support import workflows
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
        workflow_id.append(create(workflows.draws.ffqn, component=workflows.draws.component_id))

    claim_and_run_beside(executor, submit_a_workflow_once_the_worker_is_busy, budget=30, linger=0)

    def locked_at(execution_id: str):
        return next(r.created_at for r in store.get(execution_id).events if r.event.VARIANT == "locked")

    assert all(store.get_state(e).state == "finished" for e in backlog)
    assert locked_at(workflow_id[0]) < locked_at(backlog[-1])
    assert store.get_state(workflow_id[0]).state == "finished"
