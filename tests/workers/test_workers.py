"""End-to-end tests of the worker runtime, through real worker clusters.

Every test submits executions of the activities in ``tests/support/components.py`` and lets a real
``manage.py obelisk_worker`` cluster (a subprocess; ``tests/support/clusters.py``) run them
against the test database, then reads the outcome from the execution log. Timeouts are
safety limits only: no test asserts how long the engine took.

Most tests share one 2-worker cluster (``cluster``). Tests that kill processes or need a
cluster of their own (``own_clusters``) stop the shared cluster first, so no other cluster
serves the same functions while they run; they come last in the file so the shared cluster
is started only once.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from executions import errors, store
from executions.events import (
    Err,
    ExecutionFailure,
    Finished,
    Locked,
    Ok,
    TemporarilyFailed,
    TemporarilyTimedOut,
)
from tests.support.clusters import (
    WorkerCluster,
    process_alive,
    report_log,
    started_clusters,
    wait_for_marker,
    wait_until,
)
from workers.testing import submit

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

WAIT = 30  # seconds: safety limit for an execution to finish


# ---------------------------------------------------------------------------------------
# Fixtures
# ---------------------------------------------------------------------------------------


class ClusterPool:
    """The module's shared cluster, started on first use and stopped for tests that need
    to be the only cluster serving the test functions."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.shared: WorkerCluster | None = None
        self.started = 0

    def get_shared(self) -> WorkerCluster:
        if self.shared is None or not self.shared.alive():
            if self.shared is not None:
                self.shared.stop()
            self.started += 1
            self.shared = WorkerCluster(self.directory / f"shared-{self.started}.log", workers=2, name="shared cluster")
            self.shared.start()
        return self.shared

    def stop_shared(self) -> None:
        if self.shared is not None:
            self.shared.stop()
            self.shared = None


@pytest.fixture(scope="module")
def cluster_pool(django_db_setup, django_db_blocker, tmp_path_factory):
    # The clusters connect to the test database django_db_setup created; this process
    # itself touches no database here.
    pool = ClusterPool(tmp_path_factory.mktemp("clusters"))
    try:
        yield pool
    finally:
        pool.stop_shared()


def _watch(request, clusters: list[WorkerCluster]):
    """Print the clusters' logs (what this test added) if the test fails."""
    offsets = {id(c): len(c.log()) for c in clusters}
    failed = request.session.testsfailed
    return lambda: request.session.testsfailed > failed and report_log(request, clusters, offsets)


@pytest.fixture
def cluster(cluster_pool, request) -> WorkerCluster:
    shared = cluster_pool.get_shared()
    report_if_failed = _watch(request, [shared])
    yield shared
    report_if_failed()
    assert shared.alive(), f"the shared cluster died:\n{shared.log()[-5000:]}"


@pytest.fixture
def own_clusters(cluster_pool, request, tmp_path):
    """``start(workers)`` starts a cluster of this test's own (the shared one is stopped);
    every cluster started is stopped at teardown (``started_clusters``)."""
    cluster_pool.stop_shared()
    with started_clusters(request, tmp_path, default_workers=2) as start:
        yield start


# ---------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------


def variants(execution_id: str) -> list[str]:
    return [record.event.VARIANT for record in store.get(execution_id).events]


def finish(execution_id: str, timeout: float = WAIT):
    return store.wait_for_finished([execution_id], timeout=timeout)[execution_id]


def finished_events(log: store.ExecutionLog) -> list[store.EventRecord]:
    return [r for r in log.events if isinstance(r.event, Finished)]


def assert_retry_timing(log: store.ExecutionLog, backoffs_ms: list[int]) -> None:
    """Each retry event's back-off is exact (same transaction, same clock), and the next
    attempt was locked no earlier than the back-off's end."""
    retries = [
        (i, r) for i, r in enumerate(log.events) if isinstance(r.event, (TemporarilyFailed, TemporarilyTimedOut))
    ]
    assert [r.event.backoff_expires_at - r.created_at for _, r in retries] == [
        timedelta(milliseconds=ms) for ms in backoffs_ms
    ]
    for i, retry in retries:
        relock = log.events[i + 1]
        assert isinstance(relock.event, Locked), log.events
        assert relock.created_at >= retry.event.backoff_expires_at


# ---------------------------------------------------------------------------------------
# Tests on the shared cluster
# ---------------------------------------------------------------------------------------


