"""Schedules end to end (issue 39): real worker clusters fire ticks through their timer
sweeps and run them, and each tick runs exactly once.

Like ``tests/workers/test_worker_reliability.py``: real ``manage.py obelisk_worker``
clusters (``tests/support/clusters.py``) against the test database, so the tests are
transactional. The clusters serve ``tests/support/schedule_components.py``, whose ``note``
activity writes one line per run into a marker file: the record of what really ran. Time
passes for real (a 1-second schedule); every wait is a safety limit, never an assertion.

What they hold, as ``schedule_spec.plan_ticks`` documents it (D115): with ``allow_all``
every tick in the catch-up window starts; with ``skip`` the first due tick starts and the
rest are ``skipped``; a tick later than the window is ``missed`` (one collapsed record for
a long gap). A paused schedule fires nothing and resumes from the next tick; a backfill
creates each tick once; a schedule declared in code is one schedule however many clusters
apply it; a target a deploy changed pauses its schedule, and the others go on.
"""

from __future__ import annotations

import threading
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.db import connection, transaction
from django.utils import timezone

from executions import schedules, store
from executions.events import Ok
from executions.models import ExecutionEvent, ExecutionState, Schedule, ScheduleTick
from executions.schedule_spec import tick_execution_id
from tests.support.clusters import outcomes, started_clusters, wait_until
from tests.support.helpers import deploy_components

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

NOTE = "test:sched/acts.note"  # (marker, scheduled_at): tests/support/schedule_components.py
ADD = "test:acts/basic.add"
NIGHTLY = "sched-nightly"  # declared with @schedule in tests/support/schedule_components.py
MODULES = "tests.support.components,tests.support.schedule_components"
CHANGED_MODULES = "tests.support.components,tests.support.schedule_components_changed"
WAIT = 60  # seconds: safety limit


@pytest.fixture
def clusters(django_db_setup, request, tmp_path):
    """``start(workers, env=...)``: clusters serving the schedule components."""
    with started_clusters(
        request, tmp_path, default_workers=1, default_env={"OBELISK_COMPONENT_MODULES": MODULES}
    ) as start:
        yield start


def every_second(schedule_id: str, marker: Path, **options) -> schedules.ScheduleRequest:
    return schedules.ScheduleRequest(schedule_id, NOTE, [str(marker)], interval_seconds=1, **options)


def records(schedule_id: str) -> list[ScheduleTick]:
    return list(ScheduleTick.objects.filter(schedule_id=schedule_id).order_by("nominal_at", "id"))


def started(schedule_id: str) -> list[ScheduleTick]:
    return [r for r in records(schedule_id) if r.action == "started"]


def wait_for_started(schedule_id: str, count: int, *, after: datetime | None = None) -> list[ScheduleTick]:
    def enough():
        found = [r for r in started(schedule_id) if after is None or r.nominal_at > after]
        return found if len(found) >= count else None

    return wait_until(enough, timeout=WAIT, interval=0.1, what=f"{count} started ticks of {schedule_id}")


def runs(marker: Path) -> Counter:
    """How many times each execution really ran (lines of the ``note`` activity)."""
    try:
        lines = marker.read_text().splitlines()
    except FileNotFoundError:
        return Counter()
    return Counter(line.split()[0] for line in lines)


def finish_all(schedule_id: str) -> list[str]:
    """Pause the schedule and wait until every execution it started has finished; their
    ids. (A pause holds the row's lock: no fire pass is under way once it returns.)"""
    schedules.pause(schedule_id)
    return wait_finished([r.execution_id for r in started(schedule_id)])


def wait_finished(ids: list[str]) -> list[str]:
    results = outcomes(ids, WAIT)
    assert all(not str(value).startswith("unfinished") for value in results.values()), results
    return ids


def finished_events(execution_id: str) -> int:
    return sum(1 for record in store.get(execution_id).events if record.event.VARIANT == "finished")


