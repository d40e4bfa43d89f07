"""Workers never fail a healthy execution (issue 11), through real worker clusters.

Each test holds one guarantee a healthy execution depends on: a claimed execution is not
lost to its lock while it waits in a worker, a stop (``SIGTERM``) hands work back instead
of letting locks expire, a vanished worker is told apart from a real timeout, a database
outage is ridden out quietly, one bad result does not poison its batch, a cancelled run
records its own end, lock renewals do not flood the history, and a ``kill -9`` of the main
process alone takes the whole cluster down and hands back what it held (issue 36).

Like ``tests/workers/test_workers.py``: real ``manage.py obelisk_worker`` clusters (subprocesses,
``tests/support/clusters.py``) against the test database, the activities of
``tests/support/components.py``, marker files written by the activities as the record of what
actually ran, and timeouts only as safety limits. Every test starts clusters of its own
(``clusters``) with few worker processes (the machine is small).
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from executions import store
from executions.events import ExecutionFailure, Ok, TemporarilyTimedOut, Unlocked
from executions.state_machine import State
from tests.support.clusters import outcomes as wait_for_outcomes
from tests.support.clusters import started_clusters, wait_for_marker, wait_until
from workers.testing import submit

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SLOW = "test:acts/reliable.slow"  # (seconds, marker); no retries, lock 1 s, timeout 10 s
WAIT = 60  # seconds: safety limit for executions to finish
STOP_LIMIT = 45  # seconds: safety limit for a cluster to exit after SIGTERM (grace: 20 s)


# ---------------------------------------------------------------------------------------
# Fixtures and helpers
# ---------------------------------------------------------------------------------------


@pytest.fixture
def clusters(django_db_setup, request, tmp_path):
    """``start(workers, env=...)``: clusters of this test's own (``started_clusters``)."""
    with started_clusters(request, tmp_path, default_workers=1) as start:
        yield start


def outcomes(execution_ids: list[str], timeout: float = WAIT) -> dict[str, object]:
    return wait_for_outcomes(execution_ids, timeout)


def variants(execution_id: str) -> list[str]:
    return [record.event.VARIANT for record in store.get(execution_id).events]


class Marks:
    """The lines ``tests.support.components._note`` writes: what really ran, where and when."""

    def __init__(self, path: Path):
        self.path = path

    def lines(self) -> list[tuple[str, str, int, int, float]]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return []
        rows = []
        for line in text.splitlines():
            what, execution_id, pid, attempt, at = line.split()
            rows.append((what, execution_id, int(pid), int(attempt), float(at)))
        return rows

    def count(self, what: str) -> Counter:
        return Counter(execution_id for kind, execution_id, *_ in self.lines() if kind == what)

    def starts(self) -> Counter:
        return self.count("start")

    def ends(self) -> Counter:
        return self.count("end")

    def running_since(self) -> float | None:
        """The start time (``time.time()``) of the latest run that has not ended."""
        open_runs: dict[str, float] = {}
        for what, execution_id, _pid, _attempt, at in self.lines():
            if what == "start":
                open_runs[execution_id] = at
            else:
                open_runs.pop(execution_id, None)
        return max(open_runs.values(), default=None)


def healthy_history_problems(execution_id: str) -> list[str]:
    """Why this finished execution's history is not that of a healthy run: only created,
    locked, hand-backs (``unlocked``, reason "handed back ...") and one finished; no
    retry used, nothing timed out."""
    log = store.get(execution_id)
    kinds = [record.event.VARIANT for record in log.events]
    problems = []
    if kinds[0] != "created" or kinds[-1] != "finished" or kinds.count("finished") != 1:
        problems.append(f"history {kinds}")
    unexpected = set(kinds) - {"created", "locked", "unlocked", "finished"}
    if unexpected:
        problems.append(f"unexpected events {sorted(unexpected)} in {kinds}")
    for record in log.events:
        if isinstance(record.event, Unlocked) and not record.event.reason.startswith("handed back"):
            problems.append(f"unlocked for another reason: {record.event.reason!r}")
    if log.state.intermittent_event_count != 0:
        problems.append(f"intermittent_event_count {log.state.intermittent_event_count}")
    return [f"{execution_id}: {problem}" for problem in problems]