def test_success(cluster):
    execution_id, outcome = submit("test:acts/basic.add", [2, 3])
    assert outcome.created

    assert finish(execution_id) == Ok(5)
    log = store.get(execution_id)
    assert [r.event.VARIANT for r in log.events] == ["created", "locked", "finished"]
    assert log.events[-1].event.retval == Ok(5)
    assert log.state.is_finished
    assert store.get_finished_result(execution_id) == Ok(5)


def test_a_worker_process_runs_with_its_long_lived_objects_frozen_out_of_the_gc(cluster):
    """D132: once its executor is built, a worker process freezes what it has loaded
    (Django, the components, the executor), so the collector no longer scans those objects
    at every full collection. The collector stays on for everything made after."""
    execution_id, _ = submit("test:acts/basic.gc-state", [])
    state = finish(execution_id).value
    assert state["enabled"]
    assert state["frozen"] > state["tracked"], state  # most of the process is frozen


def test_retry_with_exponential_backoff(cluster):
    execution_id, _ = submit("test:acts/basic.fail-until", [3])

    assert finish(execution_id) == Ok(3)
    log = store.get(execution_id)
    assert [r.event.VARIANT for r in log.events] == [
        "created",
        "locked",
        "temporarily_failed",
        "locked",
        "temporarily_failed",
        "locked",
        "finished",
    ]
    # backoff 200 ms: the n-th retry waits 200 ms * 2^(n-1)
    assert_retry_timing(log, [200, 400])
    failures = [r.event for r in log.events if isinstance(r.event, TemporarilyFailed)]
    assert [f.reason for f in failures] == ["RuntimeError: attempt 1 fails", "RuntimeError: attempt 2 fails"]
    assert all("Traceback" in f.detail for f in failures)
    assert log.state.intermittent_event_count == 2


def test_retries_exhausted(cluster):
    execution_id, _ = submit("test:acts/basic.always-fails", [])

    result = finish(execution_id)
    assert isinstance(result, ExecutionFailure)
    assert result.kind == "uncategorized"
    assert "ValueError: this never works" in result.reason
    assert "Traceback (most recent call last)" in result.detail
    assert "ValueError: this never works" in result.detail

    log = store.get(execution_id)
    assert [r.event.VARIANT for r in log.events] == [
        "created",
        "locked",
        "temporarily_failed",
        "locked",
        "temporarily_failed",
        "locked",
        "finished",
    ]
    assert_retry_timing(log, [100, 200])
    assert log.state.intermittent_event_count == 2
    assert len(finished_events(log)) == 1


def test_error_value_finishes_at_once(cluster):
    execution_id, _ = submit("test:acts/basic.error-value", ["E42"])

    assert finish(execution_id) == Err({"code": "E42"})
    log = store.get(execution_id)
    assert [r.event.VARIANT for r in log.events] == ["created", "locked", "finished"]
    assert log.state.intermittent_event_count == 0


def test_timeout_interrupts_the_attempt_and_retries_it(cluster, tmp_path):
    marker = tmp_path / "sleep.marker"
    execution_id, _ = submit("test:acts/slow.sleep", [5, str(marker)])

    # Note when each attempt's start became visible (each start happened no later).
    wait_for_marker(marker)
    first_seen = time.monotonic()
    wait_until(lambda: marker.read_text().count("start ") >= 2, timeout=WAIT, what="the second attempt")
    second_seen = time.monotonic()

    result = finish(execution_id)
    assert isinstance(result, ExecutionFailure)
    assert result.kind == "timed_out"
    log = store.get(execution_id)
    assert [r.event.VARIANT for r in log.events] == [
        "created",
        "locked",
        "temporarily_timed_out",
        "locked",
        "finished",
    ]
    assert_retry_timing(log, [100])
    # The run recorded its own timeout while it still held its lock (not the lock sweep).
    timed_out = log.events[2]
    assert timed_out.created_at < log.events[1].event.lock_expires_at

    # Each attempt sleeps 5 s. Had either kept running after its timeout, it would have
    # written its "end" line by 5 s after its start.
    for seen in (first_seen, second_seen):
        time.sleep(max(0.0, seen + 5.5 - time.monotonic()))
    lines = marker.read_text().splitlines()
    starts = [line.split() for line in lines if line.startswith("start ")]
    assert [attempt for _, _, attempt in starts] == ["1", "2"]
    assert not [line for line in lines if line.startswith("end ")], lines
    # A timeout interrupts the activity; it does not kill its worker process.
    for _, pid, _ in starts:
        assert process_alive(int(pid)), f"worker {pid} is gone"
        assert cluster.is_member(int(pid))