def finished_at(execution_id: str) -> datetime | None:
    return (
        ExecutionEvent.objects.filter(execution_id=execution_id, variant="finished")
        .values_list("created_at", flat=True)
        .first()
    )


def let_pass(seconds: float) -> datetime:
    """Let the clock pass ``seconds`` (ticks fall meanwhile); the time it waited from."""
    since = timezone.now()
    wait_until(lambda: timezone.now() >= since + timedelta(seconds=seconds), timeout=seconds + 5, interval=0.05)
    return since


def test_two_clusters_fire_and_run_each_tick_of_a_one_second_schedule_exactly_once(clusters, tmp_path):
    clusters()
    clusters()
    marker = tmp_path / "runs"
    schedules.create(every_second("both", marker, overlap="allow_all", catchup_window_seconds=60))
    wait_for_started("both", 6)
    ids = finish_all("both")

    ticks = records("both")
    assert {r.action for r in ticks} == {"started"}, [(r.nominal_at, r.action, r.reason) for r in ticks]
    nominal = [r.nominal_at for r in ticks]
    assert len(set(nominal)) == len(nominal), "a tick was recorded twice"
    assert all(b - a == timedelta(seconds=1) for a, b in zip(nominal, nominal[1:], strict=False)), nominal
    row = Schedule.objects.get(schedule_id="both")
    assert ids == [tick_execution_id(row.key, t) for t in nominal]
    assert ExecutionState.objects.filter(execution_id__in=ids).count() == len(ids)
    assert runs(marker) == Counter(dict.fromkeys(ids, 1)), "each tick's execution ran once"
    assert all(finished_events(execution_id) == 1 for execution_id in ids)
    assert {store.get_created(i).metadata["obelisk.schedule"] for i in ids} == {"both"}


def stop_for_three_ticks(clusters, cluster, schedule_id: str) -> tuple[datetime, datetime]:
    """``cluster`` runs the schedule for two ticks, is stopped for three (and the time a
    cluster takes to start), and a cluster is started again; returns (the last tick before
    the stop, the time of the first fire after it)."""
    before = wait_for_started(schedule_id, 2)
    wait_finished([r.execution_id for r in before])
    cluster.stop()
    last = max(r.nominal_at for r in records(schedule_id))
    let_pass(3.2)
    clusters()
    fired = wait_until(
        lambda: [r for r in records(schedule_id) if r.nominal_at > last],
        timeout=WAIT,
        interval=0.1,
        what="the first fire after the restart",
    )
    assert last >= before[-1].nominal_at
    return last, fired[0].recorded_at


def gap(schedule_id: str, last: datetime, fired_at: datetime) -> list[ScheduleTick]:
    """The records of the first fire after the restart: the ticks due in the gap."""
    return [r for r in records(schedule_id) if r.nominal_at > last and r.recorded_at == fired_at]


def test_after_a_stopped_cluster_allow_all_catches_up_every_tick_in_the_window(clusters, tmp_path):
    marker = tmp_path / "runs"
    cluster = clusters()  # also registers the deployment the schedule is checked against
    schedules.create(every_second("catchup", marker, overlap="allow_all", catchup_window_seconds=60))
    last, fired_at = stop_for_three_ticks(clusters, cluster, "catchup")
    due = gap("catchup", last, fired_at)
    assert len(due) >= 3 and {r.action for r in due} == {"started"}
    expected = [last + timedelta(seconds=n) for n in range(1, len(due) + 1)]
    assert [r.nominal_at for r in due] == expected  # none lost, in order
    ids = finish_all("catchup")
    assert runs(marker) == Counter(dict.fromkeys(ids, 1))