def handed_back_problems(execution_id: str, *, started: bool) -> list[str]:
    """Why this unfinished execution was not given back properly by a stopping cluster: it
    must be pending again, no retry used, and, if the cluster had claimed it (``locked``
    in its history), its history must end in ``unlocked`` with a reason starting "handed
    back". ``started``: it ran, so it must have been claimed."""
    log = store.get(execution_id)
    kinds = [record.event.VARIANT for record in log.events]
    last = log.events[-1].event
    problems = []
    if log.state.state != State.PENDING_AT:
        problems.append(f"state {log.state.state}, history {kinds}")
    elif kinds == ["created"]:
        if started:
            problems.append("ran, but its history shows no lock")
    elif not (isinstance(last, Unlocked) and last.reason.startswith("handed back")):
        problems.append(f"history ends with {last!r}")
    if log.state.intermittent_event_count != 0 or any(kind.startswith("temporarily_") for kind in kinds):
        problems.append(f"a retry was used: {kinds}")
    return [f"{execution_id}: {problem}" for problem in problems]


# ---------------------------------------------------------------------------------------
# 1. Claimed but not started executions never expire in the worker
# ---------------------------------------------------------------------------------------


def test_claimed_but_unstarted_executions_never_expire_in_the_worker(clusters, tmp_path):
    """A worker claims several executions at once. If they wait behind a slow batchmate
    longer than their lock, the sweep used to time them out (a retry used, here: no retry
    left, so failed) while the worker still ran them later. With no retries and a 1 s
    lock, 8 runs of 0.6 s claimed together must all finish Ok, each started exactly once."""
    marks = Marks(tmp_path / "slow.marks")
    # Submitted before the cluster starts, so its one worker claims them as one batch.
    ids = [submit(SLOW, [0.6, str(marks.path)])[0] for _ in range(8)]
    clusters(workers=1)

    results = outcomes(ids)
    assert results == {execution_id: Ok("slept") for execution_id in ids}
    assert [p for execution_id in ids for p in healthy_history_problems(execution_id)] == []
    assert marks.starts() == Counter({execution_id: 1 for execution_id in ids})


def test_slow_executions_behind_a_backlog_of_quick_ones_never_expire(clusters, tmp_path):
    """After 300 quick executions the worker claims big batches; 20 slow ones (0.6 s, lock
    1 s, no retries) then land in one of them and must not wait there until their locks
    expire: all finish Ok, each started exactly once."""
    marks = Marks(tmp_path / "slow.marks")
    quick = [submit("test:acts/basic.noop", [])[0] for _ in range(300)]
    slow = [submit(SLOW, [0.6, str(marks.path)])[0] for _ in range(20)]
    clusters(workers=1)

    results = outcomes(quick + slow, timeout=120)
    assert results == {**{e: Ok(None) for e in quick}, **{e: Ok("slept") for e in slow}}
    assert [p for execution_id in slow for p in healthy_history_problems(execution_id)] == []
    assert marks.starts() == Counter({execution_id: 1 for execution_id in slow})


# ---------------------------------------------------------------------------------------
# 2.-3. SIGTERM
# ---------------------------------------------------------------------------------------


def test_sigterm_to_the_main_process_hands_back_and_starts_nothing_more(clusters, tmp_path):
    """An operator's ``kill <pid>`` of ``obelisk_worker``: from then on the cluster starts
    nothing, hands back what it claimed but has not started (``unlocked``, "handed back",
    no retry used), lets the running activity finish (well within the default 20 s grace)
    and exits. A new cluster then runs everything; nothing ran twice unless its first run
    was interrupted and handed back."""
    marks = Marks(tmp_path / "slow.marks")
    cluster = clusters(workers=1)
    ids = [submit(SLOW, [1.5, str(marks.path)])[0] for _ in range(12)]

    # Signal while an activity is clearly mid-run, so "nothing starts after the signal" is
    # not blurred by one that was just starting anyway.
    wait_until(
        lambda: (since := marks.running_since()) is not None and time.time() - since < 0.8,
        timeout=WAIT,
        interval=0.02,
        what="an activity in the middle of its run",
    )
    signalled_at = time.time()
    cluster.signal_main(signal.SIGTERM)
    cluster.wait_exit(STOP_LIMIT)

    late = [
        (execution_id, at) for what, execution_id, _, _, at in marks.lines() if what == "start" and at > signalled_at
    ]
    assert late == [], f"started after SIGTERM (sent at {signalled_at:.6f})"
    problems = []
    for execution_id in ids:
        result = store.get_finished_result(execution_id)
        if result is None:  # never claimed, or handed back
            problems += handed_back_problems(execution_id, started=bool(marks.starts()[execution_id]))
        elif result != Ok("slept"):
            problems.append(f"{execution_id}: finished with {result!r}")
    assert problems == []
    assert any(store.get_finished_result(e) is None for e in ids), "the cluster ran everything before stopping"

    clusters(workers=1)
    assert outcomes(ids) == {execution_id: Ok("slept") for execution_id in ids}
    assert_each_ran_once_unless_handed_back_mid_run(ids, marks)


