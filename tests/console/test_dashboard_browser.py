"""The dashboard in a real browser: a worker cluster shows up alive, and gone once stopped;
the "failed, last hour" card counts exactly what its link lists (issue 36, item 2); the
dashboard refreshes itself while open.

Chromium (Debian's, through Playwright) logs in to the admin of a live server as a
superuser; a real ``manage.py obelisk_worker`` cluster (``tests/support/clusters.py``) runs
against the same test database. Screenshots go to ``var/screenshots/dashboard-*.png``.
The browser is the session's (``tests/conftest.py``).
"""

from __future__ import annotations

import re
import signal
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.db import connections
from django.utils import timezone

from executions import store
from executions.events import ExecutionFailure
from executions.templatetags.obelisk_console import POLL_SECONDS
from tests.support import components
from tests.support.clusters import started_clusters, wait_until
from tests.support.dashboard import failures_then_a_burst, finish
from tests.support.helpers import create
from workers.testing import submit

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SCREENSHOTS = Path(__file__).resolve().parents[2] / "var" / "screenshots"
SIZES = [(1366, 768), (1920, 1080)]
PASSWORD = "dashboard-pw"


@pytest.fixture
def page(browser, live_server):
    get_user_model().objects.create_superuser("admin", "admin@example.com", PASSWORD)
    context = browser.new_context(viewport={"width": SIZES[0][0], "height": SIZES[0][1]})
    page = context.new_page()
    page.goto(f"{live_server.url}/admin/login/?next=/admin/")
    page.fill("#id_username", "admin")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(f"{live_server.url}/admin/")
    try:
        yield page
    finally:
        context.close()
        # The test's database work ran while Playwright's loop was up, on a connection of
        # its own: close it, or the test database cannot be dropped at the end.
        connections.close_all()


def screenshot(page, name: str, size: tuple[int, int]) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.set_viewport_size({"width": size[0], "height": size[1]})
    path = SCREENSHOTS / f"dashboard-{name}-{size[0]}x{size[1]}.png"
    page.screenshot(path=str(path), full_page=False)
    return path


def _reported(pid: int):
    return next((c for c in store.list_clusters() if c.pid == pid and c.alive), None)


def test_the_dashboard_shows_a_cluster_alive_then_gone_once_stopped(page, live_server, request, tmp_path):
    with started_clusters(request, tmp_path) as start:
        cluster = start(1)
        info = wait_until(lambda: _reported(cluster.pid), timeout=30, what="the cluster's first heartbeat")
        row = page.locator(f'#obelisk-clusters tr[data-cluster="{info.cluster_id}"]')
        done = [submit(components.add.ffqn, [i, 1])[0] for i in range(3)]
        done.append(submit(components.error_value.ffqn, ["E42"])[0])
        submit(components.noop.ffqn, [], scheduled_at=timezone.now() + timedelta(hours=1))
        store.wait_for_finished(done, timeout=30)

        page.goto(f"{live_server.url}/admin/")
        assert row.count() == 1
        assert "alive" in row.get_attribute("class")
        assert "alive" in row.locator("td").first.inner_text()
        assert row.locator("td").nth(2).inner_text() == str(cluster.pid)
        assert "test:acts/basic.add" in row.locator("td.fn").get_attribute("title")
        assert page.locator("#obelisk-live [data-count=scheduled] .n").inner_text() == "1"
        assert page.locator("#obelisk-live [data-count=finished-last-hour] .n").inner_text() == "4"
        assert page.locator("#obelisk-outcomes tr[data-outcome=error]").count() == 1
        for size in SIZES:
            screenshot(page, "alive", size)

        cluster.signal_main(signal.SIGTERM)
        cluster.wait_exit(30)
        page.set_viewport_size({"width": SIZES[0][0], "height": SIZES[0][1]})
        page.reload()
        assert "gone" in row.get_attribute("class")
        assert "gone" in row.locator("td").first.inner_text()
        for size in SIZES:
            screenshot(page, "gone", size)


def test_the_failed_card_opens_the_list_of_exactly_the_failures_it_counts(page, live_server):
    """Failures 35 minutes old, a burst of newer successes, an old failure and a failed
    child: the card counts the three recent failures, and clicking it lists those three."""
    failed = failures_then_a_burst(burst=5, now=timezone.now())
    page.goto(f"{live_server.url}/admin/")
    card = page.locator("#obelisk-live [data-count=failed-last-hour]")
    assert card.locator(".n").inner_text() == "3"
    assert page.locator("#obelisk-live [data-count=finished-last-hour] .n").inner_text() == "8"
    for size in SIZES:
        screenshot(page, "failed-last-hour", size)
    page.set_viewport_size({"width": SIZES[0][0], "height": SIZES[0][1]})
    card.locator("a").click()
    page.wait_for_url(re.compile(r"finished=1h"))
    shown = {span.get_attribute("title") for span in page.locator("#result_list span.obelisk-id").all()}
    assert shown == set(failed)
    assert page.locator("#changelist-filter li.selected", has_text="last hour").count() == 1
    assert page.locator("#changelist-filter li.selected", has_text="with children").count() == 1
    for size in SIZES:
        screenshot(page, "failed-last-hour-list", size)


def test_the_dashboard_refreshes_itself_while_open(page, live_server):
    page.goto(f"{live_server.url}/admin/")
    count = page.locator("#obelisk-live [data-count=failed-last-hour] .n")
    assert count.inner_text() == "0"
    late = create(now=timezone.now() - timedelta(minutes=2))
    finish(late, ExecutionFailure("uncategorized", "late"), timezone.now())
    # The next poll (every POLL_SECONDS) brings it, with no reload.
    page.wait_for_function(
        "document.querySelector('#obelisk-live [data-count=failed-last-hour] .n').textContent.trim() === '1'",
        timeout=(POLL_SECONDS + 15) * 1000,
    )
    assert page.evaluate("document.documentElement.dataset.obeliskPoll") == "polling"
    page.goto("about:blank")  # no poll left running while the test database is emptied
