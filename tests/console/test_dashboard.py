"""The dashboard's numbers (``store.dashboard``) and the worker clusters' heartbeats.

The numbers are checked against real rows brought into each state through the store, at a
fixed ``now`` (2030), on PostgreSQL and SQLite. The heartbeats are checked with a real
``manage.py obelisk_worker`` cluster (``tests/support/clusters.py``): it reports itself
alive with what it serves; stopped in order it is marked stopped at once; killed, it goes
gone once ``GONE_AFTER`` passes (asked with ``now=``, not waited for).
"""

from __future__ import annotations

import html
import re
import signal
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from executions import store
from executions.events import Err, ExecutionFailure, Ok
from executions.store.clusters import GONE_AFTER
from tests.support.clusters import started_clusters, wait_until
from tests.support.dashboard import failures_then_a_burst, finish
from tests.support.helpers import T0, block_on_child, create, create_workflow, lock
from workers import heartbeat

NOW = T0


@pytest.fixture
def rows():
    """One execution in each interesting state, created before ``NOW``."""
    ids = {}
    ids["due"] = create(now=NOW - timedelta(minutes=10))
    ids["due2"] = create(now=NOW - timedelta(minutes=3))
    ids["scheduled"] = create(now=NOW - timedelta(minutes=9), scheduled_at=NOW + timedelta(hours=1))
    ids["expired"] = create(now=NOW - timedelta(minutes=8))
    lock(ids["expired"], now=NOW - timedelta(minutes=1))  # 10 s lock: expired at NOW
    ids["running"] = create(now=NOW - timedelta(minutes=7))
    lock(ids["running"], now=NOW - timedelta(seconds=2))
    ids["ok"] = create(now=NOW - timedelta(minutes=30))
    finish(ids["ok"], Ok(1), NOW - timedelta(minutes=10))
    ids["old_failure"] = create(now=NOW - timedelta(hours=3))
    finish(ids["old_failure"], ExecutionFailure("timed_out", "slow"), NOW - timedelta(hours=2))
    ids["failed"] = create(now=NOW - timedelta(minutes=6))
    finish(ids["failed"], ExecutionFailure("uncategorized", "boom"), NOW - timedelta(minutes=5))
    ids["error"] = create(now=NOW - timedelta(minutes=5))
    finish(ids["error"], Err({"code": 1}), NOW - timedelta(minutes=1))
    ids["paused"] = create(now=NOW - timedelta(minutes=4))
    store.pause_execution(ids["paused"], now=NOW - timedelta(minutes=4))
    ids["cancelling"] = create(now=NOW - timedelta(minutes=4))
    lock(ids["cancelling"], now=NOW - timedelta(seconds=1))
    store.cancel(ids["cancelling"], now=NOW - timedelta(seconds=1))
    ids["workflow"] = create_workflow(now=NOW - timedelta(minutes=2))
    locked = lock(ids["workflow"], now=NOW - timedelta(minutes=2))
    _, ids["child"], _ = block_on_child(ids["workflow"], locked, now=NOW - timedelta(minutes=2))
    return ids


@pytest.mark.django_db
def test_the_dashboard_counts_real_rows_by_state_and_outcome(rows):
    data = store.dashboard(now=NOW)
    # Now: exact, from the partial indexes. The child of the blocked workflow is due too.
    assert data.live == {"pending": 3, "scheduled": 1, "running": 3, "paused": 1, "cancelling": 1}
    assert data.expired_locks == 1
    assert data.oldest_pending.execution_id == rows["due"]
    assert data.oldest_pending.age == timedelta(minutes=10)
    assert data.by_state == {"pending_at": 5, "locked": 3, "blocked_by_join_set": 1, "finished": 4}
    assert data.by_outcome == {
        "pending": 3,
        "scheduled": 1,
        "running": 2,
        "paused": 1,
        "cancelling": 1,
        "blocked": 1,
        "ok": 1,
        "timed_out": 1,
        "uncategorized": 1,
        "error": 1,
    }
    assert data.finished_last_hour == {"ok": 1, "uncategorized": 1, "error": 1}
    assert (data.finished_last_hour_total, data.failed_last_hour, data.errors_last_hour) == (3, 1, 1)
    assert data.total == 13 and not data.window_full


@pytest.mark.django_db
def test_the_breakdown_covers_the_newest_executions_when_there_are_more(rows):
    data = store.dashboard(now=NOW, window=3)
    assert data.window_full and data.total == 3
    # The newest three: the workflow, its child, and one of the cancelling / paused pair.
    assert data.by_state["blocked_by_join_set"] == 1
    # What matters now stays exact whatever the window.
    assert data.live["pending"] == 3 and data.expired_locks == 1


@pytest.mark.django_db
def test_an_empty_store_has_an_empty_dashboard():
    data = store.dashboard(now=NOW)
    assert data.live == {"pending": 0, "scheduled": 0, "running": 0, "paused": 0, "cancelling": 0}
    assert data.oldest_pending is None and data.expired_locks == 0 and data.by_state == {}
    assert store.backlog(now=NOW) == {}


@pytest.mark.django_db
def test_backlog_counts_due_executions_per_function(rows):
    assert store.backlog(now=NOW) == {"test:pkg/ifc.fn": 3}
    assert store.first_scheduled_at([rows["due"]]) == {rows["due"]: NOW - timedelta(minutes=10)}