def assert_each_ran_once_unless_handed_back_mid_run(ids: list[str], marks: Marks) -> None:
    """Each execution ran at most twice, and twice only if its first run was interrupted
    (no "end" line) and handed back."""
    starts, ends = marks.starts(), marks.ends()
    problems = []
    for execution_id in ids:
        if starts[execution_id] == 1 and ends[execution_id] == 1:
            continue
        if starts[execution_id] == 2 and ends[execution_id] == 1:
            log = store.get(execution_id)
            if any(isinstance(r.event, Unlocked) and r.event.reason.startswith("handed back") for r in log.events):
                continue
        problems.append(f"{execution_id}: {starts[execution_id]} start(s), {ends[execution_id]} end(s)")
    assert problems == []


def test_sigterm_to_the_whole_process_group_hands_back_after_the_grace_period(clusters, tmp_path):
    """systemd and Kubernetes signal every process of the cluster at once. With a 1 s grace
    period and 5 s activities: unstarted executions are handed back at once, the running one
    is interrupted after the grace period and handed back too; none is timed out or pays a
    retry, and a new cluster finishes them all."""
    marks = Marks(tmp_path / "slow.marks")
    cluster = clusters(workers=1, env={"OBELISK_SHUTDOWN_GRACE_SECONDS": "1"})
    ids = [submit(SLOW, [5, str(marks.path)])[0] for _ in range(3)]
    wait_until(lambda: marks.running_since() is not None, timeout=WAIT, what="an activity to start")

    cluster.signal_group(signal.SIGTERM)
    cluster.wait_exit(STOP_LIMIT)

    assert marks.ends() == Counter(), "a 5 s activity finished although the grace period is 1 s"
    started = marks.starts()
    assert started, "nothing ran before the signal"
    assert [p for e in ids for p in handed_back_problems(e, started=bool(started[e]))] == []

    clusters(workers=2)
    assert outcomes(ids) == {execution_id: Ok("slept") for execution_id in ids}
    assert [p for execution_id in ids for p in healthy_history_problems(execution_id)] == []
    assert_each_ran_once_unless_handed_back_mid_run(ids, marks)


def test_a_stop_signalled_many_times_in_a_burst_still_stops_the_cluster(clusters, tmp_path):
    """An impatient operator, a supervisor and ``timeout`` may all signal the
    ``obelisk_worker`` process, and a signal can arrive while the handler of the one
    before is still running. The handler runs nested inside it then, so it must take no
    lock: a process-shared ``Event.set`` in the handler deadlocked on its own
    non-reentrant lock, and the cluster never stopped. Here SIGTERM and SIGINT are sent
    back to back for half a second while an activity runs; the cluster must still hand
    back, stop and exit, and a new cluster finishes every execution."""
    marks = Marks(tmp_path / "slow.marks")
    cluster = clusters(workers=1)
    ids = [submit(SLOW, [1.5, str(marks.path)])[0] for _ in range(4)]
    wait_until(lambda: marks.running_since() is not None, timeout=WAIT, what="an activity to start")

    deadline = time.monotonic() + 0.5
    signals = 0
    while time.monotonic() < deadline and cluster.alive():
        cluster.signal_main(signal.SIGTERM if signals % 2 == 0 else signal.SIGINT)
        signals += 1
    assert signals > 100, f"only {signals} signals were sent: the burst did not happen"
    cluster.wait_exit(STOP_LIMIT)
    assert "worker cluster stopped" in cluster.log()

    problems = []
    for execution_id in ids:
        result = store.get_finished_result(execution_id)
        if result is None:
            problems += handed_back_problems(execution_id, started=bool(marks.starts()[execution_id]))
        elif result != Ok("slept"):
            problems.append(f"{execution_id}: finished with {result!r}")
    assert problems == []
    clusters(workers=1)
    assert outcomes(ids) == {execution_id: Ok("slept") for execution_id in ids}
    assert_each_ran_once_unless_handed_back_mid_run(ids, marks)