def test_after_a_stopped_cluster_skip_starts_the_first_due_tick_and_skips_the_rest(clusters, tmp_path):
    marker = tmp_path / "runs"
    cluster = clusters()
    schedules.create(every_second("skipping", marker, overlap="skip", catchup_window_seconds=60))
    last, fired_at = stop_for_three_ticks(clusters, cluster, "skipping")
    due = gap("skipping", last, fired_at)
    assert len(due) >= 3
    # Skip drops ticks while the schedule's previous execution runs: the last one before
    # the stop may have been left unfinished by it (then every tick of the gap is skipped).
    previous = [r for r in started("skipping") if r.nominal_at <= last][-1]
    done = finished_at(previous.execution_id)
    # (It may also finish during the fire pass, after the pass's `now`: then either.)
    first = {"started"} if done is not None and done <= fired_at else {"started", "skipped"}
    assert due[0].action in first and [r.action for r in due[1:]] == ["skipped"] * (len(due) - 1)
    assert [r.nominal_at for r in due] == [last + timedelta(seconds=n) for n in range(1, len(due) + 1)]
    ids = finish_all("skipping")
    assert runs(marker) == Counter(dict.fromkeys(ids, 1))


def test_after_a_stopped_cluster_ticks_older_than_the_catch_up_window_are_missed(clusters, tmp_path):
    marker = tmp_path / "runs"
    window = 1.5
    cluster = clusters()
    schedules.create(every_second("window", marker, overlap="allow_all", catchup_window_seconds=window))
    last, fired_at = stop_for_three_ticks(clusters, cluster, "window")
    due = gap("window", last, fired_at)
    late = timedelta(seconds=window)
    missed = [r for r in due if r.action == "missed"]
    assert missed, [(r.nominal_at, r.action) for r in due]
    assert all(fired_at - r.nominal_at > late for r in missed)
    starts = [r for r in due if r.action == "started"]
    assert starts and all(fired_at - r.nominal_at <= late for r in starts)
    assert {r.action for r in due} == {"missed", "started"}
    # One tick more than the window stood for every tick before it (a collapsed range).
    assert missed[0].nominal_at == last + timedelta(seconds=1)
    ids = finish_all("window")
    assert runs(marker) == Counter(dict.fromkeys(ids, 1))


def test_a_backfill_runs_each_past_tick_once_and_a_second_backfill_creates_nothing(clusters, tmp_path):
    marker = tmp_path / "runs"
    clusters()
    hourly = schedules.ScheduleRequest("hourly", NOTE, [str(marker)], cron="0 * * * *")
    row = schedules.create(hourly)
    end = timezone.now().replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
    start = end - timedelta(hours=4)
    schedules.backfill("hourly", start, end)
    expected = [tick_execution_id(row.key, start + timedelta(hours=n)) for n in range(5)]
    results = outcomes(expected, WAIT)
    assert [results[i] for i in expected] == [Ok((start + timedelta(hours=n)).isoformat()) for n in range(5)]
    assert runs(marker) == Counter(dict.fromkeys(expected, 1))

    schedules.backfill("hourly", start, end)
    assert set(ExecutionState.objects.values_list("execution_id", flat=True)) == set(expected)
    let_pass(1)  # a second run would have happened by now
    assert runs(marker) == Counter(dict.fromkeys(expected, 1))


def test_a_backfill_returns_the_ticks_of_its_own_range(clusters, tmp_path):
    """Not the schedule's newest tick records: a backfill of an older part of the range
    returns that part's ticks."""
    clusters()
    row = schedules.create(schedules.ScheduleRequest("hourly", NOTE, [str(tmp_path / "runs")], cron="0 * * * *"))
    end = timezone.now().replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
    schedules.backfill("hourly", end - timedelta(hours=4), end)
    older = schedules.backfill("hourly", end - timedelta(hours=4), end - timedelta(hours=3))
    expected = [end - timedelta(hours=4), end - timedelta(hours=3)]
    assert sorted(t.nominal_at for t in older) == expected
    assert {t.execution_id for t in older} == {tick_execution_id(row.key, t) for t in expected}