@pytest.mark.django_db
def test_the_admin_index_shows_the_dashboard_only_to_who_may_view_executions():
    due = create()
    user_model = get_user_model()
    admin_user = user_model.objects.create_superuser("root", "root@example.com", "pw")
    staff = user_model.objects.create_user("staff", "staff@example.com", "pw", is_staff=True)
    client = Client()
    client.force_login(admin_user)
    page = client.get("/admin/").content.decode()
    assert 'id="obelisk-dashboard"' in page and 'id="obelisk-clusters"' in page
    assert due in page  # the oldest due execution, linked
    client.force_login(staff)
    page = client.get("/admin/").content.decode()
    assert 'id="obelisk-dashboard"' not in page


# -- heartbeats ---------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_heartbeat_thread_reports_and_records_its_stop():
    beat = heartbeat.HeartbeatThread(
        processes=3, functions=["b:x/y.z", "a:x/y.z"], deployment_id="Dep_x", interval=0.05
    )
    beat.start()
    wait_until(lambda: beat.reports >= 2, timeout=10, what="two reports")
    (info,) = store.list_clusters()
    assert info.cluster_id == beat.cluster_id and info.alive and info.processes == 3
    assert info.functions == ("a:x/y.z", "b:x/y.z") and info.deployment_id == "Dep_x"
    assert len(beat.cluster_id) <= 64 and beat.cluster_id.startswith(f"{info.hostname[:20]}")
    beat.stop()
    (info,) = store.list_clusters()
    assert not info.alive and info.stopped_at is not None and info.running == 0


def test_the_running_counter_counts_only_inside_a_cluster():
    with heartbeat.running(5):
        assert heartbeat.running_now() == 0  # no cluster: nothing shared, nothing counted
    heartbeat.prepare_cluster()
    try:
        with heartbeat.running(2), heartbeat.running():
            assert heartbeat.running_now() == 3
        assert heartbeat.running_now() == 0
    finally:
        heartbeat._running = None


def _cluster_of(pid: int, now=None):
    return next((info for info in store.list_clusters(now=now) if info.pid == pid), None)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_cluster_reports_alive_and_is_marked_stopped_on_sigterm(request, tmp_path):
    with started_clusters(request, tmp_path) as start:
        cluster = start(1)
        info = wait_until(lambda: _cluster_of(cluster.pid), timeout=30, what="the cluster's heartbeat")
        assert info.alive and info.processes == 1
        assert "test:acts/basic.noop" in info.functions and info.deployment_id.startswith("Dep_")
        cluster.signal_main(signal.SIGTERM)
        cluster.wait_exit(30)
        info = _cluster_of(cluster.pid)
        assert not info.alive and info.stopped_at is not None


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_killed_cluster_goes_gone_after_missed_heartbeats(request, tmp_path):
    with started_clusters(request, tmp_path) as start:
        cluster = start(1)
        wait_until(lambda: _cluster_of(cluster.pid), timeout=30, what="the cluster's heartbeat")
        cluster.signal_group(signal.SIGKILL)
        cluster.wait_exit(30)
        info = _cluster_of(cluster.pid)
        assert info.alive and info.stopped_at is None  # nobody said it stopped...
        later = info.last_seen_at + GONE_AFTER + timedelta(seconds=1)
        gone = _cluster_of(cluster.pid, now=later)
        assert not gone.alive and gone.stopped_at is None  # ...it just stopped reporting


# -- the last hour, exact at any size (issue 36, item 2) ------------------------------------


@pytest.mark.django_db
def test_failures_of_the_last_hour_are_counted_after_a_burst_of_newer_successes():
    failed = failures_then_a_burst(burst=12)
    # A breakdown window smaller than the burst: the last hour must not depend on it.
    data = store.dashboard(now=NOW, window=5)
    assert data.failed_last_hour == len(failed) == 3
    assert data.finished_last_hour == {"ok": 12, "uncategorized": 2, "timed_out": 1}
    assert data.errors_last_hour == 0


def _card_link(page: str, card: str) -> str:
    match = re.search(rf'data-count="{card}"><a href="([^"]+)"', page)
    assert match, f"no link on the {card} card"
    return html.unescape(match.group(1))


def _listed_ids(page: str) -> set[str]:
    return set(re.findall(r'<span title="([^"]+)" class="obelisk-id">', page))


@pytest.mark.django_db
def test_each_last_hour_card_links_to_the_list_of_exactly_what_it_counts():
    now = timezone.now()  # the list filters by the real clock
    failed = failures_then_a_burst(burst=3, now=now)
    error = create(now=now - timedelta(minutes=11))
    finish(error, Err({"code": 7}), now - timedelta(minutes=10))
    admin_user = get_user_model().objects.create_superuser("root", "root@example.com", "pw")
    client = Client()
    client.force_login(admin_user)
    dashboard_page = client.get("/admin/").content.decode()
    failed_page = client.get(_card_link(dashboard_page, "failed-last-hour")).content.decode()
    assert _listed_ids(failed_page) == set(failed)  # the child too; not the old failure
    finished_page = client.get(_card_link(dashboard_page, "finished-last-hour")).content.decode()
    assert len(_listed_ids(finished_page)) == 7 and {error, *failed} <= _listed_ids(finished_page)
    errors_page = client.get(_card_link(dashboard_page, "errors-last-hour")).content.decode()
    assert _listed_ids(errors_page) == {error}