# ---------------------------------------------------------------------------------------
# 4. A vanished worker is not a timeout
# ---------------------------------------------------------------------------------------


def test_lock_expired_by_a_vanished_worker_is_told_apart_from_a_real_timeout(clusters, tmp_path):
    """``kill -9`` of a whole cluster leaves locks that expire. The sweep (here: a second
    cluster's) records them as ``temporarily_timed_out`` with a reason saying the lock
    expired, and, when no retry is left, finishes them as ``timed_out`` with that reason;
    an activity that really ran out of time says "timed out after ..."."""
    first = clusters(workers=2)
    retried_marker, final_marker = tmp_path / "hang.marker", tmp_path / "hang-no-retry.marker"
    retried, _ = submit("test:acts/slow.hang", [str(retried_marker)])  # 3 retries, lock 2 s
    wait_for_marker(retried_marker)
    final, _ = submit("test:acts/reliable.hang-no-retry", [str(final_marker)])  # no retries
    wait_for_marker(final_marker)

    first.signal_group(signal.SIGKILL)
    first.wait_exit(STOP_LIMIT)
    real, _ = submit("test:acts/slow.sleep", [5, str(tmp_path / "sleep.marker")])  # timeout 1 s, 1 retry
    clusters(workers=2)

    results = outcomes([retried, final, real])
    assert isinstance(results[retried], Ok), results
    [expired] = [r.event for r in store.get(retried).events if isinstance(r.event, TemporarilyTimedOut)]
    assert (getattr(expired, "reason", None) or "").startswith("lock expired"), expired

    assert isinstance(results[final], ExecutionFailure), results
    assert results[final].kind == "timed_out"
    assert (results[final].reason or "").startswith("lock expired"), results[final]

    assert isinstance(results[real], ExecutionFailure) and results[real].kind == "timed_out", results
    [timed_out] = [r.event for r in store.get(real).events if isinstance(r.event, TemporarilyTimedOut)]
    assert (getattr(timed_out, "reason", None) or "").startswith("timed out after"), timed_out
    assert (results[real].reason or "").startswith("timed out after"), results[real]


# ---------------------------------------------------------------------------------------
# 5. Database outage
# ---------------------------------------------------------------------------------------


def _admin_connection():
    import psycopg

    settings = connection.settings_dict
    return psycopg.connect(
        host=settings.get("HOST") or "127.0.0.1",
        port=settings.get("PORT") or 5432,
        user=settings.get("USER") or None,
        password=settings.get("PASSWORD") or None,
        dbname="postgres",
        autocommit=True,
    )


def database_outage(seconds: float) -> None:
    """Make the test database unreachable for ``seconds`` without restarting the server:
    refuse new connections and end every existing one, except this test's own (which the
    test needs afterwards and which is idle meanwhile)."""
    name = connection.settings_dict["NAME"]
    connection.ensure_connection()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        [own_pid] = cursor.fetchone()
    with _admin_connection() as admin:
        quoted = '"' + name.replace('"', '""') + '"'
        admin.execute(f"ALTER DATABASE {quoted} ALLOW_CONNECTIONS false")
        try:
            end = time.monotonic() + seconds
            while time.monotonic() < end:  # also whatever was connecting at that moment
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> %s",
                    (name, own_pid),
                )
                time.sleep(0.5)
        finally:
            admin.execute(f"ALTER DATABASE {quoted} ALLOW_CONNECTIONS true")