def test_lock_is_renewed_while_the_activity_runs_without_growing_the_history(cluster, tmp_path):
    """The activity runs 3 s on a 1 s lock: the watchdog renews the lock in ``t_state``
    (sampled: always in the future), and the history stays created, locked, finished
    (issue 11 defect 8: renewals are heartbeats, not events)."""
    marker = tmp_path / "long.marker"
    execution_id, _ = submit("test:acts/slow.long", [3, str(marker)])  # lock_duration 1 s
    wait_for_marker(marker)
    samples = []
    while not store.get_state(execution_id).is_finished:
        state = store.get_state(execution_id)
        if state.state == "locked":
            samples.append(state.pending_expires_finished > timezone.now())
        time.sleep(0.2)

    assert finish(execution_id) == Ok("finished")
    log = store.get(execution_id)
    assert [r.event.VARIANT for r in log.events] == ["created", "locked", "finished"]
    assert len(samples) >= 5 and all(samples), samples
    assert log.state.intermittent_event_count == 0


def test_what_an_activity_prints_and_logs_is_stored_with_its_run(cluster):
    """Issue 12 item 5: logging and stdout of a run land in t_log with level and run id."""
    execution_id, _ = submit("test:acts/basic.chatty", [7])
    assert finish(execution_id) == Ok(7)
    (locked,) = [r.event for r in store.get(execution_id).events if isinstance(r.event, Locked)]
    logs = store.list_logs(execution_id)
    assert {entry.run_id for entry in logs} == {locked.run_id}
    assert [(e.level, e.message) for e in logs if e.level] == [("warn", "warning about 7")]
    assert [e.payload for e in logs if e.stream == "stdout"] == [b"printing 7\n"]


@pytest.mark.postgres_only
def test_a_cluster_listens_once_not_in_each_worker_process(cluster, tmp_path):
    """D88: every NOTIFY signals every listening session of the database, so a cluster
    listens in one session (its pusher, which rings the workers' doorbell) and the sweep's;
    a worker process that ran executions holds no LISTEN session of its own."""
    from django.db import connection

    from executions import notify

    path = tmp_path / "record.txt"
    ids = [submit("test:acts/basic.record", [str(path)])[0] for _ in range(40)]
    assert set(store.wait_for_finished(ids, timeout=WAIT)) == set(ids)
    workers = {int(pid) for _, pid in (line.split() for line in path.read_text().splitlines())}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT application_name FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name LIKE %s",
            [f"{notify.LISTEN_APPLICATION} %"],
        )
        listening = {int(name.rsplit(" ", 1)[1]) for (name,) in cursor.fetchall()}
    in_cluster = {pid for pid in listening if cluster.is_member(pid)}
    assert in_cluster, f"no session of the cluster listens: {listening}"
    assert workers and not workers & in_cluster, (workers, in_cluster)
    assert len(in_cluster) <= 2, in_cluster  # the pusher and the sweep


def test_cancel_pending_activity(cluster):
    execution_id, _ = submit("test:acts/basic.add", [1, 1], scheduled_at=timezone.now() + timedelta(seconds=60))

    assert store.cancel(execution_id) is store.CancelOutcome.REQUESTED
    result = finish(execution_id, timeout=15)  # the sweeper runs at least every second
    assert isinstance(result, ExecutionFailure)
    assert result.kind == "cancelled"
    assert variants(execution_id) == ["created", "cancellation_requested", "finished"]
    assert store.cancel(execution_id) is store.CancelOutcome.ALREADY_CANCELLED


def test_cancel_running_activity(cluster, tmp_path):
    marker = tmp_path / "long.marker"
    execution_id, _ = submit("test:acts/slow.long", [20, str(marker)])
    pid = int(wait_for_marker(marker).strip())

    assert store.cancel(execution_id) is store.CancelOutcome.REQUESTED
    result = finish(execution_id, timeout=15)
    assert isinstance(result, ExecutionFailure)
    assert result.kind == "cancelled"

    log = store.get(execution_id)
    kinds = [r.event.VARIANT for r in log.events]
    last_lock = max(i for i, kind in enumerate(kinds) if kind == "locked")
    assert not [k for k in kinds[last_lock:] if k.startswith("temporarily_")], kinds
    assert kinds.count("cancellation_requested") == 1
    assert kinds[-1] == "finished" and kinds.count("finished") == 1
    assert log.state.intermittent_event_count == 0
    # Cancellation interrupts the activity; the worker process lives on.
    assert process_alive(pid)
    assert cluster.is_member(pid)
    assert f"interrupting {execution_id}" in cluster.log()