def test_a_paused_schedule_fires_no_ticks_and_fires_again_once_resumed(clusters, tmp_path):
    marker = tmp_path / "runs"
    clusters()
    schedules.create(every_second("pausing", marker, overlap="allow_all"))
    wait_for_started("pausing", 2)
    schedules.pause("pausing")
    paused_at = Schedule.objects.get(schedule_id="pausing").updated_at
    let_pass(3.2)
    assert [r for r in records("pausing") if r.nominal_at > paused_at] == []
    resumed_at = timezone.now()
    schedules.resume("pausing")
    wait_for_started("pausing", 2, after=resumed_at)
    ids = finish_all("pausing")
    quiet = [r.nominal_at for r in records("pausing") if paused_at < r.nominal_at <= resumed_at]
    assert quiet == [], "the paused time is not caught up"
    assert runs(marker) == Counter(dict.fromkeys(ids, 1))


def test_a_schedule_declared_in_code_and_applied_by_clusters_starting_together_is_one_schedule(clusters):
    first, second = clusters(wait=False), clusters(wait=False)
    first.wait_ready()
    second.wait_ready()
    row = Schedule.objects.get(schedule_id=NIGHTLY)
    assert (row.source, row.cron, row.timezone, row.ffqn) == ("code", "0 3 * * *", "Europe/Prague", NOTE)
    first.stop()
    second.stop()
    clusters()  # the same code once more
    again = Schedule.objects.get(schedule_id=NIGHTLY)
    assert Schedule.objects.filter(schedule_id=NIGHTLY).count() == 1
    assert (again.key, again.updated_at) == (row.key, row.updated_at)  # applied as unchanged


def test_a_schedule_whose_target_a_deploy_changed_is_paused_and_the_others_go_on(clusters, tmp_path):
    marker = tmp_path / "runs"
    old = clusters()
    # allow_all: skip would drop its ticks while the first one waits for a worker of the
    # old deployment (D111), without ever trying to submit them.
    schedules.create(every_second("changing", marker, overlap="allow_all"))
    schedules.create(schedules.ScheduleRequest("adding", ADD, [1, 2], interval_seconds=1))
    wait_for_started("changing", 1)
    old.stop()
    clusters(env={"OBELISK_COMPONENT_MODULES": CHANGED_MODULES})  # the deploy: `note` needs `copies`
    restarted = timezone.now()
    row = wait_until(
        lambda: Schedule.objects.filter(schedule_id="changing", paused=True).first(),
        timeout=WAIT,
        what="the changed schedule to be paused",
    )
    assert f"cannot submit {NOTE}" in row.pause_reason and "takes 3 argument(s)" in row.pause_reason
    assert records("changing")[-1].action == "failed"
    later = wait_for_started("adding", 3, after=restarted)
    assert outcomes([later[-1].execution_id], WAIT) == {later[-1].execution_id: Ok(3)}
    assert not Schedule.objects.get(schedule_id="adding").paused


@pytest.mark.postgres_only
def test_applying_a_declared_schedule_while_another_process_creates_it_is_one_schedule():
    """Two workers starting at once apply the same ``@schedule``: the second one's insert
    waits for the first one's, and must then find the schedule, not fail the worker's start."""
    request = schedules.ScheduleRequest("racing", ADD, [1, 2], interval_seconds=60, source="code")
    deploy_components()
    definition = request.definition()
    inserted, release = threading.Event(), threading.Event()

    def first_process():
        try:
            with transaction.atomic():
                store.save_schedule(definition, mode="upsert")
                inserted.set()
                release.wait(WAIT)
        finally:
            connection.close()

    first = threading.Thread(target=first_process)
    first.start()
    assert inserted.wait(WAIT)
    outcome: dict = {}

    def second_process():
        try:
            outcome["value"] = schedules.apply([request])
        except Exception as error:  # noqa: BLE001 - the failure is the finding
            outcome["value"] = error
        finally:
            connection.close()

    second = threading.Thread(target=second_process)
    second.start()
    wait_until(blocked_on_a_lock, timeout=WAIT, what="the second insert to wait for the first")
    release.set()
    first.join(WAIT)
    second.join(WAIT)
    assert outcome["value"] == {"racing": "unchanged"}
    assert Schedule.objects.filter(schedule_id="racing").count() == 1


def blocked_on_a_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0] > 0