@pytest.mark.postgres_only
def test_a_database_outage_is_ridden_out_quietly(clusters, tmp_path):
    """Every connection of every cluster process breaks at once for ~4 s. Afterwards the
    cluster works on: executions submitted before the outage (running through it, no
    retries, 1 s locks) and after it all finish Ok. The log has no traceback, the pusher
    neither fails nor is reincarnated, and each loop says "database unavailable" once."""
    workers = 2
    cluster = clusters(workers=workers)
    marks = Marks(tmp_path / "slow.marks")
    before = [submit(SLOW, [2.0, str(marks.path)])[0] for _ in range(4)]
    wait_until(lambda: marks.running_since() is not None, timeout=WAIT, what="an activity to start")

    database_outage(4.0)

    after = [submit("test:acts/basic.add", [i, i])[0] for i in range(10)]
    results = outcomes(before + after)
    assert results == {**{e: Ok("slept") for e in before}, **{e: Ok(2 * i) for i, e in enumerate(after)}}
    assert [p for execution_id in before for p in healthy_history_problems(execution_id)] == []

    log = cluster.log()
    assert "Traceback" not in log
    assert "Failed to pull task from broker" not in log
    assert "reincarnated pusher" not in log.lower()
    # An outage is a warning when it starts and an info line when it ends, nothing louder
    # (and nothing that goes on after the database is back).
    loud = [line for line in log.splitlines() if " ERROR " in line or " CRITICAL " in line]
    assert loud == []
    unavailable = [line for line in log.splitlines() if "database unavailable" in line]
    # One line per loop and process (broker, sweep, executors, watchdogs, LISTEN threads),
    # not one per reconnection attempt.
    assert 1 <= len(unavailable) <= 3 * (workers + 3), "\n".join(unavailable)


# ---------------------------------------------------------------------------------------
# 6. A value that cannot be stored
# ---------------------------------------------------------------------------------------


def test_a_result_that_cannot_be_stored_does_not_poison_its_batch(clusters, tmp_path):
    """An activity returns a string with a NUL character, which PostgreSQL text cannot hold
    (refused on SQLite too, for consistency). Its execution finishes as failed ("result
    rejected"), and its 19 batchmates, whose results were written in the same group
    commit, finish Ok having run exactly once."""
    path = tmp_path / "record.txt"
    ids = [submit("test:acts/basic.record", [str(path)])[0] for _ in range(3)]
    bad, _ = submit("test:acts/reliable.nul", [])
    ids += [submit("test:acts/basic.record", [str(path)])[0] for _ in range(16)]
    clusters(workers=1)  # submitted before it starts: claimed and committed together

    results = outcomes([bad, *ids])
    failure = results.pop(bad)
    assert results == {execution_id: Ok(execution_id) for execution_id in ids}
    assert isinstance(failure, ExecutionFailure), failure
    assert failure.kind == "uncategorized"
    assert (failure.reason or "").startswith("result rejected"), failure
    assert variants(bad) == ["created", "locked", "finished"]
    assert {execution_id: variants(execution_id) for execution_id in ids} == {
        execution_id: ["created", "locked", "finished"] for execution_id in ids
    }
    runs = Counter(line.split()[0] for line in path.read_text().splitlines())
    assert runs == Counter({execution_id: 1 for execution_id in ids})


# ---------------------------------------------------------------------------------------
# 7. Cancelling a running activity
# ---------------------------------------------------------------------------------------


def test_a_cancelled_running_activity_is_always_finished_by_its_own_run(clusters, tmp_path):
    """Cancelling a running activity interrupts it and its own run records the outcome,
    "cancellation requested while running". With a 1 s lock renewed all the time, the
    renewal and the cancellation request often meet; not once in ten may that leave the
    outcome to the sweep after the lock ran out ("cancelled while its lock expired").
    One execution at a time, each cancelled at another moment of its renewal cycle (the
    i-th 0.137 * i s after it started), so the request lands before, between and right
    after renewals and cancellation checks."""
    clusters(workers=2)
    ids = []
    for i in range(10):
        marker = tmp_path / f"long-{i}.marker"
        execution_id, _ = submit("test:acts/slow.long", [20, str(marker)])  # lock 1 s, no retries
        ids.append(execution_id)
        wait_until(
            lambda: marker.exists() or store.get_state(execution_id).is_finished,  # noqa: B023
            timeout=WAIT,
            what=f"{execution_id} to start",
        )
        assert marker.exists(), f"{execution_id} finished without running: {store.get_finished_result(execution_id)}"
        time.sleep(0.137 * i)
        assert store.cancel(execution_id) is store.CancelOutcome.REQUESTED

    results = outcomes(ids)
    assert {e: (r.kind, r.reason) if isinstance(r, ExecutionFailure) else r for e, r in results.items()} == {
        execution_id: ("cancelled", "cancellation requested while running") for execution_id in ids
    }
    for execution_id in ids:
        kinds = variants(execution_id)
        assert not [k for k in kinds if k.startswith("temporarily_")], (execution_id, kinds)
        assert kinds.count("finished") == 1 and kinds[-1] == "finished", (execution_id, kinds)