def test_cancelled_run_records_its_own_outcome(cluster, tmp_path):
    marker = tmp_path / "long.marker"
    execution_id, _ = submit("test:acts/slow.long", [20, str(marker)])
    wait_for_marker(marker)

    assert store.cancel(execution_id) is store.CancelOutcome.REQUESTED
    result = finish(execution_id, timeout=15)
    assert isinstance(result, ExecutionFailure) and result.kind == "cancelled"
    log = store.get(execution_id)
    last_lock = [r.event for r in log.events if isinstance(r.event, Locked)][-1]
    # The watchdog stopped the run (decision 14: "after stopping it for a running one") and
    # the run recorded that, within its lock; not the lock sweep after the lock ran out.
    assert result.reason == "cancellation requested while running"
    assert log.events[-1].created_at < last_lock.lock_expires_at


def test_hard_stop_outcome_is_recorded_while_the_lock_is_held(cluster, tmp_path):
    marker = tmp_path / "stubborn.marker"
    execution_id, _ = submit("test:acts/slow.stubborn", [str(marker)])  # timeout 1 s, lock 3 s
    pid = int(wait_for_marker(marker).strip())

    result = finish(execution_id)
    wait_until(lambda: not process_alive(pid), timeout=15, what=f"worker {pid} to end")
    assert isinstance(result, ExecutionFailure) and result.kind == "timed_out"
    log = store.get(execution_id)
    # The activity was still running (ignoring its interrupt) until the hard stop: the
    # watchdog kept renewing its lock, so the outcome is the run's own (its fence still
    # held), not the sweep's "lock expired".
    assert [r.event.VARIANT for r in log.events] == ["created", "locked", "finished"]
    assert result.reason == "timed out after 1 s"


# ---------------------------------------------------------------------------------------
# Tests with clusters of their own
# ---------------------------------------------------------------------------------------


def test_hard_stop_of_an_activity_that_ignores_its_interrupt(own_clusters, tmp_path):
    cluster = own_clusters(workers=1)  # one worker: whatever runs next runs in a new process
    marker = tmp_path / "stubborn.marker"
    execution_id, _ = submit("test:acts/slow.stubborn", [str(marker)])
    pid = int(wait_for_marker(marker).strip())
    assert cluster.is_member(pid)

    result = finish(execution_id)
    assert isinstance(result, ExecutionFailure)
    assert result.kind == "timed_out"
    log = store.get(execution_id)
    assert [r.event.VARIANT for r in log.events][-1] == "finished"
    assert len(finished_events(log)) == 1
    stubborn_executor = [r.event for r in log.events if isinstance(r.event, Locked)][0].executor_id

    # The watchdog ended the worker process (os._exit(70)); the sentinel reaps it.
    wait_until(lambda: not process_alive(pid), timeout=15, what=f"worker {pid} to end")
    wait_until(lambda: _gone(pid), timeout=15, what=f"worker {pid} to be reaped")
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)

    # The cluster keeps working, in a new worker process.
    follow_up, _ = submit("test:acts/basic.record", [str(tmp_path / "record.txt")])
    assert finish(follow_up) == Ok(follow_up)
    recorded_id, recorded_pid = (tmp_path / "record.txt").read_text().split()
    assert recorded_id == follow_up
    assert int(recorded_pid) != pid
    assert cluster.is_member(int(recorded_pid))
    follow_up_lock = [r.event for r in store.get(follow_up).events if isinstance(r.event, Locked)][0]
    assert follow_up_lock.executor_id != stubborn_executor
    assert "did not stop within" in cluster.log()


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_killed_worker_is_recovered_and_fenced_out(own_clusters, tmp_path):
    cluster = own_clusters(workers=2)
    marker = tmp_path / "hang.marker"
    execution_id, _ = submit("test:acts/slow.hang", [str(marker)])
    pid = int(wait_for_marker(marker).strip())
    assert cluster.is_member(pid)

    os.kill(pid, signal.SIGKILL)

    result = finish(execution_id)
    assert isinstance(result, Ok)
    assert result.value.startswith("finished by ")
    finisher = int(result.value.removeprefix("finished by "))
    assert finisher != pid

    log = store.get(execution_id)
    kinds = [r.event.VARIANT for r in log.events]
    # the killed run's lock (maybe extended), the sweep's retry, the next run, its result
    assert kinds.count("finished") == 1 and kinds[-1] == "finished"
    assert kinds.count("temporarily_timed_out") == 1
    expired = kinds.index("temporarily_timed_out")
    assert set(kinds[1:expired]) == {"locked"}
    assert kinds[expired + 1 :] == ["locked", "finished"]
    locks = [r.event for r in log.events if isinstance(r.event, Locked)]
    first, last = locks[0], locks[-1]
    assert (first.run_id, first.lock_generation) != (last.run_id, last.lock_generation)
    assert log.state.intermittent_event_count == 1
    # The sweep acted on the killed run's expired lock (lock_duration 2 s, never extended
    # after the kill).
    killed_lock = log.events[expired - 1].event
    assert log.events[expired].created_at >= killed_lock.lock_expires_at

    # The dead run can no longer write.
    dead_fence = store.Fence(first.run_id, first.lock_generation)
    before = store.get(execution_id)
    with pytest.raises(errors.LockLost):
        store.append(execution_id, before.state.next_version, Finished(retval=Ok("late")), fence=dead_fence)
    [outcome] = store.append_many(
        [store.AppendItem(execution_id, before.state.next_version, Finished(retval=Ok("late")), dead_fence)]
    )
    assert isinstance(outcome, errors.LockLost)
    after = store.get(execution_id)
    assert after.events == before.events
    assert after.state.corresponding_version == before.state.corresponding_version
    assert store.get_finished_result(execution_id) == result


@pytest.mark.postgres_only
def test_clusters_race_for_the_same_executions(own_clusters, tmp_path):
    clusters = [own_clusters(workers=2, wait=False) for _ in range(3)]
    for c in clusters:
        c.wait_ready()
    path = tmp_path / "record.txt"
    ids = [submit("test:acts/basic.record", [str(path)])[0] for _ in range(500)]

    results = store.wait_for_finished(ids, timeout=120)
    assert results == {execution_id: Ok(execution_id) for execution_id in ids}
    executors = set()
    for execution_id in ids:
        events = [r.event for r in store.get(execution_id).events]
        kinds = Counter(event.VARIANT for event in events)
        assert kinds == Counter(created=1, locked=1, finished=1), (execution_id, kinds)
        executors.update(event.executor_id for event in events if isinstance(event, Locked))

    lines = [line.split() for line in path.read_text().splitlines()]
    assert len(lines) == 500
    runs = Counter(execution_id for execution_id, _ in lines)
    assert set(runs) == set(ids)
    assert set(runs.values()) == {1}  # exactly one run of each
    pids = {int(pid) for _, pid in lines}
    assert len(pids) == len(executors)  # one executor per worker process
    by_cluster = Counter(next((i for i, c in enumerate(clusters) if c.is_member(pid)), None) for pid in pids)
    assert None not in by_cluster  # every pid is a live worker of one of the three clusters
    assert len(pids) >= 2, f"only one worker process did all the work: {by_cluster}"
    assert len(by_cluster) >= 2, f"only one cluster did all the work: {by_cluster}"


def test_the_watchdog_outlives_a_failure_to_close_its_idle_connection(monkeypatch):
    """ "Never let the watchdog die": after each idle step the watchdog closes its connection
    if it broke or grew old. A failure there (a broken connection whose close fails too) is
    retried at the next step; it must not end the thread, or that process would renew no
    lock and enforce no deadline again."""
    import threading

    from django.db import DatabaseError
    from django.db.backends.base.base import BaseDatabaseWrapper

    from workers.activity_runner import Watchdog

    closes = []  # by thread: the process's own watchdog, left by earlier tests, closes too

    def failing_close(self):
        closes.append(threading.get_ident())
        raise DatabaseError("server closed the connection unexpectedly")

    monkeypatch.setattr(BaseDatabaseWrapper, "close_if_unusable_or_obsolete", failing_close)
    watchdog = Watchdog()
    watchdog._step()
    watchdog._step()
    assert closes.count(threading.get_ident()) == 2