# ---------------------------------------------------------------------------------------
# 8. Lock renewals
# ---------------------------------------------------------------------------------------


def test_lock_renewals_do_not_flood_the_history(clusters, tmp_path):
    """An activity running 4 s with a 1 s lock has its lock renewed several times. The
    renewals only move ``t_state``'s lock expiry, which is in the future whenever it is
    looked at while the run holds the lock; the history stays created, locked, finished."""
    clusters(workers=1)
    marker = tmp_path / "long.marker"
    execution_id, _ = submit("test:acts/slow.long", [4, str(marker)])  # lock 1 s
    wait_for_marker(marker)

    samples, expired = 0, []
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        sampled_at = timezone.now()  # before the read: the expiry must be later than this
        state = store.get_state(execution_id)
        if state.is_finished:
            break
        if state.state == State.LOCKED:
            samples += 1
            if state.pending_expires_finished <= sampled_at:
                expired.append((sampled_at, state.pending_expires_finished))
        time.sleep(0.05)

    assert outcomes([execution_id]) == {execution_id: Ok("finished")}
    assert samples > 0
    assert expired == [], "the lock had expired while the activity ran"
    assert variants(execution_id) == ["created", "locked", "finished"]


# ---------------------------------------------------------------------------------------
# 9. A killed main process (the OOM killer) takes its cluster down
# ---------------------------------------------------------------------------------------


def test_a_killed_main_process_takes_its_cluster_down_and_hands_back_what_it_held(clusters, tmp_path):
    """The OOM killer ends the ``obelisk_worker`` process with SIGKILL, and only it. Its
    sentinel, pusher, monitor and workers used to run on: renewing the running activity's
    lock, claiming and running new work, invisible on the dashboard. Now every process of
    the cluster ends, nothing is claimed after the kill, and the running activities (8 s,
    a 1 s lock, no retries; one in each worker) are handed back ("handed back", no retry
    used). A second cluster then runs them and what was submitted after the kill; none
    pays a retry."""
    marks = Marks(tmp_path / "slow.marks")
    first = clusters(workers=2)
    held = [submit(SLOW, [8, str(marks.path)])[0] for _ in range(2)]
    wait_until(
        lambda: len({pid for what, _, pid, _, _ in marks.lines() if what == "start"}) == 2,
        timeout=WAIT,
        what="an activity to run in each worker",
    )
    members = first.members()
    children = {pid for pid, parent in members.items() if parent == first.pid}
    assert children and set(members) - children - {first.pid}, f"no sentinel and workers found: {members}"

    killed_at = timezone.now()
    first.signal_main(signal.SIGKILL)
    first.process.wait(STOP_LIMIT)
    later = [submit("test:acts/basic.add", [i, i])[0] for i in range(5)]
    wait_until(lambda: not first.group_alive(), timeout=STOP_LIMIT, what="every process of the killed cluster to end")

    late_locks = [
        (execution_id, record.created_at)
        for execution_id in [*held, *later]
        for record in store.get(execution_id).events
        if record.event.VARIANT == "locked" and record.created_at > killed_at
    ]
    assert late_locks == [], f"claimed after the kill (at {killed_at})"
    assert [p for execution_id in held for p in handed_back_problems(execution_id, started=True)] == []
    assert {execution_id: variants(execution_id) for execution_id in later} == {e: ["created"] for e in later}

    clusters(workers=1)
    results = outcomes([*held, *later])
    assert results == {**{e: Ok("slept") for e in held}, **{e: Ok(2 * i) for i, e in enumerate(later)}}
    assert [p for execution_id in [*held, *later] for p in healthy_history_problems(execution_id)] == []
    ends = [(execution_id, pid) for what, execution_id, pid, _, _ in marks.lines() if what == "end"]
    assert sorted(e for e, _ in ends) == sorted(held) and not {pid for _, pid in ends} & set(members), (ends, members)
